"""A thread that runs one job at a time for the learner, so that slow work (a weight copy
off the GPU, a checkpoint written to disk) leaves the learner's thread free, and a job
that fails is never mistaken for one still busy."""
from __future__ import annotations

import threading
from typing import Callable


def failure_line(err: BaseException) -> str:
    text = " ".join(str(err).split())[:200]
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


class OneInFlight:
    """`offer(job)` hands the job to the thread unless one is still running (then False:
    the caller skips it, or `wait`s). A job that raises ends the thread and is kept: the
    next offer, wait or `check` raises failed(error) in the caller's thread, so a dead
    thread is never mistaken for a busy one (every later offer skipped, for ever)."""

    def __init__(self, name: str, failed: Callable[[BaseException], Exception]):
        self.failed = failed
        self.wake = threading.Condition()
        self.job: Callable[[], object] | None = None
        self.stopping = False
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self.run, name=name, daemon=True)
        self.thread.start()

    def check(self) -> None:
        if self.failure is not None:
            raise self.failed(self.failure)

    def offer(self, job: Callable[[], object]) -> bool:
        with self.wake:
            self.check()
            if self.job is not None:
                return False
            self.job = job
            self.wake.notify()
            return True

    def wait(self) -> None:
        """Returns once no job is in flight; raises as check() if the last one failed."""
        with self.wake:
            while self.job is not None and self.failure is None:
                self.wake.wait()
            self.check()

    def run(self) -> None:
        while True:
            with self.wake:
                while self.job is None and not self.stopping:
                    self.wake.wait()
                if self.job is None:
                    return
                job = self.job
            try:
                job()
            except BaseException as err:      # anything: the caller must hear of it, not a silent thread
                with self.wake:
                    self.failure = err
                    self.wake.notify_all()
                return
            with self.wake:
                self.job = None
                self.wake.notify_all()

    def close(self) -> None:
        """Waits for the job in flight, then stops the thread. Raises nothing: it runs while a
        run ends (a finally), where the failure of a last job is reported otherwise."""
        with self.wake:
            self.stopping = True
            self.wake.notify_all()
        self.thread.join()
