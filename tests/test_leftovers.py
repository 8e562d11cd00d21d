"""herd's private temporary folders left by a run killed with kill -9 are swept when the next
one is made, and a live run's never are: owners are told apart by PID and start time, real
processes. The temporary directory is the test's own (tempfile.tempdir), not the shared /tmp."""
import os
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from herd.leftovers import OWNER_FILE, make_private_folder, stamp, sweep


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def folder_owned_by(root, name, owner):
    folder = root / name
    folder.mkdir(mode=0o700)
    if owner is not None:
        (folder / OWNER_FILE).write_text(owner)
    return folder


def dead_process_stamp() -> str:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    text = stamp(child.pid)
    child.wait()
    return text


def test_a_dead_owners_folder_is_swept_and_a_live_ones_kept(temp_root):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = folder_owned_by(temp_root, "herd-learners-dead", dead_process_stamp())
        live = folder_owned_by(temp_root, "herd-learners-live", stamp(sleeper.pid))
        # This PID is alive, but it is not the process that made the folder: it started later.
        reused = folder_owned_by(temp_root, "herd-learners-reused",
                                 f"{os.getpid()} {psutil.Process().create_time() - 100:.3f}")
        unclaimed = folder_owned_by(temp_root, "herd-learners-unclaimed", None)   # its owner may be writing it
        other = folder_owned_by(temp_root, "herd-ray-dead", dead_process_stamp())
        swept = sweep("herd-learners-")
        assert sorted(swept) == sorted([dead, reused])
        assert live.is_dir() and unclaimed.is_dir() and other.is_dir() and not dead.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_an_unclaimed_folder_is_swept_once_a_day_old(temp_root):
    old = folder_owned_by(temp_root, "herd-ray-old", None)
    day_ago = time.time() - 25 * 3600
    os.utime(old, (day_ago, day_ago))
    assert sweep("herd-ray-") == [old]


def test_the_learners_rendezvous_sweeps_what_a_killed_run_left(temp_root):
    from herd.learner.distributed import private_rendezvous
    left = folder_owned_by(temp_root, "herd-learners-killed", dead_process_stamp())
    with private_rendezvous() as path:
        assert not left.exists()
        mine = os.path.dirname(path)
        assert open(os.path.join(mine, OWNER_FILE)).read() == stamp(os.getpid())
        assert sweep("herd-learners-") == []          # our own live folder is never swept
    assert not os.path.exists(mine)


def test_a_new_private_folder_is_stamped_and_private(temp_root):
    folder = make_private_folder("herd-ray-")
    assert os.stat(folder).st_mode & 0o777 == 0o700
    assert open(os.path.join(folder, OWNER_FILE)).read() == stamp(os.getpid())
