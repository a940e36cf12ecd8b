"""Reproducible sampling: at temperature 1, an evaluation plays the same episodes one at a time or
many at once, on the embedded engine or through ``verlog serve-model``; parallel branches and
training slots keep their own draws whatever order their calls reach the engine in; a seeded row
draws alike alone, batched, after a cached prefix or under a grammar; serve-model answers the
same request with the same ``seed`` alike."""

from __future__ import annotations

import asyncio
import contextlib
import json
import operator
from pathlib import Path
from typing import Annotated

import pytest
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send
from typing_extensions import TypedDict

from verlog.backends.base import Constraint, SamplingParams
from verlog.backends.embedded import EmbeddedEngine
from verlog.cli import main
from verlog.llm import VerlogChatModel
from verlog.rollout import areport_reward
from verlog.rollout.recorder import TurnRecorder
from verlog.rollout.runner import run_episode
from verlog.rollout.slots import SlotRunner

ROOT = Path(__file__).resolve().parents[1]

#: the quick start's game and model (babyai-words, its random initial weights: answers of all
#: kinds at temperature 1), 10-step levels to keep it short
QUICK = [
    str(ROOT / "configs" / "quickstart.yaml"),
    "multi_turn.langgraph.graph_kwargs.max_steps=10",
    "model.device=cpu",
]


def _episodes(out: Path) -> dict[str, dict]:
    """The episodes of an evaluation's log, without what says when and how fast they ran (and the
    digest of the settings, which names the player)."""
    rows = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    return {r["episode_id"]: {k: v for k, v in r.items() if k not in ("seconds", "finished_at", "spec")} for r in rows}


@pytest.mark.timeout(900)  # four evaluations: generous for a loaded machine
def test_eval_plays_the_same_episodes_at_any_concurrency_and_through_serve_model(tmp_path, capsys):
    """``verlog eval`` at temperature 1, one episode at a time and four at once, on the embedded
    engine and against ``verlog serve-model`` serving the same weights: the same four episodes."""
    from verlog.models import load_causal_lm, load_tokenizer, resolve_model_path
    from verlog.serve import OpenAIServer, serve_in_thread

    def evaluate(name: str, concurrency: int, *player: str) -> None:
        out = tmp_path / f"{name}{concurrency}"
        args = ["eval", *QUICK, *player, "--episodes", "4", "--concurrency", str(concurrency), "--out", str(out)]
        assert main([*args, "--no-chart"]) == 0
        runs[f"{name}, concurrency {concurrency}"] = _episodes(out)

    runs: dict[str, dict] = {}
    for concurrency in (1, 4):
        evaluate("engine", concurrency)
    folder = resolve_model_path("babyai-words")
    tokenizer = load_tokenizer(folder)
    engine = EmbeddedEngine(load_causal_lm(folder), tokenizer)
    with serve_in_thread(OpenAIServer(engine, tokenizer, model_name="babyai-words")) as base_url:
        for concurrency in (1, 4):
            evaluate("serve-model", concurrency, "--base-url", base_url, "--model", "babyai-words", "--api-key", "k")
    engine.close()
    capsys.readouterr()
    first = runs["engine, concurrency 1"]
    assert len(first) == 4 and all(r["status"] == "ok" for r in first.values())
    for name, episodes in runs.items():
        assert episodes == first, name


class Branches(TypedDict):
    answers: Annotated[list, operator.add]


def fan_out_graph(model, delays):
    """Three parallel branches asking the same question twice each; branch ``i`` first waits
    ``delays[i]`` seconds (so the order the branches call in is the test's to choose)."""

    async def branch(state: dict) -> dict:
        await asyncio.sleep(delays[state["i"]])
        first = await model.ainvoke([HumanMessage("go")])
        again = await model.ainvoke([HumanMessage("go")])
        ids = tuple(first.response_metadata["response_ids"]), tuple(again.response_metadata["response_ids"])
        return {"answers": [(state["i"], *ids)]}

    async def end(state: Branches) -> dict:
        await areport_reward(1.0, terminated=True)
        return {}

    g = StateGraph(Branches)
    g.add_node("branch", branch)
    g.add_node("end", end)
    g.add_conditional_edges(START, lambda _: [Send("branch", {"i": i}) for i in range(3)], ["branch"])
    g.add_edge("branch", "end")
    g.add_edge("end", END)
    return g.compile()


@pytest.mark.parametrize("via", ["embedded", "sglang"])
async def test_parallel_branches_draw_alike_whatever_order_they_call_in(via, tiny_model, tiny_tokenizer):
    """A call's seed is named by its place (the branch, the count of calls made there), not by
    the order calls start: reversing the order the branches call in changes no answer, on the
    embedded engine and through the SGLang client (each request's ``sampling_seed``, here
    answered by the SGLang protocol's server in front of an embedded engine)."""
    from verlog.backends.sglang import SGLangEngine
    from verlog.backends.sglang_server import SGLangCompatServer

    engine = EmbeddedEngine(tiny_model, tiny_tokenizer)
    async with contextlib.AsyncExitStack() as stack:
        server = None
        if via == "sglang":
            server = await stack.enter_async_context(SGLangCompatServer(engine))
            client = await stack.enter_async_context(SGLangEngine(server.url, timeout_s=60.0))
        model = VerlogChatModel(
            engine=engine if server is None else client, tokenizer=tiny_tokenizer, temperature=1.0, max_tokens=8
        )

        async def answers(delays, key="episode 7") -> dict[int, tuple]:
            recorder = TurnRecorder("episode", sampling_key=key)
            episode = await run_episode(fan_out_graph(model, delays), {"answers": []}, recorder=recorder)
            assert episode.status == "ok" and len(episode.turns) == 6, episode.error
            return {i: (first, again) for i, first, again in episode.output["answers"]}

        forward = await answers((0.0, 0.05, 0.1))
        backward = await answers((0.1, 0.05, 0.0))
        if server is not None:  # every request named its seed, the same six both times
            seeds = [call.body["sampling_params"].get("sampling_seed") for call in server.calls]
            assert len(seeds) == 12 and None not in seeds and len(set(seeds)) == 6
    engine.close()
    assert forward == backward
    # the same question, each call its own draw: branches and a branch's two calls differ
    draws = [ids for pair in forward.values() for ids in pair]
    assert len(set(draws)) == len(draws) == 6


class Retried(TypedDict):
    tries: int


async def test_a_retried_node_draws_afresh(tiny_model, tiny_tokenizer):
    """A node retried by its ``RetryPolicy`` asks again at the same place: its next call draws
    anew (the same draw would likely fail the same way), and the same on every run."""
    from langgraph.types import RetryPolicy

    engine = EmbeddedEngine(tiny_model, tiny_tokenizer)
    model = VerlogChatModel(engine=engine, tokenizer=tiny_tokenizer, temperature=1.0, max_tokens=8)
    tries: list[int] = []

    async def ask(state: Retried) -> dict:
        await model.ainvoke([HumanMessage("go")])
        tries.append(1)
        if len(tries) % 2:  # every first attempt fails after its call
            raise ValueError("unparsable answer")
        return {"tries": 2}

    g = StateGraph(Retried)
    g.add_node(
        "ask", ask, retry_policy=RetryPolicy(max_attempts=2, initial_interval=0.0, jitter=False, retry_on=ValueError)
    )
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    graph = g.compile()

    async def play() -> list[tuple[int, ...]]:
        recorder = TurnRecorder("retried", sampling_key="retried", keep_discarded=True)
        episode = await run_episode(graph, {"tries": 0}, recorder=recorder)
        assert episode.status == "ok" and episode.discarded_calls == 1, episode.error
        return [tuple(t.response_ids) for t in episode.turns]

    first, again = await play(), await play()
    engine.close()
    assert first == again and first[0] != first[1]


class Game(TypedDict):
    seed: int
    t: int
    answers: Annotated[list, operator.add]


def slow_game(model, delay_of):
    """Three turns; before each call the policy waits ``delay_of(seed)`` seconds."""

    async def policy(state: Game) -> dict:
        await asyncio.sleep(delay_of(state["seed"]))
        await model.ainvoke([HumanMessage(f"task {state['seed']} turn {state['t']}")])
        return {}

    async def environment(state: Game) -> dict:
        t = state["t"] + 1
        await areport_reward(0.0, terminated=t >= 3)
        return {"t": t}

    g = StateGraph(Game)
    g.add_node("policy", policy)
    g.add_node("environment", environment)
    g.add_edge(START, "policy")
    g.add_edge("policy", "environment")
    g.add_conditional_edges("environment", lambda s: END if s["t"] >= 3 else "policy", ["policy", END])
    return g.compile()


async def test_training_slots_draw_alike_whatever_order_their_calls_arrive_in(tiny_model, tiny_tokenizer):
    """Training's rule: a slot's calls are seeded from ``sampling_seed``, the slot's episode
    counter and the call's place. Slots whose calls reach the engine in another order draw the
    same turns; the two slots of a group play one task and still draw apart; another
    ``sampling_seed`` draws otherwise."""

    async def batch_of(delay_of, sampling_seed=0) -> list[list[tuple[int, ...]]]:
        engine = EmbeddedEngine(tiny_model, tiny_tokenizer)

        def build(gated):
            return slow_game(VerlogChatModel(engine=gated, tokenizer=tiny_tokenizer, max_tokens=6), delay_of)

        runner = SlotRunner(
            engine,
            build,
            lambda seed: {"seed": seed, "t": 0, "answers": []},
            num_envs=4,
            turns_per_env=4,
            group_size=2,
            sampling_seed=sampling_seed,
        )
        try:
            batch = await runner.collect()
        finally:
            await runner.aclose()
            engine.close()
        return [[tuple(turn.response_ids) for turn in turns] for turns in batch.turns]

    forward = await batch_of(lambda seed: 0.02 * (seed % 4))
    backward = await batch_of(lambda seed: 0.02 * (3 - seed % 4))
    assert forward == backward
    assert forward[0] != forward[1] and forward[2] != forward[3]  # one group, one task, their own draws
    assert await batch_of(lambda seed: 0.0, sampling_seed=1) != forward


def _prompt(tokenizer, text: str) -> list[int]:
    return tokenizer(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)[
        "input_ids"
    ]


@pytest.mark.parametrize("cache_bytes", [0, 64 << 20], ids=["no-prefix-cache", "prefix-cache"])
async def test_a_seeded_row_draws_alike_alone_batched_after_a_cached_prefix_or_constrained(
    cache_bytes, tiny_model, tiny_tokenizer
):
    """The rows beside a seeded request (other lengths, other settings, unseeded ones, rows
    joining mid-flight), the prefix cache (its prompt's start computed by an earlier call) and a
    grammar leave its tokens as they are alone on a fresh engine."""
    shared = "You play a game on a grid. Valid actions: turn left, turn right, go forward. " * 2
    prompts = [_prompt(tiny_tokenizer, shared + "hello " * i) for i in range(1, 7)]
    digits = Constraint("regex", "[0-9]{2,6}")
    settings = [
        SamplingParams(temperature=1.0, max_new_tokens=10, seed=11),
        SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=10, seed=12),
        SamplingParams(temperature=1.0, top_k=50, max_new_tokens=10, seed=13, stop=("e",)),
        SamplingParams(temperature=1.0, max_new_tokens=10, seed=14, constraint=digits),
    ]

    async def alone(i: int) -> list[int]:
        engine = EmbeddedEngine(tiny_model, tiny_tokenizer, prefix_cache_bytes=cache_bytes)
        try:
            return (await engine.generate(prompts[i], settings[i])).token_ids
        finally:
            engine.close()

    expected = [await alone(i) for i in range(len(settings))]
    engine = EmbeddedEngine(tiny_model, tiny_tokenizer, max_batch_size=8, prefix_cache_bytes=cache_bytes)
    await engine.generate(prompts[0][:-3], SamplingParams(max_new_tokens=4))  # a cached start, if any

    async def late(i: int, params: SamplingParams, delay: float):
        await asyncio.sleep(delay)
        return await engine.generate(prompts[i], params)

    noise = [late(4, SamplingParams(max_new_tokens=12), 0.0), late(5, SamplingParams(max_new_tokens=3), 0.003)]
    together = await asyncio.gather(*(late(i, s, 0.002 * i) for i, s in enumerate(settings)), *noise)
    engine.close()
    assert [g.token_ids for g in together[: len(settings)]] == expected
    assert tiny_tokenizer.decode(expected[3], skip_special_tokens=True).isdigit()  # the grammar held


async def test_serve_model_answers_a_seeded_request_alike(tiny_model, tiny_tokenizer):
    """``verlog serve-model``: the same request with the same ``seed`` gets the same answer, alone
    or among other requests; another seed another answer."""
    import openai

    from verlog.serve import OpenAIServer, serve_in_thread

    engine = EmbeddedEngine(tiny_model, tiny_tokenizer)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "roll"}], "max_tokens": 12, "temperature": 1.0}
    with serve_in_thread(OpenAIServer(engine, tiny_tokenizer, model_name="tiny")) as base_url:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)

        async def answer(**extra) -> str:
            reply = await client.chat.completions.create(**body, **extra)
            return reply.choices[0].message.content

        async def streamed(**extra) -> str:
            chunks = await client.chat.completions.create(**body, **extra, stream=True)
            return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])

        first = await answer(seed=7)
        crowd = await asyncio.gather(answer(), answer(seed=8), answer(seed=7), answer(), streamed(seed=7))
        other = await answer(seed=8)
        await client.close()
    engine.close()
    assert crowd[2] == crowd[4] == first  # streamed too
    assert other == crowd[1] != first


class Rolls(TypedDict):
    rolls: list


async def test_the_endpoint_player_sends_each_call_its_seed(tiny_model, tiny_tokenizer):
    """``verlog eval --base-url``'s ``ChatOpenAI`` sends every call the seed its episode's recorder
    named (OpenAI's ``seed``), whether the graph calls ``ainvoke``, ``astream`` or ``abatch``: the
    same episode gets the same answers from ``verlog serve-model`` on every run, another episode
    other answers."""
    from verlog.evaluation.players import EndpointModel
    from verlog.serve import OpenAIServer, serve_in_thread

    engine = EmbeddedEngine(tiny_model, tiny_tokenizer)
    with serve_in_thread(OpenAIServer(engine, tiny_tokenizer, model_name="tiny")) as base_url:
        model = EndpointModel(base_url, "tiny", api_key="k", max_retries=0)._client(temperature=1.0, max_tokens=8)

        async def roll(state: Rolls) -> dict:
            one = (await model.ainvoke("roll")).content
            streamed = "".join([chunk.content async for chunk in model.astream("roll")])
            batched = [m.content for m in await model.abatch(["roll", "roll"])]
            return {"rolls": [one, streamed, *batched]}

        g = StateGraph(Rolls)
        g.add_node("roll", roll)
        g.add_edge(START, "roll")
        g.add_edge("roll", END)
        graph = g.compile()

        async def play(key: str) -> list[str]:
            episode = await run_episode(graph, {"rolls": []}, recorder=TurnRecorder(key, sampling_key=key))
            assert episode.status == "ok", episode.error
            return episode.output["rolls"]

        first, again, other = await play("episode 1"), await play("episode 1"), await play("episode 2")
    engine.close()
    assert first == again
    assert len(set(first)) == 4 and not set(first) & set(other)
