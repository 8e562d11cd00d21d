"""Small files of a run (config.json, summary.json, test_results.json), written atomically
and durably: a reader, or a kill or power loss at any instant, sees the old file or the
new one, never half of one (the data is fsync'ed before the rename, and the folder after,
or a crash could leave the new name pointing at blocks never written).

Writes into a run folder someone else made (`herd export`, `herd plot`, `herd test` write
RUN/export, RUN/plots, RUN/tests) never follow a symbolic link out of it: run_subfolder
refuses a linked subfolder, write_bytes a linked file, and the temporary file is created
new (O_EXCL | O_NOFOLLOW) and renamed over the name, which replaces a link, never writes
through it."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from herd.errors import UserError


class LinkedPathError(UserError):
    """A run folder's subfolder or file is a symbolic link (or not what herd makes there)."""


def run_subfolder(run_dir: Path, name: str) -> Path:
    """run_dir/name, made when missing; refused in one line when it is a symbolic link or
    not a folder (a run folder from someone else could point it anywhere)."""
    folder = Path(run_dir) / name
    try:
        folder.mkdir(exist_ok=True)            # mkdir never follows a link at its last component
    except FileExistsError:
        pass                                   # a file or a dangling link: lstat says which, below
    except OSError as err:
        raise LinkedPathError(f"cannot create '{folder}': {err.strerror or err}") from None
    mode = os.lstat(folder).st_mode
    if stat.S_ISLNK(mode) or not stat.S_ISDIR(mode):
        what = "a symbolic link" if stat.S_ISLNK(mode) else "not a folder"
        raise LinkedPathError(f"'{folder}' is {what}: herd writes only inside the run folder; remove it and retry")
    return folder


def write_bytes(path: Path, data: bytes) -> None:
    """`data` as the file `path`, atomically and durably; a symbolic link (or a folder) at
    `path` is refused in one line, never written through."""
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        what = "a symbolic link" if stat.S_ISLNK(mode) else "not a plain file"
        raise LinkedPathError(f"'{path}' is {what}: herd does not write through it; remove it and retry")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)                # a leftover (or a planted link) goes; unlink never follows
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)                  # replaces a name, never writes through a link
    finally:
        tmp.unlink(missing_ok=True)            # a failed write leaves no temporary file behind
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """Makes a rename in the folder `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, data: dict) -> None:
    write_bytes(path, json.dumps(data, indent=2, default=str).encode())
