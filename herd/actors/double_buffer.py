"""Double buffering (Sample Factory's): an actor served by an inference server splits its
E environments into two halves, each with its own client (lane) at the server, and steps
one half while the server acts on the other:

    submit A0, submit B0
    collect A0 -> step A (server works on B0) -> submit A1
    collect B0 -> step B (server works on A1) -> submit B1 ...

The halves are environments 0..h-1 and h..E-1 (h = ceil(E/2)), built with the seeds the
single-buffered actor gives them (env i: seed + i), and the two lanes draw their sampling
uniforms from one generator, in the order A0, B0, A1, B1, ...: the order a single-buffered
actor draws them in (one request of E rows per step). So a double-buffered actor makes the
same trajectories as a single-buffered one wherever the server's outputs are the same; they
differ only where a forward pass over h rows rounds differently from one over E rows
(last bits of logits and values; tested in tests/actors/test_double_buffer.py).
"""
from __future__ import annotations

import numpy as np

from herd.actors.rollout import RolloutWriter, truncated_values
from herd.envs.actor_envs import make_actor_envs
from herd.inference.routing import InferenceRoute, RoutedClient
from herd.interfaces import EnvBatch


class EnvHalf:
    """One half of an actor's environments, whose env ids start at `first`."""

    def __init__(self, envs, first: int):
        self.envs, self.first = envs, first
        self.num_envs = self.batch_size = envs.num_envs

    def shifted(self, batch: EnvBatch) -> EnvBatch:
        batch.env_ids = np.asarray(batch.env_ids) + self.first
        return batch

    def start(self) -> EnvBatch:
        return self.shifted(self.envs.start())

    def send(self, actions: np.ndarray) -> None:
        self.envs.send(actions)

    def recv(self) -> EnvBatch:
        return self.shifted(self.envs.recv())

    def close(self) -> None:
        self.envs.close()


class EnvHalves(list):
    def close(self) -> None:
        for half in self:
            half.close()


class Lanes(list):
    """An actor's two InferenceClients; what run_actor closes."""

    def close(self) -> None:
        for lane in self:
            lane.close()


def split(num_envs: int) -> list[tuple[int, int]]:
    """(first env, count) of the two halves."""
    h = -(-num_envs // 2)
    return [(0, h), (h, num_envs - h)]


def double_buffered(spec, inference: InferenceRoute, stop, record: tuple | None = None,
                    place_of=None) -> tuple[EnvHalves, Lanes]:
    """The halves of `spec`'s environments and their two lanes at the server; record and
    place_of: each lane's InferenceClient's (run_actor's)."""
    halves = EnvHalves(EnvHalf(make_actor_envs(spec.env_backend, spec.env_id, count, seed=spec.seed + first,
                                               threads=spec.env_threads, env_kwargs=spec.env_kwargs), first)
                       for first, count in split(spec.envs_per_worker))
    rng = np.random.default_rng(spec.seed)       # what a single client with this seed would draw
    first = RoutedClient(inference, 0, stop=stop, rng=rng, record=record, place_of=place_of)
    # One LSTM state per env, whichever lane asks.
    second = RoutedClient(inference, 1, stop=stop, rng=rng, states=first.states, record=record, place_of=place_of)
    return halves, Lanes([first, second])


def collect_double_buffered(halves: EnvHalves, lanes: Lanes, writer: RolloutWriter, stop, together: bool = False):
    """collect_rollouts (herd/actors/actor.py) with two half-batches in flight: yields each
    finished rollout's Delivery until `stop` is set. together: the halves end each rollout
    together, for an actor with one slot (--shared_queue_size=1, synchronous sampling): the
    half that finishes its part of the rollout first would need the next slot, which comes
    back only once the other half has finished this one, so it waits, with no request in
    flight, and the two go on in their order (the sampling uniforms stay in the
    single-buffered order) once the rollout is delivered. The overlap is lost for one
    half-step per rollout."""
    in_flight = []
    for envs, lane in zip(halves, lanes):
        batch = envs.start()
        writer.observe(batch)
        in_flight.append((batch, lane.submit(batch.obs, batch.env_ids, batch.done)))
    waiting: dict[int, object] = {}              # half -> its batch, whose observations wait for the next slot
    while not stop.is_set():
        for h, (envs, lane) in enumerate(zip(halves, lanes)):
            if h in waiting:
                continue
            batch, request = in_flight[h]
            out = lane.collect(request)
            writer.record_action(batch.env_ids, out)
            envs.send(out.actions)
            batch = envs.recv()                   # this half steps while the server acts on the other
            delivered = writer.record_outcome(batch, truncated_values(lane, batch))
            yield from delivered
            if together and not delivered and writer.opens_slot(batch.env_ids):
                waiting[h] = batch                # the other half still fills the one slot
                continue
            waiting[h] = batch
            for g in sorted(waiting):             # after the deliveries (collect_rollouts says why)
                ready = waiting.pop(g)
                writer.observe(ready)
                in_flight[g] = (ready, lanes[g].submit(ready.obs, ready.env_ids, ready.done))
