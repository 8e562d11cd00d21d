"""herd.train's side of its training process (herd/api_run.py, which says why there is one):
start it, show its output where the caller's goes, pass stop requests on, read its result.

Its stdout goes straight to a terminal (the live progress line), else through this process
(a notebook's cell, pytest's capture, a redirected file). Its stderr always comes through
here, so the last lines are at hand for an error message when the run had no log.txt."""
from __future__ import annotations

import codecs
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import herd
from herd.stopping import STOP_SIGNALS


def relay(pipe, stream, tail: collections.deque | None = None) -> None:
    """Copies the child's output to `stream` as it comes (a progress line's '\\r' too),
    keeping the last lines in `tail`. Reads to the end even when `stream` fails, so the
    child never blocks on a full pipe."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    line = ""
    for chunk in iter(lambda: pipe.read1(65536), b""):
        text = decoder.decode(chunk)
        with contextlib.suppress(OSError, ValueError):      # a closed or broken stream
            stream.write(text)
            stream.flush()
        if tail is not None:
            *done, line = (line + text).split("\n")
            tail.extend(done)
    if tail is not None and line:
        tail.append(line)
    pipe.close()


def is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def passing_stops_to(child: subprocess.Popen):
    """SIGINT and SIGTERM to this process go to the child, which stops cleanly with a
    checkpoint (a notebook's stop button signals the kernel alone; a terminal's Ctrl+C
    reaches both, and a second request changes nothing). Handlers can only be installed
    from the main thread: elsewhere the child stops when it ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def pass_on(signum, frame) -> None:
        with contextlib.suppress(OSError):          # it has just ended
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, pass_on) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def sigint_blocked_here():
    """SIGINT waits (pending, not lost) while the child starts: it must not die of one
    before its own handler is in place, and this process's comes from passing_stops_to."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def child_env() -> dict[str, str]:
    """This process's environment, with the folder this `herd` came from first on
    PYTHONPATH: the child imports the same herd even when the caller put it on sys.path."""
    root = str(Path(herd.__file__).resolve().parent.parent)
    paths = [root, *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def train_in_child(options: dict) -> tuple[dict, list[str], int]:
    """Trains `options` in `python -m herd.api_run` and waits for it: (its result.json, or
    {} when it ended without one; the last lines of its stderr; its exit code)."""
    tail: collections.deque[str] = collections.deque(maxlen=20)
    with tempfile.TemporaryDirectory(prefix="herd-train-") as folder:
        request = {"options": options, "argv": list(sys.argv),
                   "sys_path": [p for p in sys.path if isinstance(p, str)]}
        Path(folder, "options.json").write_text(json.dumps(request, default=str))
        to_terminal = is_terminal(sys.stdout)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                stream.flush()                      # what the caller printed comes first
        with contextlib.ExitStack() as stack:
            with sigint_blocked_here():
                child = subprocess.Popen([sys.executable, "-m", "herd.api_run", folder], stdin=subprocess.DEVNULL,
                                         stdout=None if to_terminal else subprocess.PIPE, stderr=subprocess.PIPE,
                                         env=child_env())
                stack.enter_context(passing_stops_to(child))
            try:
                relays = [threading.Thread(target=relay, args=(child.stderr, sys.stderr, tail), daemon=True)]
                if not to_terminal:
                    relays.append(threading.Thread(target=relay, args=(child.stdout, sys.stdout), daemon=True))
                for thread in relays:
                    thread.start()
                child.wait()
                for thread in relays:       # its output's end; a process it left holding the pipe is not waited for
                    thread.join(timeout=10)
            finally:
                if child.poll() is None:        # this process is failing (an exception here): stop the run
                    child.terminate()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        child.wait(120)
        result_file = Path(folder, "result.json")
        result = json.loads(result_file.read_text()) if result_file.is_file() else {}
    return result, list(tail), child.returncode
