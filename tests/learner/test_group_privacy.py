"""Learner groups stay private (herd/learner/distributed.py): two real learner processes
meet through a file in a 0700 folder that is gone afterwards, open no socket beyond the
loopback interface (not even when the host name resolves to an outside address), and
hand each other JSON bytes, never a pickle."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from herd.errors import LearnerFailure
from herd.learner.distributed import (MEMBER_BYTES, decode_record, encode_record, from_primary, join_group,
                                      leave_group, member, private_rendezvous)

HERE = os.path.dirname(os.path.abspath(__file__))
LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")


class RefusingUnpickler:
    """Stands in for torch.distributed's unpickler: any pickle a peer sends ends the learner."""

    def __init__(self, *args, **kwargs):
        raise AssertionError("a learner unpickled what a peer sent")


def worker(rank: int, rendezvous: str, out: str) -> None:
    import psutil
    dist.distributed_c10d._unpickler = RefusingUnpickler
    group = join_group(rank, 2, "cpu", timeout_s=120, rendezvous=rendezvous)
    try:
        shared = from_primary(["/runs/primary", 7] if rank == 0 else [None, 0])
        sockets = [(c.status, c.laddr.ip, c.raddr.ip if c.raddr else None)
                   for c in psutil.Process().net_connections(kind="inet")]
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump({"members": group.members, "shared": shared, "sockets": sockets,
                       "folder_mode": stat.S_IMODE(os.stat(os.path.dirname(rendezvous)).st_mode)}, f)
        dist.barrier()          # both have looked at their sockets before either leaves
    finally:
        leave_group()


def run_pair(out: str) -> dict:
    """Both learners' reports, and whether the rendezvous folder outlived the group."""
    context = mp.get_context("spawn")
    with private_rendezvous() as rendezvous:
        processes = [context.Process(target=worker, args=(rank, rendezvous, out)) for rank in range(2)]
        for p in processes:
            p.start()
        for p in processes:
            p.join(120)
        codes = [p.exitcode for p in processes]
        for p in processes:
            if p.is_alive():
                p.kill()
    reports = [json.load(open(os.path.join(out, f"rank{r}.json"))) if codes[r] == 0 else None for r in range(2)]
    return {"codes": codes, "reports": reports, "pids": [p.pid for p in processes],
            "folder_left": os.path.exists(os.path.dirname(rendezvous))}


def check_private(result: dict) -> None:
    assert result["codes"] == [0, 0], result["codes"]          # a pickle anywhere ends a learner
    first, second = result["reports"]
    assert [tuple(m) for m in first["members"]] == [tuple(m) for m in second["members"]]
    assert [pid for _, pid in first["members"]] == result["pids"]
    assert first["shared"] == second["shared"] == ["/runs/primary", 7]
    assert first["folder_mode"] == 0o700 and not result["folder_left"]
    for report in result["reports"]:
        assert report["sockets"], "gloo opened no socket: the check below would check nothing"
        outside = [s for s in report["sockets"] if s[1] not in LOOPBACK or s[2] not in (None, *LOOPBACK)]
        assert not outside, outside


def test_learners_meet_privately_on_loopback_and_exchange_no_pickles(tmp_path):
    """Catches: a TCP store on a port picked then re-bound (raced, and listening on every
    interface for any local user), gloo sockets beyond loopback, members gathered or the run
    folder broadcast as pickles (all_gather_object, broadcast_object_list), and a
    rendezvous folder left behind or readable by others."""
    check_private(run_pair(str(tmp_path)))


NAMESPACE_SETUP = """
set -e
ip link set lo up
ip link add herd0 type veth peer name herd1
ip addr add 10.211.0.1/24 dev herd0
ip link set herd1 up
ip link set herd0 up
hostname herd-far
printf '127.0.0.1 localhost\\n10.211.0.1 herd-far\\n' > "$HOSTS"
mount --bind "$HOSTS" /etc/hosts
exec "$PYTHON" -c "$PROGRAM"
"""


def test_gloo_stays_on_loopback_when_the_host_name_resolves_outside(tmp_path):
    """Catches gloo binding to whatever the host name resolves to. Here (a network, UTS and
    mount namespace of the test's own) the name resolves to 10.211.0.1 on a veth
    interface, as a machine's name resolves to its LAN address: the learners, all on this
    machine, must still talk over 127.0.0.1 only."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-r", "-n", "-u", "-m", "true"],
                                                         capture_output=True).returncode != 0:
        pytest.skip("this machine does not let a test make its own network namespace (unshare)")
    program = textwrap.dedent(f"""
        import json, socket, sys
        sys.path[:0] = [{HERE!r}, {os.path.dirname(HERE)!r}]
        import test_group_privacy as t
        assert socket.gethostbyname(socket.gethostname()) == "10.211.0.1"
        print(json.dumps(t.run_pair({str(tmp_path)!r})))
    """)
    env = {**os.environ, "HOSTS": str(tmp_path / "hosts"), "PYTHON": sys.executable, "PROGRAM": program}
    done = subprocess.run(["unshare", "-r", "-n", "-u", "-m", "sh", "-c", NAMESPACE_SETUP], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    check_private(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_peer_record_that_is_not_what_herd_sends_is_one_line():
    """Catches a peer's record read without bounds: a length beyond the record, bytes that
    are not JSON, nesting deep enough to exhaust the stack, or a member that is not
    [host, pid] must each end in one LearnerFailure line, not a traceback or an allocation."""
    record = encode_record(["host", 12], MEMBER_BYTES)
    assert member(decode_record(record)) == ("host", 12)
    lying = record.clone()
    lying[:8] = torch.frombuffer(bytearray((2**62).to_bytes(8, "little")), dtype=torch.uint8)
    garbage = record.clone()
    garbage[8:12] = torch.tensor([0xff, 0xfe, 0x80, 0x00], dtype=torch.uint8)
    nested = b"[" * 30_000 + b"]" * 30_000           # valid JSON, nested past the interpreter's stack limit
    deep = torch.frombuffer(bytearray(len(nested).to_bytes(8, "little") + nested), dtype=torch.uint8)
    for bad, words in ((lying, "claiming"), (garbage, "not JSON"), (deep, "not JSON")):
        with pytest.raises(LearnerFailure, match=words) as err:
            decode_record(bad)
        assert "\n" not in str(err.value)
    for value in (["host"], ["host", "12"], [3, 12], ["host", True], {"host": 12}):
        with pytest.raises(LearnerFailure, match=r"not \[host, pid\]"):
            member(value)
    with pytest.raises(ValueError, match="do not fit"):
        encode_record(["x" * MEMBER_BYTES, 1], MEMBER_BYTES)
