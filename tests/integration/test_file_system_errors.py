"""File system errors: one line and a non-zero exit, never a traceback, and nothing saved
is damaged (a failed checkpoint write keeps the previous checkpoint)."""
import errno
import json
import subprocess
import sys
from pathlib import Path

from herd_testing import ROOT

from herd.checkpoint import list_checkpoints, load_checkpoint

CARTPOLE = ["--env=CartPole-v1", "--worker_count=1", "--envs_per_worker=4", "--tensorboard=False"]


def test_results_dir_that_is_a_file_is_one_line(cli, tmp_path):
    file = tmp_path / "results"
    file.write_text("not a folder")
    result = cli(["train", *CARTPOLE], file)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "is a file" in lines[0], result.stderr
    assert file.read_text() == "not a folder"


def test_empty_results_dir_is_refused_not_the_current_folder(tmp_path):
    result = subprocess.run([sys.executable, "-m", "herd.cli", "train", *CARTPOLE, "--results_dir="], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(ROOT)})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["herd: error: --results_dir is empty: give the folder for run "
                                                  "folders (default: results)"]
    assert list(tmp_path.iterdir()) == []


def test_a_run_folder_the_file_system_refuses_is_one_line(tmp_path, monkeypatch, capsys):
    """A read-only mount or a full disk at the start: prepare() passed, mkdir fails."""
    from herd.run import run_experiment

    def refuse(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    code = run_experiment({"env": "CartPole-v1", "results_dir": str(tmp_path / "results"), "worker_count": 1})
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(lines) == 1, lines
    assert "cannot create the run folder" in lines[0] and "Read-only file system" in lines[0]


# The parent process with a disk that fills up after the first checkpoint: torch.save
# writes part of the file, then fails as a full disk does.
FULL_DISK_AFTER_ONE_SAVE = """
import errno, sys, torch
real_save, saves = torch.save, []
def save(obj, f, *args, **kwargs):
    saves.append(1)
    if len(saves) > 1:
        f.write(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")
    return real_save(obj, f, *args, **kwargs)
torch.save = save
from herd.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_full_disk_at_a_checkpoint_keeps_the_previous_one_and_says_so_in_one_line(tmp_path):
    results = tmp_path / "results"
    result = subprocess.run([sys.executable, "-c", FULL_DISK_AFTER_ONE_SAVE, "train", *CARTPOLE,
                             "--environment_max_steps=500000", "--save_model_period=5", "--basic_verbose=False",
                             f"--results_dir={results}"], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "Logging error" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "No space left on device" in line]
    assert len(errors) == 1 and "the previous checkpoint" in errors[0] and "is kept" in errors[0], result.stderr
    run = next(results.iterdir())
    folder = run / "checkpoints"
    assert [p.name for p in folder.iterdir()] == ["ckpt_0000000005.pt"]      # no temporary file left
    state, _ = load_checkpoint(run)
    assert state["counters"]["updates"] == 5
    summary = json.loads((run / "summary.json").read_text())
    assert summary["ended"] == "save failed" and summary["checkpoint"] == str(list_checkpoints(folder)[0])
    assert "No space left on device" in summary["write_failures"][0]
