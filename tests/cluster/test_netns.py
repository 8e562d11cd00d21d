"""The harness itself (herd/cluster/netns.py): hosts that reach each other only over their
links, a bandwidth limit that holds, nothing left behind when its owner is killed with
SIGKILL, and one line (not a silent pass) where namespaces cannot be made."""
import os
import signal
import subprocess
import sys

import psutil
import pytest

from herd_testing import ROOT, wait_for
from herd.cluster.cpu_budget import named_cgroups
from herd.cluster.netns import LinkShape, NamespaceError, namespaces, running
from herd.cluster.ray_hosts import measure_rtt

# Sends SIZE bytes from host 0 to host 1 over TCP; prints the seconds it took.
SINK = ("import socket,sys\ns=socket.socket();s.bind((sys.argv[1],5001));s.listen(1);print('up',flush=True)\n"
        "c,_=s.accept()\nwhile c.recv(1<<20): pass\n")
SOURCE = ("import socket,sys,time\nc=socket.create_connection((sys.argv[1],5001));b=bytes(1<<20);t=time.perf_counter()\n"
          "for _ in range(int(sys.argv[2])): c.sendall(b)\nc.shutdown(socket.SHUT_WR);c.recv(1);"
          "print(time.perf_counter()-t)\n")


@pytest.mark.parametrize("latency_ms", [0.0, 1.0], ids=["veth", "delay_line"])
def test_a_bandwidth_limit_holds_and_a_cut_link_carries_nothing(hosts_or_fail, latency_ms):
    """Catches a tbf that is not applied (or applied to the wrong end), on either kind of
    link: 8 MiB at 40 Mbit/s cannot take less than 1.68 s (the limit is an upper bound:
    load only slows it down). And a host whose link is down cannot be reached (the test of
    a lost host relies on it): a delay line must drop what a down port refuses."""
    with hosts_or_fail(2, LinkShape(bandwidth_mbit=40, latency_ms=latency_ms)) as net:
        assert net.link_kind == ("veth" if latency_ms == 0 else "delay line")
        sink = net.hosts[1].popen([sys.executable, "-c", SINK, net.hosts[1].address], stdout=subprocess.PIPE, text=True)
        assert sink.stdout.readline().strip() == "up"
        sent = net.hosts[0].run([sys.executable, "-c", SOURCE, net.hosts[1].address, "8"], capture_output=True,
                                text=True, timeout=120)
        sink.wait(timeout=30)
        assert sent.returncode == 0, sent.stderr
        seconds = float(sent.stdout)
        # 8 MiB = 67.1 Mbit; tbf's burst (256 KiB) may pass at once: at least (67.1 - 2.1) / 40 s.
        assert seconds >= 65.0 / 40 * 0.97, seconds
        assert net.hosts[1].link_bytes()["rx"] >= 8 * 2**20        # it went over host 1's link

        net.hosts[1].set_link(False)
        cut = net.hosts[0].run([sys.executable, "-c", "import socket,sys;socket.create_connection((sys.argv[1],5001),"
                                "timeout=2)", net.hosts[1].address], capture_output=True, text=True, timeout=60)
        assert cut.returncode != 0 and "timed out" in cut.stderr, cut.stderr


OWNER = """
import sys, time
from herd.cluster.netns import LinkShape, NetnsCluster
net = NetnsCluster(2, LinkShape(latency_ms=1), cores=[None, 0.5]).__enter__()
sleeper = net.hosts[1].popen(["sleep", "1000"])
print(net.run, sleeper.pid, *(line.pid for line in net.delay_lines), flush=True)
time.sleep(1000)
"""


def test_closing_kills_processes_on_their_way_into_a_host(hosts_or_fail):
    """Catches a cleanup that looks for a run's processes only in its named namespaces
    (CI once left a `sleep` alive, and its cgroup, when the owner was killed while the sleep
    was still being started). Two late comers: one that joined host 1's cgroup but not yet
    its namespace, and one that opened host 0's namespace and enters it only once its name
    is deleted (what `ip netns exec` does when it opens the name just before the deletion).
    Both must be dead after close, and the cgroup gone."""
    with hosts_or_fail(2, cores=[None, 0.5]) as net:
        run, path = net.run, f"/run/netns/{net.hosts[0].namespace}"
        joined = subprocess.Popen([*net.hosts[1].budget.join_argv(), "sleep", "1000"])
        assert wait_for(lambda: joined.pid in net.hosts[1].budget.pids(), 10)
        entering = subprocess.Popen(["sh", "-c", f"exec 3<{path}; echo held; while [ -e {path} ]; do sleep 0.01; done; "
                                     "exec nsenter --net=/proc/self/fd/3 sleep 1000"], stdout=subprocess.PIPE, text=True)
        assert entering.stdout.readline().strip() == "held"
        assert joined.pid not in net.hosts[1].pids() and entering.pid not in net.hosts[0].pids()
    try:
        assert not running(joined.pid) and not running(entering.pid)
        assert named_cgroups(run + "-") == []
    finally:
        for process in (joined, entering):
            process.kill()
            process.wait()


def test_an_owner_killed_with_sigkill_leaves_no_namespace_and_no_process():
    """Catches cleanup that only runs on a normal exit (atexit, signal handlers): after
    kill -9 of the owner, its reaper must still kill the hosts' processes and the links'
    delay lines, and delete every namespace and every cgroup (host 1's budget) of the run."""
    owner = subprocess.Popen([sys.executable, "-c", OWNER], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        run, pid, *lines = owner.stdout.readline().split()
        sleeper = psutil.Process(int(pid))
        assert sleeper.is_running() and any(ns.startswith(run + "-") for ns in namespaces())
        assert len(lines) == 2 and all(psutil.pid_exists(int(p)) for p in lines), lines
        assert named_cgroups(run + "-")
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert wait_for(lambda: not any(ns.startswith(run + "-") for ns in namespaces()), 60), namespaces()
    assert wait_for(lambda: not named_cgroups(run + "-"), 30), named_cgroups(run + "-")
    for process in (pid, *lines):
        assert wait_for(lambda: gone(int(process)), 30), process


def gone(pid: int) -> bool:
    """No such process, or only its zombie (its parent, the killed owner, never reaped it)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


INTERRUPTED = """
import os, signal, time
from herd.cluster.netns import NetnsCluster
# Python's own handler, as a program started from a terminal has it: a test suite run as a
# background job hands its children SIGINT ignored, and an ignored SIGINT stays ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
net = NetnsCluster(2).__enter__()
run = net.run
try:
    os.kill(os.getpid(), signal.SIGINT)
    # Short sleeps: a signal the kernel hands to another of the process's threads does not
    # cut a long sleep short, and the handler runs only once the main thread's loop goes on.
    for _ in range(300):
        time.sleep(0.1)
    print("not interrupted")
except KeyboardInterrupt:
    print("KeyboardInterrupt", net.closed, len(net.namespaces()), signal.getsignal(signal.SIGINT) is signal.default_int_handler)
"""


def test_ctrl_c_closes_the_cluster_then_reaches_the_program_as_keyboardinterrupt():
    """Catches a SIGINT handler that cleans up and then kills the process (the shell sees exit
    130 and nothing of the program's own handling): after closing the cluster it must hand
    the signal to the handler it replaced, here Python's KeyboardInterrupt, and restore it."""
    done = subprocess.run([sys.executable, "-c", INTERRUPTED], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, (done.returncode, done.stderr[-500:])
    assert done.stdout.split() == ["KeyboardInterrupt", "True", "0", "True"], done.stdout


IGNORING = """
import os, signal, time
from herd.cluster.netns import NetnsCluster
signal.signal(signal.SIGINT, signal.SIG_IGN)            # as under nohup, or a shell's background job
with NetnsCluster(2) as net:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(1)
    print("went on", net.closed, len(net.namespaces()), signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
print("closed", len(net.namespaces()))
"""


def test_a_program_that_ignores_ctrl_c_keeps_its_cluster_through_one():
    """Catches a handler installed over SIG_IGN: a campaign run under nohup (SIGINT ignored)
    lost its namespaces to a stray SIGINT and then failed reading a link's counters. The
    program goes on, so its cluster must stay up, and close when the program closes it."""
    done = subprocess.run([sys.executable, "-c", IGNORING], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, (done.returncode, done.stderr[-500:])
    assert done.stdout.split() == ["went", "on", "False", "3", "True", "closed", "0"], done.stdout


NOT_ROOT = """
import os, sys
from herd.cluster.netns import NamespaceError, NetnsCluster
os.setgid(65534); os.setuid(65534)
try:
    NetnsCluster(2).open()
except NamespaceError as err:
    print(err); sys.exit(2)
sys.exit(0)
"""


def test_where_namespaces_cannot_be_made_the_harness_refuses_in_one_line():
    """Catches a harness that goes on (or passes) without namespaces: as an unprivileged
    user it must raise NamespaceError, one line naming why, and make nothing."""
    before = set(namespaces())
    done = subprocess.run([sys.executable, "-c", NOT_ROOT], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and "network namespaces cannot be made here" in lines[0] and "root" in lines[0], lines
    assert set(namespaces()) <= before
    assert issubclass(NamespaceError, RuntimeError)


def test_a_new_cluster_removes_what_dead_runs_left_behind(hosts_or_fail):
    """Catches leftovers piling up when both an owner and its reaper died (a machine
    reboot of the process table, a container kill): namespaces named for a run whose
    owner process is gone are removed, with their processes, by the next cluster."""
    gone = subprocess.Popen(["true"])
    gone.wait()                                  # a pid that no longer runs
    stale = f"herdnet{gone.pid}x000000-h0"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    sleeper = subprocess.Popen(["ip", "netns", "exec", stale, "sleep", "1000"])
    try:
        assert wait_for(lambda: str(sleeper.pid) in subprocess.run(["ip", "netns", "pids", stale], capture_output=True,
                                                                   text=True).stdout, 10)
        with hosts_or_fail(1) as net:
            assert stale not in namespaces() and net.namespaces()
        assert wait_for(lambda: sleeper.poll() is not None, 10)
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        subprocess.run(["ip", "netns", "del", stale], capture_output=True)


def test_link_latency_is_added_to_each_direction_of_each_link(hosts_or_fail):
    """Catches a latency that is silently not applied, applied once instead of per link and
    direction, or applied twice. A round trip between hosts a and b crosses four delays:
    a's link out, b's link in, b's link out, a's link in, so 2 x (L_a + L_b). Host 0's link
    has 0.5 ms and host 1's 2 ms: at least 5 ms (no load can make it shorter), and less
    than 5 + 3 ms (the delay line's own cost is ~0.1 ms per pass; a doubled delay is 10).
    Host 2's link has none: with host 0 the round trip is 2 x 0.5 ms."""
    shapes = [LinkShape(latency_ms=0.5), LinkShape(latency_ms=2.0), LinkShape()]
    with hosts_or_fail(3, shapes=shapes) as net:
        assert net.link_kind == "delay line"
        slow = measure_rtt(net, 0, 1, count=50)
        assert 5.0 <= slow["p50_ms"] < 8.0, slow
        fast = measure_rtt(net, 2, 0, count=50)
        assert 1.0 <= fast["p50_ms"] < 4.0, fast


def test_a_delay_line_that_dies_fails_the_open_in_one_line_and_leaves_nothing(monkeypatch):
    """Catches a cluster that goes on with a dead link (every test on it would time out, not
    fail): a delay line that cannot start must end the open with NamespaceError, one line
    naming the host, and the run's namespaces must be gone."""
    from herd.cluster import netns
    monkeypatch.setattr(netns, "DELAY_LINE", "/nonexistent/delay_line.py")
    net = netns.NetnsCluster(2, LinkShape(latency_ms=1))
    with pytest.raises(NamespaceError) as caught:
        net.open()
    assert "delay line of host 0 did not start" in str(caught.value) and "\n" not in str(caught.value)
    assert not any(ns.startswith(net.run + "-") for ns in namespaces())
