"""--synchronous_sampling (herd/backends/local.py): an actor's slot comes back only after
the learner trained on its rollout and published the weights of that update, so every
rollout is acted by the weights the learner has when it trains on it: a policy lag of 0,
where the same run with slots to spare lags. A killed actor is replaced as usual and the
slots held for it are not handed to its successor twice."""
from __future__ import annotations

import json
import os
import queue
import signal

import pytest

from herd.errors import ConfigError
from herd.plan import prepare
from herd_testing import actor_pids, only_run, run_cli, start_cli, wait_for

SYNC_RUN = ["train", "--env=CartPole-v1", "--worker_count=2", "--envs_per_worker=4", "--batch_size=8", "--seed=1",
            "--caching=True", "--tensorboard=False", "--basic_verbose=False"]


def summary_of(results) -> dict:
    return json.loads((only_run(results) / "summary.json").read_text())


@pytest.mark.parametrize("algorithm", ["impala", "appo"])
def test_every_rollout_is_trained_by_the_weights_that_acted(tmp_path, algorithm):
    """Catches slots given back before the update (the lag of the run beside it) and an
    actor that acts its first step of a rollout with the weights from before the update
    (a lag of 1 on every batch)."""
    lags = {}
    for mode, extra in (("synchronous", ["--synchronous_sampling"]), ("slots to spare", ["--shared_queue_size=4"])):
        results = tmp_path / mode.replace(" ", "_")
        result = run_cli([*SYNC_RUN, f"--algorithm={algorithm}", "--environment_max_steps=12000", *extra], results)
        assert result.returncode == 0, result.stderr[-2000:]
        summary = summary_of(results)
        assert summary["ended"] == "finished" and summary["training_steps"] > 0, summary
        lags[mode] = (summary["policy_lag_mean"], summary["policy_lag_max"])
    assert lags["synchronous"] == (0.0, 0.0), lags
    assert lags["slots to spare"][1] >= 2, lags                     # the control: without it, rollouts wait


def test_double_buffered_actors_served_by_a_server_sample_synchronously(tmp_path):
    """A GPU's Atari default on the CPU: APPO, one slot per actor, actors served by a server
    and double-buffered (their halves end each rollout together, herd/actors/double_buffer.py).
    Catches a half that asks for a second slot (the run would wait for ever: the timeout)
    and a server acting on a rollout's first step with the weights from before the update."""
    result = run_cli([*SYNC_RUN, "--algorithm=appo", "--environment_max_steps=12000", "--synchronous_sampling",
                      "--actor_inference=server", "--device=cpu", "--actor_double_buffer=True"], tmp_path, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "double-buffered actors" in result.stderr
    summary = summary_of(tmp_path)
    assert summary["ended"] == "finished" and summary["environment_steps"] >= 12000, summary
    assert (summary["policy_lag_mean"], summary["policy_lag_max"]) == (0.0, 0.0), summary
    config = json.loads((only_run(tmp_path) / "config.json").read_text())
    assert (config["shared_queue_size"], config["actor_double_buffer"]) == (1, True)


def test_a_killed_actor_is_replaced_while_the_learner_holds_its_slot(tmp_path):
    """kill -9 of an actor in a synchronous run: it is restarted, the run finishes with lag 0
    and no slot is handed out twice (two actors writing one slot would corrupt rollouts,
    and the learner would wait for ever on a slot nobody owns)."""
    results = tmp_path / "results"
    process = start_cli([*SYNC_RUN, "--synchronous_sampling", "--environment_max_steps=60000",
                         "--actor_timeout=20"], results)
    try:
        assert wait_for(lambda: len(actor_pids(process)) >= 2, 120), process.stderr.read() if process.poll() else ""
        assert wait_for(lambda: only_run(results).joinpath("train.csv").exists() if results.exists()
                        and any(results.iterdir()) else False, 120)
        victim = min(actor_pids(process))
        os.kill(victim, signal.SIGKILL)
        assert process.wait(240) == 0, process.stderr.read()[-2000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    summary = summary_of(results)
    assert summary["ended"] == "finished" and summary["actor_restarts"] >= 1, summary
    assert summary["policy_lag_max"] == 0.0, summary


@pytest.mark.parametrize("options, words", [
    ({"multiprocessing_backend": "ray"}, "python_native"),
    ({"shared_queue_size": 2}, "--shared_queue_size=2"),
    ({"batch_size": 16}, "16 fresh trajectories"),
    ({"replay_parameters": '[{"type": "standard", "capacity": 100, "sample_ratio": 1}]'}, "queue replay"),
])
def test_settings_it_cannot_keep_are_refused_in_one_line(options, words):
    base = {"env": "CartPole-v1", "worker_count": 2, "envs_per_worker": 4, "batch_size": 8,
            "synchronous_sampling": True}
    with pytest.raises(ConfigError) as refused:
        prepare({**base, **options})
    assert words in str(refused.value) and "\n" not in str(refused.value)


class NoProcess:
    """An actor process that never starts: the pool's slot bookkeeping alone is tested."""
    pid = 0

    def __init__(self, **kwargs):
        pass

    def start(self):
        pass


def test_a_restart_drops_the_slots_held_for_the_actor_it_replaces():
    """The learner holds actor 0's slot (its rollout not yet trained on) when actor 0 is
    restarted, which refills its slots: the held one must not go back to the new actor a
    second time. Catches a withheld list that survives the restart (the release then
    raises: the new actor holds none of its slots)."""
    import multiprocessing

    from herd.backends.local import ActorPool
    from herd.training import actor_spec
    from herd.store import TrajectorySlots

    plan = prepare({"env": "CartPole-v1", "worker_count": 2, "envs_per_worker": 4, "batch_size": 8,
                    "synchronous_sampling": True})
    spawn = multiprocessing.get_context("spawn")
    context = type("NoStartContext", (), {"Queue": spawn.Queue, "Pipe": spawn.Pipe, "Event": spawn.Event,
                                          "Process": NoProcess})()
    pool = ActorPool(actor_spec(plan), 2, TrajectorySlots(plan.layout, 2, 4), 1, weights=None, context=context,
                     timeout=60, max_restarts=5)
    pool.start()
    slot = pool.actors[0].free.get(timeout=10)          # actor 0 fills its slot and delivers it ...
    pool.actors[0].out.add(slot)                        # ... as receive() counts it
    pool.withhold(0, slot)
    pool.start_actor(0, generation=1)                   # restarted with its slots refilled
    assert pool.withheld == []
    pool.release_withheld()
    assert pool.actors[0].free.get(timeout=10) == slot
    with pytest.raises(queue.Empty):                    # the slot is there once
        pool.actors[0].free.get(timeout=0.5)
    with pytest.raises(RuntimeError, match="does not hold it"):
        pool.release(0, slot)


def test_a_restart_keeps_the_slots_the_queue_still_reads():
    """A slot whose rollout the queue reads in place (herd/replay/slot_queue.py: delivered,
    neither released nor withheld) stays out across its actor's restart: not refilled with
    sentinels, not handed to the new actor, which gets it when the queue frees it. Catches
    a restart that refills every slot (the new actor would write over frames in training)."""
    import multiprocessing

    import numpy as np

    from herd.backends.local import ActorPool
    from herd.store import TrajectorySlots
    from herd.training import actor_spec

    plan = prepare({"env": "CartPole-v1", "worker_count": 1, "envs_per_worker": 4, "batch_size": 8})
    spawn = multiprocessing.get_context("spawn")
    context = type("NoStartContext", (), {"Queue": spawn.Queue, "Pipe": spawn.Pipe, "Event": spawn.Event,
                                          "Process": NoProcess})()
    slots = TrajectorySlots(plan.layout, 2, 4)
    pool = ActorPool(actor_spec(plan), 1, slots, 2, weights=None, context=context, timeout=60, max_restarts=5)
    pool.start()
    read = pool.actors[0].free.get(timeout=10)          # filled and delivered; the queue reads it
    slots.views(read)["reward"][:] = 1.0
    pool.actors[0].out.add(read)
    pool.start_actor(0, generation=1)
    np.testing.assert_array_equal(slots.views(read)["reward"], 1.0)             # not refilled
    other = pool.actors[0].free.get(timeout=10)
    assert other != read
    with pytest.raises(queue.Empty):                    # only the other slot is free
        pool.actors[0].free.get(timeout=0.5)
    pool.release(0, read)                               # the queue has trained on it
    assert pool.actors[0].free.get(timeout=10) == read
