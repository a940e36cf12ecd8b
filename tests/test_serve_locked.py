"""A production server left running: nothing that changes weights or rewards is open to anyone
without a key, bad feedback and oversized headers are refused with a 4xx (never a 5xx), a model
that cannot answer is neither started nor swapped in and ``/health`` says when the served one
fails, and every answered completion is already in the trace store.

A real HTTP server on loopback with the tiny model on the embedded engine; clients are the
official ``openai`` client and aiohttp; the store is read through a connection of its own.
"""

from __future__ import annotations

import copy
import json
import socket

import aiohttp
import pytest
import torch

from verlog.backends.embedded import EmbeddedEngine
from verlog.config import REWARD_MAX_ABS
from verlog.serve import OpenAIServer
from verlog.serve.openai_server import UnservableModelError
from verlog.traces import TraceRecorder, open_store

openai = pytest.importorskip("openai")

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def engine(tiny_model, tiny_tokenizer):
    engine = EmbeddedEngine(tiny_model, tiny_tokenizer, seed=0)
    yield engine
    engine.close()


def _nan_model(model):
    broken = copy.deepcopy(model)
    with torch.no_grad():
        for p in broken.parameters():
            p.fill_(float("nan"))
    return broken


def _huge_model(model):
    """One tensor overwritten with 3e38 (the tiny model's tied embeddings): finite logits, all equal."""
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.get_input_embeddings().weight.fill_(3e38)
    return broken


async def _post(
    session: aiohttp.ClientSession, url: str, body: dict | str | None = None, key: str | None = None
) -> tuple[int, dict]:
    """POST ``body`` (a dict as JSON, a string as it is) with ``key`` as the bearer token."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if isinstance(body, str):
        headers["Content-Type"] = "application/json"
        async with session.post(url, data=body.encode(), headers=headers) as r:
            return r.status, await r.json()
    async with session.post(url, json=body, headers=headers) as r:
        return r.status, await r.json()


async def test_feedback_and_reload_are_closed_without_a_key(engine, tiny_tokenizer, recorder):
    reloads = []

    def reloader():
        reloads.append(1)
        return None, tiny_tokenizer, "tiny"

    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny", recorder=recorder, reloader=reloader) as server:
        assert server.access() == (
            "chat and models: anyone who can connect to 127.0.0.1; feedback: closed (no key); reload: closed (no key)"
        )
        oai = openai.AsyncOpenAI(base_url=server.base_url, api_key="anything", max_retries=0)
        await oai.chat.completions.create(model="tiny", messages=HI, max_tokens=2, user="e1")  # chat stays open
        async with aiohttp.ClientSession() as session:
            for path, body in (("feedback", {"episode_id": "e1", "reward": 1}), ("admin/reload", None)):
                for key in (None, "anything"):
                    status, answer = await _post(session, f"{server.base_url}/{path}", body, key)
                    assert status == 403 and answer["error"]["code"] == "endpoint_closed", answer
                    assert "--admin-key" in answer["error"]["message"]
    assert not reloads and recorder.store.episode("e1").reward is None  # nothing was reloaded or rewarded


async def test_the_admin_key_guards_reload_and_either_key_feedback(engine, tiny_tokenizer, recorder):
    def reloader():
        return None, tiny_tokenizer, "tiny"

    async with OpenAIServer(
        engine,
        tiny_tokenizer,
        model_name="tiny",
        recorder=recorder,
        reloader=reloader,
        api_key="user",
        admin_key="admin",
    ) as server:
        assert server.access() == "chat and models: API key; feedback: API key or admin key; reload: admin key"
        oai = openai.AsyncOpenAI(base_url=server.base_url, api_key="user", max_retries=0)
        await oai.chat.completions.create(model="tiny", messages=HI, max_tokens=2, user="e1")
        async with aiohttp.ClientSession() as session:
            reload, feedback = f"{server.base_url}/admin/reload", f"{server.base_url}/feedback"
            assert (await _post(session, reload, key="user"))[0] == 401  # the API key does not reload
            assert (await _post(session, reload))[0] == 401
            assert (await _post(session, reload, key="admin")) == (
                200,
                {"object": "reload", "version": "tiny", "swapped": False},
            )
            for key in ("user", "admin"):
                assert (await _post(session, feedback, {"episode_id": "e1", "reward": 0.5}, key))[0] == 200
            assert (await _post(session, feedback, {"episode_id": "e1", "reward": 9}))[0] == 401
    assert recorder.store.episode("e1").reward == 0.5
    async with OpenAIServer(
        engine, tiny_tokenizer, model_name="tiny", recorder=recorder, reloader=reloader, api_key="user"
    ) as server:  # no admin key: the API key's holders may reload
        assert server.access() == "chat and models: API key; feedback: API key; reload: API key"
        async with aiohttp.ClientSession() as session:
            assert (await _post(session, f"{server.base_url}/admin/reload", key="user"))[0] == 200


#: feedback bodies that must be refused with a 400 naming the field
BAD_FEEDBACK = [
    ('{"episode_id": "e1", "reward": 1e309}', "reward"),  # parses as inf
    ('{"episode_id": "e1", "reward": -1e309}', "reward"),
    ({"episode_id": "e1", "reward": int("9" * 400)}, "reward"),  # no float holds it
    ({"episode_id": "e1", "reward": -(10**400)}, "reward"),
    ({"episode_id": "e1", "reward": REWARD_MAX_ABS * 10}, "reward"),
    ({"episode_id": "e1", "reward": "1.0"}, "reward"),
    ({"episode_id": "e1", "reward": True}, "reward"),
    ({"episode_id": "e1", "reward": [1]}, "reward"),
    ({"episode_id": "e1", "turn": 10**400, "reward": 1}, "turn"),
    ({"episode_id": "e1", "turn": -1, "reward": 1}, "turn"),
    ({"episode_id": "e\x00", "reward": 1}, "episode_id"),
    ({"episode_id": "", "reward": 1}, "episode_id"),
    ({"episode_id": "x" * 257, "reward": 1}, "episode_id"),
    ({"episode_id": "e1"}, "reward"),  # an outcome without a reward would be trained as 0
    ({"episode_id": "e1", "reward": None, "success": True}, "reward"),
    ({"episode_id": "e1", "turn": 0}, "reward"),
]


async def test_bad_feedback_is_a_400_naming_the_field_and_changes_nothing(engine, tiny_tokenizer, recorder):
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny", recorder=recorder, api_key="k") as server:
        oai = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        await oai.chat.completions.create(model="tiny", messages=HI, max_tokens=2, user="e1")
        async with aiohttp.ClientSession() as session:
            url = f"{server.base_url}/feedback"
            for body, field in BAD_FEEDBACK:
                status, answer = await _post(session, url, body, "k")
                assert status == 400 and answer["error"]["param"] == field, (body, answer)
                assert "\n" not in answer["error"]["message"]
            for raw in (b'{"episode_id": "e1", "reward": NaN}', b'{"episode_id": "e1", "reward": Infinity}'):
                async with session.post(
                    url, data=raw, headers={"Authorization": "Bearer k", "Content-Type": "application/json"}
                ) as r:
                    assert r.status == 400
            assert (await _post(session, url, {"episode_id": "e1", "reward": -REWARD_MAX_ABS}, "k"))[0] == 200
            status, answer = await _post(
                session,
                f"{server.base_url}/chat/completions",  # a chat's episode too
                {"model": "tiny", "messages": HI, "max_tokens": 2, "user": "a\x00b"},
                "k",
            )
            assert status == 400 and answer["error"]["param"] == "user"
        assert not any(code >= 500 for code in server.responses), server.responses
    assert recorder.store.episode("e1").reward == -REWARD_MAX_ABS
    with pytest.raises(ValueError, match="reward must be a finite number"):
        recorder.store.add_feedback("e1", float("nan"))  # the Python call holds the same rule
    with pytest.raises(ValueError, match="feedback needs a reward"):
        recorder.store.add_feedback("e1", None, success=False)  # type: ignore[arg-type]
    record = recorder.store.episode("e1")
    assert (record.reward, record.success) == (-REWARD_MAX_ABS, None)  # the stored outcome is untouched


def _raw_request(port: int, headers: list[tuple[str, str]]) -> int:
    """The status of a GET /v1/models carrying ``headers`` (sent as they are, on a socket; the
    server may answer and hang up before it has read them all)."""
    lines = ["GET /v1/models HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        try:
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        except (BrokenPipeError, ConnectionResetError):  # answered and closed before the rest was read
            pass
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
    return int(data.split(b" ", 2)[1])


async def test_too_many_or_too_large_headers_are_a_431(engine, tiny_tokenizer):
    import asyncio

    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny") as server:
        port = server.port
        flood = [(f"X-Pad-{i}", "a" * 8000) for i in range(120)]  # ~1 MB of headers
        assert await asyncio.to_thread(_raw_request, port, flood) == 431
        assert await asyncio.to_thread(_raw_request, port, [(f"X-N-{i}", "1") for i in range(101)]) == 431
        assert await asyncio.to_thread(_raw_request, port, [("X-Big", "b" * 8000)] * 5) == 431  # 40 kB > 32 KiB
        # ...and those aiohttp's own HTTP parser refuses before the server sees them: 431 too
        assert await asyncio.to_thread(_raw_request, port, [("X-Huge", "h" * (64 << 10))]) == 431  # one 64 kB line
        assert await asyncio.to_thread(_raw_request, port, [(f"X-N-{i}", "1") for i in range(1000)]) == 431
        assert await asyncio.to_thread(_raw_request, port, [("X-Huge", "h" * (1 << 20))]) == 431  # 1 MB
        assert await asyncio.to_thread(_raw_request, port, [(f"X-N-{i}", "1") for i in range(50)]) == 200
        oai = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        assert (await oai.chat.completions.create(model="tiny", messages=HI, max_tokens=2)).choices
        assert not any(code >= 500 for code in server.responses), server.responses


@pytest.mark.parametrize(
    ("broken", "says"), [(_nan_model, "NaN"), (_huge_model, "constant logits")], ids=["nan", "uniform"]
)
async def test_unservable_weights_are_refused_at_start_and_by_reload(tiny_model, tiny_tokenizer, engine, broken, says):
    """Weights that cannot answer (NaN), and weights whose logits are all equal (a tensor set to
    3e38: every logprob finite, every token equally likely), are refused at start and by reload."""
    nan_engine = EmbeddedEngine(broken(tiny_model), tiny_tokenizer, seed=0)
    server = OpenAIServer(nan_engine, tiny_tokenizer, model_name="tiny", check_at_start=True)
    with pytest.raises(UnservableModelError, match=f"model version 'tiny' .*{says}"):
        await server.start()
    await server.stop()

    closed = []

    def reloader():
        fresh = EmbeddedEngine(broken(tiny_model), tiny_tokenizer, seed=0)
        closed.append(fresh)
        return fresh, tiny_tokenizer, "nan-version"

    async with OpenAIServer(
        engine, tiny_tokenizer, model_name="tiny", reloader=reloader, admin_key="a", check_at_start=True
    ) as server:
        async with aiohttp.ClientSession() as session:
            for _ in range(2):  # refused, and refused again: the good version keeps serving
                status, answer = await _post(session, f"{server.base_url}/admin/reload", key="a")
                assert status == 409 and answer["error"]["code"] == "reload_failed", answer
                assert (
                    "nan-version" in answer["error"]["message"] and "still serving 'tiny'" in answer["error"]["message"]
                )
            oai = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
            assert (await oai.chat.completions.create(model="tiny", messages=HI, max_tokens=3)).choices
            async with session.get(f"{server.url}/health") as r:
                assert r.status == 200 and (await r.json())["version"] == "tiny"
        assert server.model_version == "tiny" and all(e._closed for e in closed)
        assert not any(code >= 500 for code in server.responses), server.responses


async def test_health_reports_a_server_that_cannot_answer(tiny_model, tiny_tokenizer, engine):
    nan_engine = EmbeddedEngine(_nan_model(tiny_model), tiny_tokenizer, seed=0)
    async with OpenAIServer(nan_engine, tiny_tokenizer, model_name="tiny") as server:  # no start-up check
        oai = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{server.url}/health") as r:
                assert r.status == 200
            with pytest.raises(openai.InternalServerError):
                await oai.chat.completions.create(model="tiny", messages=HI, max_tokens=3)
            async with session.get(f"{server.url}/health") as r:
                body = await r.json()
                assert r.status == 503 and body["status"] == "failing" and "canary" in body["error"]  # rechecked: still
            await server.swap(engine, "good", close_old=False)
            server.health_recheck_s = 1e9  # no recheck: still failing until something shows otherwise
            async with session.get(f"{server.url}/health") as r:
                assert r.status == 503
            server.health_recheck_s = 0.0
            async with session.get(f"{server.url}/health") as r:  # the canary passes: ok, with no request needed
                assert r.status == 200 and (await r.json())["status"] == "ok"
            assert (await oai.chat.completions.create(model="tiny", messages=HI, max_tokens=3)).choices
    nan_engine.close()


async def test_every_answered_completion_is_already_in_the_store(engine, tiny_tokenizer, recorder, tmp_path):
    """No flush, no wait: what the client was answered, another connection to the store reads."""
    reader = open_store(tmp_path / "traces", create=False)
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny", recorder=recorder, admin_key="a") as server:
        oai = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        for i in range(6):
            stream = i % 2 == 1
            answer = await oai.chat.completions.create(
                model="tiny", messages=HI, max_tokens=3, user=f"d{i}", stream=stream
            )
            if stream:
                _ = [c async for c in answer]
            assert len(reader.turns(f"d{i}")) == 1, i
            async with aiohttp.ClientSession() as session:  # feedback right after: the turn is there
                assert (await _post(session, f"{server.base_url}/feedback", {"episode_id": f"d{i}", "reward": 1}, "a"))[
                    0
                ] == 200
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{server.url}/health") as r:
                assert (await r.json())["recording"] == {"written": 6, "dropped": 0, "late": 0, "durable": True}
    reader.close()


def test_store_and_run_folder_mistakes_are_one_line(tmp_path, capsys):
    from verlog.serve.commands import main
    from verlog.traces import TraceStoreError

    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(TraceStoreError, match="must be a folder"):
        open_store(a_file)
    with pytest.raises(TraceStoreError, match="no trace store at"):
        open_store(tmp_path / "typo", create=False)
    assert not (tmp_path / "typo").exists()  # nothing created

    assert main(["serve-model", "tiny", "--record", str(a_file), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "must be a folder" in err[0] and "cannot serve on" not in err[0], err

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("trainer: {}\n")
    assert main(["serve-model", str(run), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: no checkpoint in {str(run)!r}: this training run has saved none yet (one is written "
        "every trainer.save_every updates)"
    ]
    assert json.loads(json.dumps(err))  # one plain line


async def test_a_store_that_hangs_delays_answers_by_wait_s_at_most(engine, tiny_tokenizer, tmp_path):
    """Another process holds the SQLite store's write lock: the answer goes out after the
    recorder's ``wait_s`` (counted as late), and the turn is written once the lock is released."""
    import asyncio
    import sqlite3

    from verlog.traces import SQLITE_FILE

    store = open_store(tmp_path / "traces")
    recorder = TraceRecorder(store, wait_s=0.5)
    blocker = sqlite3.connect(tmp_path / "traces" / SQLITE_FILE, isolation_level=None)
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny", recorder=recorder) as server:
        oai = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        blocker.execute("BEGIN EXCLUSIVE")
        answer = await oai.chat.completions.create(model="tiny", messages=HI, max_tokens=2, user="held")
        assert answer.choices and recorder.late == 1 and recorder.written == 0  # answered while the lock is held
        blocker.execute("ROLLBACK")
        for _ in range(200):
            if recorder.written:
                break
            await asyncio.sleep(0.05)
    blocker.close()
    recorder.close()
    assert [t.turn_index for t in store.turns("held")] == [0] and recorder.dropped == 0
    store.close()
