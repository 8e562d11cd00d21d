"""The Ray backend's pool (herd/backends/ray_pool.py) against real Ray actors on a one-node
local Ray (loopback).

- How it reads finished rollouts: once its time is spent, the rollouts it has not read
  stay queued, in the order their calls were made, for the next receive. (A receive that
  read every finished rollout first held a learner for 42 s on a 30 Mbit/s link, with 64
  rollouts queued: nothing trained, no call was made.)
- Which weights a call's rollout acts with: the newest when the call was made, or newer."""
import pytest

ray = pytest.importorskip("ray")

T, E, SLOTS = 8, 4, 3
WAIT_S = 120.0        # actors start in seconds here; reached only if they never deliver


def cartpole_pool(actors: int):
    from herd.actors.actor import ActorSpec
    from herd.algos import get_algorithm
    from herd.algos.base import trajectory_layout
    from herd.backends.ray_actors import WeightsBoard
    from herd.backends.ray_pool import RayActorPool
    from herd.models import build_model
    model_kwargs = dict(network="mlp", obs_shape=(4,), obs_dtype="float32", num_actions=2, feature_size=64,
                        use_feature_layer=False, hidden_sizes=(64, 64))
    layout = trajectory_layout(get_algorithm("impala"), T, (4,), "float32", 2, 64)
    spec = ActorSpec(env_id="CartPole-v1", env_kwargs={}, model_kwargs=model_kwargs, envs_per_worker=E,
                     unroll_length=T, seed=1)
    board = WeightsBoard()
    board.publish(build_model(**model_kwargs), 0)
    return RayActorPool(spec, layout, actors, SLOTS, actor_cpus=1, board=board, timeout=WAIT_S, max_restarts=0,
                        driver_node=ray.get_runtime_context().get_node_id(), registry={})


def test_a_receive_whose_time_is_spent_leaves_the_rest_queued_in_call_order(local_ray):
    """Catches a receive that reads every finished rollout before it returns (its learner
    then trains nothing and makes no call until the last arrays crossed the network), one
    that drops what it did not read, one that reads a later call before an earlier, and one
    that counts an actor whose rollouts wait unread as silent (the pool would restart it)."""
    pool = cartpole_pool(actors=2)
    pool.start()
    try:
        calls = list(pool.owner)                              # oldest first: actor 0's, then actor 1's
        ready, _ = ray.wait(calls, num_returns=len(calls), timeout=WAIT_S)
        assert len(ready) == 2 * SLOTS, "the actors did not finish their calls"
        seen = pool.actors[1].last_seen
        first = pool.receive(timeout=0.0)                     # no time to read: the first one only
        assert [actor_id for actor_id, _, _ in first] == [0]
        assert list(pool.owner) == calls[1:]                  # the rest still queued, in order
        # Actor 1's calls returned, unread: it is alive (not restarted after --actor_timeout
        # while its rollouts wait behind others' on a thin link)
        assert pool.actors[1].last_seen > seen
        rest = pool.receive(timeout=WAIT_S)
        assert [actor_id for actor_id, _, _ in rest] == [0] * (SLOTS - 1) + [1] * SLOTS
        for _, rollout, arrays in first + rest:
            assert rollout.steps == T * E
            assert arrays["obs"].shape[:2] == (T + 1, E)      # field -> [T(+1), E, ...], read whole
        assert not pool.owner
    finally:
        pool.stop()


def test_a_call_made_after_new_weights_acts_with_them(local_ray):
    """Catches a call whose actor may start it on older weights than the learner had when
    it made the call: the newest version went only in a second call (offer_weights, in
    its own thread), which an idle actor may see after its rollout has begun (a one-node
    run saw 16 misses in 200). Each round leaves the actor idle, publishes new weights and
    makes one call; its rollout must carry that version."""
    from herd.models import build_model
    pool = cartpole_pool(actors=1)
    pool.start()
    try:
        assert len(read(pool, SLOTS)) == SLOTS        # the calls made at start: the actor is idle now
        model = build_model(**pool.spec.model_kwargs)
        acted_with = []
        for version in range(1, 41):
            pool.board.publish(model, version)
            pool.call(0)
            [(_, rollout, _)] = read(pool, 1)
            acted_with.append(rollout.version)
        assert acted_with == list(range(1, 41))
    finally:
        pool.stop()


def read(pool, count: int) -> list:
    """The next `count` rollouts the pool receives (its calls must be queued already)."""
    rollouts = []
    while len(rollouts) < count:
        rollouts += pool.receive(timeout=WAIT_S)
    return rollouts
