"""The command line as a newcomer meets it: --version, bare `herd`, booleans as
flags, per-command help, "did you mean", `herd train` without --env, `herd test`'s
defaults. All parse-only: nothing here starts a run."""
import subprocess
import sys

import pytest

from herd.cli import COMMANDS, build_parser, build_seed_parser, main, parse_herd_args, parse_seed_args
from herd.cli_options import command_options
from herd.config import FIELD_INFO, resolve
from herd.envs.registry import profile_kind
from herd.errors import ConfigError
from herd_testing import ROOT


def help_text(*argv) -> str:
    parser = build_parser()
    return (parser.commands[argv[0]] if argv else parser).format_help()


def test_version_prints_the_installed_version(capsys):
    """Catches a missing or wrong --version (the issue: there was none)."""
    from importlib.metadata import version
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"herd {version('herd')}"


def test_bare_herd_lists_every_command_and_exits_0():
    """Catches bare `herd` failing with argparse's 'the following arguments are required'."""
    result = subprocess.run([sys.executable, "-m", "herd.cli"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    listed = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("  ")]
    assert listed == list(COMMANDS)


def test_python_m_herd_is_the_herd_command(tmp_path):
    """Catches `python -m herd` failing ("'herd' is a package and cannot be directly
    executed") or losing the command's exit code: a bad option exits 2 with one line."""
    listing = subprocess.run([sys.executable, "-m", "herd"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0, listing.stderr
    assert [line.split()[0] for line in listing.stdout.splitlines() if line.startswith("  ")] == list(COMMANDS)
    refused = subprocess.run([sys.executable, "-m", "herd", "train", "--env", "Nope-v0"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "unknown environment 'Nope-v0'" in refused.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("argv, value", [
    (["--use_lstm"], "true"), (["--no-use_lstm"], "false"), (["--no_use_lstm"], "false"),
    (["--use_lstm=True"], "True"), (["--use_lstm", "False"], "False"), (["--use-lstm"], "true"),
])
def test_booleans_work_as_flags_and_in_the_seed_spelling(argv, value):
    """Catches `--use_lstm` alone being an error, `--no-` forms missing, or the seed's
    `--use_lstm=True` / `--use_lstm False` no longer read."""
    _, options, _ = parse_herd_args(["train", "--env=CartPole-v1", *argv])
    assert options["use_lstm"] == value
    assert resolve(options, env_kind=profile_kind).network.use_lstm is (value.lower() == "true")


def test_a_bare_boolean_does_not_swallow_the_run_folder():
    """Catches `herd test --render RUN` reading RUN as the value of --render."""
    _, options, _ = parse_herd_args(["test", "--render", "results/run_1"])
    assert options["render"] == "true" and options["load_model_url"] == "results/run_1"


def test_the_seed_commands_still_parse_verbatim():
    """Catches a change of the seed's command-line contract: every spelling of
    its four commands is read with the seed's meaning."""
    options = parse_seed_args(["--op_mode=test", "--env=PongNoFrameskip-v4", "--test_episode_count=1000",
                               "--load_model_url=x", "--render=True"])
    assert options == {"op_mode": "test", "env": "PongNoFrameskip-v4", "test_episode_count": "1000",
                       "load_model_url": "x", "render": "True"}
    assert parse_seed_args(["--use_kl_mask=False", "--batch_size=10"]) == {"use_kl_mask": "False", "batch_size": "10"}
    # main.py keeps the seed's defaults: Atlantis, 1000 test games with a video.
    cfg = resolve(parse_seed_args(["--op_mode=train"]))
    assert (cfg.env.env, cfg.test.test_episode_count, cfg.test.render) == ("AtlantisNoFrameskip-v4", 1000, True)


def test_each_command_shows_only_its_own_options_grouped_and_each_once():
    """Catches `herd test --help` printing every training option, and options spelled
    twice (`--batch_size BATCH_SIZE, --batch-size BATCH_SIZE`)."""
    train, test = help_text("train"), help_text("test")
    assert "--batch_size N " in train and "--batch-size" not in train and "BATCH_SIZE" not in train
    assert "--[no-]use_lstm" in train and "--test_episode_count" not in train
    assert "--test_episode_count N" in test and "--batch_size" not in test and "--lr " not in test
    assert "general options:" in train and "replay options:" in train and "replay options:" not in test
    for text in (train, test, build_seed_parser().format_help()):
        options = [line.split()[0] for line in text.splitlines() if line.startswith("  --")]
        assert len(options) == len(set(options)) > 20
    assert len(test.splitlines()) < len(train.splitlines()) / 2
    # herd test says its own defaults: 10 games, no video.
    assert "[default: 10]" in " ".join(test.split()) and "render during test mode [default: false]" in " ".join(
        test.split())


def test_every_config_option_belongs_to_a_command():
    """Catches a new config field that no `herd` command takes (only main.py would know it);
    op_mode is the command itself."""
    taken = {f.name for command in ("train", "resume", "test") for fields in command_options(command).values()
             for f in fields}
    assert taken == set(FIELD_INFO) - {"op_mode"}


@pytest.mark.parametrize("argv, words", [
    (["train", "--env=CartPole-v1", "--lrr=0.1"], "unknown option --lrr (did you mean --lr?)"),
    (["train", "--env=CartPole-v1", "--batch-sise=8"], "did you mean --batch_size"),
    (["train", "--env=CartPole-v1", "--batch=8"], "unknown option --batch "),     # no silent abbreviation
    (["test", "run", "--lr=0.1"], "--lr is not an option of herd test"),
    (["trian", "--env=CartPole-v1"], "unknown command 'trian' (did you mean train?)"),
    (["train", "--env=CartPole-v1", "--no-lr"], "--lr is not a boolean option"),
    (["train"], "herd train needs --env"),
    (["--env=CartPole-v1", "train"], "unknown option --env=CartPole-v1: herd takes --help and --version"),
])
def test_bad_command_lines_get_one_line_that_says_what_was_meant(argv, words):
    """Catches unknown options without a suggestion, abbreviations silently taken for
    another option, and `herd train` silently training Atlantis for 15M steps."""
    with pytest.raises(ConfigError) as err:
        parse_herd_args(argv)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_main_refuses_with_exit_2_and_one_line(capsys):
    """Catches the refusal escaping as a traceback or a usage dump."""
    assert main(["train", "--env=CartPole-v1", "--lrr=0.1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean --lr?" in err


def test_herd_test_defaults_to_ten_games_without_video_unless_asked():
    """Catches `herd test` defaulting to the seed's 1000 games with a video (12 s for 5 CartPole games)."""
    _, options, _ = parse_herd_args(["test", "results/x"])
    assert (options["test_episode_count"], options["render"]) == ("10", "false")
    _, options, _ = parse_herd_args(["test", "results/x", "--render", "--test_episode_count=3"])
    assert (options["test_episode_count"], options["render"]) == ("3", "true")
    cfg = resolve(options, saved={"test_episode_count": 1000, "render": True, "env": "CartPole-v1"})
    assert (cfg.test.test_episode_count, cfg.test.render) == (3, True)
    defaults = resolve(parse_herd_args(["test", "results/x"])[1], saved={"render": True, "env": "CartPole-v1"})
    assert (defaults.test.test_episode_count, defaults.test.render) == (10, False)
