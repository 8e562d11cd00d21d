"""herd: distributed deep reinforcement learning (IMPALA, V-trace, CLEAR, LASER, Ape-X).

The Python API (herd/api.py): `herd.train(env=..., **options)`, `herd.load_policy(run_dir)`,
`herd.evaluate(run_dir, episodes)`, plain functions of herd.api. `import herd` stays light:
herd.api (and with it numpy) loads on first use of one of these names (PEP 562), so the
command line's stop handlers, which `herd.cli` installs before any slow import, still come
first. No submodule of herd is named train or evaluate (the platform's are herd.training
and herd.evaluation): the import system would bind such a module over the function.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

API = ("train", "evaluate", "load_policy", "Run", "Policy", "RunFailed")
__all__ = list(API)

if TYPE_CHECKING:   # for type checkers and editors; never runs
    from herd.api import Policy, Run, RunFailed, evaluate, load_policy, train  # noqa: F401


def __getattr__(name: str) -> Any:
    # importlib rather than an import statement: herd.api imports parts of the platform,
    # which import `herd` back (from herd import stopping); a lookup on first use is no cycle.
    if name in API:
        value = getattr(importlib.import_module("herd.api"), name)
        globals()[name] = value         # found once: later lookups are plain attributes
        return value
    raise AttributeError(f"module 'herd' has no attribute {name!r}")
