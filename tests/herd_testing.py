"""Run herd as a user would: in a subprocess, from the repository root."""
from __future__ import annotations

import subprocess
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
