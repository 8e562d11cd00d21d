"""The harness runs as root: it signals only processes it can pin as the run's, and it runs
system tools only from root's own folders (herd/cluster/netns.py)."""
import os
import signal
import stat
import subprocess
import sys

import pytest

from herd.cluster.netns import NamespaceError, kill_all, net_of, signal_found, system_tool


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_process_named_by_the_first_scan_only_is_not_signalled():
    """Catches a signal sent to a pid found once (it may since have been reused by a
    process outside the run): only what a second scan, after pinning, still names is hit."""
    bystander = sleeper()
    scans = iter([[bystander.pid], []])
    try:
        assert signal_found(lambda: next(scans), signal.SIGKILL) == []
        with pytest.raises(subprocess.TimeoutExpired):      # still alive half a second later
            bystander.wait(timeout=0.5)
    finally:
        bystander.kill()
        bystander.wait()


def test_a_process_both_scans_name_is_killed():
    member = sleeper()
    kill_all(lambda: [member.pid] if member.poll() is None else [], grace_s=5.0)
    assert member.wait(timeout=10) == -signal.SIGTERM


def test_a_namespace_is_known_by_its_device_and_inode():
    own = os.stat("/proc/self/ns/net")
    assert net_of(os.getpid()) == (own.st_dev, own.st_ino)


def test_system_tools_resolve_to_an_absolute_path_root_owns():
    path = system_tool("ip")
    assert os.path.isabs(path) and os.stat(path).st_uid == 0


def planted_ip(folder, mode: int, owner: int | None = None) -> dict:
    tool = folder / "ip"
    tool.write_text("#!/bin/sh\ntouch planted-ran\n")
    tool.chmod(0o755)
    folder.chmod(mode)
    if owner is not None:
        os.chown(tool, owner, owner)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.parametrize("mode, owner", [(0o777, None), (0o755, 65534)], ids=["writable-folder", "not-root's"])
def test_a_tool_planted_first_on_path_is_refused(tmp_path, monkeypatch, mode, owner):
    """Catches the harness running `ip` found on PATH wherever it lies: as root, a copy in a
    folder others may write (or a file root does not own) would run as root."""
    if os.geteuid() != 0:
        pytest.fail("the harness runs as root; so must this test", pytrace=False)
    folder = tmp_path / "bin"
    folder.mkdir()
    for name, value in planted_ip(folder, mode, owner).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(NamespaceError, match="not root's alone"):
        system_tool("ip")
    assert stat.S_IMODE(os.stat(folder).st_mode) == mode
