"""The replay server's inside (herd/replay/server.py), as plain Python: a rollout goes in as
its environment columns, sample() waits for the pacing (and wakes when a write from
another thread allows a batch), stale priorities are dropped, and a saved state loaded
into a fresh server continues exactly: the same next batches as the original."""
from __future__ import annotations

import threading
import time

import numpy as np

from herd.algos import trajectory_layout
from herd.algos.apex import APEX
from herd.learner.batches import DirectBatches
from herd.replay.mixer import ReplayMixer
from herd.replay.registry import build_replay
from herd.replay.server import ReplayService
from herd.replay.spec import parse_replay_parameters

T, E = 4, 3
LAYOUT = trajectory_layout(APEX, T, (2,), "float32", 2, 8)
SPEC = parse_replay_parameters('[{"type": "prioritized", "capacity": 6, "sample_ratio": 1}]')[0]


def mixer(seed: int = 0) -> ReplayMixer:
    replay = build_replay(SPEC, LAYOUT, 8, E, n_step=2, anneal_rounds_base=50, seed=seed)
    return ReplayMixer([replay], [8], fill_in_factor=0.5, seed=seed, replay_ratio=2.0)


def rollout(tag: int) -> dict:
    """field -> [time, E, ...]: column e of rollout `tag` has observations 100 (E tag + e) + t."""
    views = {name: np.zeros((shape[0], E, *shape[1:]), dtype) for name, (shape, dtype) in LAYOUT.fields().items()}
    ids = E * tag + np.arange(E)
    views["obs"][:] = (100 * ids[None, :] + np.arange(T + 1)[:, None])[..., None]
    views["reward"][:] = ids[None, :] + 0.5 * np.arange(T)[:, None]
    views["priority"][:] = 1.0 + np.arange(T)[:, None] + ids[None, :]
    for array in views.values():
        array.flags.writeable = False            # as Ray hands them to the server
    return views


def test_a_rollout_is_stored_as_its_columns_and_counted():
    service, reference = ReplayService(mixer()), mixer()
    for tag in range(2):
        assert service.add_rollout(rollout(tag), version=tag) == T * E
        for e in range(E):
            reference.add({name: array[:, e] for name, array in rollout(tag).items()}, tag)
    sequence, batch, _ = service.sample(timeout=0.0)
    expected = reference.sample()
    assert sequence == 0
    for name, array in expected.data.items():
        np.testing.assert_array_equal(batch.data[name], array, err_msg=name)
    stats = service.stats()
    assert stats["rollouts"] == 2 and stats["transitions"] == 2 * T * E and stats["batches"] == 1
    assert stats["rollout_bytes"] == 2 * sum(a.nbytes for a in rollout(0).values()) and stats["batch_bytes"] > 0


def test_sample_waits_for_the_pacing_and_wakes_on_a_write_from_another_thread():
    service = ReplayService(mixer())
    started = time.monotonic()
    assert service.sample(timeout=0.05) == (-1, None, False)              # empty: nothing to draw
    assert time.monotonic() - started >= 0.05
    answers = []
    waiter = threading.Thread(target=lambda: answers.append(service.sample(timeout=60.0)))
    waiter.start()
    service.add_rollout(rollout(0), 0)                              # 12 transitions: the fill-in of 12
    waiter.join(30.0)
    assert not waiter.is_alive() and answers[0][0] == 0 and answers[0][1] is not None
    # 12 transitions added at 2 samples each pay for 3 batches of 8; the first is taken.
    assert [service.sample(timeout=0.0)[0] for _ in range(3)] == [1, 2, -1]


def test_priorities_of_overwritten_trajectories_are_dropped():
    """Catches a server that applies a priority to whatever now sits in an overwritten
    slot (stale 0) or drops every update (stale 8): which rows are stale is read from the
    batch's own observations (100 * column id + t), not from the server's counters."""
    service = ReplayService(mixer())
    service.add_rollout(rollout(0), 0)
    service.add_rollout(rollout(1), 1)
    _, batch, _ = service.sample(timeout=0.0)
    assert service.update(batch.keys, np.full(8, 2.0)) == 8          # nothing overwritten yet: all apply
    assert service.stats()["stale_priority_updates"] == 0
    service.add_rollout(rollout(2), 2)                              # capacity 6: rollout 0's columns 0-2 go
    column_ids = batch.data["obs"][0, :, 0] // 100                  # [B]: the column each row came from
    overwritten = int((column_ids < E).sum())
    assert 0 < overwritten < 8, column_ids                          # seed 0 draws from both rollouts
    assert service.update(batch.keys, np.full(8, 9.0)) == 8 - overwritten
    assert service.stats()["stale_priority_updates"] == overwritten
    service.add_rollout(rollout(3), 3)                              # now rollout 1's columns go too: all stale
    assert service.update(batch.keys, np.full(8, 9.0)) == 0
    assert service.stats()["stale_priority_updates"] == overwritten + 8


def test_a_saved_state_continues_exactly_in_a_fresh_server():
    original = ReplayService(mixer(seed=1))
    for tag in range(3):
        original.add_rollout(rollout(tag), tag)
        _, batch, _ = original.sample(timeout=0.0)
        original.update(batch.keys, np.linspace(0.1, 5.0, 8) * (tag + 1))
    state, drawn = original.state_dict()
    assert drawn == 3
    copy = ReplayService(mixer(seed=99))                            # another seed: the state must bring its own
    copy.load_state_dict(state)
    assert copy.stats()["loaded_trajectories"] == 6
    for service in (original, copy):
        service.add_rollout(rollout(7), 7)
    for _ in range(3):                                              # 12 new transitions pay for 3 batches
        (_, a, _), (_, b, _) = original.sample(timeout=0.0), copy.sample(timeout=0.0)
        assert a is not None and b is not None
        for name in a.data:
            np.testing.assert_array_equal(a.data[name], b.data[name], err_msg=name)
        np.testing.assert_array_equal(a.probabilities, b.probabilities)


def test_the_ratio_holds_both_ways_a_lagging_learner_is_told_to_train_first():
    """replay_ratio 2 at batch 8: a batch per 4 transitions added. Once the replay is warmed
    up, a learner LAG_BATCHES (4) batches behind (16 transitions of credit) lags until it
    has drawn enough; a saved state keeps the credit, so a resumed learner lags as well."""
    service = ReplayService(mixer())
    service.add_rollout(rollout(0), 0)                   # 12 transitions: warmed up, 3 batches due
    assert not service.mixer.lagging() and DirectBatches(service.mixer, None).has_room()
    assert service.sample(timeout=0.0)[2] is False       # credit 12 -> 8
    service.add_rollout(rollout(1), 1)                   # 20: 5 batches due, 4 or more: lagging
    assert service.mixer.lagging() and not DirectBatches(service.mixer, None).has_room()
    state, _ = service.state_dict()
    assert [service.sample(timeout=0.0)[2] for _ in range(2)] == [True, False]   # 16 (4 due), 12 (3)
    assert DirectBatches(service.mixer, None).has_room()
    restored = ReplayService(mixer())
    restored.load_state_dict(state)
    assert restored.mixer.lagging() and restored.sample(timeout=0.0)[2] is True


def test_during_the_warm_up_the_learner_never_lags():
    service = ReplayService(ReplayMixer([build_replay(SPEC, LAYOUT, 8, E, n_step=2, anneal_rounds_base=50, seed=0)],
                                        [8], fill_in_factor=1.0, seed=0, replay_ratio=8.0))   # fill: 24 transitions
    service.add_rollout(rollout(0), 0)                   # 12: 12 batches of credit, but not warmed up
    assert not service.mixer.lagging() and service.sample(timeout=0.0)[1] is None
    service.add_rollout(rollout(1), 1)
    assert service.mixer.lagging()


def test_with_a_queue_the_learner_never_lags():
    queue = build_replay(parse_replay_parameters('[{"type": "queue", "capacity": 2, "sample_ratio": 1}]')[0],
                         LAYOUT, 2, E, n_step=2, anneal_rounds_base=50, seed=0)
    fed = ReplayMixer([queue], [2], fill_in_factor=0.5, seed=0)
    for tag in range(3):
        for column in range(E):
            fed.add({name: array[:, column] for name, array in rollout(tag).items()}, tag)
        assert not fed.lagging()
