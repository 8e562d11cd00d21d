"""A batch mixed from several replays is read once (herd/replay/mixer.py join_parts,
herd/store.py Gather): each replay's share is a set of positions, and one gather per
share writes its frames straight into the batch, instead of a read per share and then
their join. Counted (tests/copy_counting.py) on host stores, plain and LZ4-packed, with
the right columns in the right order; the negative control joins read shares as before
and counts one copy more."""
from __future__ import annotations

import numpy as np
import pytest

import copy_counting
import herd.replay.mixer as mixer_module
from copy_counting import CopyCounter, ObsArray, TorchCopies, numpy_wrapped
from herd.algos.impala import impala_layout
from herd.replay.mixer import ReplayMixer, concat_columns
from herd.replay.registry import build_replay
from herd.replay.spec import parse_replay_parameters
from herd.store import read_now

OBS = (4, 6, 5)
LAYOUT = impala_layout(unroll_length=3, obs_shape=OBS, obs_dtype="uint8", num_actions=3, feature_size=4)
E = 4
SPECS = parse_replay_parameters('[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, '
                                '{"type": "standard", "capacity": 12, "sample_ratio": 0.5}]')
SHARES = [2, 2]


def mixer(compress: bool) -> ReplayMixer:
    replays = [build_replay(spec, LAYOUT, share, E, compress=compress and not spec.on_policy)
               for spec, share in zip(SPECS, SHARES)]
    return ReplayMixer(replays, SHARES, fill_in_factor=0.0, seed=0)


def filled(m: ReplayMixer, marks) -> None:
    for mark in marks:
        views = {name: np.zeros((shape[0], E, *shape[1:]), dtype) for name, (shape, dtype) in LAYOUT.fields().items()}
        for e in range(E):
            views["obs"][:, e] = 10 * mark + e
            views["action"][:, e] = mark
        m.add_rollout(views, version=mark)


def old_join(parts: list, lent: bool) -> dict:
    """The join before Gather: every share read on its own, then joined (the reads'
    frames followed as ObsArray, as numpy's reads of the storage returned them)."""
    parts = [read_now(part) for part in parts]
    parts = [{**part, "obs": part["obs"].view(ObsArray)} for part in parts]
    return {name: concat_columns([part[name] for part in parts]) for name in parts[0]}


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "lz4"])
@pytest.mark.parametrize("join", ["gather", "old"])
def test_a_mixed_batch_is_read_once_into_the_batch(compress, join, monkeypatch):
    m = mixer(compress)
    filled(m, [2])                          # frames 20 .. 23, actions 2
    for replay in m.replays:
        if "obs" in replay.storage.arrays:
            replay.storage.arrays["obs"] = replay.storage.arrays["obs"].view(ObsArray)
    if join == "old":
        monkeypatch.setattr(mixer_module, "join_parts", old_join)
    counter = CopyCounter(OBS, np.uint8)
    monkeypatch.setattr(copy_counting, "COUNTER", counter)
    with TorchCopies(counter), numpy_wrapped(monkeypatch, counter):
        batch = m.sample()
    obs = np.asarray(batch.data["obs"])                                  # [T+1, 4, ...]
    # The columns: the queue's two oldest first, then the uniform replay's two.
    assert [int(obs[0, b].flat[0]) for b in range(2)] == [20, 21]
    assert list(batch.replayed) == [False, False, True, True]
    for b in range(4):
        column = obs[:, b]
        assert (column == column.flat[0]).all()
        assert (batch.data["action"][:, b] == int(column.flat[0]) // 10).all()
    copies = counter.bytes / obs.nbytes
    if compress:
        # The packed share is unpacked into the batch (not a counted op): the queue's half
        # is gathered once; the old join copies the batch once more, whole.
        assert copies == (0.5 if join == "gather" else 1.5), sorted(counter.by_op.items())
    else:
        assert copies == (1 if join == "gather" else 2), sorted(counter.by_op.items())
