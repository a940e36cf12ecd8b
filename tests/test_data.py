"""The data section: splits read with ``datasets`` from every supported format, rows turned into
graph inputs, shuffled epochs, and the errors a user's mistakes get."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from verlog.config import DataConfig, DataInputConfig, DataSourceConfig, load_config
from verlog.data import DataError, EpochOrder, RowTasks, input_maker, load_tasks, read_rows, shared_rows, split_rows
from verlog.data.inputs import makes_input_from_row
from verlog.graph_file import load_graph_file

ROOT = Path(__file__).resolve().parents[1]
ROWS = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1), "tags": ["a", "b"]} for i in range(7)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def files(tmp_path):
    import datasets

    ds = datasets.Dataset.from_list(ROWS)
    out = {"jsonl": write_jsonl(tmp_path / "rows.jsonl", ROWS)}
    ds.to_parquet(str(tmp_path / "rows.parquet"))
    out["parquet"] = tmp_path / "rows.parquet"
    ds.remove_columns("tags").to_csv(str(tmp_path / "rows.csv"), index=False)
    out["csv"] = tmp_path / "rows.csv"
    ds.save_to_disk(str(tmp_path / "folder"))
    out["disk"] = tmp_path / "folder"
    datasets.DatasetDict({"train": ds, "test": ds.select(range(3))}).save_to_disk(str(tmp_path / "dict"))
    out["dict"] = tmp_path / "dict"
    return out


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "csv", "disk"])
def test_every_format_reads_the_same_rows(files, fmt):
    rows = read_rows(DataSourceConfig(path=str(files[fmt])), "train")
    assert len(rows) == len(ROWS)
    for got, want in zip(rows, ROWS):
        want = {k: v for k, v in want.items() if fmt != "csv" or k != "tags"}
        assert {k: (str(v) if k == "answer" else v) for k, v in got.items()} == want


def test_a_datasets_folder_with_splits_and_limits(files):
    assert len(read_rows(DataSourceConfig(path=str(files["dict"]), split="test"), "test")) == 3
    assert len(read_rows(DataSourceConfig(path=str(files["jsonl"]), limit=2), "train")) == 2
    with pytest.raises(DataError, match=r"data.train.split: .* holds the splits test, train; name one"):
        read_rows(DataSourceConfig(path=str(files["dict"])), "train")
    with pytest.raises(DataError, match=r"'valid' is not in .* \(it has test, train\)"):
        read_rows(DataSourceConfig(path=str(files["dict"]), split="valid"), "train")


def test_unreadable_sources_are_one_clear_error(tmp_path, files):
    with pytest.raises(DataError, match=r"data.test.path: no such file"):
        read_rows(DataSourceConfig(path=str(tmp_path / "missing.jsonl")), "test")
    (tmp_path / "rows.txt").write_text("x")
    with pytest.raises(DataError, match=r"data.train.format: cannot tell the format .* json \(also JSONL\), parquet"):
        read_rows(DataSourceConfig(path=str(tmp_path / "rows.txt")), "train")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n{not json\n{"prompt": "c"}\n')
    bad = tmp_path / "bad.jsonl"
    with pytest.raises(
        DataError,
        match=rf"^data.train.path: .*bad.jsonl' could not be read as json: {bad}:4:2: not valid "
        r"JSON: Expecting property name enclosed in double quotes$",
    ):
        read_rows(DataSourceConfig(path=str(bad)), "train")
    (tmp_path / "list.jsonl").write_text('{"prompt": "a"}\n["b"]\n')
    with pytest.raises(DataError, match=r"list.jsonl:2: a JSONL row must be a JSON object .* got list"):
        read_rows(DataSourceConfig(path=str(tmp_path / "list.jsonl")), "train")
    (tmp_path / "array.json").write_text('[\n  {"prompt": "a"},\n  {"prompt": b}\n]\n')
    with pytest.raises(DataError, match=r"array.json:3:14: not valid JSON: Expecting value$"):
        read_rows(DataSourceConfig(path=str(tmp_path / "array.json")), "train")
    for name, text in (("empty.jsonl", ""), ("blank.jsonl", "\n  \n"), ("empty.csv", "")):
        (tmp_path / name).write_text(text)
        with pytest.raises(
            DataError, match=rf"^data.validation.path: '.*{name}' is empty: a split needs at least one row$"
        ):
            read_rows(DataSourceConfig(path=str(tmp_path / name)), "validation")


def test_epochs_visit_every_row_once_in_a_new_order_each_time():
    order = EpochOrder(10, seed=3)
    epochs = [[order.row_index(e * 10 + k) for k in range(10)] for e in range(3)]
    assert all(sorted(e) == list(range(10)) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2]
    assert epochs == [[EpochOrder(10, seed=3).row_index(e * 10 + k) for k in range(10)] for e in range(3)]
    assert [EpochOrder(4, shuffle=False).row_index(i) for i in range(6)] == [0, 1, 2, 3, 0, 1]
    assert EpochOrder(10, seed=4).permutation(0) != order.permutation(0)


def test_rows_become_a_messages_input(tmp_path):
    spec = DataInputConfig(prompt="prompt", system="Be brief.", state={"target": "answer"})
    graph_file = load_graph_file(ROOT / "graphs" / "calculator.py")  # no make_input: the mapping is used
    to_input = input_maker(graph_file, spec, ["prompt", "answer"], "train")
    state = to_input({"prompt": "What is 2 + 2?", "answer": "4"})
    assert state == {"messages": [SystemMessage("Be brief."), HumanMessage("What is 2 + 2?")], "target": "4"}
    chat = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "2+2?"},
    ]
    state = to_input({"prompt": chat, "answer": "4"})
    assert [type(m) for m in state["messages"]] == [SystemMessage, HumanMessage, AIMessage, HumanMessage]
    with pytest.raises(
        DataError,
        match=r"data.input.prompt: column 'question' is not in data.train \(its columns: "
        r"prompt, answer\); name the column",
    ):
        input_maker(graph_file, DataInputConfig(prompt="question"), ["prompt", "answer"], "train")
    with pytest.raises(ValueError, match="must hold a string or a non-empty list"):
        to_input({"prompt": 3, "answer": "4"})


def test_make_input_of_a_row_or_of_a_seed():
    def of_row(row: dict) -> dict:
        return {"messages": [HumanMessage(row["q"])]}

    def of_seed(seed: int) -> dict:
        return {}

    def of_index(i: int) -> dict:
        return {}

    assert makes_input_from_row(of_row)
    assert not makes_input_from_row(of_seed) and not makes_input_from_row(of_index) and not makes_input_from_row(None)


def test_load_tasks_plays_training_rows_in_epochs_and_evaluation_rows_in_order(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", ROWS)
    test = write_jsonl(tmp_path / "test.jsonl", [{"prompt": "What is 100 + 1?", "answer": "101", "tags": []}])
    config = load_config(
        ROOT / "configs" / "calculator.yaml",
        [f"data.train={train}", f"data.test={test}", "data.validation=null", "data.seed=5"],
    )
    graph_file = load_graph_file(config.multi_turn.langgraph.path)
    tasks = load_tasks(config, graph_file, "train")
    assert isinstance(tasks, RowTasks) and tasks.size == 7
    order = EpochOrder(7, seed=5)
    assert [tasks.key(i) for i in range(14)] == [order.row_index(i) for i in range(14)]
    assert tasks.task(3).row == ROWS[order.row_index(3)]
    assert tasks.task(3).input["messages"][0].content == ROWS[order.row_index(3)]["prompt"]
    in_order = load_tasks(config, graph_file, "train", in_order=True)
    assert [in_order.key(i) for i in range(7)] == list(range(7))
    evaluation = load_tasks(config, graph_file, "test")
    assert evaluation.size == 1 and evaluation.row(0)["answer"] == "101"
    with pytest.raises(DataError, match=r"data.validation is not set"):
        load_tasks(config, graph_file, "validation")


def test_shared_rows_are_counted(tmp_path):
    a = read_rows(DataSourceConfig(path=str(write_jsonl(tmp_path / "a.jsonl", ROWS))), "train")
    b = read_rows(
        DataSourceConfig(
            path=str(write_jsonl(tmp_path / "b.jsonl", ROWS[2:4] + [{"prompt": "x", "answer": "y", "tags": []}]))
        ),
        "test",
    )
    assert shared_rows(a, b) == 2


def test_shipped_calculator_splits_are_disjoint():
    config = load_config(ROOT / "configs" / "calculator.yaml")
    train = split_rows(config, "train")
    sizes = {s: len(split_rows(config, s)) for s in ("train", "validation", "test")}
    assert sizes == {"train": 1000, "validation": 64, "test": 200}
    assert (
        shared_rows(train, split_rows(config, "test")) == 0
        and shared_rows(train, split_rows(config, "validation")) == 0
    )


def test_config_paths_resolve_from_the_config_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the project: paths are found from configs/calculator.yaml's folder
    config = load_config(ROOT / "configs" / "calculator.yaml")
    assert Path(config.data.train.path).resolve() == ROOT / "data" / "calculator" / "train.jsonl"
    assert Path(config.reward.functions[0].function.rpartition(":")[0]).is_file()
    assert DataConfig.model_validate({"train": "x.jsonl"}).train.path == "x.jsonl"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            'prompt,answer\n"What is 1 + 1?",2\nWhat is 2, 2?,4\n',
            r":3: 3 fields, but the header names 2 \(prompt, answer\)",
        ),
        ('prompt,answer\nWhat is 1 + 1?,2\n"What is 2 + 2?,4\nlast,5\n', r":3: a quoted field is never closed"),
        (b"prompt,answer\nWhat is 1 + 1?,2\nWhat is \xe9?,3\n", r":3: not UTF-8 text \(byte 0xe9\)"),
    ],
    ids=["fields", "quote", "encoding"],
)
def test_a_csv_file_that_cannot_be_read_names_the_file_line_and_cause(tmp_path, capsys, text, problem):
    """``verlog rollout`` on rows from a broken CSV file: one ``error:`` line naming the split, the
    file, the line and what is wrong with it."""
    from verlog.cli import main

    rows = tmp_path / "rows.csv"
    rows.write_bytes(text if isinstance(text, bytes) else text.encode())
    config = ROOT / "configs" / "calculator.yaml"
    assert main(["rollout", str(config), "model.path=tiny", f"data.train={rows}", "--episodes", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"error: data.train.path: {str(rows)!r} could not be read as csv: {rows}")
    assert re.search(problem, err), err


def test_eval_on_a_config_with_validation_rows_alone_plays_them_and_says_so(tmp_path, capsys):
    """``verlog eval`` on a config whose only evaluation split is validation: its rows are played
    (the default split, test, has no file), and the console says which split it played; a split
    asked for by name (``--split test``) that has no file is still refused in one line."""
    from verlog.cli import main

    rows = write_jsonl(tmp_path / "validation.jsonl", [{"prompt": f"What is {i} + 1?"} for i in range(2)])
    config = tmp_path / "only_validation.yaml"
    config.write_text(
        f"model: {{path: tiny}}\nmulti_turn:\n  langgraph: {{path: {ROOT / 'graphs' / 'calculator.py'}}}\n"
        f"data:\n  validation: {rows}\nsampling: {{max_tokens: 4}}\n"
    )
    out = tmp_path / "out"
    assert main(["eval", str(config), "--out", str(out), "--no-chart"]) == 0
    said = capsys.readouterr().out
    assert "data.test is not set: playing the rows of data.validation" in " ".join(said.split())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows"]["calculator"]["split"] == "validation"
    assert main(["eval", str(config), "--split", "test", "--out", str(out), "--no-chart"]) == 2
    assert "data.test is not set" in capsys.readouterr().err
