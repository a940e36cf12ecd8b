"""What verlog's chat model attaches to each answer, and the recorder reads back: the typed
``AIMessage.response_metadata`` of one model call.

:class:`TokenMetadata` is the contract between :class:`verlog.llm.VerlogChatModel` (which writes it)
and :class:`verlog.rollout.recorder.TurnRecorder` (which turns it into a training ``Turn``): the ids
exactly as the engine saw and produced them, one logprob per response id, and the sampling they
were drawn with. A call whose message lacks the token keys (:data:`TOKEN_KEYS`) is another chat
model's: the recorder counts it as uncaptured.
"""

from __future__ import annotations

from typing import Any, Mapping, TypedDict

__all__ = ["TOKEN_KEYS", "SamplingMetadata", "TokenMetadata", "has_tokens"]


class SamplingMetadata(TypedDict, total=False):
    """The sampling a response was drawn with (training recomputes logprobs at its temperature).
    ``constraint`` names the grammar kind the response was sampled under (its logprobs are then
    those of the masked distribution) and ``grammar`` is the grammar itself (training rebuilds
    the masks from it); both absent when unconstrained."""

    temperature: float
    top_p: float
    top_k: int
    constraint: str
    grammar: str


class TokenMetadata(TypedDict, total=False):
    """``response_metadata`` of an answer of verlog's chat model."""

    model_name: str
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    sampling: SamplingMetadata
    #: the prompt's images (a vision-language model's call): each encoded file in base64, in order
    images: list[str]


#: the keys without which a message carries no training data
TOKEN_KEYS: tuple[str, ...] = ("prompt_ids", "response_ids", "logprobs")


def has_tokens(metadata: Mapping[str, Any]) -> bool:
    """Whether ``metadata`` carries verlog's token data (:data:`TOKEN_KEYS`)."""
    return all(key in metadata for key in TOKEN_KEYS)
