"""The OpenAI chat-completions wire format: request validation, messages, response bodies.

Requests are checked field by field (pydantic, unknown fields refused as OpenAI does) and every
refusal is an :class:`APIError` that the server answers in OpenAI's error JSON::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "messages[0].role", "code": null}}

A parameter that this server cannot honour (``n > 1``, penalties, ``logit_bias``,
``top_logprobs``) is refused with a 400 naming it rather than silently ignored. ``response_format``
``json_schema`` / ``json_object`` and ``regex`` (SGLang's field: the whole answer matches it; an
OpenAI client sends it in ``extra_body``) are enforced by the engine's token mask (400 on an
engine that cannot enforce them).

Before any of that, :func:`decode_body` turns the raw body into JSON with bounds that make a
hostile body cheap to refuse: no ``NaN``/``Infinity``, nesting at most :data:`MAX_JSON_DEPTH`
levels (the path of the first too-deep value is named), at most ``max_messages`` messages.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from verlog.backends.token_bytes import TokenBytes
from verlog.llm.images import block_image
from verlog.traces.records import check_reward


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
        headers: dict[str, str] | None = None,
        close: bool = False,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        #: extra response headers (``Retry-After`` on 429)
        self.headers = dict(headers or {})
        #: whether the connection is closed after the answer (the body was not, or cannot be, read whole)
        self.close = close

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def error_body(message: str, *, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error JSON."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# ------------------------------------------------------------------------------- request schema
#: the deepest JSON nesting a request may have (OpenAI's own bodies need well under 20 levels;
#: tool and response schemas get the rest)
MAX_JSON_DEPTH = 64
#: the most tools one request may offer (OpenAI's own limit)
MAX_TOOLS = 128
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class _Strict(BaseModel):
    # strict: JSON types as OpenAI documents them ("max_tokens": "10" or "stream": "yes" are refused)
    model_config = ConfigDict(extra="forbid", strict=True)


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


class NamedFunction(_Strict):
    name: str = Field(min_length=1)


class NamedToolChoice(_Strict):
    """``tool_choice`` forcing one tool: ``{"type": "function", "function": {"name": ...}}``."""

    type: Literal["function"]
    function: NamedFunction


class StreamOptions(_Strict):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class ChatCompletionRequest(_Strict):
    """``POST /v1/chat/completions``: OpenAI's fields, plus ``top_k`` (as vLLM and SGLang) and
    SGLang's ``regex``."""

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1, le=(1 << 31) - 1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=_INT64_MIN, le=_INT64_MAX)  # a signed 64-bit seed
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(default=None, ge=1)
    tools: list[ToolDef] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    regex: str | None = Field(default=None, min_length=1)  # SGLang's: the answer matches this regular expression
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None


_TYPE_LABELS = frozenset({"str", "int", "float", "bool", "none", "dict", "list", "NamedToolChoice"})


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


def decode_body(raw: bytes, *, max_messages: int | None = None) -> Any:
    """The JSON of a request body, refused (400) when it is not JSON, uses ``NaN``/``Infinity``,
    nests deeper than :data:`MAX_JSON_DEPTH` levels or holds more than ``max_messages`` messages.

    These checks come before field validation and prompt rendering, whose cost grows with them."""

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    try:
        body = json.loads(raw, parse_constant=no_constant)
    except RecursionError:
        raise APIError(400, f"the request body nests deeper than {MAX_JSON_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}") from None
    if max_messages is not None and isinstance(body, dict):
        messages = body.get("messages")
        if isinstance(messages, list) and len(messages) > max_messages:
            raise APIError(
                400,
                f"'messages' has {len(messages)} messages; this server accepts at most {max_messages} per request",
                param="messages",
                code="too_many_messages",
            )
    too_deep = _too_deep(body, MAX_JSON_DEPTH)
    if too_deep is not None:
        raise APIError(
            400,
            f"'{too_deep or 'the request body'}' nests deeper than {MAX_JSON_DEPTH} levels of JSON arrays/objects",
            param=too_deep or None,
        )
    return body


def _too_deep(value: Any, limit: int) -> str | None:
    """The path of the first array/object nested more than ``limit`` levels deep in ``value``
    (``""``: the body itself), or ``None``. Iterative: a deep value cannot exhaust the stack."""
    stack: list[tuple[Any, int, str]] = [(value, 1, "")]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, dict):
            items: Any = ((f"{path}.{k}" if path else str(k), v) for k, v in node.items())
        elif isinstance(node, list):
            items = ((f"{path}[{i}]", v) for i, v in enumerate(node))
        else:
            continue
        if depth > limit:
            return path
        stack.extend((v, depth + 1, p) for p, v in items if isinstance(v, (dict, list)))
    return None


def parse_request(body: Any) -> ChatCompletionRequest:
    """Validate a decoded JSON body; raise :class:`APIError` (400) naming the first bad field."""
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = _loc(first["loc"])
        _refuse_field(first, param)
        if param.startswith("tool_choice"):
            raise APIError(
                400,
                f"Invalid value for 'tool_choice': expected 'none', 'auto', 'required' or "
                f"{{'type': 'function', 'function': {{'name': ...}}}} (got {body.get('tool_choice')!r:.200})",
                param="tool_choice",
            ) from None
        raise APIError(
            400, f"Invalid value for '{param}': {first['msg']} (got {first.get('input')!r:.200})", param=param
        ) from None
    _refuse_unsupported(request)
    for i, tool in enumerate(request.tools or ()):
        _check_schema(tool.function.parameters, f"tools[{i}].function.parameters")
    if request.response_format is not None and isinstance(request.response_format.json_schema, dict):
        _check_schema(request.response_format.json_schema.get("schema"), "response_format.json_schema.schema")
    return request


def _refuse_field(error: Any, param: str) -> None:
    """An unknown or a missing field as OpenAI words it (400)."""
    if error["type"] == "extra_forbidden":
        raise APIError(400, f"Unrecognized request argument supplied: {param}", param=param) from None
    if error["type"] == "missing":
        raise APIError(400, f"Missing required parameter: '{param}'.", param=param) from None


class FeedbackRequest(_Strict):
    """``POST /v1/feedback``: a reward (and success, info) for an episode, or for one of its turns."""

    episode_id: str = Field(min_length=1, max_length=256, pattern=r"^[^\x00]*$")
    #: finite, within ``±REWARD_MAX_ABS`` (checked by :func:`parse_feedback` before this model sees it);
    #: required there: feedback without one would be trained as a reward of 0
    reward: float | None = None
    success: bool | None = None
    info: dict[str, Any] | None = None
    #: the turn (0-based, in the episode's order) the reward is for; absent: the whole episode
    turn: int | None = Field(None, ge=0, lt=2**31)


def parse_feedback(body: Any) -> FeedbackRequest:
    """Validate a feedback body; raise :class:`APIError` (400) naming the first bad field."""
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    if body.get("reward") is not None:
        try:  # finite and bounded; an integer of any size is compared, never converted first
            body = {**body, "reward": check_reward(body["reward"])}
        except ValueError as exc:
            raise APIError(400, f"Invalid value for 'reward': {exc}", param="reward") from None
    try:
        feedback = FeedbackRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = _loc(first["loc"]) or "turn"
        _refuse_field(first, param)
        raise APIError(
            400, f"Invalid value for '{param}': {first['msg']} (got {first.get('input')!r:.200})", param=param
        ) from None
    if feedback.reward is None:  # absent or null: nothing to pay, and nothing is stored
        raise APIError(
            400,
            "Missing 'reward': feedback pays a reward on the episode (or on the turn named by 'turn'); without one the "
            "episode would be trained as if it had earned 0",
            param="reward",
        )
    return feedback


#: the most choices a schema may offer at one point of an answer: the keys an object may write
#: next (its optional properties) or the branches of an ``anyOf``/``oneOf`` (counted through nested
#: branches and local ``$ref``s). The constrained decoder (llguidance) stops mid-answer past 2,000
#: parser items at one point, which here is about 500 optional properties or 2,000 branches: a
#: schema over this bound is refused before any token is generated, with a 4x margin.
MAX_SCHEMA_BRANCHES = 256

#: JSON-schema keywords whose value is a schema / a list of schemas / an object of schemas
_SCHEMA_KEYWORDS = (
    "additionalProperties",
    "items",
    "not",
    "contains",
    "propertyNames",
    "if",
    "then",
    "else",
    "unevaluatedProperties",
    "unevaluatedItems",
    "additionalItems",
)
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def _check_schema(schema: Any, where: str) -> None:
    """Refuse (400, naming the place) a JSON schema whose keywords have the wrong JSON types
    (``"properties": 5``, ``"required": "a"``, ...): the chat template and the constrained
    decoder read them. Whether the schema makes sense is left to the constraint compiler."""

    def bad(path: str, what: str) -> APIError:
        return APIError(400, f"Invalid schema at '{path}': {what}", param=where)

    branches = _Branches(schema)
    stack = [(schema, where)]
    while stack:
        node, path = stack.pop()
        if node is None or isinstance(node, bool):
            continue
        if not isinstance(node, dict):
            raise bad(path, f"a schema must be an object or a boolean (got {type(node).__name__})")
        width = branches(node)
        if width > MAX_SCHEMA_BRANCHES:
            raise bad(
                path,
                f"offers {width} choices at one point of the answer (optional properties, anyOf/oneOf "
                f"branches); this server's constrained decoding takes at most {MAX_SCHEMA_BRANCHES}: mark "
                "properties required, or split the schema",
            )
        kind = node.get("type")
        if kind is not None and not (
            isinstance(kind, str) or (isinstance(kind, list) and all(isinstance(k, str) for k in kind))
        ):
            raise bad(f"{path}.type", "must be a string or a list of strings")
        required = node.get("required")
        if required is not None and not (isinstance(required, list) and all(isinstance(r, str) for r in required)):
            raise bad(f"{path}.required", "must be a list of property names")
        if "enum" in node and not isinstance(node["enum"], list):
            raise bad(f"{path}.enum", "must be a list")
        for key in _SCHEMA_KEYWORDS:
            if key in node:
                value = node[key]
                if key == "items" and isinstance(value, list):  # draft-7 tuple form
                    stack.extend((v, f"{path}.items[{i}]") for i, v in enumerate(value))
                else:
                    stack.append((value, f"{path}.{key}"))
        for key in _SCHEMA_LISTS:
            if key in node:
                if not isinstance(node[key], list):
                    raise bad(f"{path}.{key}", "must be a list of schemas")
                stack.extend((v, f"{path}.{key}[{i}]") for i, v in enumerate(node[key]))
        for key in _SCHEMA_MAPS:
            if key in node:
                if not isinstance(node[key], dict):
                    raise bad(f"{path}.{key}", "must be an object of schemas")
                stack.extend((v, f"{path}.{key}.{name}") for name, v in node[key].items())


class _Branches:
    """How many choices a schema offers at one point of an answer (see :data:`MAX_SCHEMA_BRANCHES`):
    an object, its optional properties (plus the next required one); ``anyOf``/``oneOf``, the sum
    of its branches'; ``allOf``, its widest part's; a local ``$ref``, its target's. Memoised per
    node, a reference cycle counting 1: linear in the schema's size."""

    def __init__(self, root: Any):
        self.root = root
        self._known: dict[int, int] = {}
        self._open: set[int] = set()

    def _target(self, ref: str) -> Any:
        node = self.root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
        return node

    def __call__(self, node: Any) -> int:
        if not isinstance(node, dict) or id(node) in self._open:
            return 1
        if id(node) in self._known:
            return self._known[id(node)]
        self._open.add(id(node))
        width = 1
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            width = self(self._target(ref))
        for key in ("anyOf", "oneOf"):
            if isinstance(node.get(key), list):
                width = max(width, sum(self(alt) for alt in node[key]))
        if isinstance(node.get("allOf"), list):
            width = max([width, *(self(part) for part in node["allOf"])])
        if isinstance(node.get("properties"), dict):
            required = node.get("required") if isinstance(node.get("required"), list) else []
            width = max(width, sum(1 for name in node["properties"] if name not in required) + 1)
        self._open.discard(id(node))
        self._known[id(node)] = width
        return width


def _refuse_unsupported(r: ChatCompletionRequest) -> None:
    def refuse(param: str, why: str) -> None:
        raise APIError(
            400, f"'{param}' {why} is not supported by this server", param=param, code="unsupported_parameter"
        )

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
        if kind != "text":
            why = " (this model takes no images)" if kind == "image_url" else ""
            raise APIError(
                400,
                f"{where}.content[{i}]: only text parts are supported{why} (got type {kind!r})",
                param=f"{where}.content[{i}].type",
            )
        if not isinstance(part.get("text"), str):
            raise APIError(
                400,
                f"{where}.content[{i}].text must be a string (got {part.get('text')!r:.100})",
                param=f"{where}.content[{i}].text",
            )
        parts.append(part["text"])
    return "".join(parts)


def _check_unicode(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate, sent as a \ud800 escape
        raise APIError(
            400, f"{where}.content is not valid Unicode: {exc.reason} at position {exc.start}", param=f"{where}.content"
        ) from None


def _without_images(content: str | list[dict[str, Any]] | None) -> str | list[dict[str, Any]] | None:
    return (
        content if isinstance(content, str) or content is None else [p for p in content if p.get("type") != "image_url"]
    )


def _content_parts(content: str | list[dict[str, Any]] | None, where: str) -> str | list[dict[str, Any]]:
    """A message's content for a vision model's chat model: its text, or, with ``image_url``
    parts (base64 data URLs of a raster image type; the model renders them wherever the
    conversation holds them, as in a graph), its parts in order. A part the chat model would
    refuse is a 400 naming it."""
    if content is None or isinstance(content, str) or not any(p.get("type") == "image_url" for p in content):
        return message_text(content, where)
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        if part.get("type") != "image_url":
            parts.append({"type": "text", "text": message_text([part], where)})
            continue
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        param = f"{where}.content[{i}].image_url.url"
        if not isinstance(url, str) or not url.startswith("data:"):
            raise APIError(
                400,
                f"{param} must be a base64 data URL (data:image/png;base64,...): this server fetches no image",
                param=param,
            )
        try:
            block_image({"type": "image_url", "image_url": {"url": url}})
        except ValueError as exc:
            raise APIError(400, f"{param}: {exc}", param=param) from None
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def to_langchain_messages(request: ChatCompletionRequest, *, images: bool = False) -> list[BaseMessage]:
    """The request's messages as the LangChain messages verlog's chat model renders; ``images``:
    the model takes images (a message of any role may hold ``image_url`` parts, as the chat model
    renders them in a graph)."""
    out: list[BaseMessage] = []
    for i, m in enumerate(request.messages):
        where = f"messages[{i}]"
        text = message_text(_without_images(m.content) if images else m.content, where)
        _check_unicode(text, where)
        content = _content_parts(m.content, where) if images else text
        if m.role in ("system", "developer"):
            out.append(SystemMessage(content))
        elif m.role == "user":
            if m.content is None:
                raise APIError(400, f"{where}: a user message needs 'content'", param=f"{where}.content")
            out.append(HumanMessage(content))
        elif m.role == "assistant":
            calls = []
            for j, call in enumerate(m.tool_calls or []):
                try:
                    args = json.loads(call.function.arguments or "{}")
                except json.JSONDecodeError as exc:
                    args = None
                    error = f"is not JSON ({exc})"
                except RecursionError:
                    args, error = None, f"nests deeper than {MAX_JSON_DEPTH} levels"
                else:
                    error = None if isinstance(args, dict) else "is not a JSON object"
                    if error is None and _too_deep(args, MAX_JSON_DEPTH) is not None:
                        error = f"nests deeper than {MAX_JSON_DEPTH} levels"
                if error:
                    param = f"{where}.tool_calls[{j}].function.arguments"
                    raise APIError(400, f"{param} {error}", param=param)
                calls.append({"name": call.function.name, "args": args, "id": call.id, "type": "tool_call"})
            out.append(AIMessage(content, tool_calls=calls))
        else:  # tool
            if not m.tool_call_id:
                raise APIError(400, f"{where}: a tool message needs 'tool_call_id'", param=f"{where}.tool_call_id")
            out.append(ToolMessage(content, tool_call_id=m.tool_call_id, name=m.name))
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


def answer_parts(message: AIMessage, text: str) -> tuple[str, list[dict[str, Any]]]:
    """The ``content`` and OpenAI ``tool_calls`` a client gets for ``message``, whose answer the
    model wrote as ``text``.

    When a ``<tool_call>`` block is malformed (bad JSON, no name, ...) the turn has no faithful
    OpenAI form: the client gets ``text`` verbatim as content and no tool calls (as vLLM's Hermes
    parser does), so it sees exactly what the model wrote."""
    if message.invalid_tool_calls:
        return text, []
    content = message.content if isinstance(message.content, str) else ""
    return content, openai_tool_calls(message)


def finish_reason(has_tool_calls: bool, engine_reason: str) -> str:
    if has_tool_calls:
        return "tool_calls"
    return "length" if engine_reason == "length" else "stop"


def token_logprobs(token_bytes: TokenBytes, ids: list[int], logprobs: list[float]) -> list[dict[str, Any]]:
    """OpenAI's ``logprobs.content`` entries for generated tokens (no alternatives): ``token``
    is the token's decoded text, ``bytes`` its raw bytes (see :class:`TokenBytes`)."""
    out = []
    for tid, lp in zip(ids, logprobs):
        text = token_bytes.tokenizer.decode([tid], skip_special_tokens=False)
        out.append({"token": text, "logprob": lp, "bytes": list(token_bytes(tid)), "top_logprobs": []})
    return out


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chunk(
    cid: str,
    created: int,
    model: str,
    delta: dict[str, Any],
    *,
    finish: str | None = None,
    logprobs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` with a single choice."""
    return {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "delta": delta,
                "logprobs": None if logprobs is None else {"content": logprobs},
                "finish_reason": finish,
            }
        ],
    }


def now() -> int:
    return int(time.time())
