"""A run: resolve the config, make the results folder, then train, resume or test.

Everything a user can get wrong is checked in `prepare()`, before any process starts
and before anything is written, so bad input costs one line and changes nothing."""
from __future__ import annotations

import json
import logging
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import torch

from herd.checkpoint import CheckpointError, check_compatible, load_checkpoint
from herd.config import Config, ConfigError, resolve
from herd.envs import EnvError, describe_env, env_kind
from herd.envs.actor_envs import resolve_env_backend
from herd.models import build_model, model_signature
from herd.trajectory import TrajectoryLayout

log = logging.getLogger("herd")

USER_ERRORS = (ConfigError, EnvError, CheckpointError)


@dataclass
class Plan:
    """A checked run: its config, environment, and the checkpoint it starts from."""
    cfg: Config
    env_spec: object
    model_kwargs: dict
    layout: TrajectoryLayout
    checkpoint: dict | None = None
    checkpoint_path: Path | None = None


def env_kwargs(cfg: Config) -> dict:
    """The preprocessing options of herd.envs.make_env, from the config."""
    e = cfg.env
    return dict(skipped_frames=e.skipped_frames, frames_stacked=e.frames_stacked, noop_threshold=e.noop_threshold,
                episodic_life=e.episodic_life, grayscaling_frames=e.grayscaling_frames,
                frame_scale_resolution=tuple(e.frame_scale_resolution), clip_rewards=e.clip_rewards,
                reward_clipping_method=e.reward_clipping_method, max_episode_steps=e.max_episode_steps)


def prepare(options: dict, overrides: dict | None = None) -> Plan:
    """Resolves and checks everything; raises one of USER_ERRORS with a one-line message."""
    mode = options.get("op_mode", (overrides or {}).get("op_mode", "train"))
    url = options.get("load_model_url", (overrides or {}).get("load_model_url"))
    checkpoint = path = saved = None
    if mode in ("train_w_load", "test"):
        if not url:
            raise ConfigError(f"--op_mode={mode} needs --load_model_url=<run folder or checkpoint file>")
        checkpoint, path = load_checkpoint(url)
        # The saved run's own mode and source must not leak into this one.
        saved = {k: v for k, v in checkpoint["config"].items() if k not in ("op_mode", "load_model_url")}
    cfg = resolve(options, overrides, saved, env_kind=env_kind)
    if cfg.general.seed is None:
        cfg.general.seed = random.randrange(2**31)
    cfg.validate()
    cfg.parallel.env_backend = resolve_env_backend(cfg.parallel.env_backend, cfg.env.env)  # saved as it ran
    spec = describe_env(cfg.env.env, **{k: v for k, v in env_kwargs(cfg).items() if k != "max_episode_steps"})
    model_kwargs = dict(network=cfg.network.network, obs_shape=tuple(spec.obs_shape), obs_dtype=spec.obs_dtype,
                        num_actions=spec.num_actions, feature_size=cfg.network.feature_out_layer_size,
                        use_feature_layer=cfg.network.use_additional_scaling_FC_layer,
                        hidden_sizes=tuple(cfg.network.hidden_sizes))
    try:
        model = build_model(**model_kwargs)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if checkpoint is not None:
        check_compatible(checkpoint, env_spec_dict(cfg, spec), model_signature(model), path)
    layout = TrajectoryLayout(cfg.train.r_f_steps, tuple(spec.obs_shape), spec.obs_dtype, spec.num_actions,
                              cfg.network.feature_out_layer_size)
    if mode != "test":
        check_memory(cfg, layout)
    return Plan(cfg, spec, model_kwargs, layout, checkpoint, path)


def env_spec_dict(cfg: Config, spec) -> dict:
    return {"env": cfg.env.env, "obs_shape": list(spec.obs_shape), "obs_dtype": spec.obs_dtype,
            "num_actions": spec.num_actions}


def check_memory(cfg: Config, layout: TrajectoryLayout) -> None:
    """Impossible sizes: replays (and slots) that cannot fit in this machine's memory."""
    trajectories = sum(spec.capacity for spec in cfg.replays if spec.type != "queue")
    trajectories += 2 * cfg.parallel.worker_count * cfg.parallel.shared_queue_size * cfg.parallel.envs_per_worker
    needed = trajectories * layout.nbytes()
    available = psutil.virtual_memory().total
    if needed > 0.8 * available:
        raise ConfigError(f"the replays and trajectory slots need {needed / 2**30:.1f} GiB but this machine has "
                          f"{available / 2**30:.1f} GiB: lower the replay capacities, envs_per_worker or r_f_steps")


def make_run_dir(cfg: Config) -> Path:
    """results/<env>_<unix_timestamp>, unique even when two runs start in the same second."""
    base = Path(cfg.general.results_dir)
    name = cfg.env.env.replace("/", "-")
    stamp = int(time.time())
    while True:
        run_dir = base / f"{name}_{stamp}"
        try:
            run_dir.mkdir(parents=True, exist_ok=False)
            return run_dir
        except FileExistsError:
            stamp += 1


def setup_logging(run_dir: Path, debug: bool) -> None:
    for handler in list(log.handlers):  # a previous experiment's log file (herd multi)
        handler.close()
        log.removeHandler(handler)
    log.setLevel(logging.DEBUG if debug else logging.INFO)
    log.propagate = False
    file_handler = logging.FileHandler(run_dir / "log.txt")
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter("[herd] %(message)s"))
    log.addHandler(file_handler)
    log.addHandler(console)


def seed_everything(cfg: Config) -> None:
    seed = cfg.general.seed
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    # Set either way: in `herd multi` one experiment's choice must not leak into the next.
    torch.use_deterministic_algorithms(cfg.general.reproducible)


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


def run_experiment(options: dict, overrides: dict | None = None) -> int:
    """Runs one experiment; returns the process exit code (2 for bad input)."""
    try:
        plan = prepare(options, overrides)
    except USER_ERRORS as err:
        print(f"herd: error: {err}", file=sys.stderr)
        return 2
    run_dir = make_run_dir(plan.cfg)
    setup_logging(run_dir, plan.cfg.general.debug)
    seed_everything(plan.cfg)
    config = plan.cfg.to_flat()
    if plan.checkpoint_path is not None:
        config["continues_from"] = str(plan.checkpoint_path)
    write_json(run_dir / "config.json", config)
    log.info("run folder %s", run_dir)
    if plan.cfg.general.op_mode == "test":
        from herd.evaluate import test_policy
        return test_policy(plan, run_dir)
    from herd.train import train
    return train(plan, run_dir)


def load_experiments(path: str) -> list[dict]:
    text = Path(path).read_text()
    if path.endswith((".yaml", ".yml")):
        import yaml
        experiments = yaml.safe_load(text)
    else:
        experiments = json.loads(text)
    if not isinstance(experiments, list) or not all(isinstance(e, dict) for e in experiments):
        raise ConfigError(f"{path} must hold a list of experiments, each a dict of options")
    return experiments


def summaries(command_line: dict, overrides: dict) -> set[Path]:
    """The summary.json files now in the experiment's results folder."""
    try:
        results = Path(resolve(command_line, overrides).general.results_dir)
    except ConfigError:
        return set()
    return set(results.glob("*/summary.json"))


def stopped_by_signal(code: int, before: set[Path], after: set[Path]) -> bool:
    """Ctrl+C or SIGTERM: a training run stops cleanly and exits 0, but says so in its summary."""
    if code == 130:
        return True
    for path in after - before:
        try:
            if json.loads(path.read_text()).get("ended") == "stopped":
                return True
        except (OSError, ValueError):  # another process's half-visible file: not ours to judge
            continue
    return False


def run_multi(experiments: list[dict], command_line: dict) -> int:
    """Runs experiments in sequence; a failing one is logged and the rest go on, but a stop
    request (Ctrl+C, SIGTERM) ends the sequence. Returns 0 when all succeeded, 1 when any
    failed, 130 when stopped."""
    failed = []
    for index, overrides in enumerate(experiments, start=1):
        print(f"[herd] experiment {index}/{len(experiments)}: {json.dumps(overrides)}", file=sys.stderr)
        before = summaries(command_line, overrides)
        try:
            code = run_experiment(command_line, overrides)
        except Exception as err:  # one broken experiment must not stop the others
            print(f"[herd] experiment {index} raised {type(err).__name__}: {err}", file=sys.stderr)
            code = 1
        if stopped_by_signal(code, before, summaries(command_line, overrides)):
            print(f"[herd] stopped during experiment {index}; experiments {index + 1}..{len(experiments)} "
                  "were not run", file=sys.stderr)
            return 130
        if code != 0:
            # Named here too: the experiment's own error line may be far up in a long log.
            print(f"[herd] experiment {index} failed (exit code {code}): {json.dumps(overrides)}", file=sys.stderr)
            failed.append(index)
    print(f"[herd] {len(experiments) - len(failed)}/{len(experiments)} experiments succeeded"
          + (f"; failed: {', '.join(map(str, failed))}" if failed else ""), file=sys.stderr)
    return 0 if not failed else 1


def run_multi_file(path: str, command_line: dict) -> int:
    import yaml
    try:
        experiments = load_experiments(path)
    except ConfigError:
        raise
    except (OSError, ValueError, yaml.YAMLError) as err:  # YAMLError is no ValueError
        reason = " ".join(str(err).split())                # YAML's messages span lines
        raise ConfigError(f"cannot read experiments from '{path}': {reason}") from None
    return run_multi(experiments, command_line)
