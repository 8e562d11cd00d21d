"""Run folders say what they are and what made them: names from --name, --tag,
the environment, the algorithm and the time; provenance in config.json and summary.json;
`herd test` writing inside the run it tested."""
import json
import subprocess
import sys
from importlib.metadata import version

from herd.config import resolve
from herd.provenance import provenance
from herd.run import make_run_dir, run_folder_name
from herd_testing import ROOT, copy_of_run, run_cli


def test_a_run_folder_is_named_by_name_tags_env_algorithm_and_time_and_stays_unique(tmp_path):
    """Catches folders named by a bare Unix time, tags dropped from the name, an env id
    with '/' making a sub-folder, and two runs started in the same second sharing a folder."""
    cfg = resolve({"env": "MinAtar/Breakout-v1", "name": "elite", "tag": "paper, seed-sweep",
                   "results_dir": str(tmp_path)})
    assert run_folder_name(cfg, 0.0).startswith("elite_paper+seed-sweep_MinAtar-Breakout-v1_impala_19")
    first, second = make_run_dir(cfg), make_run_dir(cfg)
    assert first != second and first.parent == second.parent == tmp_path
    assert second.name == f"{first.name}-2" or second.name > first.name     # the same second, or a later one
    plain = resolve({"env": "CartPole-v1", "algorithm": "apex"})
    assert run_folder_name(plain, 0.0).startswith("CartPole-v1_apex_19")


def test_provenance_names_the_code_the_command_line_and_the_libraries():
    """Catches provenance fields that are missing or made up: each is checked against its
    source (installed versions, the checkout's own git commit)."""
    made = provenance(["herd", "train", "--env=CartPole-v1", "--name=my run"])
    assert made["command_line"] == "herd train --env=CartPole-v1 '--name=my run'"
    assert made["herd_version"] == version("herd") and made["torch"] == version("torch")
    assert made["gymnasium"] == version("gymnasium") and made["ale_py"] == version("ale-py")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert made["git_commit"].split("+")[0] == head
    assert made["cpu"] and isinstance(made["gpus"], list)


def test_config_and_summary_carry_the_provenance_and_herd_test_writes_inside_the_run(small_cartpole_run, tmp_path):
    """Catches config.json or summary.json without provenance, and `herd test` making a
    new training-looking folder in results/ instead of writing into the run it tested."""
    for name in ("config.json", "summary.json"):
        made = json.loads((small_cartpole_run / name).read_text())["provenance"]
        assert made["command_line"].startswith("herd train --env=CartPole-v1") and made["torch"] == version("torch")
    assert small_cartpole_run.name.startswith("CartPole-v1_impala_")
    run = copy_of_run(small_cartpole_run, tmp_path / "results")
    result = subprocess.run([sys.executable, "-m", "herd.cli", "test", str(run), "--test_episode_count=2"],
                            cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    assert [p.name for p in (tmp_path / "results").iterdir()] == [run.name]       # no new folder beside it
    [tested] = list((run / "tests").iterdir())
    outcome = json.loads((tested / "test_results.json").read_text())
    assert outcome["episode_count"] == 2 and outcome["video"] is None               # herd test: no video by default
    assert json.loads((tested / "config.json").read_text())["provenance"]["command_line"].startswith("herd test")
    # A typed --results_dir is obeyed, with a folder that says it holds a test.
    elsewhere = run_cli(["test", str(run), "--test_episode_count=2"], tmp_path / "tests_elsewhere")
    assert elsewhere.returncode == 0, elsewhere.stderr[-2000:]
    [folder] = list((tmp_path / "tests_elsewhere").iterdir())
    assert folder.name.startswith(f"test_{run.name}_") and (folder / "test_results.json").is_file()
