"""BabyAI in text (``verlog.envs.babyai.env``), the registry and ``play``."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from verlog.envs.actions import ANSWER_FORMAT
from verlog.envs.babyai.env import (
    ACTIONS,
    NOOP,
    TASKS,
    BabyAIBotAgent,
    BabyAITextEnv,
    run_bot_episode,
)
from verlog.envs.play import play
from verlog.envs.registry import list_envs, make_env

_OBJECT_LINE = re.compile(
    r"^- an? (?:(?P<state>open|closed|locked) )?(?P<color>\w+) (?P<kind>ball|box|key|door) "
    r"(?P<where>.+)$"
)
_OFFSET = re.compile(r"(\d+) steps? (forward|left|right)")


def offsets(where: str) -> tuple[int, int]:
    forward = right = 0
    for n, way in _OFFSET.findall(where):
        if way == "forward":
            forward += int(n)
        else:
            right += int(n) if way == "right" else -int(n)
    return forward, right


def check_objects_against_world(env: BabyAITextEnv, observation: str) -> int:
    """Every object line names what really lies at that relative position; returns the count."""
    level = env.level
    pos, fwd, rgt = np.array(level.agent_pos), level.dir_vec, level.right_vec
    count = 0
    for line in observation.splitlines():
        m = _OBJECT_LINE.match(line)
        if not m:
            continue
        forward, right = offsets(m.group("where"))
        cell = level.grid.get(*(pos + forward * fwd + right * rgt))
        assert cell is not None, line
        assert (cell.type, cell.color) == (m.group("kind"), m.group("color")), line
        if cell.type == "door":
            state = "open" if cell.is_open else "locked" if cell.is_locked else "closed"
            assert m.group("state") == state, line
        count += 1
    return count


# ------------------------------------------------------------------------------------ registry


def test_list_envs_names_every_babyai_task_and_crafter() -> None:
    names = list_envs()
    for task in TASKS:
        assert f"babyai:{task}" in names
    assert "crafter" in names
    assert len(names) == len(set(names))


def test_unknown_env_name_lists_valid_names() -> None:
    with pytest.raises(ValueError) as err:
        make_env("babyai:fly")
    message = str(err.value)
    assert "babyai:fly" in message
    for name in ("babyai:goto", "babyai:open", "babyai:putnext"):  # the family's own names
        assert name in message
    assert "crafter" not in message
    with pytest.raises(ValueError) as err:
        make_env("zork")  # ("nethack" was the example here until it became a real environment)
    assert "a family of babyai, babaisai, crafter" in str(err.value) and "e.g. babyai:goto" in str(err.value)


def test_babaisai_names_come_from_its_package() -> None:
    babaisai = pytest.importorskip("verlog.envs.babaisai")
    names = list_envs()
    for task in babaisai.TASKS:
        assert f"babaisai:{task}" in names
    env = make_env(f"babaisai:{babaisai.TASKS[0]}", seed=0, max_steps=7)
    assert env.reset()
    with pytest.raises(ValueError, match="valid names"):
        make_env("babaisai:no_such_task")


def test_make_env_passes_common_kwargs() -> None:
    env = make_env("babyai:pickup", seed=3, invalid_action_penalty=0.5, max_steps=20)
    assert isinstance(env, BabyAITextEnv)
    assert env.name == "babyai:pickup"
    env.reset()
    assert env.max_steps == 20
    assert env.step("ACTION: dance").reward == pytest.approx(-0.5)
    default = make_env("babyai:goto", max_steps=None)  # None means "the game's default"
    default.reset(0)
    assert default.max_steps == 128


# ------------------------------------------------------------------------------------ text


def test_observation_shows_mission_objects_walls_front_and_carrying() -> None:
    env = BabyAITextEnv("goto", seed=0)
    observation = env.reset()
    assert observation.startswith(f"Mission: {env.mission}\n")
    assert "\nYou see:\n" in observation
    assert re.search(r"^Directly in front of you: .+\.$", observation, re.M)
    assert observation.rstrip().endswith("You are carrying nothing.")
    # over a few turns every described object sits where the text says, walls are described
    total, walls = 0, 0
    for _ in range(4):
        total += check_objects_against_world(env, observation)
        walls += len(re.findall(r"^- a wall \d+ steps? (forward|left|right)$", observation, re.M))
        observation = env.step("ACTION: turn left").observation
    assert total > 0
    assert walls > 0


def test_positions_are_relative_to_the_agent() -> None:
    env = BabyAITextEnv("goto")
    level = env.level

    def free(cell: np.ndarray) -> bool:
        inside = 0 <= cell[0] < level.grid.width and 0 <= cell[1] < level.grid.height
        return inside and level.grid.get(*cell) is None

    # put a known object 2 steps forward and 1 step left of the agent on an empty level spot
    for seed in range(50):
        env.reset(seed)
        target = np.array(level.agent_pos) + 2 * level.dir_vec - level.right_vec
        between = np.array(level.agent_pos) + level.dir_vec
        if free(target) and free(between):
            break
    from minigrid.core.world_object import Ball

    level.grid.set(*target, Ball("purple"))
    observation = env.step("ACTION: no such action").observation  # a no-op re-renders the view
    assert "- a purple ball 2 steps forward and 1 step left" in observation


def test_doors_show_their_state_and_carrying_is_reported() -> None:
    env = BabyAITextEnv("open", seed=5)
    observation = env.reset()
    bot = BabyAIBotAgent(env)
    bot.reset()
    seen_locked = seen_carry_key = False
    door_color = None
    for _ in range(env.max_steps):
        check_objects_against_world(env, observation)
        m = re.search(r"a locked (\w+) door", observation)
        if m:
            seen_locked, door_color = True, m.group(1)
        if door_color and f"You are carrying a {door_color} key." in observation:
            seen_carry_key = True
        result = env.step(bot.act(observation))
        observation = result.observation
        if result.done:
            break
    assert result.info["success"]
    assert seen_locked and seen_carry_key
    assert f"open {door_color} door" in observation  # toggled open with the key


def test_front_cell_is_described() -> None:
    env = BabyAITextEnv("pickup", seed=2)
    observation = env.reset()
    bot = BabyAIBotAgent(env)
    bot.reset()
    while True:
        answer = bot.act(observation)
        if answer.endswith("pick up"):
            # about to pick up: the object is directly in front
            m = re.search(r"^Directly in front of you: an? (\w+ \w+)\.$", observation, re.M)
            assert m and m.group(1).split()[1] in ("ball", "box", "key")
            picked = m.group(1)
        result = env.step(answer)
        observation = result.observation
        if result.done:
            break
    assert result.info["success"]
    assert f"You are carrying a {picked}." in observation


def test_instruction_has_rules_goal_actions_and_answer_format() -> None:
    env = BabyAITextEnv("pick_up_seq_go_to", seed=4)
    env.reset()
    text = env.instruction
    assert env.mission in text
    for action in ACTIONS:
        assert f"- {action}:" in text
    assert ANSWER_FORMAT in text
    assert "128 steps" in text
    assert env.valid_actions() == list(ACTIONS)


# ------------------------------------------------------------------------------------ rules


def test_same_seed_same_text() -> None:
    def transcript(env: BabyAITextEnv) -> list[str]:
        texts = [env.reset(), env.instruction]
        for i in range(15):
            texts.append(env.step(f"ACTION: {ACTIONS[i * 7 % 6]}").observation)
        return texts

    assert transcript(BabyAITextEnv("goto", seed=11)) == transcript(BabyAITextEnv("goto", seed=11))
    assert BabyAITextEnv("goto", seed=11).reset() != BabyAITextEnv("goto", seed=12).reset()
    # reset(seed) overrides, and a seeded env replays the same sequence of episodes
    a, b = BabyAITextEnv("open", seed=3), BabyAITextEnv("open")
    assert a.reset() == b.reset(3)
    assert [a.reset() for _ in range(3)] == [b.reset() for _ in range(3)]


def test_invalid_action_is_a_penalised_noop() -> None:
    env = BabyAITextEnv("goto", seed=0)
    before = env.reset()
    agent_state = (tuple(env.level.agent_pos), env.level.agent_dir)
    result = env.step("I don't know.\nACTION: jump")
    assert result.reward == pytest.approx(-0.1)
    assert result.info["valid_action"] is False
    assert result.info["action"] == NOOP
    assert result.info["step"] == 1
    assert result.observation == before
    assert (tuple(env.level.agent_pos), env.level.agent_dir) == agent_state
    valid = env.step("ACTION: turn left")
    assert valid.reward == 0.0 and valid.info["valid_action"] is True
    assert valid.info["action"] == "turn left"


def test_invalid_action_can_run_a_chosen_default() -> None:
    env = make_env("babyai:goto", seed=0, default_action="turn right")
    assert isinstance(env, BabyAITextEnv)
    env.reset()
    direction = env.level.agent_dir
    result = env.step("???")
    assert result.info["action"] == "turn right"
    assert env.level.agent_dir == (direction + 1) % 4
    with pytest.raises(ValueError):
        BabyAITextEnv("goto", default_action="jump")


def test_step_cap_truncates() -> None:
    env = BabyAITextEnv("goto", seed=0, max_steps=5)
    env.reset()
    for i in range(5):
        result = env.step("ACTION: turn left")
        assert "success" not in result.info or i == 4
    assert result.truncated and not result.terminated
    assert result.info["success"] is False
    with pytest.raises(RuntimeError):
        env.step("ACTION: turn left")


def test_success_reward_is_exactly_one() -> None:
    env = BabyAITextEnv("goto", seed=7)
    observation = env.reset()
    bot = BabyAIBotAgent(env)
    bot.reset()
    rewards = []
    while True:
        result = env.step(bot.act(observation))
        observation = result.observation
        rewards.append(result.reward)
        if result.done:
            break
    assert result.terminated and result.info["success"] is True
    assert rewards[-1] == 1.0 and sum(rewards) == 1.0


def test_unknown_task_and_layout() -> None:
    with pytest.raises(ValueError):
        BabyAITextEnv("fly")
    with pytest.raises(ValueError):
        BabyAITextEnv("goto", layout="castle")


# ------------------------------------------------------------------------------------ oracle


@pytest.mark.parametrize("task", TASKS)
def test_bot_through_text_wins_200_seeded_episodes(task: str) -> None:
    env = make_env(f"babyai:{task}")
    assert isinstance(env, BabyAITextEnv)
    started = time.perf_counter()
    wins = sum(run_bot_episode(env, seed)[0] for seed in range(200))
    elapsed = time.perf_counter() - started
    print(f"babyai:{task}: bot won {wins}/200 in {elapsed:.1f} s")
    assert wins >= 198


@pytest.mark.parametrize("task", TASKS)
def test_bot_wins_the_maze_layout(task: str) -> None:
    env = BabyAITextEnv(task, layout="maze")
    wins = sum(run_bot_episode(env, seed)[0] for seed in range(10))
    assert wins >= 9


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
def test_bot_wins_200_maze_episodes(task: str) -> None:
    env = BabyAITextEnv(task, layout="maze")
    wins = sum(run_bot_episode(env, seed)[0] for seed in range(200))
    assert wins >= 198


# ------------------------------------------------------------------------------------ play


def test_play_with_the_bot_prints_what_the_model_reads() -> None:
    lines: list[str] = []
    summary = play("babyai:goto", seed=3, agent="bot", print_fn=lines.append)
    text = "\n".join(lines)
    env = BabyAITextEnv("goto", seed=3)
    first = env.reset()
    assert env.instruction in text
    assert f"Current Observation:\n{first}" in text
    assert "Valid actions: turn" not in text  # the model never reads such a line
    assert summary["success"] is True
    assert summary["return"] == pytest.approx(1.0)


def test_play_reads_human_answers_until_quit() -> None:
    answers = iter(["left", "ACTION: go forward", "nonsense", "quit"])
    lines: list[str] = []
    summary = play("babyai:pickup", seed=0, input_fn=lambda _: next(answers), print_fn=lines.append)
    assert summary["steps"] == 3 and summary["stopped"] is True
    assert summary["return"] == pytest.approx(-0.1)
    assert any("(invalid answer)" in line for line in lines)


def test_play_rejects_unknown_agent() -> None:
    with pytest.raises(ValueError):
        play("babyai:goto", agent="robot")
