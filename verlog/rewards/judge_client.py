"""How a judge reaches its model: an OpenAI-compatible endpoint, or a LangChain chat model in process.

Both answer one attempt (``complete``) with the answer's text and finish reason, or raise:

* ``RetryableError`` (from :mod:`verlog.backends.http`) — a later attempt may do better: a
  connection error, an attempt timing out, HTTP 5xx or 429 (with the server's ``Retry-After``);
* ``JudgeCallError`` — it will not: any other HTTP 4xx (a wrong model name, a bad API key...), a
  body that is not a chat completion, or the chat model raising.

An endpoint that refuses ``response_format`` (HTTP 400 naming it) is asked again without it, and
the judge's answers are then read leniently; the same for a chat model that cannot enforce one.

An embedded judge's call runs in a fresh ``contextvars`` context with no callbacks: whatever run
it is awaited from (an episode's graph, a trainer with a ``TurnRecorder``), no callback of that
run sees it, so it is never recorded as a training turn. It is also tagged ``NO_TRAIN_TAG``, the
mark every part of verlog reads as "not a training call".
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import aiohttp

from verlog.backends.http import RetryableError, error_text, parse_retry_after, snippet
from verlog.config import ConfigError
from verlog.rollout.recorder import NO_TRAIN_TAG

__all__ = [
    "Answer",
    "ChatModelClient",
    "check_endpoint",
    "EndpointClient",
    "JudgeCallError",
    "JudgeClient",
    "RetryableError",
]

log = logging.getLogger(__name__)


class JudgeCallError(RuntimeError):
    """A judge call failed in a way retrying cannot fix."""


@dataclass(frozen=True)
class Answer:
    """A judge model's reply: its text and why it stopped (``stop``, ``length``...)."""

    text: str
    finish_reason: str | None = None


class JudgeClient(Protocol):
    """One attempt at a judge's answer (see the module docstring for what it raises)."""

    model_id: str

    async def complete(
        self,
        messages: list[dict[str, str]],
        *,
        temperature: float,
        max_tokens: int,
        response_format: dict[str, Any] | None,
        timeout_s: float,
    ) -> Answer: ...


def _refuses_response_format(text: str) -> bool:
    return "response_format" in text or "json_schema" in text


class EndpointClient:
    """``POST {base_url}/chat/completions`` with aiohttp (one session per attempt: no session
    outlives its event loop, and a verdict costs far more than a connection)."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model_id = model
        self.api_key = api_key
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.send_schema = True

    async def complete(
        self,
        messages: list[dict[str, str]],
        *,
        temperature: float,
        max_tokens: int,
        response_format: dict[str, Any] | None,
        timeout_s: float,
    ) -> Answer:
        payload: dict[str, Any] = {
            "model": self.model_id,
            "messages": messages,
            "temperature": temperature,
            "max_tokens": max_tokens,
        }
        if response_format is not None and self.send_schema:
            payload["response_format"] = response_format
        try:
            async with aiohttp.ClientSession(headers=self.headers) as session:
                async with session.post(self.url, json=payload, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                    raw = await resp.read()
                    status, retry_after = resp.status, parse_retry_after(resp.headers.get("Retry-After"))
        except asyncio.TimeoutError:
            raise RetryableError(f"no answer within {timeout_s:.3g} s", timed_out=True) from None
        except aiohttp.ClientError as exc:
            raise RetryableError(f"{type(exc).__name__}: {exc}") from None
        if status >= 500 or status in (408, 429):
            raise RetryableError(f"HTTP {status}: {error_text(raw)}", retry_after_s=retry_after)
        if status >= 400:
            message = error_text(raw)
            if status == 400 and "response_format" in payload and _refuses_response_format(message):
                log.warning(
                    "%s refuses response_format (%s); asking without it and reading answers leniently",
                    self.url,
                    message,
                )
                self.send_schema = False
                return await self.complete(
                    messages, temperature=temperature, max_tokens=max_tokens, response_format=None, timeout_s=timeout_s
                )
            raise JudgeCallError(f"{self.url} rejected the request (HTTP {status}): {message}")
        try:
            choice = json.loads(raw)["choices"][0]
            content = choice["message"].get("content")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise JudgeCallError(
                f"{self.url} answered with something that is not a chat completion: {snippet(raw)!r}"
            ) from None
        return Answer(content if isinstance(content, str) else "", choice.get("finish_reason"))


#: how long the check before the first episode waits for an endpoint's ``GET /models``
CHECK_TIMEOUT_S = 15.0


def check_endpoint(
    base_url: str, model: str, api_key: str | None = None, *, where: str, timeout_s: float = CHECK_TIMEOUT_S
) -> None:
    """Before the first episode: ``GET {base_url}/models`` answers, and names ``model`` when it
    lists models. ``ConfigError`` naming ``where`` (the judge's ``endpoint`` key) otherwise: an
    endpoint that is down or refuses the API key, or a model it does not serve. An endpoint
    without a models list (HTTP 404, or not OpenAI's list format) is only checked reachable.
    Blocking: call it off any event loop that serves the endpoint itself."""
    import urllib.error
    import urllib.request

    url = base_url.rstrip("/") + "/models"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise ConfigError(
                f"{where}.api_key_env: {url} refused the API key (HTTP {exc.code}: {error_text(exc.read())})"
            ) from None
        return  # it answers; it has no models list to check the name against
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConfigError(
            f"{where}.base_url: the judge's endpoint {base_url} does not answer ({reason}); start its "
            "server or fix base_url (checked before the first episode)"
        ) from None
    try:
        served = [str(entry["id"]) for entry in json.loads(raw)["data"]]
    except (ValueError, KeyError, TypeError):
        return
    if model not in served:
        raise ConfigError(
            f"{where}.model: {base_url} does not serve {model!r}; it serves: {', '.join(served) or 'no model'}"
        )


class ChatModelClient:
    """A LangChain chat model called in process (``embedded``), bound to the verdict's schema.

    Args:
        chat_model_for: returns the chat model (called once, at the first verdict: the trainer
            may create its engine after the judges).
        name: what ``embedded`` said (``policy`` or a model path): the model's id in cache keys.
    """

    def __init__(self, chat_model_for: Callable[[str], Any], name: str):
        self._chat_model_for = chat_model_for
        self.model_id = name
        self._model: Any = None
        self.send_schema = True

    @property
    def model(self) -> Any:
        """The chat model (asked for on first use)."""
        if self._model is None:
            try:
                self._model = self._chat_model_for(self.model_id)
            except Exception as exc:
                raise JudgeCallError(f"chat_model_for({self.model_id!r}) raised {type(exc).__name__}: {exc}") from exc
            if not hasattr(self._model, "ainvoke"):
                raise JudgeCallError(
                    f"chat_model_for({self.model_id!r}) returned {type(self._model).__name__}, "
                    "not a LangChain chat model"
                )
        return self._model

    async def complete(
        self,
        messages: list[dict[str, str]],
        *,
        temperature: float,
        max_tokens: int,
        response_format: dict[str, Any] | None,
        timeout_s: float,
    ) -> Answer:
        options: dict[str, Any] = {"temperature": temperature, "max_tokens": max_tokens}
        if response_format is not None and self.send_schema:
            options["response_format"] = response_format
        runnable = self.model.bind(**options)
        call = runnable.ainvoke(messages, config={"callbacks": [], "tags": [NO_TRAIN_TAG], "run_name": "verlog_judge"})
        # a fresh context: no parent run's callbacks (a TurnRecorder) can be inherited
        task = contextvars.Context().run(asyncio.ensure_future, call)
        try:
            message = await asyncio.wait_for(task, timeout_s)
        except asyncio.TimeoutError:
            raise RetryableError(f"no answer within {timeout_s:.3g} s", timed_out=True) from None
        except ValueError as exc:
            if "response_format" in options and _refuses_response_format(str(exc)):
                log.warning(
                    "the %s judge model cannot enforce response_format (%s); reading answers leniently",
                    self.model_id,
                    exc,
                )
                self.send_schema = False
                return await self.complete(
                    messages, temperature=temperature, max_tokens=max_tokens, response_format=None, timeout_s=timeout_s
                )
            raise JudgeCallError(f"the {self.model_id} judge model raised ValueError: {exc}") from exc
        except Exception as exc:
            raise JudgeCallError(f"the {self.model_id} judge model raised {type(exc).__name__}: {exc}") from exc
        metadata = getattr(message, "response_metadata", None) or {}
        content = getattr(message, "content", "")
        if not isinstance(content, str):
            content = "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
        return Answer(content, metadata.get("finish_reason"))
