"""How the local backend's actor processes start: forked from a fork server that has
already imported torch, numpy and gymnasium, instead of each spawned Python importing
them anew (on 2 cores that was 1.7 s of CartPole's 6.7 s to 475). The fork server is a
fresh Python started with `start_fork_server()` as soon as a run is known to train, so
its imports overlap the learner's own set-up (herd's commands that train start it before
they import torch themselves: this module imports no torch); forking from it is safe where
forking the learner is not (the learner runs torch threads, and may hold a GPU).

Only third-party modules are preloaded: Python 3.11's fork server ignores the parent's
sys.path, so a preloaded `herd` could be another checkout's than the learner's. The
children still import herd themselves, from the learner's sys.path (spawn's preparation).

The server is started with SIGINT blocked (herd.stopping): its children inherit the
mask, as spawned children did, so a Ctrl+C in the terminal reaches only the learner.
A child's multiprocessing.parent_process() is the learner, not the server."""
from __future__ import annotations

import multiprocessing
import multiprocessing as mp
import sys

from herd.errors import ConfigError
from herd.leftovers import sweep_semaphores
from herd.stopping import sigint_blocked

PRELOAD = ["torch", "numpy", "gymnasium"]


def fork_server_is_private(version: tuple = tuple(sys.version_info[:3])) -> bool:
    """Whether this Python's fork server listens where only this user can reach it. Before
    3.10.9 and in 3.11.0 (CVE-2022-42919) it listened on a Linux abstract socket that any
    local user could connect to and have it run code as this user; pyproject.toml's
    requires-python keeps pip from installing herd there, and this catches a checkout run
    from its folder by such a Python."""
    if not sys.platform.startswith("linux"):        # abstract sockets are Linux's
        return True
    fixed_in = {(3, 10): (3, 10, 9), (3, 11): (3, 11, 1)}.get(tuple(version[:2]), (3, 12))
    return tuple(version) >= fixed_in


def check_fork_server_python(version: tuple = tuple(sys.version_info[:3])) -> None:
    """One line (ConfigError) where the actors' fork server would be open to other users."""
    if not fork_server_is_private(version):
        shown = ".".join(map(str, version))
        raise ConfigError(f"Python {shown}'s fork server, which starts the actors, can be reached by any local "
                          "user (CVE-2022-42919): use Python 3.10.9 or later, or 3.11.1 or later")


def actor_context():
    """The multiprocessing context actors start from: the fork server where the platform
    has one (Linux, macOS), spawn elsewhere."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return mp.get_context("spawn")
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)     # read when the server starts: the first start wins
    return context


def start_fork_server() -> None:
    """Starts the fork server now, if not running, without waiting for its imports: the
    first actor's start waits for them, by then mostly done. Not on a Python whose fork
    server others can reach (the run's checks refuse it with one line, herd/plan.py)."""
    if actor_context().get_start_method() != "forkserver" or not fork_server_is_private():
        return
    from multiprocessing import forkserver
    if sys.platform == "linux":
        sweep_semaphores()    # what runs killed as a whole group with kill -9 left in /dev/shm
    with sigint_blocked():
        forkserver.ensure_running()
