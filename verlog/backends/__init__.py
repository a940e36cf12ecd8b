"""Inference engines behind one interface: ``await engine.generate(prompt_ids, sampling)``.

* ``EmbeddedEngine`` (``verlog.backends.embedded``): transformers in this process, CPU or one GPU,
  batching concurrent requests.
* ``SGLangEngine`` (``verlog.backends.sglang``): a client of a running SGLang server.
"""

from verlog.backends.base import (
    Engine,
    EngineError,
    EngineTimeoutError,
    Generation,
    SamplingParams,
    TokenDelta,
    run_sync,
)

__all__ = ["Engine", "EngineError", "EngineTimeoutError", "Generation", "SamplingParams", "TokenDelta", "run_sync"]
