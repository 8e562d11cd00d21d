"""Hardware figures: per-process CPU and memory of the run's processes, the machine, the
replay memory; GPU rows where NVML sees a GPU, none (and no warning) where it does not."""
import csv
import os
import subprocess
import sys
import time

import pytest
import torch

from herd.monitor.hardware import COLUMNS, HardwareMonitor, nvml_gpus


def test_a_busy_process_shows_its_cpu_and_an_ended_one_disappears(tmp_path):
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        processes = {"learner": os.getpid(), "actor-0": busy.pid, "actor-1": idle.pid}
        monitor = HardwareMonitor(tmp_path, lambda: dict(processes), lambda: 3 * 2**20, interval=60)
        monitor.sample()                                   # the baseline reading of each process
        time.sleep(1.0)
        sample = monitor.sample()
        rows = {(row["source"], row["metric"]): (row["value"], row["unit"]) for row in sample}
        # The busy loop gets what a loaded machine leaves it (16% at load 12 on 2 cores),
        # the sleeping one next to nothing.
        busy_cpu, idle_cpu = rows["actor-0", "cpu"][0], rows["actor-1", "cpu"][0]
        assert busy_cpu >= 10 and idle_cpu < busy_cpu / 5 and rows["actor-0", "cpu"][1] == "%"
        assert rows["learner", "rss"][0] > 10 and rows["learner", "rss"][1] == "MiB"
        assert 0 <= rows["system", "cpu"][0] <= 100 and rows["system", "memory_used"][0] > 0
        assert rows["replay", "stored"] == (3.0, "MiB")
        assert len({row["time"] for row in sample}) == 1                  # one time per round
        # GPU rows exactly where NVML answers (none on a CPU machine, and no warning).
        assert any(source.startswith("gpu") for source, _ in rows) == bool(nvml_gpus())
        idle.kill()
        idle.wait()
        assert "actor-1" not in {row["source"] for row in monitor.sample()}
        monitor.write(monitor.sample())
        with open(tmp_path / "hardware.csv") as f:
            written = list(csv.DictReader(f))
        assert list(written[0]) == COLUMNS and {"learner", "actor-0", "system", "replay"} <= {r["source"] for r in written}
    finally:
        busy.kill()
        idle.kill()


@pytest.mark.skipif(not (torch.cuda.is_available() and nvml_gpus()), reason="needs an NVIDIA GPU and nvidia-ml-py")
def test_a_busy_gpu_shows_its_utilisation_memory_and_power(tmp_path):
    monitor = HardwareMonitor(tmp_path, lambda: {"learner": os.getpid()}, lambda: 0, interval=60)
    block = torch.empty(2**28, dtype=torch.uint8, device="cuda")          # 256 MiB held by this process
    a = torch.randn(8192, 8192, device="cuda")
    end = time.monotonic() + 2.0
    while time.monotonic() < end:                                      # keep the GPU busy while NVML looks
        a = torch.tanh(a @ a)
        torch.cuda.synchronize()
    gpu = {row["metric"]: (row["value"], row["unit"]) for row in monitor.sample() if row["source"] == "gpu0"}
    assert gpu["utilisation"][0] > 10 and gpu["utilisation"][1] == "%"  # over the last period
    assert gpu["memory_used"][0] >= 256 and gpu["power"][0] > 10 and gpu["power"][1] == "W"
    monitor.write(monitor.sample())
    with open(tmp_path / "hardware.csv") as f:
        assert "gpu0" in {row["source"] for row in csv.DictReader(f)}
    del block
