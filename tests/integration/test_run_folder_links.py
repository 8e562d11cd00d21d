"""Writes into a run folder someone else made never follow a symbolic link out of it
(issue "Trust, second round"; herd.files.run_subfolder and write_bytes): `herd export`,
`herd plot` and `herd test` write RUN/export, RUN/plots, RUN/tests. Before: a run folder
whose export/policy.pt (or export/ itself) linked to a file elsewhere got that file
overwritten. Each case: one line, exit 2, the linked-to file unchanged."""
import sys

import pytest

from herd_testing import ROOT, copy_of_run
import subprocess

PRECIOUS = b"not yours to overwrite\n"


def herd(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "herd.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)


def assert_refused(result, victim):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and "symbolic link" in lines[0], result.stderr[-2000:]
    assert victim.read_bytes() == PRECIOUS


@pytest.fixture
def linked(small_cartpole_run, tmp_path):
    """(a copy of the run, a file outside it that links may point at)."""
    victim = tmp_path / "elsewhere" / "precious.bin"
    victim.parent.mkdir()
    victim.write_bytes(PRECIOUS)
    return copy_of_run(small_cartpole_run, tmp_path / "runs"), victim


@pytest.mark.parametrize("where", ["folder", "file"])
def test_export_does_not_write_through_a_link(linked, where):
    run, victim = linked
    if where == "folder":
        (run / "export").symlink_to(victim.parent, target_is_directory=True)
        victim.rename(victim.parent / "policy.pt")
        victim = victim.parent / "policy.pt"
    else:
        (run / "export").mkdir()
        (run / "export" / "policy.pt").symlink_to(victim)
    assert_refused(herd("export", str(run)), victim)


def test_plot_does_not_write_through_a_linked_figure(linked):
    run, victim = linked
    (run / "plots").mkdir()
    (run / "plots" / "score_vs_steps.png").symlink_to(victim)
    assert_refused(herd("plot", str(run)), victim)


def test_test_mode_does_not_write_into_a_linked_tests_folder(linked):
    run, victim = linked
    (run / "tests").symlink_to(victim.parent, target_is_directory=True)
    assert_refused(herd("test", str(run), "--test_episode_count=1"), victim)
    assert [p.name for p in victim.parent.iterdir()] == [victim.name]     # nothing made there either
