"""Loading graph files: the shipped graphs load; a file lacking the factory says so."""

import re
from pathlib import Path

import pytest

from verlog.graph_file import GraphFileError, load_graph_file

ROOT = Path(__file__).resolve().parents[1]


#: shipped graphs whose episodes come from a dataset's rows (their configs' data section), not seeds
DATASET_GRAPHS = {"calculator"}


def test_shipped_graph_files_expose_factory_and_inputs():
    for path in sorted((ROOT / "graphs").glob("*.py")):
        graph_file = load_graph_file(path)
        assert callable(graph_file.build_graph), path
        if path.stem in DATASET_GRAPHS:
            imports = re.findall(r"^\s*(?:from|import)\s+verlog\b", path.read_text(), re.MULTILINE)
            assert graph_file.make_input is None and not imports  # production code: nothing of verlog
            continue
        assert graph_file.episode_input(0) == graph_file.episode_input(0)  # seeded, deterministic


def test_missing_factory(tmp_path):
    path = tmp_path / "nofactory.py"
    path.write_text("def make_graph(model):\n    return None\n")
    with pytest.raises(GraphFileError, match=r"has no build_graph\(model, \*\*kwargs\) function"):
        load_graph_file(path)


def test_missing_file_and_import_error(tmp_path):
    with pytest.raises(GraphFileError, match="does not exist"):
        load_graph_file(tmp_path / "nope.py")
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere\n")
    with pytest.raises(GraphFileError, match="failed to import: ModuleNotFoundError"):
        load_graph_file(broken)


def test_factory_returning_uncompiled_graph(tmp_path):
    path = tmp_path / "uncompiled.py"
    path.write_text(
        "from langgraph.graph import StateGraph, MessagesState\n"
        "def build_graph(model):\n    return StateGraph(MessagesState)\n"
    )
    with pytest.raises(GraphFileError, match="did you forget .compile"):
        load_graph_file(path).build(model=None)


def test_bad_graph_kwargs_and_missing_make_input(tmp_path):
    path = tmp_path / "strict.py"
    path.write_text("def build_graph(model, depth: int = 1):\n    return None\n")
    graph_file = load_graph_file(path)
    with pytest.raises(GraphFileError, match=r"build_graph\(model, depth\) rejected graph_kwargs \['width'\]"):
        graph_file.build(model=None, width=3)
    with pytest.raises(GraphFileError, match=r"defines no make_input\(seed\)"):
        graph_file.episode_input(0)


def test_build_graph_that_raises_is_a_graph_file_error(tmp_path):
    path = tmp_path / "raising.py"
    path.write_text(
        "def build_graph(model, task='goto'):\n    raise ValueError(f'unknown task {task!r}\\nvalid: goto, pickup')\n"
    )
    with pytest.raises(GraphFileError) as info:
        load_graph_file(path).build(model=None, task="fly")
    message = str(info.value)
    assert message == f"{path}: build_graph(task='fly') raised ValueError: unknown task 'fly'; valid: goto, pickup"
    assert isinstance(info.value.__cause__, ValueError)  # the original stays reachable


def test_a_missing_make_input_is_caught_before_any_episode(tmp_path):
    path = tmp_path / "noinput.py"
    path.write_text("def build_graph(model):\n    return None\n")
    graph_file = load_graph_file(path)
    with pytest.raises(GraphFileError, match=r"defines no make_input\(seed\).*def make_input\(seed: int\)"):
        graph_file.require_make_input()
    with pytest.raises(GraphFileError):  # handing the method to a runner already fails
        runner_gets = graph_file.episode_input  # noqa: F841
