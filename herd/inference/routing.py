"""Which inference server serves an actor, and the actor's side of that choice.

Every server's channels hold a client slot for every actor's lanes (client a * lanes + lane
of actor a), and a shared route table names each actor's server. The table starts as actor
i -> server i mod S; herd/backends/inference_servers.py, its one writer, moves actors to a
server it adds as the load grows. An actor's RoutedClient reads the table as each request
starts, so a lane moves between requests, never with one in flight: whichever server
holds a request answers it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from herd.inference.channels import InferenceChannels
from herd.inference.client import InferenceClient, Pending

# Seconds an actor's client waits for a dead server's replacement: a spawned process that
# imports torch and builds the model (seconds; more under load), with room to spare.
RESTART_WAIT = 120.0


class RouteTable:
    """actor -> the server that serves it: [worker_count] int64 in shared memory, handed to
    every actor and server (torch shares it by file descriptor under spawn)."""

    def __init__(self, worker_count: int, servers: int, lanes: int = 1):
        if not 1 <= servers <= worker_count:
            raise ValueError(f"{servers} inference servers for {worker_count} actors: give each server an actor")
        self.lanes = lanes
        self.servers = torch.arange(worker_count, dtype=torch.int64).remainder_(servers).share_memory_()

    def server_of(self, actor: int) -> int:
        return int(self.servers[actor])

    def actors_of(self, server: int) -> np.ndarray:
        """The actors `server` serves now, in order."""
        return np.flatnonzero(self.servers.numpy() == server)

    def clients_of(self, server: int) -> int:
        """How many client slots (lanes) `server` serves now."""
        return self.lanes * int((self.servers.numpy() == server).sum())

    def move(self, actors, server: int) -> None:
        """From their next request on, `actors` ask `server`."""
        self.servers.numpy()[np.asarray(actors, dtype=np.int64)] = server


@dataclass(frozen=True)
class InferenceRoute:
    """Where one actor sends its observations: clients `client` .. `client + lanes - 1` (two
    lanes with --actor_double_buffer) of the channels of the server that `table` names for
    `actor` (`channels`: one per server the run may start). recorded: the trajectory fields
    the server records itself (--inference_records, records.py), which the actor leaves to it."""
    channels: tuple
    table: RouteTable
    actor: int
    lanes: int = 1
    restart_timeout: float = RESTART_WAIT
    recorded: tuple = ()

    @property
    def client(self) -> int:
        return self.actor * self.lanes

    @classmethod
    def alone(cls, channels: InferenceChannels, lanes: int = 1, **kwargs) -> "InferenceRoute":
        """One actor at one server's channels (client slots 0 .. lanes-1): an actor's own
        server (herd/inference/in_actor.py), and tests and benchmarks that drive one server."""
        return cls((channels,), RouteTable(1, 1, lanes), 0, lanes, **kwargs)


class Routed(NamedTuple):
    """A request in flight and the client (server) that holds it."""
    client: InferenceClient
    pending: Pending


class RoutedClient:
    """An ActorPolicy: lane `lane` of an actor, at whichever server the route table names for
    it when a request starts. It holds an InferenceClient per server, all with the same
    client slot, uniforms generator and LSTM states, so a move changes where the rows go,
    not what comes back. Arguments after `lane`: InferenceClient's."""

    finish_rollout = None          # the server acts; nothing completes a rollout here

    def __init__(self, route: InferenceRoute, lane: int = 0, stop=None, seed: int = 0,
                 rng: np.random.Generator | None = None, states=None, record: tuple | None = None, place_of=None):
        rng = rng if rng is not None else np.random.default_rng(seed)
        self.table, self.actor = route.table.servers.numpy(), route.actor
        self.clients: list[InferenceClient] = []
        for channels in route.channels:
            client = InferenceClient(channels, route.client + lane, stop=stop, rng=rng, states=states,
                                     restart_timeout=route.restart_timeout, record=record, place_of=place_of)
            states = client.states          # the first client's (None without an LSTM core): shared by all
            self.clients.append(client)
        self.states = states

    def current(self) -> InferenceClient:
        return self.clients[int(self.table[self.actor])]

    def submit(self, obs: np.ndarray, env_ids: np.ndarray | None = None, reset: np.ndarray | None = None) -> Routed:
        client = self.current()
        return Routed(client, client.submit(obs, env_ids, reset))

    def collect(self, routed: Routed):
        return routed.client.collect(routed.pending)

    def act(self, obs: np.ndarray, env_ids: np.ndarray | None = None, reset: np.ndarray | None = None):
        return self.collect(self.submit(obs, env_ids, reset))

    def value(self, obs: np.ndarray, env_ids: np.ndarray | None = None) -> np.ndarray:
        return self.current().value(obs, env_ids)

    def refresh(self) -> int:
        return self.current().refresh()

    def close(self) -> None:
        for client in self.clients:
            client.close()
