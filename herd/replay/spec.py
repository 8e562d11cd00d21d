"""--replay_parameters: parsing and checking the JSON list of replays, and splitting a
batch between them. Each entry's type and extra keys are checked by its kind in
registry.py, so a bad entry costs one line before anything runs."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from herd.errors import ConfigError
from herd.inputs import excerpt, parse_json
from herd.replay.registry import CIRCULAR_DEFAULT_ITERATIONS, REPLAY_KINDS


@dataclass(frozen=True)
class ReplaySpec:
    """One entry of --replay_parameters."""
    type: str
    capacity: int
    sample_ratio: float
    options: tuple = ()  # extra (key, value) pairs of the kind

    def option(self, key: str, default: Any = None) -> Any:
        return dict(self.options).get(key, default)

    @property
    def on_policy(self) -> bool:
        return REPLAY_KINDS[self.type].on_policy


def parse_replay_parameters(text: str | list | None) -> list[ReplaySpec]:
    """Parses and checks the JSON list of replays; raises ConfigError with one clear line."""
    if text is None:
        raise ConfigError("--replay_parameters is not set")
    if isinstance(text, str):
        try:
            entries = parse_json("--replay_parameters", text)   # size and depth checked first
        except json.JSONDecodeError as err:
            raise ConfigError(f"--replay_parameters is not valid JSON ({err.msg} at character {err.pos}): "
                              "give a list like '[{\"type\": \"queue\", \"capacity\": 1, \"sample_ratio\": 1}]'") from None
    else:
        entries = text
    if not isinstance(entries, list) or not entries:
        raise ConfigError("--replay_parameters must be a non-empty JSON list of replay objects")
    specs = [parse_replay_entry(i, entry) for i, entry in enumerate(entries)]
    total = sum(spec.sample_ratio for spec in specs)
    if not math.isclose(total, 1.0, abs_tol=1e-6):
        ratios = " + ".join(f"{spec.sample_ratio:g}" for spec in specs)
        raise ConfigError(f"--replay_parameters: sample_ratio values must sum to 1, but {ratios} = {total:g}")
    return specs


def parse_replay_entry(index: int, entry: Any) -> ReplaySpec:
    where = f"--replay_parameters entry {index}"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be a JSON object with type, capacity and sample_ratio")
    missing = [key for key in ("type", "capacity", "sample_ratio") if key not in entry]
    if missing:
        raise ConfigError(f"{where} lacks {', '.join(missing)}")
    kind = entry["type"]
    if not isinstance(kind, str) or kind not in REPLAY_KINDS:
        raise ConfigError(f"{where}: unknown replay type '{excerpt(kind)}' (use one of {', '.join(REPLAY_KINDS)})")
    capacity, ratio = entry["capacity"], entry["sample_ratio"]
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ConfigError(f"{where}: capacity must be an integer >= 1, got {excerpt(capacity)}")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
        raise ConfigError(f"{where}: sample_ratio must be a number in [0, 1], got {excerpt(ratio)}")
    extra = {k: v for k, v in entry.items() if k not in ("type", "capacity", "sample_ratio")}
    check = REPLAY_KINDS[kind].check_options
    if check is None and extra:
        raise ConfigError(f"{where}: unknown key(s) {excerpt(', '.join(sorted(map(str, extra))))} for type '{kind}'")
    if check is not None:
        check(where, extra)
    return ReplaySpec(kind, capacity, float(ratio), tuple(sorted(extra.items())))


def passes_per_batch(specs: list[ReplaySpec]) -> int:
    """Learner updates per batch of fresh trajectories: a circular buffer's
    iterations_per_batch (K), else 1."""
    return max([spec.option("iterations_per_batch", CIRCULAR_DEFAULT_ITERATIONS) for spec in specs
                if spec.type == "circular"] or [1])


def batch_shares(specs: list[ReplaySpec], batch_size: int) -> list[int]:
    """Trajectories each replay contributes to a batch: batch_size split by sample_ratio,
    rounded by largest remainder so the shares add up to batch_size exactly."""
    exact = [spec.sample_ratio * batch_size for spec in specs]
    shares = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(specs)), key=lambda i: exact[i] - shares[i], reverse=True)
    for i in by_remainder[: batch_size - sum(shares)]:
        shares[i] += 1
    return shares
