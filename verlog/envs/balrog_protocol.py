"""BALROG's agent protocol: how its "naive" agent reads a game and how its answers are checked.

BALROG (Paglieri et al., arXiv 2411.13543; github.com/balrog-ai/BALROG) publishes its leaderboard
with a *naive* agent. Its rules, reproduced here so that verlog's ``protocol: balrog`` scores can
stand beside that leaderboard:

* **Prompt.** The game's instructions are the first message, sent with the *user* role (not as a
  system message). Then the episode as alternating messages: each past observation as a user
  message ``Observation:\\n<text>``, each past answer as an assistant message; the newest
  observation is ``Current Observation:\\n<text>`` followed by a short rule saying to answer with
  one action and nothing else. Only the last 16 observations are kept (``max_text_history``):
  the window holds the last ``2 * 16`` events, so it can start with an answer.
* **Answers.** The model's reply is stripped, then every character that is not a letter, a space
  or a colon is deleted; the result must be *exactly* one of the game's actions (case and all).
  Anything else is invalid: the game runs its default action and the next observation starts
  with a note naming that action. The history keeps the cleaned answer.
* **Budget.** ``max_tokens`` 8192 per answer; no time limit per episode; an episode runs until the
  game ends or its step cap.

The wording of the instruction and of the notes is verlog's own (the facts are BALROG's).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

#: past observations kept in the prompt (BALROG's ``agent.max_text_history``)
HISTORY_LENGTH = 16
#: answer budget of each model call (BALROG's ``client.generate_kwargs.max_tokens``)
MAX_TOKENS = 8192

#: appended to the newest observation: answer with one action only (the naive agent's rule)
ANSWER_RULE = (
    "Answer with exactly one of the actions listed above and nothing else. Keep answering with "
    "an action every turn until the episode ends."
)

_NOT_ANSWER_CHARS = re.compile(r"[^a-zA-Z\s:]")


def clean_answer(answer: str) -> str:
    """The answer as BALROG checks it: stripped, then only letters, whitespace and colons kept."""
    return _NOT_ANSWER_CHARS.sub("", answer.strip())


def parse_answer(answer: str, valid_actions: Sequence[str]) -> str | None:
    """The action an answer names under BALROG's rule (an exact match of the cleaned answer),
    or ``None`` when it names none."""
    cleaned = clean_answer(answer)
    return cleaned if cleaned in valid_actions else None


def bare_answer(answer: str) -> str:
    """An answer in verlog's format (reasoning, then ``ACTION: <action>``) as BALROG's naive agent
    gives it: the action alone (an answer without ``ACTION:`` is returned stripped)."""
    return answer.rpartition("ACTION:")[2].strip()


class BareAnswers:
    """A scripted player (oracle, random valid actions) answering in BALROG's format: the
    ``ACTION:`` part of its answers alone, which BALROG's exact-match rule accepts."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent

    def reset(self) -> None:
        self.agent.reset()

    def act(self, observation: str) -> str:
        return bare_answer(self.agent.act(observation))


def invalid_answer_note(default_action: str) -> str:
    """The note put before the next observation when an answer was invalid."""
    return (
        f"\n\nYour last answer was not one of the valid actions, so the default action was taken: "
        f"{default_action}\n\nObservation:\n"
    )


def build_prompt(
    instruction: str,
    history: Sequence[tuple[str, str]],
    observation: str,
    history_length: int = HISTORY_LENGTH,
) -> list[BaseMessage]:
    """The messages of one model call under BALROG's protocol.

    ``history`` holds the past (observation, cleaned answer) pairs, oldest first; ``observation``
    is the newest one (with the invalid-answer note in front when the last answer was invalid).
    """
    events: list[tuple[str, str]] = []
    for past_observation, past_answer in history:
        events += [("observation", past_observation), ("answer", past_answer)]
    events.append(("observation", observation))
    window = events[-2 * history_length:] if history_length > 0 else events[-1:]
    messages: list[BaseMessage] = [HumanMessage(instruction)]
    for index, (kind, text) in enumerate(window):
        if kind == "answer":
            messages.append(AIMessage(text))
        elif index == len(window) - 1:
            messages.append(HumanMessage(f"Current Observation:\n{text}\n\n{ANSWER_RULE}"))
        else:
            messages.append(HumanMessage(f"Observation:\n{text}"))
    return messages
