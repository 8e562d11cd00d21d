"""Pong's opening rally, traced from the emulator's memory: why policies that win every
other point lose it (docs/benchmarks.md, "The opening rally").

Each game starts with the same serve (the reset's no-ops shift only its timing): the ball
goes to the opponent, which hits it near the bottom edge; the ball climbs steeply, comes
off the top wall and drops to the agent near the bottom, while the agent's paddle starts
at mid-height. No later rally of a game that the agent leads takes this path (after a
point the agent won, the serve goes to the opponent upwards). For each reset seed this runs herd's own Atari preprocessing (herd/envs/atari.py
wrap_atari over ALE's PongNoFrameskip-v4) with the agent doing nothing, and reads, after
every agent step (4 frames), the ball's position and the paddles' heights from the RAM
addresses of AtariARI's Pong annotation (ball x 49, ball y 54, agent y 51, opponent y 50;
y grows downwards). It prints, per seed, the agent step and the ball's height at the
opponent's hit and at the bounce off the top wall, the step of the point, the ball's last
height before it and the agent's paddle height (where it started).

Usage: python benchmarks/pong_opening.py [--seeds 8]
Records benchmarks/results/pong_opening.json.
"""
from __future__ import annotations

import argparse

import ale_py
import gymnasium as gym

from common import print_table, record

from herd.envs.atari import NOOP, wrap_atari

BALL_X, BALL_Y, AGENT_Y, OPPONENT_Y = 49, 54, 51, 50
MAX_STEPS = 400


def opening(seed: int) -> dict:
    """The no-op agent's opening rally for one reset seed."""
    gym.register_envs(ale_py)
    raw = gym.make("PongNoFrameskip-v4")
    env = wrap_atari(raw)
    env.reset(seed=seed)
    ale = raw.unwrapped.ale
    path = []                                  # (ball x, ball y, agent y) after each agent step
    reward = 0.0
    for _ in range(MAX_STEPS):
        _, reward, terminated, truncated, _ = env.step(NOOP)
        ram = ale.getRAM()
        path.append((int(ram[BALL_X]), int(ram[BALL_Y]), int(ram[AGENT_Y])))
        if reward != 0 or terminated or truncated:
            break
    env.close()
    xs, ys = [p[0] for p in path], [p[1] for p in path]
    # The opponent's hit: the ball's x turns from falling to rising (it travels left first);
    # the bounce: its y turns from falling to rising after that (the top wall).
    hit = next((t for t in range(1, len(xs) - 1) if xs[t - 1] > xs[t] < xs[t + 1]), None)
    bounce = next((t for t in range((hit or 0) + 1, len(ys) - 1) if ys[t - 1] > ys[t] < ys[t + 1]), None)
    # The step that ends the point already shows the next serve's reset ball: the last
    # position is the step before it.
    return {"seed": seed, "opponent_hit_step": hit, "top_wall_step": bounce, "point_step": len(path),
            "reward": reward, "hit_y": ys[hit] if hit else None, "top_wall_y": ys[bounce] if bounce else None,
            "last_ball_y": ys[-2], "agent_y": path[-2][2]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    args = parser.parse_args()
    rows = [opening(seed) for seed in range(args.seeds)]
    print("Pong's opening rally with a no-op agent (agent steps of 4 frames; heights in RAM units, "
          "y grows downwards)")
    print_table(["seed", "opponent hits (step)", "at y", "top wall (step)", "at y", "point (step)", "reward",
                 "ball's last y", "agent paddle y"],
                [[r["seed"], r["opponent_hit_step"], r["hit_y"], r["top_wall_step"], r["top_wall_y"], r["point_step"],
                  r["reward"], r["last_ball_y"], r["agent_y"]] for r in rows])
    record("pong_opening", {"command": f"python benchmarks/pong_opening.py --seeds {args.seeds}", "rows": rows})


if __name__ == "__main__":
    main()
