"""A simulated user for ``graphs/follow_up.py``: answers its ``interrupt()`` pauses in training
and evaluation (``multi_turn.langgraph.on_interrupt: examples/follow_up_user.py:ask``).

verlog calls ``ask(value, state)`` with the value the graph passed to ``interrupt()`` and the
graph's state; what it returns is the graph's ``Command(resume=...)``. It may be ``async`` and
may call any model (an LLM playing the user): its own calls are never trained.
"""

from __future__ import annotations

from typing import Any

QUESTIONS = (
    "Can you say that more simply?",
    "Why does that happen with {topic}?",
    "Give me one example about {topic}.",
    "What is a common mistake people make about {topic}?",
)


def ask(value: dict[str, Any], state: dict[str, Any]) -> str:
    """The user's next question: a fixed sequence, about the conversation's topic."""
    asked = int(value.get("follow_ups", 0))
    return QUESTIONS[asked % len(QUESTIONS)].format(topic=value.get("topic") or state.get("topic", "it"))
