"""Play a text game in the terminal, seeing exactly what a model reads.

``play("babyai:goto", seed=0)`` prints the instruction, then each observation and the valid
actions, and reads actions from the keyboard (a bare action name or a full answer ending in
``ACTION: ...``; ``quit`` stops). ``agent="bot"`` lets an oracle play instead: minigrid's
BabyAI bot, the scripted Crafter agent, the BabaIsAI solver when that package provides one, the
TextWorld game's own walkthrough, or the MiniHack search agent (NetHack has no bot).
Bots act only through ``env.step(text)``, like a model.
"""

from __future__ import annotations

import importlib
import re
from typing import Any, Callable

from verlog.envs.base import TextAgent, TextEnv
from verlog.envs.registry import make_env

RULE = "-" * 72


class _AnswerFnAgent:
    """Asks ``answer_fn(env)`` for each answer (an oracle that reads the env's state)."""

    def __init__(self, env: TextEnv, answer_fn: Callable[[TextEnv], str]) -> None:
        self.env = env
        self.answer_fn = answer_fn

    def reset(self) -> None:
        pass

    def act(self, observation: str) -> str:
        return self.answer_fn(self.env)


def _babaisai_bot(env: TextEnv) -> TextAgent | None:
    """The BabaIsAI solver as an agent, if ``verlog.envs.babaisai.solver`` offers one.

    Accepted solver APIs: ``bot_answer(env)`` returning the next answer text, or
    ``make_agent(env)`` returning a ``TextAgent``.
    """
    try:
        solver = importlib.import_module("verlog.envs.babaisai.solver")
    except ModuleNotFoundError:
        return None
    if hasattr(solver, "bot_answer"):
        return _AnswerFnAgent(env, solver.bot_answer)
    if hasattr(solver, "make_agent"):
        return solver.make_agent(env)  # type: ignore[no-any-return]
    return None


#: who answers in ``verlog play``
PLAY_AGENTS = ("human", "bot", "random")


def make_bot(env: TextEnv, name: str | None = None) -> TextAgent | None:
    """The oracle or scripted agent for ``env`` (registry ``name``, default ``env.name``), or
    ``None`` when the game has none."""
    family = re.split(r"[:/]", name or env.name, maxsplit=1)[0]
    if family == "babyai":
        from verlog.envs.babyai import BabyAIBotAgent, BabyAITextEnv

        assert isinstance(env, BabyAITextEnv)
        return BabyAIBotAgent(env)
    if family == "crafter":
        from verlog.envs.crafter_env import CrafterScriptedAgent

        return CrafterScriptedAgent()
    if family == "babaisai":
        return _babaisai_bot(env)
    if family == "textworld":
        from verlog.envs.textworld_env import TextWorldTextEnv, TextWorldWalkthroughAgent

        assert isinstance(env, TextWorldTextEnv)
        return TextWorldWalkthroughAgent(env)
    if family == "minihack":
        from verlog.envs.nle_agents import MiniHackSearchAgent
        from verlog.envs.nle_env import MiniHackTextEnv

        assert isinstance(env, MiniHackTextEnv)
        return MiniHackSearchAgent(can_open="open <direction>" in env.base_actions())
    return None


def play(
    name: str,
    seed: int | None = None,
    agent: str = "human",
    max_steps: int | None = None,
    input_fn: Callable[[str], str] = input,
    print_fn: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """Play one episode of ``name``; returns a summary (steps, return, success, last info).

    ``agent``: ``"human"`` reads answers with ``input_fn``; ``"bot"`` uses ``make_bot``;
    ``"random"`` answers with random valid actions. ``max_steps`` overrides the game's step cap.
    """
    if agent not in PLAY_AGENTS:
        raise ValueError(f"agent must be one of {', '.join(PLAY_AGENTS)}, not {agent!r}")
    env = make_env(name, seed=seed, max_steps=max_steps)
    observation = env.reset()
    bot: TextAgent | None = None
    if agent == "bot":
        bot = make_bot(env, name)
        if bot is None:
            raise ValueError(
                f"no bot is available for {name!r}: play it yourself (--agent human) or watch random "
                "valid actions (--agent random)"
            )
    elif agent == "random":
        from verlog.envs.nle_agents import RandomTextAgent

        bot = RandomTextAgent(env.valid_actions, seed=seed or 0)
    if bot is not None:
        bot.reset()

    print_fn(f"{RULE}\nINSTRUCTION\n{RULE}\n{env.instruction}")
    steps, total, info, stopped = 0, 0.0, {}, False
    while True:
        print_fn(f"{RULE}\nOBSERVATION (turn {steps + 1})\n{RULE}\n{observation}")
        actions = env.valid_actions()
        if len(actions) > 40 and hasattr(env, "base_actions"):  # NetHack-like: show the forms
            print_fn(f"Valid actions ({len(actions)}): {', '.join(env.base_actions())}")
        else:
            print_fn(f"Valid actions: {', '.join(actions)}")
        if bot is not None:
            answer = bot.act(observation)
            print_fn(f"> {answer}")
        else:
            try:
                answer = input_fn("> ")
            except (EOFError, KeyboardInterrupt):
                answer = "quit"
            if answer.strip().lower() in ("quit", "exit", "q"):
                stopped = True
                break
        result = env.step(answer)
        steps += 1
        total += result.reward
        info = result.info
        valid = "" if info.get("valid_action", True) else " (invalid answer)"
        print_fn(f"executed: {info.get('action')}{valid}  reward: {result.reward:+.2f}")
        observation = result.observation
        if result.done:
            end = "terminated" if result.terminated else "truncated"
            print_fn(f"{RULE}\nFINAL OBSERVATION\n{RULE}\n{observation}")
            print_fn(
                f"{RULE}\nepisode {end} after {steps} steps: return {total:+.2f}, "
                f"success {info.get('success')}"
            )
            break
    env.close()
    return {
        "env": name,
        "seed": seed,
        "steps": steps,
        "return": total,
        "success": bool(info.get("success", False)),
        "stopped": stopped,
        "info": info,
    }
