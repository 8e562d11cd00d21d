"""The throughput model of a herd cluster, fitted on one configuration of
benchmarks/netns_cluster.py and checked against every configuration it was not fitted on;
then its prediction for 8 to 64 nodes.

    steps/s = min(actors term, link term, learner rate, cpu term)

    sinks (a learner that takes rollouts and publishes nothing):
      actors term    actors x r
      link term      link / bytes per step
    herd's learner (it publishes the weights once per update; an actor pulls the newest
    between its rollouts, and waits for it; a node's actors share one transfer per version):
      pulls per step p = min(nodes / S, 1 / R): a node pulls at most once per update and at
                     most once per rollout its actors finish (they refresh only then), so
                     with more nodes than rollouts per update (nodes x R > S) they skip versions
      actors term    actors / (1 / r + a x W / link), a = min(actors / S, 1 / R): each actor
                     waits for the pulls it takes (once per update, at most once per rollout),
                     each at best at the link's rate; while one node pulls, the others roll out
      weights term   link / (p x W): the pulls leave the learner's host on its outgoing link,
                     at most back to back
      link term      link / bytes per step   (the trajectories, into the learner's host: the
                     other direction; each direction of a link has its own rate, here as on
                     a real full-duplex link)
      (Until a trace of a 2-host thin-link run, the actors term charged every pull to every
      actor, as if all nodes pulled at once and nobody rolled out meanwhile: the lockstep.
      The trace showed the nodes' pulls overlapping about half of the time; docs/netns-cluster.md.)
    learner rate     the paced sink's rollouts/s x T x E (known, not fitted)
    cpu term         (cores - idle cores per node x (hosts + 1)) / CPU-seconds per step: every
                     host here shares this machine's cores (a real node brings its own)
                     With per-host budgets (netns_cluster.py --host_cores/--head_cores: each
                     host its own cores, as real nodes) it is host 0's instead: its cores /
                     host 0's CPU-seconds per step; each worker host's cores are already in r
                     (fitted on one such host), so the actors term grows with hosts.

    r                agent steps/s of one actor into that sink
    bytes per step   bytes the learner's host receives on its link per agent step
    CPU-s per step   every process on the machine, beyond an idle cluster (/proc/stat)
    idle per node    busy cores of an idle Ray node (raylet and workers polling)
    link             bytes/s of the learner host's link (every link is shaped alike)
    S, W, R          steps per update (batch x T: 8 x 20, herd's CPU Atari default), the
                     weights' bytes (herd's Pong network: 1,950,375 float32) and an actor's
                     rollout (T x envs: 20 x 4 here): structure, not fitted

Runs with different budgets (none, or host 0's and each worker host's cores) are fitted and
checked apart: each setting is a cluster of other machines.

Fitted (each kind of observation, raw and LZ4, for the sinks and for herd): r, bytes per
step and CPU-seconds per step (with budgets: host 0's own too), on the 1-host unshaped
configuration without latency; the
idle cores per node on the same; and CPU-seconds per step on the 1-host unshaped
configuration with latency (the harness's delay lines cost this machine's CPU that a veth
pair, or a real link, does not). Link latency itself is not a term: the checks with 1 ms
per link say whether it should be. Checks fall in three kinds, counted apart: `network` (a shaped
link), `paced` (the sink's known rate, or the link where lower) and `cpu` (an unshaped link).

Usage: python benchmarks/netns_model.py [results/netns_cluster_Pong*.json ...]
Prints the check table (measured, predicted, error) and the 8-64 node prediction; records
benchmarks/results/netns_model.json. Refuses records of more than one machine."""
from __future__ import annotations

import glob
import json
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from netns_cluster import ANOTHER_LOAD_CORES  # noqa: E402


def pulls_per_step(nodes: float, steps_per_update: float, rollout_steps: float) -> float:
    """The most weight pulls per agent step: a node pulls at most once per update and at most
    once per rollout its actors finish (rollout_steps 1: after every step, no second bound)."""
    return min(nodes / steps_per_update, 1 / rollout_steps)


def predict(actors: int, per_actor: float, link_mbit: float | None, bytes_per_step: float,
            learner: float = math.inf, nodes: int = 1, weight_bytes: float = 0.0,
            steps_per_update: float = math.inf, rollout_steps: float = 1.0,
            cpu: float = math.inf) -> tuple[float, str]:
    """(agent steps/s, the term that limits it); the module's docstring says which is which."""
    link = math.inf if link_mbit is None else link_mbit * 1e6 / 8
    terms = {"actors": actors * per_actor, "link": link / bytes_per_step, "learner": learner, "cpu": cpu}
    if weight_bytes:
        # herd: a node pulls the newest weights at most once per update and at most once per
        # rollout of its actors, out of the learner's link (the direction the trajectories do
        # not use); each actor waits for the pulls it takes, and the others go on meanwhile.
        waits = pulls_per_step(actors, steps_per_update, rollout_steps)      # per step of one actor
        terms["actors"] = actors / (1 / per_actor + waits * weight_bytes / link)
        terms["weights"] = link / (pulls_per_step(nodes, steps_per_update, rollout_steps) * weight_bytes)
    limit = min(terms, key=terms.get)
    return terms[limit], limit


# A cluster of GPU-learner Pong (the assumptions of the 8-64 node prediction, each measured):
NODE_RATE = 11_800        # agent steps/s of one 16-core node of CPU actors: the H100 machine's steady
                          # rate (benchmarks/results/pong_h100_defaults_3min/train.csv, 14 actors x 8 envs)
GPU_LEARNER_FLOOR = 11_800   # that H100 learner kept up with it; its own ceiling is higher (an H200's
                             # captured update alone: 1.53 ms per 640 steps, results/learner_step_compare_cuda.json)
                             # but its intake from remote actors is not measured: the table says what each must sustain
# herd's Pong network, float32: the Nature CNN with its 512-unit feature layer (the Atari
# profile's feature_out_layer_size, --use_additional_scaling_FC_layer on by default):
# 1,687,719 parameters without that layer, 1,950,375 with it (tests/test_netns_model.py counts it)
WEIGHT_BYTES = 1_950_375 * 4
STEPS_PER_UPDATE = 32 * 20    # herd's CUDA Atari defaults: batch 32 x T 20
ROLLOUT_STEPS = 8 * 20        # an actor's rollout there: 8 envs x T 20
CPU_BATCH = 8                 # herd's CPU Atari default batch (the benchmark's real learner)
CORES = 16


def cluster(nodes: int, link_gbit: float, bytes_per_step: float, learners: int = 1,
            weights: bool = True) -> tuple[float, str]:
    """What `nodes` actor nodes of CORES actors can feed `learners` learners (each on its own
    machine and link, with nodes/learners of the nodes), in agent steps/s, and the term that
    limits it; each learner must then train at that rate / learners. weights: every node
    pulls the newest weights whenever its actors finish a rollout and a newer version exists
    (the worst case: at most once per update and per rollout, which herd's actors reach on
    a thin link); without: the weights cost nothing (the best case: what pulling less often,
    or from each other, would approach)."""
    value, limit = predict(CORES * nodes // learners, NODE_RATE / CORES, link_gbit * 1000, bytes_per_step,
                           nodes=nodes / learners, weight_bytes=WEIGHT_BYTES if weights else 0.0,
                           steps_per_update=STEPS_PER_UPDATE, rollout_steps=ROLLOUT_STEPS)
    return learners * value, limit


def learners_for_90pct_of_actors(nodes: int, link_gbit: float, bytes_per_step: float, weights: bool) -> int | None:
    """The fewest learners (1-16) with which the cluster reaches 90 % of its actors' own rate
    (the network then costs less than a tenth)."""
    return next((k for k in range(1, 17)
                 if cluster(nodes, link_gbit, bytes_per_step, k, weights)[0] >= 0.9 * nodes * NODE_RATE), None)


def print_cluster_table(params: dict) -> list[dict]:
    """Per (nodes, link, observations): one learner's rate in the worst and the best case for
    the weights, and the learners it takes to reach 90 % of the actors' rate in each. Bytes
    per step are herd's own (its actors send only what its loss reads)."""
    rows = []
    print(f"\n8-64 nodes of {CORES} cores (x {NODE_RATE} steps/s), Pong, one learner per machine and link;"
          " worst: every node pulls the newest weights after every rollout, best: weights free")
    print(f"{'nodes':>5} {'Gbit/s':>6} {'obs':>4} {'worst':>8} {'limit':>8} {'learners':>8} {'best':>8} {'limit':>8} "
          f"{'learners':>8}")
    for nodes in (8, 16, 32, 64):
        for gbit in (10, 25, 100):
            for obs in ("raw", "lz4"):
                b = params[f"herd_{obs}_bytes_per_step"]
                worst, worst_limit = cluster(nodes, gbit, b)
                best, best_limit = cluster(nodes, gbit, b, weights=False)
                row = {"nodes": nodes, "link_gbit": gbit, "obs": obs, "worst": round(worst), "worst_limit": worst_limit,
                       "worst_learners": learners_for_90pct_of_actors(nodes, gbit, b, True), "best": round(best),
                       "best_limit": best_limit, "best_learners": learners_for_90pct_of_actors(nodes, gbit, b, False)}
                rows.append(row)
                print(f"{nodes:>5} {gbit:>6} {obs:>4} {worst:>8.0f} {worst_limit:>8} {str(row['worst_learners']):>8} "
                      f"{best:>8.0f} {best_limit:>8} {str(row['best_learners']):>8}")
    return rows


def rows_of(run: dict, args: dict) -> list[dict]:
    """Every measured row of one configuration: (obs, sink, frames/s, bytes, busy cores, ...)."""
    rows = []
    per_rollout = args["unroll"] * args["envs"]
    base = {"hosts": run["hosts"], "bandwidth_mbit": run["bandwidth_mbit"], "latency_ms": run.get("latency_ms", 0.0),
            "rtt_ms": run["rtt_ms"]["p50_ms"], "unroll": args["unroll"], "head_cores": head_cores(run)}
    for obs in ("raw", "lz4"):
        measured_obs = run.get(obs, {})
        for sink in ("free", "paced"):
            if sink not in measured_obs:
                continue
            m = measured_obs[sink]
            rows.append({**base, "obs": obs, "sink": sink, "frames_per_s": m["frames_per_s"],
                         "bytes_per_step": m["bytes_per_step"], "busy_cores": m.get("busy_cores"),
                         "host_cores_used": m.get("host_cores_used"),
                         "idle_busy_cores": measured_obs.get("idle_busy_cores"),
                         "learner": args["rate"] * per_rollout if sink == "paced" else math.inf})
    for name, obs in (("learner", "raw"), ("learner_lz4", "lz4")):
        if run.get(name) and "frames_per_s" in run[name]:
            rows.append({**base, "obs": obs, "sink": "herd", "frames_per_s": run[name]["frames_per_s"],
                         "bytes_per_step": run[name]["bytes_per_step"], "busy_cores": run[name].get("busy_cores"),
                         "host_cores_used": run[name].get("host_cores_used"),
                         "idle_busy_cores": run.get(obs, {}).get("idle_busy_cores"), "learner": math.inf,
                         "sent_bytes_per_step": run[name].get("sent_bytes_per_step"),
                         "pulls_per_node_update": pulls_per_node_update(run[name], run["hosts"])})
    return rows


def pulls_per_node_update(learner: dict, hosts: int) -> float | None:
    """The weights a worker host took in per update, on average over the worker hosts: what
    its link received (Ray brings each version from host 0 or from a node that has it)
    over the whole run, in weights, per update. None in records without every host's bytes."""
    moved, updates = learner.get("link_bytes"), learner.get("updates")
    if not moved or not updates:
        return None
    received = [moved[str(h)]["rx"] for h in range(1, hosts + 1)]
    return round(sum(received) / len(received) / WEIGHT_BYTES / updates, 2)


def most_pulls_per_node_update(hosts: int, steps_per_update: float, rollout_steps: float) -> float:
    """The model's pulls per worker host and update: pulls_per_step's, per node and update."""
    return pulls_per_step(hosts, steps_per_update, rollout_steps) * steps_per_update / hosts


def head_cores(run: dict) -> float | None:
    """Host 0's budget of cores in a configuration, None without one."""
    return (run.get("host_cores") or [None])[0]


def budget_setting(run: dict) -> str:
    """The budgets a configuration ran with, as a name: 'none', or 'head <c> / host <c>'."""
    cores = run.get("host_cores")
    if not cores:
        return "none"
    return f"head {cores[0] if cores[0] is not None else '-'} / host {cores[1]}"


SINK_KEYS, LEARNER_KEYS = ("raw", "lz4"), ("learner", "learner_lz4")


def merged_with_older(run: dict, older: dict) -> dict:
    """A configuration measured again in part keeps the older run's other part: a run of
    herd's learner alone (netns_cluster.py --sinks 0) the older sinks, a run of the sinks
    alone (--learner_seconds 0) the older learner rows; a whole run replaces the older."""
    merged = dict(run)
    for part in (SINK_KEYS, LEARNER_KEYS):
        if not any(run.get(key) for key in part):
            merged.update({key: older[key] for key in part if key in older})
    return merged


def kind_of(row: dict) -> str:
    """The harness's kind of link: a delay line (latency) costs this machine's CPU per packet
    that a veth pair (and a real link) does not."""
    return "delay" if row["latency_ms"] else "veth"


def fit(rows: list[dict], cores: int) -> dict:
    """The model's parameters, from the 1-host unshaped configurations (the only ones it is
    fitted on), for the sinks (<obs>_...) and herd's learner (herd_<obs>_...), raw and
    LZ4-compressed observations each:
      per_actor        r: one actor's steps/s into that sink (veth links)
      bytes_per_step   what host 0's link received per step (herd's actors send fewer fields
                       than the sinks' actors: only what its loss reads)
      cpu_s_per_step_<veth|delay>   CPU-seconds per step, every process on the machine, beyond
                       the idle cluster, on each kind of link (the delay lines' own work)
      idle_cores_per_node   the busy cores of an idle Ray node (its raylet and workers polling)
      head_cpu_s_per_step_<veth|delay>   with a budget on host 0: its own CPU-seconds per step
    """
    base = [r for r in rows if r["hosts"] == 1 and r["bandwidth_mbit"] is None]
    params: dict = {"cores": cores}
    for r in base:
        if r["sink"] == "paced" or not r["busy_cores"]:
            continue
        name = f"herd_{r['obs']}" if r["sink"] == "herd" else r["obs"]
        params[f"{name}_cpu_s_per_step_{kind_of(r)}"] = (r["busy_cores"] - r["idle_busy_cores"]) / r["frames_per_s"]
        if r["head_cores"] is not None and r.get("host_cores_used"):
            params[f"{name}_head_cpu_s_per_step_{kind_of(r)}"] = r["host_cores_used"]["0"] / r["frames_per_s"]
        if kind_of(r) == "veth":
            params[f"{name}_per_actor"] = r["frames_per_s"] / r["actors_per_host"]
            params[f"{name}_bytes_per_step"] = r["bytes_per_step"]
            if r["sink"] == "free":
                params["idle_cores_per_node"] = r["idle_busy_cores"] / (r["hosts"] + 1)
    return params


def is_fitted(row: dict) -> bool:
    return row["hosts"] == 1 and row["bandwidth_mbit"] is None and row["sink"] != "paced"


def predict_row(r: dict, params: dict) -> tuple[float, str]:
    """One measured row's predicted steps/s and the term that limits it."""
    herd = r["sink"] == "herd"
    name = f"herd_{r['obs']}" if herd else r["obs"]
    # The hosts share this machine's cores: what an idle cluster of hosts + 1 nodes leaves,
    # at the CPU-seconds per step of the fit (a real node would bring its own cores instead).
    cores_left = params["cores"] - params["idle_cores_per_node"] * (r["hosts"] + 1)
    cpu_s = params.get(f"{name}_cpu_s_per_step_{kind_of(r)}")
    if r["head_cores"] is not None:
        # Each host its own cores: the worker hosts' are in r; what can still bind is host 0's.
        cores_left, cpu_s = r["head_cores"], params.get(f"{name}_head_cpu_s_per_step_{kind_of(r)}")
    return predict(r["hosts"] * r["actors_per_host"], params[f"{name}_per_actor"], r["bandwidth_mbit"],
                   params[f"{name}_bytes_per_step"], r["learner"], nodes=r["hosts"],
                   weight_bytes=WEIGHT_BYTES if herd else 0.0,
                   steps_per_update=CPU_BATCH * r["unroll"] if herd else math.inf,
                   rollout_steps=r["unroll"] * r["envs"],
                   cpu=cores_left / cpu_s if cpu_s else math.inf)




def another_load(run: dict) -> float | None:
    """The busy cores that say another load ran beside this configuration, else None."""
    seen = [run.get("outside_busy_cores")] + [run.get(obs, {}).get("idle_busy_cores") for obs in ("raw", "lz4")]
    worst = max((c for c in seen if c is not None), default=0.0)
    return worst if worst > ANOTHER_LOAD_CORES else None


def check(rows: list[dict], cores: int) -> dict | None:
    """Fits one budget setting's rows and checks every row it was not fitted on; prints the
    table. None where the setting has no 1-host unshaped run without latency to fit on."""
    params = fit(rows, cores)
    if "raw_per_actor" not in params:
        return None
    table = []
    for r in rows:
        fitted = is_fitted(r)
        value, limit = predict_row(r, params)
        # the most pulls per worker host and update (pulls_per_step): what each took in says how close
        # the actors came (on a fast link they skip versions the learner made in the meantime)
        most_pulls = (round(most_pulls_per_node_update(r["hosts"], CPU_BATCH * r["unroll"], r["unroll"] * r["envs"]), 2)
                      if r["sink"] == "herd" else None)
        error = (value - r["frames_per_s"]) / r["frames_per_s"] if r["frames_per_s"] else math.inf
        kind = ("paced" if r["sink"] == "paced" else "network" if r["bandwidth_mbit"] and (limit != "cpu" or
                r["sink"] == "herd") else "cpu")
        table.append({**r, "predicted": round(value, 1), "limit": limit, "error": round(error, 3), "fitted": fitted,
                      "kind": kind, "most_pulls_per_node_update": most_pulls})
    print("fitted on the 1-host unshaped runs (veth; delay line: its CPU only): "
          + json.dumps({k: round(v, 6 if "cpu_s" in k else 3) for k, v in params.items()}))
    print(f"{'hosts':>5} {'Mbit/s':>7} {'lat ms':>6} {'obs':>4} {'sink':>6} {'measured':>9} {'predicted':>9} "
          f"{'limit':>8} {'error':>7}  role")
    for t in table:
        print(f"{t['hosts']:>5} {t['bandwidth_mbit'] or '-':>7} {t['latency_ms']:>6g} {t['obs']:>4} {t['sink']:>6} "
              f"{t['frames_per_s']:>9} {t['predicted']:>9} {t['limit']:>8} {100 * t['error']:>6.1f}%  "
              f"{'fit' if t['fitted'] else t['kind']}"
              + (f"  pulls/host/update {t['pulls_per_node_update'] if t['pulls_per_node_update'] is not None else '?'}"
                 f" (at most {t['most_pulls_per_node_update']})" if t["sink"] == "herd" else ""))
    checks = [t for t in table if not t["fitted"]]
    within = [t for t in checks if abs(t["error"]) <= 0.2]
    by_kind = {kind: [sum(abs(t["error"]) <= 0.2 for t in checks if t["kind"] == kind),
                      sum(t["kind"] == kind for t in checks)] for kind in ("network", "paced", "cpu")}
    print(f"checks within 20 %: {len(within)} of {len(checks)}; by kind: "
          + ", ".join(f"{kind} {a} of {b}" for kind, (a, b) in by_kind.items()))
    return {"params": params, "table": table, "checks_within_20pct": [len(within), len(checks)], "by_kind": by_kind}


def main() -> None:
    files = sys.argv[1:] or sorted(glob.glob(str(HERE / "results" / "netns_cluster_Pong*.json")))
    records = [json.loads(Path(f).read_text()) for f in files]
    machines = {(r["machine"]["cpu_model"], r["machine"]["cpus"]) for r in records}
    if len(machines) != 1:
        sys.exit(f"the records come from {len(machines)} machines {sorted(machines)}: fit and check one machine's")
    # A configuration measured in several records counts once: the newest record's run (a
    # rerun replaces what it reran; one of herd's learner or of the sinks alone keeps the older other part).
    newest: dict = {}
    for f, r in sorted(zip(files, records), key=lambda fr: fr[1]["date"]):
        for run in r["runs"]:
            if (load := another_load(run)) is not None:
                print(f"left out: {Path(f).name} hosts={run['hosts']} Mbit/s={run['bandwidth_mbit']} "
                      f"latency={run.get('latency_ms', 0.0)} ms ({load} cores busy without the cluster working: "
                      "another load)")
                continue
            key = (budget_setting(run), run["hosts"], run["bandwidth_mbit"], run.get("latency_ms", 0.0))
            if key in newest:
                run = merged_with_older(run, newest[key][2])
            newest[key] = (f, r, run)
    settings: dict = {}
    for f, r, run in newest.values():
        settings.setdefault(budget_setting(run), []).extend(
            dict(row, actors_per_host=r["args"]["actors_per_host"], envs=r["args"]["envs"], file=Path(f).name)
            for row in rows_of(run, r["args"]))
    checked = {}
    for setting, rows in sorted(settings.items()):
        print(f"\nbudgets: {setting}")
        result = check(rows, records[0]["machine"]["cpus"])
        if result is None:
            print("  not checked: no 1-host unshaped run without latency to fit on (benchmarks/netns_cluster.py "
                  "--hosts 1 --bandwidths none --latencies 0, with these budgets)")
            continue
        checked[setting] = result
    if not checked:
        sys.exit("no budget setting has a 1-host unshaped run without latency to fit on: "
                 "run benchmarks/netns_cluster.py --hosts 1 --bandwidths none --latencies 0")
    # The cluster prediction takes herd's bytes per step, which no budget changes.
    predicted = print_cluster_table(checked.get("none", next(iter(checked.values())))["params"])
    out = HERE / "results" / "netns_model.json"
    out.write_text(json.dumps({"files": [Path(f).name for f in files], "settings": checked,
                               "cluster_prediction": predicted,
                               "cluster_assumptions": {"node_rate": NODE_RATE, "gpu_learner_floor": GPU_LEARNER_FLOOR,
                                                       "weight_bytes": WEIGHT_BYTES,
                                                       "steps_per_update": STEPS_PER_UPDATE}},
                              indent=2, default=str))
    print(f"recorded {out}")


if __name__ == "__main__":
    main()
