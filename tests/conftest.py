"""Fixtures every test folder may use, found by pytest by name (never imported)."""
import os
import signal
import socket

import pytest

from herd_testing import cli_in_process_runner


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """The CPU learner's cached timings (herd/learner/autotune.py) go to a folder of this
    session, inherited by every run it starts: never the user's ~/.cache, and no test's
    learner choice depends on what an earlier session measured."""
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if before is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = before


@pytest.fixture
def head():
    """A listening socket on loopback standing in for a Ray head that a crafted file (a
    checkpoint, a cluster file) names: a run that connects where the file says is seen
    by accept()."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()


@pytest.fixture
def cli(capfd):
    """The CLI in this process (cli_in_process_runner); afterwards the CLI must have given
    back the signal handlers and cleared its stop event (herd/cli.py promises that to
    in-process callers), and everything else a run may touch is put back as it was."""
    run, restore = cli_in_process_runner(capfd)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield run
    from herd import stopping
    leaked = {sig: signal.getsignal(sig) for sig in before if signal.getsignal(sig) is not before[sig]}
    stopped = stopping.STOP.is_set()
    restore()
    assert not leaked, f"the CLI left its signal handlers installed: {leaked}"
    assert not stopped, "the CLI left its stop event set"
