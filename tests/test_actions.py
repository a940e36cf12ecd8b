"""Reading actions out of model answers (``verlog.envs.actions``), shared by every game."""

from __future__ import annotations

import pytest

from verlog.envs.actions import (
    ANSWER_FORMAT,
    DEFAULT_INVALID_ACTION_PENALTY,
    normalize,
    parse_action,
)
from verlog.envs.babyai.env import ACTIONS as BABYAI_ACTIONS
from verlog.envs.babyai.env import SYNONYMS as BABYAI_SYNONYMS
from verlog.envs.crafter.env import ACTIONS as CRAFTER_ACTIONS
from verlog.envs.crafter.env import SYNONYMS as CRAFTER_SYNONYMS


def babyai(answer: str) -> str | None:
    return parse_action(answer, BABYAI_ACTIONS, BABYAI_SYNONYMS).action


def crafter(answer: str) -> str | None:
    return parse_action(answer, CRAFTER_ACTIONS, CRAFTER_SYNONYMS).action


def test_constants() -> None:
    assert DEFAULT_INVALID_ACTION_PENALTY == pytest.approx(0.1)
    assert "ACTION:" in ANSWER_FORMAT


def test_normalize() -> None:
    assert normalize("  Move_Left!! ") == "move left"
    assert normalize("pick-up") == "pick up"


@pytest.mark.parametrize(
    "answer",
    [
        "ACTION: go forward",
        "I see the ball ahead.\nACTION: go forward",
        "action: go forward",
        "Action : GO FORWARD",
        "ACTION：go forward",  # full-width colon
        "**ACTION:** go forward",
        "ACTION: `go forward`",
        "ACTION: <go forward>",
        "ACTION: go_forward",
        "ACTION: go-forward.",
        "ACTION: go forward\nbecause the ball is ahead",
        "go forward",  # a bare action name, as typed in `verlog play`
    ],
)
def test_action_line_forms(answer: str) -> None:
    assert babyai(answer) == "go forward"


def test_last_action_line_wins() -> None:
    answer = "ACTION: turn left was my first idea, but\nACTION: turn right"
    assert babyai(answer) == "turn right"


def test_trailing_words_are_tolerated() -> None:
    assert babyai("ACTION: pick up the red key") == "pick up"
    assert babyai("ACTION: turn left twice") == "turn left"
    assert crafter("ACTION: make wood pickaxe now") == "make wood pickaxe"


def test_longest_action_prefix_wins() -> None:
    # "make stone pickaxe" must not be read as a shorter action
    assert crafter("ACTION: make stone pickaxe") == "make stone pickaxe"
    assert crafter("ACTION: place table here") == "place table"


@pytest.mark.parametrize(
    ("answer", "action"),
    [
        ("ACTION: left", "turn left"),
        ("ACTION: Forward", "go forward"),
        ("ACTION: move forward", "go forward"),
        ("ACTION: pickup", "pick up"),
        ("ACTION: open the door", "toggle"),
        ("ACTION: unlock", "toggle"),
    ],
)
def test_babyai_synonyms(answer: str, action: str) -> None:
    assert babyai(answer) == action


@pytest.mark.parametrize(
    ("answer", "action"),
    [
        ("ACTION: move_left", "move left"),
        ("ACTION: west", "move left"),
        ("ACTION: go north", "move up"),
        ("ACTION: Move Down", "move down"),
        ("ACTION: collect wood", "do"),
        ("ACTION: interact", "do"),
        ("ACTION: no-op", "noop"),
        ("ACTION: craft wood pickaxe", "make wood pickaxe"),
        ("ACTION: place_stone", "place stone"),
        ("ACTION: plant sapling", "place plant"),
    ],
)
def test_crafter_synonyms(answer: str, action: str) -> None:
    assert crafter(answer) == action


@pytest.mark.parametrize(
    "answer",
    ["", "   ", "ACTION:", "ACTION: fly away", "I am not sure what to do.", "ACTION: forwards"],
)
def test_invalid_answers(answer: str) -> None:
    parsed = parse_action(answer, BABYAI_ACTIONS, BABYAI_SYNONYMS)
    assert parsed.action is None
    assert not parsed.valid


def test_raw_is_the_matched_text() -> None:
    parsed = parse_action("thinking...\nACTION: fly away", BABYAI_ACTIONS)
    assert parsed.raw == "fly away"


def test_synonym_to_an_unavailable_action_is_ignored() -> None:
    assert parse_action("ACTION: jump", ["left", "right"], {"jump": "up"}).action is None
    assert parse_action("ACTION: hop", ["left", "right"], {"hop": "left"}).action == "left"
