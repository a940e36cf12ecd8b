"""verl's per-turn rows <-> verlog's ``TurnBatch`` (N slots x K turns x T tokens), and back.

verl hands the advantage step a flat, shuffled batch of rows (``[B, T]`` right-padded
responses). verlog's GAE wants each slot's turns side by side in time order. The rows of one
agent-loop call (``verlog_trajectory``) are one slot's consecutive turns, ordered by
``verlog_position``, followed by its next-state rows (one per truncated turn whose next prompt
is known) and possibly its bootstrap row; rows verlog did not make (verl's no-op padding) take
no part.

Layout, for ``N`` trajectories of at most ``K`` turns:

* turns are right-aligned: a trajectory with ``n < K`` turns starts with ``K - n`` empty turns
  (no token, no reward, no value, not done), so every trajectory's last real turn is turn
  ``K - 1`` and bootstraps from ``bootstrap_values``. The empty turns belong to the trajectory's
  first episode (its group, no anchor; its ``episode_starts`` flag): they add nothing to it, and
  nothing flows out of them (every recursion runs backwards in time, and they come first);
* ``V_{k,j}`` for ``j < L_k`` is verl's critic value of response position ``j`` (read at the token
  before it, so ``V_{k,0}`` is the last prompt token's); ``V_{k,L_k}`` is not computed by verl and
  is set to 0: with ``lam_token == 1`` it cancels out of every advantage and return;
* ``bootstrap_values[i]`` is the bootstrap row's ``V_{.,0}`` (0 when the last turn is done);
* ``truncation_values[i, k]`` is the ``V_{.,0}`` of turn ``k``'s next-state row (the prompt that
  would have followed a truncated turn), ``NaN`` where there is none (``dual_gae`` then
  bootstraps that truncated turn from 0).

Without a critic (``values`` None) the ``TurnBatch`` has no values at all. ``turn_data`` gives the
per-turn facts estimators may need (``verlog.algo.estimators.TurnData``) in the same layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor

from verlog.algo.estimators import TurnData
from verlog.algo.multiturn_gae import TurnBatch
from verlog.integrations.verl.samples import BOOTSTRAP, NEXT_STATE, TURN, RowInfo

__all__ = ["RowLayout", "rows_to_turn_batch", "token_scores", "turn_data"]


def token_scores(response_mask: Tensor, infos: Sequence[RowInfo | None]) -> Tensor:
    """``[B, T]`` rewards: each turn's environment reward on its last response token."""
    scores = torch.zeros(response_mask.shape, dtype=torch.float32)
    lengths = response_mask.long().sum(-1)
    for row, info in enumerate(infos):
        if info is not None and info.kind == TURN and lengths[row] > 0:
            scores[row, lengths[row] - 1] = info.reward
    return scores


@dataclass
class RowLayout:
    """Where each row of the verl batch sits in the ``TurnBatch`` (``-1``: nowhere)."""

    #: per row: (trajectory index, turn index) for turn rows, else (-1, -1)
    slot: Tensor
    turn: Tensor
    trajectories: list[str]
    #: per trajectory: its number of real turns, and whether it has a bootstrap row
    turn_counts: list[int]
    has_bootstrap: list[bool]
    #: per trajectory: the batch rows of its turns, in time order
    turn_rows: list[list[int]]

    @property
    def num_turns(self) -> int:
        """Turns per trajectory in the ``TurnBatch`` (``K``)."""
        return max(self.turn_counts, default=0)

    def scatter(self, per_turn: Tensor, width: int) -> Tensor:
        """``[N, K, >=width]`` -> ``[B, width]`` (rows that are not turns get zeros)."""
        out = per_turn.new_zeros((self.slot.shape[0], width))
        rows = (self.slot >= 0).nonzero().squeeze(-1)
        if rows.numel():
            out[rows] = per_turn[self.slot[rows], self.turn[rows], :width]
        return out


def rows_to_turn_batch(
    response_mask: Tensor,
    values: Tensor | None,
    token_rewards: Tensor,
    infos: Sequence[RowInfo | None],
) -> tuple[TurnBatch, RowLayout]:
    """Build the ``TurnBatch`` of a verl batch.

    Args:
        response_mask: ``[B, T]`` (1 on a turn's response tokens, a prefix of each row).
        values: ``[B, T]`` verl's critic values of the response positions; None without a critic
            (the ``TurnBatch`` then has no values, bootstrap or truncation values).
        token_rewards: ``[B, T]`` rewards per token (the environment's on a turn's last token,
            plus any KL penalty verl put in the reward).
        infos: per row, verlog's ``RowInfo`` (``None`` for rows to ignore, e.g. verl's padding).
    """
    b, t = response_mask.shape
    if len(infos) != b:
        raise ValueError(f"{len(infos)} row infos for a batch of {b} rows")
    names, turn_rows, boot_rows, next_rows = _trajectory_rows(infos)
    n, k = len(names), max((len(r) for r in turn_rows), default=0)
    mask = torch.zeros((n, k, t), dtype=torch.bool)
    rewards = torch.zeros((n, k, t), dtype=torch.float32)
    vals = torch.zeros((n, k, t + 1), dtype=torch.float32)
    terminated = torch.zeros((n, k), dtype=torch.bool)
    truncated = torch.zeros((n, k), dtype=torch.bool)
    bootstrap = torch.zeros(n, dtype=torch.float32)
    truncation = torch.full((n, k), float("nan"), dtype=torch.float32)
    slot_of = torch.full((b,), -1, dtype=torch.long)
    turn_of = torch.full((b,), -1, dtype=torch.long)
    response_mask = response_mask.bool()
    for i, (rows, boot, nexts) in enumerate(zip(turn_rows, boot_rows, next_rows)):
        offset = k - len(rows)
        matched = 0
        for j, row in enumerate(rows):
            kk = offset + j
            info = infos[row]
            assert info is not None
            row_mask = response_mask[row]
            length = int(row_mask.sum())
            if length and not bool(row_mask[:length].all()):
                raise ValueError(f"row {row} of trajectory {names[i]!r}: response_mask is not a prefix")
            mask[i, kk] = row_mask
            rewards[i, kk] = torch.where(row_mask, token_rewards[row].float(), 0.0)
            if values is not None:
                vals[i, kk, :length] = values[row, :length].float()
            terminated[i, kk] = info.terminated
            truncated[i, kk] = info.truncated and not info.terminated
            slot_of[row], turn_of[row] = i, kk
            next_row = nexts.get((info.episode_id, info.turn_index))
            if next_row is not None:
                matched += 1
                if truncated[i, kk] and values is not None:
                    truncation[i, kk] = values[next_row, 0].float()
        if matched != len(nexts):
            raise ValueError(f"trajectory {names[i]!r}: a next-state row names no turn of it")
        if rows and not (terminated[i, -1] or truncated[i, -1]):
            if boot is None:
                raise ValueError(
                    f"trajectory {names[i]!r}: its last turn is not done and it has no bootstrap row "
                    "(the value of the prompt that follows it)"
                )
            if values is not None:
                bootstrap[i] = values[boot, 0].float()
    critic = values is not None
    batch = TurnBatch(
        token_rewards=rewards,
        response_mask=mask,
        terminated=terminated,
        truncated=truncated,
        values=vals if critic else None,
        bootstrap_values=bootstrap if critic else None,
        truncation_values=truncation if critic else None,
    )
    layout = RowLayout(
        slot=slot_of,
        turn=turn_of,
        trajectories=names,
        turn_counts=[len(r) for r in turn_rows],
        has_bootstrap=[b is not None for b in boot_rows],
        turn_rows=turn_rows,
    )
    return batch, layout


def _trajectory_rows(
    infos: Sequence[RowInfo | None],
) -> tuple[list[str], list[list[int]], list[int | None], list[dict[tuple[str, int], int]]]:
    """The rows of each trajectory (sorted by name), checked: its turn rows in position order, its
    bootstrap row (the single last row, if any) and its next-state rows by ``(episode, turn)``."""
    groups: dict[str, list[tuple[int, RowInfo]]] = {}
    for row, info in enumerate(infos):
        if info is not None:
            groups.setdefault(info.trajectory, []).append((row, info))
    names = sorted(groups)
    turn_rows: list[list[int]] = []
    boot_rows: list[int | None] = []
    next_rows: list[dict[tuple[str, int], int]] = []
    for name in names:
        rows = sorted(groups[name], key=lambda r: r[1].position)
        positions = [info.position for _, info in rows]
        if len(set(positions)) != len(positions):
            raise ValueError(f"trajectory {name!r} has rows with the same verlog_position: {positions}")
        turns = [row for row, info in rows if info.kind == TURN]
        boots = [row for row, info in rows if info.kind == BOOTSTRAP]
        if len(boots) > 1 or (boots and rows[-1][1].kind != BOOTSTRAP):
            raise ValueError(f"trajectory {name!r}: a bootstrap row must be its single last row")
        nexts: dict[tuple[str, int], int] = {}
        for row, info in rows:
            if info.kind == NEXT_STATE:
                if (info.episode_id, info.turn_index) in nexts:
                    raise ValueError(
                        f"trajectory {name!r}: two next-state rows for turn {info.turn_index} of {info.episode_id!r}"
                    )
                nexts[(info.episode_id, info.turn_index)] = row
        turn_rows.append(turns)
        boot_rows.append(boots[0] if boots else None)
        next_rows.append(nexts)

    return names, turn_rows, boot_rows, next_rows


def turn_data(infos: Sequence[RowInfo | None], layout: RowLayout) -> TurnData:
    """The per-turn facts of the estimators (``TurnData``) in ``layout``'s ``[N, K]`` shape.

    * ``groups``: each turn's episode's seed (``RowInfo.seed``). A turn whose seed is unknown, and
      a trajectory without turns, gets a group of its own; a trajectory's leading empty turns
      take its first turn's group (they belong to its first episode).
    * ``episode_starts``: whether each trajectory's first turn opens its episode.
    * ``anchors``: one id per distinct anchor key of the batch (``RowInfo.anchor``), ``-1`` where
      the environment reported none and on the empty turns.
    """
    n, k = len(layout.trajectories), layout.num_turns
    keys: list[list[object]] = []
    anchors: list[list[object]] = []
    starts = torch.ones(n, dtype=torch.bool)
    for i, rows in enumerate(layout.turn_rows):
        turns = [infos[row] for row in rows]
        own = [("seed", t.seed) if t.seed is not None else ("alone", i, j) for j, t in enumerate(turns)]
        first = own[0] if own else ("alone", i, -1)
        keys.append([first] * (k - len(turns)) + own)
        anchors.append([None] * (k - len(turns)) + [t.anchor for t in turns])
        if turns:
            starts[i] = turns[0].starts_episode
    group_ids: dict[object, int] = {}
    groups = [[group_ids.setdefault(key, len(group_ids)) for key in row] for row in keys]
    anchor_ids: dict[object, int] = {}
    states = [[-1 if a is None else anchor_ids.setdefault(a, len(anchor_ids)) for a in row] for row in anchors]
    return TurnData(
        groups=torch.tensor(groups, dtype=torch.long).view(n, k),
        episode_starts=starts,
        anchors=torch.tensor(states, dtype=torch.long).view(n, k),
    )
