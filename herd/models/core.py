"""The LSTM core (--use_lstm): one recurrent layer between a network's torso and its heads.

Shapes at the boundary (L = layers = 1, H = --lstm_size):
    torso output    [T*B, I]       the torso's per-step vectors (what the heads read without a core)
    state           [2, L, B, H]   (h, c) stacked: one tensor is easier to store, copy and index
    reset           [T, B] bool    zero the state BEFORE step t: an episode starts at step t
    core output     [T*B, H]       what the heads read

The core reads the torso output only, not IMPALA's one-hot last action and clipped last
reward. Why: on the tasks herd targets the observations already carry what those would
add (Atari's frame stack holds the motion; CartPole with hidden velocities needs the
difference of consecutive positions, which the core sees), and leaving them out keeps
every caller (actor, inference server, learner, elite scoring, test mode) to exactly
three inputs: observations, the start state and the reset flags. Nothing about the
previous step has to be carried across trajectory boundaries or stored in replays.

A trajectory stores the state at its START (after any reset at step 0): the field
CORE_STATE, one time step, [1, E, 2, L, H] in a slot and [1, B, 2, L, H] in a batch.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
import torch
from torch import Tensor, nn

CORE_STATE = "core_state"      # the trajectory field holding each column's start state
CORE_LAYERS = 1


class CoreInput(NamedTuple):
    state: Tensor                  # [2, L, B, H] (h, c) before step 0
    reset: Optional[Tensor]        # [T, B] bool: zero the state before step t; None: no reset


class LSTMCore(nn.Module):
    """One LSTM over the torso output; with `value_input_size`, a second LSTM of the same
    size over a separate value torso (the MLP's), side by side in one state whose last
    axis holds the policy stream's H units, then the value stream's."""

    def __init__(self, input_size: int, hidden_size: int, value_input_size: int = 0):
        super().__init__()
        if hidden_size < 1:
            raise ValueError(f"lstm_size must be positive, got {hidden_size}")
        self.hidden_size = hidden_size
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers=CORE_LAYERS)
        self.value_lstm = nn.LSTM(value_input_size, hidden_size, num_layers=CORE_LAYERS) if value_input_size else None

    @property
    def state_size(self) -> int:
        """The state's last axis: H, or 2H with a value stream."""
        return self.hidden_size * (1 if self.value_lstm is None else 2)

    @property
    def state_shape(self) -> tuple[int, int, int]:
        """One environment's state: (2, L, H) (2H with a value stream)."""
        return (2, CORE_LAYERS, self.state_size)

    def initial_state(self, batch: int, device=None) -> Tensor:
        return torch.zeros(2, CORE_LAYERS, batch, self.state_size, device=device)         # [2, L, B, H]

    def forward(self, torso: Tensor, T: int, B: int, core: Optional[CoreInput],
                value_torso: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor], Tensor]:
        """torso [T*B, I] (and value_torso [T*B, I_v] with a value stream) -> (output
        [T*B, H], value output [T*B, H] or None, state after step T-1 [2, L, B, H]).

        The unroll is cut into runs between the steps where any column resets: each run is
        one nn.LSTM call (one fused kernel on a GPU), and at its first step the resetting
        columns' state is zeroed. Equal, up to float rounding, to stepping one at a time."""
        if (value_torso is None) != (self.value_lstm is None):
            raise ValueError("an LSTM core with a value stream takes a value torso, and only then")
        # The core always runs in float32, also under a bf16 learner's autocast: oneDNN's
        # bf16 LSTM fails on CPUs without bf16 units ("could not create a primitive
        # descriptor"), and the core is a small part of the step next to the torso.
        x = torso.view(T, B, -1).float()
        v = None if value_torso is None else value_torso.view(T, B, -1).float()
        if core is None:
            state, reset = self.initial_state(B, torso.device), None
        else:
            state, reset = core.state, core.reset
            if tuple(state.shape) != (2, CORE_LAYERS, B, self.state_size):
                raise ValueError(f"the LSTM state must be [2, {CORE_LAYERS}, B, {self.state_size}] with B={B}, "
                                 f"got {tuple(state.shape)}")
        state = state.to(x.dtype)
        starts = [0]
        if reset is not None:
            if tuple(reset.shape) != (T, B):
                raise ValueError(f"the reset flags must be [T, B] = [{T}, {B}], got {tuple(reset.shape)}")
            starts = sorted({0, *torch.nonzero(reset.any(dim=1)).flatten().tolist()})
        H, outputs, value_outputs = self.hidden_size, [], []
        for start, end in zip(starts, starts[1:] + [T]):
            if reset is not None:
                keep = (~reset[start]).to(x.dtype).view(1, 1, B, 1)                       # [1, 1, B, 1]
                state = state * keep
            with torch.autocast(x.device.type, enabled=False):
                y, (h, c) = self.lstm(x[start:end], (state[0, ..., :H].contiguous(), state[1, ..., :H].contiguous()))
                if v is not None:
                    vy, (vh, vc) = self.value_lstm(v[start:end], (state[0, ..., H:].contiguous(),
                                                                  state[1, ..., H:].contiguous()))
                    h, c = torch.cat([h, vh], dim=-1), torch.cat([c, vc], dim=-1)
                    value_outputs.append(vy)
            state = torch.stack([h, c])
            outputs.append(y)
        y = torch.cat(outputs).reshape(T * B, H)                                           # [T*B, H]
        value_y = torch.cat(value_outputs).reshape(T * B, H) if value_outputs else None
        return y, value_y, state


def heads_after_core(heads: nn.Module, core: Optional[LSTMCore], torso: Tensor, T: int, B: int,
                     core_input: Optional[CoreInput], value_torso: Optional[Tensor] = None,
                     value_skip: bool = False):
    """What every network's unroll() ends with: torso [T*B, I] -> (ModelOutput, state or
    None). Without a core this is exactly the feed-forward heads call. value_skip: the
    value head reads the value torso beside the value core's output ([T*B, H + I_v])."""
    if core is None:
        if core_input is not None:
            raise ValueError("a recurrent state was given to a network without an LSTM core (--use_lstm=False)")
        return heads(torso, T, B, value_torso), None
    out, value_out, state = core(torso, T, B, core_input, value_torso)
    if value_skip:
        value_out = torch.cat([value_out, value_torso.float()], dim=-1)
    return heads(out, T, B, value_out), state


def recurrent_core(model: nn.Module) -> Optional[LSTMCore]:
    """The model's LSTM core, or None for a feed-forward network."""
    return next((module for module in model.modules() if isinstance(module, LSTMCore)), None)


def state_to_rows(state: Tensor) -> Tensor:
    """[2, L, B, H] -> [B, 2, L, H]: one row per environment, as trajectories store it."""
    return state.permute(2, 0, 1, 3)


def state_from_rows(rows: Tensor) -> Tensor:
    """[B, 2, L, H] -> [2, L, B, H] (contiguous), as the core takes it."""
    return rows.permute(1, 2, 0, 3).contiguous()


def core_input_from_batch(batch: dict) -> Optional[CoreInput]:
    """A learner batch's CoreInput over its T+1 observations, or None (no CORE_STATE field).

    batch[CORE_STATE] [1, B, 2, L, H]: each column's start state; batch["done"] [T, B]: the
    episode ended after step t, so step t+1 starts from a zero state. Step 0 uses the stored
    state as is: the actor already reset it where an episode began there."""
    if CORE_STATE not in batch:
        return None
    done = batch["done"].bool()                                                          # [T, B]
    reset = torch.cat([torch.zeros_like(done[:1]), done])                                # [T+1, B]
    return CoreInput(state_from_rows(batch[CORE_STATE][0].float()), reset)


class EnvCoreStates:
    """The recurrent state of each of E environments, carried from step to step and across
    trajectories by whoever acts for them (an actor's policy, an inference client, a test
    game): [2, L, E, H]. Grows to the highest environment index it is given."""

    def __init__(self, state_shape: tuple, num_envs: int = 0):
        two, layers, hidden = state_shape
        self.state = torch.zeros(two, layers, num_envs, hidden)

    @classmethod
    def for_model(cls, model: nn.Module, num_envs: int = 0) -> Optional["EnvCoreStates"]:
        core = recurrent_core(model)
        return None if core is None else cls(core.state_shape, num_envs)

    def begin(self, env_ids: np.ndarray, reset: Optional[np.ndarray] = None) -> Tensor:
        """The states to act with for env_ids [n], zeroed first where reset [n] (a new
        episode starts with this observation): [2, L, n, H], a copy."""
        ids = torch.as_tensor(np.asarray(env_ids, dtype=np.int64))
        if len(ids) and int(ids.max()) >= self.state.shape[2]:
            grown = torch.zeros(*self.state.shape[:2], int(ids.max()) + 1, self.state.shape[3])
            grown[:, :, : self.state.shape[2]] = self.state
            self.state = grown
        if reset is not None and np.any(reset):
            self.state[:, :, ids[torch.as_tensor(np.asarray(reset, dtype=bool))]] = 0.0
        return self.state[:, :, ids]

    def end(self, env_ids: np.ndarray, state: Tensor) -> None:
        """Keeps the states after the step, [2, L, n, H], for the next one."""
        self.state[:, :, torch.as_tensor(np.asarray(env_ids, dtype=np.int64))] = state.float()

    def step(self, model: nn.Module, obs: Tensor, env_ids: np.ndarray, reset: Optional[np.ndarray] = None):
        """One step of model for the environments env_ids: obs [1, n, ...] -> (ModelOutput
        over [1, n], the states it started from [2, L, n, H])."""
        start = self.begin(env_ids, reset)
        out, state = model.unroll(obs, CoreInput(start, None))
        self.end(env_ids, state)
        return out, start
