"""TextWorld under BALROG's protocol, and TextWorld from many threads at once.

Pins BALROG's settings (how its games were made, the 25-game pool, the 80-command cap, 16 past
observations, 8,192-token answers, free-text commands), the text of a fixed state, the goal
removal, the walkthrough oracle, and concurrent resets (cached and freshly generated games) and
concurrent episodes through the agent graph with no error.
"""

from __future__ import annotations

import asyncio
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("textworld")

from verlog.envs.base import play_steps  # noqa: E402
from verlog.envs.textworld import BALROG_TASK_NAMES  # noqa: E402
from verlog.envs.textworld.env import (  # noqa: E402
    AMBIGUOUS,
    BALROG_POOL_SIZE,
    DEFAULT_MAX_STEPS,
    SETTINGS,
    TextWorldTextEnv,
    TextWorldWalkthroughAgent,
    _after_objective,
    balrog_command,
    balrog_feedback,
    balrog_instruction,
)


def test_balrog_settings_are_pinned() -> None:
    """How BALROG's games were made (intelligent-go-explore's make_*.py, which BALROG's README
    points to) and its protocol (balrog/config/config.yaml)."""
    assert SETTINGS["balrog"]["treasure_hunter"] == {"level": 30, "only_last_action": True, "walkthrough_length": 20}
    assert SETTINGS["balrog"]["coin_collector"] == {"level": 220, "only_last_action": True}
    assert SETTINGS["balrog"]["cooking"] == {
        "recipe": 5,
        "take": 5,
        "go": 12,
        "open": True,
        "cook": True,
        "cut": True,
        "drop": False,
        "split": "test",
        "recipe_seed": 0,
    }
    assert BALROG_POOL_SIZE == 25 and DEFAULT_MAX_STEPS == 80
    assert list(BALROG_TASK_NAMES.values()) == ["treasure_hunter", "the_cooking_game", "coin_collector"]
    env = TextWorldTextEnv("coin_collector", protocol="balrog")
    assert env.max_steps == 80 and env.pool_size == 25 and env.game_index(27) == 3  # (s + 1) % 25: BALROG's counter
    assert TextWorldTextEnv("coin_collector").pool_size is None  # verlog: every seed its own game
    from verlog.envs import get_family

    balrog = get_family("textworld").balrog
    assert balrog is not None
    assert balrog.task_names() == ("treasure_hunter", "the_cooking_game", "coin_collector")
    assert balrog.verlog_tasks() == ("treasure_hunter", "cooking", "coin_collector")
    assert dict(balrog.max_steps) == {"treasure_hunter": 80, "coin_collector": 80, "cooking": 80}
    assert balrog.history_length == 16 and balrog.max_tokens == 8192 and balrog.episodes_per_task == 10


def test_balrog_observation_is_the_games_own_text_without_the_goal() -> None:
    env = TextWorldTextEnv("coin_collector", protocol="balrog")
    observation = env.reset(24)  # game 0 of the pool: seed s plays game (s + 1) % 25
    assert env.objective == "Your objective is to retrieve the coin from the floor of the kitchenette."
    assert observation == (
        "-= Cellar =-\nYou are in a cellar. A normal one.\n\n\n\nYou don't like doors? Why not try "
        "going east, that entranceway is unblocked. There is an unguarded exit to the north. There "
        "is an unguarded exit to the west."
    )
    result = env.step("go west")
    assert result.observation.startswith("-= Shower =-") and ">" not in result.observation  # no status line
    assert "Valid actions" not in result.observation and "Score:" not in result.observation
    assert env.step("goal").observation == ""  # the goal printed on request is removed too
    instruction = env.instruction
    assert env.objective not in instruction and "ACTION" not in instruction
    assert "25 steps" in instruction and "take coin" in instruction


def test_balrog_commands_are_free_text_and_never_invalid() -> None:
    assert balrog_command("  take non-euclidean key!\n") == "take noneuclidean key"
    assert balrog_command("ACTION: go west") == "ACTION: go west"  # the naive agent keeps it all
    env = TextWorldTextEnv("coin_collector", protocol="balrog")
    env.reset(24)
    result = env.step("fly to the moon")
    assert result.info["valid_action"] and result.info["action"] == "fly to the moon"
    assert result.reward == 0.0 and "not a verb I recognise" in result.observation
    assert env.step("").observation == "I beg your pardon?"


def test_goal_removal_tolerates_quotes_and_spacing() -> None:
    """TextWorld's ``objective`` can write ``That"s it!`` where the game prints ``That's it!``:
    the goal must still be removed from the first observation."""
    objective = 'Find the key. That"s it!'
    text = "banner\n\nFind the key.   That's it!\n\n-= Attic =-\nDusty."
    assert _after_objective(text, objective) == "\n\n-= Attic =-\nDusty."
    assert balrog_feedback(text + "\n\n>    -= Attic =-0/1", objective) == "-= Attic =-\nDusty."
    assert balrog_feedback("no goal here", objective) == "no goal here"
    env = TextWorldTextEnv("treasure_hunter", level=5)
    observation = env.reset(0)
    assert env.objective and env.objective[:40] not in observation


def test_balrog_instructions_state_balrogs_facts() -> None:
    treasure = balrog_instruction("treasure_hunter")
    assert "40 steps" in treasure and "unlock ... with ..." in treasure and "key" in treasure
    cooking = balrog_instruction("cooking")
    assert "80 steps" in cooking and "prepare meal" in cooking and "BBQ" in cooking
    with pytest.raises(ValueError, match="unknown TextWorld game"):
        balrog_instruction("zork")


@pytest.mark.parametrize("family,seeds", [("coin_collector", [24, 0]), ("cooking", [24])])  # games 0 (and 1)
def test_balrog_walkthrough_wins(family: str, seeds: list[int]) -> None:
    env = TextWorldTextEnv(family, protocol="balrog")
    for seed in seeds:
        results = play_steps(env, TextWorldWalkthroughAgent(env), seed)
        assert results[-1].info["success"] and results[-1].info["progression"] == 1.0
        assert len(results) <= 80


def _reset_and_step(family: str, seed: int, cache: Path | None, protocol: str = "verlog") -> str | None:
    try:
        env = TextWorldTextEnv(family, protocol=protocol, cache_dir=cache)
        env.reset(seed)
        for _ in range(3):
            env.step("look")
        env.close()
        return None
    except Exception as exc:  # noqa: BLE001 - the test counts every failure
        return f"{type(exc).__name__}: {exc}"


def test_16_concurrent_resets_of_cached_games() -> None:
    """TextWorld parses game files with one module-level parser: without verlog's engine lock
    nearly all of these fail (``IndexError: pop from empty list``)."""
    for seed in range(4):  # make sure the games exist
        TextWorldTextEnv("coin_collector").reset(seed)
    with ThreadPoolExecutor(16) as pool:
        errors = [e for e in pool.map(lambda i: _reset_and_step("coin_collector", i % 4, None), range(32)) if e]
    assert errors == []


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_16_concurrent_resets_of_fresh_games(tmp_path: Path) -> None:
    """16 threads reset 8 games that are not cached yet (each generated once, in child
    processes) and then 8 cached ones, BALROG's games included: no error."""
    jobs = [("coin_collector", i % 8, "verlog") for i in range(12)] + [("cooking", i % 2, "balrog") for i in range(4)]
    with ThreadPoolExecutor(16) as pool:
        errors = [e for e in pool.map(lambda job: _reset_and_step(job[0], job[1], tmp_path, job[2]), jobs) if e]
    assert errors == []


async def _run_16_episodes(protocol: str, max_steps: int) -> list:
    from verlog.envs.agent_graph import recursion_limit_for
    from verlog.graph_file import load_graph_file
    from verlog.llm import VerlogChatModel
    from verlog.models import load_tokenizer
    from verlog.rollout import run_episode
    from verlog.testing.scripted_engine import ScriptedEngine

    for seed in range(4):  # the games exist (generating them is another test's business)
        TextWorldTextEnv("coin_collector", protocol=protocol).reset(seed)
    tokenizer = load_tokenizer("tiny")
    answer = "look" if protocol == "balrog" else "ACTION: look"
    model = VerlogChatModel(engine=ScriptedEngine(tokenizer, [answer]), tokenizer=tokenizer, max_tokens=16)
    graph_file = load_graph_file(Path(__file__).resolve().parents[1] / "graphs" / "textworld.py")
    graph = graph_file.build(model, game="coin_collector", protocol=protocol, max_steps=max_steps, max_tokens=16)
    episodes = await asyncio.gather(
        *[
            run_episode(
                graph,
                graph_file.episode_input(seed % 4),
                graph_config={"recursion_limit": recursion_limit_for(max_steps)},
            )
            for seed in range(16)
        ]
    )
    assert [e.status for e in episodes] == ["ok"] * 16, [e.error for e in episodes if e.status != "ok"]
    assert all(len(e.turns) == max_steps and e.turns[-1].truncated for e in episodes)
    return episodes


async def test_16_concurrent_episodes_through_the_agent_graph() -> None:
    """16 TextWorld episodes at once through graphs/textworld.py (each in its own game, reset in
    worker threads): all finish without error."""
    await _run_16_episodes("verlog", max_steps=6)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("protocol", ["verlog", "balrog"])
async def test_16_concurrent_full_episodes_through_the_agent_graph(protocol: str) -> None:
    """16 episodes of 80 commands (BALROG's cap) at once, under each protocol: no error."""
    episodes = await _run_16_episodes(protocol, max_steps=80)
    if protocol == "balrog":  # BALROG's text: no valid-action list
        assert all("Valid actions" not in str(e.turns[-1].info) for e in episodes)


@pytest.mark.slow
@pytest.mark.timeout(7200)
@pytest.mark.parametrize("family", ["coin_collector", "cooking"])
def test_balrog_walkthrough_wins_99_percent_of_200_fresh_games(family: str) -> None:
    """BALROG's game settings and cap, 200 games (no pool: every seed its own game)."""
    env = TextWorldTextEnv(family, protocol="balrog", pool_size=None)
    wins = sum(
        bool(play_steps(env, TextWorldWalkthroughAgent(env), seed)[-1].info.get("success")) for seed in range(200)
    )
    assert wins >= 198, f"{family}: {wins}/200"


@pytest.mark.slow
@pytest.mark.timeout(14400)
def test_balrog_treasure_hunter_walkthrough_wins_every_winnable_game_of_200_fresh_ones() -> None:
    """Level 30, every seed its own game (about an hour to generate the 200 on one core). A lost
    game must be one BALROG's cleaning makes unwinnable: the parser asked which of two things was
    meant, and only a word with a character the cleaning removes tells them apart."""
    env = TextWorldTextEnv("treasure_hunter", protocol="balrog", pool_size=None)
    lost = []
    for seed in range(100_000, 100_200):
        results = play_steps(env, TextWorldWalkthroughAgent(env), seed)
        if not results[-1].info["won"]:
            options = [
                r.observation.split(AMBIGUOUS, 1)[1].split("?", 1)[0] for r in results if AMBIGUOUS in r.observation
            ]
            # "Which do you mean, portal or non-euclidean portal?": the untypeable "-" tells them apart
            assert options and all(re.search(r"[^A-Za-z\s,]", o) for o in options), (seed, options)
            lost.append(seed)
    assert len(lost) <= 3, lost  # 100080, 100148, 100180 (measured 2026-11-25)


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_balrog_treasure_hunter_pool_walkthrough_wins() -> None:
    """BALROG's 25 level-30 treasure hunter games (seconds to minutes each to generate on first use)."""
    env = TextWorldTextEnv("treasure_hunter", protocol="balrog")
    won = []
    for seed in range(BALROG_POOL_SIZE):
        results = play_steps(env, TextWorldWalkthroughAgent(env), seed)
        assert len(env.walkthrough) == 20  # BALROG's filter: 20-command walkthroughs
        won.append(bool(results[-1].info.get("success")))
    assert all(won), won


def test_registry_builds_balrogs_variant_under_its_protocol() -> None:
    from verlog.envs.registry import make_env

    env = make_env("textworld:cooking", protocol="balrog")
    assert isinstance(env, TextWorldTextEnv) and env.protocol == "balrog" and env.settings["split"] == "test"


def test_walkthrough_agent_types_what_balrogs_cleaning_lets_through() -> None:
    """BALROG keeps only letters and spaces of an answer: the oracle leaves out words it could not
    type (``frosted-glass``) and lets TextWorld's parser resolve the rest (cooking game 11 needs
    ``open frosted-glass door``)."""

    class Game:
        balrog = True
        walkthrough = ["open frosted-glass door", "go north"]

        def valid_actions(self) -> list[str]:
            return ["open frosted-glass door", "go north"]

    agent = TextWorldWalkthroughAgent(Game())  # type: ignore[arg-type]
    agent.reset()
    assert [agent.act(""), agent.act("")] == ["open door", "go north"]


@pytest.mark.slow
def test_walkthrough_agent_wins_a_game_with_a_hyphenated_door() -> None:
    env = TextWorldTextEnv("cooking", protocol="balrog", pool_size=None)
    results = play_steps(env, TextWorldWalkthroughAgent(env), 11)
    assert any("frosted-glass" in step for step in env.walkthrough) and results[-1].info["success"]


def test_walkthrough_agent_drops_each_key_after_its_last_use() -> None:
    from verlog.envs.textworld.env import keys_dropped_after_use

    plan = [
        "take key",
        "unlock gate with key",
        "open gate",
        "take non-euclidean key from box",
        "unlock gateway with non-euclidean key",
        "open gateway",
        "take keycard",
    ]
    assert keys_dropped_after_use(plan) == [
        "take key",
        "unlock gate with key",
        "drop key",
        "open gate",
        "take non-euclidean key from box",
        "unlock gateway with non-euclidean key",
        "drop non-euclidean key",
        "open gateway",
        "take keycard",
    ]
    # a key used again is dropped after its last use only
    twice = ["take latchkey", "unlock box with latchkey", "go west", "unlock door with latchkey", "go west"]
    assert keys_dropped_after_use(twice) == twice[:4] + ["drop latchkey", "go west"]


def test_walkthrough_agent_takes_without_naming_an_ambiguous_container() -> None:
    class Game:
        balrog = True
        walkthrough = ["take Canadian latchkey from chest", "unlock Canadian chest with Canadian latchkey"]

        def valid_actions(self) -> list[str]:
            return self.walkthrough

    agent = TextWorldWalkthroughAgent(Game())  # type: ignore[arg-type]
    agent.reset()
    assert agent.act("") == "take Canadian latchkey from chest"
    assert agent.act("Which do you mean, the Canadian chest or the chest?") == "take Canadian latchkey"
    assert agent.act("You take the Canadian latchkey from the chest.") == "unlock Canadian chest with Canadian latchkey"


@pytest.mark.slow
def test_fresh_treasure_hunters_that_need_the_agents_care_are_won_and_one_is_unwinnable() -> None:
    """Level-30 games where BALROG's cleaning makes names collide: 100117 and 100128 need the
    dropped keys, 100188 the plain ``take``; in 100180 a ``portal`` stands beside the locked
    ``non-euclidean portal``, which no typeable answer can name."""
    env = TextWorldTextEnv("treasure_hunter", protocol="balrog", pool_size=None)
    for seed in (100117, 100128, 100188):
        assert play_steps(env, TextWorldWalkthroughAgent(env), seed)[-1].info["won"], seed
    results = play_steps(env, TextWorldWalkthroughAgent(env), 100180)
    assert not results[-1].info["won"]
    assert any("Which do you mean, portal or non-euclidean portal?" in r.observation for r in results)


def test_walkthrough_plan_drops_steps_that_change_nothing() -> None:
    from verlog.envs.textworld.env import shortened_walkthrough

    walkthrough = [
        "inventory",
        "examine cookbook",
        "go north",
        "go south",
        "go east",
        "take knife from table",
        "dice carrot with knife",
        "drop knife",
        "take knife",
        "slice onion with knife",
        "drop knife",
        "prepare meal",
    ]
    assert shortened_walkthrough(walkthrough) == [
        "examine cookbook",
        "go east",
        "take knife from table",
        "dice carrot with knife",
        "slice onion with knife",
        "drop knife",
        "prepare meal",
    ]
