"""IMPACT against IMPALA and against IMPALA with K-fold uniform replay, at equal wall time
(docs/impact.md). Every run gets the same seconds from launch (a SIGINT then stops it, saved);
runs go one after another, never beside each other.

Configurations (K = 2, the circular buffer's passes per batch, N = 4 batches):
  impala         herd's defaults for the task (the queue: every trajectory trained on once)
  impact         --algorithm=impact with its defaults (circular buffer N=4, K=2, target
                 network synced every 8 updates, clip 0.4, importance weights truncated at 2)
  impala_replay  IMPALA with half of each batch fresh and half drawn uniformly from the last
                 N batches' trajectories: each trajectory trained on about K times, with
                 CLEAR's cloning terms (herd's default with a replay)
  impala_circular  (optional) IMPALA's loss over IMPACT's circular buffer: K passes without
                 the target network and the clip, the ablation that shows what they add

Per run: seconds from launch to the task's target average (CartPole 475 over 100 games;
MinAtar and Pong have no target here unless --target), the final average, and the whole
curve (average over the last 100 games against seconds from launch and env steps).

Usage: python benchmarks/impact.py --task cartpole --seeds 1 2 3 --seconds 60
       python benchmarks/impact.py --task cartpole --seeds 1 2 --seconds 240 --steps 100000   (a loaded machine)
       python benchmarks/impact.py --task minatar --seeds 1 2 3 4 5 --seconds 1800
       python benchmarks/impact.py --task pong --seeds 1 --seconds 2400"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

from common import moving_averages, print_table, read_csv, record, run_herd

TASKS = {
    "cartpole": {"env": "CartPole-v1", "target": 475.0, "steps": 10_000_000},
    "minatar": {"env": "MinAtar/Breakout-v1", "target": None, "steps": 1_000_000},
    "pong": {"env": "PongNoFrameskip-v4", "target": 20.0, "steps": 50_000_000},
}
K, N = 2, 4
CONFIGS = {
    "impala": [],
    "impact": ["--algorithm=impact"],
    "impala_replay": ["--replay_parameters=" + json.dumps([{"type": "queue", "capacity": 1, "sample_ratio": 1 / K},
                                                            {"type": "standard", "capacity": "BATCHES",
                                                             "sample_ratio": 1 - 1 / K}])],
    "impala_circular": ["--replay_parameters=" + json.dumps([{"type": "circular", "capacity": N, "sample_ratio": 1,
                                                              "iterations_per_batch": K}])],
}
# The profiles' batch sizes (herd/profiles.py), to size the uniform replay at N batches.
BATCH = {"cartpole": 8, "minatar": 16, "pong": 8}


def config_args(name: str, task: str) -> list[str]:
    return [a.replace('"BATCHES"', str(N * BATCH[task])) for a in CONFIGS[name]]


def curve(episodes: list[dict], launch: float, points: int = 60) -> list[list[float]]:
    """[seconds from launch, env step, average of the last 100 games] at up to `points` rows."""
    rows = [(row["unix_time"] - launch, row["env_step"], average) for row, average, _ in moving_averages(episodes)]
    step = max(1, len(rows) // points)
    return [[round(s, 1), int(e), round(a, 2)] for s, e, a in rows[::step] + rows[-1:]] if rows else []


def average_at(episodes: list[dict], launch: float, key: str, mark: float) -> float | None:
    """The average of the last 100 games as it stood at `mark` (seconds from launch when
    key is "seconds", env steps when key is "env_step"); None before the first game and
    after the last."""
    def where(row: dict) -> float:
        return row["unix_time"] - launch if key == "seconds" else row["env_step"]
    if not episodes or where(episodes[-1]) < mark:
        return None                 # the run had stopped (its step budget spent) before this mark
    last = None
    for row, average, _ in moving_averages(episodes):
        if where(row) > mark:
            break
        last = average
    return last


def spread(runs: list[dict], key: str, marks: list[float]) -> list[dict]:
    """Mean and sd over seeds of each run's average at each mark: the curve with its spread.
    A mark a run never got to (it stopped before) is left out of that mark's numbers, and
    `runs` says how many were counted."""
    out = []
    for mark in marks:
        values = [r["at"][key][i] for r in runs for i, m in enumerate(r["at"]["marks_" + key]) if m == mark
                  and r["at"][key][i] is not None]
        out.append({key: mark, "runs": len(values),
                    "mean": round(statistics.fmean(values), 2) if values else None,
                    "sd": round(statistics.stdev(values), 2) if len(values) > 1 else None})
    return out


def time_to(episodes: list[dict], launch: float, target: float | None) -> float | None:
    if target is None:
        return None
    for row, average, games in moving_averages(episodes):
        if games == 100 and average >= target:
            return round(row["unix_time"] - launch, 1)
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", choices=TASKS, default="cartpole")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--seconds", type=float, default=60, help="wall seconds from launch every run gets")
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=["impala", "impact", "impala_replay"])
    parser.add_argument("--steps", type=int, help="environment steps a run may take at most (default: the task's); "
                        "on a loaded machine a step budget compares like with like where seconds do not")
    parser.add_argument("--target", type=float, help="the average whose time is measured (default: the task's)")
    parser.add_argument("--extra", default="", help="herd flags every configuration gets, in one string")
    parser.add_argument("--step_marks", type=int, default=100_000,
                        help="the spread curve over env steps is taken every this many steps")
    parser.add_argument("--label", help="names the results file (default impact_<task>)")
    args = parser.parse_args()
    task = TASKS[args.task]
    target = args.target if args.target is not None else task["target"]
    runs = []
    time_marks = [round(args.seconds * i / 12, 1) for i in range(1, 13)]
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for name in args.configs:       # interleaved: a change in the machine's load hits every config
                flags = ["train", "--env", task["env"], f"--seed={seed}", "--basic_verbose=False",
                         f"--environment_max_steps={args.steps or task['steps']}", *config_args(name, args.task),
                         *shlex.split(args.extra)]
                run_dir, launch, code = run_herd(flags, Path(tmp) / name, stop_after=args.seconds,
                                                 timeout=args.seconds + 300)
                episodes = read_csv(run_dir / "episodes.csv") if (run_dir / "episodes.csv").exists() else []
                summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
                final = statistics.fmean(e["score"] for e in episodes[-100:]) if episodes else None
                runs.append({"config": name, "seed": seed, "exit": code, "seconds_to_target": time_to(episodes, launch, target),
                             "final_avg100": round(final, 2) if final is not None else None,
                             "env_steps": summary.get("environment_steps"), "updates": summary.get("training_steps"),
                             "curve": curve(episodes, launch)})
                last_step = int(episodes[-1]["env_step"]) if episodes else 0
                step_marks = list(range(args.step_marks, last_step + 1, args.step_marks))
                runs[-1]["at"] = {"marks_seconds": time_marks, "marks_env_step": step_marks,
                                  "seconds": [average_at(episodes, launch, "seconds", m) for m in time_marks],
                                  "env_step": [average_at(episodes, launch, "env_step", m) for m in step_marks]}
                print(f"{name} seed {seed}: exit {code}, to target {runs[-1]['seconds_to_target']}, "
                      f"final {runs[-1]['final_avg100']}, steps {runs[-1]['env_steps']}", flush=True)
    rows, summaries = [], {}
    for name in args.configs:
        mine = [r for r in runs if r["config"] == name]
        finals = [r["final_avg100"] for r in mine if r["final_avg100"] is not None]
        times = [r["seconds_to_target"] for r in mine]
        reached = [t for t in times if t is not None]
        median = statistics.median(t if t is not None else float("inf") for t in times) if times else None
        summaries[name] = {"reached": f"{len(reached)}/{len(mine)}",
                           "median_seconds_to_target": round(median, 2) if median not in (None, float("inf"))
                           else median,
                           "final_mean": round(statistics.fmean(finals), 2) if finals else None,
                           "final_std": round(statistics.stdev(finals), 2) if len(finals) > 1 else None,
                           "env_steps_mean": round(statistics.fmean(r["env_steps"] or 0 for r in mine)),
                           "curve_over_seconds": spread(mine, "seconds", time_marks),
                           "curve_over_env_steps": spread(mine, "env_step", sorted(
                               {m for r in mine for m in r["at"]["marks_env_step"]}))}
        s = summaries[name]
        rows.append([name, s["reached"], s["median_seconds_to_target"], s["final_mean"], s["final_std"],
                     s["env_steps_mean"]])
    print_table(["config", f"reached {target}", "median s to target", "final avg100 mean", "sd", "env steps"], rows)
    def cell(point: dict) -> str:
        return "-" if point["mean"] is None else f'{point["mean"]} ± {point["sd"] or 0} ({point["runs"]})'
    print_table(["seconds", *args.configs],
                [[mark, *(cell(summaries[n]["curve_over_seconds"][i]) for n in args.configs)]
                 for i, mark in enumerate(time_marks)])
    for s in summaries.values():     # inf (a median over runs that did not reach) is not JSON
        if s["median_seconds_to_target"] == float("inf"):
            s["median_seconds_to_target"] = None
    out = record(args.label or f"impact_{args.task}",
                 {"command": "python benchmarks/impact.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
                  "task": args.task, "env": task["env"], "seconds_per_run": args.seconds, "target": target,
                  "max_env_steps": args.steps or task["steps"],
                  "configs": {name: config_args(name, args.task) for name in args.configs}, "summary": summaries,
                  "runs": runs})
    print(f"recorded {out}")


if __name__ == "__main__":
    main()
