"""What the learner's host does to a Pong frame between the actor's slot and the gradient
step, counted (not timed) on a CPU learner: the bytes of frames copied, per trajectory,
by numpy and torch (tests/copy_counting.py), through the real session, batch sources and
replays of a Pong run (herd/training.py build_session) with the step replaced by one that
keeps the batches it is given. The target is one copy: the queue's write out of the slot;
the step reads the batch where the queue holds it (lent, herd/replay/mixer.py). Where the
queue reads the actors' slots (the local backend's, herd/replay/slot_queue.py), none: the
step reads the batch in the slot. The negative controls inject one more copy and see the
count, and its check, move."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import copy_counting
from copy_counting import CopyCounter, ObsArray, TorchCopies, in_thread, numpy_wrapped
from herd_testing import wait_for
import herd.learner.batches as batches_module
import herd.learner.staging as staging_module
import herd.replay.mixer as mixer_module
from herd.learner.batches import PrefetchedBatches
from herd.learner.learner import StepResult
from herd.plan import prepare
from herd.training import build_session
from herd.store import TrajectorySlots

ROLLOUTS = 2          # of 8 environments each: one batch of 8 each (Pong's CPU batch)
ENVS = 8
# Copies of each frame between the slot and the step on a CPU learner.
COPIES = {
    True: 1,     # prepared ahead (Pong's default): the queue's write, straight out of the slot
                 # while no worker holds the mixer; the batch is lent to the step in place
    False: 1,    # direct: the queue's write
}


@pytest.fixture(scope="module")
def pong_plan():
    return prepare({"env": "PongNoFrameskip-v4", "seed": 1, "tensorboard": False, "basic_verbose": False,
                    "learner_precision": "fp32", "learner_layout": "nchw", "learner_compile": False,
                    "envs_per_worker": ENVS, "batch_size": 8, "r_f_steps": 20, "worker_count": 1})


class KeptBatches:
    """The learner's step, stubbed: checks each batch's frames against those it expects
    (a batch is valid until it is given back: a gathered batch's buffer is reused after),
    returns zero metrics of the names the real step gives."""

    def __init__(self, session):
        names = (*session.options.metric_names, "grad_norm", "lr", "skipped")
        self.metrics = {name: torch.zeros(()) for name in names}
        self.expected: list[np.ndarray] = []        # the frames of batch k, set by the test
        self.frames: list[bool] = []                # batch k held them when the step read it

    def __call__(self, batch: dict) -> StepResult:
        want = torch.from_numpy(np.asarray(self.expected[len(self.frames)]).view(np.ndarray))
        self.frames.append(torch.equal(batch["obs"], want))    # aten equal: no copy to count
        return StepResult(self.metrics)


def session_of(plan, tmp_path, caching: bool, monkeypatch, counter: CopyCounter):
    plan.cfg.replay.caching = caching
    # The batch thread runs under its own counting mode (a dispatch mode is per thread).
    monkeypatch.setattr(PrefetchedBatches, "work", in_thread(PrefetchedBatches.work, lambda: TorchCopies(counter)))
    session = build_session(plan, tmp_path)
    for replay in session.batches.mixer.replays:
        storage = replay.storage
        storage.arrays["obs"] = storage.arrays["obs"].view(ObsArray)
    kept = KeptBatches(session)
    session.learner.step = kept
    return session, kept


def filled_slots(plan) -> TrajectorySlots:
    slots = TrajectorySlots(plan.layout, ROLLOUTS, ENVS)
    rng = np.random.default_rng(0)
    obs = slots.tensors["obs"].numpy()
    obs[:] = rng.integers(0, 256, obs.shape, dtype=np.uint8)
    slots.tensors["action"].zero_()
    for name in ("reward", "trunc_value", "behaviour_value", "behaviour_logits"):
        slots.tensors[name].zero_()
    slots.tensors["done"].zero_()
    return slots


def copies_per_trajectory(plan, tmp_path, caching: bool, monkeypatch, in_slots: bool = False) -> tuple[float, dict]:
    """(frames' bytes copied / the frames' bytes of the trajectories trained, the bytes by op).
    in_slots: the queue reads the rollouts in the slots (as the local backend's loop has it)."""
    obs_shape, obs_dtype = plan.layout.obs_shape, plan.layout.obs_dtype
    counter = CopyCounter(obs_shape, obs_dtype)
    monkeypatch.setattr(copy_counting, "COUNTER", counter)
    session, kept = session_of(plan, tmp_path, caching, monkeypatch, counter)
    slots = filled_slots(plan)
    kept.expected = [slots.views(slot)["obs"] for slot in range(ROLLOUTS)]
    freed = []
    if in_slots:
        slots.arrays["obs"] = slots.arrays["obs"].view(ObsArray)
        assert session.batches.read_slots(slots)
    try:
        with TorchCopies(counter), numpy_wrapped(monkeypatch, counter):
            for slot in range(ROLLOUTS):
                views = slots.views(slot)
                views["obs"] = views["obs"].view(ObsArray)
                in_place = session.ingest(views, version=0, steps=ENVS * 20, episodes=[], start=slot * ENVS,
                                      on_free=lambda slot=slot: freed.append(slot))
                assert in_place == in_slots
                # Trained before the next rollout comes: no batch thread holds the mixer then,
                # so the next rollout goes straight in (a held mixer costs one copy more:
                # test_a_busy_mixer_costs_one_copy_more).
                assert wait_for(lambda: session.train_ready_batches(lambda version: None) >= 0
                                and len(kept.frames) == slot + 1, timeout=30, interval=0.01)
    finally:
        session.batches.close()
    assert freed == (list(range(ROLLOUTS)) if in_slots else [])     # each slot back once trained on
    # The step got every frame of every slot, in order: the count is of a path that delivers.
    assert kept.frames == [True] * ROLLOUTS
    trajectory_bytes = plan.layout.fields()["obs"][0][0] * int(np.prod(obs_shape)) * np.dtype(obs_dtype).itemsize
    return counter.bytes / (ROLLOUTS * ENVS * trajectory_bytes), counter.by_op


def check_copies(caching: bool, copies: float, by_op: dict) -> None:
    assert copies == COPIES[caching], sorted(by_op.items())


@pytest.mark.parametrize("caching", [True, False], ids=["prepared-ahead", "direct"])
def test_no_frame_copy_where_the_queue_reads_the_slots(pong_plan, tmp_path, caching, monkeypatch):
    copies, by_op = copies_per_trajectory(pong_plan, tmp_path, caching, monkeypatch, in_slots=True)
    assert copies == 0, sorted(by_op.items())


def test_a_batch_gathered_out_of_the_slots_is_counted(pong_plan, tmp_path, monkeypatch):
    """Negative control of the above: the slots gather instead of lending a view."""
    monkeypatch.setattr(TrajectorySlots, "lend", lambda self, positions: None)
    copies, by_op = copies_per_trajectory(pong_plan, tmp_path, False, monkeypatch, in_slots=True)
    assert copies == 1, sorted(by_op.items())


@pytest.mark.parametrize("caching", [True, False], ids=["prepared-ahead", "direct"])
def test_frame_copies_from_slot_to_step_on_a_cpu_learner(pong_plan, tmp_path, caching, monkeypatch):
    copies, by_op = copies_per_trajectory(pong_plan, tmp_path, caching, monkeypatch)
    check_copies(caching, copies, by_op)


def test_one_more_numpy_copy_is_counted(pong_plan, tmp_path, monkeypatch):
    """Negative control: the mixer's join copies once more (numpy)."""
    join = mixer_module.concat_columns
    monkeypatch.setattr(mixer_module, "concat_columns", lambda parts: np.copy(join(parts)))
    copies, by_op = copies_per_trajectory(pong_plan, tmp_path, False, monkeypatch)
    assert copies == COPIES[False] + 1, by_op
    with pytest.raises(AssertionError):
        check_copies(False, copies, by_op)


@pytest.mark.parametrize("caching", [True, False], ids=["prepared-ahead", "direct"])
def test_one_more_torch_copy_is_counted(pong_plan, tmp_path, caching, monkeypatch):
    """Negative control: the batch's frames are cloned on their way to the step (torch),
    in the batch thread where batches are prepared ahead."""
    module = staging_module if caching else batches_module
    to_tensors = module.to_tensors

    def cloned(*args, **kwargs):
        tensors = to_tensors(*args, **kwargs)
        return {**tensors, "obs": tensors["obs"].clone()}
    monkeypatch.setattr(module, "to_tensors", cloned)
    copies, by_op = copies_per_trajectory(pong_plan, tmp_path, caching, monkeypatch)
    assert copies == COPIES[caching] + 1, by_op
    with pytest.raises(AssertionError):
        check_copies(caching, copies, by_op)


def test_a_busy_mixer_costs_one_copy_more(pong_plan, tmp_path, monkeypatch):
    """Prepared ahead, a rollout that arrives while a batch thread holds the mixer is copied
    out of its slot and written later (the slot goes back to its actor at once): one copy
    more, and the frames still reach the step intact (checked in copies_per_trajectory).
    Catches a put that waits for the mixer, or drops the rollout, when it is busy."""
    real_put = PrefetchedBatches.put_rollout

    def put_while_busy(self, views, version):
        with self.lock:                           # as a batch thread sampling would
            finished = threading.Event()
            thread = threading.Thread(target=lambda: (real_put(self, views, version), finished.set()))
            thread.start()
            assert finished.wait(10), "put waited for the mixer"
        thread.join()
    monkeypatch.setattr(PrefetchedBatches, "put_rollout", put_while_busy)
    copies, by_op = copies_per_trajectory(pong_plan, tmp_path, True, monkeypatch)
    assert copies == COPIES[True] + 1, by_op
