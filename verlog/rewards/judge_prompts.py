"""What an LLM judge is shown: an episode's transcript as text, and the rubric / ranking prompts.

A transcript is the episode's messages after the task, one block per message: the agent's text,
each tool call it made (name and JSON arguments), each tool result, with a header naming who
spoke. It is bounded by ``transcript_chars`` in two steps:

1. a message longer than a quarter of the budget keeps its first and last eighths of the budget
   with ``[… N characters cut …]`` between them (the start of a tool result and the end of a
   long answer usually matter most);
2. if the blocks still exceed the budget, the oldest blocks go first, replaced by one line
   ``[… N earlier messages cut …]``: the last messages (the final answer) are always kept.

The task (system instructions and the first user message) is shown apart from the transcript
and bounded the same way; a ranking prompt shows it once for the whole group.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from verlog.llm.prompt import content_tool_calls, message_text

__all__ = [
    "DEFAULT_RUBRIC",
    "SCORE_MAX",
    "Prompt",
    "ranking_prompt",
    "render_message",
    "rubric_prompt",
    "split_task",
    "truncate_blocks",
    "truncate_text",
]

#: judges score on an integer scale 0..SCORE_MAX (the reward is score / SCORE_MAX): integers keep a
#: constrained decoder from writing digits forever, and 0-10 is a scale every instruct model knows
SCORE_MAX = 10

#: the rubric used when a judge's config gives none
DEFAULT_RUBRIC = (
    "The agent accomplishes the task it was given. Its final answer is correct and complete, follows from what "
    "it did, and answers what was asked without invented facts. Sensible use of tools and recovering from its own "
    "mistakes count in its favour; a wrong, unsupported, off-topic or missing final answer scores low whatever "
    "else it did. When a reference answer is given, a final answer that agrees with it in substance is correct, "
    "however it is worded."
)

_RUBRIC_SYSTEM = (
    "You are an impartial grader of AI agents. You receive the task an agent was given, the record of what it "
    "did (its messages, the tools it called with their arguments, what the tools returned), sometimes a "
    "reference answer, and a rubric. Judge only what the record shows, against the rubric. First write a short "
    "explanation (at most {chars} characters), then give an integer score from 0 (fails the rubric entirely) "
    "to {top} (meets it fully). Reply with JSON only: "
    '{{"explanation": "...", "score": <integer 0-{top}>}}'
)

_RANKING_SYSTEM = (
    "You are an impartial grader comparing several attempts by AI agents at the same task. You receive the "
    "task, sometimes a reference answer, a rubric, and the record of each attempt (its messages, the tools it "
    "called with their arguments, what the tools returned), numbered 1 to {k}. Score every attempt with an "
    "integer from 0 to {top}, looking at the attempts side by side: a better attempt gets a higher score than a "
    "worse one, equally good attempts get the same score, and an attempt that fails the task stays low even if "
    "it is the best of the group. For each attempt write a short explanation (at most {chars} characters) "
    "before its score. Reply with JSON only, one entry per attempt, keyed by its number: "
    '{{"scores": {{"1": {{"explanation": "...", "score": <integer 0-{top}>}}, ...}}}}'
)


@dataclass(frozen=True)
class Prompt:
    """A judge's request: OpenAI-style chat messages (``{"role", "content"}`` dicts)."""

    messages: list[dict[str, str]]


# ------------------------------------------------------------------------------- messages as text
def _kind(message: Any) -> str:
    """``human`` / ``ai`` / ``tool`` / ``system`` for a LangChain message or an OpenAI-style dict."""
    if isinstance(message, Mapping):
        role = message.get("role") or message.get("type") or "user"
        return {"user": "human", "assistant": "ai"}.get(role, role)
    return getattr(message, "type", "human")


def _field(message: Any, name: str, default: Any = None) -> Any:
    return message.get(name, default) if isinstance(message, Mapping) else getattr(message, name, default)


def _text(content: Any) -> str:
    """A message's content as text; blocks other than text (images...) appear as ``[<type>]``."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for block in content:
        try:
            parts.append(message_text([block], allow_calls=True))  # tool-call blocks: see _calls
        except ValueError:
            parts.append(f"[{block.get('type', 'block') if isinstance(block, Mapping) else type(block).__name__}]")
    return "".join(parts)


def _calls(message: Any) -> list[str]:
    lines = []
    content = _field(message, "content", None)
    written = content_tool_calls(content) if isinstance(content, list) else []
    for call in _field(message, "tool_calls", None) or written:
        if "function" in call:  # OpenAI's dict form
            name, args = call["function"].get("name"), call["function"].get("arguments")
        else:
            name, args = call.get("name"), call.get("args")
        args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False, default=str)
        lines.append(f"-> calls tool {name}({args})")
    for call in _field(message, "invalid_tool_calls", None) or []:
        lines.append(f"-> malformed tool call: {call.get('args') or call.get('error') or ''}")
    return lines


def render_message(message: Any) -> str:
    """One message as a block of the transcript: a header naming who spoke, then its text and
    tool calls."""
    kind = _kind(message)
    text = _text(_field(message, "content", ""))
    if kind == "ai":
        body = "\n".join(([text] if text else []) + _calls(message))
        return f"[agent]\n{body or '(empty answer)'}"
    if kind == "tool":
        name = _field(message, "name", None)
        return f"[tool result{' of ' + name if name else ''}]\n{text}"
    if kind == "system":
        return f"[system]\n{text}"
    return f"[user]\n{text}"


# ------------------------------------------------------------------------------- truncation
def truncate_text(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters: its start and end kept, the middle replaced by
    a marker saying how much was cut."""
    if len(text) <= limit:
        return text
    half = max(1, limit // 2)
    return f"{text[:half]}\n[… {len(text) - 2 * half} characters cut …]\n{text[-half:]}"


def truncate_blocks(blocks: Sequence[str], limit: int) -> str:
    """Transcript blocks joined, within about ``limit`` characters (see the module docstring):
    each block cut to a quarter of the budget, then the oldest blocks dropped first."""
    per_block = max(200, limit // 4)
    kept = [truncate_text(b, per_block) for b in blocks]
    total, start = sum(len(b) + 2 for b in kept), 0
    while total > limit and start < len(kept) - 1:
        total -= len(kept[start]) + 2
        start += 1
    cut = [f"[… {start} earlier message{'s' if start != 1 else ''} cut …]"] if start else []
    return "\n\n".join(cut + kept[start:])


# ------------------------------------------------------------------------------- the prompts
def split_task(messages: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """An episode's messages split into the task (the system messages before the first user
    message, and that message) and what the agent did after it."""
    for i, message in enumerate(messages):
        if _kind(message) == "human":
            return list(messages[: i + 1]), list(messages[i + 1 :])
    return [], list(messages)


def _section(title: str, body: str) -> str:
    return f"## {title}\n{body.strip() or '(empty)'}"


def _task_text(task: Sequence[Any], limit: int) -> str:
    return truncate_blocks([render_message(m) for m in task], limit) if task else "(not given)"


def rubric_prompt(
    task: Sequence[Any],
    transcript: Sequence[Any],
    *,
    rubric: str | None,
    reference: str | None,
    transcript_chars: int,
    explanation_chars: int,
) -> Prompt:
    """The messages asking for one episode's verdict: task, transcript, reference, rubric."""
    parts = [_section("Task", _task_text(task, transcript_chars))]
    if reference is not None:
        parts.append(_section("Reference answer", truncate_text(reference, transcript_chars // 4)))
    parts.append(_section("Rubric", rubric or DEFAULT_RUBRIC))
    parts.append(
        _section(
            "What the agent did",
            truncate_blocks([render_message(m) for m in transcript], transcript_chars) or "(nothing)",
        )
    )
    parts.append("Grade this episode against the rubric. Reply with the JSON verdict only.")
    system = _RUBRIC_SYSTEM.format(chars=explanation_chars, top=SCORE_MAX)
    return Prompt([{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}])


def ranking_prompt(
    tasks: Sequence[Sequence[Any]],
    transcripts: Sequence[Sequence[Any]],
    *,
    rubric: str | None,
    reference: str | None,
    transcript_chars: int,
    explanation_chars: int,
) -> Prompt:
    """The messages asking for a group's verdict: the task once (each attempt's own task when
    they differ), then each attempt's transcript, numbered from 1."""
    k = len(transcripts)
    rendered_tasks = [_task_text(t, transcript_chars) for t in tasks]
    shared = len(set(rendered_tasks)) == 1
    parts = [_section("Task", rendered_tasks[0])] if shared else []
    if reference is not None:
        parts.append(_section("Reference answer", truncate_text(reference, transcript_chars // 4)))
    parts.append(_section("Rubric", rubric or DEFAULT_RUBRIC))
    for i, (task, transcript) in enumerate(zip(rendered_tasks, transcripts), start=1):
        body = truncate_blocks([render_message(m) for m in transcript], transcript_chars) or "(nothing)"
        if not shared:
            body = f"Its task:\n{task}\n\nWhat it did:\n{body}"
        parts.append(_section(f"Attempt {i}", body))
    parts.append(f"Score all {k} attempts, each exactly once. Reply with the JSON verdict only.")
    system = _RANKING_SYSTEM.format(k=k, chars=explanation_chars, top=SCORE_MAX)
    return Prompt([{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}])
