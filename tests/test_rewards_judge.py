"""LLM judges (``reward.judges``) against real parts.

* a ranking judge served by ``verlog serve-model`` (the real OpenAI-compatible server on the tiny
  model) scores a group: its schema makes even a random model's answer a valid verdict;
* an embedded judge on a ``VerlogChatModel`` (the policy reused as judge inside a LangGraph graph)
  is never recorded by the episode's ``TurnRecorder``;
* retries, timeouts, bounded concurrency, the cache and the errors against a real local aiohttp
  server that speaks OpenAI's chat-completions format and misbehaves on cue (counting requests).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from scripted_endpoint import ScriptedChatServer

from verlog.backends.embedded import EmbeddedEngine
from verlog.config import ConfigError, JudgeConfig, RewardConfig
from verlog.llm import VerlogChatModel
from verlog.rewards import RewardError, RewardScorer, Trajectory
from verlog.rewards.judge import (
    RETRY_TEMPERATURE,
    RankingJudge,
    RubricJudge,
    build_judge,
    explanation_key,
    judge_cache_path,
)
from verlog.rewards.judge_client import EndpointClient
from verlog.rewards.judge_prompts import DEFAULT_RUBRIC, ranking_prompt, split_task
from verlog.rewards.judge_verdicts import VerdictError, parse_ranking, parse_rubric
from verlog.rollout import TurnRecorder
from verlog.rollout.recorder import recording
from verlog.serve import OpenAIServer


# ------------------------------------------------------------------------------- episodes
def episode(answer: str, *, row: dict | None = None, key: int = 0) -> Trajectory:
    """A tool-using episode: the task, a calculator call and its result, then ``answer``."""
    messages = [
        SystemMessage("Answer with the calculator's help."),
        HumanMessage("What is (3 + 4) * 12?"),
        AIMessage("", tool_calls=[{"name": "calculate", "args": {"expression": "(3 + 4) * 12"}, "id": "c1"}]),
        ToolMessage("84", tool_call_id="c1", name="calculate"),
        AIMessage(answer),
    ]
    return Trajectory(state={"messages": messages}, row=row if row is not None else {"answer": "84"}, key=key)


def judge_config(kind: str = "rubric", *, url: str = "", **settings: Any) -> JudgeConfig:
    return JudgeConfig(kind=kind, endpoint={"base_url": url, "model": "judge-model"}, **settings)


# ------------------------------------------------------------------------------- a scripted endpoint
def verdict_for(body: dict[str, Any], score: int = 7) -> str:
    """A valid verdict for the request's schema (rubric or ranking)."""
    schema = body.get("response_format", {}).get("json_schema", {}).get("schema", {})
    keys = schema.get("properties", {}).get("scores", {}).get("required")
    if keys:
        return json.dumps({"scores": {k: {"explanation": f"attempt {k}", "score": int(k) % 11} for k in keys}})
    return json.dumps({"explanation": "uses the tool and answers 84", "score": score})


class ScriptedJudgeServer(ScriptedChatServer):
    """The scripted endpoint (``tests/scripted_endpoint.py``) answering a valid verdict by default."""

    def __init__(self, script: list[Any] | None = None):
        super().__init__(script, default=verdict_for)


@pytest.fixture
async def server():
    async with ScriptedJudgeServer() as s:
        yield s


@pytest.fixture(scope="module")
def engine(tiny_model, tiny_tokenizer):
    engine = EmbeddedEngine(tiny_model, tiny_tokenizer, seed=0)
    yield engine
    engine.close()


# ------------------------------------------------------------------------------- (1) rubric judge
async def test_rubric_judge_sends_task_transcript_reference_rubric_and_schema(server, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "sk-test")
    config = JudgeConfig(
        kind="rubric",
        name="correct",
        weight=2.0,
        reference_column="answer",
        rubric="Full marks only for the number 84.",
        endpoint={"base_url": server.base_url, "model": "judge-model", "api_key_env": "JUDGE_KEY"},
    )
    judge = build_judge(config, index=0)
    assert isinstance(judge, RubricJudge) and (judge.name, judge.weight) == ("correct", 2.0)
    result = await judge.score(episode("The answer is 84."))
    assert result.reward == pytest.approx(0.7)
    assert result.info == {explanation_key("correct"): "uses the tool and answers 84"}

    (body,) = server.requests
    assert server.headers[0]["Authorization"] == "Bearer sk-test"
    assert body["model"] == "judge-model" and body["temperature"] == 0.0
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
    assert fmt["json_schema"]["schema"]["properties"]["score"] == {"type": "integer", "minimum": 0, "maximum": 10}
    prompt = body["messages"][1]["content"]
    for shown in (
        "What is (3 + 4) * 12?",
        'calls tool calculate({"expression": "(3 + 4) * 12"})',
        "[tool result of calculate]\n84",
        "The answer is 84.",
        "## Reference answer\n84",
        "Full marks only for the number 84.",
    ):
        assert shown in prompt
    assert DEFAULT_RUBRIC not in prompt


async def test_rubric_judge_default_rubric_and_missing_reference_column(server):
    judge = build_judge(judge_config(url=server.base_url, reference_column="solution"), index=3)
    with pytest.raises(
        RewardError,
        match=r"reward\.judges\[3\] \(judge_rubric\): the episode's row has no "
        r"column 'solution'.*answer",
    ):
        await judge.score(episode("84"))
    with pytest.raises(
        ConfigError,
        match=r"reward\.judges\[3\]\.reference_column: the rows have no column "
        r"'solution' \(their columns: question, answer\)",
    ):
        judge.check_columns(["question", "answer"])
    plain = build_judge(judge_config(url=server.base_url), index=0)
    await plain.score(episode("84"))
    assert DEFAULT_RUBRIC in server.requests[-1]["messages"][1]["content"]


def test_transcripts_are_bounded_keeping_the_task_and_the_final_answer():
    chatter = []
    for i in range(40):
        chatter += [
            AIMessage(f"step {i}", tool_calls=[{"name": "look", "args": {"i": i}, "id": f"c{i}"}]),
            ToolMessage("x" * 3000, tool_call_id=f"c{i}", name="look"),
        ]
    messages = [HumanMessage("Find the key."), *chatter, AIMessage("FINAL: the key is under the mat")]
    task, transcript = split_task(messages)
    prompt = ranking_prompt(
        [task], [transcript], rubric=None, reference=None, transcript_chars=4000, explanation_chars=50
    )
    text = prompt.messages[1]["content"]
    assert "Find the key." in text and text.rstrip().endswith("Reply with the JSON verdict only.")
    assert "FINAL: the key is under the mat" in text  # the last messages are always kept
    assert "earlier messages cut" in text and "characters cut" in text
    attempt = text.split("## Attempt 1\n", 1)[1]
    assert len(attempt) < 4000 + 200
    assert "step 0\n" not in attempt and "step 39" in attempt  # the oldest go first


# ------------------------------------------------------------------------------- (2) ranking on serve-model
async def test_ranking_judge_on_serve_model_scores_a_group(engine, tiny_tokenizer):
    group = [episode("The answer is 84."), episode("It is 48."), episode("I do not know.")]
    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny") as served:
        config = JudgeConfig(
            kind="ranking",
            endpoint={"base_url": served.base_url, "model": "tiny"},
            max_tokens=200,
            explanation_chars=24,
            retries=0,
            cache=False,
        )
        judge = build_judge(config, index=1)
        assert isinstance(judge, RankingJudge)
        results = await judge.rank(group)
        # one call, valid at the first attempt (retries=0): the random model's answer was held to the schema
        assert judge.calls == 1
        assert len(results) == 3
        for result in results:
            assert 0.0 <= result.reward <= 1.0 and round(result.reward * 10) == pytest.approx(result.reward * 10)
            assert isinstance(result.info[explanation_key("judge_ranking")], str)

        # the same request without the schema: the random model writes no verdict at all
        client = EndpointClient(served.base_url, "tiny")
        client.send_schema = False
        task, _ = split_task(group[0].messages)
        prompt = ranking_prompt(
            [task] * 3,
            [split_task(e.messages)[1] for e in group],
            rubric=None,
            reference=None,
            transcript_chars=12000,
            explanation_chars=24,
        )
        answer = await client.complete(
            prompt.messages, temperature=0.0, max_tokens=200, response_format={"type": "json_schema"}, timeout_s=30
        )
        with pytest.raises(VerdictError):
            parse_ranking(answer.text, 3, 24)


# ------------------------------------------------------------------------------- (3) embedded judge
async def test_embedded_policy_judge_inside_a_graph_is_never_recorded(engine, tiny_tokenizer):
    policy = VerlogChatModel(engine=engine, tokenizer=tiny_tokenizer, max_tokens=8)
    asked: list[str] = []

    def chat_model_for(name: str) -> VerlogChatModel:
        asked.append(name)
        return policy

    judge = build_judge(
        JudgeConfig(kind="rubric", embedded="policy", max_tokens=48, explanation_chars=16, reference_column="answer"),
        index=0,
        cache_dir=None,
        chat_model_for=chat_model_for,
    )
    assert judge.cache is None  # the policy's weights change: its verdicts are never reused
    verdicts = []

    async def answer(state: MessagesState) -> dict:
        return {"messages": [await policy.ainvoke(state["messages"])]}

    async def grade(state: MessagesState) -> dict:  # a judge reusing the policy model, inside the graph
        verdicts.append(await judge.score(Trajectory(state=state, row={"answer": "84"})))
        return {}

    builder = StateGraph(MessagesState)
    builder.add_node("answer", answer)
    builder.add_node("grade", grade)
    builder.add_edge(START, "answer")
    builder.add_edge("answer", "grade")
    builder.add_edge("grade", END)
    graph = builder.compile()

    recorder = TurnRecorder("episode-0")
    with recording(recorder):  # as run_episode records: every run started in this context is seen
        await graph.ainvoke(
            {"messages": [HumanMessage("What is (3 + 4) * 12?")]},
            config={"callbacks": [recorder], "recursion_limit": 10},
        )
    assert asked == ["policy"]
    assert judge.calls >= 1 and len(verdicts) == 1 and 0.0 <= verdicts[0].reward <= 1.0
    # only the answer is a training turn: the judge's call (constrained JSON) was never seen
    assert [turn.node for turn in recorder.turns] == ["answer"]
    assert recorder.uncaptured_calls == 0


async def test_embedded_model_path_judge_and_missing_chat_model(engine, tiny_tokenizer):
    judge_model = VerlogChatModel(engine=engine, tokenizer=tiny_tokenizer)
    config = JudgeConfig(kind="ranking", embedded="tiny", max_tokens=160, explanation_chars=16, retries=0)
    judge = build_judge(config, index=2, chat_model_for=lambda name: judge_model)
    results = await judge.rank([episode("84"), episode("48")])
    assert len(results) == 2 and all(0 <= r.reward <= 1 for r in results) and judge.calls == 1
    with pytest.raises(ConfigError, match=r"reward\.judges\[2\]\.embedded: 'tiny' needs a chat model"):
        build_judge(config, index=2)


# ------------------------------------------------------------------------------- (4) retries and timeouts
async def test_retries_5xx_and_429_honouring_retry_after(server):
    server.script = [("status", 503), ("status", 429, {"Retry-After": "0.4"})]
    judge = build_judge(judge_config(url=server.base_url, retries=2), index=0)
    started = time.monotonic()
    result = await judge.score(episode("84"))
    assert result.reward == pytest.approx(0.7)
    assert len(server.requests) == 3 and time.monotonic() - started >= 0.4


async def test_a_slow_answer_times_out_and_the_retry_succeeds(server):
    server.script = [("slow", 10.0)]
    judge = build_judge(judge_config(url=server.base_url, retries=1, timeout_s=3.0), index=0)
    started = time.monotonic()
    assert (await judge.score(episode("84"))).reward == pytest.approx(0.7)
    elapsed = time.monotonic() - started
    # the first attempt had half of timeout_s, then gave up: a second request means it never waited for
    # the 10 s answer (no upper bound on the time: a busy machine is slow, and no test measures speed)
    assert len(server.requests) == 2 and 1.4 <= elapsed


async def test_no_verdict_within_timeout_s(server):
    server.script = [("slow", 10.0)] * 3
    judge = build_judge(judge_config(url=server.base_url, name="slowpoke", retries=2, timeout_s=1.5), index=4)
    started = time.monotonic()
    with pytest.raises(
        RewardError,
        match=r"reward\.judges\[4\] \(slowpoke\): no verdict after 3 attempts "
        r"\(retries=2, timeout_s=1\.5\): no answer within",
    ):
        await judge.score(episode("84"))
    assert time.monotonic() - started < 2.5


async def test_a_retry_after_beyond_the_time_left_fails_at_once(server):
    server.script = [("status", 429, {"Retry-After": "60"})]
    judge = build_judge(judge_config(url=server.base_url, retries=3, timeout_s=5.0), index=0)
    started = time.monotonic()
    with pytest.raises(RewardError, match=r"HTTP 429.*the next attempt would start after timeout_s=5 s"):
        await judge.score(episode("84"))
    assert time.monotonic() - started < 1.0 and len(server.requests) == 1


async def test_unparseable_answers_are_retried_hotter_then_read_leniently(server):
    server.script = [
        ("text", "I think it deserves a good score."),
        ("text", 'Verdict:\n```json\n{"score": "9", "explanation": "right"}\n```'),
    ]
    judge = build_judge(judge_config(url=server.base_url, retries=2), index=0)
    result = await judge.score(episode("84"))
    assert result.reward == pytest.approx(0.9) and len(server.requests) == 2
    assert server.requests[0]["temperature"] == 0.0 and server.requests[1]["temperature"] == RETRY_TEMPERATURE


async def test_a_judge_answering_garbage_fails_episodes_with_the_reason_then_stops_the_run(server):
    from verlog.rollout import SlotFailureError

    server.default = lambda body: "Great job, 10/10!"
    judge = build_judge(judge_config(url=server.base_url, retries=0, cache=False, max_consecutive_failures=3), index=0)
    for i in range(2):  # each episode fails, saying why
        with pytest.raises(
            RewardError,
            match=r"^reward\.judges\[0\] \(judge_rubric\): no verdict after 1 attempt "
            r"\(retries=0, .*\): .*JSON",
        ):
            await judge.score(episode(str(i)))
    with pytest.raises(
        SlotFailureError,
        match=r"^reward\.judges\[0\] \(judge_rubric\): 3 verdicts in a row failed "
        r"\(reward\.judges\[0\]\.max_consecutive_failures=3\); last: .*no verdict",
    ):
        await judge.score(episode("2"))
    assert judge.take_failures() == {"unparsable": 3} and judge.take_failures() == {}  # counted by reason
    server.default = lambda body: verdict_for(body, 8)  # a verdict given resets the count
    assert (await judge.score(episode("3"))).reward == pytest.approx(0.8)
    server.default = lambda body: "garbage"
    for i in range(2):
        with pytest.raises(RewardError):
            await judge.score(episode(f"again {i}"))


async def test_client_errors_are_not_retried(server):
    server.script = [("status", 401)]
    judge = build_judge(judge_config(url=server.base_url, retries=3), index=1)
    with pytest.raises(
        RewardError,
        match=r"reward\.judges\[1\] \(judge_rubric\): .*rejected the request "
        r"\(HTTP 401\): scripted 401",
    ):
        await judge.score(episode("84"))
    assert len(server.requests) == 1
    assert judge.take_failures() == {"refused": 1}


async def test_failed_verdicts_are_counted_by_reason_as_training_metrics(server):
    """``RewardScorer.take_judge_failures``: each judge's failed verdicts since the last call, by
    reason (the trainer logs them with each update)."""
    server.script = [("text", "no verdict here"), ("status", 503), ("status", 401)]
    scorer = RewardScorer(RewardConfig(judges=[judge_config(url=server.base_url, retries=0, cache=False)]))
    for answer in ("1", "2", "3"):
        with pytest.raises(RewardError):
            await scorer.score(episode(answer))
    assert scorer.take_judge_failures() == {
        "judge_failures/judge_rubric/refused": 1.0,
        "judge_failures/judge_rubric/unavailable": 1.0,
        "judge_failures/judge_rubric/unparsable": 1.0,
    }
    assert (await scorer.score(episode("84"))).reward == pytest.approx(0.7)
    assert scorer.take_judge_failures() == {}


async def test_an_endpoint_refusing_response_format_is_asked_without_it(server):
    server.refuse_response_format = True
    server.default = lambda body: 'Sure. {"score": 3, "explanation": "wrong number"} Done.'
    judge = build_judge(judge_config(url=server.base_url), index=0)
    assert (await judge.score(episode("48"))).reward == pytest.approx(0.3)
    assert (await judge.score(episode("49"))).reward == pytest.approx(0.3)
    assert ["response_format" in b for b in server.requests] == [True, False, False]


async def test_concurrency_is_bounded(server):
    judge = build_judge(judge_config(url=server.base_url, concurrency=2), index=0)
    results = await asyncio.gather(*(judge.score(episode(f"answer {i}")) for i in range(6)))
    assert len(results) == 6 and len(server.requests) == 6
    assert server.max_in_flight == 2


# ------------------------------------------------------------------------------- (5) the cache
async def test_verdicts_are_cached_on_disk_and_a_second_judge_pays_nothing(server, tmp_path):
    config = judge_config(url=server.base_url, name="quality")
    group = [episode("84"), episode("48"), episode("eighty-four")]
    first = build_judge(config, index=0, cache_dir=tmp_path)
    before = [r.reward for r in await asyncio.gather(*(first.score(e) for e in group))]
    assert len(server.requests) == 3
    path = judge_cache_path(tmp_path, "quality")
    assert path == tmp_path / "judges" / "quality.jsonl" and len(path.read_text().splitlines()) == 3

    with path.open("a") as f:  # a run killed mid-write leaves a cut last line
        f.write('{"key": "abc", "val')
    second = build_judge(config, index=0, cache_dir=tmp_path)
    assert second.cache.skipped_lines == 1
    after = [r.reward for r in await asyncio.gather(*(second.score(e) for e in group))]
    assert after == before and len(server.requests) == 3  # no HTTP call at all

    # a changed setting (here the rubric) is another verdict; it is appended on a line of its own
    third = build_judge(
        judge_config(url=server.base_url, name="quality", rubric="Be strict."), index=0, cache_dir=tmp_path
    )
    await third.score(group[0])
    assert len(server.requests) == 4
    assert build_judge(config, index=0, cache_dir=tmp_path).cache.skipped_lines == 1
    assert len(build_judge(config, index=0, cache_dir=tmp_path).cache) == 4


async def test_identical_requests_in_flight_share_one_call(server):
    judge = build_judge(judge_config(url=server.base_url, cache=False), index=0)
    results = await asyncio.gather(*(judge.score(episode("84")) for _ in range(4)))
    assert [r.reward for r in results] == [pytest.approx(0.7)] * 4
    assert len(server.requests) == 1 and judge.cache is None


# ------------------------------------------------------------------------------- (6) no valid verdict
async def test_a_judge_that_never_gets_a_valid_verdict_names_itself(server):
    def scores_attempt_one_twice(body: dict) -> str:
        return (
            '{"scores": [{"trajectory": 1, "score": 5}, {"trajectory": 1, "score": 6}, {"trajectory": 2, "score": 1}]}'
        )

    server.default = scores_attempt_one_twice
    judge = build_judge(judge_config("ranking", url=server.base_url, name="ruler", retries=2), index=2)
    with pytest.raises(
        RewardError,
        match=r"reward\.judges\[2\] \(ruler\): no verdict after 3 attempts.*"
        r"scores attempt 1 twice",
    ):
        await judge.rank([episode("84"), episode("48"), episode("12")])
    assert len(server.requests) == 3


async def test_a_verdict_cut_by_max_tokens_says_so(server):
    server.script = [("cut", '{"explanation": "the agent calls the calculator and')] * 2
    judge = build_judge(judge_config(url=server.base_url, retries=1, max_tokens=12), index=5)
    with pytest.raises(
        RewardError,
        match=r"reward\.judges\[5\] \(judge_rubric\): no verdict after 2 attempts.*"
        r"cut at max_tokens=12 .*raise reward\.judges\[5\]\.max_tokens",
    ):
        await judge.score(episode("84"))


# ------------------------------------------------------------------------------- verdicts and config
def test_lenient_verdict_reading():
    assert parse_rubric('{"explanation": "ok", "score": 8}', 100).score == 8
    assert parse_rubric('Here: {"score": 7.5} thanks', 100).reward == pytest.approx(0.75)
    assert parse_rubric('{"score": "6/10", "explanation": "' + "x" * 50 + '"}', 10).explanation == "x" * 10
    listed = parse_ranking('{"scores": [{"trajectory": 2, "score": 1}, {"trajectory": 1, "score": 10}]}', 2, 50)
    assert [v.score for v in listed] == [10, 1]
    keyed = parse_ranking('{"scores": {"Attempt 1": {"score": 4, "explanation": "a"}, "2": {"score": 0}}}', 2, 50)
    assert [(v.score, v.explanation) for v in keyed] == [(4, "a"), (0, "")]
    for bad, message in [
        ('{"score": 11}', "outside 0..10"),
        ('{"score": true}', "not a number"),
        ("no json", "holds no JSON object"),
    ]:
        with pytest.raises(VerdictError, match=message):
            parse_rubric(bad, 100)
    with pytest.raises(VerdictError, match="does not score attempts 2, 3 of 3"):
        parse_ranking('{"scores": {"1": {"score": 1}}}', 3, 50)
    with pytest.raises(VerdictError, match="scores an attempt '4'; there are attempts 1 to 3"):
        parse_ranking('{"scores": {"4": {"score": 1}}}', 3, 50)


async def test_judges_are_checked_against_their_endpoint_before_the_first_episode(engine, tiny_tokenizer, server):
    """verlog serve-model (the real OpenAI-compatible server) lists its models: a judge naming
    another model is refused; an endpoint without a models list is only checked to answer."""
    from langgraph_server import free_port

    from verlog.rewards import RewardScorer

    def scorer(url: str, model: str) -> RewardScorer:
        return RewardScorer(
            RewardConfig(
                judges=[{"endpoint": {"base_url": url, "model": "x"}}, {"endpoint": {"base_url": url, "model": model}}]
            )
        )

    async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny") as served:
        with pytest.raises(
            ConfigError,
            match=rf"^reward\.judges\[0\]\.endpoint\.model: {served.base_url} does not "
            r"serve 'x'; it serves: tiny$",
        ):
            await asyncio.to_thread(scorer(served.base_url, "tiny").check_judges)
        good = RewardScorer(RewardConfig(judges=[{"endpoint": {"base_url": served.base_url, "model": "tiny"}}]))
        await asyncio.to_thread(good.check_judges)
    await asyncio.to_thread(scorer(server.base_url, "anything").check_judges)  # no GET /models there: it answers
    down = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(
        ConfigError,
        match=rf"^reward\.judges\[0\]\.endpoint\.base_url: the judge's endpoint {down} "
        r"does not answer \(.*\); start its server or fix base_url",
    ):
        scorer(down, "x").check_judges()


def test_judge_config_errors(monkeypatch):
    monkeypatch.delenv("NO_SUCH_JUDGE_KEY", raising=False)
    config = JudgeConfig(
        endpoint={"base_url": "http://127.0.0.1:1/v1", "model": "m", "api_key_env": "NO_SUCH_JUDGE_KEY"}
    )
    with pytest.raises(
        ConfigError,
        match=r"reward\.judges\[0\]\.endpoint\.api_key_env: the environment variable "
        r"NO_SUCH_JUDGE_KEY is not set",
    ):
        build_judge(config, index=0)
    with pytest.raises(ValueError, match="give exactly one of endpoint"):
        RewardConfig.model_validate({"judges": [{"kind": "rubric"}]})
    with pytest.raises(ValueError, match="kind"):
        RewardConfig.model_validate({"judges": [{"kind": "pairwise", "embedded": "policy"}]})
