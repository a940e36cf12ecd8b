"""A small folder laid out like a BALROG checkout, with texts written for the tests (not BALROG's).

:func:`write_balrog_layout` writes the files verlog reads from a user's BALROG — the naive agent's
answer rule, the evaluator's invalid-answer note, the prompt builder's image note (BALROG's vision
protocol), each environment package's ``get_instruction_prompt`` and TextWorld's games folder —
each shaped as BALROG's are (the rule
inside a method, the note an f-string added before ``long_term_context``, imports of packages
that are not installed, a literal imported from a sibling module), so the tests check that verlog
reads them verbatim. :data:`EXPECTED` holds what each text must read.
"""

from __future__ import annotations

import shutil
from pathlib import Path

RULE = "FIXTURE RULE: answer with one action, nothing more."
NOTE = "\n\n[fixture] that was no action; ran {action} instead\n\nObservation:\n"

_NAIVE = '''
from balrog.agents.base import BaseAgent   # not importable here: verlog never imports this file


class NaiveAgent(BaseAgent):
    def act(self, obs, prev_action=None):
        naive_instruction = """
FIXTURE RULE: answer with one action, nothing more.
        """.strip()
        return naive_instruction
'''

_EVALUATOR = """
import numpy as np  # verlog reads this file, it does not run it


class Evaluator:
    def run_episode(self, env, agent, obs, action, response):
        obs["text"]["long_term_context"] = (
            f"\\n\\n[fixture] that was no action; ran {action} instead\\n\\nObservation:\\n"
            + obs["text"]["long_term_context"]
            if action != response
            else obs["text"]["long_term_context"]
        )
"""

IMAGE_NOTE = "[fixture] picture enclosed"

_HISTORY = """
from collections import deque  # verlog reads this file, it does not run it


class HistoryPromptBuilder:
    def get_prompt(self):
        messages = []
        for idx, event in enumerate(self._events):
            message_parts = ["Observation:"]
            if event.get("include_text", False):
                message_parts.append(event["text"])

            image = None
            if event.get("include_image", False):
                image = event["image"]
                message_parts.append("[fixture] picture enclosed")
            messages.append("\\n".join(message_parts))
        return messages
"""

_BABYAI = '''
from .clean_lang_wrapper import FixtureWrapper  # a class in a module verlog never runs

MOVES = {"turn left": "spin left", "go forward": "one step on"}


def get_instruction_prompt(env, mission="no mission"):
    moves = "; ".join(f"{k} = {v}" for k, v in MOVES.items())
    return f"""
FIXTURE BABYAI. Mission: {mission}. Moves: {moves}.
""".strip()
'''

_BABAISAI = """
from balrog.environments.babaisai.base import FixtureWrapper

__all__ = [FixtureWrapper]  # a NameError once the import is left out: skipped


def get_instruction_prompt(env, task=None):
    return f"FIXTURE BABAISAI for {task}"
"""

_CRAFTER = """
from .env import ACTIONS, FixtureCrafterWrapper


def get_instruction_prompt(task=None):
    return "FIXTURE CRAFTER " + str(task) + ": " + " | ".join(ACTIONS)
"""

_CRAFTER_ENV = """
import crafter_is_not_importable_here

ACTIONS = ["Noop", "Move West", "Move East"]


class FixtureCrafterWrapper:
    pass
"""

_TEXTWORLD = '''
from balrog.environments.textworld.base import TextWorldFactory

prompts = dict(
    treasure_hunter="""
    FIXTURE TREASURE HUNTER: find it.
    """,
    the_cooking_game="""
    FIXTURE COOKING: cook it.
    """,
    coin_collector="""
    FIXTURE COIN COLLECTOR: take the coin.
    """,
)


def get_instruction_prompt(env, task=None):
    return prompts[task].strip()
'''

_MINIHACK = """
from nle.language_wrapper.wrappers.nle_language_wrapper import NLELanguageWrapper

WORDS = {"north": "go up the map", "east": "go right", "south": "go down the map", "west": "go left"}


def get_instruction_prompt(env, task="none"):
    names = [NLELanguageWrapper.all_nle_action_map[a][0] for a in env.actions]
    listed = ", ".join(f"{n} ({WORDS[n]})" for n in names if n in WORDS)
    return f"FIXTURE MINIHACK {task}: {listed}"
"""

_NLE = """
import enum


class Role(enum.Enum):
    KNIGHT = "kni"


def get_instruction_prompt(task=None):
    return "FIXTURE NETHACK: get as deep as you can."
"""

_CONFIG = """
envs:
  textworld_kwargs:
    textworld_games_path: tw_games
"""

FILES = {
    "balrog/__init__.py": "",
    "balrog/agents/naive.py": _NAIVE,
    "balrog/evaluator.py": _EVALUATOR,
    "balrog/prompt_builder/history.py": _HISTORY,
    "balrog/config/config.yaml": _CONFIG,
    "balrog/environments/babyai_text/__init__.py": _BABYAI,
    "balrog/environments/babaisai/__init__.py": _BABAISAI,
    "balrog/environments/crafter/__init__.py": _CRAFTER,
    "balrog/environments/crafter/env.py": _CRAFTER_ENV,
    "balrog/environments/textworld/__init__.py": _TEXTWORLD,
    "balrog/environments/minihack/__init__.py": _MINIHACK,
    "balrog/environments/nle/__init__.py": _NLE,
}

#: what verlog must read from the layout
EXPECTED = {
    "babyai": "FIXTURE BABYAI. Mission: {mission}. Moves: turn left = spin left; go forward = one step on.",
    "babaisai": "FIXTURE BABAISAI for env/{task}",
    "crafter": "FIXTURE CRAFTER default: Noop | Move West | Move East",
    "textworld": {
        "treasure_hunter": "FIXTURE TREASURE HUNTER: find it.",
        "cooking": "FIXTURE COOKING: cook it.",
        "coin_collector": "FIXTURE COIN COLLECTOR: take the coin.",
    },
    "minihack": "FIXTURE MINIHACK MiniHack-{task}-v0: north (go up the map), east (go right), south (go down the map), "
    "west (go left)",
    "nethack": "FIXTURE NETHACK: get as deep as you can.",
    "image_note": IMAGE_NOTE,
}


def write_balrog_layout(root: Path, games: dict[str, list[tuple[Path, str]]] | None = None) -> Path:
    """Write the layout under ``root`` and return it. ``games``: BALROG task -> ``(game file, name
    in tw_games)`` pairs copied into ``tw_games/<task>/`` with the ``.json`` beside each (a name
    ending in ``.ulx`` gets only the ``.json`` and a stand-in Glulx file: TextWorld 1.7 cannot
    play Glulx, verlog rebuilds it from the ``.json``)."""
    for relative, text in FILES.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.lstrip("\n"))
    for task, files in (games or {}).items():
        folder = root / "tw_games" / task
        folder.mkdir(parents=True, exist_ok=True)
        for game, name in files:
            target = folder / name
            shutil.copy(game.with_suffix(".json"), target.with_suffix(".json"))
            if name.endswith(".ulx"):
                target.write_bytes(b"Glul stand-in: not playable by TextWorld 1.7")
            else:
                shutil.copy(game, target)
    return root
