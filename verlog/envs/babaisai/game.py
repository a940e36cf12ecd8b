"""The BabaIsAI game engine: a grid of objects and word blocks whose rules can be rewritten.

The world is a rectangle whose outermost ring is an impassable border. Inside it live:

* **objects** (``baba``, ``wall``, ``key``, ``ball``, ``door``): what they do is decided only by
  the active rules (an object with no rule is inert and can be walked over);
* **word blocks**: nouns (``BABA`` ... ``DOOR``), the verb ``IS`` and properties (``YOU``,
  ``WIN``, ``STOP``, ``PUSH``, ``DEFEAT``). Word blocks are always pushable and never move onto
  each other; a level may start with two in one cell (the original's generator stacks a rule on
  whatever lies there): only the upper one counts (rules, text) and a push moves it alone, the
  one uncovered then stops whatever pushed (the pusher stays put).

A rule is three word blocks in a row, left to right or top to bottom: ``NOUN IS PROPERTY``
("wall is stop": every wall blocks movement) or ``NOUN IS NOUN`` ("key is ball": every key turns
into a ball). Rules are recomputed after every move, so pushing a word out of line breaks its
rule at once and pushing one into line makes a new rule.

``NOUN IS NOUN`` turns objects in place. :func:`step` under the ``"previous"`` rule (BALROG's)
plays a move with the original game's own rules instead (:mod:`.original`): cells hold stacks, only
the top thing acts, YOU objects move one at a time, and ``A IS B`` puts a new B over each A.

Properties: YOU objects move with the player's action and push whatever PUSH things (every word
block, PUSH objects) lie in front, as a chain; the move fails if the chain runs into the border
or a STOP object. A YOU object on a DEFEAT object is destroyed; with no YOU object left the game
is lost. When the level is won depends on the engine's ``win_rule``:

* ``"current"`` (verlog's training variant): after a move, once the rules are recomputed, when a
  YOU object shares a cell with a WIN object (so forming ``X IS WIN`` while standing on an X wins).
* ``"previous"`` (the original BabaIsAI, and so BALROG): when a YOU object *moves into* a cell
  holding an object that was WIN under the rules in force *before* the move; rules are recomputed
  only after the check, and waiting never wins.

States are immutable and compact (two tuples of ints) so the BFS solver can hash millions of them;
:class:`Engine` holds everything that depends only on the grid size, plus a cache of rule sets.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Sequence

# ----------------------------------------------------------------------------------------------
# vocabulary: one small int ("kind") per object type and per word block
# ----------------------------------------------------------------------------------------------

#: object types, in kind order (kind ``i`` is ``OBJECT_NAMES[i]``)
OBJECT_NAMES: tuple[str, ...] = ("baba", "wall", "key", "ball", "door")
#: property words, in order after the noun words and ``IS``
PROPERTY_NAMES: tuple[str, ...] = ("you", "win", "stop", "push", "defeat")

N_OBJECTS = len(OBJECT_NAMES)
NOUN_BASE = N_OBJECTS  # noun word for object kind k is NOUN_BASE + k
IS = NOUN_BASE + N_OBJECTS
PROP_BASE = IS + 1  # property word i is PROP_BASE + i
N_KINDS = PROP_BASE + len(PROPERTY_NAMES)

#: property bit masks (bit i is PROPERTY_NAMES[i])
YOU, WIN, STOP, PUSH, DEFEAT = (1 << i for i in range(len(PROPERTY_NAMES)))
#: when a win is checked (see the module docstring)
WIN_RULES: tuple[str, ...] = ("current", "previous")

#: the player's actions and the grid offset (dx, dy) each one moves by; y grows downwards
ACTIONS: tuple[str, ...] = ("idle", "up", "down", "left", "right")
ACTION_DELTAS: dict[str, tuple[int, int]] = {
    "idle": (0, 0),
    "up": (0, -1),
    "down": (0, 1),
    "left": (-1, 0),
    "right": (1, 0),
}

# a thing (object or word) is packed as kind << _SHIFT | cell, with cell = y * width + x
_SHIFT = 12
_CELL = (1 << _SHIFT) - 1


def noun_word(obj: str) -> int:
    """The kind of the noun word block naming object type ``obj`` (e.g. ``BALL``)."""
    return NOUN_BASE + OBJECT_NAMES.index(obj)


def property_word(prop: str) -> int:
    """The kind of the property word block ``prop`` (e.g. ``WIN``)."""
    return PROP_BASE + PROPERTY_NAMES.index(prop)


def object_kind(obj: str) -> int:
    """The kind of object type ``obj``."""
    return OBJECT_NAMES.index(obj)


def is_word(kind: int) -> bool:
    """Whether ``kind`` is a word block (as opposed to an object)."""
    return kind >= NOUN_BASE


def kind_name(kind: int) -> str:
    """Lower-case name of a kind: ``ball`` for the object and for the word ``BALL`` alike."""
    if kind < NOUN_BASE:
        return OBJECT_NAMES[kind]
    if kind < IS:
        return OBJECT_NAMES[kind - NOUN_BASE]
    if kind == IS:
        return "is"
    return PROPERTY_NAMES[kind - PROP_BASE]


def pack(kind: int, x: int, y: int, width: int) -> int:
    """Pack one thing into the int the state tuples hold."""
    return kind << _SHIFT | (y * width + x)


def unpack(code: int, width: int) -> tuple[int, int, int]:
    """``(kind, x, y)`` of a packed thing."""
    cell = code & _CELL
    return code >> _SHIFT, cell % width, cell // width


# ----------------------------------------------------------------------------------------------
# rules
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleSet:
    """The rules a word layout spells, and what they mean for each object type.

    ``rules``: ``(subject object kind, predicate word kind)`` in reading order of their ``IS``
    (horizontal before vertical), without duplicates. ``props[k]``: property mask of object kind
    ``k``. ``transforms[k]``: the kind objects of kind ``k`` turn into, or ``-1``.
    """

    rules: tuple[tuple[int, int], ...]
    props: tuple[int, ...]
    transforms: tuple[int, ...]

    @property
    def has_transforms(self) -> bool:
        return any(t >= 0 for t in self.transforms)

    def texts(self) -> list[str]:
        """The rules as lower-case sentences: ``["baba is you", "wall is stop"]``."""
        return [f"{OBJECT_NAMES[s]} is {kind_name(p)}" for s, p in self.rules]


def parse_rules(word_cells: dict[int, int], width: int) -> RuleSet:
    """Read every ``NOUN IS PROPERTY`` / ``NOUN IS NOUN`` line from a ``cell -> word kind`` map."""
    found: list[tuple[int, int]] = []
    for cell in sorted(c for c, k in word_cells.items() if k == IS):
        for step in (1, width):  # horizontal, then vertical
            subject = word_cells.get(cell - step, -1)
            predicate = word_cells.get(cell + step, -1)
            if NOUN_BASE <= subject < IS and (NOUN_BASE <= predicate < IS or predicate > IS):
                rule = (subject - NOUN_BASE, predicate)
                if rule not in found:
                    found.append(rule)
    props = [0] * N_OBJECTS
    transforms = [-1] * N_OBJECTS
    keep = [False] * N_OBJECTS  # "baba is baba" protects baba from being transformed
    for subject, predicate in found:
        if predicate > IS:
            props[subject] |= 1 << (predicate - PROP_BASE)
        elif predicate - NOUN_BASE == subject:
            keep[subject] = True
        elif transforms[subject] < 0:
            transforms[subject] = predicate - NOUN_BASE  # first rule wins when several apply
    for k in range(N_OBJECTS):
        if keep[k]:
            transforms[k] = -1
    return RuleSet(tuple(found), tuple(props), tuple(transforms))


# ----------------------------------------------------------------------------------------------
# states
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GameState:
    """One position of a level: grid size plus every word block and object (packed ints).

    ``words`` keeps a fixed order (word blocks never appear, vanish or change; of two in one cell
    the later is on top); ``objects`` is sorted, so two positions that differ only in which of two
    identical objects is where are equal. Hashable and cheap to compare: the solver keys its
    visited set on ``key``.
    """

    width: int
    height: int
    words: tuple[int, ...]
    objects: tuple[int, ...]
    #: objects under others or under a word block (the original's stacks: see :mod:`.original`)
    buried: tuple[int, ...] = ()

    @classmethod
    def build(
        cls,
        width: int,
        height: int,
        words: Iterable[tuple[int, int, int]],
        objects: Iterable[tuple[int, int, int]],
    ) -> "GameState":
        """A state from ``(kind, x, y)`` triples; checks bounds. Words given for the same cell are
        stacked, the later on top (see the module docstring)."""
        if width < 3 or height < 3 or width * height > _CELL:
            raise ValueError(f"bad grid size {width}x{height}")
        packed_words: list[int] = []
        for kind, x, y in words:
            if not is_word(kind) or not (0 < x < width - 1 and 0 < y < height - 1):
                raise ValueError(f"bad word block {kind_name(kind)!r} at {(x, y)}")
            packed_words.append(pack(kind, x, y, width))
        packed_objects: list[int] = []
        for kind, x, y in objects:
            if is_word(kind) or not (0 < x < width - 1 and 0 < y < height - 1):
                raise ValueError(f"bad object {kind} at {(x, y)}")
            packed_objects.append(pack(kind, x, y, width))
        return cls(width, height, tuple(packed_words), tuple(sorted(packed_objects)))

    @property
    def key(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The part of the state that changes during play (what the solver hashes; objects under
        others are left out: the solver plans with ``NOUN IS NOUN`` turning objects in place)."""
        return self.words, self.objects

    def flattened(self) -> "GameState":
        """The state with every object acting, none under another (how :class:`Engine` and the
        solver see a state of the original's stacks)."""
        if not self.buried:
            return self
        return GameState(self.width, self.height, self.words, tuple(sorted(self.objects + self.buried)))

    def iter_buried(self) -> Iterable[tuple[int, int, int]]:
        """``(kind, x, y)`` of every object under others, lowest first in each cell."""
        return (unpack(c, self.width) for c in self.buried)

    def iter_words(self) -> Iterable[tuple[int, int, int]]:
        """``(kind, x, y)`` of every word block."""
        return (unpack(c, self.width) for c in self.words)

    def iter_objects(self) -> Iterable[tuple[int, int, int]]:
        """``(kind, x, y)`` of every object (not those under others: :meth:`iter_buried`)."""
        return (unpack(c, self.width) for c in self.objects)

    @property
    def rules(self) -> RuleSet:
        """The rules active in this state."""
        return engine_for(self.width, self.height).rules(self.words)

    def you_positions(self) -> list[tuple[int, int]]:
        """Cells of the objects the player controls (YOU), in reading order."""
        props = self.rules.props
        cells = sorted({(y, x) for k, x, y in self.iter_objects() if props[k] & YOU})
        return [(x, y) for y, x in cells]

    def is_won(self) -> bool:
        """Whether a YOU object shares a cell with a WIN object."""
        props = self.rules.props
        you = {(x, y) for k, x, y in self.iter_objects() if props[k] & YOU}
        return any(props[k] & WIN and (x, y) in you for k, x, y in self.iter_objects())

    def is_lost(self) -> bool:
        """Whether no object is YOU any more."""
        return not self.you_positions()


class StepOutcome(NamedTuple):
    """What one move did: the new state and whether it won or lost the level."""

    state: GameState
    won: bool
    lost: bool


# ----------------------------------------------------------------------------------------------
# the engine
# ----------------------------------------------------------------------------------------------

_Key = tuple[tuple[int, ...], tuple[int, ...]]


class Engine:
    """The rules of motion for one grid size, working on raw ``(words, objects)`` tuples.

    Kept separate from :class:`GameState` so the solver's inner loop avoids object creation; use
    :func:`engine_for` to get the shared instance for a size. Rule sets are cached by word layout.
    """

    _CACHE_LIMIT = 200_000

    def __init__(self, width: int, height: int, win_rule: str = "current") -> None:
        if win_rule not in WIN_RULES:
            raise ValueError(f"unknown win_rule {win_rule!r}; valid: {', '.join(WIN_RULES)}")
        self.width = width
        self.height = height
        self.previous_rules_win = win_rule == "previous"
        self.border = bytes(
            1 if x in (0, width - 1) or y in (0, height - 1) else 0 for y in range(height) for x in range(width)
        )
        self.deltas: dict[str, int] = {a: dx + dy * width for a, (dx, dy) in ACTION_DELTAS.items()}
        self._rules: dict[tuple[int, ...], RuleSet] = {}

    def rules(self, words: tuple[int, ...]) -> RuleSet:
        """The rule set spelled by a word layout (cached)."""
        rs = self._rules.get(words)
        if rs is None:
            if len(self._rules) >= self._CACHE_LIMIT:
                self._rules.clear()
            rs = parse_rules({c & _CELL: c >> _SHIFT for c in words}, self.width)
            self._rules[words] = rs
        return rs

    def advance(
        self, words: tuple[int, ...], objects: tuple[int, ...], delta: int, transforms: bool = True
    ) -> tuple[tuple[int, ...], tuple[int, ...], bool, bool]:
        """Apply one move (grid offset ``delta``; 0 waits): ``(words, objects, won, lost)``.
        ``transforms=False`` leaves ``NOUN IS NOUN`` alone."""
        rs = self.rules(words)
        props = rs.props
        if delta == 0:
            won = False if self.previous_rules_win else self._won(objects, props)
            return words, objects, won, self._lost(objects, props)
        old_props = props

        objs = [[c >> _SHIFT, c & _CELL] for c in objects]
        movers = [o for o in objs if props[o[0]] & YOU]
        if not movers:
            return words, objects, False, True
        word_list = [[c >> _SHIFT, c & _CELL] for c in words]
        word_at = {w[1]: w for w in word_list}  # the upper word of a stack: the later one
        covered: dict[int, list[list[int]]] = {}  # cell -> the words under its upper one, lowest first
        if len(word_at) < len(word_list):
            for w in word_list:
                if word_at[w[1]] is not w:
                    covered.setdefault(w[1], []).append(w)
        obj_at: dict[int, list[list[int]]] = {}
        for o in objs:
            obj_at.setdefault(o[1], []).append(o)
        # the mover furthest along the move goes first, so a line of YOU objects moves together
        movers.sort(key=lambda o: o[1], reverse=delta > 0)
        words_moved = False
        entered_win = False  # a mover stepped into a cell holding a WIN object (rules before the move)
        for mover in movers:
            start = mover[1]
            chain = _push_chain(self.border, start, delta, obj_at, word_at, props)
            if chain is None:
                continue  # blocked: this mover stays put
            stacked = max((i for i, c in enumerate(chain) if c in covered), default=None)
            if stacked is not None:
                _push_stack_top(chain, stacked, delta, word_at, covered, obj_at, props)
                words_moved = True
                continue
            words_moved |= _shift_chain(chain, delta, word_at, obj_at, props, mover)
            obj_at[start].remove(mover)
            mover[1] = start + delta
            if any(old_props[o[0]] & WIN for o in obj_at.get(mover[1], ())):
                entered_win = True
            obj_at.setdefault(mover[1], []).append(mover)

        new_words = tuple(k << _SHIFT | c for k, c in word_list) if words_moved else words
        if words_moved:
            rs = self.rules(new_words)
            props = rs.props
            if rs.has_transforms and transforms:
                trans = rs.transforms
                for o in objs:
                    if trans[o[0]] >= 0:
                        o[0] = trans[o[0]]
        new_objects = tuple(sorted(k << _SHIFT | c for k, c in objs))
        if entered_win if self.previous_rules_win else self._won(new_objects, props):
            return new_words, new_objects, True, False
        if any(props[o >> _SHIFT] & DEFEAT for o in new_objects):
            new_objects = self._defeat(new_objects, props)
        return new_words, new_objects, False, self._lost(new_objects, props)

    @staticmethod
    def _won(objects: tuple[int, ...], props: Sequence[int]) -> bool:
        you = {c & _CELL for c in objects if props[c >> _SHIFT] & YOU}
        if not you:
            return False
        return any(props[c >> _SHIFT] & WIN and (c & _CELL) in you for c in objects)

    @staticmethod
    def _lost(objects: tuple[int, ...], props: Sequence[int]) -> bool:
        return not any(props[c >> _SHIFT] & YOU for c in objects)

    @staticmethod
    def _defeat(objects: tuple[int, ...], props: Sequence[int]) -> tuple[int, ...]:
        deadly = {c & _CELL for c in objects if props[c >> _SHIFT] & DEFEAT}
        return tuple(c for c in objects if not (props[c >> _SHIFT] & YOU and (c & _CELL) in deadly))

    def step_key(self, key: _Key, action: str) -> tuple[_Key, bool, bool]:
        """:meth:`advance` on a state key with a named action."""
        w, o, won, lost = self.advance(key[0], key[1], self.deltas[action])
        return (w, o), won, lost


@functools.lru_cache(maxsize=64)
def engine_for(width: int, height: int, win_rule: str = "current") -> Engine:
    """The shared :class:`Engine` for a grid size and win rule."""
    return Engine(width, height, win_rule)


def step(state: GameState, action: str, win_rule: str = "current") -> StepOutcome:
    """Play one action (``idle``/``up``/``down``/``left``/``right``) from ``state``; ``win_rule``
    says when a win counts (see the module docstring)."""
    if action not in ACTION_DELTAS:
        raise ValueError(f"unknown action {action!r}; expected one of {ACTIONS}")
    engine = engine_for(state.width, state.height, win_rule)
    if win_rule == "previous":  # the original game's rules, stacks and all (BALROG's)
        from .original import advance_original

        words, objects, buried, won, lost = advance_original(
            engine, state.words, state.objects, state.buried, engine.deltas[action]
        )
    else:
        words, objects, won, lost = engine.advance(state.words, state.objects, engine.deltas[action])
        buried = state.buried
    if (words, objects, buried) == (state.words, state.objects, state.buried):
        return StepOutcome(state, won, lost)
    new = GameState(state.width, state.height, words, objects, buried)
    return StepOutcome(new, won, lost)


# ----------------------------------------------------------------------------------------------
# ASCII rendering
# ----------------------------------------------------------------------------------------------

_WORD_LABELS = {k: kind_name(k).upper() for k in range(NOUN_BASE, N_KINDS)}
_WORD_LABELS[property_word("defeat")] = "DEFT"


def render_ascii(state: GameState) -> str:
    """Draw the grid, one 4-character field per cell.

    Border ``####``, empty `` .  ``, objects in lower case (``baba``, ``wall``, ``key``), word
    blocks in upper case (``BABA``, ``IS``, ``WIN``). A cell holding several things shows the (upper)
    word block, else the YOU object, else the first object, marked with ``+`` when others hide under it.
    """
    w, h = state.width, state.height
    props = state.rules.props
    cells: dict[tuple[int, int], list[int]] = {}
    for k, x, y in state.iter_objects():
        cells.setdefault((x, y), []).append(k)
    stacked: set[tuple[int, int]] = {(x, y) for _, x, y in state.iter_buried()}
    words: dict[tuple[int, int], int] = {}
    for k, x, y in state.iter_words():  # the later word of a cell is the upper one
        if (x, y) in words:
            stacked.add((x, y))
        words[(x, y)] = k
    rows = []
    for y in range(h):
        fields = []
        for x in range(w):
            if x in (0, w - 1) or y in (0, h - 1):
                fields.append("####")
                continue
            here = cells.get((x, y), [])
            if (x, y) in words:
                label, hidden = _WORD_LABELS[words[(x, y)]], bool(here) or (x, y) in stacked
            elif here:
                here.sort(key=lambda k: (not props[k] & YOU, k))
                label, hidden = OBJECT_NAMES[here[0]], len(here) > 1 or (x, y) in stacked
            else:
                label, hidden = " .", False
            if hidden:
                label = label[:3] + "+"
            fields.append(f"{label:<4}")
        rows.append(" ".join(fields).rstrip())
    return "\n".join(rows)


def state_from_map(rows: Sequence[str]) -> GameState:
    """Build a state from a hand-drawn map of the inside of a level (the border is added).

    Each row lists its cells separated by spaces: ``.`` empty, an object in lower case
    (``baba``, ``wall``, ``key``, ``ball``, ``door``), a word block in upper case (``BABA``,
    ``IS``, ``YOU``, ``WIN``, ``STOP``, ``PUSH``, ``DEFEAT``, ``KEY`` ...); ``+`` stacks several
    things in one cell (``key+baba``; of two words, ``KEY+WIN``, the later is on top). Used by
    tests and for writing custom puzzles.
    """
    grid = [row.split() for row in rows]
    if not grid or any(len(r) != len(grid[0]) for r in grid):
        raise ValueError("map rows must be non-empty and equally long")
    words: list[tuple[int, int, int]] = []
    objects: list[tuple[int, int, int]] = []
    word_kinds = {kind_name(k).upper(): k for k in range(NOUN_BASE, N_KINDS)}
    for y, row in enumerate(grid, start=1):
        for x, token in enumerate(row, start=1):
            if token == ".":
                continue
            for part in token.split("+"):
                if part in word_kinds:
                    words.append((word_kinds[part], x, y))
                elif part in OBJECT_NAMES:
                    objects.append((OBJECT_NAMES.index(part), x, y))
                else:
                    raise ValueError(f"unknown map token {part!r}")
    return GameState.build(len(grid[0]) + 2, len(grid) + 2, words, objects)


# ------------------------------------------------------------------ one move's pushes (``advance``)
Cells = dict[int, list[list[int]]]


def _push_chain(
    border: Sequence[bool], start: int, delta: int, obj_at: Cells, word_at: dict[int, list[int]], props: Sequence[int]
) -> list[int] | None:
    """The cells whose pushable contents shift by ``delta`` when the mover at ``start`` moves
    (words and PUSH objects up to the first free cell), or ``None`` when the border or a STOP
    object blocks the move."""
    cell = start + delta
    chain: list[int] = []
    while not border[cell]:
        here = obj_at.get(cell)
        pushes = cell in word_at
        if here:
            for o in here:
                m = props[o[0]]
                if m & PUSH:
                    pushes = True
                elif m & STOP:
                    return None
        if not pushes:
            return chain  # reached a free cell: the move succeeds
        chain.append(cell)
        cell += delta
    return None


def _shift_pushed(c: int, dest: int, obj_at: Cells, props: Sequence[int], mover: list[int] | None = None) -> None:
    """The PUSH objects of cell ``c`` (the mover aside) moved to ``dest``."""
    here = obj_at.get(c)
    if here:
        for o in [o for o in here if props[o[0]] & PUSH and o is not mover]:
            here.remove(o)
            o[1] = dest
            obj_at.setdefault(dest, []).append(o)


def _push_stack_top(
    chain: list[int],
    stacked: int,
    delta: int,
    word_at: dict[int, list[int]],
    covered: Cells,
    obj_at: Cells,
    props: Sequence[int],
) -> None:
    """A push into a stack of words (cell ``chain[stacked]``, the nearest to the free end): its
    upper word and what lies ahead of it move; the word it uncovers stops everything behind it,
    the mover included (the original pushes one thing at a time, from the far end)."""
    for c in reversed(chain[stacked + 1 :]):
        dest = c + delta
        w = word_at.pop(c, None)
        if w is not None:
            w[1] = dest
            word_at[dest] = w
        _shift_pushed(c, dest, obj_at, props)
    c = chain[stacked]
    w = word_at.pop(c)
    w[1] = c + delta
    word_at[c + delta] = w
    word_at[c] = covered[c].pop()
    if not covered[c]:
        del covered[c]


def _shift_chain(
    chain: list[int],
    delta: int,
    word_at: dict[int, list[int]],
    obj_at: Cells,
    props: Sequence[int],
    mover: list[int],
) -> bool:
    """Every word and PUSH object of ``chain`` moved by ``delta``, the far end first; whether a
    word moved (the rules must be read again)."""
    words_moved = False
    for c in reversed(chain):
        dest = c + delta
        w = word_at.pop(c, None)
        if w is not None:
            w[1] = dest
            word_at[dest] = w
            words_moved = True
        _shift_pushed(c, dest, obj_at, props, mover)
    return words_moved
