"""The console progress line and score formatting: no negative times, no "nan" scores."""
import math

from herd.monitor.progress import ProgressLine, format_score


class Log:
    def isatty(self):
        return False


def render(steps, total=2000, start_steps=0, elapsed=10.0, average=20.0):
    return ProgressLine(total, enabled=True, stream=Log()).render(steps, 200.0, average, elapsed, start_steps)


def test_no_negative_time_left_once_steps_pass_the_budget():
    assert render(1000).endswith("| 0:10 left")                # half done in 10 s: 10 s to go
    for steps in (2000, 2050, 9000):                          # the last rollouts overshoot the budget
        line = render(steps)
        assert line.endswith("| 0:00 left"), line
        assert "-" not in line.split("|")[-1], line
    # A run resumed at or past its budget has made no steps yet, and has nothing left either.
    assert render(2050, start_steps=2050).endswith("| 0:00 left")
    assert render(0).endswith("| --:-- left")                 # no rate yet: unknown, not zero


def test_format_score_says_dash_when_there_is_no_score_yet():
    assert format_score(float("nan")) == "-"
    assert format_score(None) == "-"
    assert format_score(21.456) == "21.46"
    assert format_score(-3.0, 1) == "-3.0"
    assert format_score(0.0) == "0.00"
    assert "nan" not in render(100, average=math.nan) and "avg score - |" in render(100, average=math.nan)
