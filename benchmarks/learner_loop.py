"""The learner process's loop alone: what the host spends per update and per trajectory
when the gradient step costs nothing.

The loop is the local backend's own (herd/backends/local.py, train_local) over a session
built the way a Pong run builds it (herd/plan.py prepare, herd/training.py build_session:
the queue replay, the mixer, the batch source with its preparing thread, the metric sums,
train.csv) with the real TrajectorySlots in shared memory, the real pipes and FreeSlots
queues of ActorPool, SharedWeights and the WeightPublisher. Two things are not real:

    the actors     InProcessActors below owns the pipes and queues but no process: when
                   the loop receives, it sends one Rollout message per slot released
                   since, for slots filled once with Pong-shaped data (84x84x4 uint8
                   frames, r_f_steps 20, 8 envs per rollout). Its CPU time is measured and
                   taken out of the learner's.
    the step       StubStep: the learner's step runs once for real (the first batch), and
                   from then on returns that update's metrics without computing anything.

Host time is the CPU time of the whole learner process (every thread: the loop, the
batch-preparing thread, the queues' feeder threads, torch's intra-op threads) between the
warm-up's last update and the run's last one, less the in-process actors'. Each update
trains on one batch of B trajectories, so per update the loop also ingests B; two batch
sizes separate the two costs: host ms per update = a + b * B gives `a`, the cost of one
update apart from its data, and `b`, the cost of one trajectory. Goals: a <= 0.5 ms,
b <= 0.1 ms. Checkpoints are left out (their period is set beyond the run).

With --before REV the same command first runs REV's own copy of this benchmark against
REV's herd (a temporary git worktree), so that before and after are measured in one
command, one after the other on the same machine.

Usage: python benchmarks/learner_loop.py [--updates 400] [--batches 8 32] [--caching both] [--before REV]
Records benchmarks/results/learner_loop.json; its last lines:
    learner_loop: per_update_ms=<a> per_trajectory_ms=<b> (caching=True)
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from common import print_table, record

import herd.backends.local as local
from herd.actors.actor import Rollout
from herd.plan import prepare
from herd.trajectory import FreeSlots
from herd.training import actor_spec, build_session

GOAL_PER_UPDATE_MS = 0.5
GOAL_PER_TRAJECTORY_MS = 0.1
WARMUP_UPDATES = 20
ACTORS = 16               # the GPU machine: a select over 16 pipes
SLOTS_PER_ACTOR = 2


def pong_options(batch_size: int, caching: bool, updates: int) -> dict:
    """A Pong run on this CPU as the command line makes it, with the step's configuration
    fixed (nothing timed at start-up: the step is stubbed) and a step budget of `updates`
    batches."""
    envs, unroll = 8, 20
    return {"env": "PongNoFrameskip-v4", "seed": 1, "tensorboard": False, "basic_verbose": False,
            "learner_precision": "fp32", "learner_layout": "nchw", "learner_compile": False,
            "batch_size": batch_size, "envs_per_worker": envs, "r_f_steps": unroll, "caching": caching,
            "worker_count": ACTORS, "shared_queue_size": SLOTS_PER_ACTOR,
            "environment_max_steps": updates * batch_size * unroll, "save_model_period": 10**9}


def fill_like_pong(slots, actions: int, seed: int = 0) -> None:
    """Every slot holds a plausible rollout: random frames, actions, rewards, no episode end."""
    rng = np.random.default_rng(seed)
    for name, tensor in slots.tensors.items():
        array = tensor.numpy()
        if name == "obs":
            array[:] = rng.integers(0, 256, array.shape, dtype=np.uint8)
        elif name == "action":
            array[:] = rng.integers(0, actions, array.shape)
        elif name == "done":
            array[:] = False
        elif name == "trunc_value":
            array[:] = 0
        else:
            array[:] = rng.standard_normal(array.shape).astype(array.dtype)


class InProcessActors(local.ActorPool):
    """ActorPool's pipes and FreeSlots with no actor processes behind them: a slot
    released to an actor is "filled" at once (its data stays) and delivered on the next
    receive. actor_cpu: CPU seconds this process spent in the actors' part."""

    actions = 6

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.senders: dict[int, object] = {}
        self.released = [0] * self.count          # slots in an actor's FreeSlots, not yet taken
        self.actor_cpu = 0.0
        fill_like_pong(self.slots, self.actions)

    def start_actor(self, actor_id: int, generation: int) -> None:
        free = FreeSlots(self.context)
        for slot in self.owned_slots(actor_id):
            free.put(slot)
        receiver, sender = self.context.Pipe(duplex=False)
        self.senders[actor_id] = sender
        self.released[actor_id] = self.slots_per_actor
        self.actors[actor_id] = local.ActorHandle(None, free, receiver, time.monotonic())

    def deliver(self) -> None:
        """What the actors would do: take each released slot and send its Rollout."""
        start = time.thread_time()
        steps = self.spec.unroll_length * self.spec.envs_per_worker
        for actor_id, actor in enumerate(self.actors):
            while self.released[actor_id]:
                slot = actor.free.get(timeout=5.0)
                self.released[actor_id] -= 1
                self.senders[actor_id].send(Rollout(slot, actor_id, self.weights.version, steps, []))
        self.actor_cpu += time.thread_time() - start

    def receive(self, timeout: float) -> list:
        self.deliver()
        return super().receive(timeout)

    def release(self, actor_id: int, slot: int) -> None:
        super().release(actor_id, slot)
        self.released[actor_id] += 1

    def check_health(self) -> None:
        pass

    def stop(self, timeout: float = 5.0) -> None:
        self.stop_event.set()
        for actor_id, actor in enumerate(self.actors):
            self.senders[actor_id].close()
            self.close_channels(actor)


class StubStep:
    """The learner's step as the loop sees it, without its compute: the first call is a
    real update (what it returns is what every later call returns). Marks the process's
    CPU time, the actors' and the session's counters at the warm-up's end and at every
    later update."""

    def __init__(self, session, pool_of):
        self.session, self.pool_of = session, pool_of
        self.real = session.learner.step
        self.result = None      # the real update's StepResult
        self.calls = 0
        self.marks: list[tuple] = []

    def mark(self) -> tuple:
        pool = self.pool_of()
        return (time.process_time(), pool.actor_cpu, time.perf_counter(), self.calls, self.session.counters.rollouts)

    def __call__(self, batch: dict):
        self.calls += 1
        if self.result is None:
            self.result = self.real(batch)
        if self.calls >= WARMUP_UPDATES:
            self.marks[min(len(self.marks), 1):] = [self.mark()]      # [the warm-up's end, the latest]
        return self.result


def run(batch_size: int, caching: bool, updates: int) -> dict:
    plan = prepare(pong_options(batch_size, caching, updates + WARMUP_UPDATES))
    pools: list[InProcessActors] = []

    class Pool(InProcessActors):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            pools.append(self)

    with tempfile.TemporaryDirectory() as folder:
        session = build_session(plan, Path(folder))
        stub = StubStep(session, lambda: pools[0])
        session.learner.step = stub
        real_pool, local.ActorPool = local.ActorPool, Pool
        try:
            ended = local.train_local(session, actor_spec(plan), ACTORS, SLOTS_PER_ACTOR,
                                      threading.Event(), max_restarts=0)
        finally:
            local.ActorPool = real_pool
            session.batches.close()
            if session.metrics is not None:
                session.metrics.close()
    assert ended == "finished", ended
    (cpu0, actor0, wall0, calls0, rollouts0), (cpu1, actor1, wall1, calls1, rollouts1) = stub.marks
    done = calls1 - calls0
    trajectories = (rollouts1 - rollouts0) * plan.cfg.parallel.envs_per_worker
    host_ms = ((cpu1 - cpu0) - (actor1 - actor0)) * 1000
    return {"batch_size": batch_size, "caching": caching, "updates": done, "trajectories": trajectories,
            "host_ms_per_update": round(host_ms / done, 3), "host_ms_per_trajectory": round(host_ms / trajectories, 4),
            "wall_ms_per_update": round((wall1 - wall0) * 1000 / done, 3),
            "actor_ms_per_update_taken_out": round((actor1 - actor0) * 1000 / done, 3),
            "publishes": session.publishes}


def fit(rows: list[dict]) -> tuple[float, float]:
    """Host ms per update = a + b * batch_size, least squares: (a, b)."""
    sizes = np.array([r["batch_size"] for r in rows], dtype=float)
    times = np.array([r["host_ms_per_update"] for r in rows])
    b, a = np.polyfit(sizes, times, 1)
    return float(a), float(b)


REPOSITORY = Path(__file__).resolve().parent.parent
FIT_LINE = re.compile(r"learner_loop: per_update_ms=(\S+) per_trajectory_ms=(\S+) \(caching=(\w+)\)")


def run_revision(revision: str, argv: list[str]) -> dict[str, dict]:
    """REV's benchmarks/learner_loop.py with `argv`, against REV's herd: caching -> its fit."""
    with tempfile.TemporaryDirectory() as folder:
        tree = Path(folder) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), revision], cwd=REPOSITORY, check=True,
                       capture_output=True)
        try:
            done = subprocess.run([sys.executable, "benchmarks/learner_loop.py", *argv], cwd=tree, text=True,
                                  env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPOSITORY, capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"the benchmark at {revision} failed: {done.stderr.strip().splitlines()[-1:]}")
    return {caching: {"per_update_ms": float(a), "per_trajectory_ms": float(b)}
            for a, b, caching in FIT_LINE.findall(done.stdout)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--updates", type=int, default=400, help="timed updates per configuration")
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--caching", choices=("on", "off", "both"), default="both",
                        help="the batch source: prepared ahead in a thread (Pong's default) or not")
    parser.add_argument("--before", help="a git revision whose own copy of this benchmark runs first")
    args = parser.parse_args()
    argv = ["--updates", str(args.updates), "--batches", *map(str, args.batches), "--caching", args.caching]
    before = run_revision(args.before, argv) if args.before else {}
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.caching]
    results, rows, fits = [], [], {}
    for caching in modes:
        measured = [run(batch, caching, args.updates) for batch in args.batches]
        results += measured
        for r in measured:
            rows.append([f"caching={caching}", r["batch_size"], r["updates"], r["host_ms_per_update"],
                         r["host_ms_per_trajectory"], r["wall_ms_per_update"], r["actor_ms_per_update_taken_out"]])
        if len(args.batches) > 1:
            a, b = fit(measured)
            fits[str(caching)] = {"per_update_ms": round(a, 3), "per_trajectory_ms": round(b, 4)}
            rows.append([f"caching={caching}", "fit a + b*B", "", f"a={a:.3f} (goal {GOAL_PER_UPDATE_MS})",
                         f"b={b:.4f} (goal {GOAL_PER_TRAJECTORY_MS})", "", ""])
    print_table(["batch source", "B", "updates", "host ms/update", "host ms/trajectory", "wall ms/update",
                 "actors' ms taken out"], rows)
    if before:
        print_table(["batch source", f"ms/update before ({args.before})", "after", "ms/trajectory before", "after"],
                    [[f"caching={c}", f["per_update_ms"], fits.get(c, {}).get("per_update_ms"),
                      f["per_trajectory_ms"], fits.get(c, {}).get("per_trajectory_ms")] for c, f in before.items()])
    record("learner_loop", {"command": "python benchmarks/learner_loop.py " + " ".join(argv)
                                       + (f" --before {args.before}" if args.before else ""),
                            "before": {"revision": args.before, "fits": before} if args.before else None,
                            "goals": {"per_update_ms": GOAL_PER_UPDATE_MS,
                                      "per_trajectory_ms": GOAL_PER_TRAJECTORY_MS},
                            "actors": ACTORS, "slots_per_actor": SLOTS_PER_ACTOR, "warmup_updates": WARMUP_UPDATES,
                            "results": results, "fits": fits})
    for caching, f in fits.items():
        print(f"learner_loop: per_update_ms={f['per_update_ms']} per_trajectory_ms={f['per_trajectory_ms']} "
              f"(caching={caching})")


if __name__ == "__main__":
    main()
