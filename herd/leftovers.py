"""herd's private temporary folders (/tmp/herd-ray-*, /tmp/herd-learners-*), made so that a
later herd can tell a dead owner's from a live run's: each holds an `owner` file with the
owning process's PID and start time. A run killed with kill -9 cannot remove its folder;
the next herd to make one sweeps every folder of that prefix whose owner is gone.

A PID alone cannot say "gone": PIDs are reused (quickly, in containers). The start time
of the process now holding that PID can: another process has another start time. A
folder without a readable owner file is left alone unless it is older than a day (an
owner killed between mkdtemp and writing the file), and folders of another user are
never touched (mkdtemp makes them 0700; the sweep checks the owner uid too)."""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import psutil

OWNER_FILE = "owner"
# A folder whose owner never wrote its file: removed only once this old.
UNCLAIMED_AGE_S = 24 * 3600.0
# Start times are floats from /proc (clock ticks since boot): equal within this.
START_TOLERANCE_S = 0.05


def stamp(pid: int) -> str:
    return f"{pid} {psutil.Process(pid).create_time():.3f}"


def owner_alive(text: str) -> bool:
    """Whether the process an owner file names still runs: its PID is taken, by a process
    started at the time recorded (not a later one that got the PID again)."""
    try:
        pid_text, start_text = text.split()
        pid, started = int(pid_text), float(start_text)
        return abs(psutil.Process(pid).create_time() - started) <= START_TOLERANCE_S
    except psutil.NoSuchProcess:
        return False
    except (ValueError, psutil.Error):       # a file herd did not write, or no access: keep the folder
        return True


def make_private_folder(prefix: str) -> str:
    """A fresh 0700 folder under the temporary directory, stamped with this process as its
    owner, after sweeping the same prefix's folders whose owners are gone."""
    sweep(prefix)
    folder = tempfile.mkdtemp(prefix=prefix)
    with open(os.path.join(folder, OWNER_FILE), "w") as file:
        file.write(stamp(os.getpid()))
    return folder


def sweep(prefix: str, root: str | None = None) -> list[Path]:
    """Removes this user's folders named prefix* whose owner is gone; returns them."""
    removed = []
    base = Path(root or tempfile.gettempdir())
    for folder in base.glob(f"{prefix}*"):
        try:
            info = folder.lstat()
        except OSError:
            continue
        if folder.is_symlink() or not folder.is_dir() or info.st_uid != os.getuid():
            continue
        try:
            owner = (folder / OWNER_FILE).read_text()[:100]
        except OSError:
            if time.time() - info.st_mtime < UNCLAIMED_AGE_S:
                continue
            owner = ""
        if owner and owner_alive(owner):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


# multiprocessing's named semaphores (a Lock, an Event, a Queue's) on Linux: /dev/shm/sem.mp-*.
# Their resource tracker unlinks them at the end; a run killed as a whole group with
# kill -9 takes the tracker with it and leaves them.
SEMAPHORE_GLOB = "sem.mp-*"
# A semaphore file younger than this is left alone: a process may be between creating it
# and mapping it.
SEMAPHORE_MIN_AGE_S = 60.0


def mapped_paths(uid: int) -> set[str]:
    """Every file that a live process of `uid` maps (sem_open maps a named semaphore for as
    long as the process has it open), read from /proc/<pid>/maps."""
    paths = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            with open(f"/proc/{entry.name}/maps") as maps:
                for line in maps:
                    fields = line.split(None, 5)
                    if len(fields) == 6:
                        paths.add(fields[5].rstrip("\n").removesuffix(" (deleted)"))
        except OSError:                    # gone meanwhile
            continue
    return paths


def sweep_semaphores(root: str = "/dev/shm", min_age_s: float = SEMAPHORE_MIN_AGE_S) -> list[Path]:
    """Removes this user's multiprocessing semaphores under `root` that no live process of
    this user maps and that are older than min_age_s; returns them. A semaphore some
    process still has open is always mapped by it, so a live run's are never touched."""
    uid = os.getuid()
    candidates = []
    for path in Path(root).glob(SEMAPHORE_GLOB):
        try:
            info = path.lstat()
        except OSError:
            continue
        if path.is_symlink() or not path.is_file() or info.st_uid != uid or time.time() - info.st_mtime < min_age_s:
            continue
        candidates.append(path)
    if not candidates:
        return []
    in_use = mapped_paths(uid)
    removed = []
    for path in candidates:
        if str(path) in in_use:
            continue
        try:
            path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed
