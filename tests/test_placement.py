"""Where a run connects, writes or reports comes only from this invocation or the defaults
(herd/placement.py, applied in herd.config.resolve): a checkpoint's saved placement values
are not applied, and an experiments file naming one is refused in one line. Before: W&B's
project was no placement option, so resuming a shared checkpoint uploaded its config and
metrics wherever it said, and an experiments file could set the backend, the Ray address
and the results folder unfiltered."""
import json
import os
import socket
import subprocess
import sys

import pytest

from herd.config import Config, ConfigError, resolve
from herd.inputs import FromFile
from herd.placement import PLACEMENT_OPTIONS
from herd_testing import ROOT

# A value other than the default for every placement option, as a crafted file would hold.
ELSEWHERE = {"results_dir": "/elsewhere/runs", "multiprocessing_backend": "ray", "ray_address": "10.0.0.5:6379",
             "replay_server": True, "replay_server_node": "ab" * 28, "device": "cuda", "learner_count": 4,
             "wandb_project": "someone-elses-project"}


def test_every_placement_option_has_a_crafted_value_here():
    """A placement option added later must be tried below too."""
    assert set(ELSEWHERE) == set(PLACEMENT_OPTIONS)
    defaults = Config().to_flat()
    assert all(ELSEWHERE[name] != defaults[name] for name in PLACEMENT_OPTIONS)


@pytest.mark.parametrize("name", ELSEWHERE)
def test_a_checkpoints_saved_placement_value_is_not_applied(name):
    cfg = resolve({}, saved={name: ELSEWHERE[name], "gamma": 0.5}).to_flat()
    assert cfg[name] == Config().to_flat()[name], f"the saved {name} was applied"
    assert cfg["gamma"] == 0.5                    # any other saved option still is


@pytest.mark.parametrize("name", ELSEWHERE)
def test_an_experiments_file_naming_a_placement_option_is_refused(name):
    experiment = FromFile({"env": "CartPole-v1", name: ELSEWHERE[name]})
    with pytest.raises(ConfigError, match=f"the experiments file sets {name}=.*only from the command line") as err:
        resolve({f"{name}": Config().to_flat()[name]}, experiment)     # refused even when the command line names it
    assert "\n" not in str(err.value)


def test_this_invocation_still_places_the_run():
    """The rule is about files: the command line and multi_train.py's EXPERIMENTS (code the
    user runs, plain dicts) place runs as before, over a checkpoint's values."""
    saved = dict(ELSEWHERE)
    cfg = resolve({"results_dir": "typed", "wandb_project": "mine"}, {"ray_address": "127.0.0.1:6379"}, saved)
    assert (cfg.general.results_dir, cfg.stats.wandb_project, cfg.parallel.ray_address) == (
        "typed", "mine", "127.0.0.1:6379")
    assert resolve({}, FromFile({"lr": 0.01}), saved).train.lr == 0.01


def test_herd_multi_refuses_the_file_before_connecting_or_writing(tmp_path):
    """The real command: one line, exit 2, no run folder anywhere, and no connection to the
    Ray head the file names (the old code probed it while checking the experiments)."""
    head = socket.socket()
    head.bind(("127.0.0.1", 0))
    head.listen(8)
    head.setblocking(False)
    elsewhere = tmp_path / "elsewhere"
    experiments = tmp_path / "experiments.json"
    experiments.write_text(json.dumps([
        {"env": "CartPole-v1", "multiprocessing_backend": "ray", "ray_address": f"127.0.0.1:{head.getsockname()[1]}"},
        {"env": "CartPole-v1", "results_dir": str(elsewhere)}]))
    try:
        done = subprocess.run([sys.executable, "-m", "herd.cli", "multi", str(experiments),
                               f"--results_dir={tmp_path / 'results'}"], cwd=ROOT, capture_output=True, text=True,
                              timeout=240, env={**os.environ, "PYTHONPATH": str(ROOT)})
        with pytest.raises(BlockingIOError):
            head.accept()
    finally:
        head.close()
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert "experiment 1/2" in lines[0] and "multiprocessing_backend" in lines[0] and "command line" in lines[0]
    assert not elsewhere.exists() and not (tmp_path / "results").exists()
