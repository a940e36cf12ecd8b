"""A breadth-first solver for BabaIsAI and a bot that plays through the text interface.

:func:`solve` searches the full game state (every word block and object, so rules are
recomputed along the way) and returns a shortest winning action sequence. The bot
(:func:`bot_answer`, :func:`play_bot_episode`) plans with the solver but acts only by sending text
answers such as ``"ACTION: up"`` to :meth:`BabaIsAIEnv.step`, which exercises the same parsing and
episode logic a language model goes through.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .game import GameState, engine_for

if TYPE_CHECKING:  # pragma: no cover
    from verlog.envs.base import StepResult

    from .env import BabaIsAIEnv

#: moves the solver tries; waiting never changes the state, so it never helps
_MOVES: tuple[str, ...] = ("up", "down", "left", "right")


_Key = tuple[tuple[int, ...], tuple[int, ...]]

#: shortest remaining plans found so far, keyed by (width, height, state key); every state along
#: a found path is stored, so a bot following a plan never searches twice
_PLANS: dict[tuple[int, int, _Key], tuple[str, ...]] = {}
#: states proven unsolvable within a depth: (width, height, key) -> that depth
_NO_PLAN: dict[tuple[int, int, _Key], int] = {}
_CACHE_LIMIT = 100_000


def solve(state: GameState, max_depth: int = 100, max_states: int = 3_000_000) -> list[str] | None:
    """A shortest action list that wins from ``state``, or ``None`` when there is none within
    ``max_depth`` moves (or the search visits more than ``max_states`` states).

    Breadth-first over full states (word blocks and objects; rules follow from the words), with
    waiting left out since it never changes a state. Results are cached per state.
    """
    if state.is_won():
        return []
    where = (state.width, state.height, state.key)
    plan = _PLANS.get(where)
    if plan is not None:
        return list(plan) if len(plan) <= max_depth else None
    if _NO_PLAN.get(where, -1) >= max_depth:
        return None
    path = _bfs(state, max_depth, max_states)
    if len(_PLANS) > _CACHE_LIMIT:
        _PLANS.clear()
    if len(_NO_PLAN) > _CACHE_LIMIT:
        _NO_PLAN.clear()
    if path is None:
        _NO_PLAN[where] = max_depth
        return None
    keys, actions = path
    for i, key in enumerate(keys):
        _PLANS[(state.width, state.height, key)] = tuple(actions[i:])
    return list(actions)


def _bfs(state: GameState, max_depth: int, max_states: int) -> tuple[list[_Key], list[str]] | None:
    """Breadth-first search; returns the states along the path (start included, win excluded)
    and the actions, or ``None``."""
    engine = engine_for(state.width, state.height)
    deltas = [(a, engine.deltas[a]) for a in _MOVES]
    advance = engine.advance
    start = state.key
    parent: dict[_Key, tuple[_Key, str] | None] = {start: None}
    frontier = [start]
    for _ in range(max_depth):
        nxt = []
        for key in frontier:
            words, objects = key
            for action, delta in deltas:
                w2, o2, won, lost = advance(words, objects, delta)
                child = (w2, o2)
                if child in parent:
                    continue
                parent[child] = (key, action)
                if won:
                    keys: list[_Key] = []
                    actions: list[str] = []
                    link = parent[child]
                    while link is not None:
                        prev, act = link
                        keys.append(prev)
                        actions.append(act)
                        link = parent[prev]
                    return keys[::-1], actions[::-1]
                if not lost:
                    nxt.append(child)
        if not nxt or len(parent) > max_states:
            return None
        frontier = nxt
    return None


def bot_answer(env: "BabaIsAIEnv") -> str:
    """The bot's next answer text for ``env``'s current state (``"ACTION: <move>"``).

    Plans a shortest win from the state the env is in now (cached, so following the plan step
    by step costs one search); answers ``idle`` when no win is reachable in the steps left.
    """
    plan = solve(env.state, max_depth=max(1, env.max_steps - env.steps_taken))
    move = plan[0] if plan else "idle"
    return f"Following the shortest plan to a win.\nACTION: {move}"


def bot_actions(env: "BabaIsAIEnv") -> list[str]:
    """The whole plan from the env's current state as answer texts (empty when unsolvable)."""
    plan = solve(env.state, max_depth=max(1, env.max_steps - env.steps_taken)) or []
    return [f"ACTION: {move}" for move in plan]


def play_bot_episode(env: "BabaIsAIEnv", seed: int | None = None) -> list["StepResult"]:
    """Reset ``env`` with ``seed`` and let the bot play to the end through ``env.step`` (text)."""
    env.reset(seed=seed)
    results = []
    while True:
        result = env.step(bot_answer(env))
        results.append(result)
        if result.done:
            return results
