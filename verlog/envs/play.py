"""Play a text game in the terminal, seeing exactly what a model reads.

``play("babyai:goto", seed=0)`` prints the instruction, then at each turn the new message the
model would receive (the observation with the graph's own framing and notes, built by the same
functions the game graphs use), and nothing else; it reads answers from the keyboard (a bare
action name, or a full answer ending in ``ACTION: ...`` under verlog's protocol; ``quit`` stops).
``protocol="balrog"`` plays the game as BALROG's protocol does (see :mod:`verlog.envs.balrog_protocol`). ``agent="bot"`` lets an oracle play instead: minigrid's
BabyAI bot, the scripted Crafter agent, the BabaIsAI solver when that package provides one, the
TextWorld game's own walkthrough, or the MiniHack search agent (NetHack has no bot).
Bots act only through ``env.step(text)``, like a model.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from verlog.envs import balrog_protocol
from verlog.envs.agent_graph import balrog_env_kwargs, balrog_wording, build_prompt, shown_step
from verlog.envs.balrog_source import open_source
from verlog.envs.base import TextAgent, TextEnv
from verlog.envs.registry import get_family, make_env
from verlog.step_info import episode_won

RULE = "-" * 72


#: who answers in ``verlog play``
PLAY_AGENTS = ("human", "bot", "random")


def make_bot(env: TextEnv, name: str | None = None) -> TextAgent | None:
    """The oracle or scripted agent for ``env`` (registry ``name``, default ``env.name``), or
    ``None`` when the game has none (its family declares it: :mod:`verlog.envs.family`)."""
    family = get_family(re.split(r"[:/]", name or env.name, maxsplit=1)[0])
    return family.bot(env) if family.bot is not None else None


def model_message(
    observation: str, feedback: str, protocol: str, wording: balrog_protocol.Wording = balrog_protocol.VERLOG_WORDING
) -> str:
    """The newest user message a game graph sends the model for ``observation`` (``feedback``:
    verlog's note after an invalid answer; BALROG's is inside the observation), exactly as the
    graphs build it (under BALROG's protocol, in ``wording``)."""
    if protocol == "balrog":
        return balrog_protocol.build_prompt("", [], observation, answer_rule=wording.answer_rule)[-1].text
    return build_prompt("", [], observation, 0, feedback)[-1].text


def play(
    name: str,
    seed: int | None = None,
    agent: str = "human",
    max_steps: int | None = None,
    input_fn: Callable[[str], str] = input,
    print_fn: Callable[[str], Any] = print,
    protocol: str = "verlog",
    balrog_source: str | None = None,
) -> dict[str, Any]:
    """Play one episode of ``name``; returns a summary (steps, return, success, last info).

    ``agent``: ``"human"`` reads answers with ``input_fn``; ``"bot"`` uses ``make_bot``;
    ``"random"`` answers with random valid actions. ``max_steps`` overrides the game's step cap;
    ``protocol``: ``"verlog"`` or ``"balrog"`` (the game's settings and the model's framing);
    ``balrog_source``: under BALROG's protocol, your BALROG checkout (default ``$VERLOG_BALROG``),
    whose wording (and TextWorld games) are then shown, as the game graphs use them.
    """
    if agent not in PLAY_AGENTS:
        raise ValueError(f"agent must be one of {', '.join(PLAY_AGENTS)}, not {agent!r}")
    source = open_source(balrog_source) if protocol == "balrog" else None
    wording = balrog_wording(name, source) if protocol == "balrog" else balrog_protocol.VERLOG_WORDING
    env = make_env(name, seed=seed, max_steps=max_steps, protocol=protocol, **balrog_env_kwargs(name, source))
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
        from verlog.envs.nle.agents import RandomTextAgent

        bot = RandomTextAgent(env.valid_actions, seed=seed or 0)
    if bot is not None and protocol == "balrog":  # bots answer in verlog's format
        bot = balrog_protocol.BareAnswers(bot)
    if bot is not None:
        bot.reset()

    role = "first user message" if protocol == "balrog" else "system message"
    print_fn(f"{RULE}\nINSTRUCTION ({role})\n{RULE}\n{wording.instruction_for(env)}")
    steps, total, info, stopped, feedback = 0, 0.0, {}, False, ""
    while True:
        print_fn(
            f"{RULE}\nTURN {steps + 1}: what the model reads\n{RULE}\n"
            f"{model_message(observation, feedback, protocol, wording)}"
        )
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
        observation, _, feedback = shown_step(result, protocol, wording.invalid_note)
        if result.done:
            end = "terminated" if result.terminated else "truncated"
            print_fn(f"{RULE}\nFINAL OBSERVATION\n{RULE}\n{observation}")
            print_fn(f"{RULE}\nepisode {end} after {steps} steps: return {total:+.2f}, success {info.get('success')}")
            break
    env.close()
    return {
        "env": name,
        "seed": seed,
        "steps": steps,
        "return": total,
        "success": episode_won(info),
        "stopped": stopped,
        "info": info,
    }
