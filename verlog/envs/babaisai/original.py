"""One move under the original BabaIsAI's rules, the ones BALROG plays (cells hold stacks).

The original game (nacloos/baba-is-ai) keeps a *stack* of things in every cell and lets only the
top one act. :func:`advance_original` applies one move to a state of :mod:`.game` that way:

* **YOU objects move one at a time**, in reading order of their cells (a cell's top thing only;
  each moves at most once a step). An object moving onto a cell is put on top of what is there:
  an object it covers no longer acts (it does not move, block, push, win or count as YOU) until
  it is uncovered. YOU does not block other objects; STOP does; word blocks and the border do.
* **Pushing** goes from the far end: the top thing of the next cell, if it is a word block or a
  PUSH object, is pushed first (recursively); then the mover enters if that cell's top (after
  the push) is empty or can be overlapped (an object without STOP: even a PUSH object that could
  not be pushed). A word uncovered by a push stops what pushed it.
* **Win and loss** are read, for each mover, from the top thing of the cell it ends in, with the
  rules in force before the move (WIN: won, DEFEAT: lost; a mover that could not move reads its
  own cell, itself); only the last mover's reading counts.
* After the moves the rules are read again from the top word blocks, then every ``A IS B`` rule,
  in rule order, puts a new ``B`` on top of each cell whose top is an ``A`` (the ``A`` stays
  under it). Waiting changes nothing.

A :class:`~.game.GameState` holds these stacks as: the top object of each cell whose top is an
object (``objects``), every other object (``buried``, lowest first in each cell), and the word
blocks (``words``, which always lie over objects; of two in a cell the later is on top).
The solver keeps planning with :class:`~.game.Engine` (a line of YOU objects moves together,
NOUN IS NOUN turns objects in place); the difference shows only with several YOU objects or
``A IS B`` rules.
"""

from __future__ import annotations

from typing import Any

from .game import _CELL, _SHIFT, DEFEAT, IS, NOUN_BASE, PUSH, STOP, WIN, YOU, Engine

_WORD, _OBJECT = 0, 1


def advance_original(
    engine: Engine, words: tuple[int, ...], objects: tuple[int, ...], buried: tuple[int, ...], delta: int
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], bool, bool]:
    """Apply one move (grid offset ``delta``; 0 waits) under the original's rules (see the
    module docstring): ``(words, objects, buried, won, lost)``; ``lost`` means a DEFEAT object
    was stepped on (a state without YOU objects is the caller's to judge)."""
    if delta == 0:
        return words, objects, buried, False, False
    props = engine.rules(words).props
    stacks: dict[int, list[list[Any]]] = {}  # cell -> things, lowest first: [type, kind, moved]
    for code in (*buried, *objects):
        stacks.setdefault(code & _CELL, []).append([_OBJECT, code >> _SHIFT, False])
    word_things = []
    for code in words:
        thing = [_WORD, code >> _SHIFT, code & _CELL]
        stacks.setdefault(code & _CELL, []).append(thing)
        word_things.append(thing)
    border = engine.border

    def top(cell: int) -> list[Any] | None:
        stack = stacks.get(cell)
        return stack[-1] if stack else None

    def pushable(thing: list[Any]) -> bool:
        return thing[0] == _WORD or bool(props[thing[1]] & PUSH)

    def overlappable(thing: list[Any] | None) -> bool:
        return thing is None or (thing[0] == _OBJECT and not props[thing[1]] & STOP)

    def move(cell: int) -> tuple[int, bool, bool]:
        ahead = cell + delta
        if border[ahead]:
            target = cell
        else:
            thing = top(ahead)
            if thing is not None and pushable(thing):
                move(ahead)
            target = ahead if overlappable(top(ahead)) else cell
        reached = top(target)
        won = reached is not None and reached[0] == _OBJECT and bool(props[reached[1]] & WIN)
        lost = reached is not None and reached[0] == _OBJECT and bool(props[reached[1]] & DEFEAT)
        if target != cell:
            thing = stacks[cell].pop()
            stacks.setdefault(target, []).append(thing)
            if thing[0] == _WORD:
                thing[2] = target
        return target, won, lost

    won = lost = False
    for cell in range(engine.width * engine.height):
        thing = top(cell)
        if thing is not None and thing[0] == _OBJECT and props[thing[1]] & YOU and not thing[2]:
            thing[2] = True
            _, won, lost = move(cell)

    new_words = tuple(kind << _SHIFT | cell for _, kind, cell in word_things)
    rules = engine.rules(new_words).rules
    for subject, predicate in rules:  # A IS B, in rule order: a new B over every cell topped by an A
        if NOUN_BASE <= predicate < IS:
            for cell in sorted(stacks):
                thing = top(cell)
                if thing is not None and thing[0] == _OBJECT and thing[1] == subject:
                    stacks[cell].append([_OBJECT, predicate - NOUN_BASE, True])
    new_objects: list[int] = []
    new_buried: list[int] = []
    for cell in sorted(stacks):
        stack = [t for t in stacks[cell] if t[0] == _OBJECT]
        if not stack:
            continue
        covered = stacks[cell][-1][0] == _WORD
        for i, thing in enumerate(stack):
            code = thing[1] << _SHIFT | cell
            (new_objects if i == len(stack) - 1 and not covered else new_buried).append(code)
    return new_words, tuple(sorted(new_objects)), tuple(new_buried), won, lost
