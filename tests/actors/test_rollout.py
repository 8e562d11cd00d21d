"""The actor loop and its rollout writer, with fake environments and a fake policy whose
every value says where it came from: each environment's column must hold consecutive
steps of that environment, in sync and in async mode, with outcomes on the right step."""
import threading

import numpy as np
import pytest

from herd.actors.actor import act_and_collect
from herd.interfaces import EnvBatch, PolicyStep
from herd.actors.rollout import RolloutWriter
from herd.algos.impala import impala_layout
from herd.store import TrajectorySlots

T, E, A, F = 4, 5, 3, 2
LAYOUT = impala_layout(unroll_length=T, obs_shape=(2,), obs_dtype="float32", num_actions=A, feature_size=F)
DONE_EVERY, TRUNCATE_EVERY = 7, 11


class CountingEnvs:
    """Env e's observation is [e, c] where c counts its steps; reward c; every 7th step ends
    an episode, every 11th is a time-limit truncation. Async: each batch is a random subset."""

    def __init__(self, batch_size: int, seed: int = 0):
        self.num_envs, self.batch_size = E, batch_size
        self.count = np.zeros(E, dtype=np.int64)
        self.rng = np.random.default_rng(seed)
        self.pending: list = []     # envs stepping (sent, not yet received)
        self.ready: list = []       # envs stepped, waiting to be received
        self.last_ids = None

    def rows(self, ids):
        return np.stack([np.array([e, self.count[e]], dtype=np.float32) for e in ids])

    def start(self) -> EnvBatch:
        self.ready = list(range(E))
        return self.take(initial=True)

    def take(self, initial=False) -> EnvBatch:
        order = self.rng.permutation(len(self.ready)) if self.batch_size < E else np.arange(len(self.ready))
        ids = np.array([self.ready[i] for i in order[: self.batch_size]], dtype=np.int64)
        self.ready = [e for e in self.ready if e not in set(ids.tolist())]
        self.last_ids = ids
        batch = EnvBatch(ids, self.rows(ids), np.zeros(len(ids), np.float32), np.zeros(len(ids), np.bool_))
        if not initial:
            for row, e in enumerate(ids):
                c = self.count[e]
                batch.reward[row] = c
                batch.done[row] = c % DONE_EVERY == 0 or c % TRUNCATE_EVERY == 0
                if c % TRUNCATE_EVERY == 0 and c % DONE_EVERY != 0:
                    batch.truncated_obs[row] = np.array([e, -c], dtype=np.float32)
        return batch

    def send(self, actions):
        assert len(actions) == len(self.last_ids)
        for e in self.last_ids:
            self.count[e] += 1
        self.ready += self.last_ids.tolist()

    def recv(self) -> EnvBatch:
        return self.take()

    def close(self):
        pass


class EchoPolicy:
    """action = c % A, value = c, logits/features carry e and c; version = refresh count."""

    finish_rollout = None

    def __init__(self):
        self.version = 0

    def act(self, obs, env_ids=None, reset=None):
        e, c = obs[:, 0], obs[:, 1]
        fields = {"behaviour_logits": np.stack([e, c, -c], 1).astype(np.float32),
                  "behaviour_value": c.astype(np.float32), "features": np.stack([e, c], 1).astype(np.float32)}
        return PolicyStep((c % A).astype(np.int64), fields, self.version)

    def value(self, obs, env_ids=None):
        return obs[:, 1].astype(np.float32)        # -c for a truncated final obs

    def refresh(self):
        self.version += 1
        return self.version

    def close(self):
        pass


def run_loop(batch_size: int, deliveries: int, slots_count: int = 6):
    slots = TrajectorySlots(LAYOUT, slots_count, E)
    free = list(range(slots_count))
    acquired, delivered, copies = [], [], []
    stop = threading.Event()

    def acquire():
        slot = free.pop(0)
        acquired.append(slot)
        return slot

    def send(delivery):
        delivered.append(delivery)
        copies.append({name: view.copy() for name, view in slots.views(delivery.slot).items()})
        slots.reset(delivery.slot)
        free.append(delivery.slot)                 # the learner frees it at once
        if len(delivered) == deliveries:
            stop.set()

    writer = RolloutWriter(slots.views, acquire, T, E)
    act_and_collect(CountingEnvs(batch_size), EchoPolicy(), writer, send, stop)
    return delivered, copies, acquired


@pytest.mark.parametrize("batch_size", [E, 2, 1])
def test_every_column_holds_consecutive_steps_of_its_environment(batch_size):
    delivered, copies, _ = run_loop(batch_size, deliveries=6)
    for k, data in enumerate(copies):
        for e in range(E):
            first = k * T                                            # env e's k-th trajectory starts at count k*T
            assert data["obs"][:, e, 0].tolist() == [e] * (T + 1)
            assert data["obs"][:, e, 1].tolist() == list(range(first, first + T + 1))
            counts = np.arange(first, first + T)
            assert data["action"][:, e].tolist() == (counts % A).tolist()
            assert data["behaviour_value"][:, e].tolist() == counts.tolist()
            assert data["features"][:, e].tolist() == [[e, c] for c in counts]
            after = counts + 1                                       # the step's outcome: count after it
            assert data["reward"][:, e].tolist() == after.tolist()
            ended = (after % DONE_EVERY == 0) | (after % TRUNCATE_EVERY == 0)
            assert data["done"][:, e].tolist() == ended.tolist()
            truncated = (after % TRUNCATE_EVERY == 0) & (after % DONE_EVERY != 0)
            assert data["trunc_value"][:, e].tolist() == np.where(truncated, -after, 0).tolist()
    assert all(d.steps == T * E for d in delivered)


def test_sync_mode_keeps_one_slot_open_and_versions_are_the_oldest_acting():
    delivered, _, acquired = run_loop(E, deliveries=4)
    assert len(acquired) == 5 and acquired[:2] == [0, 1]   # the next slot is taken only after one is delivered
    assert [d.version for d in delivered] == [0, 1, 2, 3]   # one refresh after each delivery


def test_async_mode_delivers_in_order_with_the_oldest_version():
    delivered, _, acquired = run_loop(1, deliveries=5)
    versions = [d.version for d in delivered]
    assert versions == sorted(versions) and len(set(acquired)) <= 6


def test_an_actor_with_one_slot_hands_it_over_before_it_opens_the_next():
    # With one slot (--shared_queue_size=1) the next trajectory can only start once the
    # learner has the last one back: acquiring first would wait forever (here: pop from
    # an empty list). Each delivery must still hold consecutive steps of every env.
    delivered, copies, acquired = run_loop(E, deliveries=3, slots_count=1)
    assert [d.slot for d in delivered] == [0, 0, 0] and acquired == [0, 0, 0, 0]
    for k, data in enumerate(copies):
        for e in range(E):
            assert data["obs"][:, e, 1].tolist() == list(range(k * T, k * T + T + 1))


@pytest.mark.parametrize("batch_size, lockstep", [(E, True), (2, False)])
def test_a_synchronous_backend_is_written_in_lockstep(batch_size, lockstep):
    """With every environment in every batch, in order, each write is one slice per field
    (the test above checks what lands); the first partial batch ends that for good."""
    slots = TrajectorySlots(LAYOUT, 4, E)
    free = list(range(4))
    writer = RolloutWriter(slots.views, lambda: free.pop(0), T, E)
    stop = threading.Event()

    def send(delivery):
        free.append(delivery.slot)
        stop.set()

    act_and_collect(CountingEnvs(batch_size), EchoPolicy(), writer, send, stop)
    assert writer.lockstep is lockstep
