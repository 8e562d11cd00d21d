"""A stop (Ctrl+C, SIGTERM) at any instant, start-up included: exit 0, no traceback, and
either no run folder (stopped before one was made) or one that resumes. Children start
with SIGINT blocked, so a Ctrl+C to the group cannot kill them mid-import."""
import json
import os
import signal
import time

import torch.multiprocessing as mp

from herd_testing import killed_at_exit, only_run, run_cli, start_cli, wait_for

from herd.checkpoint import load_checkpoint
from herd.stopping import sigint_blocked

CARTPOLE = ["--env=CartPole-v1", "--worker_count=1", "--envs_per_worker=4", "--tensorboard=False"]


def catches(pid: int, sig: int) -> bool:
    """Whether the process has a handler for `sig` (its SigCgt mask in /proc)."""
    try:
        status = open(f"/proc/{pid}/status").read()
    except FileNotFoundError:
        return False
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    return bool(caught & (1 << (sig - 1)))


def test_a_stop_during_start_up_exits_0_without_a_traceback_or_a_folder(tmp_path):
    for sig in (signal.SIGINT, signal.SIGTERM):
        results = tmp_path / sig.name
        process = start_cli(["train", *CARTPOLE], results)
        with killed_at_exit(process):
            # SIGTERM is caught once herd's handlers are in: from then on, during the slow
            # imports and the checks, a stop must be clean. Python alone never catches it.
            assert wait_for(lambda: catches(process.pid, signal.SIGTERM), timeout=30, interval=0.005)
            os.killpg(process.pid, sig)
            _, stderr = process.communicate(timeout=60)
        assert process.returncode == 0, stderr
        assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
        assert "stopped before the run started" in stderr
        assert not results.exists() or not any(results.iterdir())


def test_a_stop_after_the_folder_exists_leaves_a_run_that_resumes(tmp_path, monkeypatch):
    """The stop comes while the run folder is being set up (before the training session
    exists): the run saves its step-0 checkpoint, and `herd resume` continues it."""
    import herd.run
    from herd.cli import main

    real_seed = herd.run.seed_everything

    def seed_then_stop(cfg):
        os.kill(os.getpid(), signal.SIGINT)     # a Ctrl+C at this instant
        real_seed(cfg)

    monkeypatch.setattr(herd.run, "seed_everything", seed_then_stop)
    previous = signal.getsignal(signal.SIGINT)
    results = tmp_path / "results"
    assert main(["train", *CARTPOLE, "--basic_verbose=False", f"--results_dir={results}"]) == 0
    assert signal.getsignal(signal.SIGINT) is previous          # the CLI gave the handlers back
    run = only_run(results)
    assert json.loads((run / "summary.json").read_text())["ended"] == "stopped"
    state, _ = load_checkpoint(run)
    assert state["counters"]["env_steps"] == 0
    resumed = run_cli(["resume", str(run), "--environment_max_steps=1000", "--basic_verbose=False"],
                      tmp_path / "resumed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((only_run(tmp_path / "resumed") / "summary.json").read_text())
    assert summary["ended"] == "finished" and summary["environment_steps"] >= 1000


def test_resume_of_a_folder_killed_before_its_first_checkpoint_is_one_line(cli, tmp_path):
    run = tmp_path / "CartPole-v1_1"
    run.mkdir()
    (run / "config.json").write_text("{}")
    result = cli(["resume", str(run)], tmp_path / "results")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "has no checkpoint" in lines[0] and "herd train" in lines[0]


def report_sigint(conn) -> None:
    """In a spawned child: is SIGINT blocked once CPython has started, and did one come?"""
    time.sleep(0.3)
    conn.send((signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []), signal.SIGINT in signal.sigpending()))


def test_children_start_with_sigint_blocked_and_survive_a_ctrl_c_while_starting():
    context = mp.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=report_sigint, args=(sender,))
    with sigint_blocked():
        child.start()
    sender.close()                          # the child's end: EOF if it dies
    os.kill(child.pid, signal.SIGINT)       # while it is still starting Python and importing
    assert receiver.poll(60), child.exitcode
    blocked, pending = receiver.recv()
    child.join(30)
    assert child.exitcode == 0              # not killed, no KeyboardInterrupt
    assert blocked and pending              # CPython kept the inherited mask; the signal waits, unseen
    # The parent's own mask is back as it was: its Ctrl+C still works.
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_actors_of_a_run_have_sigint_blocked(stopped_run):
    """The shared lifecycle run (conftest.py): its first actors and the one started to
    replace a killed actor had SIGINT blocked, and its Ctrl+C to the whole group ended it
    with exit 0 and no traceback."""
    assert stopped_run["sigint_blocked"] == {"first actors": True, "replacement": True}
    assert stopped_run["returncode"] == 0 and "Traceback" not in stopped_run["stderr"], stopped_run["stderr"][-3000:]
