"""The contract every env from make_env keeps, on real gymnasium and ALE envs (classic
control, Atari, and the optional MuJoCo and Box2D families): observations as describe_env
promised, seeded determinism, and info["episode_score"] exactly at the real end of a game,
equal to the raw rewards of the whole game. Continuous (Box) actions are seen as [-1, 1]^A."""
import gymnasium as gym
import numpy as np
import pytest

from herd.envs import describe_env, make_env
from herd.envs.atari import wrap_atari
from herd.envs.wrappers import env_action

# MuJoCo v5 and Box2D need herd's extras ('.[mujoco]', '.[box2d]'), MinAtar '.[minatar]': CI installs them.
CONTINUOUS_IDS = ["Pendulum-v1", "HalfCheetah-v5", "Hopper-v5", "LunarLanderContinuous-v3", "BipedalWalker-v3"]
ENV_IDS = ["CartPole-v1", "Acrobot-v1", "PongNoFrameskip-v4", "MinAtar/Breakout-v1", "MinAtar/Seaquest-v1", "LunarLander-v3",
           *CONTINUOUS_IDS]


def random_actions(spec, size, seed):
    """Uniform random actions: indices, or vectors in [-1.5, 1.5]^A (beyond the bounds too:
    the env clips them)."""
    rng = np.random.default_rng(seed)
    if spec.action_kind == "continuous":
        return rng.uniform(-1.5, 1.5, size=(size, spec.num_actions)).astype(np.float32)
    return rng.integers(spec.num_actions, size=size)


def play(env, actions, reset_on_end=True):
    """Steps `actions`; -> observations [T+1, ...], rewards, terminated, truncated, infos."""
    obs, _ = env.reset()
    trace = {"obs": [obs], "reward": [], "terminated": [], "truncated": [], "info": []}
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(env_action(action))
        for key, value in zip(("reward", "terminated", "truncated", "info"), (reward, terminated, truncated, info)):
            trace[key].append(value)
        if (terminated or truncated) and reset_on_end:
            obs, _ = env.reset()
        trace["obs"].append(obs)
    trace["obs"] = np.stack(trace["obs"])
    return trace


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_observations_match_describe_env(env_id):
    spec = describe_env(env_id)
    env = make_env(env_id, seed=0)
    if spec.action_kind == "continuous":
        assert env.action_space == gym.spaces.Box(-1.0, 1.0, (spec.num_actions,), np.float32)
    else:
        assert isinstance(env.action_space, gym.spaces.Discrete) and env.action_space.n == spec.num_actions
    assert (spec.action_kind == "continuous") == (env_id in CONTINUOUS_IDS)
    assert env.observation_space.shape == spec.obs_shape and env.observation_space.dtype == spec.obs_dtype
    trace = play(env, random_actions(spec, 50, 0))
    assert trace["obs"].shape == (51, *spec.obs_shape) and trace["obs"].dtype == spec.obs_dtype
    assert all(env.observation_space.contains(o) for o in trace["obs"])
    assert all(isinstance(r, float) for r in trace["reward"])
    env.close()


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_same_seed_same_trajectory(env_id):
    actions = random_actions(describe_env(env_id), 300, 1)       # CartPole resets several times here
    first, second = (play(make_env(env_id, seed=7), actions) for _ in range(2))
    np.testing.assert_array_equal(first["obs"], second["obs"])
    assert first["reward"] == second["reward"] and first["terminated"] == second["terminated"]
    env_a, env_b = make_env(env_id, seed=3), make_env(env_id, seed=3)
    np.testing.assert_array_equal([env_a.action_space.sample() for _ in range(20)],
                                  [env_b.action_space.sample() for _ in range(20)])


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1", "Pendulum-v1", "Hopper-v5", "BipedalWalker-v3"])
def test_different_seeds_start_differently(env_id):
    assert not np.array_equal(make_env(env_id, seed=1).reset()[0], make_env(env_id, seed=2).reset()[0])


def check_scores(trace):
    """episode_score on exactly the steps that end a game, equal to that game's raw rewards."""
    start, games = 0, 0
    for t, info in enumerate(trace["info"]):
        ended = trace["terminated"][t] or trace["truncated"][t]
        assert ("episode_score" in info) == ended and ("episode_length" in info) == ended
        if ended:
            assert info["episode_score"] == pytest.approx(sum(trace["reward"][start:t + 1]))
            assert info["episode_length"] == t + 1 - start
            assert isinstance(info["episode_score"], float) and isinstance(info["episode_length"], int)
            start, games = t + 1, games + 1
    return games


@pytest.mark.parametrize("env_id, steps", [("CartPole-v1", 300), ("Acrobot-v1", 1100), ("MinAtar/Breakout-v1", 300),
                                           ("MinAtar/Asterix-v1", 1500), ("Pendulum-v1", 450), ("Hopper-v5", 300),
                                           ("LunarLanderContinuous-v3", 800)])
def test_vector_episode_score_at_every_real_end(env_id, steps):
    actions = random_actions(describe_env(env_id), steps, 0)
    trace = play(make_env(env_id, seed=0, clip_rewards=False), actions)
    assert check_scores(trace) >= 2


def test_continuous_actions_are_rescaled_to_the_bounds_and_clipped():
    """Pendulum's torque is in [-2, 2]: the agent's 1.0 is 2.0, and 3.0 is clipped to it,
    the stored (unclipped) action being the policy's own sample (herd.ops.distributions)."""
    raw = gym.make("Pendulum-v1")
    raw.reset(seed=4)
    expected = [raw.step(np.array([torque], np.float32))[0] for torque in (2.0, -1.0, 2.0, -2.0)]
    env = make_env("Pendulum-v1", seed=4)
    env.reset()
    got = [env.step(np.array([a], np.float32))[0] for a in (1.0, -0.5, 3.0, -7.0)]
    np.testing.assert_allclose(np.stack(got), np.stack(expected), rtol=1e-6)


def test_reward_scale_scales_what_the_agent_sees_not_the_score():
    env = make_env("Pendulum-v1", seed=0, reward_scale=0.1, max_episode_steps=5, clip_rewards=False)
    trace = play(env, np.zeros((5, 1), np.float32), reset_on_end=False)
    raw = play(make_env("Pendulum-v1", seed=0, max_episode_steps=5, clip_rewards=False), np.zeros((5, 1), np.float32),
               reset_on_end=False)
    np.testing.assert_allclose(trace["reward"], 0.1 * np.array(raw["reward"]), rtol=1e-6)
    assert trace["info"][-1]["episode_score"] == pytest.approx(sum(raw["reward"]))


def test_vector_score_is_raw_when_rewards_are_clipped():
    env = make_env("CartPole-v1", seed=0, reward_clipping_method="soft_asymmetric", max_episode_steps=30)
    trace = play(env, [0, 1] * 15)
    assert trace["reward"][0] == pytest.approx(5 * np.tanh(0.2))
    assert trace["info"][-1]["episode_score"] == 30.0


def test_cartpole_time_limit_truncates():
    env = make_env("CartPole-v1", seed=0, max_episode_steps=20)
    trace = play(env, [0, 1] * 10, reset_on_end=False)           # alternating keeps the pole up
    assert trace["terminated"] == [False] * 20
    assert trace["truncated"] == [False] * 19 + [True]
    assert trace["info"][-1] == {"episode_score": 20.0, "episode_length": 20}


def test_pong_whole_game_score():
    env = make_env("PongNoFrameskip-v4", seed=0, clip_rewards=False)
    trace = play(env, np.random.default_rng(0).integers(6, size=4000), reset_on_end=False)
    end = trace["terminated"].index(True)                          # a random player loses quickly
    trace = {key: value[:end + 1] for key, value in trace.items()}
    assert check_scores(trace) == 1
    assert 21 in (trace["reward"].count(-1.0), trace["reward"].count(1.0))   # a game goes to 21 points
    assert trace["info"][-1]["episode_score"] <= -15                           # and a random player loses it


def test_pong_agent_time_limit_truncates_without_terminating():
    env = make_env("PongNoFrameskip-v4", seed=0, max_episode_steps=40, clip_rewards=False)
    trace = play(env, [0] * 45)
    assert trace["truncated"].index(True) == 39 and not any(trace["terminated"][:40])
    assert check_scores(trace) == 1
    assert env.unwrapped.ale.getEpisodeFrameNumber() < 60          # the game really restarted


class RawRewards(gym.Wrapper):
    """Records every raw-frame reward since the last real reset (the ground truth score)."""

    def reset(self, **kwargs):
        self.rewards = []
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.rewards.append(float(reward))
        return obs, reward, terminated, truncated, info


def test_breakout_episodic_life_scores_the_whole_game():
    spy = RawRewards(gym.make("BreakoutNoFrameskip-v4", obs_type="grayscale"))
    env = wrap_atari(spy, clip_rewards=True)
    env.reset(seed=5)
    rng = np.random.default_rng(5)
    life_ends, agent_steps, clipped = 0, 0, []
    while True:
        _, reward, terminated, truncated, info = env.step(int(rng.integers(4)))
        agent_steps += 1
        clipped.append(reward)
        if "episode_score" in info:
            break
        assert not truncated
        if terminated:
            life_ends += 1
            env.reset()
    assert life_ends == 4 and terminated                           # 5 lives: 4 life losses, then game over
    assert env.unwrapped.ale.lives() == 0
    assert info["episode_score"] == sum(spy.rewards) > 0           # all lives, raw, hidden steps too
    assert info["episode_length"] == agent_steps
    assert set(clipped) <= {0.0, 1.0}                             # the agent saw clipped rewards
