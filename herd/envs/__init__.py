"""Environments: the registry of what herd runs, and our Atari preprocessing."""
from herd.envs.registry import EnvError, EnvSpec, describe_env, env_kind, make_env
from herd.envs.wrappers import REWARD_CLIPPING_METHODS, clip_reward

__all__ = ["EnvError", "EnvSpec", "describe_env", "env_kind", "make_env", "clip_reward", "REWARD_CLIPPING_METHODS"]
