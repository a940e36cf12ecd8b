"""``VerlogChatModel`` passes LangChain's standard unit tests for chat models (``langchain-tests``).

The standard suite checks construction (with the standard parameters ``temperature``,
``max_tokens``, ``timeout``, ``stop``, ``max_retries``, ``streaming``), ``bind_tools`` with every
tool format and ``tool_choice="any"``, ``with_structured_output`` for every method, the
LangSmith tracing parameters (and a per-call ``model`` override) and init time.
"""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from verlog.testing.scripted_engine import ScriptedEngine
from verlog.llm import VerlogChatModel
from verlog.models import load_tokenizer

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
    assert meta["prompt_ids"][-len(prefix_ids):] == prefix_ids  # forced tokens: prompt, not response
    assert meta["response_ids"][:-1] == _TOKENIZER('{"value": 42}}\n</tool_call>', add_special_tokens=False)["input_ids"]
    assert len(meta["logprobs"]) == len(meta["response_ids"])


async def test_tool_choice_none_and_unknown():
    engine = ScriptedEngine(_TOKENIZER, ["plain"])
    model = VerlogChatModel(engine=engine, tokenizer=_TOKENIZER)
    answer = await model.bind_tools([Answer], tool_choice="none").ainvoke("hi")
    assert answer.content == "plain" and "tools" not in _TOKENIZER.decode(engine.calls[-1]).lower()
    with pytest.raises(ValueError, match="not among the tools"):
        model.bind_tools([Answer], tool_choice="Other")
