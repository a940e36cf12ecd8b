"""`verlog serve-model`'s OpenAI-compatible server, driven by unmodified OpenAI clients.

The official ``openai`` client and LangChain's ``ChatOpenAI`` talk to it: chat, token
streaming, tool calls (Hermes ``<tool_call>`` blocks as OpenAI ``tool_calls``), forced tool
choice, logprobs. A greedy answer equals what training's chat model produces on the same
engine. Bad requests get OpenAI's error JSON with a 4xx status, and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from openai_tools import CALCULATE

from verlog.backends.base import Engine, Generation, SamplingParams
from verlog.backends.embedded import EmbeddedEngine
from verlog.graph_file import load_graph_file
from verlog.llm import VerlogChatModel
from verlog.serve import OpenAIServer, ServerLimits, serve_in_thread
from verlog.testing.scripted_engine import ScriptedEngine

openai = pytest.importorskip("openai")
langchain_openai = pytest.importorskip("langchain_openai")
ChatOpenAI = langchain_openai.ChatOpenAI

ROOT = Path(__file__).resolve().parents[1]
TOOL_ANSWER = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "(3 + 4) * 12"}}\n</tool_call>'


@pytest.fixture(scope="module")
def engine(tiny_model, tiny_tokenizer):
    engine = EmbeddedEngine(tiny_model, tiny_tokenizer, seed=0)
    yield engine
    engine.close()


def client(server: OpenAIServer, api_key: str = "unused") -> "openai.AsyncOpenAI":
    return openai.AsyncOpenAI(base_url=server.base_url, api_key=api_key, max_retries=0)


# ------------------------------------------------------------------------------- chat, streaming
async def test_openai_client_chat_matches_training_chat_model(engine, tiny_tokenizer):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Count to three."}]
    trained = VerlogChatModel(engine=engine, tokenizer=tiny_tokenizer, temperature=0, max_tokens=24)
    expected = await trained.ainvoke([SystemMessage("You are terse."), HumanMessage("Count to three.")])
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny") as server:
        oai = client(server)
        models = await oai.models.list()
        assert [m.id for m in models.data] == ["tiny"]
        answer = await oai.chat.completions.create(
            model="tiny", messages=messages, temperature=0, max_tokens=24, logprobs=True
        )
    choice = answer.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == expected.content  # the same code path as training
    assert choice.finish_reason == ("length" if expected.response_metadata["finish_reason"] == "length" else "stop")
    assert answer.usage.prompt_tokens == len(expected.response_metadata["prompt_ids"])
    assert answer.usage.completion_tokens == len(expected.response_metadata["response_ids"])
    lps = [entry.logprob for entry in choice.logprobs.content]
    assert lps == pytest.approx(expected.response_metadata["logprobs"], abs=1e-5)


async def test_openai_client_streams_tokens(engine, tiny_tokenizer):
    messages = [{"role": "user", "content": "Tell me a story."}]
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny") as server:
        oai = client(server)
        whole = await oai.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=40)
        stream = await oai.chat.completions.create(
            model="tiny",
            messages=messages,
            temperature=0,
            max_tokens=40,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces, finish, usage = [], None, None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                if choice.delta.content:
                    pieces.append(choice.delta.content)
                finish = choice.finish_reason or finish
    assert len(pieces) > 3, "tokens arrive as they are generated, not in one piece"
    assert "".join(pieces) == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens


async def test_stop_strings_are_cut_while_streaming(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["alpha beta STOP gamma"])
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny") as server:
        oai = client(server)
        whole = await oai.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], stop=["STOP"]
        )
        stream = await oai.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], stop="STOP", stream=True
        )
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert whole.choices[0].message.content == streamed == "alpha beta "


# ------------------------------------------------------------------------------- tool calls
async def test_openai_client_tool_calls(tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, [TOOL_ANSWER])
    messages = [{"role": "user", "content": "What is (3 + 4) * 12?"}]
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny") as server:
        oai = client(server)
        answer = await oai.chat.completions.create(model="tiny", messages=messages, tools=[CALCULATE])
        stream = await oai.chat.completions.create(model="tiny", messages=messages, tools=[CALCULATE], stream=True)
        deltas, finish = [], None
        async for chunk in stream:
            for choice in chunk.choices:
                deltas += choice.delta.tool_calls or []
                finish = choice.finish_reason or finish
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "calculate"
    assert json.loads(call.function.arguments) == {"expression": "(3 + 4) * 12"}
    assert finish == "tool_calls"
    assert [(d.function.name, json.loads(d.function.arguments)) for d in deltas] == [
        ("calculate", {"expression": "(3 + 4) * 12"})
    ]
    # the tools reached the model through the chat template, exactly as in training
    trained = VerlogChatModel(engine=engine, tokenizer=tiny_tokenizer)
    assert engine.calls[0] == trained.render_prompt_ids([HumanMessage("What is (3 + 4) * 12?")], [CALCULATE])


async def test_forced_tool_choice_prefills_the_call(tiny_tokenizer):
    # the engine continues after the forced opening `<tool_call>\n{"name": "calculate", "arguments": `
    engine = ScriptedEngine(tiny_tokenizer, ['{"expression": "6 * 7"}}\n</tool_call>'])
    forced = {"type": "function", "function": {"name": "calculate"}}
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny") as server:
        answer = await client(server).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "6 times 7?"}], tools=[CALCULATE], tool_choice=forced
        )
    (call,) = answer.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("calculate", {"expression": "6 * 7"})
    prefix = '<tool_call>\n{"name": "calculate", "arguments": '
    prefix_ids = tiny_tokenizer(prefix, add_special_tokens=False)["input_ids"]
    assert engine.calls[0][-len(prefix_ids) :] == prefix_ids  # forced tokens are prompt, not response


async def test_chat_openai_unmodified_chat_stream_and_tools(engine, tiny_tokenizer):
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny") as server:
        llm = ChatOpenAI(base_url=server.base_url, model="tiny", api_key="unused", temperature=0, max_tokens=20)
        answer = await llm.ainvoke("Say hello.")
        chunks = [chunk async for chunk in llm.astream("Say hello.")]
    trained = VerlogChatModel(engine=engine, tokenizer=tiny_tokenizer, temperature=0, max_tokens=20)
    assert answer.content == (await trained.ainvoke([HumanMessage("Say hello.")])).content
    assert len(chunks) > 3
    assert "".join(c.content for c in chunks) == answer.content

    scripted = ScriptedEngine(tiny_tokenizer, [TOOL_ANSWER])
    async with OpenAIServer(scripted, tiny_tokenizer, model_name="tiny") as server:
        from tools.calculator import calculate

        llm = ChatOpenAI(base_url=server.base_url, model="tiny", api_key="unused")
        with_tools = llm.bind_tools([calculate])
        message = await with_tools.ainvoke("What is (3 + 4) * 12?")
        streamed = None
        async for chunk in with_tools.astream("What is (3 + 4) * 12?"):
            streamed = chunk if streamed is None else streamed + chunk
    for msg in (message, streamed):
        assert [(c["name"], c["args"]) for c in msg.tool_calls] == [("calculate", {"expression": "(3 + 4) * 12"})]
        assert not msg.invalid_tool_calls


def test_sync_clients_against_a_server_thread(engine, tiny_tokenizer):
    server = OpenAIServer(engine, tiny_tokenizer, model_name="tiny")
    with serve_in_thread(server) as base_url:
        sync = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
        first = sync.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], temperature=0, max_tokens=8
        )
        again = ChatOpenAI(base_url=base_url, model="tiny", api_key="unused", temperature=0, max_tokens=8).invoke("hi")
    assert first.choices[0].message.content == again.content


async def test_calculator_graph_round_trip_with_chat_openai(tiny_tokenizer):
    """A ReAct graph file, unchanged, over HTTP: tool call -> tool result message -> answer."""
    engine = ScriptedEngine(tiny_tokenizer, [TOOL_ANSWER, "The answer is 84."])
    graph_file = load_graph_file(ROOT / "graphs" / "calculator.py")
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny") as server:
        llm = ChatOpenAI(base_url=server.base_url, model="tiny", api_key="unused")
        graph = graph_file.build(llm)
        state = await graph.ainvoke(
            {"messages": [SystemMessage("Use the tool."), HumanMessage("What is (3 + 4) * 12?")], "target": 84.0},
            {"recursion_limit": 20},
        )
    kinds = [m.type for m in state["messages"]]
    assert kinds == ["system", "human", "ai", "tool", "ai"]
    assert state["messages"][3].content == "84"
    assert state["messages"][-1].content == "The answer is 84."
    # the second call's prompt carried the assistant's tool call and the tool's answer
    second = tiny_tokenizer.decode(engine.calls[1])
    assert '"expression": "(3 + 4) * 12"' in second and "<tool_response>\n84\n</tool_response>" in second


# ------------------------------------------------------------------------------- bad requests
async def _post(session: aiohttp.ClientSession, url: str, body, headers=None) -> tuple[int, dict]:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    async with session.post(url, data=data, headers={"Content-Type": "application/json", **(headers or {})}) as r:
        return r.status, await r.json()


async def test_bad_requests_get_clear_errors_and_the_server_keeps_serving(engine, tiny_tokenizer):
    limits = ServerLimits(max_body_bytes=20_000, max_prompt_tokens=200, max_tokens_cap=64, default_max_tokens=16)
    ok = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    cases = [
        ({"model": "tiny"}, 400, "messages"),  # missing field
        ({**ok, "messages": [{"role": "robot", "content": "hi"}]}, 400, "messages[0].role"),  # wrong schema
        ({**ok, "messages": []}, 400, "messages"),
        ({**ok, "temperature": "hot"}, 400, "temperature"),
        ({**ok, "max_tokens": 0}, 400, "max_tokens"),
        ({**ok, "frobnicate": True}, 400, "frobnicate"),  # unknown field
        ({**ok, "n": 3}, 400, "n"),  # cannot honour
        ({**ok, "max_tokens": 5000}, 400, "max_tokens"),  # over the cap
        (
            {**ok, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            400,
            "messages[0].content[0].type",
        ),
        ({**ok, "messages": [{"role": "user", "content": "word " * 400}]}, 400, "messages"),  # prompt too long
        ({**ok, "model": "gpt-9"}, 404, "model"),  # unknown model
        (
            {**ok, "tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [CALCULATE]},
            400,
            "tool_choice",
        ),
        (b"{not json", 400, None),
        ([1, 2, 3], 400, None),
        ({**ok, "messages": [{"role": "user", "content": "x" * 30_000}]}, 413, None),  # body too large
    ]
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny", limits=limits) as server:
        url = f"{server.base_url}/chat/completions"
        async with aiohttp.ClientSession() as session:
            for body, status, param in cases:
                got, payload = await _post(session, url, body)
                assert got == status, (body if not isinstance(body, bytes) else body[:40], payload)
                error = payload["error"]
                assert error["message"] and error["type"], payload
                if param is not None:
                    assert error["param"] == param, payload
                # ... and the next good request is served
                got, payload = await _post(session, url, ok)
                assert got == 200 and payload["choices"][0]["message"]["role"] == "assistant"
            async with session.get(f"{server.url}/v2/nothing") as r:
                assert r.status == 404 and "error" in await r.json()
            async with session.get(f"{server.base_url}/chat/completions") as r:
                assert r.status == 405 and "error" in await r.json()
            async with session.get(f"{server.base_url}/models/gpt-9") as r:
                assert r.status == 404 and (await r.json())["error"]["code"] == "model_not_found"
        # the official client maps them to its typed errors
        oai = client(server)
        with pytest.raises(openai.NotFoundError, match="gpt-9"):
            await oai.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.BadRequestError, match="context_length_exceeded|at most 200"):
            await oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "word " * 400}])
        done = await oai.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert done.choices[0].message.role == "assistant"


async def test_api_key(engine, tiny_tokenizer):
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny", api_key="s3cret") as server:
        with pytest.raises(openai.AuthenticationError):
            await client(server, "wrong").models.list()
        with pytest.raises(openai.AuthenticationError):
            await client(server, "wrong").chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}]
            )
        answer = await client(server, "s3cret").chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert answer.choices[0].message.role == "assistant"
        async with aiohttp.ClientSession() as session, session.get(f"{server.url}/health") as r:
            assert r.status == 200  # health checks need no key


class _SlowEngine(Engine):
    """Answers after a delay (to fill the server's generation slots)."""

    eos_token_ids = ()

    def __init__(self, delay_s: float):
        self.delay_s = delay_s

    async def generate(self, prompt_ids, sampling: SamplingParams, *, request_id=None) -> Generation:
        await asyncio.sleep(self.delay_s)
        return Generation([65, 66], [-0.5, -0.5], "length")


async def test_too_many_waiting_requests_get_429(tiny_tokenizer):
    limits = ServerLimits(max_concurrency=1, max_queue=1)
    async with OpenAIServer(_SlowEngine(1.0), tiny_tokenizer, model_name="tiny", limits=limits) as server:
        oai = client(server)

        async def ask():
            try:
                await oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
                return 200
            except openai.RateLimitError as exc:
                assert exc.body["code"] == "server_busy"
                assert 1 <= int(exc.response.headers["Retry-After"]) <= 60  # about one generation's time
                return 429

        statuses = sorted(await asyncio.gather(*(ask() for _ in range(4))))
        assert statuses == [200, 200, 429, 429]  # one running, one waiting, the rest refused
        assert await ask() == 200  # and it serves again once free


async def test_engine_streams_tokens_and_frees_a_cancelled_request(engine, tiny_tokenizer):
    seen: list[int] = []
    first = asyncio.Event()

    def on_token(token: int, logprob: float) -> None:
        seen.append(token)
        first.set()

    sampling = SamplingParams(temperature=1.0, max_new_tokens=3000)
    task = asyncio.ensure_future(engine.generate([1, 2, 3, 4], sampling, on_token=on_token))
    await asyncio.wait_for(first.wait(), 10)
    task.cancel()
    await asyncio.sleep(0.3)
    count = len(seen)
    await asyncio.sleep(0.3)
    assert len(seen) == count < 3000  # the engine stopped decoding the cancelled request
    quick = await asyncio.wait_for(engine.generate([1, 2, 3], SamplingParams(temperature=0, max_new_tokens=4)), 10)
    assert len(quick.token_ids) <= 4
    greedy = SamplingParams(temperature=0, max_new_tokens=12)
    streamed: list[int] = []
    generation = await engine.generate([5, 6, 7], greedy, on_token=lambda t, lp: streamed.append(t))
    assert streamed == generation.token_ids


async def test_engine_stream_yields_deltas_then_the_generation_and_stops_when_closed(engine):
    from verlog.backends.base import TokenDelta

    greedy = SamplingParams(temperature=0, max_new_tokens=16)
    items = [item async for item in engine.stream([5, 6, 7], greedy)]
    deltas, generation = items[:-1], items[-1]
    assert isinstance(generation, Generation) and all(isinstance(d, TokenDelta) for d in deltas)
    assert [t for d in deltas for t in d.token_ids] == generation.token_ids
    assert [lp for d in deltas for lp in d.logprobs] == generation.logprobs
    assert generation.token_ids == (await engine.generate([5, 6, 7], greedy)).token_ids
    # a consumer that stops early frees the request's batch row
    long = engine.stream([1, 2, 3, 4], SamplingParams(temperature=1.0, max_new_tokens=3000))
    first = await asyncio.wait_for(long.__anext__(), 10)
    assert isinstance(first, TokenDelta)
    generated = engine.stats.generated_tokens
    await long.aclose()
    await asyncio.sleep(0.3)
    settled = engine.stats.generated_tokens
    await asyncio.sleep(0.3)
    assert engine.stats.generated_tokens == settled < generated + 3000


async def test_server_streams_through_engine_stream(tiny_tokenizer):
    """The server takes tokens from ``engine.stream``: an engine overriding only ``stream``
    (no ``generate`` tricks) streams in several chunks."""
    from verlog.backends.base import TokenDelta

    class Streaming(ScriptedEngine):
        async def stream(self, prompt_ids, sampling, *, request_id=None):
            generation = await self.generate(prompt_ids, sampling, request_id=request_id)
            for i, (t, lp) in enumerate(zip(generation.token_ids, generation.logprobs)):
                await asyncio.sleep(0.01 * (i == 3))  # a pause mid-answer: chunks go out meanwhile
                yield TokenDelta([t], [lp])
            yield generation

    streaming = Streaming(tiny_tokenizer, ["one two three four five six"])
    async with OpenAIServer(streaming, tiny_tokenizer, model_name="tiny") as server:
        stream = await client(server).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "count"}], stream=True
        )
        pieces = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 1 and "".join(pieces) == "one two three four five six"


async def test_invalid_tool_call_text_is_returned_as_content(tiny_tokenizer):
    engine = ScriptedEngine(
        tiny_tokenizer, ['Let me see. <tool_call>\n{"name": "calculate", "arguments": [1]}\n</tool_call>']
    )
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny") as server:
        answer = await client(server).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], tools=[CALCULATE]
        )
    message = answer.choices[0].message
    assert not message.tool_calls and answer.choices[0].finish_reason == "stop"
    # verbatim: nothing moved, no `</tool_call>` the model did not write
    assert message.content == 'Let me see. <tool_call>\n{"name": "calculate", "arguments": [1]}\n</tool_call>'


def test_messages_convert_to_the_training_prompt(tiny_tokenizer):
    """An OpenAI conversation with tool calls renders to the same ids as the LangChain one."""
    from verlog.serve.openai_protocol import parse_request, to_langchain_messages

    body = {
        "model": "tiny",
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+2?"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "calculate", "arguments": '{"expression": "2+2"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "4"},
        ],
    }
    expected = [
        SystemMessage("sys"),
        HumanMessage("What is 2+2?"),
        AIMessage("", tool_calls=[{"name": "calculate", "args": {"expression": "2+2"}, "id": "call_1"}]),
    ]
    from langchain_core.messages import ToolMessage

    expected.append(ToolMessage("4", tool_call_id="call_1"))
    model = VerlogChatModel(engine=ScriptedEngine(tiny_tokenizer, ["x"]), tokenizer=tiny_tokenizer)
    got = to_langchain_messages(parse_request(body))
    assert model.render_prompt_ids(got, [CALCULATE]) == model.render_prompt_ids(expected, [CALCULATE])
