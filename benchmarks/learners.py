"""Several learners (--learner_count) on this machine, three measurements:

  grad_sync   one update of two learners (2 gloo processes) with herd's explicit flat
              all-reduce (gradients, counters and stop votes in one buffer) against
              DistributedDataParallel (bucketed all-reduce during the backward pass, plus
              the small all-reduce of counters and stop votes herd needs anyway), and
              one learner alone: ms per update for the CartPole MLP and the Nature CNN.
  throughput  `herd train` with N = 1 and N = 2 learners for a fixed time: updates/s and
              environment frames/s in the steady state (train.csv rows after the first).
  cartpole    CartPole with --learner_count=2 for several seeds: seconds from launch to a
              100-episode average of 475, and where each run ended.

Usage: python benchmarks/learners.py grad_sync | throughput [--env CartPole-v1 --seconds 40] |
       cartpole [--seeds 1 2 3 --steps 150000]
"""
from __future__ import annotations

import argparse
import functools
import os
import shlex
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from common import print_table, read_csv, record, run_herd

from herd.learner.distributed import GroupSync, broadcast_state, join_group, leave_group, private_rendezvous
from herd.learner.learner import Learner, build_optimizer, build_scheduler
from herd.losses.impala import ImpalaLossWeights, impala_loss
from herd.models import build_model

MODELS = {  # name: (network, obs shape, dtype, actions, batch B, unroll T, timed updates), per learner
    "mlp (CartPole)": ("mlp", (4,), "float32", 2, 4, 16, 200),
    "nature_cnn (Atari)": ("nature_cnn", (4, 84, 84), "uint8", 6, 16, 10, 10),
}


def synthetic_batch(shape, dtype, actions, B, T, seed) -> dict:
    g = torch.Generator().manual_seed(seed)
    obs = (torch.randint(0, 255, (T + 1, B, *shape), dtype=torch.uint8, generator=g) if dtype == "uint8"
           else torch.randn(T + 1, B, *shape, generator=g))
    return {"obs": obs, "action": torch.randint(0, actions, (T, B), generator=g), "reward": torch.randn(T, B, generator=g),
            "done": torch.zeros(T, B, dtype=torch.bool), "trunc_value": torch.zeros(T, B),
            "behaviour_logits": torch.randn(T, B, actions, generator=g), "behaviour_value": torch.randn(T, B),
            "replayed": torch.zeros(B, dtype=torch.bool)}


def make_learner(network, shape, dtype, actions, grad_sync=None) -> Learner:
    torch.manual_seed(0)
    model = build_model(network, shape, dtype, actions, None if network != "mlp" else 64)
    optimizer = build_optimizer("adam", model.parameters(), 1e-4, 0.01)
    return Learner(model, optimizer, build_scheduler(optimizer, 1e-4, 1e-5, 10_000),
                   functools.partial(impala_loss, weights=ImpalaLossWeights()), 40.0, grad_sync=grad_sync)


def time_steps(learner: Learner, batch: dict, repeats: int) -> float:
    for _ in range(3):
        learner.step(batch)
    start = time.perf_counter()
    for _ in range(repeats):
        learner.step(batch)
    return (time.perf_counter() - start) / repeats * 1000


def sync_worker(rank: int, rendezvous: str, queue, scale: float) -> None:
    torch.set_num_threads(1)                # one core per learner process
    group = join_group(rank, 2, "cpu", 300, rendezvous)
    try:
        for name, (network, shape, dtype, actions, B, T, repeats) in MODELS.items():
            repeats = max(1, int(repeats * scale))
            batch = synthetic_batch(shape, dtype, actions, B, T, seed=rank)
            # herd: one flat all-reduce per update between backward and clip.
            learner = make_learner(network, shape, dtype, actions)
            broadcast_state(learner.model)
            learner.grad_sync = GroupSync(group, learner.trainable).exchange
            herd_ms = time_steps(learner, batch, repeats)
            # DDP: gradients all-reduced in buckets during backward (its fastest setting: the
            # feature head is in the forward's outputs, so DDP finds no unused parameter);
            # herd's counters and stop votes still need a round of their own.
            learner = make_learner(network, shape, dtype, actions)
            ddp = torch.nn.parallel.DistributedDataParallel(learner.model, find_unused_parameters=False)
            control = torch.zeros(2 * (6 + 2 * 256))

            def control_round() -> bool:
                dist.all_reduce(control)
                return True
            learner.forward, learner.grad_sync = ddp, control_round
            ddp_ms = time_steps(learner, batch, repeats)
            # The communication alone: herd's round buffer, all-reduced back to back.
            buffer = torch.zeros(sum(p.numel() for p in learner.trainable) + control.numel())
            for _ in range(3):
                dist.all_reduce(buffer)
            start = time.perf_counter()
            for _ in range(repeats):
                dist.all_reduce(buffer)
            comm_ms = (time.perf_counter() - start) / repeats * 1000
            dist.barrier()
            alone_ms = time_steps(make_learner(network, shape, dtype, actions), batch, repeats) if rank == 0 else 0.0
            if rank == 0:
                params = sum(p.numel() for p in learner.model.parameters())
                queue.put((name, params, B, T, herd_ms, ddp_ms, alone_ms, comm_ms))
            dist.barrier()
    finally:
        leave_group()


def grad_sync(args) -> None:
    context = mp.get_context("spawn")
    queue = context.Queue()
    with private_rendezvous() as rendezvous:
        workers = [context.Process(target=sync_worker, args=(rank, rendezvous, queue, args.scale)) for rank in range(2)]
        for w in workers:
            w.start()
        results = [queue.get(timeout=900) for _ in MODELS]
        for w in workers:
            w.join()
    rows = [[name, f"{params:,}", f"{B} x {T}", f"{alone:.1f}", f"{ours:.1f}", f"{ddp:.1f}", f"{comm:.2f}"]
            for name, params, B, T, ours, ddp, alone, comm in results]
    print("ms per update; two learners are two gloo processes with one torch thread each")
    print_table(["model", "parameters", "batch per learner B x T", "1 learner", "2 learners, herd all-reduce",
                 "2 learners, DDP", "the all-reduce alone"], rows)
    record("learners_grad_sync", {"command": f"python benchmarks/learners.py grad_sync --scale {args.scale}",
                                  "timed_updates": {k: max(1, int(v[-1] * args.scale)) for k, v in MODELS.items()},
                                  "results": [dict(zip(["model", "parameters", "batch", "unroll", "herd_ms", "ddp_ms",
                                                        "one_learner_ms", "allreduce_only_ms"], r)) for r in results]})


def steady_rates(run: Path) -> tuple[float, float, int]:
    """(updates/s, environment frames/s, rows) between the first and the last train.csv row."""
    rows = read_csv(run / "train.csv")
    first, last = rows[0], rows[-1]
    seconds = last["wall_time"] - first["wall_time"]
    return (last["update"] - first["update"]) / seconds, (last["env_step"] - first["env_step"]) / seconds, len(rows)


def throughput(args) -> None:
    extra = shlex.split(args.extra)
    rows, results = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for count in (1, 2):
            run, _, code = run_herd(["train", "--env", args.env, f"--learner_count={count}", "--seed=1",
                                     "--basic_verbose=False", "--tensorboard=False", "--verbose_learner_out_int=10",
                                     "--environment_max_steps=100000000", *extra], Path(tmp) / str(count),
                                    stop_after=args.seconds)
            updates, frames, n = steady_rates(run)
            frames *= 4 if "NoFrameskip" in args.env else 1          # emulator frames on Atari
            results.append({"learners": count, "exit": code, "updates_per_s": round(updates, 1),
                            "frames_per_s": round(frames), "train_rows": n})
            rows.append([count, code, f"{updates:.1f}", f"{frames:,.0f}"])
    print(f"{args.env}, {args.seconds} s per run, steady state (train.csv rows after the first), {os.cpu_count()} cores")
    print_table(["learners", "exit", "updates/s", "frames/s"], rows)
    name = args.env.split("-")[0].split("NoFrameskip")[0]
    record(f"learners_throughput_{name}", {"command": f"python benchmarks/learners.py throughput --env {args.env} "
                                           f"--seconds {args.seconds} --extra='{args.extra}'", "results": results})


def cartpole(args) -> None:
    from cartpole import time_to_target
    rows, runs = [], []
    # The quick start's options (as in the README's CartPole table) and the learner count.
    flags = [f"--learner_count={args.learners}", "--basic_verbose=False", "--tensorboard=False"]
    flags += [f"--environment_max_steps={args.steps}"] if args.steps else []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            run, launch, code = run_herd(["train", "--env", "CartPole-v1", f"--seed={seed}", *flags], Path(tmp))
            episodes = read_csv(run / "episodes.csv")
            seconds, steps = time_to_target(episodes, launch)
            scores = [e["score"] for e in episodes]
            best = max((statistics.fmean(scores[i - 100:i]) for i in range(100, len(scores) + 1)), default=float("nan"))
            final = statistics.fmean(scores[-100:])
            runs.append({"seed": seed, "exit": code, "seconds_to_475": seconds, "env_steps_to_475": steps,
                         "best_avg100": round(best, 1), "final_avg100": round(final, 1), "episodes": len(scores)})
            rows.append([seed, code, f"{seconds:.1f}" if seconds else "not reached", int(steps) if steps else "-",
                         f"{best:.1f}", f"{final:.1f}"])
    reached = sum(r["seconds_to_475"] is not None for r in runs)
    print_table(["seed", "exit", "seconds to 475 (from launch)", "env steps", "best avg100", "final avg100"], rows)
    print(f"reached 475: {reached}/{len(runs)}")
    steps = f" --steps {args.steps}" if args.steps else ""
    record(f"learners_cartpole_n{args.learners}{'_' + str(args.steps) if args.steps else ''}",
           {"command": f"python benchmarks/learners.py cartpole --learners {args.learners} --seeds "
                       f"{' '.join(map(str, args.seeds))}{steps}",
            "herd_flags": "train --env CartPole-v1 " + " ".join(flags), "reached": reached, "runs": runs})


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    g = sub.add_parser("grad_sync")
    g.add_argument("--scale", type=float, default=1.0, help="times the timed updates per model (200 MLP, 10 CNN)")
    t = sub.add_parser("throughput")
    t.add_argument("--env", default="CartPole-v1")
    t.add_argument("--seconds", type=float, default=40)
    t.add_argument("--extra", default="", help="extra herd flags in one string")
    c = sub.add_parser("cartpole")
    c.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    c.add_argument("--learners", type=int, default=2)
    c.add_argument("--steps", type=int, default=None, help="--environment_max_steps (default: herd's, 500,000)")
    args = parser.parse_args()
    {"grad_sync": grad_sync, "throughput": throughput, "cartpole": cartpole}[args.what](args)


if __name__ == "__main__":
    main()
