"""Run herd as a user would: in a subprocess, from the repository root; and, for refusals
that write nothing, the same CLI in this process (cli_in_process_runner, behind the `cli`
fixture of tests/conftest.py). One home for the helpers tests share: run folders, metric
rows, log text, environments without a display."""
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


# A Ray node of the test clusters: loopback only, a small object store.
RAY_NODE = dict(node_ip_address="127.0.0.1", object_store_memory=200 * 2**20)


RAY_WORKER_CPUS = 2     # each worker node of the integration tests' shared cluster


@contextmanager
def loopback_ray_cluster(worker_cpus: int, **head_options):
    """A real multi-node Ray cluster on this machine: a head with 0 CPUs (no actor fits
    there) and two worker nodes of `worker_cpus`, all on 127.0.0.1, with a fresh token that
    the herd processes inherit. Yields ray.cluster_utils.Cluster. (Ray is imported here,
    not at the top: most tests never need it.)"""
    import secrets

    from ray.cluster_utils import Cluster

    from herd.backends.ray_cluster import restore_auth, use_token_auth
    saved = {name: os.environ.get(name) for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    use_token_auth(secrets.token_hex(32))
    made = Cluster(initialize_head=True, head_node_args=dict(num_cpus=0, include_dashboard=False, **RAY_NODE,
                                                             **head_options))
    try:
        for _ in range(2):
            made.add_node(num_cpus=worker_cpus, **RAY_NODE)
        made.wait_for_nodes()
        yield made
    finally:
        made.shutdown()
        restore_auth(saved)


# A small CartPole run with a uniform replay beside the queue (the lifecycle run, tests of
# resuming): 2 actors x 4 envs x 8 steps, batch 8.
SMALL_REPLAY = '--replay_parameters=[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, ' \
               '{"type": "standard", "capacity": 64, "sample_ratio": 0.5}]'
SMALL_RUN = ["--env=CartPole-v1", "--worker_count=2", "--envs_per_worker=4", "--batch_size=8", "--r_f_steps=8",
             "--training_fill_in_factor=0.1", "--seed=5", SMALL_REPLAY]


def newest_update(results: Path) -> int:
    """The update count of the newest checkpoint of the one run folder under `results` (0: none yet)."""
    from herd.checkpoint import list_checkpoints
    runs = [p for p in results.iterdir() if p.is_dir()] if results.exists() else []
    found = list_checkpoints(runs[0] / "checkpoints") if runs else []
    return int(found[0].stem.split("_")[1]) if found else 0


def read_rows(path: Path) -> list[dict]:
    """A metric file's rows (csv with a header) as dicts of strings; [] while it does not exist."""
    import csv
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# The families IMPALA runs on, where every algorithm that replaces its loss must run too
# (tests/integration/test_impact_runs.py, test_appo_runs.py): test id -> extra arguments.
FAMILIES = {
    "lstm": ["--env=CartPole-v1", "--use_lstm=True", "--lstm_size=16"],
    "continuous": ["--env=Pendulum-v1"],
    "minatar": ["--env=MinAtar/Breakout-v1", "--envs_per_worker=4", "--batch_size=4"],
    "two-learners": ["--env=CartPole-v1", "--learner_count=2", "--envs_per_worker=4", "--batch_size=8"],
    "ray": ["--env=CartPole-v1", "--multiprocessing_backend=ray", "--envs_per_worker=4"],
}


def short_family_run(algorithm: str, args: list[str], results: Path) -> tuple[dict, dict]:
    """(summary.json, the checkpoint's state) of a 1,500-step run of `algorithm` with
    `args` (a FAMILIES entry), which must finish and have trained."""
    import json
    from herd.checkpoint import load_checkpoint
    result = run_cli(["train", f"--algorithm={algorithm}", "--worker_count=2", "--environment_max_steps=1500",
                      "--seed=1", "--tensorboard=False", *args], results, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((only_run(results) / "summary.json").read_text())
    assert summary["algorithm"] == algorithm and summary["training_steps"] > 0, summary
    return summary, load_checkpoint(only_run(results))[0]


def capped_child(body: str, address_space: int, deadline_s: float) -> str:
    """`body` (Python) in a fresh interpreter under an address-space cap of `address_space`
    bytes: its stdout, or what went wrong (its exit and stderr, or no answer in time)."""
    import textwrap
    code = (f"import resource\nresource.setrlimit(resource.RLIMIT_AS, ({address_space}, {address_space}))\n"
            + textwrap.dedent(body))
    try:
        result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                                timeout=deadline_s)
    except subprocess.TimeoutExpired:
        return f"no answer within {deadline_s} s"
    return result.stdout.strip() if result.returncode == 0 else f"exit {result.returncode}: {result.stderr[-500:]}"


def kind_of(env_id: str) -> str:
    """The env kind config.resolve asks for, without probing the environment."""
    return "atari" if env_id.endswith("NoFrameskip-v4") else "vector"


def no_display_env(**extra) -> dict:
    """This process's environment without a display (nor MuJoCo's GL choice), plus `extra`:
    a child sees what a headless server would give it."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL")}
    return {**env, **extra}


def log_text(results: Path) -> str:
    """log.txt of the one run folder under `results` so far ("" before there is one)."""
    logs = list(results.glob("*/log.txt"))
    return logs[0].read_text() if logs else ""


def actor_pids(process) -> set[int]:
    """The herd process's live child processes other than multiprocessing's resource
    tracker, counting those its actors' fork server (herd/backends/start.py) forked as its own."""
    import psutil
    pids = set()
    for child in psutil.Process(process.pid).children():
        try:
            command = " ".join(child.cmdline())
        except psutil.NoSuchProcess:        # gone, or a zombie (a finished `git rev-parse` not yet reaped)
            continue
        if "multiprocessing.forkserver" in command:
            pids.update(grandchild.pid for grandchild in child.children())
        elif "resource_tracker" not in command:
            pids.add(child.pid)
    return pids


def sigint_blocked_in(pid: int) -> bool:
    """Whether SIGINT is in the process's blocked mask (SigBlk in /proc)."""
    with open(f"/proc/{pid}/status") as f:
        blocked = int(next(line for line in f if line.startswith("SigBlk:")).split()[1], 16)
    return bool(blocked & (1 << (signal.SIGINT - 1)))


def copy_of_run(run: Path, folder: Path) -> Path:
    """A copy of the run folder `run` inside `folder` (made), under the run's own name."""
    import shutil
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copytree(run, folder / run.name))


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


def peaked(kwargs: dict, action: int) -> torch.nn.Module:
    """A model built from `kwargs` (herd.models.build_model) that picks `action` with
    probability ~1 (policy bias +-50)."""
    from herd.models import build_model
    model = build_model(**kwargs)
    with torch.no_grad():
        model.heads.policy.weight.zero_()
        model.heads.policy.bias.fill_(-50.0)
        model.heads.policy.bias[action] = 50.0
    return model


def fixed_policy_state(model_state: dict, w) -> dict:
    """The MLP's weights set to act by sign(w . obs), through both tanh layers."""
    state = {k: torch.zeros_like(v) for k, v in model_state.items()}
    state["torso.0.weight"][0] = torch.tensor(w)
    state["torso.2.weight"][0, 0] = 1.0
    state["heads.policy.weight"][0, 0], state["heads.policy.weight"][1, 0] = -SHARP, SHARP
    return state


def fixed_action(w, obs) -> int:
    return int(float(np.dot(np.asarray(w, np.float32), np.asarray(obs, np.float32))) > 0)


def fixed_policy_run(small_cartpole_run: Path, folder: Path, w) -> Path:
    """A copy of a real run folder whose checkpoint holds the fixed policy `w` instead of learned weights."""
    from herd.checkpoint import load_checkpoint, save_checkpoint
    run = copy_of_run(small_cartpole_run, folder)
    state, path = load_checkpoint(run)
    state["model"] = fixed_policy_state(state["model"], w)
    save_checkpoint({k: v for k, v in state.items() if k not in ("format_version", "checksum")}, run,
                    state["counters"]["updates"])
    return run


# ---------------------------------------------------------------------------------------
# The CLI in-process: for refusals (bad input, bad checkpoints), which check only "one line
# on stderr, exit code 2, nothing written". Starting a subprocess costs ~1.4 s of torch
# import per case; a handful of cases per kind still run as real processes.

class CliResult:
    """What run_cli's CompletedProcess gives the refusal tests: returncode, stdout, stderr."""

    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


class _Records:
    """A logging handler that keeps records at WARNING and above: with no handler of its
    own, a fresh process prints those on stderr (logging's last resort); under pytest the
    root logger has pytest's capture handler instead, which prints nothing."""

    def __init__(self):
        import logging

        class Handler(logging.Handler):
            def emit(inner, record):  # noqa: N805
                self.lines.append(record.getMessage())
        self.lines: list[str] = []
        self.handler = Handler(level=logging.WARNING)


def _python_default_warning_filters() -> None:
    """The filters of a fresh `python` (no -W): DeprecationWarning & co. ignored, the rest
    shown. pytest shows them all, and would only record, not print, what a user sees."""
    import warnings
    warnings.resetwarnings()
    warnings.simplefilter("default")
    for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
        warnings.filterwarnings("ignore", category=category)


def _process_state() -> dict:
    import logging
    from herd import stopping
    herd_log = logging.getLogger("herd")
    return {"signals": {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)},
            "stop": stopping.STOP.is_set(), "cwd": os.getcwd(), "environ": dict(os.environ),
            "herd_log": (list(herd_log.handlers), herd_log.level, herd_log.propagate, herd_log.disabled),
            "deterministic": torch.are_deterministic_algorithms_enabled(), "threads": torch.get_num_threads()}


def _restore_process_state(saved: dict) -> None:
    import logging
    from herd import stopping
    for sig, handler in saved["signals"].items():
        signal.signal(sig, handler)
    stopping.STOP.set() if saved["stop"] else stopping.STOP.clear()
    os.chdir(saved["cwd"])
    os.environ.clear()
    os.environ.update(saved["environ"])
    herd_log = logging.getLogger("herd")
    for handler in herd_log.handlers:
        if handler not in saved["herd_log"][0]:
            handler.close()
    herd_log.handlers[:], herd_log.level, herd_log.propagate, herd_log.disabled = \
        list(saved["herd_log"][0]), *saved["herd_log"][1:]
    from herd.devices import use_deterministic_algorithms
    use_deterministic_algorithms(saved["deterministic"])
    torch.set_num_threads(saved["threads"])


def cli_in_process_runner(capfd):
    """run(args, results, entry="herd"|"main") -> CliResult, running herd.cli.main (`herd
    ...`) or herd.cli.seed_main (`python main.py ...`, which only calls it) in this process,
    from the repository root as run_cli does. stderr is everything written to file
    descriptor 2 (C libraries included), plus the warnings and WARNING log records a fresh
    process would have printed there. Returns (run, restore); restore() puts back what a
    run may have changed in this process (see _process_state)."""
    import logging
    import warnings

    saved = _process_state()

    def run(args: list[str], results: Path, entry: str = "herd") -> CliResult:
        from herd.cli import main, seed_main
        capfd.readouterr()                                   # earlier output is not this run's
        herd_log = logging.getLogger("herd")
        herd_log.handlers[:], herd_log.propagate = [], True  # as in a fresh process
        records = _Records()
        logging.getLogger().addHandler(records.handler)
        os.chdir(ROOT)
        try:
            with warnings.catch_warnings(record=True) as caught:
                _python_default_warning_filters()
                try:
                    code = (seed_main if entry == "main" else main)([*args, f"--results_dir={results}"])
                except SystemExit as exit:                   # argparse's --help and the like
                    code = exit.code if isinstance(exit.code, int) else 1
        finally:
            logging.getLogger().removeHandler(records.handler)
            os.chdir(saved["cwd"])
        out, err = capfd.readouterr()
        extra = [f"{w.category.__name__}: {w.message}" for w in caught] + records.lines
        return CliResult(code, out, err + "".join(line + "\n" for line in extra))

    return run, lambda: _restore_process_state(saved)
