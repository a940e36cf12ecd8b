"""``VerlogChatModel`` passes LangChain's standard unit tests for chat models (``langchain-tests``).

The standard suite checks construction (with the standard parameters ``temperature``,
``max_tokens``, ``timeout``, ``stop``, ``max_retries``, ``streaming``), ``bind_tools`` with every
tool format and ``tool_choice="any"``, ``with_structured_output`` for every method, the
LangSmith tracing parameters (and a per-call ``model`` override) and init time.
"""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from verlog.llm import VerlogChatModel
from verlog.models import load_tokenizer
from verlog.testing.scripted_engine import ScriptedEngine

langchain_tests = pytest.importorskip("langchain_tests.unit_tests")

_TOKENIZER = load_tokenizer("tiny")


class TestVerlogChatModelStandard(langchain_tests.ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[VerlogChatModel]:
        return VerlogChatModel

    @property
    def chat_model_params(self) -> dict:
        return {"engine": ScriptedEngine(_TOKENIZER, ["hello"]), "tokenizer": _TOKENIZER, "model_name": "tiny"}


class Answer(BaseModel):
    """The final answer."""

    value: int


async def test_structured_output_through_a_forced_tool_call():
    """What ``with_structured_output`` builds works end to end: the answer is prefilled with a
    call of the schema's tool, the model completes its arguments, the parser returns the object."""
    engine = ScriptedEngine(_TOKENIZER, ['{"value": 42}}\n</tool_call>'])
    model = VerlogChatModel(engine=engine, tokenizer=_TOKENIZER)
    assert await model.with_structured_output(Answer).ainvoke("What is six times seven?") == Answer(value=42)
    raw = await model.bind_tools([Answer], tool_choice="Answer").ainvoke("?")
    assert raw.tool_calls[0]["args"] == {"value": 42}
    meta = raw.response_metadata
    prefix_ids = _TOKENIZER('<tool_call>\n{"name": "Answer", "arguments": ', add_special_tokens=False)["input_ids"]
    assert meta["prompt_ids"][-len(prefix_ids) :] == prefix_ids  # forced tokens: prompt, not response
    assert (
        meta["response_ids"][:-1] == _TOKENIZER('{"value": 42}}\n</tool_call>', add_special_tokens=False)["input_ids"]
    )
    assert len(meta["logprobs"]) == len(meta["response_ids"])


async def test_tool_choice_none_and_unknown():
    engine = ScriptedEngine(_TOKENIZER, ["plain"])
    model = VerlogChatModel(engine=engine, tokenizer=_TOKENIZER)
    answer = await model.bind_tools([Answer], tool_choice="none").ainvoke("hi")
    assert answer.content == "plain" and "tools" not in _TOKENIZER.decode(engine.calls[-1]).lower()
    with pytest.raises(ValueError, match="not among the tools"):
        model.bind_tools([Answer], tool_choice="Other")


def test_tool_call_content_blocks_render_as_calls():
    """An assistant message in Anthropic's format (text + ``tool_use`` blocks) renders exactly as
    the same message with ``tool_calls``; other non-text blocks are refused by name."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    model = VerlogChatModel(engine=ScriptedEngine(_TOKENIZER, ["ok"]), tokenizer=_TOKENIZER)
    call = {"name": "Answer", "args": {"value": 3}, "id": "abc", "type": "tool_call"}
    as_blocks = AIMessage(
        [
            {"type": "text", "text": "let me see"},
            {"type": "tool_use", "id": "abc", "name": "Answer", "input": {"value": 3}},
        ]
    )
    as_calls = AIMessage("let me see", tool_calls=[call])
    rest = [ToolMessage("3", tool_call_id="abc")]
    rendered = model.render_prompt_ids([HumanMessage("?"), as_blocks, *rest])
    assert rendered == model.render_prompt_ids([HumanMessage("?"), as_calls, *rest])
    assert '"value": 3' in _TOKENIZER.decode(rendered)
    with pytest.raises(ValueError, match="content block of type 'image'"):
        model.render_prompt_ids([HumanMessage([{"type": "image", "url": "x"}])])
    with pytest.raises(ValueError, match="content block of type 'tool_use'"):  # only an assistant calls tools
        model.render_prompt_ids([HumanMessage([{"type": "tool_use", "name": "x", "input": {}}])])
