"""Fixtures several integration modules share."""
import os
import signal

import psutil
import pytest

from herd_testing import (RAY_WORKER_CPUS, SMALL_RUN, actor_pids, killed_at_exit, log_text, loopback_ray_cluster,
                          newest_update, only_run, run_cli, sigint_blocked_in, start_cli, wait_for)

RAY_MODULES = ("test_apex_ray.py", "test_ray_backend.py")   # the users of ray_cluster


def pytest_collection_modifyitems(config, items):
    """The modules on the shared Ray cluster run last and together: the cluster, started by
    the first of them, then idles beside no other test (a session fixture lives until the
    session ends)."""
    items.sort(key=lambda item: item.path.name in RAY_MODULES)       # stable: the order within stays


@pytest.fixture(scope="session")
def ray_cluster():
    """One loopback Ray cluster for the integration modules that need one: a head with 0
    CPUs (no actor fits there) + two worker nodes of RAY_WORKER_CPUS each, all on 127.0.0.1,
    with a token the herd processes inherit. Fast node-death detection (0.5 s health
    checks), so a removed node is noticed within seconds, not Ray's default ~30 s. A test
    that removes a node adds one back before it ends."""
    with loopback_ray_cluster(RAY_WORKER_CPUS, _system_config={
            "health_check_period_ms": 500, "health_check_timeout_ms": 500, "health_check_failure_threshold": 3}) as made:
        yield made


@pytest.fixture(scope="session")
def small_cartpole_run(tmp_path_factory):
    """A few seconds of CartPole training (one actor, 2,048 steps, seed 1): a real run
    folder with a checkpoint, config and metric files, not a good player. Read-only: a
    test that changes it works on a copy (herd_testing.copy_of_run)."""
    results = tmp_path_factory.mktemp("small_cartpole")
    result = run_cli(["train", "--env=CartPole-v1", "--environment_max_steps=2000", "--worker_count=1", "--seed=1",
                      "--tensorboard=False"], results)
    assert result.returncode == 0, result.stderr[-2000:]
    return only_run(results)


@pytest.fixture(scope="session")
def stopped_run(tmp_path_factory):
    """One run that meets what a long run meets, each step waited for in the run's own
    files: it trains (a first checkpoint), one actor is killed (kill -9) and replaced, the
    other hangs (SIGSTOP: alive, delivering nothing) and is replaced after --actor_timeout
    (15 s: a healthy actor starved of CPU on a loaded machine must not pass for hung; with
    the least allowed, 2 s, one did and failed six tests), training goes on with both replacements (a newer
    checkpoint), then Ctrl+C. Tests of the lifecycle, of start-up signals and of resuming
    with several learners each check their part of it."""
    results = tmp_path_factory.mktemp("lifecycle") / "first"
    process = start_cli(["train", *SMALL_RUN, "--environment_max_steps=100000000", "--verbose_learner_out_int=1",
                         "--save_model_period=50", "--actor_timeout=15"], results)
    with killed_at_exit(process):
        assert wait_for(lambda: len(actor_pids(process)) >= 2, 60)
        killed, hung = sorted(actor_pids(process))
        blocked = {"first actors": all(sigint_blocked_in(pid) for pid in (killed, hung))}
        assert wait_for(lambda: newest_update(results) > 0, 60), "no checkpoint: the run does not train"
        # Read once they have delivered (a checkpoint): inside run_actor, past start-up.
        schedulers = {"first actors": [os.sched_getscheduler(pid) for pid in (killed, hung)]}
        psutil.Process(killed).kill()
        assert wait_for(lambda: "died" in log_text(results), 20)
        assert wait_for(lambda: actor_pids(process) - {killed, hung}, 20), "the killed actor was not replaced"
        replacement = (actor_pids(process) - {killed, hung}).pop()
        blocked["replacement"] = sigint_blocked_in(replacement)
        psutil.Process(hung).suspend()
        assert wait_for(lambda: "delivered nothing" in log_text(results), 60), "the stopped actor was not called hung"
        assert wait_for(lambda: hung not in actor_pids(process), 20), "the hung actor was kept"
        updates_after_both = newest_update(results)
        assert wait_for(lambda: newest_update(results) > updates_after_both, 30), "no training after the replacements"
        schedulers["replacement"] = [os.sched_getscheduler(replacement)]
        children = psutil.Process(process.pid).children(recursive=True)
        os.killpg(process.pid, signal.SIGINT)          # Ctrl+C in a terminal signals the whole group
        _, err = process.communicate(timeout=20)
    return {"run": only_run(results), "returncode": process.returncode, "stderr": err, "children": children,
            "killed": killed, "hung": hung, "replacement": replacement, "updates_after_both": updates_after_both,
            "sigint_blocked": blocked, "schedulers": schedulers}
