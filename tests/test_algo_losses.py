"""PPO, DAPO and GSPO losses against values worked out by hand on tiny tensors."""

from __future__ import annotations

import math

import pytest
import torch

from verlog.algo import (
    aggregate,
    aggregation_weight,
    clipped_value_loss,
    entropy_bonus,
    entropy_from_logits,
    gspo_policy_loss,
    kl_in_reward,
    kl_k1,
    kl_k3,
    masked_mean,
    policy_loss_fn,
    ppo_policy_loss,
)

# (advantage, ratio) per token and the loss each should get with eps = 0.2, c = 3:
POLICY_CASES = [
    (1.0, 1.1, -1.1),  # inside the trust region
    (1.0, 1.5, -1.2),  # A > 0, ratio above 1 + eps: clipped
    (-1.0, 0.5, 0.8),  # A < 0, ratio below 1 - eps: clipped
    (-1.0, 5.0, 3.0),  # A < 0, ratio > c: dual clip, loss = -c * A
    (-2.0, 2.0, 4.0),  # A < 0, ratio large but below c: plain -A * ratio
    (1.0, 0.5, -0.5),  # A > 0, ratio below 1 - eps: unclipped term is the max
]


def policy_inputs():
    adv = torch.tensor([[a for a, _, _ in POLICY_CASES] + [-50.0]], dtype=torch.float64)
    ratio = torch.tensor([[r for _, r, _ in POLICY_CASES] + [100.0]], dtype=torch.float64)
    mask = torch.tensor([[True] * len(POLICY_CASES) + [False]])  # the last token is padding
    old_logp = torch.full_like(ratio, -1.0)
    logp = (old_logp + ratio.log()).requires_grad_(True)
    return logp, old_logp, adv, mask, ratio


def test_policy_loss_regions():
    logp, old_logp, adv, mask, ratio = policy_inputs()
    loss, metrics = ppo_policy_loss(logp, old_logp, adv, mask, clip_eps=0.2, dual_clip=3.0)
    expected = sum(case[2] for case in POLICY_CASES) / len(POLICY_CASES)
    assert loss.item() == pytest.approx(expected)
    assert metrics["policy_loss"] == pytest.approx(expected)
    assert metrics["clip_frac"] == pytest.approx(2 / 6)
    assert metrics["dual_clip_frac"] == pytest.approx(1 / 6)
    r = ratio[0, :6]
    assert metrics["approx_kl_k1"] == pytest.approx(float((-r.log()).mean()))
    assert metrics["approx_kl"] == pytest.approx(float((r - 1 - r.log()).mean()))
    assert metrics["ratio_max"] == pytest.approx(5.0)

    # gradients: d loss / d logp = -A * ratio / n where unclipped, 0 where (dual) clipped or padding
    loss.backward()
    expected_grad = torch.tensor([-1.1, 0.0, 0.0, 0.0, 4.0, -0.5, 0.0], dtype=torch.float64) / 6
    torch.testing.assert_close(logp.grad[0], expected_grad)


def test_policy_loss_without_dual_clip():
    logp, old_logp, adv, mask, _ = policy_inputs()
    loss, metrics = ppo_policy_loss(logp, old_logp, adv, mask, dual_clip=None)
    expected = (-1.1 - 1.2 + 0.8 + 5.0 + 4.0 - 0.5) / 6
    assert loss.item() == pytest.approx(expected)
    assert metrics["dual_clip_frac"] == 0.0
    with pytest.raises(ValueError):
        ppo_policy_loss(logp, old_logp, adv, mask, dual_clip=1.0)


def value_inputs():
    # (value, old value, return) -> 1/2 max((V-R)^2, (V_clip-R)^2) with clip 0.5
    values = torch.tensor([[1.0, 2.0, 0.0], [2.0, 9.0, 9.0]], dtype=torch.float64)
    old = torch.tensor([[0.8, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    returns = torch.tensor([[2.0, 3.0, -1.0], [1.2, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    per_position = [
        0.5,  # inside the clip range: 1/2 (1 - 2)^2
        1.125,  # moved up past old + 0.5: V_clip = 1.5, 1/2 (1.5 - 3)^2
        1.125,  # moved down past old - 0.5: V_clip = 0.5, 1/2 (0.5 + 1)^2
        0.32,  # clipping would help (V_clip = 1.5 is closer to R): the max keeps 1/2 (2 - 1.2)^2
    ]
    return values, old, returns, mask, per_position


def test_value_loss_clipping_both_sides():
    values, old, returns, mask, per_position = value_inputs()
    values.requires_grad_(True)
    loss, metrics = clipped_value_loss(values, old, returns, mask, clip=0.5)
    assert loss.item() == pytest.approx(sum(per_position) / 4)
    assert metrics["value_clip_frac"] == pytest.approx(2 / 4)
    assert metrics["value_mean"] == pytest.approx((1.0 + 2.0 + 0.0 + 2.0) / 4)
    loss.backward()
    # clipped positions get no gradient; the others (V - R) / n
    expected = torch.tensor([[-1.0, 0.0, 0.0], [0.8, 0.0, 0.0]], dtype=torch.float64) / 4
    torch.testing.assert_close(values.grad, expected)


def test_value_loss_first_value_weight_and_no_clip():
    values, old, returns, mask, per_position = value_inputs()
    loss, _ = clipped_value_loss(values, old, returns, mask, clip=0.5, first_value_weight=3.0)
    # position 0 of each row (the turn's V(s_k)) counts three times; the divisor stays 4
    assert loss.item() == pytest.approx((3 * 0.5 + 1.125 + 1.125 + 3 * 0.32) / 4)
    loss, metrics = clipped_value_loss(values, old, returns, mask, clip=None)
    assert loss.item() == pytest.approx((0.5 + 0.5 + 0.5 + 0.32) / 4)
    assert metrics["value_clip_frac"] == 0.0


def test_explained_variance():
    returns = torch.tensor([1.0, 2.0, 3.0, 4.0])
    mask = torch.ones(4, dtype=torch.bool)
    _, perfect = clipped_value_loss(returns, returns, returns, mask)
    _, constant = clipped_value_loss(torch.full((4,), 2.5), torch.full((4,), 2.5), returns, mask)
    assert perfect["explained_variance"] == pytest.approx(1.0)
    assert constant["explained_variance"] == pytest.approx(0.0)


def test_entropy_of_known_distributions():
    uniform = torch.zeros(4)
    skewed = torch.tensor([0.5, 0.25, 0.25]).log()
    logits = torch.stack([torch.cat([skewed, torch.tensor([-math.inf])]), uniform, torch.randn(4)])
    entropy = entropy_from_logits(logits)
    assert entropy[0].item() == pytest.approx(1.5 * math.log(2))
    assert entropy[1].item() == pytest.approx(math.log(4))
    mask = torch.tensor([True, True, False])
    assert entropy_bonus(logits, mask).item() == pytest.approx((1.5 * math.log(2) + math.log(4)) / 2)
    # half precision logits are computed in float32
    assert entropy_from_logits(uniform.to(torch.bfloat16)).dtype == torch.float32


def test_entropy_gradient_of_masked_logits_is_the_allowed_tokens_own():
    """Tokens masked to ``-inf`` (a grammar's) add nothing to the entropy nor to its gradient:
    the gradient equals that of the entropy over the allowed tokens alone (a NaN here once
    poisoned every weight after one update)."""
    allowed = torch.tensor([0.3, -1.2, 2.0], requires_grad=True)
    entropy_from_logits(allowed).backward()
    full = torch.tensor([0.3, -math.inf, -1.2, -math.inf, 2.0], requires_grad=True)
    entropy_from_logits(full).backward()
    assert torch.isfinite(full.grad).all()
    assert full.grad[[1, 3]].tolist() == [0.0, 0.0]
    assert torch.allclose(full.grad[[0, 2, 4]], allowed.grad)


def test_kl_estimators_by_hand():
    logp = torch.tensor([-1.0, -2.0], dtype=torch.float64)
    ref = torch.tensor([-1.5, -1.0], dtype=torch.float64)
    torch.testing.assert_close(kl_k1(logp, ref), torch.tensor([0.5, -1.0], dtype=torch.float64))
    k3 = torch.tensor([math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0], dtype=torch.float64)
    torch.testing.assert_close(kl_k3(logp, ref), k3)


def test_kl_estimators_are_unbiased():
    p = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    q = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    true_kl = float((p * (p / q).log()).sum())
    samples = torch.multinomial(p, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    logp, logq = p.log()[samples], q.log()[samples]
    assert kl_k1(logp, logq).mean().item() == pytest.approx(true_kl, abs=0.01)
    assert kl_k3(logp, logq).mean().item() == pytest.approx(true_kl, abs=0.01)
    assert (kl_k3(logp, logq) >= 0).all()


def test_kl_in_reward():
    rewards = torch.tensor([[0.0, 1.0, 7.0]], dtype=torch.float64)
    logp = torch.tensor([[-1.0, -2.0, 0.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.0, -9.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    shaped, metrics = kl_in_reward(rewards, logp, ref, mask, beta=0.1)
    torch.testing.assert_close(shaped, torch.tensor([[-0.05, 1.1, 7.0]], dtype=torch.float64))
    assert metrics["kl_k1"] == pytest.approx(-0.25)
    assert metrics["kl_k3"] == pytest.approx((math.exp(-0.5) - 0.5 + math.exp(1.0) - 2) / 2)
    assert metrics["kl_beta"] == 0.1


def test_masked_mean_ignores_nan_padding():
    x = torch.tensor([1.0, 3.0, float("nan")])
    assert masked_mean(x, torch.tensor([True, True, False])).item() == 2.0
    assert masked_mean(x, torch.zeros(3, dtype=torch.bool)).item() == 0.0


def test_clip_higher_leaves_more_room_above_one():
    """DAPO's clip-higher: ``clip(rho, 1 - eps_low, 1 + eps_high)`` with eps_low 0.2, eps_high 0.28."""
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    ratio = torch.tensor([[1.25, 1.5, 0.7, 1.25]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    old_logp = torch.zeros_like(ratio)
    logp = ratio.log().requires_grad_(True)
    loss, metrics = ppo_policy_loss(logp, old_logp, adv, mask, clip_eps=0.2, clip_eps_high=0.28, dual_clip=None)
    # 1.25 < 1.28: not clipped (-1.25); 1.5 clipped to 1.28 (-1.28); A < 0 at 0.7: clip to 0.8 (0.8);
    # A < 0 at 1.25: the unclipped -A * rho = 1.25 is the max
    assert loss.item() == pytest.approx((-1.25 - 1.28 + 0.8 + 1.25) / 4)
    assert metrics["clip_frac"] == pytest.approx(2 / 4)
    symmetric, _ = ppo_policy_loss(logp, old_logp, adv, mask, clip_eps=0.2, dual_clip=None)
    assert symmetric.item() == pytest.approx((-1.2 - 1.2 + 0.8 + 1.25) / 4)


def test_token_mean_and_sequence_mean_aggregation():
    x = torch.tensor([[4.0, 99.0, 99.0], [1.0, 2.0, 3.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[True, False, False], [True, True, True], [False, False, False]])
    assert aggregate(x, mask, "token_mean").item() == pytest.approx(10 / 4)  # every token alike (DAPO)
    assert aggregate(x, mask, "sequence_mean").item() == pytest.approx((4 + 2) / 2)  # turns alike
    assert aggregation_weight(mask, "token_mean") == 4 and aggregation_weight(mask, "sequence_mean") == 2
    with pytest.raises(ValueError, match="token_mean, sequence_mean"):
        aggregate(x, mask, "seq")
    # a mini-batch split into micro-batches and weighed by aggregation_weight gives the same loss
    for how in ("token_mean", "sequence_mean"):
        parts = [(slice(0, 1),), (slice(1, 3),)]
        total = aggregation_weight(mask, how)
        joined = sum(aggregate(x[p], mask[p], how) * aggregation_weight(mask[p], how) / total for (p,) in parts)
        assert joined.item() == pytest.approx(aggregate(x, mask, how).item())


def test_gspo_sequence_ratio_and_clip_by_hand():
    """GSPO: ``s_i = exp(mean_t log rho_{i,t})`` per turn, clipped as a whole; its gradient is that
    of ``-A * s_i``: ``d/d logp_{i,t} = -A * s_i / |y_i|`` inside the clip range, 0 outside."""
    old_logp = torch.zeros(3, 2, dtype=torch.float64)
    log_rho = torch.tensor([[0.1, 0.3], [0.01, -0.01], [-0.5, 9.0]], dtype=torch.float64)
    logp = (old_logp + log_rho).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0], [2.0, 2.0], [-1.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, True], [True, False]])
    loss, metrics = gspo_policy_loss(
        logp, old_logp, adv, mask, clip_eps=0.2, clip_eps_high=0.2, aggregation="sequence_mean"
    )
    s = [math.exp(0.2), math.exp(0.0), math.exp(-0.5)]  # turn 2's second token is padding
    # turn 0: s = 1.221 > 1.2, A > 0: clipped, -1.2;  turn 1: s = 1, -2;  turn 2: s = 0.607 < 0.8, A < 0: 0.8
    assert loss.item() == pytest.approx((-1.2 - 2.0 + 0.8) / 3)
    assert metrics["clip_frac"] == pytest.approx(3 / 5)  # tokens of the clipped turns 0 and 2
    loss.backward()
    expected = torch.tensor([[0.0, 0.0], [-2.0 * s[1] / 2 / 3] * 2, [0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, expected)
    # one ratio per turn: tokens of a turn cannot be clipped apart (PPO would clip token 0.3 alone)
    ppo, _ = ppo_policy_loss(logp.detach(), old_logp, adv, mask, clip_eps=0.2, dual_clip=None)
    assert ppo.item() != pytest.approx(loss.item())
    assert policy_loss_fn("gspo") is gspo_policy_loss and policy_loss_fn("ppo") is ppo_policy_loss
    with pytest.raises(ValueError, match="ppo, gspo"):
        policy_loss_fn("grpo")
