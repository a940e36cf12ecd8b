"""verlog's text games: the ``TextEnv`` interface, the registry of every game by name, and the
players (oracles, scripted and random agents) that act through the same text.

    from verlog.envs import make_env, list_envs, play_steps
    env = make_env("babyai:goto", seed=0)

One folder per game family (``babyai/``, ``babaisai/``, ``crafter/``, ``textworld/``, ``nle/``
for MiniHack and NetHack), whose ``__init__`` declares the family (its tasks, BALROG's protocol,
its constants); the game modules themselves (minigrid, crafter, textworld, nle) are imported only
when a game of theirs is made.
"""

from verlog.envs.base import StepResult, TextAgent, TextEnv, play_steps
from verlog.envs.family import PROTOCOLS, BalrogSettings, EnvFamily, check_protocol
from verlog.envs.registry import families, get_family, list_envs, make_env, register_family
from verlog.step_info import StepInfo, episode_won, step_info

__all__ = [
    "PROTOCOLS",
    "BalrogSettings",
    "EnvFamily",
    "StepInfo",
    "StepResult",
    "TextAgent",
    "TextEnv",
    "check_protocol",
    "episode_won",
    "families",
    "get_family",
    "list_envs",
    "make_env",
    "play_steps",
    "register_family",
    "step_info",
]
