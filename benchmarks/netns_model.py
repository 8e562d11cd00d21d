"""The throughput model of a herd cluster, fitted on one run of benchmarks/netns_cluster.py
and checked against the runs it was not fitted on; then its prediction for 8 to 64 nodes.

    frames/s = min(actors x per-actor rate,  link bandwidth / bytes per step,  learner rate)

    per-actor rate   agent steps/s of one actor (fitted: the 1-host unshaped run, free sink)
    bytes per step   bytes the learner's host receives on its link per agent step (fitted:
                     the same run; raw and LZ4-compressed observations each)
    link bandwidth   the learner host's link (every link is shaped alike: the learner's is the
                     one every trajectory crosses); a tbf rate counts the bytes the counters count
    learner rate     the paced sink's rollouts/s x T x E (known, not fitted); herd's real
                     learner: fitted from its 1-host unshaped run where that run was learner-bound

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


def predict(actors: int, per_actor: float, bandwidth_mbit: float | None, bytes_per_step: float,
            learner: float = math.inf) -> tuple[float, str]:
    """(frames/s, the term that limits it)."""
    terms = {"actors": actors * per_actor,
             "link": math.inf if bandwidth_mbit is None else bandwidth_mbit * 1e6 / 8 / bytes_per_step,
             "learner": learner}
    limit = min(terms, key=terms.get)
    return terms[limit], limit


def rows_of(run: dict, args: dict) -> list[dict]:
    """Every measured row of one configuration: (obs, sink, frames/s, ...)."""
    rows = []
    per_rollout = args["unroll"] * args["envs"]
    for obs in ("raw", "lz4"):
        for sink, measured in run.get(obs, {}).items():
            learner = args["rate"] * per_rollout if sink == "paced" else math.inf
            rows.append({"hosts": run["hosts"], "bandwidth_mbit": run["bandwidth_mbit"], "obs": obs, "sink": sink,
                         "frames_per_s": measured["frames_per_s"], "bytes_per_step": measured["bytes_per_step"],
                         "learner": learner})
    if run.get("learner") and "frames_per_s" in run["learner"]:
        rows.append({"hosts": run["hosts"], "bandwidth_mbit": run["bandwidth_mbit"], "obs": "raw", "sink": "herd",
                     "frames_per_s": run["learner"]["frames_per_s"], "bytes_per_step": run["learner"]["bytes_per_step"],
                     "learner": None})
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
    herd_fit = [r for r in rows if r["sink"] == "herd" and r["hosts"] == 1 and r["bandwidth_mbit"] is None]
    actor_bound = params["raw_per_actor"] * (herd_fit[0]["actors_per_host"] if herd_fit else 1)
    # herd's learner: its rate where its unshaped 1-host run stayed clearly below what the actors make.
    params["herd_learner"] = (herd_fit[0]["frames_per_s"] if herd_fit and herd_fit[0]["frames_per_s"] < 0.8 * actor_bound
                              else math.inf)
    table = []
    for r in rows:
        fitted = r in fit or r in herd_fit
        learner = params["herd_learner"] if r["sink"] == "herd" else r["learner"]
        value, limit = predict(r["hosts"] * r["actors_per_host"], params[f"{r['obs']}_per_actor"], r["bandwidth_mbit"],
                               params[f"{r['obs']}_bytes_per_step"], learner)
        error = (value - r["frames_per_s"]) / r["frames_per_s"] if r["frames_per_s"] else math.inf
        table.append({**r, "predicted": round(value, 1), "limit": limit, "error": round(error, 3), "fitted": fitted})
    print(f"fitted on the 1-host unshaped run: {json.dumps({k: round(v, 1) for k, v in params.items()})}")
    print(f"{'hosts':>5} {'Mbit/s':>7} {'obs':>4} {'sink':>6} {'measured':>9} {'predicted':>9} {'limit':>8} "
          f"{'error':>7}  role")
    for t in table:
        print(f"{t['hosts']:>5} {t['bandwidth_mbit'] or '-':>7} {t['obs']:>4} {t['sink']:>6} {t['frames_per_s']:>9} "
              f"{t['predicted']:>9} {t['limit']:>8} {100 * t['error']:>6.1f}%  {'fit' if t['fitted'] else 'check'}")
    checks = [t for t in table if not t["fitted"]]
    within = [t for t in checks if abs(t["error"]) <= 0.2]
    print(f"checks within 20 %: {len(within)} of {len(checks)}")
    out = HERE / "results" / "netns_model.json"
    out.write_text(json.dumps({"files": [Path(f).name for f in files], "params": params, "table": table,
                               "checks_within_20pct": [len(within), len(checks)]}, indent=2, default=str))
    print(f"recorded {out}")


if __name__ == "__main__":
    main()
