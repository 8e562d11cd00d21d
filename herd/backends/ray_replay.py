"""The Ray backend's replay server (--replay_server): the replay in its own Ray actor, so
that actors on many nodes feed one replay and the learner process only trains.

    RolloutWorker i --next_rollout (2 returns)--> learner: ray.get(metadata) only (version,
        |                                           steps, games); it hands the arrays' ref on
        +-- arrays: field -> [T(+1), E, ...] -----> ReplayServer (Ray actor; the learner's node
                    (Ray resolves the ref on the      by default): a ReplayMixer built by the same
                     server's node)                   code as the learner's (herd/training.py)
    learner <-- sample(): (sequence, MixedBatch, lagging), --cache_output_buffer_size calls in flight
    learner --> updates([(keys, |TD errors|), ...]): new priorities, a few batches' at once,
                fire and forget

What moves off the learner process: reading each rollout out of the object store, writing
it into the replay (LZ4 packing of frames with --use_replay_compression), the priority
updates, drawing and collating batches. What the learner's node still receives: the
sampled batches (their bytes are counted in summary.json; for Ape-X at a replay ratio >= 1
they can be more bytes than the rollouts were, since every transition carries its
bootstrap observation), and, with the server on the learner's node, the rollouts too, into
the node's object store. Rollouts smaller than Ray's inline limit (100 KiB: CartPole's)
travel inside the call's reply to the learner's Ray core and from there in the server
call, never deserialized by the learner; larger ones (Atari's) stay in the actor node's
object store until the server pulls them.

The server's calls run in three concurrency groups of one thread each (herd/replay/
server.py's ReplayService says what each does): writes in the default group, in the order
the learner sent them (Ray runs one caller's calls of a single-threaded group in order), so
a state_dict call sees every rollout and priority sent before it; sample calls in their own
thread, so a sample waiting for the pacing never blocks the writes that would end its wait;
stats and where in a third, never queued behind either.

A server that dies (or does not answer a state call within CALL_TIMEOUT s) raises
ReplayLost: the run ends with one line and exit 1, and its last checkpoint stays as it was
(there is no replay to save with a final one)."""
from __future__ import annotations

import logging
import os
import signal
import time

import numpy as np
import ray
import torch
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from herd.backends.local import START_GRACE
from herd.backends.ray_pool import one_line
from herd.backends.ray_wire import unpack_obs
from herd.errors import ReplayLost
from herd.learner.batches import ReplayElsewhere
from herd.learner.learner import to_tensors
from herd.replay.server import ReplayService

log = logging.getLogger("herd")


def host_array(values) -> np.ndarray:
    """values as a numpy array: a tensor (perhaps on a GPU) is copied to the host, the
    replay server's side of the wire."""
    if isinstance(values, torch.Tensor):
        return values.detach().float().cpu().numpy()
    return np.asarray(values)

SAMPLES, CONTROL = "samples", "control"     # the writes run in the default group
SAMPLE_WAIT = 0.5         # seconds a sample call waits for the pacing before it answers empty
CALL_TIMEOUT = 300.0      # seconds a state or load call may take (a large replay) before the server counts as hung
STATS_PERIOD = 1.0        # seconds between the learner's requests for the server's counters
SERVER_CPUS = 1.0         # what the server reserves on a node other than the learner's (--replay_server_node)


class ReplayServer(ReplayService):
    """The Ray actor: a ReplayService over the mixer that `build()` makes in this process."""

    def __init__(self, build):
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)     # the learner alone decides how to stop
        except ValueError:
            pass     # not the main thread: Ray's workers start with SIGINT blocked anyway
        torch.set_num_threads(1)     # sampling is numpy; the learner's node keeps its cores for the learner
        super().__init__(build())

    def where(self) -> dict:
        return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    def add_rollout(self, views: dict, version: int) -> int:
        """Observations packed by the actor (--ray_compress_obs) are unpacked here, where they are read."""
        return super().add_rollout(unpack_obs(views), version)

    def updates(self, pairs: list) -> int:
        """Several batches' priorities, [(keys, values [B]), ...], in the order they were trained."""
        return sum(self.update(keys, values) for keys, values in pairs)


def writable(value):
    """A copy of the read-only arrays Ray hands out (views of its object store), recursively:
    torch refuses to wrap read-only memory without a warning, and the learner keeps these."""
    if isinstance(value, np.ndarray):
        return value if value.flags.writeable else value.copy()
    if isinstance(value, dict):
        return {key: writable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(writable(item) for item in value)
    return value


class RemoteBatches:
    """The learner's side of the replay server, with the protocol of herd/learner/batches.py."""

    discarded = 0          # nothing is discarded: a server that falls behind makes the learner wait

    def __init__(self, server, place: dict, device: torch.device, in_flight: int, max_writes: int):
        self.server, self.place, self.device = server, place, device
        self.in_flight, self.max_writes = in_flight, max_writes
        self.requests: list = []          # refs of sample calls, oldest first (one thread answers them in order)
        self.adds: list = []              # refs of add_rollout calls not yet known to be done
        self.updates: list = []           # refs of updates calls not yet known to be done
        self.priorities: list = []        # (keys, values) of trained batches not yet sent
        self.drop_before = 0              # batches drawn before the last saved state: not trained on (server.py)
        self.dropped = self.lost_rollouts = 0
        self.lagging = False              # the last answer said the learner lags the replay ratio
        self.stats: dict = {}
        self.stats_call, self.stats_time = None, 0.0

    # ------------------------------------------------------------------ the protocol
    def has_room(self) -> bool:
        """False while --replay_writer_queue_size rollouts wait to be written in the server,
        or while the server's last answer said the learner lags the replay ratio (each
        batch it then answers with brings a newer word)."""
        self.adds = self.reap(self.adds, lost_ok=True)
        return len(self.adds) < self.max_writes and not self.lagging

    def read_slots(self, slots) -> bool:
        return False            # the replay is in the server: rollouts travel to it

    def keep(self, start: int, n: int, version: int, on_free) -> bool:
        return False

    def put_rollout(self, arrays_ref, version: int) -> None:
        """arrays_ref: the object ref of a rollout's arrays (field -> [T(+1), E, ...]);
        passed as an argument, so Ray resolves it on the server's node."""
        self.adds.append(self.server.add_rollout.remote(arrays_ref, version))

    def next_ready(self):
        """(tensors, MixedBatch) of the oldest answered sample call, or None when none has
        answered yet; keeps `in_flight` calls requested."""
        self.poll_stats()
        while True:
            while len(self.requests) < self.in_flight:
                self.requests.append(self.server.sample.options(concurrency_group=SAMPLES).remote(SAMPLE_WAIT))
            ready, _ = ray.wait(self.requests[:1], timeout=0)
            if not ready:
                return None
            sequence, mixed, self.lagging = self.fetch(self.requests.pop(0))
            if mixed is None:
                continue                                   # the pacing allowed none within SAMPLE_WAIT
            if sequence < self.drop_before:
                self.dropped += 1                          # counted in the last checkpoint's replay state
                continue
            tensors = to_tensors(writable(mixed.data), writable(mixed.replayed), self.device)
            mixed.data = None
            return tensors, mixed

    def update(self, keys: list, values) -> int:
        """Keeps the priorities [B] and sends them with those of the next batches, `in_flight`
        batches' at once: a Ray call costs the learner about 0.4 ms here (a CartPole update
        takes about 5), and these batches were drawn that far ahead anyway. The server's
        keys drop the values of items overwritten since. Returns how many were kept."""
        self.priorities.append((keys, host_array(values)))    # the server's replay is on its host
        if len(self.priorities) >= self.in_flight:
            self.send_priorities()
        return len(values)

    def give_back(self, mixed) -> None:
        pass                # the server's batches come as copies: nothing is lent

    def send_priorities(self) -> None:
        if self.priorities:
            self.updates.append(self.server.updates.remote(self.priorities))
            self.priorities = []
        if len(self.updates) > 2:
            self.updates = self.reap(self.updates)

    def replay_state(self) -> dict:
        self.send_priorities()         # before the state call: the server runs them in this order
        state, drawn = self.fetch(self.server.state_dict.remote(), CALL_TIMEOUT)
        self.drop_before = drawn
        return writable(state)

    def load_replay_state(self, state: dict, fresh: bool = True) -> None:
        self.fetch(self.server.load_state_dict.remote(state, fresh), CALL_TIMEOUT)

    def replay_nbytes(self) -> int:
        """As of the last counters fetched (the hardware monitor's thread reads it)."""
        return int(self.stats.get("nbytes", 0))

    def close(self) -> None:
        try:
            ray.kill(self.server, no_restart=True)
        except RayError:
            pass                                           # already gone

    # ------------------------------------------------------------------ the backend's
    def waitables(self) -> list:
        """Refs whose answer may make a batch ready: the backend wakes on them too."""
        return self.requests[:1]

    def hand_back(self, save_replay: bool) -> ReplayElsewhere:
        """At the end (before Ray shuts down, and the server with it): waits for every write
        sent, takes the counters and, for the final checkpoint, the replay's state. A dead
        server gives a stand-in whose replay_state raises ReplayLost (no final checkpoint)."""
        try:
            self.send_priorities()
            for ref in self.adds:
                self.fetch(ref, CALL_TIMEOUT, lost_ok=True)
            for ref in self.updates:
                self.fetch(ref, CALL_TIMEOUT)
            self.adds, self.updates = [], []
            state = self.replay_state() if save_replay else None
            self.stats = self.fetch(self.server.stats.options(concurrency_group=CONTROL).remote(), CALL_TIMEOUT)
            return ReplayElsewhere(None, state=state)
        except ReplayLost as err:
            return ReplayElsewhere(None, lost=err)

    def describe(self) -> dict:
        """summary.json's `replay`: where it ran and what passed through it."""
        return {"location": "replay_server", **self.place, **self.stats,
                "batches_dropped_at_saves": self.dropped, "lost_rollouts": self.lost_rollouts}

    # ------------------------------------------------------------------ internals
    def fetch(self, ref, timeout: float | None = None, lost_ok: bool = False):
        """ray.get, with a dead, hung or failing server as ReplayLost. lost_ok (an add): a
        rollout that was lost before the server could read it (its actor's node died) is
        counted and dropped, not fatal."""
        try:
            return ray.get(ref, timeout=timeout)
        except RayActorError as err:
            log.debug("the replay server's error: %s", err)     # Ray's account: many lines, for --debug
            raise ReplayLost(f"the replay server (pid {self.place['pid']} on node {self.place['node'][:12]}) died: "
                             "the run stops without a final checkpoint") from None
        except GetTimeoutError:
            raise ReplayLost(f"the replay server did not answer within {timeout:g} s: the run stops without a "
                             "final checkpoint") from None
        except RayTaskError as err:      # its own code raised
            raise ReplayLost(f"the replay server failed ({one_line(err)})") from None
        except RayError as err:
            if not lost_ok:
                raise ReplayLost(f"the replay server failed ({one_line(err)})") from None
            self.lost_rollouts += 1
            log.warning("a rollout was lost on its way to the replay server (%s): dropped", one_line(err))
            return None

    def reap(self, refs: list, lost_ok: bool = False) -> list:
        """The refs still running; the answers of the others are checked (a dead server raises)."""
        if not refs:
            return refs
        ready, running = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            self.fetch(ref, lost_ok=lost_ok)
        return running

    def poll_stats(self) -> None:
        """Asks for the server's counters at most every STATS_PERIOD s, never waiting for them."""
        if self.stats_call is not None:
            ready, _ = ray.wait([self.stats_call], timeout=0)
            if ready:
                self.stats, self.stats_call = self.fetch(self.stats_call), None
        elif time.monotonic() - self.stats_time > STATS_PERIOD:
            self.stats_call = self.server.stats.options(concurrency_group=CONTROL).remote()
            self.stats_time = time.monotonic()


def start_replay_server(build, node: str, driver_node: str, device: torch.device, in_flight: int,
                        max_writes: int) -> RemoteBatches:
    """Starts the server on `node` (learner: the driver's node, reserving no Ray CPU there,
    as the learner itself reserves none; a node id: reserving 1 CPU there) and waits until
    it has built its replay. build() -> ReplayMixer, run in the server."""
    target, cpus = (driver_node, 0) if node == "learner" else (node, SERVER_CPUS)
    server_class = ray.remote(concurrency_groups={SAMPLES: 1, CONTROL: 1})(ReplayServer)
    server = server_class.options(num_cpus=cpus, max_restarts=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
        target, soft=False)).remote(build)
    try:
        place = ray.get(server.where.options(concurrency_group=CONTROL).remote(), timeout=START_GRACE)
    except GetTimeoutError:
        raise ReplayLost(f"the replay server did not start within {START_GRACE:g} s on node {target[:12]}") from None
    except RayError as err:
        raise ReplayLost(f"the replay server failed to start ({one_line(err)})") from None
    log.info("replay server runs on node %s (pid %d)%s", place["node"][:12], place["pid"],
             ", the learner's" if place["node"] == driver_node else "")
    return RemoteBatches(server, place, device, in_flight, max_writes)

