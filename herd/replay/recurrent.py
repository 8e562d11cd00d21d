"""Elite and attentive scoring for a network with an LSTM core (--use_lstm): the same two
scorers as herd/replay/elite.py's model_scorers, but a step's current-model features
depend on every step before it in the episode, so each candidate trajectory is unrolled
from the LSTM state stored at its start (CORE_STATE, herd/models/core.py), with resets
after its done flags, up to the last step scored; the features of the scored steps are
then compared per step, exactly as for a feed-forward network.

Cost: a forward pass over (last scored step + 1) steps per candidate instead of k steps,
at most T+1 (the attentive anchor's bootstrap observation)."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from herd.models.core import CORE_STATE, CoreInput, state_from_rows
from herd.replay.distances import distance


def on_device(data, device: torch.device) -> torch.Tensor:
    """A host array (read from a host TrajectoryStore: shared, then copied over) or a tensor
    already on `device` (read from a store on that device: returned as it is) as a tensor there."""
    return torch.as_tensor(data).to(device)


def scored_steps(T: int, score_steps: Optional[int], rng: np.random.Generator) -> np.ndarray:
    """The time steps [k] scored this round: all T, or score_steps of them at random."""
    if score_steps is None or score_steps >= T:
        return np.arange(T)
    return np.sort(rng.choice(T, size=score_steps, replace=False))


def recurrent_scorers(storage, model: torch.nn.Module, device: torch.device, dist_function: str, p: float = 2,
                      score_steps: Optional[int] = None, bf16: bool = False):
    """(off-policy scorer, attentive scorer) over `storage` with the recurrent `model`."""
    T = storage.unroll_length

    def unrolled_features(positions: np.ndarray, last: int) -> torch.Tensor:
        """Current-model features of steps 0..last of each trajectory: [last+1, C, F]."""
        steps = np.arange(last + 1)
        obs = storage.read_steps(positions, steps, ("obs",))["obs"]                          # [last+1, C, ...]
        done = storage.read_steps(positions, steps[: min(last, T)], ("done",))["done"]       # [last, C]
        start = storage.read_steps(positions, np.array([0]), (CORE_STATE,))[CORE_STATE][0]   # [C, 2, L, H]
        # Host arrays or device tensors (a store on the device): either way joined on `device`.
        done = on_device(done, device).bool()
        reset = torch.cat([torch.zeros((1, len(positions)), dtype=torch.bool, device=device), done])  # [last+1, C]
        core = CoreInput(state_from_rows(on_device(start, device)), reset)
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            return model(on_device(obs, device), core).features.float()

    def off_policy(positions: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        steps = scored_steps(T, score_steps, rng)
        current = unrolled_features(positions, int(steps[-1]))[torch.from_numpy(steps)]     # [k, C, F]
        stored = on_device(storage.read_steps(positions, steps, ("features",))["features"], device)   # [k, C, F]
        return distance(dist_function, current, stored, p).cpu().numpy().astype(np.float64)  # [C]

    def attentive(positions: np.ndarray, anchor: int, rng: np.random.Generator) -> np.ndarray:
        steps = scored_steps(T, score_steps, rng)
        features = unrolled_features(positions, int(steps[-1]))[torch.from_numpy(steps)]    # [k, C, F]
        candidates = features.mean(dim=0, keepdim=True)                                    # [1, C, F]
        last = unrolled_features(np.array([anchor]), T)[T]                                  # [1, F]: anchor's last state
        anchor_features = last.expand_as(candidates)                                        # [1, C, F]
        return distance(dist_function, candidates, anchor_features, p).cpu().numpy().astype(np.float64)

    return off_policy, attentive
