"""Hermes-style tool calling: tool schemas for the chat template, ``<tool_call>`` parsing.

A model asks for a tool by writing ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
in its answer. Well-formed blocks become LangChain ``tool_calls``; anything malformed becomes an
``invalid_tool_calls`` entry carrying the raw text and the reason, never an exception, so a graph
can show the model its mistake.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from langchain_core.messages import InvalidToolCall, ToolCall
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
#: the name at the start of a call whose JSON is broken (e.g. cut by the token budget)
_NAME = re.compile(r'^\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)+)"')


@dataclass
class ParsedToolCalls:
    """An answer split into its visible text and its tool calls."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    invalid_tool_calls: list[InvalidToolCall] = field(default_factory=list)


def tool_schemas(tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool]) -> list[dict]:
    """OpenAI-format function schemas for LangChain tools, typed Python functions or dicts."""
    return [convert_to_openai_tool(t) for t in tools]


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_tool_calls(text: str) -> ParsedToolCalls:
    """Split ``text`` into content and Hermes ``<tool_call>`` blocks.

    Each block must hold a JSON object with a string ``name`` and an object ``arguments`` (a JSON
    string holding an object is accepted too). An unclosed last block is parsed if its JSON is
    complete (the model hit a stop sequence), else reported invalid (with the tool's name when
    the broken JSON starts with it).
    """
    if TOOL_CALL_OPEN not in text:
        return ParsedToolCalls(content=text)
    parsed = ParsedToolCalls(content=_BLOCK.sub("", text).strip())
    for match in _BLOCK.finditer(text):
        raw = match.group(1).strip()
        call_id = _call_id()
        try:
            payload = json.loads(raw)
        except json.JSONDecodeError as exc:
            name = _NAME.match(raw)
            parsed.invalid_tool_calls.append(
                InvalidToolCall(
                    name=json.loads(f'"{name.group(1)}"') if name else None,
                    args=raw,
                    id=call_id,
                    error=f"tool call is not valid JSON: {exc}",
                    type="invalid_tool_call",
                )
            )
            continue
        error = _check_payload(payload)
        if error:
            parsed.invalid_tool_calls.append(
                InvalidToolCall(
                    name=payload.get("name") if isinstance(payload, dict) else None,
                    args=raw,
                    id=call_id,
                    error=error,
                    type="invalid_tool_call",
                )
            )
            continue
        args = payload.get("arguments", {})
        if isinstance(args, str):
            args = json.loads(args)
        parsed.tool_calls.append(ToolCall(name=payload["name"], args=args, id=call_id, type="tool_call"))
    return parsed


def _check_payload(payload: Any) -> str | None:
    if not isinstance(payload, dict):
        return "tool call must be a JSON object with 'name' and 'arguments'"
    if not isinstance(payload.get("name"), str) or not payload["name"]:
        return "tool call has no string 'name'"
    args = payload.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as exc:
            return f"tool call 'arguments' is a string that is not JSON: {exc}"
    if not isinstance(args, dict):
        return "tool call 'arguments' must be a JSON object"
    return None
