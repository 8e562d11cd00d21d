"""Does a refactor change what IMPALA computes? Run this once per source tree (e.g. the
commit before a change and the one after) and compare the digests it prints.

For each configuration (the on-policy queue alone, with a uniform replay's columns, with
elite replay, Ape-X's prioritized replay): the same config and seed, 50 identical
synthetic rollouts fed to a real training session (config resolution, replays, mixer,
learner, loss), then a digest
of the parameters after every update that followed, and the actions and logits an actor's
local policy gives for the same observations with the same seed. Equal digests mean
bit-identical updates and actions; timing cannot enter, unlike a learning benchmark.

Checkpoints: `--save DIR` also writes each configuration's checkpoint after 25 rollouts,
`--resume DIR` loads those (another tree's: do checkpoints written before a change resume
exactly?) and feeds the other 25; digests equal to those of a run that never stopped say
they do.

Usage: PYTHONPATH=<tree> python benchmarks/equivalence.py [--label after] [--save DIR |
--resume DIR] (records benchmarks/results/equivalence_<label>.json)."""
from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
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
# Pong's options that the defaults have moved since older trees, pinned so that two trees
# compare the same configuration (the seed's values, fp32, no prefetching: batches in an
# order that timing cannot change).
PONG = {"env": "PongNoFrameskip-v4", "batch_size": "8", "envs_per_worker": "8", "caching": "False",
        "learner_precision": "fp32", "learner_compile": "False", "normalize_observations": "False",
        "entropy_loss_weight": "0.01", "environment_max_steps": "15000000", "algorithm": "impala"}
# CartPole's defaults train with Adam, whose CPU step moved to aten's fused kernel (other
# rounding, by design); RMSprop's arithmetic is the same in older trees, so the CartPole
# rows pin it and compare what the data path hands the update.
CARTPOLE = {"env": "CartPole-v1", "algorithm": "impala", "optimizer": "rmsprop"}
CONFIGS = {
    "cartpole-queue": CARTPOLE,
    "cartpole-queue+standard": {**CARTPOLE, "replay_parameters": QUEUE_AND_STANDARD, "caching": "False"},
    "cartpole-apex-prioritized": {**CARTPOLE, "algorithm": "apex", "caching": "False",
                                  "training_fill_in_factor": "0.05"},
    "pong-queue": PONG,
    "pong-queue+standard": {**PONG, "replay_parameters": QUEUE_AND_STANDARD},
    "pong-queue+elite": {**PONG, "replay_parameters": QUEUE_AND_ELITE},
}
ROLLOUTS = 50
SAVE_AT = 25          # --save / --resume: the checkpoint after this many rollouts


def prepare(options: dict):
    try:
        from herd.plan import prepare as prepare_plan      # since the seams (algorithm builders)
    except ImportError:
        from herd.run import prepare as prepare_plan       # before
    return prepare_plan(options)


def herd_tree() -> str:
    """The commit of the herd being measured (the PYTHONPATH tree's), '+changes' if its tree differs."""
    import herd
    folder = Path(herd.__file__).parent
    commit = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--", "."], capture_output=True,
                           text=True).stdout.strip()
    return commit + ("+changes" if dirty else "")


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


def run_config(options: dict, save_to: Path | None = None, resume_from: Path | None = None) -> dict:
    """save_to: also writes a checkpoint there after the first SAVE_AT rollouts; resume_from:
    loads the checkpoint there (written by another tree, perhaps) and feeds the rollouts
    after the first SAVE_AT (the same ones)."""
    from herd.actors.policy import LocalPolicy
    from herd.checkpoint import load_checkpoint
    from herd.run import seed_everything
    try:
        from herd.training import build_session
    except ImportError:
        from herd.train import build_session              # before herd/training.py
    from herd.weights import SharedWeights

    plan = prepare({**options, "seed": 123, "tensorboard": False, "basic_verbose": False})
    seed_everything(plan.cfg)
    session = build_session(plan, Path(tempfile.mkdtemp()))
    if resume_from is not None:
        state, _ = load_checkpoint(resume_from)
        session.load_state_dict(state, load_optimizer=True)
    rng = np.random.default_rng(0)
    envs, actions = plan.cfg.parallel.envs_per_worker, plan.env_spec.num_actions
    for index in range(ROLLOUTS):
        views = synthetic_rollout(plan.layout.fields(), envs, actions, rng)
        if resume_from is not None and index < SAVE_AT:
            continue                            # fed before the checkpoint was written
        steps = views["action"].size
        session.ingest(views, version=max(0, session.counters.updates - 1), steps=steps, episodes=[(10.0, 10)])
        session.train_ready_batches(lambda version: None)
        if save_to is not None and index == SAVE_AT - 1:
            shutil.copy(session.save(), save_to)
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
    parser.add_argument("--save", type=Path, help="a folder: also write each configuration's checkpoint after "
                                                  f"{SAVE_AT} rollouts there")
    parser.add_argument("--resume", type=Path, help="a folder of --save's checkpoints (another tree's, perhaps): "
                                                    f"resume each and feed the rollouts after the first {SAVE_AT}")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.save is not None:
        args.save.mkdir(parents=True, exist_ok=True)

    def checkpoint(folder: Path | None, name: str) -> Path | None:
        return None if folder is None else folder / f"{name}.pt"
    results = {name: run_config(options, checkpoint(args.save, name), checkpoint(args.resume, name))
               for name, options in CONFIGS.items()}
    print_table(["configuration", "updates", "parameters", "actions", "logits"],
                [[name, r["updates"], r["parameters"], r["actions"], r["logits"]] for name, r in results.items()])
    record(f"equivalence_{args.label}", {"herd": herd_tree(), "rollouts": ROLLOUTS, "configs": CONFIGS, "results": results,
                                         "resumed_after": SAVE_AT if args.resume else None})


if __name__ == "__main__":
    main()
