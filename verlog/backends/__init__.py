"""Inference engines behind one interface: ``await engine.generate(prompt_ids, sampling)``.

* ``EmbeddedEngine`` (``verlog.backends.embedded``): transformers in this process, CPU or one GPU,
  batching concurrent requests; its decode step runs on the device (``decode_rows``: sampling,
  stops, grammar masks; ``stop_strings``: stop strings as a token-transition table; ``grammar``:
  llguidance's masks; ``prefix_cache``: KV kept across calls; ``token_bytes``: each token's bytes).
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
