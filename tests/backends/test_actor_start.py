"""Actors start forked from a fork server that imported torch already (issue 29: each
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
