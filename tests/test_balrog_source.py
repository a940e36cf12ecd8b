"""The user's BALROG: its wording and TextWorld games, read verbatim from a BALROG checkout.

A folder laid out like BALROG (``tests/balrog_layout.py``, texts written for these tests) stands
in for a checkout: every game graph under ``protocol="balrog"`` must show its instruction as the
first message, end each newest observation with its answer rule, put its invalid-answer note
before the observation after a bad answer, and TextWorld must play its game files (a Z-machine
file as is, a Glulx one rebuilt from the ``.json`` beside it). ``verlog eval --balrog`` records
where the texts came from in ``summary.json``; without it the run says the wording is verlog's.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml
from balrog_layout import EXPECTED, NOTE, RULE, write_balrog_layout
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage

from verlog.envs.balrog_source import ENV_VAR, BalrogSource, BalrogSourceError, find_root, open_source
from verlog.envs.registry import make_env
from verlog.graph_file import load_graph_file

ROOT = Path(__file__).resolve().parents[1]
SEED = 1_000_000  # verlog eval's first seed: TextWorld game (seed + 1) % 2 = 1, the .z8 file


@pytest.fixture(scope="module")
def game(tmp_path_factory) -> Path:
    """A small TextWorld coin collector game, generated for the test (game.z8 + game.json)."""
    pytest.importorskip("textworld")
    from verlog.envs.textworld.games import build_game

    path, _ = build_game(
        "coin_collector", {"level": 5, "only_last_action": True}, 0, tmp_path_factory.mktemp("tw-cache")
    )
    return path


@pytest.fixture(scope="module")
def layout(tmp_path_factory, game: Path) -> Path:
    """The BALROG-like folder; TextWorld's coin collector has a Glulx stand-in (rebuilt from its
    .json) then a Z-machine copy of the same game: BALROG lists .ulx files first."""
    return write_balrog_layout(
        tmp_path_factory.mktemp("BALROG"), {"coin_collector": [(game, "level_5_a.ulx"), (game, "level_5_b.z8")]}
    )


@pytest.fixture(autouse=True)
def no_user_balrog(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setenv("VERLOG_CACHE", str(tmp_path / "cache"))  # Glulx rebuilds go to a fresh cache


class Recording(GenericFakeChatModel):
    """A fake chat model keeping every prompt it is given."""

    prompts: list = []

    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):  # type: ignore[override]
        self.prompts.append(messages)
        return await super()._agenerate(messages, stop=stop, run_manager=run_manager, **kwargs)


GAMES = {  # graph file, its settings, an answer BALROG's rule rejects (None: every answer is valid), the action run then
    "babyai": ("babyai", {"task": "goto"}, "forward!!", "go forward"),
    "babaisai": ("babaisai", {"task": "goto_win"}, "ACTION: up", "idle"),
    "crafter": ("crafter", {}, "move left", "Noop"),
    "textworld": ("textworld", {"game": "coin_collector"}, None, None),
    "minihack": ("minihack", {"task": "MazeWalk-9x9"}, "go north", "north"),
    "nethack": ("nethack", {}, "Quaff!!", "esc"),
}


def _expected_instruction(family: str, settings: dict) -> str:
    expected = EXPECTED[family]
    if family == "babyai":
        env = make_env("babyai:goto", protocol="balrog")
        env.reset(SEED)
        return expected.format(mission=env.mission)
    if family == "babaisai":
        return expected.format(task=settings["task"])
    if family == "textworld":
        return expected[settings["game"]]
    if family == "minihack":
        return expected.format(task=settings["task"])
    return expected


@pytest.mark.parametrize("family", list(GAMES))
async def test_prompts_equal_the_layouts_texts_verbatim(layout: Path, family: str) -> None:
    if family in ("minihack", "nethack"):
        pytest.importorskip("nle")
    if family == "minihack":
        pytest.importorskip("minihack")
    graph_name, settings, invalid, default = GAMES[family]
    answers = [invalid or "look", "look" if family == "textworld" else "x"]
    model = Recording(messages=iter(AIMessage(a) for a in answers))
    model.prompts = []
    graph = load_graph_file(ROOT / "graphs" / f"{graph_name}.py").build(
        model, protocol="balrog", max_steps=2, balrog_source=str(layout), **settings
    )
    state = await asyncio.wait_for(graph.ainvoke({"seed": SEED}), 120)
    first, second = model.prompts
    assert first[0] == HumanMessage(_expected_instruction(family, settings))
    assert first[-1].content.endswith(f"\n\n{RULE}") and second[-1].content.endswith(f"\n\n{RULE}")
    if invalid is not None:
        note = NOTE.format(action=default)
        assert note in second[-1].content
        assert state["history"][1][0].startswith(note)  # the note heads what the history keeps, as in BALROG
    else:
        assert "[fixture]" not in second[-1].content
        assert state["info"]["game_file"] == "level_5_b.z8"  # BALROG's game file, not verlog's pool


def test_textworld_plays_the_layouts_games_in_balrogs_order(layout: Path, game: Path) -> None:
    pytest.importorskip("textworld")
    from verlog.envs.textworld.env import TextWorldTextEnv, TextWorldWalkthroughAgent

    source = BalrogSource(layout)
    files = source.textworld_games("coin_collector")
    assert [f.name for f in files] == ["level_5_a.ulx", "level_5_b.z8"]  # Glulx first, as BALROG globs
    env = TextWorldTextEnv("coin_collector", protocol="balrog", game_files=files)
    assert env.pool_size == 2 and env.game_index(SEED) == 1 and env.game_index(SEED + 1) == 0
    objective = json.loads(game.with_suffix(".json").read_text())["objective"]
    for seed, name in ((SEED, "level_5_b.z8"), (SEED + 1, "level_5_a.ulx")):
        observation = env.reset(seed)
        assert env.game_file is not None and env.game_file.name == name
        assert env.objective == objective.strip()  # the layout's game (the Glulx one rebuilt from its .json)
        agent = TextWorldWalkthroughAgent(env)
        agent.reset()
        result = None
        while result is None or not result.done:
            result = env.step(agent.act(observation))
            observation = result.observation
        assert result.info["won"] and result.info["game_file"] == name
    with pytest.raises(ValueError, match="pool_size is the number of game_files"):
        TextWorldTextEnv("coin_collector", protocol="balrog", game_files=files, pool_size=25)
    with pytest.raises(ValueError, match="protocol='balrog'"):
        TextWorldTextEnv("coin_collector", game_files=files)


def test_a_glulx_game_without_its_json_is_refused(tmp_path: Path) -> None:
    from verlog.envs.textworld.games import zmachine_game

    lone = tmp_path / "lone.ulx"
    lone.write_bytes(b"Glul")
    with pytest.raises(ValueError, match="Glulx game, which TextWorld 1.7 cannot play, and no lone.json"):
        zmachine_game(lone)


def test_what_is_not_balrog_is_refused_in_one_line(tmp_path: Path, layout: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(BalrogSourceError, match="is not BALROG .* no balrog/agents/naive.py"):
        find_root(tmp_path / "empty")
    with pytest.raises(BalrogSourceError, match="does not exist"):
        find_root(tmp_path / "nowhere")
    assert find_root(layout / "balrog") == layout.resolve()  # the package folder works too
    broken = write_balrog_layout(tmp_path / "broken")
    (broken / "balrog/environments/nle/__init__.py").unlink()
    with pytest.raises(BalrogSourceError, match="balrog/environments/nle/__init__.py is missing"):
        BalrogSource(broken)
    odd = write_balrog_layout(tmp_path / "odd")
    (odd / "balrog/agents/naive.py").write_text("RULE = 'no naive_instruction here'\n")
    (odd / "balrog/evaluator.py").write_text("note = f'{action}'\n")
    with pytest.raises(BalrogSourceError, match="no naive_instruction text"):
        _ = BalrogSource(odd).answer_rule
    with pytest.raises(BalrogSourceError, match="no invalid-answer note"):
        BalrogSource(odd).invalid_note("north")
    with pytest.raises(BalrogSourceError, match="no TextWorld games for 'treasure_hunter'"):
        BalrogSource(layout).textworld_games("treasure_hunter")


def test_provenance_names_every_file_and_follows_their_content(tmp_path: Path, layout: Path) -> None:
    source = BalrogSource(layout)
    provenance = source.provenance()
    assert provenance["path"] == str(layout.resolve())
    assert source.rule_files() == []  # the layout has only what verlog reads
    assert set(provenance["files"]) == {str(p) for p in source.text_files()} | {
        "tw_games/coin_collector/level_5_a.ulx",
        "tw_games/coin_collector/level_5_a.json",
        "tw_games/coin_collector/level_5_b.z8",
        "tw_games/coin_collector/level_5_b.json",
    }
    assert provenance["textworld_games"] == {"coin_collector": 2} and len(provenance["sha256"]) == 64
    copy = write_balrog_layout(tmp_path / "copy")
    before = BalrogSource(copy).provenance()["sha256"]
    opened = open_source({"path": str(copy), "sha256": before})
    assert opened is not None and opened.answer_rule == RULE
    rule = copy / "balrog/agents/naive.py"
    rule.write_text(rule.read_text().replace("one action", "a single action"))
    assert BalrogSource(copy).provenance()["sha256"] != before
    assert BalrogSource(copy).answer_rule == "FIXTURE RULE: answer with a single action, nothing more."
    # BALROG's code whose rules verlog plays by (a wrapper, NetHack's achievements) is hashed too
    edited = BalrogSource(copy).provenance()["sha256"]
    wrapper = copy / "balrog/environments/textworld/base.py"
    wrapper.write_text("def filter_objective(obs, info):\n    return obs.split(info['objective'])[-1].strip()\n")
    (copy / "balrog/environments/nle/achievements.json").write_text('{"dlvl": [1, 2]}')
    (copy / "balrog/environments/nle/Tiles16x16.png").write_bytes(b"an image decides no text")
    source = BalrogSource(copy)
    assert [str(p) for p in source.rule_files()] == [
        "balrog/environments/textworld/base.py",
        "balrog/environments/nle/achievements.json",
    ]
    assert set(source.rule_files()) <= {Path(name) for name in source.provenance()["files"]}
    assert source.provenance()["sha256"] != edited
    wrapper.write_text(wrapper.read_text() + "# changed\n")
    assert BalrogSource(copy).provenance()["sha256"] != source.provenance()["sha256"]


def test_resuming_after_a_games_json_was_edited_is_refused_naming_it(tmp_path: Path, game: Path, capsys) -> None:
    """The ``.json`` beside a TextWorld game decides its text (the Glulx game is rebuilt from it;
    TextWorld reads a Z-machine game's goal from it): editing a room's description changes the
    digest, and the same ``--out`` refuses the episodes played before, naming the file."""
    from verlog.cli import main

    copy = write_balrog_layout(
        tmp_path / "BALROG", {"coin_collector": [(game, "level_5_a.ulx"), (game, "level_5_b.z8")]}
    )
    suite = tmp_path / "tw.yaml"
    suite.write_text(
        yaml.safe_dump(
            {
                "textworld": {
                    "config": str(ROOT / "configs" / "textworld.yaml"),
                    "overrides": {"rollout.episode_timeout_s": None},
                    "graph_kwargs": {"protocol": "balrog", "history_turns": 16, "max_tokens": 8192, "max_steps": 80},
                    "tasks": [{"name": "coin_collector", "graph_kwargs": {"game": "coin_collector"}}],
                }
            }
        )
    )
    run = [
        "eval",
        "--suite",
        str(suite),
        "model.path=tiny",
        "--episodes",
        "1",
        "--no-chart",
        "--balrog",
        str(copy),
        "--graph-kwargs",
        '{"max_steps": 1, "max_tokens": 4}',
        "--out",
        str(tmp_path / "out"),
    ]
    before = BalrogSource(copy).provenance()
    assert main(run) == 0
    assert json.loads((tmp_path / "out" / "balrog_source.json").read_text()) == before
    capsys.readouterr()
    description = copy / "tw_games/coin_collector/level_5_a.json"
    data = json.loads(description.read_text())
    data["objective"] = data["objective"] + " Edited."
    description.write_text(json.dumps(data))
    assert BalrogSource(copy).provenance()["sha256"] != before["sha256"]
    assert main(run) == 2
    said = capsys.readouterr()
    message = said.out + said.err
    assert (
        f"played with other settings (the BALROG files at {copy.resolve()} changed since they were played: "
        "tw_games/coin_collector/level_5_a.json;"
    ) in " ".join(message.split())
    assert "model, sampling or graph" not in message and "Traceback" not in message
    assert main([*run[:-1], str(tmp_path / "out"), "--fresh"]) == 0  # --fresh discards them, as the message says
    assert json.loads((tmp_path / "out" / "balrog_source.json").read_text())["sha256"] != before["sha256"]
    capsys.readouterr()
    no_balrog = [a for i, a in enumerate(run) if a != "--balrog" and run[i - 1] != "--balrog"]
    assert main(no_balrog) == 2
    said = capsys.readouterr()
    assert "(BALROG's own wording and games, read from" in " ".join((said.out + said.err).split())


def test_the_environment_variable_names_the_users_balrog(monkeypatch, layout: Path) -> None:
    assert open_source(None) is None  # no BALROG given: verlog's wording
    monkeypatch.setenv(ENV_VAR, str(layout))
    source = open_source(None)
    assert source is not None and source.root == layout.resolve()
    model = Recording(messages=iter([AIMessage("Do")]))
    model.prompts = []
    graph = load_graph_file(ROOT / "graphs" / "crafter.py").build(model, protocol="balrog", max_steps=1)
    asyncio.run(graph.ainvoke({"seed": 3}))
    assert model.prompts[0][0].content == EXPECTED["crafter"]
    with pytest.raises(Exception, match="balrog_source applies to protocol='balrog' only"):
        load_graph_file(ROOT / "graphs" / "crafter.py").build(model, balrog_source=str(layout))


def _mini_suite(tmp_path: Path) -> Path:
    suite = tmp_path / "mini.yaml"
    suite.write_text(
        yaml.safe_dump(
            {
                "babyai": {
                    "config": str(ROOT / "configs" / "babyai.yaml"),
                    "overrides": {"rollout.episode_timeout_s": None},
                    "graph_kwargs": {"protocol": "balrog", "history_turns": 16, "max_tokens": 8192, "max_steps": None},
                    "tasks": [{"name": "goto", "graph_kwargs": {"task": "goto"}}],
                },
                "crafter": {
                    "config": str(ROOT / "configs" / "crafter.yaml"),
                    "overrides": {"rollout.episode_timeout_s": None},
                    "graph_kwargs": {"protocol": "balrog", "history_turns": 16, "max_tokens": 8192, "max_steps": 2000},
                },
            }
        )
    )
    return suite


def test_eval_records_the_wordings_source_in_the_summary(tmp_path: Path, layout: Path, capsys) -> None:
    from verlog.cli import main

    suite = _mini_suite(tmp_path)
    common = [
        "eval",
        "--suite",
        str(suite),
        "model.path=tiny",
        "--episodes",
        "1",
        "--no-chart",
        "--graph-kwargs",
        '{"max_steps": 2, "max_tokens": 4}',
    ]
    assert main([*common, "--balrog", str(layout), "--out", str(tmp_path / "balrog")]) == 0
    said = capsys.readouterr().out
    provenance = BalrogSource(layout).provenance()
    assert f"wording: BALROG's own, read from {layout.resolve()} (sha256 {provenance['sha256'][:12]})" in said
    summary = json.loads((tmp_path / "balrog" / "summary.json").read_text())
    assert summary["balrog_wording"] == "balrog" and summary["balrog_source"] == provenance
    assert summary["not_the_suites_protocol"] == ["max_steps", "max_tokens"]
    records = [json.loads(line) for line in (tmp_path / "balrog" / "episodes.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["status"] == "ok" for r in records)

    assert main([*common, "--out", str(tmp_path / "verlog")]) == 0
    said = capsys.readouterr().out
    assert "wording: verlog's" in said and "--balrog PATH" in said
    summary = json.loads((tmp_path / "verlog" / "summary.json").read_text())
    assert summary["balrog_wording"] == "verlog" and "balrog_source" not in summary
    # without --balrog the prompts are verlog's paraphrase: flagged like any other difference
    assert summary["not_the_suites_protocol"] == ["balrog_source", "max_steps", "max_tokens"]
    assert (
        "not the suite's protocol: balrog_source, max_steps, max_tokens differ from it (balrog_source: no --balrog"
        in said
    )
    assert "evaluation of tiny (not the suite's protocol)" in said  # the score table is marked

    assert main([*common, "--balrog", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x")]) == 2
    said = capsys.readouterr()
    assert "error: --balrog: BALROG folder" in said.out + said.err and "Traceback" not in said.out + said.err


def test_play_shows_the_users_balrog_wording(layout: Path) -> None:
    from verlog.envs.play import play

    lines: list[str] = []
    play(
        "babyai:goto",
        seed=SEED,
        agent="bot",
        max_steps=3,
        print_fn=lines.append,
        protocol="balrog",
        balrog_source=str(layout),
    )
    assert lines[0].endswith(_expected_instruction("babyai", {}))
    assert lines[1].endswith(f"\n\n{RULE}")
