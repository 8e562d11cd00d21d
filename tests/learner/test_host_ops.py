"""What the learner's host does around one update, counted (not timed) on a CPU learner:
the torch ops that train_ready_batches dispatches for one batch of a Pong run, after the first
(herd/training.py build_session; the batch source direct, so everything runs on this
thread), with the gradient step replaced by one that returns a real step's metrics
without computing, and the weights published into SharedWeights as a run does. The
bound is today's count with a little room: the update's bookkeeping (the batch's
tensors, the publish) must stay about ten ops, whatever the batch size; the metrics are
summed inside the update (herd/learner/learner.py), so on a GPU inside its graph. The
negative control sums them on the host's side of the update, as the session once did,
and sees the bound fail."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from herd.learner.learner import StepResult
from herd.learner.publisher import WeightPublisher
from herd.plan import prepare
from herd.training import build_session
from herd.store import TrajectorySlots
from herd.weights import SharedWeights

HOST_OPS_PER_UPDATE = 12      # aten ops dispatched by train_ready_batches for one update, at most


class OpCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def pong_plan():
    return prepare({"env": "PongNoFrameskip-v4", "seed": 1, "tensorboard": False, "basic_verbose": False,
                    "learner_precision": "fp32", "learner_layout": "nchw", "learner_compile": False,
                    "envs_per_worker": 8, "batch_size": 8, "r_f_steps": 20, "worker_count": 1, "caching": False})


def ops_of_one_update(plan, tmp_path, sums_outside: bool = False) -> tuple[int, Counter]:
    session = build_session(plan, tmp_path)
    metrics = {name: torch.zeros(()) for name in (*session.options.metric_names, "grad_norm", "lr", "skipped")}

    def stub_step(batch):
        if sums_outside:
            session.metric_sums.add(metrics)      # the injected defect: the sums outside the update
        return StepResult(metrics)
    session.learner.step = stub_step
    weights = SharedWeights(session.learner.model)
    publish = WeightPublisher(session.learner.model, weights.publish_vector)
    slots = TrajectorySlots(plan.layout, 1, 8)
    for tensor in slots.tensors.values():
        tensor.zero_()
    try:
        session.ingest(slots.views(0), version=0, steps=160, episodes=[])
        assert session.train_ready_batches(publish) == 1    # the first: what is made once happens here
        session.ingest(slots.views(0), version=1, steps=160, episodes=[])
        counting = OpCount()
        with counting:
            trained = session.train_ready_batches(publish)
        assert trained == 1 and weights.version == 2        # the update ran and was published
    finally:
        publish.close()
        session.batches.close()
        if session.metrics is not None:
            session.metrics.close()
    return sum(counting.ops.values()), counting.ops


def test_one_update_costs_the_host_a_bounded_number_of_torch_ops(pong_plan, tmp_path):
    total, ops = ops_of_one_update(pong_plan, tmp_path)
    assert total <= HOST_OPS_PER_UPDATE, sorted(ops.items())


def test_the_bound_sees_metrics_summed_outside_the_update(pong_plan, tmp_path):
    total, ops = ops_of_one_update(pong_plan, tmp_path, sums_outside=True)
    assert total > HOST_OPS_PER_UPDATE, sorted(ops.items())


def test_the_frame_statistics_are_written_inside_the_weight_guard(pong_plan, tmp_path):
    """Pong's per-pixel statistics are frozen parameters of the learner's model, which a
    CPU run shares with its actors (herd/weights.py adopt): each rollout's update of them
    runs inside the learner's weight_writes, as the optimizer's steps do (else a reader
    could copy a mean of one rollout beside a variance of the one before)."""
    import contextlib

    session = build_session(pong_plan, tmp_path)
    stats = session.observation_stats
    assert stats is not None and any(p is stats.mean for p in session.learner.model.parameters())
    inside, merged_inside = [], []

    @contextlib.contextmanager
    def writing():
        inside.append(True)
        try:
            yield
        finally:
            inside.pop()

    session.learner.write_weights_within(writing)
    merge = stats.merge
    stats.merge = lambda *args: (merged_inside.append(bool(inside)), merge(*args))[1]
    slots = TrajectorySlots(pong_plan.layout, 1, 8)
    try:
        session.ingest(slots.views(0), version=0, steps=160, episodes=[])
    finally:
        session.batches.close()
        if session.metrics is not None:
            session.metrics.close()
    assert merged_inside == [True]
