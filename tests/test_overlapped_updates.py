"""Overlapped updates and straggler-tolerant batches, on the real slot runner, graph, chat model and
recorder (a scripted engine plays the model; ``asyncio.sleep`` plays the update):

* each turn records the version of the weights its call was admitted under, and a batch's turns
  are never more than ``max_staleness`` updates behind the weights their update starts from;
  alternating updates (bound 0) train fresh turns only;
* the correction weight of each turn is the docs' ``min(pi_prox / pi_behav, c)`` times its staleness
  weight (1 within the bound, 0 beyond);
* with stragglers, a batch holds ``num_envs x turns_per_env`` complete turns however slow some slots'
  tools are, every episode's turns reach the batches once, in order, with their rewards, and each
  slot's bootstrap prompt is the prompt of its next turn.
"""

from __future__ import annotations

import asyncio
import re

import pytest
import torch
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from verlog.algo.off_policy import OffPolicyCorrection, decoupled_advantages
from verlog.llm import VerlogChatModel
from verlog.rollout import areport_reward
from verlog.rollout.slots import SlotRunner
from verlog.testing import ScriptedEngine
from verlog.train.pipeline import BatchPipeline, live_correction
from verlog.train.storage import RolloutStorage, aligned_grid

EPISODE = 6  # turns per episode


class State(TypedDict):
    seed: int
    t: int


def build_graph(model, slow_s=lambda seed, t: 0.0):
    async def policy(state: State) -> dict:
        await model.ainvoke([HumanMessage(f"seed {state['seed']} turn {state['t']}")])
        return {}

    async def tool(state: State) -> dict:  # the environment's step, slow in some episodes
        await asyncio.sleep(slow_s(state["seed"], state["t"]))
        t = state["t"] + 1
        await areport_reward(float(t), terminated=t >= EPISODE)
        return {"t": t}

    g = StateGraph(State)
    g.add_node("policy", policy)
    g.add_node("tool", tool)
    g.add_edge(START, "policy")
    g.add_edge("policy", "tool")
    g.add_conditional_edges("tool", lambda s: END if s["t"] >= EPISODE else "policy", ["policy", END])
    return g.compile()


def make_runner(tokenizer, *, num_envs=4, turns_per_env=3, cap=None, slow_s=lambda seed, t: 0.0):
    engine = ScriptedEngine(tokenizer, ["go"])
    models = []

    def build(gated):
        models.append(VerlogChatModel(engine=gated, tokenizer=tokenizer, max_tokens=4))
        return build_graph(models[-1], slow_s)

    runner = SlotRunner(
        engine,
        build,
        lambda seed: {"seed": seed, "t": 0},
        num_envs=num_envs,
        turns_per_env=turns_per_env,
        graph_config={"recursion_limit": 100},
        max_turns_per_env=cap,
    )
    return runner, engine


def state_of(tokenizer, prompt_ids) -> tuple[int, int]:
    seed, turn = re.search(r"seed (\d+) turn (\d+)", tokenizer.decode(prompt_ids)).groups()
    return int(seed), int(turn)


async def train_loop(runner, updates: int, max_staleness: int, update_s: float = 0.05, long_updates: bool = False):
    """The trainer's loop (verlog.train.trainer) with a pause for each update: overlapped
    (``max_staleness`` >= 1) publishes the new weights when the update ends, alternating (0)
    once its step is over. ``long_updates``: each update also lasts until the rollout has collected
    every batch the bound lets it (an update slower than the rollout, whatever the machine's load).
    Returns the batches and the engine calls made during updates."""
    pipeline = BatchPipeline(runner.collect, first=1, max_staleness=max_staleness)
    batches, during = [], []
    try:
        for update in range(1, updates + 1):
            batch, waits = await pipeline.next()
            assert set(waits) == {"trainer_wait_s", "rollout_wait_s"}  # who waited for whom, each update
            batches.append(batch)
            before = len(runner.engine.calls)
            await asyncio.sleep(update_s)  # the update
            while long_updates and not pipeline.at_bound:
                await asyncio.sleep(0.005)
            during.append(len(runner.engine.calls) - before)
            runner.policy_version = update
            pipeline.publish(update)
    finally:
        await pipeline.aclose()
        await runner.aclose()
    return batches, during


@pytest.mark.parametrize("max_staleness", [0, 1, 2])
async def test_turns_record_their_version_and_staleness_stays_within_the_bound(tiny_tokenizer, max_staleness):
    runner, _ = make_runner(tiny_tokenizer)
    batches, during = await asyncio.wait_for(train_loop(runner, 6, max_staleness, long_updates=True), 120)
    lags = []
    for update, batch in enumerate(batches, start=1):
        for turn in batch.flat_turns():
            assert isinstance(turn.policy_version, int)
            lags.append((update - 1) - turn.policy_version)  # update k starts from the weights of k - 1
        weights, figures = live_correction(batch, update, OffPolicyCorrection(2.0, max_versions=max_staleness))
        assert weights.tolist() == [1.0] * len(weights)  # nothing beyond the bound to drop
        assert figures["staleness_max"] <= max_staleness
    assert min(lags) >= 0 and max(lags) <= max_staleness
    if max_staleness == 0:  # alternating: nothing played while an update ran, every turn fresh
        assert set(lags) == {0} and sum(during) == 0
    else:  # overlapped: the slots played on during the updates, with the weights they had
        assert max(lags) == max_staleness and sum(during) > 0


async def test_a_turn_beyond_the_bound_weighs_nothing_and_the_others_get_the_decoupled_weight(tiny_tokenizer):
    runner, _ = make_runner(tiny_tokenizer, num_envs=2, turns_per_env=3)
    try:
        batch = await runner.collect()
    finally:
        await runner.aclose()
    turns = batch.flat_turns()
    for turn, version in zip(turns, [4, 4, 3, 2, 1, 4]):  # trained at update 5 (from the weights of 4)
        turn.policy_version = version
    weights, figures = live_correction(batch, 5, OffPolicyCorrection(2.0, max_versions=2))
    assert weights.tolist() == [1, 1, 1, 1, 0, 1]  # staleness 0, 0, 1, 2, 3 (dropped), 0
    assert figures == {
        "staleness_mean": pytest.approx(1.0),
        "staleness_max": 3.0,
        "off_policy_turns": pytest.approx(0.5),
        "stale_dropped_turns": 1.0,
    }
    # the loss's weight per token: min(pi_prox / pi_behav, c) x the turn's staleness weight
    storage = RolloutStorage.from_batch(batch)
    behaviour = storage.rollout_logprobs
    proximal = behaviour + torch.tensor([0.5, -0.5, 2.0, 0.0, 0.3, -0.1]).unsqueeze(1)
    mask = storage.response_mask
    advantages = torch.ones_like(behaviour)
    weighted, metrics = decoupled_advantages(
        advantages, proximal, behaviour, mask, weights, OffPolicyCorrection(2.0, max_versions=2)
    )
    expected = torch.exp(proximal - behaviour).clamp(max=2.0) * weights.unsqueeze(1)
    assert torch.allclose(weighted[mask], expected[mask])
    assert metrics["behaviour_weight_truncated"] > 0  # exp(2) > c: truncated at c


async def test_stragglers_fill_the_batch_from_fast_slots_and_lose_no_turn(tiny_tokenizer):
    num_envs, turns_per_env, cap = 4, 3, 6

    def slow_s(seed, t):  # slot 0's first episode (seed 0) waits 1 s on its tool at every step
        return 1.0 if seed == 0 else 0.0

    runner, _ = make_runner(tiny_tokenizer, num_envs=num_envs, turns_per_env=turns_per_env, cap=cap, slow_s=slow_s)
    batches, _ = await train_loop(runner, 5, 0, update_s=0.0)
    per_slot: list[list] = [[] for _ in range(num_envs)]
    for b, batch in enumerate(batches):
        assert sum(len(slot) for slot in batch.turns) == num_envs * turns_per_env  # the batch's size, always
        assert all(len(slot) <= cap for slot in batch.turns)
        for i, turns in enumerate(batch.turns):
            for turn in turns:  # every turn complete: the environment's reward is on it
                assert turn.reward == turn.turn_index + 1 and turn.terminated == (turn.turn_index + 1 == EPISODE)
            per_slot[i] += [(b, t) for t in turns]
    slow = [len(batch.turns[0]) for batch in batches]
    assert slow[0] < turns_per_env  # the slow slot gave fewer turns, nobody waited for it
    for i, taken in enumerate(per_slot):  # a slot's turns across batches: consecutive, none twice
        for (b0, prev), (b1, nxt) in zip(taken, taken[1:]):
            if prev.done:
                assert nxt.turn_index == 0 and nxt.episode_id != prev.episode_id
            else:
                assert (nxt.episode_id, nxt.turn_index) == (prev.episode_id, prev.turn_index + 1)
                if b1 > b0:  # cut there: the batch's bootstrap is the prompt of that next turn
                    assert batches[b0].bootstrap_prompt_ids[i] == nxt.prompt_ids
                    assert state_of(tiny_tokenizer, nxt.prompt_ids) == (
                        state_of(tiny_tokenizer, prev.prompt_ids)[0],
                        prev.turn_index + 1,
                    )
    assert runner.counters.turns == len(batches) * num_envs * turns_per_env


async def test_without_stragglers_the_slow_slot_holds_the_batch(tiny_tokenizer):
    runner, _ = make_runner(
        tiny_tokenizer, num_envs=4, turns_per_env=3, slow_s=lambda seed, t: 1.0 if seed == 0 else 0.0
    )
    batches, _ = await train_loop(runner, 1, 0, update_s=0.0)
    batch = batches[0]
    assert [len(slot) for slot in batch.turns] == [3, 3, 3, 3]
    # the fast slots waited at the boundary for the slow one's 3 steps of 1 s (their own 3 turns take
    # far less, even on a busy machine)
    assert batch.boundary_wait_max_s >= 1.0 and batch.boundary_wait_s > 0


def test_ragged_slots_end_their_grid_rows():
    assert aligned_grid([2, 0, 3], 3).tolist() == [1, 2, 6, 7, 8]


# ---------------------------------------------------------------------- the trainer, end to end


def short_run(run_dir, *extra: str) -> list[str]:
    from test_train_cli import CONFIG

    from verlog.models import toy_model_dir

    return [
        CONFIG,
        f"model.path={toy_model_dir()}",
        f"trainer.run_dir={run_dir}",
        "wandb.mode=disabled",
        "trainer.num_envs=4",
        "trainer.turns_per_env=3",
        "trainer.save_every=1",
        "critic_warmup.buffer_multiplier=1",
        "critic_warmup.iterations=1",
        "eval.at_start=false",
        "eval.at_end=false",
        "algorithm.mini_batch_turns=6",
        *extra,
    ]


def update_records(run_dir) -> list[dict]:
    import json

    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "update"]


@pytest.mark.parametrize("update_in", ["process", "thread"])
def test_overlapped_training_reports_staleness_and_resumes_from_the_trained_batch(tmp_path, update_in):
    from verlog.cli import main
    from verlog.weights import checkpoint as ckpt

    run_dir = tmp_path / "run"
    overlap = (
        "trainer.overlap.enabled=true",
        "trainer.overlap.max_staleness=1",
        f"trainer.overlap.update_in={update_in}",
    )
    assert main(["train", *short_run(run_dir, "trainer.total_updates=3", *overlap)]) == 0
    records = update_records(run_dir)
    assert [r["update"] for r in records] == [1, 2, 3]
    for r in records:
        assert 0 <= r["staleness_mean"] <= r["staleness_max"] <= 1 and r["stale_dropped_turns"] == 0
        for key in (
            "off_policy_turns",
            "behaviour_weight",
            "behaviour_weight_truncated",
            "trainer_wait_s",
            "rollout_wait_s",
            "boundary_wait_s",
        ):
            assert key in r, key
    assert records[0]["staleness_max"] == 0  # batch 1 was played by the weights update 1 starts from
    # the checkpoint of update 3 holds the slots' counters at batch 3's cut, not those of the batch
    # played ahead meanwhile: warm-up batch + 3 batches of 4 x 3 turns
    state = ckpt.read_state(ckpt.latest_checkpoint(run_dir))
    assert state["runner"]["counters"]["turns"] == 4 * 4 * 3 == records[-1]["turns_total"]
    # the checkpoints hold what the updates trained, wherever they ran: the actor moved between
    # updates 2 and 3, and its optimizer's state counts more steps at 3 than at 2
    first, last = (ckpt.checkpoints_root(run_dir) / f"update_00000{k}" for k in (2, 3))
    assert _actor_weights(first) != _actor_weights(last)
    assert _adam_steps(last) > _adam_steps(first) > 0
    assert _adam_steps(last, "critic") > _adam_steps(first, "critic") > 0
    assert main(["train", *short_run(run_dir, "trainer.total_updates=5", *overlap), "--resume"]) == 0
    records = update_records(run_dir)
    assert [r["update"] for r in records] == [1, 2, 3, 4, 5]
    assert records[-1]["turns_total"] == 6 * 4 * 3


def test_straggler_tolerant_training_runs_and_refuses_group_estimators(tmp_path, capsys):
    from verlog.cli import main

    run_dir = tmp_path / "run"
    assert main(["train", *short_run(run_dir, "trainer.total_updates=2", "trainer.stragglers.enabled=true")]) == 0
    records = update_records(run_dir)
    assert [r["turns_total"] for r in records] == [24, 36]  # a batch is num_envs x turns_per_env turns
    assert all(r["slot_turns_max"] <= 6 for r in records)  # the cap: twice turns_per_env by default
    bad = short_run(
        tmp_path / "r2", "trainer.stragglers.enabled=true", "algorithm.estimator=grpo", "trainer.group_size=2"
    )
    assert main(["train", *bad]) == 2
    err = capsys.readouterr().err
    assert "trainer.stragglers.enabled" in err and "grpo" in err
    bad = short_run(tmp_path / "r3", "trainer.stragglers.enabled=true", "trainer.stragglers.max_turns_per_env=2")
    assert main(["train", *bad]) == 2
    assert "max_turns_per_env" in capsys.readouterr().err


def test_gae_over_ragged_slots_equals_each_slot_alone(tiny_tokenizer):
    """A slot's turns at the end of its grid row get the advantages they get in a batch of their own."""
    from verlog.config import AlgorithmConfig
    from verlog.rollout.slots import SlotBatch
    from verlog.rollout.turn import Turn

    def turns(n, start):
        return [
            Turn("e", k, [1, 2], [3, 4][: 1 + k % 2], [-1.0] * (1 + k % 2), reward=float(start + k)) for k in range(n)
        ]

    lengths = [2, 4, 1]
    slots = [turns(n, 10 * i) for i, n in enumerate(lengths)]
    boot = [[5, 6]] * 3
    algo = AlgorithmConfig(estimator="gae", gamma_step=0.9, lam_step=0.8, whiten_advantages=False)
    torch.manual_seed(0)
    values = [torch.randn(n, 3) for n in lengths]
    bootstrap = torch.tensor([0.3, -0.2, 0.7])

    ragged = RolloutStorage.from_batch(SlotBatch(slots, boot, [True] * 3, [[0] * n for n in lengths]))
    ragged.values, ragged.bootstrap_values = torch.cat(values), bootstrap
    ragged.compute_advantages(algo)
    rows = 0
    for i, n in enumerate(lengths):
        alone = RolloutStorage.from_batch(SlotBatch([slots[i]], [boot[i]], [True], [[0] * n]))
        alone.values, alone.bootstrap_values = values[i][:, : alone.response_ids.shape[1] + 1], bootstrap[i : i + 1]
        alone.compute_advantages(algo)
        width = alone.response_ids.shape[1]
        assert torch.allclose(ragged.advantages[rows : rows + n, :width], alone.advantages)
        assert torch.allclose(ragged.returns[rows : rows + n, : width + 1], alone.returns)
        rows += n


@pytest.mark.parametrize("kind", ["full", "train_layers", "lora"])
def test_the_engines_copy_takes_the_trained_weights_and_shares_the_frozen_ones(tiny_dir, kind):
    """The rollout's copy of the actor: its own tensors for what trains (all of it, the last layers,
    the LoRA adapters), the actor's for what is frozen; publishing makes the two generate alike."""
    from verlog.config import LoRAConfig
    from verlog.weights.actor_critic import load_actor, train_last_layers
    from verlog.weights.rollout_copy import publish_weights, rollout_copy

    lora = LoRAConfig(rank=4 if kind == "lora" else 0)
    actor, _ = load_actor(tiny_dir, dtype="float32", device="cpu", lora=lora)
    if kind == "train_layers":
        train_last_layers(actor, 1, section="actor")
    clone = rollout_copy(actor)
    pairs = list(zip(actor.parameters(), clone.parameters(), strict=True))
    assert all((a is b) != a.requires_grad for a, b in pairs)  # trained: a copy; frozen: the same tensor
    assert not any(b.requires_grad for _, b in pairs) and not clone.training
    with torch.no_grad():
        for a, _ in pairs:
            if a.requires_grad:
                a.add_(0.01 * torch.randn_like(a))
    ids = torch.tensor([[1, 2, 3, 4]])
    assert not torch.allclose(actor(ids).logits, clone(ids).logits)
    trained = sum(a.numel() for a, _ in pairs if a.requires_grad)
    assert publish_weights(actor, clone) == trained
    assert torch.equal(actor(ids).logits, clone(ids).logits)


def _actor_weights(checkpoint) -> list[float]:
    from safetensors.torch import load_file

    weights = load_file(next((checkpoint / "actor").glob("*.safetensors")))
    return [round(float(t.float().sum()), 6) for _, t in sorted(weights.items())]


def _adam_steps(checkpoint, model: str = "actor") -> float:
    """The step count of the actor's (or the critic's) optimizer saved in ``checkpoint``."""
    from verlog.weights import checkpoint as ckpt

    states = ckpt._load_tree(checkpoint, "optimizers")[model]["state"]
    return max(float(state["step"]) for state in states.values())
