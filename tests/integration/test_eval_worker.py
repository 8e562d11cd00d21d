"""The evaluation worker in a real run: whole games at the interval, eval.csv, a video."""
import csv
import os

from herd_testing import only_run, read_rows, run_cli


def test_a_run_evaluates_every_n_updates_and_records_a_video(tmp_path):
    result = run_cli(["train", "--env=CartPole-v1", "--environment_max_steps=40000", "--tensorboard=False",
                      "--eval_interval=60", "--eval_episodes=3", "--eval_video_every=1", "--seed=4"], tmp_path,
                     timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    run = only_run(tmp_path)
    with open(run / "eval.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows, "no evaluation in a run of 300 updates"
    updates = [int(r["update"]) for r in rows]
    # Published at updates 60, 120, ...: the worker evaluates the newest it finds when idle.
    assert all(u % 60 == 0 for u in updates) and updates == sorted(set(updates))
    assert all(int(r["episodes"]) == 3 and 1 <= float(r["min"]) <= float(r["mean"]) <= float(r["max"]) <= 500
               for r in rows)
    assert (run / "eval_videos" / f"eval_{updates[0]:08d}.mp4").stat().st_size > 1000


def cartpole_evaluator(tmp_path, model_kwargs):
    import torch.multiprocessing as mp

    from herd.eval_worker import EvalSpec, Evaluator
    from herd.models import build_model
    model = build_model(**model_kwargs)
    spec = EvalSpec("CartPole-v1", {"episodic_life": False, "clip_rewards": False}, model_kwargs, episodes=4,
                    greedy=False, video_every=0, seed=11, tensorboard=False)
    return model, Evaluator(spec, model, tmp_path, every_updates=10, every_seconds=None,
                            context=mp.get_context("spawn"))


def test_the_worker_follows_new_weights_survives_a_crash_and_stops_with_the_run(tmp_path):
    import psutil

    from herd_testing import ANGLE_ONLY, BALANCER, fixed_policy_state, wait_for
    model_kwargs = dict(network="mlp", obs_shape=(4,), obs_dtype="float32", num_actions=2, feature_size=64)
    model, evaluator = cartpole_evaluator(tmp_path, model_kwargs)
    rows = lambda: read_rows(tmp_path / "eval.csv")  # noqa: E731
    try:
        model.load_state_dict(fixed_policy_state(model.state_dict(), BALANCER))
        evaluator.on_update(model, 10, env_steps=1000)
        assert wait_for(lambda: len(rows()) == 1, 60)
        model.load_state_dict(fixed_policy_state(model.state_dict(), ANGLE_ONLY))
        evaluator.on_update(model, 15, env_steps=1500)             # not due: nothing published
        evaluator.on_update(model, 20, env_steps=2000)
        assert wait_for(lambda: len(rows()) == 2, 60)
        first, second = rows()
        assert (first["update"], first["env_step"], float(first["mean"])) == ("10", "1000", 500.0)
        assert (second["update"], second["env_step"]) == ("20", "2000") and float(second["mean"]) < 60
        # A crash (kill -9: what a segfaulting emulator does to the process): the next due
        # evaluation restarts the worker, counted, and evaluations go on.
        dead = evaluator.process
        dead.kill()
        dead.join(5)
        model.load_state_dict(fixed_policy_state(model.state_dict(), BALANCER))
        evaluator.on_update(model, 30, env_steps=3000)
        assert evaluator.restarts == 1 and evaluator.process.pid != dead.pid
        assert wait_for(lambda: len(rows()) == 3, 60) and float(rows()[2]["mean"]) == 500.0
        worker = psutil.Process(evaluator.process.pid)
    finally:
        evaluator.close()
    assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE


def test_a_finished_run_waits_for_its_last_due_evaluation_and_a_stopped_one_does_not(tmp_path):
    # On a busy machine the low-priority worker may get no core until training ends: a run
    # that finishes still reports the evaluation it asked for; a stopped run ends at once.
    model_kwargs = dict(network="mlp", obs_shape=(4,), obs_dtype="float32", num_actions=2, feature_size=64)
    for finished, folder in ((True, tmp_path / "finished"), (False, tmp_path / "stopped")):
        folder.mkdir()
        model, evaluator = cartpole_evaluator(folder, model_kwargs)
        evaluator.on_update(model, 10, env_steps=1000)     # published before the worker is up
        evaluator.close(finished=finished)
        assert not evaluator.process.is_alive()
        rows = read_rows(folder / "eval.csv") if (folder / "eval.csv").exists() else []
        assert [r["update"] for r in rows] == (["10"] if finished else [])


def report_scheduler(queue):
    from herd.eval_worker import yield_to_training
    yield_to_training()
    queue.put((os.sched_getscheduler(0), os.nice(0)))


def test_the_worker_runs_only_on_time_training_leaves():
    # SCHED_IDLE where Linux offers it (an actor or learner that wakes takes the core back
    # at once), else the lowest nice value; never the plain priority training has.
    import multiprocessing
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=report_scheduler, args=(queue,))
    process.start()
    policy, niceness = queue.get(timeout=60)
    process.join(10)
    assert policy == os.SCHED_IDLE or niceness == 19
