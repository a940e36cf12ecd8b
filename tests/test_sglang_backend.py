"""SGLangEngine against a real HTTP server (SGLangCompatServer on 127.0.0.1) over loopback."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from verlog.backends.base import (
    Engine,
    EngineError,
    EngineTimeoutError,
    Generation,
    SamplingParams,
    run_sync,
    sync_bridge_loop,
)
from verlog.backends.sglang import ROUTING_KEY_HEADER, SGLangEngine, parse_generate_response
from verlog.backends.sglang_server import (
    SGLangCompatServer,
    delay,
    fail_first,
    respond_with,
)

IDS = [17, 4, 99, 2]
# not exactly representable in binary: checks the JSON round trip keeps every bit
LOGPROBS = [-0.1234567890123456, -2.5e-9, -7.0, -0.3333333333333333]


class ScriptedEngine(Engine):
    """Answers every prompt with IDS / LOGPROBS (cut to max_new_tokens) and records its calls."""

    eos_token_ids = (2,)

    def __init__(self, finish_reason: str = "stop") -> None:
        self.finish_reason = finish_reason
        self.calls: list[tuple[list[int], SamplingParams, str | None]] = []

    async def generate(self, prompt_ids, sampling, *, request_id=None) -> Generation:
        self.calls.append((list(prompt_ids), sampling, request_id))
        n = min(len(IDS), sampling.max_new_tokens)
        reason = self.finish_reason if n == len(IDS) else "length"
        return Generation(IDS[:n], LOGPROBS[:n], reason)  # type: ignore[arg-type]


@pytest.fixture
async def scripted():
    engine = ScriptedEngine()
    async with SGLangCompatServer(engine) as server:
        yield engine, server


def client(server: SGLangCompatServer, **kwargs) -> SGLangEngine:
    kwargs.setdefault("timeout_s", 5.0)
    kwargs.setdefault("retry_backoff_s", 0.01)
    return SGLangEngine(server.url, **kwargs)


async def test_ids_logprobs_and_finish_reason_round_trip_exactly(scripted):
    engine, server = scripted
    async with client(server) as sg:
        gen = await sg.generate([1, 2, 3], SamplingParams())
        short = await sg.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
    assert gen.token_ids == IDS
    assert gen.logprobs == LOGPROBS  # bit-exact
    assert gen.finish_reason == "stop"
    assert gen.info["finish_reason"] == {"type": "stop", "matched": 2}
    assert gen.info["prompt_tokens"] == 3 and gen.info["completion_tokens"] == 4
    assert (short.token_ids, short.logprobs) == (IDS[:2], LOGPROBS[:2])
    assert short.finish_reason == "length"
    assert engine.calls[0][0] == [1, 2, 3]
    body = server.calls[0].body
    assert body["return_logprob"] is True and body["logprob_start_len"] == -1


async def test_sampling_params_reach_the_server(scripted):
    engine, server = scripted
    sampling = SamplingParams(
        temperature=0.0,
        top_p=0.9,
        top_k=20,
        max_new_tokens=64,
        stop=("</tool>", "\n\n"),
        stop_token_ids=(7,),
        seed=1234,
    )
    async with client(server, eos_token_ids=(2, 3)) as sg:
        await sg.generate([5], sampling)
        await sg.generate([5], SamplingParams())
    sent = server.calls[0].body["sampling_params"]
    assert sent == {
        "temperature": 0.0,
        "top_p": 0.9,
        "top_k": 20,
        "max_new_tokens": 64,
        "stop": ["</tool>", "\n\n"],
        "stop_token_ids": [2, 3, 7],
        "sampling_seed": 1234,
    }
    received = engine.calls[0][1]
    assert received == SamplingParams(
        temperature=0.0,
        top_p=0.9,
        top_k=20,
        max_new_tokens=64,
        stop=("</tool>", "\n\n"),
        stop_token_ids=(2, 3, 7),
        seed=1234,
    )
    # defaults: top_k -1 (whole vocabulary), nothing optional sent
    assert server.calls[1].body["sampling_params"] == {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "max_new_tokens": 256,
        "stop_token_ids": [2, 3],
    }


async def test_request_id_is_forwarded_as_rid_and_routing_key(scripted):
    engine, server = scripted
    async with client(server) as sg:
        first = await sg.generate([1], SamplingParams(), request_id="episode-7")
        await sg.generate([1], SamplingParams(), request_id="episode-7")
        await sg.generate([1], SamplingParams())
    rids = [call.body.get("rid") for call in server.calls]
    assert rids[0].startswith("episode-7_t") and rids[1].startswith("episode-7_t")
    assert rids[0] != rids[1]  # SGLang refuses two running requests with one rid
    assert rids[2] is None
    assert [c.headers.get(ROUTING_KEY_HEADER) for c in server.calls] == ["episode-7", "episode-7", None]
    assert engine.calls[0][2] == rids[0]
    assert first.info["id"] == rids[0]


async def test_api_key_and_headers_are_sent(scripted):
    _, server = scripted
    async with client(server, api_key="secret", headers={"X-Team": "rl"}) as sg:
        await sg.generate([1], SamplingParams())
    headers = server.calls[0].headers
    assert headers["Authorization"] == "Bearer secret" and headers["X-Team"] == "rl"


async def test_transient_server_errors_are_retried():
    engine = ScriptedEngine()
    async with SGLangCompatServer(engine, fault=fail_first(2, status=503)) as server:
        async with client(server, max_retries=2) as sg:
            gen = await sg.generate([1], SamplingParams(), request_id="ep")
    assert gen.token_ids == IDS
    assert len(server.calls) == 3 and server.stats.served == 1
    rids = [call.body["rid"] for call in server.calls]
    assert rids[1] == rids[0] + "_r1" and rids[2] == rids[0] + "_r2"


async def test_429_is_retried_and_exhausted_retries_name_the_error():
    async with SGLangCompatServer(ScriptedEngine(), fault=fail_first(10, status=500, message="CUDA OOM")) as srv:
        async with client(srv, max_retries=1) as sg:
            with pytest.raises(EngineError, match=r"2 attempts: HTTP 500: CUDA OOM"):
                await sg.generate([1], SamplingParams())
    async with SGLangCompatServer(ScriptedEngine(), fault=fail_first(1, status=429)) as srv:
        async with client(srv, max_retries=1) as sg:
            assert (await sg.generate([1], SamplingParams())).token_ids == IDS


async def test_client_errors_are_not_retried_and_carry_the_server_message(scripted):
    _, server = scripted
    async with client(server, max_retries=3) as sg:
        with pytest.raises(EngineError, match=r"HTTP 400\): 'input_ids' must be a non-empty") as e:
            await sg.generate([], SamplingParams())
    assert not isinstance(e.value, EngineTimeoutError)
    assert server.url in str(e.value)
    assert len(server.calls) == 1
    fault = fail_first(10, status=422, message="max_new_tokens exceeds the context length")
    async with SGLangCompatServer(ScriptedEngine(), fault=fault) as other:
        async with client(other, max_retries=3) as sg:
            with pytest.raises(EngineError, match=r"HTTP 422\): max_new_tokens exceeds"):
                await sg.generate([1], SamplingParams())
        assert len(other.calls) == 1


async def test_server_validates_request_bodies(scripted):
    import aiohttp

    _, server = scripted
    bad_bodies = {
        b"not json": "not valid JSON",
        b"[1, 2]": "JSON object",
        b"{}": "missing 'input_ids'",
        b'{"text": "hi"}': "no tokenizer",
        b'{"input_ids": [[1, 2]]}': "batched",
        b'{"input_ids": [1, "a"]}': "non-negative integers",
        b'{"input_ids": [1], "sampling_params": {"top_p": 0}}': "top_p",
        b'{"input_ids": [1], "stream": "yes"}': "'stream' must be true or false",
        b'{"input_ids": [1], "return_hidden_states": true}': "return_hidden_states",
        b'{"input_ids": [1], "return_logprob": true, "logprob_start_len": 0}': "prompt logprobs",
    }
    async with aiohttp.ClientSession() as http:
        for raw, message in bad_bodies.items():
            async with http.post(server.url + "/generate", data=raw) as resp:
                assert resp.status == 400, raw
                assert message in (await resp.json())["error"]["message"], raw
        # neutral values of unsupported params, and SGLang's "whole vocabulary" top_k, are fine
        ok = {
            "input_ids": [1],
            "sampling_params": {"repetition_penalty": 1.0, "top_k": 1 << 30},
            "return_hidden_states": False,
        }
        async with http.post(server.url + "/generate", json=ok) as resp:
            assert resp.status == 200
            body = await resp.json()
            assert body["output_ids"] == IDS and "output_token_logprobs" not in body["meta_info"]


async def test_timeouts_are_retried_then_raise_engine_timeout_error():
    async with SGLangCompatServer(ScriptedEngine(), fault=delay(2.0)) as server:
        sg = SGLangEngine(server.url, timeout_s=0.15, max_retries=2, retry_backoff_s=0.01)
        started = time.perf_counter()
        with pytest.raises(EngineTimeoutError) as err:
            await sg.generate([1], SamplingParams(), request_id="slow")
        elapsed = time.perf_counter() - started
        await sg.aclose()
        message = str(err.value)
        assert server.url in message and "0.15s" in message and "3 attempts" in message
        assert isinstance(err.value, TimeoutError)
        # three attempts, each cut at 0.15 s: three calls and the timeout error say none waited out its 2 s
        # answer (no upper bound on the time: a busy machine is slow, and no test measures speed)
        assert len(server.calls) == 3 and 0.4 < elapsed
        assert len({call.body["rid"] for call in server.calls}) == 3


async def test_a_slow_first_attempt_is_retried_successfully():
    async with SGLangCompatServer(ScriptedEngine(), fault=delay(2.0, first=1)) as server:
        async with SGLangEngine(server.url, timeout_s=0.3, retry_backoff_s=0.01) as sg:
            gen = await sg.generate([1], SamplingParams(), request_id="ep")
    assert gen.token_ids == IDS and len(server.calls) == 2


async def test_unreachable_server_is_a_clear_error():
    async with SGLangCompatServer(ScriptedEngine()) as server:
        url = server.url  # the port is free again once the server stops
    async with SGLangEngine(url, timeout_s=1.0, max_retries=1, retry_backoff_s=0.01) as sg:
        with pytest.raises(EngineError, match=r"failed after 2 attempts: ClientConnectorError"):
            await sg.generate([1], SamplingParams())
        assert await sg.health() is False


GOOD_META = {
    "finish_reason": {"type": "stop", "matched": 2},
    "output_token_logprobs": [[-0.5, 17, None], [-0.25, 2, None]],
}


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ([GOOD_META], "expected a JSON object"),
        ({"output_ids": [17, 2]}, "no 'meta_info'"),
        ({"meta_info": {**GOOD_META, "finish_reason": {"type": "eos"}}}, "unknown finish_reason"),
        ({"meta_info": {"finish_reason": {"type": "stop"}}}, "no 'meta_info.output_token_logp"),
        ({"meta_info": {**GOOD_META, "output_token_logprobs": [[-0.5]]}}, r"logprobs\[0\] is"),
        ({"meta_info": {**GOOD_META, "output_token_logprobs": [[None, 17]]}}, "null means NaN"),
        ({"meta_info": {**GOOD_META, "output_token_logprobs": [[-0.5, "a"]]}}, "token id"),
        ({"meta_info": {**GOOD_META, "output_token_logprobs": [[0.7, 17]]}}, "logprob 0.7"),
        ({"output_ids": [17], "meta_info": GOOD_META}, "disagree"),
        ({"output_ids": [17, 3], "meta_info": GOOD_META}, "first difference at index 1"),
        ({"output_ids": "17 2", "meta_info": GOOD_META}, "not a list of token ids"),
    ],
)
async def test_malformed_responses_raise_engine_error(body, problem):
    async with SGLangCompatServer(ScriptedEngine(), fault=respond_with(body)) as server:
        async with client(server, max_retries=3) as sg:
            expected = f"malformed /generate response from {server.url}.*{problem}"
            with pytest.raises(EngineError, match=expected):
                await sg.generate([1], SamplingParams())
        assert len(server.calls) == 1  # not retried


async def test_non_json_success_body_is_an_engine_error():
    async with SGLangCompatServer(ScriptedEngine(), fault=respond_with("<html>oops")) as server:
        async with client(server) as sg:
            with pytest.raises(EngineError, match="not JSON: '<html>oops'"):
                await sg.generate([1], SamplingParams())


def test_ids_fall_back_to_the_logprob_entries_without_output_ids():
    gen = parse_generate_response({"text": "hi", "meta_info": GOOD_META})
    assert gen.token_ids == [17, 2] and gen.logprobs == [-0.5, -0.25]
    aborted = parse_generate_response(
        {
            "meta_info": {"finish_reason": {"type": "abort", "message": "paused"}, "output_token_logprobs": []},
            "output_ids": [],
        }
    )
    assert aborted.finish_reason == "abort" and aborted.token_ids == []


async def test_calls_from_other_event_loops_share_the_engine(scripted):
    engine, server = scripted
    sg = client(server)
    try:
        in_loop = await sg.generate([1], SamplingParams(), request_id="main")

        def sync_call(rid: str) -> Generation:
            # a sync LangChain call: an HTTP engine's sync calls share verlog's sync-bridge loop
            assert not sg.sync_on_thread_loop
            return run_sync(sg.generate([2], SamplingParams(), request_id=rid), sync_bridge_loop())

        from_threads = await asyncio.gather(*(asyncio.to_thread(sync_call, f"thread-{i}") for i in range(3)))
        assert in_loop.token_ids == IDS
        assert all(gen.token_ids == IDS for gen in from_threads)
        # one session for this loop, one for the sync bridge: sync calls share it, none leaks
        assert sg.open_sessions == 2
        assert await asyncio.to_thread(sync_call, "again") is not None
        assert sg.open_sessions == 2
    finally:
        await sg.aclose()
    assert sg.open_sessions == 0
    assert {call[2].split("_t")[0] for call in engine.calls} == {"main", "thread-0", "thread-1", "thread-2", "again"}


async def test_aclose_closes_sessions_of_loops_running_in_other_threads(scripted):
    _, server = scripted
    sg = client(server)
    await sg.generate([1], SamplingParams())
    other = asyncio.new_event_loop()
    thread = threading.Thread(target=other.run_forever, daemon=True)
    thread.start()
    try:
        fut = asyncio.run_coroutine_threadsafe(sg.generate([1], SamplingParams()), other)
        assert (await asyncio.wrap_future(fut)).token_ids == IDS
        assert sg.open_sessions == 2
        await sg.aclose()
        assert sg.open_sessions == 0
    finally:
        other.call_soon_threadsafe(other.stop)
        thread.join(timeout=5)
        other.close()


async def test_fifty_concurrent_requests(scripted):
    engine, server = scripted
    async with client(server) as sg:
        gens = await asyncio.gather(
            *(sg.generate([i, i + 1], SamplingParams(), request_id=f"ep-{i}") for i in range(50))
        )
    assert all(gen.token_ids == IDS and gen.logprobs == LOGPROBS for gen in gens)
    assert sorted(call[0][0] for call in engine.calls) == list(range(50))
    assert len({call.body["rid"] for call in server.calls}) == 50
    assert sg.open_sessions == 0


async def test_health_and_wait_until_ready(scripted):
    _, server = scripted
    async with client(server) as sg:
        assert await sg.health() is True
        assert await sg.health(generate=True) is True
        server.ready = False
        assert await sg.health() is False
        with pytest.raises(EngineTimeoutError, match=r"not ready after 0.2s"):
            await sg.wait_until_ready(0.2, poll_interval_s=0.05)
        asyncio.get_running_loop().call_later(0.1, setattr, server, "ready", True)
        await sg.wait_until_ready(5.0, poll_interval_s=0.02)


async def test_server_refuses_a_duplicate_running_rid():
    import aiohttp

    release = asyncio.Event()

    class Held(ScriptedEngine):
        async def generate(self, prompt_ids, sampling, *, request_id=None):
            await release.wait()
            return await super().generate(prompt_ids, sampling, request_id=request_id)

    async with SGLangCompatServer(Held()) as server, aiohttp.ClientSession() as http:
        body = {"input_ids": [1], "rid": "same"}
        first = asyncio.create_task(http.post(server.url + "/generate", json=body))
        while not server.calls:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.02)
        async with http.post(server.url + "/generate", json=body) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["message"] == "Duplicate request ID detected: same"
        release.set()
        async with await first as resp:
            assert resp.status == 200 and (await resp.json())["meta_info"]["id"] == "same"


async def test_engine_errors_become_http_500():
    class Broken(Engine):
        async def generate(self, prompt_ids, sampling, *, request_id=None):
            raise EngineError("worker crashed")

    async with SGLangCompatServer(Broken()) as server:
        async with client(server, max_retries=1) as sg:
            with pytest.raises(EngineError, match="HTTP 500: engine error: worker crashed"):
                await sg.generate([1], SamplingParams())
            assert await sg.health(generate=True) is False


# ------------------------------------------------------------------------------- streaming
async def collect(stream) -> tuple[list, Generation]:
    items = [item async for item in stream]
    assert isinstance(items[-1], Generation) and not any(isinstance(i, Generation) for i in items[:-1])
    return items[:-1], items[-1]


async def test_stream_yields_the_tokens_then_the_same_generation(scripted):
    engine, server = scripted
    async with client(server) as sg:
        deltas, gen = await collect(sg.stream([1, 2, 3], SamplingParams(max_new_tokens=8), request_id="ep-1"))
        whole = await sg.generate([1, 2, 3], SamplingParams(max_new_tokens=8))
    assert [t for d in deltas for t in d.token_ids] == gen.token_ids == whole.token_ids == IDS
    assert [lp for d in deltas for lp in d.logprobs] == gen.logprobs == LOGPROBS  # every bit kept
    assert gen.finish_reason == "stop" and gen.info["completion_tokens"] == len(IDS)
    body = server.calls[0].body
    assert body["stream"] is True and body["rid"].startswith("ep-1_t")
    assert server.calls[0].headers[ROUTING_KEY_HEADER] == "ep-1"


async def test_stream_from_a_live_engine_arrives_in_pieces(tiny_model, tiny_tokenizer):
    from verlog.backends.embedded import EmbeddedEngine

    backend = EmbeddedEngine(tiny_model, tiny_tokenizer)
    greedy = SamplingParams(temperature=0, max_new_tokens=24)
    try:
        async with SGLangCompatServer(backend) as server, client(server) as sg:
            deltas, gen = await collect(sg.stream([5, 6, 7, 8], greedy))
            whole = await sg.generate([5, 6, 7, 8], greedy)
    finally:
        backend.close()
    assert len(deltas) > 1 and [t for d in deltas for t in d.token_ids] == gen.token_ids == whole.token_ids
    # (the second call reads its prompt from the prefix cache: equal to float round-off)
    assert gen.logprobs == pytest.approx(whole.logprobs, abs=1e-5) and gen.finish_reason == whole.finish_reason


async def test_stream_understands_incremental_chunks_and_retries_before_the_first(scripted):
    import json

    _, server = scripted

    def chunk(ids, lps, total, finish=None):
        meta = {
            "completion_tokens": total,
            "finish_reason": finish,
            "output_token_logprobs": [[lp, t, None] for t, lp in zip(ids, lps)],
        }
        return "data: " + json.dumps({"output_ids": ids, "meta_info": meta}) + "\n\n"

    # SGLang launched with --incremental-streaming-output: each chunk holds only its new tokens
    sse = chunk(IDS[:2], LOGPROBS[:2], 2) + chunk(IDS[2:], LOGPROBS[2:], 4, {"type": "stop"}) + "data: [DONE]\n\n"
    server.fault = respond_with(sse)
    async with client(server) as sg:
        deltas, gen = await collect(sg.stream([1], SamplingParams()))
    assert [d.token_ids for d in deltas] == [IDS[:2], IDS[2:]] and gen.token_ids == IDS
    assert gen.finish_reason == "stop"
    # a chunk whose count disagrees is refused, naming the problem
    server.fault = respond_with(chunk(IDS[:2], LOGPROBS[:2], 3) + "data: [DONE]\n\n")
    async with client(server) as sg:
        with pytest.raises(EngineError, match="holds 2 tokens after 0, but says 3"):
            await collect(sg.stream([1], SamplingParams()))
    # a failure before the first chunk is retried
    server.fault = fail_first(server.stats.received + 1, status=503)
    async with client(server, max_retries=1) as sg:
        _, gen = await collect(sg.stream([1], SamplingParams()))
    assert gen.token_ids == IDS


async def test_default_stream_of_an_engine_that_cannot_stream_is_one_chunk(scripted):
    engine, _ = scripted
    deltas, gen = await collect(engine.stream([1, 2], SamplingParams()))
    assert len(deltas) == 1 and deltas[0].token_ids == IDS and gen.token_ids == IDS


async def test_another_http_engine_reuses_the_retry_and_session_base(scripted):
    """An engine for another HTTP API writes only its request and response formats."""
    from verlog.backends.http import HTTPEngine

    class Minimal(HTTPEngine):
        server_name = "Minimal server"

        async def generate(self, prompt_ids, sampling, *, request_id=None) -> Generation:
            body = {"input_ids": prompt_ids, "return_logprob": True}
            answer = await self.post_json("/generate", lambda attempt: body)
            return parse_generate_response(answer)

    _, server = scripted
    server.fault = fail_first(2, status=503, message="warming up")
    async with Minimal(server.url, retry_backoff_s=0.01, max_retries=2) as engine:
        assert (await engine.generate([1, 2], SamplingParams())).token_ids == IDS  # after 2 retries
        assert engine.open_sessions == 1 and await engine.get_ok("/health")
    assert engine.open_sessions == 0
    server.fault = fail_first(server.stats.received + 5, status=503, message="still warming up")
    async with Minimal(server.url, retry_backoff_s=0.01, max_retries=1) as engine:
        with pytest.raises(
            EngineError, match=r"Minimal request to .* failed after 2 attempts: HTTP 503: still warming"
        ):
            await engine.generate([1], SamplingParams())
