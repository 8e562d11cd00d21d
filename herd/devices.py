"""Which device the learner uses and what that hardware does fast: the few decisions
that depend on the machine rather than on the run's options."""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import weakref

import torch


def learner_device(name: str) -> torch.device:
    """--device auto|cpu|cuda -> the learner's device (auto: cuda when a GPU is visible)."""
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


@functools.lru_cache(maxsize=None)
def cpuinfo_field(name: str) -> str:
    """The first `name` line's value in /proc/cpuinfo ("" where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(name):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_flags() -> frozenset:
    return frozenset(cpuinfo_field("flags").split())


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("AMD EPYC"), or "" where there is none."""
    return cpuinfo_field("model name")


def bf16_choice(device: torch.device) -> tuple[bool, str]:
    """Whether bfloat16 autocast runs the learner faster here, and why: a GPU that supports
    bfloat16; on x86 CPUs, the instructions oneDNN uses for bf16 matrix products: AMX
    (Sapphire Rapids and later) or AVX512-BF16 (e.g. AMD EPYC Zen 4), where the learner
    step measured about 2-2.5x faster in bf16 (benchmarks/learner_step.py: 2-core Xeon with
    AMX 79 -> 32 ms at batch 8 x 20; an EPYC with AVX512-BF16, 100 -> 40 ms). Without
    them oneDNN emulates bf16, and it is slower than fp32."""
    if device.type == "cuda":
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return True, "the GPU supports bfloat16"
        return False, "the GPU has no bfloat16 support"
    flags = cpu_flags()
    isa = [name for flag, name in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16")) if flag in flags]
    if not isa:
        return False, "the CPU has neither AMX nor AVX512-BF16 (oneDNN would emulate bf16)"
    if not torch.backends.mkldnn.is_available():
        return False, f"the CPU has {'/'.join(isa)} but this torch has no oneDNN"
    return True, f"the CPU has {' and '.join(isa)}, which oneDNN uses for bf16"


def fast_bf16(device: torch.device) -> bool:
    """bfloat16 matrix units present (bf16_choice, which also says why)."""
    return bf16_choice(device)[0]


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


def host_register(tensor: torch.Tensor, device: torch.device) -> bool:
    """Page-locks a shared-memory tensor in place for `device`, until the tensor object is
    collected; False where CUDA refuses (a CPU device reads it as it is).

    The registration must end with the mapping: CUDA keeps a range registered after its
    memory is unmapped, and a later mapping at the same address is then refused ("already
    mapped") or, worse, copied from the old pages. A refusal is also cleared from CUDA's
    last error, which the next kernel launch would otherwise report as its own."""
    if device.type != "cuda":
        return True
    ptr, nbytes = tensor.data_ptr(), tensor.numel() * tensor.element_size()
    try:
        cudart = torch.cuda.cudart()
        code = cudart.cudaHostRegister(ptr, nbytes, 0)
        error = int(getattr(code, "value", code))
    except Exception:   # an old driver, an unsupported mapping: the staging path works everywhere
        return False
    if error != 0:
        clear_cuda_error()
        return False
    weakref.finalize(tensor, host_unregister, ptr)
    return True


def host_unregister(ptr: int) -> None:
    """Ends host_register's registration of the range at ptr (a refusal cleared as there)."""
    code = torch.cuda.cudart().cudaHostUnregister(ptr)
    if int(getattr(code, "value", code)) != 0:
        clear_cuda_error()


def clear_cuda_error() -> None:
    """Resets this thread's last CUDA runtime error (cudaGetLastError of the runtime library
    this process loaded; torch exposes none)."""
    with contextlib.suppress(OSError):        # no /proc, no library: nothing more to clear
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart.so" in line}
        for path in paths:
            ctypes.CDLL(path).cudaGetLastError()
