"""BALROG's progression (0-1) for every environment family, on hand-made states.

The NetHack table is BALROG's ``achievements.json``: checked against the sample values the
benchmark's source shows (Dlvl:2 0.0154, Dlvl:5 0.0265, Dlvl:10 0.1256, Xp:2 0.0185, Xp:5 0.0291,
Xp:10 0.1791; Dlvl:1 and Xp:1 are 0).
"""

from __future__ import annotations

import pytest

from verlog.envs import progression as P
from verlog.envs.registry import progression


def test_nethack_table_has_balrogs_87_values() -> None:
    table = P.nethack_table()
    assert len(table) == 87
    assert all(0.0 <= v <= 1.0 for v in table.values())
    assert table["Dlvl:1"] == 0.0 and table["Xp:1"] == 0.0
    samples = {"Dlvl:2": 0.0154, "Dlvl:5": 0.0265, "Dlvl:10": 0.1256, "Xp:2": 0.0185, "Xp:5": 0.0291, "Xp:10": 0.1791}
    for key, value in samples.items():
        assert table[key] == pytest.approx(value, abs=5e-5), key
    depths = [table[f"Dlvl:{d}"] for d in range(1, 51)]
    levels = [table[f"Xp:{x}"] for x in range(1, 31)]
    assert depths == sorted(depths) and levels == sorted(levels)  # deeper / higher is never worse
    assert table["You ascend t"] == 1.0


def test_nethack_value_is_the_better_of_depth_and_level() -> None:
    assert P.nethack_value(1, 1) == 0.0
    assert P.nethack_value(5, 1) == pytest.approx(0.0265, abs=5e-5)
    assert P.nethack_value(2, 10) == pytest.approx(0.1791, abs=5e-5)
    assert P.nethack_value(10, 5) == pytest.approx(0.1256, abs=5e-5)
    assert P.nethack_value(60, 40) == 0.0  # milestones missing from the table count 0 (as in BALROG)


def test_nethack_progress_keeps_the_episode_maximum() -> None:
    progress = P.NetHackProgress()
    assert progress.update(1, 1) == 0.0
    assert progress.update(5, 2) == pytest.approx(0.0265, abs=5e-5)
    assert progress.update(2, 3) == pytest.approx(0.0265, abs=5e-5)  # climbing back up loses nothing
    assert (progress.max_depth, progress.max_experience_level) == (5, 3)
    info = {"max_depth": 5, "max_experience_level": 3, "depth": 2, "experience_level": 3}
    assert P.nethack_progression(info) == pytest.approx(progress.value)
    assert P.nethack_progression({"depth": 10, "experience_level": 1}) == pytest.approx(0.1256, abs=5e-5)


def test_crafter_counts_distinct_achievements_over_22() -> None:
    assert P.crafter_progression({"achievements": []}) == 0.0
    assert P.crafter_progression({"achievements": ["collect_wood", "collect_wood", "place_table"]}) == pytest.approx(
        2 / 22
    )
    assert P.crafter_value(11) == pytest.approx(0.5)
    assert P.crafter_value(22) == 1.0


def test_textworld_is_score_fraction_or_win() -> None:
    assert P.textworld_progression({"score": 0, "max_score": 17, "won": False}) == 0.0
    assert P.textworld_progression({"score": 8, "max_score": 17, "won": False}) == pytest.approx(8 / 17)
    assert P.textworld_progression({"score": 8, "max_score": 17, "won": True}) == 1.0
    assert P.textworld_progression({"score": 0, "max_score": 0, "won": False}) == 0.0


def test_goal_based_families_are_win_or_nothing() -> None:
    assert P.won_progression({"success": True}) == 1.0
    assert P.won_progression({}) == 0.0
    assert P.won_progression({"won": True}) == 1.0
    assert P.won_progression({"won": False, "success": False}) == 0.0
    assert P.minihack_progression({"success": True}) == 1.0
    assert P.minihack_progression({"success": False}) == 0.0


def test_progression_dispatches_on_the_env_name() -> None:
    assert progression("minihack:MazeWalk-9x9", {"success": True}) == 1.0
    assert progression("textworld:cooking", {"score": 17, "max_score": 17}) == 1.0
    assert progression("crafter", {"achievements": ["wake_up"]}) == pytest.approx(1 / 22)
    assert progression("nethack", {"max_depth": 2}) == pytest.approx(0.0154, abs=5e-5)
    # the running value an environment reports wins over recomputing it
    assert progression("nethack", {"progression": 0.5, "max_depth": 2}) == 0.5
    with pytest.raises(ValueError, match="families"):
        progression("zork", {})


def test_existing_environments_report_progression() -> None:
    from verlog.envs.babyai.env import BabyAIBotAgent, BabyAITextEnv
    from verlog.envs.crafter.env import CrafterTextEnv

    env = BabyAITextEnv("goto")
    observation = env.reset(1)
    bot = BabyAIBotAgent(env)
    bot.reset()
    while True:
        result = env.step(bot.act(observation))
        observation = result.observation
        assert result.info["progression"] == (1.0 if result.info.get("success") else 0.0)
        if result.done:
            break
    assert result.info["success"] and result.info["progression"] == 1.0

    crafter = CrafterTextEnv(seed=0, max_steps=5)
    crafter.reset()
    result = crafter.step("ACTION: noop")
    assert result.info["progression"] == pytest.approx(len(result.info["achievements"]) / 22)

    babaisai = pytest.importorskip("verlog.envs.babaisai")
    baba = babaisai.make("goto_win", 0, max_steps=3, ensure_solvable=False)
    baba.reset()
    assert baba.step("ACTION: idle").info["progression"] == 0.0
