"""Reading a run folder back: its CSV tables as columns of floats, its config, and the
moving-average score. What `herd plot` and `herd watch` show comes from here only, so
they read exactly what the run wrote."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from herd.errors import UserError
from herd.inputs import MAX_FILE_BYTES, excerpt, parse_json, quoted, read_bounded

# What config.json holds that does not change what is learnt: seeds, names, paths, what
# is logged and shown, where processes run and how long one waits for another, the
# budget (a resumed run raises it; the LR schedule's horizon, which it sets, is its own
# option), and test mode's and evaluation's options. Runs that differ only here are one
# configuration; `herd plot` draws them as one mean and band.
NOT_CONFIGURATION = frozenset((
    "seed", "results_dir", "load_model_url", "continues_from", "op_mode", "name", "tag", "provenance",
    "picked_for_this_machine", "load_optimizer_save", "save_model_period", "save_model_seconds", "save_replay", "debug", "device",
    "actor_inference", "environment_max_steps", "multiprocessing_backend", "actor_timeout", "max_actor_restarts",
    "learner_timeout", "ray_address", "actor_cpus", "replay_server_node", "avg_buff_size", "verbose_worker_out_int",
    "verbose_learner_out_int", "basic_verbose", "worker_verbose", "background_save", "tensorboard",
    "hardware_interval", "eval_interval", "eval_episodes", "eval_greedy", "eval_video_every", "test_episode_count",
    "render", "test_greedy", "apex_test_epsilon"))


# The largest CSV field a run's tables may hold: herd writes numbers and short names, and
# the csv module's own limit is 128 KiB per field.
MAX_FIELD_CHARS = 4096


def check_run_dir(path: str | Path) -> Path:
    """The run folder at `path`, its config.json read and checked (a UserError's one line if not)."""
    run = Path(path)
    if not (run / "config.json").is_file():
        raise UserError(f"{quoted(path)} is not a herd run folder (it has no config.json)")
    read_config(run)
    return run


def continued_run(run: Path) -> tuple[str, int] | None:
    """(the folder name of the run this one resumed, the update of the checkpoint it
    resumed from), or None for a run that started afresh. config.json's continues_from is
    <run>/checkpoints/ckpt_<update>.pt."""
    source = read_config(run).get("continues_from")
    if not source or not isinstance(source, str):
        return None
    checkpoint = Path(source)
    try:
        update = int(checkpoint.stem.split("_")[-1])
    except ValueError:
        return None                        # not a checkpoint herd named: nothing to cut at
    return checkpoint.parent.parent.name, update


def join_resumed(runs: list[Path]) -> list[list[Path]]:
    """The runs as chains, each a run followed by the runs that resumed it, in order (a
    stop and its resumption are one run of training, not two runs). A resumed run whose
    origin is not among `runs` starts its own chain."""
    by_name = {run.name: run for run in runs}
    successor: dict[Path, Path] = {}
    for run in runs:
        origin = continued_run(run)
        if origin is not None and origin[0] in by_name and by_name[origin[0]] not in successor:
            successor[by_name[origin[0]]] = run
    chains = []
    for run in runs:
        if run in successor.values():
            continue
        chain = [run]
        while chain[-1] in successor and successor[chain[-1]] not in chain:
            chain.append(successor[chain[-1]])
        chains.append(chain)
    return chains


def read_joined(chain: list[Path], name: str) -> dict[str, np.ndarray]:
    """A table (episodes.csv, train.csv) of a chain: each run's rows up to the update its
    successor resumed from, then the successor's. The counters (env_step, update,
    wall_time) continue across a resume, so the joined columns run on."""
    parts = []
    for run, after in zip(chain, [*chain[1:], None]):
        table = read_table(run / name)
        if table and after is not None and "update" in table:
            keep = table["update"] <= continued_run(after)[1]
            table = {column: values[keep] for column, values in table.items()}
        if table:
            parts.append(table)
    if not parts:
        return {}
    columns = [c for c in parts[0] if all(c in part for part in parts)]
    return {column: np.concatenate([part[column] for part in parts]) for column in columns}


def read_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV table of a run (a file someone else may have written): a UserError
    of one line for anything herd does not write (a NUL byte, a field of 200 KB, bytes that
    are not UTF-8); [] when the file is missing."""
    if not path.is_file():
        return []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except (csv.Error, UnicodeDecodeError, OSError) as err:
        raise UserError(f"cannot read {quoted(path)}: {excerpt(' '.join(str(err).split()), 120)}") from None
    for row in rows:
        for value in row.values():
            if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
                raise UserError(f"cannot read {quoted(path)}: it has a field of {len(value):,} characters, more "
                                f"than the {MAX_FIELD_CHARS:,} herd writes")
            if isinstance(value, str) and "\0" in value:
                raise UserError(f"cannot read {quoted(path)}: it holds a NUL byte, which herd never writes")
    return rows


def read_table(path: Path) -> dict[str, np.ndarray]:
    """column -> float array [rows] (empty cells are NaN); {} when the file is missing."""
    rows = read_rows(path)
    if not rows:
        return {}

    def number(text: str) -> float:
        try:
            return float(text)
        except (TypeError, ValueError):
            return float("nan")

    return {name: np.array([number(row.get(name)) for row in rows]) for name in rows[0]}


def read_json_object(path: Path) -> dict:
    """A JSON object a run wrote (config.json, summary.json), read bounded (herd.inputs):
    a UserError of one line when it is not one (invalid JSON, a list, too large or deep)."""
    try:
        value = parse_json(quoted(path), read_bounded(str(path), MAX_FILE_BYTES, "a run's JSON file"),
                           MAX_FILE_BYTES)
    except UserError:
        raise
    except (OSError, ValueError) as err:      # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UserError(f"cannot read {quoted(path)}: {excerpt(' '.join(str(err).split()), 120)}") from None
    if not isinstance(value, dict):
        raise UserError(f"{quoted(path)} holds a JSON {type(value).__name__}, not the object herd writes")
    return value


def read_config(run: Path) -> dict:
    return read_json_object(run / "config.json")


def config_number(config: dict, key: str, default: float) -> float:
    """A number option of a config.json; `default` when it is missing or not a positive number."""
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        return default
    return value


def config_text(config: dict, key: str, default: str) -> str:
    """A text option of a config.json, as a figure or a screen shows it: one line, at most
    100 characters, escapes shown escaped (herd.inputs.quoted, without its quotes)."""
    value = config.get(key, default)
    return quoted(value)[1:-1]


def configuration_key(config: dict) -> tuple:
    """What makes two runs the same configuration: the options that change learning."""
    return tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in config.items() if k not in NOT_CONFIGURATION))


def moving_average(scores: np.ndarray, window: int) -> np.ndarray:
    """[n] -> [n]: the mean of the last `window` scores up to each one (fewer at the start)."""
    if len(scores) == 0:
        return scores
    sums = np.cumsum(np.insert(scores, 0, 0.0))
    counts = np.minimum(np.arange(1, len(scores) + 1), window)
    ends = np.arange(1, len(scores) + 1)
    return (sums[ends] - sums[ends - counts]) / counts
