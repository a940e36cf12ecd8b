"""``VerlogChatModel``: a LangChain chat model whose tokens come from a verlog engine.

It is the one place where text becomes token ids and back:

* messages (+ bound tools) are rendered with the tokenizer's chat template and encoded once;
* the engine returns response ids and one logprob per id;
* the ``AIMessage`` carries them in ``response_metadata`` (``prompt_ids``, ``response_ids``,
  ``logprobs``, ``finish_reason``), where verlog's recorder picks them up as a training turn.

Graphs use it like any LangChain chat model: ``invoke``/``ainvoke``, ``bind_tools``, and
``bind(temperature=..., max_tokens=..., stop=[...])`` for per-node sampling settings.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from pydantic import ConfigDict, Field, PrivateAttr

from verlog.backends.base import Engine, Generation, SamplingParams, run_sync
from verlog.llm.prompt import PromptRenderer
from verlog.llm.tool_calls import parse_tool_calls, tool_schemas

#: run-config metadata key under which the episode runner puts the episode id; the chat model
#: sends it as the engine request id so one episode's calls share a replica's prefix cache
EPISODE_ID_KEY = "verlog_episode_id"

_SAMPLING_KWARGS = ("temperature", "top_p", "top_k", "max_tokens", "seed", "stop_token_ids")


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
        self._renderer = PromptRenderer(self.tokenizer, self.chat_template_kwargs)
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

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Offer ``tools`` (LangChain tools, typed functions, pydantic models or OpenAI dicts).

        The schemas are rendered by the chat template; the model's ``<tool_call>`` blocks come
        back as ``tool_calls``. ``tool_choice`` other than ``None``/``"auto"`` cannot be enforced
        on raw token generation and is rejected.
        """
        if tool_choice not in (None, "auto"):
            raise ValueError(
                f"tool_choice={tool_choice!r} is not supported by VerlogChatModel (allowed: None, 'auto')"
            )
        return self.bind(tools=tool_schemas(tools), **kwargs)

    # ----------------------------------------------------------------- generation
    def _sampling(self, stop: list[str] | None, kwargs: dict[str, Any]) -> SamplingParams:
        unknown = set(kwargs) - set(_SAMPLING_KWARGS) - {"tools", "max_new_tokens"}
        if unknown:
            raise TypeError(
                f"VerlogChatModel got unknown call options {sorted(unknown)}; "
                f"allowed: {sorted(_SAMPLING_KWARGS + ('stop', 'tools'))}"
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

    async def _call(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        metadata: dict[str, Any] | None,
        kwargs: dict[str, Any],
    ) -> ChatResult:
        tools = kwargs.get("tools")
        sampling = self._sampling(stop, kwargs)
        prompt_ids = self._renderer.render(messages, tools)
        request_id = (metadata or {}).get(EPISODE_ID_KEY)
        generation = await self.engine.generate(prompt_ids, sampling, request_id=request_id)
        message = self._to_message(prompt_ids, generation, sampling, has_tools=bool(tools))
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _to_message(
        self, prompt_ids: list[int], gen: Generation, sampling: SamplingParams, *, has_tools: bool
    ) -> AIMessage:
        ids = gen.token_ids
        end = len(ids)
        while end and (ids[end - 1] in self._eos_ids or ids[end - 1] in sampling.stop_token_ids):
            end -= 1
        text = self.tokenizer.decode(ids[:end], skip_special_tokens=True)
        if gen.finish_reason == "stop":
            for s in sampling.stop:  # the stop string itself is not part of the answer
                cut = text.find(s)
                if cut >= 0:
                    text = text[:cut]
        parsed = parse_tool_calls(text) if has_tools else None
        metadata = {
            "model_name": self.model_name,
            "prompt_ids": list(prompt_ids),
            "response_ids": list(ids),
            "logprobs": list(gen.logprobs),
            "finish_reason": gen.finish_reason,
        }
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
        return await self._call(messages, stop, run_manager.metadata if run_manager else None, kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return run_sync(self._call(messages, stop, run_manager.metadata if run_manager else None, kwargs))
