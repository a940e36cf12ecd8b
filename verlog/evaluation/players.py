"""The model an evaluation plays with: a checkpoint on verlog's engine, or any OpenAI-compatible endpoint.

Both give the graph files a LangChain chat model and nothing else changes:

* :class:`EngineModel` — a training checkpoint (a run folder, a checkpoint folder, LoRA adapters
  merged) or the config's ``model.path``, served by verlog's embedded engine (or the config's
  SGLang engine) through ``VerlogChatModel``;
* :class:`EndpointModel` — LangChain's standard ``ChatOpenAI`` pointed at ``--base-url`` (vLLM,
  SGLang, ``verlog serve-model``, a hosted API), checked with one short request before any
  episode starts so that a wrong URL, key or model name fails at once with one clear line.

Both sample each call with the seed the episode's recorder names for it
(:mod:`verlog.llm.call_seeds`; OpenAI's ``seed`` for an endpoint): an endpoint that honours
``seed`` (``verlog serve-model``, vLLM, SGLang) plays the same episodes on every run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from verlog.config import VerlogConfig
from verlog.evaluation.runner import EvalError
from verlog.evaluation.tasks import EvalTask
from verlog.llm.call_seeds import call_seed_of
from verlog.llm.loop_http import loop_local_async_client

__all__ = ["EndpointModel", "EngineModel", "sampling_of"]

#: where the endpoint's API key is read from when --api-key is not given, in this order
API_KEY_VARS = ("VERLOG_API_KEY", "OPENAI_API_KEY")


def sampling_of(config: VerlogConfig, temperature: float | None, max_tokens: int | None) -> dict[str, Any]:
    """The sampling settings of a config's episodes: the given overrides, else ``eval.temperature``,
    else the config's ``sampling`` section."""
    s = config.sampling
    temp = next(t for t in (temperature, config.eval.temperature, s.temperature) if t is not None)
    return {
        "temperature": temp,
        "max_tokens": max_tokens or s.max_tokens,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "stop": list(s.stop),
    }


class EngineModel:
    """A checkpoint (or ``model.path``) played on the engine of ``config``; load with :meth:`start`."""

    def __init__(
        self,
        config: VerlogConfig,
        checkpoint: str | None,
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
    ):
        from verlog.weights.policy import find_policy

        self.config = config
        # checked here, before anything is written: the same loading as serve-model's
        self.source = find_policy(checkpoint if checkpoint is not None else config.model.path, base=config.model.path)
        self.folder: Path | None = (
            (self.source.checkpoint or self.source.adapter or self.source.model) if checkpoint is not None else None
        )
        self.label = str(self.folder) if self.folder is not None else config.model.path
        self.temperature, self.max_tokens = temperature, max_tokens
        self.engine: Any = None
        self.tokenizer: Any = None

    def sampling(self, config: VerlogConfig) -> dict[str, Any]:
        return {
            **sampling_of(config, self.temperature, self.max_tokens),
            "chat_template_kwargs": config.multi_turn.chat_template_kwargs,
        }

    async def start(self) -> None:
        """Load the policy's weights and start the engine."""
        from verlog.agent import build_engine, pick_device
        from verlog.weights.policy import load_policy

        config = self.config
        model, self.tokenizer = load_policy(
            self.source, dtype=config.model.dtype, device=pick_device(config.model.device)
        )
        self.engine = build_engine(config, self.tokenizer, model)

    def chat_model(self, task: EvalTask) -> Any:
        from verlog.agent import build_chat_model

        s = sampling_of(task.config, self.temperature, self.max_tokens)
        return build_chat_model(task.config, self.engine, self.tokenizer).model_copy(
            update={"temperature": s["temperature"], "max_tokens": s["max_tokens"]}
        )

    async def aclose(self) -> None:
        if self.engine is not None:
            await self.engine.aclose()


class EndpointModel:
    """A model behind an OpenAI-compatible endpoint, called with LangChain's ``ChatOpenAI``."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        timeout_s: float = 300.0,
        max_retries: int = 2,
    ):
        try:
            import langchain_openai  # noqa: F401
        except ImportError:
            raise EvalError("evaluating an endpoint needs langchain-openai: pip install 'verlog[eval]'") from None
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key or next((os.environ[v] for v in API_KEY_VARS if os.environ.get(v)), "EMPTY")
        self.temperature, self.max_tokens = temperature, max_tokens
        self.timeout_s, self.max_retries = timeout_s, max_retries
        #: the endpoint's address is transport, not identity: the same model behind a new port
        #: resumes the same evaluation
        self.label = model
        #: one pool of connections per event loop, shared by every task's model
        self._http = loop_local_async_client()

    def sampling(self, config: VerlogConfig) -> dict[str, Any]:
        s = sampling_of(config, self.temperature, self.max_tokens)
        s.pop("top_k")  # not part of OpenAI's API
        return s

    def _client(self, **settings: Any) -> Any:
        return _seeded_chat_openai()(
            base_url=self.base_url, model=self.model, api_key=self.api_key, http_async_client=self._http, **settings
        )

    def chat_model(self, task: EvalTask) -> Any:
        s = self.sampling(task.config)
        extra: dict[str, Any] = {"stop": s["stop"]} if s["stop"] else {}
        if s["top_p"] != 1.0:
            extra["top_p"] = s["top_p"]
        return self._client(
            temperature=s["temperature"],
            max_tokens=s["max_tokens"],
            timeout=self.timeout_s,
            max_retries=self.max_retries,
            **extra,
        )

    async def start(self) -> None:
        """One short request: fails with :class:`EvalError` when the endpoint cannot serve ``model``."""
        import openai

        where = f"the OpenAI-compatible endpoint {self.base_url}"
        try:
            await self._client(max_tokens=1, timeout=30, max_retries=0).ainvoke("Say OK.")
        except (openai.APIConnectionError, openai.APITimeoutError) as exc:
            cause: BaseException = exc
            while cause.__cause__ is not None or cause.__context__ is not None:  # the root: refused, DNS ...
                cause = cause.__cause__ or cause.__context__  # type: ignore[assignment]
            raise EvalError(
                f"cannot reach {where} ({type(cause).__name__}: {cause}); is the server running, and "
                "does the URL end with /v1?"
            ) from None
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise EvalError(
                f"{where} refused the API key (HTTP {exc.status_code}): pass --api-key or set "
                f"${' or $'.join(API_KEY_VARS)}"
            ) from None
        except openai.NotFoundError:
            raise EvalError(
                f"{where} answered 404 for model {self.model!r}: check --model, and that the URL ends with /v1"
            ) from None
        except openai.APIStatusError as exc:
            raise EvalError(
                f"{where} answered HTTP {exc.status_code} to a test request for model {self.model!r}: {exc.message}"
            ) from None

    async def aclose(self) -> None:
        return None


_SEEDED: type | None = None


def _seeded_chat_openai() -> type:
    """``ChatOpenAI`` sending each call the seed its episode's recorder named for it (OpenAI's
    ``seed``), unless the call or the model gives one: through ``invoke``, ``ainvoke``, ``batch``,
    ``abatch``, ``stream`` and ``astream`` alike (LangChain runs ``_stream``/``_astream`` without
    their run: ``stream`` and ``astream`` hand its id over as a call option, as
    ``VerlogChatModel``'s do)."""
    global _SEEDED
    if _SEEDED is None:
        from langchain_openai import ChatOpenAI

        from verlog.llm.chat_model import _RUN_ID_OPTION, _with_run_id

        class SeededChatOpenAI(ChatOpenAI):  # type: ignore[misc, valid-type]
            def _seeded(self, run_manager: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
                kwargs = dict(kwargs)
                given = kwargs.pop(_RUN_ID_OPTION, None)
                if self.seed is None and kwargs.get("seed") is None:
                    seed = call_seed_of(run_manager.run_id if run_manager is not None else given)
                    if seed is not None:
                        kwargs["seed"] = seed
                return kwargs

            def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
                kwargs = self._seeded(run_manager, kwargs)
                return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)

            async def _agenerate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
                kwargs = self._seeded(run_manager, kwargs)
                return await super()._agenerate(messages, stop=stop, run_manager=run_manager, **kwargs)

            def _stream(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
                kwargs = self._seeded(run_manager, kwargs)
                yield from super()._stream(messages, stop=stop, run_manager=run_manager, **kwargs)

            async def _astream(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
                kwargs = self._seeded(run_manager, kwargs)
                async for chunk in super()._astream(messages, stop=stop, run_manager=run_manager, **kwargs):
                    yield chunk

            def stream(self, input: Any, config: Any = None, *, stop: Any = None, **kwargs: Any) -> Any:
                config, kwargs = _with_run_id(config, kwargs)
                yield from super().stream(input, config, stop=stop, **kwargs)

            async def astream(self, input: Any, config: Any = None, *, stop: Any = None, **kwargs: Any) -> Any:
                config, kwargs = _with_run_id(config, kwargs)
                async for chunk in super().astream(input, config, stop=stop, **kwargs):
                    yield chunk

            def _get_invocation_params(self, stop: Any = None, **kwargs: Any) -> dict[str, Any]:
                kwargs.pop(_RUN_ID_OPTION, None)  # a call's identity, not one of its settings
                return super()._get_invocation_params(stop=stop, **kwargs)

            def _get_llm_string(self, stop: Any = None, **kwargs: Any) -> str:
                kwargs.pop(_RUN_ID_OPTION, None)  # (LangChain's cache key)
                return super()._get_llm_string(stop=stop, **kwargs)

        _SEEDED = SeededChatOpenAI
    return _SEEDED
