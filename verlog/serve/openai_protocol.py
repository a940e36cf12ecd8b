"""The OpenAI chat-completions wire format: request validation, messages, response bodies.

Requests are checked field by field (pydantic, unknown fields refused as OpenAI does) and every
refusal is an :class:`APIError` that the server answers in OpenAI's error JSON::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "messages[0].role", "code": null}}

A parameter that this server cannot honour (``n > 1``, penalties, ``logit_bias``,
``top_logprobs``) is refused with a 400 naming it rather than silently ignored. ``response_format``
``json_schema`` / ``json_object`` is enforced by the engine's token mask (400 on an engine that
cannot enforce it).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from pydantic import BaseModel, ConfigDict, Field, ValidationError


class APIError(Exception):
    """A request the server refuses, answered with ``status`` and OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def error_body(message: str, *, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error JSON."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# ------------------------------------------------------------------------------- request schema
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionCall(_Strict):
    name: str = Field(min_length=1)
    arguments: str


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None


class FunctionDef(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(_Strict):
    type: Literal["function"]
    function: FunctionDef


class StreamOptions(_Strict):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class ChatCompletionRequest(_Strict):
    """``POST /v1/chat/completions``: OpenAI's fields, plus ``top_k`` (as vLLM and SGLang)."""

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(default=None, ge=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None


_TYPE_LABELS = frozenset({"str", "int", "float", "bool", "none", "dict", "list"})


def _loc(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as a field path, e.g. ``messages[0].content``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _TYPE_LABELS or any(c in part for c in "[]'-,"):
            continue  # pydantic's union-branch labels are not part of the field path
        else:
            out += f".{part}" if out else str(part)
    return out


def parse_request(body: Any) -> ChatCompletionRequest:
    """Validate a decoded JSON body; raise :class:`APIError` (400) naming the first bad field."""
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = _loc(first["loc"])
        if first["type"] == "extra_forbidden":
            raise APIError(400, f"Unrecognized request argument supplied: {param}", param=param) from None
        if first["type"] == "missing":
            raise APIError(400, f"Missing required parameter: '{param}'.", param=param) from None
        raise APIError(400, f"Invalid value for '{param}': {first['msg']} (got {first.get('input')!r:.200})",
                       param=param) from None
    _refuse_unsupported(request)
    return request


def _refuse_unsupported(r: ChatCompletionRequest) -> None:
    def refuse(param: str, why: str) -> None:
        raise APIError(400, f"'{param}' {why} is not supported by this server", param=param, code="unsupported_parameter")

    if r.n not in (None, 1):
        refuse("n", f"= {r.n} (only 1 choice per request)")
    if r.presence_penalty:
        refuse("presence_penalty", f"= {r.presence_penalty}")
    if r.frequency_penalty:
        refuse("frequency_penalty", f"= {r.frequency_penalty}")
    if r.logit_bias:
        refuse("logit_bias", "(non-empty)")
    if r.top_logprobs:
        refuse("top_logprobs", f"= {r.top_logprobs} (the chosen token's logprob is returned with logprobs=true)")
    if r.top_k is not None and (r.top_k == 0 or r.top_k < -1):
        raise APIError(400, f"Invalid value for 'top_k': must be -1 (off) or >= 1, got {r.top_k}", param="top_k")
    if r.tool_choice is not None and r.tool_choice != "none" and not r.tools:
        raise APIError(400, "'tool_choice' is only allowed when 'tools' are specified", param="tool_choice")
    stops = [r.stop] if isinstance(r.stop, str) else (r.stop or [])
    if len(stops) > 4 or any(not s for s in stops):
        raise APIError(400, "'stop' takes up to 4 non-empty strings", param="stop")


# ------------------------------------------------------------------------------- messages
def message_text(content: str | list[dict[str, Any]] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for i, part in enumerate(content):
        kind = part.get("type")
        if kind != "text" or not isinstance(part.get("text"), str):
            raise APIError(400, f"{where}.content[{i}]: only text parts are supported (got type {kind!r})",
                           param=f"{where}.content[{i}].type")
        parts.append(part["text"])
    return "".join(parts)


def to_langchain_messages(request: ChatCompletionRequest) -> list[BaseMessage]:
    """The request's messages as the LangChain messages verlog's chat model renders."""
    out: list[BaseMessage] = []
    for i, m in enumerate(request.messages):
        where = f"messages[{i}]"
        text = message_text(m.content, where)
        if m.role in ("system", "developer"):
            out.append(SystemMessage(text))
        elif m.role == "user":
            if m.content is None:
                raise APIError(400, f"{where}: a user message needs 'content'", param=f"{where}.content")
            out.append(HumanMessage(text))
        elif m.role == "assistant":
            calls = []
            for j, call in enumerate(m.tool_calls or []):
                try:
                    args = json.loads(call.function.arguments or "{}")
                except json.JSONDecodeError as exc:
                    args = None
                    error = f"is not JSON ({exc})"
                else:
                    error = None if isinstance(args, dict) else "is not a JSON object"
                if error:
                    param = f"{where}.tool_calls[{j}].function.arguments"
                    raise APIError(400, f"{param} {error}", param=param)
                calls.append({"name": call.function.name, "args": args, "id": call.id, "type": "tool_call"})
            out.append(AIMessage(text, tool_calls=calls))
        else:  # tool
            if not m.tool_call_id:
                raise APIError(400, f"{where}: a tool message needs 'tool_call_id'", param=f"{where}.tool_call_id")
            out.append(ToolMessage(text, tool_call_id=m.tool_call_id, name=m.name))
    return out


# ------------------------------------------------------------------------------- responses
def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def openai_tool_calls(message: AIMessage) -> list[dict[str, Any]]:
    """The message's tool calls in OpenAI's format (arguments as a JSON string)."""
    return [
        {
            "id": call["id"],
            "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call["args"], ensure_ascii=False)},
        }
        for call in message.tool_calls
    ]


def visible_content(message: AIMessage) -> str:
    """The message's text as a client sees it: malformed ``<tool_call>`` blocks, which have no
    OpenAI form, are given back as text so the client sees what the model wrote."""
    content = message.content if isinstance(message.content, str) else ""
    bad = [f"<tool_call>\n{c.get('args') or ''}\n</tool_call>" for c in message.invalid_tool_calls]
    return "\n".join([content, *bad]) if content and bad else (content or "\n".join(bad))


def finish_reason(message: AIMessage, engine_reason: str) -> str:
    if message.tool_calls:
        return "tool_calls"
    return "length" if engine_reason == "length" else "stop"


def token_logprobs(tokenizer: Any, ids: list[int], logprobs: list[float]) -> list[dict[str, Any]]:
    """OpenAI's ``logprobs.content`` entries for generated tokens (no alternatives)."""
    out = []
    for tid, lp in zip(ids, logprobs):
        text = tokenizer.decode([tid], skip_special_tokens=False)
        out.append({"token": text, "logprob": lp, "bytes": list(text.encode("utf-8")), "top_logprobs": []})
    return out


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chunk(cid: str, created: int, model: str, delta: dict[str, Any], *, finish: str | None = None,
          logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One ``chat.completion.chunk`` with a single choice."""
    return {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "delta": delta,
            "logprobs": None if logprobs is None else {"content": logprobs},
            "finish_reason": finish,
        }],
    }


def now() -> int:
    return int(time.time())
