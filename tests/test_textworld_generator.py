"""What verlog changes in TextWorld's generator, in the generating process: its constraint check
answers exactly what TextWorld's own check answers (on random states, full and incremental search,
and on whole generated games, which must come out identical from the same seed), and a walkthrough
search that never ends rejects its candidate seed."""

from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("textworld")

import textworld  # noqa: E402
from textworld.challenges.tw_treasure_hunter import treasure_hunter  # noqa: E402
from textworld.generator import QuestGenerationError, World, chaining  # noqa: E402
from textworld.generator import game as tw_game  # noqa: E402
from textworld.generator.data import KnowledgeBase  # noqa: E402
from textworld.logic import Proposition, Variable  # noqa: E402

from verlog.envs.textworld import generator as textworld_generator  # noqa: E402
from verlog.envs.textworld.games import _generate  # noqa: E402

TREASURE_KB = treasure_hunter.KB_PATH
TEXTWORLD_CHECK = chaining._Chainer.check_state
TEXTWORLD_APPLY = chaining._Chainer.apply
TEXTWORLD_FLATTEN = tw_game.ActionDependencyTree.flatten


def _install_for_this_test(monkeypatch) -> None:
    """verlog's changes applied for the test only (TextWorld's methods are put back afterwards)."""
    monkeypatch.setattr(chaining._Chainer, "apply", TEXTWORLD_APPLY)
    monkeypatch.setattr(chaining._Chainer, "check_state", TEXTWORLD_CHECK)
    monkeypatch.setattr(tw_game.ActionDependencyTree, "flatten", TEXTWORLD_FLATTEN)
    textworld_generator.install()
    assert chaining._Chainer.check_state is not TEXTWORLD_CHECK
    assert tw_game.ActionDependencyTree.flatten is not TEXTWORLD_FLATTEN


def _world_state(kb: KnowledgeBase, seed: int):
    """A state like a hard treasure hunter's before its quest: rooms, doors, containers."""
    rng = random.Random(seed)
    import numpy as np

    np_rng = np.random.RandomState(seed)
    world = World.from_map(textworld.generator.make_map(n_rooms=6, rng=np_rng, possible_door_states=["open"]), kb=kb)
    counts = kb.types.count(world.state)
    objects = []
    for i in range(6):
        kind = rng.choice(["c", "s", "k", "o"])
        counts[kind] = counts.get(kind, 0) + 1
        objects.append(Variable(f"{kind}_{counts[kind]}_{i}", kind))
    world.populate_with(objects, rng=np_rng)
    return world.state


def _random_facts(state, constraints, rng: random.Random, n: int) -> list:
    """``n`` facts shaped like constraint preconditions, over the state's variables."""
    facts = []
    rules = list(constraints)
    while len(facts) < n:
        pred = rng.choice(rng.choice(rules).preconditions)
        args = []
        for ph in pred.parameters:
            pool = sorted(state.variables_of_type(ph.type)) or [Variable(f"new_{ph.type}_{len(facts)}", ph.type)]
            args.append(rng.choice(pool))
        facts.append(Proposition(pred.name, args))
    return facts


def test_the_check_agrees_with_textworlds_on_random_states() -> None:
    kb = KnowledgeBase.load(TREASURE_KB)
    options = textworld.GameOptions()
    options.kb = kb
    constraints = list(kb.logic.constraints.values())
    rng = random.Random(0)
    answers = {True: 0, False: 0}
    anchored_checks = 0
    for seed in range(12):
        base = _world_state(kb, seed)
        base_violates = not TEXTWORLD_CHECK(chaining._Chainer(base, options.chaining), base)
        assert textworld_generator.violates_a_constraint(base, constraints) == base_violates
        for trial in range(25):
            new = _random_facts(base, constraints, rng, rng.randint(1, 3))
            state = base.copy()
            state.add_facts(new)
            textworld_says = not TEXTWORLD_CHECK(chaining._Chainer(state, options.chaining), state)
            answers[textworld_says] += 1
            assert textworld_generator.violates_a_constraint(state, constraints) == textworld_says, (seed, trial, new)
            if not base_violates:  # the incremental search needs a parent that passes
                anchored_checks += 1
                got = textworld_generator.violates_a_constraint(state, constraints, new_facts=new)
                assert got == textworld_says, (seed, trial, new)
    # both answers occur, so a check that always says one thing would fail
    assert answers[True] > 20 and answers[False] > 20, answers
    assert anchored_checks > 100


def _game_json(family: str, settings: dict, seed: int) -> str:
    game = _generate(family, settings, seed)
    return json.dumps(game.serialize(), sort_keys=True, default=str)


LEVEL_30 = {"level": 30, "only_last_action": True}


@pytest.mark.parametrize(
    "family,settings,seed",
    [
        ("treasure_hunter", LEVEL_30, 100011),
        pytest.param("treasure_hunter", LEVEL_30, 100006, marks=pytest.mark.slow),
        pytest.param("treasure_hunter", LEVEL_30, 100105, marks=pytest.mark.slow),
        pytest.param("treasure_hunter", {"level": 20}, 7, marks=pytest.mark.slow),
        pytest.param("coin_collector", {"level": 220, "only_last_action": True}, 3, marks=pytest.mark.slow),
        pytest.param(
            "cooking",
            {
                "recipe": 5,
                "take": 5,
                "go": 12,
                "open": True,
                "cook": True,
                "cut": True,
                "drop": False,
                "split": "test",
                "recipe_seed": 0,
            },
            3,
            marks=pytest.mark.slow,
        ),
    ],
)
def test_every_family_makes_the_same_game_with_either_check(monkeypatch, family, settings, seed) -> None:
    textworlds = _game_json(family, settings, seed)
    _install_for_this_test(monkeypatch)
    assert _game_json(family, settings, seed) == textworlds


def test_a_walkthrough_search_that_never_ends_rejects_the_candidate(monkeypatch) -> None:
    """TextWorld's ``ActionDependencyTree.flatten`` cycles forever on the level-30 treasure hunter
    of seed 21; the generating process stops it at a fixed count so the seed moves on."""
    _install_for_this_test(monkeypatch)
    with pytest.raises(QuestGenerationError, match="walkthrough search did not end"):
        _generate("treasure_hunter", LEVEL_30, 21)
    assert _generate("treasure_hunter", LEVEL_30, 100011).metadata["walkthrough"]
