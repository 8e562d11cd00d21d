"""Learning tests: only a working learner scores far above chance within a short budget.
CartPole with IMPALA, with IMPACT and with the LSTM core runs by default; Pendulum
(Gaussian IMPALA), Ape-X and MinAtar take minutes on a loaded 2-core machine and are
marked slow (docs/testing.md: -m slow). Each states its budget, threshold, what chance scores and its
measured pass rate."""
import json

import pytest

from herd_testing import only_run, run_cli


def test_cartpole_quick_start_learns(tmp_path):
    # The quick start's own defaults; a random policy averages about 22.
    result = run_cli(["train", "--env=CartPole-v1", "--seed=2", "--environment_max_steps=250000",
                      "--tensorboard=False"], tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((only_run(tmp_path) / "summary.json").read_text())
    assert summary["environment_steps"] <= 250000 + 2 * 16 * 16
    # 200 is far beyond chance yet robust to a loaded CI machine (the time to 475 is in benchmarks/).
    # Pass rate: one seed must pass, this one. Six runs of seed 2 on the 2-core Intel machine
    # under load 5-7 (2026-11-24, 500,000 steps each, episodes.csv read back) first reached a
    # 100-game average of 200 after 43,008 / 53,248 / 55,808 / 60,160 / 94,976 / 192,768
    # steps, and their best averages by 250,000 steps were 270 to 500: 6 of 6 pass at this
    # budget. In the recorded runs of benchmarks/cartpole.py (seeds 1-5: results/cartpole.json
    # on a quiet machine, and before/after the seams on a machine shared with other training
    # runs) every one of 15 runs reached a best 100-episode average of 284 or more at 500,000.
    # Those runs learned from raw rewards; with the vector profile's reward scale 0.1 (the
    # default since), 30 of 30 seeds reached 475 within 253,000 steps (results/
    # cartpole_20_defaults.json, cartpole_issue16_reward_scale_0.1.json), and this test passed.
    assert summary["max_average_score"] is not None and summary["max_average_score"] >= 200, summary


def test_impact_learns_cartpole_with_its_defaults(tmp_path):
    """IMPACT (target network, clipped surrogate, circular buffer: each batch twice) with
    its defaults. Random play averages about 22. Threshold: a best 100-game average of 300
    at 150,000 steps. Measured on the idle 2-core Xeon (2026-11-25, python
    benchmarks/cartpole.py --seeds 1 2 3 --extra="--algorithm=impact
    --environment_max_steps=150000": results/cartpole_impact_defaults_150k_test_budget.json):
    seeds 1, 2, 3 reached 475 at 135,936, 87,296 and 114,176 steps and ended at 490-498:
    3 of 3 pass; this test runs seed 1, the slowest. Catches a broken surrogate, target
    network or circular buffer (a loss that does not learn, or a buffer that starves it)."""
    summary = learned(tmp_path, ["--env=CartPole-v1", "--algorithm=impact", "--seed=1"], 150_000, timeout=240)
    assert summary["max_average_score"] is not None and summary["max_average_score"] >= 300, summary


@pytest.mark.timeout(420)   # its inner budget (360 s) and a margin
def test_appo_learns_cartpole_with_its_defaults(tmp_path):
    """APPO (each stored batch in 4 passes of 4 shuffled minibatches, the clipped surrogate on
    V-trace(0.95) targets, normalised advantages, Adam clipped at 0.5) with its defaults.
    Random play averages about 22. Threshold: a best 100-game average of 300 at 200,000
    steps. Measured on the 2-core AMD EPYC shared with a Pong run (2026-11-28, python
    benchmarks/cartpole.py --seeds 1 2 3 --label cartpole_appo_defaults_150k_test_budget
    --extra="--algorithm=appo --environment_max_steps=150000":
    results/cartpole_appo_defaults_150k_test_budget.json): seeds 1, 2, 3 reached 475 at
    136,448, 123,648 and 104,704 steps (best 500, 494, 500); quiet (2026-11-30, the same with
    --seeds 1 2 3 4 5 --label cartpole_appo_defaults_200k_test_budget and 200,000 steps):
    89,088-105,728 steps. The sampling is asynchronous, so a seed's course depends on the
    policy lag: one run of seed 1 in the full suite had a best of 279.81 at 150,000 steps,
    hence the budget of 200,000. Catches a broken surrogate, target, advantage normalisation or reuse
    loop (a loss that does not learn, or minibatches that cover the wrong columns)."""
    summary = learned(tmp_path, ["--env=CartPole-v1", "--algorithm=appo", "--seed=1"], 200_000, timeout=360)
    assert summary["max_average_score"] is not None and summary["max_average_score"] >= 300, summary


def learned(tmp_path, args: list[str], budget: int, timeout: float) -> dict:
    """summary.json of a training run of `budget` steps with `args`, which must finish."""
    result = run_cli(["train", f"--environment_max_steps={budget}", "--tensorboard=False", "--basic_verbose=False",
                      *args], tmp_path, timeout=timeout)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((only_run(tmp_path) / "summary.json").read_text())
    assert summary["ended"] == "finished" and summary["environment_steps"] >= budget, summary
    return summary


@pytest.mark.slow
@pytest.mark.timeout(660)   # its inner budget (600 s) and a margin
def test_pendulum_gaussian_policy_learns(tmp_path):
    """IMPALA with the Gaussian policy (the continuous profile, benchmarks/continuous.py's
    Pendulum flags). The first games of the recorded runs, near random play, average
    -1,050 to -1,600; a policy that swings up and balances scores about -150. Threshold: a best
    100-game average of -700, far above chance. Budget 150,000 steps. Measured on the
    2-core Xeon shared with 8 other agents (load 14-24, 2026-11-25): seeds 1, 2, 3 reached
    -386, -425, -348 at 150,000 steps in 198-359 s: 3 of 3 pass; this test runs seed 2,
    the lowest. (benchmarks/results/continuous_Pendulum-v1.json: -175 to -198 at 300,000.)
    Catches a broken Gaussian log-probability, KL, or action scaling."""
    summary = learned(tmp_path, ["--env=Pendulum-v1", "--seed=2", "--gamma=0.9", "--entropy_loss_weight=0"],
                      150_000, timeout=600)
    assert summary["max_average_score"] is not None and summary["max_average_score"] >= -700, summary


@pytest.mark.slow
@pytest.mark.timeout(660)   # its inner budget (600 s) and a margin
def test_apex_learns_cartpole_on_the_local_backend(tmp_path):
    """Ape-X (prioritized replay, n-step double dueling DQN, per-actor epsilon) with its
    CartPole defaults on the local backend. Random play averages about 22. Threshold: a
    best 100-game average of 200 over all actors (the exploring ones included) at 100,000
    steps. Measured on the loaded 2-core Xeon (load 14-24, 2026-11-25): seeds 1, 2, 3
    reached 408, 412, 393 in 245-395 s: 3 of 3 pass; this test runs seed 1.
    (benchmarks/results/apex_cartpole.json: 5 of 5 seeds solve it greedily at 170,000.)
    Catches broken priorities, targets, n-step returns or epsilon schedule."""
    summary = learned(tmp_path, ["--env=CartPole-v1", "--algorithm=apex", "--seed=1"], 100_000, timeout=600)
    assert summary["max_average_score"] is not None and summary["max_average_score"] >= 200, summary


@pytest.mark.slow
@pytest.mark.timeout(420)   # its inner budget (360 s) and a margin
def test_minatar_breakout_learns(tmp_path):
    """IMPALA with the MinAtar profile (minatar_cnn on 10x10 frames) on MinAtar Breakout.
    Random play averages 0.45 a game (benchmarks/results/minatar_Breakout.json, 300 games).
    Threshold: a best 100-game average of 1.5, three times chance, at 150,000 steps.
    Measured on the loaded 2-core Xeon (2026-11-25): seeds 1, 2, 3 reached 3.21, 3.22, 3.08
    in 100-110 s: 3 of 3 pass; this test runs seed 2. Catches a broken convolutional model or
    MinAtar's observation layout ([C, 10, 10] floats) read wrongly."""
    summary = learned(tmp_path, ["--env=MinAtar/Breakout-v1", "--seed=2"], 150_000, timeout=360)
    assert summary["max_average_score"] is not None and summary["max_average_score"] >= 1.5, summary


def test_lstm_core_learns_cartpole_with_the_defaults(tmp_path):
    """IMPALA with the LSTM core and otherwise the defaults a user gets (`herd train --env
    CartPole-v1 --use_lstm=True`). Random play averages about 22. Threshold: a best
    100-game average of 100, between 4 and 5 times chance, at 150,000 steps. Measured on
    the idle 2-core Xeon (2026-11-25, python benchmarks/cartpole.py --seeds 1 2 3
    --extra="--use_lstm=True --environment_max_steps=150000":
    results/cartpole_lstm_defaults_150k_test_budget.json): seeds 1, 2, 3 reached best
    averages of 172.9, 417.0 and 132.4: 3 of 3 pass (14 s for seed 1 alone); this test runs
    seed 1. (With a full budget every one of 10 seeds reached 381 or more, and 9 reached
    475: results/cartpole_lstm_defaults_loaded_*.json.) With the value head reading the
    value torso beside the value LSTM (docs/lstm.md) seed 1 reached 308.1 here
    (one run, 2026-11-27, load 10-14). Catches a core that does not learn: start states not
    stored or not reset at episode ends, gradients cut through time."""
    summary = learned(tmp_path, ["--env=CartPole-v1", "--use_lstm=True", "--seed=1"], 150_000, timeout=240)
    assert summary["max_average_score"] is not None and summary["max_average_score"] >= 100, summary
