"""BabaIsAI levels drawn as the original game draws them (BALROG's vision protocol).

BALROG's BabaIsAI wrapper shows the model ``render(mode="rgb_array")`` of the original game
(nacloos/baba-is-ai): the whole level, its border included, 32 pixels a cell, so a ``width`` x
``height`` level is a ``32 * height`` x ``32 * width`` RGB image. :func:`render_level` draws a
:class:`~.game.GameState` the same way:

* each cell is drawn at three times its size (96x96) and averaged down to 32x32 (the original's
  anti-aliasing), the mean's fractions dropped: first a grid line along its top and left edges
  (grey 100), then the thing on top of the cell;
* the border is a grey square filling the cell; a ``wall`` object a smaller grey square; a
  ``ball`` a green disc; a ``key`` a blue key; a ``door`` a red door; a ``baba`` a white triangle
  pointing the way it faces (the direction of the player's last move for the baba that is YOU,
  right when the level starts; any other baba points right: the original draws it from a cache of
  tiles shared by the whole process, filled by the first one it drew);
* a word block is a light square (235) holding a black square with its word written in OpenCV's
  Hershey simplex font (scale 1, 3 pixels thick, centred), as the original writes it; the
  property DEFEAT reads ``lose`` there, the original's name for it.

The shapes are the original's, evaluated at each pixel's centre; the word text needs OpenCV
(``opencv-python-headless``, which BALROG and BabaIsAI install too).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from .game import NOUN_BASE, OBJECT_NAMES, PROP_BASE, PROPERTY_NAMES, YOU, GameState, kind_name

#: pixels of a cell's side in the image (the original's ``TILE_PIXELS``)
TILE_PIXELS = 32
#: each cell is drawn this many times larger, then averaged down
SUBDIVS = 3
_GRID_LINE = (100, 100, 100)
_GREY = (100, 100, 100)
_WORD_BACK = (235, 235, 235)
_WORD_MARGIN = 10
#: the original's default colour of each object type (its levels give objects no other)
OBJECT_COLORS: dict[str, tuple[int, int, int]] = {
    "baba": (255, 255, 255),
    "wall": _GREY,
    "key": (0, 0, 255),
    "ball": (0, 255, 0),
    "door": (255, 0, 0),
}
#: the direction a move faces, as the original numbers them (0 right, 1 down, 2 left, 3 up)
FACING: dict[str, int] = {"right": 0, "down": 1, "left": 2, "up": 3}
#: a cell kind for the border ring (the original's ``Wall``)
_BORDER = -1


def word_text(kind: int) -> str:
    """The word written on a word block (DEFEAT is ``lose``, as the original names it)."""
    if kind >= PROP_BASE and PROPERTY_NAMES[kind - PROP_BASE] == "defeat":
        return "lose"
    return kind_name(kind)


def _coordinates(size: int) -> tuple[np.ndarray, np.ndarray]:
    """The pixel centres of a ``size`` x ``size`` tile in 0-1 units: ``(x, y)``."""
    centres = (np.arange(size) + 0.5) / size
    return np.broadcast_to(centres[None, :], (size, size)), np.broadcast_to(centres[:, None], (size, size))


def _rect(x: np.ndarray, y: np.ndarray, xmin: float, xmax: float, ymin: float, ymax: float) -> np.ndarray:
    return (x >= xmin) & (x <= xmax) & (y >= ymin) & (y <= ymax)


def _circle(x: np.ndarray, y: np.ndarray, cx: float, cy: float, r: float) -> np.ndarray:
    return (x - cx) * (x - cx) + (y - cy) * (y - cy) <= r * r


def _triangle(x: np.ndarray, y: np.ndarray, a: tuple, b: tuple, c: tuple) -> np.ndarray:
    """Inside the triangle ``abc``, by barycentric coordinates (the original's test)."""
    v0 = (c[0] - a[0], c[1] - a[1])
    v1 = (b[0] - a[0], b[1] - a[1])
    v2x, v2y = x - a[0], y - a[1]
    dot00 = v0[0] * v0[0] + v0[1] * v0[1]
    dot01 = v0[0] * v1[0] + v0[1] * v1[1]
    dot11 = v1[0] * v1[0] + v1[1] * v1[1]
    dot02 = v0[0] * v2x + v0[1] * v2y
    dot12 = v1[0] * v2x + v1[1] * v2y
    inv_denom = 1 / (dot00 * dot11 - dot01 * dot01)
    u = (dot11 * dot02 - dot01 * dot12) * inv_denom
    v = (dot00 * dot12 - dot01 * dot02) * inv_denom
    return (u >= 0) & (v >= 0) & (u + v < 1)


def _rotated(x: np.ndarray, y: np.ndarray, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """The points a shape turned by ``theta`` about the centre is tested at."""
    x, y = x - 0.5, y - 0.5
    return 0.5 + x * math.cos(-theta) - y * math.sin(-theta), 0.5 + y * math.cos(-theta) + x * math.sin(-theta)


def _word_image(text: str) -> np.ndarray:
    """The black square of a word block with ``text`` written in it, as the original writes it."""
    try:
        import cv2
    except ImportError:  # pragma: no cover - depends on the installation
        raise ImportError(
            "BabaIsAI's images write the word blocks with OpenCV, as the original game does: "
            "pip install opencv-python-headless (in verlog's envs extra)"
        ) from None
    side = SUBDIVS * TILE_PIXELS - 2 * _WORD_MARGIN
    image = np.zeros((side, side, 3), np.uint8)
    font, scale, thickness = cv2.FONT_HERSHEY_SIMPLEX, 1, 3
    width, height = cv2.getTextSize(text, font, scale, thickness)[0]
    origin = (int((side - width) / 2), int((side + height) / 2))
    cv2.putText(image, text, origin, fontFace=font, fontScale=scale, color=_WORD_BACK, thickness=thickness)
    return image


@lru_cache(maxsize=None)
def tile(kind: int | None, facing: int = 0) -> np.ndarray:
    """The 32x32 image of a cell holding ``kind`` on top (``None``: an empty cell; ``-1``: the
    border), a baba facing ``facing``; read-only (cached)."""
    size = SUBDIVS * TILE_PIXELS
    image = np.zeros((size, size, 3), np.uint8)
    x, y = _coordinates(size)
    image[_rect(x, y, 0, 0.031, 0, 1)] = _GRID_LINE
    image[_rect(x, y, 0, 1, 0, 0.031)] = _GRID_LINE
    if kind == _BORDER:
        image[_rect(x, y, 0, 1, 0, 1)] = _GREY
    elif kind is not None and kind >= NOUN_BASE:
        image[_rect(x, y, 0.06, 0.94, 0.06, 0.94)] = _WORD_BACK
        image[_WORD_MARGIN:-_WORD_MARGIN, _WORD_MARGIN:-_WORD_MARGIN] = _word_image(word_text(kind))
    elif kind is not None:
        name = OBJECT_NAMES[kind]
        color = OBJECT_COLORS[name]
        if name == "wall":
            image[_rect(x, y, 0.2, 0.8, 0.2, 0.8)] = color
        elif name == "ball":
            image[_circle(x, y, 0.5, 0.5, 0.31)] = color
        elif name == "door":
            image[_rect(x, y, 0.00, 1.00, 0.00, 1.00)] = color
            image[_rect(x, y, 0.04, 0.96, 0.04, 0.96)] = (0, 0, 0)
            image[_rect(x, y, 0.08, 0.92, 0.08, 0.92)] = color
            image[_rect(x, y, 0.12, 0.88, 0.12, 0.88)] = (0, 0, 0)
            image[_circle(x, y, 0.75, 0.50, 0.08)] = color
        elif name == "key":
            image[_rect(x, y, 0.50, 0.63, 0.31, 0.88)] = color
            image[_rect(x, y, 0.38, 0.50, 0.59, 0.66)] = color
            image[_rect(x, y, 0.38, 0.50, 0.81, 0.88)] = color
            image[_circle(x, y, 0.56, 0.28, 0.190)] = color
            image[_circle(x, y, 0.56, 0.28, 0.064)] = (0, 0, 0)
        elif name == "baba":
            rx, ry = _rotated(x, y, 0.5 * math.pi * facing)
            image[_triangle(rx, ry, (0.12, 0.19), (0.87, 0.50), (0.12, 0.81))] = color
        else:  # pragma: no cover - every object type is drawn above
            raise ValueError(f"no drawing for BabaIsAI object {name!r}")
    small = image.reshape(TILE_PIXELS, SUBDIVS, TILE_PIXELS, SUBDIVS, 3).mean(axis=3).mean(axis=1)
    out = np.zeros((TILE_PIXELS, TILE_PIXELS, 3), np.uint8)
    out[...] = small  # the original stores the means in a uint8 image: fractions dropped
    out.flags.writeable = False
    return out


def top_kinds(state: GameState) -> dict[tuple[int, int], int]:
    """The kind on top of every cell holding something: a word block (the later of two), else an
    object you control, else the object there (as BALROG's text names them)."""
    props = state.rules.props
    top: dict[tuple[int, int], int] = {}
    for kind, x, y in state.iter_objects():
        if (x, y) not in top or (props[kind] & YOU and not props[top[(x, y)]] & YOU):
            top[(x, y)] = kind
    for kind, x, y in state.iter_words():
        top[(x, y)] = kind
    return top


def render_level(state: GameState, facing: int = 0) -> np.ndarray:
    """The ``(32 * height, 32 * width, 3)`` image of ``state`` as the original draws it (see the
    module docstring); ``facing``: the direction of the player's last move (:data:`FACING`)."""
    if facing not in FACING.values():
        raise ValueError(
            f"facing must be one of {sorted(FACING.values())} (0 right, 1 down, 2 left, 3 up), got {facing}"
        )
    props = state.rules.props
    top = top_kinds(state)
    image = np.zeros((state.height * TILE_PIXELS, state.width * TILE_PIXELS, 3), np.uint8)
    for y in range(state.height):
        for x in range(state.width):
            if x in (0, state.width - 1) or y in (0, state.height - 1):
                kind: int | None = _BORDER
            else:
                kind = top.get((x, y))
            turned = kind is not None and 0 <= kind < NOUN_BASE and OBJECT_NAMES[kind] == "baba" and props[kind] & YOU
            cell = tile(kind, facing if turned else 0)
            image[y * TILE_PIXELS : (y + 1) * TILE_PIXELS, x * TILE_PIXELS : (x + 1) * TILE_PIXELS] = cell
    return image


__all__ = ["FACING", "OBJECT_COLORS", "TILE_PIXELS", "render_level", "tile", "top_kinds", "word_text"]
