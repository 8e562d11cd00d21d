"""Where the Ray backend's actors run (--ray_address): a private Ray started on this
machine for the run, or an existing cluster that the learner joins as a driver.

The private cluster has no dashboard, is shut down at the end of the run, and listens on
the loopback address only. That takes Ray's single-machine address mode
(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, its default on macOS and Windows): otherwise Ray
rewrites 127.0.0.1 into the machine's outside address, for its own node and for a head it
joins, and its servers listen on every interface (measured with `ss -ltnp`, Ray 2.60).
Ray reads that mode when it is imported, so herd imports Ray in connect() and not before
(check_backend only finds the package).

It also runs with token authentication and a fresh random token per run
(RAY_AUTH_MODE=token, RAY_AUTH_TOKEN) unless the user chose a mode: every local user can
reach 127.0.0.1, and without a token any of them could run code as us on our cluster.
Choosing the mode explicitly silences Ray 2.60's warning on init, and a token in the
environment (inherited by the raylet and every worker) leaves ~/.ray/auth_token alone.
Joining a cluster leaves both to the user's environment: the cluster's settings rule.
A user's RAY_AUTH_MODE other than token turns the token off: that is their choice, said in
a warning line, since it opens the private cluster to every local user.

Its files (sockets, logs, session data) live in a fresh folder only this user can enter
(tempfile.mkdtemp: 0700), removed at the end, not in the shared /tmp/ray: Ray makes that
world-writable (0777, and so its own temp folder: hence Ray's folder is one level inside
ours), so another local user could plant or read files there."""
from __future__ import annotations

import logging
import math
import os
import secrets
import shutil
from dataclasses import dataclass, field

from herd.backends.ray_auto import resolve_auto_address
from herd.errors import ConfigError
from herd.leftovers import make_private_folder

log = logging.getLogger("herd")

LOOPBACK = "127.0.0.1"
# Seconds a head may take to answer the probe before its address counts as unreachable.
PROBE_TIMEOUT = 5.0
GCS_PROBE = "/ray.rpc.NodeInfoGcsService/GetClusterId"     # Ray 2.60's GCS (src/ray/protobuf/gcs_service.proto)
AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")
LOOPBACK_MODE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"    # "0": Ray's node address is 127.0.0.1


def check_ray_address(address: str) -> None:
    """One line (ConfigError) unless a Ray head answers at host:port within PROBE_TIMEOUT s.
    `local` starts its own cluster; `auto` is the address of this user's own cluster file
    (herd/backends/ray_auto.py), refused before any probe when someone else could have
    written it.

    The probe asks the head's GCS for its cluster id over gRPC (what Ray's own connect does
    first, but once, with a deadline): ray.init instead retries for about 20 s, printing a
    line a second, and a port that accepts TCP but is no Ray head (a proxy, another
    service) would pass a bare TCP check. A head with token auth answers UNAUTHENTICATED
    to a probe without a token: it is there, and ray.init brings the token."""
    if address == "local":
        return
    shown = address
    if address == "auto":
        address = resolve_auto_address()
        shown = f"auto ({address})"
    import grpc   # Ray's own dependency (grpcio): the extra is installed when this runs
    host, _, port = address.rpartition(":")
    channel = grpc.insecure_channel(f"{host}:{port}")
    try:
        channel.unary_unary(GCS_PROBE)(b"", timeout=PROBE_TIMEOUT)    # an empty GetClusterIdRequest
    except grpc.RpcError as err:
        if err.code() not in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            reason = {grpc.StatusCode.DEADLINE_EXCEEDED: f"no answer within {PROBE_TIMEOUT:g} s",
                      grpc.StatusCode.UNAVAILABLE: "nothing listens there",
                      grpc.StatusCode.UNIMPLEMENTED: "something other than a Ray head listens there"
                      }.get(err.code(), err.code().name.lower())
            raise ConfigError(f"--ray_address={shown}: cannot reach a Ray head there ({reason}); start one with "
                              f"`ray start --head --port={port}` or fix the address") from None
    finally:
        channel.close()


@dataclass
class RayCluster:
    """The connection of this run's driver (the learner) to Ray."""
    address: str                     # what --ray_address said
    private: bool                    # started here for this run: shut it down at the end
    driver_node: str = ""            # node id (hex) of the learner's node
    saved_env: dict = field(default_factory=dict)   # the variables we may set, as they were
    folder: str | None = None        # private: the 0700 folder holding Ray's temp folder

    def shutdown(self) -> None:
        import ray
        ray.shutdown()               # private: stops its processes; joined: disconnects (our actors end with us)
        restore_auth(self.saved_env)
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def restore_auth(saved: dict) -> None:
    """The variables as they were (saved by connect), Ray's config and token re-read."""
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    reread_auth()


def use_token_auth(token: str) -> None:
    """RAY_AUTH_MODE=token with `token` for this process and the Ray processes it starts.
    Ray reads the mode into its config when it is imported (herd imports it to check that
    it is installed), so the config is re-read here, as Ray's own switch to token mode does
    (Ray 2.60: ray._raylet.Config.initialize); without it this process would connect
    without its token and be refused."""
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = token
    reread_auth()


def reread_auth() -> None:
    """Ray's config re-read, and its token: Ray 2.60 keeps the first token it loaded in a
    process-wide cache (AuthenticationTokenLoader), so a second cluster with a new token in
    the same process (`herd multi`, a test session) would otherwise be refused with the old
    one; Ray's own token setup resets that cache the same way."""
    from ray._raylet import AuthenticationTokenLoader, Config
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def is_loopback(address: str) -> bool:
    return address == "local" or address.rpartition(":")[0].strip("[]") in ("127.0.0.1", "localhost", "::1")


def connect(address: str, actors: int, actor_cpus: float) -> RayCluster:
    """Starts the private cluster (local) or joins one (auto, host:port); one line
    (ConfigError) when that fails. The private cluster gets CPUs for every actor (Ray's
    CPUs are a scheduling quantity: more actors than cores time-share them, as local
    processes do) and none for the learner, which is this process (the driver)."""
    saved = {name: os.environ.get(name) for name in (*AUTH_VARIABLES, LOOPBACK_MODE)}
    # `auto` resolved by herd (its owner checked), never by Ray's own lookup.
    target = resolve_auto_address() if address == "auto" else address
    if is_loopback(target):
        os.environ[LOOPBACK_MODE] = "0"      # before Ray is imported (see the module's docstring)
    import ray
    if ray.is_initialized():           # an in-process caller's earlier run: never share its state
        ray.shutdown()
    common = dict(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=True)
    cluster = RayCluster(address, private=address == "local", saved_env=saved)
    try:
        if cluster.private:
            if "RAY_AUTH_MODE" not in os.environ:
                use_token_auth(secrets.token_hex(32))
            elif os.environ["RAY_AUTH_MODE"] != "token":
                log.warning("RAY_AUTH_MODE=%s turns token authentication off: any local user can run code as you "
                            "on the private Ray cluster (unset it to get a fresh token per run)",
                            os.environ["RAY_AUTH_MODE"])
            cluster.folder = make_private_folder("herd-ray-")   # and a killed run's left behind is swept
            cpus = max(os.cpu_count() or 1, math.ceil(actors * actor_cpus))
            ray.init(address="local", _node_ip_address=LOOPBACK, num_cpus=cpus, num_gpus=0,
                     _temp_dir=os.path.join(cluster.folder, "ray"), **common)
        else:
            try:
                ray.init(address=target, **common)
            except (ConnectionError, RuntimeError, ValueError) as err:
                reason = " ".join(str(err).split())[:300]
                raise ConfigError(f"--ray_address={address}: cannot join the Ray cluster ({reason})") from None
    except BaseException:
        cluster.shutdown()
        raise
    cluster.driver_node = ray.get_runtime_context().get_node_id()
    where = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}.get(cluster.driver_node)
    if is_loopback(target) and where != LOOPBACK:
        # Ray was imported before connect() (an in-process caller): its address mode was fixed then.
        log.warning("Ray's node listens on %s, not only on %s: Ray was imported before the run", where, LOOPBACK)
    return cluster


def check_room(actor_cpus: float, actors: int, reserved: dict[str, float] | None = None) -> None:
    """One line (ConfigError) when no node of the cluster could ever host an actor;
    a warning when the cluster cannot host all of them at once (the rest wait for room).
    reserved: node id -> CPUs taken there before any actor (a replay server)."""
    import ray
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    reserved = reserved or {}
    free = [max(0.0, n["Resources"].get("CPU", 0.0) - reserved.get(n["NodeID"], 0.0)) for n in nodes]
    largest = max(free, default=0.0)
    if largest < actor_cpus:
        raise ConfigError(f"--actor_cpus={actor_cpus:g}: no node of the Ray cluster has that many CPUs "
                          f"(the largest has {largest:g}{' free' if reserved else ''}): lower --actor_cpus or add "
                          "bigger nodes")
    total = sum(math.floor(cpus / actor_cpus + 1e-9) for cpus in free)
    if total < actors:
        log.warning("the Ray cluster has room for %d of the %d actors (--actor_cpus=%g): the others wait for room",
                    total, actors, actor_cpus)


def check_server_node(node: str, cpus: float) -> None:
    """One line (ConfigError) unless `node` (a node id) is a live node of the cluster with
    `cpus` CPUs (--replay_server_node)."""
    import ray
    nodes = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
    if node not in nodes:
        raise ConfigError(f"--replay_server_node={node}: no live node of the Ray cluster has that id "
                          "(`ray list nodes` shows them; or use learner)")
    if nodes[node]["Resources"].get("CPU", 0.0) < cpus:
        raise ConfigError(f"--replay_server_node={node}: the replay server reserves {cpus:g} CPU there, and the "
                          "node has none (or use learner: the learner's node, where it reserves none)")


def describe_nodes() -> str:
    """'3 nodes, 4 CPUs' for the log."""
    import ray
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    cpus = sum(n["Resources"].get("CPU", 0.0) for n in nodes)
    return f"{len(nodes)} node{'s' * (len(nodes) != 1)}, {cpus:g} CPUs"
