"""The Ray backend: actors as Ray actors on any node of a cluster, the learner (this
process, the Ray driver) on the driver's node. `train_ray` is its one wiring function:

    RolloutWorker i (Ray actor, SPREAD over the nodes) --rollout (object ref)--> TrainingSession
        ^        (slots_per_actor next_rollout calls queued per actor)            | (replays, learner,
        +---- offer_weights(version, [ref]) <---- WeightsBoard: one ray.put per update   checkpoints)

The learner side is the same TrainingSession as the local backend's; only the transport
differs (herd/backends/ray_actors.py says how a rollout and the weights travel). With
--replay_server the replay runs in its own Ray actor instead of in the learner:

    RolloutWorker i --(metadata ref)--> TrainingSession (counts steps and games)
                    --(arrays ref, handed on unread)--> ReplayServer --batches--> learner
                                                                     <--priorities--

(herd/backends/ray_replay.py); the session's batch source is then its RemoteBatches.

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
from herd.backends.ray_cluster import check_room, check_server_node, connect, describe_nodes
from herd.backends.signals import install_stop_signals
from herd.errors import ConfigError
from herd.learner.session import TrainingSession

log = logging.getLogger("herd")


def train_ray(session: TrainingSession, spec: ActorSpec, worker_count: int, slots_per_actor: int,
              stop_requested: threading.Event, actor_timeout: float = 60.0, max_restarts: int = 20,
              inference_device: str | None = None, ray_address: str = "local", actor_cpus: float = 1.0,
              replay_server: bool = False, replay_server_node: str = "learner", ray_compress_obs: bool = False) -> str:
    """Runs Ray actors and the learner until the step budget or a stop request; returns why
    it ended. ray_address: local (a private Ray here), auto or host:port (join a cluster).
    replay_server: the replay in its own Ray actor on replay_server_node (learner or a node
    id); the session's batch source is then a ReplayElsewhere stand-in (herd/training.py).
    ray_compress_obs: actors send observations LZ4-compressed (herd/backends/ray_wire.py)."""
    if inference_device is not None:   # validate() refuses it; the server shares this machine's memory
        raise ConfigError("the Ray backend runs no inference server: use --actor_inference=local")
    cluster = connect(ray_address, worker_count, actor_cpus)
    # Imported once connected: Ray must not be imported before connect() chose its address mode.
    from herd.backends.ray_actors import WeightsBoard
    from herd.backends.ray_pool import RayActorPool
    from herd.backends.ray_replay import SERVER_CPUS
    # ray.init replaced the SIGTERM handler (it would exit without saving): ours again, until the end.
    restore_signals = install_stop_signals(stop_requested)
    pool = remote = None
    read = [0]     # bytes of rollout arrays the learner read (the replay in the learner)
    try:
        reserved = {} if not replay_server or replay_server_node == "learner" else {replay_server_node: SERVER_CPUS}
        for node, cpus in reserved.items():
            check_server_node(node, cpus)
        check_room(actor_cpus, worker_count, reserved)
        log.info("Ray backend: %s at %s; %d actors of %g CPUs each; the replay in %s", describe_nodes(),
                 "a private cluster on 127.0.0.1" if cluster.private else ray_address, worker_count, actor_cpus,
                 "a replay server" if replay_server else "the learner")
        board = WeightsBoard()
        board.publish(session.learner.model, session.counters.updates)
        publish = lambda version: board.publish(session.learner.model, version)  # noqa: E731
        pool = RayActorPool(spec, session.layout, worker_count, slots_per_actor, actor_cpus, board, actor_timeout,
                            max_restarts, cluster.driver_node, session.processes, fetch_arrays=not replay_server,
                            compress_obs=ray_compress_obs)
        session.summary_extra["actor_restarts"] = lambda: pool.restarts
        session.summary_extra["actor_nodes"] = lambda: dict(pool.nodes)   # node id -> actors started there
        session.summary_extra["actor_weights_taken"] = lambda: pool.weights_taken    # rollouts with newer weights
        session.summary_extra["learner_node"] = lambda: cluster.driver_node
        session.summary_extra["replay"] = lambda: {"location": "learner", "node": cluster.driver_node,
                                                   "rollout_bytes": read[0]}
        if not session.done:         # a resumed run whose budget is spent: no actor to start and stop
            pool.start()             # the actors start (their first calls queued) while the server starts
        if replay_server:
            remote = serve_replay(session, replay_server_node, cluster.driver_node)
        wake = remote.waitables if remote is not None else list
        last_health_check = time.monotonic()
        while not session.done and not stop_requested.is_set():
            if not session.batches.has_room():
                # The replay writer is full: train; the actors' finished rollouts wait in Ray meanwhile.
                if not session.train_ready_batches(publish):
                    time.sleep(0.001)
                continue
            for actor_id, rollout, arrays in pool.receive(timeout=0.5, wake=wake()):
                if remote is None:
                    read[0] += sum(array.nbytes for array in arrays.values())
                # arrays: field -> [T(+1), E, ...], or their ref, which the session hands to the server
                session.ingest(arrays, rollout.version, rollout.steps, rollout.episodes, actor_id=actor_id)
                del arrays                               # ingest copied what it keeps: Ray may free the object
                session.train_ready_batches(publish)
                if pool.actors[actor_id].failed is None:
                    pool.call(actor_id)                  # one more rollout (with the newest weights)
                if session.done or stop_requested.is_set():
                    break
            if remote is not None:
                session.train_ready_batches(publish)     # batches answered while no rollout came
            if time.monotonic() - last_health_check > 1.0:
                pool.check_health()
                last_health_check = time.monotonic()
                session.show_progress()
    finally:
        if pool is not None:
            pool.stop()
        if remote is not None:
            # The server ends with Ray below: its last state (and counters) for the final checkpoint.
            session.use_batches(remote.hand_back(session.options.save_replay))
        restore_signals()
        cluster.shutdown()
    return "stopped" if stop_requested.is_set() else "finished"


def serve_replay(session: TrainingSession, node: str, driver_node: str):
    """Starts the replay server on `node`, loads the checkpoint's replay into it, and makes
    it the session's batch source; returns it (RemoteBatches)."""
    from herd.backends.ray_replay import start_replay_server
    held = session.batches             # ReplayElsewhere: how to build the replay, and a checkpoint's
    remote = start_replay_server(held.build, node, driver_node, session.options.device, held.requests_ahead,
                                 held.writes_waiting)
    held.hand_over(remote)
    session.use_batches(remote)
    session.summary_extra["replay"] = remote.describe
    if remote.place["node"] == driver_node:
        session.processes["replay-server"] = remote.place["pid"]     # the hardware monitor sees this node only
    return remote
