"""benchmarks/common.py's helpers that turn a run's files into a benchmark's figures."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from common import busy_shares  # noqa: E402


def test_busy_shares_average_each_role_s_processes_after_the_warm_up():
    rows = [{"time": t, "source": source, "metric": metric, "value": value, "unit": "%"}
            for t, source, metric, value in [
                (5, "actor-0", "cpu", 10.0), (5, "actor-1", "cpu", 12.0),          # warm-up: left out
                (10, "actor-0", "cpu", 90.0), (10, "actor-1", "cpu", 80.0), (15, "actor-10", "cpu", 85.0),
                (10, "actor-0", "rss", 500.0),                                     # not CPU
                (10, "inference-1", "cpu", 40.0), (15, "inference", "cpu", 60.0),
                (10, "learner", "cpu", 150.0), (10, "system", "cpu", 70.0)]]
    assert busy_shares(rows, after=10) == {"actors": 0.85, "servers": 0.5, "learner": 1.5}
    assert busy_shares(rows[:2], after=10) == {}
