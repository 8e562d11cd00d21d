"""--ray_address=auto: the Ray cluster this user started on this machine with `ray start
--head`, whose address Ray writes into ray/ray_current_cluster under the temp folder
($RAY_TMPDIR, else $TMPDIR, else /tmp, as Ray 2.60 picks it).

That folder is shared, and Ray makes it world-writable: any local user can leave a file
there naming a head of their own, and a learner that joins it as a driver unpickles what
the cluster sends. So herd reads the file itself, through one descriptor (no link
followed, no FIFO waited on), and takes the address only from a regular file that this
user owns and nobody else may write; anything else is one line. Ray's own lookup is never
reached: where the file is missing it takes any raylet it finds among the machine's
processes, whoever started it. RAY_ADDRESS in the user's own environment wins, as in Ray.

A leaf module: herd/backends/ray_cluster.py resolves `auto` here before probing and
before connecting, without importing Ray."""
from __future__ import annotations

import errno
import os
import re
import stat
import sys
from pathlib import Path

from herd.errors import ConfigError
from herd.inputs import excerpt

# host:port, or [IPv6]:port: what `ray start --head` writes (a line, well under this).
ADDRESS = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):[0-9]{1,5}")
MAX_FILE_BYTES = 4096


def cluster_file() -> Path:
    """Where Ray writes the address of the last cluster started with `ray start --head`."""
    if "RAY_TMPDIR" in os.environ:
        base = os.environ["RAY_TMPDIR"]
    elif sys.platform.startswith("linux") and "TMPDIR" in os.environ:
        base = os.environ["TMPDIR"]
    else:
        base = "/tmp"
    return Path(base) / "ray" / "ray_current_cluster"


def resolve_auto_address() -> str:
    """The host:port `auto` means for this user, or a one-line ConfigError."""
    from_environment = os.environ.get("RAY_ADDRESS", "")
    if from_environment and from_environment != "auto":
        return from_environment
    path = cluster_file()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(f"--ray_address=auto: no Ray cluster was started on this machine ({path} does not exist): "
                          "start one with `ray start --head` or give --ray_address=host:port") from None
    except OSError as err:                  # ELOOP: the name is a symbolic link
        raise refused(path, "is a symbolic link" if err.errno == errno.ELOOP else f"cannot be read ({err.strerror})")
    problem = untrusted(os.fstat(fd))        # of what was opened, not of the name (which may change)
    if problem:
        os.close(fd)
        raise refused(path, problem)
    with os.fdopen(fd, "rb") as file:
        data = file.read(MAX_FILE_BYTES + 1)
    address = data.decode("utf-8", errors="replace").strip()
    if len(data) > MAX_FILE_BYTES or not ADDRESS.fullmatch(address):
        raise ConfigError(f"--ray_address=auto: {path} does not hold a host:port (it holds "
                          f"'{excerpt(address)}'): give --ray_address=host:port")
    return address


def untrusted(info: os.stat_result) -> str | None:
    """Why a cluster file with this status may hold someone else's address, or None."""
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if info.st_uid != os.geteuid():
        return f"belongs to another user (uid {info.st_uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"may be written by other users (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def refused(path: Path, problem: str) -> ConfigError:
    return ConfigError(f"--ray_address=auto: {path} {problem}, so it may name someone else's Ray cluster: give "
                       "--ray_address=host:port of your own, or remove the file and run `ray start --head` again")
