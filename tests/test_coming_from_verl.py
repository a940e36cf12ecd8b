"""A verl user moves in unchanged (docs/coming_from_verl.md): GSM8K rows written as verl's
``examples/data_preprocess/gsm8k.py`` writes them, a reward function with verl's ``compute_score``
signature and return shapes (verl's own ``default_compute_score`` included), and the ``data`` /
``custom_reward_function`` keys of a verl config, on the embedded trainer and on ``--engine verl``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from doc_pages import doc_blocks
from langchain_core.messages import AIMessage, HumanMessage

from verlog.config import ConfigError, RewardFunctionConfig, config_from_dict
from verlog.rewards import RewardFunction, Trajectory

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "coming_from_verl.md"
#: the instruction verl's gsm8k.py appends to each question
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def gsm8k_rows(split: str, n: int) -> list[dict]:
    """Rows with the layout verl's examples/data_preprocess/gsm8k.py writes (questions of our own)."""
    rows = []
    for i in range(n):
        question = f"Tom has {i + 3} apples and buys {2 * i + 1} more. How many apples does he have?"
        answer = str(3 * i + 4)
        rows.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "user", "content": question + " " + INSTRUCTION}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {
                    "split": split,
                    "index": i,
                    "answer": f"{i + 3} + {2 * i + 1} = {answer}\n#### {answer}",
                    "question": question,
                },
            }
        )
    return rows


def write_gsm8k(folder: Path) -> dict[str, Path]:
    """train.parquet and test.parquet under ``folder``, written with ``datasets`` as verl's script does."""
    import datasets

    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, n in (("train", 12), ("test", 4)):
        paths[split] = folder / f"{split}.parquet"
        datasets.Dataset.from_list(gsm8k_rows(split, n)).to_parquet(str(paths[split]))
    return paths


@pytest.fixture
def verl_user(tmp_path, monkeypatch) -> Path:
    """A verl user's working folder: ~/data/gsm8k/*.parquet, my_reward.py from the docs page, and
    the graphs folder the configs name; HOME and the working directory point there."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    write_gsm8k(tmp_path / "data" / "gsm8k")
    (tmp_path / "my_reward.py").write_text(doc_blocks(DOC.name, "python")[0])
    (tmp_path / "graphs").symlink_to(ROOT / "graphs")
    return tmp_path


def verl_trajectory(answer: str, row: dict) -> Trajectory:
    return Trajectory(
        state={"messages": [HumanMessage(row["prompt"][0]["content"]), AIMessage(answer)]}, row=row, key=0
    )


# ------------------------------------------------------------------ the reward function


async def test_the_docs_compute_score_is_called_with_verls_arguments_and_its_dict_is_kept(verl_user):
    row = gsm8k_rows("train", 3)[2]  # ground truth "10"
    function = RewardFunction(RewardFunctionConfig(function=f"{verl_user / 'my_reward.py'}:compute_score"))
    function.check_arguments(list(row))  # verl's signature is accepted before any episode
    right = await function(verl_trajectory("5 + 5 = 10\n#### 10", row))
    assert right.reward == 1.0 and right.info == {"answered": True}
    wrong = await function(verl_trajectory("#### 11", row))
    assert wrong.reward == 0.0 and wrong.info == {"answered": True}


async def test_verls_own_default_compute_score_scores_gsm8k_rows_read_from_parquet(verl_user):
    """verl's default_compute_score (it dispatches on data_source) on rows read back from the Parquet file."""
    from verlog.config import DataSourceConfig
    from verlog.data.files import read_rows

    rows = read_rows(DataSourceConfig(path=str(verl_user / "data/gsm8k/train.parquet")), "train")
    row = rows[1]  # ground truth "7"
    assert row["reward_model"]["ground_truth"] == "7" and row["extra_info"]["index"] == 1
    function = RewardFunction(RewardFunctionConfig(function="verl.utils.reward_score:default_compute_score"))
    function.check_arguments(rows.columns)
    assert (await function(verl_trajectory("3 + 4 = 7 #### 7", row))).reward == 1.0
    assert (await function(verl_trajectory("#### 8", row))).reward == 0.0


#: a reward function of verl's shape that hands its ``**kwargs`` on, as verl's own do: only what
#: verl passes (its four arguments and reward_kwargs) may reach it
FORWARDING_SCORE = """
def strict(solution_str, ground_truth, bonus=0.0):
    return float(solution_str.strip().endswith(ground_truth)) + bonus


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    assert data_source == "openai/gsm8k" and extra_info["split"] == "train"
    return strict(solution_str, ground_truth, **kwargs)
"""


def test_a_verl_function_with_kwargs_gets_only_verls_arguments_and_reward_kwargs(verl_user, capsys):
    """``verlog rollout`` on the docs' embedded config with verl's default_compute_score's shape
    (``**kwargs`` handed on to a function that takes only verl's arguments): every episode is
    scored, with the reward_kwargs, none fails on a verlog argument (prompt, row...)."""
    from verlog.cli import main

    (verl_user / "my_reward.py").write_text(FORWARDING_SCORE)
    config = verl_user / "verl_gsm8k_embedded.yaml"
    config.write_text(doc_blocks(DOC.name, "yaml")[1])
    out = verl_user / "episodes.json"
    overrides = [
        "model.path=tiny",
        "sampling.max_tokens=4",
        "custom_reward_function.reward_kwargs={bonus: 0.5}",
        "multi_turn.langgraph.graph_config={recursion_limit: 4}",
    ]
    assert main(["rollout", str(config), *overrides, "--episodes", "3", "--json", str(out)]) == 0
    episodes = json.loads(out.read_text())
    assert [e["status"] for e in episodes] == ["ok"] * 3, [e["error"] for e in episodes]
    assert all(sum(t["reward"] for t in e["turns"]) in (0.5, 1.5) for e in episodes)


def test_verls_signature_without_a_ground_truth_is_refused_naming_where_verl_reads_it(tmp_path):
    path = tmp_path / "r.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    function = RewardFunction(RewardFunctionConfig(function=f"{path}:compute_score"))
    with pytest.raises(ConfigError, match=r"needs 'ground_truth'.*reward_model\.ground_truth"):
        function.check_arguments(["prompt", "answer"])
    function.check_arguments(["prompt", "ground_truth"])  # a plain column of that name is fine too


# ------------------------------------------------------------------ the config keys


def test_custom_reward_function_is_an_entry_of_reward_functions_at_either_place():
    graph = {"langgraph": {"path": "graphs/calculator.py"}}
    top = config_from_dict(
        {"multi_turn": graph, "custom_reward_function": {"path": "my_reward.py", "name": "compute_score"}}
    )
    inside = config_from_dict(
        {
            "multi_turn": graph,
            "reward": {"custom_reward_function": {"path": "my_reward.py", "reward_kwargs": {"strict": True}}},
        }
    )
    assert [f.function for f in top.reward.functions] == ["my_reward.py:compute_score"]
    assert inside.reward.functions[0].function == "my_reward.py:compute_score"  # verl's default name
    assert inside.reward.functions[0].kwargs == {"strict": True}
    unset = config_from_dict({"multi_turn": graph, "custom_reward_function": {"path": None, "name": None}})
    assert unset.reward.functions == []  # verl's defaults: no custom function
    with pytest.raises(ConfigError, match="given twice"):
        config_from_dict(
            {
                "multi_turn": graph,
                "custom_reward_function": {"path": "a.py"},
                "reward": {"custom_reward_function": {"path": "b.py"}},
            }
        )


def test_verls_data_keys_are_the_splits_and_the_prompt_column(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    graph = {"langgraph": {"path": "graphs/calculator.py"}}
    data = config_from_dict(
        {
            "multi_turn": graph,
            "data": {
                "train_files": "~/data/gsm8k/train.parquet",
                "val_files": ["~/data/gsm8k/test.parquet"],
                "prompt_key": "question",
            },
        }
    ).data
    assert data.train.path == str(tmp_path / "data/gsm8k/train.parquet")
    assert data.validation.path == str(tmp_path / "data/gsm8k/test.parquet") and data.input.prompt == "question"
    with pytest.raises(ConfigError, match=r"^invalid config <config>: data: train_files and train both name"):
        config_from_dict({"multi_turn": graph, "data": {"train_files": "a.parquet", "train": "b.parquet"}})
    with pytest.raises(ConfigError, match="got 2 files; give one"):
        config_from_dict({"multi_turn": graph, "data": {"train_files": ["a.parquet", "b.parquet"]}})


# ------------------------------------------------------------------ the embedded trainer


@pytest.mark.timeout(900)
def test_the_docs_embedded_config_trains_three_updates_on_verls_files(verl_user):
    from verlog.cli import main

    config = verl_user / "verl_gsm8k_embedded.yaml"
    config.write_text(doc_blocks(DOC.name, "yaml")[1])
    run_dir = verl_user / "run"
    overrides = [
        "model.path=tiny",
        "model.dtype=float32",
        f"trainer.run_dir={run_dir}",
        "trainer.total_updates=3",
        "trainer.num_envs=8",
        "trainer.group_size=4",
        "trainer.turns_per_env=2",
        "trainer.torch_threads=1",
        "trainer.save_every=0",
        "sampling.max_tokens=12",
        "wandb.mode=disabled",
        "algorithm.mini_batch_turns=16",
        "eval.at_start=false",
        "eval.at_end=false",
        "multi_turn.langgraph.graph_config={recursion_limit: 8}",
    ]
    assert main(["train", str(config), *overrides]) == 0
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["data"]["train"]["path"] == str(verl_user / "data/gsm8k/train.parquet")
    assert saved["reward"]["functions"] == [
        {"function": "my_reward.py:compute_score", "name": None, "weight": 1.0, "timeout_s": 60.0, "kwargs": {}}
    ]  # the custom_reward_function block
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in records if r.get("kind", "update") == "update" and "episode_return" in r]
    assert len(updates) == 3
    assert any(key.startswith("reward/compute_score") for r in records for key in r), "the function's reward is logged"


# ------------------------------------------------------------------ --engine verl


def test_the_docs_verl_config_composes_with_the_users_files_and_function(verl_user, capsys):
    from verlog.cli import main

    config = verl_user / "verl_gsm8k.yaml"
    config.write_text(doc_blocks(DOC.name, "yaml")[0])
    assert main(["train", "--engine", "verl", str(config), "actor_rollout_ref.model.path=tiny", "--dry-run"]) == 0
    captured = capsys.readouterr()
    composed = yaml.safe_load(captured.out)
    block = composed["verlog"]
    assert block["data"]["train"] == str(verl_user / "data/gsm8k/train.parquet")
    assert block["data"]["validation"] == str(verl_user / "data/gsm8k/test.parquet")
    assert block["data"]["input"] == {"prompt": "prompt"}
    assert block["reward"]["functions"] == [{"function": f"{verl_user / 'my_reward.py'}:compute_score"}]
    assert block["num_envs"] == 32 and composed["data"]["train_batch_size"] == 32
    assert composed["data"]["train_files"].startswith("verlog://slots/32")  # the slots, which play the rows above
    assert composed["custom_reward_function"]["path"] is None  # run by the agent loop, not verl's reward manager
    err = captured.err
    assert "note: data.train_files is played as verlog.data.train" in err
    assert "note: custom_reward_function (" in err and "verlog.reward.functions[0]" in err
    assert "multi_turn.max_assistant_turns is a setting of verl's own tool agent, unused here" in err

    from verlog.integrations.verl.launch import compose_verl_config
    from verlog.integrations.verl.settings import agent_spec

    spec = agent_spec(compose_verl_config(config, ["actor_rollout_ref.model.path=tiny"]))
    assert (spec.rollout_n, spec.settings.group_size, spec.estimator) == (4, 4, "grpo")  # verl's group: a row's n
    assert spec.settings.validation_episodes() == 4  # verl's validation plays every row of val_files


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "verlog.data.train=data/gsm8k/train.parquet",
            r"^data\.train_files and verlog\.data\.train both name the train rows: keep one$",
        ),
        ("data.train_files=[a.parquet, b.parquet]", r"^data\.train_files: verlog reads one file.*got 2 files"),
    ],
)
def test_a_data_key_given_both_ways_is_refused_in_one_line(verl_user, override, message):
    from verlog.integrations.verl.launch import compose_verl_config

    config = verl_user / "verl_gsm8k.yaml"
    config.write_text(doc_blocks(DOC.name, "yaml")[0])
    with pytest.raises(ConfigError, match=message):
        compose_verl_config(config, ["actor_rollout_ref.model.path=tiny", override])
