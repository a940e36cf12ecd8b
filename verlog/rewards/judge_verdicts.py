"""The JSON a judge answers with: its schema (sent as ``response_format``) and a lenient reader.

A rubric verdict is ``{"explanation": str, "score": int 0..SCORE_MAX}``. A ranking verdict keys
one such entry by each attempt's number: ``{"scores": {"1": {...}, "2": {...}, ...}}``. Keying by
number (rather than a list of ``{"trajectory": i, ...}``) makes "every attempt scored exactly
once" part of the schema itself, in the subset of JSON Schema that OpenAI's strict mode, vLLM,
SGLang and verlog's engine all enforce; a list could only say so with ``prefixItems``, which
OpenAI's strict mode refuses.

The reader accepts what an endpoint that ignores the schema may write instead: JSON inside code
fences or prose, a score given as a number or a numeric string, and the list form
``{"scores": [{"trajectory": 1, "score": ..., "explanation": ...}, ...]}``. Anything else — no
JSON, a score outside 0..SCORE_MAX, an attempt scored twice or not at all — is a
``VerdictError``, which the judge retries.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from verlog.rewards.judge_prompts import SCORE_MAX

__all__ = [
    "Verdict",
    "VerdictError",
    "parse_ranking",
    "parse_rubric",
    "ranking_schema",
    "response_format",
    "rubric_schema",
]


class VerdictError(ValueError):
    """A judge's answer is not a valid verdict (retried; the message says what was wrong)."""


@dataclass(frozen=True)
class Verdict:
    """One episode's score (0..SCORE_MAX as the judge gave it) and the judge's explanation."""

    score: float
    explanation: str

    @property
    def reward(self) -> float:
        """The score normalized to [0, 1]."""
        return self.score / SCORE_MAX


# ------------------------------------------------------------------------------- schemas
def _entry_schema(explanation_chars: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "explanation": {"type": "string", "maxLength": explanation_chars},
            "score": {"type": "integer", "minimum": 0, "maximum": SCORE_MAX},
        },
        "required": ["explanation", "score"],
        "additionalProperties": False,
    }


def rubric_schema(explanation_chars: int) -> dict[str, Any]:
    """The JSON schema of a rubric verdict."""
    return _entry_schema(explanation_chars)


def ranking_schema(k: int, explanation_chars: int) -> dict[str, Any]:
    """The JSON schema of a ranking verdict over ``k`` attempts (keys ``"1"`` .. ``"k"``, all required)."""
    keys = [str(i) for i in range(1, k + 1)]
    entry = _entry_schema(explanation_chars)
    return {
        "type": "object",
        "properties": {
            "scores": {
                "type": "object",
                "properties": {key: entry for key in keys},
                "required": keys,
                "additionalProperties": False,
            }
        },
        "required": ["scores"],
        "additionalProperties": False,
    }


def response_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's ``response_format`` asking for JSON under ``schema`` (strict)."""
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


# ------------------------------------------------------------------------------- reading answers
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def _json_object(text: str) -> dict[str, Any]:
    """The first JSON object in ``text`` (whole, in a code fence, or amid prose)."""
    text = (text or "").strip()
    candidates = [text] + _FENCE.findall(text)
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    decoder = json.JSONDecoder()
    for start in (i for i, ch in enumerate(text) if ch == "{"):
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    shown = text if len(text) <= 200 else text[:200] + "..."
    raise VerdictError(f"the answer holds no JSON object: {shown!r}")


def _score(value: Any, where: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value.strip().split("/")[0])
        except ValueError:
            raise VerdictError(f"{where} is not a number: {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise VerdictError(f"{where} is not a number: {value!r}")
    if not 0 <= value <= SCORE_MAX:
        raise VerdictError(f"{where} is {value}, outside 0..{SCORE_MAX}")
    return float(value)


def _entry(value: Any, where: str, explanation_chars: int) -> Verdict:
    if not isinstance(value, dict) or "score" not in value:
        raise VerdictError(f"{where} has no score: {value!r:.200}")
    explanation = value.get("explanation", "")
    explanation = explanation if isinstance(explanation, str) else json.dumps(explanation, default=str)
    return Verdict(_score(value["score"], f"{where}'s score"), explanation[:explanation_chars])


def parse_rubric(text: str, explanation_chars: int) -> Verdict:
    """A rubric verdict read from a judge's answer (``VerdictError`` if there is none)."""
    return _entry(_json_object(text), "the verdict", explanation_chars)


def _attempt_number(key: Any) -> int | None:
    if isinstance(key, bool):
        return None
    if isinstance(key, int):
        return key
    match = re.fullmatch(r"\s*(?:attempt|trajectory)?[\s_#-]*(\d+)\s*", str(key), re.IGNORECASE)
    return int(match.group(1)) if match else None


def parse_ranking(text: str, k: int, explanation_chars: int) -> list[Verdict]:
    """A ranking verdict over ``k`` attempts, in attempt order (``VerdictError`` unless every
    attempt 1..k is scored exactly once)."""
    scores = _json_object(text).get("scores")
    if isinstance(scores, dict):
        pairs = list(scores.items())
    elif isinstance(scores, list):
        pairs = [(e.get("trajectory", e.get("attempt")) if isinstance(e, dict) else None, e) for e in scores]
    else:
        raise VerdictError(f"the verdict has no 'scores' object: {text[:200]!r}")
    found: dict[int, Verdict] = {}
    for key, value in pairs:
        number = _attempt_number(key)
        if number is None or not 1 <= number <= k:
            raise VerdictError(f"the verdict scores an attempt {key!r}; there are attempts 1 to {k}")
        if number in found:
            raise VerdictError(f"the verdict scores attempt {number} twice")
        found[number] = _entry(value, f"attempt {number}", explanation_chars)
    missing = [i for i in range(1, k + 1) if i not in found]
    if missing:
        raise VerdictError(
            f"the verdict does not score attempt{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of {k}"
        )
    return [found[i] for i in range(1, k + 1)]
