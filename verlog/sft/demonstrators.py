"""Who answers the graph's model calls in a demonstration: a scripted agent or a teacher model.

A demonstrator sees each call as a :class:`DemoCall` (the messages and tools the graph passed, the
grammar the answer must follow, the episode's task, and for a game graph the live game itself) and
returns the answer: text, or an ``AIMessage`` whose tool calls are written the way the policy
writes them. :class:`~verlog.sft.engine.DemonstrationEngine` turns the answer into the policy's
token ids, so the graph, its chat model and verlog's recorder run exactly as in training.

The scripted agents verlog ships:

* :class:`GameBot` (``agent: game``): the game's own oracle on the live game (minigrid's BabyAI bot,
  the Sokoban solver, TextWorld's walkthrough, BabaIsAI's solver, the Crafter and MiniHack scripts);
* :class:`RowAnswer` (``agent: answer``): a data row's answer column (e.g. the calculator's exact
  result);
* :class:`FunctionAgent` (``agent: file.py:function``): your own, called with the :class:`DemoCall`.

and :class:`Teacher` (``source: teacher``): any OpenAI-compatible endpoint, a stronger model.
"""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from langchain_core.messages import AIMessage, BaseMessage

from verlog.backends.base import Constraint
from verlog.data.tasks import Task
from verlog.envs.base import TextAgent, TextEnv
from verlog.llm.tool_calls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

__all__ = [
    "DemoCall",
    "DemonstrationError",
    "Demonstrator",
    "FunctionAgent",
    "GameBot",
    "RowAnswer",
    "Teacher",
    "answer_text",
]


class DemonstrationError(RuntimeError):
    """A demonstrator cannot answer a call (no bot for the game, no answer in the row, an answer
    outside the call's grammar): the episode fails and is not a demonstration."""


@dataclass(frozen=True)
class DemoCall:
    """One model call of the graph, as a demonstrator sees it.

    ``messages`` and ``tools`` are what the graph passed (tools as OpenAI schemas, ``None``: none
    offered); ``tool_choice`` is ``"required"``, a tool's name or ``None``; ``constraint`` is the
    grammar the answer must follow (e.g. the valid actions' regex of ``constrain_answers``);
    ``task`` is the episode's (its seed or row); ``game`` the live game of a game graph (``None``
    otherwise: :func:`verlog.envs.live.live_game`); ``index`` the call's number in its episode."""

    messages: tuple[BaseMessage, ...]
    tools: tuple[dict[str, Any], ...] | None
    tool_choice: str | None
    constraint: Constraint | None
    task: Task
    game: TextEnv | None
    index: int
    episode_id: str


class Demonstrator(Protocol):
    """Answers a graph's model calls in demonstrations; ``forget`` is called when an episode ends."""

    async def answer(self, call: DemoCall) -> str | AIMessage: ...

    def forget(self, episode_id: str) -> None: ...


def answer_text(answer: str | AIMessage) -> str:
    """The text the policy would write for ``answer``: its content, then each tool call as a
    ``<tool_call>`` block (the Hermes format verlog's chat model reads, with the JSON laid out as
    a forced tool call's prefix writes it)."""
    if isinstance(answer, str):
        return answer
    content = answer.content if isinstance(answer.content, str) else _text_of(answer.content)
    blocks = [
        f"{TOOL_CALL_OPEN}\n{json.dumps({'name': call['name'], 'arguments': call['args']}, ensure_ascii=False)}\n"
        f"{TOOL_CALL_CLOSE}"
        for call in answer.tool_calls
    ]
    return "\n".join(part for part in (content.strip() if blocks else content, *blocks) if part)


def _text_of(content: list[Any]) -> str:
    return "".join(p if isinstance(p, str) else str(p.get("text", "")) for p in content if isinstance(p, (str, dict)))


#: "ACTION: x" (verlog's answer format) -> "x", for a call whose grammar takes the bare name
_ACTION_LINE = re.compile(r"(?is).*\bACTION\s*:\s*(.+?)\s*$")


def fit_to_regex(text: str, constraint: Constraint | None) -> str:
    """``text``, or its bare action (``ACTION: go forward`` -> ``go forward``) when the call's
    regex takes bare action names and not the full answer (a bot answers in the game's own
    format; ``constrain_answers`` holds the policy to the names)."""
    if constraint is None or constraint.kind != "regex" or re.fullmatch(constraint.grammar, text):
        return text
    bare = _ACTION_LINE.match(text)
    if bare and re.fullmatch(constraint.grammar, bare.group(1)):
        return bare.group(1)
    return text


class GameBot:
    """The game's own oracle or scripted player (its family's ``bot``) playing the live game the
    graph's call is made for: one bot per episode, started on its first call. The graph steps
    the game with the bot's answer, as it would with the policy's."""

    def __init__(self) -> None:
        self._bots: dict[str, tuple[TextEnv, TextAgent]] = {}

    async def answer(self, call: DemoCall) -> str:
        if call.game is None:
            raise DemonstrationError(
                "agent game: this call is not made by a game graph's policy node (no live game); give "
                "agent: answer or your own agent (file.py:function)"
            )
        held = self._bots.get(call.episode_id)
        if held is None or held[0] is not call.game:  # a new episode, or its game was rebuilt
            from verlog.envs.play import make_bot

            bot = make_bot(call.game)
            if bot is None:
                raise DemonstrationError(f"{call.game.name} has no scripted player: use a teacher or your own agent")
            bot.reset()
            held = self._bots[call.episode_id] = (call.game, bot)
        return fit_to_regex(held[1].act(""), call.constraint)

    def forget(self, episode_id: str) -> None:
        self._bots.pop(episode_id, None)


class RowAnswer:
    """Answers every call with the episode's row's ``column`` (the task's exact answer)."""

    def __init__(self, column: str) -> None:
        self.column = column

    async def answer(self, call: DemoCall) -> str:
        row = call.task.row
        if row is None:
            raise DemonstrationError("agent answer plays data rows: this config's episodes are seeds (no row)")
        if self.column not in row or row[self.column] is None:
            raise DemonstrationError(
                f"agent answer: the row has no {self.column!r} (answer_column); its columns: {', '.join(row)}"
            )
        return str(row[self.column])

    def forget(self, episode_id: str) -> None:
        pass


class FunctionAgent:
    """A user's scripted agent: ``function(call: DemoCall)`` returning the answer (text or an
    ``AIMessage``), sync or async."""

    def __init__(self, function: Callable[[DemoCall], Any]) -> None:
        self.function = function

    async def answer(self, call: DemoCall) -> str | AIMessage:
        result = self.function(call)
        if inspect.isawaitable(result):
            result = await result
        if not isinstance(result, (str, AIMessage)):
            raise DemonstrationError(
                f"{getattr(self.function, '__name__', 'agent')} returned {type(result).__name__}: return the "
                "answer's text or an AIMessage"
            )
        return result

    def forget(self, episode_id: str) -> None:
        pass


class Teacher:
    """A stronger model behind an OpenAI-compatible endpoint answering each call with the same
    messages and tools (``tool_choice`` passed on); ``temperature`` and ``max_tokens`` its own."""

    def __init__(self, chat_model: Any) -> None:
        self.chat_model = chat_model

    async def answer(self, call: DemoCall) -> AIMessage:
        model = self.chat_model
        if call.tools:
            choice = call.tool_choice
            model = model.bind_tools(list(call.tools), **({"tool_choice": choice} if choice else {}))
        elif call.constraint is not None and call.constraint.kind == "regex":
            model = model.bind(extra_body={"regex": call.constraint.grammar})  # SGLang's (and verlog's) field
        reply = await model.ainvoke(list(call.messages))
        if not isinstance(reply, AIMessage):
            raise DemonstrationError(f"the teacher answered {type(reply).__name__}, not a chat message")
        return reply

    def forget(self, episode_id: str) -> None:
        pass
