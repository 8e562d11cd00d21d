"""Run herd as a user would: in a subprocess, from the repository root."""
from __future__ import annotations

import os
import signal
import subprocess
from contextlib import contextmanager
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_cli(args: list[str], results: Path, entry: str = "herd", timeout: float = 240) -> subprocess.CompletedProcess:
    command = [sys.executable, "main.py"] if entry == "main" else [sys.executable, "-m", "herd.cli"]
    return subprocess.run([*command, *args, f"--results_dir={results}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def only_run(results: Path) -> Path:
    runs = [p for p in results.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def start_cli(args: list[str], results: Path) -> subprocess.Popen:
    """herd in its own process group, as a terminal would start it (Ctrl+C reaches the group)."""
    return subprocess.Popen([sys.executable, "-m", "herd.cli", *args, f"--results_dir={results}"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for(predicate, timeout: float, interval: float = 0.2) -> bool:
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def any_alive(processes) -> bool:
    """True while any of the psutil processes still runs (zombies count as gone)."""
    import psutil
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            continue
    return False


@contextmanager
def killed_at_exit(process: subprocess.Popen):
    """A test's process group (start_new_session) never outlives the test, pass or fail."""
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
