"""``DemonstrationEngine``: an engine whose answers come from a demonstrator, as the policy's tokens.

The graph runs as in training: its nodes call verlog's chat model, which renders each call with
the **policy's** chat template (tools, images, ``chat_template_kwargs``, a forced tool call's
prefix) and asks this engine. The engine hands the call (:func:`verlog.llm.chat_model.engine_call`:
the messages and tools) to the demonstrator, and returns its answer as the policy would have
written it: the answer's text encoded by the policy's tokenizer (:func:`verlog.tokens.encode_plain`)
followed by the end-of-turn token (unless the call's ``max_tokens`` ends the answer first, as the
policy's own answer would end). So every demonstration turn records exactly the prompt ids the
policy will see and ids the policy can produce; only the ids of the answer may differ from the
teacher's own (another tokenizer's, or another split of the same text).

An answer is refused (the call raises, its episode fails, nothing of it is trained) when it does
not follow the call's grammar (a ``constrain_answers`` regex, a JSON schema, a forced tool call:
checked by replaying the ids through the grammar, as training rebuilds its masks), when it does
not fit the call's ``max_tokens``, or when a forced tool call's answer does not begin with the
prefix the chat model already sent. The logprobs of a demonstration are 0 (not the policy's:
SFT does not read them).
"""

from __future__ import annotations

import asyncio
from typing import Any

from verlog.backends.base import CONSTRAINT_KINDS, Constraint, Engine, Generation, ImageInputs, SamplingParams
from verlog.data.tasks import Task
from verlog.envs.live import live_game
from verlog.llm.chat_model import engine_call
from verlog.sft.demonstrators import DemoCall, DemonstrationError, Demonstrator, answer_text
from verlog.tokens import encode_plain, eos_token_ids

__all__ = ["DemonstrationEngine"]


class DemonstrationEngine(Engine):
    """Answers the graph's model calls with ``demonstrator``'s answers, in ``tokenizer``'s ids.

    Each episode is announced with :meth:`begin` (its id, the chat model's request id, and its task)
    and closed with :meth:`end`. It takes every constraint kind the embedded engine enforces, so
    the chat model plans a call (a forced tool call's prefix, the grammar) as it does in training."""

    constraint_kinds = frozenset(CONSTRAINT_KINDS)
    accepts_images = True

    def __init__(self, demonstrator: Demonstrator, tokenizer: Any, *, end_token_id: int | None = None):
        self.demonstrator = demonstrator
        self.tokenizer = tokenizer
        end = end_token_id if end_token_id is not None else getattr(tokenizer, "eos_token_id", None)
        if not isinstance(end, int):
            raise ValueError("the policy's tokenizer names no end-of-sequence token: a demonstration cannot end a turn")
        self.end_token_id = end
        self.eos_token_ids = tuple(sorted({end, *eos_token_ids(tokenizer)}))
        self._tasks: dict[str, Task] = {}
        self._calls: dict[str, int] = {}
        self._masks: Any = None

    def begin(self, episode_id: str, task: Task) -> None:
        """Episode ``episode_id`` (the request id its calls carry) plays ``task``."""
        self._tasks[episode_id] = task
        self._calls[episode_id] = 0

    def end(self, episode_id: str) -> None:
        self._tasks.pop(episode_id, None)
        self._calls.pop(episode_id, None)
        self.demonstrator.forget(episode_id)

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        *,
        request_id: str | None = None,
        images: ImageInputs | None = None,
    ) -> Generation:
        call = engine_call()
        if call is None or request_id is None or request_id not in self._tasks:
            raise DemonstrationError(
                "a demonstration answers the calls of verlog's chat model in an episode it was told of "
                f"(request {request_id!r}); a call made outside the episode's run cannot be demonstrated"
            )
        index = self._calls[request_id]
        self._calls[request_id] = index + 1
        answer = await self.demonstrator.answer(
            DemoCall(
                messages=call.messages,
                tools=call.tools,
                tool_choice=call.tool_choice,
                constraint=sampling.constraint,
                task=self._tasks[request_id],
                game=live_game(),
                index=index,
                episode_id=request_id,
            )
        )
        text = answer_text(answer)
        prefix = self._forced_prefix(prompt_ids)
        if prefix:
            if not text.startswith(prefix):
                raise DemonstrationError(
                    f"the call forces a tool call, and the demonstrator's answer does not begin with it: {text[:80]!r}"
                )
            text = text[len(prefix) :]
        ids = encode_plain(self.tokenizer, text)
        if len(ids) > sampling.max_new_tokens:
            raise DemonstrationError(
                f"the demonstrator's answer is {len(ids)} tokens of the policy, over the call's max_tokens "
                f"{sampling.max_new_tokens}: {text[:80]!r}"
            )
        # the policy ends its answer with the end token, unless its budget ends first (as a
        # one-token answer's does under max_tokens 1): the demonstration does the same
        finish = "stop" if len(ids) < sampling.max_new_tokens else "length"
        ids = ids + [self.end_token_id] if finish == "stop" else ids
        if sampling.constraint is not None:
            await asyncio.to_thread(self._check_grammar, sampling.constraint, ids, text)
        return Generation(ids, [0.0] * len(ids), finish)

    def _forced_prefix(self, prompt_ids: list[int]) -> str:
        """The answer's start the chat model sent as the end of the prompt (a forced tool call)."""
        call = engine_call()
        if call is None or not call.tools or call.tool_choice is None:
            return ""
        from verlog.llm.constrained import forced_tool_call

        return forced_tool_call(list(call.tools), call.tool_choice, self.constraint_kinds, self.tokenizer).prefix

    def _check_grammar(self, constraint: Constraint, ids: list[int], text: str) -> None:
        if self._masks is None:
            from verlog.train.grammar_masks import ResponseMasks

            self._masks = ResponseMasks(self.tokenizer, len(self.tokenizer), self.eos_token_ids)
        if self._masks.packed(constraint, ids) is None:
            raise DemonstrationError(
                f"the demonstrator's answer {text[:80]!r} does not follow the call's {constraint.kind} constraint "
                f"({constraint.grammar[:120]})"
            )
