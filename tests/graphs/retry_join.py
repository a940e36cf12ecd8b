"""A test graph of attempts thrown away and of a reward reported at a join.

``style``:

* ``retry_policy``: the policy node calls the model (``calls`` times), then raises the first time
  it runs in each step; its ``RetryPolicy`` runs it again (the first attempt's calls are discarded).
* ``with_retry``: ``(model | parser).with_retry()`` whose parser fails once (the first call is
  discarded).
* ``with_fallbacks``: ``(model | parser)`` whose parser always fails, with the bare model as its
  fallback (the first call is discarded, the fallback's call is a turn).
* ``errored_call``: a chat model whose every call errors, retried once by ``with_retry``, with the
  policy model as its fallback (two calls that errored, never turns; the fallback's is one).
* ``pause``: the policy node of ``retry_policy`` without its failure; the environment node of
  an odd seed's episode pauses at ``interrupt()`` after the first step (nobody answers it in
  training: the episode ends ``interrupted``), an even seed's plays to its end.
* ``join``: ``branches`` parallel branches (``Send``) each call the model after a random sleep (so
  they start and finish in a different order every run); a join node reports the reward.

Every style plays ``steps`` steps; the environment node rewards each with 1 (the join style
reports it at the join).
"""

from __future__ import annotations

import asyncio
import operator
import random
from typing import Annotated, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage
from langchain_core.outputs import ChatResult
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langgraph.graph import END, START, StateGraph
from langgraph.types import RetryPolicy, Send, interrupt
from typing_extensions import TypedDict

from verlog.rollout.events import areport_reward

STYLES = ("retry_policy", "with_retry", "with_fallbacks", "errored_call", "join", "pause")


class DownEndpoint(BaseChatModel):
    """A chat model whose endpoint is down: every call raises."""

    @property
    def _llm_type(self) -> str:
        return "down-endpoint"

    def _generate(self, messages: list, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
        raise ConnectionError("the endpoint is down")


class State(TypedDict):
    step: int
    branch: int
    answers: Annotated[list[str], operator.add]
    pause: bool


def make_input(seed: int) -> dict[str, Any]:
    return {"step": 0, "branch": -1, "answers": [], "pause": seed % 2 == 1}


def build_graph(
    model, style: str = "retry_policy", steps: int = 2, branches: int = 3, max_tokens: int = 8, calls: int = 1
):
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    policy_model = model.bind(max_tokens=max_tokens)
    raised: set[tuple[str, int]] = set()  # (episode thread, step) whose first attempt raised

    async def policy(state: State, config: RunnableConfig) -> dict:
        prompt = [HumanMessage(f"step {state['step']}")]
        if style == "pause":
            answer = await policy_model.ainvoke(prompt)
        elif style == "retry_policy":
            for _ in range(calls):
                answer = await policy_model.ainvoke(prompt)
            key = (config["configurable"]["thread_id"], state["step"])
            if key not in raised:
                raised.add(key)
                raise ValueError("a flaky tool failed after the model call")
        elif style == "with_retry":
            failures = []

            def parse_once(message: Any) -> Any:
                if not failures:
                    failures.append(message)
                    raise ValueError("the parser failed")
                return message

            chain = (policy_model | RunnableLambda(parse_once)).with_retry(
                stop_after_attempt=2, wait_exponential_jitter=False
            )
            answer = await chain.ainvoke(prompt)
        elif style == "errored_call":
            down = DownEndpoint().with_retry(stop_after_attempt=2, wait_exponential_jitter=False)
            answer = await down.with_fallbacks([policy_model]).ainvoke(prompt)
        else:

            def never(message: Any) -> Any:
                raise ValueError("the parser always fails")

            answer = await (policy_model | RunnableLambda(never)).with_fallbacks([policy_model]).ainvoke(prompt)
        return {"answers": [str(answer.content)]}

    async def branch(state: State) -> dict:
        await asyncio.sleep(random.random() * 0.02)  # the branches start in a different order each run
        answer = await policy_model.ainvoke([HumanMessage(f"step {state['step']} branch {state['branch']}")])
        await asyncio.sleep(random.random() * 0.02)  # ...and finish in a different order
        return {"answers": [str(answer.content)]}

    async def environment(state: State) -> dict:
        if style == "pause" and state["pause"]:
            interrupt("shall I go on?")
        await areport_reward(1.0, terminated=state["step"] + 1 >= steps)
        return {"step": state["step"] + 1}

    async def fan_out(state: State) -> list[Send]:
        return [Send("branch", {"step": state["step"], "branch": i, "answers": []}) for i in range(branches)]

    async def next_step(state: State) -> Any:
        if state["step"] >= steps:
            return END
        return await fan_out(state) if style == "join" else "policy"

    graph = StateGraph(State)
    graph.add_node(
        "policy",
        policy,
        retry_policy=RetryPolicy(max_attempts=3, initial_interval=0.0, jitter=False, retry_on=ValueError),
    )
    graph.add_node("branch", branch)
    graph.add_node("environment", environment)
    graph.add_conditional_edges(START, next_step, ["policy", "branch", END])
    graph.add_edge("policy", "environment")
    graph.add_edge("branch", "environment")
    graph.add_conditional_edges("environment", next_step, ["policy", "branch", END])
    return graph.compile()
