"""Which device the learner uses and what that hardware does fast: the few decisions
that depend on the machine rather than on the run's options."""
from __future__ import annotations

import functools
import os
import sys

import torch


def learner_device(name: str) -> torch.device:
    """--device auto|cpu|cuda -> the learner's device (auto: cuda when a GPU is visible)."""
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


@functools.lru_cache(maxsize=None)
def cpu_flags() -> frozenset:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def fast_bf16(device: torch.device) -> bool:
    """bfloat16 matrix units present: AMX on x86 CPUs (Sapphire Rapids and later), or a
    GPU that supports bfloat16. There bf16 autocast runs the learner about 2x faster
    (benchmarks/learner_step.py); elsewhere it would be emulated, and slower."""
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return "amx_bf16" in cpu_flags()


def use_deterministic_algorithms(mode: bool) -> None:
    """torch.use_deterministic_algorithms(mode), skipped where it would change nothing:
    torch 2.13's version imports torch._inductor to set inductor's own flag as well, which
    took 1.8 s of every run's start-up on a 2-core CPU. Skipped only when both flags already
    say `mode`: torch's (without warn_only), and inductor's, or, inductor not imported yet,
    the default it will read (TORCHINDUCTOR_DETERMINISTIC) when it is."""
    inductor = sys.modules.get("torch._inductor.config")
    inductor_mode = (inductor.deterministic if inductor is not None
                     else os.environ.get("TORCHINDUCTOR_DETERMINISTIC") == "1")
    if (torch.are_deterministic_algorithms_enabled() == mode and inductor_mode == mode
            and not torch.is_deterministic_algorithms_warn_only_enabled()):
        return
    torch.use_deterministic_algorithms(mode)
