"""What users and files hand in is bounded before it is parsed (herd/inputs.py):
sizes and nesting depths, values that must be scalars, and error lines that quote at most
an excerpt. Each test says what unbounded parsing does instead."""
import json

import pytest

from herd.config import ConfigError, resolve
from herd.inputs import MAX_DEPTH, MAX_FILE_BYTES, MAX_OPTION_CHARS, excerpt, nesting_depth
from herd.replay.spec import parse_replay_parameters

LONGEST_LINE = 500      # an error line quotes excerpts: a few hundred characters at most


def test_deeply_nested_replay_parameters_are_one_line():
    """Before: json.loads recursed into a RecursionError traceback."""
    with pytest.raises(ConfigError, match=f"nests lists and objects 30000 deep, more than the {MAX_DEPTH}"):
        parse_replay_parameters("[" * 30_000 + "]" * 30_000)


def test_oversized_replay_parameters_are_refused_before_parsing():
    """Before: a megabyte of JSON was parsed, and its error line quoted what it read."""
    text = '[{"type": "queue", "capacity": 1, "sample_ratio": 1, "x": "' + "y" * 2**20 + '"}]'
    with pytest.raises(ConfigError, match=f"more than the {MAX_OPTION_CHARS:,} allowed") as err:
        parse_replay_parameters(text)
    assert len(str(err.value)) < LONGEST_LINE


def test_brackets_inside_strings_do_not_count_as_nesting():
    assert nesting_depth('[{"a": "[[[[{{{{"}, [1, "\\"]]]"]]') == 2


@pytest.mark.parametrize("name, value", [
    ("results_dir", ["a", "b"]),          # before: the folder "['a', 'b']" was made
    ("env", {"id": "CartPole-v1"}),       # before: its Python repr was taken as the env id
    ("lr", [0.1]),
    ("hidden_sizes", [[64], [64]]),       # a tuple option takes a flat list of numbers only
    ("hidden_sizes", list(range(1000))),
])
def test_non_scalar_option_values_are_refused(name, value):
    with pytest.raises(ConfigError, match=f"--{name} must be"):
        resolve({name: value})


def test_tuple_options_still_take_short_lists():
    assert resolve({"hidden_sizes": [32, 16]}).network.hidden_sizes == (32, 16)


def test_excerpts_are_short_and_one_line():
    shared = ["x"] * 9
    for _ in range(30):                  # 9**30 leaves if walked: reprlib never walks it
        shared = [shared] * 9
    for value in ("a\nb" * 10_000, shared, {"k" * 1000: 1}):
        text = excerpt(value)
        assert len(text) <= 80 and "\n" not in text, text


ALIAS_BOMB = "\n".join([
    '- lr: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]',
    *[f"  gamma: &{b} [*{a}, *{a}, *{a}, *{a}, *{a}, *{a}, *{a}, *{a}, *{a}]".replace("gamma", f"g{b}")
      for a, b in zip("abcde", "bcdef")],
]) + "\n"


def one_line_refusal(result, results, words):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and words in lines[0] and len(lines[0]) < LONGEST_LINE, result.stderr[:2000]
    assert not results.exists()


def test_a_yaml_alias_bomb_costs_one_short_line(cli, tmp_path):  # noqa: F811
    """Before: the experiment was echoed whole as JSON in the error line (a few hundred
    bytes of aliases made a line of megabytes)."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(ALIAS_BOMB)
    results = tmp_path / "results"
    one_line_refusal(cli(["multi", str(bomb)], results), results, "--lr must be a single value")


def test_a_deeply_nested_json_experiments_file_is_one_line(cli, tmp_path):  # noqa: F811
    """Before: json.loads' RecursionError was no ValueError: a traceback."""
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    results = tmp_path / "results"
    one_line_refusal(cli(["multi", str(deep)], results), results, "deep")


def test_a_deeply_nested_yaml_experiments_file_is_one_line(cli, tmp_path):  # noqa: F811
    """Before: PyYAML's composer recursed into a RecursionError traceback."""
    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * 20_000 + "]" * 20_000)
    results = tmp_path / "results"
    one_line_refusal(cli(["multi", str(deep)], results), results, "too deep")


def test_an_oversized_experiments_file_is_refused_before_reading(cli, tmp_path):  # noqa: F811
    """Before: any size was read and parsed."""
    big = tmp_path / "big.json"
    big.write_text(json.dumps([{"env": "CartPole-v1", "results_dir": "r" * 1000}] * (MAX_FILE_BYTES // 1000)))
    results = tmp_path / "results"
    one_line_refusal(cli(["multi", str(big)], results), results, f"more than the {MAX_FILE_BYTES:,}")


def test_an_experiment_with_a_long_value_is_echoed_as_an_excerpt(cli, tmp_path):  # noqa: F811
    """Before: the error line held the experiment's whole JSON (here 60 KB)."""
    long = tmp_path / "long.json"
    long.write_text(json.dumps([{"env": "CartPole-v1", "eval_interval": "9" * 60_000 + "x"}]))
    results = tmp_path / "results"
    one_line_refusal(cli(["multi", str(long)], results), results, "--eval_interval")
