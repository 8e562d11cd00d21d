"""The private Ray cluster (herd/backends/ray_cluster.py, --ray_address=local) keeps its
files to this user and removes them at the end, and says so when the user's environment
turns its token off. A real single-node Ray, started in a child process (Ray's address
mode is fixed when it is imported, so it gets a fresh interpreter)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from herd_testing import ROOT

PROGRAM = textwrap.dedent("""
    import json, logging, os, stat, sys
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    from herd.backends.ray_cluster import connect
    import ray
    cluster = connect("local", actors=1, actor_cpus=1.0)
    try:
        session = ray._private.worker._global_node.get_session_dir_path()
        folders, path = [], os.path.dirname(os.path.realpath(session))
        while path != os.path.dirname(path):          # every folder above the session, up to /
            info = os.stat(path)
            folders.append([path, stat.S_IMODE(info.st_mode), info.st_uid])
            path = os.path.dirname(path)
        assert ray.get(ray.remote(lambda: 42).remote()) == 42      # the cluster works from there
    finally:
        cluster.shutdown()
    print(json.dumps({"session": session, "folders": folders, "uid": os.getuid(),
                      "left": [f for f, _, _ in folders if os.path.exists(f)]}))
""")


def test_the_private_cluster_keeps_its_files_private_and_warns_when_the_token_is_off(tmp_path):
    """Catches the private cluster's sockets, logs and session files in the shared /tmp/ray
    (Ray makes it world-writable: another local user can plant or read files there), its
    folder left behind after the run, and a user's RAY_AUTH_MODE=disabled turning the
    token off without a word."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    env.pop("RAY_AUTH_TOKEN", None)
    done = subprocess.run([sys.executable, "-c", PROGRAM], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert not report["session"].startswith("/tmp/ray/"), report["session"]
    # Some folder above the session is this user's alone (0700): nobody else can enter below it.
    private = [f for f, mode, uid in report["folders"] if mode == 0o700 and uid == report["uid"]]
    assert private, report["folders"]
    assert private[0] not in report["left"], report["left"]        # removed with everything inside
    warnings = [line for line in done.stderr.splitlines() if "RAY_AUTH_MODE=disabled" in line]
    assert len(warnings) == 1 and "token authentication off" in warnings[0], done.stderr[-2000:]
