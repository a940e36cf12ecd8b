"""Constrained decoding: forced tool calls and JSON formats hold whatever the model's weights.

The tiny model is random: without a mask its answers are noise. With one, ``tool_choice``
"required"/named gives a call of an offered tool whose arguments satisfy the tool's schema, and
``with_structured_output`` / ``response_format`` give a valid object, for every seed; both
through ``VerlogChatModel`` and through ``verlog serve-model``'s HTTP endpoint with the official
``openai`` client and LangChain's ``ChatOpenAI``. The recorded logprobs are those of the masked
distribution; requests without a constraint are never masked; engines that cannot enforce a
constraint refuse it.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Literal

import jsonschema
import pytest
import torch
from langchain_core.messages import HumanMessage
from pydantic import BaseModel, Field

from verlog.backends.base import Constraint, InvalidConstraintError, SamplingParams, UnsupportedConstraintError
from verlog.backends.embedded import EmbeddedEngine
from verlog.backends.grammar import GrammarCompiler
from verlog.backends.sglang import SGLangEngine
from verlog.llm import VerlogChatModel
from verlog.llm.constrained import closed_schema
from verlog.serve import OpenAIServer
from verlog.testing.scripted_engine import ScriptedEngine

SEEDS = range(20)


class Weather(BaseModel):
    """The weather forecast asked for."""

    city: str = Field(max_length=16)
    days: int
    unit: Literal["celsius", "fahrenheit"]
    detailed: bool


def get_time(zone: Literal["utc", "local"], precise: bool = False) -> str:
    """The current time in a zone."""
    return zone


@pytest.fixture(scope="module")
def engine(tiny_model, tiny_tokenizer):
    eng = EmbeddedEngine(tiny_model, tiny_tokenizer, seed=0)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def chat(engine, tiny_tokenizer):
    return VerlogChatModel(engine=engine, tokenizer=tiny_tokenizer, temperature=1.0, max_tokens=200)


def tool_parameters(model: VerlogChatModel) -> dict[str, dict]:
    bound = model.bind_tools([Weather, get_time])
    return {t["function"]["name"]: t["function"]["parameters"] for t in bound.kwargs["tools"]}


def assert_valid_call(call: dict, parameters: dict[str, dict]) -> None:
    assert call["name"] in parameters, call
    jsonschema.validate(call["args"], closed_schema(parameters[call["name"]]))


# ------------------------------------------------------------------------------ chat model
async def test_required_tool_choice_gives_a_schema_valid_call_for_every_seed(chat, tiny_tokenizer):
    parameters = tool_parameters(chat)
    bound = chat.bind_tools([Weather, get_time], tool_choice="required")
    answers = await asyncio.gather(*[bound.ainvoke("What will the weather be?", seed=s) for s in SEEDS])
    for answer in answers:
        assert not answer.invalid_tool_calls and len(answer.tool_calls) == 1, answer
        assert_valid_call(answer.tool_calls[0], parameters)
        meta = answer.response_metadata
        assert meta["finish_reason"] == "stop" and meta["sampling"]["constraint"] == "lark"
        # the call is closed as the Hermes format says, then the model's end token
        assert tiny_tokenizer.decode(meta["response_ids"]).endswith("}\n</tool_call><|im_end|>")
    assert {a.tool_calls[0]["name"] for a in answers} == {"Weather", "get_time"}  # the choice is the model's


async def test_named_tool_choice_gives_that_tool_for_every_seed(chat):
    parameters = tool_parameters(chat)
    bound = chat.bind_tools([Weather, get_time], tool_choice="get_time")
    answers = await asyncio.gather(*[bound.ainvoke("What time is it?", seed=s) for s in SEEDS])
    for answer in answers:
        (call,) = answer.tool_calls
        assert call["name"] == "get_time"
        assert_valid_call(call, parameters)


@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
async def test_structured_output_is_valid_for_every_seed(chat, method):
    results = await asyncio.gather(*[_structured(chat, method, s) for s in SEEDS])
    for result in results:
        assert result["parsing_error"] is None, result
        assert isinstance(result["parsed"], Weather)


async def _structured(chat: VerlogChatModel, method: str, seed: int) -> dict:
    model = chat.model_copy(update={"seed": seed})
    return await model.with_structured_output(Weather, method=method, include_raw=True).ainvoke("Forecast?")


async def test_json_mode_and_dict_schemas(chat):
    for seed in range(5):
        model = chat.model_copy(update={"seed": seed})
        anything = await model.with_structured_output(
            Weather.model_json_schema(), method="json_mode", include_raw=True
        ).ainvoke("JSON please")
        assert anything["parsing_error"] is None and isinstance(anything["parsed"], dict)
        as_dict = await model.with_structured_output(Weather.model_json_schema(), method="json_schema").ainvoke("?")
        jsonschema.validate(as_dict, Weather.model_json_schema())
    raw = await chat.bind(
        response_format={
            "type": "json_schema",
            "json_schema": {
                "name": "pick",
                "schema": {"type": "object", "properties": {"n": {"enum": [1, 2, 3]}}, "required": ["n"]},
            },
        },
    ).ainvoke("pick", seed=3)
    assert json.loads(raw.content)["n"] in (1, 2, 3)
    with pytest.raises(ValueError, match="unsupported response_format"):
        await chat.bind(response_format={"type": "xml"}).ainvoke("?")
    with pytest.raises(ValueError, match="cannot be combined"):
        await (
            chat.bind_tools([Weather], tool_choice="Weather").bind(response_format={"type": "json_object"}).ainvoke("?")
        )


async def test_structured_output_streams(chat):
    structured = chat.model_copy(update={"seed": 1}).with_structured_output(Weather)
    chunks = [c async for c in structured.astream("Forecast?")]
    assert chunks and isinstance(chunks[-1], Weather)


async def test_unconstrained_calls_are_not_masked(engine, chat, tiny_tokenizer):
    """A request without a constraint gets the same tokens whether or not a constrained one is
    decoded in the same batch, and a plain ``tool_choice=auto`` call is not constrained."""
    prompt = tiny_tokenizer("tell me something", add_special_tokens=False)["input_ids"]
    plain = SamplingParams(temperature=1.0, max_new_tokens=30, seed=11)
    alone = await engine.generate(prompt, plain)
    constrained = SamplingParams(
        temperature=1.0,
        max_new_tokens=30,
        seed=12,
        constraint=Constraint.json_schema(
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
        ),
    )
    together, _ = await asyncio.gather(engine.generate(prompt, plain), engine.generate(prompt, constrained))
    assert together.token_ids == alone.token_ids
    auto = await chat.bind_tools([Weather]).ainvoke("hi", seed=2)
    assert "constraint" not in auto.response_metadata["sampling"]


# ------------------------------------------------------------------------------ engine
async def test_logprobs_are_those_of_the_masked_distribution(engine, tiny_model, tiny_tokenizer):
    """Each recorded logprob equals ``log_softmax(masked logits / temperature)`` of the chosen
    token, the mask recomputed here by replaying the tokens through a fresh matcher."""
    temperature = 0.7
    constraint = Constraint.json_schema(Weather.model_json_schema())
    prompt = tiny_tokenizer("the weather:", add_special_tokens=False)["input_ids"]
    gen = await engine.generate(
        prompt, SamplingParams(temperature=temperature, max_new_tokens=120, seed=1, constraint=constraint)
    )
    assert gen.finish_reason == "stop"
    Weather.model_validate_json(tiny_tokenizer.decode(gen.token_ids[:-1]))
    ids = torch.tensor([prompt + gen.token_ids])
    with torch.inference_mode():
        logits = tiny_model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    matcher = GrammarCompiler(tiny_tokenizer, logits.shape[1], engine.eos_token_ids).matcher(constraint)
    masked_lp, plain_lp = [], []
    for step, token in enumerate(gen.token_ids):
        allowed = matcher.allowed(logits.shape[1])
        assert allowed[token]
        masked = logits[step].masked_fill(~allowed, float("-inf"))
        masked_lp.append(torch.log_softmax(masked / temperature, -1)[token].item())
        plain_lp.append(torch.log_softmax(logits[step] / temperature, -1)[token].item())
        if token not in engine.eos_token_ids:
            matcher.accept(token)
    assert gen.logprobs == pytest.approx(masked_lp, abs=1e-4)
    assert max(abs(a - b) for a, b in zip(gen.logprobs, plain_lp)) > 0.1  # the mask mattered


async def test_engine_constraint_errors(engine, tiny_tokenizer):
    prompt = tiny_tokenizer("x", add_special_tokens=False)["input_ids"]
    with pytest.raises(InvalidConstraintError, match="invalid lark constraint"):
        await engine.generate(prompt, SamplingParams(constraint=Constraint("lark", "start: (")))
    regex = await engine.generate(
        prompt, SamplingParams(max_new_tokens=20, seed=0, constraint=Constraint("regex", "(yes|no)"))
    )
    assert tiny_tokenizer.decode(regex.token_ids, skip_special_tokens=True) in ("yes", "no")
    with pytest.raises(ValueError, match="kind must be one of"):
        Constraint("ebnf", "root ::= 'a'")
    with pytest.raises(ValueError, match="must be JSON text"):
        Constraint("json_schema", "{not json")


async def test_engines_that_cannot_enforce_a_constraint_refuse_it(tiny_tokenizer):
    scripted = ScriptedEngine(tiny_tokenizer, ["{}"])
    with pytest.raises(UnsupportedConstraintError, match="ScriptedEngine cannot enforce a 'json_schema'"):
        await scripted.generate([1, 2], SamplingParams(constraint=Constraint.json_schema({"type": "object"})))
    with pytest.raises(UnsupportedConstraintError):
        async for _ in scripted.stream([1, 2], SamplingParams(constraint=Constraint("regex", "a"))):
            pass
    model = VerlogChatModel(engine=scripted, tokenizer=tiny_tokenizer)
    with pytest.raises(ValueError, match="needs constrained decoding, which ScriptedEngine does not do"):
        await model.with_structured_output(Weather, method="json_schema").ainvoke("?")
    # SGLang's /generate enforces JSON schemas and regexes itself: they are passed through
    sglang = SGLangEngine("http://127.0.0.1:9")
    schema = Constraint.json_schema({"type": "object"})
    assert (
        sglang.build_payload([1], SamplingParams(constraint=schema))["sampling_params"]["json_schema"] == schema.grammar
    )
    assert (
        sglang.build_payload([1], SamplingParams(constraint=Constraint("regex", "a+")))["sampling_params"]["regex"]
        == "a+"
    )
    with pytest.raises(UnsupportedConstraintError, match="cannot enforce a 'lark'"):
        await sglang.generate([1], SamplingParams(constraint=Constraint("lark", 'start: "a"')))
    # ... so a forced tool call on SGLang is held to the call's JSON schema
    plan = VerlogChatModel(engine=sglang, tokenizer=tiny_tokenizer).plan_call(
        [HumanMessage("?")], [t for t in tool_schemas_of(Weather)], "required"
    )
    assert plan.constraint.kind == "json_schema" and plan.prefix == "<tool_call>\n"
    await sglang.aclose()


def tool_schemas_of(*tools) -> list[dict]:
    from verlog.llm.tool_calls import tool_schemas

    return tool_schemas(tools)


async def test_an_extra_body_regex_holds_every_answer(chat, engine):
    """``bind(extra_body={"regex": ...})`` (SGLang's field) holds the answer to the pattern for every
    seed; its turns say so; a key of another dialect, a regex with a JSON format or with a forced
    tool call, and a pattern that does not compile are refused, not dropped."""
    words = ("turn left", "turn right", "go forward")
    bound = chat.bind(extra_body={"regex": "(turn left|turn right|go forward)"}, max_tokens=12)
    answers = await asyncio.gather(*[bound.ainvoke("Which way?", seed=s) for s in SEEDS])
    assert all(a.content in words for a in answers), [a.content for a in answers]
    assert all(a.response_metadata["sampling"]["constraint"] == "regex" for a in answers)
    assert all(a.response_metadata["finish_reason"] == "stop" for a in answers)
    plain = await chat.bind(max_tokens=12).ainvoke("Which way?", seed=0)
    assert plain.response_metadata["sampling"].get("constraint") is None
    with pytest.raises(ValueError, match=r"unsupported extra_body keys \['guided_regex'\]; accepted: \['regex'\]"):
        await chat.bind(extra_body={"guided_regex": "a"}).ainvoke("?")
    with pytest.raises(ValueError, match="cannot be combined"):
        await chat.bind(extra_body={"regex": "a"}, response_format={"type": "json_object"}).ainvoke("?")
    with pytest.raises(ValueError, match="extra_body regex and a forced tool_choice cannot be combined"):
        await chat.bind_tools([get_time], tool_choice="get_time").bind(extra_body={"regex": "a"}).ainvoke("?")
    with pytest.raises(InvalidConstraintError, match="invalid regex constraint"):
        await chat.bind(extra_body={"regex": "(unclosed"}).ainvoke("?")


# ------------------------------------------------------------------------------ serve-model
async def test_serve_model_takes_sglangs_regex_field_from_chat_openai(engine, tiny_tokenizer):
    """The same binding on LangChain's ``ChatOpenAI`` sends ``regex`` in the body, as SGLang's server
    reads it: ``verlog serve-model`` holds the answer to it, and refuses a bad pattern naming the field."""
    openai = pytest.importorskip("openai")
    langchain_openai = pytest.importorskip("langchain_openai")
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny") as server:
        model = langchain_openai.ChatOpenAI(
            base_url=server.base_url, api_key="unused", model="tiny", max_tokens=12, max_retries=0
        )
        answers = await asyncio.gather(
            *[model.bind(extra_body={"regex": "(yes|no)"}, seed=s).ainvoke("Agree?") for s in SEEDS]
        )
        assert {a.content for a in answers} <= {"yes", "no"}
        oai = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as err:
            await oai.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "?"}], extra_body={"regex": "(unclosed"}
            )
        assert err.value.body["param"] == "regex" and "invalid regex" in err.value.body["message"]


async def test_serve_model_forced_tool_calls_with_the_openai_client(engine, tiny_tokenizer):
    openai = pytest.importorskip("openai")
    tools = [{"type": "function", "function": s["function"]} for s in tool_schemas_of(Weather, get_time)]
    parameters = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny") as server:
        oai = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        for choice in ("required", {"type": "function", "function": {"name": "Weather"}}):
            replies = await asyncio.gather(
                *[
                    oai.chat.completions.create(
                        model="tiny",
                        messages=[{"role": "user", "content": "weather?"}],
                        tools=tools,
                        tool_choice=choice,
                        seed=s,
                        max_tokens=200,
                    )
                    for s in SEEDS
                ]
            )
            for reply in replies:
                c = reply.choices[0]
                assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1, c
                call = c.message.tool_calls[0].function
                if isinstance(choice, dict):
                    assert call.name == "Weather"
                assert_valid_call({"name": call.name, "args": json.loads(call.arguments)}, parameters)
        # response_format json_schema, with the client's own parse helper
        replies = await asyncio.gather(
            *[
                oai.chat.completions.parse(
                    model="tiny",
                    messages=[{"role": "user", "content": "weather?"}],
                    response_format=Weather,
                    seed=s,
                    max_tokens=200,
                )
                for s in SEEDS
            ]
        )
        assert all(isinstance(r.choices[0].message.parsed, Weather) for r in replies)
        # streamed: the pieces join into the same valid object
        stream = await oai.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "weather?"}],
            seed=4,
            max_tokens=200,
            stream=True,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "Weather", "schema": Weather.model_json_schema()},
            },
        )
        pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        assert len([p for p in pieces if p]) > 1
        Weather.model_validate_json("".join(pieces))
        # json_object: any object (a random model rarely closes one within the budget; when the
        # budget ends first, finish_reason says "length")
        replies = await asyncio.gather(
            *[
                oai.chat.completions.create(
                    model="tiny",
                    messages=[{"role": "user", "content": "json"}],
                    response_format={"type": "json_object"},
                    seed=s,
                    max_tokens=60,
                )
                for s in SEEDS
            ]
        )
        for reply in replies:
            c = reply.choices[0]
            assert c.message.content.startswith("{")
            if c.finish_reason == "stop":
                assert isinstance(json.loads(c.message.content), dict)


async def test_serve_model_structured_output_with_chat_openai(engine, tiny_tokenizer):
    langchain_openai = pytest.importorskip("langchain_openai")
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny") as server:
        for method in ("json_schema", "function_calling"):
            results = await asyncio.gather(
                *[
                    langchain_openai.ChatOpenAI(
                        base_url=server.base_url, api_key="unused", model="tiny", seed=s, max_tokens=200, max_retries=0
                    )
                    .with_structured_output(Weather, method=method)
                    .ainvoke("Forecast?")
                    for s in SEEDS
                ]
            )
            assert all(isinstance(r, Weather) for r in results), method


async def test_serve_model_refuses_formats_it_cannot_enforce(tiny_tokenizer):
    openai = pytest.importorskip("openai")
    async with OpenAIServer(ScriptedEngine(tiny_tokenizer, ["{}"]), tiny_tokenizer, model_name="tiny") as server:
        oai = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as err:
            await oai.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "?"}], response_format={"type": "json_object"}
            )
        assert err.value.body["param"] == "response_format" and "constrained decoding" in err.value.body["message"]
        with pytest.raises(openai.BadRequestError) as err:
            await oai.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "?"}], response_format={"type": "json_schema"}
            )
        assert err.value.body["param"] == "response_format"


async def test_serve_model_refuses_a_schema_that_does_not_compile(engine, tiny_tokenizer):
    openai = pytest.importorskip("openai")
    bad = {
        "type": "json_schema",
        "json_schema": {
            "name": "x",
            "schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}, "required": ["a"]},
        },
    }
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny") as server:
        oai = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as err:
                await oai.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "?"}], response_format=bad, stream=stream
                )
            assert err.value.body["param"] == "response_format" and "invalid" in err.value.body["message"]
        ok = await oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "?"}], max_tokens=4)
        assert ok.choices[0].message.content is not None  # the server keeps serving


# ------------------------------------------------------------------------------ training rollouts
async def test_a_training_graph_that_forces_a_tool_call_records_constrained_turns(engine, tiny_tokenizer):
    """Slot rollouts (training) pass a graph's constraint through the runner's gate to the
    engine: every recorded turn is a valid call, with the masked distribution's logprobs."""
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    from verlog.rollout import areport_reward
    from verlog.rollout.slots import SlotRunner

    class State(TypedDict):
        seed: int

    def build(gated):
        model = VerlogChatModel(engine=gated, tokenizer=tiny_tokenizer, max_tokens=200)
        assert gated.constraint_kinds == engine.constraint_kinds
        forced = model.bind_tools([get_time], tool_choice="required")

        async def policy(state: State) -> dict:
            await forced.ainvoke([HumanMessage(f"time? ({state['seed']})")], seed=state["seed"])
            await areport_reward(1.0, terminated=True)
            return {}

        g = StateGraph(State)
        g.add_node("policy", policy)
        g.add_edge(START, "policy")
        g.add_edge("policy", END)
        return g.compile()

    runner = SlotRunner(
        engine,
        build,
        lambda seed: {"seed": seed},
        num_envs=2,
        turns_per_env=2,
        graph_config={"recursion_limit": 10},
        seed=0,
    )
    try:
        batch = await runner.collect()
    finally:
        await runner.aclose()
    turns = batch.flat_turns()
    assert len(turns) == 4
    for turn in turns:
        # one tool: "required" names it, so the prompt ends with the call's opening and name
        assert tiny_tokenizer.decode(turn.prompt_ids).endswith('<tool_call>\n{"name": "get_time", "arguments": ')
        text = tiny_tokenizer.decode(turn.response_ids, skip_special_tokens=True)
        assert text.endswith("}\n</tool_call>")
        arguments = json.loads(text.removesuffix("}\n</tool_call>"))
        jsonschema.validate(
            arguments,
            closed_schema(tool_parameters(VerlogChatModel(engine=engine, tokenizer=tiny_tokenizer))["get_time"]),
        )
        # the closing tag is the only token the grammar allows there: probability 1 once masked
        close = turn.response_ids.index(tiny_tokenizer.convert_tokens_to_ids("</tool_call>"))
        assert turn.logprobs[close] == pytest.approx(0.0, abs=1e-6)


def test_closed_schema_closes_objects_that_do_not_say():
    schema = {
        "type": "object",
        "properties": {
            "properties": {"type": "object", "properties": {"x": {"type": "integer"}}},
            "open": {"type": "object", "properties": {}, "additionalProperties": True},
            "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
        },
        "$defs": {"Item": {"type": "object", "properties": {"y": {"type": "string"}}}},
    }
    closed = closed_schema(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["properties"]["additionalProperties"] is False  # a property named "properties"
    assert "additionalProperties" not in closed["properties"]["properties"]["properties"]  # a map, not a schema
    assert closed["properties"]["open"]["additionalProperties"] is True  # said explicitly: kept
    assert closed["$defs"]["Item"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the caller's schema is not changed


# ------------------------------------------------------------------------------ word-level models
async def test_a_word_level_model_takes_regex_constraints_exactly():
    """llguidance cannot read the WordPiece decoder of verlog's word-level models; the engine
    gives it each token's text plus the space that decoder writes between words. A regex then
    holds the decoded answer exactly (one word or several, never a word's prefix: ``do`` is not
    a way into ``down``), so ``constrain_answers`` works with such a model; grammars that
    describe JSON or Lark text are refused, naming what the model takes."""
    from verlog.models import load_causal_lm, load_tokenizer, resolve_model_path

    folder = resolve_model_path("sokoban-words")
    tokenizer = load_tokenizer(folder)
    engine = EmbeddedEngine(load_causal_lm(folder), tokenizer, seed=0)
    try:
        chat = VerlogChatModel(engine=engine, tokenizer=tokenizer, temperature=1.0, max_tokens=4)
        one = chat.bind(extra_body={"regex": "(up|down)"})
        several = chat.bind(extra_body={"regex": "(up|left)( (down|right))+"})
        singles = await asyncio.gather(*[one.ainvoke("sokoban", seed=s) for s in SEEDS])
        phrases = await asyncio.gather(*[several.ainvoke("sokoban", seed=s) for s in SEEDS])
        with pytest.raises(InvalidConstraintError, match="allowed for such a model: regex"):
            await chat.bind(response_format={"type": "json_object"}).ainvoke("sokoban")
    finally:
        engine.close()
    assert {a.content for a in singles} == {"up", "down"}
    for answer in singles:
        assert len(answer.response_metadata["response_ids"]) <= 2  # the word, then the end token
        assert answer.response_metadata["sampling"]["constraint"] == "regex"
    assert all(re.fullmatch("(up|left)( (down|right))+", a.content) for a in phrases)
    assert len({a.content for a in phrases}) > 2
    # a tokenizer without a decoder (``toy``'s) joins its words with spaces too
    toy = load_tokenizer(resolve_model_path("toy"))
    matcher = GrammarCompiler(toy, len(toy), (toy.eos_token_id,)).matcher(Constraint("regex", "(left|right)"))
    allowed = matcher.allowed(len(toy)).nonzero().flatten().tolist()
    assert sorted(toy.convert_ids_to_tokens(allowed)) == ["left", "right"]
