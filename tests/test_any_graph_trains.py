"""Any LangGraph graph trains correctly: ``def`` nodes calling ``model.invoke``, LLM nodes that
sample at their own temperatures, and step caps (truncation) that keep the value of the state
after the cut.

The graph is ``tests/graphs/sync_corridor.py`` (the cue corridor with sync nodes and two LLM
nodes at 0.7 and 1.3) played by the word-level toy model through the real commands.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from verlog.cli import main
from verlog.config import AlgorithmConfig, load_config
from verlog.rollout import areport_reward
from verlog.rollout.slots import SlotRunner
from verlog.train.ppo import Learner, ppo_update, score_batch
from verlog.train.storage import RolloutStorage

ROOT = Path(__file__).resolve().parents[1]
GRAPH = ROOT / "tests" / "graphs" / "sync_corridor.py"
SCOUT_TEMPERATURE, POLICY_TEMPERATURE = 0.7, 1.3  # the graph's two nodes


def overrides(run_dir: Path, *extra: str) -> list[str]:
    return [
        f"multi_turn.langgraph.path={GRAPH}", f"trainer.run_dir={run_dir}", "wandb.mode=disabled",
        "trainer.num_envs=8", "trainer.turns_per_env=4", "trainer.save_every=0", "trainer.torch_threads=1",
        "algorithm.mini_batch_turns=32", "algorithm.ppo_epochs=1", "eval.episodes=8", "eval.at_start=false",
        "critic_warmup.buffer_multiplier=1", "critic_warmup.iterations=1", "rollout.episode_timeout_s=60",
        *extra,
    ]


def metrics_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("kind", "update") == "update" and "actor_grad_norm" in r]


@pytest.mark.timeout(600)
def test_sync_node_graph_trains_rolls_out_and_evaluates(tmp_path, capsys):
    config = ROOT / "configs" / "cue_corridor.yaml"
    run_dir = tmp_path / "run"
    assert main(["train", str(config), *overrides(run_dir, "trainer.total_updates=3")]) == 0
    updates = metrics_rows(run_dir)
    assert [r["update"] for r in updates] == [1, 2, 3]  # three updates: the second collect no longer hangs
    assert (run_dir / "eval.json").exists()
    capsys.readouterr()
    # the same graph file under verlog rollout and verlog eval
    assert main(["rollout", str(config), *overrides(run_dir), "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "scout" in out and "policy" in out
    assert main(["eval", str(config), *overrides(run_dir), "--checkpoint", str(run_dir), "--episodes", "4",
                 "--out", str(tmp_path / "eval")]) == 0
    assert (tmp_path / "eval" / "summary.json").exists()


@pytest.mark.timeout(600)
def test_each_turn_is_scored_at_its_own_temperature(tmp_path):
    """Two nodes at 0.7 and 1.3, engine logprobs used as they are: the first PPO step's ratio is 1."""
    run_dir = tmp_path / "temps"
    config = load_config(ROOT / "configs" / "cue_corridor.yaml", overrides(
        run_dir, "trainer.total_updates=1", "algorithm.recompute_logprobs=false", "eval.at_end=false",
        "critic_warmup.buffer_multiplier=0", "algorithm.entropy_coef=0", "algorithm.kl_coef=0",
    ))
    from rich.console import Console

    from verlog.train import train

    train(config, console=Console(quiet=True))
    [row] = metrics_rows(run_dir)
    assert abs(row["ratio_max"] - 1.0) < 1e-5
    assert abs(row["approx_kl"]) < 1e-6


async def test_turns_record_their_nodes_sampling(tiny_tokenizer, tiny_model):
    from verlog.backends.embedded import EmbeddedEngine
    from verlog.graph_file import load_graph_file
    from verlog.llm import VerlogChatModel

    engine = EmbeddedEngine(tiny_model, tiny_tokenizer, seed=0)
    graph_file = load_graph_file(GRAPH)
    runner = SlotRunner(
        engine, lambda e: graph_file.build(VerlogChatModel(engine=e, tokenizer=tiny_tokenizer)),
        graph_file.episode_input, num_envs=2, turns_per_env=4, graph_config={"recursion_limit": 60},
    )
    try:
        batch = await runner.collect()
    finally:
        await runner.aclose()
    temperatures = {t.node: t.temperature for t in batch.flat_turns()}
    assert temperatures == {"scout": SCOUT_TEMPERATURE, "policy": POLICY_TEMPERATURE}
    storage = RolloutStorage.from_batch(batch)
    assert sorted(set(storage.temperatures.tolist())) == pytest.approx([SCOUT_TEMPERATURE, POLICY_TEMPERATURE])


# ---------------------------------------------------------------------- truncation


class _State(TypedDict):
    t: int


def _capped_graph(model, cap: int):
    """One state forever (the prompt never changes), reward 1 a step, cut after ``cap`` steps."""
    prompt = [SystemMessage("walk the corridor"), HumanMessage("pos 0 of 4 cue red")]

    async def policy(state: _State) -> dict:
        await model.bind(max_tokens=1).ainvoke(prompt)
        return {}

    async def environment(state: _State) -> dict:
        t = state["t"] + 1
        cut = t >= cap
        await areport_reward(1.0, truncated=cut, next_messages=prompt if cut else None)
        return {"t": t}

    g = StateGraph(_State)
    g.add_node("policy", policy)
    g.add_node("environment", environment)
    g.add_edge(START, "policy")
    g.add_edge("policy", "environment")
    g.add_conditional_edges("environment", lambda s: END if s["t"] >= cap else "policy", ["policy", END])
    return g.compile()


async def _capped_batch(tokenizer, model, cap=3, num_envs=4, turns_per_env=6):
    """The capped task's turns. ``model``: the policy's model (sampled by the embedded engine), or
    ``None`` for a scripted one-token answer (the same turns whatever the machine's load: unseeded
    requests share one random stream, drawn in the order the engine batches them)."""
    from verlog.backends.embedded import EmbeddedEngine
    from verlog.llm import VerlogChatModel
    from verlog.testing import ScriptedEngine

    engine = ScriptedEngine(tokenizer, ["a"]) if model is None else EmbeddedEngine(model, tokenizer, seed=0)
    chat = {}

    def build(e):
        chat["model"] = VerlogChatModel(engine=e, tokenizer=tokenizer)
        return _capped_graph(chat["model"], cap)

    runner = SlotRunner(engine, build, lambda seed: {"t": 0}, num_envs=num_envs, turns_per_env=turns_per_env,
                        graph_config={"recursion_limit": 50},
                        render_prompt=lambda m, tools: chat["model"].render_prompt_ids(m, tools))
    try:
        return await runner.collect()
    finally:
        await runner.aclose()


def _learner(model_dir, gamma_step: float, critic_lr: float = 5e-2) -> Learner:
    from verlog.models import load_causal_lm
    from verlog.weights.actor_critic import load_critic

    actor = load_causal_lm(model_dir)
    critic = load_critic(model_dir, dtype="float32", device="cpu")
    algo = AlgorithmConfig(gamma_step=gamma_step, lam_step=0.95, whiten_advantages=False, value_clip=None,
                           first_value_weight=1.0, micro_batch_tokens=4096, mini_batch_turns=64, ppo_epochs=1)
    return Learner(actor, critic, torch.optim.Adam(actor.parameters(), 1e-4),
                   torch.optim.Adam(critic.parameters(), critic_lr), None, algo, pad_id=0, device=torch.device("cpu"))


def test_swapping_terminated_and_truncated_changes_the_advantages(tiny_tokenizer, tiny_model, tiny_dir):
    batch = asyncio.run(_capped_batch(tiny_tokenizer, tiny_model))
    cut = [t for t in batch.flat_turns() if t.truncated]
    assert cut and all(t.next_prompt_ids for t in cut)
    learner = _learner(tiny_dir, gamma_step=0.9)
    torch.nn.init.constant_(learner.critic.value_head.bias, 1.0)  # every state worth 1, not 0
    truncated = RolloutStorage.from_batch(batch)
    score_batch(truncated, learner)
    terminated = RolloutStorage.from_batch(batch)
    terminated.terminated, terminated.truncated = truncated.truncated.clone(), truncated.terminated.clone()
    score_batch(terminated, learner)
    assert torch.isfinite(truncated.truncation_values[truncated.truncated]).all()
    assert not torch.allclose(truncated.advantages, terminated.advantages)


def test_truncation_aware_critic_learns_the_value_of_a_capped_task(tiny_tokenizer, tiny_dir):
    """One state, reward 1 a step, gamma 0.9, cut after 3 steps: the state's value is 1 / (1 - 0.9)
    = 10 (the cap is not part of the state). Bootstrapping the cut turns from the value of the
    state after the cut learns it; treating the cut as an ending would learn about 2.6."""
    torch.manual_seed(0)
    batch = asyncio.run(_capped_batch(tiny_tokenizer, None))
    learner = _learner(tiny_dir, gamma_step=0.9)
    storage = RolloutStorage.from_batch(batch)
    for _ in range(80):  # critic-only iterations on one buffer, values and GAE recomputed each time
        score_batch(storage, learner, logprobs=False)
        ppo_update(storage, learner, update_actor=False)
    score_batch(storage, learner, logprobs=False)
    first_values = storage.values[:, 0]
    value = first_values.mean().item()
    print(f"\nlearned V(s) = {value:.3f} (analytic 10.0)")
    assert abs(value - 10.0) / 10.0 < 0.05


def test_capped_game_graphs_report_the_state_after_the_cut(tiny_tokenizer):
    """The shipped game loop (``verlog/envs/agent_graph.py``) ends a capped episode as truncated
    and hands over the prompt its next step would have shown."""
    from verlog.graph_file import load_graph_file
    from verlog.llm import VerlogChatModel
    from verlog.testing import ScriptedEngine

    graph_file = load_graph_file(ROOT / "graphs" / "babyai.py")
    chat = {}

    def build(engine):
        chat["model"] = VerlogChatModel(engine=engine, tokenizer=tiny_tokenizer, max_tokens=8)
        return graph_file.build(chat["model"], task="goto", max_steps=3)

    async def collect():
        runner = SlotRunner(
            ScriptedEngine(tiny_tokenizer, ["ACTION: turn left"]), build, graph_file.episode_input,
            num_envs=2, turns_per_env=3, graph_config={"recursion_limit": 40},
            render_prompt=lambda m, tools: chat["model"].render_prompt_ids(m, tools),
        )
        try:
            return await runner.collect()
        finally:
            await runner.aclose()

    batch = asyncio.run(collect())
    for turns in batch.turns:  # turning left three times never reaches the goal: cut at step 3
        last = turns[-1]
        assert last.truncated and not last.terminated
        assert last.next_prompt_ids and last.next_prompt_ids != last.prompt_ids
        shown = tiny_tokenizer.decode(last.next_prompt_ids)
        assert tiny_tokenizer.decode(last.prompt_ids).split("\n")[0] == shown.split("\n")[0]  # same instruction
