"""The netns benchmark's arithmetic (benchmarks/netns_model.py, netns_cluster.py): the
weight pulls' cap, the steady window of a bursty run, and the rule that leaves out a
configuration measured beside another load. No namespaces needed."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import netns_cluster  # noqa: E402
import netns_model  # noqa: E402

W = 6_750_000.0       # bytes of weights per pull
LINK_MBIT = 30.0      # 3.75 MB/s each way


def herd_terms(nodes: int, rollout_steps: float, steps_per_update: float = 160.0) -> tuple[float, str]:
    # actors fast and trajectories tiny: only the weights can bind
    return netns_model.predict(nodes, 1e9, LINK_MBIT, 1.0, nodes=nodes, weight_bytes=W,
                               steps_per_update=steps_per_update, rollout_steps=rollout_steps)


def test_one_node_pulls_once_per_update():
    value, limit = herd_terms(nodes=1, rollout_steps=80)
    # the actors wait W / link per update of 160 steps; nothing else costs time
    assert limit == "actors"
    assert value == pytest.approx(160 / (W / 3.75e6), rel=1e-6)


def test_more_nodes_than_rollouts_per_update_skip_versions():
    # 4 nodes of 80-step rollouts, 160 steps per update: a node refreshes once per rollout,
    # so the weights leave host 0 once per 80 steps, not 4 times per 160
    value, limit = herd_terms(nodes=4, rollout_steps=80)
    assert limit == "weights"        # pulls that fill host 0's outgoing link back to back
    assert value == pytest.approx(3.75e6 / (W / 80), rel=1e-6)
    uncapped, _ = herd_terms(nodes=4, rollout_steps=1)          # no cap: every node every update
    assert uncapped == pytest.approx(3.75e6 / (4 * W / 160), rel=1e-6)
    assert value == pytest.approx(2 * uncapped, rel=1e-6)


def test_a_node_rolls_out_while_another_pulls():
    # 2 nodes of one 80-step actor at 79 steps/s, an update per 160 steps: each actor waits
    # for its own pull (W at the link's rate) once per rollout, and rolls out while the other
    # node pulls; what binds is host 0's outgoing link, full of pulls back to back.
    pull_s = W / 3.75e6
    value, limit = netns_model.predict(2, 79.0, LINK_MBIT, 1.0, nodes=2, weight_bytes=W,
                                       steps_per_update=160, rollout_steps=80)
    assert limit == "weights" and value == pytest.approx(80 / pull_s, rel=1e-6)
    # the lockstep (both nodes pull at once, sharing the link, and nobody rolls out meanwhile)
    # would be slower: one rollout's time plus two pulls per 160 steps
    lockstep = 160 / (80 / 79.0 + 2 * pull_s)
    assert value > 1.2 * lockstep
    # actors that take no time change nothing: the link binds, not the actors
    fast, _ = netns_model.predict(2, 1e9, LINK_MBIT, 1.0, nodes=2, weight_bytes=W, steps_per_update=160,
                                  rollout_steps=80)
    assert fast == pytest.approx(value, rel=1e-6)


def test_the_trajectories_and_the_weights_use_opposite_directions():
    # trajectories that fill 90 % of the link at the pulls' own rate do not slow the pulls,
    # which go the other way (a link shared by both would give about half that rate)
    pulls_rate = 160 / (W / 3.75e6)
    value, limit = netns_model.predict(1, 1e9, LINK_MBIT, 0.9 * 3.75e6 / pulls_rate, nodes=1, weight_bytes=W,
                                       steps_per_update=160, rollout_steps=80)
    assert limit == "actors" and value == pytest.approx(pulls_rate, rel=1e-6)


def test_a_configuration_beside_another_load_is_left_out():
    clean = {"outside_busy_cores": 0.03, "raw": {"idle_busy_cores": 0.15}, "lz4": {"idle_busy_cores": 0.2}}
    assert netns_model.another_load(clean) is None
    assert netns_model.another_load({**clean, "raw": {"idle_busy_cores": 2.003}}) == 2.003
    assert netns_model.another_load({**clean, "outside_busy_cores": 1.1}) == 1.1
    # records older than the outside measurement still carry the idle cluster's
    assert netns_model.another_load({"raw": {"idle_busy_cores": 0.15}}) is None


def test_the_steady_window_spans_bursts_whole():
    # a thin link: updates come in bursts after stalls
    rows = [{"wall_time": t, "env_step": s} for t, s in
            [(10.0, 160), (10.2, 320), (40.0, 480), (40.1, 640), (70.0, 800), (70.2, 960)]]
    start, end = netns_cluster.steady_window(rows)
    # first update at 10 s, last at 70.2: the mark is at 30.07 s; the window starts at the
    # last row before it (10.2 s), not at the first after it (40 s, a burst's first row)
    assert (start["wall_time"], end["wall_time"]) == (10.2, 70.2)
    assert netns_cluster.steady_window(rows[:1]) is None


def budget_row(hosts: int, frames: float, used: dict | None = None) -> dict:
    """A free-sink row of a cluster where host 0 has 0.5 cores and each worker host 0.3."""
    return {"hosts": hosts, "bandwidth_mbit": None, "latency_ms": 0.0, "rtt_ms": 0.05, "unroll": 20,
            "head_cores": 0.5, "obs": "raw", "sink": "free", "frames_per_s": frames, "bytes_per_step": 30_000.0,
            "busy_cores": 0.65, "idle_busy_cores": 0.05, "host_cores_used": used, "learner": float("inf"),
            "actors_per_host": 1, "envs": 4}


def test_with_budgets_each_worker_host_brings_its_cores_and_host_0_can_bind():
    # fitted on one worker host: 250 steps/s, host 0 busy 0.25 of its 0.5 cores (1 ms per step)
    params = netns_model.fit([budget_row(1, 250.0, {"0": 0.25, "1": 0.3})], cores=2)
    assert params["raw_head_cpu_s_per_step_veth"] == pytest.approx(0.001)
    # 2 hosts: 500 steps/s of actors, host 0 can take 0.5 / 0.001 = 500: level
    assert netns_model.predict_row(budget_row(2, 0.0), params)[0] == pytest.approx(500.0)
    # 4 hosts: 1000 steps/s of actors, host 0's cores bind at 500
    value, limit = netns_model.predict_row(budget_row(4, 0.0), params)
    assert (value, limit) == (pytest.approx(500.0), "cpu")
    # the same row without budgets: the machine's 2 cores, less 5 idle nodes' 0.025 each, at
    # the whole machine's 2.4 ms per step ((0.65 - 0.05) / 250)
    shared = dict(budget_row(4, 0.0), head_cores=None)
    assert netns_model.predict_row(shared, params) == (pytest.approx((2 - 5 * 0.025) / 0.0024), "cpu")


def test_budget_settings_are_named_apart():
    assert netns_model.budget_setting({"host_cores": None}) == "none"
    assert netns_model.budget_setting({}) == "none"
    assert netns_model.budget_setting({"host_cores": [0.5, 0.3, 0.3]}) == "head 0.5 / host 0.3"


def test_the_models_weight_bytes_are_herds_pong_network():
    """Catches a model that prices the weights of another network than the one herd's Pong
    run publishes (it once took the Nature CNN without herd's 512-unit feature layer: 13 %
    fewer bytes per pull)."""
    from herd.config import NetworkConfig
    from herd.models import build_model
    from herd.profiles import PROFILES
    network = NetworkConfig()
    model = build_model("nature_cnn", (4, 84, 84), "uint8", 6, PROFILES["atari"]["feature_out_layer_size"],
                        use_feature_layer=network.use_additional_scaling_FC_layer)
    assert netns_model.WEIGHT_BYTES == 4 * sum(p.numel() for p in model.parameters())


def test_a_configuration_measured_again_in_part_keeps_the_older_other_part():
    older = {"hosts": 2, "raw": {"free": {"frames_per_s": 95.8}}, "lz4": {"free": {"frames_per_s": 160.0}},
             "learner": {"frames_per_s": 56.6}, "learner_lz4": {"frames_per_s": 33.9}}
    herd_alone = {"hosts": 2, "learner": {"frames_per_s": 101.0}, "learner_lz4": {"frames_per_s": 150.0}}
    merged = netns_model.merged_with_older(herd_alone, older)
    assert merged["raw"] == older["raw"] and merged["lz4"] == older["lz4"]
    assert merged["learner"]["frames_per_s"] == 101.0          # herd's rows are the newer run's
    sinks_alone = {"hosts": 2, "raw": {"free": {"frames_per_s": 99.0}}, "learner": None, "learner_lz4": None}
    merged = netns_model.merged_with_older(sinks_alone, older)
    assert merged["raw"]["free"]["frames_per_s"] == 99.0
    assert "lz4" not in merged            # the newer sinks are taken whole: no older sink mixed in
    assert merged["learner"] == older["learner"] and merged["learner_lz4"] == older["learner_lz4"]
    whole = {**older, "raw": {"free": {"frames_per_s": 90.0}}, "learner": {"frames_per_s": 70.0}}
    assert netns_model.merged_with_older(whole, older) == whole           # a whole run replaces the older
