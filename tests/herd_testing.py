"""Run herd as a user would: in a subprocess, from the repository root."""
from __future__ import annotations

import os
import signal
import subprocess
from contextlib import contextmanager
import sys
from pathlib import Path

import numpy as np
import torch

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


def corrupt_first_weight(checkpoint: Path, count: int = 256) -> None:
    """Inverts `count` bytes of the first model tensor's data inside a checkpoint, in place:
    the zip's structure (headers, offsets, directory) is unchanged, only its CRC no longer
    matches, which torch does not check. torch writes each storage uncompressed as a zip
    member `<archive>/data/<key>`; the one holding the weight is found by its bytes."""
    import struct
    import zipfile

    import torch

    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    weight = next(iter(state["model"].values())).contiguous().numpy().tobytes()
    assert len(weight) >= count, len(weight)
    with zipfile.ZipFile(checkpoint) as archive:
        found = [info for info in archive.infolist() if "/data/" in info.filename and archive.read(info) == weight]
    assert len(found) == 1 and found[0].compress_type == zipfile.ZIP_STORED, found
    with open(checkpoint, "r+b") as f:
        f.seek(found[0].header_offset)
        header = f.read(30)                                 # the local file header's fixed part
        name_length, extra_length = struct.unpack("<HH", header[26:30])
        start = found[0].header_offset + 30 + name_length + extra_length
        f.seek(start)
        data = f.read(count)
        f.seek(start)
        f.write(bytes(b ^ 0xFF for b in data))


# Fixed CartPole policies: push the cart the way the pole leans (w . obs > 0 -> right),
# obs = (position, velocity, angle, angular velocity). The first balances every game to
# the 500-step cap; the second, the angle alone, loses after 25 to 52 steps: games of
# different lengths, so a score list that matches is no coincidence.
BALANCER = (0.0, 0.0, 1.0, 0.3)
ANGLE_ONLY = (0.0, 0.0, 1.0, 0.0)
SHARP = 1e6   # logits +-SHARP * tanh(tanh(w . obs)): the sampled action is the sign, with certainty


def fixed_policy_state(model_state: dict, w) -> dict:
    """The MLP's weights set to act by sign(w . obs), through both tanh layers."""
    state = {k: torch.zeros_like(v) for k, v in model_state.items()}
    state["torso.0.weight"][0] = torch.tensor(w)
    state["torso.2.weight"][0, 0] = 1.0
    state["heads.policy.weight"][0, 0], state["heads.policy.weight"][1, 0] = -SHARP, SHARP
    return state


def fixed_action(w, obs) -> int:
    return int(float(np.dot(np.asarray(w, np.float32), np.asarray(obs, np.float32))) > 0)
