"""What herd's actor side costs beside the emulators: actors (and inference servers) with
a constant policy, against the env-only ceiling, in one command.

1. Ceiling: `workers` processes, each stepping `envs` environments with random actions
   and nothing else, with the env backend the actors use (throughput.py's ceiling).
2. Pipeline: herd's own ActorPool of `workers` actor processes, each with `envs`
   environments and its trajectory slots in shared memory, acting with network
   `constant` (herd/models/constant.py: one policy for every observation, no network to
   compute) either in each actor (`local`) or through batched inference servers on the
   CPU (`server`: the channels, doorbells, batching and sampling of herd/inference/;
   `server_db`: the same with double buffering, herd/actors/double_buffer.py;
   `server_records`: the servers write the observations and their outputs into the
   slots, the actors only rewards and dones, herd/inference/records.py; `server_spin`:
   requests and answers polled instead of slept on, --inference_doorbell=spin), or
   (`threaded`) all the games in one actor process stepped by `workers` emulator threads
   of ale_vector, asynchronously, the policy in that process (EnvPool's shape), or
   (`threaded_server`) that one process served by an inference server, or running the
   server's batched path itself (`threaded_in_actor`: Sebulba's shape, the policy where a
   GPU would hold it); `in_actor`: every actor runs that path itself
   (--actor_inference=in_actor, herd/inference/in_actor.py). The
   learner's side is reduced to what an actor needs of it: each rollout's slot goes back
   at once (nothing is stored or trained).

So the ratio pipeline / ceiling is what herd's acting, rollout writing and hand-off cost
per frame (goal: at least 0.9). Frames are agent steps x 4 (Atari's frame skip); the first
`warmup` seconds of each pipeline run are not counted. The ceiling of a 2-core VM moves by
a quarter from one minute to the next, so the measurement runs in `rounds`, each a ceiling
and then every mode for seconds / rounds, and the ratio reported is the median of the
rounds' own ratios. Beside it, where the machine's cores went over each mode's measured
seconds (psutil: the actor processes, the server processes, this process, idle) and the
servers' CPU per request: what a server mode loses to the server's work and what to its
wake-ups (cores left idle while every process waits on another).
Usage: python benchmarks/pipeline.py [--env PongNoFrameskip-v4] [--workers 2] [--envs 8] [--seconds 30]
       [--rounds 3] [--modes local,server,server_db,server_records,server_spin,threaded,threaded_server,
       in_actor,threaded_in_actor]
Records benchmarks/results/pipeline_<env>_<workers>x<envs>.json; its last line:
    pipeline: ceiling_fps=<n> <mode>_fps=<n> <mode>_ratio=<r> ...
"""
from __future__ import annotations

import argparse
import statistics
import time

import psutil

from common import print_table, record
from throughput import ceiling

from herd.backends.local import ActorPool, in_actor_inference, start_inference_servers, step_records
from herd.backends.start import actor_context
from herd.models import build_model
from herd.plan import prepare
from herd.training import actor_spec, inference_setup
from herd.store import TrajectorySlots
from herd.weights import SharedWeights

GOAL = 0.9
CORE_USES = ("actors", "servers", "main", "idle", "server_us_per_request")   # cores_used()'s fields
FRAME_SKIP = 4
SLOTS_PER_ACTOR = 2
MODES = {"local": "actors, policy in each", "server": "actors + {servers} inference server(s)",
         "server_db": "double-buffered actors + {servers} server(s)",
         "server_records": "actors + {servers} server(s) recording the steps",
         "server_spin": "actors + {servers} server(s), requests and answers polled",
         "threaded": "1 actor, all games, {workers} emulator threads",
         "threaded_server": "1 actor, all games, {workers} emulator threads + {servers} server(s)",
         "in_actor": "actors, each running the server's path",
         "threaded_in_actor": "1 actor, all games, {workers} emulator threads, the server's path in it"}


def cpu_use(registry: dict, servers) -> dict:
    """CPU seconds so far: the actor processes' and the inference servers' (every thread
    of each: the emulator threads too), this process's (the learner's stand-in), the
    machine's idle time; the requests the servers answered."""
    use = {"time": time.monotonic(), "actors": 0.0, "servers": 0.0, "main": sum(psutil.Process().cpu_times()[:2]),
           "idle": psutil.cpu_times().idle,
           "requests": 0 if servers is None else sum(t["requests"] for t in servers.tallies())}
    for name, pid in registry.items():
        try:
            use["servers" if name.startswith("inference") else "actors"] += sum(psutil.Process(pid).cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return use


def cores_used(start: dict, end: dict) -> dict:
    """Where the machine's cores went between two cpu_use() readings: cores of actors,
    servers, this process and idle; the servers' CPU microseconds per request."""
    seconds = end["time"] - start["time"]
    cores = {name: round((end[name] - start[name]) / seconds, 3) for name in ("actors", "servers", "main", "idle")}
    requests = end["requests"] - start["requests"]
    cores["server_us_per_request"] = round((end["servers"] - start["servers"]) / requests * 1e6, 1) if requests else None
    return cores


def pipeline_rate(env: str, workers: int, envs: int, seconds: float, warmup: float, mode: str) -> dict:
    """Agent steps per second of `workers` actors with the constant policy, after `warmup` s."""
    in_actor = mode.endswith("in_actor")
    served = mode.startswith("server") or mode == "threaded_server" or in_actor
    options = {"env": env, "network": "constant", "normalize_observations": False, "worker_count": workers,
               "envs_per_worker": envs, "device": "cpu", "tensorboard": False,
               "actor_inference": ("in_actor" if in_actor else "server") if served else "local",
               "actor_double_buffer": mode == "server_db",
               "inference_records": "on" if mode == "server_records" else "off",
               "inference_doorbell": "spin" if mode == "server_spin" else "semaphore"}
    if mode.startswith("threaded"):
        # The EnvPool / Sebulba shape: one process steps every game on `workers` emulator
        # threads, asynchronously (half the games step while the policy acts on the others).
        options.update(worker_count=1, envs_per_worker=workers * envs, env_threads=workers,
                       env_batch_size=workers * envs // 2)
        workers, envs = 1, workers * envs
    plan = prepare(options)
    spec = actor_spec(plan)
    context = actor_context()
    slots = TrajectorySlots(plan.layout, workers * SLOTS_PER_ACTOR, envs)
    model = build_model(**plan.model_kwargs)
    weights = SharedWeights(model, context)
    weights.publish(model, version=0)
    stop = context.Event()
    servers = acting = None
    registry: dict = {}                     # process name -> pid, of the actors and servers
    if served:
        setup = inference_setup(plan.cfg, "cpu", workers)
        records = step_records(slots, "cpu") if setup.records else None
        if in_actor:
            acting = in_actor_inference(spec, weights, "cpu", setup, records)
        else:
            servers = acting = start_inference_servers(spec, workers, weights, "cpu", stop, context, setup,
                                                       max_restarts=0, registry=registry, records=records)
    pool = ActorPool(spec, workers, slots, SLOTS_PER_ACTOR, weights, context, timeout=120.0, max_restarts=0,
                     inference=acting, stop_event=stop, registry=registry)
    pool.start()
    steps, first, deadline, measured = 0, None, None, None
    try:
        while deadline is None or time.monotonic() < deadline:
            for rollout in pool.receive(0.5):
                pool.release(rollout.actor_id, rollout.slot)
                if first is None:           # the first rollout: every actor has started by about now
                    first = time.monotonic()
                    deadline = first + warmup + seconds
                elif time.monotonic() >= first + warmup:
                    if measured is None:
                        measured = cpu_use(registry, servers)
                    steps += rollout.steps
            pool.check_health()
        if measured is None:
            raise SystemExit(f"{mode}: no rollout came after the {warmup:g} s warm-up: measure longer (--seconds)")
        cores = cores_used(measured, cpu_use(registry, servers))
    finally:
        pool.stop()
        if servers is not None:
            servers.stop()
    return {"mode": mode, "agent_steps": steps, "steps_per_s": steps / seconds,
            "servers": 0 if servers is None else servers.count, "cores": cores}


def median_of(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", default="PongNoFrameskip-v4")
    parser.add_argument("--label", default=None, help="names the results file (default pipeline_<game>_<workers>x<envs>)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0,
                        help="measured seconds of each mode, all rounds together")
    parser.add_argument("--rounds", type=int, default=3, help="ceiling-then-modes rounds; the median ratio is reported")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds after the first rollout not measured")
    parser.add_argument("--modes", default="local,server", help="comma-separated: local (the policy in each actor), "
                                                                 "server (batched inference servers on the CPU), "
                                                                 "server_db (the same, double-buffered actors), "
                                                                 "server_records (servers that record the steps), "
                                                                 "server_spin (requests and answers polled), "
                                                                 "threaded (one actor process, --workers threads), "
                                                                 "threaded_server (the same, served), in_actor "
                                                                 "(each actor runs the server's path), "
                                                                 "threaded_in_actor (threaded, the path in it)")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        raise SystemExit(f"unknown mode(s) {', '.join(sorted(unknown))}: use {', '.join(MODES)}")
    backend = actor_spec(prepare({"env": args.env, "worker_count": args.workers, "envs_per_worker": args.envs,
                                  "device": "cpu", "tensorboard": False})).env_backend
    if args.rounds < 1:
        raise SystemExit("--rounds must be >= 1")
    each = args.seconds / args.rounds
    rounds = []
    for _ in range(args.rounds):
        top = ceiling(backend, args.env, args.workers, args.envs, each)
        rounds.append({"ceiling_steps_per_s": round(top, 1),
                       "runs": [pipeline_rate(args.env, args.workers, args.envs, each, args.warmup, mode)
                                for mode in modes]})
        for run in rounds[-1]["runs"]:
            run["ratio"] = round(run["steps_per_s"] / top, 3)
    runs = []
    for i, mode in enumerate(modes):
        of_mode = [r["runs"][i] for r in rounds]
        runs.append({"mode": mode, "servers": of_mode[0]["servers"],
                     "steps_per_s": statistics.median(r["steps_per_s"] for r in of_mode),
                     "ratio": statistics.median(r["ratio"] for r in of_mode),
                     "ratios": [r["ratio"] for r in of_mode],
                     "cores": {name: median_of(r["cores"][name] for r in of_mode) for name in CORE_USES}})
    top = statistics.median(r["ceiling_steps_per_s"] for r in rounds)
    rows = [["env only (ceiling)", backend, f"{top * FRAME_SKIP:,.0f}", "1.00", "", "", ""]]
    for run in runs:
        label = MODES[run["mode"]].format(servers=run["servers"], workers=args.workers)
        cores = run["cores"]
        rows.append([label, backend, f"{run['steps_per_s'] * FRAME_SKIP:,.0f}", f"{run['ratio']:.2f} (goal {GOAL})",
                     " ".join(f"{r:.2f}" for r in run["ratios"]),
                     " / ".join(f"{cores[name]:.2f}" for name in CORE_USES[:4]),
                     "" if cores["server_us_per_request"] is None else f"{cores['server_us_per_request']:.0f}"])
    print(f"median of {args.rounds} rounds of a ceiling and then each mode, {each:.0f} s each; cores: of "
          f"{psutil.cpu_count()}, the actors' processes (their emulator threads included), the servers', this "
          f"process's (the learner's stand-in), idle")
    print_table(["what runs", "env backend", "frames/s", "share of the ceiling", "each round",
                 "cores: actors / servers / main / idle", "server CPU us per request"], rows)
    name = args.label or f"pipeline_{args.env.split('NoFrameskip')[0].split('-')[0]}_{args.workers}x{args.envs}"
    record(name, {"command": f"python benchmarks/pipeline.py --env {args.env} --workers {args.workers} --envs "
                             f"{args.envs} --seconds {args.seconds} --rounds {args.rounds} --warmup {args.warmup} "
                             f"--modes {args.modes}" + (f" --label {args.label}" if args.label else ""),
                  "env_backend": backend, "frame_skip": FRAME_SKIP, "goal": GOAL,
                  "ceiling_steps_per_s": round(top, 1), "runs": runs, "rounds": rounds})
    print("pipeline: ceiling_fps=%d %s" % (top * FRAME_SKIP, " ".join(
        f"{r['mode']}_fps={r['steps_per_s'] * FRAME_SKIP:.0f} {r['mode']}_ratio={r['ratio']}" for r in runs)))


if __name__ == "__main__":
    main()
