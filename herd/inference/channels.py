"""The shared memory between actor processes (clients) and the inference server.

Built once in the main process, before any process starts, and handed to every child as
an argument (torch shares the tensors by file descriptor under spawn, like
TrajectorySlots). C clients, each with a fixed index and room for R rows:

    obs        [C, R, *obs_shape]  uint8 frames or float32 vectors    client writes
    uniforms   [C, R]      float32 in [0, 1), one per row, to sample with   client writes
    actions    [C, R]      int64                                        server writes
    logits     [C, R, A]   float32                                      server writes
    value      [C, R]      float32                                      server writes
    features   [C, R, F]   float32, only where a replay reads them (with_features)  server writes
    core_state [C, R, 2, L, H] float32, only for a model with an LSTM core (--use_lstm):
               the client writes each row's state before the step, the server overwrites
               it with the state after. The clients keep the states (one per env), so the
               server stays without per-client state: a restarted actor simply starts
               its environments from zero states, and no answer depends on who shared a batch.
    places     [C, R, 2] int64, only where the server records the steps itself
               (--inference_records, records.py): each row's obs and step place   client writes
    header     [C, 9]      int64: REQUEST_SEQ, ROWS, KIND, ANSWER_SEQ, VERSION; the clocks of
               the round trip, in perf_counter_ns (CLOCK_MONOTONIC: one clock for every
               process of the machine): REQUEST_NS (client: as it published; the server
               tallies each request's wait for its launch), ANSWER_NS (server: as it
               answered), and the client's TAKEN_NS, TAKEN (the nanoseconds from answers
               to the client's reading them, summed, and how many: its wake-up, or the
               time a double-buffered actor was busy elsewhere)
    server     [SERVER_FIELDS] int64: server pid, state (NOT_STARTED/RUNNING/EXITED), version
               loaded, and the tally and load below

A request is pending while header[c, REQUEST_SEQ] != header[c, ANSWER_SEQ]. The client
writes obs, uniforms, ROWS and KIND first and REQUEST_SEQ last; the server answers by
writing the outputs and VERSION first and ANSWER_SEQ = the sequence number it read last.
Each side writes only its own fields, so no lock is needed, and a client waits for exactly
its own sequence number, so an answer meant for someone else (a dead predecessor with
the same index) is never taken. The doorbell (doorbells.py) only wakes the other side.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.multiprocessing as mp

from herd.inference.doorbells import make_doorbell

# header columns
REQUEST_SEQ, ROWS, KIND, ANSWER_SEQ, VERSION, REQUEST_NS, ANSWER_NS, TAKEN_NS, TAKEN = range(9)
HEADER_FIELDS = 9
# request kinds
ACT, VALUE = 1, 2
# server columns and states; the tally of answered batches (BatchServer.finish): batches,
# their rows and requests, the nanoseconds from each batch's launch to its answers, and
# (BatchServer.launch) from each request's publication to its batch's launch; the
# server process's CPU time and life so far, in nanoseconds (written by the server itself,
# every WAKE_INTERVAL and as it exits: its load, readable after it is gone)
(SERVER_PID, SERVER_STATE, SERVER_VERSION, SERVER_BATCHES, SERVER_ROWS, SERVER_REQUESTS, SERVER_ANSWER_NS,
 SERVER_CPU_NS, SERVER_LIFE_NS, SERVER_WAIT_NS) = range(10)
SERVER_FIELDS = 10
NOT_STARTED, RUNNING, EXITED = 0, 1, 2


def shared(shape: tuple, dtype: torch.dtype, fill) -> torch.Tensor:
    return torch.full(shape, fill, dtype=dtype).share_memory_()


class InferenceChannels:
    """Request and response areas for `num_clients` clients of up to `max_rows` rows each,
    plus the doorbell of the chosen `mechanism` (see doorbells.py).

    The channels outlive a server: a restarted server (herd/backends/inference_servers.py)
    serves the requests its predecessor left pending, since everything it needs is in the
    header. Clients may come and go (same index, one at a time)."""

    def __init__(self, num_clients: int, max_rows: int, obs_shape: tuple, obs_dtype: str, num_actions: int,
                 feature_size: int, mechanism: str = "semaphore", context=None, core_state_shape: tuple | None = None,
                 with_features: bool = True, with_places: bool = False):
        if num_clients < 1 or max_rows < 1:
            raise ValueError(f"inference channels need at least one client and one row, got "
                             f"num_clients={num_clients}, max_rows={max_rows}")
        if np.dtype(obs_dtype) not in (np.dtype(np.uint8), np.dtype(np.float32)):
            raise ValueError(f"inference observations are uint8 frames or float32 vectors, got {obs_dtype}")
        context = context or mp.get_context("spawn")
        C, R = num_clients, max_rows
        self.num_clients, self.max_rows = C, R
        self.obs_shape, self.obs_dtype = tuple(int(d) for d in obs_shape), str(np.dtype(obs_dtype))
        self.num_actions, self.feature_size = int(num_actions), int(feature_size)
        self.mechanism = mechanism
        obs_torch = torch.from_numpy(np.zeros(0, dtype=self.obs_dtype)).dtype
        self.obs = shared((C, R, *self.obs_shape), obs_torch, 0)
        self.uniforms = shared((C, R), torch.float32, 0.0)
        # Outputs start as sentinels (-1, NaN): a row the server never wrote cannot pass as data.
        self.actions = shared((C, R), torch.int64, -1)
        self.logits = shared((C, R, self.num_actions), torch.float32, float("nan"))
        self.value = shared((C, R), torch.float32, float("nan"))
        # No feature vectors unless a replay reads them (elite): 512 floats a row on Atari,
        # more than the frame's logits and value together, copied for nothing otherwise.
        self.features = shared((C, R, self.feature_size), torch.float32, float("nan")) if with_features else None
        self.core_state = None if core_state_shape is None else shared((C, R, *core_state_shape), torch.float32, 0.0)
        self.places = shared((C, R, 2), torch.int64, -1) if with_places else None
        self.header = shared((C, HEADER_FIELDS), torch.int64, 0)
        self.server = shared((SERVER_FIELDS,), torch.int64, 0)
        self.doorbell = make_doorbell(mechanism, C, context)

    @classmethod
    def for_model(cls, model_kwargs: dict, num_clients: int, max_rows: int, mechanism: str = "semaphore",
                  context=None, with_features: bool = True, with_places: bool = False) -> "InferenceChannels":
        """Channels sized for the network `build_model(**model_kwargs)` builds (its feature
        size is probed, since feature_size=None means the torso's own)."""
        from herd.models import build_model, recurrent_core
        model = build_model(**model_kwargs)
        core = recurrent_core(model)
        obs_shape, obs_dtype = tuple(model_kwargs["obs_shape"]), model_kwargs["obs_dtype"]
        with torch.no_grad():
            out = model(torch.zeros((1, 1, *obs_shape), dtype=torch.from_numpy(np.zeros(0, obs_dtype)).dtype))
        return cls(num_clients, max_rows, obs_shape, obs_dtype, out.logits.shape[-1], out.features.shape[-1],
                   mechanism, context, core_state_shape=core.state_shape if core is not None else None,
                   with_features=with_features, with_places=with_places)

    def busy(self) -> float | None:
        """The server process's CPU time as a share of its life (a replacement's since it
        started); None before a server has reported."""
        info = self.server.numpy()
        life = int(info[SERVER_LIFE_NS])
        return round(int(info[SERVER_CPU_NS]) / life, 3) if life > 0 else None

    def running(self) -> bool:
        """A server has started on these channels and serves them."""
        return int(self.server[SERVER_STATE]) == RUNNING

    def usage(self) -> tuple[int, int]:
        """The server's CPU time and life so far, in nanoseconds, as it last reported them
        (a replacement's since it started): the load over a window is the ratio of two
        readings' differences."""
        info = self.server.numpy()
        return int(info[SERVER_CPU_NS]), int(info[SERVER_LIFE_NS])

    def tally(self) -> dict:
        """What the server (and any replacement) answered so far: batches and requests, and per batch the
        mean rows, requests (clients answered together) and microseconds from its launch to
        its answers (the forward pass, and on a GPU the copies and the wait for the device);
        per request the mean microseconds from its publication to its batch's launch (the
        server's wake-up and its queue: what more servers would shorten), and from its
        answer to the client's reading it (the client's wake-up)."""
        info, header = self.server.numpy(), self.header.numpy()
        batches = int(info[SERVER_BATCHES])
        per_batch = max(batches, 1)
        return {"batches": batches, "requests": int(info[SERVER_REQUESTS]),
                "mean_rows": round(int(info[SERVER_ROWS]) / per_batch, 2),
                "mean_requests": round(int(info[SERVER_REQUESTS]) / per_batch, 2),
                "mean_answer_us": round(int(info[SERVER_ANSWER_NS]) / per_batch / 1e3, 1),
                "mean_wait_us": round(int(info[SERVER_WAIT_NS]) / max(int(info[SERVER_REQUESTS]), 1) / 1e3, 1),
                "mean_taken_us": round(int(header[:, TAKEN_NS].sum()) / max(int(header[:, TAKEN].sum()), 1) / 1e3, 1)}
