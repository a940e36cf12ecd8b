"""``VerlogChatModel``: a LangChain chat model whose tokens come from a verlog engine.

It is the one place where text becomes token ids and back:

* messages (+ bound tools) are rendered with the tokenizer's chat template and encoded once;
* the engine returns response ids and one logprob per id;
* the ``AIMessage`` carries them in ``response_metadata`` (``prompt_ids``, ``response_ids``,
  ``logprobs``, ``finish_reason`` and the ``sampling`` they were drawn with), where verlog's
  recorder picks them up as a training turn.

Graphs use it like any LangChain chat model: ``invoke``/``ainvoke``, ``stream``/``astream``,
``batch``/``abatch``, ``bind_tools``, and ``bind(temperature=..., max_tokens=..., stop=[...])``
for per-node sampling settings.

Every engine request is made knowing its call: the request id is the episode id of the run's
metadata (:data:`EPISODE_ID_KEY`), and while the engine answers, :func:`engine_call_run` is the
LangChain run id of the call (the one its callbacks saw start), so an engine that gates calls
(the training runner) matches each request to its recorded call, however LangChain invoked the
model. (langchain-core calls ``_stream``/``_astream`` without their run: ``stream``, ``astream``
and the generate path hand it over as a call option.) A call with no ``seed`` of its own samples
with the seed its episode's recorder named for it, if any (:mod:`verlog.llm.call_seeds`): the
same episode draws the same tokens whatever else the engine is answering.

``tool_choice`` ("required", or a tool's name) is honoured by prefilling the answer with the
opening of a Hermes tool call (``<tool_call>`` and, for a named tool, its name): those forced
tokens are sent to the engine as the end of the prompt, so ``prompt_ids`` stay exactly what the
engine saw and ``response_ids`` exactly what it generated. On an engine that enforces
constraints (the embedded one) the rest of the call is held to the tools' schemas by a token
mask, and ``response_format`` (OpenAI's ``json_schema`` / ``json_object``, bound with
``bind(response_format=...)``) holds the answer to a JSON schema: see :mod:`verlog.llm.constrained`.
``with_structured_output`` supports the methods ``function_calling`` (the default),
``json_schema`` and ``json_mode``. ``bind(extra_body={"regex": pattern})`` holds the answer to a
regular expression, as SGLang's OpenAI server reads that ``extra_body`` (so the same graph code
constrains a ``ChatOpenAI`` pointed at SGLang). A constrained answer's logprobs are those of the masked
distribution it was sampled from (``response_metadata["sampling"]["constraint"]`` names the
constraint's kind); an unconstrained call is never masked.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import uuid
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterator, Sequence
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.base import LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig, ensure_config
from langchain_core.tools import BaseTool
from pydantic import ConfigDict, Field, PrivateAttr

from verlog.backends.base import (
    Constraint,
    Engine,
    Generation,
    ImageInputs,
    SamplingParams,
    check_sync_call,
    run_sync,
)
from verlog.llm.call_seeds import call_seed_of
from verlog.llm.constrained import (
    extra_body_constraint,
    forced_tool_call,
    response_format_constraint,
    structured_output,
)
from verlog.llm.metadata import SamplingMetadata, TokenMetadata
from verlog.llm.prompt import PromptRenderer
from verlog.llm.streaming import TextReleaser, last_chunk
from verlog.llm.tool_calls import parse_tool_calls, tool_schemas
from verlog.tokens import encode_plain

#: run-config metadata key under which the episode runner puts the episode id; the chat model
#: sends it as the engine request id so one episode's calls share a replica's prefix cache
EPISODE_ID_KEY = "verlog_episode_id"

#: the call option that tells ``_stream``/``_astream`` (which LangChain calls without their run
#: manager) the run id of their call; taken out before the options reach the engine or a cache key
_RUN_ID_OPTION = "verlog_run_id"


@dataclass(frozen=True)
class EngineCall:
    """The ``VerlogChatModel`` call an engine request answers, as LangChain made it: its run id,
    the messages and the tools it was given (OpenAI schemas, ``None``: no tools), and its
    ``tool_choice`` as :func:`normalize_tool_choice` reads it. An engine that answers from the
    conversation rather than from token ids (a demonstrator: :mod:`verlog.sft.engine`) reads it."""

    run_id: UUID | None
    messages: tuple[BaseMessage, ...] = ()
    tools: tuple[dict[str, Any], ...] | None = None
    tool_choice: str | None = None


_ENGINE_CALL: ContextVar[EngineCall | None] = ContextVar("verlog_engine_call", default=None)


def engine_call() -> EngineCall | None:
    """The ``VerlogChatModel`` call whose engine request is being answered (read by an engine
    inside ``generate``/``stream``; ``None`` for requests made otherwise)."""
    return _ENGINE_CALL.get()


def engine_call_run() -> UUID | None:
    """The LangChain run id of the ``VerlogChatModel`` call whose engine request is being
    answered (read by an engine inside ``generate``/``stream``; ``None`` for other requests)."""
    call = _ENGINE_CALL.get()
    return call.run_id if call is not None else None


@contextlib.contextmanager
def _engine_call(call: EngineCall) -> Iterator[None]:
    token = _ENGINE_CALL.set(call)
    try:
        yield
    finally:
        _ENGINE_CALL.reset(token)


_SAMPLING_KWARGS = ("temperature", "top_p", "top_k", "max_tokens", "seed", "stop_token_ids")
#: call options that shape the answer rather than the sampling (``extra_body``: SGLang's ``regex``)
_CALL_KWARGS = ("tools", "tool_choice", "response_format", "extra_body")


@dataclass(frozen=True)
class CallPlan:
    """What one call sends the engine, beyond the sampling settings.

    ``prompt_ids`` end with the ids of ``prefix`` (the prefilled start of the answer, non-empty
    when a tool call is forced); ``constraint`` is the grammar the rest must follow (``None``:
    unconstrained); ``has_tools`` says whether tools are offered (their calls are parsed);
    ``images`` are the prompt's images (``None``: a text prompt)."""

    prompt_ids: list[int]
    prefix: str
    constraint: Constraint | None
    has_tools: bool
    images: ImageInputs | None = None


@dataclass(frozen=True)
class _Request:
    """One call's engine request: its plan, the sampling (with the plan's constraint), and who
    asks (the call's LangChain run id, the episode's request id)."""

    plan: CallPlan
    sampling: SamplingParams
    run_id: UUID | None
    request_id: str | None
    #: the call as LangChain made it (what the engine may read while it answers: ``engine_call``)
    call: EngineCall

    def send(self, call: Callable[..., Any]) -> Any:
        """``call`` (an engine's ``generate`` or ``stream``) made with this request (images only
        where the prompt has some: engines without images take no such option)."""
        with_images = {} if self.plan.images is None else {"images": self.plan.images}
        return call(self.plan.prompt_ids, self.sampling, request_id=self.request_id, **with_images)


def normalize_tool_choice(tool_choice: Any, tool_names: Sequence[str]) -> str | None:
    """A tool choice as ``None`` (the model decides), ``"none"`` (no tools offered),
    ``"required"`` (some tool must be called) or the name of the tool that must be called.

    Accepts LangChain's and OpenAI's spellings: ``None``/``"auto"``/``False``, ``"none"``,
    ``"any"``/``"required"``/``True`` (with a single tool: that tool), a tool name, or
    ``{"type": "function", "function": {"name": ...}}``.
    """
    if tool_choice in (None, "auto", False):
        return None
    if tool_choice == "none":
        return "none"
    if tool_choice in (True, "any", "required"):  # with one tool: that tool
        return tool_names[0] if len(tool_names) == 1 else "required"
    name = tool_choice
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name") if tool_choice.get("type") == "function" else None
    if not isinstance(name, str) or not name:
        raise ValueError(
            f"unsupported tool_choice {tool_choice!r}: expected 'auto', 'none', 'required', 'any', "
            "a tool name or {'type': 'function', 'function': {'name': ...}}"
        )
    if name not in tool_names:
        raise ValueError(f"tool_choice names {name!r}, which is not among the tools {list(tool_names)}")
    return name


class VerlogChatModel(BaseChatModel):
    """A LangChain chat model backed by a verlog ``Engine`` and a Hugging Face tokenizer.

    Example::

        model = VerlogChatModel(engine=engine, tokenizer=tokenizer, temperature=1.0, max_tokens=256)
        answer = await model.bind_tools([add, multiply]).ainvoke(messages)
        answer.response_metadata["response_ids"]  # exactly what the engine produced
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    engine: Engine
    tokenizer: Any = Field(description="a transformers tokenizer with a chat_template")
    processor: Any = Field(
        default=None,
        description="a vision-language model's processor (verlog.models.load_processor): messages may hold images",
    )
    image_transform: Callable[[bytes], bytes] | None = Field(
        default=None,
        description="what a prompt's image files become before the processor sees them (the turn keeps the "
        "result), e.g. verl's process_vision_info (verlog.integrations.verl.vision_info); None: as they are",
    )
    model_name: str = "verlog"
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 256
    stop: list[str] | None = None
    seed: int | None = None

    _renderer: PromptRenderer = PrivateAttr()
    _eos_ids: frozenset[int] = PrivateAttr()

    def model_post_init(self, context: Any) -> None:
        self._renderer = PromptRenderer(self.tokenizer, self.chat_template_kwargs, self.processor, self.image_transform)
        eos = set(self.engine.eos_token_ids)
        for tid in (getattr(self.tokenizer, "eos_token_id", None),):
            if isinstance(tid, int):
                eos.add(tid)
        self._eos_ids = frozenset(eos)

    @property
    def _llm_type(self) -> str:
        return "verlog"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "max_tokens": self.max_tokens,
        }

    # ----------------------------------------------------------------- public helpers
    def render_prompt_ids(self, messages: Sequence[BaseMessage], tools: list[dict] | None = None) -> list[int]:
        """The prompt ids this model would send the engine for ``messages``."""
        return self._renderer.render(messages, tools)

    def render_prompt_text(self, messages: Sequence[BaseMessage], tools: list[dict] | None = None) -> str:
        """The prompt this model would render for ``messages``, as text (before tokenization; an
        image is its placeholder, before the processor expands it)."""
        return self._renderer.render_text(messages, tools, images=[])

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | bool | dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Offer ``tools`` (LangChain tools, typed functions, pydantic models or OpenAI dicts).

        The schemas are rendered by the chat template; the model's ``<tool_call>`` blocks come
        back as ``tool_calls``. ``tool_choice``: ``None``/``"auto"`` (the model decides),
        ``"none"`` (the tools are not offered), ``"any"``/``"required"`` (the answer starts with
        ``<tool_call>``) or a tool's name (the answer starts with a call of that tool).
        """
        schemas = tool_schemas(tools)
        choice = normalize_tool_choice(tool_choice, [s["function"]["name"] for s in schemas])
        if choice == "none":
            return self.bind(**kwargs)
        if choice is not None:
            kwargs["tool_choice"] = choice
        return self.bind(tools=schemas, **kwargs)

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "verlog"
        model = kwargs.get("model")
        params["ls_model_name"] = model if isinstance(model, str) else self.model_name
        return params

    def sampling_params(self, stop: list[str] | None = None, **kwargs: Any) -> SamplingParams:
        """The engine's sampling settings for a call with these options (the model's defaults
        filled in); unknown options raise ``TypeError``."""
        return self._sampling(stop, kwargs)

    def prompt_for(
        self, messages: Sequence[BaseMessage], tools: list[dict] | None = None, tool_choice: Any = None
    ) -> tuple[list[int], str]:
        """The ids to send the engine for a call, and the answer text they prefill (non-empty
        only when ``tool_choice`` forces a tool call: the prefill's ids end the prompt).
        ``tool_choice="none"`` renders the prompt without the tools."""
        plan = self.plan_call(messages, tools, tool_choice)
        return plan.prompt_ids, plan.prefix

    def plan_call(
        self,
        messages: Sequence[BaseMessage],
        tools: list[dict] | None = None,
        tool_choice: Any = None,
        response_format: Any = None,
        extra_body: Any = None,
    ) -> CallPlan:
        """The prompt ids, prefill and constraint of a call (see :class:`CallPlan`).

        A forced tool call (``tool_choice`` "required"/"any"/a name), a JSON ``response_format``
        and an ``extra_body`` regex (SGLang's ``{"regex": ...}``) are constrained when the engine
        enforces constraints; a ``response_format`` or regex on an engine that cannot, or two of
        them together, raise ``ValueError``."""
        choice = normalize_tool_choice(tool_choice, [t["function"]["name"] for t in tools or ()]) if tools else None
        if choice == "none":
            tools = None
        formats = [
            (name, c)
            for name, c in (
                ("response_format", response_format_constraint(response_format)),
                ("extra_body regex", extra_body_constraint(extra_body)),
            )
            if c is not None
        ]
        wanted = formats[0][1] if formats else None
        if wanted is not None:
            if len(formats) > 1:
                raise ValueError("response_format and an extra_body regex cannot be combined: choose one")
            if choice is not None:
                raise ValueError(f"{formats[0][0]} and a forced tool_choice cannot be combined: choose one")
            if wanted.kind not in self.engine.constraint_kinds:
                raise ValueError(
                    f"{formats[0][0]} needs constrained decoding, which {type(self.engine).__name__} does not do "
                    f"(it enforces: {', '.join(sorted(self.engine.constraint_kinds)) or 'no constraints'})"
                )
        prompt_ids, images = self._renderer.render_images(messages, tools)
        if images is not None and not self.engine.accepts_images:
            raise ValueError(
                f"the messages hold images, and {type(self.engine).__name__} does not take images "
                "(the embedded engine does, with a vision-language model)"
            )
        prefix, constraint = "", wanted
        if choice is not None:
            forced = forced_tool_call(tools or [], choice, self.engine.constraint_kinds, self.tokenizer)
            prefix, constraint = forced.prefix, forced.constraint
            prompt_ids += encode_plain(self.tokenizer, prefix)
        return CallPlan(prompt_ids, prefix, constraint, bool(tools), images)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type,
        *,
        include_raw: bool = False,
        method: str = "function_calling",
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable:
        """A runnable returning ``schema``'s object (a pydantic instance, or a dict for a JSON
        schema / TypedDict). ``method``: ``function_calling`` (a forced call of the schema as a
        tool), ``json_schema`` (the answer is JSON under the schema) or ``json_mode`` (any JSON
        object, parsed with the schema). On an engine that enforces constraints the output is
        valid whatever the model (unless ``max_tokens`` runs out first)."""
        if kwargs:
            raise ValueError(f"unexpected with_structured_output arguments {sorted(kwargs)}")
        return structured_output(self, schema, method=method, include_raw=include_raw, strict=strict)

    def to_message(
        self,
        prompt_ids: list[int],
        generation: Generation,
        sampling: SamplingParams,
        *,
        has_tools: bool,
        prefix: str = "",
        images: ImageInputs | None = None,
    ) -> AIMessage:
        """The ``AIMessage`` of an engine's generation, exactly as ``ainvoke`` returns it
        (end-of-sequence and stop text removed, tool calls parsed when tools were offered)."""
        return self._to_message(prompt_ids, generation, sampling, has_tools=has_tools, prefix=prefix, images=images)

    def answer_text(self, token_ids: Sequence[int], sampling: SamplingParams, *, finished: bool) -> str:
        """The visible text of (part of) an answer: trailing end/stop ids dropped, special tokens
        skipped, cut at a stop string once the answer has ``finished`` with reason "stop"."""
        ids = list(token_ids)
        end = len(ids)
        while end and (ids[end - 1] in self._eos_ids or ids[end - 1] in sampling.stop_token_ids):
            end -= 1
        text = self.tokenizer.decode(ids[:end], skip_special_tokens=True)
        if finished:
            for s in sampling.stop:  # the stop string itself is not part of the answer
                cut = text.find(s)
                if cut >= 0:
                    text = text[:cut]
        return text

    # ----------------------------------------------------------------- generation
    def _sampling(self, stop: list[str] | None, kwargs: dict[str, Any]) -> SamplingParams:
        unknown = set(kwargs) - set(_SAMPLING_KWARGS) - set(_CALL_KWARGS) - {"max_new_tokens"}
        if unknown:
            raise TypeError(
                f"VerlogChatModel got unknown call options {sorted(unknown)}; "
                f"allowed: {sorted(_SAMPLING_KWARGS + ('stop',) + _CALL_KWARGS)}"
            )
        stops = stop if stop is not None else self.stop
        return SamplingParams(
            temperature=kwargs.get("temperature", self.temperature),
            top_p=kwargs.get("top_p", self.top_p),
            top_k=kwargs.get("top_k", self.top_k),
            max_new_tokens=kwargs.get("max_tokens", kwargs.get("max_new_tokens", self.max_tokens)),
            stop=tuple(stops or ()),
            stop_token_ids=tuple(kwargs.get("stop_token_ids", ())),
            seed=kwargs.get("seed", self.seed),
        )

    @staticmethod
    def _identify(
        run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None,
        kwargs: dict[str, Any],
    ) -> tuple[UUID | None, str | None]:
        """A call's LangChain run id and episode id (taking the run id out of the call options,
        where ``stream``, ``astream`` and ``_(a)generate_with_cache`` put it). The episode id is
        the run's metadata's, else the enclosing run's (a node's config, when LangChain gives no
        run manager)."""
        given = kwargs.pop(_RUN_ID_OPTION, None)
        metadata = run_manager.metadata if run_manager is not None else None
        episode_id = (metadata or {}).get(EPISODE_ID_KEY) or (ensure_config().get("metadata") or {}).get(EPISODE_ID_KEY)
        return (run_manager.run_id if run_manager is not None else given), episode_id

    def _request(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None,
        kwargs: dict[str, Any],
    ) -> _Request:
        """A call's engine request: its plan, its sampling (with the plan's constraint) and who
        asks. Made in the calling thread: a sync call's text work never runs on the engine's loop."""
        run_id, request_id = self._identify(run_manager, kwargs)
        sampling = self._sampling(stop, kwargs)
        if sampling.seed is None:  # the seed the episode's recorder named for this call, if any
            sampling = dataclasses.replace(sampling, seed=call_seed_of(run_id))
        plan = self.plan_call(
            messages,
            kwargs.get("tools"),
            kwargs.get("tool_choice"),
            kwargs.get("response_format"),
            kwargs.get("extra_body"),
        )
        if plan.constraint is not None:
            sampling = dataclasses.replace(sampling, constraint=plan.constraint)
        tools = kwargs.get("tools")
        choice = (
            normalize_tool_choice(kwargs.get("tool_choice"), [t["function"]["name"] for t in tools]) if tools else None
        )
        call = EngineCall(run_id, tuple(messages), tuple(tools) if tools and choice != "none" else None, choice)
        return _Request(plan, sampling, run_id, request_id, call)

    async def _generation(self, request: _Request) -> Generation:
        """The engine's answer to ``request`` (the one step of a call that needs the engine's loop)."""
        with _engine_call(request.call):
            return await request.send(self.engine.generate)

    def _result(self, request: _Request, generation: Generation) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._answer(request, generation))])

    def _answer(self, request: _Request, generation: Generation) -> AIMessage:
        plan = request.plan
        return self._to_message(
            plan.prompt_ids,
            generation,
            request.sampling,
            has_tools=plan.has_tools,
            prefix=plan.prefix,
            images=plan.images,
        )

    async def _pieces(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None,
        kwargs: dict[str, Any],
    ) -> AsyncIterator[ChatGenerationChunk]:
        """The answer in pieces as the engine chooses tokens (``Engine.stream``); the pieces join
        into exactly the answer ``ainvoke`` returns, token data and tool calls included."""
        request = self._request(messages, stop, run_manager, kwargs)
        sampling, plan = request.sampling, request.plan
        releaser = TextReleaser(
            lambda ids: self.answer_text(ids, sampling, finished=False),
            sampling,
            hold_all=plan.has_tools or bool(plan.prefix),
        )
        async with contextlib.aclosing(request.send(self.engine.stream)) as items:
            with _engine_call(request.call):  # the request is made with the first item
                item = await anext(items, None)
            while item is not None:
                if isinstance(item, Generation):
                    yield ChatGenerationChunk(message=last_chunk(self._answer(request, item), releaser.sent))
                    return
                piece = releaser.push(item.token_ids)
                if piece:
                    yield ChatGenerationChunk(message=AIMessageChunk(content=piece))
                item = await anext(items, None)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        async for chunk in self._pieces(messages, stop, run_manager, kwargs):
            yield chunk

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        """``_astream`` for sync callers: each piece is fetched on the engine's sync loop."""
        loop = self._sync_loop()
        check_sync_call(loop, "stream")
        pieces = self._pieces(messages, stop, run_manager, kwargs)
        try:
            while True:
                try:
                    yield run_sync(pieces.__anext__(), loop)
                except StopAsyncIteration:
                    return
        finally:
            run_sync(pieces.aclose(), loop)

    # ----------------------------------------------------------------- LangChain's entry points
    def stream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> Iterator[AIMessageChunk]:
        """LangChain's ``stream``, telling ``_stream`` the run id of its call."""
        config, kwargs = _with_run_id(config, kwargs)
        yield from super().stream(input, config, stop=stop, **kwargs)

    async def astream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AIMessageChunk]:
        """LangChain's ``astream``, telling ``_astream`` the run id of its call."""
        config, kwargs = _with_run_id(config, kwargs)
        async for chunk in super().astream(input, config, stop=stop, **kwargs):
            yield chunk

    def batch(
        self,
        inputs: list[LanguageModelInput],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[AIMessage]:
        """LangChain's ``batch``, refused at once where it would block the loop its calls need."""
        check_sync_call(self._sync_loop(), "batch")
        return super().batch(inputs, config, return_exceptions=return_exceptions, **kwargs)

    def _generate_with_cache(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        # a callback that wants tokens makes LangChain stream the call through ``_stream``, without its run
        kwargs = {**kwargs, _RUN_ID_OPTION: run_manager.run_id} if run_manager is not None else kwargs
        return super()._generate_with_cache(messages, stop=stop, run_manager=run_manager, **kwargs)

    async def _agenerate_with_cache(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        kwargs = {**kwargs, _RUN_ID_OPTION: run_manager.run_id} if run_manager is not None else kwargs
        return await super()._agenerate_with_cache(messages, stop=stop, run_manager=run_manager, **kwargs)

    def _get_invocation_params(self, stop: list[str] | None = None, **kwargs: Any) -> dict[str, Any]:
        kwargs.pop(_RUN_ID_OPTION, None)  # a call's identity, not one of its settings
        return super()._get_invocation_params(stop=stop, **kwargs)

    def _get_llm_string(self, stop: list[str] | None = None, **kwargs: Any) -> str:
        kwargs.pop(_RUN_ID_OPTION, None)  # (LangChain's cache key)
        return super()._get_llm_string(stop=stop, **kwargs)

    def _to_message(
        self,
        prompt_ids: list[int],
        gen: Generation,
        sampling: SamplingParams,
        *,
        has_tools: bool,
        prefix: str = "",
        images: ImageInputs | None = None,
    ) -> AIMessage:
        ids = gen.token_ids
        text = prefix + self.answer_text(ids, sampling, finished=gen.finish_reason == "stop")
        parsed = parse_tool_calls(text) if has_tools else None
        # what the logprobs were drawn with: training recomputes them at this temperature
        drawn = SamplingMetadata(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
        if sampling.constraint is not None:  # the logprobs are those of the masked distribution
            drawn["constraint"] = sampling.constraint.kind
            drawn["grammar"] = sampling.constraint.grammar
        metadata = TokenMetadata(
            model_name=self.model_name,
            prompt_ids=list(prompt_ids),
            response_ids=list(ids),
            logprobs=list(gen.logprobs),
            finish_reason=gen.finish_reason,
            sampling=drawn,
        )
        if images is not None:
            metadata["images"] = [base64.b64encode(data).decode("ascii") for data in images.images]
        usage = {
            "input_tokens": len(prompt_ids),
            "output_tokens": len(ids),
            "total_tokens": len(prompt_ids) + len(ids),
        }
        if parsed is None:
            return AIMessage(content=text, response_metadata=metadata, usage_metadata=usage)
        return AIMessage(
            content=parsed.content,
            tool_calls=parsed.tool_calls,
            invalid_tool_calls=parsed.invalid_tool_calls,
            response_metadata=metadata,
            usage_metadata=usage,
        )

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        request = self._request(messages, stop, run_manager, kwargs)
        return self._result(request, await self._generation(request))

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        request = self._request(messages, stop, run_manager, kwargs)
        return self._result(request, run_sync(self._generation(request), self._sync_loop()))

    def _sync_loop(self) -> Any:
        """Where sync calls run the engine (:meth:`Engine.sync_loop`)."""
        return self.engine.sync_loop()


def _with_run_id(config: RunnableConfig | None, kwargs: dict[str, Any]) -> tuple[RunnableConfig, dict[str, Any]]:
    """``config`` with the run id its call will have, and the call options carrying it too."""
    run_id = (config or {}).get("run_id") or uuid.uuid4()
    return {**(config or {}), "run_id": run_id}, {**kwargs, _RUN_ID_OPTION: run_id}  # type: ignore[typeddict-item]
