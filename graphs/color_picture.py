"""Name the colour: a small game played from pictures, for vision-language agents.

Each turn the environment shows a picture (a tile of one of :data:`COLORS` with a little noise)
and asks which colour it is; the answer ``COLOR: <name>`` earns 1 when it is right. The episode
is ``turns`` pictures long. The policy sees the rules, then the last ``image_history`` pictures
with its answers to them (older exchanges keep only their text), as LangChain messages with
OpenAI ``image_url`` parts: any chat model that takes images plays it (a vision-language model on
verlog's embedded engine, ``ChatOpenAI`` against ``verlog serve-model tiny-vl`` or any
OpenAI-compatible VLM endpoint).
"""

from __future__ import annotations

import base64
import io
import random
import re
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from verlog.rollout.events import areport_reward

COLORS = {"red": (220, 30, 30), "green": (30, 180, 40), "blue": (30, 60, 220), "yellow": (230, 210, 40)}
RULES = f"Each picture is a tile of one colour: {', '.join(COLORS)}. Answer with one line: COLOR: <name>."
_ANSWER = re.compile(r"color\s*:\s*([a-z]+)", re.IGNORECASE)


class State(TypedDict):
    seed: int
    colors: list[str]
    history: list[BaseMessage]
    turn: int


def make_input(seed: int) -> dict[str, Any]:
    """The pictures of episode ``seed``: its colours, drawn from the seed."""
    return {"seed": seed, "colors": [], "history": [], "turn": 0}


def picture(color: str, seed: int, side: int = 48) -> str:
    """A PNG data URL of a ``color`` tile with seeded noise (no two pictures alike)."""
    from PIL import Image

    rng = random.Random(seed)
    base = COLORS[color]
    image = Image.new("RGB", (side, side), base)
    for _ in range(side):
        x, y = rng.randrange(side), rng.randrange(side)
        image.putpixel((x, y), tuple(max(0, min(255, c + rng.randint(-60, 60))) for c in base))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode("ascii")


def without_images(message: BaseMessage) -> BaseMessage:
    """A past question with its picture replaced by a short note (beyond the image history)."""
    if isinstance(message.content, str):
        return message
    text = "".join(p.get("text", "") for p in message.content if isinstance(p, dict) and p.get("type") == "text")
    return HumanMessage(text + " (picture not shown again)")


def build_graph(model, turns: int = 3, image_history: int = 1, max_tokens: int = 8):
    """The game: ``turns`` pictures; the model sees the last ``image_history`` of them."""
    policy_model = model.bind(max_tokens=max_tokens)

    async def policy(state: State) -> dict:
        rng = random.Random(state["seed"] * 1000 + state["turn"])
        color = rng.choice(sorted(COLORS))
        question = HumanMessage(
            content=[
                {"type": "text", "text": f"Picture {state['turn'] + 1}: which colour?"},
                {"type": "image_url", "image_url": {"url": picture(color, rng.randrange(2**31))}},
            ]
        )
        shown = state["history"]
        keep = 2 * max(0, image_history - 1)  # the last pictures (with their answers) stay whole
        past = [without_images(m) if i < len(shown) - keep else m for i, m in enumerate(shown)]
        answer = await policy_model.ainvoke([SystemMessage(RULES), *past, question])
        return {"history": [*shown, question, AIMessage(answer.content)], "colors": [*state["colors"], color]}

    async def environment(state: State) -> dict:
        said = _ANSWER.findall(state["history"][-1].content)
        right = bool(said) and said[-1].lower() == state["colors"][-1]
        turn = state["turn"] + 1
        await areport_reward(1.0 if right else 0.0, terminated=turn >= turns, info={"success": right})
        return {"turn": turn}

    def next_step(state: State) -> str:
        return END if state["turn"] >= turns else "policy"

    g = StateGraph(State)
    g.add_node("policy", policy)
    g.add_node("environment", environment)
    g.add_edge(START, "policy")
    g.add_edge("policy", "environment")
    g.add_conditional_edges("environment", next_step, ["policy", END])
    return g.compile()
