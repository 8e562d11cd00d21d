"""The one rule for placement: the options that decide where a run connects, computes,
writes or reports come from this invocation (the command line, a Python call,
multi_train.py's EXPERIMENTS, which are code the user runs) or the defaults, never from a
file herd reads. herd.config.resolve applies it where the config's layers are merged:

- a checkpoint's saved config (`herd resume`, `herd test`, `herd export`, herd.load_policy,
  herd.evaluate) always holds every option, so its placement values are set aside, not
  applied, and the run's log names those that differ (herd.plan);
- an experiments file (`herd multi FILE`) names an option only because its author chose
  to, so naming a placement option there is refused in one line, before any experiment
  runs: running the experiments somewhere other than the file says would surprise whoever
  wrote it, and doing what it says would let a file from someone else send the runs, their
  results or their metrics where it likes.

A leaf module (herd.errors and herd.inputs only), so the config and the plan share it."""
from __future__ import annotations

from typing import Any

from herd.errors import ConfigError
from herd.inputs import excerpt

# Where a run writes (results_dir), which machines it joins and what they send it
# (multiprocessing_backend, ray_address: a Ray driver unpickles what the cluster sends),
# where its processes run (replay_server, replay_server_node, device, learner_count), and
# where its config and metrics are uploaded (wandb_project).
PLACEMENT_OPTIONS = ("results_dir", "multiprocessing_backend", "ray_address", "replay_server", "replay_server_node",
                     "device", "learner_count", "wandb_project")


def split_placement(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the options that are not placement options, the placement options), in their order."""
    kept = {name: value for name, value in options.items() if name not in PLACEMENT_OPTIONS}
    placement = {name: value for name, value in options.items() if name in PLACEMENT_OPTIONS}
    return kept, placement


def refuse_placement(options: dict[str, Any], source: str) -> None:
    """One line (ConfigError) when `options`, read from `source` (a file), name a placement
    option; the line names the first and says where it may be given instead."""
    named = [name for name in options if name in PLACEMENT_OPTIONS]
    if not named:
        return
    first = named[0]
    raise ConfigError(f"{source} sets {first}={excerpt(options[first])}, and where a run connects, writes or "
                      f"reports ({', '.join(PLACEMENT_OPTIONS)}) comes only from the command line: remove "
                      f"{', '.join(named)} from the file and give --{first}=... on the command line if you want it")
