"""Which environment backend an actor steps: the one place that maps `--env_backend` to
an `ActorEnvs` implementation (herd/actors/interfaces.py)."""
from __future__ import annotations

from herd.envs.batched_cartpole import check_runs_batched, runs_batched
from herd.envs.registry import EnvError, env_kind
from herd.inputs import quoted

# gymnasium:  E envs built by make_env, stepped one by one in the actor's process (any env).
# ale_vector: ale-py's C++ AtariVectorEnv, E envs stepped by `threads` threads, optionally
#             asynchronous (batch_size < E); Atari only.
# numpy:      gymnasium's CartPole for all E envs in one array operation per step
#             (herd/envs/batched_cartpole.py, the same task); CartPole-v0/v1 only.
ENV_BACKENDS = ("gymnasium", "ale_vector", "numpy")
# What each steps, as the run's log says it.
ENV_BACKEND_WORDS = {"gymnasium": "gymnasium, one environment after another in the actor's process",
                     "ale_vector": "ale-py's C++ vector environment",
                     "numpy": "herd's numpy batch of gymnasium's CartPole (herd/envs/batched_cartpole.py)"}


def resolve_env_backend(requested: str, env_id: str) -> str:
    """`auto` -> ale_vector for Atari, numpy for CartPole, gymnasium otherwise; a backend
    that cannot run `env_id` raises EnvError with one line."""
    kind = env_kind(env_id)
    if requested == "auto":
        return "ale_vector" if kind == "atari" else "numpy" if runs_batched(env_id) else "gymnasium"
    if requested == "ale_vector" and kind != "atari":
        raise EnvError(f"--env_backend=ale_vector runs Atari games only, not {quoted(env_id)}: use gymnasium or auto")
    if requested == "numpy":
        check_runs_batched(env_id)
    if requested not in ENV_BACKENDS:
        raise EnvError(f"unknown --env_backend '{requested}' (use auto, {', '.join(ENV_BACKENDS)})")
    return requested


def check_asynchronous(backend: str, env_batch_size: int, num_envs: int) -> None:
    """--env_batch_size below the actor's envs asks for asynchronous stepping, which only
    ale_vector does: refused elsewhere instead of silently stepping them all."""
    if backend != "ale_vector" and 0 < env_batch_size < num_envs:
        raise EnvError(f"--env_batch_size={env_batch_size} steps environments asynchronously, which only "
                       f"--env_backend=ale_vector does (this run's: {backend}); leave it at 0")


def make_actor_envs(backend: str, env_id: str, num_envs: int, *, seed: int, threads: int = 1,
                    batch_size: int = 0, env_kwargs: dict):
    """An ActorEnvs of `num_envs` environments; env i is seeded with seed + i."""
    if backend == "gymnasium":
        from herd.envs.gym_envs import GymEnvs
        return GymEnvs(env_id, num_envs, seed=seed, **env_kwargs)
    if backend == "numpy":
        from herd.envs.batched_cartpole import BatchedCartPole
        return BatchedCartPole(env_id, num_envs, seed=seed, **env_kwargs)
    if backend == "ale_vector":
        from herd.envs.ale_vector import AleVectorEnvs
        return AleVectorEnvs(env_id, num_envs, seed=seed, batch_size=batch_size, num_threads=threads, **env_kwargs)
    raise EnvError(f"unknown env backend '{backend}'")
