"""Stop requests shared by every backend: SIGINT/SIGTERM set an event that the backend's
loop checks, so the run stops between steps and saves instead of dying mid-write."""
from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger("herd")


def install_stop_signals(stop: threading.Event):
    """SIGINT/SIGTERM ask the run to stop after the current step; returns a restore function."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handler(signum, frame):
        if not stop.is_set():
            log.info("received %s: stopping and saving", signal.Signals(signum).name)
        stop.set()

    for sig in previous:
        signal.signal(sig, handler)
    return lambda: [signal.signal(sig, h) for sig, h in previous.items()]
