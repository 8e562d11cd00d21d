"""The contract every env from make_env keeps, on real gymnasium and ALE envs: observations
as describe_env promised, seeded determinism, and info["episode_score"] exactly at the
real end of a game, equal to the raw rewards of the whole game."""
import gymnasium as gym
import numpy as np
import pytest

from herd.envs import describe_env, make_env
from herd.envs.atari import wrap_atari

ENV_IDS = ["CartPole-v1", "Acrobot-v1", "PongNoFrameskip-v4", "MinAtar/Breakout-v1", "MinAtar/Seaquest-v1"]


def play(env, actions, reset_on_end=True):
    """Steps `actions`; -> observations [T+1, ...], rewards, terminated, truncated, infos."""
    obs, _ = env.reset()
    trace = {"obs": [obs], "reward": [], "terminated": [], "truncated": [], "info": []}
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(int(action))
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
    assert isinstance(env.action_space, gym.spaces.Discrete) and env.action_space.n == spec.num_actions
    assert env.observation_space.shape == spec.obs_shape and env.observation_space.dtype == spec.obs_dtype
    trace = play(env, np.random.default_rng(0).integers(spec.num_actions, size=50))
    assert trace["obs"].shape == (51, *spec.obs_shape) and trace["obs"].dtype == spec.obs_dtype
    assert all(env.observation_space.contains(o) for o in trace["obs"])
    assert all(isinstance(r, float) for r in trace["reward"])
    env.close()


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_same_seed_same_trajectory(env_id):
    n = describe_env(env_id).num_actions
    actions = np.random.default_rng(1).integers(n, size=300)     # CartPole resets several times here
    first, second = (play(make_env(env_id, seed=7), actions) for _ in range(2))
    np.testing.assert_array_equal(first["obs"], second["obs"])
    assert first["reward"] == second["reward"] and first["terminated"] == second["terminated"]
    env_a, env_b = make_env(env_id, seed=3), make_env(env_id, seed=3)
    assert [env_a.action_space.sample() for _ in range(20)] == [env_b.action_space.sample() for _ in range(20)]


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1"])
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
                                           ("MinAtar/Asterix-v1", 1500)])
def test_vector_episode_score_at_every_real_end(env_id, steps):
    n = describe_env(env_id).num_actions
    trace = play(make_env(env_id, seed=0, clip_rewards=False), np.random.default_rng(0).integers(n, size=steps))
    assert check_scores(trace) >= 2


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
