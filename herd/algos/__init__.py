"""The algorithm registry, keyed by --algorithm. A new algorithm is a builder module here
(see base.py) and one entry below; backends and environments don't change."""
from __future__ import annotations

from herd.algos.apex import APEX
from herd.algos.appo import APPO
from herd.algos.base import Algorithm, trajectory_layout
from herd.algos.impact import IMPACT
from herd.algos.impala import IMPALA
from herd.errors import ConfigError

ALGORITHMS: dict[str, Algorithm] = {"impala": IMPALA, "apex": APEX, "impact": IMPACT, "appo": APPO}

__all__ = ["ALGORITHMS", "Algorithm", "get_algorithm", "trajectory_layout"]


def get_algorithm(name: str) -> Algorithm:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ConfigError(f"--algorithm: unknown algorithm '{name}' (use one of {', '.join(ALGORITHMS)})") from None
