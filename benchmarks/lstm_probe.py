"""Looks inside CartPole MLP checkpoints (with or without the LSTM core) for the LSTM's (docs/lstm.md)
late collapse: plays 16 sampled games from each and prints, per checkpoint,

  games     mean length with the core's state carried through each game (as actors do) and
            with it zeroed every 16 steps (the learner's unroll); equal lengths mean the
            policy does not depend on memory older than one trajectory
  stale     mean |P(a=1)| change when checkpoint k+d's weights unroll each 16-step window
            from the state checkpoint k carried there (what the learner does d updates
            later) instead of from its own state, next to the change of the policy itself
            (both from k's state): how much the stored start states' staleness matters
  value     what the value head reads: mean |h| and the share of units with |h| > 0.9
            (saturated), for the value LSTM, the policy LSTM and a feed-forward value torso

Usage: python benchmarks/lstm_probe.py RUN_DIR [--every 4] [--lag 1]
(RUN_DIR/checkpoints/ckpt_*.pt: keep them with --save_model_period; herd keeps the last 3)."""
from __future__ import annotations

import argparse
import glob

import gymnasium as gym
import numpy as np
import torch

from herd.checkpoint import load_checkpoint
from herd.models import build_model
from herd.models.core import CoreInput

WINDOW = 16        # the vector profile's unroll length T


def load(path: str):
    state, _ = load_checkpoint(path)
    lstm = 64 if any(k.startswith("core.") for k in state["model"]) else 0
    value_in = state["model"]["heads.value.weight"].shape[1]
    model = build_model("mlp", (4,), "float32", 2, 64, lstm_size=lstm)
    if model.heads.value.weight.shape[1] != value_in:       # a checkpoint from before the value skip
        model.heads.value = torch.nn.Linear(value_in, 1)
        model.value_skip = False
    model.load_state_dict(state["model"])
    return model.eval(), bool(lstm)


def step(model, lstm: bool, obs: np.ndarray, state):
    x = torch.tensor(obs, dtype=torch.float32)[None]
    if not lstm:
        return model(x), None
    return model.unroll(x, CoreInput(state, None))


def play(model, lstm: bool, games: int = 16, reset_every: int = 0, steps: int = 500, seed: int = 0):
    """Lengths of `games` sampled games, and their observations [t, games, 4] with an alive mask."""
    g = torch.Generator().manual_seed(seed)
    envs = [gym.make("CartPole-v1") for _ in range(games)]
    obs = np.stack([e.reset(seed=seed * 1000 + i)[0] for i, e in enumerate(envs)]).astype(np.float32)
    state = model.core.initial_state(games) if lstm else None
    alive, lengths, seen, masks = np.ones(games, bool), np.zeros(games, int), [], []
    for t in range(steps):
        if lstm and reset_every and t % reset_every == 0:
            state = state * 0
        with torch.no_grad():
            out, state = step(model, lstm, obs, state)
        actions = torch.multinomial(torch.softmax(out.logits[0], -1), 1, generator=g)[:, 0]
        seen.append(obs.copy())
        masks.append(alive.copy())
        for i, env in enumerate(envs):
            if alive[i]:
                obs[i], _, terminated, truncated, _ = env.step(int(actions[i]))
                lengths[i] += 1
                alive[i] = not (terminated or truncated)
        if not alive.any():
            break
    return lengths, torch.tensor(np.stack(seen)), torch.tensor(np.stack(masks))


def stale(old, new, obs: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """(|dP| learner-from-stale-state vs own state, |dP| of the policy change), steps 32+."""
    T, B = obs.shape[:2]
    with torch.no_grad():
        own = torch.softmax(new.unroll(obs, CoreInput(new.core.initial_state(B), None))[0].logits, -1)[..., 1]
        state, rows = old.core.initial_state(B), []
        for s in range(0, T - WINDOW + 1, WINDOW):
            window = obs[s:s + WINDOW]
            out_old, next_state = old.unroll(window, CoreInput(state, None))
            out_new, _ = new.unroll(window, CoreInput(state, None))
            if s >= 2 * WINDOW:
                rows.append((torch.softmax(out_new.logits, -1)[..., 1], own[s:s + WINDOW],
                             torch.softmax(out_old.logits, -1)[..., 1], mask[s:s + WINDOW]))
            state = next_state
    if not rows:
        return float("nan"), float("nan")
    from_stale, from_own, before, m = (torch.cat(x) for x in zip(*rows))
    return float((from_stale - from_own)[m].abs().mean()), float((from_stale - before)[m].abs().mean())


def value_inputs(model, lstm: bool, obs: torch.Tensor, mask: torch.Tensor) -> dict:
    T, B = obs.shape[:2]
    flat = obs.reshape(T * B, 4)
    with torch.no_grad():
        if not lstm:
            return {"value torso": model.value_torso(flat).view(T, B, -1)[mask]}
        y, vy, _ = model.core(model.torso(flat), T, B, CoreInput(model.core.initial_state(B), None),
                              model.value_torso(flat))
    return {"value LSTM": vy.view(T, B, -1)[mask], "policy LSTM": y.view(T, B, -1)[mask]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--every", type=int, default=4, help="every Nth checkpoint")
    parser.add_argument("--lag", type=int, default=1, help="checkpoints between k and k+d for `stale`")
    args = parser.parse_args()
    torch.set_num_threads(1)
    paths = sorted(glob.glob(f"{args.run_dir}/checkpoints/ckpt_*.pt"))
    for i in range(0, len(paths), args.every):
        model, lstm = load(paths[i])
        lengths, obs, mask = play(model, lstm)
        line = f"{paths[i].split('_')[-1][:-3]}  games: carried {lengths.mean():5.1f}"
        if lstm:
            line += f", reset every {WINDOW} {play(model, lstm, reset_every=WINDOW)[0].mean():5.1f}"
            if i + args.lag < len(paths):
                line += "  stale: |dP| %.4f vs policy change %.4f" % stale(model, load(paths[i + args.lag])[0], obs, mask)
        for name, h in value_inputs(model, lstm, obs, mask).items():
            line += f"  {name}: |h| {h.abs().mean():.2f}, >0.9 {(h.abs() > 0.9).float().mean():.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
