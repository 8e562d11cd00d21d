"""An actor's free slot indices (herd/trajectory.py FreeSlots): a one-way pipe from the
learner to the actor process, in order, with a timeout, and a put to a dead actor lost
quietly (its slots are refilled into a new FreeSlots when it is restarted)."""
from __future__ import annotations

import multiprocessing
import queue
import time

import pytest

from herd.trajectory import FreeSlots


def take(free: FreeSlots, count: int, out) -> None:
    out.put([free.get(timeout=10) for _ in range(count)])


def test_indices_reach_the_actor_process_in_order():
    context = multiprocessing.get_context("spawn")
    free, out = FreeSlots(context), context.Queue()
    child = context.Process(target=take, args=(free, 5, out))
    child.start()
    for slot in (3, 0, 70_000, 2, 1):
        free.put(slot)
    assert out.get(timeout=60) == [3, 0, 70_000, 2, 1]
    child.join(10)
    assert child.exitcode == 0


def test_get_waits_at_most_its_timeout_and_a_dead_actors_puts_are_lost_quietly():
    context = multiprocessing.get_context("spawn")
    free = FreeSlots(context)
    start = time.monotonic()
    with pytest.raises(queue.Empty):
        free.get(timeout=0.2)
    assert 0.15 < time.monotonic() - start < 5
    child = context.Process(target=take, args=(free, 1, context.Queue()))
    child.start()
    child.kill()
    child.join(10)
    for slot in range(100):          # nobody reads: no error, no block
        free.put(slot)
    assert free.get(timeout=1) == 0  # the learner's own read end still holds them
    free.close()
