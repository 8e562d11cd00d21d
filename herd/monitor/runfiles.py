"""Reading a run folder back: its CSV tables as columns of floats, its config, and the
moving-average score. What `herd plot` and `herd watch` show comes from here only, so
they read exactly what the run wrote."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from herd.errors import UserError

# What config.json holds that does not change what is learnt: seeds, names, paths, what
# is logged and shown, where processes run and how long one waits for another, the
# budget (a resumed run raises it; the LR schedule's horizon, which it sets, is its own
# option), and test mode's and evaluation's options. Runs that differ only here are one
# configuration; `herd plot` draws them as one mean and band.
NOT_CONFIGURATION = frozenset((
    "seed", "results_dir", "load_model_url", "continues_from", "op_mode", "name", "tag", "provenance",
    "picked_for_this_machine", "load_optimizer_save", "save_model_period", "save_replay", "debug", "device",
    "actor_inference", "environment_max_steps", "multiprocessing_backend", "actor_timeout", "max_actor_restarts",
    "learner_timeout", "ray_address", "actor_cpus", "replay_server_node", "avg_buff_size", "verbose_worker_out_int",
    "verbose_learner_out_int", "basic_verbose", "worker_verbose", "background_save", "tensorboard",
    "hardware_interval", "eval_interval", "eval_episodes", "eval_greedy", "eval_video_every", "test_episode_count",
    "render", "test_greedy", "apex_test_epsilon"))


def check_run_dir(path: str | Path) -> Path:
    run = Path(path)
    if not (run / "config.json").is_file():
        raise UserError(f"'{path}' is not a herd run folder (it has no config.json)")
    return run


def continued_run(run: Path) -> tuple[str, int] | None:
    """(the folder name of the run this one resumed, the update of the checkpoint it
    resumed from), or None for a run that started afresh. config.json's continues_from is
    <run>/checkpoints/ckpt_<update>.pt."""
    source = read_config(run).get("continues_from")
    if not source:
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


def read_table(path: Path) -> dict[str, np.ndarray]:
    """column -> float array [rows] (empty cells are NaN); {} when the file is missing."""
    if not path.is_file():
        return {}
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return {}

    def number(text: str) -> float:
        try:
            return float(text)
        except (TypeError, ValueError):
            return float("nan")

    return {name: np.array([number(row.get(name)) for row in rows]) for name in rows[0]}


def read_config(run: Path) -> dict:
    return json.loads((run / "config.json").read_text())


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
