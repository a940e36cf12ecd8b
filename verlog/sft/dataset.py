"""Demonstrations as supervised rows: sequences, the answer tokens trained in each, the split.

A row is one forward pass: a sequence of ids and the positions of its answer tokens (each
predicted by the position before it). A turn is its prompt followed by its answer; when a turn's
whole sequence is the start of the next turn's prompt (a graph that keeps the history as it was:
the earlier answer's very ids are in the later prompt), the earlier turn joins the later one's row,
so an episode's turns that share their prefix are trained in one pass, each answer read where it
stands. Rows of a turn with images stay whole and alone (the images belong to the prompt).

Episodes are split into training and held-out rows by a hash of their id (``held_out_fraction``),
never by turn, so the held-out loss is measured on whole episodes the policy was not fitted to.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

from verlog.sft.collect import Demonstration

__all__ = ["SftRow", "rows_of", "split_episodes", "value_rows"]


@dataclass
class SftRow:
    """One pass: ``ids``, and ``answers``, the positions of the answer tokens in it (position ``p``
    is predicted by the hidden state at ``p - 1``); ``images`` of a turn with a picture (its row
    holds that one turn); ``turns``: how many turns' answers the row holds."""

    ids: list[int]
    answers: list[int]
    images: tuple[str, ...] = ()
    turns: int = 1
    #: how many leading ids are the first turn's prompt (its images belong to it; a value row's values
    #: are read from its last token on)
    prompt_len: int = 0
    episode_id: str = ""

    @property
    def first_answer(self) -> int:
        return min(self.answers)


def rows_of(demos: Sequence[Demonstration]) -> list[SftRow]:
    """The rows of ``demos``, turns that share their prefix joined (see the module doc)."""
    rows: list[SftRow] = []
    for demo in demos:
        current: SftRow | None = None
        for turn in demo.turns:
            if not turn.response_ids:
                continue
            sequence = list(turn.prompt_ids) + list(turn.response_ids)
            start, length = len(turn.prompt_ids), len(turn.response_ids)
            answers = list(range(start, start + length))
            joins = (
                current is not None
                and not current.images
                and not turn.images
                and len(current.ids) <= len(turn.prompt_ids)
                and turn.prompt_ids[: len(current.ids)] == current.ids
            )
            if joins:
                assert current is not None
                current.ids, current.turns = sequence, current.turns + 1
                current.answers += answers
                continue
            if current is not None:
                rows.append(current)
            current = SftRow(
                sequence,
                answers,
                tuple(turn.images),
                prompt_len=start,
                episode_id=demo.episode_id,
            )
        if current is not None:
            rows.append(current)
    return rows


def value_rows(demos: Sequence[Demonstration], gamma: float) -> tuple[list[SftRow], list[float]]:
    """One row per turn (a turn's values are read at its own positions, whatever follows it) and
    each turn's Monte-Carlo return in its episode (``verlog.algo.sft.monte_carlo_returns``)."""
    import torch

    from verlog.algo import monte_carlo_returns

    rows, targets = [], []
    for demo in demos:
        returns = monte_carlo_returns(torch.as_tensor([t.reward for t in demo.turns]), gamma).tolist()
        for turn, value in zip(demo.turns, returns):
            if not turn.response_ids:
                continue
            start = len(turn.prompt_ids)
            answers = list(range(start, start + len(turn.response_ids)))
            rows.append(SftRow(list(turn.prompt_ids) + list(turn.response_ids), answers, tuple(turn.images), 1, start))
            targets.append(value)
    return rows, targets


def _draw(episode_id: str, seed: int) -> float:
    """An episode's stable uniform draw in [0, 1) (a hash of its id and ``seed``)."""
    digest = hashlib.sha256(f"{seed}:{episode_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_episodes(
    demos: Sequence[Demonstration], fraction: float, seed: int
) -> tuple[list[Demonstration], list[Demonstration]]:
    """``(training, held_out)`` demonstrations, whole episodes each side: those whose draw is below
    ``fraction`` are held out; with a ``fraction`` above 0, at least one episode (the lowest draw)
    is held out and at least one trained whenever there are two."""
    draws = {d.episode_id: _draw(d.episode_id, seed) for d in demos}
    held = {d.episode_id for d in demos if draws[d.episode_id] < fraction}
    if fraction > 0 and not held and len(demos) > 1:
        held = {min(draws, key=draws.__getitem__)}
    if len(held) == len(demos) and demos:
        held.discard(max(draws, key=draws.__getitem__))
    return [d for d in demos if d.episode_id not in held], [d for d in demos if d.episode_id in held]
