"""The live console progress line."""
from __future__ import annotations

import sys
import time


def format_duration(seconds: float) -> str:
    if seconds != seconds or seconds == float("inf"):
        return "--:--"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_score(value: float | None, digits: int = 2) -> str:
    """A score for the console and the log: "-" when there is none yet (the average of no
    finished episode is NaN, which reads like a bug)."""
    if value is None or value != value:
        return "-"
    return f"{value:.{digits}f}"


class ProgressLine:
    """Redraws one line on a terminal; prints a line every `interval` seconds otherwise."""

    def __init__(self, total_steps: int, enabled: bool, stream=None, interval: float = 1.0):
        self.total = total_steps
        self.enabled = enabled
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.interval = interval if self.tty else max(interval, 10.0)
        self.last = 0.0

    def render(self, steps: int, fps: float, average: float, elapsed: float, start_steps: int = 0) -> str:
        done = steps - start_steps
        # Actors finish their rollouts after the budget is reached, so steps can pass the
        # total: nothing is left then, not a negative time.
        left = max(self.total - steps, 0)
        if left == 0:
            remaining = 0.0
        else:
            remaining = left / (done / elapsed) if done > 0 and elapsed > 0 else float("nan")
        return (f"steps {steps:,}/{self.total:,} ({100 * steps / self.total:.0f}%) | {fps:,.0f} fps | "
                f"avg score {format_score(average, 1)} | {format_duration(elapsed)} elapsed | "
                f"{format_duration(remaining)} left")

    def update(self, steps: int, fps: float, average: float, elapsed: float, start_steps: int = 0,
               force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self.last < self.interval):
            return
        self.last = now
        line = self.render(steps, fps, average, elapsed, start_steps)
        if self.tty:
            self.stream.write("\r" + line.ljust(100))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()
