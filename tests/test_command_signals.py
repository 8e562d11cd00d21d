"""Every herd command ends within a second of SIGINT or SIGTERM. `herd watch` of a run that
died without a summary (kill -9) waits forever by design: only a signal ends it, so it is
the command to try. It runs in a real terminal (a pty), as a user runs it, so its live view
is drawn and the test knows when it is inside its loop."""
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest

from herd_testing import ROOT

SECOND = 1.0


def read_until(fd: int, words: bytes, timeout: float) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while words not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                seen += os.read(fd, 65536)
            except OSError:            # the child closed its end
                break
    return seen


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_watch_of_a_dead_run_ends_within_a_second_of_a_signal(tmp_path, signum):
    run = tmp_path / "dead_run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"env": "CartPole-v1", "environment_max_steps": 1000}))
    main, child = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "herd.cli", "watch", str(run), "--interval=0.5"], cwd=ROOT,
                               stdin=child, stdout=child, stderr=child, start_new_session=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
    os.close(child)
    try:
        shown = read_until(main, b"environment steps", timeout=60)
        assert b"environment steps" in shown, shown[-500:]
        time.sleep(1.0)                      # inside its refresh loop, some sleeps later
        process.send_signal(signum)
        sent = time.monotonic()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"herd watch still runs 10 s after {signum.name}")
        took = time.monotonic() - sent
        assert took < SECOND, f"herd watch took {took:.2f} s to end after {signum.name}"
        assert b"Traceback" not in read_until(main, b"\0", timeout=0.5)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        os.close(main)
