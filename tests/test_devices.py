"""herd.devices: host_register's page-locking of shared memory; use_deterministic_algorithms: torch's switch for both of its flags (torch's
and inductor's), without importing torch._inductor (1.8 s of every run's start-up) where
the switch would change nothing."""
import gc
import subprocess
import sys

import pytest
import torch

from herd.devices import host_register
from herd_testing import ROOT

SCRIPT = """
import os, sys, torch
from herd.devices import use_deterministic_algorithms
os.environ.pop("TORCHINDUCTOR_DETERMINISTIC", None)
use_deterministic_algorithms(False)          # what every run that is not --reproducible asks for
assert "torch._inductor" not in sys.modules and not torch.are_deterministic_algorithms_enabled()
use_deterministic_algorithms(True)
import torch._inductor.config as inductor
assert torch.are_deterministic_algorithms_enabled() and inductor.deterministic
use_deterministic_algorithms(True)
assert torch.are_deterministic_algorithms_enabled() and inductor.deterministic
use_deterministic_algorithms(False)          # herd multi: one experiment's choice never leaks into the next
assert not torch.are_deterministic_algorithms_enabled() and not inductor.deterministic
torch.use_deterministic_algorithms(True, warn_only=True)
use_deterministic_algorithms(True)           # warn_only is not what herd asked for: set again
assert torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()
print("ok")
"""


def test_deterministic_switch_sets_both_flags_and_imports_inductor_only_when_needed():
    result = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def test_bf16_is_picked_from_the_instructions_onednn_uses_and_says_why(monkeypatch):
    """An AMD EPYC with AVX512-BF16 but no AMX trains 2.5x faster in bf16 (100 -> 40 ms per
    update); herd looked for AMX alone and trained it in fp32. Catches a choice that
    ignores AVX512-BF16, or that picks bf16 on a CPU that would emulate it."""
    import torch

    from herd import devices
    cpu = torch.device("cpu")
    for flags, fast, named in (({"amx_bf16", "avx512_bf16"}, True, "AMX"), ({"avx512_bf16", "avx512f"}, True,
                                                                             "AVX512-BF16"),
                               ({"avx2", "avx512f"}, False, "neither")):
        monkeypatch.setattr(devices, "cpu_flags", lambda flags=flags: frozenset(flags))
        picked, why = devices.bf16_choice(cpu)
        assert picked is fast and named in why, (flags, why)
        assert devices.fast_bf16(cpu) is fast


def test_capturing_the_update_on_a_cpu_is_refused_in_one_line():
    from herd.config import ConfigError, resolve
    from herd.envs.registry import profile_kind
    cfg = resolve({"env": "CartPole-v1", "device": "cpu", "learner_capture": True}, env_kind=profile_kind)
    try:
        cfg.validate()
    except ConfigError as err:
        assert "--learner_capture=True" in str(err) and "\n" not in str(err)
    else:
        raise AssertionError("--learner_capture=True on a CPU learner was accepted")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_page_locked_area_is_released_with_its_tensor_and_a_refusal_leaves_no_error():
    """Areas made and dropped one after another (each test's channels, a restarted run's
    slots) each register: a dropped one's range is unregistered, so a new mapping at its
    address is not refused as "already mapped". A refused registration (the same range
    twice) is not reported by the next kernel launch as its error."""
    cuda = torch.device("cuda")
    for _ in range(20):
        area = torch.zeros(1 << 20).share_memory_()
        assert host_register(area, cuda)
        torch.ones(4, device=cuda).add_(1)
        del area
        gc.collect()
    twice = torch.zeros(1 << 20).share_memory_()
    assert host_register(twice, cuda) and not host_register(twice, cuda)
    torch.ones(4, device=cuda).add_(1)
    torch.cuda.synchronize()
