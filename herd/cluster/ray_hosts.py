"""A Ray cluster on the hosts of a NetnsCluster: the head on host 0, a worker node on
every other host, each with its own CPU budget (--num-cpus), all talking over the hosts'
links (their 10.213.0.x addresses), with token auth (a fresh token per cluster, handed to
every Ray process and to the drivers started with `env()`).

Ray is started with its own command line (`ray start`) inside each namespace, as on real
machines; its processes are the namespaces' processes, so closing the NetnsCluster ends
them. Nothing here imports Ray: the drivers (herd, a benchmark) do, in their own host."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile

from herd.cluster.netns import Host, NamespaceError, NetnsCluster

GCS_PORT = 6379
# Ray notices a lost node after about 3 x 0.5 s instead of its default ~30 s: the tests cut
# hosts off and wait for that.
FAST_HEALTH_CHECKS = {"health_check_period_ms": 500, "health_check_timeout_ms": 500,
                      "health_check_failure_threshold": 3}

NODES_SCRIPT = """
import json, sys, time, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
deadline = time.monotonic() + float(sys.argv[3])
while True:
    alive = [n for n in ray.nodes() if n["Alive"]]
    if len(alive) >= int(sys.argv[2]) or time.monotonic() > deadline:
        break
    time.sleep(0.2)
print(json.dumps({n["NodeManagerAddress"]: n["NodeID"] for n in alive}))
"""


class RayHosts:
    """`cpus[i]` Ray CPUs on host i (host 0: the head; 0 there keeps every actor off it)."""

    def __init__(self, net: NetnsCluster, cpus: list[float], object_store_mb: int = 150,
                 system_config: dict | None = None):
        if len(cpus) != len(net.hosts):
            raise NamespaceError(f"{len(cpus)} CPU budgets for {len(net.hosts)} hosts: give one per host")
        self.net = net
        self.cpus = list(cpus)
        self.object_store = object_store_mb * 2**20
        self.system_config = FAST_HEALTH_CHECKS if system_config is None else system_config
        self.token = secrets.token_hex(32)
        # Short: Ray's Unix sockets live below it, and their paths may not exceed 107 bytes.
        self.temp_root = tempfile.mkdtemp(prefix="hn", dir="/tmp")
        self.node_ids: dict[int, str] = {}      # host index -> Ray node id

    @property
    def address(self) -> str:
        return f"{self.net.hosts[0].address}:{GCS_PORT}"

    def env(self) -> dict:
        """The environment of a process that joins this cluster (a driver, a Ray node)."""
        env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token, "RAY_USAGE_STATS_ENABLED": "0"}
        env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)   # the hosts' own addresses, not loopback
        env.pop("RAY_ADDRESS", None)
        return env

    def start_node(self, host: Host, timeout_s: float = 180) -> None:
        """`ray start` on the host: the head on host 0, a worker node joining it elsewhere."""
        # This Python's own ray (the environment herd runs from), never another found on PATH.
        ray = os.path.join(os.path.dirname(sys.executable), "ray")
        argv = [ray, "start", f"--node-ip-address={host.address}", f"--num-cpus={self.cpus[host.index]:g}",
                "--num-gpus=0", f"--object-store-memory={self.object_store}", "--disable-usage-stats",
                f"--temp-dir={self.temp_root}/h{host.index}"]
        if host.index == 0:
            argv += ["--head", f"--port={GCS_PORT}", "--include-dashboard=false",
                     f"--system-config={json.dumps(self.system_config)}"]
        else:
            argv += [f"--address={self.address}"]
        done = host.run(argv, env=self.env(), capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])[:400]
            raise NamespaceError(f"ray start on host {host.index} failed: {tail}")

    def start(self, timeout_s: float = 180) -> RayHosts:
        for host in self.net.hosts:
            self.start_node(host, timeout_s)
        self.node_ids = self.wait_for_nodes(len(self.net.hosts), timeout_s)
        return self

    def wait_for_nodes(self, count: int, timeout_s: float) -> dict[int, str]:
        """{host index: node id} of the live nodes once `count` are alive (a driver on host 0 asks
        the GCS); NamespaceError when fewer are alive after timeout_s."""
        done = self.net.hosts[0].run([sys.executable, "-c", NODES_SCRIPT, self.address, str(count), str(timeout_s)],
                                     env=self.env(), capture_output=True, text=True, timeout=timeout_s + 120)
        if done.returncode != 0:
            raise NamespaceError(f"asking the Ray head for its nodes failed: {done.stderr.strip()[-300:]}")
        by_address = json.loads(done.stdout.strip().splitlines()[-1])
        found = {h.index: by_address[h.address] for h in self.net.hosts if h.address in by_address}
        if len(found) < count:
            raise NamespaceError(f"{len(found)} of {count} Ray nodes came up within {timeout_s:g} s")
        return found

    def close(self) -> None:
        """The Ray processes end with the namespaces (NetnsCluster.close); this removes the temp root."""
        shutil.rmtree(self.temp_root, ignore_errors=True)


def measure_rtt(net: NetnsCluster, a: int, b: int, count: int = 200) -> dict:
    """Round trips of a 1-byte TCP message between hosts a and b: {'p50_ms', 'p90_ms'}."""
    server = net.hosts[b].popen([sys.executable, "-c", ECHO_SERVER, net.hosts[b].address],
                                stdout=subprocess.PIPE, text=True)
    try:
        port = server.stdout.readline().strip()
        done = net.hosts[a].run([sys.executable, "-c", ECHO_CLIENT, net.hosts[b].address, port, str(count)],
                                capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise NamespaceError(f"round trip from host {a} to host {b} failed: {done.stderr.strip()[-300:]}")
        return json.loads(done.stdout)
    finally:
        server.kill()
        server.wait()


ECHO_SERVER = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while (b := c.recv(1)):
    c.sendall(b)
"""
ECHO_CLIENT = """
import json, socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
times = []
for _ in range(int(sys.argv[3])):
    t = time.perf_counter(); c.sendall(b"x"); c.recv(1); times.append((time.perf_counter() - t) * 1e3)
times.sort()
print(json.dumps({"p50_ms": times[len(times) // 2], "p90_ms": times[int(len(times) * 0.9)]}))
"""

