"""The estimators' defaults are the published algorithms: GRPO, RLOO and GiGPO keep their own scale
(no re-whitening over the batch unless ``whiten_advantages: true``), PPO's GAE is whitened, tied
groups get exactly 0, REINFORCE++-baseline (group mean, then batch whitening) by hand and against
verl's own function; GSPO's cap stops the gradient where verl's does; the entropy bonus is
aggregated as the policy loss is."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_algo_advantages import grpo_batch
from test_algo_estimators import gae_batch, one_token_batch

from verlog.algo import TurnBatch, dual_gae, entropy_bonus, gspo_policy_loss, whiten
from verlog.algo.estimators import TurnData, estimate_advantages, get_estimator
from verlog.algo.estimators.reinforce_pp_baseline import reinforce_pp_baseline_advantages
from verlog.config import AlgorithmConfig

STARTS = torch.ones(3, dtype=torch.bool)


def test_each_estimator_declares_its_papers_whitening():
    whitens = {
        name: get_estimator(name).whitens
        for name in ("gae", "grpo", "rloo", "gigpo", "reinforce_pp", "reinforce_pp_baseline", "zero")
    }
    # PPO's GAE is whitened (Verlog, verl); the group estimators keep their scale; REINFORCE++ and
    # its baseline variant normalize inside their own formula
    assert whitens == {
        "gae": True,
        "grpo": False,
        "rloo": False,
        "gigpo": False,
        "reinforce_pp": False,
        "reinforce_pp_baseline": False,
        "zero": False,
    }
    assert AlgorithmConfig().whiten_advantages is None


def test_grpo_and_rloo_by_default_are_their_papers_values():
    batch, groups = grpo_batch()
    data = TurnData(groups, STARTS)
    # group 0 complete: A = 1, C = 3, E = 2 (mean 2, unbiased std 1); group 1: B alone (0); D running
    grpo = estimate_advantages(AlgorithmConfig(estimator="grpo"), batch, data).advantages
    per_turn = torch.tensor([[-1.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64) / (1 + 1e-6)
    torch.testing.assert_close(grpo, torch.where(batch.response_mask, per_turn.unsqueeze(-1), 0.0))
    rloo = estimate_advantages(AlgorithmConfig(estimator="rloo"), batch, data).advantages
    assert rloo[0, 0, 0].item() == -1.5 and rloo[1, 0, 0].item() == 1.5  # R_i - mean of the others, unscaled
    # asked for, whitening is over the tokens the policy loss uses
    asked = estimate_advantages(AlgorithmConfig(estimator="grpo", whiten_advantages=True), batch, data)
    policy = batch.response_mask & asked.included.unsqueeze(-1)
    torch.testing.assert_close(asked.advantages, whiten(grpo, policy))


def test_gae_is_whitened_by_default_and_not_when_told():
    batch = gae_batch(1)
    adv, _ = dual_gae(batch, 0.99, 0.95)
    default = estimate_advantages(AlgorithmConfig(), batch, TurnData()).advantages
    torch.testing.assert_close(default, whiten(adv, batch.response_mask))
    raw = estimate_advantages(AlgorithmConfig(whiten_advantages=False), batch, TurnData()).advantages
    torch.testing.assert_close(raw, adv)


def tied_batch():
    """Seed 5: three episodes returning 0.1 each (a tie); seed 6: returns 1 and 0. One turn each."""
    batch = one_token_batch([[0.1], [0.1], [0.1], [1.0], [0.0]], [[True]] * 5)
    groups = torch.tensor([[5], [5], [5], [6], [6]])
    return batch, groups


def test_tied_groups_get_exactly_zero():
    batch, groups = tied_batch()
    returns = batch.token_rewards[:3, 0, 0]
    # the plain formula leaves rounding that a std scaling blows up: the case is a real one
    assert ((returns - returns.mean()) / (returns.std() + 1e-6) != 0).all()
    data = TurnData(groups, torch.ones(5, dtype=torch.bool), anchors=torch.zeros_like(groups))
    for name in ("grpo", "rloo", "gigpo"):
        for norm in ("mean_std", "mean"):
            adv = estimate_advantages(AlgorithmConfig(estimator=name, group_norm=norm), batch, data).advantages
            assert (adv[:3] == 0).all(), (name, norm)
            assert adv[3, 0, 0].item() > 0 > adv[4, 0, 0].item()
    # GRPO's signal of seed 6: (1 - 0.5) / (std{1, 0} + eps), unscaled by the batch
    grpo = estimate_advantages(AlgorithmConfig(estimator="grpo"), batch, data).advantages
    assert grpo[3, 0, 0].item() == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-6), abs=1e-12)


def test_reinforce_pp_baseline_by_hand():
    batch, groups = grpo_batch()
    adv, included = reinforce_pp_baseline_advantages(batch, groups, STARTS)
    # group-centred returns A' on the policy tokens: A -1 (3 tokens), C +1 (2), B 0 (alone, 2), E 0 (tie-free
    # but at the mean, 6); D is running (left out). Over 13 tokens: mean -1/13, population std 8/13, so
    #   A: (-1 + 1/13) / (8/13) = -1.5    C: (1 + 1/13) / (8/13) = 1.75    B, E: (1/13) / (8/13) = 0.125
    per_turn = torch.tensor([[-1.5, -1.5, 0.125], [1.75, 0.0, 0.0], [0.125, 0.125, 0.125]], dtype=torch.float64)
    torch.testing.assert_close(adv, torch.where(batch.response_mask, per_turn.unsqueeze(-1), 0.0), atol=1e-6, rtol=0)
    assert included.tolist() == [[True, True, True], [True, False, False], [True, True, True]]
    out = estimate_advantages(AlgorithmConfig(estimator="reinforce_pp_baseline"), batch, TurnData(groups, STARTS))
    torch.testing.assert_close(out.advantages, adv)


def test_reinforce_pp_baseline_matches_verl_on_single_turn_episodes():
    """One turn per episode, every group of two or more: verl's ``reinforce_plus_plus_baseline``
    up to its whitening's Bessel correction (verl divides the variance by n - 1 tokens, verlog by n)."""
    from verl.trainer.ppo.core_algos import compute_reinforce_plus_plus_baseline_outcome_advantage

    g = torch.Generator().manual_seed(3)
    rows, width = 8, 5
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    mask = torch.arange(width) < lengths[:, None]
    scores = torch.randint(0, 3, (rows,), generator=g).to(torch.float64)
    rewards = torch.zeros(rows, width, dtype=torch.float64)
    rewards[torch.arange(rows), lengths - 1] = scores
    index = np.array(["a", "a", "a", "b", "b", "c", "c", "c"], dtype=object)

    expected, _ = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards.clone(), mask.long(), index)
    batch = TurnBatch(
        rewards.unsqueeze(1),
        mask.unsqueeze(1),
        torch.ones(rows, 1, dtype=torch.bool),
        torch.zeros(rows, 1, dtype=torch.bool),
    )
    group_ids = torch.tensor([ord(i) for i in index]).unsqueeze(1)
    adv, _ = reinforce_pp_baseline_advantages(batch, group_ids)
    n = int(mask.sum())
    torch.testing.assert_close(adv.squeeze(1), expected * math.sqrt(n / (n - 1)) * mask, atol=1e-6, rtol=0)


def test_gspo_cap_stops_the_gradient_as_verls_does():
    """Above the cap (log s > 10) the ratio is the constant e^10: no gradient flows (verl clamps
    the token's log-ratio, gradient path included); below it the gradient is GSPO's."""
    from verl.trainer.ppo.core_algos import compute_policy_loss_gspo

    old = torch.zeros(2, 3, dtype=torch.float64)
    logp = torch.tensor([[12.0, 11.0, 13.0], [0.1, -0.2, 0.05]], dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 3, dtype=torch.bool)
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3], dtype=torch.float64)
    loss, _ = gspo_policy_loss(logp, old, adv, mask, clip_eps=100.0, clip_eps_high=1e6)  # no PPO clip
    loss.backward()
    assert not logp.grad[0].any()  # capped sequence: no gradient
    assert logp.grad[1].abs().min() > 0

    from verl.workers.config import ActorConfig

    config = ActorConfig(
        strategy="fsdp",
        clip_ratio=100.0,
        clip_ratio_low=100.0,
        clip_ratio_high=1e6,
        ppo_micro_batch_size_per_gpu=1,
        rollout_n=1,
    )
    theirs = logp.detach().clone().requires_grad_(True)
    verl_loss = compute_policy_loss_gspo(
        old, theirs, adv, mask.long(), loss_agg_mode="seq-mean-token-mean", config=config
    )[0]
    verl_loss.backward()
    torch.testing.assert_close(loss.detach(), verl_loss.detach())
    torch.testing.assert_close(logp.grad, theirs.grad)


def test_entropy_bonus_is_aggregated_as_the_policy_loss_is():
    entropy_logits = torch.tensor([[[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 50.0], [0.0, 50.0]]])
    mask = torch.tensor([[True, False, False], [True, True, True]])
    # row 0: one token of entropy log 2; row 1: log 2 and two near-zero entropies
    by_turn = entropy_bonus(entropy_logits, mask, "sequence_mean")
    assert by_turn.item() == pytest.approx((math.log(2) + math.log(2) / 3) / 2, abs=1e-6)
    assert entropy_bonus(entropy_logits, mask).item() == pytest.approx(2 * math.log(2) / 4, abs=1e-6)
