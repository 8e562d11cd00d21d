"""Peer benchmark: Sample Factory 2.1.1 (APPO) on Atari, measured beside herd.

Sample Factory (SF) needs gymnasium<1.0, numpy<2 and ale-py==0.9.0 while herd uses
gymnasium 1.x, numpy 2 and ale-py 0.12, so SF runs from its own virtual environment
(benchmarks/.peer-venv-sf/, built on first use in about a minute, reused after) in a
subprocess: SF's own Atari example (sf_examples.atari.train_atari: its preprocessing, its
PPO hyperparameters), CPU learner, the same number of workers and envs as herd.

Unit: emulator frames per second, as in herd's throughput benchmark. SF's "Total num frames"
is the number of samples its learner has trained on times env_frameskip (4), because the
Atari example sets summaries_use_frameskip=True; agent steps/s = frames/s / 4.

Modes (MODES below): "serial" is SF's fastest on this 2-core machine and the one herd's
target is set against; "async" and "default" are for reference. Serial mode is also the
most hurt by other processes on the cores (its torch threads wait for each other), so each
result says how many cores SF got and how many other processes took in the window.

  python benchmarks/peer_sample_factory.py --mode serial [--seconds 120 --workers 2 --envs 4]
  python benchmarks/peer_sample_factory.py --mode all     # writes results/peer_sample_factory.json
  from peer_sample_factory import run_peer; run_peer(mode="serial")["frames_per_s"]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
VENV = HERE / ".peer-venv-sf"
# The one set of versions the peer is measured with. torch 2.13.0 is the CPU wheel on
# disk here; any other torch requirement would pull a multi-GB CUDA build from PyPI.
PINS = {"sample-factory": "2.1.1", "torch": "2.13.0", "ale-py": "0.9.0"}
RANGES = ["gymnasium<1.0", "numpy<2"]


class PeerError(RuntimeError):
    """The peer could not be built or run; the message is one line for the user."""


def _venv_python(path: Path) -> Path:
    return path / "bin" / "python"


def _healthy(python: Path) -> bool:
    """True when the venv imports everything the run needs at the pinned versions."""
    if not python.exists():
        return False
    check = ("import importlib.metadata as m, sys; import torch, gymnasium, numpy, ale_py, sample_factory, sf_examples; "
             f"want = {PINS!r}; "
             "bad = [k for k, v in want.items() if m.version(k).split('+')[0] != v]; "  # torch says 2.13.0+cpu
             "bad += ['gymnasium'] if int(gymnasium.__version__.split('.')[0]) >= 1 else []; "
             "bad += ['numpy'] if int(numpy.__version__.split('.')[0]) >= 2 else []; "
             "sys.exit(1 if bad else 0)")
    return subprocess.run([str(python), "-c", check], capture_output=True).returncode == 0


def _pip(python: Path, args: list[str], log: Path) -> None:
    with open(log, "a") as out:
        out.write(f"\n$ pip {' '.join(args)}\n")
        out.flush()
        code = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", *args],
                              stdout=out, stderr=subprocess.STDOUT).returncode
    if code != 0:
        tail = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
        raise PeerError(f"pip install {' '.join(args)} failed (exit {code}; log {log}): {tail[0]}")


def ensure_peer_venv(path: Path = VENV) -> Path:
    """Returns the python of a venv with Sample Factory 2.1.1, building it if missing or broken.
    Raises PeerError with a one-line reason when it cannot be built (e.g. no network)."""
    path = Path(path)
    python = _venv_python(path)
    if _healthy(python):
        return python
    started = time.monotonic()
    if path.exists():  # half-built or stale: start over rather than patch it
        if not (path / "pyvenv.cfg").exists() and any(path.iterdir()):
            raise PeerError(f"{path} exists and is not a virtual environment: remove it or choose another path")
        shutil.rmtree(path)
    # The venv's base is this interpreter's base (3.11, the version of the local torch wheel).
    if subprocess.run([sys.executable, "-m", "venv", str(path)], capture_output=True).returncode != 0:
        raise PeerError(f"could not create a virtual environment at {path} (python -m venv failed)")
    log = path / "build.log"
    # torch first, on its own, so the CPU wheel is what satisfies every later torch requirement;
    # then the rest under a constraints file that holds torch (and the other pins) in place.
    _pip(python, [f"torch=={PINS['torch']}"], log)
    constraints = path / "constraints.txt"
    constraints.write_text("\n".join([*(f"{k}=={v}" for k, v in PINS.items()), *RANGES]) + "\n")
    _pip(python, ["-c", str(constraints), *(f"{k}=={v}" for k, v in PINS.items()), *RANGES], log)
    if not _healthy(python):
        raise PeerError(f"the venv at {path} was built but does not import Sample Factory at the pinned versions (log {log})")
    with open(log, "a") as out:
        out.write(f"\nbuilt in {time.monotonic() - started:.0f} s\n")
    return python


# ale-py 0.9 registers the ALE ids (PongNoFrameskip-v4, ...) with gymnasium only when it is
# imported, and Sample Factory's Atari example never imports it. SF starts its helper
# processes with multiprocessing's "spawn", which re-imports the main script as __mp_main__
# in each child: the import at the top of this file therefore runs in every SF process.
LAUNCHER = '''\
import ale_py  # noqa: F401  (registers the ALE environments in this process)

if __name__ == "__main__":
    import sys
    from sf_examples.atari.train_atari import main
    sys.exit(main())
'''

# The execution flags of each mode; the learning hyperparameters stay those of SF's Atari
# example (sf_examples/atari/atari_params.py: PPO, rollout 128, 4 minibatches of 256, 4 epochs;
# it already sets async_rl=False, batched_sampling=False, worker_num_splits=1).
MODES = {
    # the example as shipped: rollout workers, an inference worker and a learner in separate
    # processes, synchronous PPO (collection waits for the learner)
    "default": [],
    # the same processes, collecting the next batch while the learner trains on the last one.
    # SF pins rollout worker i to core i by default; on 2 cores that leaves the learner and the
    # inference worker fighting a pinned worker, and unpinned it was a little faster here.
    "async": ["--async_rl=True", "--set_workers_cpu_affinity=False"],
    # everything in one process, one event loop: no inter-process traffic, and the learner's
    # torch uses both cores (SF limits it to 1 thread in its own process otherwise). Fastest
    # here. Tried and not faster on this machine: --batched_sampling=True (1,140-1,180 frames/s
    # against 1,180-1,320 without, same hour) and --worker_num_splits=2.
    "serial": ["--serial_mode=True"],
}

FPS_LINE = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\]\[\d+\] Fps is \(10 sec: ([^,]+), "
                      r"60 sec: ([^,]+), 300 sec: ([^)]+)\)\. Total num frames: (\d+)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def peer_environ(site: Path | None) -> dict[str, str]:
    """The peer's process environment: herd's own must not leak into its interpreter; a site
    folder (site_python) is its PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    if site is not None:
        env["PYTHONPATH"] = str(Path(site).resolve())
    return env


def sf_env_name(python: Path, env_id: str, environ: dict[str, str] | None = None) -> str:
    """SF's name for a gymnasium Atari id (PongNoFrameskip-v4 -> atari_pong), from SF's own table."""
    code = ("import sys; from sf_examples.atari.atari_utils import ATARI_ENVS; "
            "print(next((s.name for s in ATARI_ENVS if s.env_id == sys.argv[1]), ''))")
    name = subprocess.run([str(python), "-c", code, env_id], capture_output=True, text=True,
                          env=environ).stdout.strip()
    if not name:
        raise PeerError(f"Sample Factory's Atari example has no environment for {env_id!r}")
    return name


def parse_fps(log_text: str, warmup: float) -> dict:
    """Steady-state emulator frames/s from SF's 5-second reports.

    SF's "Total num frames" is what the learner has trained on, times env_frameskip (the
    Atari example sets summaries_use_frameskip=True), i.e. emulator frames, the unit herd
    reports. It moves in whole training iterations (1024 samples = 4096 frames here), so the
    rate is taken over a long window: from the first report `warmup` seconds after the first
    trained frame to the last report."""
    reports = []
    for line in ANSI.sub("", log_text).splitlines():
        m = FPS_LINE.search(line)
        if m:
            t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(m.group(2)) / 1000
            reports.append((t, int(m.group(6)), m.group(4)))
    trained = [r for r in reports if r[1] > 0]
    if not trained:
        raise PeerError("Sample Factory reported no trained frames: run longer (--seconds) or read its log")
    window = [r for r in reports if r[0] >= trained[0][0] + warmup]
    if len(window) < 2 or window[-1][1] == window[0][1]:
        raise PeerError("Sample Factory's run was too short to measure after the warm-up: run longer (--seconds)")
    (t0, f0, _), (t1, f1, sf60) = window[0], window[-1]
    step = min(b[1] - a[1] for a, b in zip(reports, reports[1:]) if b[1] > a[1])  # one training iteration
    return {"frames_per_s": (f1 - f0) / (t1 - t0), "window": (t0, t1), "window_s": round(t1 - t0, 1),
            "frames_in_window": f1 - f0, "frames_step": step, "resolution_fps": round(step / (t1 - t0)),
            "total_frames": f1, "sf_last_60s_fps": float(sf60) if sf60 != "nan" else None}


def _tree_cpu_seconds(pid: int) -> float:
    total = 0.0
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                times = p.cpu_times()
                total += times.user + times.system
    return total


def _machine_busy_seconds() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def stop_peer(process: subprocess.Popen, grace: float = 30) -> None:
    """SIGINT to SF's main process (its event loop exits cleanly and stops its children, which
    ignore SIGINT themselves); then SIGKILL whatever is left in its session."""
    tree = [process]
    try:
        tree += psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        pass
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the group SF runs in (start_new_session below)
    except ProcessLookupError:
        pass
    for p in tree:  # a child that left the group would still be one of these
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    process.wait()


def _session_left(sid: int, wait: float = 10) -> list[int]:
    """Processes still alive in the session SF was started in: none, once the killed ones
    have died (a killed child is a zombie until init reaps it, so zombies don't count)."""
    deadline = time.monotonic() + wait
    while True:
        left = []
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(p.pid)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def site_python(site: Path) -> Path:
    """This interpreter, for a peer installed with `pip install --target SITE` (a machine that
    reaches no registry, such as the lent GPU box: docs/gpu.md): it runs with PYTHONPATH=SITE,
    its torch is this interpreter's own. Raises PeerError when SITE does not import the peer."""
    site = Path(site).resolve()
    check = ("import gymnasium, numpy, ale_py, sample_factory, sf_examples, sys; "
             "sys.exit(int(gymnasium.__version__.split('.')[0]) >= 1 or int(numpy.__version__.split('.')[0]) >= 2)")
    if subprocess.run([sys.executable, "-c", check], env=peer_environ(site), capture_output=True).returncode != 0:
        raise PeerError(f"{site} does not import Sample Factory with gymnasium<1 and numpy<2")
    return Path(sys.executable)


def run_peer(env_id: str = "PongNoFrameskip-v4", workers: int = 2, envs_per_worker: int = 4, seconds: float = 120,
             mode: str = "serial", extra_args: tuple | list = (), warmup: float = 15, venv: Path = VENV,
             site: Path | None = None, device: str = "cpu") -> dict:
    """Trains Sample Factory's Atari example for `seconds` (wall clock from launch, start-up
    included) and returns its steady-state emulator frames/s with the exact command and log tail.
    The peer comes from `site` when given (site_python), else from the venv; `device` is SF's
    learner device (cpu or gpu)."""
    if mode not in MODES:
        raise PeerError(f"unknown mode {mode!r}: choose one of {', '.join(MODES)}")
    if device not in ("cpu", "gpu"):
        raise PeerError(f"unknown device {device!r}: choose cpu or gpu")
    python = site_python(site) if site is not None else ensure_peer_venv(venv)
    env = peer_environ(site)
    with tempfile.TemporaryDirectory(prefix="herd-peer-sf-") as tmp:
        launcher = Path(tmp) / "sf_atari_launcher.py"
        launcher.write_text(LAUNCHER)
        command = [str(python), str(launcher), f"--env={sf_env_name(python, env_id, env)}", "--experiment=peer",
                   f"--train_dir={tmp}/train_dir", "--restart_behavior=overwrite", f"--device={device}",
                   f"--num_workers={workers}", f"--num_envs_per_worker={envs_per_worker}", *MODES[mode], *extra_args]
        log_path = Path(tmp) / "sf.log"
        with open(log_path, "w") as log:
            # a new session: SF's processes form one group, killed together by stop_peer
            process = subprocess.Popen(command, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
            # (time, CPU seconds of SF's processes, busy CPU seconds of the whole machine): how much
            # of the cores SF got, and how much other users of this shared machine took
            cpu = []
            try:
                deadline = time.time() + seconds
                while time.time() < deadline and process.poll() is None:
                    cpu.append((time.time(), _tree_cpu_seconds(process.pid), _machine_busy_seconds()))
                    time.sleep(1)
                early = process.poll() is not None  # SF ended by itself: a crash or a bad flag
            finally:
                stop_peer(process)
        left = _session_left(process.pid)
        text = ANSI.sub("", log_path.read_text(errors="replace"))
    tail = text.strip().splitlines()[-40:]
    if early:
        error = next((l for l in reversed(tail) if "Error" in l or "error:" in l), tail[-1] if tail else "no output")
        raise PeerError(f"Sample Factory exited early with code {process.returncode}: {error.strip()}")
    result = parse_fps(text, warmup)
    (t0, c0, b0), (t1, c1, b1) = (min(cpu, key=lambda s: abs(s[0] - t)) for t in result.pop("window"))
    if t1 > t0:
        result["sf_cores_used"] = round((c1 - c0) / (t1 - t0), 2)
        result["other_cores_used"] = round(max(0.0, (b1 - b0 - (c1 - c0)) / (t1 - t0)), 2)
    return {"mode": mode, "mode_flags": MODES[mode], "extra_args": list(extra_args), "env_id": env_id, "device": device,
            "workers": workers, "envs_per_worker": envs_per_worker, "seconds": seconds, "warmup": warmup,
            **result, "agent_steps_per_s": result["frames_per_s"] / 4,  # frameskip 4 (env_frameskip)
            "exit_code": process.returncode,  # 2 is SF's INTERRUPTED: stopped by our SIGINT
            "leftover_processes": left,
            "command": " ".join(shlex.quote(c) for c in command), "log_tail": tail}


def main() -> None:
    parser = argparse.ArgumentParser(description="Sample Factory 2.1.1 (APPO) throughput on Atari, for comparison with herd")
    parser.add_argument("--env", default="PongNoFrameskip-v4")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs", type=int, default=4, help="environments per worker")
    parser.add_argument("--seconds", type=float, default=120, help="length of each run, start-up (~20 s) included")
    parser.add_argument("--warmup", type=float, default=15, help="seconds after the first trained frames not measured")
    parser.add_argument("--mode", default="serial", choices=[*MODES, "all"])
    parser.add_argument("--extra", default="", help="extra Sample Factory flags in one string")
    parser.add_argument("--label", default="", help="suffix of the results file name")
    args = parser.parse_args()
    from common import print_table, record  # here, so that importing this module needs no common
    modes = list(MODES) if args.mode == "all" else [args.mode]
    runs = []
    try:
        for mode in modes:
            runs.append(run_peer(args.env, args.workers, args.envs, args.seconds, mode, shlex.split(args.extra), args.warmup))
    except PeerError as e:
        sys.exit(f"peer_sample_factory: {e}")
    print_table(["Sample Factory 2.1.1 mode", "emulator frames/s", "agent steps/s", "window s", "SF's 60 s fps",
                 "cores SF got", "cores others took"],
                [[r["mode"], f"{r['frames_per_s']:,.0f}", f"{r['agent_steps_per_s']:,.0f}", r["window_s"],
                  r["sf_last_60s_fps"], r.get("sf_cores_used"), r.get("other_cores_used")] for r in runs])
    for r in runs:
        if (r.get("other_cores_used") or 0) > 0.25:  # serial mode loses most when another process holds a core
            print(f"warning: other processes took {r['other_cores_used']} cores during the {r['mode']} run: "
                  "its number is too low; rerun on a quiet machine")
    for r in runs:
        print(f"{r['mode']}: {r['command']}")
    name = "peer_sample_factory" + (f"_{args.label}" if args.label else "")
    print(f"recorded {record(name, {'peer': 'sample-factory 2.1.1', 'venv_pins': {**PINS, 'ranges': RANGES}, 'runs': runs})}")


if __name__ == "__main__":
    main()
