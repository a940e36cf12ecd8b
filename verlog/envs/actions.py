"""Reading a text action out of a model's answer, the same way for every environment.

The answer format is free reasoning followed by ``ACTION: <action>``. Matching is tolerant
(case, surrounding punctuation, underscores or hyphens for spaces, declared synonyms); an answer
that names no valid action is *invalid*: the environment runs its default action and the turn
pays ``invalid_action_penalty``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

#: reward added to a turn whose answer named no valid action (Verlog uses -0.1)
DEFAULT_INVALID_ACTION_PENALTY = 0.1

ANSWER_FORMAT = (
    "Think briefly about what to do, then end your answer with one line of the form\n"
    "ACTION: <action>\nwhere <action> is exactly one of the valid actions."
)

_ACTION_LINE = re.compile(r"action\s*[:：]\s*(.+)", re.IGNORECASE)
_NON_WORD = re.compile(r"[^a-z0-9]+")


def normalize(text: str) -> str:
    """Lower-case, turn any run of non-alphanumerics into one space, strip."""
    return _NON_WORD.sub(" ", text.lower()).strip()


@dataclass(frozen=True)
class ParsedAction:
    """The outcome of parsing: ``action`` is a valid action name or ``None`` when invalid."""

    action: str | None
    raw: str  # the text that was matched against the actions (the ACTION line, or the answer)

    @property
    def valid(self) -> bool:
        return self.action is not None


def parse_action(
    answer: str,
    valid_actions: Sequence[str],
    synonyms: Mapping[str, str] | None = None,
) -> ParsedAction:
    """Find the action an answer asks for.

    The last ``ACTION:`` line wins; without one, a bare answer that is itself an action name (as
    typed by a person in ``verlog play``) is accepted. ``synonyms`` maps extra phrasings (any
    case) to valid action names.
    """
    lookup = {normalize(a): a for a in valid_actions}
    for phrase, target in (synonyms or {}).items():
        if target in valid_actions:
            lookup.setdefault(normalize(phrase), target)

    matches = _ACTION_LINE.findall(answer)
    candidate = matches[-1] if matches else answer
    candidate = candidate.strip().splitlines()[0] if candidate.strip() else ""
    key = normalize(candidate)
    if key in lookup:
        return ParsedAction(lookup[key], candidate)
    # tolerate trailing words ("go forward." / "pick up the key"): longest action that prefixes it
    for norm in sorted(lookup, key=len, reverse=True):
        if norm and (key.startswith(norm + " ")):
            return ParsedAction(lookup[norm], candidate)
    return ParsedAction(None, candidate)
