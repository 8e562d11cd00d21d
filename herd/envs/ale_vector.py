"""AleVectorEnvs: an actor's Atari environments stepped by ale-py's C++ vector environment
(`ale_py.vector_env.AtariVectorEnv`, worker threads, no Python per frame), behind the
`ActorEnvs` seam (herd/actors/interfaces.py).

The C++ side does frame skip with max-pool, grayscale or RGB, INTER_AREA resize and frame
stacking; herd keeps in Python what must match its own gymnasium stack (herd.envs.atari):
reward clipping (ALE's own is off, so raw scores stay known), the whole-game score and
length, episodic-life bookkeeping and the frame-stack restarts.

    ALE rows [n, k, H, W] gray or [n, k, H, W, 3] RGB  ->  EnvBatch.obs [n, k*C, H, W] uint8

Same as make_env (checked step by step in tests/envs/test_ale_vector.py, with noop_threshold=0
and fire_reset=False so that both start from the same emulator state): observations are
bit-identical, gray and RGB (ALE resizes with the same OpenCV INTER_AREA, max-pools the same
two frames; RGB frames are reordered to our channel-first [3*k, H, W]; a new stack's older
slots, zeros in ALE, get the first frame as in ours), and so are rewards
and done flags, up to a lost life. Same action set (the minimal one, same meanings), same
seeds convention (env i gets seed + i), same EnvBatch semantics: a lost life with episodic
life gives done=True and the game goes on; `finished` reports (raw score over all lives,
agent steps) once per game, on the step the game ends (game over or truncation); a truncated
episode's final observation goes into truncated_obs.

Differences from make_env (ALE's C++ preprocessing, which herd cannot change), measured:
  * reset: ALE takes 0..noop_threshold no-op frames (we pass noop_max = noop_threshold + 1;
    ours: 1..noop_threshold), drawn from its own RNG, so the same seed gives another count.
    For games with FIRE (and fire_reset=True) ALE presses FIRE for 1 frame, in place of one
    of the no-ops; ours presses FIRE then action 2 for one agent step each (8 frames). With
    noop_threshold=0 the two emulators then run 7 frames apart: over the first 30 steps of
    random play, 0.3-0.6 mean absolute pixel difference on Breakout (0.25 on Pong; max 114
    and 162; 0.6-1.2% of pixels), and Pong's first observation differs on every pixel until
    the stack has moved on. Rewards earned during reset frames are not in ALE's score (ours
    counts them; in practice they are 0).
  * after a lost life (episodic life): ours takes one hidden NOOP agent step (then FIRE and
    2 for FIRE games) before the agent acts again; ALE takes none, so the agent's next
    action acts at once, 4 (12) frames earlier, and in Breakout the agent itself must press
    FIRE to serve. The frame stack restarts at the new life in both (older slots hold
    copies of the newest frame).
  * time limit: ALE truncates a game after exactly ceil(max_num_frames_per_episode /
    skipped_frames) agent steps (27000 for the v4/v5 ids), which is describe_env's
    max_episode_steps; ours truncates when ALE's raw-frame counter, which also counts the
    reset and hidden frames, reaches 108000, a few steps earlier (Breakout with NOOPs only,
    noop_threshold=30, seed 0: ours at agent step 26995, ALE at 27000). max_episode_steps
    (agent steps) is exact in both.
  * a life lost on the very step of a truncation: ALE marks the step terminated (no
    truncated_obs); ours marks it truncated. Game overs on that step agree (terminated).
  * asynchronous mode only: rows come in the order the threads finish, and on a busy
    machine the OS may stall one worker for tens of batches while the other envs go on.
ALE's own episodic_life option is not used: it resets the whole game on every lost life, so
a game would never end and scores would be per life. We run it with life_loss_info (a lost
life is a termination without reset) and tell a lost life from a game over by lives and
episode_frame_number (a reset puts both back to the game's start).
"""
from __future__ import annotations

import os

import numpy as np
from ale_py.vector_env import AtariVectorEnv

from herd.interfaces import EnvBatch
from herd.envs.registry import (EnvError, EnvSpec, check_atari_id, check_preprocessing, is_ale,
                                registered_spec)
from herd.envs.wrappers import REWARD_CLIPPING_METHODS
from herd.inputs import quoted

NO_FRAME_CAP = 2**30        # ALE needs some cap; an id without one gets this (about 8 years of play)


def clip_rewards_array(raw: np.ndarray, method: str) -> np.ndarray:
    """herd.envs.wrappers.clip_reward on an array: raw [n] -> clipped [n] float32."""
    raw = np.asarray(raw, dtype=np.float64)
    if method == "abs_one_sign":
        clipped = np.sign(raw)
    elif method == "abs_one_clamp":
        clipped = np.clip(raw, -1.0, 1.0)
    elif method == "soft_asymmetric":
        squashed = 5.0 * np.tanh(raw / 5.0)
        clipped = np.where(squashed < 0, 0.3 * squashed, squashed)
    else:
        raise EnvError(f"reward_clipping_method must be one of {', '.join(REWARD_CLIPPING_METHODS)}, got {method!r}")
    return clipped.astype(np.float32)


def ale_game(env_id: str):
    """(ROM name, gymnasium spec) of an Atari id herd accepts; EnvError (one line) otherwise."""
    spec = registered_spec(env_id)
    if not is_ale(spec):
        raise EnvError(f"environment {quoted(env_id)} is not an Atari game: the ALE vector backend runs "
                       f"<Game>NoFrameskip-v4 or ALE/<Game>-v5 ids only (use make_env for other ids)")
    check_atari_id(env_id, spec)
    return spec.kwargs["game"], spec


def resolve_counts(num_envs, batch_size, num_threads) -> tuple[int, int]:
    """-> (batch_size, num_threads), with 0 resolved; EnvError for bad values."""
    def is_int(value) -> bool:
        return isinstance(value, (int, np.integer)) and not isinstance(value, bool)

    if not is_int(num_envs) or num_envs < 1:
        raise EnvError(f"num_envs must be an integer >= 1, got {num_envs!r}")
    if not is_int(batch_size) or not 0 <= batch_size <= num_envs:
        raise EnvError(f"batch_size must be an integer from 0 (synchronous) to num_envs={num_envs}, got {batch_size!r}")
    if not is_int(num_threads) or num_threads < 0:
        raise EnvError(f"num_threads must be an integer >= 0 (0: one per CPU, at most batch_size), "
                       f"got {num_threads!r}")
    batch_size = int(batch_size) or int(num_envs)
    if num_threads == 0:
        # The CPUs this process may use (affinity, not the machine's count): more threads
        # than that only take turns, and more than batch_size have nothing to step.
        num_threads = min(batch_size, len(os.sched_getaffinity(0)))
    return batch_size, int(num_threads)


class AleVectorEnvs:
    """`num_envs` Atari environments of `env_id` with herd's preprocessing, stepped by ALE's
    C++ threads. Keywords as herd.envs.make_env (so the same env_kwargs dict fits), plus:

    batch_size: 0 (or num_envs) = synchronous, every env in every batch, rows in env order;
        0 < batch_size < num_envs = asynchronous, each recv() gives the first batch_size envs
        whose step finished (EnvBatch.env_ids says which).
    num_threads: ALE worker threads; 0 = min(batch_size, CPUs this process may run on). Give
        it explicitly when several actors share the machine.
    seed: env i gets seed + i (modulo 2**31: ALE's seeds are 32-bit). In synchronous mode
        two instances with the same seed and the same actions give identical batches;
        asynchronous mode keeps each env's own trajectory reproducible, not the order in
        which envs arrive.
    start() is called once: ALE goes on resetting each game by itself (same step).
    See the module docstring for how this differs from make_env."""

    def __init__(self, env_id: str, num_envs: int, *, seed: int, batch_size: int = 0, num_threads: int = 0,
                 skipped_frames: int = 4, frames_stacked: int = 4, noop_threshold: int = 30,
                 episodic_life: bool = True, grayscaling_frames: bool = True, frame_scale_resolution=(84, 84),
                 clip_rewards: bool = True, reward_clipping_method: str = "abs_one_sign",
                 max_episode_steps: int | None = None, fire_reset: bool = True):
        check_preprocessing(skipped_frames, frames_stacked, noop_threshold, frame_scale_resolution,
                            reward_clipping_method, max_episode_steps)
        game, gym_spec = ale_game(env_id)
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
            raise EnvError(f"seed must be an integer >= 0, got {seed!r}")
        self.batch_size, self.num_threads = resolve_counts(num_envs, batch_size, num_threads)
        self.num_envs, self.seed, self.env_id = int(num_envs), int(seed), env_id
        # ALE takes 32-bit seeds: larger ones (herd's own go up to 2**31 - 1, plus env offsets) wrap.
        self.env_seeds = (self.seed + np.arange(self.num_envs, dtype=np.int64)) % 2**31   # [E]
        self.episodic_life = bool(episodic_life)
        self.clip_method = reward_clipping_method if clip_rewards else None
        self.channels = 1 if grayscaling_frames else 3
        self.k = frames_stacked
        height, width = (int(v) for v in frame_scale_resolution)
        # ALE truncates after ceil(frames / skipped_frames) agent steps, counted from the
        # real reset across lives: with frames = max_episode_steps * skip, exactly ours.
        frames = gym_spec.kwargs.get("max_num_frames_per_episode") or NO_FRAME_CAP
        if max_episode_steps:
            frames = min(frames, max_episode_steps * skipped_frames)
        self.vec = AtariVectorEnv(
            game, self.num_envs, batch_size=self.batch_size if self.batch_size < self.num_envs else 0,
            num_threads=self.num_threads, max_num_frames_per_episode=frames, repeat_action_probability=0.0,
            full_action_space=bool(gym_spec.kwargs.get("full_action_space", False)), autoreset_mode="SameStep",
            img_height=height, img_width=width, grayscale=bool(grayscaling_frames), stack_num=frames_stacked,
            frameskip=skipped_frames, maxpool=True, noop_max=noop_threshold + 1 if noop_threshold else 0,
            episodic_life=False, life_loss_info=self.episodic_life, reward_clipping=False,
            use_fire_reset=bool(fire_reset))
        self.action_meanings = [action.name for action in self.vec.ale.get_action_set()]
        self.num_actions = len(self.action_meanings)
        self.obs_shape = (self.k * self.channels, height, width)
        self.spec = EnvSpec("atari", self.obs_shape, "uint8", self.num_actions, -(-frames // skipped_frames))
        # Per env (index = env id, never row): the game so far and where its episode began.
        E = self.num_envs
        self.score = np.zeros(E, np.float64)    # raw reward of the game so far, all lives
        self.length = np.zeros(E, np.int64)     # agent steps of the game so far
        self.lives = np.zeros(E, np.int64)      # ALE lives after the env's last step
        self.frame = np.zeros(E, np.int64)      # ALE episode_frame_number after the last step
        self.fresh = np.zeros(E, np.int64)      # stack slots filled since the episode (life) began, <= k
        self.acted = np.zeros(E, np.bool_)      # an action was sent and its step not yet received
        self.rows = None                        # env ids of the last batch handed out [n]
        self.waiting = False                    # send() called, recv() not yet

    # ---- the ActorEnvs protocol -------------------------------------------------------

    def start(self) -> EnvBatch:
        self._check_open()
        if self.rows is not None:
            # In async mode other envs are still stepping: a second reset would mix with them.
            raise RuntimeError("AleVectorEnvs.start() is called once; make a new AleVectorEnvs to start over")
        obs, info = self.vec.reset(seed=self.env_seeds)
        self.acted[:] = False
        self.waiting = False
        return self._batch(obs, np.zeros(len(obs), np.int64), np.zeros(len(obs), np.bool_),
                           np.zeros(len(obs), np.bool_), info)

    def send(self, actions: np.ndarray) -> None:
        self._check_open()
        if self.rows is None or self.waiting:
            raise RuntimeError("AleVectorEnvs.send() needs a batch to act on: call start() first, "
                               "then alternate recv() and send()")
        actions = np.asarray(actions)
        if actions.shape != self.rows.shape or not np.issubdtype(actions.dtype, np.integer):
            raise ValueError(f"actions must be {len(self.rows)} integers (one per row of the last batch), "
                             f"got shape {actions.shape} dtype {actions.dtype}")
        if actions.size and (actions.min() < 0 or actions.max() >= self.num_actions):
            # ALE's worker would fail on it and leave recv() waiting forever.
            raise ValueError(f"actions must be in 0..{self.num_actions - 1}, got {actions.min()}..{actions.max()}")
        self.vec.send(actions.astype(np.int64, copy=False))
        self.acted[self.rows] = True
        self.waiting = True

    def recv(self) -> EnvBatch:
        self._check_open()
        if not self.waiting:
            raise RuntimeError("AleVectorEnvs.recv() without a send(): every batch needs its actions first")
        obs, reward, terminated, truncated, info = self.vec.recv()
        self.waiting = False
        return self._batch(obs, reward, terminated, truncated, info)

    def close(self) -> None:
        """Stops ALE's worker threads (they finish the step under way). Safe to call twice."""
        vec, self.vec = getattr(self, "vec", None), None
        if vec is not None:
            vec.close()
            vec.ale = None   # the C++ vectorizer joins its threads when its last reference goes

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    # ---- from ALE's rows to an EnvBatch ------------------------------------------------

    def _check_open(self) -> None:
        if self.vec is None:
            raise RuntimeError("AleVectorEnvs is closed")

    def _batch(self, obs, reward, terminated, truncated, info) -> EnvBatch:
        """ALE's rows (obs [n, k, H, W(, 3)], raw int rewards [n], flags [n]) -> EnvBatch."""
        ids = np.asarray(info["env_id"], np.int64)                      # [n]
        lives = np.asarray(info["lives"], np.int64)
        frame = np.asarray(info["episode_frame_number"], np.int64)
        raw = np.asarray(reward, np.float64)
        done = np.zeros(len(ids), np.bool_)
        truncated_obs, finished = {}, []
        for row, e in enumerate(ids):
            if not self.acted[e]:
                # A reset's row (start(), or in async mode one that arrives after start()).
                raw[row] = 0.0
                self.score[e], self.length[e], self.fresh[e] = 0.0, 0, 1
            else:
                done[row], game_over = self._step_row(e, raw[row], terminated[row], truncated[row],
                                                      lives[row], frame[row])
                if game_over:
                    if truncated[row] and not terminated[row]:
                        final = info["final_obs"][row].copy()
                        self._restart_stack(final, min(self.fresh[e] + 1, self.k))
                        truncated_obs[row] = self._layout(final[None])[0]
                    finished.append((float(self.score[e]), int(self.length[e])))
                    self.score[e], self.length[e], self.fresh[e] = 0.0, 0, 1
            self.lives[e], self.frame[e] = lives[row], frame[row]
            self.acted[e] = False
            self._restart_stack(obs[row], self.fresh[e])
        self.rows = ids
        clipped = clip_rewards_array(raw, self.clip_method) if self.clip_method else raw.astype(np.float32)
        return EnvBatch(env_ids=ids, obs=self._layout(obs), reward=clipped, done=done,
                        truncated_obs=truncated_obs, finished=finished)

    def _step_row(self, e, raw, terminated, truncated, lives, frame) -> tuple[bool, bool]:
        """Books env e's step; -> (done, the game ended). The score keeps counting across lives."""
        self.score[e] += raw
        self.length[e] += 1
        # With life_loss_info a lost life also sets `terminated`, but ALE resets the game only
        # at a game over or truncation, which puts lives and the frame counter back.
        life_lost = (self.episodic_life and bool(terminated) and lives < self.lives[e]
                     and frame > self.frame[e])
        game_over = bool(truncated) or (bool(terminated) and not life_lost)
        if life_lost:
            self.fresh[e] = 1   # like ours, the stack starts over with the new life
        elif not game_over:
            self.fresh[e] = min(self.fresh[e] + 1, self.k)
        return bool(terminated or truncated), game_over

    def _restart_stack(self, stack: np.ndarray, fresh: int) -> None:
        """stack [k, H, W(, 3)] in place: the slots older than the episode's first frame get a
        copy of it, as our FrameStack does (ALE leaves zeros after a reset, and the previous
        life's frames after a lost life)."""
        if fresh < self.k:
            stack[:self.k - fresh] = stack[self.k - fresh]

    def _layout(self, obs: np.ndarray) -> np.ndarray:
        """ALE [n, k, H, W] or [n, k, H, W, 3] -> ours [n, k*C, H, W], RGB channels per frame."""
        if self.channels == 1:
            return obs
        n, k, h, w, c = obs.shape
        return np.ascontiguousarray(obs.transpose(0, 1, 4, 2, 3)).reshape(n, k * c, h, w)
