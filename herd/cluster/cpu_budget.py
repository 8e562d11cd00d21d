"""Each host's own cores: a cgroup per host whose CFS quota is the host's budget, so the
hosts of a NetnsCluster on one machine behave like machines of that many cores each.
The budgets together must fit this machine's cores; then a host gets its
cores whatever the other hosts do, and its processes' CPU-seconds are counted apart
(cpuacct), where /proc/stat only tells the whole machine's.

Why not Ray's --num-cpus alone: that says how many actors Ray places on a node, and
nothing more; every process still ran on every core of the machine, so four "hosts" on two
cores slowed each other down (the benchmark's CPU per step grew with hosts).

cgroup v1 (`cpu` and `cpuacct` hierarchies, mounted apart or together), as on this
machine and CI. A host's cgroups are made under the owner's own (a parent's limit still
holds) and named <run>-h<i>, so cleaning up a run (netns.remove_run) finds them by name.
Where they cannot be made (cgroup v2 only, read-only /sys/fs/cgroup, not root) the
cluster refuses in one line: NamespaceError, raised by the caller with this text.

Standard library only: the harness's reaper runs netns.py, which imports this, as a script."""
from __future__ import annotations

import errno
import os
import time

# The CFS period: a host may run cores x 10 ms in every 10 ms. Short, because a host that has
# used its quota waits for the next period: with the kernel's default 100 ms a 0.3-core host
# stalled up to 70 ms at a time (hand-offs of ~90 ms), which no real machine does.
PERIOD_US = 10_000
MIN_CORES = 0.1               # the kernel's smallest quota is 1 ms per period
CONTROLLERS = ("cpu", "cpuacct")


class BudgetError(RuntimeError):
    """Per-host CPU budgets cannot be had here; str() is one line saying why."""


def mounts() -> dict[str, str]:
    """{controller: mount point} of the cgroup v1 hierarchies that hold cpu and cpuacct."""
    found = {}
    with open("/proc/mounts") as table:
        for line in table:
            _, point, kind, options, *_ = line.split()
            if kind == "cgroup":
                for controller in CONTROLLERS:
                    if controller in options.split(","):
                        found[controller] = point
    return found


def own_cgroup(controller: str) -> str:
    """This process's cgroup path in the v1 hierarchy holding `controller` ('/' at the top)."""
    with open("/proc/self/cgroup") as table:
        for line in table:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controller in controllers.split(","):
                return path
    raise BudgetError(f"this process is in no cgroup v1 `{controller}` hierarchy")


def check_cores(cores: list[float | None], machine_cores: int | None = None) -> None:
    """Sizes before anything is made: every budget in [MIN_CORES, machine], and all of them
    together within the machine's cores (more would share cores again, as without budgets)."""
    machine_cores = machine_cores or len(os.sched_getaffinity(0))
    for index, c in enumerate(cores):
        if c is not None and not MIN_CORES <= c <= machine_cores:
            raise BudgetError(f"host {index}'s budget of {c:g} cores: give {MIN_CORES:g} to {machine_cores} "
                              "(this machine's cores), or none")
    total = sum(c for c in cores if c is not None)
    if total > machine_cores + 1e-9:
        raise BudgetError(f"the hosts' budgets add up to {total:g} cores, more than this machine's {machine_cores}: "
                          "they would share cores again; give budgets that fit")


class CpuBudget:
    """One host's cgroups (one per hierarchy: cpu and cpuacct may be one mount), made by open()."""

    def __init__(self, name: str, cores: float):
        self.name = name
        self.cores = cores
        self.dirs: list[str] = []          # one per distinct hierarchy, the cpu one first

    def open(self) -> CpuBudget:
        found = mounts()
        missing = [c for c in CONTROLLERS if c not in found]
        if missing:
            raise BudgetError(f"per-host CPU budgets need cgroup v1's {' and '.join(missing)} controller(s), "
                              "which this machine has not mounted (cgroup v2 alone is not supported): "
                              "run without budgets")
        for controller in CONTROLLERS:
            path = os.path.join(found[controller] + own_cgroup(controller), self.name)
            if path in self.dirs:
                continue                    # cpu and cpuacct mounted together
            try:
                os.mkdir(path)
            except FileExistsError:
                pass
            except OSError as err:
                raise BudgetError(f"cannot make the cgroup {path}: {err.strerror} (needs root and a writable "
                                  "/sys/fs/cgroup)") from None
            self.dirs.append(path)
        write(os.path.join(self.dirs[0], "cpu.cfs_period_us"), PERIOD_US)
        write(os.path.join(self.dirs[0], "cpu.cfs_quota_us"), round(self.cores * PERIOD_US))
        return self

    def join_argv(self) -> list[str]:
        """The prefix that starts a command inside these cgroups: a shell writes its own pid
        into each (its children, and what it execs, stay there), then execs the command."""
        procs = [os.path.join(d, "cgroup.procs") for d in self.dirs]
        script = " && ".join(f'echo $$ > "${i + 1}"' for i in range(len(procs)))
        return ["sh", "-c", f'{script} && shift {len(procs)} && exec "$@"', "sh", *procs]

    def usage_path(self) -> str:
        """cpuacct.usage: nanoseconds of CPU the host's processes used, all cores together."""
        return os.path.join(self.dirs[-1], "cpuacct.usage")

    def usage_s(self) -> float:
        return read_int(self.usage_path()) / 1e9

    def throttled(self) -> dict:
        """{'periods', 'throttled_periods', 'throttled_s'}: how often the quota held it back."""
        with open(os.path.join(self.dirs[0], "cpu.stat")) as stat:
            fields = dict(line.split() for line in stat if line.strip())
        return {"periods": int(fields["nr_periods"]), "throttled_periods": int(fields["nr_throttled"]),
                "throttled_s": int(fields["throttled_time"]) / 1e9}

    def pids(self) -> list[int]:
        return procs_in(self.dirs[0])


def write(path: str, value: int) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def read_int(path: str) -> int:
    with open(path) as f:
        return int(f.read().strip())


def named_cgroups(prefix: str) -> list[str]:
    """Every cgroup, in the cpu and cpuacct hierarchies, whose name starts with `prefix`."""
    try:
        points = set(mounts().values())
    except OSError:
        return []
    found = []
    for point in points:
        for parent, children, _ in os.walk(point):
            mine = [c for c in children if c.startswith(prefix)]
            found += [os.path.join(parent, c) for c in mine]
            children[:] = [c for c in children if c not in mine]     # no harness cgroup has children
    return found


def procs_in(cgroup: str) -> list[int]:
    """The processes in one cgroup (a directory); none once it is removed."""
    try:
        with open(os.path.join(cgroup, "cgroup.procs")) as procs:
            return [int(p) for p in procs.read().split()]
    except FileNotFoundError:
        return []


def cgroup_pids(prefix: str) -> list[int]:
    """The processes in every cgroup whose name starts with `prefix`."""
    return sorted({pid for path in named_cgroups(prefix) for pid in procs_in(path)})


def remove_cgroups(run: str, timeout_s: float = 10.0) -> list[str]:
    """Removes the cgroups of `run`'s hosts (named <run>-...) wherever they are in the cpu and
    cpuacct hierarchies, once their processes are gone (the caller killed them; a cgroup
    empties a moment after its last process exits). Returns the ones it removed."""
    removed = []
    for path in named_cgroups(run + "-"):
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                os.rmdir(path)
                removed.append(path)
                break
            except FileNotFoundError:
                break
            except OSError as err:
                if err.errno != errno.EBUSY or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
    return removed


def runs_with_cgroups(prefix: str) -> set[str]:
    """The runs (a cgroup <run>-h<i> -> <run>) of every cgroup named for a harness run."""
    return {os.path.basename(path).split("-")[0] for path in named_cgroups(prefix) if "-" in os.path.basename(path)}
