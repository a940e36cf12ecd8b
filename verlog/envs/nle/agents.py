"""Scripted players for the NetHack-based games that read only the observation text.

* :class:`MiniHackSearchAgent` solves the MiniHack navigation tasks (mazes, rooms and corridors):
  it rebuilds a map from the text (``Position``, the ``Around you`` lines, the ``On the map``
  list), walks a shortest path to the staircase down once it has seen it, and otherwise explores
  the nearest unexplored edge of what it knows. Closed doors are opened (kicked when locked);
  monsters in the way are attacked by walking into them.
* :class:`RandomTextAgent` answers with a random valid action (the NetHack crash test).

Both act only through the text (``env.step("ACTION: ...")``), like a model.
"""

from __future__ import annotations

import heapq
import random
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from verlog.envs.base import play_steps
from verlog.envs.nle.verlog_text import DIRECTION_OF_OFFSET, DIRECTIONS
from verlog.step_info import episode_won

_POSITION = re.compile(r"^Position: column (\d+), row (\d+)\.$")
_RAY = re.compile(r"^- (north|east|south|west|northeast|southeast|southwest|northwest): (.+)$")
_RAY_OPEN = re.compile(r"^(\d+) open squares?, then (.+)$")
_FEATURE = re.compile(r"^- (.+?)(?: \((monster|item|trap)\))?: (.+?)(?: \(\d+ in all\))?$")
_STEP = re.compile(r"(\d+) steps? (north|east|south|west)")
_UNIT = {"east": (1, 0), "west": (-1, 0), "south": (0, 1), "north": (0, -1)}


def _article_free(name: str) -> str:
    for article in ("a ", "an ", "the "):
        if name.startswith(article):
            return name[len(article) :]
    return name


def parse_offset(text: str) -> tuple[int, int]:
    """``"3 steps east and 1 step north"`` -> ``(3, -1)``; ``"here"`` -> ``(0, 0)``."""
    dx = dy = 0
    for n, way in _STEP.findall(text):
        ux, uy = _UNIT[way]
        dx, dy = dx + ux * int(n), dy + uy * int(n)
    return dx, dy


@dataclass
class NLEObservation:
    """The facts of one observation text (see :func:`verlog.envs.nle.verlog_text.render`)."""

    position: tuple[int, int] | None = None
    #: direction -> (open squares in a row, what stops the line)
    rays: dict[str, tuple[int, str]] = field(default_factory=dict)
    #: name -> [(dx, dy, kind)] nearest first (at most the few the text lists)
    features: dict[str, list[tuple[int, int, str]]] = field(default_factory=dict)
    message: str = ""


def parse_observation(text: str) -> NLEObservation:
    """Read back an observation text of the MiniHack / NetHack environments."""
    facts = NLEObservation()
    section = ""
    for line in text.splitlines():
        if line.startswith("Message: "):
            facts.message = line[len("Message: ") :]
            continue
        if m := _POSITION.match(line):
            facts.position = (int(m.group(1)), int(m.group(2)))
            continue
        if line.startswith("Around you"):
            section = "around"
            continue
        if line.startswith("On the map"):
            section = "map"
            continue
        if not line.startswith("- "):
            section = "" if not line.startswith(" ") else section
            continue
        if section == "around" and (m := _RAY.match(line)):
            rest = m.group(2)
            if rest.endswith(", right next to you"):
                facts.rays[m.group(1)] = (0, _article_free(rest[: -len(", right next to you")]))
            elif r := _RAY_OPEN.match(rest):
                facts.rays[m.group(1)] = (int(r.group(1)), _article_free(r.group(2)))
        elif section == "map" and (m := _FEATURE.match(line)):
            name, kind = m.group(1), m.group(2) or "terrain"
            spots = [(*parse_offset(spot), kind) for spot in m.group(3).split("; ")]
            facts.features[name] = spots
    return facts


#: what stops a line of sight and cannot be walked through
_BLOCKING_WORDS = (
    "wall",
    "molten lava",
    "water",
    "tree",
    "iron bars",
    "edge of the map",
    "boulder",
    "raised drawbridge",
    "sink",
    "grave",
)


class MiniHackSearchAgent:
    """Explore-then-go-to-the-stairs, from the text alone (see the module docstring)."""

    def __init__(self, seed: int = 0, can_open: bool = True) -> None:
        self.rng = random.Random(seed)
        self.can_open = can_open
        self.reset()

    def reset(self) -> None:
        self.open: set[tuple[int, int]] = set()  # walkable squares seen
        self.blocked: set[tuple[int, int]] = set()
        self.doors: dict[tuple[int, int], str] = {}  # position -> "closed door" / "open door" ...
        self.goal: tuple[int, int] | None = None
        self.locked: set[tuple[int, int]] = set()
        self.last_target: tuple[int, int] | None = None
        self.last_action = ""
        self.stuck = 0
        self.previous: tuple[int, int] | None = None
        self.searched: dict[tuple[int, int], int] = {}
        self.bad_moves: set[tuple[tuple[int, int], tuple[int, int]]] = set()  # moves that failed

    # -- reading the text ----------------------------------------------------------------------

    def _learn(self, facts: NLEObservation) -> None:
        assert facts.position is not None
        x, y = facts.position
        self.open.add((x, y))
        self.blocked.discard((x, y))
        for name, (n, stop) in facts.rays.items():
            dx, dy, _ = DIRECTIONS[name]
            for i in range(1, n + 1):
                cell = (x + dx * i, y + dy * i)
                self.open.add(cell)
                self.blocked.discard(cell)
                if self.doors.get(cell) == "closed door":  # opened since
                    self.doors[cell] = "open door"
            cell = (x + dx * (n + 1), y + dy * (n + 1))
            if stop.startswith("unexplored"):
                if n == 0:  # next to us and still dark: rock (adjacent floor would show)
                    self.blocked.add(cell)
            elif any(word in stop for word in _BLOCKING_WORDS):
                self.blocked.add(cell)
                self.open.discard(cell)
            elif "closed door" in stop:
                self.doors[cell] = "closed door"
                self.blocked.discard(cell)
            else:  # a monster, an item, stairs, a trap, a fountain...: walkable
                self.open.add(cell)
        for name, spots in facts.features.items():
            for dx, dy, kind in spots:
                cell = (x + dx, y + dy)
                if name in ("staircase down", "ladder down"):
                    self.goal = cell
                    self.open.add(cell)
                elif name in ("closed door", "open door", "doorway", "broken door"):
                    self.doors[cell] = name
                    self.blocked.discard(cell)
                    if name != "closed door":
                        self.open.add(cell)
                elif any(word in name for word in _BLOCKING_WORDS) and kind == "terrain":
                    self.blocked.add(cell)
        if facts.message and "You find" in facts.message:  # a hidden door or passage appeared
            self.searched.clear()
        if "This door is locked" in facts.message and self.last_target in self.doors:
            self.locked.add(self.last_target)

    # -- moving ---------------------------------------------------------------------------------

    @staticmethod
    def _hostile(name: str, facts: NLEObservation) -> bool:
        if name.startswith(("tame ", "peaceful ")) or name.startswith("unexplored"):
            return False
        return any(kind == "monster" for _, _, kind in facts.features.get(name, []))

    def _can_step(self, a: tuple[int, int], b: tuple[int, int]) -> bool:
        if (a, b) in self.bad_moves:
            return False
        diagonal = a[0] != b[0] and a[1] != b[1]
        if diagonal and (
            self.doors.get(a) in ("open door", "closed door") or self.doors.get(b) in ("open door", "closed door")
        ):
            return False
        return b not in self.blocked

    def _path(
        self, start: tuple[int, int], targets: set[tuple[int, int]], through_unknown: bool
    ) -> list[tuple[int, int]] | None:
        """Cheapest path (unknown squares cost more) from start to any target."""
        frontier = [(0, start)]
        came: dict[tuple[int, int], tuple[int, int] | None] = {start: None}
        cost = {start: 0}
        while frontier:
            c, cur = heapq.heappop(frontier)
            if cur in targets:
                path = [cur]
                while came[path[-1]] is not None:
                    path.append(came[path[-1]])  # type: ignore[arg-type]
                return path[::-1]
            if c > cost.get(cur, 1 << 30):
                continue
            for dx, dy, _ in DIRECTIONS.values():
                nxt = (cur[0] + dx, cur[1] + dy)
                if not (0 <= nxt[0] < 80 and 0 <= nxt[1] < 21) or not self._can_step(cur, nxt):
                    continue
                known = nxt in self.open or nxt in self.doors or nxt == self.goal
                if not known and not (through_unknown or nxt in targets):
                    continue
                step = 1 if known else 4
                if nxt in self.locked:
                    step += 6
                new = c + step
                if new < cost.get(nxt, 1 << 30):
                    cost[nxt] = new
                    came[nxt] = cur
                    heapq.heappush(frontier, (new, nxt))
        return None

    def _frontier(self) -> set[tuple[int, int]]:
        """Unknown squares next to a known walkable one, and closed doors."""
        out = {cell for cell, kind in self.doors.items() if kind == "closed door"}
        for x, y in self.open:
            for dx, dy, _ in DIRECTIONS.values():
                cell = (x + dx, y + dy)
                if (
                    cell not in self.open
                    and cell not in self.blocked
                    and cell not in self.doors
                    and 0 <= cell[0] < 80
                    and 0 <= cell[1] < 21
                ):
                    out.add(cell)
        return out

    def _dead_ends(self, searches: int = 15) -> set[tuple[int, int]]:
        """Walkable squares with at most one walkable neighbour, not yet searched ``searches``
        times (hidden corridors continue from such ends); then any walkable square next to rock."""

        def neighbours(cell: tuple[int, int]) -> int:
            return sum((cell[0] + dx, cell[1] + dy) in self.open for dx, dy, _ in DIRECTIONS.values())

        ends = {c for c in self.open if neighbours(c) <= 1 and self.searched.get(c, 0) < searches}
        if ends:
            return ends
        return {c for c in self.open if self.searched.get(c, 0) < searches and neighbours(c) <= 3}

    def _move(self, here: tuple[int, int], nxt: tuple[int, int]) -> str:
        direction = DIRECTION_OF_OFFSET[(nxt[0] - here[0], nxt[1] - here[1])]
        if self.doors.get(nxt) == "closed door" and self.can_open:
            self.last_target = nxt
            return f"kick {direction}" if nxt in self.locked else f"open {direction}"
        return direction

    def act(self, observation: str) -> str:
        facts = parse_observation(observation)
        if facts.position is None:
            return "ACTION: north"
        self._learn(facts)
        here = facts.position
        self.stuck = self.stuck + 1 if here == self.previous else 0
        self.previous = here
        for direction in DIRECTIONS:  # fight what stands next to us before anything else
            n, stop = facts.rays.get(direction, (1, ""))
            if n == 0 and self._hostile(stop, facts):
                self.last_action = direction
                return f"ACTION: {direction}"
        path = None
        if self.goal is not None:
            path = self._path(here, {self.goal}, through_unknown=True)
        if path is None:
            frontier = self._frontier()
            if frontier:
                path = self._path(here, frontier, through_unknown=False)
        if path is None:  # nothing left to explore: look for hidden passages at dead ends
            spots = self._dead_ends()
            if not spots and self.searched:  # every spot searched: go round again
                self.searched.clear()
                spots = self._dead_ends()
            if here in spots:
                self.searched[here] = self.searched.get(here, 0) + 1
                self.last_action = "search"
                return "ACTION: search"
            if spots:
                path = self._path(here, spots, through_unknown=False)
        if path is None or len(path) < 2:
            safe = [d for d, (dx, dy, _) in DIRECTIONS.items() if (here[0] + dx, here[1] + dy) not in self.blocked]
            action = "search" if self.stuck % 2 or not safe else self.rng.choice(safe)
        else:
            if self.stuck >= 2 and self.last_action in DIRECTIONS:
                # the same move failed twice (something unseen, or too much to squeeze
                # diagonally between rocks): plan without it
                self.bad_moves.add((here, path[1]))
                self.stuck = 0
                path = self._path(here, {path[-1]}, through_unknown=True) or path
            action = self._move(here, path[1])
        self.last_action = action
        return f"ACTION: {action}"


class RandomTextAgent:
    """Answers with a uniformly random valid action of ``env`` (``valid_actions()`` is read
    each turn, so item actions follow the inventory)."""

    def __init__(self, valid_actions: Callable[[], list[str]], seed: int = 0) -> None:
        self.valid_actions = valid_actions
        self.rng = random.Random(seed)

    def reset(self) -> None:
        pass

    def act(self, observation: str) -> str:
        return f"ACTION: {self.rng.choice(self.valid_actions())}"


def play_scripted_episode(env: Any, agent: Any, seed: int | None = None) -> dict[str, Any]:
    """Play one episode of ``env`` with ``agent``; returns steps, return, success and last info."""
    results = play_steps(env, agent, seed)
    last = results[-1]
    return {
        "steps": len(results),
        "return": sum(r.reward for r in results),
        "success": episode_won(last.info),
        "info": last.info,
    }
