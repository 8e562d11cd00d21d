"""Episode statistics: the moving-average score and the records the summary reports."""
from __future__ import annotations

from collections import deque


class EpisodeStats:
    def __init__(self, window: int):
        self.scores: deque[float] = deque(maxlen=window)
        self.episodes = 0
        self.max_score = float("-inf")
        self.max_average = float("-inf")

    def add(self, score: float) -> None:
        self.scores.append(score)
        self.episodes += 1
        self.max_score = max(self.max_score, score)
        if len(self.scores) == self.scores.maxlen:
            # Only a full window counts as a record of the moving average.
            self.max_average = max(self.max_average, self.average)

    @property
    def average(self) -> float:
        return sum(self.scores) / len(self.scores) if self.scores else float("nan")

    def state_dict(self) -> dict:
        return {"scores": list(self.scores), "episodes": self.episodes,
                "max_score": self.max_score, "max_average": self.max_average}

    def load_state_dict(self, state: dict) -> None:
        self.scores.clear()
        self.scores.extend(float(s) for s in state["scores"])
        self.episodes = int(state["episodes"])
        self.max_score = float(state["max_score"])
        self.max_average = float(state["max_average"])
