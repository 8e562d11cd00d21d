"""What a resumed run takes over besides the weights: the optimizer's state and the
learning-rate schedule continue where the first run stopped (docs/checkpoints.md); and what --reproducible makes the
same in two runs of one seed."""
import pytest

from herd_testing import only_run, read_rows, run_cli
from herd.checkpoint import load_checkpoint

HORIZON = 100_000       # LR decay horizon in updates: far beyond both runs, so the LR still moves
FIRST = ["train", "--env=CartPole-v1", "--worker_count=1", "--seed=1", "--tensorboard=False",
         f"--lr_scheduler_steps={HORIZON}", "--environment_max_steps=2000"]


@pytest.mark.timeout(420)   # the sum of its inner budgets (2 x 180 s), and a margin
def test_resume_continues_the_optimizer_and_the_learning_rate_schedule(tmp_path):
    """Catches a resume that builds a fresh optimizer (Adam's step count and moments start
    again at 0: a burst of large steps) or a fresh schedule (the LR jumps back up to its
    start value): after resuming, every count is the whole run's, and the LR is the
    schedule's value at the whole run's update count."""
    result = run_cli(FIRST, tmp_path / "first", timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    first = only_run(tmp_path / "first")
    before, _ = load_checkpoint(first)
    result = run_cli(["resume", str(first), "--environment_max_steps=4000"], tmp_path / "resumed", timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    after, _ = load_checkpoint(only_run(tmp_path / "resumed"))

    old, total = before["counters"]["updates"], after["counters"]["updates"]
    assert 0 < old < total, (old, total)
    assert after["scheduler"]["last_epoch"] == total                      # a fresh one: total - old
    steps = {int(s["step"]) for s in after["optimizer"]["state"].values() if "step" in s}
    assert steps == {total}, (steps, total)                               # Adam/RMSprop count every update
    config = before["config"]
    lr, end = float(config["lr"]), float(config["lr_end_value"])
    expected = end + (lr - end) * (1 - total / HORIZON)                   # linear decay (power 1)
    # The schedule's rate for the next update (a float32 device tensor in the learner).
    assert after["scheduler"]["_last_lr"][0] == pytest.approx(expected, rel=1e-6)
    assert before["scheduler"]["_last_lr"][0] > after["scheduler"]["_last_lr"][0]


def first_update_and_games(tmp_path, name: str, seed: int):
    """(train.csv's row of update 1, the scores of the games played before any update)."""
    result = run_cli(["train", "--env=CartPole-v1", "--worker_count=1", f"--seed={seed}", "--reproducible=True",
                      "--environment_max_steps=1000", "--verbose_learner_out_int=1", "--tensorboard=False"],
                     tmp_path / name, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    run = only_run(tmp_path / name)
    first = read_rows(run / "train.csv")[0]
    assert first["update"] == "1"
    games = [(row["score"], row["length"]) for row in read_rows(run / "episodes.csv") if row["update"] == "0"]
    return {k: v for k, v in first.items() if k not in ("wall_time", "fps", "policy_lag")}, games


@pytest.mark.timeout(420)   # the sum of its inner budgets (3 x 120 s), and a margin
def test_reproducible_runs_of_one_seed_play_and_learn_the_same_until_the_first_update(tmp_path):
    """--reproducible with one seed: the same games before any update and the same first
    update, to the last digit; another seed gives other games. Catches a seed that does
    not reach the actors' environments or action sampling, or the learner's
    initialisation. (Later updates are not the same: the actor picks up new weights when
    they arrive, so the data it plays with depends on timing; a whole run is identical
    only where actors and learner take turns, which herd does not do.)"""
    first, games = first_update_and_games(tmp_path, "a", seed=7)
    again, games_again = first_update_and_games(tmp_path, "b", seed=7)
    other, other_games = first_update_and_games(tmp_path, "c", seed=8)
    assert len(games) >= 5 and games == games_again
    assert first == again, (first, again)
    assert other_games != games and other["loss"] != first["loss"]
