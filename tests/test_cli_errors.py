"""A user's mistakes end in one ``error:`` line on stderr and exit status 2, never a traceback,
through ``verlog train``, ``verlog rollout`` and ``verlog eval``: a ``build_graph`` that raises,
a graph file without ``make_input``, ``graph_kwargs`` of the wrong type, episodes that keep
failing (``trainer.max_consecutive_failures``); and a ``metrics.jsonl`` cut by a kill is mended
on ``--resume``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verlog.cli import main
from verlog.train.metrics import truncate_after

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "configs" / "cue_corridor.yaml")

#: a graph file whose build_graph, make_input and node are fine unless told otherwise
GRAPH = """
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict


class State(TypedDict):
    seed: int


def make_input(seed):
    return {{"seed": seed}}


def build_graph(model, **graph_kwargs):
    {build}

    async def policy(state):
        {node}
        await model.ainvoke("Say yes.")
        return {{}}

    graph = StateGraph(State)
    graph.add_node("policy", policy)
    graph.add_edge(START, "policy")
    graph.add_edge("policy", END)
    return graph.compile()
"""


def graph_file(tmp_path: Path, *, build: str = "pass", node: str = "pass", make_input: bool = True) -> Path:
    path = tmp_path / "user_graph.py"
    text = GRAPH.format(build=build, node=node)
    if not make_input:
        text = text.replace("def make_input(seed):", "def make_start(seed):")
    path.write_text(text)
    return path


def command(kind: str, tmp_path: Path, *overrides: str) -> list[str]:
    """``verlog <kind>`` on the toy model with a small, fast setting."""
    from verlog.models import toy_model_dir

    common = [CONFIG, f"model.path={toy_model_dir()}", "multi_turn.langgraph.graph_kwargs={}", *overrides]
    if kind == "train":
        return [
            "train",
            *common,
            f"trainer.run_dir={tmp_path / 'run'}",
            "wandb.mode=disabled",
            "trainer.total_updates=1",
            "trainer.num_envs=2",
            "trainer.turns_per_env=2",
            "critic_warmup.buffer_multiplier=0",
            "eval.at_start=false",
            "eval.at_end=false",
            "algorithm.mini_batch_turns=4",
        ]
    if kind == "rollout":
        return ["rollout", *common, "--episodes", "2"]
    return ["eval", *common, "--episodes", "2", "--out", str(tmp_path / "eval"), "--no-chart"]


def one_error_line(capsys) -> str:
    """The single ``error:`` line of stderr (nothing else there mentions an error; no traceback)."""
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], err  # nothing follows it
    assert "error:" not in out
    return errors[0]


COMMANDS = ["train", "rollout", "eval"]


@pytest.mark.parametrize("kind", COMMANDS)
def test_build_graph_that_raises(kind, tmp_path, capsys):
    path = graph_file(tmp_path, build='raise RuntimeError("no API key for the judge")')
    assert main(command(kind, tmp_path, f"multi_turn.langgraph.path={path}")) == 2
    line = one_error_line(capsys)
    assert str(path) in line and "build_graph" in line and "RuntimeError: no API key for the judge" in line


@pytest.mark.parametrize("kind", COMMANDS)
def test_graph_file_without_make_input(kind, tmp_path, capsys):
    path = graph_file(tmp_path, make_input=False)
    assert main(command(kind, tmp_path, f"multi_turn.langgraph.path={path}")) == 2
    line = one_error_line(capsys)
    assert str(path) in line and "defines no make_input(seed)" in line and "def make_input(seed: int)" in line


@pytest.mark.parametrize("kind", COMMANDS)
@pytest.mark.parametrize(
    "key, value, says",
    [
        ("multi_turn.langgraph.graph_kwargs", "[4, 10]", "must be a mapping of keyword arguments of build_graph"),
        ("multi_turn.langgraph.graph_kwargs", "{1: 2}", "keys must be argument names"),
        ("eval.tasks", "[{name: a, graph_kwargs: [1]}]", "must be a mapping of keyword arguments of build_graph"),
        ("multi_turn.chat_template_kwargs", "[enable_thinking]", "must be a mapping of keyword arguments of the chat"),
    ],
)
def test_kwargs_of_the_wrong_type(kind, key, value, says, tmp_path, capsys):
    assert main([*command(kind, tmp_path), f"{key}={value}"]) == 2
    line = one_error_line(capsys)
    dotted = "eval.tasks.0.graph_kwargs" if key == "eval.tasks" else key
    assert f"{dotted}: {says}" in line


def test_graph_kwargs_build_graph_does_not_take(tmp_path, capsys):
    assert main(command("rollout", tmp_path, "multi_turn.langgraph.graph_kwargs={lenght: 4}")) == 2
    line = one_error_line(capsys)
    assert "cue_corridor.py: build_graph(" in line and "rejected graph_kwargs ['lenght']" in line


def test_episodes_that_keep_failing_stop_training(tmp_path, capsys):
    path = graph_file(tmp_path, node='raise RuntimeError("the game server is down")')
    code = main(command("train", tmp_path, f"multi_turn.langgraph.path={path}", "trainer.max_consecutive_failures=2"))
    assert code == 2
    line = one_error_line(capsys)
    assert "failed 2 episodes in a row" in line and "the game server is down" in line


def test_a_cut_metrics_line_is_dropped_and_complete_ones_kept(tmp_path):
    path = tmp_path / "metrics.jsonl"
    records = [{"update": u, "kind": "update", "loss": 0.5} for u in (1, 2, 3)]
    text = "".join(json.dumps(r) + "\n" for r in records)
    path.write_text(text + '{"update": 4, "kind": "upd')  # killed while writing update 4
    [warning] = truncate_after(path, 3)
    assert "dropped a cut last line" in warning
    assert path.read_text() == text  # every complete record, byte for byte

    path.write_text(text + json.dumps({"update": 4}))  # complete but for its newline: kept
    assert truncate_after(path, 4) == [] and path.read_text() == text + json.dumps({"update": 4}) + "\n"
    path.write_text(text + "not json\n" + json.dumps({"update": 5}) + "\n")
    assert truncate_after(path, 2) == []  # records after the checkpoint go; a foreign line stays
    assert path.read_text() == json.dumps(records[0]) + "\n" + json.dumps(records[1]) + "\nnot json\n"
    truncate_after(tmp_path / "absent.jsonl", 1)  # nothing to mend


def test_overrides_may_follow_options(tmp_path, capsys):
    assert main(["rollout", CONFIG, "--episodes", "1", "sampling.temprature=0"]) == 2
    assert "sampling.temprature: unknown key" in one_error_line(capsys)
    with pytest.raises(SystemExit) as exit_info:  # anything else is still argparse's own error
        main(["rollout", CONFIG, "--episodes", "1", "--shw-messages"])
    assert exit_info.value.code == 2 and "unrecognized arguments: --shw-messages" in capsys.readouterr().err


@pytest.mark.parametrize("split", ["test", "validation"])
def test_eval_split_on_a_config_without_data_is_one_error_line(split, tmp_path, capsys):
    """The seed-made episodes of cue_corridor have no splits: --split is a mistake, not seeds played quietly."""
    assert (
        main(["eval", CONFIG, "--split", split, "--episodes", "2", "--out", str(tmp_path / "eval"), "--no-chart"]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: --split {split}: {CONFIG} has no data rows to split (its episodes come from "
        "make_input(seed)); drop --split, or add a data section with the split's file"
    ]
    assert not (tmp_path / "eval").exists()


@pytest.mark.parametrize("kind", COMMANDS)
def test_a_judge_endpoint_that_is_down_stops_the_command_before_any_episode(kind, tmp_path, capsys):
    """Nothing listens on the judge's port: one error line naming the key, and no episode played."""
    from langgraph_server import free_port

    judge = f"[{{endpoint: {{base_url: 'http://127.0.0.1:{free_port()}/v1', model: judge}}}}]"
    path = graph_file(tmp_path, node='raise RuntimeError("an episode was played")')
    assert main(command(kind, tmp_path, f"multi_turn.langgraph.path={path}", f"reward.judges={judge}")) == 2
    line = one_error_line(capsys)
    assert line.startswith("error: reward.judges[0].endpoint.base_url: the judge's endpoint http://127.0.0.1:")
    assert "does not answer" in line and "an episode was played" not in line
