"""The throughput model of a herd cluster, fitted on one run of benchmarks/netns_cluster.py
and checked against the runs it was not fitted on; then its prediction for 8 to 64 nodes.

    frames/s = min(actors term,  link / bytes per step,  link x S / (nodes x W),  learner rate)

    actors term      actors x per-actor rate r for the sinks (they publish weights once); herd's
                     actors also wait for the weights once per update: S / (S / (actors x r) + W / link)
    r                agent steps/s of one actor (fitted: the 1-host unshaped run, free sink)
    bytes per step   bytes the learner's host receives on its link per agent step (fitted: the
                     same run; raw and LZ4-compressed observations each)
    link             bytes/s of the learner host's link (every link is shaped alike; the learner's
                     is the one every trajectory crosses); tbf counts what the counters count
    S, W             steps per update (batch x T: 8 x 20, herd's CPU Atari default) and the weights'
                     bytes (the Nature CNN's 1,687,719 float32): every node pulls them once per
                     update over the learner's link (not fitted: the model's structure says so)
    learner rate     the paced sink's rollouts/s x T x E (known, not fitted); herd's CPU learner
                     is never the limit here (benchmarks/learner_step.py: a batch of 8 x 20 takes
                     49-79 ms idle, 2,000-3,300 steps/s, against the 1-2 actors' 250-440)

The checks fall in three kinds, counted apart: `network` (a shaped link: the link or weights
terms, or herd's actors waiting on the link), `paced` (the sink's known rate) and `cpu` (the
actors term with 2 hosts: on this machine every host shares the same 2 cores, loaded by other
jobs, so more hosts cannot add actor CPU as real nodes do; these test the machine, not the model).

Usage: python benchmarks/netns_model.py [results/netns_cluster_Pong*_h*_bw*.json ...]
Prints the check table (measured, predicted, error) and the 8-64 node prediction; records
benchmarks/results/netns_model.json."""
from __future__ import annotations

import glob
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def predict(actors: int, per_actor: float, link_mbit: float | None, bytes_per_step: float,
            learner: float = math.inf, nodes: int = 1, weight_bytes: float = 0.0,
            steps_per_update: float = math.inf) -> tuple[float, str]:
    """(agent steps/s, the term that limits it); the module's docstring says which is which."""
    link = math.inf if link_mbit is None else link_mbit * 1e6 / 8
    acting = actors * per_actor
    if weight_bytes:        # per update each actor acts S/actors steps, then waits for the new weights
        acting = steps_per_update / (steps_per_update / acting + weight_bytes / link)
    terms = {"actors": acting, "link": link / bytes_per_step,
             "weights": link * steps_per_update / (nodes * weight_bytes) if weight_bytes else math.inf,
             "learner": learner}
    limit = min(terms, key=terms.get)
    return terms[limit], limit


# A cluster of GPU-learner Pong (the assumptions of the 8-64 node prediction, each measured):
NODE_RATE = 11_800        # agent steps/s of one 16-core node of CPU actors: the H100 machine's steady
                          # rate (benchmarks/results/pong_h100_defaults_3min/train.csv, 14 actors x 8 envs)
GPU_LEARNER_FLOOR = 11_800   # that H100 learner kept up with it: its own ceiling is higher, not measured
                             # here (no GPU): the table says what each learner must sustain
WEIGHT_BYTES = 1_687_719 * 4  # the Nature CNN's float32 weights, pulled once per node per update
STEPS_PER_UPDATE = 32 * 20    # herd's CUDA Atari defaults: batch 32 x T 20
CPU_BATCH = 8                 # herd's CPU Atari default batch (the benchmark's real learner)
CORES = 16


def cluster(nodes: int, link_gbit: float, bytes_per_step: float, learners: int = 1,
            weights: bool = True) -> tuple[float, str]:
    """What `nodes` actor nodes of CORES actors can feed `learners` learners (each on its own
    machine and link, with nodes/learners of the nodes), in agent steps/s, and the term that
    limits it; each learner must then train at that rate / learners. weights: every node
    pulls the weights after every update over its learner's link (the worst case; measured
    here: 0.3-1 pulls per node and update, actors skip versions while a pull is slow);
    without: the weights cost nothing (the best case)."""
    value, limit = predict(CORES * nodes // learners, NODE_RATE / CORES, link_gbit * 1000, bytes_per_step,
                           nodes=nodes / learners, weight_bytes=WEIGHT_BYTES if weights else 0.0,
                           steps_per_update=STEPS_PER_UPDATE)
    return learners * value, limit


def learners_for_actors(nodes: int, link_gbit: float, bytes_per_step: float, weights: bool) -> int | None:
    """The fewest learners (1-16) with which the actors are the limit."""
    return next((k for k in range(1, 17) if cluster(nodes, link_gbit, bytes_per_step, k, weights)[1] == "actors"), None)


def print_cluster_table(params: dict) -> list[dict]:
    """Per (nodes, link, observations): one learner's rate in the worst and the best case for
    the weights, and the learners it takes for the actors to be the limit in each."""
    rows = []
    print(f"\n8-64 nodes of {CORES} cores (x {NODE_RATE} steps/s), Pong, one learner per machine and link;"
          " worst: every node pulls the weights every update, best: weights free")
    print(f"{'nodes':>5} {'Gbit/s':>6} {'obs':>4} {'worst':>8} {'limit':>8} {'learners':>8} {'best':>8} {'limit':>8} "
          f"{'learners':>8}")
    for nodes in (8, 16, 32, 64):
        for gbit in (10, 25, 100):
            for obs in ("raw", "lz4"):
                b = params[f"{obs}_bytes_per_step"]
                worst, worst_limit = cluster(nodes, gbit, b)
                best, best_limit = cluster(nodes, gbit, b, weights=False)
                row = {"nodes": nodes, "link_gbit": gbit, "obs": obs, "worst": round(worst), "worst_limit": worst_limit,
                       "worst_learners": learners_for_actors(nodes, gbit, b, True), "best": round(best),
                       "best_limit": best_limit, "best_learners": learners_for_actors(nodes, gbit, b, False)}
                rows.append(row)
                print(f"{nodes:>5} {gbit:>6} {obs:>4} {worst:>8.0f} {worst_limit:>8} {str(row['worst_learners']):>8} "
                      f"{best:>8.0f} {best_limit:>8} {str(row['best_learners']):>8}")
    return rows


def rows_of(run: dict, args: dict) -> list[dict]:
    """Every measured row of one configuration: (obs, sink, frames/s, bytes, busy cores, ...)."""
    rows = []
    per_rollout = args["unroll"] * args["envs"]
    base = {"hosts": run["hosts"], "bandwidth_mbit": run["bandwidth_mbit"], "latency_ms": run.get("latency_ms", 0.0),
            "rtt_ms": run["rtt_ms"]["p50_ms"], "unroll": args["unroll"]}
    for obs in ("raw", "lz4"):
        measured_obs = run.get(obs, {})
        for sink in ("free", "paced"):
            if sink not in measured_obs:
                continue
            m = measured_obs[sink]
            rows.append({**base, "obs": obs, "sink": sink, "frames_per_s": m["frames_per_s"],
                         "bytes_per_step": m["bytes_per_step"], "busy_cores": m.get("busy_cores"),
                         "idle_busy_cores": measured_obs.get("idle_busy_cores"),
                         "learner": args["rate"] * per_rollout if sink == "paced" else math.inf})
    for name, obs in (("learner", "raw"), ("learner_lz4", "lz4")):
        if run.get(name) and "frames_per_s" in run[name]:
            rows.append({**base, "obs": obs, "sink": "herd", "frames_per_s": run[name]["frames_per_s"],
                         "bytes_per_step": run[name]["bytes_per_step"], "busy_cores": run[name].get("busy_cores"),
                         "idle_busy_cores": run.get(obs, {}).get("idle_busy_cores"), "learner": math.inf,
                         "sent_bytes_per_step": run[name].get("sent_bytes_per_step")})
    return rows


def fit(rows: list[dict], cores: int) -> dict:
    """The model's parameters, from the 1-host unshaped configuration without added latency
    (the only one it is fitted on), for each kind of observation:
      <obs>_per_actor       r: one actor's steps/s into the free sink
      <obs>_bytes_per_step  what host 0's link received per step (free sink)
      <obs>_cpu_s_per_step  CPU-seconds per step beyond the idle cluster (free sink)
      <obs>_herd_cpu_s_per_step  the same with herd's learner as the sink (it trains on these cores too)
      idle_cores_per_node   the busy cores of an idle Ray node (its raylet and workers polling)
    """
    base = [r for r in rows if r["hosts"] == 1 and r["bandwidth_mbit"] is None and not r["latency_ms"]]
    params: dict = {"cores": cores}
    for r in base:
        if r["sink"] == "free":
            params[f"{r['obs']}_per_actor"] = r["frames_per_s"] / r["actors_per_host"]
            params[f"{r['obs']}_bytes_per_step"] = r["bytes_per_step"]
            params["idle_cores_per_node"] = r["idle_busy_cores"] / (r["hosts"] + 1)
            params[f"{r['obs']}_cpu_s_per_step"] = (r["busy_cores"] - r["idle_busy_cores"]) / r["frames_per_s"]
        elif r["sink"] == "herd" and r["busy_cores"]:
            params[f"{r['obs']}_herd_cpu_s_per_step"] = (r["busy_cores"] - r["idle_busy_cores"]) / r["frames_per_s"]
    return params


def predict_row(r: dict, params: dict) -> tuple[float, str]:
    """One measured row's predicted steps/s and the term that limits it."""
    herd = r["sink"] == "herd"
    cpu = params.get(f"{r['obs']}_herd_cpu_s_per_step" if herd else f"{r['obs']}_cpu_s_per_step")
    # The hosts share this machine's cores: what an idle cluster of hosts + 1 nodes leaves,
    # at the CPU-seconds per step of the fit (a real node would bring its own cores instead).
    cores_left = params["cores"] - params["idle_cores_per_node"] * (r["hosts"] + 1)
    value, limit = predict(r["hosts"] * r["actors_per_host"], params[f"{r['obs']}_per_actor"], r["bandwidth_mbit"],
                           params[f"{r['obs']}_bytes_per_step"], r["learner"], nodes=r["hosts"],
                           weight_bytes=WEIGHT_BYTES if herd else 0.0,
                           steps_per_update=CPU_BATCH * r["unroll"] if herd else math.inf)
    if cpu and cores_left / cpu < value:
        return cores_left / cpu, "cpu"
    return value, limit


def main() -> None:
    files = sys.argv[1:] or sorted(glob.glob(str(HERE / "results" / "netns_cluster_Pong*.json")))
    records = [json.loads(Path(f).read_text()) for f in files]
    machines = {(r["machine"]["cpu_model"], r["machine"]["cpus"]) for r in records}
    if len(machines) != 1:
        sys.exit(f"the records come from {len(machines)} machines {sorted(machines)}: fit and check one machine's")
    rows = [dict(row, actors_per_host=r["args"]["actors_per_host"], file=Path(f).name)
            for f, r in zip(files, records) for run in r["runs"] for row in rows_of(run, r["args"])]
    params = fit(rows, records[0]["machine"]["cpus"])
    if "raw_per_actor" not in params:
        sys.exit("no 1-host unshaped run without latency to fit on: "
                 "run benchmarks/netns_cluster.py --hosts 1 --bandwidths none --latencies 0")
    table = []
    for r in rows:
        fitted = r["hosts"] == 1 and r["bandwidth_mbit"] is None and not r["latency_ms"] and r["sink"] != "paced"
        value, limit = predict_row(r, params)
        # herd's actors pull the weights once per node and update: what host 0 sent says whether they did
        expected_sent = r["hosts"] * WEIGHT_BYTES / (CPU_BATCH * r["unroll"]) if r["sink"] == "herd" else None
        error = (value - r["frames_per_s"]) / r["frames_per_s"] if r["frames_per_s"] else math.inf
        kind = "paced" if r["sink"] == "paced" else "cpu" if limit in ("cpu", "actors") else "network"
        table.append({**r, "predicted": round(value, 1), "limit": limit, "error": round(error, 3), "fitted": fitted,
                      "kind": kind, "expected_sent_bytes_per_step": expected_sent and round(expected_sent)})
    print("fitted on the 1-host unshaped run without latency: "
          + json.dumps({k: round(v, 6 if "cpu_s" in k else 3) for k, v in params.items()}))
    print(f"{'hosts':>5} {'Mbit/s':>7} {'lat ms':>6} {'obs':>4} {'sink':>6} {'measured':>9} {'predicted':>9} "
          f"{'limit':>8} {'error':>7}  role")
    for t in table:
        print(f"{t['hosts']:>5} {t['bandwidth_mbit'] or '-':>7} {t['latency_ms']:>6g} {t['obs']:>4} {t['sink']:>6} "
              f"{t['frames_per_s']:>9} {t['predicted']:>9} {t['limit']:>8} {100 * t['error']:>6.1f}%  "
              f"{'fit' if t['fitted'] else t['kind']}"
              + (f"  sent/step {t['sent_bytes_per_step']} (one pull per node and update: "
                 f"{t['expected_sent_bytes_per_step']})" if t["sink"] == "herd" else ""))
    checks = [t for t in table if not t["fitted"]]
    within = [t for t in checks if abs(t["error"]) <= 0.2]
    by_kind = {kind: [sum(abs(t["error"]) <= 0.2 for t in checks if t["kind"] == kind),
                      sum(t["kind"] == kind for t in checks)] for kind in ("network", "paced", "cpu")}
    print(f"checks within 20 %: {len(within)} of {len(checks)}; by kind: "
          + ", ".join(f"{kind} {a} of {b}" for kind, (a, b) in by_kind.items()))
    predicted = print_cluster_table(params)
    out = HERE / "results" / "netns_model.json"
    out.write_text(json.dumps({"files": [Path(f).name for f in files], "params": params, "table": table,
                               "checks_within_20pct": [len(within), len(checks)], "by_kind": by_kind,
                               "cluster_prediction": predicted,
                               "cluster_assumptions": {"node_rate": NODE_RATE, "gpu_learner_floor": GPU_LEARNER_FLOOR,
                                                       "weight_bytes": WEIGHT_BYTES,
                                                       "steps_per_update": STEPS_PER_UPDATE}},
                              indent=2, default=str))
    print(f"recorded {out}")


if __name__ == "__main__":
    main()
