"""The agent graphs of the text games: graph, recorder and environment agree turn by turn.

An oracle's answers (replayed through a scripted engine) win through the graph exactly as they
win on the bare environment; invalid answers pay the penalty and are told; the default history
window keeps prompts flat while the full history grows; step caps end as truncated.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from verlog.envs.agent_graph import recursion_limit_for
from verlog.envs.babaisai import make as make_baba
from verlog.envs.babaisai.solver import bot_actions
from verlog.envs.babyai.env import BabyAIBotAgent, BabyAITextEnv
from verlog.graph_file import load_graph_file
from verlog.llm import VerlogChatModel
from verlog.rollout import Episode, run_episode
from verlog.testing.scripted_engine import ScriptedEngine

ROOT = Path(__file__).resolve().parents[1]


def oracle_answers_babyai(task: str, seed: int) -> list[str]:
    env = BabyAITextEnv(task)
    observation = env.reset(seed)
    bot = BabyAIBotAgent(env)
    bot.reset()
    answers = []
    while True:
        answers.append(f"I follow the plan.\n{bot.act(observation)}")
        result = env.step(answers[-1])
        observation = result.observation
        if result.done:
            assert result.info["success"]
            return answers


async def play(graph_name: str, answers, seed: int, max_steps: int | None = None, **graph_kwargs) -> Episode:
    from verlog.models import load_tokenizer

    tokenizer = load_tokenizer("tiny")
    graph_file = load_graph_file(ROOT / "graphs" / f"{graph_name}.py")
    model = VerlogChatModel(engine=ScriptedEngine(tokenizer, answers), tokenizer=tokenizer, max_tokens=128)
    graph = graph_file.build(model, max_steps=max_steps, **graph_kwargs)
    return await run_episode(
        graph,
        graph_file.episode_input(seed),
        graph_config={"recursion_limit": recursion_limit_for(max_steps or 128)},
        keep_messages=True,
    )


@pytest.mark.parametrize("task", ["goto", "pickup", "pick_up_seq_go_to", "open"])
async def test_babyai_oracle_wins_through_the_graph(task):
    answers = oracle_answers_babyai(task, seed=3)
    episode = await play("babyai", answers, seed=3, task=task)
    assert episode.status == "ok", episode.error
    assert len(episode.turns) == len(answers)
    assert [t.reward for t in episode.turns] == [0.0] * (len(answers) - 1) + [1.0]
    last = episode.turns[-1]
    assert last.terminated and not last.truncated and last.info["success"]
    assert all(t.info["valid_action"] for t in episode.turns)


async def test_babaisai_solver_wins_through_the_graph():
    env = make_baba("two_room-maybe_break_stop-goto_win", seed=2)
    env.reset(2)
    answers = bot_actions(env)
    episode = await play("babaisai", answers, seed=2, task="two_room-maybe_break_stop-goto_win")
    assert episode.status == "ok" and len(episode.turns) == len(answers)
    assert episode.turns[-1].reward == 1.0 and episode.turns[-1].terminated and episode.info["success"]


async def test_invalid_answers_are_penalized_and_told():
    episode = await play("babyai", ["I am not sure what to do."], seed=0, task="goto", max_steps=4)
    assert episode.status == "ok" and len(episode.turns) == 4
    assert all(t.reward == pytest.approx(-0.1) and t.info["valid_action"] is False for t in episode.turns)
    # the step cap ends the episode as truncated (the last state still has a value)
    assert episode.turns[-1].truncated and not episode.turns[-1].terminated
    second_prompt = episode.turns[1].messages[-1].content
    assert "named no valid action" in second_prompt and "Current Observation:" in second_prompt


async def test_history_window_keeps_prompts_flat():
    answers = ["Going.\nACTION: move left", "Going.\nACTION: move up", "Chop.\nACTION: do", "Wait.\nACTION: noop"]
    window = await play("crafter", answers, seed=1, max_steps=30)
    full = await play("crafter", answers, seed=1, max_steps=30, history_turns=None)
    assert window.status == full.status == "ok" and len(window.turns) == len(full.turns) == 30
    for turn in window.turns[1:]:
        kinds = [m.type for m in turn.messages]
        assert kinds == ["system", "human", "ai", "human"]  # instruction, one past exchange, now
        assert turn.messages[-1].content.startswith("Current Observation:\n")
    for k, turn in enumerate(full.turns):
        assert len(turn.messages) == 2 + 2 * k  # every past exchange
    assert max(len(t.prompt_ids) for t in window.turns) < 2.5 * len(window.turns[0].prompt_ids)
    assert len(full.turns[-1].prompt_ids) > 8 * len(full.turns[0].prompt_ids)
    # both runs took the same actions: same rewards turn by turn
    assert [t.reward for t in window.turns] == [t.reward for t in full.turns]


async def test_environment_failure_is_a_failed_episode(monkeypatch):
    from verlog.envs.crafter.env import CrafterTextEnv

    calls = {"n": 0}
    real_step = CrafterTextEnv.step

    def flaky(self, text):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("the game crashed")
        return real_step(self, text)

    monkeypatch.setattr(CrafterTextEnv, "step", flaky)
    episode = await play("crafter", ["ACTION: noop"], seed=0, max_steps=10)
    assert episode.status == "error" and "the game crashed" in episode.error
    assert len(episode.turns) == 3 and episode.trainable_turns() == []


def test_unknown_task_names_the_valid_ones():
    graph_file = load_graph_file(ROOT / "graphs" / "babyai.py")
    with pytest.raises(ValueError, match="valid: goto, pickup, pick_up_seq_go_to, open"):
        graph_file.build(model=None, task="fly")


@pytest.mark.parametrize("protocol", ["verlog", "balrog"])
async def test_constrained_answers_are_always_an_action(tiny_model, tiny_tokenizer, protocol):
    """``constrain_answers``: the random tiny model, whose free answers are noise, names a valid
    action at every step of every game (the engine holds it to the game's action names), under
    both protocols; its turns record the regex constraint."""
    import asyncio

    from verlog.backends.embedded import EmbeddedEngine
    from verlog.envs.babyai.env import BabyAITextEnv

    engine = EmbeddedEngine(tiny_model, tiny_tokenizer, seed=0)
    try:
        graph_file = load_graph_file(ROOT / "graphs" / "babyai.py")
        model = VerlogChatModel(engine=engine, tokenizer=tiny_tokenizer, max_tokens=16)
        graph = graph_file.build(
            model, task="goto", protocol=protocol, max_steps=6, constrain_answers=True, history_turns=0
        )
        episodes = await asyncio.gather(
            *[
                run_episode(
                    graph, graph_file.episode_input(seed), graph_config={"recursion_limit": recursion_limit_for(6)}
                )
                for seed in range(4)
            ]
        )
    finally:
        engine.close()
    actions = BabyAITextEnv("goto").actions
    turns = [t for e in episodes for t in e.turns]
    assert all(e.status == "ok" for e in episodes) and len(turns) >= 4
    assert all(tiny_tokenizer.decode(t.response_ids, skip_special_tokens=True) in actions for t in turns)
    assert all(t.info["valid_action"] for t in turns if "valid_action" in t.info)
    assert all(t.reward >= 0 for t in turns)  # no invalid-answer penalty was paid
