"""Where the Ray backend's actors run (--ray_address): a private Ray started on this
machine for the run, or an existing cluster that the learner joins as a driver.

The private cluster listens on the loopback address only, has no dashboard and is shut
down at the end of the run. It runs with token authentication and a fresh random token
per run (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN), unless the user set RAY_AUTH_MODE: Ray's
C++ servers listen on every interface whatever the node address, and any local user can
reach 127.0.0.1, so without a token anyone who can reach a port could run code as us.
Setting the mode explicitly also silences Ray 2.60's warning on init, and a token in the
environment (inherited by the raylet and every worker) leaves ~/.ray/auth_token alone.

Ray is imported inside the functions: the module is importable without the extra
(herd/plan.py checks an address before anything starts)."""
from __future__ import annotations

import logging
import math
import os
import secrets
import socket
from dataclasses import dataclass, field

from herd.errors import ConfigError

log = logging.getLogger("herd")

LOOPBACK = "127.0.0.1"
# Seconds a host:port may take to accept a TCP connection before it counts as unreachable;
# with Ray's own connect on top the run gives up well within 30 s instead of retrying for minutes.
PROBE_TIMEOUT = 5.0
AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")


def check_ray_address(address: str) -> None:
    """One line (ConfigError) unless host:port accepts a connection within PROBE_TIMEOUT s.
    `local` starts its own cluster and `auto` is resolved by Ray when connecting."""
    if address in ("local", "auto"):
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT):
            pass
    except OSError as err:
        reason = "timed out" if isinstance(err, TimeoutError) else (err.strerror or type(err).__name__)
        raise ConfigError(f"--ray_address={address}: cannot reach a Ray head there ({reason}); start one with "
                          f"`ray start --head --port={port}` or fix the address") from None


@dataclass
class RayCluster:
    """The connection of this run's driver (the learner) to Ray."""
    address: str                     # what --ray_address said
    private: bool                    # started here for this run: shut it down at the end
    driver_node: str = ""            # node id (hex) of the learner's node
    saved_env: dict = field(default_factory=dict)   # auth variables before we set them

    def shutdown(self) -> None:
        import ray
        ray.shutdown()               # private: stops its processes; joined: disconnects (our actors end with us)
        for name, value in self.saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def private_auth() -> dict:
    """Token auth with a fresh token for a private cluster (see the module's docstring);
    returns the variables' previous values to restore."""
    saved = {name: os.environ.get(name) for name in AUTH_VARIABLES}
    if "RAY_AUTH_MODE" not in os.environ:
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    return saved


def connect(address: str, actors: int, actor_cpus: float) -> RayCluster:
    """Starts the private cluster (local) or joins one (auto, host:port); one line
    (ConfigError) when that fails. The private cluster gets CPUs for every actor (Ray's
    CPUs are a scheduling quantity: more actors than cores time-share them, as local
    processes do) and none for the learner, which is this process (the driver)."""
    import ray
    if ray.is_initialized():           # an in-process caller's earlier run: never share its state
        ray.shutdown()
    common = dict(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=True)
    if address == "local":
        saved = private_auth()
        cpus = max(os.cpu_count() or 1, math.ceil(actors * actor_cpus))
        try:
            ray.init(address="local", _node_ip_address=LOOPBACK, num_cpus=cpus, num_gpus=0, **common)
        except Exception:
            RayCluster(address, True, saved_env=saved).shutdown()
            raise
        cluster = RayCluster(address, private=True, saved_env=saved)
    else:
        try:
            ray.init(address=address, **common)
        except (ConnectionError, RuntimeError, ValueError) as err:
            ray.shutdown()
            reason = " ".join(str(err).split())[:300]
            raise ConfigError(f"--ray_address={address}: cannot join the Ray cluster ({reason})") from None
        cluster = RayCluster(address, private=False)
    cluster.driver_node = ray.get_runtime_context().get_node_id()
    return cluster


def check_room(actor_cpus: float, actors: int) -> None:
    """One line (ConfigError) when no node of the cluster could ever host an actor;
    a warning when the cluster cannot host all of them at once (the rest wait for room)."""
    import ray
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    largest = max((n["Resources"].get("CPU", 0.0) for n in nodes), default=0.0)
    if largest < actor_cpus:
        raise ConfigError(f"--actor_cpus={actor_cpus:g}: no node of the Ray cluster has that many CPUs "
                          f"(the largest has {largest:g}): lower --actor_cpus or add bigger nodes")
    total = sum(math.floor(n["Resources"].get("CPU", 0.0) / actor_cpus + 1e-9) for n in nodes)
    if total < actors:
        log.warning("the Ray cluster has room for %d of the %d actors (--actor_cpus=%g): the others wait for room",
                    total, actors, actor_cpus)


def describe_nodes() -> str:
    """'3 nodes, 4 CPUs' for the log."""
    import ray
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    cpus = sum(n["Resources"].get("CPU", 0.0) for n in nodes)
    return f"{len(nodes)} node{'s' * (len(nodes) != 1)}, {cpus:g} CPUs"
