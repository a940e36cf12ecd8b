"""BALROG's vision (VLM) protocol: an image of each observation beside its text, sent as BALROG sends it.

BALROG (github.com/balrog-ai/BALROG) scores vision-language models with the same naive agent as
its text leaderboard and one more setting, ``agent.max_image_history`` (``balrog/config/
config.yaml``: 0, text only; its VLM mode in ``docs/evaluation.md``: 1). With it above 0:

* **Images.** Every game's observation carries an RGB image drawn by the game's own renderer
  (each game's ``observation_image``, see :meth:`verlog.envs.base.TextEnv.observation_image`):
  BabyAI its agent's view, ``get_pov_render(tile_size=16)`` (7x7 cells, 112x112 pixels);
  Crafter ``render()`` at BALROG's ``crafter_kwargs.size`` (256x256); BabaIsAI
  ``render(mode="rgb_array")``, the whole level at 32 pixels a cell; NetHack and MiniHack the
  16x16 tiles of every glyph of the 21x79 map (336x1264, MiniHack's tile atlas, the one BALROG
  ships); TextWorld none.
* **Text.** NetHack and MiniHack switch the NLE language wrapper from its *hybrid* view to its
  *language* view (``vlm = max_image_history > 0`` in ``make_nle_env``/``make_minihack_env``): no
  ASCII map, and the bottom-line statistics shown with the inventory (the families'
  ``BalrogSettings.vision_kwargs``). The other games' text does not change.
* **Which messages carry one** (``balrog/prompt_builder/history.py``). The history window holds the
  last ``2 * max(max_text_history, max_image_history)`` events; of its observations that have an
  image, the newest ``max_image_history`` carry it: their user message gets one line more after
  its text (a short note that an image comes with it) and the image. With ``max_image_history``
  1 that is the current observation alone; the answer rule still comes last in its text.
* **How it is sent** (``balrog/client.py``, its OpenAI client): each message as content parts,
  the text first, then ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``,
  the image saved by PIL as PNG (:func:`png_data_url`). verlog's game graphs put exactly these
  two parts in the LangChain ``HumanMessage`` of an observation with an image
  (:func:`image_content`), which every OpenAI-compatible vision endpoint accepts; a message
  without an image stays a plain string, the same text BALROG sends as its single text part.

The note's wording is BALROG's prose: verlog says it in its own words (:data:`IMAGE_NOTE`) unless
the user's BALROG is given, whose ``history.py`` it is then read from
(:attr:`verlog.envs.balrog_source.BalrogSource.image_note`).
"""

from __future__ import annotations

import base64
import io
from typing import Any

#: ``max_image_history`` of BALROG's text protocol (``config.yaml``): no images
TEXT_ONLY = 0
#: ``max_image_history`` of BALROG's VLM mode (``docs/evaluation.md``): the current observation's image
IMAGE_HISTORY = 1
#: the graph setting (and BALROG's ``agent`` key) that turns the vision protocol on
SETTING = "max_image_history"
#: verlog's words for the line an observation's text gets when its image is attached (BALROG's
#: own line is read from the user's BALROG)
IMAGE_NOTE = "The image of this observation is attached."


def check_image_history(value: Any) -> int:
    """``value`` as a ``max_image_history`` (how many of the newest observations carry their
    image: 0 for the text protocol, BALROG's VLM mode 1), or a ``ValueError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"{SETTING} must be a whole number of images, 0 or more (0: BALROG's text protocol, "
            f"{IMAGE_HISTORY}: its VLM mode), got {value!r}"
        )
    return value


def rgb_image(pixels: Any) -> Any:
    """A PIL RGB image of an ``(height, width, 3)`` array, as BALROG's wrappers make one
    (``Image.fromarray(...).convert("RGB")``)."""
    from PIL import Image

    return Image.fromarray(pixels).convert("RGB")


def png_data_url(image: Any) -> str:
    """The ``data:image/png;base64,...`` URL of a PIL image, encoded as BALROG's OpenAI client
    does (``image.save(buffer, format="PNG")``)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("utf-8")


def image_part(url: str) -> dict[str, Any]:
    """OpenAI's content part for an image given by ``url`` (a data URL)."""
    return {"type": "image_url", "image_url": {"url": url}}


def image_content(text: str, url: str) -> list[dict[str, Any]]:
    """A message's content under BALROG's vision protocol: its text part, then its image part."""
    return [{"type": "text", "text": text}, image_part(url)]


def data_url_of(env: Any) -> str | None:
    """The data URL of ``env``'s current observation image, or ``None`` for a game without one."""
    image = env.observation_image()
    return None if image is None else png_data_url(image)
