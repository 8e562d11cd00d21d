"""A checked Plan: the resolved config, the environment, the model and trajectory shapes,
and the checkpoint a run starts from. `prepare()` checks everything a user can get wrong
before any process starts and before anything is written, so bad input costs one line
and changes nothing. run.py makes Plans; train.py and evaluate.py consume them."""
from __future__ import annotations

import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from herd.algos import Algorithm, get_algorithm, trajectory_layout
from herd.backends import SERVED_INFERENCE
from herd.backends.ray_cluster import check_ray_address
from herd.backends.start import check_fork_server_python
from herd.checkpoint import check_compatible, check_parts, check_session_parts, load_checkpoint
from herd.config import Config, ConfigError, machine_picks, resolve
from herd.inputs import excerpt
from herd.sizes import check_memory, check_model_size, check_observation_size, check_thread_options
from herd.envs import EnvSpec, describe_env
from herd.envs.registry import profile_kind
from herd.envs.actor_envs import check_asynchronous, resolve_env_backend
from herd.models import build_model, model_signature, recurrent_core
from herd.monitor.tracking import check_wandb
from herd.placement import PLACEMENT_OPTIONS, split_placement  # noqa: F401 (PLACEMENT_OPTIONS: herd.plan's name for it)
from herd.models.base import TrainingLayout
from herd.trajectory import TrajectoryLayout


@dataclass
class Plan:
    """A checked run: its config, environment, and the checkpoint it starts from."""
    cfg: Config
    env_spec: EnvSpec
    model_kwargs: dict[str, Any]            # herd.models.build_model's arguments
    layout: TrajectoryLayout                # what one trajectory holds, for this algorithm
    algorithm: Algorithm
    checkpoint: dict[str, Any] | None = None
    checkpoint_path: Path | None = None
    # What the hardware decided (config.machine_picks): logged and written to config.json.
    machine_picks: dict[str, Any] | None = None
    # The checkpoint's saved placement options that differ from this run's and were not
    # applied (PLACEMENT_OPTIONS): {name: saved value}, for the run's log.
    ignored_saved: dict[str, Any] | None = None
    # What made the run (herd.provenance, set by run.py): written to config.json and summary.json.
    provenance: dict[str, Any] = field(default_factory=dict)


def split_saved_config(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A checkpoint's saved config -> (the options a resume or test takes from it, the
    placement options it does not: herd.placement, applied again where the config is
    resolved). The saved run's own mode and source never leak either."""
    kept, placement = split_placement(config)
    return {name: value for name, value in kept.items() if name not in ("op_mode", "load_model_url")}, placement


def describe_ignored(ignored: dict[str, Any]) -> str:
    """The log line naming the saved placement values that were not applied (excerpts:
    a crafted value may be anything)."""
    values = ", ".join(f"{name}={shown(value)}" for name, value in ignored.items())
    return (f"not taken from the checkpoint's saved config (where a run connects and writes comes from the "
            f"command line or the defaults): {values}")


def shown(value: Any) -> str:
    return repr(excerpt(value, 200)) if isinstance(value, str) else excerpt(value, 200)


def ignored_placement(placement: dict[str, Any], cfg: Config) -> dict[str, Any]:
    """The saved placement values that differ from what this run uses (any value that is
    not a plain scalar, which herd never saves there, counts as differing)."""
    flat = cfg.to_flat()
    return {name: value for name, value in placement.items()
            if not isinstance(value, (str, int, float, bool, type(None))) or value != flat[name]}


def env_kwargs(cfg: Config) -> dict[str, Any]:
    """The preprocessing options of herd.envs.make_env, from the config."""
    e = cfg.env
    kwargs = dict(skipped_frames=e.skipped_frames, frames_stacked=e.frames_stacked, noop_threshold=e.noop_threshold,
                  episodic_life=e.episodic_life, grayscaling_frames=e.grayscaling_frames,
                  frame_scale_resolution=tuple(e.frame_scale_resolution), clip_rewards=e.clip_rewards,
                  reward_clipping_method=e.reward_clipping_method, max_episode_steps=e.max_episode_steps)
    if e.hide_velocity:
        kwargs["hide_velocity"] = True   # --hide_velocity: only then a key, as every env backend takes these
    scale = cfg.continuous.reward_scale
    if scale is not None and scale != 1.0:
        kwargs["reward_scale"] = scale    # vector tasks only (check_continuous); absent, nothing changes
    return kwargs


def env_spec_dict(cfg: Config, spec: EnvSpec) -> dict[str, Any]:
    return {"env": cfg.env.env, "obs_shape": list(spec.obs_shape), "obs_dtype": spec.obs_dtype,
            "num_actions": spec.num_actions}


def check_seed_shapes(cfg: Config, spec: EnvSpec) -> None:
    """The seed's --actions_count and --observation_shape, when given, must match the env."""
    e = cfg.env
    if e.actions_count is not None and e.actions_count != spec.num_actions:
        raise ConfigError(f"--actions_count={e.actions_count} but {e.env} has {spec.num_actions} actions: "
                          "drop the flag or fix it")
    if e.observation_shape is not None and tuple(e.observation_shape) != tuple(spec.obs_shape):
        shape = ",".join(map(str, spec.obs_shape))
        raise ConfigError(f"--observation_shape={','.join(map(str, e.observation_shape))} but {e.env} gives "
                          f"{shape} after preprocessing: drop the flag or use {shape}")


def prepare(options: dict[str, Any], overrides: dict[str, Any] | None = None) -> Plan:
    """Resolves and checks everything; raises a herd.errors.UserError with a one-line message.
    Sizes are checked before what they size is built (herd/sizes.py); should an allocation
    fail anyway (memory taken by others meanwhile), that is one line too, not a traceback."""
    try:
        return prepare_checked(options, overrides)
    except MemoryError:
        raise ConfigError("this machine ran out of memory while preparing the run: lower the sizes "
                          "(network, observations, replays) or free memory") from None
    except RuntimeError as err:
        if not allocation_failure(err):
            raise
        raise ConfigError(f"preparing the run could not allocate memory ({excerpt(str(err), 120)}): lower the "
                          "sizes (network, observations, replays) or free memory") from None


def allocation_failure(err: RuntimeError) -> bool:
    """torch's allocators raise RuntimeError, not MemoryError, when an allocation fails."""
    text = str(err).lower()
    return any(words in text for words in ("defaultcpuallocator", "can't allocate memory", "out of memory",
                                           "not enough memory"))


def prepare_checked(options: dict[str, Any], overrides: dict[str, Any] | None) -> Plan:
    mode = options.get("op_mode", (overrides or {}).get("op_mode", "train"))
    url = options.get("load_model_url", (overrides or {}).get("load_model_url"))
    checkpoint = path = saved = None
    placement: dict[str, Any] = {}
    if mode in ("train_w_load", "test"):
        if not url:
            raise ConfigError(f"--op_mode={mode} needs --load_model_url=<run folder or checkpoint file>")
        checkpoint, path = load_checkpoint(url)
        check_parts(checkpoint, path)
        saved, placement = split_saved_config(checkpoint["config"])
        given_env = options.get("env", (overrides or {}).get("env"))
        if given_env is not None and given_env != saved.get("env"):
            # The backend the saved run resolved for its own environment: another one gets
            # its own (and a checkpoint made for another task is refused for that, below).
            saved.pop("env_backend", None)
    cfg = resolve(options, overrides, saved, env_kind=profile_kind)
    if saved is not None and saved.get("algorithm", "impala") != cfg.general.algorithm:
        # Ape-X's dueling Q head has the same parameter shapes as IMPALA's heads: only the
        # config can tell that the weights mean something else.
        raise ConfigError(f"{path} was trained with --algorithm={saved.get('algorithm', 'impala')}, not "
                          f"{cfg.general.algorithm}: drop --algorithm or start a new run")
    if cfg.general.seed is None:
        cfg.general.seed = random.randrange(2**31)
    check_action_kind(cfg)      # before validate(): Ape-X's replay checks would hide the reason
    cfg.validate()
    check_run_name(cfg)         # here, not in the CLI: herd.train(name=...) and resumes pass here too
    check_wandb(cfg.stats.wandb_project)
    check_thread_options(cfg)
    check_observation_size(cfg)  # before describe_env makes one
    cfg.parallel.env_backend = resolve_env_backend(cfg.parallel.env_backend, cfg.env.env)  # saved as it ran
    check_asynchronous(cfg.parallel.env_backend, cfg.parallel.env_batch_size, cfg.parallel.envs_per_worker)
    spec = describe_env(cfg.env.env, **{k: v for k, v in env_kwargs(cfg).items() if k != "max_episode_steps"})
    check_seed_shapes(cfg, spec)
    algorithm = get_algorithm(cfg.general.algorithm)
    check_continuous(cfg, spec, algorithm)
    model_kwargs = dict(network=cfg.network.network, obs_shape=tuple(spec.obs_shape), obs_dtype=spec.obs_dtype,
                        num_actions=spec.num_actions, feature_size=cfg.network.feature_out_layer_size,
                        use_feature_layer=cfg.network.use_additional_scaling_FC_layer,
                        hidden_sizes=tuple(cfg.network.hidden_sizes), **algorithm.model_options,
                        # --use_lstm: only then a key, so feed-forward kwargs stay as they were
                        **({"lstm_size": cfg.network.lstm_size} if cfg.network.use_lstm else {}),
                        **continuous_model_options(cfg, spec))
    # Local actors each hold a model; a Ray cluster's actors run on its other machines.
    elsewhere = cfg.parallel.multiprocessing_backend == "ray" and cfg.parallel.ray_address != "local"
    check_model_size(cfg, model_kwargs, 0 if mode == "test" or elsewhere else cfg.parallel.worker_count)
    try:
        model = build_model(**model_kwargs)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if checkpoint is not None:
        check_compatible(checkpoint, env_spec_dict(cfg, spec), model_signature(model), path)
        check_session_parts(checkpoint, path, resuming=mode == "train_w_load")
    if cfg.train.learner_layout != "auto" and not isinstance(model, TrainingLayout):
        raise ConfigError(f"--learner_layout={cfg.train.learner_layout} applies to convolutional networks "
                          f"(nature_cnn, resnet); this run's network has no layout to choose: leave it on auto")
    core = recurrent_core(model)
    distribution = model_kwargs.get("action_distribution", "categorical")
    layout = trajectory_layout(algorithm, cfg.train.r_f_steps, spec.obs_shape, spec.obs_dtype, spec.num_actions,
                               cfg.network.feature_out_layer_size, distribution,
                               core.state_shape if core is not None else None,
                               read=algorithm.read_fields(tuple(r.type for r in cfg.replays), distribution))
    if mode != "test":
        check_memory(cfg, layout)
        if cfg.parallel.multiprocessing_backend == "python_native":
            check_fork_server_python()      # its actors start from the fork server
        if cfg.parallel.multiprocessing_backend == "ray":
            check_ray_address(cfg.parallel.ray_address)     # unreachable: one line within seconds, not a hang
    check_results_dir(cfg.general.results_dir)
    given = {*options, *(overrides or {}), *(saved or {})}
    return Plan(cfg, spec, model_kwargs, layout, algorithm, checkpoint, path,
                machine_picks(cfg, profile_kind(cfg.env.env), given), ignored_placement(placement, cfg))


# -- continuous control ------------------------------------------------------
def continuous_model_options(cfg: Config, spec: EnvSpec) -> dict[str, Any]:
    """build_model's arguments for a Gaussian policy and observation normalisation; empty
    for a discrete task without normalisation, whose network is then exactly as before."""
    options: dict[str, Any] = {}
    if spec.action_kind == "continuous":
        options.update(action_distribution="gaussian", initial_log_std=cfg.continuous.initial_log_std)
    if cfg.continuous.normalize_observations:
        options["normalize_observations"] = True
    return options


def check_action_kind(cfg: Config) -> None:
    """An algorithm that cannot act in the environment's action space (Ape-X with a Box)."""
    algorithm = get_algorithm(cfg.general.algorithm)
    if "continuous" not in algorithm.action_kinds and profile_kind(cfg.env.env) == "continuous":
        raise ConfigError(f"--algorithm={algorithm.name} needs discrete actions, but {cfg.env.env} has continuous "
                          "(Box) actions: use --algorithm=impala")


def check_continuous(cfg: Config, spec: EnvSpec, algorithm: Algorithm) -> None:
    """What continuous actions, observation normalisation and reward scaling cannot run with."""
    c = cfg.continuous
    if spec.action_kind == "continuous" and cfg.general.actor_inference in SERVED_INFERENCE:
        raise ConfigError(f"--actor_inference={cfg.general.actor_inference} samples discrete actions only: "
                          "continuous-action runs act with --actor_inference=local")
    if spec.action_kind == "continuous" and cfg.parallel.actor_double_buffer:
        raise ConfigError("--actor_double_buffer overlaps stepping with an inference server's work, and "
                          "continuous-action runs act with their own models (--actor_inference=local)")
    if c.normalize_observations and cfg.general.algorithm not in ("impala", "impact", "appo"):
        raise ConfigError(f"--normalize_observations is built for --algorithm=impala, impact or appo, not "
                          f"{cfg.general.algorithm} (its target network would normalise with older statistics)")
    if c.normalize_observations and cfg.parallel.learner_count > 1:
        raise ConfigError(f"--normalize_observations with --learner_count={cfg.parallel.learner_count}: each "
                          "learner would gather its own statistics and the weights would differ; use one learner")
    if c.reward_scale is not None and not 0 < c.reward_scale < float("inf"):
        raise ConfigError(f"--reward_scale must be a positive number, got {c.reward_scale}")
    if c.reward_scale not in (None, 1.0) and spec.kind != "vector":
        raise ConfigError("--reward_scale applies to vector tasks; Atari has --clip_rewards")
    if spec.action_kind == "continuous" and cfg.network.use_lstm and any(
            r.option("dist_function") == "kl_div" for r in cfg.replays):
        # Elite kl_div scores a Gaussian step by step (folded into the batch axis); an LSTM
        # must unroll each trajectory from its start state instead: that scorer is not built.
        raise ConfigError("elite replay's dist_function kl_div with --use_lstm and continuous actions is not built: "
                          "use ln_norm or cos_dist")
    if not -5.0 <= c.initial_log_std <= 2.0:
        raise ConfigError(f"--initial_log_std must be in [-5, 2] (the range the policy keeps it in), "
                          f"got {c.initial_log_std}")
# -- end continuous control


# A run's --name and --tag become part of its folder's name: letters, digits, . _ - only
# (no '/' or '..': a name must not place the run folder outside --results_dir).
SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def check_run_name(cfg: Config) -> None:
    """--name and --tag must be usable in a folder name (one line, before anything is written)."""
    for option, value in (("name", cfg.general.name), *(("tag", tag) for tag in run_tags(cfg))):
        if value is not None and not (isinstance(value, str) and SAFE_NAME.match(value)):
            raise ConfigError(f"--{option}={excerpt(value)!r}: use 1-64 letters, digits, '.', '_' or '-' "
                              "(it becomes part of the run folder's name)")


def run_tags(cfg: Config) -> list[str]:
    return [tag.strip() for tag in (cfg.general.tag or "").split(",") if tag.strip()]


# Kernel file systems: a run folder there fails at its first write, or writes a setting.
PSEUDO_FILE_SYSTEMS = (Path("/proc"), Path("/sys"))


def check_results_dir(results_dir: str) -> None:
    """The results folder must be a folder that can be made or written, checked on the
    nearest part of the path that exists (nothing is created here); a NUL byte, an
    over-long path or a kernel file system (/proc, /sys) is refused with one line too."""
    shown = excerpt(results_dir)
    if "\0" in results_dir:
        raise ConfigError(f"--results_dir '{shown}' holds a NUL byte, which no path can: give a folder path")
    path = Path(results_dir).absolute()
    real = Path(os.path.realpath(path))
    if any(root == where or root in where.parents for root in PSEUDO_FILE_SYSTEMS for where in (path, real)):
        raise ConfigError(f"--results_dir '{shown}' is in a kernel file system (/proc, /sys), where run folders "
                          "cannot be written: give a folder on a disk")
    try:
        existing = path
        while not existing.exists():
            existing = existing.parent
        usable = existing.is_dir(), os.access(existing, os.W_OK | os.X_OK)
    except OSError as err:                      # a name too long, a loop of links, no permission to look
        raise ConfigError(f"--results_dir '{shown}' cannot be used ({err.strerror or type(err).__name__}): give "
                          "another folder") from None
    if not usable[0]:
        where = "is a file" if existing == path else f"is under '{excerpt(str(existing))}', which is a file"
        raise ConfigError(f"--results_dir '{shown}' {where}, not a folder: give a folder for the run folders")
    if not usable[1]:
        raise ConfigError(f"--results_dir '{shown}': '{excerpt(str(existing))}' is not writable (permissions or a "
                          "read-only file system): give a folder you can write")


def test_policy_of(plan: Plan) -> tuple | None:
    """(algorithm, its test-act kwargs) where the algorithm acts its own way in test and
    evaluation games (Ape-X: epsilon-greedy on Q values), else None: sample the policy."""
    kwargs = plan.algorithm.test_act_kwargs(plan.cfg)
    return None if kwargs is None else (plan.algorithm.name, kwargs)


def plays_greedily(plan: Plan, argmax: bool) -> bool:
    """Whether test or evaluation games are played without exploration: the argmax of the
    policy (--test_greedy, --eval_greedy), or an algorithm that acts its own way with no
    exploration left (Ape-X at --apex_test_epsilon=0). What eval.csv's `greedy` column says."""
    policy = test_policy_of(plan)
    if policy is None:
        return argmax
    return policy[1].get("epsilon") == 0
