"""A user's mistakes through the real command line (``verlog.cli.main``, stderr captured): each is
one ``error:`` line and exit status 2; and what used to be a mistake but is a reasonable request
now works: a Hugging Face hub id as ``model.path`` (from the local cache, offline), a training run
folder as ``model.path`` (its latest actor), a graph file outside ``graphs/`` importing its
neighbours, ``verlog serve --state-dir`` with a relative path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from langgraph_server import free_port, running
from test_cli_errors import COMMANDS, GRAPH, command, one_error_line

from verlog.cli import main

ROOT = Path(__file__).resolve().parents[1]


def neighbour_graph(folder: Path, *, raise_in_input: bool = False) -> Path:
    """``test_cli_errors``' graph file, put in ``folder`` (not a ``graphs/`` folder) and importing
    its prompt from ``prompts_beside.py`` beside it; its ``make_input`` raises if told to."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prompts_beside.py").write_text('PROMPT = "Say yes."\n')
    text = "from prompts_beside import PROMPT\n" + GRAPH.format(build="pass", node="pass")
    text = text.replace('model.ainvoke("Say yes.")', "model.ainvoke(PROMPT)")
    if raise_in_input:
        text = text.replace(
            "def make_input(seed):\n", 'def make_input(seed):\n    raise RuntimeError("no task for this seed")\n'
        )
    path = folder / "my_agent.py"
    path.write_text(text)
    assert "PROMPT)" in text and ("RuntimeError" in text) == raise_in_input
    return path


@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache, offline."""
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def hub_cache_with_toy(cache: Path, repo_id: str = "verlog-test/toy-words") -> str:
    """Lay the toy model out in ``cache`` as the hub does: ``models--org--name/blobs/`` holding the
    files, ``snapshots/<revision>/`` linking them, ``refs/main`` naming the revision."""
    from verlog.models import toy_model_dir

    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot, blobs = repo / "snapshots" / revision, repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    for i, source in enumerate(sorted(p for p in toy_model_dir().iterdir() if p.is_file())):
        shutil.copy(source, blobs / f"blob{i}")
        os.symlink(f"../../blobs/blob{i}", snapshot / source.name)
    return repo_id


# ---------------------------------------------------------------------- model.path


@pytest.mark.parametrize("kind", COMMANDS)
@pytest.mark.parametrize("spec", ["Qwen/Qwen2.5-0.5B-Instruct", "no-such-model"])
def test_a_model_path_that_names_nothing_is_one_line(kind, spec, tmp_path, capsys, empty_hub_cache):
    assert main(command(kind, tmp_path, f"model.path={spec}")) == 2
    line = one_error_line(capsys)
    assert repr(spec) in line and "'tiny'" in line and "Hugging Face hub id" in line
    assert str(empty_hub_cache) in line and "HF_HUB_OFFLINE" in line


@pytest.mark.parametrize("kind", ["rollout", "train", "eval"])
def test_a_hub_id_loads_from_the_local_cache_offline(kind, tmp_path, capsys, empty_hub_cache):
    repo_id = hub_cache_with_toy(empty_hub_cache)
    assert main(command(kind, tmp_path, f"model.path={repo_id}")) == 0, capsys.readouterr().err
    if kind == "train":  # the run records the snapshot it trained from
        saved = (tmp_path / "run" / "config.yaml").read_text()
        assert "models--verlog-test--toy-words/snapshots/" in saved


def test_a_run_folder_as_model_path_means_its_latest_actor(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(command("train", tmp_path)) == 0
    actor = run / "checkpoints" / "update_000001" / "actor"
    assert actor.is_dir()
    capsys.readouterr()
    for kind in COMMANDS:  # train starts a new run from it, rollout and eval play it
        assert main(command(kind, tmp_path / kind, f"model.path={run}")) == 0, (kind, capsys.readouterr().err)
    saved = (tmp_path / "train" / "run" / "config.yaml").read_text()
    assert str(actor) in saved
    # a checkpoint folder too
    assert main(command("rollout", tmp_path, f"model.path={actor.parent}")) == 0


def test_a_run_folder_without_checkpoint_as_model_path_is_one_line(tmp_path, capsys):
    (tmp_path / "empty_run" / "checkpoints").mkdir(parents=True)
    assert main(command("rollout", tmp_path, f"model.path={tmp_path / 'empty_run'}")) == 2
    assert "no checkpoint in" in one_error_line(capsys)


# ---------------------------------------------------------------------- graph files


@pytest.mark.parametrize("kind", ["rollout", "eval"])
def test_make_input_that_raises_is_one_line(kind, tmp_path, capsys):
    path = neighbour_graph(tmp_path / "agent", raise_in_input=True)
    assert main(command(kind, tmp_path, f"multi_turn.langgraph.path={path}")) == 2
    line = one_error_line(capsys)
    assert "RuntimeError: no task for this seed" in line
    assert ("make_input(" in line and str(path) in line) if kind == "rollout" else "every episode" in line


def test_a_graph_outside_graphs_imports_its_neighbours(tmp_path, capsys):
    path = neighbour_graph(tmp_path / "agent")
    before = list(sys.path)
    assert main(command("rollout", tmp_path, f"multi_turn.langgraph.path={path}")) == 0, capsys.readouterr().err
    assert sys.path == before  # its folder was on sys.path while it loaded, not after
    sys.modules.pop("prompts_beside", None)


# ---------------------------------------------------------------------- --resume


def test_resume_after_changing_num_envs_or_lora_is_one_line(tmp_path, capsys):
    assert main(command("train", tmp_path)) == 0
    capsys.readouterr()
    assert main([*command("train", tmp_path), "trainer.num_envs=4", "trainer.total_updates=2", "--resume"]) == 2
    line = one_error_line(capsys)
    assert "trainer.num_envs" in line and "state.json" in line
    # the same run resumed with LoRA adapters where it saved a full actor (checked before anything loads)
    assert main([*command("train", tmp_path), "actor.lora.rank=4", "trainer.total_updates=2", "--resume"]) == 2
    line = one_error_line(capsys)
    assert "actor.lora.rank: update_000001 holds a full actor but actor.lora.rank is 4" in line
    # ... and with another estimator: refused in one line, the run's config.yaml and checkpoint untouched
    run = tmp_path / "run"
    saved = (run / "config.yaml").read_text()
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir()) if (run / "checkpoints").is_dir() else None
    assert "estimator: gae" in saved
    for other in ("grpo", "rloo"):
        args = [
            *command("train", tmp_path),
            f"algorithm.estimator={other}",
            "trainer.group_size=2",
            "trainer.total_updates=2",
            "--resume",
        ]
        assert main(args) == 2
        line = one_error_line(capsys)
        assert line == (
            f"error: algorithm.estimator: the run in {str(run)!r} was trained with 'gae', not {other!r}: "
            "resume with algorithm.estimator=gae (or start a new run in another trainer.run_dir)"
        )
    assert (run / "config.yaml").read_text() == saved
    if checkpoints is not None:
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == checkpoints
    # a config.yaml edited by hand does not hide it: the checkpoint holds a critic grpo does not have
    (run / "config.yaml").write_text(saved.replace("estimator: gae", "estimator: grpo"))
    assert (
        main(
            [
                *command("train", tmp_path),
                "algorithm.estimator=grpo",
                "trainer.group_size=2",
                "trainer.total_updates=2",
                "--resume",
            ]
        )
        == 2
    )
    assert "algorithm.estimator: update_000001 holds a critic but 'grpo' has none" in one_error_line(capsys)


@pytest.mark.parametrize("what", ["missing", "empty"])
def test_resume_without_a_checkpoint_refuses(what, tmp_path, capsys):
    run = tmp_path / "run"
    if what == "empty":
        run.mkdir()
    assert main([*command("train", tmp_path), "--resume"]) == 2
    line = one_error_line(capsys)
    assert "trainer.run_dir: --resume" in line and "no checkpoint" in line and str(run) in line
    assert not (run / "config.yaml").exists() and not (run / "metrics.jsonl").exists()  # nothing written


def test_resume_over_an_earlier_run_without_checkpoint_refuses(tmp_path, capsys):
    """A folder with an earlier run's log but no checkpoint: --resume names what it found and
    leaves it as it was (it used to delete the log and start afresh there)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"update": 1}\n')
    assert main([*command("train", tmp_path), "--resume"]) == 2
    line = one_error_line(capsys)
    assert "holds metrics.jsonl of an earlier run but no checkpoint" in line and str(run) in line
    assert (run / "metrics.jsonl").read_text() == '{"update": 1}\n' and not (run / "config.yaml").exists()


# ---------------------------------------------------------------------- verlog serve


def test_serve_takes_a_relative_state_dir(tmp_path):
    """``verlog serve --state-dir state/here`` from the user's folder: the server (which runs in the
    state folder) finds its ``langgraph.json`` and keeps its threads there."""
    pytest.importorskip("langgraph_api")
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "verlog.cli",
        "serve",
        str(ROOT / "graphs" / "guess_number.py"),
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--model",
        "x",
        "--port",
        str(port),
        "--state-dir",
        "state/here",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with running(cmd, env, tmp_path, port, tmp_path / "serve.log"):
        assert (tmp_path / "state" / "here" / "langgraph.json").is_file()
    assert f"threads kept in {tmp_path / 'state' / 'here' / 'threads.sqlite'}" in (tmp_path / "serve.log").read_text()


# ---------------------------------------------------------------------- --help


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["serve", "--help"], ["rollout"]])
def test_help_and_usage_errors_do_not_load_torch(argv):
    """``verlog --help`` (and a command's help, a missing argument) answers without importing torch,
    transformers or LangChain: the commands import them when they run."""
    code = (
        "import sys\nfrom verlog.cli import main\ntry:\n    main(%r)\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'transformers', 'langchain_core') if m in sys.modules))"
    ) % (argv,)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_eval_help_still_lists_its_options(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    out = capsys.readouterr().out
    assert "--checkpoint" in out and "resumes an interrupted run" in out
