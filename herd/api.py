"""herd from Python: train a run, load its policy, evaluate it; what `import herd` offers.

    import herd
    run = herd.train(env="CartPole-v1", environment_max_steps=200_000)
    policy = herd.load_policy(run.run_dir)
    env = policy.make_env()
    obs, _ = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(policy.act(obs))
    herd.evaluate(run.run_dir, episodes=10)        # {"mean": ..., "std": ..., "episodes": [...]}

Options are the command line's (docs/options.md), as Python values: `use_lstm=True`,
`hidden_sizes=(64, 64)`, `replay_parameters=[{"type": "queue", ...}]`. Bad input raises
herd.errors.UserError with the one line the command line would print.
"""
from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from herd.errors import UserError

__all__ = ["Policy", "Run", "RunFailed", "evaluate", "load_policy", "train"]


class RunFailed(RuntimeError):
    """A run that started but ended with a non-zero exit code (its log.txt says why)."""


@dataclass(frozen=True)
class Run:
    """A finished (or stopped) training run: its folder and what it wrote there."""
    run_dir: Path
    exit_code: int

    @property
    def summary(self) -> dict[str, Any]:
        """summary.json: steps, updates, final average score, how the run ended..."""
        return json.loads((self.run_dir / "summary.json").read_text())

    @property
    def config(self) -> dict[str, Any]:
        """config.json: every option as the run resolved it."""
        return json.loads((self.run_dir / "config.json").read_text())


def as_option(value: Any) -> Any:
    """A Python value as the command line would spell it: replay lists as JSON, tuples as 'a,b'."""
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return value


def train(env: str, **options: Any) -> Run:
    """Trains on `env` (any id `herd train --env` takes) with the given options and returns
    the Run once it has ended. The training runs in a process of its own (herd/api_run.py
    says why), so this works from a script without a main guard, a heredoc or a notebook.
    Raises UserError on bad input (nothing written) and RunFailed when the run itself fails."""
    from herd.api_launch import train_in_child
    given = {name: as_option(value) for name, value in options.items()}
    if given.get("op_mode", "train") != "train":
        raise UserError("herd.train starts a new run: op_mode cannot be given (use load_model_url with "
                        "op_mode='train_w_load' on the command line to resume)")
    result, stderr_tail, process_code = train_in_child({**given, "env": env, "op_mode": "train"})
    if "user_error" in result:
        raise user_error(result["kind"])(result["user_error"])
    if "crash" in result:
        raise RunFailed(f"the run failed: {result['crash']}")
    if not result:
        raise RunFailed(f"the training process ended with exit code {process_code} before it said how the run "
                        f"went{cause(None, stderr_tail)}")
    code, run_dir = result["exit_code"], result["run_dir"] and Path(result["run_dir"])
    if run_dir is None or code != 0:
        where = f"in {run_dir} " if run_dir else "before its folder was made "
        see = f" ({run_dir / 'log.txt'})" if run_dir else ""
        raise RunFailed(f"the run {where}ended with exit code {code}{cause(run_dir, stderr_tail)}{see}")
    return Run(run_dir, code)


def user_error(kind: str) -> type[UserError]:
    """The class of a UserError the training process reported: herd.errors' of that name, or UserError."""
    from herd import errors
    found = getattr(errors, kind, UserError)
    return found if isinstance(found, type) and issubclass(found, UserError) else UserError


def cause(run_dir: Path | None, stderr_tail: list[str]) -> str:
    """': <why>' from the run's log.txt (its last ERROR line) or else from the training
    process's last error output; '' when neither says."""
    lines = []
    if run_dir is not None:
        with contextlib.suppress(OSError):
            lines = [m.group(1) for m in map(LOG_ERROR.match, (run_dir / "log.txt").read_text().splitlines()) if m]
    lines = lines or [line.removeprefix("herd: error: ") for line in stderr_tail if line.startswith("herd: error: ")]
    lines = lines or [line for line in stderr_tail if line.strip()]
    return f": {' '.join(lines[-1].split())}" if lines else ""


# A log.txt line of an error: '2025-01-01 12:00:00,000 ERROR <message>'.
LOG_ERROR = re.compile(r"^\S+ \S+ (?:ERROR|CRITICAL) (.*)$")


class Policy:
    """A run's trained policy, acting on observations as the run's environments give them.

    `act(observation)` takes one observation (or a batch [N, ...]) in the shape the run's
    preprocessing produces (`make_env()` builds such an environment: Atari frame skip,
    grayscale, resize and frame stack; MinAtar channels; vector tasks as float32). For a
    vector task it also takes the raw gymnasium observation and applies the run's
    preprocessing itself (float32, and the masked entries of --hide_velocity). It returns
    what `make_env()`'s environment steps with: an int (discrete), or a float vector in
    [-1, 1]^A that the environment rescales to its Box bounds (continuous).
    """

    def __init__(self, plan, greedy: bool = False):
        from herd.models import build_model
        from herd.plan import env_kwargs, test_policy_of
        self.plan = plan
        self.model = build_model(**plan.model_kwargs)
        self.model.load_state_dict(plan.checkpoint["model"])
        self.model.eval()
        self.greedy = greedy
        self.algorithm_policy = test_policy_of(plan)    # Ape-X: epsilon-greedy on Q values
        self.env_kwargs = env_kwargs(plan.cfg)
        self.obs_shape = tuple(plan.env_spec.obs_shape)
        self.obs_dtype = np.dtype(plan.env_spec.obs_dtype)
        self.states = None                               # an LSTM core's state per stream (EnvCoreStates)

    @property
    def env_id(self) -> str:
        return self.plan.cfg.env.env

    @property
    def preprocessing(self) -> dict[str, Any]:
        """What turns a raw observation into the network's input, as JSON-ready data (also
        written by `herd export`)."""
        spec = self.plan.env_spec
        return {"env": self.env_id, "kind": spec.kind, "obs_shape": list(spec.obs_shape),
                "obs_dtype": spec.obs_dtype, "action_kind": spec.action_kind, "num_actions": spec.num_actions,
                "env_kwargs": {k: list(v) if isinstance(v, tuple) else v for k, v in self.env_kwargs.items()},
                "hidden_entries": list(self.hidden_entries()),
                "greedy": self.greedy, "algorithm": self.plan.cfg.general.algorithm}

    def hidden_entries(self) -> tuple[int, ...]:
        if not self.env_kwargs.get("hide_velocity"):
            return ()
        from herd.envs.masking import velocity_indices
        from herd.envs.registry import import_env_module
        return velocity_indices(import_env_module(self.env_id))

    def make_env(self, seed: int | None = None, render_mode: str | None = None):
        """A gymnasium environment with the run's preprocessing (as `herd test` plays)."""
        from herd.envs import make_env
        return make_env(self.env_id, seed=seed, render_mode=render_mode, **self.env_kwargs)

    def reset(self) -> None:
        """Forgets an LSTM core's state (call at the start of each episode); a no-op otherwise."""
        self.states = None

    def network_input(self, observation: Any) -> tuple[np.ndarray, bool]:
        """([N, *obs_shape] in the network's dtype, whether it was one observation)."""
        obs = np.asarray(observation)
        hidden = self.hidden_entries()
        if hidden and obs.shape[-1] == self.obs_shape[-1] + len(hidden):     # a raw vector observation
            obs = np.delete(obs, hidden, axis=-1)
        obs = obs.astype(self.obs_dtype, copy=False)
        if obs.shape == self.obs_shape:
            return np.ascontiguousarray(obs[None]), True
        if obs.shape[1:] == self.obs_shape:
            return np.ascontiguousarray(obs), False
        raise ValueError(f"observation of shape {obs.shape}: this policy takes {self.obs_shape} (or a batch "
                         f"[N, {', '.join(map(str, self.obs_shape))}]), as policy.make_env() gives them")

    def act(self, observation: Any):
        """The action for one observation, or an array of actions for a batch [N, ...]."""
        from herd.envs.wrappers import env_action
        from herd.evaluation import act
        from herd.models import EnvCoreStates
        batch, single = self.network_input(observation)
        if self.states is None:
            self.states = EnvCoreStates.for_model(self.model, len(batch))      # None: feed-forward
        memory = None if self.states is None else (self.states, list(range(len(batch))))
        actions = act(self.model, batch, self.greedy, self.algorithm_policy, memory)
        return env_action(actions[0]) if single else actions


def load_policy(run_dir: str | Path, greedy: bool = False, env: str | None = None) -> Policy:
    """The policy of a run folder's newest checkpoint (or of a checkpoint file). Actions are
    sampled as in training unless `greedy` (the most probable action; Ape-X plays at its
    --apex_test_epsilon either way). env: the run's environment id, needed (and only
    then) for a custom `pkg.module:EnvId`: herd imports a module only when the caller
    names it, never because a checkpoint does (docs/security.md)."""
    import tempfile

    from herd.plan import prepare
    # Loading writes nothing: the saved config's results folder (perhaps on another machine,
    # perhaps read-only) must not decide whether a policy can be read.
    options = {"op_mode": "test", "load_model_url": str(run_dir), "render": False,
               "results_dir": tempfile.gettempdir()}
    plan = prepare({**options, "env": env} if env is not None else options)
    return Policy(plan, greedy)


def evaluate(run_dir: str | Path, episodes: int = 10, greedy: bool = False, seed: int = 0,
             env: str | None = None) -> dict[str, Any]:
    """Plays `episodes` whole games with a run's policy, as `herd test` does, and returns
    their scores: {"episode_count", "mean", "std", "min", "max", "episodes"}. Writes nothing.
    env: as for load_policy (a custom environment's id, which the caller must name)."""
    if not isinstance(episodes, int) or isinstance(episodes, bool) or episodes < 1:
        raise UserError(f"episodes must be a positive integer, got {episodes!r}")
    from herd.evaluation import MAX_TEST_ENVS, play_episodes, summarize
    policy = load_policy(run_dir, greedy, env)
    scores = play_episodes(policy.model, policy.env_id, policy.env_kwargs, episodes, MAX_TEST_ENVS, seed,
                           greedy=greedy, policy=policy.algorithm_policy)
    return summarize(scores)
