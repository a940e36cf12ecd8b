"""NetHack's map drawn in tiles, as BALROG's vision protocol shows NetHack and MiniHack.

BALROG's NLE wrapper draws an observation's image with ``render("tiles")``
(``balrog/environments/nle/render_rgb.py``): every glyph of the 21x79 map becomes its 16x16 tile
of NetHack's tile set, by NetHack's glyph-to-tile table, laid out as the map is (336x1264
pixels). BALROG ships that table and the tile atlas (``tiles.pkl``); both are MiniHack's own
(``minihack/tiles``: the same table, the same file byte for byte), which verlog reads from the
installed ``minihack`` package.
"""

from __future__ import annotations

import pickle
from functools import lru_cache
from pathlib import Path

import numpy as np

#: pixels of a tile's side
TILE_SIZE = 16


@lru_cache(maxsize=1)
def tile_atlas() -> tuple[np.ndarray, np.ndarray]:
    """``(glyph -> tile index, tiles)``: NetHack's glyph-to-tile table and its tiles, an
    ``(n, 16, 16, 3)`` array of RGB pixels, from the installed ``minihack``."""
    import minihack.tiles as minihack_tiles

    with open(Path(minihack_tiles.__file__).parent / "tiles.pkl", "rb") as f:
        tiles = pickle.load(f)
    atlas = np.stack([tiles[i] for i in range(len(tiles))])
    return np.asarray(minihack_tiles.glyph2tile), atlas


def render_tiles(glyphs: np.ndarray) -> np.ndarray:
    """The ``(rows * 16, columns * 16, 3)`` image of a map of glyphs, each as its tile."""
    glyph2tile, atlas = tile_atlas()
    rows, columns = glyphs.shape
    tiles = glyph2tile[glyphs]
    size_y, size_x = atlas.shape[1:3]
    return atlas[tiles].transpose(0, 2, 1, 3, 4).reshape(rows * size_y, columns * size_x, 3)
