"""Does a refactor change what IMPALA computes? Run this once per source tree (e.g. the
commit before a change and the one after) and compare the digests it prints.

For each configuration: the same config and seed, 40 identical synthetic rollouts fed to
a real training session (config resolution, replays, mixer, learner, loss), then a digest
of the parameters after every update that followed, and the actions and logits an actor's
local policy gives for the same observations with the same seed. Equal digests mean
bit-identical updates and actions; timing cannot enter, unlike a learning benchmark.

Usage: PYTHONPATH=<tree> python benchmarks/equivalence.py [--label after]
(records benchmarks/results/equivalence_<label>.json)."""
from __future__ import annotations

import argparse
import hashlib
import tempfile
from pathlib import Path

import numpy as np
import torch

from common import print_table, record

QUEUE_AND_STANDARD = ('[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, '
                      '{"type": "standard", "capacity": 100, "sample_ratio": 0.5}]')
QUEUE_AND_ELITE = ('[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, {"type": "custom", "capacity": 50, '
                   '"sample_ratio": 0.5, "dist_function": "ln_norm", "sample_strategy": "elite_sampling", '
                   '"lambda_batch_multiplier": 3}]')
CONFIGS = {
    "cartpole-queue": {"env": "CartPole-v1"},
    "cartpole-queue+standard": {"env": "CartPole-v1", "replay_parameters": QUEUE_AND_STANDARD, "caching": "False"},
    "pong-queue+elite": {"env": "PongNoFrameskip-v4", "batch_size": "8", "envs_per_worker": "2", "caching": "False",
                         "learner_precision": "fp32", "replay_parameters": QUEUE_AND_ELITE},
}
ROLLOUTS = 40


def prepare(options: dict):
    try:
        from herd.plan import prepare as prepare_plan      # since the seams (algorithm builders)
    except ImportError:
        from herd.run import prepare as prepare_plan       # before
    return prepare_plan(options)


def digest(arrays) -> str:
    h = hashlib.sha256()
    for array in arrays:
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()[:16]


def synthetic_rollout(fields: dict, envs: int, num_actions: int, rng: np.random.Generator) -> dict:
    """field -> [time, E, ...] as an actor's slot holds it, with plausible values."""
    views = {}
    for name, (shape, dtype) in fields.items():
        full = (shape[0], envs, *shape[1:])
        if name == "action":
            views[name] = rng.integers(0, num_actions, size=full).astype(dtype)
        elif name == "done":
            views[name] = rng.random(full) < 0.05
        elif dtype == np.uint8:
            views[name] = rng.integers(0, 255, size=full).astype(dtype)
        else:
            views[name] = rng.standard_normal(full).astype(dtype)
    views["trunc_value"][:] = 0
    return views


def run_config(options: dict) -> dict:
    from herd.actors.policy import LocalPolicy
    from herd.run import seed_everything
    from herd.training import build_session
    from herd.weights import SharedWeights

    plan = prepare({**options, "seed": 123, "tensorboard": False, "basic_verbose": False})
    seed_everything(plan.cfg)
    session = build_session(plan, Path(tempfile.mkdtemp()))
    rng = np.random.default_rng(0)
    envs, actions = plan.cfg.parallel.envs_per_worker, plan.env_spec.num_actions
    for _ in range(ROLLOUTS):
        views = synthetic_rollout(plan.layout.fields(), envs, actions, rng)
        steps = views["action"].size
        session.ingest(views, version=max(0, session.counters.updates - 1), steps=steps, episodes=[(10.0, 10)])
        session.train_ready_batches(lambda version: None)
    params = digest(p.detach().numpy() for p in session.learner.model.parameters())
    policy = LocalPolicy(plan.model_kwargs, SharedWeights(session.learner.model), seed=5)
    step = policy.act(views["obs"][0])
    logits = step.fields["behaviour_logits"] if hasattr(step, "fields") else step.logits   # before: .logits
    session.batches.close()
    return {"updates": session.counters.updates, "parameters": params, "actions": digest([step.actions]),
            "logits": digest([logits])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", default="now", help="names the results file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {name: run_config(options) for name, options in CONFIGS.items()}
    print_table(["configuration", "updates", "parameters", "actions", "logits"],
                [[name, r["updates"], r["parameters"], r["actions"], r["logits"]] for name, r in results.items()])
    record(f"equivalence_{args.label}", {"rollouts": ROLLOUTS, "configs": CONFIGS, "results": results})


if __name__ == "__main__":
    main()
