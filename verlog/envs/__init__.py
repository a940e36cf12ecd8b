"""verlog's text games: the ``TextEnv`` interface, the registry of every game by name, and the
players (oracles, scripted and random agents) that act through the same text.

    from verlog.envs import make_env, list_envs, play_steps
    env = make_env("babyai:goto", seed=0)

Game modules (minigrid, crafter, textworld, nle) are imported only when a game of theirs is made.
"""

from verlog.envs.base import StepResult, TextAgent, TextEnv, play_steps
from verlog.envs.registry import list_envs, make_env

__all__ = ["StepResult", "TextAgent", "TextEnv", "list_envs", "make_env", "play_steps"]
