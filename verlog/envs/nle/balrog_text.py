"""NetHack and MiniHack observations as BALROG's model reads them, and its action names.

BALROG renders NLE observations with the NLE language wrapper (``nle-language-wrapper``, a C++
extension that does not build here) and shows its language model the *hybrid* view: the message,
the wrapper's "language observation" (what is on the map, with distance and direction), the
cursor, the raw 80x23 terminal below the message line as the map, and the inventory. This module
computes the same texts from the same arrays by the wrapper's rules, in Python:

* :func:`text_message`: the top line, or every line of a window ending in ``--More--``,
  ``(end)`` or ``(n of m)``, read from the first line's indentation;
* :func:`text_glyphs`: one line per (thing, distance) with its directions. Things are the
  *screen* features (monsters, objects, doors, stairs, fountains, altars, traps shown as ...)
  anywhere on the map, and the *visual* features (walls, doorways, open doors, dark areas ...)
  met by rays cast up to 9 squares in the eight compass directions, a wall or closed door ending
  a ray. Distances are the largest of the two offsets in words (``adjacent`` 1, ``very near`` 2,
  ``near`` 3-5, ``far`` 6-19, ``very far`` 20+), directions one of 16 (``eastnortheast``: more
  east than northeast). Lines run from the farthest to the nearest, then clockwise from north; a
  thing seen in one direction several times at one distance is named in the plural;
* :func:`text_cursor`: where the terminal cursor is (on the agent: ``Yourself a <monster>``);
* :func:`text_inventory`: ``<letter>: <item>`` lines;
* :func:`text_blstats`: the bottom-line statistics, which BALROG shows only in the wrapper's
  *language* view (:func:`balrog_language_texts`), the text of its vision protocol, where an image
  of the map (:mod:`verlog.envs.nle.tiles`) replaces the terminal.

Where the wrapper reads out of its arrays' bounds (a first message line that is blank, a ``(n of
m)`` marker at a line's edge, ``ch`` plurals) we take the reading its memory layout gives in
practice: the row before, no match, no special plural. Names of map things come from NetHack's
own tables (``nle.nethack``); the wrapper names an object by its unidentified appearance class
rules (a potion is ``<appearance> potion``) using NetHack's fixed description table, exactly as
the wrapper's lookup tables do.

Actions: :data:`NLE_ACTION_KEYS` names every NetHack command the wrapper names (``north`` ->
``k``, ``far east`` -> ``L``, ``pickup`` -> ``,``, ``esc`` ...); :func:`nethack_action_names` and
:func:`minihack_action_names` are the action sets BALROG accepts (see :mod:`verlog.envs.nle.env`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterable, Mapping, Sequence

import numpy as np
from nle import nethack

DUNGEON_WIDTH = 79
DUNGEON_HEIGHT = 21

# --------------------------------------------------------------------------------------------
# action names (the wrapper's), each with its NetHack key


def _key(spec: str) -> int:
    if spec.startswith("^") and len(spec) == 2:
        return ord(spec[1]) & 0x1F if spec[1] != "[" else 27
    if spec.startswith("M-") and len(spec) == 3:
        return 0x80 | ord(spec[2])
    if spec == "\\r":
        return 13
    assert len(spec) == 1, spec
    return ord(spec)


# (names, key) in the wrapper's order; a later entry with the same key replaces the names of the
# earlier one but keeps its place (the wrapper's table is a Python dict keyed by equal integers)
_ACTION_TABLE: tuple[tuple[tuple[str, ...], str], ...] = (
    (("help",), "?"),
    (("previous message",), "^p"),
    (("north",), "k"),
    (("east",), "l"),
    (("south",), "j"),
    (("west",), "h"),
    (("northeast",), "u"),
    (("southeast",), "n"),
    (("southwest",), "b"),
    (("northwest",), "y"),
    (("far north",), "K"),
    (("far east",), "L"),
    (("far south",), "J"),
    (("far west",), "H"),
    (("far northeast",), "U"),
    (("far southeast",), "N"),
    (("far southwest",), "B"),
    (("far northwest",), "Y"),
    (("up",), "<"),
    (("down",), ">"),
    (("wait",), "."),
    (("more",), "\\r"),
    (("extcmd",), "#"),
    (("extlist",), "M-?"),
    (("adjust",), "M-a"),
    (("annotate",), "M-A"),
    (("apply",), "a"),
    (("attributes",), "^x"),
    (("autopickup",), "@"),
    (("call",), "C"),
    (("cast",), "Z"),
    (("chat",), "M-c"),
    (("close",), "c"),
    (("conduct",), "M-C"),
    (("dip",), "M-d"),
    (("drop",), "d"),
    (("droptype",), "D"),
    (("eat",), "e"),
    (("esc",), "^["),
    (("engrave",), "E"),
    (("enhance",), "M-e"),
    (("fire",), "f"),
    (("fight",), "F"),
    (("force",), "M-f"),
    (("glance",), ";"),
    (("history",), "V"),
    (("inventory",), "i"),
    (("inventtype",), "I"),
    (("invoke",), "M-i"),
    (("jump",), "M-j"),
    (("kick",), "^d"),
    (("known",), "\\"),
    (("knownclass",), "`"),
    (("look",), ":"),
    (("loot",), "M-l"),
    (("monster",), "M-m"),
    (("move",), "m"),
    (("movefar",), "M"),
    (("offer",), "M-o"),
    (("open",), "o"),
    (("options",), "O"),
    (("overview",), "^o"),
    (("pay",), "p"),
    (("pickup",), ","),
    (("pray",), "M-p"),
    (("puton",), "P"),
    (("quaff",), "q"),
    (("quit",), "M-q"),
    (("quiver",), "Q"),
    (("read",), "r"),
    (("redraw",), "^r"),
    (("remove",), "R"),
    (("ride",), "M-R"),
    (("rub",), "M-r"),
    (("rush",), "g"),
    (("rush2",), "G"),
    (("save",), "S"),
    (("search",), "s"),
    (("seeall",), "*"),
    (("seeamulet",), '"'),
    (("seearmor",), "["),
    (("seegold", "dollar"), "$"),
    (("seerings",), "="),
    (("seespells", "plus"), "+"),
    (("seetools",), "("),
    (("seetrap",), "^"),
    (("seeweapon",), ")"),
    (("shell",), "!"),
    (("sit",), "M-s"),
    (("swap",), "x"),
    (("takeoff",), "T"),
    (("takeoffall",), "A"),
    (("teleport",), "^t"),
    (("throw",), "t"),
    (("tip",), "M-T"),
    (("travel",), "_"),
    (("turnundead",), "M-t"),
    (("twoweapon",), "X"),
    (("untrap",), "M-u"),
    (("version",), "M-v"),
    (("versionshort",), "v"),
    (("wear",), "W"),
    (("whatdoes",), "&"),
    (("whatis",), "/"),
    (("wield",), "w"),
    (("wipe",), "M-w"),
    (("zap",), "z"),
    (("minus",), "-"),
    (("space",), " "),
    (("apos",), "'"),
    (("zero",), "0"),
    (("one",), "1"),
    (("two",), "2"),
    (("three",), "3"),
    (("four",), "4"),
    (("five",), "5"),
    (("six",), "6"),
    (("seven",), "7"),
    (("eight",), "8"),
    (("nine",), "9"),
    (("wizard detect",), "^e"),
    (("wizard genesis",), "^g"),
    (("wizard identify",), "^i"),
    (("wizard teleport",), "^v"),
    (("wizard map",), "^f"),
    (("wizard where",), "^o"),
    (("wizard wish",), "^w"),
)


def _names_by_key() -> dict[int, tuple[str, ...]]:
    table: dict[int, tuple[str, ...]] = {}
    for names, spec in _ACTION_TABLE:
        table[_key(spec)] = names  # same key: the later names win, the place stays
    return table


#: NetHack key -> the wrapper's names of that command (its first name is the action's name)
NLE_ACTION_NAMES: Mapping[int, tuple[str, ...]] = _names_by_key()
#: every name (and key character) the wrapper understands -> NetHack key
NLE_ACTION_KEYS: Mapping[str, int] = {
    **{name: key for key, names in NLE_ACTION_NAMES.items() for name in names},
    **{chr(key): key for key in NLE_ACTION_NAMES if 32 <= key < 127},
}
_LETTERS = tuple(chr(c) for c in range(ord("a"), ord("z") + 1)) + tuple(chr(c) for c in range(ord("A"), ord("Z") + 1))
_DIGITS = tuple(str(d) for d in range(10))

#: BALROG's MiniHack actions (the only ones its MiniHack prompt offers), in its order
MINIHACK_ACTIONS: tuple[str, ...] = (
    "north",
    "east",
    "south",
    "west",
    "northeast",
    "southeast",
    "southwest",
    "northwest",
    "far north",
    "far east",
    "far south",
    "far west",
    "far northeast",
    "far southeast",
    "far southwest",
    "far northwest",
    "up",
    "down",
    "wait",
    "more",
    "apply",
    "close",
    "open",
    "eat",
    "force",
    "kick",
    "loot",
    "pickup",
    "pray",
    "puton",
    "quaff",
    "search",
    "zap",
)
#: the actions BALROG's NetHack prompt describes, in its order
NETHACK_PROMPT_ACTIONS: tuple[str, ...] = (
    "north",
    "east",
    "south",
    "west",
    "northeast",
    "southeast",
    "southwest",
    "northwest",
    "far north",
    "far east",
    "far south",
    "far west",
    "far northeast",
    "far southeast",
    "far southwest",
    "far northwest",
    "up",
    "down",
    "wait",
    "more",
    "annotate",
    "apply",
    "call",
    "cast",
    "close",
    "open",
    "dip",
    "drop",
    "droptype",
    "eat",
    "esc",
    "engrave",
    "enhance",
    "fire",
    "fight",
    "force",
    "inventory",
    "invoke",
    "jump",
    "kick",
    "look",
    "loot",
    "monster",
    "offer",
    "overview",
    "pay",
    "pickup",
    "pray",
    "puton",
    "quaff",
    "quiver",
    "read",
    "remove",
    "rub",
    "search",
    "swap",
    "takeoff",
    "takeoffall",
    "teleport",
    "throw",
    "travel",
    "twoweapon",
    "untrap",
    "wear",
    "wield",
    "wipe",
    "zap",
    "minus",
    "space",
    "apos",
    *_DIGITS,
)


def key_of(action: str) -> int:
    """The NetHack key of one of the wrapper's action names (``"far east"`` -> ``ord("L")``)."""
    try:
        return NLE_ACTION_KEYS[action]
    except KeyError:
        raise ValueError(f"unknown NetHack action {action!r}") from None


def nethack_action_names() -> tuple[str, ...]:
    """The answers BALROG accepts in NetHack: the name of each of NLE's ``USEFUL_ACTIONS``, every
    single letter and every digit. (BALROG also lists the two-digit numbers ``00``-``99``, which
    its action mapping then rejects with an error that ends the episode; they are left out. The
    digits stay listed, though BALROG's answer cleaning, which keeps only letters, never lets an
    answer reach them.)"""
    names = [NLE_ACTION_NAMES[int(a)][0] for a in nethack.USEFUL_ACTIONS if int(a) in NLE_ACTION_NAMES]
    return tuple(dict.fromkeys([*names, *_LETTERS, *_DIGITS]))


def minihack_action_names(task_actions: Iterable[int]) -> tuple[str, ...]:
    """The answers BALROG accepts in a MiniHack task whose action set is ``task_actions`` (NLE
    action values): the names of those actions that are BALROG MiniHack actions, in the task's
    order."""
    names = [NLE_ACTION_NAMES[int(a)][0] for a in task_actions if int(a) in NLE_ACTION_NAMES]
    return tuple(dict.fromkeys(n for n in names if n in MINIHACK_ACTIONS))


# --------------------------------------------------------------------------------------------
# what each glyph is called

#: NetHack 3.6's map symbols in order, as the wrapper names them
CMAP_NAMES: tuple[str, ...] = (
    "dark area",
    "vertical wall",
    "horizontal wall",
    "northwest room corner",
    "northeast room corner",
    "southwest corner",
    "southeast corner",
    "cross wall",
    "t up wall",
    "t down wall",
    "t west wall",
    "t east wall",
    "doorway",
    "vertical open door",
    "horizontal open door",
    "vertical closed door",
    "horizontal closed door",
    "bars",
    "tree",
    "room floor",
    "dark room floor",
    "corridor floor",
    "lit corridor floor",
    "stairs up",
    "stairs down",
    "ladder up",
    "ladder down",
    "alter",
    "grave",
    "throne",
    "sink",
    "fountain",
    "pool",
    "ice",
    "lava",
    "vertical lowered drawbridge",
    "horizontal lowered drawbridge",
    "vertical raised drawbridge",
    "horizontal raised drawbridge",
    "air floor",
    "cloud floor",
    "water floor",
    "arrow trap",
    "dart trap",
    "falling rock trap",
    "squeaky board",
    "bear trap",
    "land mine",
    "rolling boulder trap",
    "sleeping gas trap",
    "rust trap",
    "fire trap",
    "pit",
    "spiked pit",
    "hole",
    "trap door",
    "teleportation trap",
    "level teleporter",
    "magic portal",
    "web",
    "statue trap",
    "magic trap",
    "anti magic trap",
    "polymorph trap",
    "vibrating square",
    "vertical beam",
    "horizontal beam",
    "left slant beam",
    "right slant beam",
    "dig beam",
    "flash beam",
    "boom left",
    "boom right",
    "shield 1",
    "shield 2",
    "shield 3",
    "shield 4",
    "poison cloud",
    "valid position",
    "swallow top left",
    "swallow top center",
    "swallow top right",
    "swallow middle left",
    "swallow middle right",
    "swallow bottom left",
    "swallow bottom center",
    "swallow bottom right",
    "explosion top left",
    "explosion top center",
    "explosion top right",
    "explosion middle left",
    "explosion middle center",
    "explosion middle right",
    "explosion bottom left",
    "explosion bottom center",
    "explosion bottom right",
)
_FLOORS = frozenset({"room floor", "dark room floor", "corridor floor", "lit corridor floor"})
#: map symbols listed wherever they are on the map
_SCREEN_SYMBOLS = frozenset(
    {
        "horizontal closed door",
        "vertical closed door",
        "bars",
        "tree",
        "stairs up",
        "stairs down",
        "ladder up",
        "ladder down",
        "alter",
        "grave",
        "throne",
        "sink",
        "fountain",
        "pool",
        "ice",
        "lava",
        "vertical raised drawbridge",
        "horizontal raised drawbridge",
    }
)
#: map symbols that end a ray
_BLOCKING = frozenset(
    {
        "dark area",
        "vertical wall",
        "horizontal wall",
        "northwest room corner",
        "northeast room corner",
        "southwest corner",
        "southeast corner",
        "cross wall",
        "t up wall",
        "t down wall",
        "t west wall",
        "t east wall",
        "horizontal closed door",
        "vertical closed door",
        "horizontal raised drawbridge",
        "vertical raised drawbridge",
    }
)
_WARNINGS = tuple(
    f"unknown creature causing you {w}" for w in ("worry", "concern", "anxiety", "disquiet", "alarm", "dread")
)
_SWALLOW = (
    "swallow top left",
    "swallow top center",
    "swallow top right",
    "swallow middle left",
    "swallow middle right",
    "swallow bottom left",
    "swallow bottom center",
    "swallow bottom right",
)
_ZAP = ("horizontal zap beam", "vertical zap beam", "left slant zap beam", "right slant zap beam")
_EXPLODE = (
    "explosion top left",
    "explosion top center",
    "explosion top right",
    "explosion middle left",
    "explosion middle center",
    "explosion middle right",
    "explosion bottom left",
    "explosion bottom center",
    "explosion bottom right",
)


def _cmap_name(glyph: int) -> str:
    index = glyph - nethack.GLYPH_CMAP_OFF
    return CMAP_NAMES[index] if 0 <= index < len(CMAP_NAMES) else ""


def _object_name(otyp: int) -> str:
    descr = nethack.objdescr.from_idx(otyp)
    name, appearance = descr.oc_name or "", descr.oc_descr or ""
    raw_class = nethack.objclass(otyp).oc_class
    klass = ord(raw_class) if isinstance(raw_class, str) else int(raw_class)
    if klass in (
        nethack.ILLOBJ_CLASS,
        nethack.WEAPON_CLASS,
        nethack.COIN_CLASS,
        nethack.ROCK_CLASS,
        nethack.BALL_CLASS,
        nethack.CHAIN_CLASS,
    ):
        return name
    if klass in (nethack.ARMOR_CLASS, nethack.TOOL_CLASS):
        return appearance or name
    if klass == nethack.RING_CLASS:
        return f"{appearance} ring"
    if klass == nethack.AMULET_CLASS:
        return appearance if "Amulet" in appearance else f"{appearance} amulet"
    if klass == nethack.FOOD_CLASS:
        return name + appearance
    if klass == nethack.POTION_CLASS:
        return f"{appearance} potion"
    if klass == nethack.SCROLL_CLASS:
        return f"scroll labeled {appearance}"
    if klass == nethack.SPBOOK_CLASS:
        return f"{appearance} spellbook"
    if klass == nethack.WAND_CLASS:
        return f"{appearance} wand"
    if klass == nethack.GEM_CLASS:
        return name if appearance in name else f"{appearance} {name}"
    if klass == nethack.VENOM_CLASS:
        return f"splash of {name}"
    return ""


def _monster_name(index: int) -> str:
    return nethack.permonst(index).mname


@lru_cache(maxsize=1)
def screen_names() -> tuple[str, ...]:
    """Glyph -> name of what the wrapper lists wherever it is on the map ("" for the others)."""
    g = nethack
    names: list[str] = []
    for glyph in range(g.MAX_GLYPH):
        if glyph >= g.GLYPH_STATUE_OFF:
            name = f"{_monster_name(glyph - g.GLYPH_STATUE_OFF)} statue"
        elif glyph >= g.GLYPH_WARNING_OFF:
            name = _WARNINGS[glyph - g.GLYPH_WARNING_OFF]
        elif glyph >= g.GLYPH_SWALLOW_OFF:
            name = _SWALLOW[(glyph - g.GLYPH_SWALLOW_OFF) % len(_SWALLOW)]
        elif glyph >= g.GLYPH_ZAP_OFF:
            name = _ZAP[(glyph - g.GLYPH_ZAP_OFF) % len(_ZAP)]
        elif glyph >= g.GLYPH_EXPLODE_OFF:
            name = _EXPLODE[(glyph - g.GLYPH_EXPLODE_OFF) % len(_EXPLODE)]
        elif glyph >= g.GLYPH_CMAP_OFF:
            cmap = _cmap_name(glyph)
            name = cmap if cmap in _SCREEN_SYMBOLS and cmap not in _FLOORS else ""
        elif glyph >= g.GLYPH_OBJ_OFF:
            name = _object_name(glyph - g.GLYPH_OBJ_OFF)
        elif glyph >= g.GLYPH_RIDDEN_OFF:
            name = f"ridden {_monster_name(glyph - g.GLYPH_RIDDEN_OFF)}"
        elif glyph >= g.GLYPH_BODY_OFF:
            name = f"{_monster_name(glyph - g.GLYPH_BODY_OFF)} corpse"
        elif glyph >= g.GLYPH_DETECT_OFF:
            name = f"detected {_monster_name(glyph - g.GLYPH_DETECT_OFF)}"
        elif glyph >= g.GLYPH_INVIS_OFF:
            name = "invisible creature"
        elif glyph >= g.GLYPH_PET_OFF:
            name = f"tame {_monster_name(glyph - g.GLYPH_PET_OFF)}"
        else:
            name = _monster_name(glyph - g.GLYPH_MON_OFF)
        names.append(name)
    return tuple(names)


@lru_cache(maxsize=1)
def _has_screen_name() -> np.ndarray:
    return np.array([bool(name) for name in screen_names()], dtype=bool)


@lru_cache(maxsize=1)
def visual_names() -> tuple[str, ...]:
    """Glyph -> name of the map symbols the wrapper reports only along its rays ("" else)."""
    names = [""] * nethack.MAX_GLYPH
    for glyph in range(nethack.GLYPH_CMAP_OFF, nethack.GLYPH_EXPLODE_OFF):
        cmap = _cmap_name(glyph)
        if cmap and cmap not in _FLOORS and cmap not in _SCREEN_SYMBOLS:
            names[glyph] = cmap
    return tuple(names)


def pluralize(noun: str) -> str:
    """The wrapper's plural of a map thing's name ("dark area" -> "dark areas")."""
    if noun.endswith(("boots", "shoes", "scales", "lenses", "bars")):
        return noun
    exceptions = {
        "can of grease": "cans of grease",
        "Master of Thieves": "Masters of Thieves",
        "ice": "area of ice",
        "lava": "area of lava",
    }
    if noun in exceptions:
        return exceptions[noun]
    for prefix, plural in (
        ("boom ", "booms "),
        ("shield ", "shields "),
        ("swallow ", "swallows "),
        ("scroll ", "scrolls "),
        ("worthless piece ", "worthless pieces "),
        ("unknown creature ", "unknown creatures "),
    ):
        if noun.startswith(prefix):
            return plural + noun[len(prefix) :]
    if len(noun) >= 2 and noun[-1] == "y" and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    if noun[-1:] in ("z", "x") or noun[-2:] in ("sh", "ss"):
        return noun + "es"
    if noun[-1:] == "f":
        return (noun[:-2] if noun[-2:] == "ff" else noun[:-1]) + "ves"
    if noun[-1:] == "s":
        return noun + "es"
    return noun + "s"


# --------------------------------------------------------------------------------------------
# positions in words

_DISTANCE_ORDER = ("very far", "far", "near", "very near", "adjacent")
_DIRECTION_ORDER = (
    "north",
    "northnortheast",
    "northeast",
    "eastnortheast",
    "east",
    "eastsoutheast",
    "southeast",
    "southsoutheast",
    "south",
    "southsouthwest",
    "southwest",
    "westsouthwest",
    "west",
    "westnorthwest",
    "northwest",
    "northnorthwest",
)


def distance_words(offset: int) -> str:
    """``adjacent`` (1), ``very near`` (2), ``near`` (3-5), ``far`` (6-19), ``very far``."""
    if offset == 1:
        return "adjacent"
    if offset == 2:
        return "very near"
    if 2 < offset < 6:
        return "near"
    if 5 < offset < 20:
        return "far"
    return "very far"


def position_words(dx: int, dy: int) -> tuple[str, str]:
    """(distance, direction) of an offset; ``dx`` grows east, ``dy`` grows *north*."""
    diagonal_steps = min(abs(dx), abs(dy))
    diagonal = ""
    if diagonal_steps > 0:
        if dy < 0 and dx < 0:
            diagonal = "southwest"
        elif dy < 0 < dx:
            diagonal = "southeast"
        elif dy > 0 > dx:
            diagonal = "northwest"
        else:
            diagonal = "northeast"
    y_rest = dy - diagonal_steps if dy > 0 else dy + diagonal_steps
    x_rest = dx - diagonal_steps if dx > 0 else dx + diagonal_steps
    x_word = "west" if x_rest < 0 else ("east" if x_rest > 0 else "")
    y_word = "south" if y_rest < 0 else ("north" if y_rest > 0 else "")
    return distance_words(max(abs(dx), abs(dy))), y_word + x_word + diagonal


# --------------------------------------------------------------------------------------------
# the wrapper's texts

_RAYS = ((1, 0), (1, 1), (0, 1), (-1, 1), (-1, 0), (-1, -1), (0, -1), (1, -1))  # east first, y grows south


def text_glyphs(glyphs: np.ndarray, blstats: np.ndarray) -> str:
    """What is on the map, one line per (name, distance) with its directions (see the module)."""
    screen, visual = screen_names(), visual_names()
    px, py = int(blstats[0]), int(blstats[1])
    flat = np.asarray(glyphs).reshape(-1)
    found: list[tuple[str, str, str]] = []
    for index in np.flatnonzero(_has_screen_name()[flat]):
        name = screen[int(flat[index])]
        x, y = int(index) % DUNGEON_WIDTH, int(index) // DUNGEON_WIDTH
        if x == px and y == py:
            continue
        found.append((name, *position_words(x - px, py - y)))
    for sx, sy in _RAYS:
        for step in range(1, 10):
            x, y = px + sx * step, py + sy * step
            if not (0 <= x < DUNGEON_WIDTH and 0 <= y < DUNGEON_HEIGHT):
                break
            glyph = int(flat[x + y * DUNGEON_WIDTH])
            name = visual[glyph]
            if not screen[glyph] and name:
                found.append((name, *position_words(x - px, py - y)))
                if name in _BLOCKING:
                    break
    ordered = [
        item for d in _DISTANCE_ORDER for r in _DIRECTION_ORDER for item in found if item[1] == d and item[2] == r
    ]
    return "\n".join(f"{name} {distance} {directions}" for name, distance, directions in _group(ordered))


def _group(items: Sequence[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """Join the directions of one (name, distance); a direction seen twice or more turns the
    name plural."""
    keys: list[tuple[str, str]] = []
    directions: dict[tuple[str, str], list[str]] = {}
    for name, distance, direction in items:
        if (name, distance) not in directions:
            keys.append((name, distance))
        directions.setdefault((name, distance), []).append(direction)
    new_keys: list[tuple[str, str]] = []
    new_directions: dict[tuple[str, str], list[str]] = {}
    for key in keys:
        counts: dict[str, int] = {}
        for direction in directions[key]:
            counts[direction] = counts.get(direction, 0) + 1
        single = [d for d, n in counts.items() if n == 1]
        several = [d for d, n in counts.items() if n > 1]
        if single:
            new_keys.append(key)
            new_directions[key] = single
        if several:
            plural = (pluralize(key[0]), key[1])
            new_keys.append(plural)
            new_directions[plural] = several
    lines = []
    for name, distance in new_keys:
        ds = new_directions[(name, distance)]
        if len(ds) == 1:
            joined = ds[0]
        elif len(ds) == 2:
            joined = f"{ds[0]} and {ds[1]}"
        else:
            joined = ", ".join(ds[:-1]) + f", and {ds[-1]}"
        lines.append((name, distance, joined))
    return lines


def text_cursor(glyphs: np.ndarray, blstats: np.ndarray, tty_cursor: np.ndarray) -> str:
    """What the terminal cursor is on: ``Yourself a <monster>`` on the agent, else the distance,
    direction and name of the map square under it ("" off the map)."""
    px, py = int(blstats[0]), int(blstats[1])
    cx, cy = int(tty_cursor[1]), int(tty_cursor[0]) - 1
    dx, dy = cx - px, py - cy
    index = cx + cy * DUNGEON_WIDTH
    flat = np.asarray(glyphs).reshape(-1)
    if not (
        0 <= dx + DUNGEON_WIDTH < 2 * DUNGEON_WIDTH
        and 0 <= dy + DUNGEON_HEIGHT < 2 * DUNGEON_HEIGHT
        and 0 < index < flat.size
    ):
        return ""
    name = screen_names()[int(flat[index])]
    if dx == 0 and dy == 0:
        return f"Yourself a {name}"
    distance, direction = position_words(dx, dy)
    return f"{distance} {direction} {name}"


def text_inventory(inv_strs: np.ndarray, inv_letters: np.ndarray) -> str:
    """``<letter>: <item>`` lines, up to the first empty slot."""
    lines = []
    for letter, raw in zip(np.asarray(inv_letters).reshape(-1), np.asarray(inv_strs)):
        if int(letter) == 0:
            break
        text = bytes(raw).split(b"\x00", 1)[0].decode("latin-1")
        lines.append(f"{chr(int(letter))}: {text}")
    return "\n".join(lines)


def _rows(tty_chars: np.ndarray) -> list[str]:
    """The terminal's rows as text (one character per byte)."""
    return [bytes(row).decode("latin-1") for row in np.asarray(tty_chars, dtype=np.uint8)]


def _trim(text: str) -> str:
    # the wrapper trims spaces and \x1a only; a line whose sole non-blank is its last character
    # comes out empty (its start index test)
    start = next((i for i, c in enumerate(text) if c not in " \x1a"), None)
    if start is None or start == len(text) - 1:
        return ""
    return text[start:].rstrip(" \x1a")


def _multipage_end(row: str) -> bool:
    of = row.find(" of ")
    counted = of >= 2 and of + 5 < len(row) and row[of - 2] == "(" and row[of + 5] == ")"
    return counted or "--More--" in row or "(end)" in row


def text_message(tty_chars: np.ndarray) -> str:
    """The message: the top line, or every line of a window that ends in ``--More--``, ``(end)``
    or ``(n of m)`` (read from the top line's indentation)."""
    rows = _rows(tty_chars)
    first, second = _trim(rows[0]), _trim(rows[1]) if len(rows) > 1 else ""
    if not first and not second:
        return first
    stripped = rows[0].lstrip(" ")
    indent = len(rows[0]) - len(stripped) if stripped else None
    death_screen = "Points" in second or "list!" in second
    output = ""
    blank_rows = 0
    for index, row in enumerate(rows):
        if indent is None:  # a blank top line: the wrapper reads one character early
            text = (rows[index - 1][-1] if index > 0 else "") + row
        else:
            text = row[indent:]
        text = _trim(text)
        blank_rows = blank_rows + 1 if not text else 0
        if text:
            output += text
        if _multipage_end(text):
            return output
        if text:
            output += "\n"
        if death_screen and blank_rows > 1:
            return output
    return first


def ascii_map(tty_chars: np.ndarray) -> str:
    """The terminal below the message line, every row in full, each ending with a newline."""
    return "".join(row + "\n" for row in _rows(tty_chars)[1:])


#: the wrapper's words for NetHack's alignment, hunger and encumbrance values (``blstats``); a
#: value it has no word for reads as nothing, as its ``std::unordered_map`` lookup gives
_ALIGNMENTS = {-128: "None", 1: "Lawful", 0: "Neutral", -1: "Chaotic"}
_HUNGER = ("Satiated", "Not Hungry", "Hungry", "Weak", "Fainting", "Fainted", "Starved")
_ENCUMBRANCE = ("Unencumbered", "Burdened", "Stressed", "Strained", "Overtaxed", "Overloaded")
#: the wrapper's condition names, in the order its ``std::unordered_map`` of 13 masks (13 buckets,
#: libstdc++) is walked: latest declared first, except that Riding (bucket 4096 % 13 = 1) comes
#: just before Stoned, the first declared, whose bucket it shares
_CONDITIONS: tuple[tuple[str, str], ...] = (
    ("BL_MASK_FLY", "Flying"),
    ("BL_MASK_LEV", "Levitating"),
    ("BL_MASK_HALLU", "Hallucinating"),
    ("BL_MASK_CONF", "Confused"),
    ("BL_MASK_STUN", "Stunned"),
    ("BL_MASK_DEAF", "Deaf"),
    ("BL_MASK_BLIND", "Blind"),
    ("BL_MASK_TERMILL", "Terminally Ill"),
    ("BL_MASK_FOODPOIS", "Food Poisoning"),
    ("BL_MASK_STRNGL", "Strangled"),
    ("BL_MASK_SLIME", "Slimed"),
    ("BL_MASK_RIDE", "Riding"),
    ("BL_MASK_STONE", "Stoned"),
)


def _word(words: Sequence[str], value: int) -> str:
    return words[value] if 0 <= value < len(words) else ""


def text_blstats(blstats: np.ndarray) -> str:
    """The wrapper's bottom-line statistics: one ``Name: value`` line each, from strength (its
    ``blstats[3]/blstats[2]``) to the conditions (``None`` when there are none)."""
    b = [int(v) for v in blstats]
    conditions = [name for mask, name in _CONDITIONS if b[25] & getattr(nethack, mask)]
    lines = [
        ("Strength", f"{b[3]}/{b[2]}"),
        ("Dexterity", b[4]),
        ("Constitution", b[5]),
        ("Intelligence", b[6]),
        ("Wisdom", b[7]),
        ("Charisma", b[8]),
        ("Depth", b[12]),
        ("Gold", b[13]),
        ("HP", f"{b[10]}/{b[11]}"),
        ("Energy", f"{b[14]}/{b[15]}"),
        ("AC", b[16]),
        ("XP", f"{b[18]}/{b[19]}"),
        ("Time", b[20]),
        ("Position", f"{b[0]}|{b[1]}"),
        ("Hunger", _word(_HUNGER, b[21])),
        ("Monster Level", b[17]),
        ("Encumbrance", _word(_ENCUMBRANCE, b[22])),
        ("Dungeon Number", b[23]),
        ("Level Number", b[24]),
        ("Score", b[9]),
        ("Alignment", _ALIGNMENTS.get(b[26], "")),
        ("Condition", " ".join(conditions) or "None"),
    ]
    return "\n".join(f"{name}: {value}" for name, value in lines)


def balrog_language_texts(obs: Mapping[str, np.ndarray], message: str) -> tuple[str, str]:
    """BALROG's *language* observation of an NLE state (its vision protocol, where the image
    stands in for the map): ``(current, past)``.

    ``past`` (what the history keeps) is the message, the language observation and the cursor;
    ``current`` shows the statistics (:func:`text_blstats`) and the inventory first, then the same.
    """
    sections = [
        ("message", message),
        ("language observation", text_glyphs(obs["glyphs"], obs["blstats"])),
        ("cursor", text_cursor(obs["glyphs"], obs["blstats"], obs["tty_cursor"])),
    ]
    past = "\n".join(f"{name}:\n{text}\n" for name, text in sections)
    short = [
        ("statistics", text_blstats(obs["blstats"])),
        ("inventory", text_inventory(obs["inv_strs"], obs["inv_letters"])),
    ]
    current = "\n".join(f"{name}:\n{text}\n" for name, text in short)
    return f"{current}\n{past}", past


def balrog_texts(obs: Mapping[str, np.ndarray], message: str) -> tuple[str, str]:
    """BALROG's hybrid observation of an NLE state: ``(current, past)``.

    ``past`` is what BALROG keeps of an observation in the history (message, language
    observation, cursor, map); ``current`` is what the newest observation shows: the inventory
    first, then the same. ``message`` is the turn's message (with the texts behind ``--More--``).
    """
    cursor = obs["tty_cursor"]
    sections = [
        ("message", message),
        ("language observation", text_glyphs(obs["glyphs"], obs["blstats"])),
        ("cursor", text_cursor(obs["glyphs"], obs["blstats"], cursor) + f"\n(x={int(cursor[1])}, y={int(cursor[0])})"),
        ("map", ascii_map(obs["tty_chars"])),
    ]
    past = "\n".join(f"{name}:\n{text}\n" for name, text in sections)
    inventory = f"inventory:\n{text_inventory(obs['inv_strs'], obs['inv_letters'])}\n"
    return f"{inventory}\n{past}", past
