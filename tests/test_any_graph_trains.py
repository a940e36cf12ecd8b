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
        f"multi_turn.langgraph.path={GRAPH}",
        f"trainer.run_dir={run_dir}",
        "wandb.mode=disabled",
        "trainer.num_envs=8",
        "trainer.turns_per_env=4",
        "trainer.save_every=0",
        "trainer.torch_threads=1",
        "algorithm.mini_batch_turns=32",
        "algorithm.ppo_epochs=1",
        "eval.episodes=8",
        "eval.at_start=false",
        "critic_warmup.buffer_multiplier=1",
        "critic_warmup.iterations=1",
        "rollout.episode_timeout_s=60",
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
    assert (
        main(
            [
                "eval",
                str(config),
                *overrides(run_dir),
                "--checkpoint",
                str(run_dir),
                "--episodes",
                "4",
                "--out",
                str(tmp_path / "eval"),
            ]
        )
        == 0
    )
    assert (tmp_path / "eval" / "summary.json").exists()


@pytest.mark.timeout(600)
def test_each_turn_is_scored_at_its_own_temperature(tmp_path):
    """Two nodes at 0.7 and 1.3, engine logprobs used as they are: the first PPO step's ratio is 1."""
    run_dir = tmp_path / "temps"
    config = load_config(
        ROOT / "configs" / "cue_corridor.yaml",
        overrides(
            run_dir,
            "trainer.total_updates=1",
            "algorithm.recompute_logprobs=false",
            "eval.at_end=false",
            "critic_warmup.buffer_multiplier=0",
            "algorithm.entropy_coef=0",
            "algorithm.kl_coef=0",
        ),
    )
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
        engine,
        lambda e: graph_file.build(VerlogChatModel(engine=e, tokenizer=tiny_tokenizer)),
        graph_file.episode_input,
        num_envs=2,
        turns_per_env=4,
        graph_config={"recursion_limit": 60},
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

    runner = SlotRunner(
        engine,
        build,
        lambda seed: {"t": 0},
        num_envs=num_envs,
        turns_per_env=turns_per_env,
        graph_config={"recursion_limit": 50},
        render_prompt=lambda m, tools: chat["model"].render_prompt_ids(m, tools),
    )
    try:
        return await runner.collect()
    finally:
        await runner.aclose()


def _learner(model_dir, gamma_step: float, critic_lr: float = 5e-2) -> Learner:
    from verlog.models import load_causal_lm
    from verlog.weights.actor_critic import load_critic

    actor = load_causal_lm(model_dir)
    critic = load_critic(model_dir, dtype="float32", device="cpu")
    algo = AlgorithmConfig(
        gamma_step=gamma_step,
        lam_step=0.95,
        whiten_advantages=False,
        value_clip=None,
        first_value_weight=1.0,
        micro_batch_tokens=4096,
        mini_batch_turns=64,
        ppo_epochs=1,
    )
    return Learner(
        actor,
        critic,
        torch.optim.Adam(actor.parameters(), 1e-4),
        torch.optim.Adam(critic.parameters(), critic_lr),
        None,
        algo,
        pad_id=0,
        device=torch.device("cpu"),
    )


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
            ScriptedEngine(tiny_tokenizer, ["ACTION: turn left"]),
            build,
            graph_file.episode_input,
            num_envs=2,
            turns_per_env=3,
            graph_config={"recursion_limit": 40},
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


# ---------------------------------------------------------------------- every way to call a model

ANY_CALL = ROOT / "tests" / "graphs" / "any_call.py"


def any_call_config(tmp_path: Path, name: str, **graph_kwargs) -> tuple[Path, Path]:
    """A small training run of ``tests/graphs/any_call.py`` on the tiny model (4 slots x 4 turns,
    3 updates, a validation evaluation after every update): its config file and run folder."""
    import yaml

    run_dir = tmp_path / name
    config = {
        "model": {"path": "tiny", "device": "cpu"},
        "engine": {"kind": "embedded", "batch_wait_ms": 1.0},
        "sampling": {"temperature": 1.0, "max_tokens": 8},
        "multi_turn": {
            "langgraph": {"path": str(ANY_CALL), "graph_config": {"recursion_limit": 200}, "graph_kwargs": graph_kwargs}
        },
        "rollout": {"episode_timeout_s": 120, "seed": 0},
        "trainer": {
            "run_dir": str(run_dir),
            "total_updates": 3,
            "num_envs": 4,
            "turns_per_env": 4,
            "save_every": 0,
            "eval_every": 1,
            "torch_threads": 1,
        },
        "actor": {"lr": 1.0e-4},
        "critic": {"lr": 1.0e-3},
        "algorithm": {"mini_batch_turns": 16, "kl_coef": 0.0},
        "critic_warmup": {"buffer_multiplier": 0},
        "eval": {"episodes": 4, "at_start": False, "at_end": False},
        "wandb": {"mode": "disabled"},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, run_dir


def any_call_module():
    from verlog.graph_file import load_graph_file

    return load_graph_file(ANY_CALL).module


@pytest.mark.timeout(600)
def test_every_langchain_entry_point_trains(tmp_path):
    """invoke, ainvoke, stream, astream, batch, abatch, structured output (sync and async), Send
    fan-outs, asyncio.gather, a branch that calls late, calls with callbacks of their own: 3 updates
    with an evaluation after each (the late branch's call meets a closed gate), no episode lost."""
    config, run_dir = any_call_config(tmp_path, "every", styles=list(any_call_module().STYLES))
    assert main(["train", str(config)]) == 0
    updates = metrics_rows(run_dir)
    assert [r["update"] for r in updates] == [1, 2, 3]
    assert all(r["failed_episodes"] == 0 and r["uncaptured_calls"] == 0 for r in updates)
    assert updates[-1]["turns_total"] == 3 * 4 * 4


async def test_every_entry_point_is_captured_token_exact(tiny_tokenizer, tiny_model):
    """Each turn's prompt ids are the chat template of exactly the call's messages (plus, for a
    structured call, the forced tool call's opening), and its logprobs those of a teacher-forced
    pass (a constrained call's are of the masked distribution: never below the unmasked ones)."""
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from test_rollout_capture import forced_logprobs

    from verlog.backends.embedded import EmbeddedEngine
    from verlog.graph_file import load_graph_file
    from verlog.llm import VerlogChatModel
    from verlog.llm.prompt import to_chat_dicts

    graph_file = load_graph_file(ANY_CALL)
    module = graph_file.module
    engine = EmbeddedEngine(tiny_model, tiny_tokenizer, seed=0)
    batches = []
    try:
        for styles in (module.PARALLEL, module.SEQUENTIAL):
            runner = SlotRunner(
                engine,
                lambda e, styles=styles: graph_file.build(
                    VerlogChatModel(engine=e, tokenizer=tiny_tokenizer), styles=styles
                ),
                graph_file.episode_input,
                num_envs=4,
                turns_per_env=6,
                graph_config={"recursion_limit": 200},
                keep_messages=True,
            )
            try:
                batches += [await asyncio.wait_for(runner.collect(), 120) for _ in range(2)]
            finally:
                await runner.aclose()
    finally:
        engine.close()
    tools = [convert_to_openai_tool(module.Choice)]
    nodes = set()
    for turn in (t for b in batches for t in b.flat_turns()):
        nodes.add(turn.node)
        constrained = turn.node in ("structured", "astructured")
        text = tiny_tokenizer.apply_chat_template(
            to_chat_dicts(turn.messages),
            tools=tools if constrained else None,
            tokenize=False,
            add_generation_prompt=True,
        )
        rendered = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
        assert turn.prompt_ids[: len(rendered)] == rendered
        if constrained:  # the rest is the forced opening of the call
            assert tiny_tokenizer.decode(turn.prompt_ids[len(rendered) :]).startswith("<tool_call>")
            assert turn.constraint is not None  # (a lark grammar: the tool call around its JSON)
            assert (torch.tensor(turn.logprobs) >= forced_logprobs(tiny_model, turn) - 1e-3).all()
        else:
            assert turn.prompt_ids == rendered and turn.constraint is None
            assert torch.allclose(forced_logprobs(tiny_model, turn), torch.tensor(turn.logprobs), atol=1e-3)
    assert nodes >= {
        "ainvoke",
        "invoke",
        "gather",
        "call",
        "call_sync",
        "abatch",
        "batch",
        "astream",
        "stream",
        "structured",
        "astructured",
    }


@pytest.mark.timeout(600)
def test_blocking_calls_in_async_nodes_train(tmp_path):
    """``model.invoke``, ``model.stream`` and ``model.batch`` inside ``async def`` nodes (each blocks
    its episode's event loop, as in production) train 3 updates under ``verlog train``, with an
    evaluation after each: no episode lost, every turn captured."""
    module = any_call_module()
    config, run_dir = any_call_config(tmp_path, "blocking", styles=list(module.BLOCKING))
    assert main(["train", str(config)]) == 0
    updates = metrics_rows(run_dir)
    assert [r["update"] for r in updates] == [1, 2, 3]
    assert all(r["failed_episodes"] == 0 and r["uncaptured_calls"] == 0 for r in updates)
    assert updates[-1]["turns_total"] == 3 * 4 * 4


@pytest.mark.timeout(600)
def test_a_judge_reusing_the_policy_model_never_trains(tmp_path, capsys, tiny_tokenizer):
    """A judge node calls the policy model tagged ``NO_TRAIN_TAG`` and reports its score: under
    ``verlog rollout`` no judge call is a turn (each step has one more model call than turns) and
    only answer turns carry rewards; training runs 3 updates."""
    import re

    module = any_call_module()
    config, run_dir = any_call_config(tmp_path, "judge", styles=["ainvoke", "stream"], judge=True)
    out = tmp_path / "rollout.json"
    assert main(["rollout", str(config), "--episodes", "4", "--json", str(out)]) == 0
    episodes = json.loads(out.read_text())
    assert len(episodes) == 4 and all(e["status"] == "ok" for e in episodes)
    for episode in episodes:
        assert {t["node"] for t in episode["turns"]} <= {"ainvoke", "stream"}
        calls = [
            tuple(
                map(
                    int, re.search(r"seed (\d+) step (\d+) call (\d+)", tiny_tokenizer.decode(t["prompt_ids"])).groups()
                )
            )
            for t in episode["turns"]
        ]
        steps = {(seed, step) for seed, step, _ in calls}
        assert episode["model_calls"] == len(episode["turns"]) + len(steps)  # one judge call per step
        for (seed, step, call), turn in zip(calls, episode["turns"]):
            if call < module.calls_at(seed, step) - 1:
                assert turn["reward"] == 0.0  # the judge's score goes to the step's answer only
    capsys.readouterr()
    assert main(["train", str(config)]) == 0
    assert [r["update"] for r in metrics_rows(run_dir)] == [1, 2, 3]


@pytest.mark.timeout(300)
def test_engine_logprobs_of_constrained_turns_are_warned_about(tmp_path, capsys):
    """``recompute_logprobs: false`` trains constrained turns on the masked distribution's
    logprobs: the trainer says so (once)."""
    config, _ = any_call_config(tmp_path, "masked", styles=["structured"])
    overrides = ["algorithm.recompute_logprobs=false", "algorithm.constrained_logprobs=policy"]
    assert main(["train", str(config), "trainer.total_updates=2", *overrides]) == 0
    said = capsys.readouterr()
    assert " ".join((said.out + said.err).split()).count("recompute_logprobs is false") == 1  # (rich wraps lines)


@pytest.mark.timeout(300)
def test_constrained_turns_train_on_the_distribution_they_were_sampled_from(tmp_path, capsys):
    """Structured-output turns (a Lark grammar around a tool call's JSON, on a BPE vocabulary) are
    scored under the grammar's masks, rebuilt from each turn's recorded grammar: the trainer's old
    logprobs equal the engine's (within float32 noise), every constrained turn masked; with
    ``constrained_logprobs: policy`` they are the whole distribution's, far from the engine's."""
    config, run_dir = any_call_config(tmp_path, "masked", styles=["structured", "ainvoke"])
    assert main(["train", str(config), "trainer.total_updates=2"]) == 0
    masked = metrics_rows(run_dir)
    assert all(r["masked_turns"] > 0 and r["unmasked_constrained_turns"] == 0 for r in masked)
    assert all(r["rollout_logprob_gap"] < 1e-4 for r in masked)
    assert "recompute_logprobs is false" not in capsys.readouterr().out
    config, run_dir = any_call_config(tmp_path, "policy", styles=["structured", "ainvoke"])
    assert main(["train", str(config), "trainer.total_updates=2", "algorithm.constrained_logprobs=policy"]) == 0
    whole = metrics_rows(run_dir)
    assert all("masked_turns" not in r for r in whole)
    assert all(r["rollout_logprob_gap"] > 100 * m["rollout_logprob_gap"] for r, m in zip(whole, masked))


# ---------------------------------------------------------------------- calls outside the episode's context

EXECUTOR_CALL = ROOT / "tests" / "graphs" / "executor_call.py"


def executor_call_config(tmp_path: Path, style: str) -> tuple[Path, Path]:
    """``any_call_config``'s run on ``tests/graphs/executor_call.py`` in ``style``: 2 updates of
    4 slots x 4 turns, no evaluation."""
    import yaml

    path, run_dir = any_call_config(tmp_path, style)
    config = yaml.safe_load(path.read_text())
    config["multi_turn"]["langgraph"] |= {"path": str(EXECUTOR_CALL), "graph_kwargs": {"style": style}}
    config["trainer"] |= {"total_updates": 2, "eval_every": 0}
    path.write_text(yaml.safe_dump(config))
    return path, run_dir


@pytest.mark.parametrize(("style", "outside"), [("executor", 1), ("to_thread", 0), ("config", 0)])
def test_a_call_handed_to_run_in_executor_is_counted_and_warned_of_in_rollout(tmp_path, recwarn, style, outside):
    """``verlog rollout``: each step's ``loop.run_in_executor(None, model.invoke, ...)`` is answered
    but not a turn, and counted as uncaptured with a warning naming the node and the fixes; with
    ``asyncio.to_thread`` or the node's config passed, the same call is a turn."""
    config, _ = executor_call_config(tmp_path, style)
    out = tmp_path / "episodes.json"
    assert main(["rollout", str(config), "--episodes", "2", "--json", str(out)]) == 0
    for episode in json.loads(out.read_text()):
        assert episode["status"] == "ok"
        assert (episode["uncaptured_calls"], episode["model_calls"]) == (2 * outside, 4)
        assert len(episode["turns"]) == 4 - 2 * outside
        assert len({t["turn_index"] for t in episode["turns"]}) == len(episode["turns"])
    said = [str(w.message) for w in recwarn if "outside its episode's context" in str(w.message)]
    if outside:
        assert said and "node 'policy'" in said[0] and "asyncio.to_thread" in said[0] and "config" in said[0]
    else:
        assert not said


def test_a_call_handed_to_run_in_executor_is_counted_in_training(tmp_path):
    """``verlog train`` (each slot's graph on a loop of its own): the executor's calls are the
    batches' ``uncaptured_calls``, one per step; the ``ainvoke`` calls train."""
    config, run_dir = executor_call_config(tmp_path, "executor")
    assert main(["train", str(config)]) == 0
    updates = metrics_rows(run_dir)
    assert [r["update"] for r in updates] == [1, 2]
    assert all(r["failed_episodes"] == 0 for r in updates)
    ended = [r for r in updates if r["episodes"] > 0]
    assert ended and all(r["uncaptured_calls"] == 2 * r["episodes"] for r in ended)
