"""Hermes tool-call parsing: good calls become tool_calls, bad ones invalid_tool_calls."""

from langchain_core.tools import tool

from tools.calculator import calculate
from verlog.llm.tool_calls import parse_tool_calls, tool_schemas


def test_plain_text_has_no_calls():
    parsed = parse_tool_calls("The answer is 4.")
    assert parsed.content == "The answer is 4." and not parsed.tool_calls and not parsed.invalid_tool_calls


def test_one_and_two_calls():
    text = (
        'Let me compute.\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "2+2"}}\n</tool_call>'
        '<tool_call>{"name": "calculate", "arguments": "{\\"expression\\": \\"3*3\\"}"}</tool_call>'
    )
    parsed = parse_tool_calls(text)
    assert parsed.content == "Let me compute."
    assert [c["args"] for c in parsed.tool_calls] == [{"expression": "2+2"}, {"expression": "3*3"}]
    assert all(c["name"] == "calculate" and c["id"].startswith("call_") for c in parsed.tool_calls)
    assert len({c["id"] for c in parsed.tool_calls}) == 2


def test_malformed_json_becomes_invalid_call_not_exception():
    parsed = parse_tool_calls('<tool_call>{"name": "calculate", "arguments": {"expression": </tool_call>')
    assert not parsed.tool_calls
    (bad,) = parsed.invalid_tool_calls
    assert "not valid JSON" in bad["error"] and bad["args"].startswith('{"name"')


def test_wrong_shapes_are_invalid():
    for body, reason in [
        ('["calculate"]', "JSON object"),
        ('{"arguments": {}}', "no string 'name'"),
        ('{"name": "calculate", "arguments": [1]}', "must be a JSON object"),
        ('{"name": "calculate", "arguments": "{oops"}', "not JSON"),
    ]:
        (bad,) = parse_tool_calls(f"<tool_call>{body}</tool_call>").invalid_tool_calls
        assert reason in bad["error"], body


def test_unclosed_block_cut_by_max_tokens():
    parsed = parse_tool_calls('<tool_call>{"name": "calculate", "arguments": {"expression": "1+1"}}')
    assert parsed.tool_calls[0]["args"] == {"expression": "1+1"}
    parsed = parse_tool_calls('<tool_call>{"name": "calcu')
    assert parsed.invalid_tool_calls and not parsed.tool_calls
    assert parsed.invalid_tool_calls[0]["name"] is None
    # cut inside the arguments: the call is invalid but names its tool
    (cut,) = parse_tool_calls('<tool_call>{"name": "calculate", "arguments": {"expression": "1+').invalid_tool_calls
    assert cut["name"] == "calculate" and "not valid JSON" in cut["error"]


def test_schemas_from_functions_and_tools():
    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    schemas = tool_schemas([calculate, add])
    assert [s["function"]["name"] for s in schemas] == ["calculate", "add"]
    assert schemas[0]["function"]["parameters"]["properties"]["expression"]["type"] == "string"
    assert "arithmetic" in schemas[0]["function"]["description"]


def test_calculator_tool():
    assert calculate("(3 + 4) * 12") == "84"
    assert calculate("7 / 2") == "3.5"
    assert calculate("1/0") == "Error: division by zero"
    assert calculate("__import__('os')").startswith("Error")
    assert calculate("2 ** 1000").startswith("Error")
