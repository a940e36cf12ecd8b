"""BALROG's protocol, pinned: the settings of each environment family (task lists, caps, history,
answer budget, invalid-answer actions), BabyAI's levels and BabyAI-Text wording, BabaIsAI's text
and win rule, the naive agent's prompt and answer rule, the suite file, and the oracles.

The figures come from balrog-ai/BALROG (``balrog/config/config.yaml``, its environment wrappers,
``prompt_builder/history.py``, ``agents/naive.py``), BartekCupial/Minigrid (``MixedTrainLocal``,
the text descriptions) and nacloos/baba-is-ai (the 40 tasks, the step function).
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import yaml
from langchain_core.messages import AIMessage, HumanMessage

from verlog.envs import BalrogSettings, EnvFamily, balrog_protocol, families, get_family, register_family
from verlog.envs.base import play_steps
from verlog.envs.play import RULE, make_bot, model_message
from verlog.envs.registry import FAMILIES, list_envs, make_env

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "configs" / "suites" / "balrog.yaml"
BABYAI_CAPS = {"goto": 64, "pickup": 64, "open": 128, "putnext": 128, "pick_up_seq_go_to": 128}


# --------------------------------------------------------------------------------------------
# the families' BALROG settings


def _balrog_families() -> dict:
    return {name: family for name, family in families().items() if family.balrog is not None}


def test_every_balrog_family_has_its_protocol_defaults() -> None:
    assert list(families()) == ["babyai", "babaisai", "crafter", "textworld", "minihack", "nethack", "sokoban"]
    # BALROG's six games; sokoban (verl-agent's) has no BALROG protocol
    assert list(_balrog_families()) == ["babyai", "babaisai", "crafter", "textworld", "minihack", "nethack"]
    for family in _balrog_families().values():
        assert family.balrog.history_length == 16
        assert family.balrog.max_tokens == 8192
        assert set(family.balrog.verlog_tasks()) <= set(family.tasks or ("",))


def test_balrog_task_lists_episodes_caps_and_invalid_actions() -> None:
    babyai = get_family("babyai").balrog
    assert babyai.verlog_tasks() == ("goto", "pickup", "open", "putnext", "pick_up_seq_go_to")
    assert babyai.episodes_per_task == 10 and babyai.invalid_action == "go forward"
    baba = get_family("babaisai").balrog
    assert len(baba.tasks) == 40 and len(set(baba.task_names())) == 40
    assert baba.episodes_per_task == 3 and baba.invalid_action == "idle"
    assert set(baba.max_steps.values()) == {100}
    assert set(get_family("babaisai").tasks) == set(baba.verlog_tasks())
    assert get_family("crafter").balrog.max_steps == {"": 2000}
    assert get_family("textworld").balrog.task_names() == ("treasure_hunter", "the_cooking_game", "coin_collector")
    assert set(get_family("textworld").balrog.max_steps.values()) == {80}
    minihack = get_family("minihack").balrog
    assert len(minihack.tasks) + len(minihack.left_out) == 8 and minihack.invalid_action == "north"
    nethack = get_family("nethack").balrog
    assert nethack.max_steps == {"": 100_000} and nethack.invalid_action == "esc"


def test_register_family_and_unknown_names() -> None:
    family = EnvFamily(
        name="toy-test",
        tasks=("a",),
        make=lambda task, seed, **kw: None,  # type: ignore[arg-type,return-value]
        progression=lambda info: 0.0,
        balrog=BalrogSettings(tasks=(("A", "a"),)),
    )
    register_family(family)
    try:
        assert "toy-test:a" in list_envs()
        with pytest.raises(ValueError, match="already registered"):
            register_family(family)
    finally:
        FAMILIES.unregister("toy-test")
    with pytest.raises(ValueError, match="unknown protocol 'bogus'; valid: verlog, balrog"):
        make_env("babyai:goto", protocol="bogus")
    with pytest.raises(ValueError, match="Boxoban-Hard is left out"):
        make_env("minihack:Boxoban-Hard")


def test_suite_file_matches_the_families() -> None:
    suite = yaml.safe_load(SUITE.read_text())
    assert list(suite) == list(_balrog_families())
    for name, entry in suite.items():
        settings = get_family(name).balrog
        shared = entry["graph_kwargs"]
        assert shared["protocol"] == "balrog" and shared["history_turns"] == 16 and shared["max_tokens"] == 8192
        assert entry["overrides"]["rollout.episode_timeout_s"] is None  # BALROG has no episode time limit
        assert entry["overrides"]["eval.episodes"] == settings.episodes_per_task
        caps = set(settings.max_steps.values())
        assert shared["max_steps"] == (caps.pop() if caps else None)
        # the graphs carry the recursion limit of their step cap: a suite (or --graph-kwargs) that
        # changes max_steps needs no recursion limit of its own, which would go stale
        assert not any("recursion_limit" in key for key in entry["overrides"])
        tasks = [next(iter(t["graph_kwargs"].values())) for t in entry.get("tasks", [])]
        assert tasks == [t for t in settings.verlog_tasks() if t]


@pytest.mark.parametrize("family", ["babyai", "textworld", "minihack"])
def test_suite_graphs_let_episodes_reach_their_cap_whatever_max_steps_is(family: str) -> None:
    """A suite task's graph, built with the suite's settings or a smoke run's ``max_steps``,
    carries a recursion limit its longest episode fits in (3 supersteps a step)."""
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    from verlog.graph_file import load_graph_file

    entry = yaml.safe_load(SUITE.read_text())[family]
    config = yaml.safe_load((SUITE.parent / entry["config"]).read_text())
    graph_file = load_graph_file(ROOT / config["multi_turn"]["langgraph"]["path"])
    task = entry["tasks"][-1]["graph_kwargs"]
    for max_steps in (entry["graph_kwargs"]["max_steps"], 100, 300):
        kwargs = {**entry["graph_kwargs"], **task, "max_steps": max_steps}
        graph = graph_file.build(FakeListChatModel(responses=["x"]), **kwargs)
        cap = max_steps
        if cap is None:  # the level's own (BabyAI under BALROG: minigrid's, 128 for this task)
            env = make_env(f"{family}:{next(iter(task.values()))}", protocol="balrog")
            env.reset(0)
            cap = env.max_steps
        assert graph.config["recursion_limit"] >= 3 * cap + 1, (family, max_steps)


# --------------------------------------------------------------------------------------------
# BabyAI


@pytest.mark.parametrize("task", list(BABYAI_CAPS))
def test_babyai_balrog_levels_objects_caps_and_exclusions(task: str) -> None:
    env = make_env(f"babyai:{task}", protocol="balrog")
    for seed in range(12):
        env.reset(seed)
        level = env.level
        objects = [o for o in level.grid.grid if o is not None and o.type in ("key", "ball", "box")]
        assert env.max_steps == BABYAI_CAPS[task]
        if task in ("goto", "pickup"):
            assert len(objects) == 1 and (level.width, level.height) == (8, 8)
        elif task == "open":
            doors = [o for o in level.grid.grid if o is not None and o.type == "door"]
            assert [o.type for o in objects] == ["key"] and len(doors) == 1 and doors[0].is_locked
            assert objects[0].color == doors[0].color in ("yellow", "green", "blue", "purple")
            assert (level.width, level.height) == (15, 8)
        else:
            assert len(objects) == 2
        for pair in ("yellow box", "red key", "red door", "green ball", "grey door"):
            assert pair not in level.mission


def _recording_script():
    """``tests/data/babyai_balrog_levels.py``, which recorded BALROG's BabyAI levels and texts
    from BabyAI-Text's own code."""
    import importlib.util

    script = ROOT / "tests" / "data" / "babyai_balrog_levels.py"
    spec = importlib.util.spec_from_file_location("babyai_balrog_levels", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _recorded_levels() -> tuple[dict[str, list[str]], object]:
    """BALROG's levels recorded from BabyAI-Text's own generator, and the script's ``level_key``."""
    import json

    script = _recording_script()
    return json.loads(script.OUT.read_text()), script.level_key


@pytest.mark.parametrize("task", list(BABYAI_CAPS))
def test_babyai_balrog_texts_equal_balrogs_step_for_step(task: str) -> None:
    """Every observation of 20 episodes per task played with random actions (seeds 0-19), as
    BALROG's BabyAI-Text wrapper gives it after each step, down to the episode's end."""
    import json

    from verlog.envs.babyai.env import ACTIONS, BabyAITextEnv

    script = _recording_script()
    recorded = json.loads(script.TEXTS.read_text())[task]
    assert len(recorded) == 20 and tuple(ACTIONS) == script.ACTIONS
    env = BabyAITextEnv(task, protocol="balrog")
    identical = total = 0
    for seed, expected in enumerate(recorded):
        ours = [script.text_key(env.reset(seed))]
        for action in script.random_actions(seed):
            result = env.step(ACTIONS[action])
            ours.append(script.text_key(result.observation))
            if result.terminated or result.truncated:
                break
        assert len(ours) == len(expected), f"seed {seed}: {len(ours)} observations, BALROG's episode {len(expected)}"
        identical += sum(a == b for a, b in zip(ours, expected))
        total += len(expected)
    print(f"babyai/{task}: {identical}/{total} observations identical to BALROG's")
    assert identical == total


@pytest.mark.parametrize("task", list(BABYAI_CAPS))
def test_babyai_balrog_levels_equal_balrogs_for_300_seeds(task: str) -> None:
    from verlog.envs.babyai.env import BalrogTaskLevel

    recorded, level_key = _recorded_levels()
    assert len(recorded[task]) == 300
    level = BalrogTaskLevel(task)
    differing = []
    for seed, expected in enumerate(recorded[task]):
        level.reset(seed=seed)
        if level_key(level) != expected:
            differing.append(seed)
    assert differing == [], f"{task}: {len(differing)} of 300 seeds give another level than BALROG's"


def test_babyai_text_wording_of_fixed_states() -> None:
    from verlog.envs.babyai.env import describe_view_balrog

    # the encoded 7x7 view: [x][y] = (object, colour, state); the agent at (3, 6) looks up
    empty, wall, ball, door, key = 1, 2, 6, 4, 5
    red, green, blue = 0, 1, 2
    image = np.zeros((7, 7, 3), dtype=np.uint8)
    image[:, :, 0] = empty
    image[:, 2, 0] = wall  # a wall 4 steps forward
    image[0, 6, 0] = wall  # 3 steps left (nothing in between)
    image[2, 4] = (ball, red, 0)  # 1 step left and 2 steps forward
    image[3, 5] = (key, green, 0)  # right in front: 1 step forward (and it hides the wall ahead)
    image[5, 6] = (door, blue, 2)  # 2 steps right, same row
    image[6, 6, 0] = wall  # behind the door: not described
    text = describe_view_balrog(image, carrying=None)
    assert text.splitlines() == [
        "a wall 3 steps left",
        "a red ball 1 step left and 2 steps forward",
        "a green key 1 step forward",
        "a locked blue door 2 steps right",
    ]
    image[3, 5, 0] = empty
    image[5, 6] = (door, blue, 0)
    carried = type("Obj", (), {"color": "purple", "type": "box"})()
    assert describe_view_balrog(image, carrying=carried).splitlines() == [
        "You carry a purple box",
        "a wall 4 steps forward",
        "a wall 3 steps left",
        "a red ball 1 step left and 2 steps forward",
        "a open blue door 2 steps right",  # BabyAI-Text's own article
    ]


def test_babyai_balrog_answer_rule_and_default_action() -> None:
    env = make_env("babyai:goto", seed=0, protocol="balrog")
    env.reset()
    result = env.step("ACTION: turn left")  # not exactly an action: invalid, "go forward" runs
    assert result.info["valid_action"] is False and result.info["action"] == "go forward"
    assert result.reward == 0.0
    direction = env.level.agent_dir
    assert env.step(" turn left. ").info["valid_action"] is True  # stripped, punctuation dropped
    assert env.level.agent_dir == (direction - 1) % 4
    assert env.step("Turn left").info["valid_action"] is False  # case matters


def test_babyai_verlog_variant_keeps_its_own_levels() -> None:
    env = make_env("babyai:goto", seed=0)
    env.reset()
    assert env.max_steps == 128 and "Mission:" in env.reset(0)
    objects = [o for o in env.level.grid.grid if o is not None and o.type in ("key", "ball", "box")]
    assert len(objects) == 9


# --------------------------------------------------------------------------------------------
# BabaIsAI


def test_babaisai_balrog_text_of_a_fixed_state() -> None:
    from verlog.envs.babaisai import state_from_map
    from verlog.envs.babaisai.env import describe_balrog

    state = state_from_map(
        [
            "BALL IS WIN . . .",
            ". . . . . .",
            ". ball . baba . .",
            ". . . . . KEY",
            "BABA IS YOU . . .",
        ]
    )
    assert describe_balrog(state).splitlines() == [
        "Active rules:",
        "ball is win",
        "baba is you",
        "",
        "Objects on the map:",
        "rule `ball` 3 step to the left and 2 step up",  # BALROG says "step" for left and up
        "rule `is` 2 step to the left and 2 step up",
        "rule `win` 1 step to the left and 2 step up",
        "ball 2 step to the left",
        "rule `key` 2 steps to the right and 1 step down",
        "rule `baba` 3 step to the left and 2 steps down",
        "rule `is` 2 step to the left and 2 steps down",
        "rule `you` 1 step to the left and 2 steps down",
    ]


def test_babaisai_win_is_checked_with_the_previous_rules() -> None:
    from verlog.envs.babaisai import state_from_map, step

    # standing on a WIN object wins at once under the current-rules check; the original game
    # counts only a move into a cell whose object was WIN before the move
    on_ball = state_from_map(
        [
            "BALL IS WIN . .",
            ". . . . .",
            ". ball+baba . . .",
            "BABA IS YOU . .",
        ]
    )
    assert step(on_ball, "idle", "current").won and not step(on_ball, "idle", "previous").won
    walk_in = state_from_map(
        [
            "BALL IS WIN . .",
            ". . . . .",
            ". baba ball . .",
            "BABA IS YOU . .",
        ]
    )
    assert step(walk_in, "right", "previous").won and step(walk_in, "right", "current").won


def test_babaisai_balrog_answers_and_default_action() -> None:
    env = make_env("babaisai:goto_win", seed=1, protocol="balrog")
    env.reset()
    assert env.win_rule == "previous" and env.max_steps == 100 and not env.ensure_solvable
    result = env.step("ACTION: up")
    assert result.info["valid_action"] is False and result.info["action"] == "idle" and result.reward == 0.0
    assert env.step("left").info["valid_action"] is True


def test_babaisai_balrog_prints_an_empty_line_for_a_controlled_object_that_is_not_baba() -> None:
    from verlog.envs.babaisai import state_from_map
    from verlog.envs.babaisai.env import describe_balrog

    state = state_from_map(
        [
            "BALL IS YOU . .",
            ". . . . .",
            ". key ball baba .",
            "KEY IS WIN . .",
        ]
    )
    assert describe_balrog(state).split("Objects on the map:\n")[1].splitlines() == [
        "rule `ball` 2 step to the left and 2 step up",
        "rule `is` 1 step to the left and 2 step up",
        "rule `you` 2 step up",
        "key 1 step to the left",
        "",  # the ball measured from: BALROG's line for it is empty; babas are never listed
        "rule `key` 2 step to the left and 1 step down",
        "rule `is` 1 step to the left and 1 step down",
        "rule `win` 1 step down",
    ]


def test_babaisai_balrog_starts_a_new_level_when_nothing_is_you_and_goes_on() -> None:
    from verlog.envs.babaisai import make, state_from_map
    from verlog.envs.babaisai.env import broken_you_text, describe_balrog

    broken_rule = state_from_map(
        [
            "BALL IS WIN . .",
            ". . . . .",
            ". . baba . .",
            ". BABA IS YOU .",
            ". . . . .",
            ". ball . . .",
        ]
    )
    observations = []
    for _ in range(2):
        env = make("goto_win", seed=5, protocol="balrog", max_steps=3)
        env.reset(5)
        env.reset_to(broken_rule)
        result = env.step("down")  # pushes IS out of BABA IS YOU: nothing is YOU any more
        observations.append(result.observation)
        assert not result.done and result.info["levels_restarted"] == 1 and result.info["lost"] is False
        fresh = env.state
        assert result.observation == broken_you_text(_broken(broken_rule), fresh)
        assert env.step("up").observation == describe_balrog(env.state)  # the new level plays on
        last = env.step("up")
        assert last.truncated and last.info["step"] == 3  # the step count ran on: BALROG's cap holds
    assert observations[0] == observations[1]  # the new level is drawn from the episode's seed
    text = observations[0]
    assert text.startswith(
        "[...] IS YOU rule was broken, environment resetActive rules:\nball is win\n\n"
        "Objects on the map:\ndefaultdict(<function BabaIsAIWrapper.textworld_process_obsv.<locals>."
        "<lambda> at 0x7f0000000000>, {'text': {'long_term_context': 'Active rules:\\n"
    )
    assert text.endswith(
        "'short_term_context': ''}, 'image': <PIL.Image.Image image mode=RGB size=256x256 at 0x7F0000000000>})"
    )


def _broken(state):
    from verlog.envs.babaisai import step

    return step(state, "down", "previous").state


def test_babaisai_balrog_stacks_the_extra_win_rule_over_the_words_there() -> None:
    from verlog.envs.babaisai import make
    from verlog.envs.babaisai.levels import generate

    def stacked(level) -> bool:
        cells = [(x, y) for _, x, y in level.state.iter_words()]
        return len(cells) != len(set(cells))

    task = "two_room-make_win-distr_win_rule"
    draws = [generate(task, random.Random(seed), ensure_solvable=False, stack_words=True) for seed in range(60)]
    assert 5 <= sum(map(stacked, draws)) <= 30  # a quarter of BALROG's draws start with a stack
    assert not any(stacked(generate(task, random.Random(s), ensure_solvable=False)) for s in range(60))  # verlog's
    seed = next(s for s in range(60) if stacked(draws[s]))
    env = make(task, protocol="balrog")
    env.reset(seed)
    assert stacked(env.level)


def test_babaisai_a_push_moves_the_upper_word_of_a_stack_alone() -> None:
    from verlog.envs.babaisai import state_from_map, step
    from verlog.envs.babaisai.env import describe_balrog

    state = state_from_map(
        [
            "BALL IS WIN . .",
            ". . . . .",
            "baba KEY+WIN . . .",  # WIN lies on KEY
            ". . . . .",
            "BABA IS YOU . .",
        ]
    )
    assert "rule `win` 1 step to the right\n" in describe_balrog(state) and "`key`" not in describe_balrog(state)
    for rule in ("previous", "current"):
        first = step(state, "right", rule).state
        words = {(x, y): k for k, x, y in first.iter_words()}
        assert len(words) == len(first.words) and first.you_positions() == state.you_positions()  # baba stays
        second = step(first, "right", rule).state
        assert second.you_positions() == [(2, 3)]  # now KEY and WIN move on together


def test_babaisai_balrog_plays_the_originals_stacks() -> None:
    """NOUN IS NOUN puts a new object over the old one, which comes back when uncovered; a YOU
    object moving onto another covers it; only the top of a cell acts."""
    from verlog.envs.babaisai import state_from_map, step
    from verlog.envs.babaisai.game import object_kind

    def things(state, cell):
        return (
            [k for k, x, y in state.iter_buried() if (x, y) == cell],
            [k for k, x, y in state.iter_objects() if (x, y) == cell],
        )

    ball, key = object_kind("ball"), object_kind("key")
    state = state_from_map(
        [
            "BALL IS YOU . . .",
            ". . . . . .",
            ". key . . . .",
            "KEY IS . BALL baba .",
            "BABA IS YOU . . .",
        ]
    )
    made = step(state, "left", "previous").state  # KEY IS BALL: a ball over the key
    assert things(made, (2, 3)) == ([key], [ball])
    moved = step(made, "up", "previous").state  # the ball (YOU) leaves: the key comes back, turned again
    assert things(moved, (2, 2)) == ([], [ball]) and things(moved, (2, 3)) == ([key], [ball])
    covered = step(moved, "down", "previous").state  # the upper ball moves down onto the other one
    assert things(covered, (2, 3)) == ([key, ball], [ball]) and things(covered, (2, 2)) == ([], [])
    assert things(step(state, "left", "current").state, (2, 3)) == ([], [ball])  # verlog's: turned in place


@pytest.mark.parametrize("seed", [0, 1])
def test_babaisai_levels_follow_the_benchmark_layouts(seed: int) -> None:
    from verlog.envs.babaisai.levels import TASKS, generate

    assert len(TASKS) == 40
    for task in TASKS:
        level = generate(task, random.Random(seed), ensure_solvable=False)
        rules = level.state.rules.texts()
        assert "baba is you" in rules
        assert (level.state.width, level.state.height) == ((8, 8) if task.startswith(("goto", "make")) else (13, 9))
        if task.startswith("two_room"):  # the dividing column of walls
            assert {(x, y) for k, x, y in level.state.iter_objects() if k == 1} == {(6, y) for y in range(1, 8)}


# --------------------------------------------------------------------------------------------
# Crafter


def _blank_crafter(protocol: str = "balrog"):
    """A Crafter game under BALROG's protocol whose 13x11 area around the player is all grass with
    no creature: the tests below lay out fixed states on it."""
    from verlog.envs.crafter.env import CrafterTextEnv

    env = CrafterTextEnv(seed=0, protocol=protocol)
    env.reset(0)
    world, player = env.game._world, env.game._player
    for obj in world.objects:
        if obj is not player:
            world.remove(obj)
    px, py = (int(v) for v in player.pos)
    for dx in range(-6, 7):
        for dy in range(-5, 6):
            world[(px + dx, py + dy)] = "grass"
    player.facing = np.array([0, 1])
    return env, world, player, (px, py)


def test_crafter_balrog_settings_and_action_names() -> None:
    from verlog.envs.crafter.balrog_text import BALROG_ACTIONS

    crafter = get_family("crafter").balrog
    assert crafter.task_names() == ("default",) and crafter.max_steps == {"": 2000}
    assert crafter.episodes_per_task == 10 and crafter.invalid_action == "Noop"
    assert dict(crafter.env_kwargs) == {"protocol": "balrog"}
    assert BALROG_ACTIONS == (
        "Noop",
        "Move West",
        "Move East",
        "Move North",
        "Move South",
        "Do",
        "Sleep",
        "Place Stone",
        "Place Table",
        "Place Furnace",
        "Place Plant",
        "Make Wood Pickaxe",
        "Make Stone Pickaxe",
        "Make Iron Pickaxe",
        "Make Wood Sword",
        "Make Stone Sword",
        "Make Iron Sword",
    )
    env = make_env("crafter", protocol="balrog")
    assert env.max_steps == 2000 and env.invalid_action_penalty == 0.0 and env.valid_actions() == list(BALROG_ACTIONS)
    assert "ACTION" not in env.instruction and "Move West" in env.instruction
    verlog = make_env("crafter")
    assert verlog.max_steps == 400 and "move left" in verlog.valid_actions()


def test_crafter_balrog_reset_plays_a_noop_and_answers_are_exact() -> None:
    import crafter

    from verlog.envs.crafter.env import _TextCrafter

    env = make_env("crafter", protocol="balrog")
    env.reset(5)
    twin = _TextCrafter(seed=None, length=None)
    twin.reseed(5)
    twin.reset()
    assert env.game._step == 1 and twin._step == 0  # BALROG's wrapper steps Noop once on reset
    twin.step(0)
    assert (env.game._sem_view() == twin._sem_view()).all()
    assert isinstance(env.game, crafter.Env)
    facing = tuple(env.game._player.facing)
    result = env.step("move west")  # not exactly an action: Noop runs, no penalty
    assert result.info["valid_action"] is False and result.info["action"] == "Noop" and result.reward == 0.0
    assert tuple(env.game._player.facing) == facing
    result = env.step(" Move West. ")  # stripped, punctuation dropped: valid
    assert result.info["valid_action"] is True and result.info["action"] == "Move West"
    assert tuple(env.game._player.facing) == (-1, 0)
    assert result.info["history_observation"] == env.history_observation
    assert result.observation.endswith(env.history_observation)
    assert result.info["progression"] == len(result.info["achievements"]) / 22


def _world_state(game) -> tuple:
    """What must agree between two Crafter games step for step: the random generator's state,
    the player, and every object's kind, position and health."""
    _, key, pos, *_ = game._world.random.get_state()
    objects = sorted((type(o).__name__, int(o.pos[0]), int(o.pos[1]), float(o.health)) for o in game._world.objects)
    return int(pos), np.asarray(key).tobytes(), tuple(int(v) for v in game._player.pos), tuple(objects)


def test_crafter_balrog_random_stream_follows_the_rendered_game_through_nights(seed: int = 3) -> None:
    """BALROG renders every Crafter frame at 256x256 (the game's own step, then its language
    wrapper's ``render()``), and a night frame draws noise from the game's generator. verlog
    renders nothing but draws the same numbers: over 620 steps (two nights, steps 148-272 and
    448-572 of the day cycle; the wandering player's health is restored alike in every game) its
    game is the rendered game's, state for state, and without the draws it is not."""
    import crafter

    from verlog.envs.crafter import BALROG_IMAGE_SIZE
    from verlog.envs.crafter.balrog_text import BALROG_ACTIONS
    from verlog.envs.crafter.env import _TextCrafter

    class Rendered(_TextCrafter):  # the real image, as BALROG's crafter.Env(size=(256, 256)) renders it
        def _obs(self):
            return crafter.Env._obs(self)

    assert BALROG_IMAGE_SIZE == (256, 256)  # balrog/config/config.yaml: crafter_kwargs.size
    rendered = Rendered(seed=None, length=None, size=BALROG_IMAGE_SIZE)
    rendered.reseed(seed)
    rendered.reset()
    rendered.step(0)
    assert rendered.render().shape == (256, 256, 3)  # BALROG's wrapper renders the observation too
    ours = make_env("crafter", protocol="balrog")
    ours.reset(seed)
    plain = _TextCrafter(seed=None, length=None)  # verlog's protocol: no draws
    plain.reseed(seed)
    plain.reset()
    plain.step(0)
    rng = random.Random(seed)
    nights, diverged = 0, None
    assert _world_state(ours.game) == _world_state(rendered)
    for step in range(1, 621):
        name = rng.choice(BALROG_ACTIONS[:6])  # moves, Noop and Do: the player wanders
        rendered.step(BALROG_ACTIONS.index(name))
        rendered.render()
        ours.step(name)
        plain.step(BALROG_ACTIONS.index(name))
        assert _world_state(ours.game) == _world_state(rendered), f"step {step}"
        nights += rendered._world.daylight < 0.5
        if diverged is None and _world_state(plain) != _world_state(rendered):
            diverged = rendered._step
        for game in (rendered, ours.game, plain):  # zombies kill a wanderer at night: keep it alive, alike
            game._player.health = 9
    assert nights >= 2 * 120, "the episode must see two whole nights"
    assert diverged == 148  # the game's first night frame: without the draws the stream parts there


def test_crafter_balrog_texts_equal_balrogs_wrapper_over_long_episodes() -> None:
    """Every observation (the newest one's text and what the history keeps) of three long
    episodes through nights, as BALROG's own Crafter language wrapper gave them rendering every
    image (``tests/data/crafter_balrog_texts.py`` recorded them): verlog's text and its game's
    random stream are BALROG's."""
    import importlib.util
    import json

    from verlog.envs.crafter.balrog_text import BALROG_ACTIONS
    from verlog.envs.crafter.env import CrafterTextEnv

    path = ROOT / "tests" / "data" / "crafter_balrog_texts.py"
    spec = importlib.util.spec_from_file_location("crafter_balrog_texts", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    recorded = json.loads(script.OUT.read_text())
    env = CrafterTextEnv(protocol="balrog")
    identical = total = 0
    for seed, expected in recorded.items():
        ours = [script.text_key(env.reset(int(seed)), env.history_observation)]
        for _, action in zip(range(script.STEPS), script.random_actions(int(seed))):
            result = env.step(BALROG_ACTIONS[action])
            ours.append(script.text_key(result.observation, env.history_observation))
            env.game._player.health = 9
            if result.done:
                break
        assert len(ours) == len(expected), f"seed {seed}: {len(ours)} observations, BALROG's episode {len(expected)}"
        identical += sum(a == b for a, b in zip(ours, expected))
        total += len(expected)
    print(f"crafter: {identical}/{total} observations identical to BALROG's")
    assert total > 1500 and identical == total


def test_crafter_balrog_text_of_a_fixed_state() -> None:
    from crafter import objects

    env, world, player, (px, py) = _blank_crafter()
    world[(px - 2, py - 1)] = "tree"  # 3 steps north-west ...
    world[(px - 1, py - 2)] = "tree"  # ... and this one, also 3 steps, is found later (column by column from the west)
    world[(px + 3, py)] = "water"
    world[(px, py + 1)] = "stone"  # in front (the player faces south)
    world[(px - 4, py + 3)] = "table"  # the area's south-west corner: 7 steps
    world[(px + 4, py - 3)] = "lava"  # the north-east corner
    world[(px + 5, py)] = "diamond"  # out of the 9x7 area: not seen
    world.add(objects.Cow(world, (px + 1, py - 1)))
    player.inventory.update({"wood": 3, "wood_pickaxe": 1, "sapling": 0, "food": 7})
    current, past = env._render(), env.history_observation
    assert past == (
        "You see:\n"  # kinds in the order first met, column by column from the west; the nearest of each
        "- grass 1 step to your west\n"
        "- table 7 steps to your south-west\n"
        "- tree 3 steps to your north-west\n"
        "- stone 1 step to your south\n"
        "- cow 2 steps to your north-east\n"
        "- water 3 steps to your east\n"
        "- lava 7 steps to your north-east\n"
        "\n"
        "You face stone at your front."
    )
    assert current == (
        "Your status:\n- health: 9/9\n- food: 7/9\n- drink: 9/9\n- energy: 9/9\n\n"
        "Your inventory:\n- wood: 3\n- wood_pickaxe: 1\n" + past
    )


def test_crafter_balrog_text_asleep_dead_and_at_the_worlds_edge() -> None:
    env, world, player, (px, py) = _blank_crafter()
    player.sleeping = True
    asleep = env._render()
    assert asleep.startswith("Your status:\n") and "You have nothing in your inventory.\nYou are sleeping" in asleep
    assert env.history_observation == (
        "You are sleeping, and will not be able take actions until energy is full.\n\n\n\n"  # BALROG's two blank lines
        "You see:\n- grass 1 step to your west\n\nYou face grass at your front."
    )
    player.sleeping, player.health = False, 0
    env._render()
    assert env.history_observation.startswith("You died.\n\n\n\nYou see:")
    player.health = 9
    # near the world's west edge BALROG's slice of the map is empty: nothing seen, nothing faced
    world.move(player, (2, py))
    env._render()
    assert env.history_observation == "You see nothing away from you.\n\nYou face nothing at your front."


def test_crafter_balrog_graph_prompt_keeps_only_the_long_term_part() -> None:
    import asyncio

    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    from verlog.graph_file import load_graph_file

    prompts: list = []

    class Recording(GenericFakeChatModel):
        async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):  # type: ignore[override]
            prompts.append(messages)
            return await super()._agenerate(messages, stop=stop, run_manager=run_manager, **kwargs)

    model = Recording(messages=iter(AIMessage(a) for a in ["Do", "!!", "Sleep"]))
    graph = load_graph_file(Path(__file__).resolve().parents[1] / "graphs" / "crafter.py").build(
        model, protocol="balrog", history_turns=16, max_tokens=8192, max_steps=3
    )
    state = asyncio.run(graph.ainvoke({"seed": 4}))
    assert state["steps"] == 3 and state["info"]["action"] == "Sleep"
    third = prompts[2]
    assert [type(m).__name__ for m in third] == [
        "HumanMessage",
        "HumanMessage",
        "AIMessage",
        "HumanMessage",
        "HumanMessage",
    ]  # the empty answer ("!!" cleaned) adds no message
    assert third[1].content.startswith("Observation:\nYou see") and "Your status" not in third[1].content
    assert third[3].content.startswith("Observation:\nYou see")
    # "!!" ran Noop: BALROG's note heads the long-term part, after the status and inventory
    note = balrog_protocol.invalid_answer_note("Noop")
    assert third[4].content.startswith("Current Observation:\nYour status:\n")
    assert f"inventory.\n{note}You see" in third[4].content
    assert state["history"][-1][0].startswith(note + "You see")  # and the history keeps it


# --------------------------------------------------------------------------------------------
# the naive agent's prompt


def test_balrog_prompt_keeps_16_observations_and_cleaned_answers() -> None:
    history = [(f"obs {i}", f"answer {i}") for i in range(20)]
    messages = balrog_protocol.build_prompt("the rules", history, "obs 20")
    assert isinstance(messages[0], HumanMessage) and messages[0].content == "the rules"
    observations = [m for m in messages[1:] if isinstance(m, HumanMessage)]
    answers = [m for m in messages[1:] if isinstance(m, AIMessage)]
    assert len(observations) == 16 and len(answers) == 16
    assert isinstance(messages[1], AIMessage) and messages[1].content == "answer 4"  # the window starts with an answer
    assert observations[0].content == "Observation:\nobs 5"
    assert observations[-1].content == f"Current Observation:\nobs 20\n\n{balrog_protocol.ANSWER_RULE}"
    assert balrog_protocol.clean_answer("  go forward!\n") == "go forward"
    assert balrog_protocol.parse_answer("ACTION: left", ["left"]) is None


def test_balrog_prompt_leaves_empty_answers_out_and_textless_older_observations() -> None:
    """BALROG records no action for an answer that is empty once cleaned; its window is the last
    32 events, and only the newest 16 observations in it keep their text."""
    history = [(f"obs {i}", "" if i % 2 else f"answer {i}") for i in range(24)]  # every odd answer empty
    messages = balrog_protocol.build_prompt("the rules", history, "obs 24")
    window = messages[1:]  # 24 observations, 12 answers and the current one: the last 32 events
    assert len(window) == 32 and window[0].content == "Observation:"  # obs 3, beyond the newest 16
    answers = [m.content for m in window if isinstance(m, AIMessage)]
    assert answers == [f"answer {i}" for i in range(4, 24, 2)]  # the empty ones left no message
    observations = [m.content for m in window if isinstance(m, HumanMessage)]
    assert len(observations) == 22 and observations[:6] == ["Observation:"] * 6  # obs 3-8: no text
    assert observations[6] == "Observation:\nobs 9" and observations[-2] == "Observation:\nobs 23"
    assert observations[-1] == f"Current Observation:\nobs 24\n\n{balrog_protocol.ANSWER_RULE}"
    short = balrog_protocol.build_prompt("r", [("a", ""), ("b", "go")], "c")
    assert [m.content for m in short[1:]] == [
        "Observation:\na",
        "Observation:\nb",
        "go",
        f"Current Observation:\nc\n\n{balrog_protocol.ANSWER_RULE}",
    ]


def test_play_shows_only_what_the_model_reads() -> None:
    from verlog.envs.play import play

    lines: list[str] = []
    play("babyai:goto", seed=0, agent="bot", print_fn=lines.append, protocol="balrog")
    text = "\n".join(lines)
    assert "Valid actions" not in text and "Current Observation:" in text
    assert balrog_protocol.ANSWER_RULE in text
    assert model_message("obs", "", "verlog") == "Current Observation:\nobs"


@pytest.mark.parametrize("name", ["babyai:goto", "crafter", "babaisai:goto_win"])
def test_play_random_and_bots_answer_in_balrogs_format(name: str) -> None:
    """Scripted players answer ``ACTION: <action>`` (verlog's format); under BALROG's protocol
    ``verlog play`` passes the action alone, which BALROG's exact-match rule accepts."""
    from verlog.envs.play import play

    for agent in ("random", "bot"):
        lines: list[str] = []
        summary = play(name, seed=3, agent=agent, max_steps=12, print_fn=lines.append, protocol="balrog")
        answers = [line for line in lines if line.startswith("> ")]
        assert answers and not any("ACTION" in a for a in answers), answers
        assert not any("(invalid answer)" in line for line in lines), agent
        assert summary["steps"] == len(answers)
    assert balrog_protocol.bare_answer("I go on.\nACTION: go forward ") == "go forward"
    assert balrog_protocol.bare_answer(" north") == "north"


def test_play_puts_balrogs_note_where_the_graph_does() -> None:
    """After an invalid answer NetHack's next message shows the inventory, then BALROG's note,
    then the rest, as the graph's prompt does (the note heads the long-term part)."""
    pytest.importorskip("minihack")
    from verlog.envs.play import play

    lines: list[str] = []
    typed = iter(["zap", "quit"])
    play(
        "minihack:MazeWalk-9x9",
        seed=0,
        agent="human",
        input_fn=lambda _prompt: next(typed),
        print_fn=lines.append,
        protocol="balrog",
    )
    second = next(line for line in lines if line.startswith(f"{RULE}\nTURN 2"))
    note = balrog_protocol.invalid_answer_note("north")
    before, after = second.split(note)
    assert "inventory:" in before and after.startswith("message:\n") and "inventory:" not in after


# --------------------------------------------------------------------------------------------
# the oracles under BALROG's protocol (quick; the 200-seed runs are marked slow)


def _oracle_wins(name: str, seeds: range, **kwargs: object) -> int:
    env = make_env(name, protocol="balrog", **kwargs)
    wins = 0
    for seed in seeds:
        results = play_steps(env, make_bot(env, name), seed=seed)
        wins += bool(results[-1].info.get("success"))
    return wins


def test_babyai_bot_wins_under_balrog_quick() -> None:
    for task in BABYAI_CAPS:
        assert _oracle_wins(f"babyai:{task}", range(4)) == 4


def test_babaisai_solver_wins_under_balrog_quick() -> None:
    tasks = ["goto_win", "make_win-distr_obj_rule", "two_room-goto_win-distr_obj", "two_room-maybe_break_stop-goto_win"]
    for task in tasks:
        assert _oracle_wins(f"babaisai:{task}", range(2)) == 2


@pytest.mark.slow
def test_babyai_bot_wins_200_fresh_seeds_per_task_under_balrog() -> None:
    for task in BABYAI_CAPS:
        assert _oracle_wins(f"babyai:{task}", range(50_000, 50_200)) >= 198, task


@pytest.mark.slow
def test_babaisai_solver_wins_200_fresh_seeds_over_the_40_tasks_under_balrog() -> None:
    # 5 fresh seeds for each of the 40 tasks, levels as drawn (no solvability check)
    tasks = get_family("babaisai").balrog.verlog_tasks()
    wins = sum(_oracle_wins(f"babaisai:{task}", range(60_000, 60_005)) for task in tasks)
    assert wins >= 198


# --------------------------------------------------------------------------------------------
# BALROG's aggregation, the resume check and wide tables


def _record(env: str, task: str, seed: int, progression: float, status: str = "ok"):
    from verlog.evaluation.results import EpisodeRecord

    return EpisodeRecord(
        episode_id=f"{env}/{task}/{seed}",
        env=env,
        task=task,
        seed=seed,
        status=status,
        turns=1,
        episode_return=0.0,
        success=progression == 100.0,
        progression=progression,
        seconds=0.0,
    )


def test_scores_pool_an_environments_episodes_leave_crashes_out_and_use_balrogs_se() -> None:
    import math

    from verlog.evaluation.results import summarize

    records = [
        _record("babyai", "goto", 0, 100.0),
        _record("babyai", "goto", 1, 0.0),
        _record("babyai", "open", 0, 100.0),
        _record("babyai", "open", 1, 100.0),
        _record("babyai", "open", 2, 100.0),
        _record("babyai", "open", 3, 0.0, status="error"),
        _record("crafter", "crafter", 0, 50.0),
    ]
    summary = summarize(records)
    goto, open_, _ = summary.tasks
    assert open_.episodes == 3 and open_.errors == 1 and open_.progression == 100.0
    assert goto.progression_se == pytest.approx(50.0 / math.sqrt(2))  # population s.d. / sqrt(n)
    babyai = summary.envs[0]
    assert babyai.episodes == 5 and babyai.progression == pytest.approx(80.0)  # pooled, not (50 + 100) / 2
    assert babyai.progression_se == pytest.approx(40.0 / math.sqrt(5))
    assert summary.overall.progression == pytest.approx((80.0 + 50.0) / 2)


def test_resume_spec_includes_the_episode_time_limit() -> None:
    from verlog.evaluation.runner import task_spec
    from verlog.evaluation.tasks import plan_tasks

    task = plan_tasks([], [], suite="balrog")[0]
    assert task.graph_kwargs["protocol"] == "balrog" and task.config.rollout.episode_timeout_s is None
    longer = plan_tasks([], ["rollout.episode_timeout_s=600"], suite="balrog")[0]
    assert task_spec(task, "m", {}) != task_spec(longer, "m", {})


def test_tables_keep_whole_task_names_in_a_pipe() -> None:
    import io

    from rich.console import Console

    from verlog.evaluation.command import print_wide
    from verlog.evaluation.report import summary_table
    from verlog.evaluation.results import summarize

    name = "two_room-maybe_break_stop-goto_win-distr_obj-irrelevant_rule"
    console = Console(file=io.StringIO(), force_terminal=False, width=80)
    print_wide(
        console, summary_table(summarize([_record("babaisai", name, 0, 0.0), _record("babaisai", "goto_win", 0, 0.0)]))
    )
    assert name in console.file.getvalue()  # type: ignore[attr-defined]


async def test_babyai_graph_under_balrog_plays_the_naive_agents_prompt() -> None:
    import asyncio

    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    from verlog.envs.babyai.env import BabyAIBotAgent
    from verlog.graph_file import load_graph_file

    env = make_env("babyai:goto", protocol="balrog")
    observation = env.reset(7)
    bot = BabyAIBotAgent(env)
    bot.reset()
    answers = ["Let me think."]  # invalid: "go forward" runs, and the next observation says so
    env.step(answers[0])
    while True:
        answers.append(bot.act(observation))
        result = env.step(answers[-1])
        observation = result.observation
        if result.done:
            break
    prompts: list = []

    class Recording(GenericFakeChatModel):
        async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):  # type: ignore[override]
            prompts.append(messages)
            return await super()._agenerate(messages, stop=stop, run_manager=run_manager, **kwargs)

    model = Recording(messages=iter(AIMessage(a) for a in answers))
    graph = load_graph_file(Path(__file__).resolve().parents[1] / "graphs" / "babyai.py").build(
        model, task="goto", protocol="balrog", history_turns=16, max_tokens=8192
    )
    state = await asyncio.wait_for(graph.ainvoke({"seed": 7}, {"recursion_limit": 400}), 60)
    assert state["info"]["success"] and state["steps"] == len(answers)
    first, second = prompts[0], prompts[1]
    assert isinstance(first[0], HumanMessage) and "go to" in first[0].content  # the instruction, a user message
    assert "did not" not in first[-1].content and "the default action was taken: go forward" in second[-1].content
    assert isinstance(second[2], AIMessage) and second[2].content == "Let me think"  # cleaned answer
