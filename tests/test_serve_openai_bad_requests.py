"""`verlog serve-model`'s OpenAI server against bad, hostile and slow clients.

Every malformed request gets a 4xx naming what is wrong (never a 5xx, never a hang); a big
request is refused without stalling ``/health``; a client that sends its headers or body too
slowly is cut off at the read timeout; and after all that the next good request is served the
same as before. Everything runs against the real server on loopback, with the tiny model.
"""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import select
import socket
import time
from typing import Any

import aiohttp
import pytest
from openai_tools import CALCULATE

from verlog.backends.embedded import EmbeddedEngine
from verlog.serve import OpenAIServer, ServerLimits, serve_in_thread
from verlog.serve.commands import main as serve_main
from verlog.serve.openai_protocol import MAX_JSON_DEPTH, TokenBytes
from verlog.testing.scripted_engine import ScriptedEngine

openai = pytest.importorskip("openai")

HI = [{"role": "user", "content": "hi"}]
#: the bytes of U+FFFD, what a token that is part of a character decodes to
REPLACEMENT = list("\ufffd".encode())


@pytest.fixture(scope="module")
def engine(tiny_model, tiny_tokenizer):
    engine = EmbeddedEngine(tiny_model, tiny_tokenizer, seed=0)
    yield engine
    engine.close()


def _big_body(messages: int, width: int, limit: int = 1 << 20) -> bytes:
    """A chat request of ``messages`` user messages of ``width`` characters, trimmed under ``limit`` bytes."""
    message = {"role": "user", "content": "x " * (width // 2)}
    fits = (limit - len(json.dumps({"model": "tiny", "messages": []}))) // (len(json.dumps(message)) + 2)
    raw = json.dumps({"model": "tiny", "messages": [message] * min(messages, fits)}).encode()
    assert len(raw) <= limit
    return raw


#: a bound against a hang (a request never answered), not a speed: how fast /health answers under a flood
#: of large bodies is benchmarks/serve_load.py's figure (P10); a busy machine must not fail a test
HANG_S = 60.0


async def _health_during(
    session: aiohttp.ClientSession, server: OpenAIServer, raw: bytes
) -> tuple[int, dict, list[float]]:
    """POST ``raw`` and poll ``/health`` until it is answered: (status, body, when each /health
    answer arrived, on ``time.perf_counter``'s clock). Every /health answer is checked to be a 200;
    the client's timeout (``HANG_S``) bounds a hang; how fast it answers is P10's figure."""

    async def post() -> tuple[int, dict]:
        async with session.post(
            f"{server.base_url}/chat/completions", data=raw, headers={"Content-Type": "application/json"}
        ) as r:
            return r.status, await r.json()

    task = asyncio.ensure_future(post())
    answered: list[float] = []
    while not task.done() or not answered:
        async with session.get(f"{server.url}/health") as r:
            assert r.status == 200
            await r.read()
        answered.append(time.perf_counter())
        await asyncio.sleep(0.01)
    status, payload = await task
    return status, payload, answered


# ------------------------------------------------------------------------ a big request, /health
async def test_a_1mib_request_is_refused_without_stalling_health(engine, tiny_tokenizer):
    server = OpenAIServer(engine, tiny_tokenizer, model_name="tiny")  # the default limits
    timeout = aiohttp.ClientTimeout(total=HANG_S)
    with serve_in_thread(server):  # its own event loop: this loop only polls
        async with aiohttp.ClientSession(timeout=timeout) as session:
            # ~16k messages in 1 MiB: refused on the message count, before any validation or rendering
            many = _big_body(20_000, 30)
            assert len(many) > 1_000_000
            status, payload, answered = await _health_during(session, server, many)
            assert status == 400, payload
            assert payload["error"]["param"] == "messages" and payload["error"]["code"] == "too_many_messages"
            assert "at most 2048" in payload["error"]["message"]
            # ~1.9k long messages in 1 MiB: under the count, so rendered on a worker thread, then
            # refused for its length (from its byte count: it is never tokenized whole)
            long = _big_body(2_000, 520)
            assert len(long) > 1_000_000
            status, payload, answered = await _health_during(session, server, long)
            assert status == 400, payload
            assert payload["error"]["code"] == "context_length_exceeded", payload
    assert not any(code >= 500 for code in server.responses)


class _SlowTemplate:
    """A tokenizer whose chat template takes ``delay_s`` of blocking work (a huge conversation)."""

    def __init__(self, tokenizer: Any, delay_s: float):
        self._tokenizer, self._delay_s = tokenizer, delay_s
        self.rendering: list[tuple[float, float]] = []  # (start, end) of each render, perf_counter's clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._tokenizer(*args, **kwargs)

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        time.sleep(self._delay_s)  # blocks whatever thread renders: it must not be the event loop's
        self.rendering.append((start, time.perf_counter()))
        return self._tokenizer.apply_chat_template(*args, **kwargs)


async def test_health_answers_while_a_prompt_is_being_rendered(tiny_tokenizer):
    slow = _SlowTemplate(tiny_tokenizer, delay_s=2.0)
    server = OpenAIServer(ScriptedEngine(tiny_tokenizer, ["done"]), slow, model_name="tiny")
    with serve_in_thread(server):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            raw = json.dumps({"model": "tiny", "messages": HI}).encode()
            status, payload, answered = await _health_during(session, server, raw)
    assert status == 200 and payload["choices"][0]["message"]["content"] == "done"
    [(start, end)] = slow.rendering
    # /health was answered while the render blocked its thread: it never waited for it (an order of
    # events on one clock, not a speed: a loop blocked by the render answers nothing inside the window)
    assert any(start < t < end for t in answered), (start, end, answered)


# ------------------------------------------------------------------------ slow clients
def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _closed_within(sock: socket.socket, seconds: float, *, trickle: bytes = b"") -> float | None:
    """Seconds until the server closes ``sock`` (sending ``trickle`` a byte at a time meanwhile),
    or ``None`` if it is still open after ``seconds``."""
    start = time.monotonic()
    sent = 0
    while time.monotonic() - start < seconds:
        if sent < len(trickle):
            try:
                sock.send(trickle[sent : sent + 1])
                sent += 1
            except OSError:  # reset by the server
                return time.monotonic() - start
        readable, _, _ = select.select([sock], [], [], 0.1)
        if readable:
            try:
                if sock.recv(65536) == b"":
                    return time.monotonic() - start
            except OSError:
                return time.monotonic() - start
    return None


def _good_request(port: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            json.dumps({"model": "tiny", "messages": HI, "max_tokens": 4}),
            {"Content-Type": "application/json"},
        )
        response = conn.getresponse()
        assert response.status == 200
        return json.loads(response.read())
    finally:
        conn.close()


def test_slow_clients_are_cut_off_at_the_read_timeout(engine, tiny_tokenizer):
    # room for 4 requests: slow uploads must not take it (50 of the crowd below are sending bodies)
    limits = ServerLimits(read_timeout_s=1.0, max_concurrency=2, max_queue=2)
    server = OpenAIServer(engine, tiny_tokenizer, model_name="tiny", limits=limits)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    with serve_in_thread(server):
        port = server.port
        # headers sent, body partial: 408 with OpenAI's error JSON, then the connection is closed
        sock = _connect(port)
        start = time.monotonic()
        sock.sendall(head + b"Content-Length: 1000\r\n\r\n" + b'{"model": "ti')
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        elapsed = time.monotonic() - start
        sock.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b'"code": "request_timeout"' in answer and b"did not arrive within 1.0 s" in answer
        assert 0.9 < elapsed < HANG_S, elapsed  # not before the timeout; after it, a bound against a hang

        # a body trickled a byte at a time is cut off too (the timeout covers the whole body)
        sock = _connect(port)
        sock.sendall(head + b"Content-Length: 1000\r\n\r\n")
        assert _closed_within(sock, HANG_S, trickle=b"x" * 1000) is not None
        sock.close()

        # headers never finished, or trickled: the connection is closed
        for trickle in (b"", b"X-Slow: " + b"y" * 1000):
            sock = _connect(port)
            sock.sendall(head)
            closed = _closed_within(sock, HANG_S, trickle=trickle)
            sock.close()
            assert closed is not None, "never closed"

        # a crowd of half-sent requests is closed all the same, and good requests go on meanwhile
        # (a body still arriving holds no place in the queue)
        crowd = [_connect(port) for _ in range(100)]
        for i, sock in enumerate(crowd):
            sock.sendall(head + (b"Content-Length: 500\r\n\r\n{" if i % 2 else b"Content-Le"))
        assert _good_request(port)["choices"][0]["message"]["role"] == "assistant"
        deadline = time.monotonic() + HANG_S
        still_open = [s for s in crowd if _closed_within(s, max(0.0, deadline - time.monotonic())) is None]
        for sock in crowd:
            sock.close()
        assert not still_open, f"{len(still_open)} of 100 slow connections still open after {HANG_S} s"

        # an idle keep-alive connection is closed after the timeout; the next good request is served
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/health")
        assert conn.getresponse().read() and conn.sock is not None
        assert _closed_within(conn.sock, HANG_S) is not None
        conn.close()
        assert _good_request(port)["choices"][0]["message"]["role"] == "assistant"
    assert not any(code >= 500 for code in server.responses)


def test_read_timeout_and_max_messages_are_serve_model_options(capsys):
    assert serve_main(["serve-model", "tiny", "--device", "cpu", "--read-timeout-s", "0"]) == 2
    assert "read_timeout_s must be > 0" in capsys.readouterr().err
    assert serve_main(["serve-model", "tiny", "--device", "cpu", "--max-messages", "0"]) == 2
    assert "max_messages must be >= 1" in capsys.readouterr().err


# ------------------------------------------------------------------------ logprob bytes
def test_token_bytes_are_each_tokens_own_bytes(tiny_tokenizer):
    token_bytes = TokenBytes(tiny_tokenizer)
    assert token_bytes.byte_level
    # every token: its bytes decode (invalid pieces replaced) to what the tokenizer decodes
    for tid in range(len(tiny_tokenizer)):
        text = tiny_tokenizer.decode([tid], skip_special_tokens=False)
        assert token_bytes(tid).decode("utf-8", errors="replace") == text, tid
    # '€' is three byte-level tokens here, each a part of the character: their own bytes, not U+FFFD's
    ids = tiny_tokenizer("€", add_special_tokens=False)["input_ids"]
    assert [token_bytes(t) for t in ids] == [b"\xe2", b"\x82", b"\xac"]
    assert all(tiny_tokenizer.decode([t]) == "\ufffd" for t in ids)


async def test_logprob_bytes_of_partial_utf8_tokens(tiny_tokenizer):
    text = "price: 5€, 中文 ok"
    engine = ScriptedEngine(tiny_tokenizer, [text])
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny") as server:
        oai = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        whole = await oai.chat.completions.create(model="tiny", messages=HI, logprobs=True)
        stream = await oai.chat.completions.create(model="tiny", messages=HI, logprobs=True, stream=True)
        streamed = [
            e async for c in stream if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content
        ]
    assert whole.choices[0].message.content == text
    for entries in (whole.choices[0].logprobs.content, streamed):
        answer = entries[:-1]  # the last is the end-of-sequence token
        assert b"".join(bytes(e.bytes) for e in answer) == text.encode()
        partial = [e for e in answer if e.token == "\ufffd"]
        assert len(partial) >= 3 and all(e.bytes != REPLACEMENT and len(e.bytes) < 3 for e in partial)
    eos = tiny_tokenizer.eos_token
    assert bytes(whole.choices[0].logprobs.content[-1].bytes) == eos.encode()


# ------------------------------------------------------------------------ malformed tool calls
@pytest.mark.parametrize(
    "answer",
    [
        'Let me see. <tool_call>\n{"name": "calculate", "arguments": {"expression": "1+"\n</tool_call>',  # bad JSON
        'Checking.\n\n<tool_call>\n{"name": "calculate", "arguments": {"expression"',  # cut, never closed
        '<tool_call>\n{"name": "calculate", "arguments": [1]}\n</tool_call>  trailing',  # arguments not an object
    ],
)
async def test_a_malformed_tool_call_is_returned_verbatim(tiny_tokenizer, answer):
    engine = ScriptedEngine(tiny_tokenizer, [answer])
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny") as server:
        oai = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        whole = await oai.chat.completions.create(model="tiny", messages=HI, tools=[CALCULATE])
        stream = await oai.chat.completions.create(model="tiny", messages=HI, tools=[CALCULATE], stream=True)
        pieces, calls, finish = [], [], None
        async for chunk in stream:
            for choice in chunk.choices:
                pieces.append(choice.delta.content or "")
                calls += choice.delta.tool_calls or []
                finish = choice.finish_reason or finish
    message = whole.choices[0].message
    assert message.content == answer  # exactly what the model wrote, nothing added or moved
    assert not message.tool_calls and whole.choices[0].finish_reason == "stop"
    assert "".join(pieces) == answer and not calls and finish == "stop"


# ------------------------------------------------------------------------ the bad-request suite
OK = {"model": "tiny", "messages": HI, "max_tokens": 6, "temperature": 0}
NESTED = b'{"model": "tiny", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


def _nested(depth: int) -> Any:
    value: Any = {"type": "string"}
    for _ in range(depth):
        value = {"type": "object", "properties": {"a": value}}
    return value


def _with(**fields: Any) -> dict:
    return {**OK, **fields}


def _without(name: str) -> dict:
    return {k: v for k, v in OK.items() if k != name}


def _assistant_call(arguments: str) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "calculate", "arguments": arguments}}],
    }


def _optional(n: int) -> dict:
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(n)}}


def _objects(n: int) -> list[dict]:
    return [{"type": "object", "properties": {f"k{i}": {"type": "integer"}}, "required": [f"k{i}"]} for i in range(n)]


def _json_schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def _tool(parameters: Any) -> list[dict]:
    return [{"type": "function", "function": {"name": "f", "parameters": parameters}}]


#: (what, body, headers, status, param: the field the error names, or a prefix of it with "*")
BAD_REQUESTS: list[tuple[str, Any, dict[str, str], int, str | None]] = [
    ("not JSON", b"{not json", {}, 400, None),
    ("empty body", b"", {}, 400, None),
    ("not UTF-8", b'{"model": "\xff\xfe"}', {}, 400, None),
    ("NaN", b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', {}, 400, None),
    ("an array", [1, 2, 3], {}, 400, None),
    ("a string", "hello", {}, 400, None),
    ("100k nested lists", NESTED, {}, 400, None),
    (
        "nested tool schema",
        _with(tools=[{"type": "function", "function": {"name": "deep", "parameters": _nested(MAX_JSON_DEPTH)}}]),
        {},
        400,
        "tools[0].function.parameters*",
    ),
    ("no model", _without("model"), {}, 400, "model"),
    ("model not a string", _with(model=5), {}, 400, "model"),
    ("unknown model", _with(model="gpt-9"), {}, 404, "model"),
    ("no messages", _without("messages"), {}, 400, "messages"),
    ("messages a string", _with(messages="hi"), {}, 400, "messages"),
    ("messages empty", _with(messages=[]), {}, 400, "messages"),
    ("message not an object", _with(messages=[42]), {}, 400, "messages[0]"),
    ("message role unknown", _with(messages=[{"role": "robot", "content": "hi"}]), {}, 400, "messages[0].role"),
    ("message without role", _with(messages=[{"content": "hi"}]), {}, 400, "messages[0].role"),
    ("content a number", _with(messages=[{"role": "user", "content": 42}]), {}, 400, "messages[0].content"),
    (
        "content an image",
        _with(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        {},
        400,
        "messages[0].content[0].type",
    ),
    ("user content null", _with(messages=[{"role": "user", "content": None}]), {}, 400, "messages[0].content"),
    (
        "message extra field",
        _with(messages=[{"role": "user", "content": "hi", "mood": "sad"}]),
        {},
        400,
        "messages[0].mood",
    ),
    (
        "tool message without id",
        _with(messages=[*HI, {"role": "tool", "content": "4"}]),
        {},
        400,
        "messages[1].tool_call_id",
    ),
    (
        "tool call arguments not JSON",
        _with(messages=[*HI, _assistant_call("{oops")]),
        {},
        400,
        "messages[1].tool_calls[0].function.arguments",
    ),
    (
        "tool call arguments nested 100k deep",
        _with(messages=[*HI, _assistant_call("[" * 100_000 + "]" * 100_000)]),
        {},
        400,
        "messages[1].tool_calls[0].function.arguments",
    ),
    (
        "content part text a number",
        _with(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}]),
        {},
        400,
        "messages[0].content[0].text",
    ),
    (
        "content a lone surrogate",
        b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}]}',
        {},
        400,
        "messages[0].content",
    ),
    ("too many messages", _with(messages=HI * 51), {}, 400, "messages"),
    ("prompt too long", _with(messages=[{"role": "user", "content": "word " * 400}]), {}, 400, "messages"),
    ("temperature a string", _with(temperature="hot"), {}, 400, "temperature"),
    ("temperature too high", _with(temperature=3), {}, 400, "temperature"),
    ("top_p zero", _with(top_p=0), {}, 400, "top_p"),
    ("top_k zero", _with(top_k=0), {}, 400, "top_k"),
    ("top_k 2**70", _with(top_k=2**70), {}, 400, "top_k"),
    ("max_tokens negative", _with(max_tokens=-1), {}, 400, "max_tokens"),
    ("max_tokens zero", _with(max_tokens=0), {}, 400, "max_tokens"),
    ("max_tokens huge", _with(max_tokens=2**70), {}, 400, "max_tokens"),
    ("max_tokens over the cap", _with(max_tokens=65), {}, 400, "max_tokens"),
    ("max_tokens a string", _with(max_tokens="10"), {}, 400, "max_tokens"),
    ("max_tokens a fraction", _with(max_tokens=1.5), {}, 400, "max_tokens"),
    ("max_completion_tokens huge", _with(max_completion_tokens=10**9), {}, 400, "max_completion_tokens"),
    ("seed 2**70", _with(seed=2**70), {}, 400, "seed"),
    ("seed -2**70", _with(seed=-(2**70)), {}, 400, "seed"),
    ("seed a string", _with(seed="1"), {}, 400, "seed"),
    ("stop a number", _with(stop=5), {}, 400, "stop"),
    ("five stops", _with(stop=["a", "b", "c", "d", "e"]), {}, 400, "stop"),
    ("empty stop", _with(stop=[""]), {}, 400, "stop"),
    ("stream a string", _with(stream="yes"), {}, 400, "stream"),
    ("stream_options unknown", _with(stream=True, stream_options={"bogus": 1}), {}, 400, "stream_options.bogus"),
    ("n 2", _with(n=2), {}, 400, "n"),
    ("logprobs a string", _with(logprobs="true"), {}, 400, "logprobs"),
    ("top_logprobs", _with(logprobs=True, top_logprobs=5), {}, 400, "top_logprobs"),
    ("logit_bias", _with(logit_bias={"1": 5}), {}, 400, "logit_bias"),
    ("presence_penalty", _with(presence_penalty=1), {}, 400, "presence_penalty"),
    ("metadata not strings", _with(metadata={"a": 1}), {}, 400, "metadata.a"),
    ("unknown field", _with(frobnicate=True), {}, 400, "frobnicate"),
    ("tools a string", _with(tools="calculate"), {}, 400, "tools"),
    ("tool without function", _with(tools=[{"type": "function"}]), {}, 400, "tools[0].function"),
    (
        "tool of another type",
        _with(tools=[{"type": "retrieval", "function": CALCULATE["function"]}]),
        {},
        400,
        "tools[0].type",
    ),
    (
        "tool name invalid",
        _with(tools=[{"type": "function", "function": {"name": "bad name!"}}]),
        {},
        400,
        "tools[0].function.name",
    ),
    ("tool parameters a list", _with(tools=_tool([1])), {}, 400, "tools[0].function.parameters"),
    (
        "tool properties a number",
        _with(tools=_tool({"type": "object", "properties": 5})),
        {},
        400,
        "tools[0].function.parameters",
    ),
    (
        "tool schema type a number",
        _with(tools=_tool({"type": 5}), tool_choice="required"),
        {},
        400,
        "tools[0].function.parameters",
    ),
    (
        "forced tool with a dangling $ref",
        _with(tools=_tool({"type": "object", "properties": {"a": {"$ref": "#/x"}}}), tool_choice="required"),
        {},
        400,
        "tools",
    ),
    ("tool_choice unknown", _with(tools=[CALCULATE], tool_choice="always"), {}, 400, "tool_choice"),
    ("tool_choice without tools", _with(tool_choice="required"), {}, 400, "tool_choice"),
    (
        "tool_choice names no tool",
        _with(tools=[CALCULATE], tool_choice={"type": "function", "function": {"name": "x"}}),
        {},
        400,
        "tool_choice",
    ),
    ("tool_choice malformed", _with(tools=[CALCULATE], tool_choice={"type": "function"}), {}, 400, "tool_choice"),
    (
        "tool_choice function a string",
        _with(tools=[CALCULATE], tool_choice={"type": "function", "function": "f"}),
        {},
        400,
        "tool_choice",
    ),
    ("response_format unknown", _with(response_format={"type": "xml"}), {}, 400, "response_format.type"),
    ("response_format a string", _with(response_format="json"), {}, 400, "response_format"),
    (
        "response_format schema a number",
        _with(response_format={"type": "json_schema", "json_schema": {"schema": 5}}),
        {},
        400,
        "response_format.json_schema.schema",
    ),
    (
        "response_format schema bad regex",
        _with(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(("}},
            }
        ),
        {},
        400,
        "response_format",
    ),
    (
        "response_format with a forced call",
        _with(tools=[CALCULATE], tool_choice="required", response_format={"type": "json_object"}),
        {},
        400,
        "response_format",
    ),
    # schemas the constrained decoder would give up on mid-answer: refused before any token
    (
        "response_format with 501 optional properties",
        _with(response_format=_json_schema(_optional(501))),
        {},
        400,
        "response_format.json_schema.schema",
    ),
    (
        "streamed, 501 optional properties",
        _with(stream=True, response_format=_json_schema(_optional(501))),
        {},
        400,
        "response_format.json_schema.schema",
    ),
    (
        "response_format oneOf 2,500 objects",
        _with(response_format=_json_schema({"oneOf": _objects(2500)})),
        {},
        400,
        "response_format.json_schema.schema",
    ),
    (
        "streamed, anyOf 2,500 objects",
        _with(stream=True, response_format=_json_schema({"anyOf": _objects(2500)})),
        {},
        400,
        "response_format.json_schema.schema",
    ),
    (
        "anyOf through $refs",
        _with(
            response_format=_json_schema(
                {
                    "$defs": {"a": {"anyOf": _objects(200)}, "b": {"anyOf": _objects(200)}},
                    "anyOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}],
                }
            )
        ),
        {},
        400,
        "response_format.json_schema.schema",
    ),
    (
        "forced tool with 501 optional arguments",
        _with(tools=_tool(_optional(501)), tool_choice="required"),
        {},
        400,
        "tools[0].function.parameters",
    ),
    (
        "129 tools",
        _with(tools=[{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]),
        {},
        400,
        "tools",
    ),
    # bodies that do not decode
    ("gzip that is not gzip", json.dumps(OK).encode(), {"Content-Encoding": "gzip"}, 400, None),
    ("deflate that is not deflate", json.dumps(OK).encode(), {"Content-Encoding": "deflate"}, 400, None),
    ("an unknown Content-Encoding", json.dumps(OK).encode(), {"Content-Encoding": "zstd-x"}, 415, None),
    ("a gzip bomb", gzip.compress(b'{"model": "' + b"a" * (64 << 20) + b'"}'), {"Content-Encoding": "gzip"}, 413, None),
    ("body over the limit", _with(messages=[{"role": "user", "content": "x" * 300_000}]), {}, 413, None),
    ("text/plain", json.dumps(OK), {"Content-Type": "text/plain"}, 415, None),
    ("a form", b"model=tiny", {"Content-Type": "application/x-www-form-urlencoded"}, 415, None),
    ("no API key", OK, {"Authorization": ""}, 401, None),
    ("wrong API key", OK, {"Authorization": "Bearer wrong"}, 401, None),
    ("not a bearer key", OK, {"Authorization": "Basic czNjcmV0"}, 401, None),
]


async def test_bad_request_suite(engine, tiny_tokenizer):
    limits = ServerLimits(
        max_body_bytes=256_000,
        max_prompt_tokens=200,
        max_tokens_cap=64,
        default_max_tokens=16,
        max_messages=50,
        read_timeout_s=5.0,
    )
    key = {"Authorization": "Bearer s3cret"}
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny", api_key="s3cret", limits=limits) as server:
        url = f"{server.base_url}/chat/completions"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:

            async def post(body: Any, headers: dict[str, str]) -> tuple[int, dict]:
                data = (
                    body
                    if isinstance(body, bytes)
                    else body.encode()
                    if isinstance(body, str) and headers.get("Content-Type")
                    else json.dumps(body).encode()
                )
                sent = {"Content-Type": "application/json", **key, **headers}
                async with session.post(url, data=data, headers={k: v for k, v in sent.items() if v}) as r:
                    assert r.content_type == "application/json", (r.status, await r.text())
                    return r.status, await r.json()

            status, before = await post(OK, {})
            assert status == 200
            for what, body, headers, want, param in BAD_REQUESTS:
                status, payload = await post(body, headers)
                assert status == want, (what, payload)
                error = payload["error"]
                assert error["message"] and error["type"], (what, payload)
                if param is not None and param.endswith("*"):
                    assert (error["param"] or "").startswith(param[:-1]), (what, payload)
                elif param is not None:
                    assert error["param"] == param, (what, payload)
            for path, method, want in (
                ("/v2/nothing", "GET", 404),
                ("/v1/chat/completions", "GET", 405),
                ("/v1/models/gpt-9", "GET", 404),
            ):
                async with session.request(method, f"{server.url}{path}", headers=key) as r:
                    assert r.status == want and "error" in await r.json()
            # after all that, the next good request is served, and answers as before
            status, after = await post(OK, {})
            assert status == 200
            assert after["choices"][0]["message"] == before["choices"][0]["message"]
    assert not any(code >= 500 for code in server.responses), server.responses
    assert sum(n for code, n in server.responses.items() if 400 <= code < 500) == len(BAD_REQUESTS) + 3


def test_every_bad_request_names_a_reason():
    """The suite covers each main request field."""
    from verlog.serve.openai_protocol import ChatCompletionRequest

    named = {(param or "").split(".")[0].split("[")[0] for *_, param in BAD_REQUESTS}
    main = {
        "model",
        "messages",
        "temperature",
        "top_p",
        "top_k",
        "max_tokens",
        "max_completion_tokens",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "n",
        "tools",
        "tool_choice",
        "logprobs",
        "top_logprobs",
        "response_format",
        "logit_bias",
        "presence_penalty",
        "metadata",
    }
    assert main <= set(ChatCompletionRequest.model_fields)
    assert main <= named, main - named
