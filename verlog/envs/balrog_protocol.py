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
* **Empty answers.** An answer that is empty once cleaned adds no assistant message: the
  history then holds two observations in a row. The window is BALROG's: the last ``2 * 16``
  events (observations and answers); of the observations in it only the newest 16 keep their
  text, so after empty answers older ones appear as a bare ``Observation:``.
* **Budget.** ``max_tokens`` 8192 per answer; no time limit per episode; an episode runs until the
  game ends or its step cap.
* **Images** (BALROG's vision protocol, ``max_image_history`` > 0): the newest observations carry
  an image of the game beside their text (:mod:`verlog.envs.balrog_vision`).

Three texts are prose rather than rules: each game's instruction, the answer rule and the
invalid-answer note (a fourth under the vision protocol: the line saying an image is attached).
verlog ships its own wording of them (:data:`VERLOG_WORDING`: the same facts in other words);
:mod:`verlog.envs.balrog_source` reads BALROG's own from a BALROG checkout the user points to, so
a run can use them verbatim without verlog carrying them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from verlog.envs.balrog_vision import IMAGE_NOTE, image_content

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
    """verlog's note put before the next observation when an answer was invalid."""
    return (
        f"\n\nYour last answer was not one of the valid actions, so the default action was taken: "
        f"{default_action}\n\nObservation:\n"
    )


@dataclass(frozen=True)
class Wording:
    """The prose of BALROG's protocol: what a game graph under ``protocol="balrog"`` says.

    Attributes:
        answer_rule: appended to the newest observation (after a blank line).
        invalid_note: the note put before the next observation after an invalid answer, given
            the action that ran instead.
        instruction: the first user message for a game, or ``None`` for the game's own
            ``instruction`` (verlog's words).
        source: where the texts come from: ``"verlog"``, or the BALROG checkout they were read from.
        image_note: under BALROG's vision protocol, the last line of an observation's text when
            its image is attached.
    """

    answer_rule: str = ANSWER_RULE
    invalid_note: Callable[[str], str] = invalid_answer_note
    instruction: Callable[[Any], str] | None = None
    source: str = "verlog"
    image_note: str = IMAGE_NOTE

    def instruction_for(self, env: Any) -> str:
        """The instruction of the game ``env`` in this wording."""
        return env.instruction if self.instruction is None else self.instruction(env)


#: verlog's own wording of BALROG's texts (the same facts in verlog's words)
VERLOG_WORDING = Wording()


def build_prompt(
    instruction: str,
    history: Sequence[tuple[str, str]],
    observation: str,
    history_length: int = HISTORY_LENGTH,
    answer_rule: str = ANSWER_RULE,
    *,
    images: Sequence[str | None] | None = None,
    image: str | None = None,
    max_image_history: int = 0,
    image_note: str = IMAGE_NOTE,
) -> list[BaseMessage]:
    """The messages of one model call under BALROG's protocol.

    ``history`` holds the past (observation, cleaned answer) pairs, oldest first; ``observation``
    is the newest one (with the invalid-answer note in front when the last answer was invalid).
    An empty answer adds no message (BALROG records no action for it); the window is the last
    ``2 * max(history_length, max_image_history)`` events, and only its newest ``history_length``
    observations keep their text (the others read ``Observation:`` alone, as in BALROG's history
    builder).

    BALROG's vision protocol (``max_image_history`` > 0, :mod:`verlog.envs.balrog_vision`):
    ``images`` are the data URLs of the history's observation images (aligned with ``history``,
    ``None`` where there is none) and ``image`` the newest observation's; the newest
    ``max_image_history`` observations of the window that have one carry it: ``image_note`` is
    their text's last line and the message's content is that text, then the image part.
    """
    past_images = list(images) if images is not None else [None] * len(history)
    if len(past_images) != len(history):
        raise ValueError(f"images: one per past observation ({len(history)}), got {len(past_images)}")
    events: list[tuple[str, str, str | None]] = []
    for (past_observation, past_answer), past_image in zip(history, past_images):
        events.append(("observation", past_observation, past_image))
        if past_answer:
            events.append(("answer", past_answer, None))
    events.append(("observation", observation, image))
    span = max(history_length, max_image_history)
    window = events[-2 * span :] if span > 0 else events[-1:]
    shown = max(history_length, 1)
    observations = [i for i, (kind, _, _) in enumerate(window) if kind == "observation"]
    with_text = set(observations[-shown:])
    pictured = [i for i in observations if window[i][2] is not None]
    with_image = set(pictured[-max_image_history:]) if max_image_history > 0 else set()
    messages: list[BaseMessage] = [HumanMessage(instruction)]
    for index, (kind, text, url) in enumerate(window):
        if kind == "answer":
            messages.append(AIMessage(text))
            continue
        newest = index == len(window) - 1
        parts = ["Current Observation:" if newest else "Observation:"]
        if index in with_text:
            parts.append(text)
        if index in with_image:
            parts.append(image_note)
        content = "\n".join(parts) + (f"\n\n{answer_rule}" if newest else "")
        if index in with_image:
            assert url is not None
            messages.append(HumanMessage(content=image_content(content, url)))
        else:
            messages.append(HumanMessage(content))
    return messages
