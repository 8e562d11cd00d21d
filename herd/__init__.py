"""herd: distributed deep reinforcement learning (IMPALA, V-trace, CLEAR, LASER, Ape-X).

The Python API (herd/api.py): `herd.train(env=..., **options)`, `herd.load_policy(run_dir)`,
`herd.evaluate(run_dir, episodes)`. `import herd` stays light: torch and the rest load on
first use of one of these names (PEP 562), so the command line's stop handlers, which
`herd.cli` installs before any slow import, still come first.
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

API = ("load_policy", "Run", "Policy", "RunFailed")
# herd/train.py and herd/evaluate.py are modules of the platform and, called, the API's
# functions: the import system binds a submodule to its package's attribute of the same
# name, so a plain function `herd.train` would be replaced by the module the moment
# anything imports herd.train. The modules keep every attribute (herd.train.learner_logging,
# monkeypatching, `import herd.train as t`), and calling one runs herd.api's function.
CALLABLE_MODULES = ("train", "evaluate")
__all__ = [*CALLABLE_MODULES, *API]

if TYPE_CHECKING:   # for type checkers and editors; never runs
    from herd.api import Policy, Run, RunFailed, evaluate, load_policy, train  # noqa: F401


class CallableModule(types.ModuleType):
    """A submodule that, called, runs herd.api's function of the same name."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        function = getattr(importlib.import_module("herd.api"), self.__name__.rpartition(".")[2])
        return function(*args, **kwargs)


class Package(types.ModuleType):
    """`herd` itself: makes herd.train and herd.evaluate callable as they are bound to it."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in CALLABLE_MODULES and type(value) is types.ModuleType:
            value.__class__ = CallableModule
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = Package


def __getattr__(name: str) -> Any:
    # importlib rather than an import statement: herd.api imports the whole platform, which
    # imports `herd` back (from herd import stopping); a lookup on first use is no cycle.
    if name in CALLABLE_MODULES:
        return importlib.import_module(f"herd.{name}")
    if name in API:
        return getattr(importlib.import_module("herd.api"), name)
    raise AttributeError(f"module 'herd' has no attribute {name!r}")
