"""APPO's options (herd/algos/appo.py, herd/profiles.py): the defaults every kind of task
gets, what the summary says, and the combinations that make no sense refused in one line
before anything is allocated."""
from __future__ import annotations

import pytest

from herd.config import ConfigError, machine_picks, resolve
from herd.envs.registry import profile_kind


def config(**options):
    return resolve({"env": "CartPole-v1", **{k: str(v) for k, v in options.items()}}, env_kind=profile_kind)


def test_appo_defaults_are_ppos_and_other_algorithms_take_one_step_per_batch():
    appo = config(algorithm="appo")
    assert (appo.train.passes_per_batch, appo.train.minibatches_per_pass) == (4, 4)
    assert (appo.loss.vtrace_lambda, appo.loss.clip_param, appo.loss.normalize_advantages) == (0.95, 0.1, True)
    assert (appo.loss.value_clip, appo.loss.normalize_returns) == (0.0, False)
    assert appo.train.gradient_clip_by_norm_threshold == 0.5 and appo.train.optimizer == "adam"
    assert appo.train.target_update_period == 1
    impala = config()
    assert (impala.train.passes_per_batch, impala.train.minibatches_per_pass) == (1, 1)
    assert impala.loss.vtrace_lambda == 1.0 and impala.train.gradient_clip_by_norm_threshold == 40.0
    assert config(algorithm="impact").loss.clip_param == 0.4


def test_atari_appo_trains_a_stored_batch_of_1024_steps_in_16_steps_of_256():
    cfg = resolve({"env": "PongNoFrameskip-v4", "algorithm": "appo", "device": "cpu", "worker_count": "2"},
                  env_kind=profile_kind)
    t = cfg.train
    assert (t.batch_size * t.r_f_steps, t.passes_per_batch * t.minibatches_per_pass) == (1024, 16)
    assert t.batch_size * t.r_f_steps // t.minibatches_per_pass == 256
    assert t.lr == 0.00025


@pytest.mark.parametrize("workers, given, batch", [(2, {}, 8), (16, {}, 8), (3, {}, 8), (4, {"batch_size": "16"}, 16)])
def test_atari_appo_samples_synchronously_stored_batches_of_8_rollouts(workers, given, batch):
    """Sample Factory's Atari shape (herd/profiles.py): 128-step rollouts of 4 games per
    actor, sampled synchronously, a stored batch of 8 of them (PPO's 1,024 steps; one
    rollout of every game on 2 cores) whatever the actors' count unless --batch_size says
    otherwise, frames and returns normalised, the clip at 0.3 (measured on Pong)."""
    cfg = resolve({"env": "PongNoFrameskip-v4", "algorithm": "appo", "device": "cpu", "worker_count": str(workers),
                   **given}, env_kind=profile_kind)
    assert cfg.parallel.synchronous_sampling and cfg.parallel.shared_queue_size == 1
    assert (cfg.train.batch_size, cfg.train.r_f_steps, cfg.parallel.envs_per_worker) == (batch, 128, 4)
    assert cfg.continuous.normalize_observations and cfg.loss.normalize_returns and cfg.loss.clip_param == 0.3
    assert machine_picks(cfg, "atari", set())["options"]["synchronous_sampling"] is True   # the log says so


def test_synchronous_sampling_is_appos_on_atari_with_the_local_backend_only():
    ray = resolve({"env": "PongNoFrameskip-v4", "algorithm": "appo", "device": "cpu",
                   "multiprocessing_backend": "ray"}, env_kind=profile_kind)
    assert not ray.parallel.synchronous_sampling and ray.train.batch_size == 8     # the machine's, not 2 x 4
    impala = resolve({"env": "PongNoFrameskip-v4", "device": "cpu"}, env_kind=profile_kind)
    assert not impala.parallel.synchronous_sampling
    assert not config(algorithm="appo").parallel.synchronous_sampling                # CartPole
    asked = resolve({"env": "PongNoFrameskip-v4", "algorithm": "appo", "device": "cpu",
                     "synchronous_sampling": "False"}, env_kind=profile_kind)
    assert not asked.parallel.synchronous_sampling                                  # the command line wins


@pytest.mark.parametrize("workers, envs, batch, slots",
                         [(2, 8, 64, 5), (16, 8, 64, 1), (1, 4, 64, 17), (2, 8, 8, 1), (2, 8, 16, 2)])
def test_the_actors_slots_hold_about_one_batch_so_the_policy_lag_stays_small(workers, envs, batch, slots):
    """Sampling asynchronously, slots x workers x envs trajectories can wait for the
    learner: one batch and a round, or one round where a round holds more than a batch."""
    cfg = resolve({"env": "PongNoFrameskip-v4", "algorithm": "appo", "device": "cpu", "worker_count": str(workers),
                   "envs_per_worker": str(envs), "batch_size": str(batch), "synchronous_sampling": "False"},
                  env_kind=profile_kind)
    assert cfg.parallel.shared_queue_size == slots
    per_round = workers * envs
    assert slots * per_round >= batch and (slots == 1 or (slots - 1) * per_round < batch + per_round)


@pytest.mark.parametrize("option", ["env_batch_size=4", "actor_double_buffer=True"])
def test_actors_that_need_two_slots_get_two(option):
    name, value = option.split("=")
    cfg = resolve({"env": "PongNoFrameskip-v4", "algorithm": "appo", "device": "cpu", "worker_count": "2",
                   "envs_per_worker": "8", "batch_size": "8", "synchronous_sampling": "False", name: value},
                  env_kind=profile_kind)
    assert cfg.parallel.shared_queue_size == 2
    given = resolve({"env": "PongNoFrameskip-v4", "algorithm": "appo", "device": "cpu", "shared_queue_size": "9"},
                    env_kind=profile_kind)
    assert given.parallel.shared_queue_size == 9                   # the command line wins


@pytest.mark.parametrize("options, words", [
    (dict(passes_per_batch=2), "--passes_per_batch is APPO's"),
    (dict(minibatches_per_pass=2), "--minibatches_per_pass is APPO's"),
    (dict(normalize_advantages=True), "--normalize_advantages is APPO's"),
    (dict(value_clip=0.2), "--value_clip is APPO's"),
    (dict(normalize_returns=True), "--normalize_returns is APPO's"),
    (dict(algorithm="appo", batch_size=30), "do not split into --minibatches_per_pass=4 equal minibatches"),
    (dict(algorithm="appo", passes_per_batch=0), "--passes_per_batch must be from 1 to 1000"),
    (dict(algorithm="appo", minibatches_per_pass=5000), "--minibatches_per_pass must be from 1 to 1000"),
    (dict(algorithm="appo", vtrace_lambda=1.5), "--vtrace_lambda must be in [0, 1]"),
    (dict(vtrace_lambda=-0.1), "--vtrace_lambda must be in [0, 1]"),
    (dict(algorithm="appo", value_clip=-1), "--value_clip must be a number >= 0"),
    (dict(algorithm="appo", use_kl_mask=True), "no LASER mask or CLEAR cloning terms"),
    (dict(algorithm="appo", use_policy_cloning_loss=True), "no LASER mask or CLEAR cloning terms"),
    (dict(algorithm="appo", clip_param=1.0), "--clip_param must be in (0, 1)"),
    (dict(algorithm="appo", replay_parameters='[{"type": "circular", "capacity": 4, "sample_ratio": 1}]'),
     "appo does not train from a 'circular' replay"),
])
def test_options_that_make_no_sense_are_refused_in_one_line(options, words):
    with pytest.raises(ConfigError) as err:
        config(**options).validate()
    assert words in str(err.value) and "\n" not in str(err.value)


def test_the_summary_names_the_reuse():
    from herd.algos.appo import APPO
    described = APPO.describe_optimization(config(algorithm="appo"))
    assert (described["passes_per_batch"], described["minibatches_per_pass"], described["vtrace_lambda"]) == (4, 4, 0.95)
