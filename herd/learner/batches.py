"""Where the learner gets its batches: straight from the replay mixer, or prepared ahead
by background threads (`caching`) so that writing, sampling, decompressing and collating
hide behind the learner's step. (With the Ray backend's --replay_server the replay lives
in a Ray actor instead: herd/backends/ray_replay.py's RemoteBatches, the same protocol;
`ReplayElsewhere` below stands in for it until the backend has started it.)

Every source takes rollouts with `put_rollout(views, version)` (field -> [time, E, ...],
written with one copy per field where the replays allow; `put(trajectories, version)`
takes a list of environment columns, field -> [time, ...], as one rollout), hands out
ready batches with `next_ready()` -> (tensors, MixedBatch) or None when none is ready yet,
passes the learner's new per-column values (priorities) back to the replays with
`update(keys, values)`: a batch prepared ahead may have been partly overwritten since,
and the replays' keys make sure such values are dropped, not misapplied; and takes each
batch back with `give_back(mixed)` once the learner's step has read it. On a CPU learner
whose only replay is the on-policy queue, batches are lent (herd/replay/mixer.py `lends`,
herd/training.py build_mixer): the step reads the observations where the queue wrote
them, and the queue keeps those positions from new rollouts until they are given back.
Where the local backend's loop has switched that queue to the actors' slots (`read_slots`,
herd/replay/slot_queue.py), `keep(start, n, version, on_free)` takes a rollout where it
is instead of `put_rollout`, and the slot goes back (on_free) once it was trained on."""
from __future__ import annotations

import logging
import queue
import threading
import time

import torch

from herd.errors import ReplayLost
from herd.learner.learner import to_tensors
from herd.learner.staging import Staging
from herd.replay.mixer import ReplayMixer
from herd.replay.writer import WriterQueue
from herd.store import TrajectorySlots
from herd.trajectory import stack_columns

log = logging.getLogger("herd")


class DirectBatches:
    def __init__(self, mixer: ReplayMixer, device: torch.device):
        self.mixer = mixer
        self.device = device
        self.discarded = 0

    def has_room(self) -> bool:
        """False while the learner lags its replay ratio (herd/replay/mixer.py): train first."""
        return not self.mixer.lagging()

    def can_add(self, n: int) -> bool:
        """n trajectories can be written now without losing an unused fresh one."""
        return self.mixer.can_add(n)

    def slots_full(self) -> bool:
        """The queue reads the actors' slots and holds its capacity: take no rollout now."""
        return self.mixer.slots_full()

    def put_rollout(self, views: dict, version: int) -> None:
        """Writes into the replays now (one copy, out of the slot)."""
        self.mixer.add_rollout(views, version)

    def put(self, trajectories: list, version: int) -> None:
        self.put_rollout(stack_columns(trajectories), version)

    def read_slots(self, slots: TrajectorySlots) -> bool:
        """Fresh rollouts may be kept where the actors wrote them from now on (ReplayMixer.read_slots)."""
        return self.mixer.read_slots(slots)

    def keep(self, start: int, n: int, version: int, on_free, overwrite: bool = True) -> bool:
        """A rollout in the slots' positions start .. start + n - 1 taken where it is (True:
        on_free() once trained on), or not (False: put_rollout it). overwrite: SlotQueue.keep's."""
        return self.mixer.keep(start, n, version, on_free, overwrite)

    def prepare(self):
        """The next batch, sampled (a herd.replay.mixer.MixedBatch), or None when none is ready."""
        return self.mixer.sample() if self.mixer.ready() else None

    def next_ready(self):
        """(tensors, MixedBatch) or None."""
        mixed = self.prepare()
        if mixed is None:
            return None
        tensors = to_tensors(mixed.data, mixed.replayed, self.device)
        mixed.data = None  # the tensors hold it now
        return tensors, mixed

    def update(self, keys: list, values) -> int:
        return self.mixer.update(keys, values)

    def give_back(self, mixed) -> None:
        self.mixer.give_back(mixed)

    def replay_state(self) -> dict:
        return self.mixer.state_dict()

    def replay_nbytes(self) -> int:
        return self.mixer.nbytes()

    def load_replay_state(self, state: dict, fresh: bool = True) -> None:
        self.mixer.load_state_dict(state, fresh)

    def close(self) -> None:
        pass


class PrefetchedBatches:
    """A wrapper around a DirectBatches that runs its one line, `prepare()`, ahead: `threads`
    workers each write waiting rollouts into the replays and prepare up to `per_round`
    batches per round into a queue of `buffer_size` ready batches, staged on their way to
    the device. Every call into the wrapped source is made under one lock (the mixer is not
    thread-safe on its own)."""

    def __init__(self, source: DirectBatches, threads: int, per_round: int, buffer_size: int,
                 writer_queue_size: int, discarding_strategy: str):
        self.source = source
        self.mixer = source.mixer           # read without the lock for figures (replay_nbytes)
        self.device = source.device
        self.staging = Staging(self.device)     # a copy stream of its own on a GPU
        self.per_round = per_round
        self.writer = WriterQueue(writer_queue_size, discarding_strategy)
        self.ready: queue.Queue = queue.Queue(maxsize=buffer_size)
        self.lock = threading.Lock()        # the mixer is not thread-safe on its own
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.workers = [threading.Thread(target=self.work, name=f"herd-batches-{i}", daemon=True)
                        for i in range(threads)]
        for worker in self.workers:
            worker.start()

    @property
    def discarded(self) -> int:
        return self.writer.discarded

    def has_room(self) -> bool:
        """False while the writer queue is full, the queue reading the actors' slots holds
        its capacity, or the learner lags its replay ratio: the learner should take no more
        rollouts. (The mixer's figures are read without the
        lock: a count one write old is close enough.)"""
        return self.writer.has_room() and self.source.has_room() and not self.source.slots_full()

    def put(self, trajectories: list, version: int) -> None:
        self.put_rollout(stack_columns(trajectories), version)

    def read_slots(self, slots: TrajectorySlots) -> bool:
        with self.lock:
            return self.source.read_slots(slots)

    def keep(self, start: int, n: int, version: int, on_free) -> bool:
        """DirectBatches.keep; not while copied rollouts wait for a worker (they come first)."""
        with self.lock:
            # Within the queue's capacity (has_room), as the copies would wait in the writer queue.
            kept = self.writer.peek() is None and self.source.keep(start, n, version, on_free, overwrite=False)
        if kept:
            self.writer.poke()              # a worker prepares the batch this may complete
        return kept

    def put_rollout(self, views: dict, version: int) -> None:
        """views: field -> [time, E, ...], the slot's (copied before this returns)."""
        if self.error is not None:
            raise RuntimeError("batch preparation failed") from self.error
        # Straight into the replays where that needs no waiting: the mixer free (a worker
        # is not sampling), nothing queued before these (order kept) and room for them.
        if self.lock.acquire(blocking=False):
            try:
                written = self.writer.peek() is None and self.source.can_add(views["action"].shape[1])
                if written:
                    self.source.put_rollout(views, version)
            finally:
                self.lock.release()
            if written:
                self.writer.poke()          # a worker prepares the batch these may complete
                return
        # Else copied now, for a worker to write: the slot goes back to its actor as soon as
        # this returns.
        self.writer.offer(({name: array.copy() for name, array in views.items()}, version))

    def work(self) -> None:
        try:
            while not self.stopping.is_set():
                self.writer.wait_for_work(timeout=0.05)
                prepared = []
                with self.lock:
                    # Write what waits, as long as no unused fresh trajectory gets overwritten.
                    while (item := self.writer.peek()) is not None and self.source.can_add(item[0]["action"].shape[1]):
                        self.source.put_rollout(*self.writer.pop())
                    while len(prepared) < self.per_round and not self.ready.full() and (
                            mixed := self.source.prepare()) is not None:
                        prepared.append(mixed)
                if not prepared and self.writer.peek() is not None:
                    time.sleep(0.001)  # waiting for the learner to take a prepared batch
                for mixed in prepared:
                    staged = self.staging.stage(mixed.data, mixed.replayed)
                    mixed.data = None  # the tensors hold it now: don't keep the numpy copy alive
                    while not self.stopping.is_set():
                        try:
                            self.ready.put((staged, mixed), timeout=0.1)
                            break
                        except queue.Full:
                            continue
        except BaseException as err:  # surfaced to the learner thread on its next put()
            log.exception("batch preparation failed")
            self.error = err

    def next_ready(self):
        try:
            (tensors, copied), mixed = self.ready.get_nowait()
            return Staging.hand_over(tensors, copied), mixed
        except queue.Empty:
            if self.error is not None:
                raise RuntimeError("batch preparation failed") from self.error
            return None

    def update(self, keys: list, values) -> int:
        with self.lock:
            return self.source.update(keys, values)

    def give_back(self, mixed) -> None:
        """Also wakes a worker: rollouts waiting for the room may be written now."""
        if mixed.lent:
            with self.lock:
                self.source.give_back(mixed)
            self.writer.poke()

    def replay_nbytes(self) -> int:
        """An estimate, read without the lock (a figure for the hardware monitor)."""
        return self.mixer.nbytes()

    def replay_state(self) -> dict:
        """The replays' contents; batches already prepared are not part of it."""
        with self.lock:
            return self.source.replay_state()

    def load_replay_state(self, state: dict, fresh: bool = True) -> None:
        with self.lock:
            self.source.load_replay_state(state, fresh)

    def close(self) -> None:
        self.stopping.set()
        for worker in self.workers:
            worker.join(2.0)


class ReplayElsewhere:
    """The batch source of a run whose replay lives in another process (the Ray backend's
    replay server) until the backend has started that process and taken over
    (RemoteBatches): it knows how to build the replay there (`build() -> ReplayMixer`,
    picklable), keeps the checkpoint's replay state for it, and gives no batches. It is
    also what holds the server's last state between the backend's end and the final
    checkpoint (the server ends with the backend's Ray connection)."""

    discarded = 0

    def __init__(self, build, requests_ahead: int = 0, writes_waiting: int = 0, state: dict | None = None,
                 lost: BaseException | None = None):
        """requests_ahead: sample requests the learner keeps in flight to the server
        (--cache_output_buffer_size); writes_waiting: rollouts sent to it and not yet
        written after which the learner takes no more (--replay_writer_queue_size)."""
        self.build = build
        self.requests_ahead, self.writes_waiting = requests_ahead, writes_waiting
        self.state, self.fresh = state, True
        self.lost = lost      # why the state could not be fetched (the server had died), else None

    def hand_over(self, batches) -> None:
        """Loads the replay state it holds (a checkpoint's) into the source that takes over."""
        if self.state is not None:
            batches.load_replay_state(self.state, self.fresh)

    def has_room(self) -> bool:
        return False

    def put_rollout(self, views, version: int) -> None:
        raise RuntimeError("the replay server has not started (or has ended): no rollout can be stored")

    def read_slots(self, slots) -> bool:
        return False            # the replay is in another process: rollouts travel to it

    def keep(self, start: int, n: int, version: int, on_free) -> bool:
        return False

    def next_ready(self):
        return None

    def update(self, keys: list, values) -> int:
        return 0

    def give_back(self, mixed) -> None:
        pass

    def replay_state(self) -> dict | None:
        """The loaded (or last fetched) state; None when there is none (a run stopped before
        its replay server started): the checkpoint then holds no replay."""
        if self.lost is not None:
            raise ReplayLost(str(self.lost))
        return self.state

    def load_replay_state(self, state: dict, fresh: bool = True) -> None:
        self.state, self.fresh = state, fresh

    def replay_nbytes(self) -> int:
        return 0

    def close(self) -> None:
        self.state = None
