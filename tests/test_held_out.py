"""Held-out levels are held out by content: no training seed draws a level whose puzzle (walls,
targets, boxes; objects, doors, mission) a held-out seed draws, while each side keeps the game's
own distribution and every seed means one level."""

from __future__ import annotations

import pytest

from verlog.config import EvalConfig
from verlog.envs import make_env
from verlog.envs.held_out import HELD_OUT_SHARE, draw_level, held_out_content


def _contents(env, seeds, content) -> list[str]:
    out = []
    for seed in seeds:
        env.reset(seed)
        out.append(content(env))
    return out


def test_sokoban_training_rooms_never_hold_a_held_out_rooms_puzzle():
    from verlog.envs.sokoban import HELD_OUT_SEED_START
    from verlog.envs.sokoban.env import level_content

    def rooms(share: float, seeds, **kwargs) -> list[str]:
        return _contents(make_env("sokoban", held_out_share=share, **kwargs), seeds, lambda e: level_content(e.level))

    held = range(HELD_OUT_SEED_START, HELD_OUT_SEED_START + 128)
    for share in (HELD_OUT_SHARE, 0.0):
        train = set(rooms(share, range(2000), search_depth=[1, 12])) | set(rooms(share, range(2000)))
        shared = sum(c in train for c in rooms(share, held))
        if share:
            assert shared == 0
        else:  # split by seed alone (verl-agent's): the same rooms come back
            assert shared > 10
    # every seed is one room, and the held-out seeds' rooms all lie in the held-out part
    assert rooms(HELD_OUT_SHARE, held) == rooms(HELD_OUT_SHARE, held)
    assert all(held_out_content(c, HELD_OUT_SHARE) for c in rooms(HELD_OUT_SHARE, held))


@pytest.mark.parametrize("task", ["goto", "putnext"])
def test_babyai_training_levels_never_hold_a_held_out_levels_content(task):
    from verlog.envs.babyai.env import HELD_OUT_SEED_START

    assert HELD_OUT_SEED_START == EvalConfig().seed  # the game's held-out seeds are verlog's evaluation seeds
    env = make_env(f"babyai:{task}", protocol="balrog", held_out_share=HELD_OUT_SHARE)
    train = set(_contents(env, range(1500), lambda e: e.level_content()))
    held = _contents(env, range(HELD_OUT_SEED_START, HELD_OUT_SEED_START + 128), lambda e: e.level_content())
    assert not train & set(held)
    assert all(held_out_content(c, HELD_OUT_SHARE) for c in held)
    if task != "goto":
        return
    plain = make_env(f"babyai:{task}", protocol="balrog", held_out_share=0)
    before = set(_contents(plain, range(1500), lambda e: e.level_content()))
    repeats = sum(
        c in before
        for c in _contents(plain, range(HELD_OUT_SEED_START, HELD_OUT_SEED_START + 128), lambda e: e.level_content())
    )
    assert repeats > 100  # split by seed alone, nearly every "held-out" go-to level is a training level


def test_balrogs_protocol_keeps_balrogs_level_of_each_seed_unless_a_share_is_given():
    """Under ``protocol="balrog"`` a seed plays BALROG's own level of that seed (its recorded
    episodes are reproduced seed for seed); verlog's protocol, or a share given, splits by content."""
    balrog = make_env("babyai:goto", protocol="balrog")
    plain = make_env("babyai:goto", protocol="balrog", held_out_share=0)
    split = make_env("babyai:goto", protocol="balrog", held_out_share=HELD_OUT_SHARE)
    assert balrog.held_out_share == 0 and make_env("babyai:goto").held_out_share == HELD_OUT_SHARE
    seeds = range(40)
    assert _contents(balrog, seeds, lambda e: e.level_content()) == _contents(plain, seeds, lambda e: e.level_content())
    assert _contents(split, seeds, lambda e: e.level_content()) != _contents(plain, seeds, lambda e: e.level_content())


def test_a_level_is_drawn_again_only_when_its_content_is_on_the_other_side():
    drawn = []

    def draw(seed: int) -> int:
        drawn.append(seed)
        return seed

    assert draw_level(5, held_out=False, share=0.0, draw=draw, content_of=str) == 5 and drawn == [5]
    level = draw_level(5, held_out=True, share=0.5, draw=draw, content_of=str)
    assert held_out_content(str(level), 0.5) and drawn[-1] == level
    assert draw_level(5, held_out=True, share=0.5, draw=draw, content_of=str) == level  # deterministic


def test_bad_shares_are_refused():
    with pytest.raises(ValueError, match="held_out_share"):
        make_env("sokoban", held_out_share=1.0)
    with pytest.raises(ValueError, match="held_out_share"):
        make_env("babyai:goto", held_out_share=-0.1)


def test_mixed_plays_balrogs_five_kinds_in_turn_and_its_bot_wins_each():
    from verlog.envs.babyai import BALROG_KINDS
    from verlog.envs.babyai.env import run_bot_episode

    env = make_env("babyai:mixed", protocol="balrog")
    assert env.max_steps == 128  # the longest kind's cap bounds an episode (the graph's recursion limit)
    for seed in range(10):
        won, steps = run_bot_episode(env, seed)
        assert env.level.task == BALROG_KINDS[seed % 5] and won and steps <= env.level.max_steps
