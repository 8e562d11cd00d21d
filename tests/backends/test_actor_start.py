"""Actors start forked from a fork server that imported torch already (each
spawned actor importing torch cost CartPole 1.7 s of start-up)."""
import os
import signal

from herd.backends.start import actor_context, start_fork_server
from herd.stopping import sigint_blocked
from start_probe import report_start


def test_an_actor_process_starts_with_torch_imported_sigint_blocked_and_the_learner_as_parent():
    """Catches actors started by spawn (torch not yet imported when they begin), a fork
    server that lets a terminal's Ctrl+C reach them (SIGINT not blocked), and a parent
    that is the fork server rather than the learner (actors would not notice the learner
    killed with kill -9: herd/actors/actor.py watches multiprocessing.parent_process())."""
    start_fork_server()
    context = actor_context()
    assert context.get_start_method() == "forkserver"
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=report_start, args=(sender,))
    with sigint_blocked():
        child.start()
    sender.close()
    assert receiver.poll(120), child.exitcode
    torch_imported, blocked, parent = receiver.recv()
    child.join(30)
    assert child.exitcode == 0
    assert torch_imported and blocked and parent == os.getpid()
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])     # ours is back as it was


PROBE = """
import sys
import psutil
import herd.cli as cli
parse = cli.parse_herd_args
def probe(argv):
    children = [p.cmdline() for p in psutil.Process().children()]
    servers = sum("forkserver" in " ".join(line) for line in children)
    print("torch" in sys.modules, servers, flush=True)
    return parse(argv)
cli.parse_herd_args = probe
sys.exit(cli.main(sys.argv[1:]))
"""


def test_herd_train_starts_the_fork_server_before_it_imports_torch(tmp_path):
    """The fork server's torch import runs beside the command's own: catches a `herd
    train` that imports torch first and starts the server afterwards (then the actors, and
    the first update, wait for a second torch import after the run folder), and a `herd
    plot` that starts a server it never uses."""
    import subprocess
    import sys
    for argv, expected in ((["train", "--env", "Nope-v0"], "False 1"), (["plot", str(tmp_path)], "False 0")):
        result = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=tmp_path, capture_output=True,
                                text=True, timeout=120)
        assert result.stdout.splitlines()[:1] == [expected], (argv, result.stdout, result.stderr[-1000:])
