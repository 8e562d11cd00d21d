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
    learner rate     the paced sink's rollouts/s x T x E (known, not fitted); herd's real learner:
                     fitted from its 1-host unshaped run where that run was learner-bound

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


def cluster(nodes: int, link_gbit: float, bytes_per_step: float, learners: int = 1) -> tuple[float, str]:
    """What `nodes` actor nodes of CORES actors can feed `learners` learners (each on its own
    machine and link, with nodes/learners of the nodes), in agent steps/s, and the term that
    limits it; each learner must then train at that rate / learners."""
    value, limit = predict(CORES * nodes // learners, NODE_RATE / CORES, link_gbit * 1000, bytes_per_step,
                           nodes=nodes / learners, weight_bytes=WEIGHT_BYTES, steps_per_update=STEPS_PER_UPDATE)
    return learners * value, limit


def print_cluster_table(params: dict) -> list[dict]:
    """Per (nodes, link, observations): the rate with one learner, and the fewest learners
    (1-16) with which the actors become the limit."""
    rows = []
    print(f"\n8-64 nodes of 16 cores (x {NODE_RATE} steps/s), Pong, one learner per machine and link:")
    print(f"{'nodes':>5} {'Gbit/s':>6} {'obs':>4} {'1 learner':>10} {'limit':>8} {'learners for actors':>20} "
          f"{'steps/s then':>12} {'each learner':>12}")
    for nodes in (8, 16, 32, 64):
        for gbit in (10, 25, 100):
            for obs in ("raw", "lz4"):
                one, limit = cluster(nodes, gbit, params[f"{obs}_bytes_per_step"])
                enough = next((k for k in range(1, 17) if cluster(nodes, gbit, params[f"{obs}_bytes_per_step"], k)[1]
                               == "actors"), None)
                rate = cluster(nodes, gbit, params[f"{obs}_bytes_per_step"], enough)[0] if enough else None
                rows.append({"nodes": nodes, "link_gbit": gbit, "obs": obs, "one_learner": round(one),
                             "limit": limit, "learners_for_actor_bound": enough,
                             "steps_per_s": round(rate) if rate else None,
                             "per_learner": round(rate / enough) if rate else None})
                print(f"{nodes:>5} {gbit:>6} {obs:>4} {one:>10.0f} {limit:>8} {str(enough):>20} "
                      f"{rate or 0:>12.0f} {(rate or 0) / (enough or 1):>12.0f}")
    return rows


def rows_of(run: dict, args: dict) -> list[dict]:
    """Every measured row of one configuration: (obs, sink, frames/s, ...)."""
    rows = []
    per_rollout = args["unroll"] * args["envs"]
    for obs in ("raw", "lz4"):
        for sink, measured in run.get(obs, {}).items():
            learner = args["rate"] * per_rollout if sink == "paced" else math.inf
            rows.append({"hosts": run["hosts"], "bandwidth_mbit": run["bandwidth_mbit"], "obs": obs, "sink": sink,
                         "unroll": args["unroll"],
                         "frames_per_s": measured["frames_per_s"], "bytes_per_step": measured["bytes_per_step"],
                         "learner": learner})
    for name, obs in (("learner", "raw"), ("learner_lz4", "lz4")):
        if run.get(name) and "frames_per_s" in run[name]:
            rows.append({"hosts": run["hosts"], "bandwidth_mbit": run["bandwidth_mbit"], "obs": obs, "sink": "herd",
                         "unroll": args["unroll"],
                         "frames_per_s": run[name]["frames_per_s"], "bytes_per_step": run[name]["bytes_per_step"],
                         "learner": None, "sent_bytes_per_step": run[name].get("sent_bytes_per_step")})
    return rows


def main() -> None:
    files = sys.argv[1:] or sorted(glob.glob(str(HERE / "results" / "netns_cluster_Pong*_h*_bw*.json")))
    records = [json.loads(Path(f).read_text()) for f in files]
    rows = [dict(row, actors_per_host=r["args"]["actors_per_host"], file=Path(f).name)
            for f, r in zip(files, records) for run in r["runs"] for row in rows_of(run, r["args"])]
    fit = [r for r in rows if r["hosts"] == 1 and r["bandwidth_mbit"] is None and r["sink"] == "free"]
    if not fit:
        sys.exit("no 1-host unshaped run to fit on: run benchmarks/netns_cluster.py --hosts 1 --bandwidths none")
    params = {f"{r['obs']}_per_actor": r["frames_per_s"] / r["actors_per_host"] for r in fit}
    params.update({f"{r['obs']}_bytes_per_step": r["bytes_per_step"] for r in fit})
    herd_fit = [r for r in rows if r["sink"] == "herd" and r["hosts"] == 1 and r["bandwidth_mbit"] is None
                and r["obs"] == "raw"]
    actor_bound = params["raw_per_actor"] * (herd_fit[0]["actors_per_host"] if herd_fit else 1)
    # herd's learner: its rate where its unshaped 1-host run stayed clearly below what the actors make.
    params["herd_learner"] = (herd_fit[0]["frames_per_s"] if herd_fit and herd_fit[0]["frames_per_s"] < 0.8 * actor_bound
                              else math.inf)
    table = []
    for r in rows:
        fitted = r in fit or r in herd_fit
        learner = params["herd_learner"] if r["sink"] == "herd" else r["learner"]
        herd = r["sink"] == "herd"
        value, limit = predict(r["hosts"] * r["actors_per_host"], params[f"{r['obs']}_per_actor"], r["bandwidth_mbit"],
                               params[f"{r['obs']}_bytes_per_step"], learner, nodes=r["hosts"],
                               weight_bytes=WEIGHT_BYTES if herd else 0.0,
                               steps_per_update=CPU_BATCH * r["unroll"] if herd else math.inf)
        # herd's actors pull the weights once per node and update: what host 0 sent says whether they did
        expected_sent = r["hosts"] * WEIGHT_BYTES / (CPU_BATCH * r["unroll"]) if herd else None
        error = (value - r["frames_per_s"]) / r["frames_per_s"] if r["frames_per_s"] else math.inf
        table.append({**r, "predicted": round(value, 1), "limit": limit, "error": round(error, 3), "fitted": fitted,
                      "expected_sent_bytes_per_step": expected_sent and round(expected_sent)})
    print(f"fitted on the 1-host unshaped run: {json.dumps({k: round(v, 1) for k, v in params.items()})}")
    print(f"{'hosts':>5} {'Mbit/s':>7} {'obs':>4} {'sink':>6} {'measured':>9} {'predicted':>9} {'limit':>8} "
          f"{'error':>7}  role")
    for t in table:
        print(f"{t['hosts']:>5} {t['bandwidth_mbit'] or '-':>7} {t['obs']:>4} {t['sink']:>6} {t['frames_per_s']:>9} "
              f"{t['predicted']:>9} {t['limit']:>8} {100 * t['error']:>6.1f}%  {'fit' if t['fitted'] else 'check'}"
              + (f"  sent/step {t['sent_bytes_per_step']} (one pull per node and update: "
                 f"{t['expected_sent_bytes_per_step']})" if t["sink"] == "herd" else ""))
    checks = [t for t in table if not t["fitted"]]
    within = [t for t in checks if abs(t["error"]) <= 0.2]
    print(f"checks within 20 %: {len(within)} of {len(checks)}")
    predicted = print_cluster_table(params)
    out = HERE / "results" / "netns_model.json"
    out.write_text(json.dumps({"files": [Path(f).name for f in files], "params": params, "table": table,
                               "checks_within_20pct": [len(within), len(checks)], "cluster_prediction": predicted,
                               "cluster_assumptions": {"node_rate": NODE_RATE, "gpu_learner_floor": GPU_LEARNER_FLOOR,
                                                       "weight_bytes": WEIGHT_BYTES,
                                                       "steps_per_update": STEPS_PER_UPDATE}},
                              indent=2, default=str))
    print(f"recorded {out}")


if __name__ == "__main__":
    main()
