"""Continuous control with IMPALA's Gaussian policy: learning curves on Pendulum-v1,
HalfCheetah-v5 and Hopper-v5 (the continuous profile's defaults plus each task's own flags
in TASKS below), the time each run took and the machine it ran on.

Usage:
  python benchmarks/continuous.py --tasks Pendulum-v1 --seeds 1 2 3
  python benchmarks/continuous.py --tasks HalfCheetah-v5 Hopper-v5 --seeds 1 2 3      # 1M steps each
  python benchmarks/continuous.py --tasks HalfCheetah-v5 --steps 100000 --label probe  # a short probe

Per task it prints a table (seed, steps, minutes, final and best 100-game average) and
writes benchmarks/results/continuous_<task><label>.json with every run's curve: the
100-game average score against environment steps and wall time, at most ~300 points.
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import tempfile
from pathlib import Path

from common import moving_averages, print_table, read_csv, record, run_herd

# Each task's target (the goals) and the flags it needs beyond the continuous
# profile (herd/config.py PROFILES["continuous"]). Pendulum: its reward arrives every step
# and a swing-up pays off within a few dozen steps, so a short horizon (gamma 0.9, as
# on-policy methods use there) fits it better than MuJoCo's 0.99. No entropy bonus: the
# Gaussian's log-std is learned, and the default bonus (0.01 per action dimension) only
# pushes it up (README, Continuous control).
TASKS = {
    "Pendulum-v1": {"steps": 300_000, "target": -250.0, "flags": ["--gamma=0.9", "--entropy_loss_weight=0"]},
    "HalfCheetah-v5": {"steps": 1_000_000, "target": 3000.0, "flags": ["--entropy_loss_weight=0"]},
    "Hopper-v5": {"steps": 1_000_000, "target": 1500.0, "flags": ["--entropy_loss_weight=0"]},
}
CURVE_POINTS = 300


def curve(episodes: list[dict], launch: float) -> list[list[float]]:
    """[[env_step, seconds from launch, 100-game average], ...], thinned to ~CURVE_POINTS."""
    points = [[int(row["env_step"]), round(row["unix_time"] - launch, 1), round(avg, 2)]
              for row, avg, _ in moving_averages(episodes)]
    stride = max(1, len(points) // CURVE_POINTS)
    return points[::stride] + ([points[-1]] if points and (len(points) - 1) % stride else [])


def run_task(task: str, seeds: list[int], steps: int, extra: list[str], tmp: Path, save) -> list[dict]:
    """save(runs) after every seed: a long benchmark stopped midway keeps what it measured."""
    runs = []
    for seed in seeds:
        flags = ["train", f"--env={task}", f"--seed={seed}", f"--environment_max_steps={steps}",
                 "--basic_verbose=False", *TASKS[task]["flags"], *extra]
        run_dir, launch, code = run_herd(flags, tmp, timeout=6 * 3600)
        episodes = read_csv(run_dir / "episodes.csv")
        averages = [avg for _, avg, games in moving_averages(episodes) if games == 100]
        total = json.loads((run_dir / "summary.json").read_text())
        runs.append({"seed": seed, "exit": code, "env_steps": total["environment_steps"],
                     "minutes": round(total["total_time_s"] / 60, 2), "episodes": len(episodes),
                     "final_avg100": round(averages[-1], 2) if averages else None,
                     "best_avg100": round(max(averages), 2) if averages else None,
                     "command": "herd " + " ".join(shlex.quote(f) for f in flags),
                     "curve": curve(episodes, launch)})
        save(runs)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=None, help="environment steps per run (default: the task's own, "
                        "1M for MuJoCo, 300k for Pendulum)")
    parser.add_argument("--label", default="", help="appended to the results file's name")
    parser.add_argument("--extra", default="", help="extra herd flags in one string, e.g. --extra='--lr=0.0005'")
    args = parser.parse_args()
    extra = shlex.split(args.extra)
    for task in args.tasks:
        steps = args.steps or TASKS[task]["steps"]
        target = TASKS[task]["target"]

        def save(runs: list[dict]) -> None:
            finals = [r["final_avg100"] for r in runs if r["final_avg100"] is not None]
            record(f"continuous_{task}{args.label}", {
                "task": task, "steps": steps, "target": target, "extra": args.extra, "runs": runs,
                "median_final_avg100": statistics.median(finals) if finals else None,
                "reached_target": sum(r["best_avg100"] is not None and r["best_avg100"] >= target for r in runs)})

        with tempfile.TemporaryDirectory() as tmp:
            runs = run_task(task, args.seeds, steps, extra, Path(tmp), save)
        print(f"\n{task}: {steps:,} steps per run, target {target:g}")
        print_table(["seed", "exit", "env steps", "minutes", "episodes", "final avg100", "best avg100"],
                    [[r["seed"], r["exit"], f"{r['env_steps']:,}", r["minutes"], r["episodes"],
                      r["final_avg100"], r["best_avg100"]] for r in runs])


if __name__ == "__main__":
    main()
