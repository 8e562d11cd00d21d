"""Which device the learner uses and what that hardware does fast: the few decisions
that depend on the machine rather than on the run's options."""
from __future__ import annotations

import functools

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
