"""The Atari preprocessing wrappers on small fake envs whose frames, rewards and lives are
known, so every number below is computed by hand."""
import gymnasium as gym
import numpy as np
import pytest

from herd.envs import REWARD_CLIPPING_METHODS, clip_reward
from herd.envs.atari import EpisodicLife, FireReset, FrameStack, MaxAndSkip, NoopReset, ResizeFrame
from herd.envs.score import GameScore


class FakeAle:
    def __init__(self):
        self.lives_left = 3

    def lives(self):
        return self.lives_left


class ScriptedEnv(gym.Env):
    """Frame t (t = 1, 2, ... since reset) is a [2, 2] uint8 image lit at pixel (0, 0) on odd
    t and at (0, 1) on even t, with value 10*t: the flicker that max-pooling undoes.
    Reward of step t is t. `end_at`: step that terminates; `truncate_at`: step that
    truncates; `lose_life_at`: steps that lose a life (the last life ends the game)."""

    def __init__(self, end_at=None, truncate_at=None, lose_life_at=()):
        self.observation_space = gym.spaces.Box(0, 255, (2, 2), np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self.end_at, self.truncate_at, self.lose_life_at = end_at, truncate_at, set(lose_life_at)
        self.ale = FakeAle()
        self.t = 0
        self.resets = 0
        self.actions = []

    def frame(self):
        image = np.zeros((2, 2), np.uint8)
        image[0, 0 if self.t % 2 else 1] = (10 * self.t) % 256
        return image

    def get_action_meanings(self):
        return ["NOOP", "FIRE", "UP"]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.ale.lives_left = 0, 3
        self.resets += 1
        return self.frame(), {}

    def step(self, action):
        self.t += 1
        self.actions.append(int(action))
        if self.t in self.lose_life_at:
            self.ale.lives_left -= 1
        terminated = self.t == self.end_at or self.ale.lives_left == 0
        return self.frame(), float(self.t), terminated, self.t == self.truncate_at, {"t": self.t}


def test_frame_skip_max_pools_the_last_two_frames_and_sums_rewards():
    env = MaxAndSkip(ScriptedEnv(), skip=4)
    env.reset()
    frame, reward, terminated, truncated, info = env.step(0)
    # frames 3 (30 at (0,0)) and 4 (40 at (0,1)): the max shows both
    np.testing.assert_array_equal(frame, [[30, 40], [0, 0]])
    assert reward == 1 + 2 + 3 + 4
    assert (terminated, truncated, info["t"]) == (False, False, 4)
    frame, reward, *_ = env.step(0)
    np.testing.assert_array_equal(frame, [[70, 80], [0, 0]])
    assert reward == 5 + 6 + 7 + 8


def test_frame_skip_stops_when_the_game_ends_and_keeps_the_score_info():
    env = MaxAndSkip(GameScore(ScriptedEnv(end_at=6)), skip=4)
    env.reset()
    env.step(0)
    frame, reward, terminated, truncated, info = env.step(0)
    assert env.unwrapped.t == 6                                   # stopped after 2 of 4 frames
    assert reward == 5 + 6 and terminated and not truncated
    np.testing.assert_array_equal(frame, [[50, 60], [0, 0]])
    assert info["episode_score"] == sum(range(1, 7)) and info["episode_length"] == 6


def test_frame_skip_carries_score_keys_from_an_inner_step():
    class LateInfo(gym.Wrapper):
        """Puts the score on the 1st inner step only, then keeps going (skip sees it early)."""
        def step(self, action):
            obs, r, te, tr, info = self.env.step(action)
            return obs, r, te, tr, ({"episode_score": 5.0, "episode_length": 1} if self.env.unwrapped.t == 1 else {})

    env = MaxAndSkip(LateInfo(ScriptedEnv()), skip=3)
    env.reset()
    *_, info = env.step(0)
    assert info == {"episode_score": 5.0, "episode_length": 1}
    *_, info = env.step(0)
    assert "episode_score" not in info


def test_frame_skip_of_one_returns_the_raw_frame():
    env = MaxAndSkip(ScriptedEnv(), skip=1)
    env.reset()
    frame, reward, *_ = env.step(0)
    np.testing.assert_array_equal(frame, [[10, 0], [0, 0]])
    assert reward == 1


@pytest.mark.parametrize("method, raw, expected", [
    ("abs_one_sign", [3.0, -0.2, 0.0, 1e6], [1.0, -1.0, 0.0, 1.0]),
    ("abs_one_clamp", [3.0, -0.2, 0.0, -7.0, 0.5], [1.0, -0.2, 0.0, -1.0, 0.5]),
    ("soft_asymmetric", [5.0, -5.0, 0.0, 100.0], [5 * np.tanh(1), -0.3 * 5 * np.tanh(1), 0.0, 5 * np.tanh(20)]),
])
def test_clip_reward(method, raw, expected):
    assert method in REWARD_CLIPPING_METHODS
    np.testing.assert_allclose([clip_reward(r, method) for r in raw], expected, rtol=1e-9)


def test_clip_reward_rejects_an_unknown_method():
    with pytest.raises(ValueError, match="unknown"):
        clip_reward(1.0, "tanh")


def test_noop_reset_count_is_bounded_and_deterministic_under_a_seed():
    env = NoopReset(ScriptedEnv(), noop_max=30)
    counts = []
    for seed in range(40):
        env.reset(seed=seed)
        first = env.unwrapped.t
        env.reset(seed=seed)
        assert env.unwrapped.t == first == env.last_noops      # same seed, same count
        assert set(env.unwrapped.actions) == {0}                  # only no-ops
        counts.append(first)
    assert 1 <= min(counts) and max(counts) <= 30
    assert len(set(counts)) > 10                                  # actually random across seeds


def test_noop_reset_zero_disables_and_reports_its_reward():
    env = NoopReset(ScriptedEnv(), noop_max=0)
    env.reset(seed=0)
    assert env.unwrapped.t == 0
    env = NoopReset(ScriptedEnv(), noop_max=3)
    _, info = env.reset(seed=0)
    assert info["reset_reward"] == sum(range(1, env.last_noops + 1))
    # GameScore above counts the no-op rewards in the whole-game score
    scored = GameScore(NoopReset(ScriptedEnv(end_at=10), noop_max=3))
    scored.reset(seed=0)
    while True:
        *_, terminated, _, info = scored.step(0)
        if terminated:
            break
    assert info["episode_score"] == sum(range(1, 11))


def run_until_game_over(env, max_steps=100):
    """Steps action 2, resetting after each terminated/truncated; -> list of (step, info) ends."""
    ends = []
    env.reset()
    for step in range(1, max_steps + 1):
        _, _, terminated, truncated, info = env.step(2)
        if terminated or truncated:
            ends.append((step, terminated, truncated, info))
            if "episode_score" in info:
                return ends
            env.reset()
    raise AssertionError("the game never ended")


def test_episodic_life_ends_episodes_per_life_but_scores_the_whole_game():
    raw = ScriptedEnv(lose_life_at=(3, 7, 12))
    env = EpisodicLife(GameScore(raw))
    ends = run_until_game_over(env)
    # life losses at steps 3 and 7 end the agent's episode; the reset after each takes one
    # hidden no-op (raw steps 4 and 8), so the raw step 12 is the agent's 10th step
    assert [(s, te, tr) for s, te, tr, _ in ends] == [(3, True, False), (6, True, False), (10, True, False)]
    assert ["episode_score" in info for *_, info in ends] == [False, False, True]
    assert raw.resets == 1                                       # life losses did not reset the game
    assert raw.actions[3] == 0 and raw.actions[7] == 0           # the hidden no-ops
    assert ends[-1][3]["episode_score"] == sum(range(1, 13))     # all raw rewards, hidden steps too
    assert ends[-1][3]["episode_length"] == 10                   # agent steps only
    assert env.game_over
    env.reset()
    assert raw.resets == 2 and not env.game_over                 # a real reset after game over


def test_episodic_life_truncation_is_a_real_end_and_not_a_termination():
    raw = ScriptedEnv(lose_life_at=(2,), truncate_at=5)
    env = EpisodicLife(GameScore(raw))
    ends = run_until_game_over(env)
    assert [(s, te, tr) for s, te, tr, _ in ends] == [(2, True, False), (4, False, True)]
    assert env.game_over and ends[-1][3]["episode_length"] == 4


def test_episodic_life_resets_for_real_when_the_last_step_lost_no_life():
    raw = ScriptedEnv(lose_life_at=(2,))
    env = EpisodicLife(raw)
    env.reset()
    env.step(0)
    env.reset()                                                  # abandoning a running game
    assert raw.resets == 2
    env.step(0), env.step(0)
    env.reset(seed=1)                                            # a seed always means a new game
    assert raw.resets == 3


def test_fire_reset_presses_fire_after_every_reset_without_counting_those_steps():
    raw = ScriptedEnv(lose_life_at=(4,))
    env = FireReset(EpisodicLife(GameScore(raw)))
    assert FireReset.applies_to(raw)
    env.reset()
    assert raw.actions == [1, 2]
    env.step(0)
    assert env.step(0)[2]                                        # raw step 4 lost a life
    env.reset()
    assert raw.actions == [1, 2, 0, 0, 0, 1, 2]                  # hidden no-op, then FIRE again
    ends = run_until_game_over(FireReset(EpisodicLife(GameScore(ScriptedEnv(lose_life_at=(4, 9, 14))))))
    assert [s for s, *_ in ends] == [2, 4, 6]
    assert ends[-1][3]["episode_length"] == 6                    # FIRE and no-op steps are not agent steps
    assert ends[-1][3]["episode_score"] == sum(range(1, 15))     # but their rewards are in the score


def test_game_time_limit_counts_agent_steps_and_never_marks_a_termination_as_truncated():
    env = GameScore(ScriptedEnv(end_at=3), max_length=3)
    env.reset()
    env.step(0), env.step(0)
    *_, terminated, truncated, info = env.step(0)
    assert terminated and not truncated and info["episode_length"] == 3
    env = GameScore(ScriptedEnv(), max_length=3)
    env.reset()
    assert [env.step(0)[3] for _ in range(3)] == [False, False, True]
    # the 2 FIRE steps inside reset() do not use up the limit
    env = FireReset(GameScore(ScriptedEnv(), max_length=3))
    env.reset()
    assert [env.step(0)[3] for _ in range(3)] == [False, False, True]
    assert env.unwrapped.t == 5


def test_resize_and_stack_give_channel_first_uint8():
    class Big(ScriptedEnv):
        def __init__(self, rgb):
            super().__init__()
            shape = (20, 16, 3) if rgb else (20, 16)
            self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
            self.rgb = rgb

        def frame(self):
            image = np.full(self.observation_space.shape, self.t, np.uint8)
            if self.rgb:
                image[..., 2] = 200                                  # a distinct blue channel
            return image

    env = FrameStack(ResizeFrame(Big(rgb=False), 10, 8), 3)
    obs, _ = env.reset()
    assert obs.shape == (3, 10, 8) and obs.dtype == np.uint8 and env.observation_space.contains(obs)
    assert (obs == 0).all()
    env.step(0)
    obs, *_ = env.step(0)
    assert [int(obs[c, 0, 0]) for c in range(3)] == [0, 1, 2]        # oldest first
    env = FrameStack(ResizeFrame(Big(rgb=True), 10, 8), 2)
    obs, _ = env.reset()
    assert obs.shape == (6, 10, 8) and env.observation_space.contains(obs)
    assert (obs[2] == 200).all() and (obs[0] == 0).all()             # channel-first RGB per frame
