"""The memory task (docs/lstm.md): CartPole-v1 with the velocities hidden (--hide_velocity:
the agent sees cart position and pole angle only), an LSTM agent against a feed-forward
one with otherwise identical settings, several seeds each.

A feed-forward policy sees one observation and cannot tell which way the pole is moving;
an LSTM can recover the velocities from consecutive observations. Acceptance: the LSTM
agent's 100-episode average reaches 475, the feed-forward agent's stays far below.

Per run: the wall time (from launch) and environment steps at which the 100-episode
average first reaches 475, the best and final averages, and the curve of the average
over time (every CURVE_EVERY steps). A run that reaches the target is stopped there
(SIGINT: a clean, saved stop); the others run the whole step budget.
Usage: python benchmarks/memory_task.py [--seeds 1 2 3] [--agents lstm,ff] [--steps 1000000] [--extra '...']
"""
from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from common import ROOT, herd_command, moving_averages, newest_run, print_table, read_csv, record

TARGET, WINDOW, CURVE_EVERY = 475.0, 100, 10_000
TASK = ["--env=CartPole-v1", "--hide_velocity=True"]
# The settings both agents share: the vector profile's (Adam 0.001 decayed linearly over
# the run, batch 8, T 16), spelled out; one actor of 16 envs. An LSTM of 64 units (the
# MLP's value torso gets its own, herd/models/mlp.py) reached 475 with these in a probe.
# --reward_scale=1: the records were measured with raw rewards, before the vector profile's
# default became 0.1.
COMMON = ["--r_f_steps=16", "--batch_size=8", "--lr=0.001", "--optimizer=adam", "--worker_count=1",
          "--envs_per_worker=16", "--reward_scale=1"]
AGENTS = {
    "lstm": ["--use_lstm=True", "--lstm_size=64"],
    "ff": [],                                   # the same network without the core
}


def watch(args: list[str], results: Path, budget_s: float) -> tuple[Path, float, int, bool]:
    """Runs herd; stops it (SIGINT) once the 100-episode average reaches TARGET.
    Returns (run folder, launch time, exit code, stopped at the target)."""
    results.mkdir(parents=True, exist_ok=True)
    before = set(results.iterdir())
    launch = time.time()
    process = subprocess.Popen(herd_command([*args, f"--results_dir={results}"]), cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    reached = False
    try:
        while process.poll() is None and time.time() - launch < budget_s:
            time.sleep(2.0)
            runs = [p for p in results.iterdir() if p not in before]
            episodes = runs[0] / "episodes.csv" if runs else None
            if episodes is not None and episodes.exists() and reached_target(read_csv(episodes)):
                reached = True
                break
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    if process.returncode != 0:
        print(err[-3000:])
    return newest_run(results, before), launch, process.returncode, reached


def reached_target(episodes: list[dict]) -> bool:
    return any(games == WINDOW and average >= TARGET for _, average, games in moving_averages(episodes, WINDOW))


def summarize(episodes: list[dict], launch: float) -> dict:
    seconds = steps = None
    curve, next_point, best = [], CURVE_EVERY, float("nan")
    for row, average, games in moving_averages(episodes, WINDOW):
        if games == WINDOW:
            best = average if best != best else max(best, average)
            if seconds is None and average >= TARGET:
                seconds, steps = row["unix_time"] - launch, row["env_step"]
        if row["env_step"] >= next_point:
            curve.append([int(row["env_step"]), round(row["unix_time"] - launch, 1), round(average, 1)])
            next_point = (row["env_step"] // CURVE_EVERY + 1) * CURVE_EVERY
    final = sum(e["score"] for e in episodes[-WINDOW:]) / max(1, len(episodes[-WINDOW:]))
    return {"seconds_to_475": round(seconds, 1) if seconds is not None else None,
            "env_steps_to_475": int(steps) if steps is not None else None,
            "best_avg100": round(best, 1) if best == best else None, "final_avg100": round(final, 1),
            "episodes": len(episodes), "env_steps": int(episodes[-1]["env_step"]) if episodes else 0,
            "curve_env_step_seconds_avg100": curve}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--agents", default="lstm,ff", help=f"comma-separated, of {', '.join(AGENTS)}")
    parser.add_argument("--steps", type=int, default=1_000_000, help="environment steps per run at most")
    parser.add_argument("--budget_s", type=float, default=1800, help="wall seconds per run at most")
    parser.add_argument("--extra", default="", help="extra herd flags for every run")
    parser.add_argument("--label", default="memory_task", help="names the results file")
    parser.add_argument("--merge", nargs="+", default=None, metavar="NAME",
                        help="instead of running: combine the runs of earlier results files (e.g. one invocation "
                             "per seed, run side by side) into --label")
    parser.add_argument("--add_run", action="append", default=[], metavar="AGENT:SEED:RUN_FOLDER",
                        help="with --merge: also a run made by a plain `herd train` with the same flags (its "
                             "seconds count from the session's start, not the process launch)")
    args = parser.parse_args()
    if args.merge:
        return merge(args)
    agents = [a.strip() for a in args.agents.split(",") if a.strip()]
    unknown = [a for a in agents if a not in AGENTS]
    if unknown:
        raise SystemExit(f"memory_task: unknown agent(s) {unknown}; known: {list(AGENTS)}")
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for agent in agents:
                herd_args = ["train", *TASK, *COMMON, *AGENTS[agent], f"--environment_max_steps={args.steps}",
                             f"--seed={seed}", "--basic_verbose=False", "--tensorboard=False",
                             *shlex.split(args.extra)]
                run_dir, launch, code, stopped = watch(herd_args, Path(tmp) / f"{agent}_{seed}", args.budget_s)
                result = summarize(read_csv(run_dir / "episodes.csv"), launch)
                runs.append({"agent": agent, "seed": seed, "exit": code, "stopped_at_target": stopped,
                             "herd_args": herd_args, **result})
                r = runs[-1]
                print(f"{agent} seed {seed}: best avg100 {r['best_avg100']}, 475 at "
                      f"{r['env_steps_to_475'] or '-'} steps / {r['seconds_to_475'] or '-'} s", flush=True)
    print_table(["agent", "seed", "exit", "s to 475 (from launch)", "env steps to 475", "best avg100",
                 "final avg100", "env steps run", "episodes"],
                [[r["agent"], r["seed"], r["exit"], r["seconds_to_475"] or "not reached",
                  r["env_steps_to_475"] or "-", r["best_avg100"], r["final_avg100"], r["env_steps"], r["episodes"]]
                 for r in runs])
    reached = {a: sum(r["seconds_to_475"] is not None for r in runs if r["agent"] == a) for a in agents}
    print(" ".join(f"{a}_reached={reached[a]}/{len(args.seeds)}" for a in agents))
    record(args.label, {"task": "CartPole-v1 --hide_velocity=True", "target": TARGET, "window": WINDOW,
                        "common_flags": COMMON, "agents": {a: AGENTS[a] for a in agents}, "steps": args.steps,
                        "extra": args.extra, "precision": "fp32", "reached": reached, "runs": runs})


def merge(args) -> None:
    """Combines earlier results files (and run folders) into one record."""
    import json
    runs, records = [], []
    for name in args.merge:
        record_ = json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text())
        records.append({"name": name, "machine": record_["machine"], "date": record_["date"]})
        runs += [{**run, "source": name} for run in record_["runs"]]
    for spec in args.add_run:
        agent, seed, folder = spec.split(":", 2)
        episodes = read_csv(Path(folder) / "episodes.csv")
        config = json.loads((Path(folder) / "config.json").read_text())
        session_start = episodes[0]["unix_time"] - episodes[0]["wall_time"]
        runs.append({"agent": agent, "seed": int(seed), "exit": 0, "stopped_at_target": None,
                     "source": f"herd train, config {json.dumps({k: config[k] for k in CONFIG_KEYS})}",
                     **summarize(episodes, session_start)})
    runs.sort(key=lambda r: (r["agent"], r["seed"]))
    agents = sorted({r["agent"] for r in runs})
    reached = {a: f"{sum(r['seconds_to_475'] is not None for r in runs if r['agent'] == a)}/"
                  f"{sum(r['agent'] == a for r in runs)}" for a in agents}
    print_table(["agent", "seed", "s to 475", "env steps to 475", "best avg100", "final avg100", "env steps run"],
                [[r["agent"], r["seed"], r["seconds_to_475"] or "not reached", r["env_steps_to_475"] or "-",
                  r["best_avg100"], r["final_avg100"], r["env_steps"]] for r in runs])
    print(" ".join(f"{a}_reached={reached[a]}" for a in agents))
    record(args.label, {"task": "CartPole-v1 --hide_velocity=True", "target": TARGET, "window": WINDOW,
                        "common_flags": COMMON, "agents": {a: AGENTS[a] for a in agents}, "precision": "fp32",
                        "reached": reached, "merged_from": records, "runs": runs})


CONFIG_KEYS = ("use_lstm", "lstm_size", "hide_velocity", "r_f_steps", "batch_size", "lr", "optimizer", "worker_count",
               "envs_per_worker", "environment_max_steps", "seed")


if __name__ == "__main__":
    main()
