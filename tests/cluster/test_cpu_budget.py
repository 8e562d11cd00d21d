"""Each host's own cores (herd/cluster/cpu_budget.py): a host with a budget cannot use more
CPU than it, its processes and their children are counted in its cgroup, the links' delay
lines are not, the sizes are refused in one line before anything is made, and nothing is
left behind (closed, or its owner killed)."""
import os
import subprocess
import sys

import pytest

from herd.cluster.cpu_budget import BudgetError, CpuBudget, check_cores, mounts, named_cgroups, runs_with_cgroups
from herd.cluster.netns import LinkShape, NamespaceError, NetnsCluster, namespaces
from herd_testing import wait_for

# Spins for argv[1] seconds of wall time; prints the CPU-seconds it got.
SPIN = "import sys,time\nt=time.monotonic()\nwhile time.monotonic()-t<float(sys.argv[1]): pass\nprint(time.process_time())"


def test_a_host_with_a_budget_gets_that_many_cores_and_is_counted_apart(hosts_or_fail):
    """Catches a quota that is not applied (or applied to another cgroup) and a count that
    misses the host's processes. Host 0 (0.2 cores) and host 1 (no budget) spin at once for
    3 s: host 0 may use at most 0.2 x 3 s (plus one period's slack), while host 1 gets far more
    (the negative control: without the quota the same loop takes most of a core), and the
    kernel says it throttled host 0."""
    with hosts_or_fail(2, cores=[0.2, None]) as net:
        budget = net.hosts[0].budget
        assert budget is not None and net.hosts[1].budget is None
        before = budget.usage_s()
        spins = [host.popen([sys.executable, "-c", SPIN, "3"], stdout=subprocess.PIPE, text=True)
                 for host in net.hosts]
        capped, free = (float(s.communicate(timeout=60)[0]) for s in spins)
        used = budget.usage_s() - before
        assert capped <= used + 0.01                     # the loop's own CPU is within its host's count
        assert used <= 0.2 * 3.0 * 1.15 + 0.05, used      # python's start-up also runs under the quota
        assert free >= 3 * used, (free, used)
        assert budget.throttled()["throttled_periods"] > 0


def test_what_a_host_starts_stays_in_its_cgroup_and_a_delay_line_stays_out(hosts_or_fail):
    """Catches a budget joined by the first process only (Ray's raylet and workers are its
    children's children) and a link's delay line charged to its host (a real link costs a
    host nothing)."""
    with hosts_or_fail(2, LinkShape(latency_ms=1), cores=[0.5, 0.5]) as net:
        shell = net.hosts[1].popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
        try:
            grandchild = int(shell.stdout.readline())
            assert shell.pid in net.hosts[1].budget.pids() and grandchild in net.hosts[1].budget.pids()
            assert grandchild not in net.hosts[0].budget.pids()
            lines = [line.pid for line in net.delay_lines]
            assert len(lines) == 2 and not set(lines) & {p for h in net.hosts for p in h.budget.pids()}
        finally:
            shell.kill()
            shell.wait()
        run = net.run
        assert len(named_cgroups(run + "-")) >= 2
    assert named_cgroups(run + "-") == [] and not any(ns.startswith(run + "-") for ns in namespaces())


@pytest.mark.parametrize("hosts, cores, reason", [
    (3, [1.5, 1.5, 1.5], "add up to 4.5 cores"),
    (2, [0.05, None], "host 0's budget of 0.05 cores: give 0.1 to 2"),
    (2, [-1.0, None], "host 0's budget of -1 cores"),
    (2, [0.5], "1 CPU budgets for 2 hosts"),
], ids=["too_many", "too_small", "negative", "one_short"])
def test_budgets_that_do_not_fit_are_refused_in_one_line_before_anything_is_made(hosts, cores, reason, monkeypatch):
    """Catches budgets that share cores again (more than the machine's, here said to be 2),
    quotas the kernel cannot give, and a count that does not match the hosts: NamespaceError,
    one line, raised by the constructor, before any namespace or cgroup exists."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    before = set(namespaces())
    with pytest.raises(NamespaceError) as caught:
        NetnsCluster(hosts, cores=cores)
    assert reason in str(caught.value) and "\n" not in str(caught.value)
    assert set(namespaces()) == before


def test_check_cores_counts_only_the_hosts_with_a_budget():
    """Catches None (no budget) counted as cores, or a sum checked against the wrong count."""
    check_cores([1.0, None, 1.0], machine_cores=2)
    with pytest.raises(BudgetError, match="add up to 2.01 cores, more than this machine's 2"):
        check_cores([1.0, 1.01, None], machine_cores=2)


def test_a_machine_without_cgroup_v1_cpu_refuses_in_one_line(monkeypatch):
    """Catches a budget silently not applied where the cpu hierarchy is missing (cgroup v2
    alone): opening it says so in one line."""
    from herd.cluster import cpu_budget
    monkeypatch.setattr(cpu_budget, "mounts", lambda: {"cpuacct": "/sys/fs/cgroup/cpuacct"})
    with pytest.raises(BudgetError) as caught:
        CpuBudget("herdnet0x0-h0", 0.5).open()
    assert "cgroup v1's cpu controller" in str(caught.value) and "\n" not in str(caught.value)


def test_a_new_cluster_removes_the_cgroups_of_dead_runs(hosts_or_fail):
    """Catches cgroups piling up when an owner and its reaper both died: a cgroup named for a
    run whose owner is gone is removed by the next cluster, and one of a live owner is kept."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    cpu = mounts()["cpu"]
    stale, alive = (os.path.join(cpu, f"herdnet{pid}x000000-h0") for pid in (gone.pid, os.getpid()))
    for path in (stale, alive):
        os.makedirs(path, exist_ok=True)
    try:
        assert {f"herdnet{gone.pid}x000000", f"herdnet{os.getpid()}x000000"} <= runs_with_cgroups("herdnet")
        with hosts_or_fail(1):
            pass
        assert wait_for(lambda: not os.path.exists(stale), 10) and os.path.exists(alive)
    finally:
        for path in (stale, alive):
            if os.path.exists(path):
                os.rmdir(path)
