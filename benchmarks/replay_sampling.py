"""What replay sampling costs the learner, on Atari-sized data, on this machine.

Data: real Pong trajectories (T=10, obs [4, 84, 84] uint8, random play, features from a
Nature CNN), replicated to fill a replay of 1,000 trajectories, as in the seed's commands.
Batches are the seed's: 100 trajectories, half fresh (queue), half from the replay.

1. Storage: bytes per trajectory and microseconds to write one, with and without LZ4.
2. Sampling: milliseconds to draw and collate one batch (queue share + replay share, to
   tensors) for `standard`, `custom` elite sampling (lambda 6) and attentive sampling
   (lambda 6), with and without compression.
3. The learner: its step time alone, and its updates per second when it pulls batches
   from the mixer with caching off (sampling in its own thread) and on (background
   threads), for each replay kind. The last column compares with `standard`.

Usage: python benchmarks/replay_sampling.py [--updates 12] [--precision fp32|bf16] [--score_steps 2]
"""
from __future__ import annotations

import functools
import argparse
import json
import os
import time

import numpy as np
import torch

from common import print_table, record

from herd.replay.spec import parse_replay_parameters
from herd.envs.gym_envs import GymEnvs
from herd.learner.batches import DirectBatches, PrefetchedBatches
from herd.learner.learner import Learner, build_optimizer, build_scheduler, to_tensors
from herd.losses.impala import ImpalaLossWeights, impala_loss
from herd.models import build_model
from herd.replay.mixer import ReplayMixer
from herd.replay.registry import build_replay
from herd.algos.impala import impala_layout

T, BATCH, CAPACITY, ACTIONS = 10, 100, 1000, 6
LAYOUT = impala_layout(unroll_length=T, obs_shape=(4, 84, 84), obs_dtype="uint8", num_actions=ACTIONS,
                          feature_size=512)
QUEUE = {"type": "queue", "capacity": 1, "sample_ratio": 0.5}
ELITE = {"dist_function": "ln_norm", "lambda_batch_multiplier": 6, "alfa_annealing_factor": 2.0}
KINDS = {
    "standard": {"type": "standard", "capacity": CAPACITY, "sample_ratio": 0.5},
    "elite λ6": {"type": "custom", "capacity": CAPACITY, "sample_ratio": 0.5, "sample_strategy": "elite_sampling", **ELITE},
    "attentive λ6": {"type": "custom", "capacity": CAPACITY, "sample_ratio": 0.5, "sample_strategy": "attentive_sampling",
                     **ELITE},
}


def pong_trajectories(model, count: int) -> list[dict]:
    """`count` real Pong trajectories of random play, field -> [time, ...]."""
    envs = GymEnvs("PongNoFrameskip-v4", 8, seed=0)
    batch, rng, out = envs.start(), np.random.default_rng(0), []
    while len(out) < count:
        obs = np.empty((T + 1, 8, *LAYOUT.obs_shape), np.uint8)
        obs[0] = batch.obs
        actions, rewards, dones = (np.empty((T, 8), np.int64), np.empty((T, 8), np.float32),
                                   np.empty((T, 8), np.bool_))
        for t in range(T):
            actions[t] = rng.integers(ACTIONS, size=8)
            envs.send(actions[t])
            batch = envs.recv()
            obs[t + 1], rewards[t], dones[t] = batch.obs, batch.reward, batch.done
        with torch.no_grad():
            output = model(torch.from_numpy(obs[:T]))
        for e in range(8):
            out.append({"obs": obs[:, e], "action": actions[:, e], "reward": rewards[:, e], "done": dones[:, e],
                        "trunc_value": np.zeros(T, np.float32),
                        "behaviour_logits": output.logits[:, e].numpy(), "behaviour_value": output.value[:, e].numpy(),
                        "features": output.features[:, e].numpy()})
    envs.close()
    return out[:count]


def build_mixer(kind: str, compress: bool, model, score_steps, bf16: bool = False) -> ReplayMixer:
    spec = dict(KINDS[kind])
    if spec["type"] == "custom":
        spec["score_steps"] = score_steps
    specs = parse_replay_parameters(json.dumps([QUEUE, spec]))
    replays = [build_replay(s, LAYOUT, BATCH // 2, 8, compress=compress, anneal_rounds_base=10000) for s in specs]
    for replay in replays:
        replay.attach_model(model, "cpu", bf16=bf16)
    return ReplayMixer(replays, [BATCH // 2, BATCH // 2], fill_in_factor=0.2, seed=0)


def fill(mixer: ReplayMixer, data: list[dict]) -> float:
    """Fills the replay to capacity; returns microseconds per trajectory written."""
    start = time.perf_counter()
    for i in range(CAPACITY):
        mixer.replays[1].add(data[i % len(data)], version=0)
    return (time.perf_counter() - start) / CAPACITY * 1e6


def feed_queue(mixer_or_batches, data: list[dict], start: int) -> None:
    trajectories = [data[(start + i) % len(data)] for i in range(BATCH // 2)]
    if isinstance(mixer_or_batches, ReplayMixer):
        for trajectory in trajectories:
            mixer_or_batches.replays[0].add(trajectory, version=0)
    else:
        for i in range(0, len(trajectories), 10):  # as rollouts of 10 trajectories arrive
            mixer_or_batches.put(trajectories[i:i + 10], version=0)


def sample_ms(mixer: ReplayMixer, data: list[dict], rounds: int) -> float:
    total = 0.0
    for r in range(rounds):
        feed_queue(mixer, data, r * 7)
        start = time.perf_counter()
        mixed = mixer.sample()
        batch, replayed = mixed.data, mixed.replayed
        to_tensors(batch, replayed, torch.device("cpu"))
        total += time.perf_counter() - start
    return total / rounds * 1000


def make_learner(model, precision: str) -> Learner:
    optimizer = build_optimizer("rmsprop", model.parameters(), 0.0008, 0.01)
    return Learner(model, optimizer, build_scheduler(optimizer, 0.0008, 1e-5, 10000), ImpalaLossWeights(use_policy_cloning=True, use_value_cloning=True),
                   40.0, precision=precision)


def learner_rate(mixer, learner, data, caching: bool, updates: int) -> float:
    """Updates per second of the learner pulling batches from `mixer` (fresh data fed as it trains)."""
    batches = (PrefetchedBatches(DirectBatches(mixer, torch.device("cpu")), 1, 1, 3, 4, "wait") if caching
               else DirectBatches(mixer, torch.device("cpu")))
    fed, done, start = 0, -2, None
    try:
        while done < updates:
            if batches.has_room():
                feed_queue(batches, data, fed * 13)
                fed += 1
            ready = batches.next_ready()
            if ready is None:
                time.sleep(0.001)
                continue
            learner.step(ready[0])
            done += 1
            if done == 0:
                start = time.perf_counter()  # two warm-up updates are not timed
    finally:
        batches.close()
    return updates / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--updates", type=int, default=12, help="timed learner updates per configuration")
    parser.add_argument("--sample_rounds", type=int, default=10)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--score_steps", default="2", help='time steps per scored candidate, or "all"')
    args = parser.parse_args()
    score_steps = args.score_steps if args.score_steps == "all" else int(args.score_steps)
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    model = build_model("nature_cnn", LAYOUT.obs_shape, "uint8", ACTIONS, 512)
    data = pong_trajectories(build_model("nature_cnn", LAYOUT.obs_shape, "uint8", ACTIONS, 512), 200)

    learner = make_learner(model, args.precision)
    step_batch = to_tensors(*build_and_sample(model, data, score_steps), torch.device("cpu"))
    for _ in range(2):
        learner.step(step_batch)
    start = time.perf_counter()
    for _ in range(5):
        learner.step(step_batch)
    step_ms = (time.perf_counter() - start) / 5 * 1000

    rows, results = [], {"learner_step_ms": round(step_ms, 1), "configs": []}
    for kind in KINDS:
        for compress in (False, True):
            mixer = build_mixer(kind, compress, model, score_steps, bf16=args.precision == "bf16")
            write_us = fill(mixer, data)
            per_trajectory = mixer.replays[1].storage.nbytes() / CAPACITY
            ms = sample_ms(mixer, data, args.sample_rounds)
            rates = {caching: learner_rate(mixer, learner, data, caching, args.updates) for caching in (False, True)}
            results["configs"].append({"kind": kind, "compress": compress, "bytes_per_trajectory": round(per_trajectory),
                                       "write_us": round(write_us, 1), "sample_ms": round(ms, 1),
                                       "updates_per_s_caching_off": round(rates[False], 3),
                                       "updates_per_s_caching_on": round(rates[True], 3)})
    base = {c["compress"]: c for c in results["configs"] if c["kind"] == "standard"}
    for c in results["configs"]:
        ref = base[c["compress"]]
        c["vs_standard_caching_on"] = round(c["updates_per_s_caching_on"] / ref["updates_per_s_caching_on"], 3)
        c["vs_standard_caching_off"] = round(c["updates_per_s_caching_off"] / ref["updates_per_s_caching_off"], 3)
        rows.append([c["kind"], "lz4" if c["compress"] else "off", f"{c['bytes_per_trajectory'] / 1024:.0f}",
                     f"{c['write_us']:.0f}", f"{c['sample_ms']:.1f}", f"{c['updates_per_s_caching_off']:.2f}",
                     f"{c['updates_per_s_caching_on']:.2f}", f"{100 * c['vs_standard_caching_on']:.0f}%"])
    print(f"learner step alone (batch {BATCH}, T {T}, Nature CNN, {args.precision}, "
          f"{torch.get_num_threads()} threads): {step_ms:.0f} ms")
    print_table(["replay", "compression", "KiB/traj", "write µs", "sample ms/batch", "updates/s caching off",
                 "updates/s caching on", "on vs standard"], rows)
    record(f"replay_sampling_{args.precision}_steps{args.score_steps}",
           {"command": f"python benchmarks/replay_sampling.py --updates {args.updates} --precision {args.precision} "
                       f"--score_steps {args.score_steps}", "batch_size": BATCH, "unroll_length": T,
            "capacity": CAPACITY, "score_steps": args.score_steps, "precision": args.precision, **results})


def build_and_sample(model, data, score_steps):
    """One standard batch (numpy) for timing the learner step on its own."""
    mixer = build_mixer("standard", False, model, score_steps)
    fill(mixer, data)
    feed_queue(mixer, data, 0)
    mixed = mixer.sample()
    batch, replayed = mixed.data, mixed.replayed
    return batch, replayed


if __name__ == "__main__":
    main()
