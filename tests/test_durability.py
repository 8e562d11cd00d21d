"""Durability of a run's files: small JSON files reach the disk before their
rename, the metric tables survive a file that cannot be written, and results folders
that cannot hold runs are refused with one line. Each failed on the code before."""
import logging
import os
import subprocess
import sys

import pytest

import herd.files
import herd.monitor.metrics as metrics
from herd_testing import ROOT
from herd.config import ConfigError
from herd.files import write_json
from herd.plan import check_results_dir


def test_json_files_are_fsynced_before_the_rename(tmp_path, monkeypatch):
    """Before: written and renamed with no fsync, so a power loss could leave the new
    name on blocks never written (an empty or torn config.json)."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(herd.files.os, "fsync", lambda fd: (events.append(("fsync", os.readlink(
        f"/proc/self/fd/{fd}"))), real_fsync(fd)))
    monkeypatch.setattr(herd.files.os, "replace", lambda a, b: (events.append(("replace", str(b))), real_replace(a, b)))
    path = tmp_path / "summary.json"
    write_json(path, {"a": 1})
    tmp = str(path.with_name(f".{path.name}.tmp-{os.getpid()}"))
    assert events == [("fsync", tmp), ("replace", str(path)), ("fsync", str(tmp_path))]
    assert path.read_text().startswith("{") and not os.path.exists(tmp)


class Unwritable:
    """open() in metrics that fails with ENOSPC while `broken`, like a full disk."""

    def __init__(self, monkeypatch):
        self.broken = True
        real_open = open

        def fake_open(path, mode="r", *args, **kwargs):
            if self.broken and "a" in mode:
                raise OSError(28, "No space left on device")
            return real_open(path, mode, *args, **kwargs)
        monkeypatch.setattr(metrics, "open", fake_open, raising=False)


def test_a_table_survives_a_full_disk_and_writes_its_rows_once_it_can(tmp_path, monkeypatch, caplog):
    """Before: the OSError escaped flush(): the learner's loop (or the background flusher
    thread, which then died, letting rows pile up for ever) ended with a traceback."""
    disk = Unwritable(monkeypatch)
    table = metrics.CsvTable(tmp_path / "train.csv", ["a"], flush_seconds=0.0)
    with caplog.at_level(logging.WARNING, logger="herd"):
        for value in range(5):
            table.add(a=value)                   # each add flushes (flush_seconds=0): each fails
    warnings = [r.getMessage() for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(warnings) == 1 and "No space left on device" in warnings[0]   # one line, not one per try
    disk.broken = False
    table.add(a=5)
    table.close()
    assert (tmp_path / "train.csv").read_text().split() == ["a", "0", "1", "2", "3", "4", "5"]


def test_rows_kept_while_failing_are_bounded(tmp_path, monkeypatch):
    """Before: rows piled up without bound once the flusher thread had died."""
    monkeypatch.setattr(metrics, "MAX_PENDING_ROWS", 10)
    disk = Unwritable(monkeypatch)
    table = metrics.CsvTable(tmp_path / "episodes.csv", ["a"], flush_seconds=0.0)
    for value in range(100):
        table.add(a=value)
    assert len(table.rows) <= 10 and table.dropped == 90
    disk.broken = False
    table.close()
    assert (tmp_path / "episodes.csv").read_text().split() == ["a", *map(str, range(90, 100))]


def test_the_background_flusher_keeps_running_after_an_oserror(tmp_path, monkeypatch):
    """Before: the flusher thread died at the first OSError."""
    disk = Unwritable(monkeypatch)
    table = metrics.CsvTable(tmp_path / "train.csv", ["a"], flush_seconds=0.01, background=True)
    table.add(a=1)
    from herd_testing import wait_for
    assert wait_for(lambda: table.failing, 30, interval=0.01)
    disk.broken = False
    assert wait_for(lambda: not table.failing, 30, interval=0.01), "the flusher stopped retrying"
    assert table.flusher.is_alive()
    table.close()
    assert (tmp_path / "train.csv").read_text().split() == ["a", "1"]


@pytest.mark.parametrize("folder, words", [
    ("runs\0here", "NUL byte"),                           # before: passed; mkdir's ValueError traceback
    ("/proc/herd-results", "kernel file system"),         # before: passed, then mkdir failed (exit 1)
    ("/sys/herd-results", "kernel file system"),
    ("x" * 5000, "cannot be used"),                        # before: OSError (name too long) traceback
])
def test_results_folders_that_cannot_hold_runs_are_refused(folder, words):
    with pytest.raises(ConfigError, match=words) as err:
        check_results_dir(folder)
    assert len(str(err.value)) < 300


def test_a_proc_results_folder_exits_2_with_one_line(tmp_path):
    """The whole CLI: one line and exit 2, before any folder is tried (before: exit 1 when mkdir failed)."""
    result = subprocess.run([sys.executable, "-m", "herd.cli", "train", "--env=CartPole-v1",
                             "--results_dir=/proc/herd-results"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "kernel file system" in lines[0], result.stderr[-2000:]
