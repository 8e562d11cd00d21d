"""Stop requests (Ctrl+C, SIGTERM) from the first instant of the CLI to its exit.

A leaf module (it imports nothing heavy): the CLI installs `install()` before it imports
torch, so a stop during start-up never surfaces as a KeyboardInterrupt traceback from
whatever import or setup step was running, nor as a silent exit 143. The handler only
sets `STOP`; each phase checks it where stopping is safe: before the run folder exists
(nothing written, exit 0), or in the training loop (checkpoint saved, exit 0).

Child processes are started with SIGINT *blocked* (`sigint_blocked`): a terminal's Ctrl+C
reaches the whole process group, and a spawned child that is still importing torch would
otherwise die with a KeyboardInterrupt traceback before it could ignore the signal. A
blocked signal mask survives fork and exec, and CPython does not unblock it at start-up,
so the child never sees SIGINT (the parent alone decides how to stop; it ends its
children). Blocking rather than ignoring keeps the parent lossless: a SIGINT that arrives
while the child is being started stays pending (or goes to another thread) and reaches
the parent's handler, where a temporarily ignored one would be dropped. CPython's own
resource tracker is started the same way."""
from __future__ import annotations

import logging
import signal
import threading
from contextlib import contextmanager

log = logging.getLogger("herd")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP = threading.Event()


def request_stop(signum, frame) -> None:
    if not STOP.is_set():
        log.info("received %s: stopping and saving", signal.Signals(signum).name)
    STOP.set()


class Stopped(KeyboardInterrupt):
    """Raised by `interrupt` in the main thread: the command stops where it is."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def interrupt(signum, frame) -> None:
    """The handler of commands that never read STOP (watch, plot, export): they hold nothing
    a stop must save, so the signal ends them at once, wherever they wait (a sleep, a read)."""
    STOP.set()
    raise Stopped(signum)


def install(handler=request_stop):
    """SIGINT/SIGTERM call `handler` from now on (request_stop: they set STOP, for commands
    whose loops read it; interrupt: they raise Stopped); returns a function that restores
    the previous handlers (so an in-process caller, e.g. a test, gets its own Ctrl+C back)."""
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    return restore


def requested() -> bool:
    return STOP.is_set()


@contextmanager
def sigint_blocked():
    """Processes started inside start with SIGINT blocked (see the module's docstring)."""
    # The first spawn starts CPython's resource tracker, which blocks SIGINT around its own
    # start and then *unblocks* it, undoing ours for the child that follows: start it first.
    from multiprocessing import resource_tracker
    resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
