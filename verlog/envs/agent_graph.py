"""The agent loop of every text game: reset → (memory → policy → environment)* → end.

* ``memory`` builds the prompt. Under verlog's protocol: the game's instruction as the system
  message, the last ``history_turns`` (observation, answer) exchanges, then ``Current
  Observation:`` — Verlog's default is one previous exchange, so a prompt stays the same size
  however long the episode. Under ``protocol="balrog"``: BALROG's naive-agent prompt (the
  instruction as the first user message, the last 16 observations, answers kept as BALROG cleans
  them; see :mod:`verlog.envs.balrog_protocol`), with the game in BALROG's settings. Its prose
  (each game's instruction, the answer rule, the invalid-answer note) is verlog's wording unless
  the user's BALROG is given (``balrog_source=PATH`` or ``$VERLOG_BALROG``:
  :mod:`verlog.envs.balrog_source`), whose texts, and TextWorld games, are then used verbatim.
  ``max_image_history`` above 0 plays BALROG's vision protocol (:mod:`verlog.envs.balrog_vision`):
  the newest observations carry an image of the game, an OpenAI ``image_url`` part after their
  text in the ``HumanMessage``'s content, for a vision-language model.
* ``policy`` asks the model for an answer (free reasoning, then ``ACTION: <action>``).
* ``environment`` steps the game with the answer text and reports the reward, the episode end
  and the step's info through LangChain's callback channel (``areport_reward``).

The graph files ``graphs/babyai.py``, ``graphs/babaisai.py`` and ``graphs/crafter.py`` are thin
wrappers choosing the game. Every node and router is ``async``: in an async run LangGraph
executes sync functions in a thread pool, a thread hop per step.

**Games live outside the state, and can be rebuilt from it.** The live game objects are kept in
the graph's own table (keyed by a per-episode id), so the state stays plain, checkpointable data;
the state also holds what rebuilds the game: its seed (drawn in ``reset`` when the input gives
none) and the answers it was stepped with (``actions``). A step whose game is not in the table
(a restarted server resuming a thread from its checkpoint, another worker, a game evicted from
the table) replays those answers on a fresh game of the same seed and checks it reaches the
observation the state holds; a game that does not (not deterministic under its seed) fails the
step with a clear error instead of playing on from another state. Finished games are closed at
once; the table keeps at most ``MAX_LIVE_GAMES`` games and closes those idle for
``IDLE_GAME_S`` seconds (a failed run's game), as both can be rebuilt. Games are built, reset
and replayed in a worker thread (TextWorld generates a game on first use); steps run on the
event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import re
import time
import uuid
from collections import OrderedDict
from typing import Any, Callable, Mapping, Sequence

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from verlog.envs import balrog_protocol, balrog_vision
from verlog.envs.balrog_source import BalrogSource, open_source
from verlog.envs.base import StepResult, TextEnv
from verlog.envs.family import check_protocol
from verlog.envs.live import playing
from verlog.envs.registry import get_family, make_env, split_env_name
from verlog.rollout.events import areport_reward
from verlog.step_info import ANCHOR_KEY

#: most games kept alive at once by one graph (the least recently stepped go first; a thread
#: that goes on rebuilds its game from the state)
MAX_LIVE_GAMES = 1024
#: a game not stepped for this long is closed (its run failed or was abandoned; rebuilt if it goes on)
IDLE_GAME_S = 3600.0


class GameState(TypedDict, total=False):
    """The graph state of one episode (plain data only)."""

    seed: int
    game_id: str
    #: the answers the game was stepped with, in order (with ``seed``: what rebuilds the game)
    actions: list[str]
    instruction: str
    observation: str
    #: what of ``observation`` the history keeps (BALROG drops NetHack's inventory from past ones)
    history_observation: str
    #: past (observation, answer) exchanges, oldest first
    history: list[tuple[str, str]]
    #: BALROG's vision protocol only: the PNG data URL of the current observation's image
    #: (``None`` for a game without one)
    image: str | None
    #: BALROG's vision protocol only: the images of the history's observations, one per exchange
    #: (``None`` where none is kept: only the newest ``max_image_history`` are)
    history_images: list[str | None]
    prompt: list[BaseMessage]
    answer: str
    feedback: str
    steps: int
    episode_return: float
    done: bool
    info: dict[str, Any]


def build_prompt(
    instruction: str, history: list[tuple[str, str]], observation: str, history_turns: int | None, feedback: str = ""
) -> list[BaseMessage]:
    """The messages of one policy call. ``history_turns=None`` keeps the whole history."""
    window = history if history_turns is None else (history[-history_turns:] if history_turns > 0 else [])
    messages: list[BaseMessage] = [SystemMessage(instruction)]
    for past_observation, past_answer in window:
        messages += [HumanMessage(f"Observation:\n{past_observation}"), AIMessage(past_answer)]
    note = f"{feedback}\n\n" if feedback else ""
    messages.append(HumanMessage(f"{note}Current Observation:\n{observation}"))
    return messages


def invalid_answer_feedback(executed: str) -> str:
    """The note verlog's protocol puts before the next observation after an invalid answer."""
    return f"Your last answer named no valid action, so '{executed}' was done instead."


def shown_step(
    result: StepResult, protocol: str, invalid_note: Callable[[str], str] = balrog_protocol.invalid_answer_note
) -> tuple[str, str, str]:
    """What a game graph keeps of a step: ``(observation, history_observation, feedback)``.

    Under BALROG's protocol an invalid answer's note (``invalid_note(executed action)``) goes where
    BALROG puts it: at the head of the observation's long-term part (what the history keeps: for
    NetHack, MiniHack and Crafter, all but the part only the current observation shows, which
    comes first), so the history keeps it too. Under verlog's, the note is ``feedback``, shown
    once before the next observation.
    """
    observation = result.observation
    past = str(result.info.get("history_observation") or observation)
    if result.info.get("valid_action", True):
        return observation, past, ""
    executed = str(result.info.get("action"))
    if protocol != "balrog":
        return observation, past, invalid_answer_feedback(executed)
    note = invalid_note(executed)
    if observation.endswith(past):  # the short-term part (if any) comes first, then the long-term
        return observation[: len(observation) - len(past)] + note + past, note + past, ""
    return note + observation, note + past, ""


def balrog_wording(env_name: str, source: BalrogSource | None, vision: bool = False) -> balrog_protocol.Wording:
    """The wording of ``env_name``'s games under BALROG's protocol: BALROG's own texts, read from
    ``source`` (the user's BALROG), or verlog's (``source=None``); ``vision``: the image note too
    (BALROG's vision protocol)."""
    if source is None:
        return balrog_protocol.VERLOG_WORDING
    family, task = split_env_name(env_name)
    settings = family.balrog
    if settings is None:
        raise ValueError(f"{env_name!r} has no BALROG protocol")
    name = settings.balrog_name(task)
    prompt = settings.prompt
    instruction = None if prompt is None else (lambda env: source.instruction(prompt(env, name)))
    return balrog_protocol.Wording(
        answer_rule=source.answer_rule,
        invalid_note=source.invalid_note,
        instruction=instruction,
        source=str(source.root),
        image_note=source.image_note if vision else balrog_vision.IMAGE_NOTE,
    )


def balrog_env_kwargs(env_name: str, source: BalrogSource | None) -> dict[str, Any]:
    """Constructor settings the user's BALROG gives ``env_name``'s game (TextWorld: its game files);
    none without a source."""
    if source is None:
        return {}
    family, task = split_env_name(env_name)
    if family.balrog is None or family.balrog.source_kwargs is None:
        return {}
    return dict(family.balrog.source_kwargs(source, family.balrog.balrog_name(task)))


def vision_env_kwargs(env_name: str, max_image_history: int) -> dict[str, Any]:
    """Constructor settings of BALROG's vision protocol for ``env_name``'s game (NetHack and
    MiniHack: the language-only text); none under the text protocol (``max_image_history`` 0)."""
    if max_image_history <= 0:
        return {}
    family, _ = split_env_name(env_name)
    return dict(family.balrog.vision_kwargs) if family.balrog is not None else {}


def build_env_graph(
    model: Any,
    env_name: str,
    *,
    history_turns: int | None = 1,
    max_tokens: int | None = None,
    env_kwargs: dict[str, Any] | None = None,
    protocol: str = "verlog",
    instruction: str | None = None,
    balrog_source: str | os.PathLike | Mapping[str, Any] | None = None,
    constrain_answers: bool = False,
    max_image_history: int = balrog_vision.TEXT_ONLY,
):
    """A compiled graph playing ``env_name`` with ``model``.

    Args:
        history_turns: past exchanges shown to the model (``None``: all of them); under
            ``protocol="balrog"``, past observations (BALROG: 16).
        max_tokens: the policy call's response budget (default: the model's own).
        env_kwargs: passed to ``make_env`` (``max_steps``, ``invalid_action_penalty``, ...).
        protocol: ``"verlog"`` (the training variant) or ``"balrog"`` (BALROG's game settings,
            prompt and answer rule).
        instruction: a text shown instead of the game's instruction, e.g. a short one for a small
            model trained from scratch; ``{mission}`` in it stands for the level's mission.
        balrog_source: under ``protocol="balrog"``, the user's BALROG (a checkout or its
            package folder, or ``{path, sha256}`` to insist on exact files; default
            ``$VERLOG_BALROG``): its instructions, answer rule, invalid-answer note and TextWorld
            games are used verbatim. Without one, the wording is verlog's.
        constrain_answers: each answer is held to one of the actions valid at that step (the
            policy call is bound to ``extra_body={"regex": ...}``, SGLang's constraint field, which
            verlog's engines and ``verlog serve-model`` enforce by token masking): a model that
            does not yet know the format plays from the first step. Off by default; a model
            behind an API that knows no ``regex`` field must leave it off.
        max_image_history: under ``protocol="balrog"``, BALROG's vision protocol when above 0
            (BALROG's VLM mode: 1): the newest this many observations that have an image carry
            it (:mod:`verlog.envs.balrog_vision`); 0, the default, is the text protocol.
    """
    check_protocol(protocol)
    balrog = protocol == "balrog"
    if balrog and history_turns is None:
        raise ValueError("protocol='balrog' keeps a fixed number of past observations: give history_turns (BALROG: 16)")
    if balrog_source and not balrog:
        raise ValueError("balrog_source applies to protocol='balrog' only (BALROG's wording and games)")
    balrog_vision.check_image_history(max_image_history)
    if max_image_history and not balrog:
        raise ValueError(
            f"max_image_history={max_image_history}: images are BALROG's vision protocol, give protocol='balrog' "
            "(verlog's protocol is text only: max_image_history 0)"
        )
    source = open_source(balrog_source) if balrog else None
    agent = _GameAgent(
        model.bind(max_tokens=max_tokens) if max_tokens else model,
        env_name,
        protocol=protocol,
        wording=balrog_wording(env_name, source, vision=max_image_history > 0),
        env_kwargs={
            **balrog_env_kwargs(env_name, source),
            **vision_env_kwargs(env_name, max_image_history),
            **(env_kwargs or {}),
        },
        history_turns=history_turns,
        instruction=instruction,
        constrain_answers=constrain_answers,
        max_image_history=max_image_history,
    )
    graph = StateGraph(GameState)
    graph.add_node("reset", agent.reset)
    graph.add_node("memory", agent.memory)
    graph.add_node("policy", agent.policy)
    graph.add_node("environment", agent.environment)
    graph.add_edge(START, "reset")
    graph.add_edge("reset", "memory")
    graph.add_edge("memory", "policy")
    graph.add_edge("policy", "environment")
    graph.add_conditional_edges("environment", agent.next_step, ["memory", END])
    # the graph carries the recursion limit its longest episode needs, so every runner of it
    # (LangGraph's server in any stream mode, ``graph.invoke``, verlog's runners when their config
    # sets none) lets an episode end at the game's own step cap
    cap = step_cap(env_name, protocol, agent.env_kwargs)
    return graph.compile().with_config(recursion_limit=recursion_limit_for(cap))


class _GameAgent:
    """The nodes of one game graph (see :func:`build_env_graph` for the settings) and the live
    games they step (:class:`GameTable`, rebuilt from the state when missing)."""

    def __init__(
        self,
        policy_model: Any,
        env_name: str,
        *,
        protocol: str,
        wording: balrog_protocol.Wording,
        env_kwargs: dict[str, Any],
        history_turns: int | None,
        instruction: str | None,
        constrain_answers: bool,
        max_image_history: int = 0,
    ):
        self.policy_model, self.env_name, self.protocol = policy_model, env_name, protocol
        self.balrog = protocol == "balrog"
        self.wording, self.env_kwargs = wording, env_kwargs
        self.history_turns, self.instruction, self.constrain_answers = history_turns, instruction, constrain_answers
        self.max_image_history = max_image_history
        self.games = GameTable()

    # ------------------------------------------------------------------ games
    def start_game(self, seed: int) -> tuple[TextEnv, str]:
        env = make_env(self.env_name, protocol=self.protocol, **self.env_kwargs)
        return env, env.reset(seed)

    def rebuild_game(self, state: GameState) -> TextEnv:
        """The game of ``state`` rebuilt from its seed and answers (see the module docstring)."""
        if "actions" not in state or state.get("seed") is None:
            raise RuntimeError(
                f"game {state.get('game_id')!r} is not running and the state cannot rebuild it "
                "(no seed or answer log: a state saved by an older verlog?)"
            )
        env, observation = self.start_game(state["seed"])
        for answer in state["actions"]:
            observation = self.shown(env.step(answer))[0]
        if observation != state["observation"]:
            env.close()
            raise RuntimeError(
                f"{self.env_name}: replaying the {len(state['actions'])} answers of game {state.get('game_id')!r} "
                f"(seed {state['seed']}) did not reach the saved observation: the game is not deterministic "
                "under its seed, so this thread cannot go on in a new process"
            )
        return env

    def shown(self, result: StepResult) -> tuple[str, str, str]:
        return shown_step(result, self.protocol, self.wording.invalid_note)

    def image_of(self, env: TextEnv) -> str | None:
        """The data URL of ``env``'s current observation image under BALROG's vision protocol
        (``None`` for a game without images, and under the text protocol: none is drawn)."""
        return balrog_vision.data_url_of(env) if self.max_image_history > 0 else None

    def kept_images(self, state: GameState) -> list[str | None]:
        """The history's images once the current observation joins it: only the newest
        ``max_image_history`` are kept (no prompt shows older ones), the others ``None``."""
        images = [*state.get("history_images", [None] * len(state["history"])), state.get("image")]
        kept, left = [], self.max_image_history
        for url in reversed(images):
            keep = url is not None and left > 0
            left -= keep
            kept.append(url if keep else None)
        return kept[::-1]

    async def game_of(self, state: GameState) -> TextEnv:
        env = self.games.get(state["game_id"])
        if env is None:  # another process's (or an evicted) game: rebuild it from the state
            env = await asyncio.to_thread(self.rebuild_game, state)
            self.games.add(state["game_id"], env)
        return env

    def prompt_of(self, state: GameState) -> list[BaseMessage]:
        """What the policy is shown in ``state`` (under training, also the value of a cut episode's
        next state)."""
        if self.balrog:
            assert self.history_turns is not None
            return balrog_protocol.build_prompt(
                state["instruction"],
                state["history"],
                state["observation"],
                self.history_turns,
                self.wording.answer_rule,
                images=state.get("history_images"),
                image=state.get("image"),
                max_image_history=self.max_image_history,
                image_note=self.wording.image_note,
            )
        return build_prompt(
            state["instruction"], state["history"], state["observation"], self.history_turns, state.get("feedback", "")
        )

    # ------------------------------------------------------------------ nodes
    async def reset(self, state: GameState) -> dict:
        # the seed is drawn here when the input gives none, so that the state can rebuild the game
        seed = state.get("seed")
        seed = random.randrange(2**31) if seed is None else seed
        # in a worker thread: building a game can take seconds (TextWorld generates and compiles
        # one on first use), which must not stall the other episodes on the event loop
        env, observation = await asyncio.to_thread(self.start_game, seed)
        game_id = uuid.uuid4().hex
        self.games.add(game_id, env)
        return {
            "seed": seed,
            "game_id": game_id,
            "actions": [],
            "observation": observation,
            "history_observation": str(getattr(env, "history_observation", None) or observation),
            "instruction": self.wording.instruction_for(env)
            if self.instruction is None
            else self.instruction.replace("{mission}", str(getattr(env, "mission", ""))),
            "history": [],
            **({"image": self.image_of(env), "history_images": []} if self.max_image_history > 0 else {}),
            "feedback": "",
            "steps": 0,
            "episode_return": 0.0,
            "done": False,
            "info": {},
        }

    async def memory(self, state: GameState) -> dict:
        return {"prompt": self.prompt_of(state)}

    async def policy(self, state: GameState) -> dict:
        model_now, env = self.policy_model, await self.game_of(state)
        if self.constrain_answers:
            model_now = model_now.bind(extra_body={"regex": answer_pattern(env.valid_actions())})
        with playing(env):  # a scripted demonstrator answering the call plays the game itself
            answer = await model_now.ainvoke(state["prompt"])
        return {"answer": answer.content if isinstance(answer.content, str) else str(answer.content)}

    async def environment(self, state: GameState) -> dict:
        env = await self.game_of(state)
        result = env.step(state["answer"])
        observation, history_observation, feedback = self.shown(result)
        image = self.image_of(env)  # before a finished game is closed: a cut episode's next prompt shows it
        # BALROG's history keeps the answer as it checked it
        answer = balrog_protocol.clean_answer(state["answer"]) if self.balrog else state["answer"]
        if result.done:
            self.games.close(state["game_id"])
        past = state.get("history_observation", state["observation"]) if self.balrog else state["observation"]
        update = {
            "actions": [*state.get("actions", []), state["answer"]],
            "history": [*state["history"], (past, answer)],
            **({"image": image, "history_images": self.kept_images(state)} if self.max_image_history > 0 else {}),
            "observation": observation,
            "history_observation": history_observation,
            "feedback": feedback,
            "steps": state["steps"] + 1,
            "episode_return": state["episode_return"] + result.reward,
            "done": result.done,
            "info": result.info,
        }
        # a step cap cut the game: the prompt the next step would show is the state to value
        cut = result.truncated and not result.terminated
        next_messages = self.prompt_of({**state, **update}) if cut else None
        # the state the step was taken in, for estimators that compare turns by state (GiGPO)
        anchor = hashlib.sha1(state["observation"].encode()).hexdigest()[:16]
        await areport_reward(
            result.reward,
            terminated=result.terminated,
            truncated=result.truncated,
            info={**result.info, ANCHOR_KEY: anchor},
            next_messages=next_messages,
        )
        return update

    async def next_step(self, state: GameState) -> str:
        return END if state["done"] else "memory"


class GameTable:
    """The live games of one graph, by episode id: least recently stepped first, at most
    ``MAX_LIVE_GAMES``, none idle longer than ``IDLE_GAME_S`` (every game dropped is closed)."""

    def __init__(self, max_games: int | None = None, idle_s: float | None = None) -> None:
        self.max_games = MAX_LIVE_GAMES if max_games is None else max_games
        self.idle_s = IDLE_GAME_S if idle_s is None else idle_s
        self._games: OrderedDict[str, tuple[TextEnv, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._games)

    def __contains__(self, game_id: str) -> bool:
        return game_id in self._games

    def get(self, game_id: str) -> TextEnv | None:
        """The game, marked as just used; ``None`` if it is not live."""
        entry = self._games.pop(game_id, None)
        if entry is None:
            return None
        self._games[game_id] = (entry[0], time.monotonic())
        return entry[0]

    def add(self, game_id: str, env: TextEnv) -> None:
        """Keep ``env``; close the games over the size cap and those idle too long."""
        self._games[game_id] = (env, time.monotonic())
        horizon = time.monotonic() - self.idle_s
        while self._games:
            oldest_id, (oldest, used) = next(iter(self._games.items()))
            if len(self._games) <= self.max_games and used >= horizon:
                break
            del self._games[oldest_id]
            oldest.close()

    def close(self, game_id: str) -> None:
        """Close and forget a game (its episode ended)."""
        entry = self._games.pop(game_id, None)
        if entry is not None:
            entry[0].close()


_REGEX_META = re.compile(r"[\\.^$|?*+()\[\]{}]")


def answer_pattern(actions: Sequence[str]) -> str:
    """A regular expression matched exactly by the action names ``actions``."""
    if not actions:
        raise ValueError("no valid actions to constrain an answer to")
    # only the metacharacters escaped: engines read the pattern with different regex dialects
    return "(" + "|".join(_REGEX_META.sub(r"\\\g<0>", a) for a in actions) + ")"


def recursion_limit_for(max_steps: int) -> int:
    """A recursion limit that lets an episode of ``max_steps`` steps finish (3 nodes per step)."""
    return 3 * max_steps + 10


def step_cap(env_name: str, protocol: str, env_kwargs: dict[str, Any]) -> int:
    """The most steps an episode of ``env_name`` can last with these settings: the game's own cap,
    read from a game built (and, where the level sets the cap, as in BALROG's BabyAI, reset) once."""
    env = make_env(env_name, protocol=protocol, **env_kwargs)
    try:
        if not env.max_steps:
            env.reset(0)
        cap = int(env.max_steps)
    finally:
        env.close()
    if cap < 1:
        raise ValueError(f"{env_name}: the game reports no step cap (max_steps={cap}); give max_steps")
    return cap


def build_game_graph(
    model: Any,
    env_name: str,
    *,
    protocol: str = "verlog",
    history_turns: int | None | str = "default",
    max_tokens: int | None | str = "default",
    max_steps: int | None = None,
    invalid_action_penalty: float | None = None,
    instruction: str | None = None,
    balrog_source: str | os.PathLike | Mapping[str, Any] | None = None,
    constrain_answers: bool = False,
    max_image_history: int = balrog_vision.TEXT_ONLY,
    **env_kwargs: Any,
):
    """:func:`build_env_graph` with the protocol's defaults: verlog's (one past exchange, the
    model's own answer budget) or BALROG's for the game's family (``BalrogSettings``: 16 past
    observations, 8192 tokens, its step cap). Explicit values override the defaults;
    ``balrog_source`` names the user's BALROG (its wording, see :func:`build_env_graph`);
    ``max_image_history`` above 0 plays BALROG's vision protocol (BALROG's VLM mode: 1)."""
    check_protocol(protocol)
    balrog = get_family(env_name).balrog if protocol == "balrog" else None
    if protocol == "balrog" and balrog is None:
        raise ValueError(f"{env_name!r} has no BALROG protocol")
    if history_turns == "default":
        history_turns = balrog.history_length if balrog else 1
    if max_tokens == "default":
        max_tokens = balrog.max_tokens if balrog else None
    kwargs = {"max_steps": max_steps, "invalid_action_penalty": invalid_action_penalty, **env_kwargs}
    return build_env_graph(
        model,
        env_name,
        history_turns=history_turns,
        max_tokens=max_tokens,  # type: ignore[arg-type]
        env_kwargs={k: v for k, v in kwargs.items() if v is not None},
        protocol=protocol,
        instruction=instruction,
        balrog_source=balrog_source,
        constrain_answers=constrain_answers,
        max_image_history=max_image_history,
    )
