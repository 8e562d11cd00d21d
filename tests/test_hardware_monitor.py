"""Hardware figures: per-process CPU and memory of the run's processes, the machine, the
replay memory; no GPU rows (and no warning) where there is no NVML."""
import csv
import os
import subprocess
import sys
import time

from herd.monitor.hardware import COLUMNS, HardwareMonitor


def test_a_busy_process_shows_its_cpu_and_an_ended_one_disappears(tmp_path):
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        processes = {"learner": os.getpid(), "actor-0": busy.pid, "actor-1": idle.pid}
        monitor = HardwareMonitor(tmp_path, lambda: dict(processes), lambda: 3 * 2**20, interval=60)
        monitor.sample()                                   # the baseline reading of each process
        time.sleep(1.0)
        rows = {row["source"]: row for row in monitor.sample()}
        assert rows["actor-0"]["cpu_percent"] > 40 and rows["actor-1"]["cpu_percent"] < 20
        assert rows["learner"]["rss_mib"] > 10 and rows["actor-0"]["pid"] == busy.pid
        assert 0 <= rows["system"]["cpu_percent"] <= 100 and rows["system"]["rss_mib"] > 0
        assert rows["replay"]["value"] == 3.0
        assert not any(source.startswith("gpu") for source in rows)      # no NVML here
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
