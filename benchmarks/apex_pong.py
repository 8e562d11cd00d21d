"""Ape-X on Pong, on this machine: the greedy score during a long run, the actors' frames
per second against the environment-only ceiling, and what one learner update costs at
the paper's batch of 512 transitions.

Three measurements, one command:
1. The env-only ceiling: the actors' processes stepping Pong with random actions
   (benchmarks/throughput.py's `ceiling`, same preprocessing, same workers and envs).
2. The learner alone: updates per second of the Ape-X learner (dueling Nature CNN, double
   Q target through the target network, Huber loss) on Pong-shaped transition batches of
   --learner_batch (512 by default; the paper's) and of the run's batch, in the precision
   herd picks here. Seed 004 reported 10-12 updates/s at 512 on its GPU, the paper 19.
3. The run: `herd train --env PongNoFrameskip-v4 --algorithm=apex` with Ape-X's Atari
   defaults (herd/config.py ALGORITHM_PROFILES), a greedy evaluation every
   --eval_minutes (the evaluation worker, epsilon 0, whole games without episodic life),
   stopped with Ctrl+C after --minutes. Recorded: every greedy evaluation, every training
   game (with the least exploring actor's marked), the steady-state frames/s and updates/s.

The issue's goal: a greedy score above 0 within 45 minutes.
Usage: python benchmarks/apex_pong.py [--minutes 45] [--eval_minutes 5] [--extra='...']
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import tempfile
import time
from pathlib import Path

import torch

from common import ROOT, print_table, read_csv, record, run_herd
from throughput import ceiling, steady_state_rate

from herd.devices import fast_bf16
from herd.learner.learner import Learner, build_optimizer, build_scheduler
from herd.losses.dqn import ApexLoss
from herd.models import build_model

FRAME_SKIP, ACTIONS, N_STEP = 4, 6, 3


def transition_batch(B: int) -> dict[str, torch.Tensor]:
    """A batch as herd/replay/transitions.py gives it: obs [2, B, 4, 84, 84] (s_t and its
    bootstrap observation), action [1, B], the n-step window [n, B], weight [1, B]."""
    g = torch.Generator().manual_seed(0)
    return {"obs": torch.randint(0, 255, (2, B, 4, 84, 84), dtype=torch.uint8, generator=g),
            "action": torch.randint(0, ACTIONS, (1, B), generator=g),
            "reward": torch.randint(-1, 2, (N_STEP, B), generator=g).float(),
            "done": torch.zeros(N_STEP, B, dtype=torch.bool), "trunc_value": torch.zeros(N_STEP, B),
            "valid": torch.ones(N_STEP, B, dtype=torch.bool), "weight": torch.rand(1, B, generator=g),
            "replayed": torch.ones(B, dtype=torch.bool)}


def learner_rate(batch_size: int, precision: str, threads: int, seconds: float = 20.0) -> float:
    """Updates per second of the Ape-X learner alone on one repeated batch."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build_model("nature_cnn", (4, 84, 84), "uint8", ACTIONS, None, head="dueling_q")
    optimizer = build_optimizer("adam", model.parameters(), 1e-4, 0.01)
    learner = Learner(model, optimizer, build_scheduler(optimizer, 1e-4, 1e-5, 10**6),
                      ApexLoss(model, 0.99, 2500), 40.0, precision=precision)
    batch = transition_batch(batch_size)
    learner.step(batch)                                       # warm-up
    updates, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        learner.step(batch)
        updates += 1
    return updates / (time.perf_counter() - start)


def evaluations(run_dir: Path) -> list[dict]:
    path = run_dir / "eval.csv"
    rows = read_csv(path) if path.exists() else []
    return [{"minutes": round(r["wall_time"] / 60, 2), "env_step": int(r["env_step"]), "update": int(r["update"]),
             "greedy_mean": r["mean"], "games": int(r["episodes"]), "greedy": r["greedy"] == "True"} for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=45.0)
    parser.add_argument("--eval_minutes", type=float, default=5.0, help="minutes between greedy evaluations")
    parser.add_argument("--eval_games", type=int, default=1, help="greedy games per evaluation")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--learner_batch", type=int, default=512)
    parser.add_argument("--extra", default="", help="extra herd flags for the run")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    precision = "bf16" if fast_bf16(torch.device("cpu")) else "fp32"
    cores = os.cpu_count() or 1
    threads = max(1, cores // 2) if precision == "bf16" else cores      # the learner's threads in a run (herd/config.py)
    ceiling_fps = ceiling("ale_vector", "PongNoFrameskip-v4", args.workers, args.envs, seconds=15) * FRAME_SKIP
    rates = {batch: learner_rate(batch, precision, threads) for batch in (args.learner_batch, 128)}
    herd_args = ["train", "--env=PongNoFrameskip-v4", "--algorithm=apex", f"--worker_count={args.workers}",
                 f"--envs_per_worker={args.envs}", "--basic_verbose=False", "--verbose_learner_out_int=20",
                 f"--eval_interval={int(args.eval_minutes * 60)}s", f"--eval_episodes={args.eval_games}",
                 "--eval_video_every=0", *shlex.split(args.extra)]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir, launch, code = run_herd(herd_args, Path(tmp), stop_after=args.minutes * 60,
                                         timeout=args.minutes * 60 + 600)
        kept = ROOT / "benchmarks" / "results" / f"apex_pong{args.tag}_run"     # the run's own files, kept first
        kept.mkdir(parents=True, exist_ok=True)
        for name in ("eval.csv", "train.csv", "episodes.csv", "log.txt", "config.json", "summary.json"):
            if (run_dir / name).exists():
                shutil.copy(run_dir / name, kept / name)
        train = read_csv(run_dir / "train.csv")
        games = read_csv(run_dir / "episodes.csv")
        greedy = evaluations(run_dir)
        config = (run_dir / "config.json").read_text()
        log_tail = (run_dir / "log.txt").read_text().splitlines()[-10:]
    warmup = 120.0
    steps_rate = steady_state_rate(train, warmup)
    late = [r for r in train if r["wall_time"] >= warmup]
    updates_rate = (late[-1]["update"] - late[0]["update"]) / (late[-1]["wall_time"] - late[0]["wall_time"])
    marked = [g for g in games if g.get("least_exploring") == 1]
    print_table(["what", "value"], [
        ["env-only ceiling, frames/s", f"{ceiling_fps:,.0f}"],
        ["training, frames/s (steady state)", f"{steps_rate * FRAME_SKIP:,.0f} ({steps_rate * FRAME_SKIP / ceiling_fps:.1%})"],
        ["training, learner updates/s", f"{updates_rate:.2f}"],
        *[[f"learner alone, batch {b}, {precision}, {threads} threads: updates/s", f"{r:.2f}"] for b, r in rates.items()],
        ["greedy evaluations (minutes: score)", ", ".join(f"{e['minutes']:.0f}: {e['greedy_mean']:.0f}" for e in greedy)],
    ])
    best = max((e["greedy_mean"] for e in greedy), default=None)
    print(f"best greedy score {best} (goal: above 0 within {args.minutes:g} minutes)")
    record(f"apex_pong{args.tag}", {
        "command": "python benchmarks/apex_pong.py " + " ".join(f"--{k}={v}" for k, v in vars(args).items()),
        "herd_args": herd_args, "exit_code": code, "precision": precision, "learner_threads": threads,
        "ceiling_fps": round(ceiling_fps), "train_fps": round(steps_rate * FRAME_SKIP),
        "train_updates_per_s": round(updates_rate, 3),
        "learner_alone_updates_per_s": {str(b): round(r, 3) for b, r in rates.items()},
        "greedy_evaluations": greedy, "best_greedy": best,
        "games": [{"minutes": round((g["unix_time"] - launch) / 60, 2), "env_step": int(g["env_step"]),
                   "score": g["score"], "least_exploring": int(g.get("least_exploring", 0) == 1)} for g in games],
        "least_exploring_games": len(marked), "config": json.loads(config), "log_tail": log_tail})


if __name__ == "__main__":
    main()
