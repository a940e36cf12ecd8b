"""Token streaming for ``VerlogChatModel``: answer text in pieces as the engine chooses tokens.

The streamed pieces, joined, are exactly the text ``ainvoke`` returns: text is released only up
to the last whitespace decoded so far, never a partial UTF-8 character (decoded as U+FFFD) nor
the start of a stop string, and the last chunk carries the rest together with everything a
training turn needs (``response_metadata``: prompt and response ids, logprobs, finish reason,
sampling) and the usage. With tools offered the answer may turn into a tool call, which cannot
be taken back once shown as text: then the whole answer comes in the last chunk.
"""

from __future__ import annotations

import json
from typing import Callable, Sequence

from langchain_core.messages import AIMessage, AIMessageChunk

from verlog.backends.base import SamplingParams

__all__ = ["TextReleaser", "last_chunk"]


class TextReleaser:
    """Turns the growing list of response ids into the next piece of text that is safe to show.

    ``decode(ids)`` is the chat model's visible-text decoding of a partial answer.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], sampling: SamplingParams, *, hold_all: bool = False):
        self._decode = decode
        self._stops = sampling.stop
        self._hold_all = hold_all
        self.ids: list[int] = []
        self.sent = ""

    def push(self, token_ids: Sequence[int]) -> str:
        """Add newly chosen ids; return the text that may be shown now ("" if none)."""
        self.ids += token_ids
        if self._hold_all:
            return ""
        text = self._decode(self.ids)
        for stop in self._stops:  # a stop string ends the answer before it
            cut = text.find(stop)
            if cut >= 0:
                text = text[:cut]
        safe = len(text)
        if "\ufffd" in text:
            safe = min(safe, text.index("\ufffd"))
        for stop in self._stops:  # the text may end with the start of a stop string
            for n in range(min(len(stop) - 1, safe), 0, -1):
                if text[:safe].endswith(stop[:n]):
                    safe -= n
                    break
        cut = max(text.rfind(" ", 0, safe), text.rfind("\n", 0, safe))
        safe = cut + 1 if cut >= 0 else 0
        if safe <= len(self.sent) or not text.startswith(self.sent):
            return ""
        piece, self.sent = text[len(self.sent) : safe], text[:safe]
        return piece


def last_chunk(message: AIMessage, sent: str) -> AIMessageChunk:
    """The closing chunk of a streamed answer: what ``message`` (the answer ``ainvoke`` would
    return) holds beyond the ``sent`` text, its tool calls, metadata and usage."""
    content = message.content if isinstance(message.content, str) else str(message.content)
    rest = content[len(sent) :] if content.startswith(sent) else content
    tool_call_chunks = [
        {"name": call["name"], "args": json.dumps(call["args"], ensure_ascii=False), "id": call.get("id"), "index": i}
        for i, call in enumerate(message.tool_calls)
    ]
    offset = len(tool_call_chunks)
    tool_call_chunks += [
        {"name": bad.get("name"), "args": bad.get("args"), "id": bad.get("id"), "index": offset + i}
        for i, bad in enumerate(message.invalid_tool_calls)
    ]
    return AIMessageChunk(
        content=rest,
        tool_call_chunks=tool_call_chunks,
        response_metadata=dict(message.response_metadata),
        usage_metadata=message.usage_metadata,
    )
