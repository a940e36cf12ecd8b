"""The data and reward sections on verl: ``verlog.data`` rows and ``verlog.reward`` functions in a
verl config, run by verl's real agent-loop worker on CPU (verl's config composition, dataset
collation and post-processing; a fake ``LLMServerClient`` served by the embedded engine on the tiny
model), as ``tests/test_verl_pipeline.py`` runs the seed-made games."""

from __future__ import annotations

import json

import pytest
from test_verl_pipeline import _rollout_world

pytest.importorskip("verl")

GRAPH = '''
"""A production-style one-call agent: a messages state in, one answer out. No verlog import."""
from langgraph.graph import END, START, MessagesState, StateGraph


def build_graph(model):
    async def answer(state: MessagesState):
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("answer", answer)
    graph.add_edge(START, "answer")
    graph.add_edge("answer", END)
    return graph.compile()
'''

REWARD = '''
def by_row(key, answer):
    """A reward that names the row it scored: its index and its answer column."""
    return {"reward": key / 100 + float(answer) / 10000, "success": key % 2 == 0}
'''


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_dir):
    root = tmp_path_factory.mktemp("verl_data")
    for split, n in (("train", 9), ("validation", 3)):
        rows = [
            {"prompt": f"{split} question {i}", "answer": str(i + (50 if split == "validation" else 0))}
            for i in range(n)
        ]
        (root / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "reward.py").write_text(REWARD)
    settings = {
        "verlog": {
            "num_envs": 2,
            "turns_per_env": 3,
            # relative paths: resolved against the config file's folder for Ray's workers
            "data": {"train": "train.jsonl", "validation": "validation.jsonl", "shuffle": False},
            "reward": {"functions": ["reward.py:by_row"]},
        },
        "actor_rollout_ref": {
            "model": {"path": "tiny"},
            "rollout": {
                "name": "sglang",
                "prompt_length": 256,
                "response_length": 4,
                "multi_turn": {"langgraph": {"path": "one_call.py", "graph_config": {"recursion_limit": 10}}},
            },
        },
        "trainer": {"n_gpus_per_node": 1, "total_training_steps": 2},
    }
    return _rollout_world(root, "one_call", GRAPH, settings, tiny_dir, validate=True)


def test_slots_play_the_training_rows_and_the_reward_function_scores_each(world):
    assert world.config.verlog.data.train.endswith("/train.jsonl")  # made absolute by the launcher
    seen = []
    for step in (1, 2):
        for key in world.keys[step]:
            row = world.store.rows["train"][key]
            extra = row["extra_fields"]
            if extra["verlog_kind"] != "turn":
                continue
            prompt = world.tokenizer.decode(row["prompts"].tolist())
            index = int(prompt.split("train question ")[1].split("<")[0])
            # one call per episode: every turn ends its episode, carrying the function's reward
            assert extra["verlog_terminated"]
            assert extra["verlog_reward"] == pytest.approx(index / 100 + index / 10000)
            seen.append(index)
    # 2 slots (2 groups of one) x 3 turns x 2 steps = 12 episodes: the rows in file order, then again
    assert sorted(seen) == sorted([i % 9 for i in range(12)])


def test_validation_plays_every_validation_row_once(world):
    rows = [world.store.rows["val"][k] for k in world.store.trajectory_keys("val")]
    assert len(world.config.data.val_files) and "episodes/3" in str(world.config.data.val_files)
    scores = {}
    for row in rows:
        prompt = world.tokenizer.decode(row["prompts"].tolist())
        index = int(prompt.split("validation question ")[1].split("<")[0])
        scores[index] = (row["rm_scores"].sum().item(), row["extra_fields"]["reward_extra_info"]["acc"])
    assert sorted(scores) == [0, 1, 2]
    for index, (score, acc) in scores.items():
        assert score == pytest.approx(index / 100 + (index + 50) / 10000)
        assert acc == float(index % 2 == 0)


def test_ranking_judges_and_loaded_judge_models_are_refused_under_verl():
    from verlog.config import ConfigError
    from verlog.integrations.verl.settings import read_settings

    with pytest.raises(ConfigError, match=r"verlog.*reward.judges\[0\]: a ranking judge scores the groups"):
        read_settings({"verlog": {"reward": {"judges": [{"kind": "ranking", "embedded": "policy"}]}}})
    with pytest.raises(ConfigError, match=r"under verl a judge is an endpoint or the policy's own server"):
        read_settings({"verlog": {"reward": {"judges": [{"kind": "rubric", "embedded": "smollm2"}]}}})
    with pytest.raises(ConfigError, match=r"data.train: the slots play the training split's rows"):
        read_settings({"verlog": {"data": {"test": "x.jsonl"}}})


def test_the_shipped_verl_calculator_config_composes_and_passes_verls_checks(monkeypatch, tmp_path):
    from pathlib import Path

    from verlog.integrations.verl.launch import compose_verl_config, launch
    from verlog.integrations.verl.settings import agent_spec

    root = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # the config's relative paths resolve from its own folder
    printed: list[str] = []
    config_file = root / "configs" / "verl_calculator.yaml"
    assert launch(config_file, ["actor_rollout_ref.model.path=tiny"], dry_run=True, echo=printed.append) == 0
    config = compose_verl_config(config_file, ["actor_rollout_ref.model.path=tiny"])
    settings = agent_spec(config).settings
    assert Path(settings.data.train.path) == root / "data" / "calculator" / "train.jsonl"
    assert Path(settings.reward.functions[0].function.rpartition(":")[0]) == root / "rewards" / "calculator.py"
    assert str(config.data.val_files).startswith("verlog://episodes/64?")  # every validation row
    assert config.critic.enable is False and config.algorithm.adv_estimator == "grpo"
