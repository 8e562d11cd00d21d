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

from herd.actors.actor import ActorSpec
from herd.backends.ray_cluster import check_room, check_server_node, connect, describe_nodes
from herd.backends.signals import install_stop_signals
from herd.errors import ConfigError
from herd.learner.loop import Arrival, run_loop
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
        if not session.done:         # a resumed run whose budget is spent: no actor to start and stop
            pool.start()             # the actors start (their first calls queued) while the server starts
        source = RayRollouts(pool, cluster.driver_node)
        if replay_server:
            remote = source.remote = serve_replay(session, replay_server_node, cluster.driver_node)
        return run_loop(session, source, publish, stop_requested)
    finally:
        if pool is not None:
            pool.stop()
        if remote is not None:
            # The server ends with Ray below: its last state (and counters) for the final checkpoint.
            session.use_batches(remote.hand_back(session.options.save_replay))
        restore_signals()
        cluster.shutdown()


class RayRollouts:
    """The Ray backend as the learner loop's RolloutSource (herd/learner/loop.py): the
    rollouts of the pool's actors, their arrays fetched here, or (with a replay server)
    their refs handed on unread; each actor gets its next call once the updates that its
    rollout made ready are trained, so the call carries the newest weights."""

    slots = None                    # rollouts arrive as arrays (or refs), not in slots of a store here

    def __init__(self, pool, driver_node: str):
        self.pool, self.driver_node = pool, driver_node
        self.remote = None          # the replay server's RemoteBatches, when there is one
        self.bytes_read = 0         # bytes of rollout arrays the learner read (the replay in the learner)
        self.calls_due: list[int] = []

    def receive(self, timeout: float) -> list[Arrival]:
        wake = self.remote.waitables() if self.remote is not None else []    # a replay server's answer
        arrivals = []
        for actor_id, rollout, arrays in self.pool.receive(timeout=timeout, wake=wake):
            if self.remote is None:
                self.bytes_read += sum(array.nbytes for array in arrays.values())
            # arrays: field -> [T(+1), E, ...], or their ref, which the session hands to the server
            arrivals.append(Arrival(actor_id, arrays, rollout.version, rollout.steps, rollout.episodes))
        return arrivals

    def release(self, arrival: Arrival) -> None:
        arrival.fields = None                   # ingest copied what it keeps: Ray may free the object
        self.calls_due.append(arrival.actor_id)

    def after_training(self, trained: int) -> None:
        for actor_id in self.calls_due:
            if self.pool.actors[actor_id].failed is None:
                self.pool.call(actor_id)        # one more rollout (with the newest weights)
        self.calls_due.clear()

    def check_health(self) -> None:
        self.pool.check_health()

    def summary(self) -> dict:
        replay = (self.remote.describe() if self.remote is not None else
                  {"location": "learner", "node": self.driver_node, "rollout_bytes": self.bytes_read})
        return {"actor_restarts": self.pool.restarts, "actor_nodes": dict(self.pool.nodes),   # node id -> actors
                "actor_weights_taken": self.pool.weights_taken,     # rollouts acted with newer weights
                "learner_node": self.driver_node, "replay": replay}


def serve_replay(session: TrainingSession, node: str, driver_node: str):
    """Starts the replay server on `node`, loads the checkpoint's replay into it, and makes
    it the session's batch source; returns it (RemoteBatches)."""
    from herd.backends.ray_replay import start_replay_server
    held = session.batches             # ReplayElsewhere: how to build the replay, and a checkpoint's
    remote = start_replay_server(held.build, node, driver_node, session.options.device, held.requests_ahead,
                                 held.writes_waiting)
    held.hand_over(remote)
    session.use_batches(remote)
    if remote.place["node"] == driver_node:
        session.processes["replay-server"] = remote.place["pid"]     # the hardware monitor sees this node only
    return remote
