"""The background batch threads (herd/learner/batches.py PrefetchedBatches): an error in
a thread must reach the learner's thread, not end the thread in silence (the learner
would then wait forever for a batch that never comes)."""
import numpy as np
import pytest
import torch

from herd_testing import wait_for
from herd.algos.impala import impala_layout
from herd.learner.batches import DirectBatches, PrefetchedBatches
from herd.replay.mixer import ReplayMixer
from herd.replay.registry import build_replay
from herd.replay.spec import parse_replay_parameters

LAYOUT = impala_layout(unroll_length=3, obs_shape=(2,), obs_dtype="float32", num_actions=2, feature_size=4)
E = 2


def rollout() -> dict:
    """field -> [time, E, ...] zeros: two environment columns of one actor's slot."""
    return {name: np.zeros((shape[0], E, *shape[1:]), dtype) for name, (shape, dtype) in LAYOUT.fields().items()}


def prefetched(fail_on_sample: bool) -> PrefetchedBatches:
    spec = parse_replay_parameters('[{"type": "queue", "capacity": 1, "sample_ratio": 1}]')[0]
    mixer = ReplayMixer([build_replay(spec, LAYOUT, 2, E)], [2], 0.0, seed=0)
    if fail_on_sample:
        def sample():
            raise ValueError("a sampler bug")
        mixer.sample = sample
    return PrefetchedBatches(DirectBatches(mixer, torch.device("cpu")), threads=1, per_round=1, buffer_size=2,
                             writer_queue_size=4, discarding_strategy="keep_latest")


def raised(call):
    try:
        call()
    except RuntimeError as err:
        return err
    return None


def test_a_thread_that_fails_hands_its_error_to_the_learner():
    """Catches a thread whose exception is only logged: next_ready() would keep answering
    "nothing yet" and put() keep accepting rollouts while no batch ever comes."""
    healthy = prefetched(fail_on_sample=False)
    try:
        healthy.put_rollout(rollout(), 0)
        assert wait_for(lambda: healthy.next_ready() is not None, 60), "a healthy source never gave a batch"
    finally:
        healthy.close()
    batches = prefetched(fail_on_sample=True)
    try:
        batches.put_rollout(rollout(), 0)
        assert wait_for(lambda: raised(batches.next_ready) is not None, 60), "the thread's error never reached next_ready"
        error = raised(batches.next_ready)
        assert "batch preparation failed" in str(error) and isinstance(error.__cause__, ValueError)
        with pytest.raises(RuntimeError, match="batch preparation failed") as put_error:
            batches.put_rollout(rollout(), 1)                     # a rollout arriving later is refused too
        assert str(put_error.value.__cause__) == "a sampler bug"
    finally:
        batches.close()
