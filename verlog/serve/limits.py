"""What one request to ``verlog serve-model`` may ask for, and how many are served at once
(:class:`ServerLimits`; ``serve-model``'s ``--max-*`` options set them)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ServerLimits"]


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask for, and how many are served at once.

    Args:
        max_body_bytes: largest request body (413 above it).
        max_prompt_tokens: longest rendered prompt (400 ``context_length_exceeded`` above it);
            ``None``: the engine's context length minus one.
        max_tokens_cap: largest ``max_tokens`` a request may ask (400 above it).
        default_max_tokens: the response budget when a request sets none.
        max_concurrency: requests generating at once (the engine batches them together).
        max_queue: requests allowed to wait (for their prompt to be rendered, for a generation
            slot) beyond those generating; more get 429 with ``Retry-After``.
        large_body_bytes: bodies larger than this are prepared on a lane of their own (one worker
            thread), so that they cannot hold up the small requests' workers.
        max_large_queue: large bodies admitted at once (included in ``max_queue``); more large
            bodies get 429 while small requests are still served.
        request_timeout_s: a generation still running after this long is stopped (504).
        max_messages: most messages in one request (400 above it, checked before rendering).
        read_timeout_s: a connection must send a request's headers within this long of opening
            (or of its previous answer: idle keep-alive connections are closed then too), and
            the body within this long of the headers (408, connection closed).
        max_header_bytes: the most bytes a request's headers may take, names and values (431
            above it).
        max_headers: the most header fields a request may have (431 above it). The HTTP parser
            itself refuses (431 too) a header line over ``max_header_bytes`` or over 4x this many fields
            before the request reaches the server.
    """

    max_body_bytes: int = 1 << 20
    max_prompt_tokens: int | None = None
    max_tokens_cap: int = 2048
    default_max_tokens: int = 256
    max_concurrency: int = 64
    max_queue: int = 256
    request_timeout_s: float | None = 600.0
    max_messages: int = 2048
    read_timeout_s: float = 15.0
    large_body_bytes: int = 64 << 10
    max_large_queue: int = 8
    max_header_bytes: int = 32 << 10
    max_headers: int = 100

    def __post_init__(self) -> None:
        for name in (
            "max_body_bytes",
            "max_tokens_cap",
            "default_max_tokens",
            "max_concurrency",
            "max_messages",
            "large_body_bytes",
            "max_large_queue",
            "max_header_bytes",
            "max_headers",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"ServerLimits.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_queue < 0:
            raise ValueError(f"ServerLimits.max_queue must be >= 0, got {self.max_queue}")
        if not self.read_timeout_s > 0:
            raise ValueError(f"ServerLimits.read_timeout_s must be > 0, got {self.read_timeout_s}")
        if self.default_max_tokens > self.max_tokens_cap:
            raise ValueError(
                f"ServerLimits.default_max_tokens ({self.default_max_tokens}) exceeds max_tokens_cap "
                f"({self.max_tokens_cap})"
            )
