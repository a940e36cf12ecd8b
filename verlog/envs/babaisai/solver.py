"""A breadth-first solver for BabaIsAI and a bot that plays through the text interface.

:func:`solve` searches the full game state (every word block and object, so rules are
recomputed along the way) and returns a shortest winning action sequence. The bot
(:func:`bot_answer`, :func:`play_bot_episode`) plans with the solver but acts only by sending text
answers such as ``"ACTION: up"`` to :meth:`BabaIsAIEnv.step`, which exercises the same parsing and
episode logic a language model goes through.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .game import IS, NOUN_BASE, GameState, engine_for, property_word

YOU_WORD = property_word("you")

if TYPE_CHECKING:  # pragma: no cover
    from verlog.envs.base import StepResult

    from .env import BabaIsAIEnv

#: moves the solver tries; waiting never changes the state, so it never helps
_MOVES: tuple[str, ...] = ("up", "down", "left", "right")


_Key = tuple[tuple[int, ...], tuple[int, ...]]

#: shortest remaining plans found so far, keyed by (width, height, state key); every state along
#: a found path is stored, so a bot following a plan never searches twice
_PLANS: dict[tuple[int, int, str, _Key], tuple[str, ...]] = {}
#: states proven unsolvable within a depth: (width, height, win rule, key) -> that depth
_NO_PLAN: dict[tuple[int, int, str, _Key], int] = {}
_CACHE_LIMIT = 100_000


def solve(
    state: GameState, max_depth: int = 100, max_states: int = 3_000_000, win_rule: str = "current"
) -> list[str] | None:
    """A shortest action list that wins from ``state``, or ``None`` when there is none within
    ``max_depth`` moves (or the search visits more than ``max_states`` states).

    Breadth-first over full states (word blocks and objects; rules follow from the words), with
    waiting left out since it never changes a state. ``win_rule``: when a win counts (see
    :mod:`.game`). Results are cached per state. A state of the original's stacks is searched
    with every object acting (:meth:`GameState.flattened`).
    """
    state = state.flattened()
    if win_rule == "current" and state.is_won():
        return []
    where = (state.width, state.height, win_rule, state.key)
    plan = _PLANS.get(where)
    if plan is not None:
        return list(plan) if len(plan) <= max_depth else None
    if _NO_PLAN.get(where, -1) >= max_depth:
        return None
    path = None
    for frozen, budget in _stages(state, max_states):
        path = _bfs(state, max_depth, budget, win_rule, frozen)
        if path is not None:
            break
    if len(_PLANS) > _CACHE_LIMIT:
        _PLANS.clear()
    if len(_NO_PLAN) > _CACHE_LIMIT:
        _NO_PLAN.clear()
    if path is None:
        _NO_PLAN[where] = max_depth
        return None
    keys, actions = path
    for i, key in enumerate(keys):
        _PLANS[(state.width, state.height, win_rule, key)] = tuple(actions[i:])
    return list(actions)


#: most states the bot's search visits in one reply (an unsolvable level then costs seconds, not minutes)
BOT_MAX_STATES = 300_000
#: states each narrowed search may visit before the next, wider one is tried
_STAGE_STATES = 60_000


def _word_groups(state: GameState) -> tuple[set[int], set[int], set[int]]:
    """Indices (into ``state.words``) of: the loose nouns (in no active rule), the words of active
    rules other than YOU rules, the nouns of YOU rules."""
    at = {(x, y): (i, k) for i, (k, x, y) in enumerate(state.iter_words())}
    you_rule: set[int] = set()
    other_rule: set[int] = set()
    for (x, y), (i, k) in at.items():
        if k != IS:
            continue
        for dx, dy in ((1, 0), (0, 1)):
            before, after = at.get((x - dx, y - dy)), at.get((x + dx, y + dy))
            if before is None or after is None or not (NOUN_BASE <= before[1] < IS) or after[1] == IS:
                continue
            (you_rule if after[1] == YOU_WORD else other_rule).update({before[0], i, after[0]})
    nouns = {i for i, (k, _, _) in enumerate(state.iter_words()) if NOUN_BASE <= k < IS}
    loose_nouns = nouns - you_rule - other_rule
    return loose_nouns, other_rule - you_rule, nouns & you_rule


def _stages(state: GameState, max_states: int) -> list[tuple[frozenset[int], int]]:
    """The searches to try, narrowest first, as (word blocks that must stay put, state budget).

    Levels are solved by moving few words: one loose noun (to make a rule), perhaps with the
    words of a rule to break (WALL IS STOP) or a YOU rule's noun (to make something else YOU). So
    the searches let move: each loose noun alone; then each with one word of another rule; then
    each with the other rules' words; then each
    with the other rules' words and the YOU rules' nouns; then every loose noun with those; then
    every word. A narrow search is far smaller (pushes of words that do not matter are never
    explored); its plan may be a few moves longer than the shortest.
    """
    everything = frozenset(range(len(state.words)))
    loose_nouns, other_rule, you_nouns = _word_groups(state)
    budget = min(_STAGE_STATES, max_states)
    singles: list[set[int]] = [{n} for n in sorted(loose_nouns)] or [set()]
    pairs = [n | {w} for n in singles for w in sorted(other_rule)]  # make one rule, break another
    movable_sets = [
        *singles,
        *pairs,
        *(n | other_rule for n in singles),
        *(n | other_rule | you_nouns for n in singles),
        loose_nouns | other_rule | you_nouns,
    ]
    stages: list[tuple[frozenset[int], int]] = []
    seen: set[frozenset[int]] = set()
    for movable in movable_sets:
        frozen = everything - movable
        if frozen not in seen:
            seen.add(frozen)
            stages.append((frozen, budget))
    stages.append((frozenset(), max_states))
    return stages


def _bfs(
    state: GameState,
    max_depth: int,
    max_states: int,
    win_rule: str = "current",
    frozen: frozenset[int] = frozenset(),
) -> tuple[list[_Key], list[str]] | None:
    """Breadth-first search in which the word blocks at the indices ``frozen`` never move;
    returns the states along the path (start included, win excluded) and the actions, or
    ``None``."""
    engine = engine_for(state.width, state.height, win_rule)
    fixed = [(i, state.words[i]) for i in sorted(frozen)]
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
                if won:  # checked first: under the previous-rules win, a known state can be won into
                    keys: list[_Key] = []
                    actions: list[str] = []
                    link: tuple[_Key, str] | None = (key, action)
                    while link is not None:
                        prev, act = link
                        keys.append(prev)
                        actions.append(act)
                        link = parent[prev]
                    return keys[::-1], actions[::-1]
                if child in parent or (w2 is not words and any(w2[i] != c for i, c in fixed)):
                    continue
                parent[child] = (key, action)
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
    plan = solve(
        env.state, max_depth=max(1, env.max_steps - env.steps_taken), max_states=BOT_MAX_STATES, win_rule=env.win_rule
    )
    move = plan[0] if plan else "idle"
    if env.protocol == "balrog":  # BALROG accepts only the bare action name
        return move
    return f"Following the shortest plan to a win.\nACTION: {move}"


def bot_actions(env: "BabaIsAIEnv") -> list[str]:
    """The whole plan from the env's current state as answer texts (empty when unsolvable)."""
    plan = solve(env.state, max_depth=max(1, env.max_steps - env.steps_taken), win_rule=env.win_rule) or []
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
