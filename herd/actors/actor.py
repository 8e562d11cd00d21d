"""The actor loop: step `envs_per_worker` environments together with a local copy of the
policy, write `unroll_length`-step rollouts into shared-memory slots, hand the slot
index to the learner, pull newer weights between rollouts."""
from __future__ import annotations

import multiprocessing
import queue
import signal
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from herd.envs import make_env
from herd.models import build_model
from herd.trajectory import TrajectorySlots
from herd.weights import SharedWeights


@dataclass(frozen=True)
class ActorSpec:
    """What an actor process needs, unpacked from the config by the backend."""
    env_id: str
    env_kwargs: dict
    model_kwargs: dict
    envs_per_worker: int
    unroll_length: int
    seed: int
    torch_threads: int = 1


class Rollout(NamedTuple):
    """Message from an actor to the learner: slot `slot` holds a finished rollout."""
    slot: int
    actor_id: int
    version: int                           # policy version that acted
    steps: int                             # environment (agent) steps in the rollout
    episodes: list                         # (score, length) of whole episodes that ended


@dataclass
class EnvGroup:
    """The actor's environments, stepped together, with automatic reset."""
    envs: list
    obs: np.ndarray = field(init=False)     # [E, *obs_shape]

    def __post_init__(self):
        self.obs = np.stack([env.reset()[0] for env in self.envs])

    def step(self, actions: np.ndarray):
        """-> rewards [E], dones [E], truncated final observations {e: obs}, finished episodes."""
        E = len(self.envs)
        rewards = np.zeros(E, dtype=np.float32)
        dones = np.zeros(E, dtype=np.bool_)
        truncated_final: dict[int, np.ndarray] = {}
        finished = []
        for e, env in enumerate(self.envs):
            obs, reward, terminated, truncated, info = env.step(int(actions[e]))
            rewards[e] = reward
            if "episode_score" in info:
                finished.append((float(info["episode_score"]), int(info["episode_length"])))
            if terminated or truncated:
                dones[e] = True
                if truncated and not terminated:
                    truncated_final[e] = obs
                obs, _ = env.reset()
            self.obs[e] = obs
        return rewards, dones, truncated_final, finished


def collect_rollout(model, group: EnvGroup, views: dict[str, np.ndarray], unroll_length: int) -> tuple[int, list]:
    """Fills one slot's views ([time, E, ...]) by acting for `unroll_length` steps."""
    finished_all = []
    for t in range(unroll_length):
        views["obs"][t] = group.obs
        with torch.no_grad():
            out = model(torch.from_numpy(group.obs).unsqueeze(0))          # [1, E, ...]
            logits = out.logits[0]                                          # [E, A]
            actions = torch.multinomial(torch.softmax(logits, dim=-1), 1).squeeze(1)
        views["action"][t] = actions.numpy()
        views["behaviour_logits"][t] = logits.numpy()
        views["behaviour_value"][t] = out.value[0].numpy()
        views["features"][t] = out.features[0].numpy()
        rewards, dones, truncated_final, finished = group.step(actions.numpy())
        views["reward"][t] = rewards
        views["done"][t] = dones
        views["trunc_value"][t] = 0.0
        if truncated_final:
            # A truncated episode bootstraps from the value of its last state.
            finals = torch.from_numpy(np.stack(list(truncated_final.values()))).unsqueeze(0)
            with torch.no_grad():
                values = model(finals).value[0].numpy()
            views["trunc_value"][t, list(truncated_final)] = values
        finished_all.extend(finished)
    views["obs"][unroll_length] = group.obs
    return unroll_length * len(group.envs), finished_all


def run_actor(actor_id: int, spec: ActorSpec, slots: TrajectorySlots, free_slots, rollouts,
              weights: SharedWeights, stop) -> None:
    """Process entry point. `free_slots`: this actor's queue of slot indices it may fill;
    `rollouts`: the write end of this actor's pipe to the learner; `stop`: an Event."""
    # Ctrl+C reaches the whole process group: the main process alone decides how to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(spec.torch_threads)
    torch.manual_seed(spec.seed)
    envs = [make_env(spec.env_id, seed=spec.seed + i, **spec.env_kwargs) for i in range(spec.envs_per_worker)]
    group = EnvGroup(envs)
    model = build_model(**spec.model_kwargs)
    model.eval()
    version = weights.pull(model, have_version=-1)
    try:
        parent = multiprocessing.parent_process()
        while not stop.is_set():
            if parent is not None and not parent.is_alive():
                break  # the learner was killed (kill -9): no one will ever read our rollouts
            try:
                slot = free_slots.get(timeout=0.2)
            except queue.Empty:
                continue
            version = weights.pull(model, version)
            steps, finished = collect_rollout(model, group, slots.views(slot), spec.unroll_length)
            rollouts.send(Rollout(slot, actor_id, version, steps, finished))
    except (BrokenPipeError, EOFError):
        pass  # the learner is gone
    finally:
        for env in envs:
            env.close()
