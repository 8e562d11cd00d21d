"""The hostile-input campaign of benchmarks/reliability.py: what a careless user
or an attacker hands herd. Crafted checkpoints (a redirected config, dtype and shape bombs,
version claims, reference bombs), oversized and deeply nested options, YAML alias bombs,
unwritable and odd result paths, and placement asked for by a file or a neighbour
(experiments files naming where runs connect, write or report, a planted Ray cluster
file, two learners with the LAN in their environment: their listening sockets watched
with `ss`).

Each case runs the real CLI in a process of its own under a 6 GB address-space cap
(RLIMIT_AS) and must end within BUDGET_S seconds of CPU time (its own and its children's:
on a shared machine the wall clock measures the neighbours; both are recorded, with the
load average) in one line on stderr and exit 2, or,
where the file asks for something herd does not do, in a harmless exit 0 that did not do
it (checked: no folder where the file said, no connection to the address it named)."""
from __future__ import annotations

import io
import json
import os
import re
import resource
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil
import torch

from common import ROOT, herd_command

sys.path.insert(0, str(ROOT))
from herd.checkpoint import checksum, load_checkpoint, to_storable  # noqa: E402

CAP = 6 * 2**30
BUDGET_S = 10.0
HARD_TIMEOUT_S = 120.0


@dataclass
class Hostile:
    name: str
    args: list[str]                           # herd's arguments
    words: str = ""                           # in the one error line (a refusal)
    harmless: Callable[[], str | None] | None = None   # an exit-0 case: its check, None when harmless
    cwd: Path | None = None
    env: dict = field(default_factory=dict)   # added to the environment herd runs in
    after: Callable[[], str | None] | None = None      # any case: a further check, None when it held
    watch_listeners: bool = False             # record every TCP address herd's processes listen on (ss)
    budget_s: float | None = None             # CPU seconds allowed, when not BUDGET_S (a real run)


@dataclass
class Result:
    name: str
    passed: bool
    seconds: float                            # wall clock
    cpu_seconds: float                        # user + system, the process and its children
    exit: int | None
    problems: list = field(default_factory=list)


def capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))
    os.setsid()


def run(case: Hostile, results: Path) -> Result:
    args = [*case.args] if case.cwd is not None else [*case.args, f"--results_dir={results}"]
    started, before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    # WANDB_MODE=offline: a run that took a W&B project from a file keeps its uploads in RUN/wandb.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline", **case.env}
    listeners: set[str] = set()
    process = subprocess.Popen(herd_command(args), cwd=case.cwd or ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, preexec_fn=capped, env=env)
    watcher = threading.Thread(target=watch_listeners, args=(process, listeners), daemon=True)
    if case.watch_listeners:
        watcher.start()
    try:
        err = process.communicate(timeout=HARD_TIMEOUT_S)[1]
        code = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        code, err = None, process.communicate()[1]
    if case.watch_listeners:
        watcher.join()
    seconds = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    problems = []
    lines = err.strip().splitlines()
    if case.harmless is None:
        if code != 2 or len(lines) != 1 or case.words not in lines[0]:
            problems.append(f"exit {code}, {len(lines)} lines: {err[-300:]!r}")
        elif results.exists() and any(results.iterdir()):
            problems.append("a run folder was made")
    else:
        problem = case.harmless() if code == 0 else f"exit {code}: {err[-300:]!r}"
        if problem:
            problems.append(problem)
    if case.after is not None and (problem := case.after()):
        problems.append(problem)
    if case.watch_listeners and not listeners:
        problems.append("no listening socket was seen: the check of their addresses checked nothing")
    if listeners - {"127.0.0.1", "::1"}:
        problems.append(f"listened beyond loopback: {sorted(listeners)}")
    budget = case.budget_s or BUDGET_S
    if cpu > budget or code is None:
        problems.append(f"took {cpu:.1f} s of CPU, {seconds:.1f} s of wall clock (budget {budget:g} s)")
    return Result(case.name, not problems, round(seconds, 1), round(cpu, 1), code, problems)


def watch_listeners(process: subprocess.Popen, addresses: set[str]) -> None:
    """Until `process` ends: the local addresses of the TCP sockets it and its descendants
    listen on, read with `ss -ltnp` every 0.2 s."""
    while process.poll() is None:
        try:
            pids = {process.pid, *(child.pid for child in psutil.Process(process.pid).children(recursive=True))}
        except psutil.NoSuchProcess:
            return
        table = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout
        for line in table.splitlines():
            if {int(pid) for pid in re.findall(r"pid=(\d+)", line)} & pids:
                addresses.add(line.split()[3].rsplit(":", 1)[0].strip("[]"))
        time.sleep(0.2)


# -- crafting --------------------------------------------------------------------------
def save_raw(storable: dict, path: Path, digest: str | None = None) -> Path:
    """torch.save of a storable state with the checksum herd would compute (or `digest`)."""
    storable = {k: v for k, v in storable.items() if k != "checksum"}
    storable["checksum"] = digest or checksum(storable)
    torch.save(storable, path)
    return path


def variant(source: Path, path: Path, change: Callable[[dict], None], digest: str | None = None) -> Path:
    """A copy of the checkpoint `source`, changed by change(storable state), re-checksummed."""
    state, _ = load_checkpoint(source)
    storable = to_storable(state)
    change(storable)
    return save_raw(storable, path, digest)


def deep_pickle_checkpoint(path: Path, depth: int) -> Path:
    """A checkpoint whose entry "deep" is lists nested `depth` deep, pickled by hand."""
    def text(value: str) -> bytes:
        return b"X" + struct.pack("<I", len(value)) + value.encode()
    body = (b"\x80\x02}(" + text("format_version") + b"K\x02" + text("checksum") + text("0" * 64) + text("deep")
            + b"]" * depth + b"a" * (depth - 1) + b"u.")
    template = io.BytesIO()
    torch.save({}, template)
    with zipfile.ZipFile(io.BytesIO(template.getvalue())) as source, zipfile.ZipFile(path, "w") as target:
        for info in source.infolist():
            target.writestr(info.filename, body if info.filename.endswith("data.pkl") else source.read(info))
    return path


def set_tag(storable: dict, tag: str, tensor=None) -> None:
    storable["replay"] = {"bomb": {"__ndarray__": torch.zeros(16, dtype=torch.uint8) if tensor is None else tensor,
                                   "dtype": tag}}


def shared_bomb(storable: dict) -> None:
    bomb = [1]
    for _ in range(60):                       # 2**60 paths, within the depth bound: the sharing is refused
        bomb = [bomb, bomb]
    storable["stats"] = bomb


def checkpoint_cases(source: Path, work: Path, head: socket.socket) -> list[Hostile]:
    elsewhere = work / "elsewhere"
    address = "127.0.0.1:%d" % head.getsockname()[1]

    def redirect(s: dict) -> None:
        s["config"].update(results_dir=str(elsewhere), multiprocessing_backend="ray", ray_address=address,
                           wandb_project="someone-elses-project")

    def nothing_redirected() -> str | None:
        if connected(head):
            return f"connected to {address}, which the checkpoint named"
        if any((run / "wandb").exists() or json.loads((run / "config.json").read_text()).get("wandb_project")
               for run in (work / "results").glob("*") if (run / "config.json").exists()):
            return "reported to the W&B project the checkpoint named"
        return f"wrote into {elsewhere}, which the checkpoint named" if elsewhere.exists() else None

    c = work / "checkpoints"
    c.mkdir()
    redirected = variant(source, c / "redirected.pt", redirect)
    steps = str(load_checkpoint(source)[0]["counters"]["env_steps"])
    made = {
        "dtype tag U100000000": variant(source, c / "u.pt", lambda s: set_tag(s, "U100000000")),
        "dtype tag of another item size": variant(source, c / "f.pt", lambda s: set_tag(s, "float64")),
        "tagged view of a larger buffer": variant(source, c / "v.pt", lambda s: set_tag(
            s, "int64", torch.arange(1000)[10:20])),
        "obs_shape 2**40 in env_spec": variant(source, c / "o.pt", lambda s: s["env_spec"].update(
            obs_shape=[2**40, 2**40])),
        "model_signature bomb": variant(source, c / "m.pt", lambda s: s.update(model_signature={"w": 10**12})),
        "format version 3": variant(source, c / "v3.pt", lambda s: s.update(format_version=3)),
        "format version tensor(2)": variant(source, c / "vt.pt", lambda s: s.update(format_version=torch.tensor(2))),
        "format version True": variant(source, c / "vb.pt", lambda s: s.update(format_version=True)),
        "config: network of 40 GB": variant(source, c / "h.pt", lambda s: s["config"].update(
            hidden_sizes=[100000, 100000])),
        "config: replay_parameters 10,000 deep": variant(source, c / "r.pt", lambda s: s["config"].update(
            replay_parameters="[" * 10000 + "]" * 10000)),
        "config: option as a nested list": variant(source, c / "n.pt", lambda s: s["config"].update(lr=[[0.1]])),
        "2**60 shared references": variant(source, c / "s.pt", shared_bomb, digest="0" * 64),
        "nesting 100,000 deep": deep_pickle_checkpoint(c / "d.pt", 100_000),
        "counters holding __dict__": variant(source, c / "cd.pt", lambda s: s["counters"].update(
            __dict__={"env_steps": 0})),
        "optimizer as a list": variant(source, c / "ol.pt", lambda s: s.update(optimizer=[1, 2])),
        "a deflated record (zip bomb)": deflated(load_checkpoint(source)[1], c / "z.pt"),
    }
    words = {"dtype tag U100000000": "'U100000000'", "dtype tag of another item size": "whose stored data is",
             "tagged view of a larger buffer": "herd does not write that", "obs_shape 2**40 in env_spec": "made for",
             "model_signature bomb": "model_signature", "format version 3": "format version",
             "format version tensor(2)": "format version", "format version True": "format version",
             "config: network of 40 GB": "GiB of parameters", "config: replay_parameters 10,000 deep": "deep",
             "config: option as a nested list": "--lr must be", "2**60 shared references": "the same container twice",
             "nesting 100,000 deep": "more than 64 deep", "counters holding __dict__": "counter named __dict__",
             "optimizer as a list": "optimizer state", "a deflated record (zip bomb)": "compressed record"}
    cases = [Hostile(f"checkpoint: {name}", ["test", str(path), "--render=False", "--test_episode_count=1"],
                     words[name]) for name, path in made.items()]
    cases += [Hostile("checkpoint: redirected config (test)", ["test", str(redirected), "--render=False",
                                                                "--test_episode_count=1"],
                      harmless=nothing_redirected, cwd=work),
              Hostile("checkpoint: no rng (resume)", ["resume", str(variant(source, c / "nr.pt", lambda s: s.pop(
                  "rng"))), "--worker_count=1"], "has no rng"),
              Hostile("checkpoint: redirected config (resume)", ["resume", str(redirected), "--worker_count=1",
                                                                  f"--environment_max_steps={steps}"],
                      harmless=nothing_redirected, cwd=work)]
    return cases


def deflated(source: Path, target: Path) -> Path:
    """The checkpoint `source` with every zip record deflated (a zip bomb's shape)."""
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
    return target


def connected(head: socket.socket) -> bool:
    """Whether anything connected to the listening socket `head` since the last look."""
    try:
        head.accept()[0].close()
        return True
    except BlockingIOError:
        return False


def outside_interface() -> str | None:
    """An interface beside loopback with an IPv4 address, or None."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and not a.address.startswith("127.") for a in addresses):
            return name
    return None


def placement_cases(work: Path, head: socket.socket) -> list[Hostile]:
    """Where a run connects, writes or reports, asked for by a file or a neighbour."""
    files, elsewhere = work / "placement", work / "placement-elsewhere"
    files.mkdir()
    address = "127.0.0.1:%d" % head.getsockname()[1]

    def experiments(name: str, options: dict) -> str:
        path = files / f"{name}.json"
        path.write_text(json.dumps([{"env": "CartPole-v1", **options}]))
        return str(path)

    def no_connection() -> str | None:
        return f"connected to {address}, which a file named" if connected(head) else None

    rule = "only from the command line"
    cases = [
        Hostile("experiments file: Ray backend and a Ray head", ["multi", experiments("ray", dict(
            multiprocessing_backend="ray", ray_address=address))], rule, after=no_connection),
        Hostile("experiments file: results_dir elsewhere", ["multi", experiments("results", dict(
            results_dir=str(elsewhere)))], rule, after=lambda: f"wrote {elsewhere}" if elsewhere.exists() else None),
        Hostile("experiments file: wandb_project", ["multi", experiments("wandb", dict(
            wandb_project="someone-elses-project"))], rule),
    ]
    planted = files / "raytmp" / "ray" / "ray_current_cluster"     # what another local user leaves in /tmp/ray
    planted.parent.mkdir(parents=True)
    planted.parent.chmod(0o777)
    planted.write_text(address)
    if os.geteuid() == 0:
        os.chown(planted, 65534, 65534)       # nobody's
        how = "owned by another user"
    else:
        planted.chmod(0o666)
        how = "writable by every user"
    cases.append(Hostile(f"--ray_address=auto, cluster file {how}", [
        "train", "--env=CartPole-v1", "--multiprocessing_backend=ray", "--ray_address=auto"],
        "someone else's Ray cluster", env={"RAY_TMPDIR": str(planted.parent.parent), "RAY_ADDRESS": ""},
        after=no_connection))
    outside = outside_interface()
    if outside is not None and shutil.which("ss"):
        # The user's environment names the LAN for torchrun; a group on one machine stays on loopback.
        cases.append(Hostile(f"two learners, GLOO/NCCL_SOCKET_IFNAME={outside} in the environment", [
            "train", "--env=CartPole-v1", "--learner_count=2", "--worker_count=2", "--environment_max_steps=4000",
            "--tensorboard=False", "--seed=1"], harmless=lambda: None, watch_listeners=True, budget_s=120.0,
            env={"GLOO_SOCKET_IFNAME": outside, "NCCL_SOCKET_IFNAME": outside}))
    return cases


def option_cases(work: Path) -> list[Hostile]:
    cartpole, pong = "--env=CartPole-v1", "--env=PongNoFrameskip-v4"
    capacity = '[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, ' \
               '{"type": "standard", "capacity": 1000000000000, "sample_ratio": 0.5}]'
    return [
        Hostile("option: --hidden_sizes=100000,100000", ["train", cartpole, "--hidden_sizes=100000,100000"],
                "GiB of parameters"),
        Hostile("option: --lstm_size=1000000", ["train", cartpole, "--use_lstm=True", "--lstm_size=1000000"],
                "GiB of parameters"),
        Hostile("option: --frame_scale_resolution=50000,50000", ["train", pong, "--frame_scale_resolution=50000,50000"],
                "makes observations"),
        Hostile("option: --frames_stacked=100000", ["train", pong, "--frames_stacked=100000"], "makes observations"),
        Hostile("option: replay capacity 10**12", ["train", cartpole, f"--replay_parameters={capacity}"],
                "of memory is available"),
        Hostile("option: --cache_output_buffer_size=10**9", ["train", cartpole, "--caching=True",
                                                             "--cache_output_buffer_size=1000000000"],
                "prefetched batches"),
        Hostile("option: --caching_threads=100000", ["train", cartpole, "--caching_threads=100000"], "more threads"),
        Hostile("option: --learner_timeout=1e300", ["train", cartpole, "--learner_timeout=1e300"], "longer than a week"),
        Hostile("option: --replay_parameters 10,000 deep", ["train", cartpole, "--replay_parameters="
                                                            + "[" * 10000 + "]" * 10000], "deep"),
        Hostile("option: --replay_parameters of 100 KB", ["train", cartpole, "--replay_parameters=" + "[" * 100_000],
                "characters long"),
    ]


def file_cases(work: Path) -> list[Hostile]:
    files = work / "files"
    files.mkdir()
    alias = files / "alias_bomb.yaml"
    alias.write_text("- lr: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"  g{b}: &{b} [*{a}, *{a}, *{a}, *{a}, *{a}, *{a}, *{a}, *{a}, *{a}]\n" for a, b in zip("abcdefgh", "bcdefghi")))
    deep_yaml = files / "deep.yaml"
    deep_yaml.write_text("[" * 50_000 + "]" * 50_000)
    deep_json = files / "deep.json"
    deep_json.write_text("[" * 500_000 + "]" * 500_000)
    big = files / "big.json"
    big.write_text(json.dumps([{"env": "CartPole-v1"}] * 200_000))
    nul = files / "nul.json"
    nul.write_text(json.dumps([{"env": "CartPole-v1", "results_dir": "runs\0here"}]))
    return [
        Hostile("yaml: alias bomb (9**9 leaves)", ["multi", str(alias)], "--lr must be a single value"),
        Hostile("yaml: nested 50,000 deep", ["multi", str(deep_yaml)], "too deep"),
        Hostile("json: nested 500,000 deep", ["multi", str(deep_json)], "deep"),
        Hostile("json: 3.6 MB experiments file", ["multi", str(big)], "bytes an experiments file may be"),
        Hostile("experiments file: results_dir with a NUL byte", ["multi", str(nul)], "only from the command line",
                cwd=files),
    ]


def run_folder_cases(work: Path) -> list[Hostile]:
    """Run folders someone else wrote, for herd watch and herd plot (no --results_dir: cwd)."""
    folders = work / "run_folders"
    episodes = "episode,score,length,env_step,update,wall_time,unix_time\n"
    made = {"invalid JSON": ('{"env": ', episodes + "1,1,10,10,0,1,0\n", "cannot read"),
            "a list for config.json": ("[1, 2]", episodes, "holds a JSON list"),
            "a NUL byte in episodes.csv": ('{"env": "CartPole-v1"}', episodes + "1,1\0,10,10,0,1,0\n", "NUL byte"),
            "a 200 KB field": ('{"env": "CartPole-v1"}', episodes + "1," + "9" * 200_000 + ",10,10,0,1,0\n",
                               "field")}
    cases = []
    for index, (name, (config, table, words)) in enumerate(made.items()):
        run = folders / f"run{index}"
        run.mkdir(parents=True)
        (run / "config.json").write_text(config)
        (run / "episodes.csv").write_text(table)
        cases += [Hostile(f"run folder: {name} (watch)", ["watch", str(run), "--once"], words, cwd=work),
                  Hostile(f"run folder: {name} (plot)", ["plot", str(run)], words, cwd=work)]
    for index, env in enumerate(["[bold]x[/] [/]", "\x1b]0;title\x07", "$\\x$"]):
        run = folders / f"named{index}"
        run.mkdir(parents=True)
        (run / "config.json").write_text(json.dumps({"env": env}))
        (run / "episodes.csv").write_text(episodes + "1,1,10,10,0,1,0\n2,2,10,20,1,2,0\n")
        plots = run / "plots"
        cases += [Hostile(f"run folder: env {env!r} (watch)", ["watch", str(run), "--once"], cwd=work,
                          harmless=lambda: None),
                  Hostile(f"run folder: env {env!r} (plot)", ["plot", str(run)], cwd=work,
                          harmless=lambda plots=plots: None if (plots / "score_vs_steps.png").is_file()
                          else "no figure")]
    return cases


def path_cases(work: Path) -> list[Hostile]:
    cartpole = "--env=CartPole-v1"
    a_file = work / "a_file"
    a_file.write_text("")
    read_only = work / "read_only"
    read_only.mkdir()
    cases = [Hostile("results_dir in /proc", ["train", cartpole, "--results_dir=/proc/herd-results"],
                     "kernel file system", cwd=work),
             Hostile("results_dir in /sys", ["train", cartpole, "--results_dir=/sys/herd-results"],
                     "kernel file system", cwd=work),
             Hostile("results_dir under a file", ["train", cartpole, f"--results_dir={a_file}/runs"], "which is a file",
                     cwd=work),
             Hostile("results_dir of 5,000 characters", ["train", cartpole, "--results_dir=" + "x" * 5000],
                     "cannot be used", cwd=work)]
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(read_only)],
                      capture_output=True).returncode == 0:
        cases.append(Hostile("results_dir on a read-only file system", ["train", cartpole,
                                                                        f"--results_dir={read_only}/runs"],
                             "is not writable", cwd=work))
    return cases


def unmount(work: Path) -> None:
    subprocess.run(["umount", "-l", str(work / "read_only")], capture_output=True)


def small_run(work: Path) -> Path:
    """A real checkpoint to craft from: a few seconds of CartPole."""
    results = work / "source"
    done = subprocess.run(herd_command(["train", "--env=CartPole-v1", "--environment_max_steps=2000",
                                        "--worker_count=1", "--seed=1", "--tensorboard=False",
                                        f"--results_dir={results}"]), cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"the source run failed: {done.stderr[-500:]}")
    return next(p for p in results.iterdir() if p.is_dir())


def campaign(work: Path, repeats: int = 1, report=print) -> list[Result]:
    """Every hostile case `repeats` times; report(line) after each."""
    head = socket.socket()
    head.bind(("127.0.0.1", 0))
    head.listen(8)
    head.setblocking(False)
    try:
        cases = [*checkpoint_cases(small_run(work), work, head), *option_cases(work), *file_cases(work),
                 *run_folder_cases(work), *path_cases(work), *placement_cases(work, head)]
        results = []
        for repeat in range(repeats):
            for index, case in enumerate(cases):
                result = run(case, work / f"results-{repeat}-{index}")
                results.append(result)
                status = "ok" if result.passed else "FAIL: " + "; ".join(result.problems)
                report(f"[hostile {len(results)}/{len(cases) * repeats}] {case.name}: exit {result.exit}, "
                       f"{result.cpu_seconds} s CPU, {result.seconds} s wall, load {os.getloadavg()[0]:.1f} {status}")
        return results
    finally:
        head.close()
        unmount(work)
