"""verl's ``multi_turn`` config dataclass, extended with verlog's agent block.

verl turns ``actor_rollout_ref.rollout`` into typed dataclasses in every worker, and its
``MultiTurnConfig`` rejects keys it does not know. The composed config therefore points
``actor_rollout_ref.rollout.multi_turn._target_`` at this subclass, which accepts verlog's
``langgraph`` and ``chat_template_kwargs`` next to verl's own keys (validated by
``verlog.integrations.verl.settings.read_multi_turn``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from verl.workers.config import MultiTurnConfig

__all__ = ["VerlogMultiTurnConfig", "TARGET"]


@dataclass
class VerlogMultiTurnConfig(MultiTurnConfig):
    """verl's multi-turn settings plus the graph verlog runs (``langgraph``) and the options of
    the tokenizer's chat template (``chat_template_kwargs``)."""

    langgraph: Optional[dict[str, Any]] = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


#: the ``_target_`` the composed config gives ``actor_rollout_ref.rollout.multi_turn``
TARGET = f"{VerlogMultiTurnConfig.__module__}.{VerlogMultiTurnConfig.__qualname__}"
