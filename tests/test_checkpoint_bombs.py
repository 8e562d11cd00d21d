"""Crafted checkpoints that a valid checksum does not make safe: each loads in a
child process under a 2 GB address-space cap and a deadline, and must end in the one-line
CheckpointError. Loaded without these checks, each of these fails (noted per test): with a
traceback, a MemoryError, or a walk that never ends."""
import io
import struct
import zipfile

import numpy as np
import pytest
import torch

from herd_testing import capped_child
from herd.checkpoint import checksum

ADDRESS_SPACE = 2 * 2**30
DEADLINE_S = 60     # generous for a loaded machine; the refusals take well under a second of work


def write(state: dict, path, version=2, digest=None) -> None:
    """torch.save of `state` as a checkpoint of `version`; for version 2 with the checksum
    herd would compute (or `digest`, where computing it is what the bomb attacks)."""
    state = {**state, "format_version": version}
    if version == 2:
        state["checksum"] = digest if digest is not None else checksum(state)
    torch.save(state, path)


def load_in_child(path) -> str:
    """load_checkpoint(path) in a fresh Python under the cap: its one line of outcome."""
    return capped_child(f"""
        from herd.checkpoint import load_checkpoint
        from herd.errors import CheckpointError
        try:
            load_checkpoint({str(path)!r})
        except CheckpointError as err:
            print("refused:", err)
        else:
            print("loaded")
    """, ADDRESS_SPACE, DEADLINE_S)


def assert_refused(path, words):
    outcome = load_in_child(path)
    assert outcome.startswith("refused:") and words in outcome and "\n" not in outcome, outcome


def tagged(tensor, dtype):
    return {"__ndarray__": tensor, "dtype": dtype}


def test_a_dtype_tag_that_asks_for_gigabytes_is_refused(tmp_path):
    """Before: numpy's astype('U100000000') of a few bytes asked for 24 GiB (MemoryError
    traceback, or the memory taken)."""
    path = tmp_path / "ckpt.pt"
    write({"replay": tagged(torch.zeros(16, dtype=torch.uint8), "U100000000")}, path)
    assert_refused(path, "tagged 'U100000000'")


def test_a_dtype_tag_of_another_item_size_is_refused(tmp_path):
    """Before: 8 uint8 bytes tagged float64 were converted value by value into 8 floats,
    not refused: the tag decided what the array became."""
    path = tmp_path / "ckpt.pt"
    write({"replay": tagged(torch.arange(8, dtype=torch.uint8), "float64")}, path)
    assert_refused(path, "tagged float64 whose stored data is torch.uint8")


def test_a_view_of_a_larger_buffer_is_refused(tmp_path):
    """to_storable writes whole contiguous buffers; a tagged view into a larger storage
    (strided, offset) is not what herd wrote. Before: loaded as a 10-element array."""
    path = tmp_path / "ckpt.pt"
    write({"replay": tagged(torch.arange(100, dtype=torch.int64)[5:15], "int64")}, path)
    assert_refused(path, "herd does not write that")


@pytest.mark.parametrize("bomb", ["stride_0", "overlapping"])
def test_a_tensor_that_addresses_its_bytes_many_times_is_refused_before_any_copy(tmp_path, bomb):
    """4 bytes seen as 10**10 floats (stride 0), or 800 KB seen as a 10**5 x 10**5 matrix
    whose rows overlap (strides 1, 1): each 40 GB once made contiguous. Before: the checksum
    walk made it contiguous, an allocation of 40 GB (under the cap here: a MemoryError, on a
    large machine the memory taken). Now the layout is refused first: the refusal names
    the overlap, not a failed allocation."""
    tensor = (torch.zeros(1).expand(10**10) if bomb == "stride_0"
              else torch.arange(200_000, dtype=torch.float32).as_strided((100_000, 100_000), (1, 1)))
    path = tmp_path / "ckpt.pt"
    write({"model": {"w": tensor}}, path, digest="0" * 64)     # a true digest would take the same 40 GB
    assert_refused(path, "whose elements overlap")
    assert "asks for more than" not in load_in_child(path)


def test_honest_tensor_layouts_pass_the_layout_check():
    """What torch.save keeps of what herd saves: contiguous tensors, transposes, views
    inside their storage, size-1 dimensions with any stride, empty and 0-d tensors."""
    from herd.checkpoint import check_layout
    base = torch.arange(24.0).reshape(2, 3, 4)
    for tensor in (base, base.transpose(0, 2), base[1], base[:, 1:, ::2],
                   torch.zeros(1).expand(1, 1), torch.zeros(0, 5), torch.tensor(3.0)):
        check_layout(tensor)


def test_a_tree_of_shared_references_is_refused_without_walking_it(tmp_path):
    """A list holding the same list twice, 60 times over: 2**60 paths from a few hundred
    bytes. Before: the checksum walk never ended."""
    bomb = [1]
    for _ in range(60):
        bomb = [bomb, bomb]
    path = tmp_path / "ckpt.pt"
    write({"config": {}, "bomb": bomb}, path, digest="0" * 64)
    assert_refused(path, "the same container twice")


def pickled_text(text: str) -> bytes:
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def write_deep(path, depth: int) -> None:
    """A version 2 checkpoint whose "deep" entry is lists nested `depth` deep, pickled by
    hand (pickle's own writer recurses and cannot make one; its reader builds it without
    recursion), in the zip layout torch.save writes."""
    nested = b"]" * depth + b"a" * (depth - 1)         # EMPTY_LIST x depth, then APPEND each into the one before
    body = (b"\x80\x02}(" + pickled_text("format_version") + b"K\x02" + pickled_text("checksum")
            + pickled_text("0" * 64) + pickled_text("deep") + nested + b"u.")
    template = io.BytesIO()
    torch.save({}, template)
    with zipfile.ZipFile(io.BytesIO(template.getvalue())) as source, zipfile.ZipFile(path, "w") as target:
        for info in source.infolist():
            target.writestr(info.filename, body if info.filename.endswith("data.pkl") else source.read(info))


def test_deep_nesting_is_refused(tmp_path):
    """Lists nested 100,000 deep. Before: a RecursionError traceback from the checksum walk."""
    path = tmp_path / "ckpt.pt"
    write_deep(path, 100_000)
    assert_refused(path, "nests containers more than 64 deep")


@pytest.mark.parametrize("claim", [torch.tensor(2), 2.0, True, "2", [2]])
def test_a_format_version_that_is_not_an_integer_is_refused(tmp_path, claim):
    """Before: a tensor(2) version passed `in (1, 2)` and `== 2` (elementwise), and the
    file loaded; True passed as version 1 (True == 1), unverified; 2.0 as version 2 ("2"
    and [2] were refused before too: kept so that they stay refused)."""
    path = tmp_path / "ckpt.pt"
    state = {"model": {"w": torch.zeros(2)}, "format_version": claim}
    state["checksum"] = checksum(state)
    torch.save(state, path)
    assert_refused(path, "format version")


def test_an_honest_checkpoint_with_every_stored_dtype_loads(tmp_path):
    """The refusals above must not catch what herd writes: arrays of every dtype it
    stores, empty ones and 0-d ones, round-trip."""
    from herd.checkpoint import STORED_DTYPES, load_checkpoint, save_checkpoint
    arrays = {name: np.arange(6).astype(name).reshape(2, 3) for name in sorted(STORED_DTYPES)}
    arrays["empty"] = np.zeros((0, 4), dtype=np.float32)
    arrays["scalar"] = np.array(3.5)
    save_checkpoint({"replay": arrays}, tmp_path, update=1)
    state, _ = load_checkpoint(tmp_path)
    for name, array in arrays.items():
        assert state["replay"][name].dtype == array.dtype, name
        np.testing.assert_array_equal(state["replay"][name], array)


def test_memory_errors_while_loading_become_the_checkpoint_error(tmp_path, monkeypatch):
    """Any MemoryError while reading becomes the one-line error (before: a traceback)."""
    import herd.checkpoint as checkpoint
    from herd.errors import CheckpointError
    checkpoint.save_checkpoint({"model": {}}, tmp_path, update=1)

    def no_memory(*args, **kwargs):
        raise MemoryError
    monkeypatch.setattr(checkpoint.torch, "load", no_memory)
    with pytest.raises(CheckpointError, match="asks for more than this machine can give"):
        checkpoint.load_checkpoint(tmp_path)


def test_a_model_signature_herd_does_not_write_is_the_checkpoint_error(tmp_path):
    """Before: list(10**12) raised a TypeError traceback in check_compatible."""
    from herd.checkpoint import check_compatible
    from herd.errors import CheckpointError
    env = {"env": "CartPole-v1", "obs_shape": [4], "obs_dtype": "float32", "num_actions": 2}
    state = {"env_spec": env, "model_signature": {"w": 10**12}, "config": {}}
    with pytest.raises(CheckpointError, match="model_signature herd does not write"):
        check_compatible(state, env, {"w": [2, 4]}, tmp_path / "ckpt.pt")
    with pytest.raises(CheckpointError, match="was made for"):      # its own refusals pass through unchanged
        check_compatible({**state, "env_spec": {**env, "obs_shape": [2**40]}}, env, {"w": [2, 4]}, tmp_path)


def recompressed(source, target, compression) -> None:
    """The zip archive `source` rewritten record for record with `compression`."""
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info), compress_type=compression)


def test_a_compressed_record_is_refused_before_it_is_read(tmp_path):
    """A zip bomb: 64 MB of zeros that deflate to about 64 KB, inflated by torch while it
    reads. torch.save stores records uncompressed, so any compressed one is refused before
    torch reads anything. Before: loaded (the 64 MB inflated in memory; a larger one would
    take the machine's memory)."""
    stored, bomb = tmp_path / "stored.pt", tmp_path / "ckpt.pt"
    write({"model": {"w": torch.zeros(16 * 2**20)}}, stored)
    recompressed(stored, bomb, zipfile.ZIP_DEFLATED)
    assert bomb.stat().st_size < stored.stat().st_size / 50
    assert_refused(bomb, "holds a compressed record")
    # The same records stored as torch.save stores them still load.
    recompressed(stored, tmp_path / "restored.pt", zipfile.ZIP_STORED)
    assert "compressed" not in load_in_child(tmp_path / "restored.pt")
