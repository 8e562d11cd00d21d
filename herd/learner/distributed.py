"""Several learners (--learner_count N): data-parallel learners in one torch.distributed
process group (gloo on CPUs; NCCL for gradients on GPUs, gloo beside it), each with its
own actors and replays and 1/N of every batch.

Every update is one *round*: each learner all-reduces a single flat float32 buffer

    [ gradients (P values) | row of learner 0 | row of learner 1 | ... ]

in which it filled the gradients of its own batch and its own row (others' rows are
zeros, so the sum hands every learner every row exactly). A row carries what that learner
counted since its last round (environment steps, rollouts, stale rollouts dropped,
finished episodes) and two votes: `stop` (Ctrl+C, a failure, the end of the run) and
`more` (it holds episodes that did not fit in the row). So one collective per update
averages the gradients, keeps the counters and episode statistics identical on every
learner (totals over all of them) and makes stopping a collective decision: a learner
that stops joins the next round with zero gradients and its stop vote, and nobody applies
that round's gradients. We measured this against DistributedDataParallel
(benchmarks/learners.py --grad_sync): see the README.

A learner that dies breaks the round for the others: gloo notices the closed connection
at once, a hung learner after --learner_timeout; the survivors raise LearnerFailure.

The learners of one machine meet through a file in a private folder and talk over the
loopback interface, gloo and NCCL both (loopback_environment); what they hand each other besides tensors of numbers (host, pid, the
run folder) is JSON in a tensor, never a pickle (docs/security-clusters.md)."""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np
import psutil
import torch
import torch.distributed as dist

from herd.errors import LearnerFailure
from herd.leftovers import make_private_folder

log = logging.getLogger("herd")

HEADER = ("stop", "more", "env_steps", "rollouts", "stale", "episodes")
MAX_EPISODES = 256      # episodes one row carries; more wait for the next round


def torchrun_world_size() -> int | None:
    """WORLD_SIZE when this process was started by torchrun (RANK and WORLD_SIZE set), else None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    return None


@contextmanager
def private_rendezvous():
    """The path of the file through which the learners of one machine meet (a FileStore),
    in a fresh folder only this user can enter (mkdtemp makes it 0700), removed at the end.
    A TCP store on a port picked beforehand could be taken by someone else between the pick
    and the bind, and any local user could connect to it; a file in a private folder can be
    neither."""
    folder = make_private_folder("herd-learners-")      # and a killed run's left behind is swept
    try:
        yield os.path.join(folder, "rendezvous")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def loopback_interface() -> str:
    """The name of the network interface that holds 127.0.0.1 (lo on Linux, lo0 on macOS)."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses):
            return name
    raise LearnerFailure("no network interface holds 127.0.0.1: the learners of this machine cannot meet")


def loopback_environment() -> dict[str, str]:
    """The variables that keep a group of this machine's learners on the loopback interface.
    Gloo binds to the interface GLOO_SOCKET_IFNAME names, else to the address the host name
    resolves to (often the machine's outside address); NCCL picks an interface of its own
    (the first that is up, loopback last) for its bootstrap sockets and its socket
    transport unless NCCL_SOCKET_IFNAME names one ("=lo": that interface exactly, not a
    prefix), and may use InfiniBand or a network plugin instead of sockets: IB off and its
    own socket network keep it on the named interface. Learners that all run here would
    otherwise listen on the network for nothing."""
    interface = loopback_interface()
    return {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": f"={interface}", "NCCL_IB_DISABLE": "1",
            "NCCL_NET": "Socket"}


# The variables use_loopback replaced, as they were (None: unset), for leave_group.
_replaced: dict[str, str | None] = {}


def use_loopback() -> None:
    """Sets loopback_environment() for as long as this process is in a local group, over
    whatever the user's environment says (a torchrun setting has no place here). Not only
    while the group is made: NCCL reads its variables when it makes its first communicator,
    at the group's first CUDA collective. leave_group() puts back what was there."""
    for name, value in loopback_environment().items():
        _replaced.setdefault(name, os.environ.get(name))
        os.environ[name] = value


def restore_environment() -> None:
    for name, value in _replaced.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _replaced.clear()


def share_of(total: int, count: int, rank: int) -> tuple[int, int]:
    """(first index, how many) of `total` items for learner `rank` of `count`, as even as can be."""
    base, extra = divmod(total, count)
    return rank * base + min(rank, extra), base + (rank < extra)


@dataclass
class LearnerGroup:
    """Where this process stands among the learners."""
    rank: int
    size: int
    local_rank: int = 0
    members: list = field(default_factory=list)     # (host, pid) of every learner, by rank

    @property
    def primary(self) -> bool:
        return self.rank == 0

    def dead_ranks(self) -> list[int]:
        """Learners on this host whose process is gone (others cannot be checked from here)."""
        here = socket.gethostname()
        return [rank for rank, (host, pid) in enumerate(self.members)
                if host == here and rank != self.rank and not pid_alive(pid)]

    def saver(self) -> bool:
        """After a failure: the lowest-ranked learner still alive writes the last checkpoint."""
        dead = set(self.dead_ranks())
        return min(r for r in range(self.size) if r not in dead) == self.rank


def pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def join_group(rank: int, size: int, device_type: str, timeout_s: float, rendezvous: str | None = None,
               local_rank: int | None = None) -> LearnerGroup:
    """Joins the process group: the learners of this machine meet through the file
    `rendezvous` (private_rendezvous) and talk over the loopback interface; torchrun's
    learners (rendezvous None) meet where torchrun says (MASTER_ADDR/PORT), possibly on
    several machines."""
    local = int(os.environ.get("LOCAL_RANK", rank)) if local_rank is None else local_rank
    # Gloo carries everything on CPUs; on GPUs NCCL reduces the (CUDA) round buffer, and
    # each learner must own its GPU before NCCL's first collective (one GPU per learner).
    backend = "gloo"
    if device_type == "cuda":
        backend = "cpu:gloo,cuda:nccl"
        torch.cuda.set_device(local % torch.cuda.device_count())
    timeout = timedelta(seconds=timeout_s)
    if rendezvous is None:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=size, timeout=timeout)
    else:
        use_loopback()                  # until leave_group
        dist.init_process_group(backend, store=dist.FileStore(rendezvous, size), rank=rank, world_size=size,
                                timeout=timeout)
    # Tensors of JSON bytes, never pickles: what a peer sends is read as data, not run as code.
    mine = encode_record([socket.gethostname(), os.getpid()], MEMBER_BYTES)
    records = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(records, mine)
    return LearnerGroup(rank, size, local, [member(decode_record(r)) for r in records])


MEMBER_BYTES = 1024         # one learner's [host name, pid] as JSON (host names: 255 bytes at most)
PRIMARY_BYTES = 65536       # what the primary hands the others (from_primary): a path, a seed


def encode_record(value, size: int) -> torch.Tensor:
    """`value` as JSON in a [size] uint8 tensor: 8 bytes of length (little-endian), then UTF-8."""
    data = json.dumps(value).encode()
    if len(data) > size - 8:
        raise ValueError(f"{len(data)} bytes of JSON do not fit a record of {size}")
    record = torch.zeros(size, dtype=torch.uint8)
    record[:8 + len(data)] = torch.frombuffer(bytearray(len(data).to_bytes(8, "little") + data), dtype=torch.uint8)
    return record


def decode_record(record: torch.Tensor):
    """The JSON value in a record from a peer; LearnerFailure (one line) for anything else."""
    raw = record.cpu().numpy().tobytes()
    length = int.from_bytes(raw[:8], "little")
    if length > len(raw) - 8:
        raise LearnerFailure(f"a learner sent a record claiming {length} bytes (at most {len(raw) - 8})")
    try:
        return json.loads(raw[8:8 + length].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise LearnerFailure("a learner sent a record that is not JSON") from None


def member(value) -> tuple[str, int]:
    """(host, pid) from a peer's record, checked."""
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
            and isinstance(value[1], int) and not isinstance(value[1], bool)):
        raise LearnerFailure("a learner sent a member record that is not [host, pid]")
    return value[0], value[1]


def torchrun_group(device_type: str, timeout_s: float) -> LearnerGroup | None:
    """The group of the processes torchrun started (MASTER_ADDR/PORT, RANK, WORLD_SIZE,
    LOCAL_RANK from it), or None when torchrun did not start this one."""
    size = torchrun_world_size()
    if size is None:
        return None
    return join_group(int(os.environ["RANK"]), size, device_type, timeout_s)


def from_primary(values: list) -> list:
    """The primary's values (JSON: strings, numbers, None) on every learner: the run folder,
    the seed. Sent as JSON bytes in a tensor; the caller checks the types it needs."""
    record = encode_record(list(values), PRIMARY_BYTES) if dist.get_rank() == 0 else \
        torch.zeros(PRIMARY_BYTES, dtype=torch.uint8)
    dist.broadcast(record, src=0)
    received = decode_record(record)
    if not (isinstance(received, list) and len(received) == len(values)):
        raise LearnerFailure(f"the primary learner sent {type(received).__name__} for {len(values)} values")
    return received


def short_reason(err: Exception) -> str:
    """The gist of a gloo/NCCL error, without the C++ source location it starts with."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    text = re.sub(r"^\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", text)
    return text.split(". This is typically")[0][:160]


def leave_group() -> None:
    """Leaves the group, if any, and puts back the variables a local group set."""
    if dist.is_initialized():
        dist.destroy_process_group()
    restore_environment()


def broadcast_state(module: torch.nn.Module) -> None:
    """Every learner starts from the primary's weights (and buffers)."""
    with torch.no_grad():
        for tensor in module.state_dict().values():
            dist.broadcast(tensor, src=0)


@dataclass
class Tally:
    """What one learner counted since its last round."""
    env_steps: int = 0
    rollouts: int = 0
    stale: int = 0
    episodes: list = field(default_factory=list)    # (score, length)

    def add(self, env_steps: int, stale: bool, episodes: list) -> None:
        self.env_steps += env_steps
        self.rollouts += 1
        self.stale += int(stale)
        self.episodes.extend(episodes)

    def merged(self, other: "Tally") -> "Tally":
        """Both counts together (two rounds of one learner)."""
        return Tally(self.env_steps + other.env_steps, self.rollouts + other.rollouts, self.stale + other.stale,
                     self.episodes + other.episodes)


class GroupSync:
    """The round of every update (module docstring). Learner.step calls `exchange` between
    backward and clip; the session feeds `pending` and counts what `received` holds."""

    def __init__(self, group: LearnerGroup, params, max_episodes: int = MAX_EPISODES):
        self.group = group
        self.params = list(params)
        self.numel = sum(p.numel() for p in self.params)
        self.max_episodes = max_episodes
        self.row = len(HEADER) + 2 * max_episodes
        self.pending = Tally()
        # By rank, from every round since the session last took them: an update of several
        # gradient steps (APPO's passes) makes one round per step, each carrying counts.
        self.received: list[Tally] = []
        self.stopped = False                # a round carried a stop vote: no more updates
        self.more = False                   # some learner still holds episodes: drain before the end
        self.broken = False                 # a round failed: no more collectives

    def pack_row(self, stop: bool) -> np.ndarray:
        row = np.zeros(self.row, dtype=np.float32)
        sent, rest = self.pending.episodes[:self.max_episodes], self.pending.episodes[self.max_episodes:]
        row[:len(HEADER)] = (stop, bool(rest), self.pending.env_steps, self.pending.rollouts, self.pending.stale,
                             len(sent))
        if sent:
            # score, length, score, length... (float32: exact for integer scores and lengths below 2**24)
            row[len(HEADER):len(HEADER) + 2 * len(sent)] = np.asarray(sent, dtype=np.float32).reshape(-1)
        self.pending = Tally(episodes=rest)
        return row

    @staticmethod
    def unpack_row(row: np.ndarray) -> Tally:
        count = int(row[5])
        pairs = row[len(HEADER):len(HEADER) + 2 * count].reshape(count, 2)
        return Tally(int(row[2]), int(row[3]), int(row[4]), [(float(s), int(n)) for s, n in pairs])

    def exchange(self, with_gradients: bool = True, stop: bool = False) -> bool:
        """One round. Returns True when the averaged gradients are now in the parameters'
        .grad and the update is to be applied (no learner voted stop)."""
        if self.broken:
            raise LearnerFailure("the learner group already failed")
        device = self.params[0].device
        buffer = torch.zeros(self.numel + self.group.size * self.row, dtype=torch.float32, device=device)
        if with_gradients:
            offset = 0
            for p in self.params:
                if p.grad is not None:
                    buffer[offset:offset + p.numel()].copy_(p.grad.reshape(-1))
                offset += p.numel()
        start = self.numel + self.group.rank * self.row
        buffer[start:start + self.row] = torch.from_numpy(self.pack_row(stop)).to(device)
        try:
            dist.all_reduce(buffer)
        except Exception as err:  # gloo/NCCL raise RuntimeError or DistBackendError subclasses
            self.broken = True
            raise LearnerFailure(f"learner {self.group.rank} lost the other learners ({short_reason(err)})") from None
        rows = buffer[self.numel:].view(self.group.size, self.row).cpu().numpy()
        tallies = [self.unpack_row(r) for r in rows]
        self.received = [old.merged(new) for old, new in zip(self.received, tallies)] if self.received else tallies
        self.more = bool(rows[:, 1].any())
        self.stopped = self.stopped or stop or bool(rows[:, 0].any())
        if self.stopped or not with_gradients:
            return False
        # The sum is identical on every learner, and so is this division: identical weights.
        averaged = buffer[:self.numel].div_(self.group.size)
        offset = 0
        for p in self.params:
            # A parameter the loss does not reach (the feature head) has no gradient on any
            # learner (same model, same loss): it stays None, as with one learner.
            if p.grad is not None:
                p.grad.copy_(averaged[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        return True

    def take_received(self) -> list[Tally]:
        received, self.received = self.received, []
        return received
