"""``ScriptedEngine``: a zero-latency engine that answers with scripted texts.

For testing graphs and for benchmarks that measure everything except the model: each call
returns the next scripted answer (or ``script(prompt_ids)`` if the script is a function),
encoded with the real tokenizer plus the end-of-sequence token, with a fixed logprob per token.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable

from verlog.backends.base import Engine, Generation, SamplingParams


class ScriptedEngine(Engine):
    """Answers from a script instead of a model.

    Args:
        tokenizer: encodes the answers (its eos token ends each one).
        script: answer texts, cycled; or a function ``prompt_ids -> text``.
        logprob: the logprob reported for every token.
    """

    def __init__(
        self,
        tokenizer: Any,
        script: Iterable[str] | Callable[[list[int]], str],
        *,
        logprob: float = -1.0,
    ):
        self.tokenizer = tokenizer
        eos = tokenizer.eos_token_id
        self.eos_token_ids = (eos,) if isinstance(eos, int) else ()
        self._script = script if callable(script) else itertools.cycle(list(script))
        self._logprob = logprob
        self._cache: dict[str, list[int]] = {}
        self.calls: list[list[int]] = []

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, request_id: str | None = None
    ) -> Generation:
        self.calls.append(prompt_ids)
        text = self._script(prompt_ids) if callable(self._script) else next(self._script)
        ids = self._cache.get(text)
        if ids is None:
            ids = self._cache[text] = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        ids = ids[: sampling.max_new_tokens]
        finish = "length"
        if len(ids) < sampling.max_new_tokens and self.eos_token_ids:
            ids = ids + [self.eos_token_ids[0]]
            finish = "stop"
        return Generation(ids, [self._logprob] * len(ids), finish)
