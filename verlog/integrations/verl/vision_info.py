"""The images of a verl run as verl's own agent loops hand them to the processor.

verl's agent loops do not give a message's image to the processor as it is: they first pass it
through ``qwen_vl_utils.process_vision_info`` (``RLHFDataset.process_vision_info``), which

* makes it RGB, an RGBA image composited onto white by its alpha (a plain ``convert("RGB")``
  would keep the colour of transparent pixels), and
* resizes it (PIL's default resampling, bicubic) to the nearest size whose sides are multiples of
  ``2 * patch_size`` (the processor's ``image_processor.patch_size``, 14 when it has none) holding
  between 4 and 16384 such squares, keeping the aspect ratio (at most 200:1).

The processor then resizes the result again by its own rule. Where the processor's bounds differ
from those (Qwen3-VL's, say), or its resampling is not PIL's, a picture handed over as it is
would get other pixels, and another number of image tokens, than verl's own agent loops give
it. :func:`vision_info_image` makes an image's bytes what ``process_vision_info`` makes of them
(a PNG, lossless, so the same pixels come back wherever verlog opens the turn's images), and
verlog's agent loop renders every prompt from those: the server, the turn's sample and verl's
worker all see the pixels verl's own loops would.
"""

from __future__ import annotations

import io
import math
from typing import Any

__all__ = ["MAX_ASPECT_RATIO", "image_patch_size", "vision_info_image", "vision_info_size"]

#: squares of ``2 * patch_size`` a resized image holds at least and at most
MIN_SQUARES, MAX_SQUARES = 4, 16384
#: the widest aspect ratio (long side / short side) process_vision_info takes
MAX_ASPECT_RATIO = 200
#: patches a side of one image token spans (a 2 x 2 merge of patches)
SPATIAL_MERGE = 2


def image_patch_size(processor: Any) -> int:
    """The patch size verl's agent loop passes to ``process_vision_info`` for ``processor``."""
    return int(getattr(getattr(processor, "image_processor", None), "patch_size", None) or 14)


def vision_info_size(height: int, width: int, patch_size: int) -> tuple[int, int]:
    """The ``(height, width)`` an image of this size is resized to (see the module docstring)."""
    factor = patch_size * SPATIAL_MERGE
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(
            f"an image of {width}x{height} pixels is wider than {MAX_ASPECT_RATIO}:1, which verl's agent loops "
            "(process_vision_info) refuse"
        )
    low, high = MIN_SQUARES * factor**2, MAX_SQUARES * factor**2
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > high:
        scale = math.sqrt(height * width / high)
        h, w = math.floor(height / scale / factor) * factor, math.floor(width / scale / factor) * factor
    elif h * w < low:
        scale = math.sqrt(low / (height * width))
        h, w = math.ceil(height * scale / factor) * factor, math.ceil(width * scale / factor) * factor
    return h, w


def vision_info_image(data: bytes, patch_size: int) -> bytes:
    """An encoded image as ``process_vision_info`` hands it to the processor, as PNG bytes (the
    same bytes when it changes nothing: an RGB PNG already of its size)."""
    from PIL import Image

    from verlog.llm.images import open_images

    [rgb] = open_images([data])  # refuses what does not open, in words
    image = Image.open(io.BytesIO(data))
    if image.mode == "RGBA":
        rgb = Image.new("RGB", image.size, (255, 255, 255))
        rgb.paste(image, mask=image.split()[3])
    height, width = vision_info_size(rgb.height, rgb.width, patch_size)
    if (height, width) == (rgb.height, rgb.width) and image.format == "PNG" and image.mode == "RGB":
        return data
    if (height, width) != (rgb.height, rgb.width):
        rgb = rgb.resize((width, height), Image.Resampling.BICUBIC)
    out = io.BytesIO()
    rgb.save(out, format="PNG")
    return out.getvalue()
