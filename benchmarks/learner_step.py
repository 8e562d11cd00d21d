"""How cheap can the CPU learner step be? One learner update (Nature CNN or IMPALA ResNet,
V-trace loss, RMSprop) on a Pong-sized batch, timed under each option PyTorch offers:
intra-op threads, channels-last activations, bfloat16 autocast (AMX on recent Xeons),
torch.compile. Prints milliseconds per update and frames per second of learner
throughput (frames = agent steps x 4), and records the table.

Usage: python benchmarks/learner_step.py [--batch 32] [--unroll 20] [--network nature_cnn]
"""
from __future__ import annotations

import functools
import argparse
import os
import time

import torch

from common import print_table, record

from herd.learner.learner import Learner, build_optimizer, build_scheduler
from herd.losses.impala import ImpalaLossWeights, impala_loss
from herd.models import build_model

ACTIONS = 6


def batch_of(B: int, T: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    """A batch as the learner gets it: obs [T+1, B, 4, 84, 84], the rest [T, B, ...]."""
    return {"obs": torch.randint(0, 255, (T + 1, B, 4, 84, 84), dtype=torch.uint8, generator=g),
            "action": torch.randint(0, ACTIONS, (T, B), generator=g), "reward": torch.randn(T, B, generator=g),
            "done": torch.zeros(T, B, dtype=torch.bool), "trunc_value": torch.zeros(T, B),
            "behaviour_logits": torch.randn(T, B, ACTIONS, generator=g), "behaviour_value": torch.randn(T, B),
            "replayed": torch.zeros(B, dtype=torch.bool)}


def time_updates(learner: Learner, batch, repeats: int) -> float:
    for _ in range(2):
        learner.step(batch)                   # warm-up (and compilation)
    start = time.perf_counter()
    for _ in range(repeats):
        learner.step(batch)
    return (time.perf_counter() - start) / repeats * 1000


def make(network: str, precision: str, compiled: bool, channels_last: bool) -> Learner:
    torch.manual_seed(0)
    model = build_model(network, (4, 84, 84), "uint8", ACTIONS, None)
    # The Nature CNN's own switch (herd/models/cnn.py): channels-last activations in the
    # learner on CPU, herd's default. The ResNet is channels-last on CPU always: there the
    # plain rows convert the weights too, which changes nothing.
    if hasattr(model, "channels_last_when_training"):
        model.channels_last_when_training = channels_last
    elif channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = build_optimizer("rmsprop", model.parameters(), 0.0008, 0.01)
    # compile_model as herd's learner compiles: its training forward pass only (replacing
    # learner.model, as this script once did, left the learner running the plain model).
    return Learner(model, optimizer, build_scheduler(optimizer, 0.0008, 1e-5, 10000),
                   functools.partial(impala_loss, weights=ImpalaLossWeights()), 40.0, precision=precision,
                   compile_model=compiled)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--unroll", type=int, default=20)
    parser.add_argument("--network", default="nature_cnn", choices=("nature_cnn", "resnet"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no_compile", action="store_true", help="skip the torch.compile rows (slow to build)")
    args = parser.parse_args()
    batch = batch_of(args.batch, args.unroll)
    frames = args.batch * args.unroll * 4
    cores = os.cpu_count() or 1
    options = [(threads, precision, False, False) for threads in sorted({1, cores}) for precision in ("fp32", "bf16")]
    options += [(cores, "fp32", False, True), (cores, "bf16", False, True)]
    if not args.no_compile:       # compiled, without and with channels-last (herd's default on CPU)
        options += [(cores, precision, True, channels_last) for channels_last in (False, True)
                    for precision in ("fp32", "bf16")]
    rows, results = [], []
    for threads, precision, compiled, channels_last in options:
        torch.set_num_threads(threads)
        try:
            ms = time_updates(make(args.network, precision, compiled, channels_last), batch, args.repeats)
        except Exception as err:  # torch.compile needs a working C compiler; report, don't stop
            rows.append([threads, precision, "yes" if channels_last else "no", "yes" if compiled else "no",
                         f"failed: {type(err).__name__}", "-"])
            continue
        results.append({"threads": threads, "precision": precision, "channels_last": channels_last,
                        "compiled": compiled, "ms_per_update": round(ms, 1), "learner_fps": round(frames / ms * 1000)})
        rows.append([threads, precision, "yes" if channels_last else "no", "yes" if compiled else "no",
                     f"{ms:.0f}", f"{frames / ms * 1000:,.0f}"])
    print(f"{args.network}, batch {args.batch} x unroll {args.unroll} ({frames:,} frames per update)")
    print_table(["threads", "precision", "channels-last", "torch.compile", "ms/update", "learner frames/s"], rows)
    record(f"learner_step_{args.network}_b{args.batch}_t{args.unroll}",
           {"command": f"python benchmarks/learner_step.py --batch {args.batch} --unroll {args.unroll} "
                       f"--network {args.network}", "results": results})


if __name__ == "__main__":
    main()
