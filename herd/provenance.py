"""What made a run: herd's version and git commit, the command line, the versions of the
libraries that decide its numbers, and the machine's CPU and GPU. Written into
config.json and summary.json, so a result found months later says where it came from."""
from __future__ import annotations

import platform
import shlex
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Sequence

LIBRARIES = ("torch", "gymnasium", "ale-py", "numpy")


def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def git_commit(folder: Path) -> str | None:
    """The commit of the git checkout herd runs from, '+dirty' with uncommitted changes to
    tracked files; None outside a checkout (an installed wheel) or without git."""
    if not (folder / ".git").exists():     # installed into site-packages: some other repository, or none
        return None
    try:
        commit = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10)
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def cpu_model() -> str:
    """'Intel(R) Xeon(R) CPU @ 2.20GHz' from /proc/cpuinfo where there is one."""
    from herd.devices import cpuinfo_field      # torch: imported only when provenance is written
    return cpuinfo_field("model name") or platform.processor() or platform.machine()


def gpus() -> list[str]:
    """The names of the CUDA devices torch sees ([] on a CPU-only machine)."""
    import torch
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]


def provenance(argv: Sequence[str]) -> dict:
    """config.json's and summary.json's "provenance"."""
    import os
    herd_folder = Path(__file__).resolve().parent
    return {
        "herd_version": package_version("herd"),
        "git_commit": git_commit(herd_folder.parent),
        "command_line": shlex.join(argv),
        "python": platform.python_version(),
        **{name.replace("-", "_"): package_version(name) for name in LIBRARIES},
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "gpus": gpus(),
        "hostname": platform.node(),
    }
