"""N hosts on this machine as Linux network namespaces: the harness that tests and
benchmarks herd's multi-node paths on a real network stack (docs/netns-cluster.md).

    host 0 (ns <run>-h0)   eth0 10.213.0.1 ─link─ p0 ┐
    host 1 (ns <run>-h1)   eth0 10.213.0.2 ─link─ p1 ├─ br0 (ns <run>-br)
    ...                                              ┘      (link: a veth pair, or a delay line)

Every host is a namespace of its own with one link to a bridge that lives
in a namespace of its own too: nothing is made in the machine's own namespace, and the
subnet exists only on this run's private bridge (no route leads out of it, so two runs, or
two helpers, never see each other's hosts). Each link can be shaped in both directions:
a bandwidth limit (tc tbf) and a one-way latency. The latency comes from a delay line in
user space (herd/cluster/delay_line.py): this kernel has no sch_netem, so a cluster with
latency makes every link two TAP devices (the host's eth0, the bridge's port) with a
process between them that holds each frame for the link's delay; without latency a link
is a veth pair, all in the kernel. `link_kind` says which ("veth" or "delay line").

Each host may have its own cores (`cores`): a cgroup whose CFS quota is its budget
(herd/cluster/cpu_budget.py), which every process started on the host joins. Without one a
host's processes share all of this machine's cores with the other hosts'.

Cleaning up. Every namespace of a run is named <run>-..., where <run> is
`herdnet<owner pid>x<random>`. Closing (the context manager, atexit, SIGINT/SIGTERM) kills
every process inside the run's namespaces and cgroups and deletes them; a reaper
process (this file run as a script, in its own session) does the same once its owner dies
without closing (kill -9); and every new cluster first removes the namespaces of runs
whose owner process is gone; the run's cgroups (named <run>-h<i>) go with its namespaces.
This file uses the standard library, psutil and cpu_budget.py only: the reaper runs it as
a script.

Where namespaces cannot be made (not root, no CAP_SYS_ADMIN, no iproute2 that can be
installed), the cluster refuses with NamespaceError: one line saying why."""
from __future__ import annotations

import atexit
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import psutil

if __package__:
    from herd.cluster.cpu_budget import (BudgetError, CpuBudget, cgroup_pids, check_cores, remove_cgroups,
                                          runs_with_cgroups)
else:           # run as a script: the reaper (guard), beside cpu_budget.py
    from cpu_budget import BudgetError, CpuBudget, cgroup_pids, check_cores, remove_cgroups, runs_with_cgroups

PREFIX = "herdnet"
SUBNET = "10.213.0"          # host i is SUBNET.(i+1)/24, on this run's own bridge only
DEVICE = "eth0"              # each host's one link, as on a real machine
MAX_HOSTS = 200
# A delay line's TAPs carry frames up to 64 KB: few frames (little copying in Python) per byte.
JUMBO_MTU = 65000
DELAY_LINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "delay_line.py")


class NamespaceError(RuntimeError):
    """The harness cannot do what was asked here; str() is one line saying why."""


@dataclass(frozen=True)
class LinkShape:
    """What one host's link does to its packets, in each direction."""
    bandwidth_mbit: float | None = None     # tc tbf rate (None: the link's own speed)
    latency_ms: float = 0.0                 # one-way delay, each direction (the delay line)

    def check(self) -> None:
        if self.bandwidth_mbit is not None and not 0 < self.bandwidth_mbit <= 400_000:
            raise NamespaceError(f"bandwidth_mbit={self.bandwidth_mbit}: give a rate in (0, 400000] Mbit/s or None")
        if not 0 <= self.latency_ms <= 10_000:
            raise NamespaceError(f"latency_ms={self.latency_ms}: give a delay in [0, 10000] ms")


def system_tool(name: str) -> str:
    """The absolute path of system tool `name` (ip, tc), looked up on PATH and taken only
    where root owns it and its folder and no one else may write either: the harness runs it
    as root, so a writable copy earlier on PATH would run as root too. One line
    (NamespaceError) otherwise."""
    found = shutil.which(name)
    if found is None:
        raise NamespaceError(f"`{name}` is not on PATH: install iproute2")
    real = os.path.realpath(found)
    for path in (real, os.path.dirname(real)):
        st = os.stat(path)
        if st.st_uid != 0 or st.st_mode & 0o022:
            raise NamespaceError(f"`{name}` on PATH is {real}, and {path} is not root's alone (owner uid {st.st_uid}, "
                                 f"mode {st.st_mode & 0o777:o}): the harness runs it as root, so it refuses; put "
                                 f"root's iproute2 first on PATH")
    return real


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`ip ARGS`; NamespaceError with ip's own first line when it fails and check is set."""
    done = subprocess.run([system_tool("ip"), *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[0]
        raise NamespaceError(f"`ip {' '.join(args)}` failed: {reason}")
    return done


def ensure_iproute2() -> None:
    """`ip` and `tc` on PATH, installing iproute2 with apt-get where they are missing (as CI
    runs: root on a fresh machine); one line (NamespaceError) where that cannot be done."""
    if shutil.which("ip") and shutil.which("tc"):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise NamespaceError("network namespaces need iproute2 (`ip`, `tc`), which is missing and cannot be installed "
                             "here (needs root and apt-get): install iproute2")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "iproute2"]):
        done = subprocess.run(argv, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["?"])[-1]
            raise NamespaceError(f"installing iproute2 failed ({' '.join(argv)}: {tail})")


def namespaces() -> list[str]:
    """Names of this machine's named network namespaces."""
    done = ip("netns", "list", check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def net_inode(namespace: str) -> tuple[int, int] | None:
    """The identity of a named namespace, (device, inode) of the nsfs file that
    /proc/<pid>/ns/net of its processes points to: the inode alone is unique only within
    its file system."""
    try:
        st = os.stat(f"/run/netns/{namespace}")
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def net_of(pid: int) -> tuple[int, int] | None:
    """The (device, inode) identity of a process's network namespace; None when it is
    gone, or a zombie (its namespaces are released)."""
    try:
        st = os.stat(f"/proc/{pid}/ns/net")
    except OSError:
        return None
    return st.st_dev, st.st_ino


def pids_in_nets(inodes: set[tuple[int, int]]) -> list[int]:
    """Every process whose network namespace is one of `inodes`: what `ip netns pids` tells
    for one named namespace, and still after a namespace has lost its name."""
    return [int(entry.name) for entry in os.scandir("/proc") if entry.name.isdigit() and net_of(int(entry.name)) in inodes]


def pids_in(namespace: str) -> list[int]:
    inode = net_inode(namespace)
    return [] if inode is None else pids_in_nets({inode})


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def signal_found(find_pids, sig: int) -> list[int]:
    """Sends `sig` to every process find_pids() names and still names once it is pinned: a
    pidfd is opened on each first, then find_pids() asked again, and only a process both
    answers name is signalled, through its pidfd. A pid that was reused by a process outside
    the run between the scan and the signal is then either not named again or not the
    pidfd's process (whose signal finds it gone), so nothing else is ever killed."""
    pinned = {}
    for pid in find_pids():
        try:
            pinned[pid] = os.pidfd_open(pid)
        except ProcessLookupError:
            pass
    try:
        still = set(find_pids())
        for pid, fd in pinned.items():
            if pid in still:
                try:
                    signal.pidfd_send_signal(fd, sig)
                except ProcessLookupError:
                    pass
        return [pid for pid in pinned if pid in still]
    finally:
        for fd in pinned.values():
            os.close(fd)


def kill_all(find_pids, grace_s: float = 3.0) -> None:
    """SIGTERM to every process find_pids() names, SIGKILL to those left after grace_s."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        pids = signal_found(find_pids, sig)
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if running(p)]
            time.sleep(0.05)
        if not pids:
            return


def kill_all_in(namespace: str, grace_s: float = 3.0) -> None:
    kill_all(lambda: pids_in(namespace), grace_s)


def remove_run(run: str, settle_s: float = 1.0) -> None:
    """Every process of the run killed (in its namespaces or its hosts' cgroups), then the
    namespaces deleted (their veth ends and the bridge go with them), then the cgroups.

    A process being started on a host when this runs may be in neither yet: `ip netns exec`
    opens the namespace's name and only then enters it, so one that opened it just before
    the name was deleted enters it after, unnamed (a host with a budget: it joined the
    cgroups first). Such late comers are looked for by the namespaces' inodes and the
    cgroups until none has appeared for settle_s."""
    mine = [ns for ns in namespaces() if ns.startswith(run + "-")]
    inodes = {inode for ns in mine if (inode := net_inode(ns)) is not None}

    def left() -> list[int]:
        return [p for p in {*pids_in_nets(inodes), *cgroup_pids(run + "-")} if running(p)]

    kill_all(left)
    for ns in mine:
        ip("netns", "del", ns, check=False)
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < settle_s:
        if left():
            kill_all(left, grace_s=0.0)
            quiet_since = time.monotonic()
        time.sleep(0.05)
    remove_cgroups(run)


def owner_of(namespace: str) -> int | None:
    """The owner pid encoded in a harness namespace's (or cgroup's, or run's) name, None for others."""
    head = namespace.split("-")[0]
    if not head.startswith(PREFIX) or "x" not in head:
        return None
    digits = head[len(PREFIX):].split("x")[0]
    return int(digits) if digits.isdigit() else None


def sweep_leftovers() -> list[str]:
    """Removes the namespaces and cgroups of harness runs whose owner process is gone;
    returns their runs."""
    runs = {ns.split("-")[0] for ns in namespaces()} | runs_with_cgroups(PREFIX)
    dead = sorted(run for run in runs if (pid := owner_of(run)) is not None and not psutil.pid_exists(pid))
    for run in dead:
        remove_run(run)
    return dead


class Host:
    """One host: a namespace with one link (DEVICE) to the bridge, and its own cores when it
    has a budget (then `budget` is its CpuBudget, open)."""

    def __init__(self, run: str, index: int):
        self.index = index
        self.namespace = f"{run}-h{index}"
        self.address = f"{SUBNET}.{index + 1}"
        self.port = f"p{index}"                  # its link's end on the bridge
        self.bridge_ns = f"{run}-br"
        self.budget: CpuBudget | None = None

    def command(self, argv: list[str]) -> list[str]:
        """argv run inside this host's namespace (and its cgroups, where it has a budget:
        joined first, because `ip netns exec` hides /sys/fs/cgroup from what it runs)."""
        join = self.budget.join_argv() if self.budget else []
        return [*join, system_tool("ip"), "netns", "exec", self.namespace, *argv]

    def popen(self, argv: list[str], enter_timeout_s: float = 30.0, **kwargs) -> subprocess.Popen:
        """Starts argv on this host; returns once it is inside the host's namespace (or has
        ended), so that closing the run, or its reaper, finds it there from then on."""
        process = subprocess.Popen(self.command(argv), **kwargs)
        inode = net_inode(self.namespace)
        deadline = time.monotonic() + enter_timeout_s
        while process.poll() is None and net_of(process.pid) != inode:
            if time.monotonic() > deadline:
                process.kill()
                process.wait()
                raise NamespaceError(f"a process started on host {self.index} did not enter its namespace "
                                     f"within {enter_timeout_s:g} s: {' '.join(argv)[:80]}")
            time.sleep(0.002)
        return process

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv), **kwargs)

    def pids(self) -> list[int]:
        return pids_in(self.namespace)

    def set_link(self, up: bool) -> None:
        """Cuts (or restores) the host's cable: its port on the bridge goes down."""
        ip("-n", self.bridge_ns, "link", "set", self.port, "up" if up else "down")

    def link_bytes(self) -> dict:
        """{'tx': bytes the host sent, 'rx': bytes it received} on its link so far."""
        done = ip("-n", self.namespace, "-j", "-s", "link", "show", "dev", DEVICE)
        stats = json.loads(done.stdout)[0]["stats64"]
        return {"tx": int(stats["tx"]["bytes"]), "rx": int(stats["rx"]["bytes"])}

    def kill_processes(self) -> None:
        """Every process on this host killed (a machine that loses power)."""
        kill_all_in(self.namespace, grace_s=0.0)


def shape_args(shape: LinkShape) -> list[str] | None:
    """The root qdisc (bandwidth) for one direction of a link, or None for an unlimited link.
    Latency is not a qdisc here: the delay line adds it (module docstring)."""
    if shape.bandwidth_mbit:
        # burst: at least 4 ms at the rate and more than one 64 KiB packet (a veth offloads
        # segmentation, a delay line's TAP carries jumbo frames: a packet larger than the
        # bucket would never leave).
        burst = max(int(shape.bandwidth_mbit * 1e6 / 8 * 0.004), 256 * 1024)
        return ["tbf", "rate", f"{shape.bandwidth_mbit:g}mbit", "burst", str(burst), "latency", "100ms"]
    return None


def tc(namespace: str, device: str, qdisc: list[str]) -> None:
    done = subprocess.run([system_tool("ip"), "netns", "exec", namespace, system_tool("tc"), "qdisc", "replace", "dev",
                           device, "root", *qdisc],
                          capture_output=True, text=True)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["?"])[0]
        raise NamespaceError(f"tc {qdisc[0]} on {namespace}/{device} failed: {reason}")


class NetnsCluster:
    """`hosts` hosts joined by a bridge; a context manager. shape: every link's shape, or
    shapes: one per host. cores: each host's CPU budget in cores (None: no budget, the
    machine's cores shared), or none at all. Host 0 is where a Ray head and the learner go
    by convention."""

    def __init__(self, hosts: int, shape: LinkShape = LinkShape(), shapes: list[LinkShape] | None = None,
                 cores: list[float | None] | None = None):
        if not 1 <= hosts <= MAX_HOSTS:
            raise NamespaceError(f"hosts={hosts}: give 1 to {MAX_HOSTS}")
        self.shapes = list(shapes) if shapes is not None else [shape] * hosts
        if len(self.shapes) != hosts:
            raise NamespaceError(f"{len(self.shapes)} link shapes for {hosts} hosts: give one per host")
        for s in self.shapes:
            s.check()
        self.cores = list(cores) if cores is not None else [None] * hosts
        if len(self.cores) != hosts:
            raise NamespaceError(f"{len(self.cores)} CPU budgets for {hosts} hosts: give one per host (None: no budget)")
        try:
            check_cores(self.cores)
        except BudgetError as err:
            raise NamespaceError(str(err)) from None
        self.run = f"{PREFIX}{os.getpid()}x{secrets.token_hex(3)}"
        self.hosts = [Host(self.run, i) for i in range(hosts)]
        self.closed = True
        self.reaper: subprocess.Popen | None = None
        # One kind for every link: the bridge's MTU is its smallest port's, and the delay
        # lines' jumbo frames are what keeps them cheap.
        self.link_kind = "delay line" if any(s.latency_ms > 0 for s in self.shapes) else "veth"
        self.delay_lines: list[subprocess.Popen] = []
        self.previous_handlers: dict = {}

    def __enter__(self) -> NetnsCluster:
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> None:
        if os.geteuid() != 0:
            raise NamespaceError("network namespaces cannot be made here: they need root (CAP_SYS_ADMIN, "
                                 "CAP_NET_ADMIN); run as root")
        ensure_iproute2()
        sweep_leftovers()
        self.closed = False
        self.guard()
        try:
            self.build()
        except BaseException:
            self.close()
            raise

    def build(self) -> None:
        bridge = f"{self.run}-br"
        try:
            ip("netns", "add", bridge)
        except NamespaceError as err:
            raise NamespaceError(f"network namespaces cannot be made here: {err}") from None
        ip("-n", bridge, "link", "add", "br0", "type", "bridge")
        ip("-n", bridge, "link", "set", "br0", "up")
        for host, shape, cores in zip(self.hosts, self.shapes, self.cores):
            ip("netns", "add", host.namespace)
            if cores is not None:
                try:
                    host.budget = CpuBudget(host.namespace, cores).open()
                except BudgetError as err:
                    raise NamespaceError(str(err)) from None
            if self.link_kind == "veth":
                # Both ends made directly inside their namespaces: no name ever appears in the
                # machine's own namespace, so concurrent runs cannot collide.
                ip("link", "add", DEVICE, "netns", host.namespace, "type", "veth", "peer", "name", host.port,
                   "netns", bridge)
            else:
                ip("-n", host.namespace, "tuntap", "add", "dev", DEVICE, "mode", "tap")
                ip("-n", bridge, "tuntap", "add", "dev", host.port, "mode", "tap")
                for ns, device in ((host.namespace, DEVICE), (bridge, host.port)):
                    ip("-n", ns, "link", "set", device, "mtu", str(JUMBO_MTU))
            ip("-n", bridge, "link", "set", host.port, "master", "br0")
            ip("-n", bridge, "link", "set", host.port, "up")
            ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", DEVICE)
            ip("-n", host.namespace, "link", "set", DEVICE, "up")
            ip("-n", host.namespace, "link", "set", "lo", "up")
            qdisc = shape_args(shape)
            if qdisc:
                tc(host.namespace, DEVICE, qdisc)        # what the host sends
                tc(bridge, host.port, qdisc)             # what it receives
            if self.link_kind == "delay line":
                self.start_delay_line(host, shape)

    def start_delay_line(self, host: Host, shape: LinkShape, timeout_s: float = 30) -> None:
        """The process that carries the host's link (delay_line.py), started in the host's
        namespace (so closing the run kills it) but outside its CPU budget (a link costs a
        real host nothing: this one's CPU is the harness's); returns once both its ends are open."""
        line = subprocess.Popen([system_tool("ip"), "netns", "exec", host.namespace, sys.executable, DELAY_LINE,
                                 "--host_device", DEVICE, "--bridge_namespace", f"/run/netns/{host.bridge_ns}",
                                 "--port", host.port, "--send_ms", f"{shape.latency_ms:g}",
                                 "--receive_ms", f"{shape.latency_ms:g}"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.delay_lines.append(line)
        ready, _, _ = select.select([line.stdout], [], [], timeout_s)
        if not ready or line.stdout.readline().strip() != "ready":
            line.kill()
            reason = (line.communicate(timeout=10)[1].strip().splitlines() or ["no answer"])[-1]
            raise NamespaceError(f"the delay line of host {host.index} did not start: {reason}")

    def guard(self) -> None:
        """Cleanup however this process ends: atexit, SIGINT/SIGTERM (then the previous
        handler runs; an ignored one stays ignored), and a reaper that outlives a kill -9."""
        atexit.register(self.close)
        if threading_main():
            for sig in (signal.SIGINT, signal.SIGTERM):
                # A program that ignores the signal (nohup, a background job) goes on when it
                # comes, so its cluster must stay up too: taking it down would break the run.
                if signal.getsignal(sig) != signal.SIG_IGN:
                    self.previous_handlers[sig] = signal.signal(sig, self.on_signal)
        self.reaper = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--reap", self.run],
                                       stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       start_new_session=True)

    def on_signal(self, signum, frame) -> None:
        previous = self.previous_handlers.get(signum, signal.SIG_DFL)    # close() forgets it
        self.close()
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        remove_run(self.run)
        for line in self.delay_lines:        # killed with the run's processes: reaped here
            line.wait(timeout=30)
        self.delay_lines = []
        for sig, handler in self.previous_handlers.items():
            if signal.getsignal(sig) == self.on_signal:
                signal.signal(sig, handler)
        self.previous_handlers = {}
        atexit.unregister(self.close)
        if self.reaper is not None:
            self.reaper.stdin.close()        # EOF: the reaper finds nothing left and exits
            self.reaper.wait(timeout=60)
            self.reaper = None

    def namespaces(self) -> list[str]:
        """This run's namespaces that exist now."""
        return [ns for ns in namespaces() if ns.startswith(self.run + "-")]


def threading_main() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def reap(run: str) -> None:
    """The reaper: waits for EOF on stdin (its owner closed the cluster or died), then
    removes whatever of `run` is left."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)       # a terminal's Ctrl+C is for the owner
    try:
        sys.stdin.buffer.read()
    finally:
        remove_run(run)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--reap":
    reap(sys.argv[2])
