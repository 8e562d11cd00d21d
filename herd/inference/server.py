"""The inference server: one process that runs the policy for its clients, batched (the
local backend may run several, each with its own clients: herd/backends/inference_servers.py).

Loop: wait for a ring (or 0.1 s), find every client with a pending request in the header,
optionally wait for a fuller batch (`min_clients` requests, at most `batch_wait_us` after
the first: on the doorbell, not spinning), pull newer weights if the learner published
any (every `weights_interval` versions), gather the rows into one [1, N, ...] input, run
one forward pass, sample all actions in one batched operation, write each client's rows
back and ring exactly those clients. With --inference_records (records.py) the server also
writes each row's observation and outputs into the trajectories, where the row's places
say, before the batch is answered.

On CUDA (herd/inference/device.py) the server is pipelined: batch k's outputs travel back
while batch k+1 is gathered and launched, each on its own set of buffers. Batch k is
answered as soon as its CUDA event has fired: at the top of each turn of the loop if it
has, else after batch k+1 is launched, waiting on the event (a blocking-sync event: the
thread sleeps, it does not spin). The request and answer areas are page-locked in place
(cudaHostRegister), so rows go from the clients' shared memory straight to the GPU and
back, one copy per field each way whatever the number of clients (device.py);
inference runs in bf16 and channels-last where asked, optionally replaying CUDA graphs
captured for padded batch sizes. On CPU none of that applies: the shared memory is read
directly and each batch is answered at once.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import time
from dataclasses import dataclass
from functools import partial

import numpy as np
import psutil
import torch

from herd.device_weights import DeviceWeightBoard
from herd.inference.channels import (ANSWER_NS, ANSWER_SEQ, EXITED, REQUEST_NS, REQUEST_SEQ, ROWS, RUNNING,
                                     SERVER_ANSWER_NS, SERVER_BATCHES, SERVER_CPU_NS, SERVER_LIFE_NS, SERVER_PID,
                                     SERVER_REQUESTS, SERVER_ROWS, SERVER_STATE, SERVER_VERSION, SERVER_WAIT_NS,
                                     VERSION, InferenceChannels)
from herd.inference.device import DevicePath
from herd.inference.forward import ServerOptions, policy_outputs, sample_actions
from herd.inference.records import StepRecords
from herd.inference.routing import RouteTable
from herd.models import build_model
from herd.weights import PublisherGone, SharedWeights

WAKE_INTERVAL = 0.1   # s: the longest the server sleeps without checking stop, its parent and weights

__all__ = ["BatchServer", "ServerOptions", "run_inference_server", "sample_actions", "serve_forever"]


@dataclass
class Launched:
    """A batch whose forward pass was started: answered by BatchServer.finish."""
    clients: np.ndarray          # [K] client indices
    seqs: np.ndarray             # [K] the request numbers being answered
    rows: np.ndarray             # [K] rows of each
    index: torch.Tensor          # [N] flat rows (client c's row r is c*R + r)
    results: dict | None         # name -> [N, ...] outputs (None: nothing to compute)
    event: object = None         # CUDA: fires when the outputs are in host memory
    started_ns: int = 0          # perf_counter_ns() as its launch began
    run: slice | None = None     # CPU: the rows as one run of the channels (a lone client's), else None


class BatchServer:
    """The model on `device`, its weights and the buffers of the batched forward passes."""

    def __init__(self, channels: InferenceChannels, model_kwargs: dict, weights: SharedWeights | DeviceWeightBoard,
                 device: torch.device, options: ServerOptions | None = None, records: StepRecords | None = None):
        """weights: SharedWeights (host shared memory), or, on the learner's own CUDA
        device, the learner's DeviceWeightBoard (device to device); both have `version`
        and `pull(model, have_version)`, and device.py's pull takes either. records:
        where the rows acted on are recorded (on `device`; None: nowhere)."""
        if records is not None and (channels.places is None or records.device != torch.empty(0, device=device).device):
            raise ValueError(f"a server on {device} records steps only into a store on its device, from channels "
                             f"with places (got a store on {records.device})")
        self.channels, self.weights, self.device = channels, weights, device
        self.options = options or ServerOptions()
        C, R = channels.num_clients, channels.max_rows
        self.header = channels.header.numpy()                       # [C, HEADER_FIELDS]
        self.server_info = channels.server.numpy()                  # [SERVER_FIELDS]
        self.row_index = np.arange(C * R, dtype=np.int64).reshape(C, R)
        # Flat [C*R, ...] views: client c's row r is row c*R + r.
        self.inputs = {"obs": channels.obs.view(C * R, *channels.obs_shape), "uniforms": channels.uniforms.view(C * R)}
        self.outputs = {"actions": channels.actions.view(C * R), "logits": channels.logits.view(C * R, -1),
                        "value": channels.value.view(C * R)}
        if channels.features is not None:           # only where a replay reads them
            self.outputs["features"] = channels.features.view(C * R, -1)
        self.recurrent = channels.core_state is not None
        if self.recurrent:
            # Each row's LSTM state comes in with the request and goes back, updated, in place.
            self.inputs["core_state"] = channels.core_state.view(C * R, *channels.core_state.shape[2:])
            self.outputs["core_state"] = self.inputs["core_state"]
        # CPU: the same areas in numpy (a run of rows written back with numpy costs a third
        # of torch's slice and copy), and each run's input views, kept (a lone client's run
        # is the same every time).
        self.outputs_np = {name: t.numpy() for name, t in self.outputs.items()}
        self.run_inputs: dict[tuple, dict] = {}
        self.records = records
        self.places = None if records is None else channels.places.view(C * R, 2).numpy()   # [C*R, 2]
        self.model = build_model(**model_kwargs).to(device).eval()
        self.path = DevicePath(self.model, R, self.inputs, self.outputs, device, self.options, records) \
            if device.type == "cuda" else None
        self.version = -1
        self.refresh_weights()

    @property
    def pipelined(self) -> bool:
        """On CUDA batch k+1 is launched before batch k is answered; on CPU that would only
        delay the answer (the forward pass runs in this thread)."""
        return self.path is not None

    def refresh_weights(self) -> None:
        published = self.weights.version
        if published == self.version:
            return  # the cheap check: one shared integer
        if self.version >= 0 and published - self.version < self.options.weights_interval:
            return  # --inference_weights_interval: not yet
        if self.path is None:
            self.version = self.weights.pull(self.model, self.version)
        else:
            self.version = self.path.pull(self.weights, self.version)
        self.server_info[SERVER_VERSION] = self.version

    def pending(self) -> np.ndarray:
        """Indices of the clients with a request waiting (including any being answered)."""
        return np.flatnonzero(self.header[:, REQUEST_SEQ] != self.header[:, ANSWER_SEQ])

    def serve(self, clients: np.ndarray) -> None:
        """Answers the requests of `clients` with one forward pass, then rings them."""
        self.finish(self.launch(clients))

    def launch(self, clients: np.ndarray) -> Launched:
        """Reads the requests of `clients` and starts their forward pass."""
        started = time.perf_counter_ns()
        # Sequence numbers first: whatever is read after them belongs to these requests or
        # (a predecessor's request overwritten by its successor) to later ones.
        seqs = self.header[clients, REQUEST_SEQ].copy()
        self.server_info[SERVER_WAIT_NS] += len(clients) * started - int(self.header[clients, REQUEST_NS].sum())
        rows = np.minimum(np.maximum(self.header[clients, ROWS], 0), self.channels.max_rows)   # (np.clip: slower)
        alone = len(clients) == 1
        rows_at = (self.row_index[clients[0], :rows[0]] if alone                                       # [N]
                   else np.concatenate([self.row_index[c, :r] for c, r in zip(clients, rows)]))
        index = torch.from_numpy(rows_at)
        if len(index) == 0:
            return Launched(clients, seqs, rows, index, None, started_ns=started)
        places = None if self.places is None else self.places[rows_at]                                 # [N, 2]
        if self.path is not None:
            results, event = self.path.launch(clients, rows, index, places)
            return Launched(clients, seqs, rows, index, results, event, started_ns=started)
        first, N = int(rows_at[0]), len(rows_at)
        run = slice(first, first + N) if alone or np.array_equal(rows_at, np.arange(first, first + N)) else None
        if run is not None:
            # One run of rows (a lone client's): read in place, no gather.
            inputs = self.run_inputs.get((first, N))                                                   # [N, ...]
            if inputs is None:
                inputs = self.run_inputs[first, N] = {name: source[run] for name, source in self.inputs.items()}
        else:
            inputs = {name: source.index_select(0, index) for name, source in self.inputs.items()}     # [N, ...]
        results = self.forward(inputs)
        if places is not None:
            self.records.write(places, inputs["obs"], results)
        return Launched(clients, seqs, rows, index, results, started_ns=started, run=run)

    def forward(self, inputs: dict) -> dict:
        """CPU: inputs name -> [N, ...] -> outputs name -> [N, ...]."""
        with torch.inference_mode():
            if not self.options.bf16:
                return policy_outputs(self.model, inputs, self.recurrent, "features" in self.outputs)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return policy_outputs(self.model, inputs, self.recurrent, "features" in self.outputs)

    def done(self, launched: Launched) -> bool:
        """Whether a launched batch's outputs are in host memory (its CUDA event fired; on
        the CPU at once: the forward pass ran in launch)."""
        return self.path is None or launched.event is None or launched.event.query()

    def finish(self, launched: Launched) -> None:
        """Writes a launched batch's outputs into the clients' areas, then answers and rings them."""
        if launched.results is not None:
            if self.path is not None:
                self.path.finish(launched.clients, launched.rows, launched.index, launched.results, launched.event)
            elif launched.run is not None:
                for name, tensor in launched.results.items():
                    self.outputs_np[name][launched.run] = tensor.numpy()
            else:
                for name, tensor in launched.results.items():
                    self.outputs[name].index_copy_(0, launched.index, tensor)
        self.header[launched.clients, VERSION] = self.version
        self.header[launched.clients, ANSWER_NS] = time.perf_counter_ns()
        self.header[launched.clients, ANSWER_SEQ] = launched.seqs   # last: from here on the client may read
        for c in launched.clients:
            self.channels.doorbell.ring_client(int(c))
        info = self.server_info                  # the tally (InferenceChannels.tally): its one writer
        info[SERVER_BATCHES] += 1
        info[SERVER_ROWS] += len(launched.index)
        info[SERVER_REQUESTS] += len(launched.clients)
        info[SERVER_ANSWER_NS] += time.perf_counter_ns() - launched.started_ns


def run_inference_server(channels: InferenceChannels, model_kwargs: dict,
                         weights: SharedWeights | DeviceWeightBoard, device: str,
                         stop, torch_threads: int = 1, seed: int = 0, batch_wait_us: float = 0.0,
                         options: ServerOptions | None = None, records: StepRecords | None = None,
                         table: RouteTable | None = None, index: int = 0) -> None:
    """Process entry point: serves `channels` until `stop` (an Event) is set or the parent
    process dies. `seed` seeds torch in this process; actions are sampled with the
    clients' uniforms (see client.py). `batch_wait_us`: after a first request, wait this
    long for others before serving (0: serve at once; options.batch_wait_us if given).
    records: where the rows acted on are recorded (records.py; None: the actors write them).
    table: the route table that names server `index`'s actors (None: every client is ours)."""
    # Ctrl+C reaches the whole process group: the main process alone decides how to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(torch_threads)
    torch.manual_seed(seed)
    options = options or ServerOptions(batch_wait_us=batch_wait_us)
    server_info = channels.server.numpy()
    server_info[SERVER_CPU_NS] = server_info[SERVER_LIFE_NS] = 0     # a replacement reports its own life
    started = psutil.Process().create_time()
    try:
        server = BatchServer(channels, model_kwargs, weights, torch.device(device), options, records)
        server_info[SERVER_PID] = os.getpid()
        server_info[SERVER_STATE] = RUNNING
        own_clients = None if table is None else partial(table.clients_of, index)
        serve_forever(server, channels, stop, options.batch_wait_us * 1e-6, options.min_clients, started,
                      own_clients)
    except PublisherGone:
        pass                    # the learner died inside a publish: the run is gone
    finally:
        report_load(server_info, started)
        server_info[SERVER_PID] = os.getpid()
        server_info[SERVER_STATE] = EXITED


def report_load(server_info, started: float) -> None:
    """This process's CPU time and its life since `started` (its start, epoch seconds) into
    the server's header (channels.busy)."""
    server_info[SERVER_CPU_NS] = time.process_time_ns()
    server_info[SERVER_LIFE_NS] = int((time.time() - started) * 1e9)


def fuller_batch(server: BatchServer, channels: InferenceChannels, clients: np.ndarray, batch_wait: float,
                 min_clients: int, busy: np.ndarray, everyone: int) -> np.ndarray:
    """Waits up to `batch_wait` s (from now) until `min_clients` clients (0: all `everyone`
    this server serves) have a request waiting; sleeps on the doorbell between rings
    instead of polling."""
    wanted = min(min_clients or everyone, everyone - len(busy))
    deadline = time.perf_counter() + batch_wait
    ready = lambda: len(np.setdiff1d(server.pending(), busy)) >= wanted   # noqa: E731  ("spin" polls it)
    while len(clients) < wanted and (left := deadline - time.perf_counter()) > 0:
        channels.doorbell.wait_server(ready, left)
        clients = np.setdiff1d(server.pending(), busy)
    return clients


def serve_forever(server: BatchServer, channels: InferenceChannels, stop, batch_wait: float,
                  min_clients: int = 0, started: float | None = None, own_clients=None) -> None:
    """The loop of run_inference_server (also runnable in a thread, as the tests do).
    started: the serving process's start (epoch seconds), from which its load is reported;
    own_clients() -> how many of the channels' clients this server serves now (None: all;
    the route table's count where several servers share the actors: routing.py)."""
    own_clients = own_clients or (lambda: channels.num_clients)
    started = psutil.Process().create_time() if started is None else started
    parent = multiprocessing.parent_process()
    doorbell = channels.doorbell
    no_one = np.zeros(0, dtype=np.int64)
    in_flight: Launched | None = None           # pipelined (CUDA): the batch launched last
    next_check = 0.0
    while True:
        now = time.monotonic()
        if now >= next_check:
            if stop.is_set() or (parent is not None and not parent.is_alive()):
                return
            report_load(server.server_info, started)
            next_check = now + WAKE_INTERVAL
        if in_flight is not None and server.done(in_flight):
            server.finish(in_flight)            # home already: answered before anything else is launched
            in_flight = None
        busy = in_flight.clients if in_flight is not None else no_one
        if in_flight is None:
            doorbell.wait_server(lambda: len(server.pending()) > 0, WAKE_INTERVAL)
        clients = server.pending() if in_flight is None else np.setdiff1d(server.pending(), busy)
        if len(clients) and batch_wait > 0 and in_flight is None:
            clients = fuller_batch(server, channels, clients, batch_wait, min_clients, busy, own_clients())
        server.refresh_weights()  # between batches, and while idle, so refresh() stays current
        launched = server.launch(clients) if len(clients) else None
        if in_flight is not None:
            server.finish(in_flight)            # batch k answered while batch k+1 runs
            in_flight = None
        if launched is not None:
            if server.pipelined:
                in_flight = launched
            else:
                server.finish(launched)
