"""A CPU learner's layout, precision and compiling, chosen by timing its own update.

Which of channels-last or NCHW activations, bf16 autocast or fp32, eager or compiled runs
a learner update fastest depends on the CPU, the network and the batch shape (on a 2-core
Xeon with AMX, channels-last made the Nature CNN's update 1.5x faster in fp32 and 1.1x in
bf16; docs/learner-speed.md). So for the
options a run leaves to herd, the learner times each candidate configuration of its real
update (its network, loss, optimizer and batch shape, on a synthetic batch and a copy of
the model, so the run's weights are untouched) for about BUDGET_S seconds at start-up,
keeps the fastest, and logs what it picked, the times and why. Compiling is tried only
where the run is long enough for it to pay (herd.config.apply_profile's rule), as one more
candidate: the fastest eager configuration, compiled.

A measurement is kept per machine, torch, thread count, network and batch shape in a
small JSON file in the user's cache folder, so the next run on the same machine starts at
once. That file is data from disk: an entry counts only when it names one of the
candidates of this run, and anything else in it is ignored with a log line."""
from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Optional

import numpy as np
import torch

from herd.devices import cpu_model
from herd.files import write_json
from herd.trajectory import TrajectoryLayout

log = logging.getLogger("herd")

# Seconds of timed updates, after each candidate's warm-up update; at least MIN_ROUNDS
# and at most MAX_ROUNDS timed updates per candidate, one candidate after the other in
# turn, so that a burst of load elsewhere falls on all of them.
BUDGET_S = 2.0
MIN_ROUNDS = 2
MAX_ROUNDS = 5
LAYOUT_CHOICES = ("auto", "channels_last", "nchw")
CACHE_FILE = "learner_choices.json"
CACHE_MAX_BYTES = 256 * 1024       # a bigger file is not ours: ignored
CACHE_MAX_ENTRIES = 64             # the oldest entries go first


@dataclass(frozen=True)
class StepConfig:
    """One way to run the learner update. channels_last None: the network has no
    convolution layout to choose (an MLP)."""
    precision: str                  # "fp32" or "bf16"
    channels_last: Optional[bool]
    compiled: bool = False

    @property
    def label(self) -> str:
        layout = {True: " channels-last", False: " NCHW", None: ""}[self.channels_last]
        return f"{self.precision}{layout}{', compiled' if self.compiled else ''}"


def candidates(precision: str, layout: str, bf16_units: bool, has_layout: bool) -> list[StepConfig]:
    """The configurations to time. precision "auto" tries fp32, and bf16 where the CPU has
    bf16 units (emulated bf16 is slower than fp32: not worth a trial); layout "auto" tries
    both where the network has a layout switch. A given value is the only one tried."""
    precisions = (["fp32", "bf16"] if bf16_units else ["fp32"]) if precision == "auto" else [precision]
    if not has_layout:
        layouts: list[Optional[bool]] = [None]
    else:
        layouts = {"auto": [True, False], "channels_last": [True], "nchw": [False]}[layout]
    return [StepConfig(p, cl) for p in precisions for cl in layouts]


def synthetic_batch(layout: TrajectoryLayout, batch_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A learner batch of this run's shapes, field -> [time, B, ...]: random frames or
    vectors, every other field zero (action 0, no episode end: a valid batch for every
    trajectory loss), and no replayed column."""
    g = torch.Generator().manual_seed(seed)
    batch = {}
    for name, (shape, dtype) in layout.fields().items():
        full = (shape[0], batch_size, *shape[1:])
        if name == "obs" and dtype == np.uint8:
            batch[name] = torch.randint(0, 256, full, dtype=torch.uint8, generator=g)
        elif name == "obs":
            batch[name] = torch.from_numpy(torch.rand(full, generator=g).numpy().astype(dtype))
        else:
            batch[name] = torch.from_numpy(np.zeros(full, dtype))
    batch["replayed"] = torch.zeros(batch_size, dtype=torch.bool)
    return batch


Measure = Callable[[list[StepConfig]], dict[StepConfig, float]]


def timed_updates(make_learner: Callable[[StepConfig], object], batch: dict[str, torch.Tensor],
                  budget_s: float = BUDGET_S, clock: Callable[[], float] = time.perf_counter) -> Measure:
    """A Measure that builds one learner per configuration (make_learner: on a copy of the
    run's model), runs one warm-up update each (allocation, oneDNN's kernels, compiling),
    then timed updates in turn until budget_s has passed; a configuration's time is its
    fastest update in ms (the one least disturbed by other processes)."""
    def measure(configs: list[StepConfig]) -> dict[StepConfig, float]:
        learners = {config: make_learner(config) for config in configs}
        for learner in learners.values():
            learner.step(batch)
        samples: dict[StepConfig, list[float]] = {config: [] for config in configs}
        start = clock()
        for done in range(1, MAX_ROUNDS + 1):
            for config, learner in learners.items():
                before = clock()
                learner.step(batch)
                samples[config].append(clock() - before)
            if done >= MIN_ROUNDS and clock() - start >= budget_s:
                break
        return {config: min(times) * 1000 for config, times in samples.items()}
    return measure


@dataclass(frozen=True)
class Choice:
    picked: StepConfig
    ms: dict[str, float]            # label -> ms per update; empty when nothing was timed
    why: str

    def log_line(self) -> str:
        times = ", ".join(f"{label} {ms:.1f} ms" for label, ms in sorted(self.ms.items(), key=lambda kv: kv[1]))
        return f"learner: runs {self.picked.label} ({self.why}{': ' + times if times else ''})"


def fastest(times: dict[StepConfig, float]) -> StepConfig:
    """The configuration of the least time; on a tie the first one listed."""
    return min(times, key=times.__getitem__)


class ChoiceCache:
    """{key: {"picked": label, "ms": {label: ms}}} in one JSON file, written atomically."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def entries(self) -> dict:
        """The file's entries; {} (with a log line) when it is missing, too big, or not
        the expected shape. Single entries are checked where they are used (lookup)."""
        try:
            if self.path.stat().st_size > CACHE_MAX_BYTES:
                log.warning("learner: ignoring %s: larger than %d bytes", self.path, CACHE_MAX_BYTES)
                return {}
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, RecursionError) as err:
            log.warning("learner: ignoring %s: not readable JSON (%s)", self.path, type(err).__name__)
            return {}
        if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
            log.warning("learner: ignoring %s: not a cache of learner choices", self.path)
            return {}
        return data["entries"]

    def lookup(self, key: str, allowed: Iterable[StepConfig]) -> Optional[Choice]:
        """The cached choice for key, only where it names one of `allowed` and its times are
        positive finite numbers for allowed configurations; otherwise None (an entry that
        is there but wrong is ignored with a log line)."""
        entry = self.entries().get(key)
        if entry is None:
            return None
        by_label = {config.label: config for config in allowed}
        ms = entry.get("ms") if isinstance(entry, dict) else None
        picked = by_label.get(entry.get("picked")) if isinstance(entry, dict) and isinstance(
            entry.get("picked"), str) else None
        if (picked is None or not isinstance(ms, dict)
                or not all(label in by_label and isinstance(value, (int, float)) and not isinstance(value, bool)
                           and math.isfinite(value) and value > 0 for label, value in ms.items())):
            log.warning("learner: ignoring the cached choice in %s: it names no configuration this run can take",
                        self.path)
            return None
        return Choice(picked, {label: float(value) for label, value in ms.items()}, f"from cache {self.path}")

    def store(self, key: str, choice: Choice) -> None:
        """Adds or replaces key's entry; a cache that cannot be written only costs a log line."""
        entries = {k: v for k, v in self.entries().items() if k != key}
        entries[key] = {"picked": choice.picked.label, "ms": {k: round(v, 3) for k, v in choice.ms.items()}}
        entries = dict(list(entries.items())[-CACHE_MAX_ENTRIES:])
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json(self.path, {"entries": entries})
        except OSError as err:
            log.warning("learner: could not save the measured choice to %s (%s)", self.path, err)


def default_cache() -> ChoiceCache:
    """$XDG_CACHE_HOME/herd/learner_choices.json, else ~/.cache/herd/learner_choices.json."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return ChoiceCache(Path(root) / "herd" / CACHE_FILE)


def cache_key(network: str, batch: dict[str, torch.Tensor], algorithm: str, configs: list[StepConfig],
              try_compile: bool) -> str:
    """What a measurement depends on: the machine (CPU model, cores, torch and its threads),
    the network and algorithm, the batch's shapes, and what was left to choose."""
    shapes = {name: list(tensor.shape) for name, tensor in sorted(batch.items())}
    return json.dumps({"cpu": cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__,
                       "threads": torch.get_num_threads(), "network": network, "algorithm": algorithm,
                       "shapes": shapes, "candidates": [c.label for c in configs], "compile": try_compile},
                      sort_keys=True)


def choose(configs: list[StepConfig], measure: Measure, try_compile: bool = False,
           cache: Optional[ChoiceCache] = None, key: str = "") -> Choice:
    """The fastest of `configs` by `measure`; with try_compile, then the fastest compiled
    against itself eager (a second measurement: one compile, not one per configuration).
    A single configuration with nothing to compile is taken untimed. With a cache, a valid
    entry for key is taken instead of measuring, and a new measurement is stored."""
    if len(configs) == 1 and not try_compile:
        return Choice(configs[0], {}, "the only configuration the options allow")
    allowed = [*configs, *(replace(c, compiled=True) for c in configs if try_compile)]
    if cache is not None:
        cached = cache.lookup(key, allowed)
        if cached is not None:
            return cached
    times = measure(configs) if len(configs) > 1 else {}
    eager = fastest(times) if times else configs[0]
    if try_compile:
        times.update(measure([eager, replace(eager, compiled=True)]))
    picked = fastest(times)
    choice = Choice(picked, {c.label: ms for c, ms in times.items()}, "measured at start-up")
    if cache is not None:
        cache.store(key, choice)
    return choice
