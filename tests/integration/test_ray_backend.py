"""--multiprocessing_backend=ray on a real multi-node Ray cluster started on this machine
(ray.cluster_utils.Cluster: a head and two worker nodes, loopback addresses only, token
auth). The head has no CPUs, so every actor must land on a worker node; the learner is
the herd process, a driver attached to the head. One cluster serves every test here
(starting one takes seconds); the test that removes a node runs last and puts one back."""
import json
import os
import secrets
import signal
import subprocess
import sys
import time

import psutil
import pytest
from ray.cluster_utils import Cluster

from herd_testing import ROOT, killed_at_exit, only_run, run_cli, start_cli, wait_for
from herd.backends.ray_cluster import restore_auth, use_token_auth
from herd.checkpoint import load_checkpoint

LOOPBACK = "127.0.0.1"
WORKER_CPUS = 2
# Small CartPole runs: 2 actors x 8 envs x 8 steps, batch 8.
SMALL = ["--env=CartPole-v1", "--multiprocessing_backend=ray", "--worker_count=2", "--envs_per_worker=8",
         "--r_f_steps=8", "--batch_size=8", "--seed=5", "--tensorboard=False"]


@pytest.fixture(scope="module")
def cluster():
    """Head (0 CPUs: no actor fits there) + two worker nodes of WORKER_CPUS each, all on
    127.0.0.1, with a token the herd processes inherit. Fast node-death detection (0.5 s
    health checks), so a removed node is noticed within seconds, not Ray's default ~30 s."""
    saved = {name: os.environ.get(name) for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    use_token_auth(secrets.token_hex(32))                # inherited by the herd processes
    node = dict(node_ip_address=LOOPBACK, object_store_memory=200 * 2**20)
    made = Cluster(initialize_head=True, head_node_args=dict(
        num_cpus=0, include_dashboard=False, **node,
        _system_config={"health_check_period_ms": 500, "health_check_timeout_ms": 500,
                        "health_check_failure_threshold": 3}))
    try:
        for _ in range(2):
            made.add_node(num_cpus=WORKER_CPUS, **node)
        made.wait_for_nodes()
        yield made
    finally:
        made.shutdown()
        restore_auth(saved)


def worker_ids(made: Cluster) -> set[str]:
    return {node.node_id for node in made.worker_nodes}


def rollout_workers(made: Cluster, nodes=None) -> list[psutil.Process]:
    """The herd actors on the cluster's nodes (or on `nodes`): processes under their
    raylets that Ray titled ray::RolloutWorker... (other Ray clusters are not ours to count)."""
    found = []
    for node in nodes or [made.head_node, *made.worker_nodes]:
        for info in node.all_processes.get("raylet", []):
            try:
                children = psutil.Process(info.process.pid).children(recursive=True)
            except psutil.Error:
                continue
            for child in children:
                try:
                    if "RolloutWorker" in " ".join(child.cmdline()):
                        found.append(child)
                except psutil.Error:
                    continue
    return found


def train_rows(results) -> int:
    files = list(results.glob("*/train.csv"))
    return max(0, len(files[0].read_text().splitlines()) - 1) if files else 0


def test_cartpole_learns_with_every_actor_on_the_worker_nodes(cluster, tmp_path):
    # The quick start's CartPole defaults (2 actors x 16 envs), seed 2. Pass rate, on this machine
    # shared with other jobs (load 8-25): at 200,000 steps 2 of 3 Ray runs reached a best 100-game
    # average of 200 (336, 232, one below; local processes under the same load: 243), since the
    # order in which rollouts arrive is not reproducible and lag grows with load; at 300,000
    # steps 1 of 1 (407). A failure here is worth a look, not a rerun.
    result = run_cli(["train", "--env=CartPole-v1", "--seed=2", "--environment_max_steps=300000",
                      "--multiprocessing_backend=ray", f"--ray_address={cluster.address}", "--tensorboard=False"],
                     tmp_path, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((only_run(tmp_path) / "summary.json").read_text())
    assert summary["ended"] == "finished" and summary["environment_steps"] >= 300000
    assert summary["max_average_score"] is not None and summary["max_average_score"] >= 200, summary
    # Every actor started on a worker node (the head has no CPUs), the learner on the head.
    assert summary["actor_nodes"] and set(summary["actor_nodes"]) <= worker_ids(cluster), summary["actor_nodes"]
    assert sum(summary["actor_nodes"].values()) == 2 and summary["actor_restarts"] == 0
    assert summary["learner_node"] == cluster.head_node.node_id


def test_ctrl_c_saves_and_the_run_resumes_on_either_backend(cluster, tmp_path):
    first = tmp_path / "ray"
    with killed_at_exit(start_cli(["train", *SMALL, f"--ray_address={cluster.address}",
                                   "--environment_max_steps=100000000", "--verbose_learner_out_int=2"],
                                  first)) as process:
        assert wait_for(lambda: train_rows(first) >= 3, 90)
        assert rollout_workers(cluster)
        os.killpg(process.pid, signal.SIGINT)          # Ctrl+C in a terminal signals the whole group
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err[-3000:]
    # The cluster-side work stopped with the run: its actors are gone from the worker nodes.
    assert wait_for(lambda: not rollout_workers(cluster), 20)
    run = only_run(first)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["ended"] == "stopped"
    state, _ = load_checkpoint(run)
    steps, updates = state["counters"]["env_steps"], state["counters"]["updates"]
    assert steps > 0 and updates == summary["training_steps"] > 0

    # The Ray run's checkpoint resumes on local processes ...
    local = tmp_path / "local"
    result = run_cli(["resume", str(run), "--multiprocessing_backend=python_native",
                      f"--environment_max_steps={steps + 2000}"], local, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = json.loads((only_run(local) / "summary.json").read_text())
    assert resumed["environment_steps"] >= steps + 2000 and resumed["training_steps"] > updates
    # ... and that local checkpoint resumes on Ray again, here on a private Ray of its own.
    again = tmp_path / "again"
    result = run_cli(["resume", str(only_run(local)), "--multiprocessing_backend=ray", "--ray_address=local",
                      f"--environment_max_steps={resumed['environment_steps'] + 2000}"], again, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    final = json.loads((only_run(again) / "summary.json").read_text())
    assert final["environment_steps"] >= resumed["environment_steps"] + 2000
    assert final["training_steps"] > resumed["training_steps"] and final["episodes"] > resumed["episodes"]
    assert "private cluster on 127.0.0.1" in (only_run(again) / "log.txt").read_text()


def test_a_killed_actor_and_a_lost_node_do_not_end_the_run(cluster, tmp_path):
    budget = 80_000
    with killed_at_exit(start_cli(["train", *SMALL, f"--ray_address={cluster.address}",
                                   f"--environment_max_steps={budget}", "--verbose_learner_out_int=2"],
                                  tmp_path)) as process:
        assert wait_for(lambda: train_rows(tmp_path) >= 3, 90)
        victims = rollout_workers(cluster)
        assert victims
        victims[0].kill()                               # an actor's process dies (kill -9)
        assert wait_for(lambda: "died" in next(tmp_path.glob("*/log.txt")).read_text(), 30)
        # A node that runs an actor now (the restarted actor may have joined the other one).
        assert wait_for(lambda: any(rollout_workers(cluster, [n]) for n in cluster.worker_nodes), 30)
        lost = next(n for n in cluster.worker_nodes if rollout_workers(cluster, [n]))
        cluster.remove_node(lost, allow_graceful=False)  # a whole node: its raylet and its actors
        _, err = process.communicate(timeout=180)
    cluster.add_node(num_cpus=WORKER_CPUS, node_ip_address=LOOPBACK, object_store_memory=200 * 2**20)
    assert process.returncode == 0, err[-3000:]
    run = only_run(tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["ended"] == "finished" and summary["environment_steps"] >= budget
    # The killed actor, and the actor(s) on the lost node (one, unless the first restart landed there too).
    assert summary["actor_restarts"] >= 2, summary
    assert lost.node_id in summary["actor_nodes"]


def test_without_ray_installed_the_backend_is_one_line_naming_the_install(tmp_path):
    # `import ray` fails as it does where the extra is not installed.
    code = ("import sys; sys.modules['ray'] = None; from herd.cli import main; "
            f"sys.exit(main(['train', '--env=CartPole-v1', '--multiprocessing_backend=ray', '--results_dir={tmp_path}']))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install -e '.[ray]'" in lines[0], result.stderr
    assert not any(tmp_path.iterdir())


def test_an_unreachable_address_is_one_line_within_30_s(tmp_path):
    # A routable address where nothing answers (no route, or packets dropped: a timeout).
    started = time.monotonic()
    result = run_cli(["train", "--env=CartPole-v1", "--multiprocessing_backend=ray", "--ray_address=10.255.255.1:6379"],
                     tmp_path, timeout=60)
    assert time.monotonic() - started < 30
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach a Ray head" in lines[0], result.stderr
