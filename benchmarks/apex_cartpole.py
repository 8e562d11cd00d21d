"""Ape-X on CartPole-v1: the greedy policy's test score after at most 3 minutes of training.

For each seed: `herd train --env CartPole-v1 --algorithm=apex` with Ape-X's vector-task
defaults (herd/config.py ALGORITHM_PROFILES), stopped with Ctrl+C (a clean, saved stop)
if it is still running 180 s after launch; then `herd test` on its final checkpoint,
greedily (epsilon 0), over --episodes games. The goal: a mean of 475 or more for at least
4 of 5 seeds. Usage: python benchmarks/apex_cartpole.py [--seeds 1 2 3 4 5] [--extra='...']
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, herd_command, print_table, read_csv, record, run_herd

TARGET = 475.0
LIMIT_S = 180.0


def greedy_test(run_dir: Path, episodes: int) -> dict:
    subprocess.run(herd_command(["test", str(run_dir), f"--test_episode_count={episodes}", "--render=False",
                                 f"--results_dir={run_dir.parent / 'tests'}"]),
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600)
    tests = [p for p in (run_dir.parent / "tests").iterdir() if p.is_dir()]
    newest = max(tests, key=lambda p: p.stat().st_mtime)
    return json.loads((newest / "test_results.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--episodes", type=int, default=100, help="greedy test games per seed")
    parser.add_argument("--extra", default="", help="extra herd flags in one string")
    parser.add_argument("--tag", default="", help="suffix of the results file name")
    args = parser.parse_args()
    extra = shlex.split(args.extra)
    rows, runs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            out = Path(tmp) / f"seed{seed}"
            run_dir, _, code = run_herd(["train", "--env", "CartPole-v1", "--algorithm=apex", f"--seed={seed}",
                                         "--basic_verbose=False", *extra], out, stop_after=LIMIT_S)
            summary = json.loads((run_dir / "summary.json").read_text())
            episodes = read_csv(run_dir / "episodes.csv")
            test = greedy_test(run_dir, args.episodes)
            run = {"seed": seed, "exit": code, "ended": summary["ended"], "train_seconds": summary["total_time_s"],
                   "env_steps": summary["environment_steps"], "updates": summary["training_steps"],
                   "training_avg100": summary["last_average_score"],
                   "least_exploring_avg": summary.get("least_exploring_average_score"),
                   "episodes": len(episodes), "greedy_test_mean": test["mean"], "greedy_test_std": test["std"],
                   "greedy_test_min": test["min"], "solved": test["mean"] >= TARGET}
            runs.append(run)
            rows.append([seed, code, run["ended"], f"{run['train_seconds']:.0f}", run["env_steps"], run["updates"],
                         f"{run['training_avg100']:.1f}", f"{test['mean']:.1f} ± {test['std']:.1f}",
                         f"{test['min']:.0f}", "yes" if run["solved"] else "no"])
            print(f"seed {seed}: greedy test mean {test['mean']:.1f}", file=sys.stderr, flush=True)
    print_table(["seed", "exit", "ended", "train s", "env steps", "updates", "train avg100",
                 f"greedy test ({args.episodes} games)", "min", ">= 475"], rows)
    solved = sum(r["solved"] for r in runs)
    print(f"solved {solved} of {len(runs)}")
    record(f"apex_cartpole{args.tag}", {"command": "python benchmarks/apex_cartpole.py --seeds "
                                        + " ".join(map(str, args.seeds)) + (f" --extra='{args.extra}'" if extra else ""),
                                        "target": TARGET, "limit_seconds": LIMIT_S, "runs": runs, "solved": solved})


if __name__ == "__main__":
    main()
