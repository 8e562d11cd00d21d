"""Peer benchmark: Sample Factory 2.1.1 on CartPole-v1, the time to a 100-episode average of 475.

SF's own gymnasium example (sf_examples.train_gym_env) with the flags its docstring gives
for CartPole-v1, on the CPU, with 2 rollout workers (herd's quick start runs 2 actors),
from SF's own venv (peer_sample_factory.py builds it). SF prints the mean raw return of
the last --stats_avg (100) episodes in its report every 5 s; the time is that of the first
report at or above 475, counted from SF's launch, so its resolution is one report (5 s).
`python benchmarks/cartpole.py --peer` runs this after herd's seeds, in the same command.

  from peer_sf_cartpole import run_peer_cartpole; run_peer_cartpole(seed=1)["seconds"]
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path

from peer_sample_factory import ANSI, VENV, PeerError, ensure_peer_venv, stop_peer

TARGET = 475.0
# The example's CartPole-v1 flags (sf_examples/train_gym_env.py docstring), CPU, 2 workers.
EXAMPLE_FLAGS = ["--algo=APPO", "--use_rnn=False", "--num_envs_per_worker=20", "--policy_workers_per_policy=2",
                 "--recurrence=1", "--with_vtrace=False", "--batch_size=512", "--reward_scale=0.1",
                 "--save_every_sec=10", "--experiment_summaries_interval=10", "--env=CartPole-v1"]
REWARD_LINE = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\]\[\d+\] Avg episode reward: "
                         r"\[\(0, '([-\d.]+)'\)\]")


def reward_reports(log_text: str) -> list[tuple[float, float]]:
    """(unix time, 100-episode mean return) of each of SF's reports, oldest first."""
    reports = []
    for line in ANSI.sub("", log_text).splitlines():
        match = REWARD_LINE.search(line)
        if match:
            when = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(match.group(2)) / 1000
            reports.append((when, float(match.group(3))))
    return reports


def run_peer_cartpole(seed: int = 1, limit_s: float = 300, workers: int = 2, venv: Path = VENV) -> dict:
    """Trains SF's CartPole example until its 100-episode mean reaches TARGET or `limit_s`
    seconds pass; returns the seconds from launch (None if not reached) and the best mean."""
    python = ensure_peer_venv(venv)
    with tempfile.TemporaryDirectory(prefix="herd-peer-sf-cartpole-") as tmp:
        command = [str(python), "-m", "sf_examples.train_gym_env", *EXAMPLE_FLAGS, f"--seed={seed}",
                   f"--num_workers={workers}", "--device=cpu", "--experiment=peer_cartpole", f"--train_dir={tmp}",
                   "--restart_behavior=overwrite"]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        log_path = Path(tmp) / "sf.log"
        launch = time.time()
        with open(log_path, "w") as log:
            process = subprocess.Popen(command, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
            seconds = None
            try:
                while time.time() < launch + limit_s and process.poll() is None:
                    time.sleep(1)
                    reached = [t for t, mean in reward_reports(log_path.read_text(errors="replace")) if mean >= TARGET]
                    if reached:
                        seconds = reached[0] - launch
                        break
                early = process.poll() is not None
            finally:
                stop_peer(process)
        text = ANSI.sub("", log_path.read_text(errors="replace"))
    tail = text.strip().splitlines()[-30:]
    if early and seconds is None:
        error = next((l for l in reversed(tail) if "Error" in l or "error:" in l), tail[-1] if tail else "no output")
        raise PeerError(f"Sample Factory's CartPole run exited early with code {process.returncode}: {error.strip()}")
    means = [mean for _, mean in reward_reports(text)]
    return {"seed": seed, "seconds": round(seconds, 1) if seconds is not None else None, "limit_s": limit_s,
            "best_avg100": max(means) if means else None, "reports": len(means),
            "command": " ".join(shlex.quote(c) for c in command), "log_tail": tail}
