"""Checkpoints: written atomically, loaded without unpickling code, versioned.

A checkpoint is a dict of tensors and plain Python values only, so it loads with
`torch.load(weights_only=True)`. numpy arrays (replay contents, RNG state) are stored as
tensors and turned back on load. Writing goes to a temporary file in the same folder,
which is fsync'ed and then renamed over the final name: a kill at any instant leaves
either the old file or the new one, never a torn one.

Since format version 2 a checkpoint also carries a SHA-256 of its contents, which loading
recomputes: torch reads tensor records without checking the zip's CRCs, so flipped bytes
inside a weight would otherwise load as silently wrong numbers."""
from __future__ import annotations

import hashlib
import os
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

from herd.checkpoint_state import check_session_state
from herd.errors import CheckpointError
from herd.files import fsync_dir
from herd.inputs import excerpt

FORMAT_VERSION = 2
# Version 1 (no checksum) is still read, unverified: refusing it would strand every agent
# saved in that format, and such a file is no likelier to be corrupt than it was when it
# loaded fine. A version 2 file without its checksum is refused.
UNVERIFIED_VERSION = 1
CHECKPOINT_DIR = "checkpoints"
NAME_PATTERN = re.compile(r"^ckpt_(\d+)\.pt$")
TEMP_PATTERN = re.compile(r"^\.ckpt_\d+\.pt\.tmp-(\d+)$")   # what save_atomic writes before its rename



def to_storable(value: Any) -> Any:
    """numpy arrays -> tensors (tagged), recursively, so weights_only loading accepts them."""
    if isinstance(value, np.ndarray):
        return {"__ndarray__": torch.from_numpy(np.ascontiguousarray(value)), "dtype": str(value.dtype)}
    if isinstance(value, dict):
        return {k: to_storable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_storable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


# The numpy dtypes to_storable can write: those torch.from_numpy takes. A tag is applied
# only when it names the tensor's own dtype, so loading never converts (a crafted tag like
# "U100000000" once asked numpy for 24 GiB from a 2 KB file).
STORED_DTYPES = frozenset({"bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
                           "float16", "float32", "float64", "complex64", "complex128"})
# Bounds of the tree a checkpoint may hold: herd writes trees about 8 deep, and never the
# same list or dict twice (to_storable builds fresh containers); a pickle can, so that a
# small file walks as an exponential tree (a "billion laughs" of references).
MAX_DEPTH = 64


def from_storable(value: Any) -> Any:
    """to_storable's inverse, for a state check_tree passed: tagged tensors become the
    numpy arrays they were (no copy), refusing any tag or layout herd does not write."""
    if isinstance(value, dict):
        if "__ndarray__" in value:
            return stored_array(value)
        return {k: from_storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_storable(v) for v in value]
    return value


def stored_array(value: dict) -> np.ndarray:
    tensor, tag = value["__ndarray__"], value.get("dtype")
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu" or tag not in STORED_DTYPES:
        raise CheckpointError(f"holds an array tagged {str(tag)[:40]!r}, which herd does not write")
    # What to_storable wrote: a whole contiguous buffer, whose bytes are its elements'.
    exact = (tensor.is_contiguous() and tensor.storage_offset() == 0
             and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size())
    try:
        array = tensor.numpy()
    except (TypeError, RuntimeError):         # bfloat16 and other types numpy lacks
        array = None
    if not exact or array is None or array.dtype != np.dtype(tag):
        raise CheckpointError(f"holds an array tagged {tag} whose stored data is {tensor.dtype} of shape "
                              f"{tuple(tensor.shape)[:8]}: herd does not write that")
    return array


def check_tree(state: Any) -> None:
    """Refuses (CheckpointError, message without the path) a tree deeper than MAX_DEPTH or
    holding one container twice, before any recursive walk, and any tensor whose layout
    herd does not write (check_layout), before the checksum copies one; walks iteratively."""
    seen: set[int] = set()
    stack = [(state, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, torch.Tensor):
            check_layout(value)
            continue
        if not isinstance(value, (dict, list, tuple)):
            continue
        if depth > MAX_DEPTH:
            raise CheckpointError(f"nests containers more than {MAX_DEPTH} deep: herd does not write that")
        if id(value) in seen:
            raise CheckpointError("holds the same container twice: herd does not write that")
        seen.add(id(value))
        items = value.values() if isinstance(value, dict) else value
        if isinstance(value, dict) and not all(isinstance(k, (str, int)) for k in value):
            raise CheckpointError("has a dict key that is neither text nor a number: herd does not write that")
        stack.extend((item, depth + 1) for item in items)


def check_layout(tensor: torch.Tensor) -> None:
    """A tensor whose elements each have their own bytes inside its storage: a dense strided
    tensor, no stride 0 on a dimension of more than one element, no two elements at one
    address, nothing addressed past the storage's end. Checked on shape, strides and
    offset alone, before any copy: the checksum (and numpy) make a tensor contiguous, and a
    4-byte storage seen as shape (10**10,) with stride 0 asked for 40 GB."""
    shown = f"a tensor of shape {tuple(tensor.shape)[:8]} with strides {tuple(tensor.stride())[:8]}" \
        if tensor.layout == torch.strided else f"a {tensor.layout} tensor"
    if tensor.layout != torch.strided:
        raise CheckpointError(f"holds {shown}: herd does not write that")
    if tensor.numel() == 0:
        return
    dims = sorted((stride, size) for size, stride in zip(tensor.shape, tensor.stride()) if size > 1)
    reach = 0                                  # the farthest element offset the smaller strides address
    for stride, size in dims:
        if stride <= reach:                    # stride 0, or a step that lands on an element already addressed
            raise CheckpointError(f"holds {shown}, whose elements overlap: herd does not write that")
        reach += (size - 1) * stride
    needed = (tensor.storage_offset() + reach + 1) * tensor.element_size()
    if tensor.storage_offset() < 0 or needed > tensor.untyped_storage().nbytes():
        raise CheckpointError(f"holds {shown} addressing {needed:,} bytes of a "
                              f"{tensor.untyped_storage().nbytes():,}-byte storage: herd does not write that")


def checksum(state: Any) -> str:
    """SHA-256 over a canonical walk of a storable state: dict keys in order, containers'
    lengths, scalars by type and repr, and each tensor's dtype, shape and raw bytes, hashed
    in one pass over its memory (replays in checkpoints can be hundreds of MB)."""
    digest = hashlib.sha256()

    def walk(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            digest.update(f"T{value.dtype}{tuple(value.shape)}:".encode())
            tensor = value.detach().cpu()        # no copy when already on the CPU
            if tensor.dtype == torch.bfloat16:
                tensor = tensor.view(torch.int16)   # numpy has no bfloat16; the same bytes
            # The array's buffer itself, in one pass (a copy only for a non-contiguous view).
            digest.update(np.ascontiguousarray(tensor.numpy()))
        elif isinstance(value, dict):
            digest.update(f"D{len(value)}:".encode())
            for key, item in value.items():
                digest.update(f"{key!r}=".encode())
                walk(item)
        elif isinstance(value, (list, tuple)):   # to_storable made tuples lists; the walk treats them alike
            digest.update(f"L{len(value)}:".encode())
            for item in value:
                walk(item)
        else:                                    # None, bool, int, float, str, torch.dtype...
            digest.update(f"{type(value).__name__}:{value!r};".encode())

    walk(state)
    return digest.hexdigest()


def remove_stale_temp_files(folder: Path) -> None:
    """Deletes the half-written temp files of saves that were killed (kill -9, power loss).

    A run folder has one writer, and its saves are sequential, so a temp file named with
    this process's PID is not being written now: it is a dead process's whose PID we got
    again (usual in containers, where PIDs restart small). A temp file of another live PID
    is kept: it may be a save in progress that its rename still needs, and keeping a stale
    one (a reused PID) costs only disk until a later save. Runs before our own write, so a
    large replay's leftovers free their space first."""
    if not folder.is_dir():
        return
    for path in folder.iterdir():
        match = TEMP_PATTERN.match(path.name)
        if match and (int(match.group(1)) == os.getpid() or not pid_alive(int(match.group(1)))):
            path.unlink(missing_ok=True)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:                      # alive, another user's
        return True
    return True


def save_atomic(state: dict, path: Path) -> None:
    """Writes `state` with its checksum (see `checksum`) under the "checksum" key."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    storable = to_storable(state)
    storable["checksum"] = checksum(storable)
    try:
        with open(tmp, "wb") as f:
            torch.save(storable, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def save_checkpoint(state: dict, run_dir: Path, update: int, keep: int = 3) -> Path:
    """Saves `ckpt_<update>.pt` in the run's checkpoint folder and keeps the newest `keep`."""
    state = {**state, "format_version": FORMAT_VERSION}
    folder = run_dir / CHECKPOINT_DIR
    path = folder / f"ckpt_{update:010d}.pt"
    remove_stale_temp_files(folder)
    save_atomic(state, path)
    for old in list_checkpoints(folder)[keep:]:
        old.unlink(missing_ok=True)
    return path


def list_checkpoints(folder: Path) -> list[Path]:
    """Checkpoint files of a folder, newest first."""
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if NAME_PATTERN.match(p.name)]
    return sorted(found, key=lambda p: int(NAME_PATTERN.match(p.name).group(1)), reverse=True)


def find_checkpoint(url: str | os.PathLike) -> Path:
    """A checkpoint file, or a run folder (its newest checkpoint)."""
    path = Path(url)
    if not path.exists():
        raise CheckpointError(f"--load_model_url '{url}' does not exist")
    if path.is_file():
        return path
    for folder in (path / CHECKPOINT_DIR, path):
        found = list_checkpoints(folder)
        if found:
            return found[0]
    if (path / "config.json").exists():   # a run folder: killed (kill -9, power loss) before its first save
        raise CheckpointError(f"run folder '{url}' has no checkpoint: the run ended before its first save, so there "
                              "is nothing to resume (start a new run with herd train)")
    raise CheckpointError(f"--load_model_url '{url}' is a folder with no checkpoint (expected {CHECKPOINT_DIR}/ckpt_*.pt)")


def load_checkpoint(url: str | os.PathLike) -> tuple[dict, Path]:
    """The checkpoint at `url` (a file, or a run folder's newest), verified: a CheckpointError
    with one line for anything herd did not write, including sizes that cannot be met."""
    path = find_checkpoint(url)
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; a cut or foreign file is not one
        raise CheckpointError(f"checkpoint '{path}' is truncated or corrupt (not a torch checkpoint archive)")
    size, available = path.stat().st_size, psutil.virtual_memory().available
    if size > available:              # loading holds the whole file in memory (torch reads every record)
        raise CheckpointError(f"checkpoint '{path}' is {size / 2**30:.1f} GiB, more than the {available / 2**30:.1f} "
                              "GiB of memory available: free memory, or load it on a larger machine")
    try:
        check_records(path)
        state = read_archive(path)
        check_tree(state)
        check_version(state, path)
        state = from_storable(state)
    except CheckpointError as err:
        if str(err).startswith("checkpoint '"):
            raise
        raise CheckpointError(f"checkpoint '{path}' {err}") from None
    except (MemoryError, RecursionError) as err:
        raise CheckpointError(f"checkpoint '{path}' asks for more than this machine can give "
                              f"({type(err).__name__}): herd does not write that") from None
    return state, path


def check_records(path: Path) -> None:
    """torch.save stores every record of its zip archive uncompressed, so the records'
    sizes add up to at most the file's: a compressed record (a zip bomb: a few KB that
    inflate to gigabytes while torch reads them) is refused before anything is read."""
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        raise CheckpointError(f"is truncated or corrupt ({type(err).__name__})") from None
    for record in records:
        if record.compress_type != zipfile.ZIP_STORED:
            raise CheckpointError(f"holds a compressed record ({excerpt(record.filename)}): torch.save stores "
                                  "records uncompressed, so herd did not write that")
    if sum(record.file_size for record in records) > size:
        raise CheckpointError(f"declares records larger than its {size} bytes: herd does not write that")


def read_archive(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as err:
        reason = " ".join(str(err).split())[:120] if str(err) else type(err).__name__
        raise CheckpointError(f"checkpoint '{path}' is truncated or corrupt ({reason})") from None
    except MemoryError:
        raise
    except Exception as err:  # an unpickling refusal: the file holds more than weights
        raise CheckpointError(f"checkpoint '{path}' cannot be loaded safely ({type(err).__name__})") from None


def check_version(state: Any, path: Path) -> None:
    """A format version herd reads, and for version 2 the checksum (popped from `state`)."""
    if not isinstance(state, dict) or "format_version" not in state:
        raise CheckpointError(f"'{path}' is not a herd checkpoint")
    version = state["format_version"]
    if type(version) is not int or version not in (UNVERIFIED_VERSION, FORMAT_VERSION):
        raise CheckpointError(f"checkpoint '{path}' has format version {str(version)[:20]}, "
                              f"this herd reads versions {UNVERIFIED_VERSION} and {FORMAT_VERSION}")
    if version == FORMAT_VERSION:
        saved = state.pop("checksum", None)      # it was added after the digest was taken
        if saved is None:
            raise CheckpointError(f"checkpoint '{path}' has no checksum (format version {version} always has one)")
        if saved != checksum(state):
            raise CheckpointError(f"checkpoint '{path}' is corrupt: its contents do not match their checksum")


# The parts a run reads first (prepare(), test mode), and their types; the session's parts
# are herd.checkpoint_state's to check (check_session_parts), also before any run folder.
PARTS = {"config": dict, "env_spec": dict, "model_signature": dict, "model": dict}


def check_parts(state: dict, path: Path) -> None:
    """A loaded state has what a run reads first, of the types herd writes (one line if not)."""
    problem = None
    for name, kind in PARTS.items():
        if not isinstance(state.get(name), kind):
            problem = f"has no {name} ({kind.__name__})"
            break
    else:
        missing = [key for key in ("env", "obs_shape", "obs_dtype", "num_actions") if key not in state["env_spec"]]
        if missing:
            problem = f"has no {', '.join(missing)} in its env_spec"
        elif not all(isinstance(v, torch.Tensor) for v in state["model"].values()):
            problem = "holds a model entry that is not a tensor"
        elif not all(isinstance(k, str) for k in state["config"]):
            problem = "holds a config option whose name is not text"
    if problem:
        raise CheckpointError(f"checkpoint '{path}' {problem}: not a checkpoint herd wrote")


def check_session_parts(state: dict, path: Path, resuming: bool) -> None:
    """herd.checkpoint_state.check_session_state, its one line naming the checkpoint."""
    try:
        check_session_state(state, resuming)
    except CheckpointError as err:
        raise CheckpointError(f"checkpoint '{path}' {err}") from None


def check_compatible(state: dict, env_spec: dict, model_signature: dict, path: Path) -> None:
    """Refuses a checkpoint made for another environment or another network."""
    try:
        compare_with_run(state, env_spec, model_signature, path)
    except CheckpointError:
        raise
    except (TypeError, ValueError, KeyError) as err:     # a crafted env_spec or signature
        raise CheckpointError(f"checkpoint '{path}' has an env_spec or model_signature herd does not write "
                              f"({type(err).__name__})") from None


def compare_with_run(state: dict, env_spec: dict, model_signature: dict, path: Path) -> None:
    saved_env = state["env_spec"]
    for key in ("obs_shape", "obs_dtype", "num_actions"):
        if list(np.atleast_1d(saved_env[key])) != list(np.atleast_1d(env_spec[key])):
            raise CheckpointError(
                f"checkpoint '{path}' was made for {excerpt(saved_env['env'])} ({key} {excerpt(saved_env[key])}), "
                f"not {env_spec['env']} ({key} {env_spec[key]})")
    saved_signature = {k: list(v) for k, v in state["model_signature"].items()}
    signature = {k: list(v) for k, v in model_signature.items()}
    if saved_signature != signature:
        # The first tensor that differs says how (a changed layer of a newer herd, another size).
        name = next(k for k in [*signature, *saved_signature] if saved_signature.get(k) != signature.get(k))
        raise CheckpointError(f"checkpoint '{path}' holds another network ({excerpt(state['config'].get('network'))} "
                              f"with {len(saved_signature)} tensors) than the one configured: {excerpt(name)} is "
                              f"{excerpt(saved_signature.get(name, 'absent'))} there, {signature.get(name, 'absent')} here")
