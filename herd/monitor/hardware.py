"""Hardware figures of a run, every few seconds, into hardware.csv and TensorBoard.

One row per process and per figure source at each sample (long format: the set of actor
processes changes when one is restarted):

    wall_time, source, pid, cpu_percent, rss_mib, shared_mib, value

    source = learner | actor-<i> | inference     one of the run's processes (on the learner's
             | replay-server                     node); cpu_percent is of one core (200 = two
                                                 cores busy)
             system                              cpu_percent of the whole machine (all cores =
                                                 100), rss_mib = memory in use
             replay                              value = MiB held by the replays' storage
             gpu<i>                              NVIDIA GPUs through NVML (the optional
                                                 nvidia-ml-py package): cpu_percent = GPU
                                                 utilisation, rss_mib = its memory in use,
                                                 value = power draw in watts

Where NVML or a GPU is missing, there are simply no gpu rows: no warning, no error. The
sampler runs in a daemon thread of the learner's process; psutil reads /proc, so it costs
the run a few milliseconds per sample."""
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

COLUMNS = ["wall_time", "source", "pid", "cpu_percent", "rss_mib", "shared_mib", "value"]
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
        rows.append({"source": f"gpu{index}", "cpu_percent": utilisation, "rss_mib": round(memory, 1),
                     "value": round(power, 1)})
    return rows


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
                rows.append({"source": source, "pid": pid, "cpu_percent": process.cpu_percent(None),
                             "rss_mib": round(memory.rss / MIB, 1),
                             "shared_mib": round(getattr(memory, "shared", 0) / MIB, 1)})
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                self.tracked.pop(pid, None)              # ended (a restarted actor): no row
        return rows

    def sample(self) -> list[dict]:
        """One round of rows (also what the thread writes)."""
        memory = psutil.virtual_memory()
        rows = self.process_rows()
        rows.append({"source": "system", "cpu_percent": psutil.cpu_percent(None),
                     "rss_mib": round((memory.total - memory.available) / MIB, 1)})
        rows.append({"source": "replay", "value": round(self.replay_bytes() / MIB, 1)})
        rows.extend(gpu_rows(self.gpus))
        wall = round(self.clock() - self.start_time, 2)
        return [{"wall_time": wall, **row} for row in rows]

    def write(self, rows: list[dict]) -> None:
        with open(self.path, "a", newline="") as f:
            csv.writer(f).writerows([[row.get(c, "") for c in COLUMNS] for row in rows])
        if self.writer is not None:
            for row in rows:
                for column in ("cpu_percent", "rss_mib", "value"):
                    if row.get(column, "") != "":
                        self.writer.add_scalar(f"hardware/{row['source']}/{column}", row[column],
                                               int(row["wall_time"]))

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
