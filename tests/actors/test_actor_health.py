"""The hang clock of an actor: --actor_timeout between rollouts, but a longer grace for
its first one (its start is slow on a loaded machine, and no hang); and no clock while the
learner holds every slot of the actor (back-pressure from a slow learner, not a hang)."""
import time

from herd.backends.local import START_GRACE, ActorHandle, ActorPool


class Alive:
    exitcode = None

    def is_alive(self):
        return True

    def kill(self):
        self.killed = True

    def join(self, timeout=None):
        pass


class Slots:
    def put(self, slot):
        pass


def pool_with(delivered: bool, silent_for: float, held: int = 0) -> tuple[ActorPool, list]:
    restarted = []
    pool = ActorPool.__new__(ActorPool)
    pool.timeout, pool.max_restarts, pool.restarts, pool.slots_per_actor = 3.0, 20, 0, 2
    pool.actors = [ActorHandle(Alive(), Slots(), None, time.monotonic() - silent_for, delivered=delivered,
                                out=set(range(held)))]
    pool.close_channels = lambda actor: None
    pool.start_actor = lambda actor_id, generation: restarted.append(actor_id)
    return pool, restarted


def test_a_starting_actor_is_not_hung_before_the_grace():
    pool, restarted = pool_with(delivered=False, silent_for=10.0)
    pool.check_health()
    assert restarted == []


def test_a_starting_actor_silent_past_the_grace_is_restarted():
    pool, restarted = pool_with(delivered=False, silent_for=START_GRACE + 1)
    pool.check_health()
    assert restarted == [0]


def test_an_actor_that_delivered_is_hung_after_the_timeout():
    pool, restarted = pool_with(delivered=True, silent_for=4.0)
    pool.check_health()
    assert restarted == [0] and pool.restarts == 1


def test_an_actor_whose_every_slot_the_learner_holds_is_not_hung():
    pool, restarted = pool_with(delivered=True, silent_for=60.0, held=2)
    pool.check_health()
    assert restarted == []


def test_the_clock_starts_when_a_waiting_actor_gets_a_slot_back():
    pool, restarted = pool_with(delivered=True, silent_for=60.0, held=2)
    pool.release(0, slot=1)
    pool.check_health()
    assert restarted == [] and pool.actors[0].out == {0}
    # With a slot to fill and silent past the timeout, it is hung again.
    pool.actors[0].last_seen -= 4.0
    pool.check_health()
    assert restarted == [0]


def test_an_actor_with_a_slot_to_fill_is_hung_after_the_timeout():
    pool, restarted = pool_with(delivered=True, silent_for=4.0, held=1)
    pool.check_health()
    assert restarted == [0]
