"""The local backend: actor processes on this machine, trajectories in shared memory.

`train_local` is the one function that wires every component of a local run:

    actor i (process) --slot index, own pipe--> TrainingSession (replays, learner)
        ^                                              |
        +---- free slot index (actor i's own pipe) <---+
        +---- versioned weights (SharedWeights) <------ publish after each update

and, with `inference_device` set, batched inference servers between actors and weights
(herd/backends/inference_servers.py: actor i served by server i mod S, dead ones restarted):

    actor i --observations (shared memory)--> inference server i mod S (process, on the device)
        ^                                        |   pulls SharedWeights between batches, or,
        +---- actions, logits, values ----------+   on the learner's own GPU, its device board

With --inference_records the servers also write the observations and their outputs into
the trajectories (herd/inference/records.py): into the actors' slots on a CPU; on a GPU
into a mirror of the slots on the learner's device, which the learner copies from, device
to device, with what the actors wrote into their slots (rewards, dones, obs[T]).

With --actor_inference=in_actor there is no server process: each actor runs the server's
batched path on the device itself (herd/inference/in_actor.py), with the same weights,
records and sampling.

On the learner's own CUDA device the servers take the weights device to device
(herd/device_weights.py: the learner's two-slot board, shared as a CUDA IPC handle);
elsewhere they pull SharedWeights, which actors acting with their own model always do.

Each actor has its own two pipes, so an actor killed mid-write (kill -9, a crashed
env) can only break its own channels: the pool replaces them with the actor."""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait

import torch
from torch.nn.utils import parameters_to_vector

from herd.actors.actor import ActorSpec, run_actor
from herd.backends.start import actor_context
from herd.device_weights import DeviceWeightBoard, same_cuda_device
from herd.devices import host_register
from herd.stopping import sigint_blocked
from herd.errors import ActorFailure
from herd.backends.inference_servers import InferenceServers
from herd.inference import ServerOptions
from herd.inference.in_actor import InActorInference
from herd.inference.records import StepRecords, recorded_fields
from herd.learner.loop import Arrival, run_loop
from herd.learner.publisher import WeightPublisher
from herd.learner.session import TrainingSession
from herd.store import TrajectorySlots
from herd.trajectory import FreeSlots
from herd.weights import SharedWeights

log = logging.getLogger("herd")


@dataclass(frozen=True)
class InferenceSetup:
    """How many inference servers, and how they batch (--inference_* options)."""
    servers: int = 1                # at first
    most: int = 1                   # the most the run may start (InferenceServers grows to it by load)
    grow_at: float | None = None    # a server's load above which another is added (None: a fixed count)
    options: ServerOptions = ServerOptions()
    records: bool = False           # --inference_records: the servers record the steps they act on
    doorbell: str = "semaphore"     # --inference_doorbell: how requests and answers wake their waiters
    in_actor: bool = False          # --actor_inference=in_actor: each actor runs the server's path itself


# Seconds an actor may take to deliver its first rollout, or --actor_timeout if longer.
# Its start (importing herd, then making its environments) is no hang:
# under load it took over 3 s, and a timeout counted from the launch restarted every actor
# until --max_actor_restarts ended the run (tests/integration/test_lifecycle.py, hung actor).
START_GRACE = 60.0


@dataclass
class ActorHandle:
    process: object
    free: FreeSlots         # the slot indices this actor may fill
    receiver: object        # read end of its rollout pipe
    last_seen: float        # when it last delivered a rollout, started, or got a slot back while it had none
    delivered: bool = False  # any rollout yet: until then START_GRACE applies
    # Its slots delivered and not yet released (read in place, withheld, or being ingested):
    # all of them out, it waits on us, not hung.
    out: set[int] = field(default_factory=set)


class ActorPool:
    """Starts actor processes, each owning `slots_per_actor` slots; restarts dead or hung
    ones with fresh environments; stops them all."""

    def __init__(self, spec: ActorSpec, count: int, slots: TrajectorySlots, slots_per_actor: int,
                 weights: SharedWeights, context, timeout: float, max_restarts: int,
                 inference: InferenceServers | InActorInference | None = None, stop_event=None,
                 registry: dict | None = None):
        self.spec, self.count, self.slots, self.weights = spec, count, slots, weights
        # The servers, or the server's path each actor runs itself; None: each acts with its own CPU model.
        self.inference = inference
        self.slots_per_actor = slots_per_actor
        self.context = context
        self.timeout = timeout
        self.max_restarts = max_restarts
        self.restarts = 0
        self.stop_event = stop_event if stop_event is not None else context.Event()
        self.actors: list[ActorHandle | None] = [None] * count
        self.registry = registry if registry is not None else {}   # "actor-<i>" -> pid, for monitoring
        # (actor, slot) of rollouts ingested but kept from their actor until an update
        # trained on them (--synchronous_sampling); a restarted actor's are dropped.
        self.withheld: list[tuple[int, int]] = []

    def owned_slots(self, actor_id: int) -> range:
        return range(actor_id * self.slots_per_actor, (actor_id + 1) * self.slots_per_actor)

    def start(self) -> None:
        for actor_id in range(self.count):
            self.start_actor(actor_id, generation=0)

    def start_actor(self, actor_id: int, generation: int) -> None:
        withheld = {slot for other, slot in self.withheld if other == actor_id}
        self.withheld = [(other, slot) for other, slot in self.withheld if other != actor_id]   # refilled below
        # A predecessor's slots the learner still reads in place (herd/replay/slot_queue.py)
        # stay out until released; the rest are refilled and free.
        previous = self.actors[actor_id]
        reading = previous.out - withheld if previous is not None else set()
        free = FreeSlots(self.context)
        for slot in self.owned_slots(actor_id):
            if slot in reading:
                continue
            self.slots.reset(slot)
            free.put(slot)
        receiver, sender = self.context.Pipe(duplex=False)
        # A restarted actor gets new seeds, so it does not replay its predecessor's episodes.
        seed = self.spec.seed + 10_000 * actor_id + 1_000_000 * generation
        spec = ActorSpec(**{**self.spec.__dict__, "seed": seed})
        process = self.context.Process(
            target=run_actor, name=f"herd-actor-{actor_id}", daemon=True,
            args=(actor_id, spec, self.slots, free, sender, self.weights, self.stop_event,
                  self.inference.route(actor_id) if self.inference is not None else None))
        with sigint_blocked():   # Ctrl+C reaches the group: the child must never see it
            process.start()
        sender.close()  # the child holds the write end; EOF then means the actor is gone
        self.actors[actor_id] = ActorHandle(process, free, receiver, time.monotonic(), out=set(reading))
        self.registry[f"actor-{actor_id}"] = process.pid

    def receive(self, timeout: float) -> list:
        """Rollouts that arrived within `timeout` seconds, from any actor."""
        receivers = {a.receiver: i for i, a in enumerate(self.actors)}
        rollouts = []
        for receiver in wait(list(receivers), timeout):
            actor_id = receivers[receiver]
            try:
                while receiver.poll():
                    rollout = receiver.recv()
                    rollouts.append(rollout)
                    actor = self.actors[actor_id]
                    actor.last_seen, actor.delivered = time.monotonic(), True
                    actor.out.add(rollout.slot)
            except (EOFError, OSError):
                pass  # the actor died; check_health restarts it
        return rollouts

    def release(self, actor_id: int, slot: int) -> None:
        actor = self.actors[actor_id]
        if slot not in actor.out:
            # A slot given back twice, or to an actor restarted since (whose slots were
            # refilled): two writers would share it.
            raise RuntimeError(f"slot {slot} released to actor {actor_id}, which does not hold it out")
        if len(actor.out) == self.slots_per_actor:
            # It had no slot to fill: its hang clock starts now, not at its last delivery
            # (a slow learner holding every slot is back-pressure, not a hung actor).
            actor.last_seen = time.monotonic()
        actor.out.discard(slot)
        actor.free.put(slot)

    def withhold(self, actor_id: int, slot: int) -> None:
        """Keeps an ingested rollout's slot from its actor until release_withheld."""
        self.withheld.append((actor_id, slot))

    def release_withheld(self) -> None:
        for actor_id, slot in self.withheld:
            self.release(actor_id, slot)
        self.withheld.clear()

    def check_health(self) -> None:
        """Restarts dead or hung actors with fresh environments and their slots refilled.
        Call it only after every received rollout was ingested: restarting resets slots."""
        now = time.monotonic()
        for actor_id, actor in enumerate(self.actors):
            alive = actor.process.is_alive()
            limit = self.timeout if actor.delivered else max(self.timeout, START_GRACE)
            waiting_on_us = len(actor.out) >= self.slots_per_actor
            hung = alive and not waiting_on_us and now - actor.last_seen > limit
            if alive and not hung:
                continue
            if hung:
                log.warning("actor %d delivered nothing for %.0f s: restarting it", actor_id, now - actor.last_seen)
                actor.process.kill()
            else:
                log.warning("actor %d died (exit code %s): restarting it with fresh environments",
                            actor_id, actor.process.exitcode)
            actor.process.join(5.0)
            self.restarts += 1
            if self.restarts > self.max_restarts:
                raise ActorFailure(f"actors failed {self.restarts} times (more than --max_actor_restarts="
                                   f"{self.max_restarts}); see the log for their errors")
            self.close_channels(actor)
            self.start_actor(actor_id, generation=self.restarts)

    @staticmethod
    def close_channels(actor: ActorHandle) -> None:
        actor.receiver.close()
        actor.free.close()

    def stop(self, timeout: float = 5.0) -> None:
        self.stop_event.set()
        deadline = time.monotonic() + timeout
        for actor in self.actors:
            if actor is not None:
                actor.process.join(max(0.1, deadline - time.monotonic()))
        for actor in self.actors:
            if actor is None:
                continue
            if actor.process.is_alive():
                log.warning("actor %s did not stop in time: terminating it", actor.process.name)
                actor.process.terminate()
                actor.process.join(2.0)
            self.close_channels(actor)


class LocalRollouts:
    """The local backend as the learner loop's RolloutSource (herd/learner/loop.py): the
    rollouts of the pool's actors, read as views into their slots; a slot goes back to its
    actor once ingested (copied), or once the queue that reads it there has trained on it
    (herd/replay/slot_queue.py), or, with synchronous sampling, once an update trained on
    it and its weights were published (the actor takes them before it acts again)."""

    def __init__(self, pool: ActorPool, slots: TrajectorySlots, servers: InferenceServers | None,
                 synchronous: bool = False, mirror: StepRecords | None = None, copies=None):
        """mirror: the servers' records on the learner's device (a rollout's recorded fields
        are read there, herd/inference/records.py), with the learner's DeviceCopies."""
        self.pool, self.slots, self.servers, self.synchronous = pool, slots, servers, synchronous
        self.mirror, self.copies = mirror, copies

    def views(self, slot: int) -> dict:
        views = self.slots.views(slot)
        return views if self.mirror is None else self.mirror.rollout(slot, views, self.copies)

    def receive(self, timeout: float) -> list[Arrival]:
        # Holding slots, the next update may come from batches prepared in the background:
        # look for it often rather than wait on actors that wait for it.
        wait_for = min(timeout, 0.005) if self.pool.withheld else timeout
        envs = self.slots.envs_per_slot
        return [Arrival(r.actor_id, self.views(r.slot), r.version, r.steps, r.episodes, ticket=r.slot,
                        start=r.slot * envs)
                for r in self.pool.receive(wait_for)]

    def release(self, arrival: Arrival) -> None:
        if self.synchronous:
            self.pool.withhold(arrival.actor_id, arrival.ticket)
        else:
            self.pool.release(arrival.actor_id, arrival.ticket)

    def after_training(self, trained: int) -> None:
        if trained:
            self.pool.release_withheld()        # synchronous sampling: the slots of what was trained on

    def check_health(self) -> None:
        if self.servers is not None:
            self.servers.check_health()         # a dead server is replaced; its actors wait meanwhile
        self.pool.check_health()

    def summary(self) -> dict:
        """Dead or hung actors (and inference servers) replaced; the servers' load and batches."""
        servers = {} if self.servers is None else {"inference_server_restarts": self.servers.restarts,
                                                   "inference_server_busy": self.servers.busy(),
                                                   "inference_server_batches": self.servers.tallies(),
                                                   "inference_servers_added": self.servers.grown}
        return {"actor_restarts": self.pool.restarts, **servers}


def device_board(model: torch.nn.Module, inference_device: str, version: int, context) -> DeviceWeightBoard | None:
    """The board a server on the learner's own CUDA device reads the weights from, holding
    the model's weights as `version`; None (the servers pull SharedWeights) elsewhere.
    Logs which path the servers take, and why, once."""
    learner = next(model.parameters()).device
    same, why = same_cuda_device(learner, torch.device(inference_device))
    if not same:
        log.info("inference servers take the weights from host shared memory: %s", why)
        return None
    board = DeviceWeightBoard.for_model(model, context)        # alive for the run: servers hold IPC handles
    with torch.no_grad():
        board.publish_vector(parameters_to_vector(model.parameters()).detach().float(), version)
    log.info("inference servers take the weights device to device from the learner's board: %s", why)
    return board


def step_records(slots: TrajectorySlots, device: str) -> StepRecords:
    """Where servers on `device` record the steps they act on: the actors' slots on a CPU,
    a mirror of them on a GPU (the learner's: the servers run on its device)."""
    fields = recorded_fields(slots.layout, ("actions", "logits", "value", "features"))
    if torch.device(device).type == "cpu":
        return StepRecords.in_slots(slots, fields)
    return StepRecords.on_device(slots.layout, slots.num_slots, slots.envs_per_slot, fields, torch.device(device))


def client_shape(spec: ActorSpec) -> tuple[int, int, bool]:
    """An actor's clients at a server: lanes (two when double-buffered), the most rows a
    lane sends at once, and whether the channels carry feature vectors (a replay reads them)."""
    lanes = 2 if spec.double_buffer else 1
    envs = spec.env_batch_size or spec.envs_per_worker      # the most observations one actor sends at once
    rows = -(-envs // lanes)                                 # ... per lane: half of them, rounded up
    return lanes, rows, spec.record_fields is None or "features" in spec.record_fields


def in_actor_inference(spec: ActorSpec, weights: SharedWeights | DeviceWeightBoard, device: str,
                       setup: InferenceSetup, records: StepRecords | None) -> InActorInference:
    """What each actor needs to run the server's batched path on `device` itself."""
    lanes, rows, features = client_shape(spec)
    return InActorInference(spec.model_kwargs, weights, device, setup.options, lanes, rows, features, records)


def start_inference_servers(spec: ActorSpec, worker_count: int, weights: SharedWeights | DeviceWeightBoard,
                            device: str, stop, context, setup: InferenceSetup, max_restarts: int,
                            registry: dict, records: StepRecords | None = None) -> InferenceServers:
    """setup.servers batched inference server processes for `worker_count` actors, on
    `device`, pulling `weights` (SharedWeights, or the learner's board on its device) and
    recording steps into `records` (None: the actors write them)."""
    lanes, rows, features = client_shape(spec)
    servers = InferenceServers(spec.model_kwargs, worker_count, setup.servers, rows, weights, device, stop, context,
                               setup.options, lanes=lanes, features=features, torch_threads=spec.torch_threads,
                               seed=spec.seed, max_restarts=max_restarts, registry=registry, records=records,
                               doorbell=setup.doorbell, most=setup.most, grow_at=setup.grow_at)
    servers.start()
    return servers


def host_weight_store(weights: SharedWeights, servers, board: DeviceWeightBoard | None):
    """Where each update's weights go in host memory: `weights`, which actors running
    their own model and servers away from the learner's device read (where it holds the
    learner's own parameters, adopted, a publish is only the version); None when inference
    servers act for every actor and read the learner's device board (a copy off the GPU
    per update that nothing would read)."""
    if servers is not None and board is not None:
        return None
    return weights.publish_adopted if weights.adopted else weights.publish_vector


def train_local(session: TrainingSession, spec: ActorSpec, worker_count: int, slots_per_actor: int,
                stop_requested: threading.Event, actor_timeout: float = 60.0, max_restarts: int = 20,
                inference_device: str | None = None, inference: InferenceSetup | None = None,
                synchronous_sampling: bool = False) -> str:
    """Runs actors and the learner until the step budget or a stop request; returns why it ended.
    inference_device: run batched inference servers there ("cpu", "cuda") instead of a
    model in every actor; `inference` says how many and how they batch (default: one).
    synchronous_sampling: each rollout's slot goes back to its actor only after an update
    (which trains on the oldest fresh rollouts first) and the publish of its weights."""
    context = actor_context()          # forked from a server that imported torch already (backends/start.py)
    slots = TrajectorySlots(session.layout, worker_count * slots_per_actor, spec.envs_per_worker)
    if session.options.device.type == "cuda":
        # Page-locked in place: a rollout's copies to the learner's device are asynchronous
        # (herd/device_copies.py); where CUDA refuses, they are staged by the driver.
        locked = all(host_register(tensor, session.options.device) for tensor in slots.tensors.values())
        log.info("the actors' slots are %s", "page-locked: rollouts go to the device asynchronously" if locked
                 else "not page-locked (CUDA refused): rollouts go to the device through the driver's staging")
    weights = SharedWeights(session.learner.model, context)
    # A CPU learner's parameters live in the shared vector: its optimizer writes the
    # weights where the actors read them (under the store's sequence lock), no copy per update.
    if weights.adopt(session.learner.model):
        session.learner.write_weights_within(weights.writing)
    weights.publish(session.learner.model, version=session.counters.updates)
    servers = acting = board = records = None       # acting: the servers, or what each actor runs itself
    stop_actors = context.Event()
    setup = inference or InferenceSetup()
    # A resumed run whose budget is already spent trains nothing: starting actors would
    # only wait for their start-up (seconds of importing torch) to stop them again.
    if inference_device is not None and not session.done:
        board = device_board(session.learner.model, inference_device, session.counters.updates, context)
        if setup.records:      # alive for the run: on a GPU the servers hold IPC handles
            records = step_records(slots, inference_device)
            log.info("the inference servers record the steps they act on %s", "in the actors' slots"
                     if records.on_host else f"on {records.device}: each frame crosses to it once")
        if setup.in_actor:
            acting = in_actor_inference(spec, board or weights, inference_device, setup, records)
            log.info("each actor runs the inference server's batched path on %s itself (no server process)",
                     inference_device)
        else:
            servers = acting = start_inference_servers(spec, worker_count, board or weights, inference_device,
                                                       stop_actors, context, setup, max_restarts, session.processes,
                                                       records)
    pool = ActorPool(spec, worker_count, slots, slots_per_actor, weights, context, actor_timeout, max_restarts,
                     inference=acting, stop_event=stop_actors, registry=session.processes)
    if not session.done:
        pool.start()
    # After every update; on a GPU learner the copy off the device does not block the update.
    # With a board, the same side stream also copies them device to device for the servers.
    publish = WeightPublisher(session.learner.model, host_weight_store(weights, acting, board), board=board)
    try:
        mirror = records if records is not None and not records.on_host else None
        rollouts = LocalRollouts(pool, slots, servers, synchronous_sampling, mirror, session.device_copies)
        return run_loop(session, rollouts, publish, stop_requested)
    finally:
        publish.close()
        pool.stop()
        if servers is not None:
            servers.stop()
