"""EpisodeStats, on which every learning threshold rests (summary.json's
max_average_score): the best moving average over full windows only, against a
brute-force computation."""
import math

import numpy as np

from herd.monitor.stats import EpisodeStats


def brute_force_max_average(scores, window: int) -> float:
    full = [np.mean(scores[end - window:end]) for end in range(window, len(scores) + 1)]
    return max(full, default=float("-inf"))


def test_max_average_is_the_best_full_window_and_keeps_its_record():
    """Catches a record taken before the window is full (one lucky first game would pass
    every learning test), the last average reported as the best, or a window of the
    wrong length."""
    rng = np.random.default_rng(0)
    scores = [500.0, 0.0, 0.0] + rng.normal(20, 15, 200).tolist() + [300.0] * 4 + rng.normal(10, 5, 50).tolist()
    stats = EpisodeStats(window=5)
    for count, score in enumerate(scores, start=1):
        stats.add(score)
        expected = brute_force_max_average(scores[:count], 5)
        assert stats.max_average == expected or math.isclose(stats.max_average, expected, rel_tol=1e-12), count
    # The four 300s (games 203-206) with the game before or after them: the best window.
    assert math.isclose(stats.max_average, max(np.mean(scores[202:207]), np.mean(scores[203:208])), rel_tol=1e-12)
    assert stats.average != stats.max_average and stats.max_score == 500.0 and stats.episodes == len(scores)


def test_no_full_window_means_no_record():
    stats = EpisodeStats(window=100)
    for _ in range(99):
        stats.add(500.0)
    assert stats.max_average == float("-inf") and stats.average == 500.0
    stats.add(0.0)
    assert stats.max_average == 495.0


def test_a_resumed_record_continues_as_if_never_stopped():
    """Catches a load that restarts the window or the record (a resumed run would then
    report the best of its second part only)."""
    scores = np.random.default_rng(1).normal(0, 10, 60).tolist()
    whole, first = EpisodeStats(window=7), EpisodeStats(window=7)
    for score in scores:
        whole.add(score)
    for score in scores[:30]:
        first.add(score)
    resumed = EpisodeStats(window=7)
    resumed.load_state_dict(first.state_dict())
    for score in scores[30:]:
        resumed.add(score)
    assert resumed.state_dict() == whole.state_dict()
