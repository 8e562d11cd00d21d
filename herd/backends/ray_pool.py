"""The Ray backend's actor pool: creates the Ray actors (SPREAD over the nodes with room),
keeps slots_per_actor next_rollout calls queued on each, collects their rollouts, and
replaces dead or hung actors (herd/backends/ray_backend.py says why the pool restarts them
itself rather than through Ray's max_restarts).

A next_rollout call has two returns, the rollout's metadata (small: Rollout) and its
arrays, so that the learner can read the one without the other: with a replay server
(herd/backends/ray_replay.py) the arrays' ref goes on to the server unread."""
from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field

import ray
from ray.exceptions import RayActorError, RayError, RayTaskError

from herd.actors.actor import ActorSpec
from herd.backends.local import START_GRACE
from herd.backends.ray_actors import WEIGHTS_GROUP, WeightsBoard, remote_worker_class
from herd.backends.ray_wire import unpack_obs
from herd.errors import ActorFailure
from herd.trajectory import TrajectoryLayout

log = logging.getLogger("herd")


@dataclass
class RemoteActor:
    handle: object
    started: float                        # when it was created (monotonic)
    starting: object = None               # ref of its where() call until it answered: placed and started
    node: str | None = None               # node id (hex) it runs on
    calls: list = field(default_factory=list)   # metadata refs of its queued next_rollout calls, oldest first
    last_seen: float = 0.0                # when a call of it last returned (or it started)
    delivered: bool = False               # any rollout yet: until then START_GRACE applies
    offered: int = -1                     # the newest weights version it was told about
    acted_with: int | None = None         # the weights version of its last rollout
    failed: str | None = None             # why it must be replaced (set by receive)
    waiting_logged: bool = False


class RayActorPool:
    """Creates the Ray actors, keeps slots_per_actor calls queued on each, collects their
    rollouts, replaces dead or hung ones, kills them all at the end."""

    def __init__(self, spec: ActorSpec, layout: TrajectoryLayout, count: int, slots_per_actor: int, actor_cpus: float,
                 board: WeightsBoard, timeout: float, max_restarts: int, driver_node: str, registry: dict,
                 fetch_arrays: bool = True, compress_obs: bool = False):
        """fetch_arrays: receive() reads each rollout's arrays (the replay is in the learner)
        or hands out their object ref unread (a replay server reads them). compress_obs:
        the actors send observations LZ4-compressed (--ray_compress_obs); the reader unpacks."""
        self.spec, self.layout, self.count, self.board = spec, layout, count, board
        self.fetch_arrays, self.compress_obs = fetch_arrays, compress_obs
        self.slots_per_actor, self.actor_cpus = slots_per_actor, actor_cpus
        self.timeout, self.max_restarts = timeout, max_restarts
        self.driver_node, self.registry = driver_node, registry   # registry: "actor-<i>" -> pid (this node's)
        self.worker_class = remote_worker_class()
        self.restarts = 0
        self.nodes: Counter = Counter()          # node id -> actors started there (summary.json)
        self.actors: list[RemoteActor | None] = [None] * count
        self.owner: dict = {}                    # metadata ref of a next_rollout call -> (actor id, arrays ref)
        # Rollouts that came with newer weights than their actor's previous one: how often the
        # actors took up new weights (each such version was pulled to its node). Counted
        # where the rollouts arrive, from the version each carries: nothing asked of the actors.
        self.weights_taken = 0

    def start(self) -> None:
        for actor_id in range(self.count):
            self.start_actor(actor_id, generation=0)

    def start_actor(self, actor_id: int, generation: int) -> None:
        # A restarted actor gets new seeds, so it does not replay its predecessor's episodes.
        seed = self.spec.seed + 10_000 * actor_id + 1_000_000 * generation
        spec = ActorSpec(**{**self.spec.__dict__, "seed": seed})
        version, refs = self.board.newest()
        # Its own slots: one more than the queued calls, for the rollout being handed over.
        handle = self.worker_class.options(num_cpus=self.actor_cpus, scheduling_strategy="SPREAD", max_restarts=0,
                                           name=None).remote(actor_id, spec, self.layout, self.slots_per_actor + 1,
                                                             version, refs, self.compress_obs)
        actor = RemoteActor(handle, started=time.monotonic(), starting=handle.where.remote(), offered=version)
        self.actors[actor_id] = actor
        for _ in range(self.slots_per_actor):
            self.call(actor_id)

    def call(self, actor_id: int) -> None:
        """Queues one more next_rollout call on the actor, and tells it of newer weights."""
        actor = self.actors[actor_id]
        version, refs = self.board.newest()
        if version > actor.offered:
            # Fire and forget: a failure shows in its rollout calls.
            actor.handle.offer_weights.options(concurrency_group=WEIGHTS_GROUP).remote(version, refs)
            actor.offered = version
        # The call carries the newest weights too, so an idle actor cannot start it on older ones.
        metadata, arrays = actor.handle.next_rollout.options(num_returns=2).remote(version, refs)
        actor.calls.append(metadata)
        self.owner[metadata] = (actor_id, arrays)

    def receive(self, timeout: float, wake: list = ()) -> list:
        """(actor id, Rollout, field -> [T(+1), E, ...] or its object ref) of the rollouts that
        arrived within `timeout` seconds, or sooner once a ref of `wake` is ready (a replay
        server's answer). A call that raised marks its actor for replacement; its rollout
        is dropped whole (and so are the actor's other queued calls when it is replaced).

        Reading a rollout's arrays waits for them to cross the network, one at a time, oldest
        call first. Once `timeout` seconds have gone into reading (the first rollout is always
        read), the finished rollouts not yet read stay queued for the next call, and the
        learner trains and queues new calls in between. (Reading every finished rollout first
        held a learner 42 s on a 30 Mbit/s link with 64 of them queued: it trained nothing,
        and the actors, out of calls, stood idle.)"""
        pending = list(self.owner)
        if not pending:
            time.sleep(timeout)
            return []
        ready, _ = ray.wait([*pending, *wake], num_returns=1, timeout=timeout)
        if ready:   # take everything that is ready by now, not one per wait (oldest calls first)
            ready, _ = ray.wait(pending, num_returns=len(pending), timeout=0)
        now = time.monotonic()
        for ref in ready:
            # Its call returned: the actor is alive, though its arrays may wait behind others'
            # (reading every actor's rollouts in call order on a thin link takes a while).
            self.actors[self.owner[ref][0]].last_seen = now
        reading_until = now + timeout
        rollouts = []
        for ref in ready:
            if rollouts and time.monotonic() > reading_until:
                break               # the rest stay in self.owner: the next call reads them first
            actor_id, arrays_ref = self.owner.pop(ref)
            actor = self.actors[actor_id]
            actor.calls.remove(ref)
            try:
                # Both returns exist once the call returned: the metadata is what was waited on.
                rollout = ray.get(ref)
                arrays = unpack_obs(ray.get(arrays_ref)) if self.fetch_arrays else arrays_ref
            except RayTaskError as err:          # its code raised (an env crashed): the actor is unusable
                actor.failed = f"failed: {one_line(err)}"
                continue
            except RayActorError as err:         # killed, its process died, or its node was lost
                actor.failed = f"died ({one_line(err)})"
                continue
            except RayError as err:              # the object was lost with its node
                log.warning("a rollout of actor %d was lost (%s): dropped", actor_id, one_line(err))
                continue
            actor.delivered = True           # last_seen: set above, when its call was found returned
            if actor.acted_with is not None and rollout.version > actor.acted_with:
                self.weights_taken += 1
            actor.acted_with = rollout.version
            rollouts.append((actor_id, rollout, arrays))
        return rollouts

    def check_health(self) -> None:
        """Notes where started actors run; replaces failed and hung ones with fresh
        environments on nodes with room. Actors still waiting for room are left waiting."""
        now = time.monotonic()
        for actor_id, actor in enumerate(self.actors):
            if actor.starting is not None and actor.failed is None:
                self.note_start(actor_id, actor, now)
            hung = actor.starting is None and actor.failed is None and now - actor.last_seen > (
                self.timeout if actor.delivered else max(self.timeout, START_GRACE))
            if hung:
                actor.failed = f"delivered nothing for {now - actor.last_seen:.0f} s"
            if actor.failed is None:
                continue
            log.warning("actor %d %s: restarting it with fresh environments", actor_id, actor.failed)
            self.restarts += 1
            if self.restarts > self.max_restarts:
                raise ActorFailure(f"actors failed {self.restarts} times (more than --max_actor_restarts="
                                   f"{self.max_restarts}); see the log for their errors")
            self.discard(actor)
            self.start_actor(actor_id, generation=self.restarts)

    def note_start(self, actor_id: int, actor: RemoteActor, now: float) -> None:
        ready, _ = ray.wait([actor.starting], timeout=0)
        if not ready:
            if now - actor.started > START_GRACE and not actor.waiting_logged:
                log.warning("actor %d has waited %.0f s to start: the cluster may have no node with %g free CPUs",
                            actor_id, now - actor.started, self.actor_cpus)
                actor.waiting_logged = True
            return
        try:
            place = ray.get(actor.starting)
        except RayError as err:
            actor.failed = f"died while starting ({one_line(err)})"
            return
        actor.starting, actor.node, actor.last_seen = None, place["node"], now
        self.nodes[place["node"]] += 1
        if place["node"] == self.driver_node:
            self.registry[f"actor-{actor_id}"] = place["pid"]    # the hardware monitor sees this node only
        log.info("actor %d runs on node %s (pid %d)", actor_id, place["node"][:12], place["pid"])

    def discard(self, actor: RemoteActor) -> None:
        """Kills the actor and forgets its queued calls: their rollouts are never used."""
        for ref in actor.calls:
            self.owner.pop(ref, None)
        actor.calls.clear()
        try:
            ray.kill(actor.handle, no_restart=True)
        except RayError:
            pass             # already gone with its node

    def stop(self) -> None:
        for actor in self.actors:
            if actor is not None:
                self.discard(actor)


def one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text[:200] + ("..." if len(text) > 200 else "") or type(err).__name__
