"""``LLMServerEngine``: verlog's ``Engine`` interface over verl's ``LLMServerClient``.

Inside verl, the agent loop's model calls go to verl's rollout replicas (SGLang or vLLM servers
that share the actor's weights) through ``LLMServerClient.generate(request_id, prompt_ids=...,
sampling_params=...)``, which returns a ``TokenOutput`` (token ids, one logprob per id, a stop
reason). This adapter is what ``VerlogChatModel`` talks to there: ids in, ids and logprobs out,
nothing re-tokenized.

* Every call of an episode carries the same ``request_id`` (the episode id, prefixed to be unique
  across slots and workers): verl's load balancer sends all of them to one replica, whose prefix
  cache then holds the episode's growing context.
* Logprobs are always requested; a server that returns none, or no token at all, is an
  ``EngineError``: the episode fails (recorded as a failed episode, its turns in the batch being
  collected dropped) and its slot starts another. An empty generation is what verl's SGLang server
  returns when the logprobs it got do not match its tokens, and also an abort before the first
  token; as a turn of no token it would break verl's post-processing (an IndexError) and lose the
  slot's sample for the step.
* A prompt longer than verl's ``rollout.prompt_length`` is refused rather than cut (verl would
  left-truncate it, so the trained prompt would differ from the one the engine saw).
* **Stop strings are applied here**, always: the response ends with the token that completes
  the stop string, as with verlog's other engines. verl starts SGLang with
  ``skip_tokenizer_init: True`` (its default), and SGLang's stop-string check then calls a
  tokenizer it does not have (its scheduler dies), so SGLang is never sent ``stop`` strings: a
  stop string that is exactly one token is sent as a stop token id (the server stops right
  there); a longer one is cut here, and the server generates on until an end of sequence or
  ``max_tokens`` (the extra tokens are dropped; the kept ones and their logprobs are exactly
  what was sampled). vLLM, which verl starts with its tokenizer, is sent the strings as well.
* The sampling seed goes under each server's own name: ``sampling_seed`` for SGLang, ``seed``
  for vLLM (each rejects the other's key).
* **Images** (a vision-language model's prompt, ``images=ImageInputs``) go to the server as verl's
  own agent loops send them: ``image_data``, the prompt's images as RGB ``PIL.Image`` objects in
  prompt order, with the prompt ids exactly as verlog's processor expanded them (verl's loops
  send the processor's expanded ids too). Where verl cannot train image turns, the agent loop
  says why (``images_refused``) and every call with images raises ``EngineError`` with that
  reason before the server sees it: images are never dropped. A response holding the model's
  image placeholder (``image_token_ids``) is an ``EngineError`` too: verl's post-processing
  counts placeholders over the whole row (prompt and response) for its pixel inputs and M-RoPE
  positions, and fails on one without an image.
"""

from __future__ import annotations

import functools
import logging
import uuid
from typing import Any, Callable, Collection

from verlog.backends.base import (
    Engine,
    EngineError,
    FinishReason,
    Generation,
    ImageInputs,
    SamplingParams,
    cut_at_stop,
)

__all__ = ["LLMServerEngine", "finish_reason", "server_images", "single_token_ids"]

logger = logging.getLogger(__name__)

#: stop reasons of verl's servers (SGLang's finish_reason types, vLLM's "completed"/"aborted")
_ABORTED = frozenset({"abort", "aborted"})
#: the ``TokenOutput.extra_fields`` kept on a generation (the weights' version)
_STEP_KEYS = ("global_steps", "min_global_steps", "max_global_steps")


def single_token_ids(tokenizer: Any, stops: tuple[str, ...]) -> tuple[list[int], tuple[str, ...]]:
    """Split stop strings into the ids of those that are exactly one token and the others."""
    ids: list[int] = []
    longer: list[str] = []
    for stop in stops:
        encoded = tokenizer.encode(stop, add_special_tokens=False)
        if len(encoded) == 1 and tokenizer.decode(encoded, skip_special_tokens=False) == stop:
            ids.append(int(encoded[0]))
        else:
            longer.append(stop)
    return ids, tuple(longer)


def server_images(images: ImageInputs) -> list[Any]:
    """A prompt's images as verl's servers take them (``image_data``): RGB ``PIL.Image`` objects
    in prompt order, opened from the very bytes the turn keeps."""
    from verlog.llm.images import open_images

    return open_images(images.images)


def finish_reason(stop_reason: str | None) -> FinishReason:
    """verl's ``TokenOutput.stop_reason`` as a verlog finish reason."""
    if stop_reason == "length":
        return "length"
    if stop_reason in _ABORTED:
        return "abort"
    return "stop"


class LLMServerEngine(Engine):
    """A verlog engine whose generations come from verl's rollout replicas.

    Args:
        client: verl's ``LLMServerClient`` (anything with its ``generate`` coroutine).
        tokenizer: the policy's tokenizer (end-of-sequence id, stop strings).
        request_prefix: prepended to every request id (episode ids are only unique per slot).
        max_prompt_tokens: verl's ``rollout.prompt_length``; longer prompts raise ``EngineError``.
        max_response_tokens: verl's ``rollout.response_length``; ``max_new_tokens`` is capped at it.
        on_output: called with each ``TokenOutput`` (e.g. to note the weights' version).
        server: verl's rollout engine (``actor_rollout_ref.rollout.name``): ``vllm`` gets vLLM's
            keys, anything else SGLang's.
        images_refused: why verl cannot train image turns here (``None``: it can); a call with
            images raises ``EngineError`` with it.
        image_token_ids: the model's image and video placeholder ids (as verl's processor names
            them); a response holding one raises ``EngineError``.
    """

    #: calls with images go to the server as ``image_data`` (unless ``images_refused`` says why not)
    accepts_images = True

    def __init__(
        self,
        client: Any,
        tokenizer: Any,
        *,
        request_prefix: str = "",
        max_prompt_tokens: int | None = None,
        max_response_tokens: int | None = None,
        on_output: Callable[[Any], None] | None = None,
        server: str = "sglang",
        images_refused: str | None = None,
        image_token_ids: Collection[int] = (),
    ):
        self.client = client
        self.server = server
        self.images_refused = images_refused
        self.image_token_ids = frozenset(int(i) for i in image_token_ids)
        self._stop_split: dict[tuple[str, ...], tuple[list[int], tuple[str, ...]]] = {}
        self.tokenizer = tokenizer
        self.request_prefix = request_prefix
        self.max_prompt_tokens = max_prompt_tokens
        self.max_response_tokens = max_response_tokens
        self.on_output = on_output
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_ids = (eos,) if isinstance(eos, int) else ()

    def sampling_params(self, sampling: SamplingParams) -> dict[str, Any]:
        """The ``sampling_params`` dict verl's servers take (SGLang and vLLM both read these keys)."""
        max_tokens = sampling.max_new_tokens
        if self.max_response_tokens is not None:
            max_tokens = min(max_tokens, self.max_response_tokens)
        params: dict[str, Any] = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "repetition_penalty": 1.0,
            "max_new_tokens": max_tokens,
            "logprobs": True,
        }
        stop_ids = set(self.stop_token_ids(sampling))
        if sampling.stop:
            if self.server == "vllm":  # verl's vLLM has its tokenizer
                params["stop"] = list(sampling.stop)
            else:  # SGLang without a tokenizer: single-token stops as ids, the rest cut here
                ids, longer = self._split_stops(tuple(sampling.stop))
                stop_ids.update(ids)
                if longer:
                    _warn_generates_past(longer)
        if stop_ids:
            params["stop_token_ids"] = sorted(stop_ids)
        if sampling.seed is not None:
            params["seed" if self.server == "vllm" else "sampling_seed"] = sampling.seed
        return params

    def _split_stops(self, stops: tuple[str, ...]) -> tuple[list[int], tuple[str, ...]]:
        if stops not in self._stop_split:
            self._stop_split[stops] = single_token_ids(self.tokenizer, stops)
        return self._stop_split[stops]

    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        *,
        request_id: str | None = None,
        images: ImageInputs | None = None,
    ) -> Generation:
        if self.max_prompt_tokens is not None and len(prompt_ids) > self.max_prompt_tokens:
            raise EngineError(
                f"prompt of {len(prompt_ids)} tokens exceeds actor_rollout_ref.rollout.prompt_length="
                f"{self.max_prompt_tokens}; raise it (verl would cut the prompt, so the trained one would "
                "not be the one the model saw)"
            )
        with_images: dict[str, Any] = {}
        if images is not None:
            if self.images_refused is not None:
                raise EngineError(f"this prompt has images, and {self.images_refused}")
            with_images["image_data"] = server_images(images)
        rid = f"{self.request_prefix}{request_id or uuid.uuid4().hex}"
        params = self.sampling_params(sampling)
        try:
            out = await self.client.generate(rid, prompt_ids=list(prompt_ids), sampling_params=params, **with_images)
        except EngineError:
            raise
        except Exception as exc:  # a replica crashed, a Ray call failed...
            raise EngineError(f"verl rollout server failed request {rid}: {type(exc).__name__}: {exc}") from exc
        if self.on_output is not None:
            self.on_output(out)
        if out.log_probs is None:
            raise EngineError(f"verl rollout server returned no logprobs for request {rid}")
        ids, logprobs = list(out.token_ids), [float(x) for x in out.log_probs]
        reason = finish_reason(out.stop_reason)
        if not ids:
            if reason == "abort":
                raise EngineError(f"verl rollout server aborted request {rid} before any token")
            raise EngineError(
                f"verl rollout server returned no token for request {rid} (stop reason {out.stop_reason!r}; "
                "SGLang does so when its logprobs do not match its tokens): the episode fails"
            )
        cut = cut_at_stop(self.tokenizer, ids, tuple(sampling.stop))
        if cut is not None and cut < len(ids):
            ids, logprobs, reason = ids[:cut], logprobs[:cut], "stop"
        placeholders = sorted(self.image_token_ids.intersection(ids))
        if placeholders:
            raise EngineError(
                f"the response to request {rid} holds the model's image placeholder (token id {placeholders[0]}): "
                "verl's post-processing counts placeholders over prompt and response for its pixel inputs and "
                "positions, and fails on one without an image; the episode fails"
            )
        info = {k: v for k, v in (out.extra_fields or {}).items() if k in _STEP_KEYS}
        return Generation(ids, logprobs, reason, info=info)


@functools.lru_cache(maxsize=64)
def _warn_generates_past(stops: tuple[str, ...]) -> None:
    """Say once per set of stop strings that the server will generate past them."""
    logger.warning(
        "stop strings %s are more than one token: verl's SGLang server runs without a tokenizer, so it "
        "generates on until an end of sequence or max_tokens and verlog cuts the response at the stop "
        "(exact, but slower; prefer single-token stops or a small max_tokens)",
        list(stops),
    )
