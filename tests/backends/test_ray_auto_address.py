"""--ray_address=auto takes the address from Ray's cluster file only when this user owns it
and nobody else may write it (herd/backends/ray_auto.py). Before: Ray read
/tmp/ray/ray_current_cluster, which any local user can plant, and the learner joined the
cluster it named as a driver (one that unpickles what the cluster sends)."""
import os
import subprocess
import sys

import pytest

from herd.backends.ray_auto import cluster_file, resolve_auto_address
from herd.backends.ray_cluster import check_ray_address, connect
from herd.errors import ConfigError

OTHER_USER = 65534          # nobody


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """An empty Ray temp folder of the test's own; returns a function writing the cluster
    file there with the given text and mode."""
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    folder = tmp_path / "ray"
    folder.mkdir()
    folder.chmod(0o777)                      # as Ray leaves it

    def plant(text: str = "127.0.0.1:6379", mode: int = 0o644):
        path = folder / "ray_current_cluster"
        path.write_text(text)
        path.chmod(mode)
        return path
    return plant


def refused(words: str) -> str:
    with pytest.raises(ConfigError, match=words) as err:
        resolve_auto_address()
    assert "\n" not in str(err.value)
    return str(err.value)


def test_the_users_own_file_gives_the_address(planted):
    planted("10.1.2.3:6380\n")
    assert resolve_auto_address() == "10.1.2.3:6380"


def test_a_file_of_another_user_is_refused(planted, head):
    """Root alone can give a file away: elsewhere this runs as skipped, and the mode tests
    below still run."""
    if os.geteuid() != 0:
        pytest.skip("only root can make a file owned by another user")
    os.chown(planted(f"127.0.0.1:{head.getsockname()[1]}"), OTHER_USER, OTHER_USER)
    refused(f"belongs to another user \\(uid {OTHER_USER}\\)")
    with pytest.raises(ConfigError, match="belongs to another user"):
        check_ray_address("auto")                 # the run's check refuses before probing
    with pytest.raises(ConfigError, match="belongs to another user"):
        connect("auto", actors=1, actor_cpus=1.0)  # and so does joining, before Ray is imported
    with pytest.raises(BlockingIOError):
        head.accept()                             # nothing connected to the planted head


@pytest.mark.parametrize("mode", [0o666, 0o646, 0o664, 0o620])
def test_a_file_others_may_write_is_refused(planted, mode):
    planted(mode=mode)
    refused(f"may be written by other users \\(mode {mode:o}\\)")


def test_a_link_a_fifo_or_a_folder_is_refused_without_waiting(planted, tmp_path):
    mine = tmp_path / "mine"
    mine.write_text("127.0.0.1:6379")
    path = cluster_file()
    path.symlink_to(mine)
    refused("is a symbolic link")
    path.unlink()
    os.mkfifo(path)                               # no writer: a plain open would wait forever
    refused("is not a regular file")
    path.unlink()
    path.mkdir()
    refused("is not a regular file")


@pytest.mark.parametrize("text", ["", "not an address", "127.0.0.1:6379 --and-more", "x" * 10_000 + ":1"])
def test_a_file_holding_no_address_is_refused(planted, text):
    planted(text)
    assert len(refused("does not hold a host:port")) < 300


def test_no_file_is_one_line(planted):
    refused("no Ray cluster was started on this machine")


def test_ray_address_in_the_users_environment_wins(planted, monkeypatch):
    planted(mode=0o666)
    monkeypatch.setenv("RAY_ADDRESS", "10.9.8.7:6379")
    assert resolve_auto_address() == "10.9.8.7:6379"


@pytest.mark.parametrize("variables", [{"RAY_TMPDIR": "/x/ray-tmp", "TMPDIR": "/y"}, {"TMPDIR": "/y/tmp"}, {}])
def test_the_file_is_where_ray_looks(variables, monkeypatch):
    """Catches herd reading another file than the one Ray itself would (Ray's rule changing)."""
    pytest.importorskip("ray")
    for name in ("RAY_TMPDIR", "TMPDIR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    rays = subprocess.run([sys.executable, "-c", "from ray._common.utils import get_ray_address_file;"
                           "print(get_ray_address_file(None))"], capture_output=True, text=True, timeout=120)
    assert rays.returncode == 0, rays.stderr[-2000:]
    assert rays.stdout.strip() == str(cluster_file())
