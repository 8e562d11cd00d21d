"""One home for the random IMPALA batches the learner tests feed to Learner.step: the
fields impala_loss reads, time-major, drawn from one seeded generator."""
from __future__ import annotations

import torch


def impala_batch(T: int, B: int, A: int, obs_shape: tuple = (4,), obs_dtype: str = "float32", seed: int = 0,
                 nan_reward: bool = False) -> dict:
    """obs [T+1, B, *obs_shape] (uint8 frames or normal floats), action [T, B] in 0..A-1,
    reward / behaviour_value [T, B] normal, behaviour_logits [T, B, A], no episode ends, no
    replayed column; with `nan_reward` the first reward is NaN (a poisoned batch)."""
    g = torch.Generator().manual_seed(seed)
    obs = (torch.randint(0, 255, (T + 1, B, *obs_shape), dtype=torch.uint8, generator=g) if obs_dtype == "uint8"
           else torch.randn(T + 1, B, *obs_shape, generator=g))
    reward = torch.randn(T, B, generator=g)
    if nan_reward:
        reward[0, 0] = float("nan")
    return {"obs": obs, "action": torch.randint(0, A, (T, B), generator=g), "reward": reward,
            "done": torch.zeros(T, B, dtype=torch.bool), "trunc_value": torch.zeros(T, B),
            "behaviour_logits": torch.randn(T, B, A, generator=g), "behaviour_value": torch.randn(T, B, generator=g),
            "replayed": torch.zeros(B, dtype=torch.bool)}
