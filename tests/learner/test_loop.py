"""herd/learner/loop.py: the one learner loop, driven by a scripted RolloutSource over a
real CartPole session (herd/training.py build_session: replays, learner, metrics), and the
Ray backend's source (herd/backends/ray_backend.py RayRollouts) over a pool that records
its calls."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import herd.learner.loop as loop_module
from herd.backends.ray_backend import RayRollouts
from herd.learner.loop import Arrival, run_loop
from herd.plan import prepare
from herd.training import build_session
from herd.store import TrajectorySlots

ENVS, UNROLL, ROLLOUTS = 2, 8, 12


@pytest.fixture
def session(tmp_path):
    plan = prepare({"env": "CartPole-v1", "seed": 3, "tensorboard": False, "basic_verbose": False,
                    "envs_per_worker": ENVS, "r_f_steps": UNROLL, "batch_size": 4, "caching": False,
                    "environment_max_steps": ENVS * UNROLL * ROLLOUTS, "save_model_period": 10**6})
    built = build_session(plan, tmp_path)
    yield built
    built.batches.close()
    if built.metrics is not None:
        built.metrics.close()


class ScriptedSource:
    """Hands over the same filled slot, one rollout per receive, and notes what the loop
    asks of it with the session's counters at that moment."""

    def __init__(self, session):
        self.session = session
        self.slots = TrajectorySlots(session.layout, 1, ENVS)
        for tensor in self.slots.tensors.values():
            tensor.zero_()                  # slots start as -1 where unwritten (actions): a played rollout
        self.slots.tensors["obs"].uniform_(-1.0, 1.0, generator=torch.Generator().manual_seed(0))
        self.events: list[tuple] = []
        self.sent = 0

    def receive(self, timeout: float) -> list[Arrival]:
        self.sent += 1
        self.events.append(("receive", self.sent))
        return [Arrival(self.sent % 3, self.slots.views(0), self.session.counters.updates, ENVS * UNROLL,
                        [(10.0, 10)], ticket=0)]

    def release(self, arrival: Arrival) -> None:
        self.events.append(("release", self.session.counters.rollouts))

    def after_training(self, trained: int) -> None:
        self.events.append(("trained", trained, self.session.counters.updates))

    def check_health(self) -> None:
        self.events.append(("health",))

    def summary(self) -> dict:
        return {"actor_restarts": 5}


def test_the_loop_ingests_releases_and_trains_every_rollout_until_the_budget(session, monkeypatch):
    monkeypatch.setattr(loop_module, "HEALTH_EVERY", 0.0)       # a health check every round
    published: list[int] = []
    source = ScriptedSource(session)
    assert run_loop(session, source, published.append, threading.Event()) == "finished"
    assert session.counters.rollouts == ROLLOUTS and session.counters.env_steps == ENVS * UNROLL * ROLLOUTS
    # Each rollout is released after it was counted and written, and before anything trains on it.
    releases = [event[1] for event in source.events if event[0] == "release"]
    assert releases == list(range(1, ROLLOUTS + 1))
    order = [event[0] for event in source.events]
    for i, name in enumerate(order):
        if name == "release":
            assert order[i - 1] == "receive" and order[i + 1] == "trained"
    # Four trajectories a batch, two per rollout: one update per two rollouts, each published.
    trained = [event[1] for event in source.events if event[0] == "trained"]
    assert sum(trained) == session.counters.updates == ROLLOUTS * ENVS // 4
    assert published == list(range(1, session.counters.updates + 1))
    assert ("health",) in source.events
    assert session.summary()["actor_restarts"] == 5


def test_a_stop_ends_the_loop_before_it_receives(session):
    stop = threading.Event()
    stop.set()
    source = ScriptedSource(session)
    assert run_loop(session, source, lambda version: None, stop) == "stopped"
    assert source.events == [] and session.counters.rollouts == 0


@pytest.mark.parametrize("seconds", [None, 1e-9], ids=["by-updates-only", "on-a-timer"])
def test_checkpoints_on_a_timer_as_well_as_by_updates(session, seconds):
    session.options.save_model_seconds = seconds
    run_loop(session, ScriptedSource(session), lambda version: None, threading.Event())
    session.saver.wait()
    written = sorted(p.name for p in (session.run_dir / "checkpoints").glob("ckpt_*.pt"))
    # No update reaches the period: only the timer writes, in the background, during the run.
    assert (written != []) == (seconds is not None), written


class RecordingPool:
    """RayActorPool as RayRollouts uses it: the calls it is asked to make."""

    class Actor:
        def __init__(self, failed=None):
            self.failed = failed

    def __init__(self):
        self.actors = [self.Actor(), self.Actor(failed="died")]
        self.calls: list[int] = []
        self.restarts, self.nodes, self.weights_taken = 1, {"n": 2}, 3

    def call(self, actor_id: int) -> None:
        self.calls.append(actor_id)


def test_ray_actors_are_called_again_after_training_and_only_when_alive():
    pool = RecordingPool()
    source = RayRollouts(pool, "driver")
    for actor_id in (0, 1, 0):
        arrival = Arrival(actor_id, {"obs": np.zeros(3)}, 0, 8, [])
        source.release(arrival)
        assert arrival.fields is None               # the rollout's arrays are let go
    assert pool.calls == []                         # not before the updates it made ready
    source.after_training(0)
    assert pool.calls == [0, 0]                     # actor 1 failed: the pool replaces it
    source.after_training(1)
    assert pool.calls == [0, 0]
    summary = source.summary()
    assert summary["actor_restarts"] == 1 and summary["replay"] == {"location": "learner", "node": "driver",
                                                                     "rollout_bytes": 0}
