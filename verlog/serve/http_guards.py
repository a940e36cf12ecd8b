"""What every request to ``verlog serve-model`` meets before the model sees it.

Every failure becomes OpenAI's error JSON (:func:`error_middleware`, which also counts the answers
by status); headers too many or too large are refused first (:func:`header_bounds_middleware`,
431, and :func:`header_bounds_handler` for those aiohttp's HTTP parser refuses itself, before
any middleware runs: 431 too); keys are checked in constant time (:func:`check_api_key` 401, :func:`check_key` 401/403 for
the endpoints that change rewards or weights); a body is read as JSON only, as is or compressed,
within the size limit and in time (:func:`read_body`: 415, 413, 400, 408).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from typing import Any, Awaitable, Callable

from aiohttp import web, web_protocol
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong

from verlog.serve import openai_protocol as proto
from verlog.serve.limits import ServerLimits
from verlog.serve.openai_protocol import APIError

__all__ = [
    "BODY_ENCODINGS",
    "bearer",
    "check_api_key",
    "check_key",
    "error_middleware",
    "header_bounds_handler",
    "header_bounds_middleware",
    "read_body",
]

log = logging.getLogger(__name__)

#: the Content-Encodings a request body may have (aiohttp decodes them; the size limit holds
#: for the decoded body)
BODY_ENCODINGS = frozenset({"identity", "gzip", "deflate"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_middleware(limits: ServerLimits, responses: dict[int, int]) -> Any:
    """A middleware that turns every failure into OpenAI's error JSON (nothing stops the server)
    and counts the answers by HTTP status in ``responses``."""

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except APIError as exc:
            response = web.json_response(exc.body(), status=exc.status, headers=exc.headers)
            if exc.close:  # the rest of the body may never come, or cannot be read: answer, then hang up
                response.force_close()
                await response.prepare(request)
                await response.write_eof()
                if request.transport is not None:
                    request.transport.close()
        except web.HTTPRequestEntityTooLarge:
            response = web.json_response(
                proto.error_body(
                    f"the request body exceeds this server's limit of {limits.max_body_bytes} bytes",
                    type="invalid_request_error",
                    code="request_too_large",
                ),
                status=413,
            )
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
            message = f"{request.method} {request.path}: {exc.reason}"
            if exc.status == 404:
                message += " (served: POST /v1/chat/completions, GET /v1/models, GET /health, POST /v1/feedback)"
            response = web.json_response(proto.error_body(message, type=kind), status=exc.status)
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:  # a bug or an engine failure: report it, keep serving
            log.exception("request %s %s failed", request.method, request.path)
            response = web.json_response(
                proto.error_body(f"internal server error: {type(exc).__name__}: {exc}", type="server_error"),
                status=500,
            )
        responses[response.status] = responses.get(response.status, 0) + 1
        return response

    return errors


def header_bounds_middleware(limits: ServerLimits) -> Any:
    """A middleware answering 431 for a request whose headers are too many or too large (before
    anything else is done with it)."""

    @web.middleware
    async def header_bounds(request: web.Request, handler: Handler) -> web.StreamResponse:
        count = len(request.raw_headers)
        size = sum(len(name) + len(value) + 4 for name, value in request.raw_headers)
        if count > limits.max_headers or size > limits.max_header_bytes:
            raise APIError(
                431,
                f"the request's headers ({count} fields, {size} bytes) exceed {header_limits_text(limits)}",
                code="request_header_fields_too_large",
                close=True,
            )
        return await handler(request)

    return header_bounds


def header_limits_text(limits: ServerLimits) -> str:
    """The header bounds as a 431's message names them."""
    return f"this server's limits ({limits.max_headers} fields, {limits.max_header_bytes} bytes)"


def parser_bounds(limits: ServerLimits) -> dict[str, int]:
    """aiohttp's HTTP parser's own bounds (``handler_args``) for ``limits``: a header line over the
    headers' byte bound, or four times as many fields as allowed, is refused while parsing, before
    the request is held whole (:func:`header_bounds_handler` answers those with a 431)."""
    return {"max_field_size": limits.max_header_bytes, "max_headers": 4 * limits.max_headers}


def header_bounds_handler(limits: ServerLimits) -> type[web_protocol.RequestHandler]:
    """aiohttp's connection handler, answering 431 (not the parser's 400) to a request its parser
    refused for its headers: a header line over ``parser_bounds``' field size, or too many
    fields. Every other refusal is answered as aiohttp answers it."""
    field_bound = parser_bounds(limits)["max_field_size"]

    class HeaderBoundsHandler(web_protocol.RequestHandler):
        __slots__ = ()

        def handle_error(
            self,
            request: Any,
            status: int = 500,
            exc: BaseException | None = None,
            message: str | None = None,
        ) -> web.StreamResponse:
            too_long = isinstance(exc, LineTooLong) and exc.args[1:2] == (field_bound,)
            too_many = isinstance(exc, BadHttpMessage) and "too many headers" in str(exc.message).lower()
            if status != 400 or not (too_long or too_many):
                return super().handle_error(request, status, exc, message)
            what = "a header field is longer than" if too_long else "the request has more header fields than"
            response = web.json_response(
                proto.error_body(
                    f"{what} {header_limits_text(limits)} allow",
                    type="invalid_request_error",
                    code="request_header_fields_too_large",
                ),
                status=431,
            )
            response.force_close()
            return response

    return HeaderBoundsHandler


def bearer(request: web.Request) -> str:
    """The token of the request's ``Authorization: Bearer <token>`` header (``""`` without one)."""
    given = request.headers.get("Authorization", "")
    return given[7:].strip() if given[:7].lower() == "bearer " else ""


def check_api_key(request: web.Request, api_key: str | None) -> None:
    """401 unless the request bears ``api_key`` (every request passes when it is ``None``)."""
    if api_key is None:
        return
    token = bearer(request)
    if not token or not hmac.compare_digest(token.encode(), api_key.encode()):
        raise APIError(401, "Incorrect or missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")


def check_key(request: web.Request, keys: tuple[str, ...], endpoint: str, holders: str) -> None:
    """An endpoint that changes rewards or weights: closed (403) without a key for it, else
    only for a request bearing one of ``keys`` (401)."""
    if not keys:
        raise APIError(
            403,
            f"{endpoint} is closed: this server has no key for it (start it with --admin-key "
            "or --api-key, or $VERLOG_ADMIN_KEY / $VERLOG_API_KEY)",
            type="permission_error",
            code="endpoint_closed",
        )
    token = bearer(request).encode()
    if not token or not any(hmac.compare_digest(token, k.encode()) for k in keys):
        raise APIError(
            401,
            f"Incorrect or missing key for {endpoint}: send 'Authorization: Bearer <{holders}>'",
            code="invalid_api_key",
        )


async def read_body(request: web.Request, limits: ServerLimits) -> bytes:
    """The raw body: JSON only (415), as is or gzip/deflate-compressed (415 for other
    encodings, 400 when it does not decode), within the size limit once decoded (413), sent in
    time (408)."""
    if (
        request.headers.get("Content-Type") is not None
        and request.content_type != "application/json"
        and not request.content_type.endswith("+json")
    ):
        raise APIError(
            415,
            f"unsupported Content-Type '{request.content_type}': send the request as JSON "
            "with 'Content-Type: application/json'",
            code="unsupported_media_type",
        )
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in BODY_ENCODINGS:
        raise APIError(
            415,
            f"unsupported Content-Encoding '{encoding[:40]}': send the body as is or with "
            f"{', '.join(sorted(BODY_ENCODINGS - {'identity'}))}",
            code="unsupported_media_type",
            close=True,
        )
    length = request.content_length
    if length is not None and length > limits.max_body_bytes:
        raise web.HTTPRequestEntityTooLarge(max_size=limits.max_body_bytes, actual_size=length)
    try:
        return await asyncio.wait_for(request.read(), limits.read_timeout_s)
    except asyncio.TimeoutError:
        raise APIError(
            408,
            f"the request body did not arrive within {limits.read_timeout_s} s (--read-timeout-s)",
            code="request_timeout",
            close=True,
        ) from None
    except web_protocol.RequestPayloadError as exc:  # a body its Content-Encoding does not decode
        encoding = request.headers.get("Content-Encoding", "")
        raise APIError(
            400,
            f"the request body cannot be decoded as its Content-Encoding "
            f"'{encoding[:40]}' says: {str(exc).strip().splitlines()[-1].strip()[:200]}",
            code="bad_content_encoding",
            close=True,
        ) from None
