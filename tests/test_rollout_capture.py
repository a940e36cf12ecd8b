"""Every model call of a graph is captured token-exact, whatever the graph does with its history.

For each recorded turn: ``prompt_ids`` equal the chat template applied to exactly the messages
that call received; ``response_ids`` are the engine's ids and decode to the message content;
one logprob per id, agreeing with a teacher-forced forward pass of the same model.
Graphs: one that trims its history (graphs/guess_number.py), one with two LLM nodes with their
own sampling settings, one with a sub-graph.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langgraph.graph import END, START, MessagesState, StateGraph

from verlog.backends.embedded import EmbeddedEngine
from verlog.graph_file import load_graph_file
from verlog.llm import VerlogChatModel
from verlog.llm.prompt import to_chat_dicts
from verlog.rollout import Episode, run_episode, run_episodes

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def engine(tiny_model, tiny_tokenizer):
    engine = EmbeddedEngine(tiny_model, tiny_tokenizer, seed=0)
    yield engine
    engine.close()


@pytest.fixture()
def model(engine, tiny_tokenizer):
    return VerlogChatModel(engine=engine, tokenizer=tiny_tokenizer, max_tokens=24)


def check_turns_exact(episodes: list[Episode], tokenizer: Any, lm: torch.nn.Module, tools=None) -> int:
    """Assert the capture contract on every turn; return how many turns were checked."""
    checked = 0
    for episode in episodes:
        assert not episode.failed, episode.error
        for turn in episode.turns:
            expected_text = tokenizer.apply_chat_template(
                to_chat_dicts(turn.messages), tools=tools, tokenize=False, add_generation_prompt=True
            )
            assert turn.prompt_ids == tokenizer(expected_text, add_special_tokens=False)["input_ids"]
            assert len(turn.logprobs) == len(turn.response_ids) > 0
            assert torch.allclose(forced_logprobs(lm, turn), torch.tensor(turn.logprobs), atol=1e-3)
            checked += 1
    return checked


def forced_logprobs(lm: torch.nn.Module, turn: Any) -> torch.Tensor:
    """The logprob of each of the turn's response ids under a teacher-forced pass of ``lm`` (at
    the turn's temperature, before any top-k/top-p or constraint mask)."""
    ids = torch.tensor([turn.prompt_ids + turn.response_ids])
    with torch.inference_mode():
        logp = torch.log_softmax(lm(ids).logits[0].float() / turn.scoring_temperature, dim=-1)
    p = len(turn.prompt_ids)
    return logp[p - 1 : p - 1 + len(turn.response_ids)].gather(1, torch.tensor(turn.response_ids)[:, None])[:, 0]


def answers_of(episode: Episode) -> list[AIMessage]:
    """The AIMessages of the episode's final state, in order."""
    state = episode.output
    messages = state.get("messages") or state.get("history") or []
    return [m for m in messages if isinstance(m, AIMessage)]


async def test_trimming_graph_is_captured_exactly(model, tiny_tokenizer, tiny_model):
    graph_file = load_graph_file(ROOT / "graphs" / "guess_number.py")
    graph = graph_file.build(model, history_turns=1, max_guesses=4, max_tokens=12)
    episodes = await run_episodes(
        graph,
        [graph_file.episode_input(s) for s in range(3)],
        graph_config={"recursion_limit": 40},
        keep_messages=True,
    )
    assert check_turns_exact(episodes, tiny_tokenizer, tiny_model) >= 6
    for episode in episodes:
        # history is trimmed: late calls saw fewer messages than the full history holds
        assert all(len(t.messages) <= 2 + 2 for t in episode.turns)
        assert len(episode.output["history"]) > 4 or episode.turns[-1].terminated
        # response ids are exactly what the message carries, and decode to its content
        for turn, answer in zip(episode.turns, answers_of(episode)):
            assert answer.response_metadata["response_ids"] == turn.response_ids
            body = [i for i in turn.response_ids if i != tiny_tokenizer.eos_token_id]
            assert tiny_tokenizer.decode(body, skip_special_tokens=True) == answer.content
        # rewards and ends come from the environment node through the callback channel
        last = episode.turns[-1]
        assert last.done and all(not t.done for t in episode.turns[:-1])
        assert last.truncated or last.reward == 1.0


async def test_two_llm_nodes_with_their_own_sampling(model, tiny_tokenizer, tiny_model):
    planner = model.bind(temperature=0.0, max_tokens=6)
    actor = model.bind(max_tokens=10, temperature=1.0)

    async def plan(state: MessagesState) -> dict:
        return {"messages": [await planner.ainvoke(state["messages"])]}

    async def act(state: MessagesState) -> dict:
        prompt = [SystemMessage("Act on the plan."), HumanMessage(str(state["messages"][-1].content))]
        return {"messages": [await actor.ainvoke(prompt)]}

    g = StateGraph(MessagesState)
    g.add_node("plan", plan)
    g.add_node("act", act)
    g.add_edge(START, "plan")
    g.add_edge("plan", "act")
    g.add_edge("act", END)
    graph = g.compile()
    inputs = [{"messages": [HumanMessage(f"task {i}")]} for i in range(4)]
    episodes = await run_episodes(graph, inputs, keep_messages=True)
    assert check_turns_exact(episodes, tiny_tokenizer, tiny_model) == 8
    for episode in episodes:
        plan_turn, act_turn = episode.turns
        assert (plan_turn.node, act_turn.node) == ("plan", "act")
        assert len(plan_turn.response_ids) <= 6 and len(act_turn.response_ids) <= 10
        assert act_turn.terminated  # the graph ended: its last turn ends the episode
    # the greedy planner answers the same task identically
    again = await run_episodes(graph, inputs[:1])
    assert again[0].turns[0].response_ids == episodes[0].turns[0].response_ids


async def test_subgraph_calls_are_captured(model, tiny_tokenizer, tiny_model):
    async def think(state: MessagesState) -> dict:
        return {"messages": [await model.ainvoke(state["messages"])]}

    inner = StateGraph(MessagesState)
    inner.add_node("think", think)
    inner.add_edge(START, "think")
    inner.add_edge("think", END)
    inner_graph = inner.compile()

    async def answer(state: MessagesState) -> dict:
        return {"messages": [await model.ainvoke([*state["messages"], HumanMessage("Now answer.")])]}

    outer = StateGraph(MessagesState)
    outer.add_node("research", inner_graph)
    outer.add_node("answer", answer)
    outer.add_edge(START, "research")
    outer.add_edge("research", "answer")
    outer.add_edge("answer", END)
    episodes = await run_episodes(
        outer.compile(), [{"messages": [HumanMessage("Why is the sky blue?")]}], keep_messages=True
    )
    assert check_turns_exact(episodes, tiny_tokenizer, tiny_model) == 2
    assert [t.node for t in episodes[0].turns] == ["think", "answer"]


async def test_two_rewards_for_one_call_sum(model):
    """An environment node that reports a shaped reward and the game's reward for the same model
    call: the turn's reward is their sum (not the last one), the infos merge, the ends stick; a
    reward before the first call is kept as the episode's unassigned reward."""
    from verlog.rollout import areport_reward

    async def start(state: MessagesState) -> dict:
        await areport_reward(0.25, info={"note": "before any call"})
        return {}

    async def act(state: MessagesState) -> dict:
        return {"messages": [await model.ainvoke(state["messages"])]}

    async def env(state: MessagesState) -> dict:
        await areport_reward(0.5, info={"valid_action": True, "shaping": 0.5})
        await areport_reward(-2.0, terminated=True, info={"success": False})
        return {}

    g = StateGraph(MessagesState)
    g.add_node("start", start)
    g.add_node("act", act)
    g.add_node("env", env)
    g.add_edge(START, "start")
    g.add_edge("start", "act")
    g.add_edge("act", "env")
    g.add_edge("env", END)
    (episode,) = await run_episodes(g.compile(), [{"messages": [HumanMessage("go")]}])
    (turn,) = episode.turns
    assert turn.reward == pytest.approx(-1.5)
    assert turn.terminated and turn.info == {"valid_action": True, "shaping": 0.5, "success": False}
    assert episode.total_reward == pytest.approx(-1.25)


@pytest.mark.parametrize("style", ["sync", "async"])
async def test_reward_events_reach_the_recorder_directly_and_every_other_listener_as_always(model, monkeypatch, style):
    """Where verlog's recorder is the only listener, a reward event is handed to it directly
    (LangChain's dispatch is not called: it would copy the run's callbacks for every event), with
    the run id, tags and metadata LangChain's dispatch gives it; with another listener (a user's
    handler) the event goes through LangChain's dispatch and reaches both."""
    from langchain_core.callbacks import BaseCallbackHandler

    from verlog.rollout import TurnRecorder, areport_reward, events, report_reward

    seen: dict[str, list] = {"recorder": [], "user": []}

    class Recorder(TurnRecorder):
        def on_custom_event(self, name, data, *, run_id, **kwargs):
            seen["recorder"].append((name, data["reward"], sorted(kwargs["tags"]), sorted(kwargs["metadata"])))
            super().on_custom_event(name, data, run_id=run_id, **kwargs)

    class User(BaseCallbackHandler):
        def on_custom_event(self, name, data, *, run_id, **kwargs):
            seen["user"].append((name, data["reward"]))

    async def act(state: MessagesState) -> dict:
        return {"messages": [await model.ainvoke(state["messages"])]}

    async def async_env(state: MessagesState) -> dict:
        await areport_reward(1.5, terminated=True)
        return {}

    def sync_env(state: MessagesState) -> dict:
        report_reward(1.5, terminated=True)
        return {}

    g = StateGraph(MessagesState)
    g.add_node("act", act)
    g.add_node("env", sync_env if style == "sync" else async_env)
    g.add_edge(START, "act")
    g.add_edge("act", "env")
    g.add_edge("env", END)
    graph = g.compile()
    dispatched = []
    for name in ("dispatch_custom_event", "adispatch_custom_event"):
        original = getattr(events, name)

        def counting(*args, _original=original, **kwargs):
            dispatched.append(args[0])
            return _original(*args, **kwargs)

        monkeypatch.setattr(events, name, counting)

    run = {"graph_config": {"tags": ["mine"], "metadata": {"who": "me"}}}
    alone = await run_episode(graph, {"messages": [HumanMessage("go")]}, episode_id="a", recorder=Recorder("a"), **run)
    assert dispatched == [] and alone.turns[0].reward == 1.5 and alone.turns[0].terminated
    direct = seen["recorder"].pop()
    run["graph_config"]["callbacks"] = [User()]
    shared = await run_episode(graph, {"messages": [HumanMessage("go")]}, episode_id="b", recorder=Recorder("b"), **run)
    assert dispatched == [events.REWARD_EVENT] and shared.turns[0].reward == 1.5
    assert seen["user"] == [(events.REWARD_EVENT, 1.5)]
    assert seen["recorder"] == [direct]  # the same name, tags and metadata keys either way
    assert "mine" in direct[2] and "who" in direct[3]


def test_sync_invoke_inside_and_outside_a_loop(model):
    import asyncio

    answer = model.invoke([HumanMessage("hi")])
    assert answer.response_metadata["response_ids"]

    async def inside() -> AIMessage:
        return model.invoke([HumanMessage("hi")])  # a sync call from a running loop

    assert asyncio.run(inside()).response_metadata["logprobs"]


def test_unknown_call_option_is_rejected(model):
    with pytest.raises(TypeError, match=r"unknown call options \['temprature'\]"):
        model.invoke([HumanMessage("hi")], temprature=0.5)


@pytest.mark.slow
async def test_real_instruct_model_answers_and_is_captured_exactly():
    """SmolLM2-135M-Instruct through the chat model: a sensible greedy answer, exact capture."""
    from verlog.models import load_causal_lm, load_tokenizer

    tokenizer, lm = load_tokenizer("smollm2"), load_causal_lm("smollm2")
    engine = EmbeddedEngine(lm, tokenizer)
    model = VerlogChatModel(engine=engine, tokenizer=tokenizer, temperature=0.0, max_tokens=24)

    async def ask(state: MessagesState) -> dict:
        return {"messages": [await model.ainvoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    episodes = await run_episodes(
        g.compile(), [{"messages": [HumanMessage("What is the capital of France?")]}], keep_messages=True
    )
    engine.close()
    assert check_turns_exact(episodes, tokenizer, lm) == 1
    assert "Paris" in answers_of(episodes[0])[0].content


async def test_answers_that_do_not_survive_decode_and_encode_are_kept_as_the_engine_wrote_them(tiny_tokenizer):
    """A sampling model may write a text in tokens its tokenizer would not make of it: here
    "hello world" one token per character. Decoding those ids and encoding the text gives other
    (merged) ids, so a chat model that re-tokenized its answer would train ids the model never
    chose; every entry point (a graph's ``ainvoke`` and ``astream``, ``invoke``) keeps the engine's
    ids, one logprob each, and the text they decode to."""
    from verlog.testing.scripted_engine import ScriptedEngine

    eos = tiny_tokenizer.eos_token_id
    spelled = tiny_tokenizer.convert_tokens_to_ids(list("helloĠworld"))  # byte-level: Ġ is the space
    assert tiny_tokenizer.unk_token_id not in spelled
    text = tiny_tokenizer.decode(spelled)
    assert text == "hello world"
    retokenized = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert retokenized != spelled and len(retokenized) < len(spelled)  # the case that catches re-tokenization
    engine = ScriptedEngine(tiny_tokenizer, [spelled], logprob=-0.5)
    chat = VerlogChatModel(engine=engine, tokenizer=tiny_tokenizer, max_tokens=32)
    written = [*spelled, eos]

    async def policy(state: MessagesState) -> dict:
        first = await chat.ainvoke([HumanMessage("say it")])
        chunks = [chunk async for chunk in chat.astream([HumanMessage("again")])]
        streamed = chunks[0]
        for chunk in chunks[1:]:
            streamed += chunk
        return {"messages": [first, AIMessage(streamed.content, response_metadata=streamed.response_metadata)]}

    g = StateGraph(MessagesState)
    g.add_node("policy", policy)
    g.add_edge(START, "policy")
    g.add_edge("policy", END)
    episode = await run_episode(g.compile(), {"messages": []})
    assert episode.status == "ok", episode.error
    assert [t.response_ids for t in episode.turns] == [written, written]
    assert all(t.logprobs == [-0.5] * len(written) for t in episode.turns)
    for answer in episode.output["messages"]:
        assert answer.response_metadata["response_ids"] == written and answer.content == "hello world"
    answer = chat.invoke("once more")
    assert answer.response_metadata["response_ids"] == written
    assert answer.response_metadata["logprobs"] == [-0.5] * len(written)
