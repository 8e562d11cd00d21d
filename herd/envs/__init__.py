"""Environments: the registry of what herd runs, and our Atari preprocessing."""
from herd.envs.registry import EnvError, EnvSpec, describe_env, env_kind, make_env  # noqa: F401
from herd.envs.wrappers import clip_reward  # noqa: F401
