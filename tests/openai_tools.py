"""Tool schemas the OpenAI-server tests send (OpenAI's ``tools`` format)."""

#: a calculator tool: one required string argument
CALCULATE = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
