"""TextWorld's prompts under ``--balrog``, message for message, against what BALROG's code gives.

A folder laid out like BALROG (``tests/balrog_layout.py``) holds one Z-machine game (``.z8``) per
TextWorld task, generated for the test; BALROG ships its cooking games in this format. The
reference below is BALROG's pipeline for such a file, written from BALROG's code
(balrog-ai/BALROG ``environments/textworld/base.py``, ``prompt_builder/history.py``,
``agents/naive.py``, ``evaluator.py``): TextWorld plays the file with BALROG's info request, each
text is what follows the last exact copy of the goal, stripped (nothing else removed: the
Z-machine status line stays), and the prompt is the instruction, then the last 32 events
(observations and answers), the newest 16 observations with their text, ``Current
Observation:`` last, the answer rule after a blank line. verlog's TextWorld graph plays the same
answers on the same file, and every prompt must be identical (the count is printed).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from pathlib import Path

import pytest
from balrog_layout import EXPECTED, RULE, write_balrog_layout
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage

from verlog.envs.balrog_source import ENV_VAR
from verlog.graph_file import load_graph_file

pytest.importorskip("textworld")

ROOT = Path(__file__).resolve().parents[1]
SEED = 1_000_000  # verlog eval's first seed; with one game per task every seed plays it
#: verlog's task -> (BALROG's task folder, generator settings of the test's small game)
GAMES = {
    "cooking": (
        "the_cooking_game",
        {
            "recipe": 2,
            "take": 2,
            "go": 6,
            "open": True,
            "cook": True,
            "cut": True,
            "drop": False,
            "split": "test",
            "recipe_seed": 0,
        },
    ),
    "coin_collector": ("coin_collector", {"level": 5, "only_last_action": True}),
    "treasure_hunter": ("treasure_hunter", {"level": 5, "only_last_action": True}),
}
#: answers beside the walkthrough: an unknown verb, a request for the goal, an empty command
EXTRA_ANSWERS = ["look", "dance wildly", "goal", "inventory"]


class Recording(GenericFakeChatModel):
    """A fake chat model keeping every prompt it is given."""

    prompts: list = []

    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):  # type: ignore[override]
        self.prompts.append(messages)
        return await super()._agenerate(messages, stop=stop, run_manager=run_manager, **kwargs)


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> Path:
    from verlog.envs.textworld.games import build_game

    cache = tmp_path_factory.mktemp("tw-cache")
    games = {}
    for family, (task, settings) in GAMES.items():
        path, _ = build_game(family, settings, 0, cache)
        games[task] = [(path, f"{task}_0.z8")]
    return write_balrog_layout(tmp_path_factory.mktemp("BALROG"), games)


@pytest.fixture(autouse=True)
def no_user_balrog(monkeypatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)


def balrogs_prompts(game: Path, instruction: str, answers: list[str], max_steps: int) -> list[list[tuple[str, str]]]:
    """The prompts BALROG's naive agent sends playing ``answers`` on ``game`` (see the module
    docstring), as (role, content) pairs."""
    import textworld

    infos = textworld.EnvInfos(objective=True, description=True, score=True, max_score=True, won=True)
    env = textworld.start(str(game), request_infos=infos)

    def text(state) -> str:
        return state.feedback.split(state["objective"])[-1].strip()

    events: deque = deque(maxlen=32)
    prompts = []
    observation, previous = text(env.reset()), None
    for step in range(max_steps):
        if previous:
            events.append(("action", previous))
        events.append(("observation", observation))
        with_text, wanted = set(), 16
        for index in reversed(range(len(events))):
            if events[index][0] == "observation" and wanted > 0:
                with_text.add(index)
                wanted -= 1
        messages = [("user", instruction)]
        for index, (kind, value) in enumerate(events):
            if kind == "action":
                messages.append(("assistant", value))
                continue
            parts = ["Current Observation:" if index == len(events) - 1 else "Observation:"]
            if index in with_text:
                parts.append(value)
            messages.append(("user", "\n".join(parts)))
        messages[-1] = ("user", messages[-1][1] + "\n\n" + RULE)
        prompts.append(messages)
        state, _, done = env.step(answers[step])
        observation, previous = text(state), answers[step]
        if done:
            break
    env.close()
    return prompts


def _pairs(messages) -> list[tuple[str, str]]:
    return [
        ("user" if isinstance(m, HumanMessage) else "assistant" if isinstance(m, AIMessage) else m.type, m.content)
        for m in messages
    ]


@pytest.mark.parametrize("family", list(GAMES))
def test_textworld_prompts_are_balrogs_for_its_zmachine_games(layout: Path, family: str) -> None:
    task = GAMES[family][0]
    game = layout / "tw_games" / task / f"{task}_0.z8"
    walkthrough = json.loads(game.with_suffix(".json").read_text())["metadata"]["walkthrough"]
    answers = EXTRA_ANSWERS + list(walkthrough)
    max_steps = len(answers)
    model = Recording(messages=iter(AIMessage(a) for a in answers))
    model.prompts = []
    graph = load_graph_file(ROOT / "graphs" / "textworld.py").build(
        model, game=family, protocol="balrog", max_steps=max_steps, balrog_source=str(layout)
    )
    state = asyncio.run(asyncio.wait_for(graph.ainvoke({"seed": SEED}), 300))
    assert state["info"]["game_file"] == game.name and state["info"]["won"]

    expected = balrogs_prompts(game, EXPECTED["textworld"][family], answers, max_steps)
    ours = [_pairs(p) for p in model.prompts]
    identical = sum(a == b for a, b in zip(ours, expected))
    print(f"textworld/{task}: {identical}/{len(expected)} prompts identical to BALROG's")
    assert len(ours) == len(expected) > len(EXTRA_ANSWERS)
    first = next((i for i, (a, b) in enumerate(zip(ours, expected)) if a != b), None)
    assert identical == len(expected), (first, ours[first], expected[first])
    # the Z-machine status line is part of what BALROG's model reads after every command
    assert all(
        m[-1][1].split("\n\n" + RULE)[0].rstrip().splitlines()[-1].lstrip().startswith(">") for m in expected[1:]
    )
