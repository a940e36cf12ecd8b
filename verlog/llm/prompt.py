"""Turning LangChain messages into the exact prompt token ids an engine sees.

The tokenizer's own chat template does the rendering (with the caller's
``chat_template_kwargs``), and the rendered text is encoded once. The ids produced here are the
ids a training turn stores as its prompt: nothing downstream re-renders or re-tokenizes them.

A vision-language model's prompt with images (:mod:`verlog.llm.images`) goes through the model's
own processor instead: the template renders each image as its placeholder, the processor
expands the placeholders into the image's tokens and turns the images into the model's pixel
inputs (:class:`verlog.backends.base.ImageInputs`).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from verlog.backends.base import ImageInputs
from verlog.llm.images import block_image, is_image_block, open_images
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
            hint = " (images need a vision-language model: its processor renders them)" if is_image_block(block) else ""
            raise ValueError(
                f"verlog's chat model reads {allowed} content blocks only; got a content block of type {kind!r}{hint}"
            )
    return "".join(parts)


def _content_with_images(content: str | list[Any], images: list[bytes], *, allow_calls: bool) -> str | list[Any]:
    """A message's content for a vision model's template: text as is; a list with images as
    OpenAI-style parts (``{"type": "text"}`` and ``{"type": "image"}`` in order), each image's
    bytes appended to ``images``."""
    if isinstance(content, str) or not any(is_image_block(b) for b in content):
        return message_text(content, allow_calls=allow_calls)
    parts: list[dict[str, Any]] = []
    for block in content:
        if is_image_block(block):
            images.append(block_image(block))
            parts.append({"type": "image"})
        elif allow_calls and isinstance(block, dict) and block.get("type") in _CALL_BLOCKS:
            continue
        else:
            parts.append({"type": "text", "text": message_text([block], allow_calls=allow_calls)})
    return parts


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


def to_chat_dicts(messages: Sequence[BaseMessage], images: list[bytes] | None = None) -> list[dict[str, Any]]:
    """LangChain messages as the ``{"role", "content", ...}`` dicts chat templates expect.

    An assistant message's calls come from its ``tool_calls``, or, if it has none, from the
    tool-call blocks of its content (messages written in Anthropic's format). With ``images`` (a
    list to fill), image blocks become ``{"type": "image"}`` parts and their bytes are appended
    to it in prompt order; without it an image block is refused."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if isinstance(m, ChatMessage):
            role = m.role
        elif isinstance(m, (HumanMessage, AIMessage, SystemMessage, ToolMessage)):
            role = _ROLE[m.type]
        else:
            raise ValueError(f"unsupported message type {type(m).__name__} for a chat template")
        is_ai = isinstance(m, AIMessage)
        content = (
            message_text(m.content, allow_calls=is_ai)
            if images is None
            else _content_with_images(m.content, images, allow_calls=is_ai)
        )
        entry: dict[str, Any] = {"role": role, "content": content}
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
    """Renders messages (+ tool schemas) with one tokenizer's chat template to text and ids;
    with a vision-language model's ``processor``, prompts with images too (:meth:`render_images`)."""

    def __init__(
        self,
        tokenizer: Any,
        chat_template_kwargs: dict[str, Any] | None = None,
        processor: Any = None,
        image_transform: Callable[[bytes], bytes] | None = None,
    ):
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.template_knows_tools = "tools" in _template_source(tokenizer)
        self.processor = processor
        #: what a prompt's image files become before the processor sees them (None: as they are)
        self.image_transform = image_transform

    def render_text(
        self, messages: Sequence[BaseMessage], tools: list[dict] | None = None, images: list[bytes] | None = None
    ) -> str:
        """The prompt as text; with ``images`` (a list to fill), image blocks render as the
        template's image placeholders and their bytes are collected in order."""
        conversation = to_chat_dicts(messages, images)
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

    def render_images(
        self, messages: Sequence[BaseMessage], tools: list[dict] | None = None
    ) -> tuple[list[int], ImageInputs | None]:
        """The prompt of ``messages`` with its images: without any, :meth:`render`'s ids and
        ``None``; with some, the processor's ids (each image's placeholder expanded) and the
        images with their pixel inputs. Images without a processor (a text model) raise
        ``ValueError``."""
        images: list[bytes] = []
        text = self.render_text(messages, tools, images)
        if not images:
            return encode_plain(self.tokenizer, text), None
        if self.processor is None:
            raise ValueError(
                "the messages hold images, and this model has no image processor: use a vision-language "
                "model (a folder with a processor config, e.g. 'tiny-vl')"
            )
        if self.image_transform is not None:
            images = [self.image_transform(image) for image in images]
        ids, inputs = self._process(text, images)
        return ids, ImageInputs(tuple(images), inputs)

    def image_inputs(self, images: Sequence[bytes]) -> dict[str, Any]:
        """The pixel inputs of a prompt's images, exactly as :meth:`render_images` made them (the
        processor's image processor on the same bytes; the prompt's text does not change them):
        what a trainer feeds with a turn's ids."""
        if self.processor is None:
            raise ValueError("this model has no image processor (not a vision-language model)")
        return dict(self.processor.image_processor(open_images(images), return_tensors="pt"))

    def _process(self, text: str, images: Sequence[bytes]) -> tuple[list[int], dict[str, Any]]:
        out = self.processor(text=[text], images=open_images(images), add_special_tokens=False, return_tensors="pt")
        inputs = dict(out)
        ids = inputs.pop("input_ids")[0].tolist()
        inputs.pop("attention_mask", None)
        inputs.pop("token_type_ids", None)
        return ids, inputs
