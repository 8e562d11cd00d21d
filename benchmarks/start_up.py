"""CartPole start-up: seconds from a run's folder to its first update (log.txt's two
lines), and from launch to the first update, for this checkout and, alternating with it
round by round so both see the same machine, another checkout of herd (--baseline DIR,
e.g. `git archive <commit> | tar -x -C DIR`). The goal: the first update within
1 s of the run folder (actors forked from a fork server that imported torch already).

Usage: python benchmarks/start_up.py [--rounds 3] [--baseline DIR] [--label NAME]"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from common import ROOT, print_table, record

ARGS = ["train", "--env", "CartPole-v1", "--environment_max_steps=3000", "--basic_verbose=False",
        "--tensorboard=False", "--seed=1"]


def log_time(line: str) -> float:
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def start_up(tree: Path, results: Path) -> dict:
    """One run from checkout `tree` (its own herd first on sys.path: cwd and PYTHONPATH)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    launch = time.time()
    code = subprocess.run([sys.executable, "-m", "herd.cli", *ARGS, f"--results_dir={results}"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=300).returncode
    [run] = [p for p in results.iterdir() if p.is_dir()]
    lines = (run / "log.txt").read_text().splitlines()
    folder = next(log_time(l) for l in lines if " INFO run folder" in l)
    first = next(log_time(l) for l in lines if " INFO first update" in l)
    return {"exit": code, "folder_to_first_update_s": round(first - folder, 2),
            "launch_to_first_update_s": round(first - launch, 2), "load_average_1min": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another herd checkout, run alternately with this one")
    parser.add_argument("--label", default="start_up_cartpole")
    args = parser.parse_args()
    trees = {"this checkout": ROOT, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    rows = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for name, tree in trees.items():
                rows[name].append(start_up(tree, Path(tmp) / f"{name.replace(' ', '_')}_{round_}"))
    print_table(["checkout", "round", "run folder to first update (s)", "launch to first update (s)", "load (1 min)"],
                [[name, i, r["folder_to_first_update_s"], r["launch_to_first_update_s"], r["load_average_1min"]]
                 for name, runs in rows.items() for i, r in enumerate(runs)])
    medians = {name: {key: statistics.median(r[key] for r in runs)
                      for key in ("folder_to_first_update_s", "launch_to_first_update_s")}
               for name, runs in rows.items()}
    print(medians)
    record(args.label, {"command": "python benchmarks/start_up.py " + " ".join(sys.argv[1:]),
                        "herd_command": "herd " + " ".join(ARGS), "runs": rows, "medians": medians,
                        **({"baseline": str(args.baseline)} if args.baseline else {})})


if __name__ == "__main__":
    main()
