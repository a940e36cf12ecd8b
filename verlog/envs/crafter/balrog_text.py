"""Crafter as BALROG's evaluation shows it: action names, observation text, first step.

BALROG plays Crafter (``crafter.Env`` with a 64x64 world and the 9x9 view) through a language
wrapper whose rules this module reproduces:

* **Actions**: Crafter's 17, in Crafter's order, named in title case with compass points for the
  moves: ``Noop``, ``Move West``, ``Move East``, ``Move North``, ``Move South``, ``Do``,
  ``Sleep``, ``Place Stone`` ... ``Make Iron Sword`` (:data:`BALROG_ACTIONS`). An answer must be
  exactly one of them once cleaned; otherwise ``Noop`` runs.
* **First observation**: resetting the game also plays one ``Noop`` step, and the first
  observation is the one after it.
* **Observation** (:func:`balrog_texts`): a long-term part, kept in the history, and a short-term
  part, shown only with the newest observation (before the long-term part):

  - long-term: "You are sleeping, ..." or "You died." when so, then ``You see:`` and one line per
    kind of thing in the 9x7 area around the player (the player excepted), the nearest of each
    kind (the first found, column by column from the west, on a tie), as ``- tree 2 steps to
    your north-west`` (the distance counts steps along both axes), or ``You see nothing away
    from you.``; then ``You face <thing> at your front.``;
  - short-term: ``Your status:`` with health, food, drink and energy out of 9, then ``Your
    inventory:`` with every item held (Crafter's item names, ``wood_pickaxe``), or ``You have
    nothing in your inventory.``

  Things are named by Crafter's semantic map: its materials (``grass``, ``water``, ``table`` ...)
  and its creatures in lower case (``cow``, ``zombie``, ``skeleton``, ``arrow``, ``plant``).
  The area is cut from that map with NumPy slices exactly as BALROG cuts it, edge effects
  included: near the world's west or north edge the slice is empty (nothing seen, nothing
  faced), near the east or south edge it is shorter.
* **Episodes**: 2,000 steps (BALROG's ``max_episode_steps``) unless the player dies;
  progression is the share of the 22 achievements unlocked.
"""

from __future__ import annotations

from typing import Any

from crafter import constants

#: Crafter's map directions as compass points (the game's "left" is west, "up" is north)
COMPASS: dict[str, str] = {"left": "west", "right": "east", "up": "north", "down": "south"}
VITALS: tuple[str, ...] = ("health", "food", "drink", "energy")


def _balrog_name(action: str) -> str:
    """``move_left`` -> ``Move West``, ``make_wood_pickaxe`` -> ``Make Wood Pickaxe``."""
    return " ".join(COMPASS.get(word, word).capitalize() for word in action.split("_"))


#: BALROG's names of Crafter's 17 actions, in Crafter's numbering
BALROG_ACTIONS: tuple[str, ...] = tuple(_balrog_name(a) for a in constants.actions)
#: the action BALROG runs when an answer names none
BALROG_DEFAULT_ACTION = BALROG_ACTIONS[0]


def semantic_names(game: Any) -> list[str]:
    """Names of the ids of Crafter's semantic map: its materials as Crafter names them (id 0 is
    ``None``), then its creature classes in lower case."""
    view = game._sem_view
    ids = {
        **{i: str(material) for material, i in view._mat_ids.items()},
        **{i: cls.__name__.lower() for cls, i in view._obj_ids.items()},
    }
    return [ids.get(i, "") for i in range(max(ids) + 1)]


def _offset_words(dx: int, dy: int) -> str:
    """``2 steps to your north-west``: the steps along both axes, then the compass points
    (north or south first)."""
    points = (["north"] if dy < 0 else ["south"] if dy > 0 else []) + (
        ["west"] if dx < 0 else ["east"] if dx > 0 else []
    )
    distance = abs(dx) + abs(dy)
    return f"{distance} step{'s' if distance > 1 else ''} to your {'-'.join(points)}"


def _surroundings(game: Any, names: list[str]) -> str:
    """``You see: ...`` and ``You face ...``; BALROG's error line when the player is not on the map."""
    semantic = game._sem_view()
    px, py = (int(v) for v in game._player.pos)
    if names[int(semantic[px, py])] != "player":
        return "Error, you are out of the map."
    half_x, half_y = (int(v) // 2 for v in game._view)
    # the same cut as BALROG's: 9 columns, 7 rows (the rows of the image above the inventory)
    area = semantic[px - half_x : px + half_x + 1, py - half_y + 1 : py + half_y]
    center = (half_x, half_y - 1)
    fx, fy = (int(v) for v in game._player.facing)
    tx, ty = center[0] + fx, center[1] + fy
    if 0 <= tx < area.shape[0] and 0 <= ty < area.shape[1]:
        facing = f"You face {names[int(area[tx, ty])]} at your front."
    else:
        facing = "You face nothing at your front."
    nearest: dict[str, tuple[int, str]] = {}  # the first found wins a tie
    for i in range(area.shape[0]):
        for j in range(area.shape[1]):
            name = names[int(area[i, j])]
            if name == "player":
                continue
            dx, dy = i - center[0], j - center[1]
            if name not in nearest or abs(dx) + abs(dy) < nearest[name][0]:
                nearest[name] = (abs(dx) + abs(dy), _offset_words(dx, dy))
    seen = (
        "You see:\n" + "\n".join(f"- {name} {words}" for name, (_, words) in nearest.items())
        if nearest
        else "You see nothing away from you."
    )
    return f"{seen}\n\n{facing}"


def _status(game: Any) -> str:
    player = game._player
    if player.sleeping:
        return "You are sleeping, and will not be able take actions until energy is full."
    if player.health <= 0:
        return "You died."
    return ""


def _inventory(game: Any) -> str:
    inventory = game._player.inventory
    status = "\n".join(f"- {name}: {inventory[name]}/9" for name in VITALS)
    items = [f"- {name}: {count}" for name, count in inventory.items() if name not in VITALS and count != 0]
    held = "Your inventory:\n" + "\n".join(items) if items else "You have nothing in your inventory."
    return f"Your status:\n{status}\n\n{held}"


def balrog_texts(game: Any) -> tuple[str, str]:
    """BALROG's observation of a Crafter game (a ``crafter.Env`` after a step): ``(current,
    past)``, where ``past`` is the long-term part the history keeps and ``current`` the newest
    observation's text (the short-term part, a line break, the long-term part)."""
    surroundings = _surroundings(game, semantic_names(game))
    status = _status(game)
    if status and not surroundings.startswith("Error"):
        surroundings = f"{status}\n\n\n\n{surroundings}"  # BALROG joins them with two blank lines
    return f"{_inventory(game)}\n{surroundings}", surroundings


#: what each action does, as the BALROG-protocol instruction lists it (verlog's words)
_ACTION_HELP: dict[str, str] = {
    "noop": "wait and do nothing",
    "move_left": "walk one cell west across open ground",
    "move_right": "walk one cell east across open ground",
    "move_up": "walk one cell north across open ground",
    "move_down": "walk one cell south across open ground",
    "do": "act on what is in front of you: gather a material, drink water, hit a creature",
    "sleep": "sleep while your energy is not full",
    "place_stone": "put a stone on the cell in front of you",
    "place_table": "put a crafting table in front of you",
    "place_furnace": "put a furnace in front of you",
    "place_plant": "plant a sapling in front of you",
    "make_wood_pickaxe": "craft a wood pickaxe (needs a table nearby and wood)",
    "make_stone_pickaxe": "craft a stone pickaxe (needs a table nearby, wood and stone)",
    "make_iron_pickaxe": "craft an iron pickaxe (needs a table and a furnace nearby, wood, coal and iron)",
    "make_wood_sword": "craft a wood sword (needs a table nearby and wood)",
    "make_stone_sword": "craft a stone sword (needs a table nearby, wood and stone)",
    "make_iron_sword": "craft an iron sword (needs a table and a furnace nearby, wood, coal and iron)",
}


def balrog_instruction() -> str:
    """The instruction under BALROG's protocol: BALROG's facts (the 17 actions with what each
    does, the 22 achievements, the goal), in verlog's words; the answer rule comes with each
    observation (:mod:`verlog.envs.balrog_protocol`)."""
    actions = ",\n".join(f"{_balrog_name(a)}: {_ACTION_HELP[a]}" for a in constants.actions)
    achievements = "\n".join(
        f"{i}. {' '.join(w.capitalize() for w in name.split('_'))}" for i, name in enumerate(constants.achievements, 1)
    )
    return (
        "You are an agent in Crafter, a survival game. These are the only actions you can take, each "
        f"followed by what it does:\n\n{actions}.\n\n"
        f"These are the achievements the game counts:\n{achievements}\n\n"
        "Next you will see the history of your actions and observations.\n"
        "Get as far as you can by unlocking every achievement.\n\nPLAY!"
    )
