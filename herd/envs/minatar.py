"""MinAtar (Young & Tian 2019): five miniature Atari games on a 10x10 grid, from the
optional `minatar` package (`pip install -e '.[minatar]'`).

Ids: `MinAtar/<Game>-v1` plays the game's minimal action set, `MinAtar/<Game>-v0` all six
actions: the names (and meanings) the minatar package itself registers with gymnasium.
herd builds its own env from the package's `Environment` instead of using that
registration, because herd's models want channel-first float frames [C, 10, 10] (the
package gives [10, 10, C] booleans).

The game modules (minatar/environments/<game>.py, numpy only) are loaded from their files
instead of through `import minatar`: the package's __init__ imports matplotlib and seaborn
(pandas, scipy) for its display, 2.5 s of CPU in every actor process; on this 2-core
machine under load that pushed the actors' start past their 60 s start-up timeout. The
package's `Environment` wrapper around a game is five lines, mirrored in MinAtarEnv
(sticky actions drawn from the game's own RandomState, as there).

Kept as MinAtar defines its games: sticky actions (the previous action repeats with
probability 0.1) and difficulty ramping (the games speed up as they go). Rewards are the
games' own (0 or 1 per step), so no clipping is needed. The games have no time limit of
their own (a good Breakout player never ends); herd truncates after MAX_EPISODE_STEPS
agent steps, like ALE's cap on Atari, so that test games end."""
from __future__ import annotations

import difflib
import importlib.util
import re
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np

from herd.errors import EnvError
from herd.inputs import quoted

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
        raise EnvError(f"unknown MinAtar environment {quoted(env_id)}: {hint}the games are "
                       f"{', '.join(GAMES)}, as {PREFIX}<Game>-v1 (minimal action set) or -v0 (all six actions)")
    if importlib.util.find_spec("minatar") is None:
        raise EnvError(f"environment {quoted(env_id)} needs the minatar package: {INSTALL_HINT}")
    return GAMES[match.group(1)], match.group(2) == "1"


def load_game(game: str):
    """The module minatar/environments/<game>.py, loaded from its file without running the
    package's __init__ (see the module docstring); once per process."""
    name = f"herd_minatar_games.{game}"
    if name not in sys.modules:
        package = importlib.util.find_spec("minatar")        # locates the package, imports nothing
        path = Path(package.submodule_search_locations[0]) / "environments" / f"{game}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


class MinAtarEnv(gym.Env):
    """One MinAtar game as a gymnasium env: observations [C, 10, 10] float32 in {0, 1}
    (channel c of the game's [10, 10, C] state), a Discrete action space over the chosen
    action set, reward 0 or 1 (float), terminated when the game ends."""

    metadata = {"render_modes": ["human", "rgb_array"], "render_fps": 15}

    def __init__(self, game: str, minimal_actions: bool = True, render_mode: str | None = None):
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise EnvError(f"MinAtar renders {' or '.join(self.metadata['render_modes'])}, not '{render_mode}'")
        self.game = load_game(game).Env(ramping=DIFFICULTY_RAMPING)
        self.random = np.random.RandomState()       # unseeded until reset(seed=...), as in MinAtar
        self.game.random = self.random              # one stream for the game and its sticky actions
        self.last_action = 0
        self.action_set = self.game.minimal_action_set() if minimal_actions else list(range(6))   # MinAtar's six
        height, width, channels = self.game.state_shape()
        self.observation_space = gym.spaces.Box(0.0, 1.0, (channels, height, width), np.float32)
        self.action_space = gym.spaces.Discrete(len(self.action_set))
        self.render_mode = render_mode
        self.window = None                          # matplotlib image, human mode
        # A fixed colour per channel, black for an empty cell (rgb_array frames).
        self.palette = np.vstack([[0, 0, 0], np.random.default_rng(0).integers(64, 256, (channels, 3))]).astype(np.uint8)

    def observation(self) -> np.ndarray:
        return np.ascontiguousarray(self.game.state().transpose(2, 0, 1), dtype=np.float32)   # [C, H, W]

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self.random = np.random.RandomState(seed)
            self.game.random = self.random
        self.game.reset()           # MinAtar keeps last_action across games; so do we
        return self.observation(), {}

    def step(self, action):
        action = self.action_set[int(action)]
        if self.random.rand() < STICKY_ACTION_PROB:
            action = self.last_action
        self.last_action = action
        reward, done = self.game.act(action)
        if self.render_mode == "human":
            self.render()
        return self.observation(), float(reward), bool(done), False, {}

    def frame(self) -> np.ndarray:
        """[160, 160, 3] uint8: the highest channel present in a cell picks its colour."""
        state = self.game.state()                                           # [H, W, C] bool
        cell = np.max(state * np.arange(1, state.shape[2] + 1), axis=2)    # [H, W], 0 = empty
        return np.repeat(np.repeat(self.palette[cell], CELL_PIXELS, axis=0), CELL_PIXELS, axis=1)

    def render(self):
        if self.render_mode != "human":
            return self.frame()
        import matplotlib.pyplot as plt      # a window only: never imported by training
        if self.window is None:
            self.window = plt.imshow(self.frame())
            plt.axis("off")
            plt.show(block=False)
        else:
            self.window.set_data(self.frame())
        plt.pause(1 / self.metadata["render_fps"])
        return None

    def close(self):
        if self.window is not None:
            import matplotlib.pyplot as plt
            plt.close(self.window.figure)
            self.window = None


def make_minatar_raw(env_id: str, render_mode: str | None = None) -> MinAtarEnv:
    game, minimal = check_minatar_id(env_id)
    return MinAtarEnv(game, minimal, render_mode)
