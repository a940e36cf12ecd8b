"""``ScriptedEngine``: a zero-latency engine that answers with scripted texts.

For testing graphs and for benchmarks that measure everything except the model: each call
returns the next scripted answer (or ``script(prompt_ids)`` if the script is a function),
encoded with the real tokenizer plus the end-of-sequence token, with a fixed logprob per token.
An answer given as token ids is sent as it is: ids the tokenizer would not make of their text
(one token per character, say), as a sampling model may write them, show a re-tokenized answer.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable, Sequence

from verlog.backends.base import Engine, Generation, SamplingParams


class ScriptedEngine(Engine):
    """Answers from a script instead of a model.

    Args:
        tokenizer: encodes the answers (its eos token ends each one).
        script: answers (texts, or lists of token ids sent as they are), cycled; or a function
            ``prompt_ids -> answer``.
        logprob: the logprob reported for every token.
    """

    def __init__(
        self,
        tokenizer: Any,
        script: Iterable[str | Sequence[int]] | Callable[[list[int]], str | Sequence[int]],
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
        answer = self._script(prompt_ids) if callable(self._script) else next(self._script)
        if isinstance(answer, str):
            ids = self._cache.get(answer)
            if ids is None:
                ids = self._cache[answer] = list(self.tokenizer(answer, add_special_tokens=False)["input_ids"])
        else:
            ids = list(answer)
        ids = ids[: sampling.max_new_tokens]
        finish = "length"
        if len(ids) < sampling.max_new_tokens and self.eos_token_ids:
            ids = ids + [self.eos_token_ids[0]]
            finish = "stop"
        return Generation(ids, [self._logprob] * len(ids), finish)
