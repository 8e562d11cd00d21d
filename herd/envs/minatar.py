"""MinAtar (Young & Tian 2019): five miniature Atari games on a 10x10 grid, from the
optional `minatar` package (`pip install -e '.[minatar]'`).

Ids: `MinAtar/<Game>-v1` plays the game's minimal action set, `MinAtar/<Game>-v0` all six
actions: the names (and meanings) the minatar package itself registers with gymnasium.
herd builds its own env from the package's `Environment` instead of using that
registration, because herd's models want channel-first float frames [C, 10, 10] (the
package gives [10, 10, C] booleans) and because registering it would import the package
(2-3 s: seaborn, scipy) in every process that only parses a command line.

Kept as MinAtar defines its games: sticky actions (the previous action repeats with
probability 0.1) and difficulty ramping (the games speed up as they go). Rewards are the
games' own (0 or 1 per step), so no clipping is needed. The games have no time limit of
their own (a good Breakout player never ends); herd truncates after MAX_EPISODE_STEPS
agent steps, like ALE's cap on Atari, so that test games end."""
from __future__ import annotations

import difflib
import importlib.util
import re

import gymnasium as gym
import numpy as np

from herd.errors import EnvError

PREFIX = "MinAtar/"
GAMES = {"Asterix": "asterix", "Breakout": "breakout", "Freeway": "freeway", "Seaquest": "seaquest",
         "SpaceInvaders": "space_invaders"}
IDS = tuple(f"{PREFIX}{game}-v{version}" for game in GAMES for version in (1, 0))
ID_PATTERN = re.compile(r"MinAtar/(\w+)-v([01])")
INSTALL_HINT = "pip install -e '.[minatar]'"
STICKY_ACTION_PROB = 0.1          # MinAtar's default
DIFFICULTY_RAMPING = True         # MinAtar's default
MAX_EPISODE_STEPS = 27_000        # the same number of agent steps as ALE's 108,000-frame cap at skip 4
CELL_PIXELS = 16                  # a rendered frame is 160x160 RGB


def is_minatar_id(env_id: str) -> bool:
    """Anything that looks meant for MinAtar (so that a typo gets MinAtar's error, not gymnasium's)."""
    return env_id.lower().startswith("minatar")


def check_minatar_id(env_id: str) -> tuple[str, bool]:
    """(the package's game name, minimal action set) of a MinAtar id; EnvError with one
    line for an unknown game or version, or when the minatar package is missing."""
    match = ID_PATTERN.fullmatch(env_id)
    if match is None or match.group(1) not in GAMES:
        close = difflib.get_close_matches(env_id, IDS, n=1, cutoff=0.5)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise EnvError(f"unknown MinAtar environment '{env_id}': {hint}the games are "
                       f"{', '.join(GAMES)}, as {PREFIX}<Game>-v1 (minimal action set) or -v0 (all six actions)")
    if importlib.util.find_spec("minatar") is None:
        raise EnvError(f"environment '{env_id}' needs the minatar package: {INSTALL_HINT}")
    return GAMES[match.group(1)], match.group(2) == "1"


class MinAtarEnv(gym.Env):
    """One MinAtar game as a gymnasium env: observations [C, 10, 10] float32 in {0, 1}
    (channel c of the package's [10, 10, C] state), a Discrete action space over the
    chosen action set, reward 0 or 1 (float), terminated when the game ends."""

    metadata = {"render_modes": ["human", "rgb_array"], "render_fps": 15}

    def __init__(self, game: str, minimal_actions: bool = True, render_mode: str | None = None):
        from minatar import Environment    # optional dependency: checked by check_minatar_id
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise EnvError(f"MinAtar renders {' or '.join(self.metadata['render_modes'])}, not '{render_mode}'")
        self.game = Environment(game, sticky_action_prob=STICKY_ACTION_PROB, difficulty_ramping=DIFFICULTY_RAMPING)
        self.action_set = self.game.minimal_action_set() if minimal_actions else list(range(self.game.num_actions()))
        height, width, channels = self.game.state_shape()
        self.observation_space = gym.spaces.Box(0.0, 1.0, (channels, height, width), np.float32)
        self.action_space = gym.spaces.Discrete(len(self.action_set))
        self.render_mode = render_mode
        # A fixed colour per channel, black for an empty cell (rgb_array frames).
        self.palette = np.vstack([[0, 0, 0], np.random.default_rng(0).integers(64, 256, (channels, 3))]).astype(np.uint8)

    def observation(self) -> np.ndarray:
        return np.ascontiguousarray(self.game.state().transpose(2, 0, 1), dtype=np.float32)   # [C, H, W]

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self.game.seed(seed)        # one RandomState for the game and its sticky actions
        self.game.reset()
        return self.observation(), {}

    def step(self, action):
        reward, done = self.game.act(self.action_set[int(action)])
        if self.render_mode == "human":
            self.render()
        return self.observation(), float(reward), bool(done), False, {}

    def render(self):
        if self.render_mode == "human":
            self.game.display_state(1000 // self.metadata["render_fps"])   # matplotlib window, paced
            return None
        state = self.game.state()                                           # [H, W, C] bool
        # The highest channel present in a cell picks its colour (MinAtar's own display does so).
        cell = np.max(state * np.arange(1, state.shape[2] + 1), axis=2)    # [H, W], 0 = empty
        frame = self.palette[cell]                                          # [H, W, 3]
        return np.repeat(np.repeat(frame, CELL_PIXELS, axis=0), CELL_PIXELS, axis=1)

    def close(self):
        if self.render_mode == "human" and self.game.visualized:
            self.game.close_display()


def make_minatar_raw(env_id: str, render_mode: str | None = None) -> MinAtarEnv:
    game, minimal = check_minatar_id(env_id)
    return MinAtarEnv(game, minimal, render_mode)
