"""Example environments for herd, registered with gymnasium when this package is imported.

`herd train --env herd_example_envs:Match-v0` makes herd import this package in every
process that builds environments (actors, the evaluation worker, test mode, Ray nodes)
and then `gymnasium.make("Match-v0")`. Nothing here knows about herd: any package that
registers gymnasium ids on import works the same way.
"""
import gymnasium as gym

# The id stays free of the package name: herd's `module:` prefix only says what to import.
gym.register(id="Match-v0", entry_point="herd_example_envs.match:MatchEnv", max_episode_steps=20)
