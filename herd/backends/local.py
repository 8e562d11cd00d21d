"""The local backend: actor processes on this machine, trajectories in shared memory.

`train_local` is the one function that wires every component of a local run:

    actors (processes) --slot index--> rollouts queue --> TrainingSession (replays, learner)
        ^                                                     |
        +---- free slot index (per-actor queue) <-------------+
        +---- versioned weights (SharedWeights) <------------- publish after each update
"""
from __future__ import annotations

import logging
import queue
import signal
import threading
import time

import torch.multiprocessing as mp

from herd.actors.actor import ActorSpec, run_actor
from herd.learner.session import TrainingSession
from herd.trajectory import TrajectorySlots
from herd.weights import SharedWeights

log = logging.getLogger("herd")


class ActorPool:
    """Starts actor processes, each owning `slots_per_actor` slots, and stops them."""

    def __init__(self, spec: ActorSpec, count: int, slots: TrajectorySlots, slots_per_actor: int,
                 weights: SharedWeights, context):
        self.spec, self.count, self.slots, self.weights = spec, count, slots, weights
        self.slots_per_actor = slots_per_actor
        self.context = context
        self.rollouts = context.Queue()
        self.stop_event = context.Event()
        self.free = [context.Queue() for _ in range(count)]
        self.processes: list = [None] * count

    def start(self) -> None:
        for actor_id in range(self.count):
            for k in range(self.slots_per_actor):
                self.free[actor_id].put(actor_id * self.slots_per_actor + k)
            self.start_actor(actor_id)

    def start_actor(self, actor_id: int) -> None:
        seed = self.spec.seed + 10_000 * actor_id
        spec = ActorSpec(**{**self.spec.__dict__, "seed": seed})
        process = self.context.Process(
            target=run_actor, name=f"herd-actor-{actor_id}", daemon=True,
            args=(actor_id, spec, self.slots, self.free[actor_id], self.rollouts, self.weights, self.stop_event))
        process.start()
        self.processes[actor_id] = process

    def release(self, actor_id: int, slot: int) -> None:
        self.free[actor_id].put(slot)

    def stop(self, timeout: float = 5.0) -> None:
        self.stop_event.set()
        deadline = time.monotonic() + timeout
        for process in self.processes:
            if process is not None:
                process.join(max(0.1, deadline - time.monotonic()))
        for process in self.processes:
            if process is not None and process.is_alive():
                log.warning("actor %s did not stop in time: terminating it", process.name)
                process.terminate()
                process.join(2.0)
        for q in [self.rollouts, *self.free]:
            q.cancel_join_thread()
            q.close()


def install_stop_signals(stop: threading.Event):
    """SIGINT/SIGTERM ask the run to stop after the current step; returns a restore function."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum, frame):
        if not stop.is_set():
            log.info("received %s: stopping and saving", signal.Signals(signum).name)
        stop.set()

    for sig in previous:
        signal.signal(sig, handler)
    return lambda: [signal.signal(sig, h) for sig, h in previous.items()]


def train_local(session: TrainingSession, spec: ActorSpec, worker_count: int, slots_per_actor: int,
                stop_requested: threading.Event) -> str:
    """Runs actors and the learner until the step budget or a stop request; returns why it ended."""
    context = mp.get_context("spawn")
    slots = TrajectorySlots(session.layout, worker_count * slots_per_actor, spec.envs_per_worker)
    weights = SharedWeights(session.learner.model, context)
    weights.publish(session.learner.model, version=session.counters.updates)
    pool = ActorPool(spec, worker_count, slots, slots_per_actor, weights, context)
    pool.start()
    publish = lambda version: weights.publish(session.learner.model, version)  # noqa: E731
    try:
        while not session.done and not stop_requested.is_set():
            try:
                rollout = pool.rollouts.get(timeout=0.5)
            except queue.Empty:
                dead = [p.name for p in pool.processes if not p.is_alive()]
                if dead:
                    raise RuntimeError(f"actor process(es) {', '.join(dead)} died")
                session.show_progress()
                continue
            session.ingest(slots.views(rollout.slot), rollout.version, rollout.steps, rollout.episodes)
            pool.release(rollout.actor_id, rollout.slot)
            session.train_ready_batches(publish)
    finally:
        pool.stop()
    return "stopped" if stop_requested.is_set() else "finished"
