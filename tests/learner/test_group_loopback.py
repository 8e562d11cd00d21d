"""A group of this machine's learners stays on loopback, gloo and NCCL both
(herd.learner.distributed.loopback_environment), even when the user's environment names
an outside interface for torchrun. Two real learner processes (gloo on the CPU): while
the group lives, every listening socket they own is on 127.0.0.1 (read with `ss`, from
outside them), and their environment names loopback for gloo and for NCCL, which reads
it at its first CUDA collective, after the group is made; afterwards the user's values
are back. Before: only GLOO_SOCKET_IFNAME was set, and only while the group was made."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time

import psutil
import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from herd.learner.distributed import join_group, leave_group, loopback_environment, private_rendezvous

VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_NET")


def outside_interface() -> str | None:
    """An interface other than loopback that holds an IPv4 address (what a user's
    GLOO_SOCKET_IFNAME names for torchrun), or None on a machine without one."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family.name == "AF_INET" and not a.address.startswith("127.") for a in addresses):
            return name
    return None


def worker(rank: int, rendezvous: str, out: str) -> None:
    group = join_group(rank, 2, "cpu", timeout_s=120, rendezvous=rendezvous)
    try:
        with open(os.path.join(out, f"during{rank}.json"), "w") as f:
            json.dump({name: os.environ.get(name) for name in VARIABLES}, f)
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(out, "looked")) and time.monotonic() < deadline:
            time.sleep(0.05)            # the test reads the sockets now
        dist.barrier()
    finally:
        leave_group()
    with open(os.path.join(out, f"after{rank}.json"), "w") as f:
        json.dump({name: os.environ.get(name) for name in VARIABLES}, f)
    assert group.size == 2


def listening(pids: set[int]) -> list[str]:
    """The local addresses of the TCP sockets the processes `pids` listen on, by `ss -ltnp`."""
    done = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, timeout=30, check=True)
    addresses = []
    for line in done.stdout.splitlines():
        owners = {int(pid) for pid in re.findall(r"pid=(\d+)", line)}
        if owners & pids:
            addresses.append(line.split()[3].rsplit(":", 1)[0].strip("[]"))
    return addresses


@pytest.fixture
def users_interfaces(monkeypatch):
    """The user's environment names an outside interface for both libraries, as for torchrun."""
    outside = outside_interface()
    if outside is None:
        pytest.skip("this machine has no interface beside loopback for the user's setting to name")
    users = {"GLOO_SOCKET_IFNAME": outside, "NCCL_SOCKET_IFNAME": outside}
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in users.items():
        monkeypatch.setenv(name, value)
    return users


def test_a_local_group_listens_on_loopback_only_and_names_it_for_nccl(tmp_path, users_interfaces):
    if shutil.which("ss") is None:
        pytest.skip("no ss on this machine")
    out = str(tmp_path)
    context = mp.get_context("spawn")
    with private_rendezvous() as rendezvous:
        processes = [context.Process(target=worker, args=(rank, rendezvous, out)) for rank in range(2)]
        for p in processes:
            p.start()
        try:
            deadline = time.monotonic() + 120
            while not all(os.path.exists(tmp_path / f"during{r}.json") for r in range(2)):
                assert time.monotonic() < deadline and all(p.is_alive() for p in processes), "the group never formed"
                time.sleep(0.05)
            addresses = listening({p.pid for p in processes})
        finally:
            (tmp_path / "looked").touch()
            for p in processes:
                p.join(120)
                if p.is_alive():
                    p.kill()
    assert [p.exitcode for p in processes] == [0, 0]
    assert addresses, "the learners listen on nothing: the check below would check nothing"
    assert set(addresses) == {"127.0.0.1"}, addresses
    expected = loopback_environment()
    assert expected["GLOO_SOCKET_IFNAME"] == "lo" and expected["NCCL_SOCKET_IFNAME"] == "=lo"
    for rank in range(2):
        during = json.loads((tmp_path / f"during{rank}.json").read_text())
        after = json.loads((tmp_path / f"after{rank}.json").read_text())
        assert during == expected, during                  # NCCL's variables still set after the group was made
        assert after == {name: users_interfaces.get(name) for name in VARIABLES}, after
