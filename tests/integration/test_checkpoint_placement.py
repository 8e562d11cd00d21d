"""A checkpoint's saved config never decides where a run connects, computes or writes:
a crafted checkpoint with a valid checksum whose config names a results folder,
the Ray backend and a Ray head is resumed and tested on the local backend, writing where
the command line says; every other saved option keeps its precedence."""
import json
import os
import subprocess
import sys


from herd_testing import ROOT, copy_of_run, only_run, run_cli
from herd.checkpoint import load_checkpoint, save_checkpoint
from herd.config import Config


def connections(server) -> int:
    count = 0
    while True:
        try:
            server.accept()[0].close()
        except BlockingIOError:
            return count
        count += 1


def herd_in(folder, args):
    """herd with no --results_dir, started in `folder`: the default results folder is then
    folder/results, unless something else decides it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "WANDB_MODE": "disabled"}          # were the saved project applied, nothing leaves this machine
    return subprocess.run([sys.executable, "-m", "herd.cli", *args], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=240)


def redirected_run(small_cartpole_run, folder, head, elsewhere):
    """A copy of a real run whose checkpoint (re-saved, so its checksum is valid) says:
    write into `elsewhere`, run on Ray, join the head at `head`, report to someone's W&B
    project; and a saved gamma of 0.5."""
    run = copy_of_run(small_cartpole_run, folder)
    state, _ = load_checkpoint(run)
    state["config"].update(results_dir=str(elsewhere), multiprocessing_backend="ray",
                           ray_address="127.0.0.1:%d" % head.getsockname()[1], gamma=0.5,
                           wandb_project="someone-elses-project")
    save_checkpoint({k: v for k, v in state.items() if k not in ("format_version", "checksum")}, run,
                    state["counters"]["updates"] + 1)
    return run, state["counters"]["env_steps"]


def test_resume_takes_neither_backend_nor_address_nor_results_folder_from_the_checkpoint(
        small_cartpole_run, tmp_path, head):
    """Catches a resume that takes the saved backend and address: it probes the socket (a
    connection) and, finding no Ray there, refuses; or, with a Ray head there, joins it as
    a driver."""
    elsewhere = tmp_path / "elsewhere"
    run, steps = redirected_run(small_cartpole_run, tmp_path / "source", head, elsewhere)
    results = tmp_path / "results"
    result = herd_in(tmp_path, ["resume", str(run), f"--environment_max_steps={steps}", "--worker_count=1"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert connections(head) == 0, "the resume connected to the address the checkpoint named"
    assert not elsewhere.exists(), "the resume wrote where the checkpoint said"
    resumed = only_run(results)
    config = json.loads((resumed / "config.json").read_text())
    assert config["multiprocessing_backend"] == "python_native" and config["ray_address"] == "local"
    assert config["results_dir"] == "results" and config["wandb_project"] is None
    assert config["gamma"] == 0.5                 # not a placement option: the saved value still applies
    log = (resumed / "log.txt").read_text()
    assert "not taken from the checkpoint's saved config" in log
    assert f"results_dir='{elsewhere}'" in log and "multiprocessing_backend='ray'" in log
    assert "wandb_project='someone-elses-project'" in log


def test_test_mode_writes_where_the_command_line_says(small_cartpole_run, tmp_path, head):
    """Catches a herd test that makes its folder in the results folder the checkpoint
    names. (Where the command line names no --results_dir, herd test writes inside the run
    it tests.)"""
    elsewhere = tmp_path / "elsewhere"
    run, _ = redirected_run(small_cartpole_run, tmp_path / "source", head, elsewhere)
    result = herd_in(tmp_path, ["test", str(run), "--test_episode_count=1", "--render=False"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert not elsewhere.exists()
    assert (only_run(run / "tests") / "test_results.json").exists()
    typed = tmp_path / "typed"
    result = herd_in(tmp_path, ["test", str(run), "--test_episode_count=1", "--render=False", f"--results_dir={typed}"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert not elsewhere.exists() and (only_run(typed) / "test_results.json").exists()
    assert connections(head) == 0


def test_the_command_line_still_beats_the_saved_config(small_cartpole_run, tmp_path, head):
    """The seed's precedence for what is not a placement option: command line > checkpoint."""
    run, steps = redirected_run(small_cartpole_run, tmp_path / "source", head, tmp_path / "elsewhere")
    results = tmp_path / "results"
    result = run_cli(["resume", str(run), f"--environment_max_steps={steps}", "--worker_count=1", "--gamma=0.9"],
                     results)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((only_run(results) / "config.json").read_text())["gamma"] == 0.9


def test_every_placement_option_is_an_option_and_is_split_off():
    """A renamed option would silently leave the list (and be applied from checkpoints again)."""
    from herd.plan import PLACEMENT_OPTIONS, split_saved_config
    flat = Config().to_flat()
    assert set(PLACEMENT_OPTIONS) <= set(flat)
    kept, placement = split_saved_config({**flat, "op_mode": "test", "load_model_url": "x"})
    assert set(placement) == set(PLACEMENT_OPTIONS)
    assert not set(kept) & {*PLACEMENT_OPTIONS, "op_mode", "load_model_url"}
    assert kept["gamma"] == flat["gamma"]
