"""What watching a run costs training: Pong training throughput with neither hardware
sampling nor the evaluation worker (`--hardware_interval=0`), with hardware sampling only
(herd's default, every 5 s), and with both (`--eval_interval`), in one command, in rounds
(none, hardware, both, none, ...) so that all three see the same machine. Each training run is herd's on-policy configuration of throughput.py; the
rate is the steady state read from train.csv after a warm-up. The evaluation plays whole
Pong games (a game lasts minutes at random play) in its own low-priority process.

Goal (issue on monitoring): at most 5% slower with each (hardware against none, both against
hardware: the worker's own cost) and with both against none.
Usage: python benchmarks/eval_overhead.py [--pairs 2] [--seconds 90] [--eval_interval 30s]"""
from __future__ import annotations

import argparse
import csv
import statistics
import tempfile
from pathlib import Path

from common import print_table, read_csv, record, run_herd
from throughput import ON_POLICY, steady_state_rate


def sampling_cost(samples: int = 200) -> float:
    """CPU milliseconds of one round of hardware figures (herd/monitor/hardware.py: psutil
    for the learner and 3 busy stand-in processes, hardware.csv and TensorBoard), the same
    work the monitor's thread does in the learner's process every --hardware_interval."""
    import os
    import subprocess
    import sys
    import time

    from torch.utils.tensorboard import SummaryWriter

    from herd.monitor.hardware import HardwareMonitor
    busy = [subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.001)"]) for _ in range(3)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            processes = {"learner": os.getpid(), **{f"actor-{i}": p.pid for i, p in enumerate(busy)}}
            writer = SummaryWriter(tmp)
            monitor = HardwareMonitor(Path(tmp), lambda: processes, lambda: 2**20, writer=writer)
            monitor.write(monitor.sample())                       # the first reading sets baselines
            start = time.process_time()
            for _ in range(samples):
                monitor.write(monitor.sample())
            cost = (time.process_time() - start) / samples * 1000
            writer.close()                                        # before its folder is removed
            return cost
    finally:
        for process in busy:
            process.kill()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", default="PongNoFrameskip-v4")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=2, help="rounds of the three configurations")
    parser.add_argument("--seconds", type=float, default=90)
    parser.add_argument("--warmup", type=float, default=30)
    parser.add_argument("--eval_interval", default="30s")
    parser.add_argument("--eval_episodes", type=int, default=2)
    parser.add_argument("--label", default="eval_overhead", help="names the results file")
    parser.add_argument("--sampling_only", action="store_true",
                        help="only time one round of hardware figures directly (CPU ms), without training runs")
    args = parser.parse_args()
    sample_ms = sampling_cost()
    share = sample_ms / (5000 * 1.0)          # of one core, at the default interval of 5 s
    print(f"hardware_sample_cpu_ms={sample_ms:.2f} share_of_one_core_at_5s={100 * share:.3f}%")
    if args.sampling_only:
        record(args.label, {"hardware_sample_cpu_ms": sample_ms, "share_of_one_core_at_5s": share})
        return
    base = ["train", f"--env={args.env}", f"--worker_count={args.workers}", f"--envs_per_worker={args.envs}",
            "--basic_verbose=False", "--verbose_learner_out_int=5", *ON_POLICY]   # a train.csv row every 5 updates
    with_eval = [f"--eval_interval={args.eval_interval}", f"--eval_episodes={args.eval_episodes}",
                 "--eval_video_every=0"]
    configs = {"none": ["--hardware_interval=0"], "hardware": [], "hardware+eval": with_eval}
    rates: dict[str, list[float]] = {name: [] for name in configs}
    evaluations = 0
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            for name, extra in configs.items():
                run_dir, _, code = run_herd([*base, *extra], Path(tmp) / f"{name}{pair}", stop_after=args.seconds)
                if code != 0:
                    raise SystemExit(f"eval_overhead: the {name} run failed (exit {code})")
                rates[name].append(4 * steady_state_rate(read_csv(run_dir / "train.csv"), args.warmup))
                if extra is with_eval and (run_dir / "eval.csv").exists():
                    with open(run_dir / "eval.csv", newline="") as f:   # has text columns: count rows only
                        evaluations += sum(1 for _ in csv.DictReader(f))
    means = {name: statistics.mean(values) for name, values in rates.items()}
    # Each cost against the configuration without it: sampling alone, the worker alone, both.
    slowdowns = {"hardware sampling": 1 - means["hardware"] / means["none"],
                 "evaluation worker": 1 - means["hardware+eval"] / means["hardware"],
                 "both": 1 - means["hardware+eval"] / means["none"]}
    print_table(["configuration", "frames/s per run", "mean"],
                [[name, ", ".join(f"{v:,.0f}" for v in values), f"{means[name]:,.0f}"] for name, values in rates.items()])
    print(" ".join(f"{name.replace(' ', '_')}_slowdown={100 * value:.1f}%" for name, value in slowdowns.items()),
          f"evaluations_finished={evaluations}")
    record(args.label, {"command": " ".join(base), "configurations": configs, "seconds": args.seconds,
                        "warmup": args.warmup, "frames_per_second": rates, "mean": means,
                        "slowdown_fraction": slowdowns, "evaluations_finished": evaluations,
                        "hardware_sample_cpu_ms": sample_ms})


if __name__ == "__main__":
    main()
