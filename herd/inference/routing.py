"""Which inference server and client slot serve an actor (herd/backends/inference_servers.py
starts the servers; the actor builds its clients from its route)."""
from __future__ import annotations

from dataclasses import dataclass

from herd.inference.channels import InferenceChannels

# Seconds an actor's client waits for a dead server's replacement: a spawned process that
# imports torch and builds the model (seconds; more under load), with room to spare.
RESTART_WAIT = 120.0


@dataclass(frozen=True)
class InferenceRoute:
    """Where one actor sends its observations: clients `client` .. `client + lanes - 1` of
    `channels` (two lanes with --actor_double_buffer). recorded: the trajectory fields the
    server records itself (--inference_records, records.py), which the actor leaves to it."""
    channels: InferenceChannels
    client: int
    lanes: int = 1
    restart_timeout: float = RESTART_WAIT
    recorded: tuple = ()


def route(actor_id: int, num_servers: int) -> tuple[int, int]:
    """Actor -> (its server, its place among that server's actors): server i mod S."""
    return actor_id % num_servers, actor_id // num_servers


def actors_of(server: int, num_servers: int, worker_count: int) -> range:
    """The actors `server` serves, in the order of their places."""
    return range(server, worker_count, num_servers)
