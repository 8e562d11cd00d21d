"""The execution backends, keyed by --multiprocessing_backend. Each is one wiring function
(`train_<name>(session, actor_spec, options, stop) -> why it ended`) that runs the same
actors, replays and learner; a new one is a module here and one entry below.

A value that names a backend not built yet is refused with one line, never run as
another: asking for Ray and silently getting local processes is the defect this guards."""
from __future__ import annotations

import importlib
from typing import Callable

from herd.errors import ConfigError

# name -> "module:function" (imported when used: the config layer reads this table).
BACKENDS: dict[str, str] = {"python_native": "herd.backends.local:train_local"}
# Names the seed's command line knows, with why they cannot run yet.
NOT_BUILT: dict[str, str] = {
    "ray": "the Ray backend is not built yet: use --multiprocessing_backend=python_native (local processes)",
}
BACKEND_CHOICES = tuple(BACKENDS) + tuple(NOT_BUILT)


def check_backend(name: str) -> None:
    """Raises ConfigError with one line unless `name` is a backend that runs."""
    if name in NOT_BUILT:
        raise ConfigError(f"--multiprocessing_backend={name}: {NOT_BUILT[name]}")
    if name not in BACKENDS:
        raise ConfigError(f"--multiprocessing_backend: unknown backend '{name}' (use one of {', '.join(BACKENDS)})")


def get_backend(name: str) -> Callable:
    check_backend(name)
    module, function = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), function)
