"""A chat-completions request turned into an engine call, and the engine's tokens back into an answer.

:class:`CallPlanner` decodes and validates a request body and renders its prompt with the chat
template used in training (:class:`PreparedCall`: prompt ids, prefilled answer text, sampling
settings within the server's limits, the token-mask constraint of a forced tool call or a JSON
format); :class:`TokenStream` yields the engine's tokens as they are chosen; :func:`streamable`
says how much of an answer so far is sure to be in its final content (what a stream may send);
:class:`EventStream` writes a streamed answer's server-sent events.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from verlog.backends.base import Engine, EngineError, Generation, ImageInputs, SamplingParams, TokenDelta
from verlog.llm.chat_model import VerlogChatModel
from verlog.llm.tool_calls import TOOL_CALL_OPEN
from verlog.serve import openai_protocol as proto
from verlog.serve.admission import PromptBound, prompt_too_long
from verlog.serve.limits import ServerLimits
from verlog.serve.openai_protocol import APIError

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["CallPlanner", "EventStream", "PreparedCall", "TokenStream", "held_back", "streamable"]


@dataclass(frozen=True)
class PreparedCall:
    """A validated request, ready for the engine: its prompt ids, the answer text they prefill,
    its sampling settings (constraint included), whether tool calls are parsed."""

    request: proto.ChatCompletionRequest
    prompt_ids: list[int]
    prefix: str
    sampling: SamplingParams
    has_tools: bool
    #: the request's messages as sent (kept for the trace store's ``full`` privacy mode)
    messages: Any = None
    #: the prompt's images (``image_url`` parts, for a vision-language model); ``None``: none
    images: ImageInputs | None = None


class CallPlanner:
    """Requests for ``model_name`` made into engine calls with ``chat_model``'s rendering, held to
    ``limits`` and to the engine's context (``max_context``; ``None``: unbounded).

    ``keep_messages()`` says whether a call keeps the request's messages as sent (the trace
    store's ``full`` privacy mode).
    """

    def __init__(
        self,
        chat_model: VerlogChatModel,
        *,
        model_name: str,
        limits: ServerLimits,
        max_context: int | None,
        keep_messages: Callable[[], bool] = lambda: False,
    ):
        self.chat_model, self.model_name, self.limits = chat_model, model_name, limits
        self.max_context = max_context
        self.max_prompt_tokens = limits.max_prompt_tokens or (max_context - 1 if max_context else None)
        bound = self.max_prompt_tokens
        self._prompt_bound = PromptBound(chat_model.tokenizer, bound) if bound else None
        self._keep_messages = keep_messages

    def unknown_model(self, name: str) -> APIError:
        """The 404 for a request naming another model."""
        return APIError(
            404,
            f"The model '{name}' does not exist on this server; it serves '{self.model_name}' (see GET /v1/models)",
            param="model",
            code="model_not_found",
        )

    def prepare(self, raw: bytes) -> PreparedCall:
        """Decode, validate and render a request body (on a worker thread: its cost grows with
        the body, which must not hold up the event loop); raises :class:`APIError`."""
        body = proto.decode_body(raw, max_messages=self.limits.max_messages)
        req = proto.parse_request(body)
        if req.model != self.model_name:
            raise self.unknown_model(req.model)
        messages = proto.to_langchain_messages(req, images=self.chat_model.processor is not None)
        tools = body["tools"] if req.tools else None  # as sent: the template renders them verbatim
        response_format = req.response_format.model_dump(exclude_none=True) if req.response_format else None
        choice = req.tool_choice.model_dump() if isinstance(req.tool_choice, proto.NamedToolChoice) else req.tool_choice
        try:  # a forced tool call or a JSON response format is held to its schema by a token mask
            if self._prompt_bound is not None:  # a prompt surely too long is refused before it is tokenized whole
                self._prompt_bound.check(
                    self.chat_model.render_prompt_text(messages, tools if choice != "none" else None)
                )
            plan = self.chat_model.plan_call(
                messages, tools, choice, response_format, {"regex": req.regex} if req.regex is not None else None
            )
        except APIError:
            raise
        except ValueError as exc:  # tool_choice naming no offered tool, a format that cannot be had
            param = (
                "messages"
                if "image" in str(exc)
                else "response_format"
                if response_format
                else "regex"
                if req.regex is not None
                else "tool_choice"
            )
            raise APIError(400, str(exc), param=param) from None
        except Exception as exc:  # the chat template refused the conversation (jinja's errors)
            raise APIError(
                400, f"the model's chat template cannot render these messages: {exc}", param="messages"
            ) from None
        sampling = dataclasses.replace(self.sampling(req, len(plan.prompt_ids)), constraint=plan.constraint)
        kept = body["messages"] if self._keep_messages() else None
        return PreparedCall(
            req, plan.prompt_ids, plan.prefix, sampling, bool(tools) and req.tool_choice != "none", kept, plan.images
        )

    def sampling(self, req: proto.ChatCompletionRequest, prompt_tokens: int) -> SamplingParams:
        """The request's sampling settings, its budget held to the limits and the context (400
        for a prompt or a ``max_tokens`` over them)."""
        if self.max_prompt_tokens is not None and prompt_tokens > self.max_prompt_tokens:
            raise prompt_too_long(f"{prompt_tokens} tokens long", self.max_prompt_tokens)
        asked = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        if asked is not None and asked > self.limits.max_tokens_cap:
            raise APIError(
                400,
                f"'{param}' is too large: {asked}; this server allows at most {self.limits.max_tokens_cap}",
                param=param,
            )
        budget = asked if asked is not None else self.limits.default_max_tokens
        if self.max_context is not None and prompt_tokens + budget > self.max_context:
            if asked is not None:
                raise APIError(
                    400,
                    f"the prompt ({prompt_tokens} tokens) plus '{param}' ({asked}) exceeds the "
                    f"model's context of {self.max_context} tokens",
                    param=param,
                    code="context_length_exceeded",
                )
            budget = self.max_context - prompt_tokens
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        options: dict[str, Any] = {"max_tokens": budget}
        for name in ("temperature", "top_p", "top_k", "seed"):
            value = getattr(req, name)
            if value is not None:
                options[name] = value
        try:
            return self.chat_model.sampling_params(stop, **options)
        except ValueError as exc:
            raise APIError(400, str(exc)) from None

    def answer_text(self, generation: Generation, sampling: SamplingParams, prefix: str) -> str:
        """The answer exactly as the model wrote it (forced prefix, no end/stop tokens)."""
        return prefix + self.chat_model.answer_text(
            generation.token_ids, sampling, finished=generation.finish_reason == "stop"
        )


class TokenStream:
    """An engine call whose tokens arrive as they are chosen (``engine.stream``: all at the end
    for engines that cannot report them earlier). Iterate for batches of ``(id, logprob)``; then
    ``generation`` holds the whole generation."""

    def __init__(
        self, engine: Engine, prompt_ids: list[int], sampling: SamplingParams, images: ImageInputs | None = None
    ):
        self._items = engine.stream(prompt_ids, sampling, **({} if images is None else {"images": images}))
        self._generation: Generation | None = None

    @property
    def generation(self) -> Generation:
        if self._generation is None:
            raise EngineError("the engine's stream ended without its generation")
        return self._generation

    async def __aiter__(self) -> AsyncIterator[list[tuple[int, float]]]:
        async for item in self._items:
            if isinstance(item, TokenDelta):
                if item.token_ids:
                    yield list(zip(item.token_ids, item.logprobs))
            else:
                self._generation = item
        _ = self.generation  # raises if the stream ended without one

    async def aclose(self) -> None:
        """Stop the generation (the client went away, the time limit passed)."""
        await self._items.aclose()


def held_back(text: str, markers: list[str]) -> int:
    """Length of the longest end of ``text`` that could be the start of one of ``markers``."""
    held = 0
    for marker in markers:
        for k in range(min(len(marker) - 1, len(text)), held, -1):
            if text.endswith(marker[:k]):
                held = k
                break
    return held


def streamable(text: str, sampling: SamplingParams, has_tools: bool) -> str:
    """The part of the answer so far that is sure to be in the final content."""
    markers = list(sampling.stop)
    for s in sampling.stop:  # a stop string ends the content (the engine stops soon after)
        cut = text.find(s)
        if cut >= 0:
            text = text[:cut]
    if has_tools:
        cut = text.find(TOOL_CALL_OPEN)
        if cut >= 0:
            text = text[:cut]
        markers.append(TOOL_CALL_OPEN)
    text = text[: len(text) - held_back(text, markers)]
    text = text.rstrip("\ufffd")  # an incomplete UTF-8 character
    return text.rstrip() if has_tools else text  # content before a tool call is stripped


class EventStream:
    """A streamed answer's server-sent events (``chat.completion.chunk``s, ``[DONE]``), the tokens
    it has received (``ids``, ``lps``), the content sent so far (``sent``) and how many tokens'
    logprobs were reported (when ``logprobs`` is asked)."""

    def __init__(self, response: "web.StreamResponse", token_bytes: proto.TokenBytes, model: str, *, logprobs: bool):
        self.response, self._token_bytes, self.model = response, token_bytes, model
        self.cid, self.created = proto.completion_id(), proto.now()
        self.logprobs = logprobs
        self.ids: list[int] = []
        self.lps: list[float] = []
        self.sent = ""
        self.reported = 0

    def add(self, batch: list[tuple[int, float]]) -> None:
        """Tokens the engine has chosen, with their logprobs."""
        for token, logprob in batch:
            self.ids.append(token)
            self.lps.append(logprob)

    def unreported(self) -> bool:
        """Whether tokens whose logprobs were asked for are not reported yet."""
        return self.logprobs and self.reported < len(self.ids)

    async def emit(self, payload: dict[str, Any] | str) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
        await self.response.write(f"data: {data}\n\n".encode())

    async def chunk(self, delta: dict[str, Any], *, finish: str | None = None, with_logprobs: bool = False) -> None:
        """One chunk; ``with_logprobs``: carrying the logprobs of the tokens received since the last report."""
        logprobs = None
        if with_logprobs and self.logprobs:
            logprobs = proto.token_logprobs(self._token_bytes, self.ids[self.reported :], self.lps[self.reported :])
            self.reported = len(self.ids)
        await self.emit(proto.chunk(self.cid, self.created, self.model, delta, finish=finish, logprobs=logprobs))

    def usage(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        """The last chunk of ``stream_options.include_usage``: no choices, the usage."""
        return {
            "id": self.cid,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": proto.usage(prompt_tokens, completion_tokens),
        }

    async def done(self) -> None:
        """``[DONE]`` and the end of the response."""
        await self.emit("[DONE]")
        await self.response.write_eof()
