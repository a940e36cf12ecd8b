"""LLM judges (``reward.judges``): a model grades finished episodes, outside the graph.

* ``RubricJudge`` (``kind: rubric``) scores one episode against a rubric: task, transcript,
  optional reference answer (a column of the row) → ``{"explanation", "score": 0..10}`` → a reward
  in [0, 1].
* ``RankingJudge`` (``kind: ranking``) scores the episodes of one group (one task played
  ``trainer.group_size`` times) side by side in a single call, as ART's RULER does: no labels
  needed, and the scores only have to order the group well, which is what a group-relative
  estimator (GRPO) uses.

The judge model is an OpenAI-compatible endpoint (``verlog serve-model``, vLLM, SGLang, OpenAI...)
or a chat model in process (``embedded``: ``policy`` or a model path, given by the trainer's
``chat_model_for``). Either way its answer is asked for as JSON under a schema
(:mod:`verlog.rewards.judge_verdicts`) and read leniently when an endpoint ignores the schema.

Each judge bounds its calls in flight (``concurrency``), gives each verdict ``timeout_s`` in all,
retries connection errors, timeouts, HTTP 5xx and 429 (after ``Retry-After`` when the server says)
and answers that are not a valid verdict (``retries`` times, with exponential backoff; a retry
after an invalid answer samples at a temperature of at least ``RETRY_TEMPERATURE``, since a greedy
judge would repeat itself), and keeps verdicts in a :class:`~verlog.rewards.judge_cache.VerdictCache`
keyed by everything that defines them — identical requests in flight at once share one call. A
judge that gets no verdict raises ``RewardError`` naming it: the episode is failed, not scored 0.

A judge's calls are never training turns: they carry no callbacks and run in a fresh context, so
a ``TurnRecorder`` of the run that awaits them never sees them.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import weakref
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

from langchain_core.language_models import BaseChatModel

from verlog.backends.http import MAX_BACKOFF_S
from verlog.config import ConfigError, JudgeConfig
from verlog.rewards.functions import RewardError
from verlog.rewards.judge_cache import VerdictCache, verdict_key
from verlog.rewards.judge_client import (
    Answer,
    ChatModelClient,
    EndpointClient,
    JudgeCallError,
    JudgeClient,
    RetryableError,
    check_endpoint,
)
from verlog.rewards.judge_prompts import Prompt, ranking_prompt, rubric_prompt, split_task
from verlog.rewards.judge_verdicts import (
    Verdict,
    VerdictError,
    parse_ranking,
    parse_rubric,
    ranking_schema,
    response_format,
    rubric_schema,
)
from verlog.rewards.result import RewardResult, Trajectory
from verlog.rollout.slots import SlotFailureError

__all__ = [
    "RETRY_TEMPERATURE",
    "RankingJudge",
    "RubricJudge",
    "build_judge",
    "explanation_key",
    "judge_cache_path",
    "judge_name",
]

#: a retry after an invalid answer samples at least this hot (a greedy judge would answer the same)
RETRY_TEMPERATURE = 0.7
#: wait before the first retry, doubled for each further one (capped at verlog.backends.http.MAX_BACKOFF_S)
RETRY_BACKOFF_S = 0.5


def judge_name(config: JudgeConfig) -> str:
    """A judge's name in metrics and files: its ``name``, else ``judge_<kind>``."""
    return config.name or f"judge_{config.kind}"


def explanation_key(name: str) -> str:
    """The ``RewardResult.info`` key of judge ``name``'s explanation."""
    return f"explanation/{name}"


def judge_cache_path(cache_dir: Path, name: str) -> Path:
    """Where judge ``name`` keeps its verdicts under a run folder."""
    return Path(cache_dir) / "judges" / f"{name}.jsonl"


class _Judge:
    """What both kinds share: the model client, the cache, the bounded, timed, retried calls."""

    def __init__(self, config: JudgeConfig, *, where: str, client: JudgeClient, cache: VerdictCache | None):
        self.config = config
        self.name = judge_name(config)
        self.weight = config.weight
        self.where = where
        self.client = client
        self.cache = cache
        self.calls = 0  # model calls made (attempts), for logs and tests
        self.failures_in_a_row = 0  # verdicts failed since the last one given
        #: verdicts failed since :meth:`take_failures` was last called, by reason (``RewardError.reason``)
        self.failures: Counter[str] = Counter()
        self._semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )
        self._inflight: dict[str, asyncio.Future] = {}

    @property
    def label(self) -> str:
        """How errors name this judge: ``reward.judges[i] (name)``."""
        return f"{self.where} ({self.name})"

    def check_columns(self, columns: Sequence[str]) -> None:
        """Refuse, before any episode, a ``reference_column`` the rows do not have (``ConfigError``)."""
        column = self.config.reference_column
        if column is not None and column not in columns:
            raise ConfigError(
                f"{self.where}.reference_column: the rows have no column {column!r} "
                f"(their columns: {', '.join(columns) or 'none'})"
            )

    def check_endpoint(self) -> None:
        """Before the first episode: an endpoint judge's server answers and serves its model
        (``ConfigError`` otherwise; an embedded judge has nothing to check)."""
        endpoint = self.config.endpoint
        if endpoint is not None and isinstance(self.client, EndpointClient):
            check_endpoint(endpoint.base_url, endpoint.model, self.client.api_key, where=f"{self.where}.endpoint")

    # ------------------------------------------------------------------ the episode as the judge sees it
    def _reference(self, trajectory: Trajectory) -> str | None:
        column = self.config.reference_column
        if column is None:
            return None
        row = trajectory.row or {}
        if column not in row:
            raise RewardError(
                f"{self.label}: the episode's row has no column {column!r} (reference_column; its "
                f"columns: {', '.join(row) or 'none: the episode played no dataset row'})",
                reason="no_reference",
            )
        value = row[column]
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)

    def _view(self, trajectory: Trajectory) -> tuple[list[Any], list[Any]]:
        """The episode's task and transcript (for a graph state without messages: the row as the
        task and the final state as the transcript)."""
        messages = trajectory.messages
        if messages:
            return split_task(messages)
        row = {k: v for k, v in (trajectory.row or {}).items() if k != self.config.reference_column}
        task = [{"role": "user", "content": json.dumps(row, ensure_ascii=False, default=str)}] if row else []
        state = json.dumps(trajectory.state, ensure_ascii=False, default=str)
        return task, [{"role": "assistant", "content": f"(final state) {state}"}]

    # ------------------------------------------------------------------ calls
    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        semaphore = self._semaphores.get(loop)
        if semaphore is None:
            semaphore = self._semaphores[loop] = asyncio.Semaphore(self.config.concurrency)
        return semaphore

    async def _verdict(self, prompt: Prompt, schema: dict[str, Any], parse: Callable[[str], Any]) -> Any:
        """The parsed verdict for ``prompt``: from the cache, from an identical call in flight,
        or from the model (bounded, timed, retried); then cached."""
        key = verdict_key(
            kind=self.config.kind,
            model=self.client.model_id,
            temperature=self.config.temperature,
            max_tokens=self.config.max_tokens,
            schema=schema,
            messages=prompt.messages,
        )
        loop = asyncio.get_running_loop()
        while True:
            if self.cache is not None and (cached := self.cache.get(key)) is not None:
                return cached
            running = self._inflight.get(key)
            if running is None or running.get_loop() is not loop:
                break
            try:
                return await asyncio.shield(running)
            except asyncio.CancelledError:
                if not running.cancelled():
                    raise  # this caller was cancelled
                # the caller that was asking was cancelled, not this one: ask again
        future = loop.create_future()
        self._inflight[key] = future
        try:
            value = await self._ask(prompt, schema, parse)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            stop = self._count_failure(exc) if isinstance(exc, RewardError) else None
            future.set_exception(stop or exc)
            future.exception()  # marked retrieved: no warning when no other caller shared it
            if stop is not None:
                raise stop from None
            raise
        finally:
            if self._inflight.get(key) is future:
                del self._inflight[key]
        self.failures_in_a_row = 0
        future.set_result(value)
        if self.cache is not None:
            self.cache.put(key, value)
        return value

    def _count_failure(self, error: RewardError) -> SlotFailureError | None:
        """One more verdict failed (its episode fails with ``error``, counted by its reason); at
        ``max_consecutive_failures`` in a row, the ``SlotFailureError`` that stops the run."""
        self.failures[error.reason] += 1
        self.failures_in_a_row += 1
        limit = self.config.max_consecutive_failures
        if self.failures_in_a_row < limit:
            return None
        return SlotFailureError(
            f"{self.label}: {limit} verdicts in a row failed "  # (verdicts under way beside it may add more)
            f"({self.where}.max_consecutive_failures={limit}); last: {error}"
        )

    def take_failures(self) -> dict[str, int]:
        """The verdicts failed since the last call, by reason (the count starts again from 0)."""
        taken, self.failures = dict(self.failures), Counter()
        return taken

    async def _ask(self, prompt: Prompt, schema: dict[str, Any], parse: Callable[[str], Any]) -> Any:
        async with self._semaphore():
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.config.timeout_s
            attempts = self.config.retries + 1
            fmt = response_format(f"verlog_{self.config.kind}_verdict", schema)
            temperature, errors, made, reason = self.config.temperature, [], 0, "unavailable"
            for attempt in range(attempts):
                left = deadline - loop.time()
                made += 1
                self.calls += 1
                try:
                    answer = await self.client.complete(
                        prompt.messages,
                        temperature=temperature,
                        max_tokens=self.config.max_tokens,
                        response_format=fmt,
                        timeout_s=left / (attempts - attempt),
                    )
                    return self._read(answer, parse)
                except JudgeCallError as exc:
                    raise RewardError(f"{self.label}: {exc}", reason="refused") from None
                except VerdictError as exc:
                    errors.append(str(exc))
                    reason = "unparsable"
                    temperature = max(temperature, RETRY_TEMPERATURE)
                    wait = 0.0
                except RetryableError as exc:
                    errors.append(str(exc))
                    reason = "unavailable"
                    # a timed-out attempt has waited its share already; other failures back off
                    wait = (
                        0.0
                        if exc.timed_out
                        else (min(RETRY_BACKOFF_S * 2**attempt, MAX_BACKOFF_S) * (0.5 + random.random() / 2))
                    )
                    if exc.retry_after_s is not None:
                        wait = max(wait, exc.retry_after_s)
                if attempt + 1 < attempts:
                    left = deadline - loop.time()
                    if wait >= left:
                        errors.append(f"the next attempt would start after timeout_s={self.config.timeout_s:g} s")
                        break
                    await asyncio.sleep(wait)
            raise RewardError(
                f"{self.label}: no verdict after {made} attempt{'s' if made != 1 else ''} "
                f"(retries={self.config.retries}, timeout_s={self.config.timeout_s:g}): " + "; ".join(errors[-3:]),
                reason=reason,
            )

    def _read(self, answer: Answer, parse: Callable[[str], Any]) -> Any:
        try:
            return parse(answer.text)
        except VerdictError:
            if answer.finish_reason == "length":
                raise VerdictError(
                    f"the answer was cut at max_tokens={self.config.max_tokens} before the verdict "
                    f"was complete (raise {self.where}.max_tokens or lower explanation_chars)"
                ) from None
            raise


def _verdict_value(verdict: Verdict) -> dict[str, Any]:
    return {"score": verdict.score, "explanation": verdict.explanation}


class RubricJudge(_Judge):
    """``kind: rubric``: one episode scored on its own against the rubric."""

    async def score(self, trajectory: Trajectory) -> RewardResult:
        """The episode's reward in [0, 1] (the judge's 0-10 score / 10); ``info`` holds the
        judge's explanation under ``explanation/<name>``. ``RewardError`` when no verdict comes."""
        task, transcript = self._view(trajectory)
        prompt = rubric_prompt(
            task,
            transcript,
            rubric=self.config.rubric,
            reference=self._reference(trajectory),
            transcript_chars=self.config.transcript_chars,
            explanation_chars=self.config.explanation_chars,
        )
        chars = self.config.explanation_chars
        value = await self._verdict(
            prompt, rubric_schema(chars), lambda text: _verdict_value(parse_rubric(text, chars))
        )
        verdict = Verdict(**value)
        return RewardResult(reward=verdict.reward, info={explanation_key(self.name): verdict.explanation})


class RankingJudge(_Judge):
    """``kind: ranking``: a group's episodes scored relative to each other in one call."""

    async def rank(self, trajectories: Sequence[Trajectory]) -> list[RewardResult]:
        """One result per trajectory, in order: rewards in [0, 1] (each 0-10 score / 10), the
        judge's explanation of each in its ``info``. ``RewardError`` when no verdict comes."""
        trajectories = list(trajectories)
        if not trajectories:
            return []
        views = [self._view(t) for t in trajectories]
        references = {self._reference(t) for t in trajectories}
        reference = next(iter(references)) if len(references) == 1 else None
        if len(references) > 1:
            raise RewardError(
                f"{self.label}: the group's episodes have different reference answers "
                f"({self.config.reference_column}): a ranking judges one task at a time"
            )
        k, chars = len(trajectories), self.config.explanation_chars
        prompt = ranking_prompt(
            [task for task, _ in views],
            [transcript for _, transcript in views],
            rubric=self.config.rubric,
            reference=reference,
            transcript_chars=self.config.transcript_chars,
            explanation_chars=chars,
        )
        values = await self._verdict(
            prompt, ranking_schema(k, chars), lambda text: [_verdict_value(v) for v in parse_ranking(text, k, chars)]
        )
        verdicts = [Verdict(**v) for v in values]
        return [RewardResult(reward=v.reward, info={explanation_key(self.name): v.explanation}) for v in verdicts]


def build_judge(
    config: JudgeConfig,
    *,
    index: int,
    cache_dir: Path | None = None,
    chat_model_for: Callable[[str], BaseChatModel] | None = None,
) -> RubricJudge | RankingJudge:
    """The judge of ``reward.judges[index]``.

    Args:
        config: the entry.
        index: its position (errors name ``reward.judges[index]``).
        cache_dir: the run folder, where verdicts are kept (``judges/<name>.jsonl``); ``None``:
            in memory only. ``cache: false`` keeps none at all, nor does ``embedded: policy``
            (the judge's weights change as it trains).
        chat_model_for: ``chat_model_for(embedded)`` -> the LangChain chat model of an embedded
            judge (``policy`` or a model path); required for ``embedded``.
    """
    where = f"reward.judges[{index}]"
    client: JudgeClient
    if config.endpoint is not None:
        api_key = None
        if config.endpoint.api_key_env:
            api_key = os.environ.get(config.endpoint.api_key_env)
            if not api_key:
                raise ConfigError(
                    f"{where}.endpoint.api_key_env: the environment variable {config.endpoint.api_key_env} is not set"
                )
        client = EndpointClient(config.endpoint.base_url, config.endpoint.model, api_key)
    else:
        assert config.embedded is not None
        if chat_model_for is None:
            raise ConfigError(
                f"{where}.embedded: {config.embedded!r} needs a chat model, which this command does "
                "not provide here; use an endpoint ({base_url, model}) for this judge"
            )
        client = ChatModelClient(chat_model_for, config.embedded)
    cache = None
    if config.cache and config.embedded != "policy":
        cache = VerdictCache(judge_cache_path(cache_dir, judge_name(config)) if cache_dir is not None else None)
    judge_class = RubricJudge if config.kind == "rubric" else RankingJudge
    return judge_class(config, where=where, client=client, cache=cache)
