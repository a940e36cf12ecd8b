"""Follow-up questions: an assistant answers a user who asks again, human in the loop.

The assistant node answers the conversation so far; the user node then pauses the graph with
LangGraph's ``interrupt()``, showing the answer, and waits for the user's next question (in
production a person answers with ``Command(resume="...")``). After ``max_follow_ups`` questions the
conversation ends. Under training a responder plays the user:
``multi_turn.langgraph.on_interrupt: examples/follow_up_user.py:ask`` (see
docs/interrupts_and_retries.md); without one every episode stops at the first pause and ends
``interrupted`` (never trained).

Reward, after each answer: 1 when the answer names the conversation's topic, else 0; the last
answer ends the episode (terminated). The graph is compiled without a checkpointer: LangGraph's
server brings its own in production, verlog gives it an in-memory one when a responder is set.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt
from typing_extensions import TypedDict

from verlog.rollout.events import areport_reward

TOPICS = ("rainbows", "tides", "volcanoes", "bread", "magnets", "bees", "glaciers", "bicycles")
SYSTEM = "You are a helpful assistant. Answer the user's questions about {topic} in one or two sentences."


class State(TypedDict):
    topic: str
    messages: list[BaseMessage]
    follow_ups: int


def make_input(seed: int) -> dict[str, Any]:
    """The conversation of episode ``seed``: a topic and the user's first question."""
    topic = TOPICS[seed % len(TOPICS)]
    return {"topic": topic, "messages": [HumanMessage(f"Tell me about {topic}.")], "follow_ups": 0}


def build_graph(model, max_follow_ups: int = 2, max_tokens: int = 48):
    """The conversation: ``assistant`` answers, ``user`` pauses for a follow-up question, at most
    ``max_follow_ups`` of them."""
    assistant_model = model.bind(max_tokens=max_tokens)

    async def assistant(state: State) -> dict:
        answer = await assistant_model.ainvoke([SystemMessage(SYSTEM.format(topic=state["topic"])), *state["messages"]])
        on_topic = state["topic"].rstrip("s").lower() in str(answer.content).lower()
        await areport_reward(
            1.0 if on_topic else 0.0, terminated=state["follow_ups"] >= max_follow_ups, info={"success": on_topic}
        )
        return {"messages": [*state["messages"], answer]}

    async def user(state: State) -> dict:
        # the pause: everything before it in this node runs again when the graph resumes
        last = state["messages"][-1]
        question = interrupt(
            {
                "topic": state["topic"],
                "answer": last.content if isinstance(last, AIMessage) else "",
                "follow_ups": state["follow_ups"],
            }
        )
        return {"messages": [*state["messages"], HumanMessage(str(question))], "follow_ups": state["follow_ups"] + 1}

    async def next_step(state: State) -> str:  # async: LangGraph runs sync functions in threads
        return "user" if state["follow_ups"] < max_follow_ups else END

    graph = StateGraph(State)
    graph.add_node("assistant", assistant)
    graph.add_node("user", user)
    graph.add_edge(START, "assistant")
    graph.add_conditional_edges("assistant", next_step, ["user", END])
    graph.add_edge("user", "assistant")
    return graph.compile()
