"""Guaranteed formats for ``VerlogChatModel``: forced tool calls, JSON responses, structured output.

``tool_choice`` "required"/"any"/a tool's name and ``response_format`` (OpenAI's ``json_schema``
and ``json_object``) become a :class:`~verlog.backends.base.Constraint` that the engine enforces
by token masking, so the answer is a well-formed call of an offered tool whose arguments follow
its schema, or JSON valid under the schema, whatever the model's weights (unless the token budget
ends first: ``finish_reason`` "length").

A forced tool call is still prefilled as before (``<tool_call>`` and, for a named tool on an
engine that reads Lark grammars, its name: those tokens end the prompt, they are not sampled);
the grammar covers the rest of the call and its closing ``</tool_call>``. On an engine that
enforces no constraints at all, the prefill alone remains (the model may still write a malformed
call, reported as an invalid tool call), and a ``response_format`` is refused with an error.

Objects in these schemas that do not say whether they allow other keys allow none (as OpenAI's
strict mode): a tool's arguments never carry keys its function does not take.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Literal, Sequence

from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import JsonOutputKeyToolsParser, PydanticToolsParser
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import BaseModel

from verlog.backends.base import Constraint
from verlog.backends.grammar import JSON_STYLE
from verlog.llm.tool_calls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

StructuredMethod = Literal["function_calling", "json_schema", "json_mode"]
STRUCTURED_METHODS: tuple[str, ...] = ("function_calling", "json_schema", "json_mode")

# JSON-schema keywords whose value is one schema, a list of schemas, or a map of name -> schema
_ONE = (
    "items",
    "additionalItems",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
)
_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def closed_schema(schema: Any) -> Any:
    """A copy of a JSON schema in which every object schema that lists ``properties`` without
    saying ``additionalProperties`` gets ``additionalProperties: false``."""
    schema = copy.deepcopy(schema)

    def close(node: Any) -> None:
        if not isinstance(node, dict):
            return
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for key in _ONE:
            close(node.get(key))
        if isinstance(node.get("additionalProperties"), dict):
            close(node["additionalProperties"])
        for key in _MANY:
            for sub in node.get(key) or ():
                close(sub)
        for key in _MAP:
            for sub in (node.get(key) or {}).values():
                close(sub)

    close(schema)
    return schema


def _styled(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` laid out as verlog writes JSON (``x-guidance``: its own settings win), for a
    schema embedded in a Lark grammar (a json_schema constraint gets the same layout from the
    engine's defaults)."""
    return {**schema, "x-guidance": {**JSON_STYLE, **(schema.get("x-guidance") or {})}}


def _arguments_schema(tool: dict[str, Any]) -> dict[str, Any]:
    parameters = tool["function"].get("parameters") or {"type": "object", "properties": {}}
    return closed_schema(parameters)


def _call_schema(tools: Sequence[dict[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """The JSON schema of a Hermes call payload ``{"name": ..., "arguments": {...}}`` of one of
    ``names``; ``$defs`` of each tool's parameters are lifted to the top (refs stay valid when
    every tool's definitions are distinct, and are renamed per tool otherwise)."""
    by_name = {t["function"]["name"]: t for t in tools}
    options, defs = [], {}
    for name in names:
        args = _arguments_schema(by_name[name])
        local = args.pop("$defs", None) or {}
        if any(k in defs for k in local):  # two tools define the same name: keep each its own
            prefix = f"{name}__"
            text = json.dumps(args)
            local_text = json.dumps(local)
            for k in local:
                text = text.replace(f'"#/$defs/{k}"', f'"#/$defs/{prefix}{k}"')
                local_text = local_text.replace(f'"#/$defs/{k}"', f'"#/$defs/{prefix}{k}"')
            args, local = json.loads(text), {f"{prefix}{k}": v for k, v in json.loads(local_text).items()}
        defs.update(local)
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": args},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    schema: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    if defs:
        schema = {**schema, "$defs": defs}
    return schema


def _closing_tag(tokenizer: Any) -> str:
    """``</tool_call>`` in Lark: the token itself when the tokenizer has it as one added token
    (llguidance matches such tokens by id, not by text), else the literal text."""
    ids = tokenizer(TOOL_CALL_CLOSE, add_special_tokens=False)["input_ids"]
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    if len(ids) == 1 and ids[0] in added:
        return f"<[{ids[0]}]>"
    return json.dumps(TOOL_CALL_CLOSE)


@dataclass(frozen=True)
class ForcedCall:
    """How a forced tool call is asked of the engine: the answer's prefilled text, and the
    constraint on the rest (``None`` when the engine enforces none)."""

    prefix: str
    constraint: Constraint | None


def forced_tool_call(
    tools: Sequence[dict[str, Any]],
    choice: str,
    engine_kinds: frozenset[str],
    tokenizer: Any,
) -> ForcedCall:
    """The prefill and constraint for ``choice`` ("required" or a tool's name) among ``tools``
    (OpenAI-format schemas) on an engine enforcing ``engine_kinds``."""
    names = [t["function"]["name"] for t in tools] if choice == "required" else [choice]
    opening = f"{TOOL_CALL_OPEN}\n"
    if "lark" in engine_kinds:
        close = _closing_tag(tokenizer)
        if choice == "required":
            call = json.dumps(_styled(_call_schema(tools, names)), ensure_ascii=False)
            return ForcedCall(opening, Constraint("lark", f'start: call "\\n" {close}\ncall: %json {call}\n'))
        by_name = {t["function"]["name"]: t for t in tools}
        args = json.dumps(_styled(_arguments_schema(by_name[choice])), ensure_ascii=False)
        prefix = f'{opening}{{"name": {json.dumps(choice, ensure_ascii=False)}, "arguments": '
        return ForcedCall(prefix, Constraint("lark", f'start: args "}}\\n" {close}\nargs: %json {args}\n'))
    if "json_schema" in engine_kinds:  # the call's JSON, without the closing tag
        return ForcedCall(opening, Constraint.json_schema(_call_schema(tools, names)))
    if choice == "required":
        return ForcedCall(opening, None)
    return ForcedCall(f'{opening}{{"name": {json.dumps(choice, ensure_ascii=False)}, "arguments": ', None)


def response_format_constraint(response_format: Any) -> Constraint | None:
    """The constraint of an OpenAI ``response_format``: ``{"type": "text"}`` (none),
    ``{"type": "json_object"}`` (any JSON object) or ``{"type": "json_schema", "json_schema":
    {"name": ..., "schema": {...}, "strict": ...}}``; a pydantic model class stands for its
    schema. Anything else raises ``ValueError`` naming what is accepted."""
    if response_format is None:
        return None
    if isinstance(response_format, type) and issubclass(response_format, BaseModel):
        return Constraint.json_schema(closed_schema(response_format.model_json_schema()))
    if not isinstance(response_format, dict) or response_format.get("type") not in (
        "text",
        "json_object",
        "json_schema",
    ):
        raise ValueError(
            f"unsupported response_format {response_format!r:.200}: expected {{'type': 'text'}}, "
            "{'type': 'json_object'} or {'type': 'json_schema', 'json_schema': {'name': ..., 'schema': {...}}}"
        )
    kind = response_format["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint.json_schema({"type": "object"})
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), (dict, bool)):
        raise ValueError("response_format json_schema needs 'json_schema': {'name': ..., 'schema': {...}}")
    schema = spec.get("schema", {})
    if schema is True or schema == {}:
        schema = {}
    elif schema is not False:
        schema = closed_schema(schema)
    return Constraint.json_schema(schema)


#: the keys of an OpenAI client's ``extra_body`` read as a constraint, named as SGLang's server
#: names them (so a graph that binds one constrains a ``ChatOpenAI`` on SGLang the same way)
EXTRA_BODY_CONSTRAINTS: tuple[str, ...] = ("regex",)


def extra_body_constraint(extra_body: Any) -> Constraint | None:
    """The constraint of an OpenAI client's ``extra_body``: ``{"regex": pattern}`` holds the whole
    answer to a regular expression (e.g. one of a game's action names). A dict without
    constraint keys is none; a key of another server's constraint dialect, or anything but a
    dict, raises ``ValueError`` naming what is accepted (a constraint must never be dropped
    silently)."""
    if extra_body is None:
        return None
    if not isinstance(extra_body, dict):
        raise ValueError(f"extra_body must be a dict, got {type(extra_body).__name__}")
    unknown = set(extra_body) - set(EXTRA_BODY_CONSTRAINTS)
    if unknown:
        raise ValueError(
            f"unsupported extra_body keys {sorted(unknown)}; accepted: {list(EXTRA_BODY_CONSTRAINTS)} "
            "(SGLang's names; JSON formats go in response_format)"
        )
    pattern = extra_body.get("regex")
    if pattern is None:
        return None
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"extra_body regex must be a non-empty string, got {pattern!r:.80}")
    return Constraint("regex", pattern)


def structured_output(
    model: Any,
    schema: dict[str, Any] | type,
    *,
    method: str = "function_calling",
    include_raw: bool = False,
    strict: bool | None = None,
) -> Runnable:
    """What ``VerlogChatModel.with_structured_output`` returns: the model bound to a forced call
    of ``schema``'s tool (``function_calling``), to a JSON response under ``schema``
    (``json_schema``) or to any JSON object (``json_mode``), piped into the matching parser.
    ``strict`` is accepted for compatibility: the output is always held to the schema."""
    if method not in STRUCTURED_METHODS:
        raise ValueError(
            f"unsupported method {method!r} for with_structured_output; expected one of {list(STRUCTURED_METHODS)}"
        )
    is_pydantic = is_basemodel_subclass(schema)  # pydantic 2, or pydantic.v1 models
    traced = {"ls_structured_output_format": {"kwargs": {"method": method, "strict": strict}, "schema": schema}}
    if method == "function_calling":
        name = convert_to_openai_tool(schema)["function"]["name"]
        llm = model.bind_tools([schema], tool_choice=name, **traced)
        parser: Runnable = (
            PydanticToolsParser(tools=[schema], first_tool_only=True)
            if is_pydantic
            else JsonOutputKeyToolsParser(key_name=name, first_tool_only=True)
        )
    elif method == "json_schema":
        if is_pydantic:
            json_schema = schema.model_json_schema() if hasattr(schema, "model_json_schema") else schema.schema()
        else:
            json_schema = convert_to_json_schema(schema)
        name = json_schema.get("title") or "response"
        llm = model.bind(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": name, "schema": json_schema, "strict": True},
            },
            **traced,
        )
        parser = PydanticOutputParser(pydantic_object=schema) if is_pydantic else JsonOutputParser()
    else:
        llm = model.bind(response_format={"type": "json_object"}, **traced)
        parser = PydanticOutputParser(pydantic_object=schema) if is_pydantic else JsonOutputParser()
    if not include_raw:
        return llm | parser
    parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
    failed = RunnablePassthrough.assign(parsed=lambda _: None)
    return RunnableMap(raw=llm) | parsed.with_fallbacks([failed], exception_key="parsing_error")
