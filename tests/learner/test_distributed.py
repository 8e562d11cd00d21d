"""Several learners (herd/learner/distributed.py), two CPU processes on gloo: the weights
stay bit-identical, one update of two learners equals one update of one learner on both
batches, counters and episodes reach every learner, a non-finite loss or a stop vote on
one learner is honoured by both, and a learner that dies is noticed at once."""
from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from impala_testing import impala_batch
from herd.errors import LearnerFailure
from herd.learner.distributed import (GroupSync, LearnerGroup, broadcast_state, join_group, leave_group,
                                      private_rendezvous)
from herd.learner.optim import GuardedSGD
from herd.learner.learner import Learner, build_optimizer, build_scheduler
from herd.losses.impala import ImpalaLossWeights, impala_loss
from herd.models import build_model

T, B, A = 5, 4, 3
K = 6                   # updates in the bit-identity check


def concat(a: dict, b: dict) -> dict:
    """Batches are time-major [T(+1), B, ...] ("replayed" is [B]): join them on the B axis."""
    return {k: torch.cat([a[k], b[k]], dim=0 if k == "replayed" else 1) for k in a}


def new_model(seed: int):
    torch.manual_seed(seed)
    return build_model("mlp", (4,), "float32", A, 8, hidden_sizes=(16,))


def new_learner(model, optimizer: str, grad_sync=None) -> Learner:
    loss = lambda batch, out: impala_loss(batch, out, weights=ImpalaLossWeights())  # noqa: E731
    if optimizer == "sgd":
        opt = GuardedSGD(model.parameters(), lr=1.0)
        return Learner(model, opt, build_scheduler(opt, 1.0, 1.0, 1), loss, 0.0, grad_sync=grad_sync)
    opt = build_optimizer("adam", model.parameters(), 0.01, 0.01)
    return Learner(model, opt, build_scheduler(opt, 0.01, 1e-5, 100), loss, 40.0, grad_sync=grad_sync)


def params(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


HANG_TIMEOUT = 3.0       # the group's timeout in the "hangs" scenario
# One pair of processes runs these one after the other: all but the last leave the group
# whole, and in the last learner 1 dies (the "hangs" scenario needs its own short timeout).
SHARED = ("identical", "one_update", "counters", "rounds", "nan_on_one", "stop_vote", "dies")


def meet(rank: int, out: str) -> None:
    """Both processes have started (imports done) before either joins the group, so that
    the rendezvous's timeout does not include the other process's start-up."""
    open(os.path.join(out, f"ready{rank}"), "w").close()
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(out, f"ready{1 - rank}")):
        if time.monotonic() > deadline:
            raise TimeoutError("the other learner process never started")
        time.sleep(0.02)


def worker(rank: int, rendezvous: str, out: str, scenario: str) -> None:
    meet(rank, out)
    group = join_group(rank, 2, "cpu", timeout_s=120, rendezvous=rendezvous)
    if scenario == "hangs":
        # Only the round is given the short timeout: with it on the rendezvous as well, a
        # loaded machine (load 20 on 2 cores) failed the join itself in 2 of 60 runs.
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=HANG_TIMEOUT))
    try:
        for name in SHARED if scenario == "shared" else (scenario,):
            result = run_scenario(rank, group, name, out)
            if result is not None:
                torch.save(result, os.path.join(out, f"rank{rank}_{name}.pt"))
    finally:
        leave_group()


def run_scenario(rank: int, group, scenario: str, out: str) -> dict | None:
    model = new_model(seed=rank + 1)        # different on purpose: broadcast_state makes them equal
    broadcast_state(model)
    result = {"initial": params(model)}
    sync = GroupSync(group, model.parameters(), max_episodes=4)
    if scenario == "identical":
        learner = new_learner(model, "adam", sync.exchange)
        result["metrics"] = [learner.step(impala_batch(T, B, A, seed=100 * k + rank)).metrics for k in range(K)]
    elif scenario == "one_update":
        learner = new_learner(model, "sgd", sync.exchange)
        result["metrics"] = [learner.step(impala_batch(T, B, A, seed=rank)).metrics]
    elif scenario == "counters":
        # 6 episodes on learner 0 with room for 4 per row: two rounds; counters exact.
        sync.pending.add(1000 + rank, stale=bool(rank), episodes=[(float(i), 10 + i) for i in range(6 - 5 * rank)])
        rounds = [sync.exchange(with_gradients=False)]
        result["first_more"] = sync.more
        tallies = sync.take_received()
        while sync.more:
            sync.exchange(with_gradients=False, stop=True)
            tallies += sync.take_received()
        result["tallies"] = [(t.env_steps, t.rollouts, t.stale, t.episodes) for t in tallies]
        result["rounds"], result["stopped"] = rounds, sync.stopped
    elif scenario == "rounds":
        # One update of several gradient steps (APPO's passes): a round per step, each
        # carrying what arrived since the one before; the session takes them once.
        for steps in (7, 5):
            sync.pending.add(steps + rank, stale=False, episodes=[(float(steps), steps)])
            sync.exchange(with_gradients=False)
        result["tallies"] = [(t.env_steps, t.rollouts, t.episodes) for t in sync.take_received()]
    elif scenario == "nan_on_one":
        learner = new_learner(model, "adam", sync.exchange)
        result["metrics"] = [learner.step(impala_batch(T, B, A, seed=rank, nan_reward=rank == 1)).metrics]
    elif scenario == "stop_vote":
        if rank == 0:
            learner = new_learner(model, "adam", sync.exchange)
            step = learner.step(impala_batch(T, B, A, seed=0))
            result["metrics"], result["step_stopped"] = [step.metrics], step.stopped
        else:
            result["applied"] = sync.exchange(with_gradients=False, stop=True)
    elif scenario in ("dies", "hangs"):
        released = os.path.join(out, "released")
        if rank == 1 and scenario == "dies":
            os._exit(3)                     # gone without a word, like kill -9
        if rank == 1:                       # alive but never joins the round, until rank 0 has given up
            while not os.path.exists(released):
                time.sleep(0.1)
            os._exit(0)
        learner = new_learner(model, "adam", sync.exchange)
        try:
            learner.step(impala_batch(T, B, A, seed=0))
            result["error"] = None
        except LearnerFailure as err:
            result["error"] = str(err)
        open(released, "w").close()
    result["final"] = params(model)
    return result


def run_pair(tmp_path, scenario: str, timeout: float = 90):
    """[rank 0's results] of `scenario` (in which learner 1 leaves), or for "shared" a
    dict: scenario -> [rank 0, rank 1] ([rank 0] for "dies")."""
    context = mp.get_context("spawn")
    with private_rendezvous() as rendezvous:
        processes = [context.Process(target=worker, args=(rank, rendezvous, str(tmp_path), scenario))
                     for rank in range(2)]
        for p in processes:
            p.start()
        for p in processes:
            p.join(timeout)
        for p in processes:
            if p.is_alive():
                p.kill()
                pytest.fail(f"{scenario}: a learner process hung")
    assert processes[0].exitcode == 0, (scenario, processes[0].exitcode)
    if scenario == "shared":
        assert processes[1].exitcode == 3, processes[1].exitcode           # it died in the last scenario
        return {name: [torch.load(tmp_path / f"rank{r}_{name}.pt", weights_only=False)
                       for r in ([0] if name == "dies" else [0, 1])] for name in SHARED}
    return [torch.load(tmp_path / f"rank0_{scenario}.pt", weights_only=False)]


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    return run_pair(tmp_path_factory.mktemp("learner_pair"), "shared")


def test_weights_are_bit_identical_on_both_learners_after_k_updates(shared):
    first, second = shared["identical"]
    for name in first["initial"]:
        assert torch.equal(first["initial"][name], second["initial"][name]), name     # broadcast at start
        assert torch.equal(first["final"][name], second["final"][name]), name         # same bits after K updates
    changed = [n for n in first["initial"] if not torch.equal(first["initial"][n], first["final"][n])]
    assert len(changed) >= len(first["initial"]) - 2, changed      # all but the feature head (no gradient)
    assert all(m["skipped"] == 0 for m in first["metrics"] + second["metrics"])
    # The averaged gradient is identical on both, so is its norm; the losses are each learner's own.
    assert [m["grad_norm"] for m in first["metrics"]] == [m["grad_norm"] for m in second["metrics"]]
    assert first["metrics"][0]["loss"] != second["metrics"][0]["loss"]


def test_one_update_of_two_learners_equals_one_learner_on_both_batches(shared):
    """herd's losses are means over the batch's T x B steps, so the average of the two
    learners' gradients (batches A and B) equals the gradient on A+B only because A and B
    have the same size (B columns each, no LASER mask, no replayed columns)."""
    first, second = shared["one_update"]
    single = new_model(seed=0)
    single.load_state_dict(first["initial"])
    both = concat(impala_batch(T, B, A, seed=0), impala_batch(T, B, A, seed=1))
    new_learner(single, "sgd").step(both)                          # SGD lr 1: params move by -grad
    moved = 0.0
    for name, value in single.state_dict().items():
        assert torch.equal(first["final"][name], second["final"][name])
        torch.testing.assert_close(first["final"][name], value, rtol=1e-5, atol=1e-6)
        moved = max(moved, float((value - first["initial"][name]).abs().max()))
    assert moved > 1e-3                                                        # the update did something


def test_counters_and_episodes_reach_every_learner_in_rank_order(shared):
    first, second = shared["counters"]
    assert first["tallies"] == second["tallies"]
    assert first["first_more"] and first["rounds"] == [False]        # no gradients: nothing to apply
    (steps0, rollouts0, stale0, episodes0), (steps1, rollouts1, stale1, episodes1) = first["tallies"][:2]
    assert (steps0, rollouts0, stale0, steps1, rollouts1, stale1) == (1000, 1, 0, 1001, 1, 1)
    assert episodes0 == [(float(i), 10 + i) for i in range(4)] and episodes1 == [(0.0, 10)]
    assert [e for t in first["tallies"][2:] for e in t[3]] == [(4.0, 14), (5.0, 15)]   # the drain round
    assert first["stopped"] and second["stopped"]


def test_the_counts_of_every_round_of_an_update_are_kept(shared):
    """Catches counts kept from the last round only (a multi-step update lost its first
    rounds' steps and games: two APPO learners never reached their step budget)."""
    first, second = shared["rounds"]
    assert first["tallies"] == second["tallies"] == [(12, 2, [(7.0, 7), (5.0, 5)]), (14, 2, [(7.0, 7), (5.0, 5)])]


def test_a_non_finite_loss_on_one_learner_skips_the_update_on_both(shared):
    first, second = shared["nan_on_one"]
    assert first["metrics"][0]["skipped"] == 1.0 and second["metrics"][0]["skipped"] == 1.0
    for name in first["initial"]:
        assert torch.equal(first["initial"][name], first["final"][name])
        assert torch.equal(first["final"][name], second["final"][name])


def test_a_stop_vote_means_nobody_applies_the_round(shared):
    first, second = shared["stop_vote"]
    assert first["step_stopped"] is True and second["applied"] is False
    for name in first["initial"]:
        assert torch.equal(first["initial"][name], first["final"][name])


def test_a_learner_that_dies_is_noticed_at_once_not_after_the_timeout(shared):
    (first,) = shared["dies"]
    assert first["error"] is not None and "lost the other learners" in first["error"], first["error"]
    # Noticed by the closed connection (gloo says "Connection closed by peer" or, when the
    # peer's socket is torn down mid-read, "Connection reset by peer"), not by the group's
    # 120 s timeout running out.
    assert "Timed out" not in first["error"], first["error"]
    assert "closed" in first["error"] or "reset by peer" in first["error"], first["error"]


def test_learner_group_saver_is_the_first_survivor():
    import socket
    here = socket.gethostname()
    gone = 2**22 + 12345                    # above the usual pid_max: no such process
    group = LearnerGroup(rank=1, size=3, members=[(here, gone), (here, os.getpid()), (here, os.getpid())])
    assert group.dead_ranks() == [0] and group.saver()
    assert not LearnerGroup(rank=2, size=3, members=group.members).saver()


def test_a_learner_that_hangs_is_given_up_after_the_timeout(tmp_path):
    (first,) = run_pair(tmp_path, "hangs")
    assert first["error"] is not None and "lost the other learners" in first["error"], first["error"]
    # Given up by the group's own timeout (gloo names it), not by a closed connection.
    assert f"Timed out waiting {HANG_TIMEOUT * 1000:.0f}ms" in first["error"], first["error"]


def test_one_learner_without_a_group_skips_a_non_finite_loss_as_before():
    model = new_model(seed=0)
    learner, before = new_learner(model, "adam"), params(model)
    result = learner.step(impala_batch(T, B, A, seed=0, nan_reward=True))
    assert result.metrics["skipped"] == 1.0 and not result.stopped
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # Adam's moments and step count are as before the update: none was made yet.
    assert all(float(state["step"]) == 0 for state in learner.optimizer.state.values())
    assert learner.scheduler.last_epoch == 0
