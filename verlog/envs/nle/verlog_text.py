"""NetHack and MiniHack observations as text, and named actions as NetHack keystrokes.

The NetHack Learning Environment (``nle``) returns arrays: the map as ``glyphs`` (what is drawn
on each of the 21x79 map cells), ``screen_descriptions`` (the words NetHack's own farlook ``;``
command gives for each cell, so an unidentified potion stays "a ruby potion"), the bottom-line
statistics ``blstats``, the top-line ``message``, the inventory ``inv_letters``/``inv_strs`` and
the raw terminal ``tty_chars``. :func:`render` turns one observation into the text a model reads:

* ``Message:`` what the game said this turn (every message, including the ones NetHack showed
  behind ``--More--``), plus notes on prompts the environment answered for the agent;
* ``Status:`` hit points, power, armour class, experience level, dungeon level and depth, gold,
  turn, hunger, encumbrance, afflictions (``Attributes:`` strength ... charisma, alignment);
* ``Position:`` the map column and row of the agent (columns grow east, rows grow south);
* ``Around you:`` one line per compass direction: how many open squares the agent could walk
  in a straight line, and what stops that line (a wall, a door, a monster, stairs, the unexplored
  dark ...);
* ``On the map:`` everything else worth knowing that is drawn on the map (stairs, doors,
  fountains, traps, items, monsters ...) with its direction and distance, nearest first;
* ``Inventory:`` the letter and description of each item carried;
* optionally (``show_map=True``) the ASCII map itself, for models that read it.

Walls, floor and corridor squares are described only through the ``Around you`` lines: listing
every wall square would swamp the prompt. The design follows the facts BALROG's NetHack text
contains (message, objects with distance and direction, map, inventory; see
``docs/environments_balrog.md``) but is our own code and wording.

Actions (:data:`BASE_ACTIONS`, :func:`expand_actions`) are named: ``north`` ... ``northwest``,
``far east`` (run), ``go down`` (``>``), ``search``, ``pick up``, ``kick west``, ``eat f``,
``zap g north`` ... ; each becomes a short key sequence with the prompts it raises answered from
its arguments (see :mod:`verlog.envs.nle.env`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np
from nle import nethack

from verlog.envs.text import count, offset_phrase

# --------------------------------------------------------------------------------------------
# directions

#: the eight compass directions: name -> (dx, dy, NetHack key); y grows south on the map
DIRECTIONS: Mapping[str, tuple[int, int, str]] = {
    "north": (0, -1, "k"),
    "east": (1, 0, "l"),
    "south": (0, 1, "j"),
    "west": (-1, 0, "h"),
    "northeast": (1, -1, "u"),
    "southeast": (1, 1, "n"),
    "southwest": (-1, 1, "b"),
    "northwest": (-1, -1, "y"),
}
DIRECTION_NAMES: tuple[str, ...] = tuple(DIRECTIONS)
DIRECTION_OF_OFFSET: Mapping[tuple[int, int], str] = {(dx, dy): n for n, (dx, dy, _) in DIRECTIONS.items()}


def map_offset(dx: int, dy: int) -> str:
    """Words for a map offset: ``map_offset(2, -1) == "2 steps east and 1 step north"``."""
    return offset_phrase((dx, "east", "west"), (dy, "south", "north"))


# --------------------------------------------------------------------------------------------
# what a map cell is

# NetHack's display symbols (``defsyms`` in NetHack 3.6 ``drawing.c``), by index
S_STONE = 0
WALLS = frozenset(range(1, 12))
S_NDOOR, S_VODOOR, S_HODOOR, S_VCDOOR, S_HCDOOR = 12, 13, 14, 15, 16
S_ROOM, S_DARKROOM, S_CORR, S_LITCORR = 19, 20, 21, 22
S_UPSTAIR, S_DNSTAIR, S_UPLADDER, S_DNLADDER = 23, 24, 25, 26
TRAPS = frozenset(range(42, 64))
#: plain walkable terrain: a straight line of these is just "open squares"
OPEN = frozenset({S_NDOOR, S_VODOOR, S_HODOOR, S_ROOM, S_DARKROOM, S_CORR, S_LITCORR})
#: terrain not worth a line of its own in "On the map" (covered by "Around you")
BACKGROUND = frozenset({S_STONE, *WALLS, S_ROOM, S_DARKROOM, S_CORR, S_LITCORR})
#: nicer names than farlook's for some symbols
SYMBOL_NAMES: Mapping[int, str] = {
    **{wall: "wall" for wall in WALLS},
    S_STONE: "unexplored darkness",
    S_NDOOR: "doorway",
    S_VODOOR: "open door",
    S_HODOOR: "open door",
    S_VCDOOR: "closed door",
    S_HCDOOR: "closed door",
    S_ROOM: "floor",
    S_DARKROOM: "dark floor",
    S_CORR: "corridor",
    S_LITCORR: "corridor",
}


@dataclass(frozen=True)
class Cell:
    """One map square: its ``kind`` (``terrain``, ``monster``, ``item``, ``unknown`` ...), its
    ``name`` in words, and whether it is ``open`` (plain walkable terrain)."""

    kind: str
    name: str
    open: bool = False
    symbol: int = -1  # NetHack's display symbol index for terrain, else -1


def _description(obs: Mapping[str, np.ndarray], x: int, y: int) -> str:
    raw = obs.get("screen_descriptions")
    if raw is None:
        return ""
    return bytes(raw[y, x]).split(b"\x00", 1)[0].decode("latin-1").strip()


def classify(obs: Mapping[str, np.ndarray], x: int, y: int) -> Cell:
    """What the map shows at column ``x``, row ``y`` (see :class:`Cell`)."""
    glyph = int(obs["glyphs"][y, x])
    words = _description(obs, x, y)
    if nethack.glyph_is_cmap(glyph):
        symbol = nethack.glyph_to_cmap(glyph)
        if symbol in TRAPS:
            return Cell("trap", words or "trap", symbol=symbol)
        name = SYMBOL_NAMES.get(symbol) or words or nethack.symdef.from_idx(symbol).explanation
        if symbol == S_STONE:
            return Cell("unknown", name, symbol=symbol)
        kind = "wall" if symbol in WALLS else "terrain"
        return Cell(kind, name, open=symbol in OPEN, symbol=symbol)
    if nethack.glyph_is_monster(glyph):
        if nethack.glyph_is_pet(glyph) and not words.startswith("tame"):
            words = f"tame {words}" if words else "your pet"
        if not words:
            words = nethack.permonst(nethack.glyph_to_mon(glyph)).mname
        return Cell("monster", words)
    if nethack.glyph_is_object(glyph) or nethack.glyph_is_body(glyph) or nethack.glyph_is_statue(glyph):
        return Cell("item", words or "an object")
    if nethack.glyph_is_invisible(glyph):
        return Cell("monster", "an unseen monster you remember")
    if nethack.glyph_is_warning(glyph):
        return Cell("monster", words or "a warning of an unseen monster")
    if nethack.glyph_is_swallow(glyph):
        return Cell("engulfed", words or "the inside of a monster")
    return Cell("effect", words or "something")


# --------------------------------------------------------------------------------------------
# status


HUNGER = ("satiated", "not hungry", "hungry", "weak", "fainting", "fainted", "starved")
ENCUMBRANCE = ("unencumbered", "burdened", "stressed", "strained", "overtaxed", "overloaded")
ALIGNMENT = {-1: "chaotic", 0: "neutral", 1: "lawful"}
CONDITIONS = (
    (nethack.BL_MASK_STONE, "turning to stone"),
    (nethack.BL_MASK_SLIME, "turning into slime"),
    (nethack.BL_MASK_STRNGL, "being strangled"),
    (nethack.BL_MASK_FOODPOIS, "food poisoned"),
    (nethack.BL_MASK_TERMILL, "terminally ill"),
    (nethack.BL_MASK_BLIND, "blind"),
    (nethack.BL_MASK_DEAF, "deaf"),
    (nethack.BL_MASK_STUN, "stunned"),
    (nethack.BL_MASK_CONF, "confused"),
    (nethack.BL_MASK_HALLU, "hallucinating"),
    (nethack.BL_MASK_LEV, "levitating"),
    (nethack.BL_MASK_FLY, "flying"),
    (nethack.BL_MASK_RIDE, "riding"),
)


@dataclass(frozen=True)
class Stats:
    """The bottom-line numbers NetHack shows (from ``blstats``)."""

    x: int
    y: int
    hp: int
    max_hp: int
    power: int
    max_power: int
    armor_class: int
    experience_level: int
    experience_points: int
    depth: int
    dungeon_level: int
    gold: int
    turn: int
    hunger: int
    encumbrance: int
    conditions: int
    strength: int
    strength_percent: int
    dexterity: int
    constitution: int
    intelligence: int
    wisdom: int
    charisma: int
    alignment: int | None
    score: int

    @classmethod
    def from_blstats(cls, blstats: Sequence[int]) -> "Stats":
        b = [int(v) for v in blstats]
        nh = nethack
        return cls(
            x=b[nh.NLE_BL_X],
            y=b[nh.NLE_BL_Y],
            hp=b[nh.NLE_BL_HP],
            max_hp=b[nh.NLE_BL_HPMAX],
            power=b[nh.NLE_BL_ENE],
            max_power=b[nh.NLE_BL_ENEMAX],
            armor_class=b[nh.NLE_BL_AC],
            experience_level=b[nh.NLE_BL_XP],
            experience_points=b[nh.NLE_BL_EXP],
            depth=b[nh.NLE_BL_DEPTH],
            dungeon_level=b[nh.NLE_BL_DLEVEL],
            gold=b[nh.NLE_BL_GOLD],
            turn=b[nh.NLE_BL_TIME],
            hunger=b[nh.NLE_BL_HUNGER],
            encumbrance=b[nh.NLE_BL_CAP],
            conditions=b[nh.NLE_BL_CONDITION],
            strength=b[nh.NLE_BL_STR25],
            strength_percent=b[nh.NLE_BL_STR125],
            dexterity=b[nh.NLE_BL_DEX],
            constitution=b[nh.NLE_BL_CON],
            intelligence=b[nh.NLE_BL_INT],
            wisdom=b[nh.NLE_BL_WIS],
            charisma=b[nh.NLE_BL_CHA],
            alignment=b[nh.NLE_BL_ALIGN] if len(b) > nh.NLE_BL_ALIGN else None,
            score=b[nh.NLE_BL_SCORE],
        )


def _strength(stats: Stats) -> str:
    if stats.strength <= 18:
        return str(stats.strength)
    if stats.strength < 118:  # 18/01 .. 18/99 are stored as 19 .. 117
        return f"18/{stats.strength - 18:02d}"
    return "18/**" if stats.strength == 118 else str(stats.strength - 100)


def status_text(stats: Stats) -> str:
    """``Status: HP 12 of 14, ...`` (one line) and ``Attributes: ...`` (one line)."""
    hunger = HUNGER[stats.hunger] if 0 <= stats.hunger < len(HUNGER) else f"hunger state {stats.hunger}"
    parts = [
        f"HP {stats.hp} of {stats.max_hp}",
        f"power {stats.power} of {stats.max_power}",
        f"armor class {stats.armor_class}",
        f"experience level {stats.experience_level} ({stats.experience_points} points)",
        f"dungeon level {stats.dungeon_level} (depth {stats.depth})",
        f"gold {stats.gold}",
        f"turn {stats.turn}",
        hunger,
    ]
    if 0 < stats.encumbrance < len(ENCUMBRANCE):
        parts.append(ENCUMBRANCE[stats.encumbrance])
    parts += [words for mask, words in CONDITIONS if stats.conditions & mask]
    attributes = (
        f"strength {_strength(stats)}, dexterity {stats.dexterity}, constitution "
        f"{stats.constitution}, intelligence {stats.intelligence}, wisdom {stats.wisdom}, "
        f"charisma {stats.charisma}"
    )
    if stats.alignment in ALIGNMENT:
        attributes += f", {ALIGNMENT[stats.alignment]}"
    return f"Status: {', '.join(parts)}.\nAttributes: {attributes}."


# --------------------------------------------------------------------------------------------
# the map around the agent


#: names that take no article
MASS_NOUNS = frozenset({"molten lava", "water", "ice", "air", "cloud", "floor", "dark floor", "corridor"})


def _with_article(name: str) -> str:
    lowered = name.lower()
    if lowered in MASS_NOUNS:
        return name
    if lowered.startswith(("a ", "an ", "the ", "your ", "tame ", "peaceful ", "unexplored")) or lowered[:1].isdigit():
        return name
    return f"{'an' if lowered[:1] in 'aeiou' else 'a'} {name}"


def ray(obs: Mapping[str, np.ndarray], x: int, y: int, dx: int, dy: int) -> tuple[int, Cell | None]:
    """Walk from (x, y) in direction (dx, dy): the number of open squares in a row, and the first
    square that is not one (``None`` past the map's edge)."""
    height, width = obs["glyphs"].shape
    n = 0
    cx, cy = x + dx, y + dy
    while 0 <= cx < width and 0 <= cy < height:
        cell = classify(obs, cx, cy)
        if not cell.open:
            return n, cell
        n += 1
        cx, cy = cx + dx, cy + dy
    return n, None


def around_text(obs: Mapping[str, np.ndarray], x: int, y: int) -> str:
    """``Around you:`` one line per compass direction (see the module docstring)."""
    lines = ["Around you (open squares in a straight line, then what stops the line):"]
    for name, (dx, dy, _) in DIRECTIONS.items():
        n, stop = ray(obs, x, y, dx, dy)
        what = "the edge of the map" if stop is None else _with_article(stop.name)
        if n == 0:
            lines.append(f"- {name}: {what}, right next to you")
        else:
            lines.append(f"- {name}: {count(n, 'open square')}, then {what}")
    return "\n".join(lines)


def features(obs: Mapping[str, np.ndarray], x: int, y: int) -> dict[str, list[tuple[int, int, int, str]]]:
    """Everything drawn on the map that is not plain background, grouped by name: for each name
    a list of ``(distance, dx, dy, kind)``, nearest first (distance = moves, diagonals allowed)."""
    glyphs = obs["glyphs"]
    height, width = glyphs.shape
    found: dict[str, list[tuple[int, int, int, str]]] = {}
    # a cheap mask first: skip stone, walls, floor and corridors drawn as plain map symbols
    cmap = glyphs - nethack.GLYPH_CMAP_OFF
    plain = (cmap >= 0) & (cmap < nethack.MAXPCHARS)
    background = np.isin(cmap, list(BACKGROUND)) & plain
    ys, xs = np.nonzero(~background)
    for cy, cx in zip(ys.tolist(), xs.tolist()):
        if cx == x and cy == y:
            continue
        cell = classify(obs, cx, cy)
        if cell.symbol in BACKGROUND:
            continue
        dx, dy = cx - x, cy - y
        found.setdefault(cell.name, []).append((max(abs(dx), abs(dy)), dx, dy, cell.kind))
    for spots in found.values():
        spots.sort()
    return found


_KIND_ORDER = {"monster": 0, "terrain": 1, "trap": 2, "item": 3, "engulfed": 4, "effect": 5}


def features_text(obs: Mapping[str, np.ndarray], x: int, y: int, max_per_name: int = 3) -> str:
    """``On the map:`` the non-background squares, nearest few per name."""
    found = features(obs, x, y)
    if not found:
        return "On the map: nothing else is visible or remembered."
    lines = ["On the map (direction and distance from you, nearest first):"]
    for name, spots in sorted(found.items(), key=lambda kv: (kv[1][0][0], _KIND_ORDER.get(kv[1][0][3], 9), kv[0])):
        where = "; ".join(map_offset(dx, dy) for _, dx, dy, _ in spots[:max_per_name])
        kind = spots[0][3]
        label = f"{name} ({kind})" if kind in ("monster", "item", "trap") else name
        more = f" ({len(spots)} in all)" if len(spots) > max_per_name else ""
        lines.append(f"- {label}: {where}{more}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# inventory, message, screen


def _cstr(row: np.ndarray) -> str:
    return bytes(row).split(b"\x00", 1)[0].decode("latin-1").strip()


def inventory_items(obs: Mapping[str, np.ndarray]) -> list[tuple[str, str]]:
    """``[(letter, description), ...]`` of the items carried."""
    letters = obs.get("inv_letters")
    strs = obs.get("inv_strs")
    if letters is None or strs is None:
        return []
    items = []
    for letter, text in zip(letters.tolist(), strs):
        if letter:
            items.append((chr(letter), _cstr(text)))
    return items


def inventory_text(obs: Mapping[str, np.ndarray]) -> str:
    items = inventory_items(obs)
    if not items:
        return "Inventory: empty."
    return "Inventory:\n" + "\n".join(f"- {letter}: {text}" for letter, text in items)


def message_of(obs: Mapping[str, np.ndarray]) -> str:
    """The top-line message of an observation."""
    message = obs.get("message")
    return _cstr(message) if message is not None else ""


def screen_lines(obs: Mapping[str, np.ndarray]) -> list[str]:
    """The terminal as 24 lines of text."""
    return [bytes(row).decode("latin-1").rstrip() for row in obs["tty_chars"]]


def map_text(obs: Mapping[str, np.ndarray]) -> str:
    """The ASCII map (terminal rows 1-21), blank rows and the common left margin removed."""
    rows = screen_lines(obs)[1:22]
    numbered = [(i, r) for i, r in enumerate(rows) if r.strip()]
    if not numbered:
        return "Map: (nothing drawn yet)"
    margin = min(len(r) - len(r.lstrip()) for _, r in numbered)
    first, last = numbered[0][0], numbered[-1][0]
    body = "\n".join(rows[i][margin:] for i in range(first, last + 1))
    return f"Map (rows {first} to {last}, columns from {margin}; @ is you, north is up):\n{body}"


def render(
    obs: Mapping[str, np.ndarray],
    message: str | None = None,
    *,
    show_map: bool = False,
    show_status: bool = True,
    show_inventory: bool = True,
    max_per_name: int = 3,
) -> str:
    """The observation text (see the module docstring). ``message`` replaces the observation's
    own top line (the environment passes every message of the turn, with its notes)."""
    stats = Stats.from_blstats(obs["blstats"])
    message = message_of(obs) if message is None else message
    parts = [f"Message: {message.strip() or '(none)'}"]
    if show_status:
        parts.append(status_text(stats))
    parts.append(f"Position: column {stats.x}, row {stats.y}.")
    parts.append(around_text(obs, stats.x, stats.y))
    parts.append(features_text(obs, stats.x, stats.y, max_per_name))
    if show_map:
        parts.append(map_text(obs))
    if show_inventory:
        parts.append(inventory_text(obs))
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------
# named actions


@dataclass(frozen=True)
class ActionSpec:
    """A named action: the ``keys`` it types (``{direction}`` stands for the direction's key,
    for prefix commands that read it directly), the arguments it takes (``"direction"``,
    ``"item"``), a ``help`` line, and how to answer a yes/no question it raises (``confirm``:
    substring of the question -> answer key)."""

    keys: str
    help: str
    args: tuple[str, ...] = ()
    confirm: tuple[tuple[str, str], ...] = ()
    select_all: bool = False  # a menu it opens should be answered "all"
    text: str = ""  # typed at a text prompt
    item: str = ""  # the item letter given when the action takes no <item> argument


def _m(key: str) -> str:
    """NetHack's meta key (M-key), as NLE's action set spells it."""
    return chr(0x80 | ord(key))


#: every named action (arguments shown as placeholders), in the order the instruction lists them
BASE_ACTIONS: Mapping[str, ActionSpec] = {
    **{name: ActionSpec(key, f"move one square {name}") for name, (_, _, key) in DIRECTIONS.items()},
    **{
        f"far {name}": ActionSpec(key.upper(), f"run {name} until something interesting happens")
        for name, (_, _, key) in DIRECTIONS.items()
    },
    "go down": ActionSpec(">", "go down the staircase (or ladder) you are standing on"),
    "go up": ActionSpec("<", "go up the staircase (or ladder) you are standing on"),
    "wait": ActionSpec(".", "rest one turn, doing nothing"),
    "search": ActionSpec("s", "search the squares around you for hidden doors, passages and traps"),
    "pick up": ActionSpec(",", "pick up everything on your square", select_all=True),
    "look": ActionSpec(":", "look at what is on your square"),
    "pray": ActionSpec(
        _m("p"), "pray to your god for help (works rarely; best when in trouble)", confirm=(("pray", "y"),)
    ),
    "open <direction>": ActionSpec("o", "open the door next to you in that direction", ("direction",)),
    "close <direction>": ActionSpec("c", "close the door next to you in that direction", ("direction",)),
    "kick <direction>": ActionSpec(
        chr(4), "kick whatever is next to you in that direction (locked doors, monsters)", ("direction",)
    ),
    "fight <direction>": ActionSpec(
        "F{direction}", "attack in that direction even if you see no monster there", ("direction",)
    ),
    "eat": ActionSpec("e", "eat the food on your square", confirm=(("eat it", "y"), ("eat one", "y"))),
    "eat <item>": ActionSpec(
        "e", "eat an item you carry (give its letter)", ("item",), confirm=(("eat it", "n"), ("eat one", "n"))
    ),
    "quaff <item>": ActionSpec("q", "drink a potion you carry", ("item",), confirm=(("drink from the", "n"),)),
    "read <item>": ActionSpec("r", "read a scroll or spellbook you carry", ("item",)),
    "wield <item>": ActionSpec("w", "wield a weapon you carry", ("item",)),
    "wear <item>": ActionSpec("W", "put on a piece of armor you carry", ("item",)),
    "take off <item>": ActionSpec("T", "take off a piece of armor you wear", ("item",)),
    "put on <item>": ActionSpec("P", "put on a ring or amulet you carry", ("item",)),
    "remove <item>": ActionSpec("R", "remove a ring or amulet you wear", ("item",)),
    "drop <item>": ActionSpec("d", "drop an item you carry", ("item",)),
    "apply <item>": ActionSpec("a", "use a tool you carry (a key, a horn, a pick-axe ...)", ("item",)),
    "apply <item> <direction>": ActionSpec("a", "use a tool you carry toward a direction", ("item", "direction")),
    "throw <item> <direction>": ActionSpec("t", "throw an item you carry in a direction", ("item", "direction")),
    "fire <direction>": ActionSpec("f", "shoot what is in your quiver in a direction", ("direction",)),
    "zap <item> <direction>": ActionSpec("z", "zap a wand you carry in a direction", ("item", "direction")),
    "zap <item>": ActionSpec("z", "zap a wand that needs no direction", ("item",)),
    "engrave Elbereth": ActionSpec(
        "E",
        "write Elbereth in the dust with your fingers (scares most monsters)",
        confirm=(("write in the", "y"), ("add to the", "n"), ("do you want to add", "n")),
        text="Elbereth",
        item="-",
    ),
    "esc": ActionSpec(chr(27), "cancel: does nothing"),
}

#: BALROG's action names (and a few natural ones) for ours
SYNONYMS: Mapping[str, str] = {
    **{f"move {d}": d for d in DIRECTION_NAMES},
    **{f"go {d}": d for d in DIRECTION_NAMES},
    **{f"walk {d}": d for d in DIRECTION_NAMES},
    **{f"run {d}": f"far {d}" for d in DIRECTION_NAMES},
    **{f"move far {d}": f"far {d}" for d in DIRECTION_NAMES},
    "down": "go down",
    "up": "go up",
    "descend": "go down",
    "ascend": "go up",
    "go downstairs": "go down",
    "go upstairs": "go up",
    "rest": "wait",
    "pickup": "pick up",
    "pick up item": "pick up",
    "escape": "esc",
}


def expand_actions(bases: Iterable[str], item_letters: Sequence[str]) -> list[str]:
    """The concrete action strings: ``<direction>`` by the eight directions, ``<item>`` by the
    letters of the items carried. Gold (``$``) is not offered as an item: a name made of a verb
    and a symbol would read like the bare verb to the tolerant parser."""
    out: list[str] = []
    letters = [letter for letter in item_letters if letter.isalpha()]
    for base in bases:
        forms = [base]
        if "<item>" in base:
            forms = [f.replace("<item>", letter) for f in forms for letter in letters]
        if "<direction>" in base:
            forms = [f.replace("<direction>", d) for f in forms for d in DIRECTION_NAMES]
        out += forms
    return out


def resolve(action: str) -> tuple[str, dict[str, str]]:
    """Split a concrete action (``"zap f north"``) into its base name (``"zap <item>
    <direction>"``) and arguments (``{"item": "f", "direction": "north"}``)."""
    if action in BASE_ACTIONS:
        return action, {}
    words = action.split()
    for base, spec in BASE_ACTIONS.items():
        if not spec.args:
            continue
        pattern = base.split()
        if len(pattern) != len(words):
            continue
        args: dict[str, str] = {}
        for p, w in zip(pattern, words):
            if p == "<direction>" and w in DIRECTIONS:
                args["direction"] = w
            elif p == "<item>" and len(w) == 1 and w.isalpha():
                args["item"] = w
            elif p != w:
                break
        else:
            return base, args
    raise KeyError(action)
