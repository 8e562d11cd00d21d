"""--multiprocessing_backend=ray on a real multi-node Ray cluster started on this machine
(ray.cluster_utils.Cluster: a head and two worker nodes, loopback addresses only, token
auth). The head has no CPUs, so every actor must land on a worker node; the learner is
the herd process, a driver attached to the head. One cluster serves every test here
(starting one takes seconds); the run that loses a node puts one back."""
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from ray.cluster_utils import Cluster

from herd_testing import (RAY_WORKER_CPUS, RAY_NODE, ROOT, killed_at_exit, log_text, newest_update, only_run, run_cli,
                          start_cli, wait_for)
from herd.checkpoint import load_checkpoint

WORKER_CPUS = RAY_WORKER_CPUS
# Small CartPole runs: 2 actors x 8 envs x 8 steps, batch 8.
SMALL = ["--env=CartPole-v1", "--multiprocessing_backend=ray", "--worker_count=2", "--envs_per_worker=8",
         "--r_f_steps=8", "--batch_size=8", "--seed=5", "--tensorboard=False"]


@pytest.fixture(scope="module")
def cluster(ray_cluster):
    """The shared loopback cluster (tests/integration/conftest.py): two worker nodes of
    WORKER_CPUS each; the node-loss test puts its node back."""
    assert len(ray_cluster.worker_nodes) == 2
    return ray_cluster


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


@pytest.mark.slow
def test_cartpole_learns_with_every_actor_on_the_worker_nodes(cluster, tmp_path):
    """Slow (20 s): the same run and checks as tests/cluster/test_ray_on_hosts.py's
    test_cartpole_learns_with_every_actor_on_the_other_hosts, which runs by default over real
    links between network namespaces; this one is the loopback twin, for machines where
    namespaces cannot be made."""
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


@pytest.fixture(scope="module")
def stopped_ray_run(cluster, tmp_path_factory):
    """One Ray run that meets failures, then Ctrl+C, each step waited for in the run's own
    files: it trains (its first update logged), an actor process is killed (kill -9) and
    replaced, a whole worker node that runs an actor is removed, every lost actor is
    restarted on the node left and training goes on (a newer checkpoint), then Ctrl+C.
    The node is put back after. The two tests below each check their part of it."""
    results = tmp_path_factory.mktemp("ray") / "ray"
    with killed_at_exit(start_cli(["train", *SMALL, f"--ray_address={cluster.address}",
                                   "--environment_max_steps=100000000", "--save_model_period=20"],
                                  results)) as process:
        try:
            assert wait_for(lambda: "first update" in log_text(results), 90), "no update within 90 s"
            victims = rollout_workers(cluster)
            assert victims
            victims[0].kill()                               # an actor's process dies (kill -9)
            assert wait_for(lambda: "died" in log_text(results), 30)
            # A node that runs an actor now (the restarted actor may have joined the other one).
            assert wait_for(lambda: any(rollout_workers(cluster, [n]) for n in cluster.worker_nodes), 30)
            lost = next(n for n in cluster.worker_nodes if rollout_workers(cluster, [n]))
            cluster.remove_node(lost, allow_graceful=False)  # a whole node: its raylet and its actors

            def restarted_and_running() -> bool:
                """Two restarts or more, and each actor's latest line says where it runs."""
                lines = log_text(results).splitlines()
                latest = {}
                for line in lines:
                    for actor in ("actor 0 ", "actor 1 "):
                        if actor in line and ("restarting it" in line or " runs on node " in line):
                            latest[actor] = "runs" if " runs on node " in line else "restarting"
                restarts = sum("restarting it" in line for line in lines)
                return restarts >= 2 and latest == {"actor 0 ": "runs", "actor 1 ": "runs"}
            assert wait_for(restarted_and_running, 60), log_text(results)
            updates = newest_update(results)
            assert wait_for(lambda: newest_update(results) > updates, 60), "no training after the node was lost"
            working = rollout_workers(cluster)
            os.killpg(process.pid, signal.SIGINT)          # Ctrl+C in a terminal signals the whole group
            _, err = process.communicate(timeout=60)
            gone = wait_for(lambda: not rollout_workers(cluster), 20)
        finally:
            cluster.add_node(num_cpus=WORKER_CPUS, **RAY_NODE)
    return {"run": only_run(results), "returncode": process.returncode, "stderr": err, "working": working,
            "actors_gone": gone, "lost": lost, "updates_after_loss": updates}


# The stopped_ray_run fixture (its waits: 350 s at most) runs inside the first test that asks for it.
@pytest.mark.timeout(660)   # the fixture and its own budgets (2 x 120 s), and a margin
def test_ctrl_c_saves_and_the_run_resumes_on_either_backend(stopped_ray_run, tmp_path):
    assert stopped_ray_run["returncode"] == 0, stopped_ray_run["stderr"][-3000:]
    # The cluster-side work stopped with the run: its actors are gone from the worker nodes.
    assert stopped_ray_run["working"] and stopped_ray_run["actors_gone"]
    run = stopped_ray_run["run"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["ended"] == "stopped"
    state, _ = load_checkpoint(run)
    steps, updates = state["counters"]["env_steps"], state["counters"]["updates"]
    assert steps > 0 and updates == summary["training_steps"] > 0 and summary["episodes"] > 0

    # The Ray run's checkpoint resumes on local processes ...
    local = tmp_path / "local"
    result = run_cli(["resume", str(run), "--multiprocessing_backend=python_native",
                      f"--environment_max_steps={steps + 2000}"], local, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = json.loads((only_run(local) / "summary.json").read_text())
    assert resumed["environment_steps"] >= steps + 2000 and resumed["training_steps"] > updates
    # The counters continue, never restart (in 2,000 steps of 16 envs a policy that
    # balances may finish no game at all: the count may stay, never fall).
    assert resumed["episodes"] >= summary["episodes"]
    # ... and that local checkpoint resumes on Ray again, here on a private Ray of its own.
    again = tmp_path / "again"
    result = run_cli(["resume", str(only_run(local)), "--multiprocessing_backend=ray", "--ray_address=local",
                      f"--environment_max_steps={resumed['environment_steps'] + 2000}"], again, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    final = json.loads((only_run(again) / "summary.json").read_text())
    assert final["environment_steps"] >= resumed["environment_steps"] + 2000
    assert final["training_steps"] > resumed["training_steps"] and final["episodes"] >= resumed["episodes"]
    assert "private cluster on 127.0.0.1" in (only_run(again) / "log.txt").read_text()


@pytest.mark.timeout(420)   # the stopped_ray_run fixture's waits (350 s), and a margin
def test_a_killed_actor_and_a_lost_node_do_not_end_the_run(stopped_ray_run):
    state, _ = load_checkpoint(stopped_ray_run["run"])
    assert state["counters"]["updates"] > stopped_ray_run["updates_after_loss"]      # it trained on after both
    summary = json.loads((stopped_ray_run["run"] / "summary.json").read_text())
    # The killed actor, and the actor(s) on the lost node (one, unless the first restart landed there too).
    assert summary["actor_restarts"] >= 2, summary
    assert stopped_ray_run["lost"].node_id in summary["actor_nodes"]


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
