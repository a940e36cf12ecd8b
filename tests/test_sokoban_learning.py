"""Sokoban learned on the CPU (issue 36): the ``sokoban-words`` model (the game's own vocabulary, one
token per move), its recipe (``configs/sokoban_words.yaml``), and ``benchmarks/sokoban_learning.py``
run end to end for one tiny update (training with before/after evaluations, random valid moves on the
same held-out rooms, the result file, a resumed run, the table)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
import torch
from conftest import ROOT
from doc_pages import doc_commands
from langchain_core.messages import convert_to_openai_messages

from verlog.config import load_config
from verlog.envs.actions import parse_action
from verlog.envs.agent_graph import build_prompt, invalid_answer_feedback
from verlog.envs.sokoban import ACTIONS, HELD_OUT_SEED_START, SYMBOLS, SYNONYMS, SokobanEnv
from verlog.envs.sokoban.generator import SEARCH_DEPTH
from verlog.graph_file import import_python_file
from verlog.models import MODEL_SPECS, load_causal_lm, load_tokenizer, resolve_model_path
from verlog.models.sokoban_words import LINE_BREAK, build_sokoban_words_model, sokoban_words_model_name


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_sokoban_words_model(tmp_path_factory.mktemp("sokoban-words"))


@pytest.fixture(scope="module")
def tok(built):
    return load_tokenizer(built)


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def _unknown(tok, text):
    return {w for w, i in zip(tok.tokenize(text), _ids(tok, text)) if i == tok.unk_token_id}


# ---------------------------------------------------------------------- sokoban-words


def test_named_spec_builds_once_into_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("VERLOG_CACHE", str(tmp_path))
    assert "sokoban-words" in MODEL_SPECS
    folder = resolve_model_path("sokoban-words")
    assert folder == tmp_path / "models" / sokoban_words_model_name()
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    assert resolve_model_path("sokoban-words") == folder  # cached: not rebuilt


def test_each_move_is_one_token_that_the_game_reads_back(tok):
    env = SokobanEnv()
    for action in ACTIONS:
        ids = _ids(tok, action)
        assert len(ids) == 1 and ids[0] != tok.unk_token_id, action
        decoded = tok.decode(ids, skip_special_tokens=True)
        assert decoded == action
        assert parse_action(decoded, ACTIONS, SYNONYMS).action == action
        env.reset(HELD_OUT_SEED_START)
        assert env.step(decoded).info["valid_action"]
    assert len(set(tok.convert_tokens_to_ids(list(ACTIONS)))) == len(ACTIONS)
    assert tok.decode([tok.eos_token_id], skip_special_tokens=True) == ""  # an empty answer is invalid


def test_every_symbol_is_one_token_and_rows_end_in_a_line_break(tok):
    env = SokobanEnv()
    env.reset(HELD_OUT_SEED_START)
    for symbol in SYMBOLS.values():
        assert len(_ids(tok, f" {symbol} \t")) == 1 and not _unknown(tok, symbol), symbol
    assert len({tok.convert_tokens_to_ids(s.lower()) for s in SYMBOLS.values()}) == len(SYMBOLS)
    words = tok.tokenize(env.observation())
    height, width = env.dim_room
    assert len(words) == height * width + height - 1 and words.count(LINE_BREAK) == height - 1
    assert words[width] == LINE_BREAK


@pytest.mark.parametrize("settings", [{}, {"dim_room": (7, 7), "num_boxes": 2, "max_steps": 30}])
def test_every_prompt_over_many_rooms_has_no_unknown_words(tok, settings):
    """Every word of the prompts verlog's Sokoban shows over random episodes on training and held-out
    seeds (every kind of cell, the invalid-answer note, the game's own instruction) is known."""
    rng = random.Random(0)
    env = SokobanEnv(**settings)
    instruction = env.instruction
    seen, texts = set(), [instruction]
    for seed in [*range(40), *range(HELD_OUT_SEED_START, HELD_OUT_SEED_START + 40)]:
        observation, note = env.reset(seed), ""
        while True:
            for text in (instruction, "sokoban"):
                messages = convert_to_openai_messages(build_prompt(text, [], observation, 0, note))
                texts.append(tok.apply_chat_template(messages, tokenize=False))
            seen |= set(observation.split())
            if env.done:
                break
            result = env.step(rng.choice([*ACTIONS, "dance"]))
            observation = result.observation
            note = "" if result.info["valid_action"] else invalid_answer_feedback(result.info["action"])
    assert seen == set(SYMBOLS.values())  # every kind of cell was shown
    assert any("named no valid action" in t for t in texts)
    unknown = set().union(*(_unknown(tok, t) for t in texts))
    assert not unknown


def test_chat_template_answer_follows_the_room(tok):
    env = SokobanEnv()
    prompt = build_prompt("sokoban", [], env.reset(HELD_OUT_SEED_START), 0)
    text = tok.apply_chat_template(convert_to_openai_messages(prompt), tokenize=False)
    assert text.startswith("<|im_start|>system sokoban <|im_start|>user Current Observation:")
    assert text.endswith(env.observation())  # no generation prompt: the move comes next
    assert len(_ids(tok, text)) < 64


def test_size_and_deterministic_build(tmp_path, built, tok):
    model = load_causal_lm(built)
    assert 100_000 < sum(p.numel() for p in model.parameters()) < 1_000_000
    assert model.config.vocab_size == len(tok) < 200
    again = build_sokoban_words_model(tmp_path / "again")
    assert load_tokenizer(again).get_vocab() == tok.get_vocab()
    first, second = model.state_dict(), load_causal_lm(again).state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)


# ---------------------------------------------------------------------- the recipe and the benchmark


def _bench():
    return import_python_file(ROOT / "benchmarks" / "sokoban_learning.py", what="benchmark")


def _doc_benchmark_commands() -> dict[str, list[str]]:
    """The benchmark's commands in docs/environments_sokoban.md, by subcommand (arguments after the script)."""
    commands = [line.split() for line in doc_commands("environments_sokoban.md") if "sokoban_learning.py" in line]
    assert all(c[:2] == ["python", "benchmarks/sokoban_learning.py"] for c in commands)
    return {c[2]: c[2:] for c in commands}


def test_the_recipe_is_verlogs_on_verl_agents_sokoban_evaluated_on_held_out_rooms():
    config = load_config(_bench().CONFIG)
    kwargs = config.multi_turn.langgraph.graph_kwargs
    assert config.model.path == "sokoban-words" and config.multi_turn.langgraph.path.endswith("graphs/sokoban.py")
    assert "dim_room" not in kwargs and "num_boxes" not in kwargs and "max_steps" not in kwargs  # verl-agent's
    assert kwargs["max_tokens"] == 1 and config.sampling.max_tokens == 1 and kwargs["history_turns"] == 0
    # training plays rooms of mixed difficulty; every evaluation plays verl-agent's (search depth 30)
    assert kwargs["search_depth"] == [1, 12]
    assert [(t.name, t.graph_kwargs) for t in config.eval.tasks] == [("sokoban", {"search_depth": SEARCH_DEPTH})]
    assert config.algorithm.estimator == "gae" and config.critic_warmup.buffer_multiplier > 0
    assert config.algorithm.gamma_token == 1.0 and config.algorithm.lam_token == 1.0
    assert config.algorithm.dual_clip is not None and config.algorithm.bootstrap_cuts
    assert config.eval.seed == HELD_OUT_SEED_START and config.eval.validation_seed >= HELD_OUT_SEED_START
    assert config.eval.episode_count() >= 64 and config.eval.at_start and config.eval.at_end
    assert config.rollout.seed == 0  # training rooms 0, 1, ...; the benchmark checks they stay below the held-out ones


def test_a_comparison_whose_training_reached_the_held_out_seeds_is_refused(tmp_path):
    """The trainer's ``seed_max`` (the highest seed training started an episode with) is checked
    against the held-out rooms: seeds that reach them would make the comparison not held out."""
    sittings = import_python_file(ROOT / "benchmarks" / "sittings.py", what="benchmark")
    config = load_config(_bench().CONFIG, [f"trainer.run_dir={tmp_path}"])
    start = config.eval.seed
    records = [{"kind": "update", "update": 1, "seed_max": 700.0}, {"kind": "eval", "update": 1}]
    assert sittings.training_seeds(config, records) == [0, 700]
    assert sittings.training_seeds(config, [{"kind": "update", "update": 1}]) is None  # a run on data rows
    reached = [*records, {"kind": "update", "update": 2, "seed_max": float(start + 5)}]
    with pytest.raises(SystemExit, match=f"reach the held-out seeds {start}"):
        sittings.training_seeds(config, reached)


def test_too_few_held_out_rooms_is_refused_before_training(tmp_path):
    with pytest.raises(SystemExit, match="eval.episodes=8 is too few"):
        # (a repeated --set adds to the overrides: the first one is not dropped)
        _bench().main(
            ["run", "--out", str(tmp_path / "runs"), "--results", str(tmp_path)]
            + ["--set", "eval.episodes=8", "--set", "eval.concurrency=2"]
        )
    assert not (tmp_path / "runs").exists()


@pytest.mark.timeout(600)
def test_one_tiny_update_writes_the_result_and_a_killed_run_resumes(tmp_path, capsys):
    bench = _bench()
    small = [
        "model.device=cpu",
        "trainer.num_envs=4",
        "trainer.turns_per_env=4",
        "eval.episodes=3",
        "eval.concurrency=4",
        "critic_warmup.buffer_multiplier=1",
        "critic_warmup.iterations=1",
        "algorithm.mini_batch_turns=8",
        "trainer.save_every=1",
    ]
    results, runs = tmp_path / "results", tmp_path / "runs"
    doc = _doc_benchmark_commands()  # the doc's commands, as written, with a tiny budget appended
    args = [*doc["run"], "--out", str(runs), "--results", str(results), "--allow-few", "--set", *small]
    assert bench.main([*args[:1], "--updates", "1", *args[1:]]) == 0
    first = json.loads((results / "result.json").read_text())
    assert first["updates"] == 1 and first["batch_turns"] == 16 and first["eval_seed"] == HELD_OUT_SEED_START
    for player in ("before", "after", "random"):
        r = first[player]
        assert r["episodes"] == 3 and 0 <= r["win_rate"] <= 1 and 1 <= r["length"] <= 15, player
    assert first["after_vs_random"]["diff"] == pytest.approx(first["after"]["win_rate"] - first["random"]["win_rate"])
    assert len(first["curve"]) == 1 and 0 < first["training_wall_s"] <= first["wall_s"]
    # 4 slots, each started on its own room (seeds 0..3) and maybe more: far below the held-out ones
    assert first["training_seeds"][0] == 0 and 3 <= first["training_seeds"][1] < HELD_OUT_SEED_START
    oracle = first["oracle_move"]  # the untrained policy's and the trained one's, on the same states
    assert set(oracle) == {"before", "after"} and set(oracle["before"]) <= {"1", "2", "3", "4", "5+"}
    assert "1" in oracle["before"] and all(0 < p < 1 for p in [*oracle["before"].values(), *oracle["after"].values()])
    assert oracle["after"] != oracle["before"]  # the trained weights were read, not the initial ones
    said = capsys.readouterr().out
    assert "| random valid moves |" in said and "| after 1 updates |" in said and "s.e. of the difference" in said
    assert "P(oracle's move), after" in said
    # run again with a larger budget: it resumes from the saved update instead of starting over
    assert bench.main([*args[:1], "--updates", "2", *args[1:]]) == 0
    second = json.loads((results / "result.json").read_text())
    assert second["updates"] == 2 and [p["update"] for p in second["curve"]] == [1, 2]
    assert len(second["sittings"]) == 2 and second["before"] == first["before"]
    capsys.readouterr()
    assert bench.main([*doc["show"], "--results", str(results)]) == 0
    assert "| after 2 updates |" in capsys.readouterr().out
    assert bench.main(["show", "--results", str(tmp_path / "none")]) == 2


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_doc_train_and_baseline_commands_run_with_a_tiny_budget(tmp_path):
    """``verlog train configs/sokoban_words.yaml`` then the baseline on its run folder, as the doc
    words them, with a tiny budget appended."""
    text = (ROOT / "docs" / "environments_sokoban.md").read_text()
    assert "`verlog train configs/sokoban_words.yaml`" in text
    assert "`python -m verlog.evaluation.baseline runs/sokoban_words`" in text
    run_dir = tmp_path / "sokoban_words"
    small = [
        "trainer.num_envs=4",
        "trainer.turns_per_env=4",
        "trainer.total_updates=1",
        "eval.episodes=2",
        "critic_warmup.buffer_multiplier=1",
        "critic_warmup.iterations=1",
        "algorithm.mini_batch_turns=8",
        "wandb.mode=disabled",
        f"trainer.run_dir={run_dir}",
    ]
    train = subprocess.run(
        [sys.executable, "-m", "verlog.cli", "train", "configs/sokoban_words.yaml", *small],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=800,
    )
    assert train.returncode == 0, train.stderr[-2000:] + train.stdout[-2000:]
    assert (run_dir / "eval.json").is_file()
    baseline = subprocess.run(
        [sys.executable, "-m", "verlog.evaluation.baseline", str(run_dir)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert baseline.returncode == 0, baseline.stderr[-2000:] + baseline.stdout[-2000:]
    assert "random valid actions" in baseline.stdout and "after 1 updates" in baseline.stdout


def test_the_held_out_check_holds_at_its_boundaries(tmp_path):
    """Training that stops one seed short of the held-out ones passes; one that reaches the first
    held-out seed, or starts on the last one, is refused (an off-by-one either way fails here)."""
    sittings = import_python_file(ROOT / "benchmarks" / "sittings.py", what="benchmark")
    config = load_config(_bench().CONFIG, [f"trainer.run_dir={tmp_path}"])
    start, stop = config.eval.seed, config.eval.seed + config.eval.episode_count()

    def played(first: int, last: int) -> list[dict]:
        config.rollout.seed = first
        return [{"kind": "update", "update": 1, "seed_max": float(last)}]

    assert sittings.training_seeds(config, played(0, start - 1)) == [0, start - 1]
    with pytest.raises(SystemExit):
        sittings.training_seeds(config, played(0, start))
    assert sittings.training_seeds(config, played(stop, stop + 10)) == [stop, stop + 10]
    with pytest.raises(SystemExit):
        sittings.training_seeds(config, played(stop - 1, stop + 10))


def test_the_oracles_move_probability_is_read_by_distance_to_solved():
    """The benchmark's analysis: on each held-out room's shortest solution, the policy's probability
    of the oracle's move, grouped by moves to solved (an untrained model is near uniform, 0.25)."""
    bench = _bench()
    policy = bench.MovePolicy("sokoban")
    probs = bench.oracle_move_probability(policy, range(HELD_OUT_SEED_START, HELD_OUT_SEED_START + 6))
    assert "1" in probs and set(probs) <= {"1", "2", "3", "4", "5+"}
    assert all(0.05 < p < 0.6 for p in probs.values())
