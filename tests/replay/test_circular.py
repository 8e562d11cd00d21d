"""IMPACT's circular buffer (herd/replay/circular.py) through the replay, the mixer and both
batch sources: every batch served exactly K times, whole and in write order, evicted
oldest first; its state across a checkpoint; and IMPACT's options refused in one line
where they make no sense together."""
from __future__ import annotations

import copy
import json
import time
from collections import Counter

import numpy as np
import pytest
import torch

from herd.algos.impala import impala_layout
from herd.config import ConfigError, resolve
from herd.learner.batches import DirectBatches, PrefetchedBatches
from herd.replay.circular import CircularSampler
from herd.replay.mixer import ReplayMixer
from herd.replay.registry import build_replay
from herd.replay.spec import parse_replay_parameters

LAYOUT = impala_layout(unroll_length=2, obs_shape=(3,), obs_dtype="float32", num_actions=2, feature_size=2)
SHARE = 3


def trajectory(tag: int) -> dict:
    return {name: np.full(shape, tag, dtype=dtype) for name, (shape, dtype) in LAYOUT.fields().items()}


def circular_mixer(num_batches: int, iterations: int, seed: int = 0) -> ReplayMixer:
    spec = parse_replay_parameters(json.dumps([{"type": "circular", "capacity": num_batches, "sample_ratio": 1,
                                                "iterations_per_batch": iterations}]))[0]
    return ReplayMixer([build_replay(spec, LAYOUT, SHARE, 2)], [SHARE], fill_in_factor=1.0, seed=seed)


def tags_of(tensors) -> tuple:
    return tuple(int(t) for t in tensors["reward"][0].tolist())     # one tag per column


def test_every_batch_is_served_exactly_k_times_whole_and_in_write_order():
    """Catches a buffer that serves a batch more or less than K times, mixes columns of
    several batches, or loses a trajectory (direct batch source: trains after each rollout)."""
    source = DirectBatches(circular_mixer(num_batches=2, iterations=3), torch.device("cpu"))
    served = []
    for start in range(0, 24, 2):                            # rollouts of 2 trajectories
        source.put([trajectory(start), trajectory(start + 1)], version=start)
        while (ready := source.next_ready()) is not None:
            served.append(tags_of(ready[0]))
    batches = [tuple(range(b * SHARE, (b + 1) * SHARE)) for b in range(24 // SHARE)]
    assert Counter(served) == {batch: 3 for batch in batches}
    # Batches come in the order they were completed (the buffer never holds two with uses here).
    assert [served[i] for i in range(0, len(served), 3)] == batches


def test_a_full_buffer_evicts_its_oldest_batch_and_counts_the_lost_passes():
    """Catches eviction out of order (a newer batch dropped, or a batch overwritten in part)
    and a lost batch that goes uncounted."""
    mixer = circular_mixer(num_batches=2, iterations=2)
    replay = mixer.replays[0]
    for tag in range(3 * SHARE):                              # three batches into two slots, none trained on
        mixer.add(trajectory(tag), version=tag)
    assert replay.sampler.evicted_unused == 1
    served = Counter(tags_of({"reward": mixer.sample().data["reward"]}) for _ in range(4))
    assert served == {(3, 4, 5): 2, (6, 7, 8): 2}              # the first batch is gone, the others whole
    assert not mixer.ready()


def test_each_pass_names_its_stored_batch_and_only_the_last_pass_publishes():
    """Catches a reuse key that changes between passes over one stored batch (IMPACT would
    run its target network on every pass) or that two batches share, a slot rewritten with a
    new batch keeping its old key (stale target outputs), and a last_pass flag that is not
    exactly the K-th serving (weights published per pass, or never)."""
    mixer = circular_mixer(num_batches=2, iterations=3, seed=1)
    for tag in range(3 * SHARE):              # batch 0's slot is overwritten by batch 2
        mixer.add(trajectory(tag), version=tag)
    served = []
    while mixer.ready():
        mixed = mixer.sample()
        served.append((tags_of({"reward": mixed.data["reward"]}), mixed.reuse_key, mixed.last_pass))
    keys = {}
    for tags, key, _ in served:
        keys.setdefault(tags, set()).add(key)
    assert set(keys) == {(3, 4, 5), (6, 7, 8)} and all(len(k) == 1 for k in keys.values())
    (first,), (second,) = keys[(3, 4, 5)], keys[(6, 7, 8)]     # slots 1 and 0
    assert first != second and first[0][1] != second[0][1]     # two slots
    assert Counter(last for _, _, last in served) == {False: 4, True: 2}
    assert all(last == (sum(t == tags for t, _, _ in served[:i + 1]) == 3) for i, (tags, _, last) in enumerate(served))
    # Batch 3 goes where batch 1 was: same slot, another generation, another key.
    for tag in range(3 * SHARE, 4 * SHARE):
        mixer.add(trajectory(tag), version=tag)
    newest = mixer.sample()
    assert tags_of({"reward": newest.data["reward"]}) == (9, 10, 11) and newest.reuse_key not in (first, second)
    assert newest.reuse_key[0][1] == first[0][1]


def test_a_batch_with_fresh_columns_has_no_reuse_key():
    """Catches a queue's fresh columns mixed into a circular batch being given cached
    target outputs from another pass."""
    specs = parse_replay_parameters(json.dumps([
        {"type": "circular", "capacity": 2, "sample_ratio": 0.5, "iterations_per_batch": 2},
        {"type": "queue", "capacity": 4, "sample_ratio": 0.5}]))
    mixer = ReplayMixer([build_replay(specs[0], LAYOUT, 2, 2), build_replay(specs[1], LAYOUT, 2, 2)], [2, 2],
                        fill_in_factor=1.0, seed=0)
    for tag in range(4):
        mixer.add(trajectory(tag), version=tag)
    mixed = mixer.sample()
    assert mixed.reuse_key is None and mixed.last_pass is False


def test_a_full_buffer_makes_the_writer_wait_instead_of_evicting():
    """Catches prefetching that overwrites batches with uses left: with the buffer full,
    rollouts wait in the writer queue until a batch is used up, so none is lost."""
    mixer = circular_mixer(num_batches=2, iterations=2)
    source = PrefetchedBatches(DirectBatches(mixer, torch.device("cpu")), threads=1, per_round=1, buffer_size=1,
                               writer_queue_size=64, discarding_strategy="wait")
    served = []
    try:
        for start in range(0, 24, 2):
            source.put([trajectory(start), trajectory(start + 1)], version=start)
        deadline = time.monotonic() + 60
        while len(served) < 16 and time.monotonic() < deadline:
            ready = source.next_ready()
            if ready is None:
                time.sleep(0.005)
                continue
            served.append(tags_of(ready[0]))
    finally:
        source.close()
    assert Counter(served) == {tuple(range(b * SHARE, (b + 1) * SHARE)): 2 for b in range(8)}
    assert mixer.replays[0].sampler.evicted_unused == 0


def test_the_buffer_resumes_exactly_from_a_checkpoint():
    """Catches a checkpoint that forgets the batches' remaining uses or the slot being
    filled: the resumed buffer serves the same batches as one that never stopped."""
    mixer = circular_mixer(num_batches=3, iterations=2, seed=4)
    for tag in range(8):                                       # two whole batches and two of a third
        mixer.add(trajectory(tag), version=tag)
    mixer.sample()
    twin = circular_mixer(num_batches=3, iterations=2, seed=99)
    twin.load_state_dict(copy.deepcopy(mixer.state_dict()))

    def rest(m):
        for tag in range(8, 14):
            m.add(trajectory(tag), version=tag)
        served = []
        while m.ready():
            served.append(tags_of({"reward": m.sample().data["reward"]}))
        return served
    resumed = rest(twin)
    assert resumed == rest(mixer) and len(resumed) == 4


def test_the_sampler_serves_whole_batches_only():
    """Catches a caller asking for part of a batch (a batch split across learners wrongly)."""
    sampler = CircularSampler(num_batches=2, share=2, iterations=1)
    sampler.add(), sampler.add()
    with pytest.raises(ValueError, match="whole batches of 2"):
        sampler.sample(1, np.random.default_rng(0))


def kind_of(env_id):
    return "atari" if env_id.endswith("NoFrameskip-v4") else "vector"


CIRCULAR = '[{"type": "circular", "capacity": 4, "sample_ratio": 1, "iterations_per_batch": 2}]'


@pytest.mark.parametrize("options, words", [
    ({"replay_parameters": '[{"type": "circular", "capacity": 4, "sample_ratio": 0.5}, '
                           '{"type": "queue", "capacity": 1, "sample_ratio": 0.5}]'}, "only replay"),
    ({"replay_parameters": CIRCULAR, "batch_size": 2, "envs_per_worker": 16}, "less than one actor's rollout"),
    ({"replay_parameters": '[{"type": "circular", "capacity": 4, "sample_ratio": 1, "iterations_per_batch": 0}]'},
     "iterations_per_batch must be an integer >= 1"),
    ({"replay_parameters": '[{"type": "circular", "capacity": 4, "sample_ratio": 1, "passes": 2}]'},
     "unknown key 'passes'"),
    ({"use_kl_mask": True}, "no LASER mask"),
    ({"use_policy_cloning_loss": True}, "CLEAR cloning"),
    ({"clip_param": 1.5}, "--clip_param must be in (0, 1)"),
    ({"importance_weight_clip": 0}, "--importance_weight_clip must be a number > 0"),
    ({"kl_target": 0}, "--kl_target > 0"),
    ({"target_update_period": 0}, "--target_update_period must be >= 1"),
    ({"replay_parameters": '[{"type": "standard", "capacity": 100, "sample_ratio": 1}]'},
     "impact does not train from a 'standard' replay"),
])
def test_options_that_make_no_sense_with_impact_are_refused_in_one_line(options, words):
    """Catches IMPACT runs that would silently do something else: CLEAR/LASER terms it does
    not compute, a circular buffer split with another replay, impossible values."""
    with pytest.raises(ConfigError) as err:
        resolve({"env": "CartPole-v1", "algorithm": "impact", **options}, env_kind=kind_of).validate()
    assert words in str(err.value) and "\n" not in str(err.value)


def test_the_kl_penalty_is_refused_without_impact():
    """Catches --use_kl_loss accepted by IMPALA, whose loss has no such term."""
    with pytest.raises(ConfigError, match="IMPACT's penalty"):
        resolve({"env": "CartPole-v1", "use_kl_loss": True}, env_kind=kind_of).validate()


def test_impact_defaults_train_each_batch_twice_and_decay_the_rate_over_those_updates():
    """Catches a profile without the circular buffer, and an LR schedule that counts one
    update per batch (it would reach its end value halfway through the run)."""
    impact = resolve({"env": "CartPole-v1", "algorithm": "impact"}, env_kind=kind_of)
    impala = resolve({"env": "CartPole-v1"}, env_kind=kind_of)
    impact.validate()
    assert [(s.type, s.option("iterations_per_batch")) for s in impact.replays] == [("circular", 2)]
    assert abs(impact.train.lr_scheduler_steps - 2 * impala.train.lr_scheduler_steps) <= 1     # both rounded up
