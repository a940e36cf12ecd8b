"""MiniHack and NetHack as text: rendering, action mapping, prompt handling, determinism, errors,
the MiniHack search agent and random NetHack play.

Rendering is checked on hand-made observations (arrays built here); everything else on the real
games. The long runs (100 seeds per MiniHack task, 2,000-step NetHack runs) are marked slow; the
default run keeps short versions.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

nethack = pytest.importorskip("nle.nethack")
pytest.importorskip("minihack")

from verlog.envs.nle import verlog_text as T  # noqa: E402
from verlog.envs.nle.agents import (  # noqa: E402
    MiniHackSearchAgent,
    RandomTextAgent,
    parse_observation,
    play_scripted_episode,
)
from verlog.envs.nle.env import MINIHACK_TASKS, MiniHackTextEnv, NetHackTextEnv, native_keys  # noqa: E402
from verlog.envs.registry import get_family, list_envs, make_env  # noqa: E402

warnings.filterwarnings("ignore", category=UserWarning)

# --------------------------------------------------------------------------------------------
# hand-made observations

H, W = nethack.DUNGEON_SHAPE


def _monster(name: str) -> int:
    for i in range(nethack.NUMMONS):
        if nethack.permonst(i).mname == name:
            return nethack.GLYPH_MON_OFF + i
    raise KeyError(name)


def _object(name: str) -> int:
    for i in range(nethack.NUM_OBJECTS):
        if nethack.OBJ_NAME(nethack.objclass(i)) == name:
            return nethack.GLYPH_OBJ_OFF + i
    raise KeyError(name)


def _cmap(symbol: int) -> int:
    return nethack.GLYPH_CMAP_OFF + symbol


def _cstrings(rows: int, cols: int, width: int) -> np.ndarray:
    return np.zeros((rows, cols, width), dtype=np.uint8)


def make_obs(blstats: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """A room 7 wide (columns 10-16) and 5 high (rows 5-9) inside walls, the agent at (12, 7):

    ``-----+---`` top wall with a closed door at (15, 4); a doorway in the west wall at (9, 7);
    a jackal at (14, 7), a dagger at (12, 9), the staircase down at (16, 5), a corridor going
    west from the doorway.
    """
    glyphs = np.full((H, W), _cmap(T.S_STONE), dtype=np.int32)
    descriptions = _cstrings(H, W, 80)

    def put(x: int, y: int, glyph: int, words: str = "") -> None:
        glyphs[y, x] = glyph
        descriptions[y, x] = 0
        descriptions[y, x, : len(words)] = np.frombuffer(words.encode(), dtype=np.uint8)

    for x in range(9, 18):
        put(x, 4, _cmap(2), "wall")
        put(x, 10, _cmap(2), "wall")
    for y in range(4, 11):
        put(9, y, _cmap(1), "wall")
        put(17, y, _cmap(1), "wall")
    for x in range(10, 17):
        for y in range(5, 10):
            put(x, y, _cmap(T.S_ROOM), "floor of a room")
    put(15, 4, _cmap(T.S_HCDOOR), "closed door")
    put(9, 7, _cmap(T.S_NDOOR), "doorway")
    for x in range(5, 9):
        put(x, 7, _cmap(T.S_CORR), "corridor")
    put(16, 5, _cmap(T.S_DNSTAIR), "staircase down")
    put(14, 7, _monster("jackal"), "jackal")
    put(12, 9, _object("dagger"), "dagger")
    put(12, 7, _monster("human"), "human rogue called Agent")

    stats = np.zeros(nethack.NLE_BLSTATS_SIZE, dtype=np.int64)
    values = {
        "NLE_BL_X": 12,
        "NLE_BL_Y": 7,
        "NLE_BL_HP": 9,
        "NLE_BL_HPMAX": 14,
        "NLE_BL_ENE": 2,
        "NLE_BL_ENEMAX": 5,
        "NLE_BL_AC": 6,
        "NLE_BL_XP": 3,
        "NLE_BL_EXP": 25,
        "NLE_BL_DEPTH": 4,
        "NLE_BL_DLEVEL": 4,
        "NLE_BL_GOLD": 17,
        "NLE_BL_TIME": 321,
        "NLE_BL_HUNGER": 2,
        "NLE_BL_CAP": 1,
        "NLE_BL_CONDITION": nethack.BL_MASK_CONF,
        "NLE_BL_STR25": 19,
        "NLE_BL_DEX": 14,
        "NLE_BL_CON": 13,
        "NLE_BL_INT": 9,
        "NLE_BL_WIS": 10,
        "NLE_BL_CHA": 8,
        "NLE_BL_ALIGN": -1,
    }
    values.update(blstats or {})
    for key, value in values.items():
        stats[getattr(nethack, key)] = value

    inv_letters = np.zeros(55, dtype=np.uint8)
    inv_strs = np.zeros((55, 80), dtype=np.uint8)
    for i, (letter, text) in enumerate([("a", "a +0 short sword (weapon in hand)"), ("f", "2 uncursed food rations")]):
        inv_letters[i] = ord(letter)
        inv_strs[i, : len(text)] = np.frombuffer(text.encode(), dtype=np.uint8)
    message = np.zeros(256, dtype=np.uint8)
    message[:10] = np.frombuffer(b"Welcome!  ", dtype=np.uint8)
    tty = np.full((24, 80), ord(" "), dtype=np.uint8)
    tty[8, 9:18] = np.frombuffer(b"|.@.d..|.", dtype=np.uint8)[:9]
    return {
        "glyphs": glyphs,
        "screen_descriptions": descriptions,
        "blstats": stats,
        "inv_letters": inv_letters,
        "inv_strs": inv_strs,
        "message": message,
        "tty_chars": tty,
    }


def test_cells_are_classified_from_glyphs_and_descriptions() -> None:
    obs = make_obs()
    assert T.classify(obs, 10, 5) == T.Cell("terrain", "floor", open=True, symbol=T.S_ROOM)
    assert T.classify(obs, 9, 5).kind == "wall"
    assert T.classify(obs, 15, 4).name == "closed door" and not T.classify(obs, 15, 4).open
    assert T.classify(obs, 9, 7).open  # a doorway without a door is walked through
    assert T.classify(obs, 14, 7) == T.Cell("monster", "jackal")
    assert T.classify(obs, 12, 9) == T.Cell("item", "dagger")
    assert T.classify(obs, 0, 0).kind == "unknown"


def test_around_lists_each_direction_with_distance_and_what_stops_it() -> None:
    text = T.around_text(make_obs(), 12, 7)
    lines = dict(line[2:].split(": ", 1) for line in text.splitlines()[1:])
    assert lines["east"] == "1 open square, then a jackal"
    assert lines["west"] == "7 open squares, then unexplored darkness"  # floor, doorway, corridor
    assert lines["north"] == "2 open squares, then a wall"
    assert lines["south"] == "1 open square, then a dagger"  # an item ends the line: it is news
    assert lines["northeast"] == "2 open squares, then a closed door"
    assert set(lines) == set(T.DIRECTION_NAMES)


def test_map_features_have_direction_and_distance_nearest_first() -> None:
    found = T.features(make_obs(), 12, 7)
    assert found["jackal"] == [(2, 2, 0, "monster")]
    assert found["staircase down"] == [(4, 4, -2, "terrain")]
    assert found["closed door"] == [(3, 3, -3, "terrain")]
    assert "floor" not in found and "wall" not in found and "corridor" not in found
    text = T.features_text(make_obs(), 12, 7)
    assert "- jackal (monster): 2 steps east" in text
    assert "- dagger (item): 2 steps south" in text
    assert "- staircase down: 4 steps east and 2 steps north" in text
    assert "- doorway: 3 steps west" in text
    assert text.index("jackal") < text.index("staircase down")  # nearest first


def test_status_inventory_and_message_render() -> None:
    text = T.render(make_obs(), "You hear a door open. (A window was closed.)")
    assert text.startswith("Message: You hear a door open. (A window was closed.)\n")
    assert (
        "Status: HP 9 of 14, power 2 of 5, armor class 6, experience level 3 (25 points), "
        "dungeon level 4 (depth 4), gold 17, turn 321, hungry, burdened, confused." in text
    )
    assert (
        "Attributes: strength 18/01, dexterity 14, constitution 13, intelligence 9, wisdom 10, charisma 8, chaotic."
        in text
    )
    assert "Position: column 12, row 7." in text
    assert "Inventory:\n- a: a +0 short sword (weapon in hand)\n- f: 2 uncursed food rations" in text
    assert "Map (" not in text
    with_map = T.render(make_obs(), show_map=True)
    assert "Message: Welcome!" in with_map
    assert "|.@.d..|" in with_map and "@ is you" in with_map
    empty = make_obs()
    empty["inv_letters"][:] = 0
    assert "Inventory: empty." in T.render(empty)


def test_observation_parser_reads_back_the_text() -> None:
    facts = parse_observation(T.render(make_obs(), "hi"))
    assert facts.position == (12, 7) and facts.message == "hi"
    assert facts.rays["east"] == (1, "jackal") and facts.rays["north"] == (2, "wall")
    assert facts.features["staircase down"] == [(4, -2, "terrain")]
    assert facts.features["jackal"] == [(2, 0, "monster")]


# --------------------------------------------------------------------------------------------
# action mapping


def test_named_actions_expand_and_resolve() -> None:
    concrete = T.expand_actions(
        ["north", "kick <direction>", "eat <item>", "zap <item> <direction>", "wield <item>"], ["$", "a", "f"]
    )
    assert concrete[:1] == ["north"]
    assert "kick southwest" in concrete and "eat f" in concrete and "zap a northeast" in concrete
    assert not any("$" in a for a in concrete)  # gold: "drop $" would read as a bare "drop"
    assert len(concrete) == 1 + 8 + 2 + 16 + 2
    assert T.resolve("zap f north") == ("zap <item> <direction>", {"item": "f", "direction": "north"})
    assert T.resolve("zap f") == ("zap <item>", {"item": "f"})
    assert T.resolve("far east") == ("far east", {})
    with pytest.raises(KeyError):
        T.resolve("dance")
    assert T.BASE_ACTIONS["north"].keys == "k" and T.BASE_ACTIONS["far west"].keys == "H"
    assert T.BASE_ACTIONS["go down"].keys == ">" and T.BASE_ACTIONS["search"].keys == "s"
    assert T.BASE_ACTIONS["fight <direction>"].keys == "F{direction}"  # a prefix: the key follows


def test_minihack_offers_the_tasks_own_actions() -> None:
    maze = MiniHackTextEnv("MazeWalk-9x9", seed=0)
    assert maze.valid_actions() == list(T.DIRECTION_NAMES)
    assert native_keys("MiniHack-MazeWalk-9x9-v0") == frozenset("kljhunby")
    corridor = MiniHackTextEnv("Corridor-R3", seed=0)
    corridor.reset()
    actions = corridor.valid_actions()
    assert "search" in actions and "open east" in actions and "kick west" in actions
    assert "far east" not in actions and "eat" not in actions
    quest = MiniHackTextEnv("Quest-Easy", seed=0)
    quest.reset()
    assert {"pick up", "go down", "far east", "zap a north"} <= set(quest.valid_actions())


def test_synonyms_and_invalid_answers_in_minihack() -> None:
    env = MiniHackTextEnv("Quest-Easy", seed=1)
    env.reset()
    result = env.step("I will grab it.\nACTION: pickup")
    assert result.info["action"] == "pick up" and result.info["valid_action"]
    result = env.step("ACTION: dance wildly")
    assert result.info["action"] == "north" and not result.info["valid_action"]  # BALROG's default
    assert result.reward == pytest.approx(-0.1)
    assert result.info["step"] == 2


def test_nethack_invalid_answer_runs_esc() -> None:
    env = NetHackTextEnv(seed=0)
    env.reset()
    result = env.step("hmm")
    assert result.info["action"] == "esc" and not result.info["valid_action"]
    assert result.reward == pytest.approx(-0.1)
    # an item letter not carried does not fall back onto another item
    result = env.step("ACTION: zap z north")
    assert result.info["action"] == "esc" and not result.info["valid_action"]


# --------------------------------------------------------------------------------------------
# prompts


def test_prompts_are_answered_from_the_action_or_cancelled_with_a_note() -> None:
    env = MiniHackTextEnv("Quest-Easy", seed=3)
    env.reset()
    # a text window with --More--: its text becomes the message
    result = env.step("ACTION: look")
    assert "Things that are here: a horn a brass wand" in result.observation
    assert env.prompt_pending() is None
    # a menu (several objects here): "pick up" selects everything
    result = env.step("ACTION: pick up")
    assert "j - a brass wand" in result.observation and "k - a horn" in result.observation
    assert env.prompt_pending() is None
    # the item and direction questions are answered from the action's arguments
    result = env.step("ACTION: zap j east")
    assert "The lava cools and solidifies" in result.observation
    # a question the action has no answer for is cancelled, and the model is told
    result = env.step("ACTION: eat")
    assert '(The game asked "What do you want to eat?' in result.observation
    assert env.prompt_pending() is None
    # a yes/no question is answered no
    result = env.step("ACTION: apply k east")
    assert "it was answered no" in result.observation and env.prompt_pending() is None
    # a text prompt is typed: engrave writes Elbereth with the fingers
    env.step("ACTION: engrave Elbereth")
    result = env.step("ACTION: look")
    assert 'You read: "Elbereth"' in result.observation
    # a window opened by hand is closed by the environment, with a note
    obs, *_ = env._press("i")
    assert env.prompt_pending() == "menu"
    messages: list[str] = []
    notes: list[str] = []
    env._settle(obs, {}, messages, notes, 0.0)
    assert env.prompt_pending() is None and notes and "window was closed" in notes[0]


def test_fight_is_a_prefix_command_and_leaves_no_pending_key() -> None:
    env = MiniHackTextEnv("Quest-Easy", seed=3)
    env.reset()
    result = env.step("ACTION: fight north")
    assert "You attack thin air" in result.observation or "wall" in result.observation
    result = env.step("ACTION: search")
    assert "Invalid direction" not in result.observation


# --------------------------------------------------------------------------------------------
# determinism, names, progression


def _trajectory(env, actions: list[str], seed: int) -> list[str]:
    texts = [env.reset(seed)]
    for action in actions:
        result = env.step(f"ACTION: {action}")
        texts.append(result.observation)
        if result.done:
            break
    return texts


def test_same_seed_same_game() -> None:
    actions = ["north", "east", "south", "west", "northeast", "southwest"] * 3
    for make in (lambda: MiniHackTextEnv("Corridor-R3"), lambda: NetHackTextEnv()):
        a, b = make(), make()
        assert _trajectory(a, actions, 7) == _trajectory(b, actions, 7)
        assert _trajectory(a, actions, 7)[0] != _trajectory(a, actions, 8)[0]
    seeded = MiniHackTextEnv("MazeWalk-15x15", seed=5)
    assert seeded.reset() == MiniHackTextEnv("MazeWalk-15x15").reset(5)


def test_unknown_task_names_list_the_valid_ones() -> None:
    with pytest.raises(ValueError) as err:
        MiniHackTextEnv("Boxoban-Hard")
    message = str(err.value)
    assert "minihack:MazeWalk-9x9" in message and "minihack:Quest-Medium" in message
    assert "Boxoban-Hard" in message and "downloaded" in message
    with pytest.raises(ValueError, match="valid names: .*minihack:Corridor-R3"):
        make_env("minihack:Boxoban-Medium")
    with pytest.raises(ValueError, match="valid names: minihack:MazeWalk-9x9, .*minihack:Quest-Medium$"):
        make_env("minihack:Nope")
    with pytest.raises(ValueError, match="with a family of babyai, babaisai, crafter, textworld, minihack, nethack"):
        make_env("zork:1")
    assert get_family("minihack").tasks == tuple(MINIHACK_TASKS)
    names = list_envs()
    assert "nethack" in names and all(f"minihack:{t}" in names for t in MINIHACK_TASKS)


def test_minihack_success_and_nethack_progression_in_info() -> None:
    env = MiniHackTextEnv("MazeWalk-9x9")
    out = play_scripted_episode(env, MiniHackSearchAgent(), seed=0)
    assert out["success"] and out["return"] == 1.0
    assert out["info"]["progression"] == 1.0 and out["info"]["end_status"] == "TASK_SUCCESSFUL"
    assert "The goal is reached" in env.observation

    nh = NetHackTextEnv(seed=0)
    nh.reset()
    info = nh.step("ACTION: search").info
    assert info["progression"] == 0.0 and info["depth"] == 1 and info["max_depth"] == 1
    assert info["experience_level"] >= 1 and info["turn"] >= 1


def test_nethack_no_progress_abort_and_step_cap() -> None:
    env = NetHackTextEnv(seed=0, no_progress_timeout=5)
    env.reset()
    steps = [env.step("ACTION: esc") for _ in range(5)]
    assert steps[-1].truncated and "did not move" in steps[-1].info["aborted"]
    capped = MiniHackTextEnv("MazeWalk-15x15", max_steps=3)
    capped.reset(0)
    results = [capped.step("ACTION: north") for _ in range(3)]
    assert results[-1].truncated and not results[-1].terminated and results[-1].info["success"] is False


# --------------------------------------------------------------------------------------------
# the search agent and random play


def _solve_rate(task: str, seeds: range, max_steps: int) -> float:
    env = MiniHackTextEnv(task, max_steps=max_steps)
    agent = MiniHackSearchAgent()
    wins = sum(play_scripted_episode(env, agent, seed=s)["success"] for s in seeds)
    return wins / len(seeds)


@pytest.mark.parametrize("task", ["MazeWalk-9x9", "MazeWalk-15x15", "Corridor-R3"])
def test_search_agent_solves_navigation_tasks_short(task: str) -> None:
    assert _solve_rate(task, range(10), max_steps=1000) >= 0.9


@pytest.mark.slow
@pytest.mark.parametrize(
    "task,max_steps",
    [
        ("MazeWalk-9x9", 100),
        ("MazeWalk-15x15", 100),
        ("MazeWalk-9x9", 200),
        ("MazeWalk-15x15", 1000),
        ("Corridor-R3", 1000),
    ],
)
def test_search_agent_solves_navigation_tasks(task: str, max_steps: int) -> None:
    """>= 95% of 100 seeds, through the text alone (caps: BALROG's 100 for the mazes, and
    MiniHack's own task limits; Corridor-R3 needs more than 100 steps on about 1 seed in 4)."""
    assert _solve_rate(task, range(100), max_steps=max_steps) >= 0.95


def _random_run(seed: int, steps: int, safe: bool = False) -> list[int]:
    """Random valid actions for ``steps`` steps (episodes restart when they end); returns the
    episode lengths. Every step must leave the game at its command prompt."""
    env = NetHackTextEnv(seed=seed, max_steps=steps)
    if safe:  # no self-harm (kicking walls, praying too often, hitting the pet): longer episodes
        choices = lambda: [a for a in env.valid_actions() if not a.startswith(("kick", "pray", "fight"))]  # noqa: E731
    else:
        choices = env.valid_actions
    agent = RandomTextAgent(choices, seed=seed)
    observation = env.reset(seed)
    lengths, length = [], 0
    for _ in range(steps):
        result = env.step(agent.act(observation))
        length += 1
        assert result.done or env.prompt_pending() is None, result.observation[:300]
        assert result.observation.startswith("Message:")
        observation = result.observation
        if result.done:
            lengths.append(length)
            length = 0
            observation = env.reset()
    return lengths + ([length] if length else [])


def test_nethack_random_text_actions_short() -> None:
    assert sum(_random_run(seed=0, steps=300)) == 300


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
def test_nethack_random_text_actions_2000_steps(seed: int) -> None:
    assert sum(_random_run(seed, 2000)) == 2000
    assert sum(_random_run(seed, 2000, safe=True)) == 2000


# --------------------------------------------------------------------------------------------
# through the agent graphs


async def _run_graph(name: str, script, seed: int, max_steps: int, **kwargs):
    from pathlib import Path

    from verlog.envs.agent_graph import recursion_limit_for
    from verlog.graph_file import load_graph_file
    from verlog.llm import VerlogChatModel
    from verlog.models import load_tokenizer
    from verlog.rollout import run_episode
    from verlog.testing.scripted_engine import ScriptedEngine

    tokenizer = load_tokenizer("tiny")
    graph_file = load_graph_file(Path(__file__).resolve().parents[1] / "graphs" / f"{name}.py")
    engine_script = script(tokenizer) if callable(script) else script
    model = VerlogChatModel(engine=ScriptedEngine(tokenizer, engine_script), tokenizer=tokenizer, max_tokens=64)
    graph = graph_file.build(model, max_steps=max_steps, **kwargs)
    return await run_episode(
        graph, graph_file.episode_input(seed), graph_config={"recursion_limit": recursion_limit_for(max_steps)}
    )


async def test_search_agent_reading_the_prompt_solves_a_maze_through_the_graph() -> None:
    """The engine's answer is the search agent's, computed from the decoded prompt text only."""
    agent = MiniHackSearchAgent()

    def script(tokenizer):
        def answer(prompt_ids: list[int]) -> str:
            prompt = tokenizer.decode(prompt_ids, skip_special_tokens=False)
            observation = prompt.rsplit("Current Observation:\n", 1)[1].split("<|im_end|>", 1)[0]
            return f"Exploring.\n{agent.act(observation)}"

        return answer

    episode = await _run_graph("minihack", script, seed=2, max_steps=100, task="MazeWalk-9x9")
    assert episode.status == "ok", episode.error
    assert episode.turns[-1].terminated and episode.turns[-1].reward == 1.0
    assert episode.turns[-1].info["success"] and episode.turns[-1].info["progression"] == 1.0
    assert all(t.info["valid_action"] for t in episode.turns)


async def test_nethack_graph_runs_and_reports_progression() -> None:
    answers = ["ACTION: search", "ACTION: far east", "I am lost.", "ACTION: eat"]
    episode = await _run_graph("nethack", answers, seed=0, max_steps=8)
    assert episode.status == "ok", episode.error
    assert len(episode.turns) == 8
    assert episode.turns[-1].truncated
    assert all("progression" in t.info and "max_depth" in t.info for t in episode.turns)
    assert episode.turns[2].reward == pytest.approx(-0.1) and episode.turns[2].info["action"] == "esc"


def test_play_nethack_has_no_bot_but_random_play() -> None:
    from verlog.envs.play import play

    with pytest.raises(ValueError, match="no bot is available for 'nethack'.*--agent random"):
        play("nethack", seed=0, agent="bot", print_fn=lambda _: None)
    summary = play("nethack", seed=0, agent="random", max_steps=5, print_fn=lambda _: None)
    assert summary["steps"] == 5
