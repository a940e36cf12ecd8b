"""What the trace store keeps: a served completion as a :class:`TracedTurn`, an episode's
:class:`Feedback`, and the operator's :class:`RecordingPolicy` (privacy, size, retention)."""

from __future__ import annotations

import math
import re
from array import array
from dataclasses import dataclass, field
from typing import Any, Literal

from verlog.config import REWARD_MAX_ABS  # feedback's bound is the reward functions' (one rule for a reward's size)
from verlog.rollout.turn import Turn

#: what a recorded turn keeps besides its token ids: ``full`` also the request's messages and the
#: answer's text; ``ids_only`` keeps no text at all (prompt and answer as token ids only)
PrivacyMode = Literal["full", "ids_only"]
PRIVACY_MODES: tuple[str, ...] = ("full", "ids_only")

#: the HTTP header a client names its episode with (else the OpenAI ``user`` field); the server
#: answers every recorded completion with the episode it was filed under in the same header
EPISODE_HEADER = "X-Verlog-Episode"
#: the response header naming the model version (checkpoint id) that produced the answer
VERSION_HEADER = "X-Verlog-Model-Version"


#: a served version that is a training checkpoint: ``RUN/update_NNNNNN`` (see
#: ``verlog.weights.policy.PolicySource.version``)
_CHECKPOINT_VERSION = re.compile(r"^(?P<run>.+)/update_(?P<update>\d+)$")


def check_reward(value: object, field_name: str = "reward") -> float:
    """``value`` as a reward: a finite number within ``±REWARD_MAX_ABS``; else a one-line
    ``ValueError`` naming ``field_name``. Integers of any size are refused past the bound, never
    converted first (a 400-digit integer does not fit a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field_name} must be a number, got {value!r:.80}")
    if isinstance(value, int):
        if abs(value) > REWARD_MAX_ABS:
            raise ValueError(
                f"{field_name} must be within ±{REWARD_MAX_ABS:g}, got an integer of {len(str(abs(value)))} digits"
            )
        return float(value)
    if not math.isfinite(value):
        raise ValueError(f"{field_name} must be a finite number, got {value!r}")
    if abs(value) > REWARD_MAX_ABS:
        raise ValueError(f"{field_name} must be within ±{REWARD_MAX_ABS:g}, got {value!r}")
    return float(value)


def checkpoint_update(version: str) -> tuple[str, int] | None:
    """``(run, update)`` of a version that is a training checkpoint (``RUN/update_NNNNNN``);
    ``None`` for any other version (a model folder's or spec's name: weights no update made)."""
    found = _CHECKPOINT_VERSION.match(version)
    return (found["run"], int(found["update"])) if found else None


@dataclass
class TracedTurn(Turn):
    """One served completion, token-exact: a :class:`~verlog.rollout.turn.Turn` (the prompt ids the
    engine saw, the response ids it produced, one logprob per response id, the behaviour policy's, and
    the sampling it was drawn with) and which model version answered, when and how fast. Trained from
    the store, it is the batch's turn itself, with the episode's feedback on it.

    ``turn_index`` is the turn's place in its episode (the order completions were recorded);
    ``reward`` the reward attached to this turn by feedback (the episode's own sits on its last turn);
    ``messages`` and ``response_text`` are ``None`` under the ``ids_only`` privacy mode.
    """

    model_version: str = field(kw_only=True)
    latency_s: float = field(default=0.0, kw_only=True)
    created: float = field(default=0.0, kw_only=True)
    response_text: str | None = field(default=None, kw_only=True)

    @property
    def nbytes(self) -> int:
        """What the turn costs in the store (ids, logprobs and text), for the size bound."""
        text = len(self.response_text or "") + (len(str(self.messages)) if self.messages is not None else 0)
        return 4 * (len(self.prompt_ids) + len(self.response_ids)) + 8 * len(self.logprobs) + text + 256


@dataclass(frozen=True)
class TracedEpisode:
    """An episode of the store: its id, how many turns it has, its feedback (``reward`` /
    ``success`` / ``info`` are ``None`` / ``{}`` until feedback arrives), when it was last written."""

    episode_id: str
    turns: int
    created: float
    updated: float
    reward: float | None = None
    success: bool | None = None
    info: dict[str, Any] = field(default_factory=dict)
    feedback_at: float | None = None

    @property
    def has_feedback(self) -> bool:
        return self.feedback_at is not None


@dataclass(frozen=True)
class RecordingPolicy:
    """What the operator allows the store to keep.

    Args:
        privacy: ``full`` (token ids, the request's messages and the answer's text) or
            ``ids_only`` (token ids and logprobs only; no text is written). Token ids decode back
            to text with the model's tokenizer: ``ids_only`` keeps text out of the database's
            columns, logs and dumps, it does not anonymize.
        max_bytes: the store's size bound; the oldest episodes (least recently written) are
            deleted past it. ``None``: unbounded.
        retention_days: episodes not written to for this long are deleted. ``None``: kept.
    """

    privacy: PrivacyMode = "full"
    max_bytes: int | None = 1 << 30
    retention_days: float | None = 30.0

    def __post_init__(self) -> None:
        if self.privacy not in PRIVACY_MODES:
            raise ValueError(f"privacy must be one of {', '.join(PRIVACY_MODES)}, got {self.privacy!r}")
        if self.max_bytes is not None and self.max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1 (or None: unbounded), got {self.max_bytes}")
        if self.retention_days is not None and not self.retention_days > 0:
            raise ValueError(f"retention_days must be > 0 (or None: kept), got {self.retention_days}")


def pack_ids(ids: list[int]) -> bytes:
    """Token ids as int32 bytes in this machine's byte order (the store's column format)."""
    return array("i", ids).tobytes()


def unpack_ids(blob: bytes) -> list[int]:
    out = array("i")
    out.frombytes(bytes(blob))
    return out.tolist()


def pack_floats(values: list[float]) -> bytes:
    """Logprobs as float64 bytes: exactly the floats the engine returned and the client received."""
    return array("d", values).tobytes()


def unpack_floats(blob: bytes) -> list[float]:
    out = array("d")
    out.frombytes(bytes(blob))
    return out.tolist()
