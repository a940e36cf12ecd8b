"""The long-horizon benchmark's parts: the ``crafter-words`` model (Crafter's own vocabulary, one
token per action), the ``bootstrap_cuts`` ablation of dual-discount GAE (computed by hand), the
per-update progression figure, and ``benchmarks/long_horizon.py`` run end to end for one tiny update
(its rows, result file, table, curves and random baseline)."""

from __future__ import annotations

import json
import random

import pytest
import torch
from conftest import ROOT
from langchain_core.messages import convert_to_openai_messages

from verlog.algo import TurnBatch
from verlog.algo.estimators import TurnData, estimate_advantages
from verlog.config import AlgorithmConfig, load_config
from verlog.envs.agent_graph import build_prompt, invalid_answer_feedback
from verlog.envs.crafter.env import ACTIONS, CrafterTextEnv, parse_action
from verlog.graph_file import import_python_file
from verlog.models import MODEL_SPECS, load_causal_lm, load_tokenizer, resolve_model_path
from verlog.models.crafter_words import CRAFTER_WORDS_MODEL_NAME, build_crafter_words_model


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_crafter_words_model(tmp_path_factory.mktemp("crafter-words"))


@pytest.fixture(scope="module")
def tok(built):
    return load_tokenizer(built)


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------------- crafter-words


def test_named_spec_builds_once_into_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("VERLOG_CACHE", str(tmp_path))
    assert "crafter-words" in MODEL_SPECS
    folder = resolve_model_path("crafter-words")
    assert folder == tmp_path / "models" / CRAFTER_WORDS_MODEL_NAME
    assert (folder / "model.safetensors").is_file()
    assert resolve_model_path("crafter-words") == folder  # cached: not rebuilt


def test_each_action_is_one_token_that_the_game_reads_back(tok):
    for action in ACTIONS:
        ids = _ids(tok, action)
        assert len(ids) == 1 and ids[0] != tok.unk_token_id, action
        decoded = tok.decode(ids, skip_special_tokens=True)
        assert decoded == action
        assert parse_action(decoded, ACTIONS).action == action
    assert len(set(tok.convert_tokens_to_ids(list(ACTIONS)))) == len(ACTIONS)


def test_the_prompts_of_long_episodes_have_no_unknown_words(tok):
    """Every word of the prompts verlog's Crafter shows over random 400-step episodes, night and
    invalid-answer notes included, is in the vocabulary; numbers are read digit by digit."""
    rng = random.Random(0)
    env = CrafterTextEnv(max_steps=400, max_per_type=1)
    texts, nights = [], 0
    for seed in range(3):
        env.reset(seed)
        for _ in range(400):
            result = env.step(rng.choice([*ACTIONS, "dance"]))
            note = "" if result.info["valid_action"] else invalid_answer_feedback(result.info["action"])
            texts.append(convert_to_openai_messages(build_prompt("crafter", [], result.observation, 0, note)))
            nights += "It is night" in result.observation
            if result.done:
                break
    assert nights  # the night's wording is covered too
    unknown = set()
    for messages in texts:
        text = tok.apply_chat_template(messages, tokenize=False)
        unknown |= {w for w, i in zip(tok.tokenize(text), _ids(tok, text)) if i == tok.unk_token_id}
    assert not unknown
    assert tok.tokenize("step 157.") == ["step", "1", "5", "7", "."]


def test_size_and_deterministic_build(tmp_path, built, tok):
    model = load_causal_lm(built)
    assert 100_000 < sum(p.numel() for p in model.parameters()) < 1_000_000
    assert model.config.vocab_size == len(tok) < 200
    again = build_crafter_words_model(tmp_path / "again")
    first, second = model.state_dict(), load_causal_lm(again).state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)


# ---------------------------------------------------------------------- ablation d: cuts as ends


def _two_slots() -> TurnBatch:
    """Slot 0: two turns of one episode that goes on past the batch (bootstrap value 5). Slot 1:
    a turn cut by a time limit (truncation value 7), then a new episode's turn, also going on."""
    rewards = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64).unsqueeze(-1)
    values = torch.tensor([[[0.5, 0.0], [1.0, 0.0]], [[2.0, 0.0], [0.25, 0.0]]], dtype=torch.float64)
    return TurnBatch(
        rewards,
        torch.ones_like(rewards, dtype=torch.bool),
        torch.zeros(2, 2, dtype=torch.bool),
        torch.tensor([[False, False], [True, False]]),
        values=values,
        bootstrap_values=torch.tensor([5.0, 6.0], dtype=torch.float64),
        truncation_values=torch.tensor([[float("nan"), float("nan")], [7.0, float("nan")]], dtype=torch.float64),
    )


@pytest.mark.parametrize("bootstrap", [True, False])
def test_bootstrap_cuts_off_treats_every_cut_as_an_end(bootstrap):
    g, lam = 0.9, 0.8
    settings = AlgorithmConfig(gamma_step=g, lam_step=lam, whiten_advantages=False, bootstrap_cuts=bootstrap)
    estimate = estimate_advantages(settings, _two_slots(), TurnData())
    adv = estimate.advantages[..., 0]
    # gamma_tok = lam_tok = 1 telescopes: A_k = r_k + g * V_next_k - V_k + g * lam * (1 - d_k) * A_{k+1}
    boot, trunc = (5.0, 7.0) if bootstrap else (0.0, 0.0)
    last0 = 2.0 + g * boot - 1.0
    last1 = 4.0 + g * (6.0 if bootstrap else 0.0) - 0.25
    expected = torch.tensor(
        [[1.0 + g * 1.0 - 0.5 + g * lam * last0, last0], [3.0 + g * trunc - 2.0, last1]], dtype=torch.float64
    )
    assert torch.allclose(adv, expected)


def test_bootstrap_cuts_is_on_by_default_and_a_config_key():
    assert AlgorithmConfig().bootstrap_cuts is True
    config = load_config(ROOT / "configs" / "crafter_words.yaml", ["algorithm.bootstrap_cuts=false"])
    assert config.algorithm.bootstrap_cuts is False


# ---------------------------------------------------------------------- the benchmark, end to end


def _bench():
    return import_python_file(ROOT / "benchmarks" / "long_horizon.py", what="benchmark")


def test_every_row_is_a_valid_config_of_the_same_recipe():
    bench = _bench()
    base = load_config(bench.CONFIG)
    assert base.model.path == "crafter-words" and base.multi_turn.langgraph.path.endswith("graphs/crafter.py")
    assert base.multi_turn.langgraph.graph_kwargs["max_steps"] == 400
    assert base.trainer.turns_per_env < 400 / 10  # most episodes are cut by batch boundaries
    assert base.critic_warmup.buffer_multiplier > 0 and base.algorithm.estimator == "gae"
    rows = {row: load_config(bench.CONFIG, bench.row_overrides(row, 32)) for row in bench.ROW_NAMES}
    assert rows["b"].critic_warmup.buffer_multiplier == 0
    assert rows["c"].algorithm.gamma_step == pytest.approx(0.99**33, abs=1e-6)
    assert rows["c"].algorithm.lam_step == pytest.approx(0.95**33, abs=1e-6)
    assert rows["d"].algorithm.bootstrap_cuts is False
    for row in ("e", "e-gigpo"):
        assert rows[row].trainer.turns_per_env == 400 and rows[row].trainer.group_size > 1
    assert rows["e"].algorithm.estimator == "grpo" and rows["e-gigpo"].algorithm.estimator == "gigpo"
    # apart from what the row changes, every row trains the same recipe
    for row, config in rows.items():
        assert config.actor == base.actor and config.sampling == base.sampling, row
        assert config.eval == base.eval and config.multi_turn == base.multi_turn, row


def test_one_tiny_run_writes_its_result_and_the_table(tmp_path):
    bench = _bench()
    small = [
        "trainer.num_envs=4",
        "trainer.turns_per_env=4",
        "multi_turn.langgraph.graph_kwargs.max_steps=12",
        "eval.episodes=2",
        "eval.concurrency=4",
        "critic_warmup.buffer_multiplier=1",
        "critic_warmup.iterations=1",
        "algorithm.mini_batch_turns=16",
    ]
    results = tmp_path / "results"
    bench.main(
        [
            "run",
            "a",
            "--seed",
            "0",
            "--steps",
            "32",
            "--out",
            str(tmp_path / "runs"),
            "--results",
            str(results),
            "--set",
            *small,
        ]
    )
    result = json.loads((results / "a" / "seed0.json").read_text())
    assert result["env_steps"] == 32 and result["updates"] == 1 and result["batch_turns"] == 16
    assert result["before"] is not None and result["after"]["episodes"] == 2
    assert 0 <= result["after"]["achievements"] <= 22 and result["after"]["length"] <= 12
    assert result["load"]["samples"] >= 1
    assert 0 < result["training_wall_s"] <= result["wall_s"] and len(result["sittings"]) == 1
    assert (tmp_path / "runs" / "a" / "seed0" / "sittings.json").is_file()
    bench.main(["random", "--results", str(results), "--set", *small])
    assert json.loads((results / "random.json").read_text())["random"]["episodes"] == 2
    bench.main(["table", "--results", str(results)])
    table = (results / "table.md").read_text()
    assert "| a | Verlog's recipe" in table and "Random valid actions" in table and "Before training" in table
    assert (results / "curves.png").stat().st_size > 0


def test_times_of_a_run_in_two_sittings_restart_with_each_sittings_clock():
    """A resumed run appends to metrics.jsonl with its clock from 0: each record's seconds are
    counted within its own sitting, for the evaluations and for training alike."""
    bench = _bench()
    task = {
        "episodes": 2,
        "progression": 50.0,
        "progression_se": 0.0,
        "return_mean": 1.0,
        "return_se": 0.0,
        "length_mean": 3.0,
    }
    records = [
        {"kind": "eval", "update": 0, "elapsed_s": 10.0, "tasks": [task]},
        {"kind": "critic_warmup", "update": 1, "elapsed_s": 12.0},
        {"kind": "update", "update": 1, "elapsed_s": 20.0},
        {"kind": "update", "update": 2, "elapsed_s": 4.0},  # resumed: a new clock
        {"kind": "eval", "update": 2, "elapsed_s": 9.0, "tasks": [dict(task, progression=100.0)]},
    ]
    assert bench.training_wall(records) == 2.0 + 8.0 + 4.0
    evals = bench.evaluations(records)
    assert evals["seconds"] == 10.0 + 5.0
    assert evals["before"]["achievements"] == 11.0 and evals["after"]["achievements"] == 22.0


def test_a_grouped_row_plays_until_its_steps_reach_the_budget(tmp_path):
    """Row e's batches hold whole groups, so their size varies: the run stops at the first update whose
    steps played (``trainer.stop_at_env_steps``) reach the budget, well before its ceiling of updates,
    and reports the steps it played, not a count of full batches."""
    bench = _bench()
    small = [
        "trainer.num_envs=4",
        "trainer.group_size=2",
        "trainer.turns_per_env=12",
        "multi_turn.langgraph.graph_kwargs.max_steps=12",
        "eval.episodes=2",
        "eval.concurrency=4",
        "algorithm.mini_batch_turns=48",
    ]
    results = tmp_path / "results"
    bench.main(
        [
            "run",
            "e",
            "--seed",
            "0",
            "--steps",
            "100",
            "--out",
            str(tmp_path / "runs"),
            "--results",
            str(results),
            "--set",
            *small,
        ]
    )
    result = json.loads((results / "e" / "seed0.json").read_text())
    records = [
        json.loads(line) for line in (tmp_path / "runs" / "e" / "seed0" / "metrics.jsonl").read_text().splitlines()
    ]
    totals = [r["turns_total"] for r in records if r["kind"] == "update"]
    assert result["budget_steps"] == 100
    assert totals[-1] >= 100 > totals[-2]  # the first update reaching the budget is the last
    assert result["env_steps"] == totals[-1] and result["updates"] == len(totals) < 100 // 4
    assert result["after"]["episodes"] == 2
