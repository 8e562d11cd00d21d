"""A custom environment's id `pkg.module:EnvId` makes herd import `pkg.module`, running its
code: only this invocation's command line (or Python call) may name one, never a file it
reads (issue "Trust, second round"; herd.config.check_env_source). Each checkpoint here
names a module that leaves a marker file when imported; each refusal must be one line,
exit 2, with no marker. Before: `herd test`, `herd resume`, `herd export`,
herd.load_policy and herd.evaluate imported whatever the saved config named, and a
module calling sys.exit() at import got past `except Exception`."""
import json
import os
import subprocess
import sys

import pytest

from herd_testing import ROOT
from herd.errors import EnvError, UserError

ENV = "herd_trust_probe:Probe-v0"


@pytest.fixture
def probe(tmp_path, monkeypatch):
    """A module on the path whose import writes `marker` (and, with SYSTEM_EXIT set, then
    calls sys.exit), and a checkpoint whose saved config names it as the env."""
    from herd.checkpoint import save_checkpoint
    modules, marker = tmp_path / "modules", tmp_path / "imported"
    modules.mkdir()
    (modules / "herd_trust_probe.py").write_text(
        f"import os, sys\nopen({str(marker)!r}, 'w').close()\n"
        "if os.environ.get('SYSTEM_EXIT'):\n    sys.exit(3)\n")
    monkeypatch.syspath_prepend(str(modules))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(modules), str(ROOT)]))
    sys.modules.pop("herd_trust_probe", None)
    spec = {"env": ENV, "obs_shape": [4], "obs_dtype": "float32", "num_actions": 2}
    run = tmp_path / "run"
    save_checkpoint({"config": {"env": ENV, "algorithm": "impala"}, "env_spec": spec, "model_signature": {},
                     "model": {}}, run, update=1)
    (run / "config.json").write_text(json.dumps({"env": ENV}))
    yield run, marker
    sys.modules.pop("herd_trust_probe", None)


def herd_cli(*args, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "herd.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=240, env={**os.environ, **env})


def assert_one_line_refusal(result, marker):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and ENV in lines[0] and "--env" in lines[0], result.stderr[-2000:]
    assert not marker.exists(), "the saved config's module was imported"


@pytest.mark.parametrize("command", ["test", "resume", "export"])
def test_a_saved_custom_env_is_not_imported_unless_the_command_line_names_it(probe, tmp_path, command):
    run, marker = probe
    result = herd_cli(command, str(run), *([] if command == "export" else [f"--results_dir={tmp_path / 'r'}"]))
    assert_one_line_refusal(result, marker)
    assert not (run / "export").exists() and not (tmp_path / "r").exists()


def test_an_experiments_file_may_not_name_a_custom_env(probe, tmp_path):
    _, marker = probe
    experiments = tmp_path / "experiments.json"
    experiments.write_text(json.dumps([{"env": ENV}]))
    assert_one_line_refusal(herd_cli("multi", str(experiments), f"--results_dir={tmp_path / 'r'}"), marker)


def test_the_python_api_refuses_a_saved_custom_env(probe):
    import herd
    run, marker = probe
    for call in (lambda: herd.load_policy(run), lambda: herd.evaluate(run, episodes=1)):
        with pytest.raises(UserError, match="add --env="):
            call()
    assert not marker.exists()


def test_the_command_line_naming_the_env_imports_it(probe, tmp_path):
    """The rule refuses files, not custom environments: --env with the same id imports it
    (then this probe registers no environment, which is the next one-line refusal)."""
    run, marker = probe
    result = herd_cli("test", str(run), f"--env={ENV}", f"--results_dir={tmp_path / 'r'}")
    assert marker.exists() and result.returncode == 2 and "Probe-v0" in result.stderr, result.stderr[-2000:]


def test_a_module_that_exits_while_imported_is_one_line(probe, monkeypatch):
    """Before: SystemExit is no Exception, so sys.exit() in the module ended herd silently."""
    from herd.envs.registry import import_env_module
    _, marker = probe
    monkeypatch.setenv("SYSTEM_EXIT", "1")
    with pytest.raises(EnvError, match="cannot import module 'herd_trust_probe' \\(SystemExit: 3\\)"):
        import_env_module(ENV)
    assert marker.exists()
