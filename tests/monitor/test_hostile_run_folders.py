"""`herd watch` and `herd plot` read run folders someone else may have written: what herd
does not write ends in one line and exit 2, and strings from the files are shown as text
(no rich markup, no mathtext, no terminal escapes), never a traceback. Real processes."""
import csv
import json
import os
import subprocess
import sys

import pytest

from herd_testing import ROOT

EPISODE_COLUMNS = ["episode", "score", "length", "env_step", "update", "wall_time", "unix_time"]


def make_run(root, config, episodes=None):
    run = root / "run"
    run.mkdir()
    (run / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    with open(run / "episodes.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(EPISODE_COLUMNS)
        writer.writerows(episodes or [[i + 1, float(i), 10, 10 * (i + 1), i, float(i + 1), 0] for i in range(5)])
    return run


def herd(*args, cwd):
    return subprocess.run([sys.executable, "-m", "herd.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})


def assert_one_line(result, words):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and words in lines[0], result.stderr[-2000:]
    assert lines[0].startswith("herd: error:") and len(lines[0]) < 400


BAD_FOLDERS = {
    "invalid JSON": ('{"env": "CartPole-v1", ', None, "cannot read"),
    "a list for config.json": ("[1, 2, 3]", None, "holds a JSON list"),
    "a NUL byte in a table": ({"env": "CartPole-v1"}, [[1, "1\0", 10, 10, 0, 1.0, 0]], "cannot read"),
    "a 200 KB field": ({"env": "CartPole-v1"}, [[1, "9" * 200_000, 10, 10, 0, 1.0, 0]], "cannot read"),
    "config nested 100,000 deep": ('{"env": ' + "[" * 100_000 + "]" * 100_000 + "}", None, "deep"),
}


@pytest.mark.parametrize("command", ["watch", "plot"])
@pytest.mark.parametrize("case", list(BAD_FOLDERS))
def test_a_run_folder_herd_did_not_write_is_one_line(tmp_path, command, case):
    config, episodes, words = BAD_FOLDERS[case]
    run = make_run(tmp_path, config, episodes)
    result = herd(command, str(run), *(["--once"] if command == "watch" else []), cwd=tmp_path)
    assert_one_line(result, words)


HOSTILE_NAMES = ["[bold red]pwned[/] [/]", "\x1b]0;pwned\x07\x1b[2J", "$\\x$", "x" * 70_000, "a\nb"]


@pytest.mark.parametrize("env", HOSTILE_NAMES, ids=["markup", "escapes", "mathtext", "64 KiB", "newline"])
def test_names_from_the_files_are_shown_as_text(tmp_path, env):
    run = make_run(tmp_path, {"env": env, "algorithm": env, "environment_max_steps": 100})
    watched = herd("watch", str(run), "--once", cwd=tmp_path)
    assert watched.returncode == 0 and not watched.stderr, watched.stderr[-2000:]
    assert "\x1b" not in watched.stdout and "\x07" not in watched.stdout       # escapes shown escaped, not sent
    assert len(max(watched.stdout.splitlines(), key=len)) < 400                  # bounded
    if env.startswith("[bold"):
        assert "[bold red]pwned[/]" in watched.stdout                            # the markup is text
    plotted = herd("plot", str(run), cwd=tmp_path)
    assert plotted.returncode == 0, plotted.stderr[-2000:]
    assert (run / "plots" / "score_vs_steps.png").stat().st_size > 0


def test_error_lines_quote_an_environment_id_bounded_and_escaped(tmp_path):
    env = "Nope\x1b[2J\n" + "y" * 60_000 + "-v0"
    result = herd("train", f"--env={env}", f"--results_dir={tmp_path / 'results'}", cwd=ROOT)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert "\x1b" not in lines[0] and len(lines[0]) < 600 and "Nope\\x1b[2J\\n" in lines[0]
