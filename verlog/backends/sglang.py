"""A client of a running SGLang server: token ids in, token ids and logprobs out, over HTTP.

verlog talks to SGLang through its native ``POST /generate`` endpoint, never the OpenAI API:
that endpoint takes ``input_ids`` and returns the generated ids (``output_ids``) and one logprob
per generated token (``meta_info.output_token_logprobs``), so nothing is re-tokenized. SGLang
itself need not be importable here (it is CUDA-only); any server that speaks the protocol works,
including :class:`verlog.backends.sglang_server.SGLangCompatServer` in front of another engine.

Protocol notes (SGLang 0.4 - 0.5):

* ``output_ids`` are the raw generated ids, the stop token included (SGLang trims only the
  ``text``). Some older servers return them only when launched with ``--return-token-ids``;
  the ids inside ``output_token_logprobs`` (``[logprob, token_id, text_or_null]``) are then used.
* A ``rid`` must be unique among the requests a server is running ("Duplicate request ID
  detected" is a 400), and a request whose client timed out may still be running when the retry
  arrives. So each call sends ``rid = f"{request_id}_t{n}"`` and each retry appends ``_r{k}``:
  the SGLang router (sgl-model-gateway) strips exactly these suffixes to route every turn of an
  episode to the same worker (with ``--routing-key-override``); the plain ``request_id`` also
  goes out as the ``x-smg-routing-key`` header.
"""

from __future__ import annotations

import itertools
import math
import secrets
from typing import Any, AsyncIterator, Mapping

from verlog.backends.base import (
    EngineError,
    FinishReason,
    Generation,
    SamplingParams,
    TokenDelta,
)
from verlog.backends.http import HTTPEngine

#: header the SGLang router reads a routing key from (besides the body ``rid``)
ROUTING_KEY_HEADER = "x-smg-routing-key"

_FINISH_REASONS: frozenset[str] = frozenset({"stop", "length", "abort"})


class SGLangEngine(HTTPEngine):
    """An :class:`Engine` backed by a running SGLang server (or anything speaking its protocol).

    Safe to call concurrently and from several event loops: each loop gets its own
    ``aiohttp.ClientSession`` (see :class:`~verlog.backends.http.HTTPEngine`, which also does the
    retries). :meth:`stream` uses SGLang's streaming ``/generate`` (``"stream": true``).

    Args:
        base_url: the server's address, e.g. ``"http://127.0.0.1:30000"``.
        timeout_s: the most one HTTP attempt may take, from sending to the full response.
        max_retries: further attempts after a timeout, a connection error, a 5xx or a 429; other
            4xx answers are not retried.
        retry_backoff_s: wait before the first retry, doubled for each further one (capped at
            30 s; a ``Retry-After`` header can lengthen it).
        eos_token_ids: the model's end-of-sequence ids, sent as ``stop_token_ids`` with every
            request (SGLang also stops on the model's own EOS unless told not to).
        api_key: sent as ``Authorization: Bearer ...`` (SGLang's ``--api-key``).
        headers: extra headers for every request.
        max_connections: the most connections open at once per event loop.
    """

    server_name = "SGLang server"

    #: SGLang's ``/generate`` takes a JSON schema (``json_schema``) or a regular expression
    #: (``regex``) among its sampling parameters and enforces it with its grammar backend
    #: (xgrammar by default). Its ``ebnf`` is that backend's dialect, not llguidance's Lark: a
    #: ``lark`` constraint is refused (a forced tool call is then held to the call's JSON schema).
    constraint_kinds = frozenset({"json_schema", "regex"})

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 120.0,
        max_retries: int = 3,
        retry_backoff_s: float = 0.5,
        eos_token_ids: tuple[int, ...] | list[int] = (),
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        max_connections: int = 1024,
    ) -> None:
        super().__init__(
            base_url,
            timeout_s=timeout_s,
            max_retries=max_retries,
            retry_backoff_s=retry_backoff_s,
            api_key=api_key,
            headers=headers,
            max_connections=max_connections,
        )
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        # starts at a random value so two processes sharing a request id still send distinct rids
        self._call_seq = itertools.count(secrets.randbelow(10**9))

    # ------------------------------------------------------------------ generation

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        *,
        request_id: str | None = None,
    ) -> Generation:
        """Send one ``/generate`` request (retrying transient failures) and parse the answer."""
        body, headers = self._request(prompt_ids, sampling, request_id, stream=False)
        answer = await self.post_json("/generate", body, headers=headers)
        return parse_generate_response(answer, url=self.base_url + "/generate")

    async def stream(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        *,
        request_id: str | None = None,
    ) -> AsyncIterator[TokenDelta | Generation]:
        """Tokens as the server streams them (see :meth:`Engine.stream`), then the whole generation.

        SGLang's streamed chunks carry the ids and logprobs generated so far (or, with
        ``--incremental-streaming-output``, only the new ones: both are understood, told apart by
        ``meta_info.completion_tokens``); the last chunk's ``meta_info`` is the generation's info.
        """
        body, headers = self._request(prompt_ids, sampling, request_id, stream=True)
        url = self.base_url + "/generate"
        ids: list[int] = []
        logprobs: list[float] = []
        last: dict[str, Any] | None = None
        async for chunk in self.post_events("/generate", body, headers=headers):
            new_ids, new_logprobs = _new_tokens(chunk, len(ids), url)
            ids += new_ids
            logprobs += new_logprobs
            last = chunk
            if new_ids:
                yield TokenDelta(new_ids, new_logprobs)
        if last is None:
            raise EngineError(f"the streamed /generate answer from {url} held no chunk")
        meta = last.get("meta_info") or {}
        finish = _parse_finish_reason(
            meta.get("finish_reason"),
            lambda problem: EngineError(
                f"malformed streamed /generate answer from {url}: {problem} (in the last chunk)"
            ),
        )
        yield Generation(ids, logprobs, finish, info=meta)

    def _request(
        self, prompt_ids: list[int], sampling: SamplingParams, request_id: str | None, *, stream: bool
    ) -> tuple[Any, dict[str, str]]:
        """The body of each attempt (a fresh ``rid`` per retry) and the routing headers."""
        payload = self.build_payload(prompt_ids, sampling)
        payload["stream"] = stream
        headers = {ROUTING_KEY_HEADER: request_id} if _is_header_safe(request_id) else {}
        rid = f"{request_id}_t{next(self._call_seq)}" if request_id else None

        def body(attempt: int) -> dict[str, Any]:
            if rid is None:
                return payload
            return {**payload, "rid": rid if attempt == 0 else f"{rid}_r{attempt}"}

        return body, headers

    def build_payload(self, prompt_ids: list[int], sampling: SamplingParams) -> dict[str, Any]:
        """The ``/generate`` body for one prompt (without ``rid``, which is set per attempt)."""
        params: dict[str, Any] = {
            # SGLang turns temperature 0 into greedy decoding (top_k = 1) itself
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,  # -1 = the whole vocabulary, as in SGLang
            "max_new_tokens": sampling.max_new_tokens,
        }
        if sampling.stop:
            params["stop"] = list(sampling.stop)
        stop_ids = self.stop_token_ids(sampling)
        if stop_ids:
            params["stop_token_ids"] = stop_ids
        if sampling.seed is not None:
            params["sampling_seed"] = sampling.seed
        if sampling.constraint is not None:  # checked against constraint_kinds before this
            params[sampling.constraint.kind] = sampling.constraint.grammar
        return {
            "input_ids": [int(t) for t in prompt_ids],
            "sampling_params": params,
            "return_logprob": True,
            # -1: logprobs of the generated tokens only, none for the prompt
            "logprob_start_len": -1,
            "stream": False,
        }

    # ------------------------------------------------------------------ health

    async def health(self, *, generate: bool = False, timeout_s: float = 5.0) -> bool:
        """Whether the server answers ``GET /health`` (``/health_generate`` with ``generate``).

        ``/health`` answers 503 while SGLang is still loading; ``/health_generate`` runs a
        one-token generation, so it also proves the scheduler and GPU are working.
        """
        return await self.get_ok("/health_generate" if generate else "/health", timeout_s=timeout_s)

    async def wait_until_ready(
        self, timeout: float = 300.0, *, poll_interval_s: float = 0.5, generate: bool = False
    ) -> None:
        """Poll :meth:`health` until it is true; :class:`EngineTimeoutError` after ``timeout`` s."""
        await self.wait_until_ok(
            "/health_generate" if generate else "/health",
            timeout,
            poll_interval_s=poll_interval_s,
            hint="; is it running, and has it finished loading the model?",
        )

    async def __aenter__(self) -> SGLangEngine:
        return self


def _new_tokens(chunk: Any, have: int, url: str) -> tuple[list[int], list[float]]:
    """The ids and logprobs a streamed chunk adds to the ``have`` tokens received before it."""

    def bad(problem: str) -> EngineError:
        return EngineError(f"malformed streamed /generate answer from {url}: {problem}")

    if not isinstance(chunk, dict) or not isinstance(chunk.get("meta_info"), dict):
        raise bad("a chunk without a 'meta_info' object")
    meta = chunk["meta_info"]
    total = meta.get("completion_tokens")
    entries = meta.get("output_token_logprobs")
    if not _is_int(total) or not isinstance(entries, list):
        raise bad("a chunk without 'meta_info.completion_tokens' or 'meta_info.output_token_logprobs'")
    generation = parse_generate_response(
        {**chunk, "meta_info": {**meta, "finish_reason": meta.get("finish_reason") or "length"}}, url=url
    )
    ids, logprobs = generation.token_ids, generation.logprobs
    if len(ids) == total:  # cumulative (SGLang's default): the tokens so far
        if total < have:
            raise bad(f"a chunk holds {total} tokens, fewer than the {have} streamed before it")
        return ids[have:], logprobs[have:]
    if have + len(ids) == total:  # incremental: only the new tokens
        return ids, logprobs
    raise bad(f"a chunk holds {len(ids)} tokens after {have}, but says {total} were generated")


# ---------------------------------------------------------------------- response parsing


def parse_generate_response(body: Any, *, url: str = "the SGLang server") -> Generation:
    """Turn one non-streaming ``/generate`` answer into a :class:`Generation`.

    Checks what training relies on and raises :class:`EngineError` naming the problem otherwise:
    one finite logprob per generated token, and the same ids in ``output_ids`` and in
    ``output_token_logprobs``. ``Generation.info`` is the server's ``meta_info``, as sent.
    """

    def bad(problem: str) -> EngineError:
        return EngineError(f"malformed /generate response from {url}: {problem}")

    if not isinstance(body, dict):
        raise bad(f"expected a JSON object, got {type(body).__name__}")
    meta = body.get("meta_info")
    if not isinstance(meta, dict):
        raise bad("no 'meta_info' object")
    finish_reason = _parse_finish_reason(meta.get("finish_reason"), bad)

    entries = meta.get("output_token_logprobs")
    if entries is None:
        raise bad("no 'meta_info.output_token_logprobs' (was return_logprob dropped?)")
    if not isinstance(entries, list):
        raise bad("'meta_info.output_token_logprobs' is not a list")
    logprobs: list[float] = []
    lp_ids: list[int] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, (list, tuple)) or len(entry) < 2:
            raise bad(f"output_token_logprobs[{i}] is {entry!r}, not [logprob, token_id, ...]")
        logprob, token_id = entry[0], entry[1]
        if not _is_number(logprob) or not math.isfinite(logprob) or logprob > 1e-4:
            raise bad(f"output_token_logprobs[{i}] has logprob {logprob!r} (null means NaN)")
        if not _is_int(token_id):
            raise bad(f"output_token_logprobs[{i}] has token id {token_id!r}")
        logprobs.append(float(logprob))
        lp_ids.append(int(token_id))

    output_ids = body.get("output_ids")
    if output_ids is None:
        token_ids = lp_ids
    else:
        if not isinstance(output_ids, list) or not all(_is_int(t) for t in output_ids):
            raise bad("'output_ids' is not a list of token ids")
        token_ids = [int(t) for t in output_ids]
        if token_ids != lp_ids:
            raise bad(
                f"'output_ids' ({len(token_ids)} ids) disagree with the ids in "
                f"output_token_logprobs ({len(lp_ids)} ids), first difference at index "
                f"{_first_difference(token_ids, lp_ids)}"
            )
    return Generation(token_ids, logprobs, finish_reason, info=meta)


def _parse_finish_reason(raw: Any, bad: Any) -> FinishReason:
    kind = raw.get("type") if isinstance(raw, dict) else raw
    if kind not in _FINISH_REASONS:
        raise bad(f"unknown finish_reason {raw!r}")
    return kind  # type: ignore[return-value]


def _is_header_safe(value: str | None) -> bool:
    """Whether ``value`` can go out as a routing-key header (the router takes <= 128 bytes)."""
    return value is not None and 0 < len(value) <= 128 and value.isascii() and value.isprintable()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
