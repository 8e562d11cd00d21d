"""What a continuous-control run is checked for before anything starts: each refusal is
one line (exit 2 from the CLI), and a valid plan has the Gaussian policy's shapes."""
import pytest

from herd.config import ConfigError
from herd.plan import plays_greedily, prepare


def refusal(tmp_path, **options) -> str:
    with pytest.raises(ConfigError) as caught:
        prepare({"results_dir": str(tmp_path), **options})
    message = str(caught.value)
    assert message and "\n" not in message
    return message


def test_a_continuous_plan(tmp_path):
    plan = prepare({"env": "Hopper-v5", "results_dir": str(tmp_path)})
    assert plan.env_spec.action_kind == "continuous" and plan.env_spec.num_actions == 3
    assert plan.model_kwargs["action_distribution"] == "gaussian" and plan.model_kwargs["normalize_observations"]
    fields = plan.layout.fields()
    T = plan.cfg.train.r_f_steps
    assert fields["action"][0] == (T, 3) and str(fields["action"][1]) == "float32"
    assert fields["behaviour_mean"][0] == fields["behaviour_log_std"][0] == (T, 3) and "behaviour_logits" not in fields


def test_discrete_plans_keep_their_network_arguments(tmp_path):
    plan = prepare({"env": "CartPole-v1", "results_dir": str(tmp_path)})
    assert not {"action_distribution", "normalize_observations", "initial_log_std"} & set(plan.model_kwargs)
    assert str(plan.layout.fields()["action"][1]) == "int64"


def test_several_learners_leave_normalisation_off_unless_asked(tmp_path):
    """Each learner would gather statistics of its own: with --learner_count=2 the default
    is off (asked for, it is refused, below)."""
    for env in ("Pendulum-v1", "PongNoFrameskip-v4"):
        options = {"env": env, "learner_count": "2", "worker_count": "2", "results_dir": str(tmp_path)}
        if env.startswith("Pong"):
            options["algorithm"] = "appo"
        assert not prepare(options).cfg.continuous.normalize_observations
    assert prepare({"env": "Pendulum-v1", "results_dir": str(tmp_path)}).cfg.continuous.normalize_observations


def test_atari_frames_are_normalised_per_pixel_by_default_but_for_ape_x(tmp_path):
    for algorithm in ("impala", "impact", "appo"):
        plan = prepare({"env": "PongNoFrameskip-v4", "algorithm": algorithm, "results_dir": str(tmp_path)})
        assert plan.model_kwargs["normalize_observations"] is True and "action_distribution" not in plan.model_kwargs
    for options in ({"algorithm": "apex"}, {"normalize_observations": "False"}, {"network": "minatar_cnn"}):
        plan = prepare({"env": "PongNoFrameskip-v4", "results_dir": str(tmp_path), **options})
        assert "normalize_observations" not in plan.model_kwargs, options


@pytest.mark.parametrize("options, words", [
    ({"env": "Pendulum-v1", "algorithm": "apex"}, ["--algorithm=apex needs discrete actions", "--algorithm=impala"]),
    ({"env": "Pendulum-v1", "actor_inference": "server"}, ["--actor_inference=server", "local"]),
    ({"env": "Pendulum-v1", "actor_inference": "in_actor"}, ["--actor_inference=in_actor", "local"]),
    ({"env": "MinAtar/Breakout-v1", "normalize_observations": "True"}, ["network minatar_cnn has no observation "
                                                                        "normaliser", "nature_cnn or resnet"]),
    ({"env": "CartPole-v1", "algorithm": "apex", "normalize_observations": "True"}, ["built for --algorithm=impala"]),
    ({"env": "Pendulum-v1", "learner_count": "2", "worker_count": "2", "normalize_observations": "True"},
     ["--learner_count=2", "one learner"]),
    ({"env": "Pendulum-v1", "reward_scale": "0"}, ["--reward_scale must be a positive number"]),
    ({"env": "PongNoFrameskip-v4", "reward_scale": "0.5"}, ["--reward_scale applies to vector tasks"]),
    ({"env": "Pendulum-v1", "use_lstm": "True", "replay_parameters":
      '[{"type": "queue", "capacity": 1, "sample_ratio": 0.5}, {"type": "custom", "capacity": 50, "sample_ratio": 0.5, '
      '"dist_function": "kl_div", "sample_strategy": "elite_sampling", "lambda_batch_multiplier": 2, '
      '"alfa_annealing_factor": 2.0}]'}, ["kl_div with --use_lstm and continuous actions", "ln_norm"]),
    ({"env": "Pendulum-v1", "initial_log_std": "3"}, ["--initial_log_std must be in [-5, 2]"]),
])
def test_what_continuous_runs_refuse_is_one_line(tmp_path, options, words):
    message = refusal(tmp_path, **options)
    for word in words:
        assert word in message, message


def test_what_counts_as_greedy_play_in_test_and_evaluation_games(tmp_path):
    """IMPALA: the argmax flag decides. Ape-X acts its own way: greedy at epsilon 0 (its
    default), not with exploration left, whatever the argmax flag says."""
    impala = prepare({"env": "CartPole-v1", "results_dir": str(tmp_path)})
    assert plays_greedily(impala, True) and not plays_greedily(impala, False)
    apex = prepare({"env": "CartPole-v1", "algorithm": "apex", "results_dir": str(tmp_path)})
    assert plays_greedily(apex, False)
    exploring = prepare({"env": "CartPole-v1", "algorithm": "apex", "apex_test_epsilon": 0.05,
                         "results_dir": str(tmp_path)})
    assert not plays_greedily(exploring, True)
