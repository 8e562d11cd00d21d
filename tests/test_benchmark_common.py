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


def test_threaded_configurations_step_the_same_games_in_fewer_processes():
    """throughput.py's THREADED configurations (Sebulba's shape) fold up to 8 actors into one
    process with as many emulator threads, half its games per batch; the others keep the
    command's actors. The games are the same: the ceiling stays comparable."""
    from throughput import actor_shape
    assert actor_shape("on-policy", 16, 8) == ["--worker_count=16", "--envs_per_worker=8"]
    assert actor_shape("on-policy-server-in-actor-threaded", 16, 8) == [
        "--worker_count=2", "--envs_per_worker=64", "--env_threads=8", "--env_batch_size=32", "--env_backend=ale_vector"]
    assert actor_shape("on-policy-server-threaded", 2, 4)[:4] == [
        "--worker_count=1", "--envs_per_worker=8", "--env_threads=2", "--env_batch_size=4"]
    assert actor_shape("on-policy-server-threaded", 6, 2)[:2] == ["--worker_count=3", "--envs_per_worker=4"]


def test_a_threaded_actor_s_busy_share_is_per_core_of_its_threads():
    from throughput import fold_of, per_core
    assert per_core({"actors": 6.4, "learner": 0.9}, fold_of("on-policy-server-threaded", 16)) == {
        "actors": 0.8, "learner": 0.9}
    assert per_core({"actors": 0.5}, fold_of("on-policy", 16)) == {"actors": 0.5}


def test_pipeline_splits_the_cores_between_two_readings():
    """benchmarks/pipeline.py's cores_used: the shares of a core per second of the window, and
    the servers' CPU per request (none without requests)."""
    from pipeline import cores_used
    start = {"time": 100.0, "actors": 10.0, "servers": 1.0, "main": 0.5, "idle": 50.0, "requests": 1_000}
    end = {"time": 110.0, "actors": 26.0, "servers": 2.5, "main": 0.7, "idle": 52.0, "requests": 21_000}
    assert cores_used(start, end) == {"actors": 1.6, "servers": 0.15, "main": 0.02, "idle": 0.2,
                                      "server_us_per_request": 75.0}
    assert cores_used(start, {**end, "requests": 1_000})["server_us_per_request"] is None
