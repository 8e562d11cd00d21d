"""Learning comparison: elite (custom) replay against uniform (standard) replay.

Same seeds, same budget, same half-fresh / half-replayed batches; only the off-policy
replay differs. Prints the mean and spread (std over seeds) of the 100-episode average
score at fixed environment-step marks, and records them in results/.
Usage: python benchmarks/elite_vs_uniform.py [--env CartPole-v1] [--seeds 1 2 3] [--steps 200000] [--keep DIR]
(then `herd plot --compare DIR/*` draws both replays' curves, mean and spread over seeds)
"""
from __future__ import annotations

import argparse
import shlex
import statistics
import tempfile
from pathlib import Path

from common import moving_averages, print_table, read_csv, record, run_herd

QUEUE = '{"type": "queue", "capacity": 1, "sample_ratio": 0.5}'
REPLAYS = {
    "uniform": '[' + QUEUE + ', {"type": "standard", "capacity": 500, "sample_ratio": 0.5}]',
    "elite": '[' + QUEUE + ', {"type": "custom", "capacity": 500, "sample_ratio": 0.5, "dist_function": "ln_norm",'
             ' "sample_strategy": "elite_sampling", "lambda_batch_multiplier": 6, "alfa_annealing_factor": 2.0}]',
}


def curve(episodes: list[dict], marks: list[int], window: int = 100) -> list[float]:
    """The moving-average score at each mark of environment steps (NaN before any episode)."""
    averages = moving_averages(episodes, window)
    values, latest, index = [], float("nan"), 0
    for mark in marks:
        while index < len(averages) and averages[index][0]["env_step"] <= mark:
            latest = averages[index][1]
            index += 1
        values.append(latest)
    return values


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--points", type=int, default=8)
    parser.add_argument("--extra", default="", help="extra herd flags in one string")
    parser.add_argument("--keep", help="keep the run folders here (for `herd plot --compare DIR/*`)")
    args = parser.parse_args()
    marks = [args.steps * (i + 1) // args.points for i in range(args.points)]
    curves: dict[str, list[list[float]]] = {name: [] for name in REPLAYS}
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(args.keep) if args.keep else Path(tmp)
        for seed in args.seeds:
            for name, replay in REPLAYS.items():
                run_dir, _, code = run_herd(["train", f"--env={args.env}", f"--seed={seed}",
                                             f"--environment_max_steps={args.steps}", f"--replay_parameters={replay}",
                                             "--basic_verbose=False", "--tensorboard=False", *shlex.split(args.extra)],
                                            results)
                if code != 0:
                    raise SystemExit(f"{name} seed {seed} failed with exit code {code}")
                curves[name].append(curve(read_csv(run_dir / "episodes.csv"), marks))
    rows, summary = [], {}
    for name, runs in curves.items():
        means = [statistics.mean(run[i] for run in runs) for i in range(len(marks))]
        spreads = [statistics.pstdev(run[i] for run in runs) for i in range(len(marks))]
        summary[name] = {"mean": means, "std": spreads, "runs": runs}
        rows.append([name] + [f"{m:.0f}±{s:.0f}" for m, s in zip(means, spreads)])
    print_table(["replay"] + [f"{m // 1000}k" for m in marks], rows)
    area = {name: statistics.mean(summary[name]["mean"]) for name in summary}
    print(" ".join(f"{name}_mean_over_curve={value:.1f}" for name, value in area.items()))
    record(f"elite_vs_uniform_{args.env}", {"env": args.env, "seeds": args.seeds, "steps": args.steps, "marks": marks,
                                            "replays": REPLAYS, "extra": args.extra, "curves": summary,
                                            "mean_over_curve": area})


if __name__ == "__main__":
    main()
