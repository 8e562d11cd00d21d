"""The inference server: one process that runs the policy for every client, batched.

Loop: wait for a ring (or 0.1 s), find every client with a pending request in the header,
pull newer weights if the learner published any, gather all their rows into one [1, N, ...]
input, run one forward pass, sample all actions in one batched operation, write each
client's rows back and ring exactly those clients. It never waits for a fuller batch unless
asked to (batch_wait_us): latency matters more, see benchmarks/inference_server.py.

On CUDA the rows are gathered into a pinned staging buffer and copied to the device with
non_blocking=True; outputs come back through pinned buffers, with one synchronisation per
batch. On CPU the shared memory is read directly (no staging).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import time

import numpy as np
import torch

from herd.inference.channels import (ANSWER_SEQ, EXITED, REQUEST_SEQ, ROWS, RUNNING, SERVER_PID, SERVER_STATE,
                                     SERVER_VERSION, VERSION, InferenceChannels)
from herd.models import build_model
from herd.models.core import CoreInput, state_from_rows, state_to_rows
from herd.weights import SharedWeights

WAKE_INTERVAL = 0.1   # s: the longest the server sleeps without checking stop, its parent and weights


def sample_actions(logits: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """logits [N, A], uniforms [N] in [0, 1) -> actions [N] int64 drawn from softmax(logits).

    Inverse CDF: the first action whose cumulative probability exceeds u * total. Actions of
    probability zero are never drawn (their CDF step is empty)."""
    cdf = torch.softmax(logits, dim=-1).cumsum(dim=-1)                       # [N, A]
    target = (uniforms * cdf[:, -1]).unsqueeze(1)                            # [N, 1]
    return torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=logits.shape[1] - 1)


class BatchServer:
    """The model on `device`, its weights and the buffers of one batched forward pass."""

    def __init__(self, channels: InferenceChannels, model_kwargs: dict, weights: SharedWeights,
                 device: torch.device):
        self.channels, self.weights, self.device = channels, weights, device
        C, R = channels.num_clients, channels.max_rows
        self.header = channels.header.numpy()                       # [C, 5]
        self.server_info = channels.server.numpy()                  # [3]
        self.row_index = np.arange(C * R, dtype=np.int64).reshape(C, R)
        # Flat [C*R, ...] views: client c's row r is row c*R + r.
        self.obs = channels.obs.view(C * R, *channels.obs_shape)
        self.uniforms = channels.uniforms.view(C * R)
        self.outputs = {"actions": channels.actions.view(C * R), "logits": channels.logits.view(C * R, -1),
                        "value": channels.value.view(C * R), "features": channels.features.view(C * R, -1)}
        self.inputs = {"obs": self.obs, "uniforms": self.uniforms}
        self.recurrent = channels.core_state is not None
        if self.recurrent:
            # Each row's LSTM state comes in with the request and goes back, updated, in place.
            self.inputs["core_state"] = channels.core_state.view(C * R, *channels.core_state.shape[2:])
            self.outputs["core_state"] = self.inputs["core_state"]
        self.model = build_model(**model_kwargs).to(device).eval()
        self.cuda = device.type == "cuda"
        if self.cuda:
            # SharedWeights.pull re-points parameters at a CPU vector, so it loads a CPU shadow
            # model whose parameters are then copied onto the device.
            self.shadow = build_model(**model_kwargs).eval()
            self.staging = {name: torch.empty_like(t).pin_memory() for name, t in self.inputs.items()}
            self.on_device = {name: torch.empty_like(t, device=device) for name, t in self.staging.items()}
            self.back = {name: torch.empty_like(t).pin_memory() for name, t in self.outputs.items()}
        self.version = -1
        self.refresh_weights()

    def refresh_weights(self) -> None:
        if self.weights.version == self.version:
            return  # the cheap check: one shared integer
        if not self.cuda:
            self.version = self.weights.pull(self.model, self.version)
        else:
            self.version = self.weights.pull(self.shadow, self.version)
            with torch.no_grad():
                for target, source in zip(self.model.parameters(), self.shadow.parameters()):
                    target.copy_(source)
        self.server_info[SERVER_VERSION] = self.version

    def pending(self) -> np.ndarray:
        """Indices of the clients with a request waiting."""
        return np.flatnonzero(self.header[:, REQUEST_SEQ] != self.header[:, ANSWER_SEQ])

    def serve(self, clients: np.ndarray) -> None:
        """Answers the requests of `clients` with one forward pass, then rings them."""
        # Sequence numbers first: whatever is read after them belongs to these requests or
        # (a predecessor's request overwritten by its successor) to later ones.
        seqs = self.header[clients, REQUEST_SEQ].copy()
        rows = np.clip(self.header[clients, ROWS], 0, self.channels.max_rows)
        index = np.concatenate([self.row_index[c, :r] for c, r in zip(clients, rows)])   # [N]
        if len(index):
            rows_t = torch.from_numpy(index)
            inputs = self.gather(rows_t)                                                  # name -> [N, ...]
            with torch.inference_mode():
                if self.recurrent:                                                        # [1, N, ...]
                    start = CoreInput(state_from_rows(inputs["core_state"]), None)        # [2, L, N, H]
                    out, state = self.model.unroll(inputs["obs"].unsqueeze(0), start)
                else:
                    out = self.model(inputs["obs"].unsqueeze(0))
                logits = out.logits[0]
                results = {"actions": sample_actions(logits, inputs["uniforms"]), "logits": logits,
                           "value": out.value[0], "features": out.features[0]}
                if self.recurrent:
                    results["core_state"] = state_to_rows(state)                          # [N, 2, L, H]
                self.scatter(rows_t, results)
        self.header[clients, VERSION] = self.version
        self.header[clients, ANSWER_SEQ] = seqs   # last: from here on the client may read
        for c in clients:
            self.channels.doorbell.ring_client(int(c))

    def gather(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """Rows [N] of the flat request areas -> obs [N, *obs_shape], uniforms [N] (and
        core_state [N, 2, L, H] for a recurrent model) on the device."""
        if not self.cuda:
            return {name: source.index_select(0, rows) for name, source in self.inputs.items()}
        n = len(rows)
        out = {}
        for name, source in self.inputs.items():
            staged = torch.index_select(source, 0, rows, out=self.staging[name][:n])
            out[name] = self.on_device[name][:n].copy_(staged, non_blocking=True)
        return out

    def scatter(self, rows: torch.Tensor, results: dict[str, torch.Tensor]) -> None:
        """Writes each result [N, ...] into rows [N] of the flat response areas."""
        if self.cuda:
            n = len(rows)
            results = {name: self.back[name][:n].copy_(t, non_blocking=True) for name, t in results.items()}
            torch.cuda.current_stream(self.device).synchronize()   # one wait for the whole batch
        for name, tensor in results.items():
            self.outputs[name].index_copy_(0, rows, tensor)


def run_inference_server(channels: InferenceChannels, model_kwargs: dict, weights: SharedWeights, device: str,
                         stop, torch_threads: int = 1, seed: int = 0, batch_wait_us: float = 0.0) -> None:
    """Process entry point: serves `channels` until `stop` (an Event) is set or the parent
    process dies. `seed` seeds torch in this process; actions are sampled with the
    clients' uniforms (see client.py). `batch_wait_us`: after a first request, wait this
    long for others before serving (0: serve at once)."""
    # Ctrl+C reaches the whole process group: the main process alone decides how to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(torch_threads)
    torch.manual_seed(seed)
    server_info = channels.server.numpy()
    try:
        server = BatchServer(channels, model_kwargs, weights, torch.device(device))
        server_info[SERVER_PID] = os.getpid()
        server_info[SERVER_STATE] = RUNNING
        serve_forever(server, channels, stop, batch_wait_us * 1e-6)
    finally:
        server_info[SERVER_PID] = os.getpid()
        server_info[SERVER_STATE] = EXITED


def serve_forever(server: BatchServer, channels: InferenceChannels, stop, batch_wait: float) -> None:
    """The loop of run_inference_server (also runnable in a thread, as the tests do)."""
    parent = multiprocessing.parent_process()
    doorbell = channels.doorbell
    has_request = lambda: len(server.pending()) > 0  # noqa: E731
    next_check = 0.0
    while True:
        now = time.monotonic()
        if now >= next_check:
            if stop.is_set() or (parent is not None and not parent.is_alive()):
                return
            next_check = now + WAKE_INTERVAL
        doorbell.wait_server(has_request, WAKE_INTERVAL)
        clients = server.pending()
        if len(clients) and batch_wait > 0:
            # Polled, not slept: time.sleep() of 100 µs takes several times that.
            deadline = time.perf_counter() + batch_wait
            while len(clients) < channels.num_clients and time.perf_counter() < deadline:
                time.sleep(0)
                clients = server.pending()
        server.refresh_weights()  # between batches, and while idle, so refresh() stays current
        if len(clients):
            server.serve(clients)
