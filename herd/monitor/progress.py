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
        remaining = (self.total - steps) / (done / elapsed) if done > 0 and elapsed > 0 else float("nan")
        average_text = f"{average:.1f}" if average == average else "-"
        return (f"steps {steps:,}/{self.total:,} ({100 * steps / self.total:.0f}%) | {fps:,.0f} fps | "
                f"avg score {average_text} | {format_duration(elapsed)} elapsed | {format_duration(remaining)} left")

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
