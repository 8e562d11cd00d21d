"""MinAtar learning check: `herd train --env MinAtar/<Game>-v1` with the MinAtar profile's
defaults, stopped after --minutes, against a random player of the same game. (Not named
minatar.py: run from benchmarks/, that would shadow the minatar package.)

For each seed: the average score of the last 100 games at each minute from launch, the
best and final 100-game averages and the environment steps done; the random player's
average over --random_games games (sampled actions, same sticky actions and ramping).
The curve of every run is recorded at one point per second (seconds from launch, steps,
100-game average after the last game of that second).

    python benchmarks/minatar_learning.py --env MinAtar/Breakout-v1 --minutes 5 --seeds 1 2 3

Writes benchmarks/results/minatar_<Game><tag>.json.
"""
from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from common import ROOT, moving_averages, print_table, read_csv, record, run_herd

sys.path.insert(0, str(ROOT))
from herd.envs import make_env  # noqa: E402  (the repository's herd, as run_herd runs it)


def random_average(env_id: str, games: int, seed: int = 0) -> float:
    env = make_env(env_id, seed=seed)
    rng = np.random.default_rng(seed)
    scores = []
    env.reset()
    while len(scores) < games:
        _, _, terminated, truncated, info = env.step(int(rng.integers(env.action_space.n)))
        if "episode_score" in info:
            scores.append(info["episode_score"])
        if terminated or truncated:
            env.reset()
    env.close()
    return statistics.mean(scores)


def curve(episodes: list[dict], launch: float) -> list[dict]:
    """The 100-game average after the last game of every second from launch: MinAtar games
    end by the thousand per minute, and one point a second keeps the record small while
    every minute mark can still be read off it exactly."""
    points = {}
    for row, average, games in moving_averages(episodes):
        second = int(row["unix_time"] - launch)
        points[second] = {"seconds": round(row["unix_time"] - launch, 1), "env_step": int(row["env_step"]),
                          "average": round(average, 3), "games": games}
    return list(points.values())


def at_minute(points: list[dict], minute: float) -> float | None:
    """The 100-game average at `minute` from launch (None before 100 games)."""
    before = [p for p in points if p["seconds"] <= minute * 60 and p["games"] == 100]
    return before[-1]["average"] if before else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", default="MinAtar/Breakout-v1")
    parser.add_argument("--minutes", type=float, default=5.0, help="stop each run after this long")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--random_games", type=int, default=1000)
    parser.add_argument("--extra", default="", help="extra herd flags in one string")
    parser.add_argument("--tag", default="", help="suffix of the results file name")
    args = parser.parse_args()
    random_score = random_average(args.env, args.random_games)
    minutes = list(range(1, int(args.minutes) + 1))
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            herd_args = ["train", f"--env={args.env}", f"--seed={seed}", "--environment_max_steps=100000000",
                         "--basic_verbose=False", "--tensorboard=False", *shlex.split(args.extra)]
            run_dir, launch, code = run_herd(herd_args, Path(tmp), stop_after=args.minutes * 60,
                                             timeout=args.minutes * 60 + 300)
            points = curve(read_csv(run_dir / "episodes.csv"), launch)
            full = [p["average"] for p in points if p["games"] == 100]
            runs.append({"seed": seed, "exit_code": code, "herd_args": herd_args,
                         "by_minute": [at_minute(points, m) for m in minutes],
                         "best_average": max(full, default=None), "final_average": full[-1] if full else None,
                         "env_steps": points[-1]["env_step"] if points else 0, "curve": points})
    print(f"random player: {random_score:.2f} (average of {args.random_games} games)")
    print_table(["seed"] + [f"{m} min" for m in minutes] + ["best", "final", "env steps"],
                [[r["seed"]] + ["-" if v is None else f"{v:.2f}" for v in r["by_minute"]]
                 + [f"{r['best_average']}", f"{r['final_average']}", f"{r['env_steps']:,}"] for r in runs])
    game = args.env.split("/")[-1].split("-")[0]
    record(f"minatar_{game}{args.tag}", {
        "command": "python benchmarks/minatar_learning.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "env": args.env, "minutes": args.minutes, "random_average": random_score, "random_games": args.random_games,
        "runs": runs})


if __name__ == "__main__":
    main()
