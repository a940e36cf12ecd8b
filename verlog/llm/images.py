"""Images in chat messages: reading them from content blocks, and what a turn keeps of them.

A message's content may hold images in any of the shapes LangChain graphs write them:

* OpenAI's ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`` (the
  ``image_url`` may also be the URL string itself);
* LangChain's standard block ``{"type": "image", "base64": "...", "mime_type": "image/png"}``
  (and its older ``{"type": "image", "source_type": "base64", "data": "..."}``);
* Anthropic's ``{"type": "image", "source": {"type": "base64", "media_type": ..., "data": ...}}``.

Each becomes the encoded file's bytes (:func:`block_image`). A block that names its type (a data
URL's mime type, ``mime_type``, Anthropic's ``media_type``) must name a raster format PIL reads
(:func:`check_image_type`): ``text/plain`` holding PNG bytes is refused, and an SVG (a vector
drawing no image processor reads) is refused in words, also when its bytes come unnamed.
A turn keeps those bytes (base64,
:func:`image_key` names them), never decoded pixels: the model's own image processor turns the
same bytes into the same pixels wherever they are needed again (:func:`open_images`).
Images given by an ``http(s)`` URL are refused: verlog fetches nothing while it runs.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from typing import Any, Sequence

__all__ = ["IMAGE_BLOCK_TYPES", "block_image", "check_image_type", "image_key", "is_image_block", "open_images"]

#: content-block types that carry an image
IMAGE_BLOCK_TYPES = ("image_url", "image")

#: the mime type of SVG, a vector drawing: no image processor reads it
SVG_TYPE = "image/svg+xml"


def _svg_refusal(named: str) -> ValueError:
    return ValueError(
        f"{named} is a vector drawing (SVG): a vision model's processor reads raster images only; "
        "rasterize it first (e.g. save it as PNG: data:image/png;base64,...)"
    )


def check_image_type(mime: str) -> None:
    """``ValueError`` unless ``mime`` (a data URL's or a block's declared type) names a raster
    image format PIL reads (``image/png``, ``image/jpeg``, ``image/webp``, ``image/gif``, ...)."""
    from PIL import Image

    Image.init()  # registers every format plugin's mime type
    readable = {m for m in Image.MIME.values() if m.startswith("image/")} | {"image/jpg"}
    kind = mime.split(";")[0].strip().lower()
    if kind == SVG_TYPE:
        raise _svg_refusal(f"an image of type {mime!r}")
    if kind not in readable:
        raise ValueError(
            f"{mime!r} is not an image format a vision model's processor reads: give an image's type as "
            "image/png, image/jpeg, image/webp or image/gif (data:image/png;base64,...)"
        )


def is_image_block(block: Any) -> bool:
    """Whether a content block is an image (any of the shapes in the module doc)."""
    return isinstance(block, dict) and block.get("type") in IMAGE_BLOCK_TYPES


def _data_url(url: str) -> bytes:
    if not url.startswith("data:"):
        raise ValueError(
            f"an image given by URL ({url[:60]!r}) is not fetched: give it as a data URL "
            "(data:image/png;base64,...) or a base64 image block"
        )
    head, _, payload = url.partition(",")
    mime, *params = head[len("data:") :].split(";")
    if "base64" not in (p.strip().lower() for p in params):
        raise ValueError(f"an image data URL must be base64-encoded (data:<mime>;base64,...), got {head!r}")
    check_image_type(mime)
    return _decode(payload)


def _decode(payload: str) -> bytes:
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"an image's base64 data does not decode ({exc})") from None


def block_image(block: dict[str, Any]) -> bytes:
    """The encoded image file (PNG, JPEG, ...) an image content block carries; ``ValueError``
    naming what is wrong for a block without one."""
    if block.get("type") == "image_url":
        url = block.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        if not isinstance(url, str):
            raise ValueError(f"an image_url block needs image_url.url (a data URL), got {block.get('image_url')!r}")
        return _data_url(url)
    source = block.get("source")
    if isinstance(source, dict):  # Anthropic's shape
        if source.get("type") != "base64" or not isinstance(source.get("data"), str):
            raise ValueError(f"an image block's source must be base64 data, got source type {source.get('type')!r}")
        if isinstance(source.get("media_type"), str):
            check_image_type(source["media_type"])
        return _decode(source["data"])
    if isinstance(block.get("mime_type"), str):  # LangChain's standard block
        check_image_type(block["mime_type"])
    for key in ("base64", "data"):
        if isinstance(block.get(key), str):
            return _decode(block[key])
    if isinstance(block.get("url"), str):
        return _data_url(block["url"])
    raise ValueError(f"an image block without image data (base64, data or a data URL): keys {sorted(block)}")


def image_key(data: bytes) -> str:
    """A short content hash naming an image (the same bytes, the same key)."""
    return hashlib.sha256(data).hexdigest()[:16]


def open_images(images: Sequence[bytes]) -> list[Any]:
    """The images as RGB ``PIL.Image`` objects (what image processors take), in order."""
    from PIL import Image

    out = []
    for data in images:
        try:
            image = Image.open(io.BytesIO(data))
            image.load()
        except Image.UnidentifiedImageError:  # its message names the buffer's memory address
            if b"<svg" in data[:1024]:
                raise _svg_refusal("an image") from None
            raise ValueError(
                "an image does not open: its bytes are in no image format PIL reads (PNG, JPEG, WebP, GIF, ...)"
            ) from None
        except Exception as exc:  # a truncated or corrupt file
            raise ValueError(f"an image does not open ({type(exc).__name__}: {exc})") from None
        out.append(image.convert("RGB"))
    return out
