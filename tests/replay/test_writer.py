"""The replay writer queue's discarding strategies, and batches prepared in the background."""
import time

import numpy as np
import pytest
import torch

from herd.replay.spec import batch_shares, parse_replay_parameters
from herd.learner.batches import DirectBatches, PrefetchedBatches
from herd.replay.mixer import ReplayMixer
from herd.replay.registry import build_replay
from herd.replay.writer import WriterQueue
from herd.algos.impala import impala_layout


@pytest.mark.parametrize("strategy, kept", [("keep_latest", [3, 4]), ("keep_oldest", [1, 2]),
                                            ("alternating", [2, 4])])
def test_discarding_strategies(strategy, kept):
    writer = WriterQueue(size=2, strategy=strategy)
    for item in range(1, 5):
        writer.offer(item)
    assert [writer.pop() for _ in range(2)] == kept and writer.peek() is None
    assert writer.discarded == 2


LAYOUT = impala_layout(unroll_length=2, obs_shape=(3,), obs_dtype="float32", num_actions=2, feature_size=2)


def make_mixer():
    specs = parse_replay_parameters('[{"type": "queue", "capacity": 1, "sample_ratio": 0.5},'
                                    ' {"type": "standard", "capacity": 50, "sample_ratio": 0.5}]')
    shares = batch_shares(specs, 4)
    return ReplayMixer([build_replay(s, LAYOUT, share, 2) for s, share in zip(specs, shares)], shares, 0.0, seed=0)


def rollout(tag):
    return [{name: np.full(shape, tag + e, dtype=dtype) for name, (shape, dtype) in LAYOUT.fields().items()}
            for e in range(2)]


@pytest.mark.parametrize("prefetched", [False, True])
def test_every_fresh_trajectory_is_trained_once(prefetched):
    mixer = make_mixer()
    if prefetched:
        source = PrefetchedBatches(DirectBatches(mixer, torch.device("cpu")), threads=2, per_round=2, buffer_size=3,
                                   writer_queue_size=100, discarding_strategy="keep_latest")
    else:
        source = DirectBatches(mixer, torch.device("cpu"))
    fresh_seen = []
    for tag in range(0, 40, 2):
        source.put(rollout(tag), version=tag)
        if not prefetched:
            while (ready := source.next_ready()) is not None:
                fresh_seen += list(ready[0]["action"][0, ~ready[0]["replayed"]].numpy())
    deadline = time.monotonic() + 5
    while prefetched and len(fresh_seen) < 40 and time.monotonic() < deadline:
        ready = source.next_ready()
        if ready is None:
            time.sleep(0.01)
            continue
        batch, mixed = ready
        assert batch["obs"].shape == (3, 4, 3) and len(mixed.versions) == 4
        fresh_seen += list(batch["action"][0, ~batch["replayed"]].numpy())
    source.close()
    assert sorted(fresh_seen) == list(range(40))
