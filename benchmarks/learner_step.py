"""The learner step, old against new: one update (Nature CNN or IMPALA ResNet, V-trace
loss, RMSprop, T=20) on Pong-sized batches already on the device, the step as it was
before it lost its host reads (benchmarks/reference_step.py, herd 9aa5e12) beside today's
(herd/learner/learner.py: no host read, foreach optimizer, closed-form V-trace; on a CPU
in the layout and precision herd's CPU learner picks for the shape by timing them,
herd/learner/autotune.py; on a GPU captured as one CUDA graph). The old and new updates
take turns after a warm-up, so that load from other processes falls on both alike. For
each batch: ms per update (the fastest, and the median), host reads per update and aten
ops per update (benchmarks/op_counts.py). Also CartPole's learner (MLP, its profile's
batch 8 x 16, Adam, one thread). Records the table in
benchmarks/results/learner_step_compare_<device>.json; its last line:
    learner_step: device=<d> batch=32 plain_ms=<x> fast_ms=<y> syncs_per_update=<z>

Usage: python benchmarks/learner_step.py [--device cpu|cuda] [--batches 8 32 128]
       python benchmarks/learner_step.py --options [--batch 32]   (the older sweep: threads,
       channels-last, bf16, torch.compile, for today's step)
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

import torch

from common import print_table, record
from op_counts import count
from reference_step import ReferenceLearner, reference_impala_loss, reference_optimizer, reference_scheduler

from herd.devices import fast_bf16

from herd.learner.autotune import Choice, StepConfig, candidates, choose, timed_updates
from herd.learner.learner import Learner, build_optimizer, build_scheduler
from herd.losses.impala import ImpalaLossWeights, impala_loss
from herd.models import build_model
from herd.models.base import TrainingLayout

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
    # learner on CPU, herd's default before it was timed per shape (the ResNet has the same).
    if isinstance(model, TrainingLayout):
        model.channels_last_when_training = channels_last
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


LOSS_METRICS = ("loss", "pg_loss", "value_loss", "entropy", "policy_cloning_loss", "value_cloning_loss",
                "kl_mask_fraction", "mean_rho")


def pair(network: str, obs: tuple, obs_dtype: str, actions: int, optimizer: str, lr: float, precision: str,
         device: torch.device, batch: dict, hidden: tuple = ()) -> tuple[ReferenceLearner, Learner, Choice]:
    """The old and the new learner from the same initial weights: the old in `precision`
    with the network's default layout, the new as herd's CPU learner picks it (the fastest
    of its layouts and precisions on this batch, timed as at a run's start-up, no cache);
    on a GPU the new one in `precision`, captured."""
    def build(cls, make_opt, make_sched, loss, config: StepConfig, **extra):
        torch.manual_seed(0)
        kwargs = {"hidden_sizes": hidden} if hidden else {}
        model = build_model(network, obs, obs_dtype, actions, 64 if hidden else None, **kwargs).to(device)
        if isinstance(model, TrainingLayout) and config.channels_last is not None:
            model.channels_last_when_training = config.channels_last
        opt = make_opt(optimizer, model.parameters(), lr, 1e-5)
        return cls(model, opt, make_sched(opt, lr, 1e-5, 10**6), functools.partial(loss, weights=ImpalaLossWeights()),
                   40.0, precision=config.precision, **extra)

    def new(config: StepConfig) -> Learner:
        return build(Learner, build_optimizer, build_scheduler, impala_loss, config, capture=device.type == "cuda",
                     metric_names=LOSS_METRICS)

    has_layout = network in ("nature_cnn", "resnet")
    old = build(ReferenceLearner, reference_optimizer, reference_scheduler, reference_impala_loss,
                StepConfig(precision, True if has_layout else None))
    if device.type == "cuda":
        config = StepConfig(precision, True if has_layout else None)
        return old, new(config), Choice(config, {}, "a GPU learner: as given")
    choice = choose(candidates("auto", "auto", fast_bf16(device), has_layout), timed_updates(new, batch))
    print(f"{network} {batch['reward'].shape[1]}x{batch['reward'].shape[0]}: {choice.log_line()}", flush=True)
    return old, new(choice.picked), choice


def interleaved(learners: dict, batch, repeats: int, device: torch.device) -> dict:
    """{name: (fastest ms, median ms, host reads, aten ops) per update}: after a warm-up each,
    the learners take turns, one update each per round, so that load from other processes
    on a shared machine falls on all of them alike; the new learner sums its metrics inside
    its update as a run's does (read once, after the timing)."""
    sums = {name: learner.metric_sums if isinstance(learner, Learner) else None for name, learner in learners.items()}

    def update(name):
        learners[name].step(batch)

    counts = {}
    for name in learners:
        for _ in range(5):
            update(name)                                # warm-up (and, on a GPU, the capture)
        counts[name] = count(lambda: [update(name) for _ in range(2)])
    samples = {name: [] for name in learners}
    for _ in range(repeats):
        for name in learners:
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            update(name)
            if device.type == "cuda":
                torch.cuda.synchronize()
            samples[name].append((time.perf_counter() - start) * 1000)
    for s in sums.values():
        if s is not None:
            s.read()
    return {name: (min(ms), statistics.median(ms), counts[name].host_reads / 2, counts[name].aten_ops / 2)
            for name, ms in samples.items()}


def compare(args) -> None:
    device = torch.device(args.device)
    precision = "bf16" if fast_bf16(device) else "fp32"
    threads = 1 if device.type == "cuda" else (os.cpu_count() or 1)
    torch.set_num_threads(threads)
    results = []
    g = torch.Generator().manual_seed(0)
    T, B = 16, 8
    # CartPole's learner: the vector profile's MLP, batch 8 x 16, Adam, fp32 for the old step, one thread.
    small = {"obs": torch.randn(T + 1, B, 4, generator=g), "action": torch.randint(0, 2, (T, B), generator=g),
             "reward": torch.randn(T, B, generator=g), "done": torch.zeros(T, B, dtype=torch.bool),
             "trunc_value": torch.zeros(T, B), "behaviour_logits": torch.randn(T, B, 2, generator=g),
             "behaviour_value": torch.randn(T, B, generator=g), "replayed": torch.zeros(B, dtype=torch.bool)}
    cases = [(f"{args.network} {b}x{args.unroll}", b, {k: v.to(device) for k, v in batch_of(b, args.unroll).items()},
              dict(network=args.network, obs=(4, 84, 84), obs_dtype="uint8", actions=ACTIONS, optimizer="rmsprop",
                   lr=0.0006, precision=precision, device=device), threads, args.repeats) for b in args.batches]
    cases.append((f"CartPole mlp {B}x{T}", B, small,
                  dict(network="mlp", obs=(4,), obs_dtype="float32", actions=2, optimizer="adam", lr=0.001,
                       precision="fp32", device=torch.device("cpu"), hidden=(64, 64)), 1, args.repeats * 20))
    for name, b, batch, kwargs, case_threads, repeats in cases:
        torch.set_num_threads(case_threads)
        old, new, choice = pair(**kwargs, batch=batch)
        row = {"learner": name, "batch": b, "new_runs": choice.picked.label, "new_choice_ms": choice.ms}
        timed = interleaved({"old": old, "new": new}, batch, repeats, kwargs["device"])
        for which, (fastest_ms, median_ms, reads, ops) in timed.items():
            row.update({f"{which}_ms": round(fastest_ms, 3), f"{which}_median_ms": round(median_ms, 3),
                        f"{which}_host_reads": reads, f"{which}_aten_ops": ops})
        if isinstance(new, Learner) and kwargs["device"].type == "cuda":
            row["new_captured"] = new.graph is not None   # a failed capture runs eagerly (and logs why)
        results.append(row)
    table = [[r["learner"], r["new_runs"], r["old_ms"], r["new_ms"], f"{r['old_ms'] / r['new_ms']:.2f}x",
              f"{r['old_median_ms'] / r['new_median_ms']:.2f}x", r["old_host_reads"], r["new_host_reads"],
              r["old_aten_ops"], r["new_aten_ops"]] for r in results]
    captured = device.type == "cuda" and all(r.get("new_captured", True) for r in results[:-1])
    print(f"learner step on {device.type} (old: {precision}, {threads} thread(s), CartPole 1; new: as picked"
          f"{', captured as one CUDA graph' if captured else ''}; fastest of {args.repeats} interleaved updates; "
          f"load average {os.getloadavg()[0]:.1f}; speed new/old = old ms / new ms)")
    print_table(["learner", "new runs", "old ms", "new ms", "speed new/old", "(medians)", "old reads/upd",
                 "new reads/upd", "old ops/upd", "new ops/upd"], table)
    record(f"learner_step_compare_{device.type}",
           {"command": f"python benchmarks/learner_step.py --device {args.device} --batches "
                       f"{' '.join(map(str, args.batches))} --repeats {args.repeats}",
            "old_precision": precision, "threads": threads,
            "timing": "old and new updates interleaved after a warm-up; *_ms the fastest update, *_median_ms the "
                      "median", "results": results})
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
