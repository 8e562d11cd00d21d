"""The Ray backend: actors as Ray actors on any node of a cluster, the learner (this
process, the Ray driver) on the driver's node. `train_ray` is its one wiring function:

    RolloutWorker i (Ray actor, SPREAD over the nodes) --rollout (object ref)--> TrainingSession
        ^        (slots_per_actor next_rollout calls queued per actor)            | (replays, learner,
        +---- offer_weights(version, [ref]) <---- WeightsBoard: one ray.put per update   checkpoints)

The learner side is the same TrainingSession as the local backend's; only the transport
differs (herd/backends/ray_actors.py says how a rollout and the weights travel).

Faults: a call of a dead actor (killed, its process gone, its node lost) raises instead of
returning, so its in-flight rollouts are dropped whole; the pool starts a new actor with
fresh seeds where the cluster has room, and counts it (summary.json: actor_restarts), up to
--max_actor_restarts. The pool restarts actors itself rather than through Ray's
max_restarts: a new actor gets new seeds (it must not replay its predecessor's games), the
count and its limit are the local backend's, and a hung actor is restarted the same way."""
from __future__ import annotations

import logging
import threading
import time

from herd.actors.actor import ActorSpec
from herd.backends.ray_cluster import check_room, connect, describe_nodes
from herd.backends.signals import install_stop_signals
from herd.errors import ConfigError
from herd.learner.session import TrainingSession

log = logging.getLogger("herd")


def train_ray(session: TrainingSession, spec: ActorSpec, worker_count: int, slots_per_actor: int,
              stop_requested: threading.Event, actor_timeout: float = 60.0, max_restarts: int = 20,
              inference_device: str | None = None, ray_address: str = "local", actor_cpus: float = 1.0) -> str:
    """Runs Ray actors and the learner until the step budget or a stop request; returns why
    it ended. ray_address: local (a private Ray here), auto or host:port (join a cluster)."""
    if inference_device is not None:   # validate() refuses it; the server shares this machine's memory
        raise ConfigError("the Ray backend runs no inference server: use --actor_inference=local")
    cluster = connect(ray_address, worker_count, actor_cpus)
    # Imported once connected: Ray must not be imported before connect() chose its address mode.
    from herd.backends.ray_actors import WeightsBoard
    from herd.backends.ray_pool import RayActorPool
    # ray.init replaced the SIGTERM handler (it would exit without saving): ours again, until the end.
    restore_signals = install_stop_signals(stop_requested)
    pool = None
    try:
        check_room(actor_cpus, worker_count)
        log.info("Ray backend: %s at %s; %d actors of %g CPUs each", describe_nodes(),
                 "a private cluster on 127.0.0.1" if cluster.private else ray_address, worker_count, actor_cpus)
        board = WeightsBoard()
        board.publish(session.learner.model, session.counters.updates)
        publish = lambda version: board.publish(session.learner.model, version)  # noqa: E731
        pool = RayActorPool(spec, session.layout, worker_count, slots_per_actor, actor_cpus, board, actor_timeout,
                            max_restarts, cluster.driver_node, session.processes)
        session.summary_extra["actor_restarts"] = lambda: pool.restarts
        session.summary_extra["actor_nodes"] = lambda: dict(pool.nodes)   # node id -> actors started there
        session.summary_extra["learner_node"] = lambda: cluster.driver_node
        if not session.done:         # a resumed run whose budget is spent: no actor to start and stop
            pool.start()
        last_health_check = time.monotonic()
        while not session.done and not stop_requested.is_set():
            if not session.batches.has_room():
                # The replay writer is full: train; the actors' finished rollouts wait in Ray meanwhile.
                if not session.train_ready_batches(publish):
                    time.sleep(0.001)
                continue
            for actor_id, rollout, arrays in pool.receive(timeout=0.5):
                session.ingest(arrays, rollout.version, rollout.steps, rollout.episodes, actor_id=actor_id)
                del arrays                               # ingest copied what it keeps: Ray may free the object
                session.train_ready_batches(publish)
                if pool.actors[actor_id].failed is None:
                    pool.call(actor_id)                  # one more rollout (with the newest weights)
                if session.done or stop_requested.is_set():
                    break
            if time.monotonic() - last_health_check > 1.0:
                pool.check_health()
                last_health_check = time.monotonic()
                session.show_progress()
    finally:
        if pool is not None:
            pool.stop()
        restore_signals()
        cluster.shutdown()
    return "stopped" if stop_requested.is_set() else "finished"
