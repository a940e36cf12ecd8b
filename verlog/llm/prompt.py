"""Turning LangChain messages into the exact prompt token ids an engine sees.

The tokenizer's own chat template does the rendering (with the caller's
``chat_template_kwargs``), and the rendered text is encoded once. The ids produced here are the
ids a training turn stores as its prompt: nothing downstream re-renders or re-tokenizes them.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from verlog.tokens import encode_plain

_ROLE = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}


#: content blocks that carry a tool call (Anthropic's ``tool_use``, LangChain's standard ``tool_call``)
_CALL_BLOCKS = ("tool_use", "tool_call")


def message_text(content: str | list[Any], *, allow_calls: bool = False) -> str:
    """The text of a message's content (text blocks joined). Tool-call blocks are skipped when
    ``allow_calls`` (an assistant message: its calls are rendered from them, see
    :func:`content_tool_calls`); any other block is rejected."""
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(block.get("text", ""))
        elif allow_calls and isinstance(block, dict) and block.get("type") in _CALL_BLOCKS:
            continue
        else:
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            allowed = "text, tool_use and tool_call" if allow_calls else "text"
            raise ValueError(
                f"verlog's chat model reads {allowed} content blocks only; got a content block of type {kind!r}"
            )
    return "".join(parts)


def content_tool_calls(content: str | list[Any]) -> list[dict[str, Any]]:
    """The tool calls written as content blocks of an assistant message (``tool_use``:
    ``name``/``input``; ``tool_call``: ``name``/``args``), as LangChain tool calls."""
    if isinstance(content, str):
        return []
    calls = []
    for block in content:
        if isinstance(block, dict) and block.get("type") in _CALL_BLOCKS:
            args = block.get("input") if block["type"] == "tool_use" else block.get("args")
            calls.append({"name": block.get("name"), "args": args or {}, "id": block.get("id"), "type": "tool_call"})
    return calls


def to_chat_dicts(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain messages as the ``{"role", "content", ...}`` dicts chat templates expect.

    An assistant message's calls come from its ``tool_calls``, or, if it has none, from the
    tool-call blocks of its content (messages written in Anthropic's format)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if isinstance(m, ChatMessage):
            role = m.role
        elif isinstance(m, (HumanMessage, AIMessage, SystemMessage, ToolMessage)):
            role = _ROLE[m.type]
        else:
            raise ValueError(f"unsupported message type {type(m).__name__} for a chat template")
        is_ai = isinstance(m, AIMessage)
        entry: dict[str, Any] = {"role": role, "content": message_text(m.content, allow_calls=is_ai)}
        calls = (m.tool_calls or content_tool_calls(m.content)) if is_ai else []
        if calls:
            entry["tool_calls"] = [
                {"type": "function", "id": c.get("id"), "function": {"name": c["name"], "arguments": c["args"]}}
                for c in calls
            ]
        if isinstance(m, ToolMessage):
            entry["tool_call_id"] = m.tool_call_id
            if m.name:
                entry["name"] = m.name
        out.append(entry)
    return out


def _template_source(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: the default one
        template = template.get("default") or next(iter(template.values()))
    if not template:
        raise ValueError(
            f"tokenizer {type(tokenizer).__name__} has no chat_template; set one before using it as a chat model"
        )
    return template


def _tools_as_system_text(tools: list[dict]) -> str:
    """Hermes-style tool instructions for chat templates that ignore the ``tools`` argument."""
    listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "You can call functions. Their signatures are inside <tools></tools>:\n"
        f"<tools>\n{listing}\n</tools>\n"
        "To call one, answer with\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


class PromptRenderer:
    """Renders messages (+ tool schemas) with one tokenizer's chat template to text and ids."""

    def __init__(self, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.template_knows_tools = "tools" in _template_source(tokenizer)

    def render_text(self, messages: Sequence[BaseMessage], tools: list[dict] | None = None) -> str:
        conversation = to_chat_dicts(messages)
        kwargs: dict[str, Any] = dict(self.chat_template_kwargs)
        if tools:
            if self.template_knows_tools:
                kwargs["tools"] = tools
            else:
                tool_text = _tools_as_system_text(tools)
                if conversation and conversation[0]["role"] == "system":
                    conversation[0] = {**conversation[0], "content": conversation[0]["content"] + "\n\n" + tool_text}
                else:
                    conversation.insert(0, {"role": "system", "content": tool_text})
        return self.tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True, **kwargs)

    def render(self, messages: Sequence[BaseMessage], tools: list[dict] | None = None) -> list[int]:
        """The prompt token ids for ``messages``: template, then one encode without extra specials."""
        return encode_plain(self.tokenizer, self.render_text(messages, tools))
