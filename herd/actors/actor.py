"""The actor loop: receive a batch of observations from the actor's environments, let the
policy act on it, send the actions back, and write every step into shared-memory slots
whose indices go to the learner. Where observations come from (per-process gymnasium
envs, ale-py's C++ vector env) and who acts (the actor's own CPU model, a batched
inference server) are the two seams of herd/actors/interfaces.py."""
from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import sys
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from herd.interfaces import ActorEnvs, ActorPolicy
from herd.actors.policy import LocalPolicy
from herd.actors.rollout import ActorStopped, RolloutWriter, truncated_values
from herd.envs.actor_envs import make_actor_envs
from herd.actors.double_buffer import collect_double_buffered, double_buffered
from herd.inference import InferenceServerGone
from herd.inference.in_actor import InActorInference
from herd.inference.routing import InferenceRoute, RoutedClient
from herd.store import TrajectorySlots
from herd.weights import PublisherGone, SharedWeights


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
    env_backend: str = "gymnasium"          # herd.envs.actor_envs.ENV_BACKENDS
    env_threads: int = 1                    # C++ backend: stepping threads of this actor
    env_batch_size: int = 0                 # C++ backend: rows per batch, 0 = all (synchronous)
    algorithm: str = "impala"               # herd.algos: how the local policy acts
    verbose_interval: int = 0               # print a progress line every N rollouts (0: never)
    worker_count: int = 1                   # N, the actors of the run (Ape-X: actor i's epsilon)
    act_options: dict = field(default_factory=dict)   # the algorithm's actor_options(cfg)
    record_fields: tuple | None = None      # the step fields the trajectory layout holds (None: all)
    double_buffer: bool = False             # two half-batches in flight (with an inference server)
    one_slot: bool = False                  # --shared_queue_size=1: double-buffered halves end rollouts together


class Rollout(NamedTuple):
    """Message from an actor to the learner: slot `slot` holds a finished rollout."""
    slot: int
    actor_id: int
    version: int                           # oldest policy version that acted in it
    steps: int                             # environment (agent) steps in the rollout
    episodes: list                         # (score, length) of whole episodes that ended


class ActorProgress:
    """The seed's --worker_verbose: one stderr line per `interval` rollouts of this actor."""

    def __init__(self, actor_id: int, interval: int, stream=None):
        self.actor_id, self.interval = actor_id, interval
        self.stream = stream or sys.stderr
        self.rollouts = self.steps = self.games = 0
        self.scores: deque = deque(maxlen=100)

    def delivered(self, steps: int, episodes: list) -> None:
        self.rollouts += 1
        self.steps += steps
        self.games += len(episodes)
        self.scores.extend(score for score, _ in episodes)
        if self.interval and self.rollouts % self.interval == 0:
            average = f"{np.mean(self.scores):.2f}" if self.scores else "-"
            self.stream.write(f"[herd] actor {self.actor_id}: {self.rollouts} rollouts, {self.steps:,} steps, "
                              f"{self.games} games, average of the last {len(self.scores)}: {average}\n")
            self.stream.flush()


def act_and_collect(envs: ActorEnvs, policy: ActorPolicy, writer: RolloutWriter, send_rollout, stop) -> None:
    """The loop itself; returns when `stop` is set (or raises ActorStopped)."""
    for delivery in collect_rollouts(envs, policy, writer, stop):
        send_rollout(delivery)


def collect_rollouts(envs: ActorEnvs, policy: ActorPolicy, writer: RolloutWriter, stop):
    """Steps the envs and yields each finished rollout's Delivery (its slot is complete)
    until `stop` is set. A generator, so that a backend can also pull one rollout at a
    time (the Ray actor returns one per call). A policy whose finish_rollout is set
    completes each rollout's fields before it is yielded (Ape-X's initial priorities);
    the policy refreshes its weights once the rollouts of a step were taken and the next
    slot is open (with one slot per actor, that is after the learner gave the slot back:
    under --synchronous_sampling, after it trained on the rollout and published)."""
    finish = policy.finish_rollout
    batch = envs.start()
    writer.observe(batch)
    while not stop.is_set():
        # env_ids and done let a recurrent policy pick each row's state and reset it where
        # an episode begins with this observation (same-step autoreset, interfaces.py).
        out = policy.act(batch.obs, batch.env_ids, batch.done)            # [n] rows of the batch
        writer.record_action(batch.env_ids, out)
        envs.send(out.actions)
        batch = envs.recv()
        delivered = writer.record_outcome(batch, truncated_values(policy, batch))
        for delivery in delivered:
            if finish is not None:
                finish(writer.views_of(delivery.slot))
            yield delivery
        # obs[t+1], or obs[0] of the next slot: after the deliveries, since opening a slot
        # may wait for a delivered one to come back (with --shared_queue_size=1).
        writer.observe(batch)
        if delivered:
            policy.refresh()


def run_as_throughput_work() -> None:
    """On Linux, this process (and the emulator threads it starts) runs SCHED_BATCH: same
    share of the CPU, but when it wakes it does not preempt the running process. An
    actor woken by its inference server's answer then lets the server finish its batch
    and ring the other clients, and one woken by a free slot lets the learner finish its
    step (measured with benchmarks/pipeline.py's server mode: docs/benchmarks.md).
    Elsewhere nothing changes."""
    if sys.platform.startswith("linux"):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


def run_actor(actor_id: int, spec: ActorSpec, slots: TrajectorySlots, free_slots, rollouts,
              weights: SharedWeights, stop, inference: InferenceRoute | InActorInference | None = None) -> None:
    """Process entry point. `free_slots`: this actor's FreeSlots, the indices it may fill;
    `rollouts`: the write end of this actor's pipe to the learner; `stop`: an Event;
    `inference`: this actor's place at a batched inference server, or the server's path to
    run in this process (herd/inference/in_actor.py); None: act with a local model."""
    # Ctrl+C reaches the whole process group: the main process alone decides how to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    run_as_throughput_work()
    torch.set_num_threads(spec.torch_threads)
    torch.manual_seed(spec.seed)
    parent = multiprocessing.parent_process()
    if isinstance(inference, InActorInference):
        inference = inference.start()       # its own BatchServer, reached like a server's

    def acquire() -> int:
        while not stop.is_set():
            if parent is not None and not parent.is_alive():
                break  # the learner was killed (kill -9): no one will ever read our rollouts
            try:
                return free_slots.get(timeout=0.2)
            except queue.Empty:
                continue
        raise ActorStopped

    progress = ActorProgress(actor_id, spec.verbose_interval)

    def send_rollout(delivery) -> None:
        rollouts.send(Rollout(delivery.slot, actor_id, delivery.version, delivery.steps, delivery.episodes))
        progress.delivered(delivery.steps, delivery.episodes)

    # Where the server records steps itself (herd/inference/records.py), the writer leaves
    # those fields to it and tells it each row's places; the client returns the rest.
    recorded = inference.recorded if inference is not None else ()
    writer = RolloutWriter(slots.views, acquire, spec.unroll_length, spec.envs_per_worker, recorded)
    place_of = writer.places if recorded else None
    record = spec.record_fields if not recorded else tuple(n for n in spec.record_fields or () if n not in recorded)
    if inference is not None and spec.double_buffer:
        envs, policy = double_buffered(spec, inference, stop, record, place_of)
    else:
        envs = make_actor_envs(spec.env_backend, spec.env_id, spec.envs_per_worker, seed=spec.seed,
                               threads=spec.env_threads, batch_size=spec.env_batch_size, env_kwargs=spec.env_kwargs)
    if inference is None:
        policy = LocalPolicy(spec.model_kwargs, weights, seed=spec.seed, algorithm=spec.algorithm, actor_id=actor_id,
                             num_actors=spec.worker_count, options=spec.act_options, num_envs=spec.envs_per_worker,
                             record=spec.record_fields)
    elif not spec.double_buffer:
        policy = RoutedClient(inference, stop=stop, seed=spec.seed, record=record, place_of=place_of)
    if spec.double_buffer and inference is not None:
        deliveries = collect_double_buffered(envs, policy, writer, stop, together=spec.one_slot)
    else:
        deliveries = collect_rollouts(envs, policy, writer, stop)
    try:
        for delivery in deliveries:
            send_rollout(delivery)
    except (ActorStopped, BrokenPipeError, EOFError, InferenceServerGone, PublisherGone):
        pass  # asked to stop, or the learner (or its inference server) is gone
    finally:
        policy.close()
        envs.close()
