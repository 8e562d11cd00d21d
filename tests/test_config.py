"""Config parsing, precedence, profiles and validation (no processes started)."""
import json
import os
from types import SimpleNamespace

import pytest

from herd.cli import parse_herd_args, parse_seed_args
from herd_testing import kind_of
from herd.config import (ConfigError, Config, apply_profile, batch_shares, parse_eval_interval, parse_replay_parameters,
                         resolve)


MIXED = ('[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, '
         '{"type": "standard", "capacity": 1000, "sample_ratio": 0.5}]')      # the seed's replays


def test_seed_flags_parse_verbatim():
    argv = ["--op_mode=train", "--env=PongNoFrameskip-v4", "--environment_max_steps=1000000", "--batch_size=10",
            "--r_f_steps=10", "--worker_count=2", "--envs_per_worker=2",
            '--replay_parameters=[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, '
            '{"type": "standard", "capacity": 1000, "sample_ratio": 0.5}]', "--c-const=0.9", "--use_kl_mask=true"]
    cfg = resolve(parse_seed_args(argv), env_kind=kind_of)
    cfg.validate()
    assert cfg.train.batch_size == 10 and cfg.parallel.envs_per_worker == 2
    assert cfg.loss.c_const == 0.9 and cfg.loss.use_kl_mask is True
    assert [s.type for s in cfg.replays] == ["queue", "standard"]
    # Where not given: the seed's RMSprop and reward clipping, herd's machine profile's lr.
    assert cfg.train.optimizer == "rmsprop" and cfg.train.lr == 0.0006 and cfg.env.clip_rewards is True


def test_atari_defaults_depend_on_the_learner_device_and_say_what_was_picked():
    from herd.config import machine_picks
    cpu = resolve({"env": "PongNoFrameskip-v4", "device": "cpu"}, env_kind=kind_of)
    gpu = resolve({"env": "PongNoFrameskip-v4", "device": "cuda"}, env_kind=kind_of)
    # A CPU learner runs IMPALA (the fewest minutes to 20 there), a GPU learner APPO (the
    # fewest frames: herd/profiles.py MACHINE_ALGORITHMS); both in batches of 8 trajectories.
    assert (cpu.general.algorithm, gpu.general.algorithm) == ("impala", "appo")
    assert (cpu.train.batch_size, gpu.train.batch_size) == (8, 8)
    assert (cpu.train.r_f_steps, cpu.train.lr, cpu.parallel.envs_per_worker) == (20, 0.0006, 8)
    assert (gpu.train.r_f_steps, gpu.train.lr, gpu.parallel.envs_per_worker, gpu.loss.clip_param) == (
        128, 0.00025, 4, 0.3)
    for cfg in (cpu, gpu):
        assert [s.type for s in cfg.replays] == ["queue"]
    # A CPU learner compiles (measured faster there); a GPU learner captures the update as
    # one CUDA graph instead (compiling measured slower than eager on an H100), on one thread.
    assert (cpu.train.learner_compile, cpu.train.learner_capture) == (True, False)
    assert (gpu.train.learner_compile, gpu.train.learner_capture, gpu.train.learner_thread_count) == (False, True, 1)
    # The learning rate decays over the whole run (GAME_PROFILES): IMPALA's Pong is 2M steps
    # in batches of 8 x 20, APPO's 1.25M (5M frames) in stored batches of 8 x 128.
    assert cpu.train.lr_scheduler_steps == -(-2_000_000 // (8 * 20))
    assert (gpu.train.environment_max_steps, gpu.train.lr_scheduler_steps) == (1_250_000, -(-1_250_000 // (8 * 128)))
    picks = machine_picks(cpu, "atari", given={"env", "device", "lr"})
    assert picks["hardware"]["device"] == "cpu" and picks["hardware"]["cpu_cores"] >= 1
    assert picks["options"]["batch_size"] == 8 and "lr" not in picks["options"]
    assert {"algorithm", "worker_count", "learner_precision", "learner_thread_count",
            "learner_compile"} <= set(picks["options"])
    assert machine_picks(gpu, "atari", given={"env", "device"})["options"]["algorithm"] == "appo"
    assert "algorithm" not in machine_picks(gpu, "atari", given={"env", "device", "algorithm"})["options"]
    # CartPole's precision and threads are its profile's, not the hardware's.
    assert set(machine_picks(resolve({"env": "CartPole-v1"}, env_kind=kind_of), "vector", {"env"})["options"]) == {
        "worker_count"}
    # A short run is not worth compiling; vector tasks, MinAtar and Ape-X keep their own defaults.
    assert resolve({"env": "PongNoFrameskip-v4", "environment_max_steps": "1000"},
                   env_kind=kind_of).train.learner_compile is False
    cartpole = resolve({"env": "CartPole-v1", "device": "cpu"}, env_kind=kind_of)
    assert (cartpole.train.batch_size, cartpole.train.learner_compile) == (8, False)
    apex = resolve({"env": "PongNoFrameskip-v4", "algorithm": "apex"}, env_kind=kind_of)
    assert (apex.train.batch_size, apex.train.learner_compile, apex.replays[0].type) == (128, False, "prioritized")


def test_actors_served_on_a_gpu_are_double_buffered_by_default():
    """Unset, --actor_double_buffer is on where a server on a GPU acts for the actors and
    their games split in halves that step together; synchronous sampling keeps its one slot
    (the halves then end each rollout together: herd/actors/double_buffer.py)."""
    def double(**options):
        cfg = resolve({"env": "PongNoFrameskip-v4", **options}, env_kind=kind_of)
        if options["device"] == "cpu":
            cfg.validate()                 # (a CUDA device is refused on this machine)
        return cfg.parallel.actor_double_buffer
    gpu = resolve({"env": "PongNoFrameskip-v4", "device": "cuda"}, env_kind=kind_of)
    assert gpu.parallel.actor_double_buffer is True
    assert (gpu.parallel.synchronous_sampling, gpu.parallel.shared_queue_size) == (True, 1)   # APPO's Atari default
    assert double(device="cuda", algorithm="impala") is True
    assert double(device="cpu") is False and double(device="cpu", actor_inference="server") is False
    assert double(device="cuda", actor_inference="local") is False
    assert double(device="cuda", actor_inference="in_actor") is True          # the server's path in each actor
    assert double(device="cuda", envs_per_worker="1") is False
    assert double(device="cuda", algorithm="impala", env_backend="ale_vector", env_batch_size="4") is False
    assert double(device="cuda", algorithm="apex") is False                    # its actors act themselves
    from herd.envs.registry import profile_kind
    from herd.plan import check_continuous
    continuous = resolve({"env": "InvertedPendulum-v5", "device": "cuda"}, env_kind=profile_kind)
    assert continuous.parallel.actor_double_buffer is False                   # its actors act themselves
    asked = resolve({"env": "InvertedPendulum-v5", "device": "cuda", "actor_double_buffer": "True"},
                    env_kind=profile_kind)
    with pytest.raises(ConfigError, match="continuous-action runs act with their own models"):
        check_continuous(asked, SimpleNamespace(action_kind="continuous"), None)
    assert double(device="cuda", actor_double_buffer="False") is False         # the command line wins
    assert double(device="cpu", actor_inference="server", actor_double_buffer="True") is True
    from herd.config import machine_picks
    assert machine_picks(gpu, "atari", given={"env", "device"})["options"]["actor_double_buffer"] is True


def test_a_gpu_atari_run_is_appo_unless_it_names_what_only_impala_has():
    """--algorithm unset: APPO for Atari on a GPU learner; a replay mix, LASER's mask, CLEAR's
    cloning terms or the entropy decay keep it IMPALA (APPO refuses them), as does a CPU
    learner or another kind of environment; a given algorithm is kept."""
    def algorithm(**options):
        cfg = resolve({"env": "PongNoFrameskip-v4", "device": "cuda", **options}, env_kind=kind_of)
        return cfg.general.algorithm
    mix = ('[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, '
           '{"type": "standard", "capacity": 1000, "sample_ratio": 0.5}]')
    assert algorithm() == algorithm(env="BreakoutNoFrameskip-v4") == "appo"
    assert algorithm(replay_parameters='[{"type": "queue", "capacity": 2, "sample_ratio": 1}]') == "appo"
    for impala_only in ({"replay_parameters": mix}, {"use_kl_mask": "true"}, {"use_policy_cloning_loss": "true"},
                        {"use_value_cloning_loss": "true"}, {"entropy_decay": "true"}):
        assert algorithm(**impala_only) == "impala", impala_only
    assert algorithm(device="cpu") == algorithm(env="CartPole-v1") == algorithm(env="MinAtar/Breakout-v1") == "impala"
    assert algorithm(algorithm="impact") == "impact" and algorithm(algorithm="impala") == "impala"


def test_the_entropy_bonus_per_kind_and_algorithm_and_the_command_line_wins():
    """Atari's IMPALA and IMPACT take a tenth of the seed's entropy bonus (their advantages
    are not normalised, herd/profiles.py says why); APPO keeps PPO's 0.01 everywhere, as do
    all other kinds; a given value is kept."""
    def entropy(**options):
        return resolve(options, env_kind=kind_of).loss.entropy_loss_weight
    assert entropy(env="BreakoutNoFrameskip-v4") == entropy(env="PongNoFrameskip-v4", algorithm="impact") == 0.001
    assert entropy(env="BreakoutNoFrameskip-v4", device="cuda", algorithm="impala") == 0.001
    assert entropy(env="PongNoFrameskip-v4") == entropy(env="PongNoFrameskip-v4", device="cuda",
                                                        algorithm="impala") == 0.0003
    assert entropy(env="PongNoFrameskip-v4", device="cuda") == 0.01           # APPO's
    assert entropy(env="PongNoFrameskip-v4", algorithm="appo") == 0.01
    for env in ("CartPole-v1", "MinAtar/Breakout-v1", "Pendulum-v1"):
        assert entropy(env=env) == 0.01, env
    assert entropy(env="PongNoFrameskip-v4", entropy_loss_weight="0.01") == 0.01
    assert entropy(env="CartPole-v1", entropy_loss_weight="0") == 0.0


def test_a_synchronous_learner_takes_every_core_and_an_asynchronous_bf16_one_half():
    """With synchronous sampling the actors wait while the learner trains, so a CPU learner
    takes a thread per core (APPO on Atari: 1.35x faster stored batches on 2 cores,
    docs/appo.md); asynchronous, a bf16 learner leaves half the cores to the actors."""
    cores = os.cpu_count() or 1
    appo = resolve({"env": "PongNoFrameskip-v4", "algorithm": "appo", "device": "cpu"}, env_kind=kind_of)
    assert appo.parallel.synchronous_sampling and appo.train.learner_thread_count == cores
    impala = resolve({"env": "PongNoFrameskip-v4", "device": "cpu", "learner_precision": "bf16"}, env_kind=kind_of)
    assert not impala.parallel.synchronous_sampling and impala.train.learner_thread_count == max(1, cores // 2)
    fp32 = resolve({"env": "PongNoFrameskip-v4", "device": "cpu", "learner_precision": "fp32"}, env_kind=kind_of)
    assert fp32.train.learner_thread_count == cores
    given = resolve({"env": "PongNoFrameskip-v4", "algorithm": "appo", "learner_thread_count": "1"}, env_kind=kind_of)
    assert given.train.learner_thread_count == 1


def test_pongs_impala_run_is_8m_frames_with_the_rate_decayed_over_it():
    """IMPALA on Pong runs 2M agent steps (8M frames), its learning rate decaying to its
    end over them (herd/profiles.py GAME_PROFILES says why); every other game, algorithm
    and a given length keep the Atari run of 15M steps, whose rate decays over it."""
    def length(**options):
        cfg = resolve(options, env_kind=kind_of)
        return cfg.train.environment_max_steps, cfg.train.lr_scheduler_steps
    assert length(env="PongNoFrameskip-v4") == (2_000_000, 12_500)          # batches of 8 x 20 steps
    assert length(env="PongNoFrameskip-v4", device="cuda", algorithm="impala") == (2_000_000, 12_500)
    # APPO's Pong: 5M frames, the schedule of its measured seeds (stored batches of 8 x 128).
    assert length(env="PongNoFrameskip-v4", algorithm="appo") == (1_250_000, 1_221)
    assert length(env="BreakoutNoFrameskip-v4") == (15_000_000, 93_750)
    assert length(env="PongNoFrameskip-v4", algorithm="impact")[0] == 15_000_000
    assert length(env="PongNoFrameskip-v4", environment_max_steps="4000000") == (4_000_000, 25_000)


def test_herd_subcommand_and_dashed_flags():
    command, options, _ = parse_herd_args(["train", "--env", "CartPole-v1", "--batch-size", "8"])
    assert command == "train" and options == {"env": "CartPole-v1", "batch_size": "8", "op_mode": "train"}
    command, options, _ = parse_herd_args(["resume", "results/x", "--lr", "0.1"])
    assert options["op_mode"] == "train_w_load" and options["load_model_url"] == "results/x"


def test_vector_profile_differs_from_atari_and_command_line_wins():
    cartpole = resolve({"env": "CartPole-v1"}, env_kind=kind_of)
    pong = resolve({"env": "PongNoFrameskip-v4"}, env_kind=kind_of)
    assert cartpole.train.optimizer == "adam" and pong.train.optimizer == "rmsprop"
    assert cartpole.env.clip_rewards is False
    assert resolve({"env": "CartPole-v1", "optimizer": "rmsprop"}, env_kind=kind_of).train.optimizer == "rmsprop"
    # herd's losses are batch means: Atari's RMSprop epsilon is scaled down to match (README).
    assert pong.train.rmsprop_eps == 1e-5 and cartpole.train.rmsprop_eps == 0.01
    assert resolve({"env": "PongNoFrameskip-v4", "rmsprop_eps": "0.01"}, env_kind=kind_of).train.rmsprop_eps == 0.01
    # CLEAR cloning defaults on exactly when an off-policy replay is used.
    mixed = resolve({"env": "PongNoFrameskip-v4", "replay_parameters": MIXED}, env_kind=kind_of)
    assert cartpole.loss.use_policy_cloning_loss is False and pong.loss.use_policy_cloning_loss is False
    assert mixed.loss.use_policy_cloning_loss is True and mixed.loss.use_value_cloning_loss is True


def test_precedence_command_line_over_overrides_over_saved_over_defaults():
    saved = {"lr": 0.1, "gamma": 0.5, "batch_size": 4, "env": "CartPole-v1"}
    overrides = {"lr": 0.2, "gamma": 0.6}
    cfg = resolve({"lr": "0.3"}, overrides, saved, env_kind=kind_of)
    assert cfg.train.lr == 0.3 and cfg.train.gamma == 0.6 and cfg.train.batch_size == 4
    assert cfg.train.r_f_steps == 16  # vector profile default
    assert cfg.general.save_model_period == Config().general.save_model_period


def test_flat_round_trip_through_json():
    cfg = resolve({"env": "PongNoFrameskip-v4", "frame_scale_resolution": "64,72"}, env_kind=kind_of)
    again = Config.from_flat(json.loads(json.dumps(cfg.to_flat())))
    assert again == cfg and again.env.frame_scale_resolution == (64, 72)


@pytest.mark.parametrize("text, words", [
    ("[{'type': 'queue'}]", "not valid JSON"),
    ('{"type": "queue", "capacity": 1, "sample_ratio": 1}', "non-empty JSON list"),
    ('[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}]', "sum to 1"),
    ('[{"type": "queue", "capacity": 1, "sample_ratio": 0.7}, {"type": "standard", "capacity": 9, "sample_ratio": 0.7}]', "sum to 1"),
    ('[{"type": "fancy", "capacity": 1, "sample_ratio": 1}]', "unknown replay type 'fancy'"),
    ('[{"type": "queue", "capacity": 0, "sample_ratio": 1}]', "capacity must be an integer >= 1"),
    ('[{"type": "queue", "sample_ratio": 1}]', "lacks capacity"),
    ('[{"type": "standard", "capacity": 5, "sample_ratio": 1, "p": 2}]', "unknown key"),
    ('[{"type": "custom", "capacity": 5, "sample_ratio": 1}]', "needs a dist_function"),
    ('[{"type": "custom", "capacity": 5, "sample_ratio": 1, "dist_function": "l2"}]', "not one of"),
    ('[{"type": "custom", "capacity": 5, "sample_ratio": 1, "dist_function": "ln_norm", "lambda_batch_multiplier": 0}]', "lambda_batch_multiplier"),
])
def test_bad_replay_parameters_give_one_clear_line(text, words):
    with pytest.raises(ConfigError) as err:
        parse_replay_parameters(text)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_batch_shares_sum_to_batch_size():
    specs = parse_replay_parameters('[{"type": "queue", "capacity": 1, "sample_ratio": 0.3},'
                                    '{"type": "standard", "capacity": 9, "sample_ratio": 0.7}]')
    assert batch_shares(specs, 10) == [3, 7]
    assert sum(batch_shares(specs, 7)) == 7


@pytest.mark.parametrize("options, words", [
    ({"batch_size": "0"}, "--batch_size must be >= 1"),
    ({"worker_count": "-1"}, "--worker_count must be >= 1"),
    ({"gamma": "1.5"}, "--gamma"),
    ({"rmsprop_eps": "-1"}, "--rmsprop_eps must be > 0"),
    ({"rmsprop_eps": "0"}, "--rmsprop_eps must be > 0"),
    ({"batch_size": "1", "replay_parameters": MIXED}, "too small"),
    ({"env_batch_size": "2", "shared_queue_size": "1"}, "needs at least 2 trajectory slots"),
    ({"op_mode": "test"}, "needs --load_model_url"),
    ({"frame_scale_resolution": "84"}, "frame_scale_resolution"),
])
def test_impossible_values_are_refused(options, words):
    cfg = resolve({"env": "PongNoFrameskip-v4", **options}, env_kind=kind_of)
    with pytest.raises(ConfigError) as err:
        cfg.validate()
    assert words in str(err.value)


@pytest.mark.parametrize("options, words", [
    ({"batch_size": "ten"}, "not a valid int"),
    ({"use_kl_mask": "maybe"}, "not a boolean"),
    ({"optimizer": "sgd"}, "not one of"),
    ({"batch_size": "2.5"}, "not a valid int"),
])
def test_bad_types_are_refused(options, words):
    with pytest.raises(ConfigError) as err:
        resolve(options, env_kind=kind_of)
    assert words in str(err.value)


def test_unknown_flag_is_one_line_error():
    with pytest.raises(ConfigError) as err:
        parse_herd_args(["train", "--no_such_flag=1"])
    assert "no_such_flag" in str(err.value)


def test_lr_decay_horizon_defaults_to_the_whole_vector_run():
    cfg = apply_profile(Config.from_flat({"env": "CartPole-v1", "environment_max_steps": 51200}), "vector")
    # queue-only: 8 fresh trajectories x 16 steps per update
    assert cfg.train.lr_scheduler_steps == 400


def test_help_shows_the_default_each_kind_of_environment_gets():
    from herd.cli import build_seed_parser
    text = " ".join(build_seed_parser().format_help().split())
    assert ("trajectories per learner batch [default: vector tasks 8; continuous control 8; MinAtar 16; "
            "Atari with a CPU learner 8; Atari with a GPU learner (--algorithm=impala) 8] [--algorithm=appo: "
            "Atari 8; MinAtar 32; vector tasks 32; continuous control 32] [--algorithm=apex: Atari 128; vector "
            "tasks 128]" in text)
    assert ("rollout fragment length, the unroll length T [default: vector tasks 16; continuous control 16; "
            "MinAtar 20; Atari with a CPU learner 20; Atari with a GPU learner (--algorithm=impala) 20]" in text)
    assert "[default: Atari with a GPU learner appo; otherwise impala]" in text


def test_continuous_tasks_get_their_own_profile():
    from herd.envs.registry import profile_kind
    cfg = resolve({"env": "Pendulum-v1"}, env_kind=profile_kind)
    assert (cfg.continuous.normalize_observations, cfg.continuous.reward_scale, cfg.train.lr) == (True, 0.1, 0.001)
    cartpole = resolve({"env": "CartPole-v1"}, env_kind=profile_kind)
    assert (cartpole.continuous.normalize_observations, cartpole.continuous.reward_scale) == (False, 0.1)
    apex = resolve({"env": "CartPole-v1", "algorithm": "apex"}, env_kind=profile_kind)
    assert apex.continuous.reward_scale == 1.0           # Ape-X's defaults were measured with raw rewards


def test_the_seed_shapes_parse_in_its_own_spelling():
    cfg = resolve({"env": "PongNoFrameskip-v4", "observation_shape": "(4, 84, 84)", "actions_count": "6"})
    assert cfg.env.observation_shape == (4, 84, 84) and cfg.env.actions_count == 6


def test_verbose_learner_out_int_is_used_as_given():
    for kind in ("atari", "vector"):
        cfg = apply_profile(resolve({"env": "CartPole-v1", "verbose_learner_out_int": "500"}), kind)
        assert cfg.stats.verbose_learner_out_int == 500


def test_apex_has_its_own_defaults_per_kind_and_the_command_line_still_wins():
    cartpole = resolve({"env": "CartPole-v1", "algorithm": "apex"}, env_kind=kind_of)
    pong = resolve({"env": "PongNoFrameskip-v4", "algorithm": "apex"}, env_kind=kind_of)
    assert [spec.type for spec in cartpole.replays] == [spec.type for spec in pong.replays] == ["prioritized"]
    assert (cartpole.train.batch_size, cartpole.train.replay_ratio, cartpole.train.target_update_period) == (128, 8, 250)
    assert (pong.train.lr, pong.train.optimizer, pong.train.target_update_period) == (0.0001, "adam", 2500)
    assert pong.env.clip_rewards and pong.replay.use_replay_compression       # the Atari profile fills the rest
    # The LR decays over the whole run: batch_size / replay_ratio environment steps per update.
    assert cartpole.train.lr_scheduler_steps == -(-170_000 // (128 // 8))
    assert resolve({"env": "CartPole-v1", "algorithm": "apex", "batch_size": "32"},
                   env_kind=kind_of).train.batch_size == 32
    impala = resolve({"env": "CartPole-v1"}, env_kind=kind_of)
    assert impala.train.replay_ratio is None and impala.train.target_update_period is None
    cartpole.validate()
    pong.validate()


def test_interval_in_updates_or_seconds():
    assert parse_eval_interval("500") == (500, None) and parse_eval_interval("60s") == (None, 60.0)
    for bad in ("0", "-5", "1.5", "fast", "infs", "nans"):
        with pytest.raises(ConfigError, match="--eval_interval"):
            parse_eval_interval(bad)


def test_the_lstm_core_is_as_wide_as_the_mlp_on_vector_tasks():
    """Catches the 256-unit default on vector tasks: the policy head then read 4x
    the MLP's inputs and CartPole's policy collapsed to one action in some seeds. Frames
    keep 256; an explicit --lstm_size wins."""
    vector = resolve({"env": "CartPole-v1", "use_lstm": True}, env_kind=kind_of)
    frames = resolve({"env": "PongNoFrameskip-v4", "use_lstm": True}, env_kind=kind_of)
    given = resolve({"env": "CartPole-v1", "use_lstm": True, "lstm_size": 32}, env_kind=kind_of)
    assert vector.network.lstm_size == vector.network.hidden_sizes[-1] == 64
    assert frames.network.lstm_size == 256 and given.network.lstm_size == 32
