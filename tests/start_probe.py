"""A process entry point that imports nothing heavy, so that what it finds in sys.modules
was there before it ran (tests/backends/test_actor_start.py)."""
import multiprocessing
import signal
import sys


def report_start(conn) -> None:
    """Sends (torch already imported, SIGINT blocked, pid of the parent process)."""
    parent = multiprocessing.parent_process()
    conn.send(("torch" in sys.modules, signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []),
               parent.pid if parent is not None else None))
