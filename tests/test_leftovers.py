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

from herd.leftovers import OWNER_FILE, make_private_folder, stamp, sweep, sweep_semaphores


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


def semaphore_file(root, name: str, age_s: float):
    path = root / f"sem.mp-{name}"
    path.write_bytes(b"\0" * 32)
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_unmapped_old_semaphores_are_swept_and_mapped_or_young_ones_kept(tmp_path):
    """Catches a sweep that removes a semaphore a live process still has open (mapped), one
    just created (not mapped yet), or another user's; and one that leaves a dead run's."""
    left = semaphore_file(tmp_path, "left", age_s=3600)
    held = semaphore_file(tmp_path, "held", age_s=3600)
    young = semaphore_file(tmp_path, "young", age_s=1)
    foreign = semaphore_file(tmp_path, "foreign", age_s=3600)
    if os.geteuid() == 0:
        os.chown(foreign, 65534, 65534)
    holder = subprocess.Popen([sys.executable, "-c",
                               "import mmap, sys, time\n"
                               f"f = open({str(held)!r}, 'r+b'); m = mmap.mmap(f.fileno(), 32)\n"
                               "print('mapped', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "mapped"
        removed = set(sweep_semaphores(str(tmp_path)))
        # As root the foreign one is another user's, kept; otherwise it is ours, a leftover.
        assert removed == ({left} if os.geteuid() == 0 else {left, foreign}) and not left.exists()
        assert held.exists() and young.exists()
    finally:
        holder.kill()
        holder.wait()
    # Its holder gone, the held one is a leftover too.
    assert sweep_semaphores(str(tmp_path)) == [held]
