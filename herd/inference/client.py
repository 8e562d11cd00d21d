"""The actor's side of the inference server: an `ActorPolicy` whose model runs elsewhere.

Sampling: the server samples every row of a batch in one batched operation on its device
(inverse CDF: the first action whose cumulative probability exceeds u), and the uniform u
of each row is drawn here, by the client, from the client's own seeded generator. So an
actor's actions depend only on its seed and its logits, never on which other clients
happened to share its batch, and a restarted actor (new seed) starts a fresh stream without
the server keeping any per-client state. The server itself draws no random numbers.
"""
from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np
import psutil

from herd.interfaces import PolicyStep
from herd.models.core import CORE_STATE, EnvCoreStates, state_from_rows, state_to_rows
from herd.inference.channels import (ACT, ANSWER_NS, ANSWER_SEQ, EXITED, KIND, NOT_STARTED, REQUEST_NS, REQUEST_SEQ,
                                     ROWS, SERVER_PID, SERVER_STATE, SERVER_VERSION, TAKEN, TAKEN_NS, VALUE, VERSION,
                                     InferenceChannels)
from herd.inference.records import FIELD_OF_OUTPUT, NOTHING


class InferenceServerGone(RuntimeError):
    """The inference server will not answer: it died, exited, never started, or a stop was requested."""


class Pending(NamedTuple):
    """A request sent by submit() whose answer collect() takes."""
    n: int                                  # rows
    seq: int                                # its sequence number
    ids: np.ndarray | None                  # [n] env ids (LSTM only)
    start: object                           # [2, L, n, H] the rows' LSTM states before the step, or None



class InferenceClient:
    """One per actor process (two with --actor_double_buffer), for client slot `index` of `channels`.

    `stop`: the run's stop Event (optional); once set, a waiting act() raises.
    `seed`: seeds the uniforms the server samples actions with (see the module docstring);
    `rng` (a numpy Generator) replaces it: the two lanes of a double-buffered actor share
    one, so they draw in the order a single-buffered actor would.
    `states`: the EnvCoreStates to keep LSTM states in (shared by an actor's lanes).
    `record`: the trajectory fields act() returns (None: every output of the channels).
    `place_of`: where the server records the rows it acts on (--inference_records):
    env ids [n] -> places [n, 2] (herd/inference/records.py; the actor's
    RolloutWriter.places); None: the server records nothing of this client's.
    `poll_interval`: how often (s) a waiting client checks that the server is still there,
    so a dead server is noticed within about that long.
    `start_timeout`: how long (s) to wait for a server that has not started yet.
    `restart_timeout`: how long (s) to wait for a dead server's replacement (the local
    backend restarts dead servers); 0: raise InferenceServerGone at once.

    At most one live client per index: a new client with the index of a dead one takes
    over its slot and ignores whatever was meant for its predecessor."""

    def __init__(self, channels: InferenceChannels, index: int, stop=None, seed: int = 0,
                 poll_interval: float = 0.1, start_timeout: float = 120.0, restart_timeout: float = 0.0,
                 rng: np.random.Generator | None = None, states: EnvCoreStates | None = None,
                 record: tuple | None = None, place_of=None):
        if not 0 <= index < channels.num_clients:
            raise ValueError(f"client index {index} out of range: the channels have {channels.num_clients} clients")
        # None: an algorithm that completes its rollouts (Ape-X) acts with its own network.
        self.finish_rollout = None
        self.channels, self.index, self.stop = channels, index, stop
        self.poll_interval, self.start_timeout, self.restart_timeout = poll_interval, start_timeout, restart_timeout
        self.rng = rng if rng is not None else np.random.default_rng(seed)
        # numpy views of this client's areas: numpy item access costs far less than torch's.
        self.header = channels.header.numpy()[index]
        self.server = channels.server.numpy()
        self.obs = channels.obs[index].numpy()                # [R, *obs_shape]
        self.uniforms = channels.uniforms[index].numpy()      # [R]
        self.actions = channels.actions[index].numpy()        # [R]
        self.value_out = channels.value[index].numpy()        # [R]
        self.places = None if channels.places is None else channels.places[index].numpy()   # [R, 2]
        self.place_of = place_of
        if place_of is not None and self.places is None:
            raise ValueError("these inference channels carry no places: the server records nothing")
        outputs = {"logits": channels.logits, "value": channels.value, "features": channels.features}
        self.outputs = {FIELD_OF_OUTPUT[name]: area[index].numpy()   # field -> [R, ...]
                        for name, area in outputs.items() if area is not None}
        if record is not None:
            record = [name for name in record if name != CORE_STATE]     # kept below, with the states
            missing = set(record) - set(self.outputs)
            if missing:
                raise ValueError(f"the inference channels do not carry {', '.join(sorted(missing))}")
            self.outputs = {name: self.outputs[name] for name in record}
        # --use_lstm: this client keeps its environments' LSTM states and sends each row's
        # with the request (channels.py says why the server keeps none).
        self.core_state = None if channels.core_state is None else channels.core_state[index]   # [R, 2, L, H]
        if self.core_state is None:
            self.states = None
        else:
            self.states = states if states is not None else EnvCoreStates(tuple(self.core_state.shape[1:]))
        self.doorbell = channels.doorbell
        # Continue after every number a predecessor used, so none of its answers can match.
        self.seq = int(max(self.header[REQUEST_SEQ], self.header[ANSWER_SEQ]))
        self.doorbell.forget_client(index)
        self.server_process: psutil.Process | None = None
        self.gone_since: float | None = None      # when this client first found the server gone
        self.closed = False

    def act(self, obs: np.ndarray, env_ids: np.ndarray | None = None, reset: np.ndarray | None = None) -> PolicyStep:
        """obs [n, *obs_shape] -> actions [n] int64 and IMPALA's step fields: behaviour_logits [n, A],
        behaviour_value [n], features [n, F] (those in `record`; the server samples as
        herd.algos.impala does); with an LSTM core also CORE_STATE [n, 2, L, H], the states
        the rows acted from."""
        return self.collect(self.submit(obs, env_ids, reset))

    def submit(self, obs: np.ndarray, env_ids: np.ndarray | None = None, reset: np.ndarray | None = None) -> Pending:
        """Sends an act request and returns at once; collect() waits for its answer. At most
        one request in flight per client: a double-buffered actor has two clients (lanes)."""
        n = self._write(obs)
        if n == 0:
            return Pending(0, -1, None, None)
        self.rng.random(n, dtype=np.float32, out=self.uniforms[:n])
        if self.places is not None:
            self.places[:n] = NOTHING if self.place_of is None else self.place_of(self._ids(n, env_ids))
        start = self._write_states(n, env_ids, reset)
        return Pending(n, self._publish(n, ACT), self._ids(n, env_ids) if start is not None else None, start)

    def collect(self, pending: Pending) -> PolicyStep:
        """The answer to a submit(): see act()."""
        n = pending.n
        if n == 0:
            return self._empty_step()
        version = self._wait(pending.seq)
        # Copies: the areas are overwritten by the next request.
        fields = self._fields(slice(0, n))
        if pending.start is not None:
            self.states.end(pending.ids, state_from_rows(self.core_state[:n]))   # the states after
            fields[CORE_STATE] = state_to_rows(pending.start).numpy()
        return PolicyStep(self.actions[:n].copy(), fields, version)

    def value(self, obs: np.ndarray, env_ids: np.ndarray | None = None) -> np.ndarray:
        """obs [n, *obs_shape] -> value [n] float32 (bootstraps truncated episodes); an LSTM
        core values them from env_ids' current states, which stay unchanged."""
        n = self._write(obs)
        if n == 0:
            return np.zeros(0, dtype=np.float32)
        self._write_states(n, env_ids, None)
        if self.places is not None:
            self.places[:n] = NOTHING                         # a value is not a step
        self._ask(n, VALUE)
        return self.value_out[:n].copy()

    @staticmethod
    def _ids(n: int, env_ids: np.ndarray | None) -> np.ndarray:
        return np.arange(n) if env_ids is None else np.asarray(env_ids)

    def _write_states(self, n: int, env_ids, reset):
        """Writes the rows' LSTM states [n, 2, L, H] into the request; returns them as
        [2, L, n, H] (None without a core)."""
        if self.states is None:
            return None
        start = self.states.begin(self._ids(n, env_ids), reset)
        self.core_state[:n].copy_(state_to_rows(start))
        return start

    def refresh(self) -> int:
        """The server pulls newer weights itself (before every batch and when idle); this
        returns the version it acts with now. Each PolicyStep carries the exact version."""
        return int(self.server[SERVER_VERSION])

    def close(self) -> None:
        """The shared memory belongs to the channels' creator; a closed client only refuses work."""
        self.closed = True

    # -- protocol -----------------------------------------------------------------------

    def _write(self, obs: np.ndarray) -> int:
        if self.closed:
            raise RuntimeError("this InferenceClient was closed")
        obs = np.asarray(obs)
        if obs.shape[1:] != self.obs.shape[1:]:
            raise ValueError(f"observations must be [n, {', '.join(map(str, self.obs.shape[1:]))}], got "
                             f"{tuple(obs.shape)}")
        n = obs.shape[0]
        if n > self.obs.shape[0]:
            raise ValueError(f"{n} observations in one request, but the inference channels hold at most "
                             f"{self.obs.shape[0]} per client (raise max_rows)")
        np.copyto(self.obs[:n], obs, casting="same_kind")
        return n

    def _ask(self, n: int, kind: int) -> int:
        """Publishes the request written so far and waits for its answer; returns its version."""
        return self._wait(self._publish(n, kind))

    def _publish(self, n: int, kind: int) -> int:
        self.seq += 1
        self.header[ROWS] = n
        self.header[KIND] = kind
        self.header[REQUEST_NS] = time.perf_counter_ns()
        self.header[REQUEST_SEQ] = self.seq  # last: from here on the server may read the request
        self.doorbell.ring_server(self.index)
        return self.seq

    def _wait(self, seq: int) -> int:
        """Waits until the answer to request `seq` (and no other) is in; returns its version."""
        header, started = self.header, time.monotonic()
        ready = lambda: header[ANSWER_SEQ] == seq  # noqa: E731
        while header[ANSWER_SEQ] != seq:
            self.doorbell.wait_client(self.index, ready, self.poll_interval)
            if header[ANSWER_SEQ] != seq:
                self._check_server(started)  # woken without our answer: timeout or a stale ring
        header[TAKEN_NS] += time.perf_counter_ns() - header[ANSWER_NS]
        header[TAKEN] += 1
        return int(header[VERSION])

    def _check_server(self, started: float) -> None:
        if self.stop is not None and self.stop.is_set():
            raise InferenceServerGone("stop requested while waiting for the inference server")
        state, pid = int(self.server[SERVER_STATE]), int(self.server[SERVER_PID])
        if state == NOT_STARTED:
            if time.monotonic() - started > self.start_timeout:
                raise InferenceServerGone(f"no inference server started within {self.start_timeout:.0f} s")
            return
        if state != EXITED and self._alive(pid):
            self.gone_since = None
            return
        what = "has exited" if state == EXITED else "died"
        if self.restart_timeout <= 0:
            raise InferenceServerGone(f"the inference server (pid {pid}) {what}")
        # Supervised: a new server will take over the channels and answer the request that
        # is still pending in the header. Wait for it, not forever.
        now = time.monotonic()
        if self.gone_since is None:
            self.gone_since = now
        elif now - self.gone_since > self.restart_timeout:
            raise InferenceServerGone(f"the inference server (pid {pid}) {what} and no new one started within "
                                      f"{self.restart_timeout:.0f} s")

    def _alive(self, pid: int) -> bool:
        try:
            if self.server_process is None or self.server_process.pid != pid:
                self.server_process = psutil.Process(pid)
            # is_running() also notices a reused pid; a killed, unreaped server is a zombie.
            return self.server_process.is_running() and self.server_process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def _fields(self, rows: slice) -> dict[str, np.ndarray]:
        return {name: area[rows].copy() for name, area in self.outputs.items()}

    def _empty_step(self) -> PolicyStep:
        return PolicyStep(np.zeros(0, np.int64), self._fields(slice(0, 0)), self.refresh())
