"""Config loading: valid files load, every bad key is named with what is allowed."""

from pathlib import Path

import pytest

from verlog.config import ConfigError, apply_overrides, config_from_dict, load_config

ROOT = Path(__file__).resolve().parents[1]
GOOD = {"multi_turn": {"langgraph": {"path": "graphs/calculator.py", "graph_config": {"recursion_limit": 20}}}}


def test_shipped_configs_load():
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        if path.name.startswith("verl_"):  # verl's configs (tests/test_verl_config.py)
            with pytest.raises(ConfigError, match=r"is a verl config .*verlog train --engine verl"):
                load_config(path)
            continue
        config = load_config(path)
        assert Path(config.multi_turn.langgraph.path).exists(), path


def test_defaults_and_graph_config():
    config = config_from_dict(GOOD)
    assert config.engine.kind == "embedded"
    assert config.multi_turn.langgraph.graph_config == {"recursion_limit": 20}
    assert config.multi_turn.chat_template_kwargs == {}


def test_unknown_key_is_named_with_allowed_keys():
    with pytest.raises(ConfigError) as info:
        config_from_dict({**GOOD, "engine": {"kind": "embedded", "max_batch": 3}})
    message = str(info.value)
    assert "engine.max_batch: unknown key" in message
    assert "max_batch_size" in message and "batch_wait_ms" in message


def test_bad_value_names_key_and_allowed_values():
    with pytest.raises(ConfigError) as info:
        config_from_dict({**GOOD, "engine": {"kind": "vllm"}})
    message = str(info.value)
    assert "engine.kind" in message and "'embedded'" in message and "'sglang'" in message and "vllm" in message
    with pytest.raises(ConfigError, match=r"rollout.slot_threads: Input should be 'auto' or 'always' \(got 'never'\)"):
        config_from_dict({**GOOD, "rollout": {"slot_threads": "never"}})


def test_unknown_top_level_section():
    with pytest.raises(ConfigError, match=r"trainerz: unknown key; allowed keys here: .*engine.*model.*multi_turn"):
        config_from_dict({**GOOD, "trainerz": {}})


def test_missing_langgraph_path():
    with pytest.raises(ConfigError, match=r"multi_turn.langgraph.path: required key is missing"):
        config_from_dict({"multi_turn": {"langgraph": {}}})


def test_bad_graph_config_keys():
    bad = {"multi_turn": {"langgraph": {"path": "x.py", "graph_config": {"recursion_limt": 5}}}}
    with pytest.raises(
        ConfigError, match=r"multi_turn.langgraph.graph_config.*recursion_limt.*allowed: recursion_limit"
    ):
        config_from_dict(bad)
    bad["multi_turn"]["langgraph"]["graph_config"] = {"recursion_limit": 0}
    with pytest.raises(ConfigError, match="recursion_limit must be an integer >= 1"):
        config_from_dict(bad)


def test_bad_device():
    with pytest.raises(ConfigError, match="model.device: device must be one of auto, cpu, cuda"):
        config_from_dict({**GOOD, "model": {"device": "gpu"}})


def test_overrides(tmp_path):
    data = apply_overrides(GOOD, ["sampling.temperature=0", "rollout.episodes=3", "sampling.stop=[a, b]"])
    config = config_from_dict(data)
    assert config.sampling.temperature == 0 and config.rollout.episodes == 3 and config.sampling.stop == ["a", "b"]
    with pytest.raises(ConfigError, match="not of the form key.path=value"):
        apply_overrides(GOOD, ["sampling.temperature"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("multi_turn: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_graph_path_resolved_relative_to_config_project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the project folder
    config = load_config(ROOT / "configs" / "calculator.yaml")
    assert Path(config.multi_turn.langgraph.path) == ROOT / "graphs" / "calculator.py"
