"""The session's part of a checkpoint (counters, statistics, random state, optimizer and
schedule, replay contents, loss state), checked key by key when the checkpoint is loaded,
before any run folder is made: a checksummed file from someone else can hold anything a
pickle of plain values can, and unchecked, each of these parts would reach code that
trusts it after the run has started (counters holding `__dict__` would be set as an
attribute and silently restart the run's counters; a missing `rng` would be a KeyError
traceback).

What is checked is the shape herd writes: the types of each part and of its entries, and
the names where herd writes fixed names. Values a later check bounds (a replay's sizes) are
left to it. Keys herd does not write are never read, so they are not refused."""
from __future__ import annotations

import math
from typing import Any

import torch

from herd.errors import CheckpointError
from herd.inputs import excerpt

# herd.learner.session.Counters' fields (a test holds the two equal); env_steps and
# updates are in every checkpoint herd wrote, the others came later.
COUNTER_KEYS = ("env_steps", "updates", "rollouts", "skipped_updates", "stale_rollouts", "wall_time")
REQUIRED_COUNTERS = ("env_steps", "updates")
STATS_KEYS = ("scores", "episodes", "max_score", "max_average")
# What every session checkpoint holds (herd.learner.session.Session.state_dict).
REQUIRED = ("optimizer", "scheduler", "counters", "stats", "rng")


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_session_state(state: dict, resuming: bool = True) -> None:
    """Raises CheckpointError (a message without the path, one line) unless every session part
    is the shape herd writes. resuming: every part must be there (a resume reads them all);
    otherwise (test mode reads the model alone) those present are checked all the same."""
    if resuming:
        for key in REQUIRED:
            if key not in state:
                raise CheckpointError(f"has no {key}: not a checkpoint herd wrote")
    checks = {"counters": check_counters, "stats": lambda value: check_stats("stats", value),
              "least_exploring_stats": lambda value: check_stats("least_exploring_stats", value),
              "rng": check_rng, "optimizer": check_optimizer,
              "scheduler": lambda value: check_plain_dict("scheduler", value)}
    for key, check in checks.items():
        if key in state:
            check(state[key])
    if "loss_state" in state:
        check_plain_dict("loss_state", state["loss_state"])
    if "replay" in state:
        check_replay(state["replay"])


def check_counters(counters: Any) -> None:
    if not isinstance(counters, dict):
        raise CheckpointError(f"has counters of type {type(counters).__name__}, not a dict: herd does not write that")
    unknown = [key for key in counters if key not in COUNTER_KEYS]
    if unknown:
        raise CheckpointError(f"has a counter named {excerpt(unknown[0])}, which herd does not write (its counters: "
                              f"{', '.join(COUNTER_KEYS)})")
    missing = [key for key in REQUIRED_COUNTERS if key not in counters]
    if missing:
        raise CheckpointError(f"has no {missing[0]} among its counters: not a checkpoint herd wrote")
    for key, value in counters.items():
        fits = is_number(value) and math.isfinite(value) and value >= 0 if key == "wall_time" else is_count(value)
        if not fits:
            raise CheckpointError(f"has counter {key} = {excerpt(value)}: herd writes "
                                  + ("a finite number of seconds" if key == "wall_time" else "a whole count >= 0"))


def check_stats(name: str, stats: Any) -> None:
    if not isinstance(stats, dict) or any(key not in stats for key in STATS_KEYS):
        raise CheckpointError(f"has {name} without {', '.join(STATS_KEYS)}: not a checkpoint herd wrote")
    scores = stats["scores"]
    if not isinstance(scores, list) or not all(is_number(score) for score in scores):
        raise CheckpointError(f"has {name} whose scores are not a list of numbers: herd does not write that")
    if not is_count(stats["episodes"]) or not is_number(stats["max_score"]) or not is_number(stats["max_average"]):
        raise CheckpointError(f"has {name} whose episodes, max_score or max_average are not numbers: herd does not "
                              "write that")


def check_rng(rng: Any) -> None:
    expected = torch.get_rng_state()
    tensor = rng.get("torch") if isinstance(rng, dict) else None
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != expected.dtype or tensor.shape != expected.shape:
        shown = (f"a {tensor.dtype} tensor of shape {tuple(tensor.shape)[:8]}" if isinstance(tensor, torch.Tensor)
                 else type(tensor).__name__)
        raise CheckpointError(f"has an rng whose torch state is {shown}, not the {expected.numel()} bytes torch "
                              "keeps: herd does not write that")


def check_optimizer(optimizer: Any) -> None:
    """torch's optimizer state_dict: {"state": {index: {name: tensor or number}}, "param_groups":
    [{"params": [index, ...], option: value}]}, each index in one group only."""
    bad = None
    if not isinstance(optimizer, dict) or not isinstance(optimizer.get("state"), dict) \
            or not isinstance(optimizer.get("param_groups"), list):
        bad = "is not the state and param_groups torch writes"
    else:
        indices: list = []
        for group in optimizer["param_groups"]:
            if not isinstance(group, dict) or not isinstance(group.get("params"), list) \
                    or not all(is_count(index) for index in group["params"]):
                bad = "has a param group without its list of parameter indices"
                break
            indices += group["params"]
        if bad is None and len(set(indices)) != len(indices):
            bad = "lists a parameter in two groups"
        if bad is None:
            for index, entry in optimizer["state"].items():
                if index not in indices or not isinstance(entry, dict) or not all(
                        isinstance(k, str) and (isinstance(v, torch.Tensor) or is_number(v))
                        for k, v in entry.items()):
                    bad = f"has a state entry {excerpt(index)} that is no parameter's tensors"
                    break
    if bad:
        raise CheckpointError(f"has an optimizer state that {bad}: herd does not write that")


def check_replay(replay: Any) -> None:
    """herd.replay's ReplayMixer.state_dict: {"replays": [one dict per replay], "credit", "rng"}."""
    check_plain_dict("replay", replay)
    replays = replay.get("replays")
    if not isinstance(replays, list) or not all(isinstance(r, dict) and all(isinstance(k, str) for k in r)
                                                for r in replays):
        raise CheckpointError("has a replay whose replays are not a list of dicts: herd does not write that")
    if not isinstance(replay.get("rng"), dict):
        raise CheckpointError("has a replay without its random generator's state: herd does not write that")


def check_plain_dict(name: str, value: Any) -> None:
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise CheckpointError(f"has a {name} that is not a dict with text keys: herd does not write that")
