"""Hardware figures of a run, every few seconds, into hardware.csv and TensorBoard.

One row per figure (long format: the set of actor processes changes when one is
restarted, and each figure keeps its own unit):

    time, source, metric, value, unit

    time    seconds since the monitor started
    source  learner | actor-<i> | inference | replay-server: one of the run's processes (on
            the learner's node): cpu (% of one core: 200 = two cores busy), rss and
            shared (MiB)
            system: cpu (% of the whole machine: all cores = 100), memory_used (MiB)
            replay: stored (MiB held by the replays' storage)
            gpu<i>: NVIDIA GPUs through NVML (the optional nvidia-ml-py package):
            utilisation (%), memory_used (MiB), power (W)

Where NVML or a GPU is missing, there are simply no gpu rows: no warning, no error. The
sampler runs in a daemon thread of the learner's process; psutil reads /proc, so it costs
the run a few milliseconds per sample. TensorBoard gets hardware/<source>/<metric>."""
from __future__ import annotations

import csv
import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

import psutil

log = logging.getLogger("herd")

COLUMNS = ["time", "source", "metric", "value", "unit"]
MIB = 2**20


def nvml_gpus() -> list:
    """NVML device handles, or [] where the package, the driver or a GPU is missing."""
    try:
        import pynvml
        pynvml.nvmlInit()
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # ImportError, NVMLError_LibraryNotFound, no device...: no GPU figures
        return []


def gpu_rows(handles: list) -> list[dict]:
    if not handles:
        return []
    import pynvml
    rows = []
    for index, handle in enumerate(handles):
        try:
            utilisation = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).used / MIB
            power = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
        except Exception:  # a GPU that stops answering is reported as missing, not fatal
            continue
        rows += [figure(f"gpu{index}", "utilisation", utilisation, "%"),
                 figure(f"gpu{index}", "memory_used", round(memory, 1), "MiB"),
                 figure(f"gpu{index}", "power", round(power, 1), "W")]
    return rows


def figure(source: str, metric: str, value: float, unit: str) -> dict:
    """One row of hardware.csv (without its time)."""
    return {"source": source, "metric": metric, "value": value, "unit": unit}


class HardwareMonitor:
    """processes() -> {source name: pid} of the run's processes now (the backend keeps it);
    replay_bytes() -> bytes the replays hold. Start with start(), end with close()."""

    def __init__(self, run_dir: Path, processes: Callable[[], dict], replay_bytes: Callable[[], int],
                 interval: float = 5.0, writer=None, clock: Callable[[], float] = time.monotonic):
        self.path = run_dir / "hardware.csv"
        self.processes, self.replay_bytes = processes, replay_bytes
        self.interval, self.writer, self.clock = interval, writer, clock
        self.start_time = clock()
        self.tracked: dict[int, psutil.Process] = {}     # cpu_percent needs the same object each time
        self.gpus = nvml_gpus()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name="herd-hardware", daemon=True)
        with open(self.path, "w", newline="") as f:
            csv.writer(f).writerow(COLUMNS)
        psutil.cpu_percent(None)                         # the first system reading sets the baseline

    def start(self) -> None:
        self.thread.start()

    def process_rows(self) -> list[dict]:
        rows = []
        for source, pid in sorted(self.processes().items()):
            process = self.tracked.get(pid)
            try:
                if process is None:
                    process = self.tracked[pid] = psutil.Process(pid)
                    process.cpu_percent(None)            # baseline: the first reading of a process is 0
                memory = process.memory_info()
                rows += [figure(source, "cpu", process.cpu_percent(None), "%"),
                         figure(source, "rss", round(memory.rss / MIB, 1), "MiB"),
                         figure(source, "shared", round(getattr(memory, "shared", 0) / MIB, 1), "MiB")]
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                self.tracked.pop(pid, None)              # ended (a restarted actor): no row
        return rows

    def sample(self) -> list[dict]:
        """One round of rows (also what the thread writes)."""
        memory = psutil.virtual_memory()
        rows = self.process_rows()
        rows += [figure("system", "cpu", psutil.cpu_percent(None), "%"),
                 figure("system", "memory_used", round((memory.total - memory.available) / MIB, 1), "MiB"),
                 figure("replay", "stored", round(self.replay_bytes() / MIB, 1), "MiB")]
        rows.extend(gpu_rows(self.gpus))
        now = round(self.clock() - self.start_time, 2)
        return [{"time": now, **row} for row in rows]

    def write(self, rows: list[dict]) -> None:
        with open(self.path, "a", newline="") as f:
            csv.writer(f).writerows([[row.get(c, "") for c in COLUMNS] for row in rows])
        if self.writer is not None:
            for row in rows:
                self.writer.add_scalar(f"hardware/{row['source']}/{row['metric']}", row["value"], int(row["time"]))

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            try:
                self.write(self.sample())
            except Exception as err:  # figures are a convenience: never let them stop training
                log.warning("hardware figures stopped (%s: %s)", type(err).__name__, err)
                return

    def close(self) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(2.0)
