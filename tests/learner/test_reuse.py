"""The learner's multi-pass update (herd/learner/reuse.py, herd/learner/learner.py) with
APPO's loss: every stored batch trained in exactly passes x minibatches gradient steps,
each pass a permutation of the batch's columns; no host read over 20 stored batches; the
target synced updates // period times; one learning-rate step per stored batch. Counts,
on a CPU (benchmarks/op_counts.py): they hold on a GPU too."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from herd.learner.learner import Learner, build_optimizer, build_scheduler
from herd.learner.reuse import Reuse, take_columns
from herd.losses.appo import AppoLoss, AppoLossWeights
from herd.models import build_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from op_counts import count  # noqa: E402

T, A, OBS, B = 5, 3, (4,), 8
NAMES = ("loss", "pg_loss", "value_loss", "entropy", "kl_target", "kl_coeff", "clip_fraction", "mean_rho",
         "mean_ratio", "return_scale", "grad_norm", "lr")


def batches(n: int, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [{"obs": torch.randn(T + 1, B, *OBS, generator=g), "action": torch.randint(0, A, (T, B), generator=g),
             "reward": torch.randn(T, B, generator=g), "done": torch.rand(T, B, generator=g) < 0.15,
             "trunc_value": torch.zeros(T, B), "behaviour_logits": torch.randn(T, B, A, generator=g),
             "behaviour_value": torch.randn(T, B, generator=g), "replayed": torch.zeros(B, dtype=torch.bool)}
            for _ in range(n)]


class CountingLoss(AppoLoss):
    """APPO's loss, recording the columns of every minibatch it is called on (its
    observations carry the column index in their first feature)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.columns: list[list[int]] = []

    def __call__(self, minibatch, out):
        self.columns.append(minibatch["obs"][0, :, 0].long().tolist())
        return super().__call__(minibatch, out)


def learner(reuse=Reuse(3, 4), period=1, loss_class=AppoLoss, weights=AppoLossWeights(use_kl_loss=True,
                                                                                     normalize_returns=True)):
    torch.manual_seed(0)
    model = build_model("mlp", OBS, "float32", A, 8, hidden_sizes=(16,))
    optimizer = build_optimizer("adam", model.parameters(), 1e-3, 0.01)
    scheduler = build_scheduler(optimizer, 1e-3, 1e-5, 100)
    loss = loss_class(model, weights, target_update_period=period)
    return Learner(model, optimizer, scheduler, loss, 0.5, reuse=reuse, metric_names=NAMES[:-2]), loss


def test_every_stored_batch_is_trained_in_passes_times_minibatches_steps_over_permutations():
    fast, loss = learner(loss_class=CountingLoss)
    data = batches(5)
    for batch in data:
        batch["obs"][..., 0] = torch.arange(B, dtype=torch.float32)       # column ids
        fast.step(batch)
    assert len(loss.columns) == 5 * 3 * 4                                  # K x M calls per stored batch
    assert all(len(columns) == B // 4 for columns in loss.columns)
    passes = [sum(loss.columns[i:i + 4], []) for i in range(0, len(loss.columns), 4)]
    assert all(sorted(p) == list(range(B)) for p in passes)                 # each pass: every column once
    assert len({tuple(p) for p in passes}) > 1                              # shuffled, not one fixed order
    steps = {int(s["step"]) for s in fast.optimizer.state.values()}
    assert steps == {5 * 3 * 4}                                             # each step applied
    assert fast.scheduler.last_epoch == 5                                   # the schedule: once per stored batch


def test_every_minibatch_step_writes_the_weights_inside_the_writing_guard():
    """A CPU learner's parameters shared with the actors (herd/weights.py adopt): each of the
    K x M optimizer steps of a stored batch runs inside weight_writes, so that a reader
    whose copy overlaps one copies again."""
    import contextlib

    fast, _ = learner()
    inside, entered, steps_inside = [], [], []

    @contextlib.contextmanager
    def writing():
        entered.append(1)
        inside.append(True)
        try:
            yield
        finally:
            inside.pop()

    fast.write_weights_within(writing)
    step = fast.optimizer.step
    fast.optimizer.step = lambda ok, lr: (steps_inside.append(bool(inside)), step(ok, lr))[1]
    for batch in batches(3):
        fast.step(batch)
    assert len(entered) == 3 * 3 * 4
    assert steps_inside == [True] * (3 * 3 * 4)


def test_twenty_multi_pass_updates_make_no_host_read_and_sync_the_target_every_period():
    fast, loss = learner(reuse=Reuse(2, 2), period=3)
    data = batches(22)
    for batch in data[:2]:                                                  # the optimizer's state is made here
        fast.step(batch)

    def train():
        for batch in data[2:]:
            fast.step(batch)                # its metrics summed inside the update
    assert count(train).host_reads == 0
    assert loss.stored_batches == 22 and loss.target_syncs == 22 // 3
    assert fast.metric_sums.updates == 22
    means, _, _ = fast.metric_sums.read()
    assert all(means[name] == means[name] for name in NAMES)               # every metric summed: no NaN


def test_a_host_read_in_the_loss_is_counted():
    """The negative control of the count above: a loss that reads a float per minibatch."""
    class Reading(AppoLoss):
        def __call__(self, minibatch, out):
            loss, metrics = super().__call__(minibatch, out)
            float(metrics["clip_fraction"])
            return loss, metrics
    fast, _ = learner(reuse=Reuse(2, 2), loss_class=Reading)
    data = batches(4)
    fast.step(data[0])
    assert count(lambda: [fast.step(b) for b in data[1:]]).host_reads == 3 * 2 * 2


def test_one_pass_of_one_minibatch_is_one_plain_step_on_the_whole_batch():
    """With Reuse(1, 1) the update is the loss on the whole stored batch, in its column order
    (a permutation of every column: the mean over them is the same)."""
    fast, loss = learner(reuse=Reuse(1, 1), weights=AppoLossWeights())
    batch = batches(1)[0]
    params = [p.detach().clone() for p in fast.model.parameters()]
    fast.step(batch)
    by_hand, hand_loss = learner(reuse=None, weights=AppoLossWeights())
    hand_loss.begin_batch()
    stored = hand_loss.prepare(batch)
    out = by_hand.model(stored["obs"])
    value, _ = hand_loss(stored, out)
    by_hand.optimizer.zero_grad()
    value.backward()
    torch.nn.utils.clip_grad_norm_(list(by_hand.model.parameters()), 0.5)
    by_hand.optimizer.step(torch.tensor(True), by_hand.scheduler.lr)
    for a, b in zip(fast.model.parameters(), by_hand.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(a, before) for a, before in zip(fast.model.parameters(), params))


def test_take_columns_selects_along_the_batch_axis():
    batch = batches(1)[0]
    columns = torch.tensor([3, 1])
    part = take_columns(batch, columns)
    assert part["obs"].shape == (T + 1, 2, *OBS) and part["replayed"].shape == (2,)
    assert torch.equal(part["reward"], batch["reward"][:, [3, 1]])


def test_a_batch_that_does_not_split_is_refused():
    with pytest.raises(ValueError, match="does not split into 3 equal minibatches"):
        Reuse(2, 3).minibatch_size(8)
