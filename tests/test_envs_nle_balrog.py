"""MiniHack and NetHack under BALROG's protocol.

Pins BALROG's settings (tasks, caps, the no-progress abort, default actions, action sets, history
and answer budget), the text of the NLE language wrapper's rules on synthetic screens and on fixed
game states, that the model answers the game's questions itself, and the invalid-answer rule.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("nle")
pytest.importorskip("minihack")

from verlog.envs.balrog_protocol import clean_answer  # noqa: E402
from verlog.envs.nle import balrog_text as L  # noqa: E402
from verlog.envs.nle.env import (  # noqa: E402
    BALROG_MINIHACK_KWARGS,
    BALROG_NETHACK_KWARGS,
    BalrogMiniHackTextEnv,
    BalrogNetHackTextEnv,
    MiniHackTextEnv,
    make_minihack,
    make_nethack,
)

MOVES = ["north", "east", "south", "west", "northeast", "southeast", "southwest", "northwest"]


# -- settings ---------------------------------------------------------------------------------


def test_balrog_settings_are_pinned() -> None:
    """balrog/config/config.yaml (minihack_kwargs, nle_kwargs, tasks) and the wrappers it uses."""
    assert BALROG_MINIHACK_KWARGS == {
        "character": "@",
        "max_episode_steps": 100,
        "penalty_step": -0.01,
        "penalty_time": 0.0,
        "penalty_mode": "constant",
        "autopickup": False,
    }
    assert BALROG_NETHACK_KWARGS == {"character": "@", "max_episode_steps": 100_000, "no_progress_timeout": 150}
    minihack = make_minihack("MazeWalk-9x9", protocol="balrog")
    assert isinstance(minihack, BalrogMiniHackTextEnv)
    assert minihack.max_steps == 100 and minihack.default_action == "north"
    assert minihack.game._max_episode_steps == 100
    nethack = make_nethack(protocol="balrog")
    assert isinstance(nethack, BalrogNetHackTextEnv)
    assert nethack.max_steps == 100_000 and nethack.default_action == "esc"
    assert nethack.game.no_progress_timeout == 150 and nethack.game._max_episode_steps == 100_000
    from verlog.envs import get_family

    mh = get_family("minihack").balrog
    assert mh is not None and mh.task_names() == (
        "MiniHack-MazeWalk-9x9-v0",
        "MiniHack-MazeWalk-15x15-v0",
        "MiniHack-Corridor-R3-v0",
        "MiniHack-CorridorBattle-Dark-v0",
        "MiniHack-Quest-Easy-v0",
        "MiniHack-Quest-Medium-v0",
    )
    assert set(mh.left_out) == {"MiniHack-Boxoban-Hard-v0", "MiniHack-Boxoban-Medium-v0"}
    assert mh.history_length == 16 and mh.max_tokens == 8192 and mh.episodes_per_task == 5
    assert mh.invalid_action == "north" and set(mh.max_steps.values()) == {100}
    nh = get_family("nethack").balrog
    assert nh is not None and nh.task_names() == ("NetHackChallenge-v0",)
    assert nh.history_length == 16 and nh.max_tokens == 8192 and nh.episodes_per_task == 5
    assert nh.invalid_action == "esc" and dict(nh.max_steps) == {"": 100_000}


def test_balrog_action_sets() -> None:
    """MiniHack: the task's own actions that BALROG's MiniHack prompt names; NetHack: every useful
    command's name, every letter and every digit (the two-digit numbers are left out)."""
    assert make_minihack("MazeWalk-9x9", protocol="balrog").valid_actions() == MOVES
    assert make_minihack("Corridor-R3", protocol="balrog").valid_actions() == MOVES + ["open", "kick", "search"]
    quest = make_minihack("Quest-Easy", protocol="balrog").valid_actions()
    assert {"zap", "apply", "pickup", "far east", "down", "more"} <= set(quest) and "esc" not in quest
    names = L.nethack_action_names()
    assert {"esc", "more", "far west", "pickup", "pray", "a", "Z", "0", "9"} <= set(names)
    assert "00" not in names and len(names) == len(set(names))
    assert L.key_of("north") == ord("k") and L.key_of("far east") == ord("L") and L.key_of("esc") == 27
    assert L.key_of("kick") == 4 and L.key_of("pray") == 0x80 | ord("p") and L.key_of("more") == 13
    assert L.NLE_ACTION_NAMES[15] == ("wizard where",)  # BALROG's table: ^o names the wizard command


def test_minihack_instruction_has_balrogs_goal_and_only_the_tasks_actions() -> None:
    corridor = make_minihack("Corridor-R3", protocol="balrog").instruction
    assert "reach the staircase down" in corridor and "kick:" in corridor and "zap:" not in corridor
    assert "explore the level, fight the monsters" in make_minihack("Quest-Medium", protocol="balrog").instruction
    assert "as far as you can" in make_minihack("MazeWalk-15x15", protocol="balrog").instruction
    nethack = make_nethack(protocol="balrog").instruction
    assert "esc:" in nethack and "travel:" in nethack and "[dgh or ?*]" in nethack and "ACTION" not in nethack
    with pytest.raises(ValueError, match="make_minihack"):
        MiniHackTextEnv("MazeWalk-9x9", protocol="balrog")
    with pytest.raises(ValueError, match="unknown MiniHack task"):
        make_minihack("Boxoban-Hard", protocol="balrog")


# -- the language wrapper's rules ----------------------------------------------------------------


def test_positions_in_words() -> None:
    assert L.position_words(1, 0) == ("adjacent", "east")
    assert L.position_words(-2, -2) == ("very near", "southwest")
    assert L.position_words(3, 1) == ("near", "eastnortheast")
    assert L.position_words(1, 4) == ("near", "northnortheast")
    assert L.position_words(0, -6) == ("far", "south")
    assert L.position_words(-25, 3) == ("very far", "westnorthwest")
    assert [L.distance_words(d) for d in (1, 2, 5, 6, 19, 20)] == [
        "adjacent",
        "very near",
        "near",
        "far",
        "far",
        "very far",
    ]


def test_plurals_and_direction_lists() -> None:
    assert [L.pluralize(n) for n in ("dark area", "fly", "wolf", "staff", "lenses", "lava", "box", "lich")] == [
        "dark areas",
        "flies",
        "wolves",
        "staves",
        "lenses",
        "area of lava",
        "boxes",
        "lichs",
    ]
    items = [
        ("wall", "near", "north"),
        ("wall", "near", "east"),
        ("wall", "near", "south"),
        ("fountain", "far", "east"),
        ("fountain", "far", "east"),
        ("fountain", "far", "west"),
    ]
    assert L._group(items) == [
        ("wall", "near", "north, east, and south"),
        ("fountain", "far", "west"),
        ("fountains", "far", "east"),
    ]


def _screen(*rows: str) -> np.ndarray:
    chars = np.full((24, 80), ord(" "), dtype=np.uint8)
    for i, row in enumerate(rows):
        chars[i, : len(row)] = [ord(c) for c in row]
    return chars


def test_message_rules_on_synthetic_screens() -> None:
    assert L.text_message(_screen("You see here a dagger.", "  |..@..|")) == "You see here a dagger."
    assert L.text_message(_screen()) == ""
    window = _screen(
        "          Things that are here:", "          a dagger", "          an apple", "          --More--"
    )
    assert L.text_message(window) == "Things that are here:\na dagger\nan apple\n--More--"
    menu = _screen(" Weapons", " a - a long sword", " (end)")
    assert L.text_message(menu) == "Weapons\na - a long sword\n(end)"
    paged = _screen(" Discoveries", " a", " (1 of 2)")
    assert L.text_message(paged) == "Discoveries\na\n(1 of 2)"


def test_inventory_and_map_text() -> None:
    letters = np.zeros(55, dtype=np.uint8)
    strs = np.zeros((55, 80), dtype=np.uint8)
    for i, (letter, text) in enumerate([("a", "a +1 long sword (weapon in hand)"), ("f", "an apple")]):
        letters[i] = ord(letter)
        strs[i, : len(text)] = [ord(c) for c in text]
    assert L.text_inventory(strs, letters) == "a: a +1 long sword (weapon in hand)\nf: an apple"
    screen = _screen("message", "row one", "row two")
    text = L.ascii_map(screen)
    assert text.count("\n") == 23 and text.startswith("row one" + " " * 73 + "\nrow two")


# -- fixed states -------------------------------------------------------------------------------

NETHACK_SEED_1_LANGUAGE = """dark area near east and southwest
horizontal wall near south
doorway very near east
vertical wall very near southeast and west
vertical closed door very near southwest
horizontal wall adjacent north, northeast, and northwest
tame little dog adjacent east
jackal adjacent west"""


MOON_MESSAGES = ("You are lucky!  Full moon tonight.", "Be careful!  New moon tonight.")


def test_nethack_fixed_state_text() -> None:
    """NetHack seed 1's first screen: a samurai in a closed room with her dog and a jackal. The
    language observation follows the wrapper's rules (a closed door is listed from anywhere; the
    rays see walls, doorways and the dark, a wall ends a ray, a door does not)."""
    env = make_nethack(1, protocol="balrog")
    observation = env.reset(1)
    inventory, rest = observation.split("\n\nmessage:\n", 1)
    assert inventory.startswith("inventory:\na: a +0 katana (weapon in hand)\nb: a blessed +0 wakizashi")
    # NetHack reads the date: on full- and new-moon nights its greeting is followed by the moon's
    welcome = "Konnichi wa Agent, welcome to NetHack!  You are a lawful female human Samurai."
    assert rest.split("\n\n", 1)[0] in (welcome, *MOON_MESSAGES)
    assert f"language observation:\n{NETHACK_SEED_1_LANGUAGE}\n\n" in rest
    assert "cursor:\nYourself a samurai\n(x=28, y=9)\n\n" in rest
    map_text = rest.split("map:\n", 1)[1]
    lines = map_text.split("\n")
    assert lines[7][26:31] == "-----" and lines[8][26:31] == "|d@d." and lines[10][26:31] == "+...|"
    assert all(len(line) == 80 for line in lines[:23]) and map_text.endswith("\n\n")
    assert lines[21].startswith("Agent the Hatamoto") and lines[22].startswith("Dlvl:1 $:0 HP:15(15)")
    assert env.history_observation == "message:\n" + rest  # the history keeps all but the inventory


def test_minihack_fixed_state_text() -> None:
    env = make_minihack("MazeWalk-9x9", protocol="balrog")
    observation = env.reset(0)
    assert "\nlanguage observation:\ndark area near north\ndark area very near south and southwest\n" in observation
    assert "cursor:\nYourself a priest\n(x=42, y=13)" in observation
    result = env.step("north")
    assert result.info["valid_action"] and "stairs up adjacent south" in result.observation
    assert result.info["history_observation"] == env.history_observation
    assert not env.history_observation.startswith("inventory")


# -- answers ------------------------------------------------------------------------------------


def test_invalid_answers_run_the_default_action_at_no_cost_as_in_balrog() -> None:
    """BALROG's evaluator runs the default action for an invalid answer and adds nothing to the
    reward: the reward is the game's, the same as answering the default action itself."""
    assert clean_answer("  far east!\n") == "far east"
    env, twin = make_minihack("MazeWalk-9x9", protocol="balrog"), make_minihack("MazeWalk-9x9", protocol="balrog")
    env.reset(0)
    twin.reset(0)
    for answer in ["ACTION: north", "go north", "North", "zap"]:  # BALROG: exact names only
        result, played = env.step(answer), twin.step("north")
        assert result.info["action"] == "north" and not result.info["valid_action"] and played.info["valid_action"]
        assert result.reward == played.reward and result.observation == played.observation
    assert env.step("  south. ").info["valid_action"]
    for make in (
        lambda **kw: make_minihack("MazeWalk-9x9", protocol="balrog", **kw),
        lambda **kw: make_nethack(1, protocol="balrog", **kw),
    ):
        assert make().invalid_action_penalty == 0.0
        costly = make(invalid_action_penalty=0.1)  # a penalty given on purpose is paid
        free = make()
        costly.reset(1)
        free.reset(1)
        assert costly.step("xyzzy!?").reward == pytest.approx(free.step("xyzzy!?").reward - 0.1)


async def test_the_suites_graph_pays_no_penalty_for_an_invalid_answer() -> None:
    """graphs/minihack.py as BALROG's suite builds it (no ``invalid_action_penalty`` given): an
    invalid answer's episode return is that of the default action answered outright; verlog's
    variant pays 0.1 per invalid answer."""
    from pathlib import Path

    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    from verlog.graph_file import load_graph_file

    graph_file = load_graph_file(Path(__file__).resolve().parents[1] / "graphs" / "minihack.py")

    async def episode_return(protocol: str, said: str) -> float:
        model = GenericFakeChatModel(messages=iter([AIMessage(said)] * 3))
        graph = graph_file.build(model, task="MazeWalk-9x9", protocol=protocol, max_steps=3)
        return (await graph.ainvoke({"seed": 0}))["episode_return"]

    assert await episode_return("balrog", "xyzzy!?") == await episode_return("balrog", "north")
    verlogs = await episode_return("verlog", "xyzzy"), await episode_return("verlog", "ACTION: north")
    assert verlogs[0] == pytest.approx(verlogs[1] - 0.3)


def test_nethack_model_answers_the_games_questions() -> None:
    env = make_nethack(1, protocol="balrog")
    env.reset(1)
    result = env.step("f")  # fire: the game asks for a direction and waits
    assert "In what direction?" in result.observation.split("language observation:")[0]
    assert result.info["valid_action"]
    result = env.step("h")  # the answer: west (towards the jackal)
    assert "In what direction?" not in result.observation.split("language observation:")[0]
    result = env.step("i")  # the inventory menu stays open until the model leaves it
    assert "(end)" in result.observation or "of " in result.observation
    assert env.step("esc").info["valid_action"]


def test_nethack_no_progress_abort_truncates() -> None:
    env = make_nethack(1, protocol="balrog", no_progress_timeout=5)
    env.reset(1)
    for step in range(20):  # looking at the inventory does not move the game's turn counter
        result = env.step("i" if step % 2 == 0 else "esc")
        if result.done:
            break
    assert result.done and result.truncated and not result.terminated and "aborted" in result.info
    assert step < 10


def _random_play(env, seed: int, steps: int) -> int:
    import random

    rng = random.Random(seed)
    env.reset(seed)
    episodes = 1
    # digits are valid actions, but BALROG's answer cleaning deletes them: no answer reaches them
    answers = [a for a in env.valid_actions() if clean_answer(a) == a]
    for _ in range(steps):
        result = env.step(rng.choice(answers))
        assert "\nmap:\n" in result.observation and result.info["valid_action"]
        if result.done:
            env.reset()
            episodes += 1
    return episodes


def test_random_answers_never_break_the_games() -> None:
    """Any valid answer, in any state (menus, questions, death), keeps the game playable."""
    assert _random_play(make_nethack(protocol="balrog"), 0, 300) >= 1
    assert _random_play(make_minihack("Quest-Easy", protocol="balrog"), 0, 200) >= 1


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("seed", range(5))
def test_nethack_random_answers_2000_steps(seed: int) -> None:
    assert _random_play(make_nethack(protocol="balrog"), seed, 2000) >= 1


def test_minihack_goal_gives_balrogs_progression() -> None:
    """The moves verlog's search agent finds win the same level under BALROG's protocol, with
    BALROG's progression (the last step's game reward reaches 1)."""
    from verlog.envs.base import play_steps
    from verlog.envs.nle.agents import MiniHackSearchAgent

    verlog_env = MiniHackTextEnv("MazeWalk-9x9")
    moves = [r.info["action"] for r in play_steps(verlog_env, MiniHackSearchAgent(can_open=False), 1)]
    env = make_minihack("MazeWalk-9x9", protocol="balrog")
    env.reset(1)
    results = [env.step(move) for move in moves]
    assert results[-1].terminated and results[-1].info["success"]
    assert results[-1].info["progression"] == 1.0 and results[-1].reward == 1.0
    assert all(r.info["progression"] == 0.0 for r in results[:-1])


@pytest.mark.parametrize(
    "name,cls", [("minihack:Corridor-R3", BalrogMiniHackTextEnv), ("nethack", BalrogNetHackTextEnv)]
)
def test_registry_builds_balrogs_variant_under_its_protocol(name: str, cls: type) -> None:
    from verlog.envs.registry import make_env

    assert isinstance(make_env(name, protocol="balrog"), cls)


async def test_the_invalid_answer_note_heads_the_long_term_part_as_in_balrog() -> None:
    """BALROG prepends its note to the observation's long-term context: the current observation
    shows the inventory (short-term), then the note, then the rest; the history keeps the note."""
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    from verlog.envs import balrog_protocol
    from verlog.envs.agent_graph import build_game_graph

    prompts: list = []

    class Recording(GenericFakeChatModel):
        async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):  # type: ignore[override]
            prompts.append(messages)
            return await super()._agenerate(messages, stop=stop, run_manager=run_manager, **kwargs)

    answers = ["Let me think.", "south", "east"]
    graph = build_game_graph(
        Recording(messages=iter(AIMessage(a) for a in answers)), "minihack:MazeWalk-9x9", protocol="balrog", max_steps=3
    )
    state = await graph.ainvoke({"seed": 0})
    note = balrog_protocol.invalid_answer_note("north")
    current = prompts[1][-1].content  # after the invalid answer
    inventory, rest = current.split(note)
    assert inventory.startswith("Current Observation:\ninventory:\n") and rest.startswith("message:\n")
    past = prompts[2][-3].content  # the same observation, now in the history: the note, no inventory
    assert past == f"Observation:\n{note}{rest.split(chr(10) + chr(10) + balrog_protocol.ANSWER_RULE)[0]}"
    assert "inventory:" not in past
    assert state["history"][1][0].startswith(note)


def test_the_docs_say_minihacks_reward_under_balrogs_protocol_is_verlogs_success() -> None:
    """docs/environments_balrog.md's invalid-answer row says what the reward is under BALROG's
    protocol, as the games give it: MiniHack's is verlog's 1/0 success (the game's own reward,
    with its -0.01 steps, in ``info["game_reward"]``), NetHack's the game's."""
    from pathlib import Path

    from verlog.envs.base import play_steps
    from verlog.envs.nle.agents import MiniHackSearchAgent

    doc = (Path(__file__).resolve().parents[1] / "docs" / "environments_balrog.md").read_text()
    [row] = [line for line in doc.splitlines() if line.startswith("| Invalid answer |")]
    balrog_cell = row.split(" | ")[2]
    assert "MiniHack's is verlog's 1/0 success" in balrog_cell and 'info["game_reward"]' in balrog_cell
    assert "NetHack's is (the change of the in-game score)" in balrog_cell

    moves = [r.info["action"] for r in play_steps(MiniHackTextEnv("MazeWalk-9x9"), MiniHackSearchAgent(), 1)]
    env = make_minihack("MazeWalk-9x9", protocol="balrog")
    env.reset(1)
    results = [env.step(move) for move in moves]
    assert [r.reward for r in results] == [0.0] * (len(results) - 1) + [1.0] and results[-1].info["success"]
    assert results[-1].info["game_reward"] >= 1.0
    assert any(r.info["game_reward"] < 0 for r in results[:-1])  # the game's -0.01 steps are not the reward
