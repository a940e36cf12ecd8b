"""Whitening, GRPO on hand-made groups, and the critic warm-up schedule."""

from __future__ import annotations

import math

import pytest
import torch

from verlog.algo import CriticWarmup, TurnBatch, WarmupPlan, episode_index, grpo_advantages, whiten


def test_whiten_over_valid_entries():
    x = torch.tensor([[1.0, 2.0], [3.0, 100.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False]])
    out = whiten(x, mask, eps=0.0)
    scale = math.sqrt(2 / 3)  # population std of 1, 2, 3
    torch.testing.assert_close(out, torch.tensor([[-1 / scale, 0.0], [1 / scale, 0.0]], dtype=torch.float64))
    kept_mean = whiten(x, mask, shift_mean=False, eps=0.0)
    expected = torch.tensor([[2 - 1 / scale, 2.0], [2 + 1 / scale, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(kept_mean, expected)


def grpo_batch():
    """Three slots x three turns, two tokens per turn at most.

    slot 0: episode A = turns 0-1 (group 0, return 1), episode B = turn 2 (group 1, return 4)
    slot 1: episode C = turn 0 (group 0, return 3), episode D = turns 1-2 still running (group 1)
    slot 2: episode E = turns 0-2 (group 0, return 2)
    """
    nan = float("nan")
    rewards = torch.tensor(
        [
            [[0.25, 0.25], [0.5, nan], [4.0, 0.0]],
            [[1.0, 2.0], [9.0, nan], [9.0, 9.0]],
            [[0.0, 0.0], [1.0, 0.0], [0.5, 0.5]],
        ],
        dtype=torch.float64,
    )
    mask = torch.tensor(
        [
            [[True, True], [True, False], [True, True]],
            [[True, True], [True, False], [True, True]],
            [[True, True], [True, True], [True, True]],
        ]
    )
    terminated = torch.tensor([[False, True, True], [True, False, False], [False, False, True]])
    truncated = torch.zeros(3, 3, dtype=torch.bool)
    groups = torch.tensor([[0, 0, 1], [0, 1, 1], [0, 0, 0]])
    return TurnBatch(rewards, mask, terminated, truncated), groups


def test_episode_index():
    dones = torch.tensor([[False, True, True], [True, False, False]])
    assert episode_index(dones).tolist() == [[0, 0, 1], [0, 1, 1]]


def test_grpo_hand_made_groups():
    batch, groups = grpo_batch()
    adv, included = grpo_advantages(batch, groups, eps=0.0)
    # group 0: returns A=1, C=3, E=2 -> mean 2, unbiased std 1; group 1: only B is complete -> 0
    per_turn = torch.tensor([[-1.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(adv, torch.where(batch.response_mask, per_turn.unsqueeze(-1), 0.0))
    assert included.tolist() == [[True, True, True], [True, False, False], [True, True, True]]


def test_grpo_without_std_and_with_episode_starts():
    batch, groups = grpo_batch()
    adv, _ = grpo_advantages(batch, groups, scale_by_std=False)
    assert adv[0, 0, 0].item() == pytest.approx(-1.0) and adv[1, 0, 1].item() == pytest.approx(1.0)
    # slot 2's episode began before the batch: E drops out, group 0 is A=1, C=3
    starts = torch.tensor([True, True, False])
    adv, included = grpo_advantages(batch, groups, starts_episode=starts, eps=0.0)
    assert adv[0, 1, 0].item() == pytest.approx(-1 / math.sqrt(2))
    assert adv[1, 0, 0].item() == pytest.approx(1 / math.sqrt(2))
    assert not included[2].any() and (adv[2] == 0).all()


def test_critic_warmup_plan_and_subsets():
    warmup = CriticWarmup(buffer_multiplier=40, iterations=5, subset_fraction=0.25, seed=3)
    plan = warmup.plan(batch_turns=256)
    assert plan == WarmupPlan(buffer_turns=10240, iterations=5, subset_turns=2560)
    subsets = list(warmup.subsets(plan.buffer_turns))
    assert len(subsets) == 5
    for idx in subsets:
        assert idx.shape == (2560,) and idx.unique().numel() == 2560
        assert int(idx.min()) >= 0 and int(idx.max()) < 10240
    assert not torch.equal(subsets[0], subsets[1])  # a fresh subset each iteration
    again = list(warmup.subsets(plan.buffer_turns))
    assert all(torch.equal(a, b) for a, b in zip(subsets, again))  # seeded: reproducible
    other = list(CriticWarmup(40, 5, 0.25, seed=4).subsets(plan.buffer_turns))
    assert not torch.equal(subsets[0], other[0])
    assert [warmup.in_warmup(i) for i in range(7)] == [True] * 5 + [False] * 2


def test_critic_warmup_disabled_and_small_buffers():
    off = CriticWarmup(buffer_multiplier=0, iterations=5)
    assert not off.enabled and off.plan(64) == WarmupPlan(0, 0, 0)
    assert list(off.subsets(100)) == [] and not off.in_warmup(0)
    half = CriticWarmup(2, 1, subset_fraction=0.5)
    assert half.plan(3).subset_turns == 3 and half.subset_size(1) == 1
    with pytest.raises(ValueError):
        CriticWarmup(subset_fraction=0.0)
