"""One actor served by a real inference server (in a thread), or running the server's
path itself (--actor_inference=in_actor), stepping real CartPole environments into its
slots: the rollouts it delivers, for tests that compare ways of acting (double buffering:
tests/actors/test_double_buffer.py; a server that records the steps:
tests/inference/test_records.py; the server's path in the actor: tests/inference/test_in_actor.py)."""
from __future__ import annotations

import threading
from contextlib import contextmanager

import torch
import torch.multiprocessing as mp

from herd.actors.actor import ActorSpec, collect_rollouts
from herd.actors.double_buffer import collect_double_buffered, double_buffered
from herd.actors.rollout import RolloutWriter
from herd.algos import IMPALA, trajectory_layout
from herd.backends.local import step_records
from herd.envs.actor_envs import make_actor_envs
from herd.inference import InferenceChannels, ServerOptions
from herd.inference.in_actor import InActorInference
from herd.inference.records import StepRecords, recorded_by
from herd.inference.routing import InferenceRoute, RoutedClient
from herd.inference.server import BatchServer, serve_forever
from herd.store import TrajectorySlots
from herd.weights import SharedWeights

MLP = dict(network="mlp", obs_shape=(4,), obs_dtype="float32", num_actions=2, feature_size=None)
LSTM = dict(MLP, lstm_size=8)          # its states: policy and value streams, [2, 1, 16]
CONTEXT = mp.get_context("spawn")
E, T, ROLLOUTS, SEED = 5, 16, 6, 3     # an odd E: double buffering's halves of 3 and 2
RECORD = ("behaviour_logits", "behaviour_value")


def layout(model: dict = MLP):
    core = (2, 1, 16) if "lstm_size" in model else None
    return trajectory_layout(IMPALA, T, (4,), "float32", 2, 64, core_state_shape=core, read=RECORD)


@contextmanager
def served(weights: SharedWeights, records: StepRecords | None = None, model: dict = MLP):
    """A server thread with two clients of E rows: a single actor uses client 0, a
    double-buffered one clients 0 and 1 (its lanes)."""
    torch.manual_seed(0)
    channels = InferenceChannels.for_model(model, 2, E, context=CONTEXT, with_features=False,
                                           with_places=records is not None)
    stop = threading.Event()
    server = BatchServer(channels, model, weights, torch.device("cpu"), records=records)
    threads = torch.get_num_threads()

    def serve() -> None:
        # A new thread's intra-op pool is not the caller's (OpenMP sets it per thread): with
        # another number of threads the forward pass's sums round differently. As in a
        # server process (run_inference_server), the count is set where the server runs.
        torch.set_num_threads(threads)
        serve_forever(server, channels, stop, 0.0)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield channels
    finally:
        stop.set()
        thread.join(5)


@contextmanager
def route(weights: SharedWeights, records: StepRecords | None, model: dict, lanes: int, in_actor: str | None):
    """The route the actor's clients take: to a server thread, or (in_actor: its device) to
    a BatchServer of the actor's own, rung inline (herd/inference/in_actor.py)."""
    if in_actor:
        yield InActorInference(model, weights, in_actor, ServerOptions(), lanes, E, features=False,
                               records=records).start()
        return
    with served(weights, records, model) as channels:
        yield InferenceRoute.alone(channels, lanes)


def trajectories(weights: SharedWeights, double: bool = False, recording: bool = False, model: dict = MLP,
                 env: dict | None = None, slots_per_actor: int = ROLLOUTS + 2, in_actor: str | None = None
                 ) -> list[dict]:
    """ROLLOUTS rollouts of one actor, copied out of its slots as delivered (each slot then
    given back, as the learner does); `recording`: the server records the steps into the
    slots (the local backend's step_records); slots_per_actor: 1 is synchronous sampling's
    single slot, where asking for a second one while it is filled would wait for ever."""
    slots = TrajectorySlots(layout(model), slots_per_actor, E)
    records = step_records(slots, "cpu") if recording else None
    recorded = recorded_by(records)
    free = list(range(slots_per_actor))

    def acquire() -> int:
        assert free, "the actor asked for a slot while all of its slots are filled: it would wait for ever"
        return free.pop(0)

    writer = RolloutWriter(slots.views, acquire, T, E, recorded)
    place_of = writer.places if recording else None
    record = tuple(n for n in RECORD if n not in recorded)
    stop = threading.Event()
    env = env or {}
    spec = ActorSpec(env_id="CartPole-v1", env_kwargs=env, model_kwargs=model, envs_per_worker=E, unroll_length=T,
                     seed=SEED, record_fields=RECORD, double_buffer=double)
    with route(weights, records, model, 2 if double else 1, in_actor) as way:
        if double:
            envs, policy = double_buffered(spec, way, stop, record, place_of)
            rollouts = collect_double_buffered(envs, policy, writer, stop, together=slots_per_actor == 1)
        else:
            envs = make_actor_envs("gymnasium", "CartPole-v1", E, seed=SEED, env_kwargs=env)
            policy = RoutedClient(way, stop=stop, seed=SEED, record=record, place_of=place_of)
            rollouts = collect_rollouts(envs, policy, writer, stop)
        out = []
        for delivery in rollouts:
            out.append({name: view.copy() for name, view in slots.views(delivery.slot).items()})
            free.append(delivery.slot)
            if len(out) == ROLLOUTS:
                break
        envs.close()
    return out
