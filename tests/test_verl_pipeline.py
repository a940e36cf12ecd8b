"""verlog inside verl's real classes, on CPU: verl's ``AgentLoopWorkerTQ`` runs verlog's agent loop
(its post-processing writes the samples), verl's config composition and dataset collation feed it,
a fake ``LLMServerClient`` is served by verlog's embedded engine on the tiny model, and verl's
TransferQueue is an in-memory stand-in. The trainer's advantage step then runs on those rows.

Slot schedule of the test graph (episode of seed s lasts 2 + s % 3 turns, seed 3 four; seed 2
crashes at its second environment step; 2 slots x 3 turns; slot i's j-th episode plays seed
2 j + (i + j) % 2: slot 0 plays 0, 3, 4, ..., slot 1 plays 1, 2, 5, ...):

    step 1  slot 0: seed 0 (2 turns, done), seed 3 turn 0 (cut)          -> bootstrap row
            slot 1: seed 1 (3 turns, done)                               -> no bootstrap row
    step 2  slot 0: seed 3 turns 1-3 (done)                              -> no bootstrap row
            slot 1: seed 2 (crashes: dropped), seed 5 turns 0-2 (cut)    -> bootstrap row
"""

from __future__ import annotations

import asyncio
import copy
from types import SimpleNamespace

import pytest
import torch
import yaml
from verl_agent_loop import dataset_batch, rollout_step

GRAPH = '''
"""Countdown: episode `seed` lasts 2 + seed % 3 turns (seed 3: 4); seeds in `fail_seeds` crash at step 2."""
from typing import Any
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict
from verlog.rollout.events import areport_reward


class State(TypedDict):
    seed: int
    step: int
    done: bool


def make_input(seed: int) -> dict[str, Any]:
    return {"seed": seed, "step": 0, "done": False}


def build_graph(model, fail_seeds=()):
    async def policy(state: State):
        await model.ainvoke([HumanMessage(f"game {state['seed']}, step {state['step']}: move?")])
        return {}

    async def env(state: State):
        step = state["step"] + 1
        if state["seed"] in fail_seeds and step == 2:
            raise RuntimeError("the environment crashed")
        done = step >= (4 if state["seed"] == 3 else 2 + state["seed"] % 3)
        await areport_reward(1.0 if done else 0.25, terminated=done, info={"success": done})
        return {"step": step, "done": done}

    graph = StateGraph(State)
    graph.add_node("policy", policy)
    graph.add_node("env", env)
    graph.add_edge(START, "policy")
    graph.add_edge("policy", "env")
    graph.add_conditional_edges("env", lambda s: END if s["done"] else "policy")
    return graph.compile()
'''

NUM_ENVS, TURNS = 2, 3


def _rows(store, partition, keys):
    """Stored rows by key, with their extra fields as plain dicts."""
    return {k: store.rows[partition][k] for k in keys}


def _rollout_world(
    root, graph_name: str, graph_text: str, settings: dict, tiny_dir, *, validate: bool = False, client_class=None
):
    """verl's real agent-loop worker running ``graph_text`` for two training steps (and one
    validation batch if ``validate``) with the tiny model on the embedded engine; ``settings``:
    the verl config file's contents (``graph_name``.py is written next to it); ``client_class``:
    the fake ``LLMServerClient`` (default ``EngineServerClient``)."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    from verlog.backends.embedded import EmbeddedEngine
    from verlog.integrations.verl.agent_loop import close_slots
    from verlog.integrations.verl.launch import compose_verl_config
    from verlog.integrations.verl.local import EngineServerClient, MemoryTransferQueue
    from verlog.models import load_causal_lm, load_tokenizer

    (root / f"{graph_name}.py").write_text(graph_text)
    config_file = root / f"{graph_name}.yaml"
    config_file.write_text(yaml.safe_dump(settings))
    config = compose_verl_config(config_file)
    store = MemoryTransferQueue()
    tokenizer = load_tokenizer(tiny_dir)
    keys_by_step: dict[int, list[str]] = {}

    async def run():
        engine = EmbeddedEngine(load_causal_lm(tiny_dir), tokenizer, max_batch_size=8, seed=0)
        client = (client_class or EngineServerClient)(engine)
        worker = AgentLoopWorkerTQ.__ray_actor_class__(config, client, None, None)
        try:
            for step in (1, 2):
                client.global_steps = step - 1  # the weights a sync step generates with
                keys_by_step[step] = await rollout_step(worker, store, dataset_batch(config.data.train_files, step))
            if validate:
                await rollout_step(worker, store, dataset_batch(config.data.val_files, 2, validate=True))
        finally:
            await close_slots()
            await engine.aclose()
        return client

    with store.patch():
        client = asyncio.run(run())
    return SimpleNamespace(config=config, store=store, client=client, keys=keys_by_step, tokenizer=tokenizer)


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_dir):
    """Two verl training steps and one validation batch through verl's real agent-loop worker."""
    return _rollout_world(
        tmp_path_factory.mktemp("verl"),
        "countdown",
        GRAPH,
        {
            "verlog": {"num_envs": NUM_ENVS, "turns_per_env": TURNS, "eval_episodes": 2, "eval_seed": 1000},
            "actor_rollout_ref": {
                "model": {"path": "tiny"},
                "rollout": {
                    "name": "sglang",
                    "prompt_length": 256,
                    "response_length": 6,
                    "multi_turn": {
                        "langgraph": {
                            "path": "countdown.py",
                            "graph_config": {"recursion_limit": 60},
                            "graph_kwargs": {"fail_seeds": [2, 1001]},
                        }
                    },
                },
            },
            "trainer": {"n_gpus_per_node": 1, "total_training_steps": 2},
        },
        tiny_dir,
        validate=True,
    )


def _by_slot(world, step):
    """Each slot's rows of a step (by trajectory), ordered by position: [(key, row, extra), ...]."""
    slots: dict[int, list] = {}
    for key in world.keys[step]:
        row = world.store.rows["train"][key]
        extra = row["extra_fields"]
        slots.setdefault(int(row["index"]), []).append((key, row, extra))
    return {i: sorted(rows, key=lambda r: r[2]["verlog_position"]) for i, rows in slots.items()}


def test_one_sample_per_turn_and_a_bootstrap_row_where_the_boundary_cuts(world):
    step1, step2 = _by_slot(world, 1), _by_slot(world, 2)
    kinds = {s: [e["verlog_kind"] for _, _, e in rows] for s, rows in step1.items()}
    assert kinds == {0: ["turn"] * 3 + ["bootstrap"], 1: ["turn"] * 3}
    assert {s: [e["verlog_kind"] for _, _, e in rows] for s, rows in step2.items()} == {
        0: ["turn"] * 3,
        1: ["turn"] * 3 + ["bootstrap"],
    }
    # verl keys the rows {uid}_{session}_{index}, index = position in the agent loop's list
    for rows in (*step1.values(), *step2.values()):
        assert [int(k.rsplit("_", 1)[1]) for k, _, _ in rows] == list(range(len(rows)))
    done = [(e["verlog_turn_index"], e["verlog_terminated"], e["verlog_reward"]) for _, _, e in step1[1]]
    assert done == [(0, False, 0.25), (1, False, 0.25), (2, True, 1.0)]  # seed 1: 3 turns, success


def test_ids_masks_and_logprobs_are_exactly_the_engines(world):
    calls: dict[str, list[dict]] = {}
    for call in world.client.calls:
        calls.setdefault(call["request_id"], []).append(call)
    checked = 0
    for step in (1, 2):
        for rows in _by_slot(world, step).values():
            for _, row, extra in rows:
                if extra["verlog_kind"] != "turn":
                    continue
                call = calls[extra["verlog_episode_id"]][extra["verlog_turn_index"]]
                assert row["prompts"].tolist() == call["prompt_ids"]
                assert row["responses"].tolist() == call["token_ids"]
                assert row["rollout_log_probs"].tolist() == pytest.approx(call["logprobs"], abs=0)
                assert row["response_mask"].tolist() == [1] * len(call["token_ids"])
                assert row["loss_mask"].tolist() == row["response_mask"].tolist()
                assert row["input_ids"].tolist() == call["prompt_ids"] + call["token_ids"]
                checked += 1
    assert checked == 12  # 2 steps x 2 slots x 3 turns


def test_the_padded_training_batch_has_one_row_per_turn(world):
    """What verl's trainer reads back from the queue: right-padded responses, masks, logprobs."""
    from verl.protocol import DataProto

    keys = world.keys[1]
    data = world.store.kv_batch_get(keys, "train", ["responses", "response_mask", "rollout_log_probs", "prompts"])
    lengths = data["responses"].offsets().diff().tolist()
    batch = DataProto(batch=data.to_padded_tensor())
    assert len(batch) == 7  # 3 + 3 turns, 1 bootstrap row
    for i, key in enumerate(keys):
        row = world.store.rows["train"][key]
        n = lengths[i]
        assert batch.batch["responses"][i, :n].tolist() == row["responses"].tolist()
        assert batch.batch["rollout_log_probs"][i, :n].tolist() == row["rollout_log_probs"].tolist()
        assert batch.batch["response_mask"][i].sum().item() == (
            0 if row["extra_fields"]["verlog_kind"] == "bootstrap" else n
        )
        assert batch.batch["response_mask"][i, n:].sum().item() == 0


def test_slots_persist_across_steps_and_the_cut_episode_continues(world):
    step1, step2 = _by_slot(world, 1), _by_slot(world, 2)
    _, boot, boot_extra = step1[0][-1]
    _, first, first_extra = step2[0][0]
    # the prompt held at the boundary is the first prompt of the next step, same episode, next turn
    assert boot["prompts"].tolist() == first["prompts"].tolist()
    assert boot["response_mask"].tolist() == [0] and boot["loss_mask"].tolist() == [0]
    assert first_extra["verlog_episode_id"] == boot_extra["verlog_episode_id"]
    assert first_extra["verlog_turn_index"] == boot_extra["verlog_turn_index"] == 1
    assert boot_extra["min_global_steps"] == 0
    assert first["extra_fields"]["max_global_steps"] == 1  # generated after the first update


def test_one_request_id_per_episode_and_failed_episodes_give_no_sample(world):
    rows = [world.store.rows["train"][k]["extra_fields"] for s in (1, 2) for k in world.keys[s]]
    sampled = {e["verlog_episode_id"] for e in rows}
    requested = set(world.client.request_ids)
    # slot 0: seeds 0, 3; slot 1: seeds 1, 2 (crashed), 5 -> 5 training episodes, 5 request ids
    train_ids = {r for r in requested if "-slot" in r}
    assert len(train_ids) == 5
    crashed = train_ids - sampled
    assert len(crashed) == 1 and "-s1.0-" in next(iter(crashed))
    summary = next(e["verlog_summary"] for e in rows if e["verlog_position"] == 0 and e["verlog_summary"]["failed"])
    assert summary["failed"] == {"error": 1}


def test_validation_plays_whole_episodes_and_scores_the_last_turn(world):
    store = world.store
    val_keys = store.trajectory_keys("val")
    rows = [store.rows["val"][k] for k in val_keys]
    # eval seeds 1000 (2 + 1000 % 3 = 3 turns) and 1001 (crashes: no sample at all)
    assert {r["extra_info"]["index"] for r in rows} == {0}
    ordered = sorted(rows, key=lambda r: r["extra_fields"]["verlog_position"])
    assert [r["extra_fields"]["verlog_turn_index"] for r in ordered] == [0, 1, 2]
    final = ordered[-1]
    assert final["rm_scores"].sum().item() == pytest.approx(1.5)  # the episode's return
    assert final["extra_fields"]["reward_extra_info"]["acc"] == 1.0


# ---------------------------------------------------------------------- the trainer's advantage step


def _expected_advantages(world, keys, values, kl, gae):
    """dual_gae computed directly from the stored turns (no verlog.integrations code)."""
    from verlog.algo import TurnBatch, dual_gae, whiten

    groups: dict[str, list] = {}
    for key in keys:
        e = world.store.rows["train"][key]["extra_fields"]
        groups.setdefault(e["verlog_trajectory"], []).append((e["verlog_position"], key, e))
    names = sorted(groups)
    k_max = max(sum(1 for _, _, e in g if e["verlog_kind"] == "turn") for g in groups.values())
    t_max = max(len(values[key]) for key in keys)
    n = len(names)
    rewards, mask = torch.zeros(n, k_max, t_max), torch.zeros(n, k_max, t_max, dtype=torch.bool)
    vals, boot = torch.zeros(n, k_max, t_max + 1), torch.zeros(n)
    term, trunc = torch.zeros(n, k_max, dtype=torch.bool), torch.zeros(n, k_max, dtype=torch.bool)
    where = {}
    for i, name in enumerate(names):
        turns = [(p, k, e) for p, k, e in sorted(groups[name]) if e["verlog_kind"] == "turn"]
        for j, (_, key, e) in enumerate(turns):
            length = len(values[key])
            mask[i, j, :length] = True
            rewards[i, j, :length] = -kl[key] if kl else 0.0
            rewards[i, j, length - 1] += e["verlog_reward"]
            vals[i, j, :length] = values[key]
            term[i, j] = e["verlog_terminated"]
            where[key] = (i, j, length)
        for _, key, e in groups[name]:
            if e["verlog_kind"] == "bootstrap":
                boot[i] = values[key][0]
    batch = TurnBatch(rewards, mask, term, trunc, values=vals, bootstrap_values=boot)
    adv, ret = dual_gae(batch, gae.gamma_step, gae.lam_step, gae.gamma_token, gae.lam_token)
    return whiten(adv, mask), ret, where


def advantage_trainer(config):
    """verlog's verl trainer with just what its advantage step reads (no workers, no Ray)."""
    from verl.trainer.ppo import core_algos

    from verlog.integrations.verl.dataset import VerlogRows
    from verlog.integrations.verl.trainer import VerlogPPOTrainer, check_verl_config

    trainer = object.__new__(VerlogPPOTrainer)
    trainer.config, trainer.spec = config, check_verl_config(config)
    trainer.slot_episodes, trainer.slot_in_flight = {}, {}
    trainer.train_dataset = VerlogRows(config.data.train_files)
    trainer.kl_ctrl_in_reward = core_algos.get_kl_controller(config.algorithm.kl_ctrl)
    return trainer


@pytest.mark.parametrize("mode", ["plain", "kl_in_reward", "critic_pretraining"])
def test_advantage_step_on_verl_rows_equals_verlog_dual_gae(world, mode):
    """verl's batch as the trainer sees it (padding rows added, rows reordered) -> the advantages and
    returns the trainer writes back equal ``verlog.algo.dual_gae`` on the same turns. In critic
    pre-training the policy is the reference (KL exactly 0) and no old logprobs exist yet."""
    from omegaconf import open_dict
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size

    store = copy.deepcopy(world.store)
    config = copy.deepcopy(world.config)
    kl_in_reward = mode == "kl_in_reward"
    with open_dict(config):
        config.algorithm.use_kl_in_reward = mode != "plain"
    keys = list(world.keys[2])
    gen = torch.Generator().manual_seed(7)
    values, kl = {}, {}
    for key in keys:  # what verl's critic and actor passes would have written
        row = store.rows["train"][key]
        length = len(row["responses"])
        values[key] = torch.randn(length, generator=gen)
        old = row["rollout_log_probs"] + 0.01 * torch.randn(length, generator=gen)
        ref = old - 0.5 * torch.rand(length, generator=gen)
        row.update(values=values[key])
        if mode != "critic_pretraining":
            row.update(old_log_probs=old, ref_log_prob=ref)
        kl[key] = 0.001 * (old - ref)
    tags = [dict(store.tags["train"][k]) for k in keys]
    trainer = advantage_trainer(config)
    metrics: dict = {}
    with store.patch():
        batch = KVBatchMeta(keys=keys, tags=tags, partition_id="train")
        batch = upsample_batch_to_divisible_size(batch, 5, world.tokenizer.eos_token_id)  # verl's padding rows
        batch.reorder(list(torch.randperm(len(batch), generator=gen)))  # as verl's balancing does
        trainer._compute_advantage(batch, metrics, initial_policy=mode == "critic_pretraining")
    assert len(batch) == 10 and sum(bool(t.get("is_padding")) for t in batch.tags) == 3

    expected_adv, expected_ret, where = _expected_advantages(
        world, keys, values, kl if kl_in_reward else None, trainer.spec.settings.advantage
    )
    for key in keys:
        row = store.rows["train"][key]
        if key not in where:  # the bootstrap rows train nothing
            assert row["advantages"].abs().sum() == 0 and row["returns"].abs().sum() == 0
            continue
        i, j, length = where[key]
        torch.testing.assert_close(row["advantages"], expected_adv[i, j, :length], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(row["returns"], expected_ret[i, j, :length], atol=1e-5, rtol=1e-5)
        e = row["extra_fields"]
        assert row["rm_scores"][-1].item() == pytest.approx(e["verlog_reward"])  # each turn its own reward
    for key in batch.keys:
        if key not in keys:
            assert store.rows["train"][key]["advantages"].abs().sum() == 0
    assert metrics["verlog/turns"] == 6 and metrics["verlog/bootstrapped_turns"] == 1
    assert metrics["verlog/episodes_ended"] == 1 and metrics["verlog/success_rate"] == 1.0
    assert metrics["verlog/failed_episodes"] == 1 and metrics["verlog/failed_episodes/error"] == 1
    assert ("actor/reward_kl_penalty" in metrics) == kl_in_reward
    # each slot's episodes so far (slot 0: seeds 0, 3, 4; slot 1: 1, 2, 5), for checkpoints and the next rows
    assert trainer.slot_episodes == {"0:0": 3, "1:0": 3}
    assert trainer.train_dataset[1]["extra_info"]["verlog_episodes_started"] == {"0": 3}


# ---------------------------------------------------------------------- sync nodes, truncation

SYNC_GRAPH = '''
"""Sync nodes only (def + model.invoke); a step cap of 3 truncates every episode and reports the
prompt the model would have been given next."""
from typing import Any
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict
from verlog.rollout.events import report_reward


class State(TypedDict):
    seed: int
    step: int


def make_input(seed: int) -> dict[str, Any]:
    return {"seed": seed, "step": 0}


def prompt(state) -> list:
    return [HumanMessage(f"game {state['seed']}, step {state['step']}: move?")]


def build_graph(model, cap=3):
    def policy(state: State):
        model.invoke(prompt(state))
        return {}

    def env(state: State):
        step = state["step"] + 1
        cut = step >= cap
        report_reward(0.5, truncated=cut, next_messages=prompt({**state, "step": step}) if cut else None)
        return {"step": step}

    graph = StateGraph(State)
    graph.add_node("policy", policy)
    graph.add_node("env", env)
    graph.add_edge(START, "policy")
    graph.add_edge("policy", "env")
    graph.add_conditional_edges("env", lambda s: END if s["step"] >= cap else "policy")
    return graph.compile()
'''


#: the same game with an ``async def`` policy node calling ``model.invoke`` (blocking its event loop)
BLOCKING_GRAPH = SYNC_GRAPH.replace("    def policy(state: State):", "    async def policy(state: State):")


@pytest.fixture(scope="module", params=["def", "async def"])
def sync_world(request, tmp_path_factory, tiny_dir):
    """Two verl training steps of a graph whose model calls are all sync (``model.invoke`` in a
    ``def`` node, or in an ``async def`` node), through verl's agent-loop worker."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    from verlog.backends.embedded import EmbeddedEngine
    from verlog.integrations.verl.agent_loop import close_slots
    from verlog.integrations.verl.launch import compose_verl_config
    from verlog.integrations.verl.local import EngineServerClient, MemoryTransferQueue
    from verlog.models import load_causal_lm, load_tokenizer

    assert "async def policy" in BLOCKING_GRAPH and "async def policy" not in SYNC_GRAPH
    root = tmp_path_factory.mktemp("verl_sync")
    (root / "capped.py").write_text(SYNC_GRAPH if request.param == "def" else BLOCKING_GRAPH)
    config_file = root / "capped.yaml"
    config_file.write_text(
        yaml.safe_dump(
            {
                "verlog": {"num_envs": NUM_ENVS, "turns_per_env": TURNS},
                "actor_rollout_ref": {
                    "model": {"path": "tiny"},
                    "rollout": {
                        "name": "sglang",
                        "prompt_length": 256,
                        "response_length": 4,
                        "multi_turn": {"langgraph": {"path": "capped.py", "graph_config": {"recursion_limit": 30}}},
                    },
                },
                "trainer": {"n_gpus_per_node": 1, "total_training_steps": 2},
            }
        )
    )
    config = compose_verl_config(config_file)
    store = MemoryTransferQueue()
    tokenizer = load_tokenizer(tiny_dir)
    keys_by_step: dict[int, list[str]] = {}

    async def run():
        engine = EmbeddedEngine(load_causal_lm(tiny_dir), tokenizer, max_batch_size=8, seed=0)
        client = EngineServerClient(engine)
        worker = AgentLoopWorkerTQ.__ray_actor_class__(config, client, None, None)
        try:
            for step in (1, 2):
                keys_by_step[step] = await rollout_step(worker, store, dataset_batch(config.data.train_files, step))
            # a restart: the slots are gone; the rows carry the counters and rounds in flight the last
            # step reported (as the trainer restores them from a checkpoint), so seeds go on
            reported, in_flight = {}, {}
            for key in keys_by_step[2]:
                summary = store.rows["train"][key]["extra_fields"]["verlog_summary"]
                reported.update((summary or {}).get("episodes_started", {}))
                in_flight.update((summary or {}).get("in_flight", {}))
            assert in_flight == {"0:0": 2, "1:0": 2}  # episode 2 started, its first call held at the boundary
            await close_slots()
            keys_by_step[3] = await rollout_step(
                worker, store, dataset_batch(config.data.train_files, 3, episodes_started=reported, in_flight=in_flight)
            )
        finally:
            await close_slots()
            await engine.aclose()
        return client, reported

    with store.patch():
        client, reported = asyncio.run(run())
    return SimpleNamespace(
        config=config, store=store, client=client, keys=keys_by_step, tokenizer=tokenizer, reported=reported
    )


def test_a_graph_of_sync_nodes_runs_under_verls_agent_loop(sync_world):
    """``model.invoke`` in a ``def`` node, or blocking an ``async def`` node, gives one exact row
    per call, step after step."""
    calls = {(c["request_id"], tuple(c["prompt_ids"])): c for c in sync_world.client.calls}
    assert len(sync_world.client.calls) == 3 * NUM_ENVS * TURNS
    for step in (1, 2):
        for rows in _by_slot(sync_world, step).values():
            turns = [(row, e) for _, row, e in rows if e["verlog_kind"] == "turn"]
            assert [e["verlog_turn_index"] for _, e in turns] == [0, 1, 2]
            for row, e in turns:
                call = calls[(e["verlog_episode_id"], tuple(row["prompts"].tolist()))]
                assert row["responses"].tolist() == call["token_ids"]
                assert row["rollout_log_probs"].tolist() == pytest.approx(call["logprobs"], abs=0)


def test_a_truncated_turn_sends_its_next_state_as_a_value_row(sync_world):
    """The step cap truncates each episode at its third turn: its next prompt, rendered as the chat
    model renders a call, follows the turns as a ``next_state`` row (no bootstrap row: the turn is
    done), and the trainer's advantage step reads its value as the truncated turn's bootstrap."""
    from langchain_core.messages import HumanMessage

    from verlog.llm.prompt import PromptRenderer

    renderer = PromptRenderer(sync_world.tokenizer, {})
    for step in (1, 2):
        for rows in _by_slot(sync_world, step).values():
            kinds = [e["verlog_kind"] for _, _, e in rows]
            assert kinds == ["turn"] * 3 + ["next_state"]
            (_, last, last_e), (_, nxt, nxt_e) = rows[2], rows[3]
            assert last_e["verlog_truncated"] and not last_e["verlog_terminated"]
            assert (nxt_e["verlog_episode_id"], nxt_e["verlog_turn_index"]) == (last_e["verlog_episode_id"], 2)
            prompt_text = sync_world.tokenizer.decode(last["prompts"].tolist())
            seed = int(prompt_text.split("game ")[1].split(",")[0])
            expected = renderer.render([HumanMessage(f"game {seed}, step 3: move?")], None)
            assert nxt["prompts"].tolist() == expected
            assert nxt["response_mask"].tolist() == [0]

    # the advantage step: each truncated turn's return is its reward + gamma_step * V(next state)
    from transfer_queue import KVBatchMeta

    from verlog.integrations.verl.trainer import VerlogPPOTrainer, check_verl_config

    store = copy.deepcopy(sync_world.store)
    keys = list(sync_world.keys[1])
    for i, key in enumerate(keys):
        store.rows["train"][key]["values"] = torch.full((len(store.rows["train"][key]["responses"]),), float(i))
    trainer = object.__new__(VerlogPPOTrainer)
    trainer.config, trainer.spec = sync_world.config, check_verl_config(sync_world.config)
    trainer.slot_episodes, trainer.slot_in_flight = {}, {}
    metrics: dict = {}
    with store.patch():
        batch = KVBatchMeta(keys=keys, tags=[dict(store.tags["train"][k]) for k in keys], partition_id="train")
        trainer._compute_advantage(batch, metrics, initial_policy=True)
    assert metrics["verlog/truncated_turns_bootstrapped"] == NUM_ENVS
    gamma = trainer.spec.settings.advantage.gamma_step
    for rows in _by_slot(SimpleNamespace(store=store, keys={1: keys}), 1).values():
        (_, last, _), (next_key, _, _) = rows[2], rows[3]
        assert last["returns"][-1].item() == pytest.approx(0.5 + gamma * keys.index(next_key))


def _seeds(world, step):
    """The seed each slot played in a step (the prompts name it)."""
    seeds = {}
    for slot, rows in _by_slot(world, step).items():
        text = world.tokenizer.decode(rows[0][1]["prompts"].tolist())
        seeds[slot] = int(text.split("game ")[1].split(",")[0])
    return seeds


def test_slot_seeds_rotate_and_go_on_after_a_restart(sync_world):
    """Slot i's j-th episode plays seed 2 j + (i + j) % 2; restarted slots (new processes, as after a
    resume) continue from the episode counters the rows carry instead of replaying seeds 0 and 1,
    first playing again, whole, the episode each had in flight (so no row of an epoch is skipped)."""
    from verlog.integrations.verl.agent_loop import slot_seed

    assert _seeds(sync_world, 1) == {0: 0, 1: 1} and _seeds(sync_world, 2) == {0: 3, 1: 2}
    assert sync_world.reported == {"0:0": 3, "1:0": 3}  # episodes 0, 1 played, 2 started and held
    assert _seeds(sync_world, 3) == {0: slot_seed(0, 2, 0, 2), 1: slot_seed(0, 2, 1, 2)} == {0: 4, 1: 5}
    played = [slot_seed(0, j, i, 4) for j in range(5) for i in range(4)]
    assert sorted(played) == list(range(20))  # every seed once, whatever the rotation


def test_whole_episode_training_rows_carry_next_state_rows(tmp_path, tiny_dir):
    """``verlog.turns_per_env: null``: each row plays one whole episode; its truncated last turn is
    followed by its next-state row, and the episode's metrics sit on the last output (verl reads them
    there). Slots of a group (``group_size: 2``) play the same seed; each episode opens at its first row."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    from verlog.backends.embedded import EmbeddedEngine
    from verlog.integrations.verl.launch import compose_verl_config
    from verlog.integrations.verl.local import EngineServerClient, MemoryTransferQueue
    from verlog.models import load_causal_lm, load_tokenizer

    (tmp_path / "capped.py").write_text(SYNC_GRAPH)
    (tmp_path / "c.yaml").write_text(
        yaml.safe_dump(
            {
                "verlog": {"num_envs": 4, "turns_per_env": None, "group_size": 2, "seed": 10},
                "actor_rollout_ref": {
                    "model": {"path": "tiny"},
                    "rollout": {
                        "name": "sglang",
                        "prompt_length": 256,
                        "response_length": 4,
                        "multi_turn": {
                            "langgraph": {
                                "path": "capped.py",
                                "graph_config": {"recursion_limit": 30},
                                "graph_kwargs": {"cap": 2},
                            }
                        },
                    },
                },
                "trainer": {"n_gpus_per_node": 1, "total_training_steps": 1},
            }
        )
    )
    config = compose_verl_config(tmp_path / "c.yaml")
    store = MemoryTransferQueue()

    async def run():
        engine = EmbeddedEngine(load_causal_lm(tiny_dir), load_tokenizer(tiny_dir), max_batch_size=8, seed=0)
        worker = AgentLoopWorkerTQ.__ray_actor_class__(config, EngineServerClient(engine), None, None)
        try:
            await rollout_step(worker, store, dataset_batch(config.data.train_files, 1))
        finally:
            await engine.aclose()

    with store.patch():
        asyncio.run(run())
    world = SimpleNamespace(store=store, keys={1: store.trajectory_keys("train")})
    seeds = {}
    for slot, rows in _by_slot(world, 1).items():
        assert [e["verlog_kind"] for _, _, e in rows] == ["turn", "turn", "next_state"]
        assert rows[-1][2]["reward_extra_info"]["episode_turns"] == 2.0
        assert [e["verlog_starts_episode"] for _, _, e in rows[:2]] == [True, False]
        seeds[slot] = {e["verlog_seed"] for _, _, e in rows[:2]}
        text = load_tokenizer(tiny_dir).decode(rows[0][1]["prompts"].tolist())
        assert seeds[slot] == {int(text.split("game ")[1].split(",")[0])}  # the seed the graph played
    assert seeds == {0: {10}, 1: {10}, 2: {11}, 3: {11}}


# ---------------------------------------------------------------------- every estimator, slot groups

GROUP_GRAPH = '''
"""Episode `seed` lasts 2 + seed % 2 turns; a turn's reward depends on the model's answer (so the
episodes of one seed differ), except in seed 1 (its episodes all return 1: a uniform group); from
step 1 on the environment names the state it acted in."""
from typing import Any
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict
from verlog.rollout.events import areport_reward


class State(TypedDict):
    seed: int
    step: int
    answer: str


def make_input(seed: int) -> dict[str, Any]:
    return {"seed": seed, "step": 0, "answer": ""}


def build_graph(model):
    async def policy(state: State):
        answer = await model.ainvoke([HumanMessage(f"game {state['seed']}, step {state['step']}: move?")])
        return {"answer": answer.content}

    async def env(state: State):
        step = state["step"] + 1
        done = step >= 2 + state["seed"] % 2
        info = {"anchor": f"{state['seed']}:{state['step']}"} if state["step"] >= 1 else {}
        shaped = len(state["answer"]) % 5 / 4 if state["seed"] != 1 else 0.0
        await areport_reward(shaped + (1.0 if done else 0.0), terminated=done, info=info)
        return {"step": step}

    graph = StateGraph(State)
    graph.add_node("policy", policy)
    graph.add_node("env", env)
    graph.add_edge(START, "policy")
    graph.add_edge("policy", "env")
    graph.add_conditional_edges("env", lambda s: END if s["step"] >= 2 + s["seed"] % 2 else "policy")
    return graph.compile()
'''

GROUP_ENVS, GROUP_SIZE = 4, 2


@pytest.fixture(scope="module")
def group_world(tmp_path_factory, tiny_dir):
    """Two verl training steps of 4 slots x 3 turns in groups of 2 (slots 0-1, 2-3 play the same
    seeds), through verl's agent-loop worker. Group 0 plays seeds 0, 3, 4, group 1 seeds 1, 2, 5:

        step 1  group 0: seed 0 (2 turns, done), seed 3 turn 0 (cut)   group 1: seed 1 (3 turns, done)
        step 2  group 0: seed 3 turns 1-2 (continued, done), seed 4 turn 0 (cut)
                group 1: seed 2 (2 turns, done), seed 5 turn 0 (cut)
    """
    return _rollout_world(
        tmp_path_factory.mktemp("verl_groups"),
        "groups",
        GROUP_GRAPH,
        {
            "verlog": {"num_envs": GROUP_ENVS, "turns_per_env": TURNS, "group_size": GROUP_SIZE},
            "actor_rollout_ref": {
                "model": {"path": "tiny"},
                "rollout": {
                    "name": "sglang",
                    "prompt_length": 256,
                    "response_length": 8,
                    "multi_turn": {"langgraph": {"path": "groups.py", "graph_config": {"recursion_limit": 30}}},
                },
            },
            "algorithm": {"use_kl_in_reward": True},
            "trainer": {"n_gpus_per_node": 1, "total_training_steps": 2},
        },
        tiny_dir,
    )


def _prompt_facts(world, row):
    """(seed, step) a turn row's prompt names: what the graph played, read from what the model saw."""
    text = world.tokenizer.decode(row["prompts"].tolist())
    seed, step = text.split("game ")[1].split(": move?")[0].split(", step ")
    return int(seed), int(step)


def test_slots_of_a_group_play_the_same_seeds_and_rows_carry_seed_start_and_anchor(group_world):
    """Slots 0-1 and 2-3 play the same seeds (``verlog.group_size: 2``); each turn row carries its
    episode's seed, whether it opens its episode (the first turn of step 2's group 0 continues
    seed 3) and the anchor state its environment reported."""
    played = {}
    for step in (1, 2):
        for slot, rows in _by_slot(group_world, step).items():
            turns = [(row, e) for _, row, e in rows if e["verlog_kind"] == "turn"]
            facts = [_prompt_facts(group_world, row) for row, _ in turns]
            played[(step, slot)] = [seed for seed, _ in facts]
            for (_, e), (seed, s) in zip(turns, facts):
                assert e["verlog_seed"] == seed
                assert e["verlog_starts_episode"] == (s == 0)
                assert e["verlog_anchor"] == (f"{seed}:{s}" if s >= 1 else None)
    assert played[(1, 0)] == played[(1, 1)] == [0, 0, 3] and played[(1, 2)] == played[(1, 3)] == [1, 1, 1]
    assert played[(2, 0)] == played[(2, 1)] == [3, 3, 4] and played[(2, 2)] == played[(2, 3)] == [2, 2, 5]


#: every estimator of the registry, and DAPO's dynamic sampling with Dr. GRPO's normalization
#: (without KL in the reward, which would make every group's returns differ)
ESTIMATOR_SETTINGS = {
    "gae": {},
    "zero": {},
    "reinforce_pp": {},
    "reinforce_pp_baseline": {},
    "grpo": {},
    "grpo+dapo": {"drop_uniform_groups": True, "group_norm": "mean"},
    "rloo": {},
    "gigpo": {"gigpo_gamma": 0.9, "gigpo_step_weight": 0.5},
}


def _embedded_estimate(world, keys, values, kl, algo):
    """The embedded trainer's path on the same turns: its ``RolloutStorage`` of the slots' turns
    (seeds, episode starts and anchors read from the prompts the model saw, not from verlog's
    row fields), KL folded into the token rewards, verl's values (``V_{k,L}`` 0), and
    ``RolloutStorage.compute_advantages``."""
    from verlog.rollout.slots import SlotBatch
    from verlog.rollout.turn import Turn
    from verlog.train.storage import RolloutStorage

    slots = _by_slot(SimpleNamespace(store=world.store, keys={0: keys}), 0)
    turns, seeds, starts, boot, order = [], [], [], [], []
    for slot in sorted(slots):
        rows = [(key, row, e) for key, row, e in slots[slot] if e["verlog_kind"] == "turn"]
        facts = [_prompt_facts(world, row) for _, row, _ in rows]
        turns.append(
            [
                Turn(
                    e["verlog_episode_id"],
                    e["verlog_turn_index"],
                    row["prompts"].tolist(),
                    row["responses"].tolist(),
                    row["rollout_log_probs"].tolist(),
                    reward=e["verlog_reward"],
                    terminated=e["verlog_terminated"],
                    info={"anchor": f"{seed}:{step}"} if step >= 1 else {},
                )
                for (_, row, e), (seed, step) in zip(rows, facts)
            ]
        )
        seeds.append([seed for seed, _ in facts])
        starts.append(facts[0][1] == 0)
        boot_rows = [key for key, _, e in slots[slot] if e["verlog_kind"] == "bootstrap"]
        boot.append(values[boot_rows[0]][0].item() if boot_rows else 0.0)
        order += [key for key, _, _ in rows]
    storage = RolloutStorage.from_batch(SlotBatch(turns, [[0]] * len(turns), starts, seeds))
    width = storage.response_ids.shape[1]
    storage.values = torch.zeros(storage.size, width + 1)
    for i, key in enumerate(order):
        n = len(values[key])
        storage.values[i, :n] = values[key]
        storage.token_rewards[i, :n] -= kl[key]
    storage.bootstrap_values = torch.tensor(boot)
    metrics = storage.compute_advantages(algo)
    return storage, {key: i for i, key in enumerate(order)}, metrics


@pytest.mark.parametrize("case", list(ESTIMATOR_SETTINGS))
def test_every_estimator_on_verl_rows_equals_the_embedded_trainers(group_world, case):
    """verl's batch as the trainer sees it (verl's padding rows, rows reordered, KL in the reward)
    through ``algorithm.adv_estimator`` -> the advantages, returns and policy-loss masks the
    trainer writes back equal the embedded trainer's ``RolloutStorage.compute_advantages`` (the
    registry's ``estimate_advantages``) on the same turns, step after step (step 2 continues an
    episode of step 1: not an episode start); the estimator's metrics too."""
    metrics = _check_estimator_on_verl_rows(group_world, case)
    if ESTIMATOR_SETTINGS[case].get("drop_uniform_groups"):  # seed 1's group returns 1.0 twice
        # (group 0's answers are sampled: their returns may happen to tie too, then both drop)
        assert metrics[1]["verlog/adv/dropped_group_frac"] >= 0.5


def test_dapo_dropping_every_group_skips_the_update_instead_of_crashing(group_world):
    """Every group's returns tie (the reward is only the win, and a group's slots play the same
    seeds): DAPO leaves every turn out of the policy loss. verl's rollout correction refuses an
    empty mask and its token-mean would divide 0 by 0, so the trainer writes the empty masks (as
    the embedded trainer computes them), skips the correction and the actor update, and says so."""
    from verlog.integrations.verl.trainer import VerlogPPOTrainer

    store = copy.deepcopy(group_world.store)
    for key in (k for keys in group_world.keys.values() for k in keys):
        extra = store.rows["train"][key]["extra_fields"]
        extra["verlog_reward"] = 1.0 if extra["verlog_terminated"] else 0.0
    tied = SimpleNamespace(**{**vars(group_world), "store": store})
    metrics = _check_estimator_on_verl_rows(tied, "grpo+dapo")
    for step in (1, 2):
        assert metrics[step]["verlog/adv/dropped_group_frac"] == 1.0
        assert metrics[step]["verlog/adv/policy_token_frac"] == 0.0
        assert not any(key.startswith("rollout_corr/") for key in metrics[step])
    trainer = object.__new__(VerlogPPOTrainer)  # no worker group: a call to verl's update would fail
    trainer.global_steps, trainer._policy_tokens = 1, 0
    skipped: dict = {}
    assert trainer._update_actor("the batch", skipped) == "the batch"
    assert skipped == {"verlog/actor_update_skipped": 1.0}


def _check_estimator_on_verl_rows(group_world, case):
    """The comparison of the test above for one estimator setting; each step's trainer metrics."""
    from omegaconf import open_dict
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size

    from verlog.algo.estimators import estimator_names, get_estimator
    from verlog.config import AlgorithmConfig
    from verlog.integrations.verl.trainer import VerlogPPOTrainer, check_verl_config

    assert {c.split("+")[0] for c in ESTIMATOR_SETTINGS} == set(estimator_names())
    name, overrides = case.split("+")[0], ESTIMATOR_SETTINGS[case]
    critic, use_kl = get_estimator(name).needs_critic, not overrides.get("drop_uniform_groups")
    config = copy.deepcopy(group_world.config)
    with open_dict(config):
        config.algorithm.use_kl_in_reward = use_kl
        config.algorithm.adv_estimator = name
        config.critic.enable = critic
        config.verlog.advantage = {**config.verlog.get("advantage", {}), **overrides}
    trainer = object.__new__(VerlogPPOTrainer)
    trainer.config, trainer.spec = config, check_verl_config(config)
    trainer.slot_episodes, trainer.slot_in_flight = {}, {}
    trainer.kl_ctrl_in_reward = core_algos.get_kl_controller(config.algorithm.kl_ctrl)
    settings = trainer.spec.advantage_settings()
    algo = AlgorithmConfig(**settings.model_dump())  # the embedded trainer's config, same values
    gen = torch.Generator().manual_seed(11)
    nonzero, by_step = 0, {}
    for step in (1, 2):
        store = copy.deepcopy(group_world.store)
        keys = list(group_world.keys[step])
        values, kl = {}, {}
        for key in keys:  # what verl's critic and actor passes would have written
            row = store.rows["train"][key]
            length = len(row["responses"])
            values[key] = torch.randn(length, generator=gen)
            old = row["rollout_log_probs"] + 0.01 * torch.randn(length, generator=gen)
            ref = old - 0.5 * torch.rand(length, generator=gen)
            row.update(old_log_probs=old, ref_log_prob=ref, **({"values": values[key]} if critic else {}))
            kl[key] = 0.001 * (old - ref) if use_kl else torch.zeros(length)
        metrics: dict = {}
        with store.patch():
            batch = KVBatchMeta(keys=keys, tags=[dict(store.tags["train"][k]) for k in keys], partition_id="train")
            batch = upsample_batch_to_divisible_size(batch, 5, group_world.tokenizer.eos_token_id)
            batch.reorder(list(torch.randperm(len(batch), generator=gen)))  # as verl's balancing does
            trainer._compute_advantage(batch, metrics)
        assert sum(bool(t.get("is_padding")) for t in batch.tags) > 0

        storage, where, expected_metrics = _embedded_estimate(group_world, keys, values, kl, algo)
        for key in keys:
            row = store.rows["train"][key]
            if key not in where:  # bootstrap rows train nothing
                assert row["advantages"].abs().sum() == 0
                continue
            i, n = where[key], len(row["responses"])
            torch.testing.assert_close(row["advantages"], storage.advantages[i, :n], atol=1e-5, rtol=1e-5)
            returns = storage.returns if critic else storage.advantages  # verl's metrics read returns
            torch.testing.assert_close(row["returns"], returns[i, :n], atol=1e-5, rtol=1e-5)
            policy = storage.policy_mask[i, :n].long()
            assert row["response_mask"].long().tolist() == policy.tolist()
            assert row["loss_mask"].long().tolist() == policy.tolist()  # verl's token count for token-mean
            nonzero += int(row["advantages"].abs().sum() > 0)
        for key in batch.keys:
            if key not in keys:  # verl's padding rows
                assert store.rows["train"][key]["advantages"].abs().sum() == 0
        for metric, value in expected_metrics.items():
            assert metrics[f"verlog/adv/{metric}"] == pytest.approx(value, abs=1e-6), metric
        by_step[step] = metrics
    dropped_all = all(m.get("verlog/adv/policy_token_frac", 1.0) == 0.0 for m in by_step.values())
    assert (nonzero == 0) == (name == "zero" or dropped_all)
    return by_step
