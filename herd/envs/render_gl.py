"""Which OpenGL platform MuJoCo renders frames with where there is no display.

MuJoCo reads MUJOCO_GL once, when it is first imported, and without a display its default
(GLFW) cannot open a context. Headless it can use EGL (GPU drivers or Mesa's software
renderer) or OSMesa (software only, older). On the machine herd was built on, Mesa's EGL
renders (a HalfCheetah frame in about 3 s including start-up) and OSMesa is not installed
(`apt-get install libosmesa6` would add it). So: a MUJOCO_GL the user set is kept; with a
display nothing is set; otherwise the first of EGL, OSMesa whose library is found.
Called at the start of the processes that render (test mode's render process, the
evaluation worker), before anything there imports mujoco."""
from __future__ import annotations

import ctypes.util
import os

HEADLESS_BACKENDS = (("egl", "EGL"), ("osmesa", "OSMesa"))     # (MUJOCO_GL value, library name)


def choose_mujoco_gl(display: bool) -> str | None:
    """Sets MUJOCO_GL for this process where it is unset and no display exists; returns
    the value in force (None: MuJoCo's own default)."""
    if os.environ.get("MUJOCO_GL"):
        return os.environ["MUJOCO_GL"]
    if display:
        return None
    for backend, library in HEADLESS_BACKENDS:
        if ctypes.util.find_library(library):
            os.environ["MUJOCO_GL"] = backend
            return backend
    return None
