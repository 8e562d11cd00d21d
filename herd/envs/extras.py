"""Environment families that need an optional extra of herd's install, and the one line a
user gets when it is missing (instead of gymnasium's own advice, which names gymnasium's
extras rather than herd's)."""
from __future__ import annotations

import importlib.util
import sys

from herd.errors import EnvError
from herd.inputs import quoted

# gymnasium entry-point package -> (herd extra, the Python module it provides, what it is)
EXTRAS = {
    "gymnasium.envs.mujoco": ("mujoco", "mujoco", "MuJoCo"),
    "gymnasium.envs.box2d": ("box2d", "Box2D", "Box2D"),
}


def installed(module: str) -> bool:
    """Whether `module` can be imported, without importing it (importing mujoco would fix
    its OpenGL backend before the render process chose one: herd/envs/render_gl.py)."""
    if module in sys.modules:
        return sys.modules[module] is not None      # None: marked unimportable
    return importlib.util.find_spec(module) is not None


def check_extra(env_id: str, entry_point: str) -> None:
    """EnvError with one line when `env_id` belongs to a family whose extra is missing, or
    is a MuJoCo task older than v5 (written for the old mujoco API: with mujoco 4 they
    print C-level deprecation warnings on every start, and their physics differ from v5)."""
    for package, (extra, module, family) in EXTRAS.items():
        if not str(entry_point).startswith(package):
            continue
        name, _, version = env_id.rpartition("-v")
        if extra == "mujoco" and version != "5":
            raise EnvError(f"environment {quoted(env_id)} is out of date: herd runs gymnasium's MuJoCo v5 tasks "
                           f"(use {name}-v5)")
        if not installed(module):
            raise EnvError(f"environment {quoted(env_id)} needs {family}, which is not installed: "
                           f"pip install -e '.[{extra}]'")
