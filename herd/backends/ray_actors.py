"""What runs inside the Ray backend's actors, and how weights reach them.

    learner (driver)                                    RolloutWorker (a Ray actor, any node)
      next_rollout.remote(version, [ref])  x slots  ->  takes those weights (or newer), then steps
                                                        its E envs until a rollout is done
      ray.wait / ray.get  <-- two object refs -------   returns Rollout, {field: [T(+1), E, ...]}
      ray.put(weights) once per update
      offer_weights.remote(version, [ref]) ---------->  remembers the newest ref; pulls the
                                                        weights (ray.get) between rollouts

A rollout travels as the return values of a call: its metadata (steps, games, version)
and its arrays, two objects. Ray serializes the slot's arrays into the object store of the
actor's node when the call returns (one copy), moves them to the learner's node if it is
another (one more), and the learner reads them there without a copy; or, with a replay
server (herd/backends/ray_replay.py), the learner reads the metadata only and the server's
node fetches the arrays. A rollout's objects are immutable: they arrive whole or their
refs raise, so nothing half-written can reach the learner or the server. The learner
keeps slots_per_actor calls queued per actor: they bound how far an actor runs ahead, as
its slots do in the local backend.

Weights are one ray.put per update (a flat float32 vector). Each call tells its actor the
newest ref, and so does a tiny call in its own concurrency group, for an actor whose
queued calls would tell it late. The actor fetches the vector only when it refreshes,
between rollouts: one copy per node in Ray's object store, not one per actor sent by the
learner."""
from __future__ import annotations

import os
import signal
from collections import deque

import numpy as np
import ray
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from herd.actors.actor import ActorProgress, ActorSpec, Rollout, collect_rollouts
from herd.actors.policy import LocalPolicy
from herd.envs.actor_envs import make_actor_envs
from herd.actors.rollout import RolloutWriter
from herd.backends.ray_wire import pack_obs
from herd.store import TrajectorySlots
from herd.trajectory import TrajectoryLayout

# The concurrency group of offer_weights: its own thread, never queued behind next_rollout.
WEIGHTS_GROUP = "weights"


class WeightsBoard:
    """Learner side: the newest published weights as (version, object ref)."""

    def __init__(self):
        self.version, self.ref = -1, None

    def publish(self, model: torch.nn.Module, version: int) -> int:
        with torch.no_grad():
            vector = parameters_to_vector(model.parameters()).detach().cpu().numpy()   # [P] float32
        self.ref = ray.put(vector)       # the one copy; the previous ref is dropped, Ray frees it
        self.version = version
        return version

    def newest(self) -> tuple[int, list]:
        """(version, [ref]): the ref inside a list, so Ray passes it on instead of resolving it."""
        return self.version, [self.ref]


class PulledWeights:
    """Actor side: duck-types herd.weights.SharedWeights for LocalPolicy (version, pull)."""

    def __init__(self, version: int, ref):
        self.offered = (version, ref)

    @property
    def version(self) -> int:
        return self.offered[0]

    def offer(self, version: int, ref) -> None:
        if version > self.offered[0]:
            self.offered = (version, ref)     # one assignment: the pulling thread sees old or new, whole

    def pull(self, model: torch.nn.Module, have_version: int) -> int:
        version, ref = self.offered
        if version == have_version:
            return have_version
        vector = ray.get(ref)                 # [P] float32, read-only view of the object store
        with torch.no_grad():
            # vector_to_parameters makes the parameters views of the vector: give them their own copy.
            vector_to_parameters(torch.from_numpy(np.array(vector)), model.parameters())
        return version


class Never:
    """A stop event that is never set: the learner ends a Ray actor by killing it."""

    @staticmethod
    def is_set() -> bool:
        return False


class RolloutWorker:
    """A Ray actor: spec.envs_per_worker environments (either env backend), its own CPU
    model, and `slots` trajectory slots of its own; one finished rollout per call."""

    def __init__(self, actor_id: int, spec: ActorSpec, layout: TrajectoryLayout, slots: int, version: int, refs: list,
                 compress_obs: bool = False):
        """compress_obs: observations leave LZ4-compressed (--ray_compress_obs, herd/backends/ray_wire.py)."""
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)     # the learner alone decides how to stop
        except ValueError:
            pass     # not the main thread: Ray's workers start with SIGINT blocked anyway
        torch.set_num_threads(spec.torch_threads)
        torch.manual_seed(spec.seed)
        self.actor_id = actor_id
        self.compress_obs = compress_obs
        # Slots of its own, each slot's fields [T(+1), E, ...] C-contiguous: Ray serializes
        # such arrays out of band, with no copy (pickling a strided array copies it first).
        self.slots = TrajectorySlots(layout, slots, spec.envs_per_worker, shared=False)
        self.free = deque(range(slots))
        self.handed: list[int] = []    # slots returned by the previous call
        self.weights = PulledWeights(version, refs[0])
        envs = make_actor_envs(spec.env_backend, spec.env_id, spec.envs_per_worker, seed=spec.seed,
                               threads=spec.env_threads, batch_size=spec.env_batch_size, env_kwargs=spec.env_kwargs)
        self.policy = LocalPolicy(spec.model_kwargs, self.weights, seed=spec.seed, algorithm=spec.algorithm,
                                  actor_id=actor_id, num_actors=spec.worker_count, options=spec.act_options,
                                  record=spec.record_fields)
        writer = RolloutWriter(self.views, self.acquire, spec.unroll_length, spec.envs_per_worker)
        self.rollouts = collect_rollouts(envs, self.policy, writer, Never())
        self.progress = ActorProgress(actor_id, spec.verbose_interval)

    def where(self) -> dict:
        """Where this actor runs; its first call, so its answer also says it has started."""
        return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    def views(self, slot: int) -> dict:
        """Slot `slot`'s fields, [T(+1), E, ...] numpy views."""
        return self.slots.views(slot)

    def acquire(self) -> int:
        if not self.free:
            # Only asynchronous env batches open several slots at once; this many never should.
            raise RuntimeError(f"actor {self.actor_id}: all {self.slots.num_slots} trajectory slots are open "
                               "(raise --shared_queue_size)")
        return self.free.popleft()

    def next_rollout(self, version: int = -1, refs: list = ()) -> tuple[Rollout, dict]:
        """Steps until a rollout is finished; returns it: (Rollout, field -> [T(+1), E, ...]),
        as two objects (the pool calls it with num_returns=2: herd/backends/ray_pool.py).
        (version, refs): the newest weights when the call was made; the rollout acts with
        them or newer. (offer_weights, in its own thread, may reach an idle actor just
        after the call it came with has started: tests/backends/test_ray_pool.py.)"""
        if refs:
            self.weights.offer(version, refs[0])
        # The previous call's arrays were serialized into the object store when it returned
        # (calls of this group run one after another), so its slot may be written again.
        self.free.extend(self.handed)
        delivery = next(self.rollouts)
        self.handed = [delivery.slot]
        self.progress.delivered(delivery.steps, delivery.episodes)
        rollout = Rollout(delivery.slot, self.actor_id, delivery.version, delivery.steps, delivery.episodes)
        views = self.views(delivery.slot)
        return rollout, pack_obs(views) if self.compress_obs else views

    def offer_weights(self, version: int, refs: list) -> None:
        """Runs in WEIGHTS_GROUP: newer weights to take at the next refresh."""
        self.weights.offer(version, refs[0])


def remote_worker_class():
    """RolloutWorker as a Ray actor class, with its weights concurrency group."""
    return ray.remote(concurrency_groups={WEIGHTS_GROUP: 1})(RolloutWorker)
