"""Actors record only the step fields that the loss and the configured replays read:
no feature vectors without an elite (custom) replay."""
from __future__ import annotations

import json

import numpy as np
import pytest

from herd.actors.policy import LocalPolicy
from herd.algos import APEX, IMPALA, trajectory_layout
from herd.errors import ConfigError
from herd.models import build_model
from herd.plan import prepare
from herd.weights import SharedWeights

QUEUE = {"type": "queue", "capacity": 1, "sample_ratio": 0.5}
STANDARD = {"type": "standard", "capacity": 100, "sample_ratio": 0.5}
CUSTOM = {"type": "custom", "capacity": 100, "sample_ratio": 0.5, "dist_function": "ln_norm",
          "sample_strategy": "elite_sampling", "lambda_batch_multiplier": 2, "alfa_annealing_factor": 2.0}


@pytest.mark.parametrize("replays, fields", [
    ([dict(QUEUE, sample_ratio=1)], {"behaviour_logits", "behaviour_value"}),
    ([QUEUE, STANDARD], {"behaviour_logits", "behaviour_value"}),
    ([QUEUE, CUSTOM], {"behaviour_logits", "behaviour_value", "features"}),
])
def test_the_plan_records_what_the_loss_and_replays_read(replays, fields, tmp_path):
    """Catches a layout that keeps every step field whatever reads it (the 512 floats of
    Atari features per step, copied by actors and server for nothing) or one that drops a
    field the loss or elite replay then misses."""
    plan = prepare({"env": "CartPole-v1", "replay_parameters": json.dumps(replays), "results_dir": str(tmp_path),
                    "batch_size": 8})
    assert {name for name, _ in plan.layout.step_fields} == fields


def test_continuous_policies_record_their_own_parameters():
    assert IMPALA.read_fields(("queue",), "gaussian") == ("behaviour_mean", "behaviour_log_std", "behaviour_value")
    assert set(APEX.read_fields(("prioritized",))) == {"q_taken", "q_max", "priority"}


def test_layout_without_read_keeps_every_field():
    all_fields = trajectory_layout(IMPALA, 4, (4,), "float32", 2, 8)
    assert {n for n, _ in all_fields.step_fields} == {"behaviour_logits", "behaviour_value", "features"}
    some = trajectory_layout(IMPALA, 4, (4,), "float32", 2, 8, read=("behaviour_logits",))
    assert some.nbytes() < all_fields.nbytes()


def test_the_local_policy_returns_only_the_recorded_fields():
    """Catches a policy whose extra outputs the rollout writer would try to store."""
    kwargs = dict(network="mlp", obs_shape=(4,), obs_dtype="float32", num_actions=2, feature_size=None)
    weights = SharedWeights(build_model(**kwargs))
    policy = LocalPolicy(kwargs, weights, seed=0, record=("behaviour_logits",))
    step = policy.act(np.zeros((3, 4), np.float32))
    assert set(step.fields) == {"behaviour_logits"} and step.fields["behaviour_logits"].shape == (3, 2)


@pytest.mark.parametrize("options, message", [
    ({"actor_double_buffer": True, "actor_inference": "local"}, "--actor_double_buffer overlaps"),
    ({"actor_double_buffer": True, "actor_inference": "server", "device": "cpu", "envs_per_worker": 1},
     "--envs_per_worker >= 2"),
    ({"actor_double_buffer": True, "actor_inference": "server", "device": "cpu", "env_batch_size": 2,
      "env_backend": "ale_vector", "env": "PongNoFrameskip-v4"}, "--env_batch_size=0 .got 2."),
    ({"inference_servers": 3, "worker_count": 2}, "--inference_servers must be from 1 to --worker_count=2"),
    ({"inference_cuda_graphs": True, "device": "cpu"}, "--inference_cuda_graphs captures CUDA graphs"),
    ({"inference_batch_wait_us": -1}, "--inference_batch_wait_us must be from 0"),
    ({"inference_weights_interval": 0}, "--inference_weights_interval must be >= 1"),
    ({"inference_records": "on", "device": "cpu"}, "--inference_records=on: the inference server records"),
    ({"inference_records": "on", "actor_inference": "server", "device": "cpu", "algorithm": "apex"},
     "--actor_inference=server: apex actors need their own model"),
    ({"actor_inference": "in_actor", "algorithm": "apex"}, "--actor_inference=in_actor: apex actors need their own"),
    ({"actor_inference": "in_actor", "actor_double_buffer": True, "envs_per_worker": 1}, "--envs_per_worker >= 2"),
    ({"actor_inference": "in_actor", "inference_servers": 1, "inference_doorbell": "spin"},
     "in_actor runs no server process, so --inference_servers, --inference_doorbell would do nothing"),
    ({"actor_inference": "in_actor", "inference_batch_wait_us": 50}, "so --inference_batch_wait_us would do nothing"),
    ({"inference_records": "maybe"}, "not one of"),
])
def test_inference_options_are_refused_in_one_line(options, message, tmp_path):
    """An option value that cannot run is refused, never silently run as something else
    (double buffering without a server would be the single-buffered actor)."""
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("+", r"\+")) as err:
        prepare({"env": "CartPole-v1", "results_dir": str(tmp_path), **options})
    assert "\n" not in str(err.value)


def test_the_number_of_servers_follows_their_load_unless_given(tmp_path):
    """Unset: one server at first and up to 4 (never more than the actors) added by their
    measured load (herd/backends/inference_servers.py); given: that many, fixed."""
    from herd.backends.inference_servers import GROW_AT
    from herd.training import inference_setup

    def setup(workers: int, **options):
        plan = prepare({"env": "CartPole-v1", "results_dir": str(tmp_path), "actor_inference": "server",
                        "device": "cpu", "worker_count": workers, **options})
        return inference_setup(plan.cfg, "cpu", workers)
    grown = setup(16)
    assert (grown.servers, grown.most, grown.grow_at) == (1, 4, GROW_AT)
    assert setup(3).most == 3 and setup(1).most == 1
    fixed = setup(16, inference_servers=2)
    assert (fixed.servers, fixed.most, fixed.grow_at) == (2, 2, None)
    plan = prepare({"env": "CartPole-v1", "results_dir": str(tmp_path), "actor_inference": "server", "device": "cpu",
                    "worker_count": 2})
    assert plan.cfg.parallel.inference_servers is None          # saved unset: a resumed run measures again


@pytest.mark.parametrize("records, on_gpu, on_cpu", [("auto", True, False), ("on", True, True), ("off", False, False)])
def test_servers_record_steps_by_default_where_they_share_the_learner_s_gpu(records, on_gpu, on_cpu):
    """--inference_records: auto records the steps in the server exactly on a GPU (each
    frame then crosses to it once); a value names what runs, on either device."""
    from herd.config import Config
    from herd.training import inference_setup
    cfg = Config()
    cfg.parallel.inference_records = records
    assert inference_setup(cfg, "cuda", 4).records is on_gpu
    assert inference_setup(cfg, "cpu", 4).records is on_cpu


@pytest.mark.parametrize("graphs, captured, measured", [(None, True, True), (True, True, False), (False, False, False)])
def test_inference_graphs_are_measured_per_size_by_default_on_a_gpu(graphs, captured, measured):
    """--inference_cuda_graphs unset: captured on a GPU and kept where replay measured
    faster (herd/inference/device.py GraphedPolicy); True: every size; never on a CPU."""
    from herd.config import Config
    from herd.training import inference_setup
    cfg = Config()
    cfg.parallel.inference_cuda_graphs = graphs
    options = inference_setup(cfg, "cuda", 4).options
    assert (options.cuda_graphs, options.graphs_measured) == (captured, measured)
    assert inference_setup(cfg, "cpu", 4).options.cuda_graphs is False
