"""Admission in serve-model: large bodies cannot hold what small requests need, and a prompt
surely over the limit is refused without being tokenized whole. Against the real server on
loopback with the tiny model's tokenizer (the benchmark, `benchmarks/serve_load.py --flood`,
measures the latencies)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import aiohttp

from verlog.serve import OpenAIServer, ServerLimits, serve_in_thread
from verlog.serve.admission import PromptBound
from verlog.testing.scripted_engine import ScriptedEngine

SMALL = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


class _MeasuredTokenizer:
    """The tiny tokenizer, counting the characters it tokenizes, and rendering a conversation
    longer than ``slow_over`` characters ``delay_s`` slowly (what a huge prompt costs)."""

    def __init__(self, tokenizer: Any, slow_over: int = 1 << 30, delay_s: float = 0.0):
        self._tokenizer, self.slow_over, self.delay_s = tokenizer, slow_over, delay_s
        self.tokenized_chars = 0
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def __len__(self) -> int:
        return len(self._tokenizer)

    def __call__(self, text: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.tokenized_chars += len(text) if isinstance(text, str) else 0
        return self._tokenizer(text, *args, **kwargs)

    def apply_chat_template(self, conversation: Any, *args: Any, **kwargs: Any) -> Any:
        if sum(len(str(m.get("content", ""))) for m in conversation) > self.slow_over:
            time.sleep(self.delay_s)
        return self._tokenizer.apply_chat_template(conversation, *args, **kwargs)


def _prompt(chars: int) -> str:
    return " ".join(f"room{i % 97} door" for i in range(chars // 10))[:chars]


def test_a_long_prompt_is_refused_having_tokenized_a_bounded_part(tiny_tokenizer):
    tokenizer = _MeasuredTokenizer(tiny_tokenizer)
    limits = ServerLimits(max_prompt_tokens=2000, max_body_bytes=2 << 20)
    server = OpenAIServer(ScriptedEngine(tiny_tokenizer, ["ok"] * 4), tokenizer, model_name="tiny", limits=limits)
    longest = max(len(b) for b in server._token_bytes.vocabulary(len(tiny_tokenizer)))
    assert PromptBound(tiny_tokenizer, 2000).max_token_bytes == 4 * longest  # its NFC may shorten a text
    assert 30_000 < 2000 * 4 * longest  # so the 30k prompt below is counted, not refused from its bytes
    with serve_in_thread(server) as base_url:
        import httpx

        def post(text: str) -> httpx.Response:
            body = {**SMALL, "messages": [{"role": "user", "content": text}]}
            return httpx.post(f"{base_url}/chat/completions", json=body, timeout=60)

        for chars, tokenized in ((900_000, 0), (30_000, PromptBound.CHUNK_CHARS)):  # from its bytes; counted
            tokenizer.tokenized_chars = 0
            answer = post(_prompt(chars))
            assert answer.status_code == 400 and answer.json()["error"]["code"] == "context_length_exceeded"
            assert tokenizer.tokenized_chars <= tokenized, (chars, tokenizer.tokenized_chars)
        # a prompt within the limit is tokenized whole and served, its ids exactly the chat template's
        answer = post(_prompt(1_200))
        assert answer.status_code == 200, answer.text
        ids = tiny_tokenizer.apply_chat_template(
            [{"role": "user", "content": _prompt(1_200)}], tokenize=False, add_generation_prompt=True
        )
        assert answer.json()["usage"]["prompt_tokens"] == len(
            tiny_tokenizer(ids, add_special_tokens=False)["input_ids"]
        )


async def test_large_bodies_do_not_hold_the_small_requests_workers_or_places(tiny_tokenizer):
    # each large body takes 0.3 s to render (twice: measured, then tokenized), and the paced lane
    # rests three times as long after it: two of them keep the large lane busy for ~3 s
    tokenizer = _MeasuredTokenizer(tiny_tokenizer, slow_over=70_000, delay_s=0.3)
    limits = ServerLimits(
        max_prompt_tokens=100_000,
        max_body_bytes=1 << 20,
        large_body_bytes=64 << 10,
        max_large_queue=2,
        max_queue=8,
        max_concurrency=2,
    )
    server = OpenAIServer(ScriptedEngine(tiny_tokenizer, ["ok"] * 100), tokenizer, model_name="tiny", limits=limits)
    large = json.dumps({**SMALL, "messages": [{"role": "user", "content": _prompt(80_000)}]}).encode()
    answered: list[tuple[str, int]] = []  # in the order the answers came
    with serve_in_thread(server):
        url = f"{server.base_url}/chat/completions"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:

            async def post(data: bytes, name: str) -> int:
                async with session.post(url, data=data, headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    answered.append((name, r.status))
                    return r.status

            flood = [asyncio.ensure_future(post(large, "large")) for _ in range(4)]
            await asyncio.sleep(0.5)  # the large lane is full, its first body being rendered
            for _ in range(5):  # one after another, as a user would
                assert await post(json.dumps(SMALL).encode(), "small") == 200
            await asyncio.gather(*flood)
    # the large lane took 2 bodies and refused the 2 beyond it at once (small ones were never refused);
    # every small request was answered before the first large body was
    assert [a for a in answered if a[0] == "large"].count(("large", 429)) == 2
    assert [a for a in answered if a != ("large", 429)] == [("small", 200)] * 5 + [("large", 200)] * 2
