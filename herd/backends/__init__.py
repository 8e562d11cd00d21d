"""The execution backends, keyed by --multiprocessing_backend. Each is one wiring function
(`train_<name>(session, actor_spec, worker_count, slots_per_actor, stop, ...) -> why it
ended`) that runs the same actors, replays and learner; a new one is a module here and one
entry below.

A value that names a backend not built yet is refused with one line, never run as
another: asking for Ray and silently getting local processes is the defect this guards.
A backend that needs an optional package names the install command when it is missing."""
from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Callable

from herd.errors import ConfigError

# name -> "module:function" (imported when used: the config layer reads this table).
BACKENDS: dict[str, str] = {
    "python_native": "herd.backends.local:train_local",
    "ray": "herd.backends.ray_backend:train_ray",
}
# Names the seed's command line knows, with why they cannot run yet (none today).
NOT_BUILT: dict[str, str] = {}
BACKEND_CHOICES = tuple(BACKENDS) + tuple(NOT_BUILT)
# --actor_inference values whose actors are answered by the inference server's batched path
# (herd/inference/, the local backend's): server processes, or that path in each actor's own.
SERVED_INFERENCE = ("server", "in_actor")
# name -> (the package it imports, how to install it): an optional extra of pyproject.toml.
REQUIRES: dict[str, tuple[str, str]] = {"ray": ("ray", "pip install -e '.[ray]'")}
# name -> the options of ParallelConfig its wiring function takes as keyword arguments.
BACKEND_OPTIONS: dict[str, tuple[str, ...]] = {"python_native": ("synchronous_sampling",),
                                                "ray": ("ray_address", "actor_cpus", "replay_server",
                                                        "replay_server_node", "ray_compress_obs")}


def check_backend(name: str) -> None:
    """Raises ConfigError with one line unless `name` is a backend that runs here."""
    if name in NOT_BUILT:
        raise ConfigError(f"--multiprocessing_backend={name}: {NOT_BUILT[name]}")
    if name not in BACKENDS:
        raise ConfigError(f"--multiprocessing_backend: unknown backend '{name}' (use one of {', '.join(BACKENDS)})")
    if name in REQUIRES:
        package, install = REQUIRES[name]
        # Found, not imported: importing Ray now would fix its address mode too early
        # (herd/backends/ray_cluster.py). None also where sys.modules holds None for it.
        if importlib.util.find_spec(package) is None:
            raise ConfigError(f"--multiprocessing_backend={name} needs the '{package}' package, which is not "
                              f"installed: {install}")


def backend_options(name: str, parallel: Any) -> dict[str, Any]:
    """The keyword arguments of backend `name`'s wiring function, read from cfg.parallel."""
    return {option: getattr(parallel, option) for option in BACKEND_OPTIONS.get(name, ())}


def get_backend(name: str) -> Callable:
    check_backend(name)
    module, function = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), function)
