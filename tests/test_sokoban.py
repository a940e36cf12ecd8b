"""The Sokoban family: verl-agent's settings pinned, the rules, the generator and the oracle.

Settings are verl-agent's (langfengQ/verl-agent, read from a fork's snapshot: ``agent_system/
environments/env_package/sokoban/sokoban/env.py``, ``.../sokoban/projection.py``,
``agent_system/environments/prompts/sokoban.py``, ``agent_system/environments/env_manager.py``,
``verl/trainer/config/ppo_trainer.yaml``, ``examples/gigpo_trainer/run_sokoban.sh``), whose rewards
are gym-sokoban's (``gym_sokoban/envs/sokoban_env.py``). See docs/environments_sokoban.md.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from doc_pages import doc_commands

from verlog.envs import get_family, list_envs, make_env, play_steps
from verlog.envs.agent_graph import recursion_limit_for
from verlog.envs.sokoban import (
    ACTION_IDS,
    ACTIONS,
    DIM_ROOM,
    HELD_OUT_SEED_START,
    MAX_STEPS,
    NO_OP,
    NUM_BOXES,
    SEARCH_DEPTH,
    SYMBOLS,
    TRAIN_SEEDS,
    game,
    generate,
    parse_grid,
    render_grid,
    render_text,
    solve,
)
from verlog.envs.sokoban.generator import gen_steps
from verlog.graph_file import load_graph_file

ROOT = Path(__file__).resolve().parents[1]
HELD_OUT = range(HELD_OUT_SEED_START, HELD_OUT_SEED_START + 64)


# --------------------------------------------------------------------------------------------
# verl-agent's settings


def test_verl_agent_action_set_and_ids() -> None:
    # projection.py: up 1, down 2, left 3, right 4; "still"/unparsable is action 0 (nothing moves)
    assert ACTIONS == ("up", "down", "left", "right")
    assert ACTION_IDS == {"still": 0, "up": 1, "down": 2, "left": 3, "right": 4} and NO_OP == "still"
    assert game.DELTAS == {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


def test_verl_agent_rewards_and_limits() -> None:
    # gym-sokoban's rewards; ppo_trainer.yaml's env.sokoban; run_sokoban.sh's env.max_steps and
    # invalid_action_penalty_coef; gym-sokoban's num_gen_steps = int(1.7 * (h + w))
    assert (game.STEP_PENALTY, game.BOX_ON_TARGET, game.BOX_OFF_TARGET, game.FINISHED) == (-0.1, 1.0, -1.0, 10.0)
    assert DIM_ROOM == (6, 6) and NUM_BOXES == 1 and SEARCH_DEPTH == 30 and MAX_STEPS == 15
    assert gen_steps(DIM_ROOM) == 20
    env = make_env("sokoban")
    assert (env.dim_room, env.num_boxes, env.search_depth, env.max_steps) == ((6, 6), 1, 30, 15)
    assert env.invalid_action_penalty == pytest.approx(0.1)
    # env_manager / envs.py: training seeds below 2**16 - 1, validation seeds from 2**16
    assert TRAIN_SEEDS == range(0, 2**16 - 1) and HELD_OUT_SEED_START == 2**16


def test_verl_agent_text_symbols_and_layout() -> None:
    assert SYMBOLS == {
        "wall": "#",
        "floor": "_",
        "target": "O",
        "box_on_target": "√",
        "box": "X",
        "player": "P",
        "player_on_target": "S",
    }
    room, state = parse_grid("#####\n#PXO#\n#_√S#\n#####".replace("S", "O"))
    # a cell is " <symbol> \t", a row a line (verl-agent's text view)
    assert render_text(room, state).splitlines()[1] == " # \t P \t X \t O \t # \t"
    on_target = game.State((2, 3), state.boxes)
    assert render_grid(room, on_target) == "#####\n#_XO#\n#_√S#\n#####"


def test_family_is_registered_without_tasks() -> None:
    family = get_family("sokoban")
    assert "sokoban" in list_envs() and family.env_names() == ["sokoban"] and family.balrog is None
    with pytest.raises(ValueError, match="valid names: sokoban"):
        make_env("sokoban:hard")


# --------------------------------------------------------------------------------------------
# the rules


def test_push_walk_and_blocked_moves_with_rewards() -> None:
    room, state = parse_grid("######\n#P_XO#\n#__XO#\n######")
    out = game.step(room, state, "right")  # walk
    assert out.state.player == (1, 2) and out.reward == pytest.approx(-0.1) and out.moved
    out = game.step(room, out.state, "right")  # push a box onto its target; one box is still off
    assert out.state.boxes == ((1, 4), (2, 3)) and out.state.player == (1, 3) and not out.solved
    assert out.reward == pytest.approx(0.9)
    blocked = game.step(room, out.state, "right")  # box against the wall: nothing moves, still costs
    assert blocked.state == out.state and not blocked.moved and blocked.reward == pytest.approx(-0.1)
    wall = game.step(room, state, "up")
    assert wall.state == state and not wall.moved
    room2, state2 = parse_grid("#######\n#PXX_O#\n#____O#\n#######")
    assert not game.step(room2, state2, "right").moved  # a box cannot push another box
    assert game.step(room, state, NO_OP).reward == 0.0  # verl-agent's action 0 pays nothing


def test_box_off_target_and_finish_bonus() -> None:
    room, state = parse_grid("#####\n#P√_#\n#####")
    off = game.step(room, state, "right")
    assert off.reward == pytest.approx(-1.1) and not off.solved
    room, state = parse_grid("#####\n#PXO#\n#####")
    win = game.step(room, state, "right")
    assert win.solved and win.reward == pytest.approx(10.9)


def test_env_step_info_win_and_truncation() -> None:
    env = make_env("sokoban", max_steps=3)
    room, state = parse_grid("######\n#P_XO#\n######")
    env.reset_to(room, state)
    first = env.step("Walk first.\nACTION: right")
    assert first.info["action"] == "right" and first.info["valid_action"] and not first.done
    assert first.info["boxes_on_target"] == 0 and "success" not in first.info
    last = env.step("ACTION: push right")
    assert last.terminated and not last.truncated and last.reward == pytest.approx(10.9)
    assert last.info["success"] and last.info["won"] and last.info["progression"] == 1.0
    env.reset_to(room, state)
    results = [env.step("ACTION: left") for _ in range(3)]
    assert results[-1].truncated and not results[-1].terminated and results[-1].info["success"] is False
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("ACTION: up")


def test_invalid_answer_runs_still_with_the_penalty() -> None:
    env = make_env("sokoban", seed=HELD_OUT_SEED_START)
    observation = env.reset()
    res = env.step("I would rather fly.\nACTION: fly")
    assert res.info["action"] == NO_OP and res.info["valid_action"] is False and res.info["step"] == 1
    assert res.reward == pytest.approx(-0.1) and res.observation == observation
    other = make_env("sokoban", seed=HELD_OUT_SEED_START, invalid_action_penalty=0.5)
    other.reset()
    assert other.step("no idea").reward == pytest.approx(-0.5)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("dim_room", (3, 6)),
        ("num_boxes", 0),
        ("max_steps", 0),
        ("search_depth", -1),
        ("search_depth", [12, 1]),
        ("search_depth", [1, 4, 8]),
        ("search_depth", [4]),
        ("dim_room", "6x6"),
    ],
)
def test_bad_settings_name_the_key_and_allowed_values(key, value) -> None:
    with pytest.raises(ValueError, match=f"Sokoban setting {key}=.* is invalid; allowed: "):
        make_env("sokoban", **{key: value})


def test_a_depth_range_mixes_easy_rooms_with_hard_ones() -> None:
    """``search_depth: [low, high]`` draws each room's depth from the range by its seed: the
    same seed gives the same room, low depths give rooms a move or two from solved, and the
    rooms of one depth in the range are the rooms of that fixed depth."""
    mixed = make_env("sokoban", search_depth=[1, 12])
    lengths = []
    for seed in range(200):
        mixed.reset(seed)
        lengths.append(len(mixed.level.solution))
        again = make_env("sokoban", search_depth=(1, 12))
        again.reset(seed)
        assert again.level == mixed.level
    fixed = make_env("sokoban")  # verl-agent's 30
    hard = []
    for seed in range(200):
        fixed.reset(seed)
        hard.append(len(fixed.level.solution))
    assert sum(n <= 2 for n in lengths) > 2 * sum(n <= 2 for n in hard)
    assert max(lengths) >= 8  # the range's deep end is as hard as the default rooms
    single = make_env("sokoban", search_depth=[5, 5])
    single.reset(7)
    rng = random.Random(7)
    rng.randint(5, 5)
    assert single.level == generate(rng, (6, 6), 1, 5, 15)


def test_a_room_too_small_for_its_boxes_is_a_clear_error() -> None:
    env = make_env("sokoban", dim_room=(4, 4), num_boxes=3)
    with pytest.raises(RuntimeError, match=r"no Sokoban level with dim_room=\(4, 4\), num_boxes=3.*use a larger room"):
        env.reset(0)


def test_rgb_view() -> None:
    env = make_env("sokoban", seed=HELD_OUT_SEED_START)
    env.reset()
    image = env.image()
    assert image.shape == (96, 96, 3) and image.dtype == np.uint8
    r, c = env.state.player
    assert tuple(image[r * 16 + 8, c * 16 + 8]) == game.COLOURS["player"]
    br, bc = env.state.boxes[0]
    assert tuple(image[br * 16 + 8, bc * 16 + 8]) == game.COLOURS["box"]
    assert tuple(image[0, 0]) == game.COLOURS["wall"]


# --------------------------------------------------------------------------------------------
# the generator and the solver


def test_generation_is_deterministic_per_seed_and_varies_across_seeds() -> None:
    first = [render_grid(lv.room, lv.state) for lv in (generate(random.Random(s), max_steps=15) for s in range(20))]
    again = [render_grid(lv.room, lv.state) for lv in (generate(random.Random(s), max_steps=15) for s in range(20))]
    assert first == again and len(set(first)) >= 18
    a, b = make_env("sokoban", seed=7), make_env("sokoban", seed=7)
    assert [a.reset() for _ in range(3)] == [b.reset() for _ in range(3)]


@pytest.mark.parametrize("settings", [{}, {"num_boxes": 2, "dim_room": (7, 7), "max_steps": 40}])
def test_generated_rooms_are_solvable_within_the_cap(settings) -> None:
    max_steps = settings.get("max_steps", MAX_STEPS)
    for seed in range(40):
        level = generate(
            random.Random(seed),
            settings.get("dim_room", DIM_ROOM),
            settings.get("num_boxes", 1),
            SEARCH_DEPTH,
            max_steps,
        )
        room, state = level.room, level.state
        assert len(state.boxes) == len(room.targets) == settings.get("num_boxes", 1)
        assert not game.is_solved(room, state) and all(room.free(b) for b in state.boxes)
        assert all(cell in room.walls for cell in ((0, 0), (room.height - 1, room.width - 1)))
        assert 1 <= len(level.solution) <= max_steps and solve(room, state) == list(level.solution)
        for action in level.solution:  # the solution really wins
            state = game.step(room, state, action).state
        assert game.is_solved(room, state)


def test_solver_is_shortest_and_detects_dead_ends() -> None:
    room, state = parse_grid("######\n#P_XO#\n######")
    assert solve(room, state) == ["right", "right"]
    stuck_room, stuck = parse_grid("#####\n#X_O#\n#P__#\n#####")  # box in a corner
    assert solve(stuck_room, stuck) is None
    assert solve(room, state, max_depth=1) is None


def test_oracle_solves_64_held_out_levels() -> None:
    env = make_env("sokoban")
    family = get_family("sokoban")
    for seed in HELD_OUT:
        results = play_steps(env, family.bot(env), seed=seed)
        last = results[-1]
        assert last.terminated and last.info["success"] and len(results) <= MAX_STEPS, seed
        assert all(r.info["valid_action"] for r in results)
        assert sum(r.reward for r in results) == pytest.approx(10.0 + 1.0 - 0.1 * len(results))


# --------------------------------------------------------------------------------------------
# through the graph


async def _play(answers: list[str], seed: int, **graph_kwargs):
    from verlog.llm import VerlogChatModel
    from verlog.models import load_tokenizer
    from verlog.rollout import run_episode
    from verlog.testing.scripted_engine import ScriptedEngine

    tokenizer = load_tokenizer("tiny")
    graph_file = load_graph_file(ROOT / "graphs" / "sokoban.py")
    model = VerlogChatModel(engine=ScriptedEngine(tokenizer, answers), tokenizer=tokenizer, max_tokens=64)
    graph = graph_file.build(model, **graph_kwargs)
    return await run_episode(
        graph,
        graph_file.episode_input(seed),
        graph_config={"recursion_limit": recursion_limit_for(MAX_STEPS)},
        keep_messages=True,
    )


async def test_oracle_wins_through_the_graph() -> None:
    seed = HELD_OUT_SEED_START + 3
    env = make_env("sokoban")
    env.reset(seed)
    plan = solve(env.room, env.state)
    episode = await _play([f"Plan step.\nACTION: {a}" for a in plan], seed)
    assert episode.status == "ok", episode.error
    assert len(episode.turns) == len(plan) and episode.info["success"] and episode.turns[-1].terminated
    assert episode.turns[-1].reward == pytest.approx(10.9)
    first_prompt = episode.turns[0].messages
    assert "push every box onto a target" in first_prompt[0].content
    assert env.observation() in first_prompt[-1].content


async def test_invalid_answers_through_the_graph_pay_and_are_told() -> None:
    episode = await _play(["I am not sure."], HELD_OUT_SEED_START, max_steps=3)
    assert episode.status == "ok" and len(episode.turns) == 3
    assert all(t.reward == pytest.approx(-0.1) and t.info["valid_action"] is False for t in episode.turns)
    assert episode.turns[-1].truncated and not episode.info["success"]
    assert "named no valid action" in episode.turns[1].messages[-1].content


# --------------------------------------------------------------------------------------------
# the doc page's commands


def _doc_commands() -> list[str]:
    return doc_commands("environments_sokoban.md")


def _verlog(args: list[str], tmp_path: Path):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "verlog.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
    )


def test_doc_play_command_runs_as_written(tmp_path) -> None:
    play = next(c for c in _doc_commands() if c.startswith("verlog play"))
    result = _verlog(play.split()[1:], tmp_path)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "success True" in result.stdout and " # \t" in result.stdout


@pytest.mark.slow
def test_doc_eval_command_runs_with_the_tiny_model(tmp_path) -> None:
    # as written, with the random-init tiny model, 2 episodes and a short answer budget appended
    command = next(c for c in _doc_commands() if c.startswith("verlog eval"))
    result = _verlog(
        [
            *command.split()[1:],
            "model.path=tiny",
            "--episodes",
            "2",
            "--max-tokens",
            "16",
            "--out",
            str(tmp_path / "eval"),
            "--no-chart",
        ],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    assert "sokoban" in result.stdout and (tmp_path / "eval" / "summary.json").exists()
