"""The CPU learner's choice of layout, precision and compiling (herd/learner/autotune.py,
herd/training.py's step_config): given options are kept, the pick is the fastest measured,
the cache is trusted only for what this run could pick, the log says what was picked, and
every candidate computes the same update. Speed itself is never asserted here."""
from __future__ import annotations

import copy
import json
import logging

import pytest
import torch

from herd.learner.autotune import (MAX_ROUNDS, ChoiceCache, StepConfig, candidates, choose, synthetic_batch,
                                   timed_updates)
from herd.errors import UserError
from herd.models import build_model
from herd.plan import prepare
from herd.training import make_learner, step_config

FP32_CL, FP32_NCHW, BF16_CL, BF16_NCHW = (StepConfig("fp32", True), StepConfig("fp32", False),
                                          StepConfig("bf16", True), StepConfig("bf16", False))


def fixed_times(ms: dict[StepConfig, float], calls: list):
    """A Measure that returns the given times (no learner runs) and records what it was asked."""
    def measure(configs):
        calls.append(list(configs))
        return {config: ms[config] for config in configs}
    return measure


def never_measured(configs):
    raise AssertionError(f"measured {configs} where nothing needed timing")


def test_given_options_are_the_only_candidates():
    assert candidates("auto", "auto", True, True) == [FP32_CL, FP32_NCHW, BF16_CL, BF16_NCHW]
    assert candidates("auto", "auto", False, True) == [FP32_CL, FP32_NCHW]      # no bf16 units: no bf16 trial
    assert candidates("bf16", "auto", False, True) == [BF16_CL, BF16_NCHW]      # given bf16: kept
    assert candidates("fp32", "nchw", True, True) == [FP32_NCHW]
    assert candidates("auto", "channels_last", True, True) == [FP32_CL, BF16_CL]
    assert candidates("auto", "auto", True, False) == [StepConfig("fp32", None), StepConfig("bf16", None)]


def test_the_pick_is_the_fastest_measured():
    calls = []
    times = {FP32_CL: 50.0, FP32_NCHW: 40.0, BF16_CL: 45.0, BF16_NCHW: 60.0}
    choice = choose(list(times), fixed_times(times, calls))
    assert choice.picked == FP32_NCHW
    assert choice.ms == {c.label: ms for c, ms in times.items()}
    assert calls == [list(times)]


def test_compiling_is_one_more_candidate_the_fastest_eager_compiled():
    calls = []
    compiled = StepConfig("bf16", True, compiled=True)
    times = {FP32_CL: 50.0, BF16_CL: 45.0, compiled: 30.0}
    assert choose([FP32_CL, BF16_CL], fixed_times(times, calls), try_compile=True).picked == compiled
    assert calls[1] == [BF16_CL, compiled]          # one compile: the eager winner's
    slower = {**times, compiled: 46.0}
    assert choose([FP32_CL, BF16_CL], fixed_times(slower, []), try_compile=True).picked == BF16_CL


def test_one_candidate_is_taken_untimed():
    choice = choose([FP32_NCHW], never_measured)
    assert choice.picked == FP32_NCHW and choice.ms == {}


class FakeLearner:
    """step() advances a fake clock: `first` seconds for its first update, then `each`."""
    def __init__(self, clock, first, each):
        self.clock, self.first, self.each, self.steps = clock, first, each, 0

    def step(self, batch):
        self.clock[0] += self.first if self.steps == 0 else self.each[min(self.steps - 1, len(self.each) - 1)]
        self.steps += 1


def test_timing_leaves_out_the_warm_up_and_keeps_the_fastest_update():
    clock = [0.0]
    made = {}

    def make(config):
        # fp32: a slow first update (compiling, allocation), then 0.05 s; bf16: 0.06 s then 0.04 s.
        made[config] = FakeLearner(clock, 100.0 if config == FP32_CL else 0.1,
                                   [0.05] if config == FP32_CL else [0.06, 0.04])
        return made[config]

    ms = timed_updates(make, {}, budget_s=0.5, clock=lambda: clock[0])([FP32_CL, BF16_CL])
    assert ms == pytest.approx({FP32_CL: 50.0, BF16_CL: 40.0})
    assert 3 <= made[FP32_CL].steps <= 1 + MAX_ROUNDS       # warm-up + at least 2, at most MAX_ROUNDS timed


def test_cached_choice_is_taken_without_measuring(tmp_path, caplog):
    cache = ChoiceCache(tmp_path / "herd" / "learner_choices.json")
    times = {FP32_CL: 50.0, FP32_NCHW: 40.0}
    first = choose(list(times), fixed_times(times, []), cache=cache, key="k")
    with caplog.at_level(logging.INFO, logger="herd"):
        again = choose(list(times), never_measured, cache=cache, key="k")
    assert again.picked == first.picked == FP32_NCHW and again.ms == first.ms
    assert "from cache" in again.log_line() and "ignoring" not in caplog.text
    calls = []
    choose(list(times), fixed_times(times, calls), cache=cache, key="another shape")
    assert calls                                  # a different key measures


HOSTILE = [
    b"{not json",
    b"[1, 2, 3]",
    json.dumps({"entries": {"k": {"picked": "rm -rf /", "ms": {}}}}).encode(),
    json.dumps({"entries": {"k": {"picked": "bf16 NCHW", "ms": {"bf16 NCHW": 1.0}}}}).encode(),  # not a candidate
    json.dumps({"entries": {"k": {"picked": "fp32 NCHW", "ms": {"fp32 NCHW": -1.0}}}}).encode(),
    json.dumps({"entries": {"k": {"picked": "fp32 NCHW", "ms": {"fp32 NCHW": "NaN"}}}}).encode(),
    json.dumps({"entries": {"k": {"picked": "fp32 NCHW", "ms": {"fp32 NCHW": True}}}}).encode(),
    json.dumps({"entries": {"k": ["fp32 NCHW"]}}).encode(),
    # a valid pick, and a time for something no run measures (it would reach the log line)
    json.dumps({"entries": {"k": {"picked": "fp32 NCHW", "ms": {"fp32 NCHW": 1.0, "x\nERROR forged": 1.0}}}}).encode(),
    b"[" * 100_000,                               # deep nesting
    b" " * 300_000,                               # larger than any cache herd writes
]


@pytest.mark.parametrize("content", HOSTILE, ids=range(len(HOSTILE)))
def test_a_corrupt_or_hostile_cache_is_ignored_with_a_log_line(tmp_path, caplog, content):
    path = tmp_path / "learner_choices.json"
    path.write_bytes(content)
    calls = []
    times = {FP32_CL: 50.0, FP32_NCHW: 60.0}
    with caplog.at_level(logging.WARNING, logger="herd"):
        choice = choose(list(times), fixed_times(times, calls), cache=ChoiceCache(path), key="k")
    assert calls and choice.picked == FP32_CL          # measured, not read
    assert "ignoring" in caplog.text and str(path) in caplog.text
    assert json.loads(path.read_text())["entries"]["k"]["picked"] == "fp32 channels-last"   # replaced


def pong_plan(tmp_path, **options):
    return prepare({"env": "PongNoFrameskip-v4", "device": "cpu", "results_dir": str(tmp_path),
                    "environment_max_steps": 100_000, "batch_size": 2, "r_f_steps": 3, **options})


def test_a_cpu_run_logs_its_pick_and_keeps_given_options(tmp_path, caplog):
    plan = pong_plan(tmp_path)
    model = build_model(**plan.model_kwargs)
    cache = ChoiceCache(tmp_path / "cache.json")
    calls = []
    times = {FP32_CL: 9.0, FP32_NCHW: 7.0, BF16_CL: 8.0, BF16_NCHW: 10.0}
    with caplog.at_level(logging.INFO, logger="herd"):
        picked = step_config(plan, model, torch.device("cpu"), False, cache, fixed_times(times, calls))
    assert picked == FP32_NCHW
    assert "learner: runs fp32 NCHW (measured at start-up: fp32 NCHW 7.0 ms" in caplog.text
    given = pong_plan(tmp_path, learner_precision="fp32", learner_layout="channels_last")
    assert step_config(given, model, torch.device("cpu"), False, cache, never_measured) == FP32_CL
    compiled = pong_plan(tmp_path, learner_precision="bf16", learner_layout="nchw", learner_compile=True)
    assert step_config(compiled, model, torch.device("cpu"), False, cache, never_measured) == StepConfig(
        "bf16", False, compiled=True)


def test_an_explicit_layout_on_a_network_without_one_is_refused(tmp_path):
    with pytest.raises(UserError, match="--learner_layout=nchw applies to convolutional networks"):
        prepare({"env": "CartPole-v1", "results_dir": str(tmp_path), "learner_layout": "nchw"})


@pytest.mark.parametrize("network", ["nature_cnn", "resnet"])
def test_every_candidate_computes_the_same_update(tmp_path, network):
    """One update from the same weights on the same synthetic batch, under each candidate:
    fp32 in either layout equal to float32 rounding; bf16 the same direction and size
    (RMSprop's first step divides by |gradient|, so bf16 rounding of small gradients shows).
    The frames go through the per-pixel normaliser (an Atari default): float32 rounding
    then moves a few of two million weights by up to 2e-6, against steps of up to 6e-3."""
    plan = pong_plan(tmp_path, network=network)
    torch.manual_seed(0)
    model = build_model(**plan.model_kwargs)
    batch = synthetic_batch(plan.layout, 2)
    batch["reward"] = torch.randn(batch["reward"].shape, generator=torch.Generator().manual_seed(1))
    before = torch.cat([p.detach().flatten() for p in model.parameters()])
    moves = {}
    for config in (FP32_CL, FP32_NCHW, BF16_CL, BF16_NCHW):
        learner = make_learner(plan, copy.deepcopy(model), config)
        learner.step(batch)
        moves[config] = torch.cat([p.detach().flatten() for p in learner.model.parameters()]) - before
    reference = moves[FP32_CL]
    assert reference.norm() > 0
    torch.testing.assert_close(moves[FP32_NCHW], reference, rtol=1e-3, atol=1e-5)
    for config in (BF16_CL, BF16_NCHW):
        assert torch.nn.functional.cosine_similarity(moves[config], reference, dim=0) > 0.95
        assert 0.9 < moves[config].norm() / reference.norm() < 1.1
