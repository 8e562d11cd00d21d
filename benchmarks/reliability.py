"""Reliability campaign: stop, kill and starve fresh herd runs at random instants, then
check what the run left behind.

Kinds of case (each on a fresh run; counts from the flags):
  sigint, sigterm   a signal to the run at a random instant from 0.2 s to 30 s after
                    launch (start-up and checkpoint writes included: --save_model_period
                    is small); expected exit 0
  kill9             kill -9 of the run at a random instant; kill9_ckpt the same, aimed
                    at a checkpoint write (sent when a .ckpt_*.tmp-* file appears)
  actor_kill        kill -9 of one actor process; the run replaces it, then is stopped
  server_kill       kill -9 of the inference server (--actor_inference=server
                    --device=cpu); the run restarts it (its actors wait), then a SIGINT
                    ends the run: exit 0 and a saved checkpoint
  disk_full         the results folder on a small tmpfs that is filled mid-run
  pong              SIGINT to a short Pong run with a compressed replay

After each case: the exit code; that no process of the run is left after 15 s (its
process group: the run starts in a session of its own); that no shared memory the run
created is left in /dev/shm; that the newest checkpoint loads; that a resume with
nothing to train (--environment_max_steps = the saved steps) saves the same counters
and the same replay contents; and that a resume with more steps continues the counters.
A run stopped before its first checkpoint must have no folder, or one that `herd resume`
refuses with one line.

  hostile           the hostile-input campaign (benchmarks/hostile.py), --hostile times:
                    crafted checkpoints, size and nesting bombs, YAML alias bombs, odd
                    result paths; each one line and exit 2 (or a harmless exit 0) within
                    10 s under a 6 GB address-space cap

  python benchmarks/reliability.py --sigint 2 --sigterm 2 --kill9 2 --kill9_ckpt 2 \\
      --actor_kills 2 --server_kills 2 --disk_full 1 --pong 1 --hostile 1 --seed 0
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import torch

from common import ROOT, herd_command, print_table, record

sys.path.insert(0, str(ROOT))
from herd.checkpoint import CHECKPOINT_DIR, list_checkpoints, load_checkpoint  # noqa: E402

REPLAY = '[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, {"type": "standard", "capacity": 256, "sample_ratio": 0.5}]'
CARTPOLE = ["--env=CartPole-v1", "--worker_count=2", "--envs_per_worker=4", "--save_model_period=20",
            "--environment_max_steps=50000000", "--tensorboard=False", "--basic_verbose=False",
            f"--replay_parameters={REPLAY}"]
PONG = ["--env=PongNoFrameskip-v4", "--worker_count=2", "--envs_per_worker=2", "--batch_size=8", "--r_f_steps=10",
        "--save_model_period=3", "--environment_max_steps=50000000", "--tensorboard=False", "--basic_verbose=False",
        "--use_replay_compression=True", "--caching=False", "--device=cpu", "--actor_inference=local",
        '--replay_parameters=[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, '
        '{"type": "standard", "capacity": 64, "sample_ratio": 0.5}]']
SERVER = ["--actor_inference=server", "--device=cpu"]
TEMP_FILE = re.compile(r"^\.ckpt_\d+\.pt\.tmp-\d+$")
SHM = Path("/dev/shm")
GONE_WITHIN = 15.0
WINDOW = [0.2, 30.0]   # signals and kills land this many seconds after launch (--latest sets the end)


@dataclass
class Outcome:
    kind: str
    detail: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems


class Run:
    """One herd process in its own session, watched: the pids of its group and the shared
    memory files they map, sampled while it runs (a killed parent's children are
    reparented, so the tree alone would lose them)."""

    def __init__(self, args: list[str], results: Path):
        self.results = results
        self.shm_before = set(os.listdir(SHM))
        self.launch = time.monotonic()
        self.process = subprocess.Popen(herd_command([*args, f"--results_dir={results}"]), cwd=ROOT,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                        start_new_session=True)
        self.pids: set[int] = {self.process.pid}
        self.shm_seen: set[str] = set()

    def elapsed(self) -> float:
        return time.monotonic() - self.launch

    def group(self) -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter():
            try:
                if os.getpgid(proc.pid) == self.process.pid and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except (ProcessLookupError, psutil.Error):
                continue
        return found

    def sample(self) -> None:
        for proc in self.group():
            self.pids.add(proc.pid)
            try:
                for line in open(f"/proc/{proc.pid}/maps"):
                    if "/dev/shm/" in line and "(deleted)" not in line:
                        self.shm_seen.add(line.split("/dev/shm/")[1].strip())
            except OSError:
                continue

    def wait_until(self, instant: float, predicate=None, poll: float = 0.05) -> bool:
        """Samples until `instant` s after launch, or until predicate() (True) or the
        process exits (False)."""
        last_sample = 0.0
        while self.elapsed() < instant:
            if self.process.poll() is not None:
                return False
            if predicate is not None and predicate():
                return True
            if time.monotonic() - last_sample > 0.5:
                self.sample()
                last_sample = time.monotonic()
            time.sleep(poll)
        return predicate is None

    def children(self, name: str) -> list[psutil.Process]:
        return [p for p in self.group() if p.pid != self.process.pid and name in " ".join(p.cmdline())]

    def finish(self, timeout: float = 120) -> tuple[int | None, str]:
        try:
            _, err = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            _, err = self.process.communicate()
            return None, err
        return self.process.returncode, err

    def leftovers(self, outcome: Outcome) -> None:
        """No process of the group after GONE_WITHIN s; no shared memory file it used or
        named after one of its pids left behind."""
        deadline = time.monotonic() + GONE_WITHIN
        while self.group() and time.monotonic() < deadline:
            time.sleep(0.2)
        alive = self.group()
        if alive:
            outcome.problems.append(f"processes left after {GONE_WITHIN:g} s: {[p.pid for p in alive]}")
            for proc in alive:
                proc.kill()
        new = set(os.listdir(SHM)) - self.shm_before
        ours = {n for n in new if n in self.shm_seen or any(f"_{pid}_" in n for pid in self.pids)}
        if ours:
            outcome.problems.append(f"shared memory left: {sorted(ours)[:5]}")
        # Other processes of the machine (another user's runs) make such files too.
        outcome.detail["shm_new_unattributed"] = len(new - ours)


def run_folder(results: Path) -> Path | None:
    runs = [p for p in results.iterdir() if p.is_dir()] if results.is_dir() else []
    return max(runs, key=lambda p: p.stat().st_mtime) if runs else None


def herd(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(herd_command(args), cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def same(a, b) -> bool:
    """Deep equality of checkpoint values (numpy arrays, tensors, containers, scalars)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return a == b


def check_saved(run: Path | None, results: Path, outcome: Outcome, more_steps: int) -> None:
    """The newest checkpoint loads, a resume with nothing to train saves the same counters
    and replay, and a resume with more steps continues the counters."""
    if run is None:
        outcome.detail["folder"] = "none"
        return
    if not list_checkpoints(run / CHECKPOINT_DIR):
        check_refused(run, results, outcome)
        return
    try:
        state, path = load_checkpoint(run)
    except Exception as err:  # the campaign reports every failure and goes on
        outcome.problems.append(f"newest checkpoint does not load: {err}")
        return
    counters = state["counters"]
    outcome.detail.update(saved_env_steps=counters["env_steps"], saved_updates=counters["updates"])
    check_replay_round_trip(run, state, results / "same", outcome)
    check_continues(run, counters, results / "more", outcome, more_steps)


def check_refused(run: Path, results: Path, outcome: Outcome) -> None:
    outcome.detail["folder"] = "no checkpoint"
    result = herd(["resume", str(run), f"--results_dir={results / 'refused'}"])
    lines = result.stderr.strip().splitlines()
    if result.returncode != 2 or len(lines) != 1 or "no checkpoint" not in lines[0]:
        outcome.problems.append(f"resume of a folder without checkpoint: exit {result.returncode}, {lines[-3:]}")


def check_replay_round_trip(run: Path, state: dict, results: Path, outcome: Outcome) -> None:
    """Resumes the run in this process exactly as `herd resume` builds its session, trains
    nothing, saves, and compares that checkpoint's counters and replay with the saved
    ones (in-process: the actors a resume subprocess would start have no part in it)."""
    from herd.plan import prepare
    from herd.training import build_session

    plan = prepare({"op_mode": "train_w_load", "load_model_url": str(run), "results_dir": str(results)})
    results.mkdir(parents=True)
    session = build_session(plan, results)
    try:
        resumed, _ = load_checkpoint(session.save())
    finally:
        session.metrics.close()
        session.batches.close()
    for key in ("env_steps", "updates", "rollouts"):
        if resumed["counters"][key] != state["counters"][key]:
            outcome.problems.append(f"{key} {state['counters'][key]} -> {resumed['counters'][key]} with nothing trained")
    if "replay" in state and not same(state["replay"], resumed.get("replay")):
        outcome.problems.append("replay contents differ after a resume that trained nothing")
    outcome.detail["replay_checked"] = "replay" in state


def check_continues(run: Path, counters: dict, results: Path, outcome: Outcome, more_steps: int) -> None:
    target = counters["env_steps"] + more_steps
    started = time.monotonic()
    # One actor: the counters' continuation is the point, and a second one costs seconds to start.
    result = herd(["resume", str(run), f"--environment_max_steps={target}", "--worker_count=1",
                   f"--results_dir={results}"])
    if result.returncode != 0:
        outcome.problems.append(f"resume: exit {result.returncode}: {result.stderr[-300:]}")
        return
    outcome.detail["resume_s"] = round(time.monotonic() - started, 1)
    resumed, _ = load_checkpoint(run_folder(results))
    c = resumed["counters"]
    if c["env_steps"] < target or c["updates"] <= counters["updates"]:
        outcome.problems.append(f"counters did not continue: {counters['env_steps']}/{counters['updates']} -> "
                                f"{c['env_steps']}/{c['updates']}")


def check_stderr(err: str, outcome: Outcome) -> None:
    if "Traceback" in err or "KeyboardInterrupt" in err:
        outcome.problems.append("traceback on stderr: " + err[err.find("Traceback"):][:300])


def writing_a_later_checkpoint(results: Path) -> bool:
    """A checkpoint exists and the next one is being written (its temporary file is
    there): a kill now must leave the existing one loadable."""
    run = run_folder(results)
    folder = run / CHECKPOINT_DIR if run else None
    try:
        names = os.listdir(folder) if folder else []
    except FileNotFoundError:
        return False
    return any(TEMP_FILE.match(n) for n in names) and any(n.endswith(".pt") for n in names)


def signal_case(kind: str, rng: random.Random, work: Path, args=CARTPOLE, more_steps=1000) -> Outcome:
    outcome = Outcome(kind)
    sig = {"sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "pong": signal.SIGINT}.get(kind, signal.SIGKILL)
    instant = rng.uniform(*WINDOW)
    run = Run(["train", *args], work / "run")
    if kind == "kill9_ckpt":
        hit = run.wait_until(60.0, lambda: writing_a_later_checkpoint(run.results), poll=0.002)
        outcome.detail["hit_checkpoint_write"] = hit
    else:
        run.wait_until(instant)
    outcome.detail["instant_s"] = round(run.elapsed(), 2)
    if run.process.poll() is None:
        # Ctrl+C reaches the whole group; SIGTERM and kill -9 the process named.
        os.killpg(run.process.pid, sig) if sig == signal.SIGINT else run.process.send_signal(sig)
    sent = time.monotonic()
    code, err = run.finish()
    outcome.detail["stop_s"] = round(time.monotonic() - sent, 1)
    outcome.detail["exit"] = code
    expected = -signal.SIGKILL if sig == signal.SIGKILL else 0
    if code != expected:
        outcome.problems.append(f"exit code {code}, expected {expected}: {err[-300:]}")
    if sig != signal.SIGKILL:
        check_stderr(err, outcome)
    run.leftovers(outcome)
    check_saved(run_folder(run.results), work, outcome, more_steps)
    return outcome


def child_kill_case(kind: str, rng: random.Random, work: Path) -> Outcome:
    """kill -9 of an actor or of the inference server: each is replaced (a
    dead server is restarted and its actors wait), then a SIGINT ends the run: exit 0,
    saved."""
    outcome = Outcome(kind)
    name = "herd-actor" if kind == "actor_kill" else "herd-inference"
    run = Run(["train", *CARTPOLE, *(SERVER if kind == "server_kill" else [])], work / "run")
    instant = rng.uniform(*WINDOW)
    found = run.wait_until(max(instant, 60.0), lambda: run.elapsed() >= instant and bool(targets(run, kind)))
    outcome.detail["instant_s"] = round(run.elapsed(), 2)
    if not found:
        outcome.problems.append(f"no {name} process to kill")
    else:
        victim = targets(run, kind)[0]
        victim.kill()
        run.wait_until(run.elapsed() + 8.0)
        os.killpg(run.process.pid, signal.SIGINT)
    code, err = run.finish()
    outcome.detail["exit"] = code
    expected = 0
    if kind == "server_kill" and "inference server 0 died" not in err:
        outcome.problems.append("no line saying the inference server died and was restarted")
    if code != expected:
        outcome.problems.append(f"exit code {code}, expected {expected}: {err[-300:]}")
    check_stderr(err, outcome)
    run.leftovers(outcome)
    check_saved(run_folder(run.results), work, outcome, 1000)
    return outcome


def targets(run: Run, kind: str) -> list[psutil.Process]:
    """Actors and the inference server are forked by the run's fork server (herd/backends/start.py),
    itself a child of the run: the fork server is the one whose children are the others,
    and is no target; the server is started first, and only with SERVER."""
    children = [p for p in run.children("multiprocessing") if "resource_tracker" not in " ".join(p.cmdline())]
    parents = {p.ppid() for p in children}
    children = [p for p in children if p.pid not in parents]
    if kind == "server_kill":
        return sorted(children, key=lambda p: p.create_time())[:1] if len(children) >= 3 else []
    return children[-1:] if children else []


def disk_full_case(rng: random.Random, work: Path) -> Outcome:
    """The results folder on a 40 MB tmpfs, filled to the last bytes once a checkpoint
    exists: the next checkpoint write fails. Expected: exit 1, one line naming the kept
    checkpoint, no temporary file, and (space freed again) a resume that continues."""
    outcome = Outcome("disk_full")
    mount = work / "tmpfs"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mount)]).returncode != 0:
        outcome.problems.append("mount -t tmpfs failed: no disk-full case on this machine")
        return outcome
    try:
        run = Run(["train", *CARTPOLE], mount / "results")
        run.wait_until(60.0, lambda: bool(run_folder(run.results)) and bool(
            list_checkpoints(run_folder(run.results) / CHECKPOINT_DIR)))
        run.wait_until(run.elapsed() + rng.uniform(0.0, 3.0))
        filler = mount / "filler"
        with open(filler, "wb", buffering=0) as f:   # unbuffered: writes until ENOSPC, the disk is full
            try:
                while f.write(b"\0" * 2**16):
                    pass
            except OSError:
                pass
        code, err = run.finish()
        outcome.detail["exit"] = code
        lines = [line for line in err.splitlines() if "No space left" in line]
        if code != 1 or not any("is kept" in line for line in lines):
            outcome.problems.append(f"exit {code}, lines {lines[:3]}: {err[-300:]}")
        check_stderr(err, outcome)
        run.leftovers(outcome)
        folder = run_folder(run.results)
        if folder and any(TEMP_FILE.match(p.name) for p in (folder / CHECKPOINT_DIR).iterdir()):
            outcome.problems.append("a temporary checkpoint file was left")
        filler.unlink()
        copy = work / "copy"
        shutil.copytree(folder, copy / folder.name)   # resume beside, off the small disk
        check_saved(copy / folder.name, work, outcome, 1000)
    finally:
        subprocess.run(["umount", "-l", str(mount)])
    return outcome


CASES = {"sigint": signal_case, "sigterm": signal_case, "kill9": signal_case, "kill9_ckpt": signal_case,
         "actor_kill": child_kill_case, "server_kill": child_kill_case,
         "pong": lambda kind, rng, work: signal_case(kind, rng, work, PONG, more_steps=200)}
FLAGS = {"sigint": "sigint", "sigterm": "sigterm", "kill9": "kill9", "kill9_ckpt": "kill9_ckpt",
         "actor_kill": "actor_kills", "server_kill": "server_kills", "disk_full": "disk_full", "pong": "pong"}


def run_case(kind: str, rng: random.Random) -> Outcome:
    with tempfile.TemporaryDirectory(prefix=f"herd-rel-{kind}-") as tmp:
        work = Path(tmp)
        started = time.monotonic()
        try:
            outcome = disk_full_case(rng, work) if kind == "disk_full" else CASES[kind](kind, rng, work)
        except Exception as err:  # a campaign bug or an unexpected state: recorded, the campaign goes on
            outcome = Outcome(kind, problems=[f"{type(err).__name__}: {err}"])
        outcome.detail["seconds"] = round(time.monotonic() - started, 1)
        return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for kind, flag in FLAGS.items():
        parser.add_argument(f"--{flag}", type=int, default=2, help=f"number of {kind} cases")
    parser.add_argument("--hostile", type=int, default=1, help="rounds of the hostile-input campaign")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--earliest", type=float, default=WINDOW[0], help="the earliest instant (s) of a signal or kill")
    parser.add_argument("--latest", type=float, default=WINDOW[1], help="the latest instant (s) of a signal or kill")
    parser.add_argument("--name", default="reliability", help="benchmarks/results/<name>.json")
    args = parser.parse_args()
    WINDOW[:] = [args.earliest, args.latest]
    rng = random.Random(args.seed)
    plan = [kind for kind, flag in FLAGS.items() for _ in range(getattr(args, flag))]
    rng.shuffle(plan)    # kinds interleaved: a slow drift of the machine hits all of them alike
    outcomes = []
    for index, kind in enumerate(plan, start=1):
        outcome = run_case(kind, rng)
        outcomes.append(outcome)
        status = "ok" if outcome.passed else "FAIL: " + "; ".join(outcome.problems)
        print(f"[{index}/{len(plan)}] {kind} {json.dumps(outcome.detail)} {status}", flush=True)
    rows = [[kind, sum(o.kind == kind for o in outcomes), sum(o.kind == kind and o.passed for o in outcomes)]
            for kind in FLAGS if any(o.kind == kind for o in outcomes)]
    hostile = []
    if args.hostile > 0:
        from hostile import campaign
        with tempfile.TemporaryDirectory(prefix="herd-rel-hostile-") as tmp:
            hostile = campaign(Path(tmp), args.hostile, report=lambda line: print(line, flush=True))
        rows.append(["hostile", len(hostile), sum(r.passed for r in hostile)])
    print_table(["kind", "tried", "passed"], rows)
    out = record(args.name, {
        "command": "python benchmarks/reliability.py " + " ".join(sys.argv[1:]), "seed": args.seed,
        "window_s": WINDOW,
        "cpu_model": cpu_model(), "table": {kind: {"tried": t, "passed": p} for kind, t, p in rows},
        "cases": [{"kind": o.kind, "passed": o.passed, "problems": o.problems, **o.detail} for o in outcomes],
        "hostile_cases": [vars(r) for r in hostile]})
    print(f"recorded {out}")


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    main()
