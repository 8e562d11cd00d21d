"""The learner's loop, the same for every backend. A backend wires its actors into a
RolloutSource; the loop does the rest:

    source.receive -> session.ingest (count, write into the replays, or keep it in its
        slot until trained on) -> source.release
        -> session.train_ready_batches (sample, gather, step, priorities, publish, log,
           checkpoint) -> source.after_training
    every second: source.check_health, the progress line

The sources: herd/backends/local.py LocalRollouts (actor processes, slots in shared
memory) and herd/backends/ray_backend.py RayRollouts (Ray actors, object refs)."""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Protocol

from herd.learner.session import TrainingSession
from herd.store import TrajectorySlots

log = logging.getLogger("herd")

RECEIVE_WAIT = 0.5          # seconds the loop waits for a rollout before looking at the rest
HEALTH_EVERY = 1.0          # seconds between the source's health checks


@dataclass
class Arrival:
    """One finished rollout as a backend hands it over."""
    actor_id: int
    fields: Any             # field -> [T(+1), E, ...] views or arrays, or (a replay server) their object ref
    version: int            # the weights it was acted with (updates)
    steps: int              # environment steps in it
    episodes: list          # (score, length) of the games that ended in it
    ticket: Any = None      # what the source needs to take it back (the local backend's slot)
    start: int | None = None    # where `fields` begin among the positions of source.slots (None: not slots)


class RolloutSource(Protocol):
    """Where finished rollouts come from, and where their storage goes back to."""

    slots: TrajectorySlots | None   # the store arrivals are positions of (start), if any: a
                                    # CPU learner's queue may read them there (herd/replay/slot_queue.py)

    def receive(self, timeout: float) -> list[Arrival]:
        """The rollouts that arrived within `timeout` seconds (or sooner, as the source sees fit)."""

    def release(self, arrival: Arrival) -> None:
        """The session has written what it keeps of `arrival`: its storage may be reused."""

    def after_training(self, trained: int) -> None:
        """`trained` updates (0 or more) were just trained and their weights published: the
        actors get what waits for that (withheld slots, calls carrying the newest weights)."""

    def check_health(self) -> None:
        """Replaces dead or hung actors (and servers); raises ActorFailure past the limit."""

    def summary(self) -> dict:
        """What summary.json says about the actors (restarts, nodes, ...)."""


def run_loop(session: TrainingSession, source: RolloutSource, publish: Callable[[int], None],
             stop: threading.Event) -> str:
    """Receives, writes, releases and trains until the step budget is spent or `stop` is
    set; returns why it ended ("finished" or "stopped"). publish(version) hands the
    weights of each trained batch to the actors."""
    session.source = source
    if source.slots is not None and session.batches.read_slots(source.slots):
        log.info("the on-policy queue reads fresh rollouts in the actors' slots (no copy out of them)")

    def train() -> int:
        trained = session.train_ready_batches(publish)
        source.after_training(trained)
        return trained

    last_check = time.monotonic()
    while not session.done and not stop.is_set():
        if not session.batches.has_room():
            # The replay writer is full: train; finished rollouts wait with the source meanwhile.
            if not train():
                time.sleep(0.001)
            continue
        for arrival in source.receive(RECEIVE_WAIT):
            # Released now if ingest copied what it keeps, else once the queue has trained on it.
            if not session.ingest(arrival.fields, arrival.version, arrival.steps, arrival.episodes, arrival.actor_id,
                                  start=arrival.start, on_free=partial(source.release, arrival)):
                source.release(arrival)
            train()
            if session.done or stop.is_set():
                break
        train()     # batches ready without a new rollout: prepared ahead, a replay server's answer
        if time.monotonic() - last_check > HEALTH_EVERY:
            source.check_health()
            last_check = time.monotonic()
            session.show_progress()
    return "stopped" if stop.is_set() else "finished"
