"""Test mode: play `test_episode_count` episodes with a saved policy and report scores."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from herd.envs import make_env
from herd.models import build_model

log = logging.getLogger("herd")


def play_episodes(model, env_id: str, env_kwargs: dict, episodes: int, num_envs: int, seed: int) -> list[float]:
    """Whole-game scores of `episodes` episodes, played by `num_envs` envs in lockstep."""
    envs = [make_env(env_id, seed=seed + i, **env_kwargs) for i in range(num_envs)]
    obs = np.stack([env.reset()[0] for env in envs])
    scores: list[float] = []
    while len(scores) < episodes:
        with torch.no_grad():
            logits = model(torch.from_numpy(obs).unsqueeze(0)).logits[0]       # [E, A]
            actions = torch.multinomial(torch.softmax(logits, -1), 1).squeeze(1).numpy()
        for e, env in enumerate(envs):
            o, _, terminated, truncated, info = env.step(int(actions[e]))
            if "episode_score" in info and len(scores) < episodes:
                scores.append(float(info["episode_score"]))
            if terminated or truncated:
                o, _ = env.reset()
            obs[e] = o
    for env in envs:
        env.close()
    return scores


def test_policy(plan, run_dir: Path) -> int:
    from herd.run import env_kwargs, write_json
    cfg = plan.cfg
    model = build_model(**plan.model_kwargs)
    model.load_state_dict(plan.checkpoint["model"])
    model.eval()
    torch.set_num_threads(max(1, cfg.train.learner_thread_count))
    count = cfg.test.test_episode_count
    scores = play_episodes(model, cfg.env.env, env_kwargs(cfg), count, min(8, count), cfg.general.seed)
    result = {"episodes": len(scores), "mean": float(np.mean(scores)), "std": float(np.std(scores)),
              "min": float(np.min(scores)), "max": float(np.max(scores)), "checkpoint": str(plan.checkpoint_path)}
    write_json(run_dir / "test_results.json", result)
    print(f"test: {result['episodes']} episodes, mean {result['mean']:.2f} ± {result['std']:.2f}, "
          f"min {result['min']:.2f}, max {result['max']:.2f}")
    return 0
