"""AleVectorEnvs (ale-py's C++ vector env) against herd's own gymnasium stack: the same spaces,
bit-identical observations where both start from the same emulator state, and the EnvBatch
meaning of done / finished / truncated_obs, in synchronous and asynchronous mode."""
import os

import numpy as np
import pytest

from herd.envs import REWARD_CLIPPING_METHODS, EnvError, clip_reward, describe_env, make_env
from herd.envs.ale_vector import AleVectorEnvs, clip_rewards_array
from herd.envs.gym_envs import GymEnvs

# Both backends from the same emulator state: no random no-ops, no FIRE at reset (the two
# press FIRE differently, see the module docstring of herd.envs.ale_vector).
SAME_START = dict(noop_threshold=0, fire_reset=False)


def play(envs: AleVectorEnvs, batches: int, choose) -> list:
    """start(), then `batches` send/recv rounds; choose(batch, round) -> actions [n]."""
    out = [envs.start()]
    for t in range(batches):
        envs.send(choose(out[-1], t))
        out.append(envs.recv())
    return out


def random_policy(num_actions: int, seed: int):
    rng = np.random.default_rng(seed)
    return lambda batch, t: rng.integers(num_actions, size=len(batch.env_ids))


def reference_play(env_id: str, actions: np.ndarray, **kwargs) -> list:
    """Our gymnasium stack stepped the way the actor steps it (herd.envs.gym_envs.GymEnvs),
    one env, seed 0; -> [(obs [C, H, W], reward, done, finished)], from the reset on."""
    envs = GymEnvs(env_id, 1, seed=0, **kwargs)
    batch = envs.start()
    out = [(batch.obs[0], 0.0, False, [])]
    for action in actions:
        envs.send(np.array([action]))
        batch = envs.recv()
        out.append((batch.obs[0], float(batch.reward[0]), bool(batch.done[0]), batch.finished))
    envs.close()
    return out


def fixed(actions: np.ndarray):
    """One env acting actions[t] in round t."""
    return lambda batch, t: actions[t:t + 1]


@pytest.mark.parametrize("env_id, rgb", [("PongNoFrameskip-v4", False), ("BreakoutNoFrameskip-v4", False),
                                         ("ALE/Breakout-v5", True)])
def test_spaces_and_actions_equal_make_env(env_id, rgb):
    kwargs = dict(grayscaling_frames=not rgb, frame_scale_resolution=(80, 72), frames_stacked=3)
    ref = make_env(env_id, seed=0, **kwargs)
    with AleVectorEnvs(env_id, 2, seed=0, **kwargs) as envs:
        assert envs.spec == describe_env(env_id, **kwargs)      # shape, dtype, num_actions, step limit
        assert envs.action_meanings == ref.unwrapped.get_action_meanings()
        batch = envs.start()
    assert batch.obs.shape == (2, *ref.observation_space.shape) == (2, 9 if rgb else 3, 80, 72)
    assert batch.obs.dtype == np.uint8 and batch.reward.dtype == np.float32 and batch.done.dtype == np.bool_
    assert batch.env_ids.dtype == np.int64 and batch.env_ids.tolist() == [0, 1]
    assert not batch.done.any() and not batch.reward.any() and not batch.finished and not batch.truncated_obs
    ref.close()


@pytest.mark.parametrize("env_id, kwargs, words", [
    ("CartPole-v1", {}, "not an Atari game"),
    ("Pong-v4", {}, "use PongNoFrameskip-v4"),
    ("PongNoFrameskip-v0", {}, "use PongNoFrameskip-v4"),
    ("PongNoFrameskp-v4", {}, "did you mean PongNoFrameskip-v4"),
    ("PongNoFrameskip-v4", {"batch_size": 5}, "batch_size must be"),
    ("PongNoFrameskip-v4", {"num_threads": -1}, "num_threads must be"),
    ("PongNoFrameskip-v4", {"frames_stacked": 0}, "frames_stacked must be"),
    ("PongNoFrameskip-v4", {"reward_clipping_method": "tanh"}, "reward_clipping_method must be"),
])
def test_bad_input_gives_one_line_env_error(env_id, kwargs, words):
    with pytest.raises(EnvError, match=words) as error:
        AleVectorEnvs(env_id, 4, seed=0, **kwargs)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("env_id, rgb, steps", [("PongNoFrameskip-v4", False, 400),
                                                ("BreakoutNoFrameskip-v4", True, 30)])
def test_same_observations_rewards_and_dones_as_make_env(env_id, rgb, steps):
    kwargs = dict(SAME_START, clip_rewards=False, grayscaling_frames=not rgb)
    actions = np.random.default_rng(3).integers(describe_env(env_id).num_actions, size=steps)
    with AleVectorEnvs(env_id, 1, seed=0, **kwargs) as envs:
        ours = play(envs, steps, fixed(actions))
    ref = reference_play(env_id, actions, **kwargs)
    for t, (batch, (obs, reward, done, finished)) in enumerate(zip(ours, ref)):
        np.testing.assert_array_equal(batch.obs[0], obs, err_msg=f"step {t}")   # the whole stack, exactly
        assert (batch.reward[0], batch.done[0], batch.finished) == (reward, done, finished), f"step {t}"
    if env_id.startswith("Pong"):
        assert sum(b.reward[0] != 0 for b in ours) >= 3                          # points were scored


def test_same_as_make_env_up_to_a_lost_life_then_both_start_a_new_stack():
    actions = np.random.default_rng(3).integers(4, size=150)
    with AleVectorEnvs("BreakoutNoFrameskip-v4", 1, seed=0, **SAME_START) as envs:
        ours = play(envs, len(actions), fixed(actions))
    ref = reference_play("BreakoutNoFrameskip-v4", actions, **SAME_START)
    lost = next(t for t, (_, _, done, _) in enumerate(ref) if done)                # the first lost life
    assert next(t for t, batch in enumerate(ours) if batch.done[0]) == lost
    for t in range(lost):
        np.testing.assert_array_equal(ours[t].obs[0], ref[t][0], err_msg=f"step {t}")
        assert ours[t].reward[0] == ref[t][1]
    # Both go on with the same game and start a new frame stack (every slot the same frame);
    # ours took a hidden NOOP step first, so the frames themselves differ.
    for obs in (ours[lost].obs[0], ref[lost][0]):
        assert all(np.array_equal(obs[0], obs[i]) for i in range(1, 4))
    assert not ours[lost].finished and not ref[lost][3]


def test_lost_lives_are_dones_and_each_game_is_reported_once_with_its_raw_score():
    """Breakout: 5 lives, so every 5th done of an env is its game over, reported once with
    the raw score of all its lives and its agent steps; the 4 before are lost lives."""
    with AleVectorEnvs("BreakoutNoFrameskip-v4", 2, seed=1, clip_rewards=False) as envs:
        batches = play(envs, 600, random_policy(4, 0))
    score, steps, dones = np.zeros(2), np.zeros(2, int), np.zeros(2, int)
    game_overs = 0
    for batch in batches[1:]:
        expected = []
        for e in range(2):
            score[e] += batch.reward[e]
            steps[e] += 1
            dones[e] += batch.done[e]
            if batch.done[e] and dones[e] % 5 == 0:
                expected.append((score[e], steps[e]))
                score[e], steps[e] = 0.0, 0
        assert batch.finished == expected
        game_overs += len(expected)
    assert game_overs >= 2 and dones.sum() >= 5 * game_overs
    assert any(s > 0 for b in batches for s, _ in b.finished)


def test_reward_clipping_methods_clip_what_the_agent_sees_and_not_the_score():
    # Space Invaders pays 5 to 30 points per alien: clamp, sign and tanh all differ there.
    def run(**kwargs):
        with AleVectorEnvs("SpaceInvadersNoFrameskip-v4", 1, seed=4, max_episode_steps=120, **kwargs) as envs:
            return play(envs, 125, random_policy(6, 1))

    raw = run(clip_rewards=False)
    rewards = np.array([b.reward[0] for b in raw])
    assert (rewards > 1).any()
    assert raw[120].finished == [(float(rewards[1:121].sum()), 120)]
    for method in REWARD_CLIPPING_METHODS:
        clipped = run(reward_clipping_method=method)
        expected = np.array([clip_reward(float(r), method) for r in rewards], np.float32)
        np.testing.assert_array_equal(np.array([b.reward[0] for b in clipped]), expected, err_msg=method)
        assert [b.finished for b in clipped] == [b.finished for b in raw]


def test_clip_rewards_array_is_clip_reward():
    raw = np.array([-100, -7, -5, -1, -0.2, 0, 0.5, 1, 3, 5, 30, 1e6])
    for method in REWARD_CLIPPING_METHODS:
        np.testing.assert_array_equal(clip_rewards_array(raw, method),
                                      np.array([clip_reward(float(r), method) for r in raw], np.float32))


def test_time_limit_truncates_across_lives_with_the_final_observation():
    limit = 100
    with AleVectorEnvs("BreakoutNoFrameskip-v4", 2, seed=2, max_episode_steps=limit) as envs:
        assert envs.spec.max_episode_steps == limit
        batches = play(envs, 2 * limit, random_policy(4, 2))
    for t, batch in enumerate(batches):
        if t in (limit, 2 * limit):
            assert batch.done.all() and sorted(batch.truncated_obs) == [0, 1]
            assert [length for _, length in batch.finished] == [limit, limit]
            for row, final in batch.truncated_obs.items():
                # the ended episode's stack moved on by one frame; the new one starts afresh
                np.testing.assert_array_equal(final[:-1], batches[t - 1].obs[row][1:])
                assert all(np.array_equal(batch.obs[row][0], batch.obs[row][i]) for i in range(1, 4))
        else:
            assert not batch.finished and not batch.truncated_obs
    assert sum(b.done.sum() for b in batches[1:limit]) >= 1        # lives were lost before the limit


def test_env_i_gets_seed_plus_i_and_the_same_seed_gives_the_same_batches():
    def run(seed):
        with AleVectorEnvs("PongNoFrameskip-v4", 2, seed=seed, max_episode_steps=30) as envs:
            return play(envs, 50, lambda batch, t: np.full(2, t % 6))      # both envs act alike

    def same(a, b, rows_a=slice(None), rows_b=slice(None)):
        return all(np.array_equal(x.obs[rows_a], y.obs[rows_b]) and np.array_equal(x.reward[rows_a], y.reward[rows_b])
                   and np.array_equal(x.done[rows_a], y.done[rows_b]) for x, y in zip(a, b))

    first, again, shifted, wrapped = run(5), run(5), run(6), run(2**31 + 5)
    assert same(first, again) and [b.finished for b in first] == [b.finished for b in again]
    assert same(first, wrapped)                                 # 32-bit ALE seeds: wraps around
    assert same(first, shifted, 1, 0)                           # env 1 of seed 5 is env 0 of seed 6
    assert not same(first, first, 0, 1)                         # seeds 5 and 6 do differ


def act_by_env_step():
    """A policy whose action depends only on the env and how many steps it has taken."""
    counts = np.zeros(64, int)

    def choose(batch, t):
        actions = (3 * batch.env_ids + counts[batch.env_ids]) % 6
        counts[batch.env_ids] += 1
        return actions
    return choose


def per_env(batches, num_envs) -> dict:
    """env id -> [(obs, reward, done, truncated final obs or None)], in that env's own order."""
    trace = {e: [] for e in range(num_envs)}
    for batch in batches:
        assert len(set(batch.env_ids.tolist())) == len(batch.env_ids)         # distinct envs in a batch
        for row, e in enumerate(batch.env_ids):
            trace[e].append((batch.obs[row], batch.reward[row], batch.done[row], batch.truncated_obs.get(row)))
    return trace


def test_async_batches_act_on_their_own_envs():
    """4 envs, batches of 2: each env acts by its own step count, so its trajectory must be
    the one it has in synchronous mode, whatever order the envs arrive in."""
    kwargs = dict(seed=9, max_episode_steps=15, clip_rewards=False, num_threads=2)
    with AleVectorEnvs("PongNoFrameskip-v4", 4, batch_size=2, **kwargs) as envs:
        assert envs.batch_size == 2
        choose, seen = act_by_env_step(), np.zeros(4, int)
        batches = [envs.start()]
        # Every env must get to 46 rows. Not a fixed number of batches: on a busy machine the
        # OS may stall one worker thread for a while, and the other envs rightly go first.
        while seen.min() < 46 and len(batches) < 3000:
            seen[batches[-1].env_ids] += 1
            envs.send(choose(batches[-1], len(batches)))
            batches.append(envs.recv())
    assert seen.min() >= 46, f"an env starved: rows per env {seen.tolist()} after {len(batches)} batches"
    with AleVectorEnvs("PongNoFrameskip-v4", 4, **kwargs) as envs:
        sync = per_env(play(envs, 45, act_by_env_step()), 4)
    assert all(len(b.env_ids) == 2 for b in batches)
    asynchronous = per_env(batches, 4)
    for e in range(4):
        assert len(asynchronous[e]) >= 46
        for t, (a, s) in enumerate(zip(asynchronous[e], sync[e])):
            np.testing.assert_array_equal(a[0], s[0], err_msg=f"env {e} step {t}")
            assert a[1:3] == s[1:3] and (a[3] is None) == (s[3] is None), f"env {e} step {t}"
            if a[3] is not None:
                np.testing.assert_array_equal(a[3], s[3])
    # Every game is truncated after 15 steps of its own env (lengths are kept per env, not per
    # row), and reported once.
    games = []
    for e in range(4):
        dones = [t for t, step in enumerate(asynchronous[e]) if step[2]]
        assert dones == list(range(15, len(asynchronous[e]), 15))
        games += [(float(sum(step[1] for step in asynchronous[e][t - 14:t + 1])), 15) for t in dones]
    assert sorted(f for b in batches for f in b.finished) == sorted(games)


@pytest.mark.parametrize("batch_size", [0, 2])
def test_each_row_action_moves_its_own_env(batch_size):
    """Envs 0 and 2 always press UP, envs 1 and 3 always DOWN: each env's last observation
    must be what one env of our gymnasium stack shows after the same presses, and not what
    it shows after the other env's presses (an action routed to the wrong row would fail)."""
    press = np.array([2, 5, 2, 5])                       # Pong: 2 = UP, 5 = DOWN
    with AleVectorEnvs("PongNoFrameskip-v4", 4, seed=0, batch_size=batch_size, num_threads=2,
                       **SAME_START) as envs:
        batch, steps, last = envs.start(), np.zeros(4, int), {}
        while steps.min() < 60:
            steps[batch.env_ids] += 1
            envs.send(press[batch.env_ids])
            batch = envs.recv()
            for row, e in enumerate(batch.env_ids):
                last[int(e)] = (batch.obs[row].copy(), int(steps[e]))
    for e, (obs, count) in last.items():
        own = reference_play("PongNoFrameskip-v4", np.full(count, press[e]), **SAME_START)[-1][0]
        other = reference_play("PongNoFrameskip-v4", np.full(count, 7 - press[e]), **SAME_START)[-1][0]
        np.testing.assert_array_equal(obs, own, err_msg=f"env {e}")
        assert not np.array_equal(obs, other), f"env {e}: UP and DOWN look the same, the test proves nothing"


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def test_protocol_misuse_and_close():
    before = thread_count()
    envs = AleVectorEnvs("PongNoFrameskip-v4", 2, seed=0, num_threads=2)
    with pytest.raises(RuntimeError, match="start"):
        envs.send(np.zeros(2, np.int64))
    envs.start()
    with pytest.raises(RuntimeError, match="send"):
        envs.recv()
    with pytest.raises(ValueError, match="0..5"):
        envs.send(np.array([0, 6]))                                  # ALE would hang on it
    with pytest.raises(ValueError, match="2 integers"):
        envs.send(np.zeros(3, np.int64))
    with pytest.raises(RuntimeError, match="once"):
        envs.start()
    envs.send(np.zeros(2, np.int64))                                 # closed with a step under way
    assert thread_count() > before
    envs.close()
    envs.close()
    assert thread_count() == before
    with pytest.raises(RuntimeError, match="closed"):
        envs.start()
