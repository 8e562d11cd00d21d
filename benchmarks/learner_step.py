"""The learner step, old against new: one update (Nature CNN or IMPALA ResNet, V-trace
loss, RMSprop, T=20) on Pong-sized batches already on the device, the step as it was
before it lost its host reads (herd/learner/reference.py, herd 9aa5e12) beside today's
(herd/learner/learner.py: no host read, foreach optimizer, closed-form V-trace; on a GPU
captured as one CUDA graph). For each batch: ms per update, host reads per update and
aten ops per update (herd/learner/counting.py). Also CartPole's learner (MLP, its
profile's batch 8 x 16, Adam) in updates per second, old and new. Records the table in
benchmarks/results/learner_step_compare_<device>.json; its last line:
    learner_step: device=<d> batch=32 plain_ms=<x> fast_ms=<y> syncs_per_update=<z>

Usage: python benchmarks/learner_step.py [--device cpu|cuda] [--batches 8 32 128]
       python benchmarks/learner_step.py --options [--batch 32]   (the older sweep: threads,
       channels-last, bf16, torch.compile, for today's step)
"""
from __future__ import annotations

import functools
import argparse
import os
import time

import torch

from common import print_table, record

from herd.devices import fast_bf16

from herd.learner.counting import count
from herd.learner.learner import Learner, build_optimizer, build_scheduler
from herd.learner.reference import ReferenceLearner, reference_impala_loss, reference_optimizer, reference_scheduler
from herd.learner.step_metrics import MetricSums
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


def options_sweep(args) -> None:
    """The older table: today's step under each option PyTorch offers (threads,
    channels-last, bf16 autocast, torch.compile), on the CPU."""
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


METRICS = ("loss", "pg_loss", "value_loss", "entropy", "policy_cloning_loss", "value_cloning_loss",
           "kl_mask_fraction", "mean_rho", "grad_norm", "lr")


def pair(network: str, obs: tuple, obs_dtype: str, actions: int, optimizer: str, lr: float, precision: str,
         device: torch.device, hidden: tuple = ()) -> tuple[ReferenceLearner, Learner]:
    """The old and the new learner from the same initial weights."""
    learners = []
    for make_opt, make_sched, cls, loss, extra in (
            (reference_optimizer, reference_scheduler, ReferenceLearner, reference_impala_loss, {}),
            (build_optimizer, build_scheduler, Learner, impala_loss, {"capture": device.type == "cuda"})):
        torch.manual_seed(0)
        kwargs = {"hidden_sizes": hidden} if hidden else {}
        model = build_model(network, obs, obs_dtype, actions, 64 if hidden else None, **kwargs).to(device)
        opt = make_opt(optimizer, model.parameters(), lr, 1e-5)
        learners.append(cls(model, opt, make_sched(opt, lr, 1e-5, 10**6),
                            functools.partial(loss, weights=ImpalaLossWeights()), 40.0, precision=precision, **extra))
    return learners[0], learners[1]


def steady_state(learner, batch, repeats: int, device: torch.device) -> tuple[float, float, float]:
    """(ms per update, host reads per update, aten ops per update) after a warm-up; the new
    learner's metrics go into a MetricSums as a run's do (read once, after the timing)."""
    sums = MetricSums(METRICS, device) if isinstance(learner, Learner) else None

    def updates(n):
        for _ in range(n):
            metrics = learner.step(batch)
            if sums is not None:
                sums.add(metrics)

    updates(5)                                          # warm-up (and, on a GPU, the capture)
    counts = count(lambda: updates(2))
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    updates(repeats)
    if device.type == "cuda":
        torch.cuda.synchronize()
    ms = (time.perf_counter() - start) / repeats * 1000
    if sums is not None:
        sums.read()
    return ms, counts.host_reads / 2, counts.aten_ops / 2


def compare(args) -> None:
    device = torch.device(args.device)
    precision = "bf16" if fast_bf16(device) else "fp32"
    threads = 1 if device.type == "cuda" else (os.cpu_count() or 1)
    torch.set_num_threads(threads)
    rows, results = [], []
    for B in args.batches:
        batch = {k: v.to(device) for k, v in batch_of(B, args.unroll).items()}
        old, new = pair(args.network, (4, 84, 84), "uint8", ACTIONS, "rmsprop", 0.0006, precision, device)
        row = {"learner": f"{args.network} {B}x{args.unroll}", "batch": B}
        for name, learner in (("old", old), ("new", new)):
            ms, reads, ops = steady_state(learner, batch, args.repeats, device)
            row.update({f"{name}_ms": round(ms, 2), f"{name}_host_reads": reads, f"{name}_aten_ops": ops})
        row["new_captured"] = new.graph is not None   # a failed capture runs eagerly (and logs why)
        results.append(row)
    # CartPole's learner: the vector profile's MLP, batch 8 x 16, Adam, fp32, one thread.
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    T, B = 16, 8
    small = {"obs": torch.randn(T + 1, B, 4, generator=g), "action": torch.randint(0, 2, (T, B), generator=g),
             "reward": torch.randn(T, B, generator=g), "done": torch.zeros(T, B, dtype=torch.bool),
             "trunc_value": torch.zeros(T, B), "behaviour_logits": torch.randn(T, B, 2, generator=g),
             "behaviour_value": torch.randn(T, B, generator=g), "replayed": torch.zeros(B, dtype=torch.bool)}
    old, new = pair("mlp", (4,), "float32", 2, "adam", 0.001, "fp32", torch.device("cpu"), hidden=(64, 64))
    row = {"learner": f"CartPole mlp {B}x{T}", "batch": B}
    for name, learner in (("old", old), ("new", new)):
        ms, reads, ops = steady_state(learner, small, args.repeats * 20, torch.device("cpu"))
        row.update({f"{name}_ms": round(ms, 3), f"{name}_host_reads": reads, f"{name}_aten_ops": ops,
                    f"{name}_updates_per_s": round(1000 / ms, 1)})
    results.append(row)
    table = [[r["learner"], r["old_ms"], r["new_ms"], f"{r['old_ms'] / r['new_ms']:.2f}x", r["old_host_reads"],
              r["new_host_reads"], r["old_aten_ops"], r["new_aten_ops"]] for r in results]
    print(f"learner step on {device.type} ({precision}, {threads} thread(s)"
          f"{', new step captured as one CUDA graph' if all(r['new_captured'] for r in results if 'new_captured' in r) else ''}; "
          f"load average {os.getloadavg()[0]:.1f})")
    print_table(["learner", "old ms", "new ms", "speed-up", "old reads/upd", "new reads/upd", "old ops/upd",
                 "new ops/upd"], table)
    record(f"learner_step_compare_{device.type}",
           {"command": f"python benchmarks/learner_step.py --device {args.device} --batches "
                       f"{' '.join(map(str, args.batches))} --repeats {args.repeats}",
            "precision": precision, "threads": threads, "results": results})
    headline = next((r for r in results if r["batch"] == 32 and r["learner"].startswith(args.network)), results[0])
    print(f"learner_step: device={device.type} batch={headline['batch']} plain_ms={headline['old_ms']} "
          f"fast_ms={headline['new_ms']} syncs_per_update={headline['new_host_reads']}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--batch", type=int, default=32, help="--options: the batch of the sweep")
    parser.add_argument("--unroll", type=int, default=20)
    parser.add_argument("--network", default="nature_cnn", choices=("nature_cnn", "resnet"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--options", action="store_true", help="the older sweep of PyTorch options instead")
    parser.add_argument("--no_compile", action="store_true", help="--options: skip the torch.compile rows")
    args = parser.parse_args()
    if args.options:
        options_sweep(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
