"""Shared helpers of the benchmarks: run herd in a subprocess, read its run folder,
print a table and record results beside the benchmark."""
from __future__ import annotations

import csv
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    """What a number depends on: the CPU (model, cores, whether it has bf16 units), the GPU if any, memory,
    the load while it ran (other programs share the cores), versions."""
    import torch

    from herd.devices import fast_bf16
    return {"cpus": os.cpu_count(), "cpu_model": cpu_model(), "bf16_units": fast_bf16(torch.device("cpu")),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "load_average_1min": round(os.getloadavg()[0], 2),
            "processor": platform.processor() or platform.machine(), "python": platform.python_version(),
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def herd_command(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "herd.cli", *args]


def newest_run(results_dir: Path, before: set) -> Path:
    runs = [p for p in results_dir.iterdir() if p.is_dir() and p not in before]
    return max(runs, key=lambda p: p.stat().st_mtime)


def run_herd(args: list[str], results_dir: Path, stop_after: float | None = None,
             timeout: float = 600) -> tuple[Path, float, int]:
    """Runs `herd <args>`; returns (run folder, launch unix time, exit code). With
    stop_after, sends SIGINT after that many seconds (a clean, saved stop)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    before = set(results_dir.iterdir())
    launch = time.time()
    process = subprocess.Popen(herd_command([*args, f"--results_dir={results_dir}"]), cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        if stop_after is not None:
            try:
                process.wait(stop_after)
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    if process.returncode != 0:
        sys.stderr.write(err[-3000:])
    return newest_run(results_dir, before), launch, process.returncode


def number_or_text(value: str | None):
    """A CSV cell as a float ("" -> nan), or as the text it is (eval.csv's `greedy` column:
    a long benchmark must not die on a text column after its run)."""
    if value in ("", None):
        return float("nan")
    try:
        return float(value)
    except ValueError:
        return value


def read_csv(path: Path) -> list[dict]:
    with open(path) as f:
        return [{k: number_or_text(v) for k, v in row.items()} for row in csv.DictReader(f)]


# A run's processes as hardware.csv names them (herd/monitor/hardware.py), by role.
ROLES = {"actors": "actor-", "servers": "inference", "learner": "learner"}


def busy_shares(hardware: list[dict], after: float) -> dict[str, float]:
    """hardware.csv's rows -> role -> how busy its processes were, as a share of one core
    each (1.0: a core's worth of CPU time), averaged over the processes of the role and
    the samples at `after` seconds or later (a process's first sample is its baseline, 0,
    and an actor's start-up is not its steady state). Roles without a process are left out."""
    shares = {}
    for role, prefix in ROLES.items():
        values = [row["value"] for row in hardware if row["metric"] == "cpu" and row["time"] >= after
                  and str(row["source"]).startswith(prefix)]
        if values:
            shares[role] = round(sum(values) / len(values) / 100.0, 3)
    return shares


def moving_averages(episodes: list[dict], window: int = 100) -> list[tuple[dict, float, int]]:
    """For each row of episodes.csv, in order: (row, average score of the last `window`
    games up to and including it, how many games that average holds)."""
    scores: deque = deque(maxlen=window)
    out = []
    for row in episodes:
        scores.append(row["score"])
        out.append((row, sum(scores) / len(scores), len(scores)))
    return out


def record(name: str, data: dict) -> Path:
    """Writes benchmarks/results/<name>.json with the machine it ran on."""
    out = ROOT / "benchmarks" / "results" / f"{name}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M"), **data}, indent=2))
    return out


def print_table(headers: list[str], rows: list[list]) -> None:
    widths = [max([len(str(h))] + [len(str(r[i])) for r in rows]) for i, h in enumerate(headers)]
    print("  ".join(str(h).ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
