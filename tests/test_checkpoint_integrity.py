"""Checkpoint integrity: the checksum that loading verifies, and the temp files of killed saves."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from herd_testing import corrupt_first_weight
from herd.checkpoint import (CHECKPOINT_DIR, CheckpointError, checksum, find_checkpoint, list_checkpoints,
                             load_checkpoint, save_checkpoint)


def small_state():
    torch.manual_seed(0)
    return {"model": {"layer.weight": torch.randn(16, 16), "layer.bias": torch.randn(16)},
            "counters": {"updates": 7, "wall_time": 1.5},
            "replay": {"obs": np.arange(40, dtype=np.uint8).reshape(4, 10)},
            "config": {"env": "CartPole-v1", "hidden_sizes": [64, 64]}}


def test_a_saved_checkpoint_loads_back(tmp_path):
    save_checkpoint(small_state(), tmp_path, update=1)
    state, _ = load_checkpoint(tmp_path)
    torch.testing.assert_close(state["model"]["layer.weight"], small_state()["model"]["layer.weight"])
    np.testing.assert_array_equal(state["replay"]["obs"], small_state()["replay"]["obs"])
    assert "checksum" not in state                          # verified and dropped: not part of the run's state


def test_flipped_tensor_bytes_are_refused(tmp_path):
    path = save_checkpoint(small_state(), tmp_path, update=1)
    corrupt_first_weight(path)
    # The corruption is real and torch alone does not notice it: the weight loads, changed.
    raw = torch.load(path, map_location="cpu", weights_only=True)
    assert not torch.equal(raw["model"]["layer.weight"], small_state()["model"]["layer.weight"])
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    assert str(err.value) == f"checkpoint '{path}' is corrupt: its contents do not match their checksum"


def test_a_checksum_covers_keys_values_dtypes_and_shapes():
    weight = torch.arange(12, dtype=torch.float32)
    base = checksum({"w": weight, "n": 1})
    assert checksum({"w": weight.clone(), "n": 1}) == base
    for changed in ({"v": weight, "n": 1}, {"w": weight, "n": 2}, {"w": weight.reshape(3, 4), "n": 1},
                    {"w": weight.view(torch.int32), "n": 1}, {"w": weight + 1, "n": 1}):
        assert checksum(changed) != base, changed
    # bfloat16 has no numpy type; its bytes are hashed all the same.
    half = torch.ones(4, dtype=torch.bfloat16)
    assert checksum({"w": half}) != checksum({"w": half * 2})


def test_a_current_checkpoint_without_its_checksum_is_refused(tmp_path):
    path = save_checkpoint(small_state(), tmp_path, update=1)
    state = torch.load(path, weights_only=True)
    del state["checksum"]
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="has no checksum"):
        load_checkpoint(path)


def test_a_version_1_checkpoint_from_before_checksums_still_loads(tmp_path):
    path = tmp_path / "old.pt"
    torch.save({"format_version": 1, "model": {"w": torch.ones(3)}}, path)
    state, _ = load_checkpoint(path)
    assert torch.equal(state["model"]["w"], torch.ones(3))


def dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_save_removes_the_temp_files_of_killed_saves_only(tmp_path):
    folder = tmp_path / CHECKPOINT_DIR
    folder.mkdir()
    stale = [folder / f".ckpt_0000000009.pt.tmp-{dead_pid()}",
             folder / f".ckpt_0000000008.pt.tmp-{os.getpid()}"]    # ours, while no save of ours is running
    in_progress = folder / f".ckpt_0000000009.pt.tmp-{os.getppid()}"  # a live process's: maybe still writing
    unrelated = folder / "notes.txt"
    for path in (*stale, in_progress, unrelated):
        path.write_bytes(b"half a checkpoint")

    # Before any save: a newer-numbered temp file is never taken for a checkpoint.
    assert list_checkpoints(folder) == []
    with pytest.raises(CheckpointError, match="no checkpoint"):
        find_checkpoint(tmp_path)
    saved = save_checkpoint(small_state(), tmp_path, update=2)
    assert find_checkpoint(tmp_path) == saved and list_checkpoints(folder) == [saved]

    assert not any(path.exists() for path in stale)
    assert in_progress.exists() and unrelated.exists()
    assert sorted(p.name for p in folder.iterdir()) == sorted([saved.name, in_progress.name, unrelated.name])


def test_a_save_keeps_the_newest_checkpoints_by_update_not_by_name(tmp_path):
    """Catches retention that keeps every checkpoint (the disk fills in a long run), deletes
    the newest, or orders by file name or time instead of update, and a foreign file in
    the checkpoint folder taken for a checkpoint or deleted."""
    folder = tmp_path / CHECKPOINT_DIR
    folder.mkdir()
    (folder / "notes.txt").write_text("the user's")                    # not ours: never read nor deleted
    (folder / "ckpt_best.pt").write_bytes(b"x")
    for update in (9, 10, 100, 11, 2):                                  # out of order on purpose
        save_checkpoint({**small_state(), "counters": {"updates": update}}, tmp_path, update=update, keep=3)
    assert [p.name for p in list_checkpoints(folder)] == [f"ckpt_{u:010d}.pt" for u in (100, 11, 10)]
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["notes.txt", "ckpt_best.pt"] + [f"ckpt_{u:010d}.pt" for u in (10, 11, 100)])
    state, path = load_checkpoint(tmp_path)
    assert path.name == f"ckpt_{100:010d}.pt" and state["counters"]["updates"] == 100


def test_a_checkpoint_of_an_unknown_format_version_is_refused(tmp_path):
    """Catches a loader that reads a format it does not know (a newer herd's file, whose
    keys may mean other things) instead of refusing it in one line."""
    path = save_checkpoint(small_state(), tmp_path, update=1)
    state = torch.load(path, weights_only=True)
    state["format_version"] = 3
    state.pop("checksum")
    state["checksum"] = checksum(state)                                # a well-formed file, only newer
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="has format version 3, this herd reads versions 1 and 2"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("content", [{"model": {"w": torch.zeros(2)}}, [1, 2, 3], torch.zeros(3)])
def test_a_torch_file_that_is_no_herd_checkpoint_is_refused(tmp_path, content):
    """Catches a foreign torch file (someone else's weights, a tensor) loaded as a herd
    checkpoint and failing later with a KeyError instead of one line."""
    path = tmp_path / "foreign.pt"
    torch.save(content, path)
    with pytest.raises(CheckpointError, match="is not a herd checkpoint"):
        load_checkpoint(path)


def test_another_network_is_refused_naming_the_first_tensor_that_differs():
    """Catches a refusal that leaves the user guessing what differs: a checkpoint of an MLP
    with an LSTM core from before the value skip (its value head read 64 inputs, now 128)
    must name that tensor and both shapes; a tensor the run lacks is named as absent here."""
    from pathlib import Path
    from herd.checkpoint import check_compatible
    env = {"env": "CartPole-v1", "obs_shape": [4], "obs_dtype": "float32", "num_actions": 2}
    here = {"torso.0.weight": [64, 4], "heads.value.weight": [1, 128]}
    saved = {"env_spec": env, "config": {"network": "auto"},
             "model_signature": {"torso.0.weight": [64, 4], "heads.value.weight": [1, 64]}}
    with pytest.raises(CheckpointError) as caught:
        check_compatible(saved, env, here, Path("old.pt"))
    assert str(caught.value).endswith("heads.value.weight is [1, 64] there, [1, 128] here"), caught.value
    saved["model_signature"] = {**here, "core.weight": [8, 8]}
    with pytest.raises(CheckpointError) as caught:
        check_compatible(saved, env, here, Path("old.pt"))
    assert str(caught.value).endswith("core.weight is [8, 8] there, absent here"), caught.value
    check_compatible({**saved, "model_signature": here}, env, here, Path("old.pt"))     # the same network loads


def test_the_counter_names_checked_are_the_sessions_counters():
    import dataclasses

    from herd.checkpoint_state import COUNTER_KEYS
    from herd.learner.session import Counters
    assert tuple(f.name for f in dataclasses.fields(Counters)) == COUNTER_KEYS


def test_counters_never_set_a_name_that_is_not_a_counter():
    from herd.learner.session import Counters
    counters = Counters(env_steps=5)
    counters.load_state_dict({"updates": 3, "__dict__": {"env_steps": 0}})
    assert (counters.env_steps, counters.updates) == (5, 3)
