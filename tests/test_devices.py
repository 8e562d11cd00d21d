"""herd.devices.use_deterministic_algorithms: torch's switch for both of its flags (torch's
and inductor's), without importing torch._inductor (1.8 s of every run's start-up) where
the switch would change nothing."""
import subprocess
import sys

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
