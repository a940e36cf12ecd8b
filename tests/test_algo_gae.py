"""Dual-discount GAE against a plain loop written from the recursion, plus classic GAE."""

from __future__ import annotations

import math

import pytest
import torch

from verlog.algo import TurnBatch, classic_gae, discounted_reverse_cumsum, dual_gae, next_state_values


def reference_dual_gae(batch: TurnBatch, gamma_step, lam_step, gamma_tok, lam_tok):
    """The recursion, literally: per slot, backwards over turns, backwards over positions."""
    n, k_turns, t_max = batch.token_rewards.shape
    adv = torch.zeros(n, k_turns, t_max, dtype=torch.float64)
    ret = torch.zeros(n, k_turns, t_max + 1, dtype=torch.float64)
    for s in range(n):
        a = 0.0  # A_{k+1,0}; beyond the batch boundary it is 0
        for k in reversed(range(k_turns)):
            length = int(batch.response_mask[s, k].sum())
            v = [float(x) for x in batch.values[s, k, : length + 1]]
            r = [float(x) for x in batch.token_rewards[s, k, :length]]
            terminated, truncated = bool(batch.terminated[s, k]), bool(batch.truncated[s, k])
            done = terminated or truncated
            if terminated:
                v_next = 0.0
            elif truncated:
                tv = None if batch.truncation_values is None else float(batch.truncation_values[s, k])
                v_next = tv if tv is not None and math.isfinite(tv) else 0.0
            elif k + 1 < k_turns:
                v_next = float(batch.values[s, k + 1, 0])
            else:
                v_next = float(batch.bootstrap_values[s])
            a = (1.0 - done) * a  # entering turn k from k+1
            a = gamma_step * v_next - v[length] + gamma_step * lam_step * a  # j = L_k
            ret[s, k, length] = a + v[length]
            for j in reversed(range(length)):
                a = r[j] + gamma_tok * v[j + 1] - v[j] + gamma_tok * lam_tok * a
                adv[s, k, j] = a
                ret[s, k, j] = a + v[j]
            # leaving turn k: a is A_{k,0}
    return adv, ret


def random_batch(seed, n=3, k=6, t=7, p_term=0.2, p_trunc=0.2, zero_lengths=True, nan_padding=True):
    g = torch.Generator().manual_seed(seed)
    low = 0 if zero_lengths else 1
    lengths = torch.randint(low, t + 1, (n, k), generator=g)
    lengths[0, 0] = t  # at least one full-length response
    mask = torch.arange(t) < lengths.unsqueeze(-1)
    rewards = torch.randn(n, k, t, generator=g, dtype=torch.float64)
    values = torch.randn(n, k, t + 1, generator=g, dtype=torch.float64)
    if nan_padding:  # padding must never leak into the result
        rewards = torch.where(mask, rewards, torch.full_like(rewards, float("nan")))
        values = torch.where(torch.arange(t + 1) <= lengths.unsqueeze(-1), values, float("nan"))
    terminated = torch.rand(n, k, generator=g) < p_term
    truncated = torch.rand(n, k, generator=g) < p_trunc
    truncation_values = torch.randn(n, k, generator=g, dtype=torch.float64)
    truncation_values[torch.rand(n, k, generator=g) < 0.5] = float("nan")  # unknown: terminal
    return TurnBatch(
        token_rewards=rewards,
        response_mask=mask,
        terminated=terminated,
        truncated=truncated,
        values=values,
        bootstrap_values=torch.randn(n, generator=g, dtype=torch.float64),
        truncation_values=truncation_values,
    )


SETTINGS = [
    (0.99, 0.95, 1.0, 1.0),
    (0.9, 0.8, 0.97, 0.9),
    (1.0, 1.0, 1.0, 1.0),
    (0.95, 0.0, 0.5, 0.0),
    (0.99, 0.95, 0.999, 1.0),
]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("gammas", SETTINGS)
def test_dual_gae_matches_reference_loop(seed, gammas):
    batch = random_batch(seed)
    adv, ret = dual_gae(batch, *gammas)
    ref_adv, ref_ret = reference_dual_gae(batch, *gammas)
    assert adv.shape == batch.token_rewards.shape and ret.shape == batch.values.shape
    torch.testing.assert_close(adv, ref_adv, atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, ref_ret, atol=1e-6, rtol=0)
    assert not torch.isnan(adv).any() and not torch.isnan(ret).any()
    assert (adv[~batch.response_mask] == 0).all() and (ret[~batch.value_mask] == 0).all()


def test_dual_gae_long_responses_chunked_discount():
    """Responses spanning several discount-matrix chunks (64 positions), with gamma*lambda < 1."""
    batch = random_batch(7, n=2, k=3, t=300, zero_lengths=False)
    adv, ret = dual_gae(batch, 0.99, 0.95, 0.995, 0.98)
    ref_adv, ref_ret = reference_dual_gae(batch, 0.99, 0.95, 0.995, 0.98)
    torch.testing.assert_close(adv, ref_adv, atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, ref_ret, atol=1e-6, rtol=0)


def test_dual_gae_float32_close_to_float64():
    batch = random_batch(3, nan_padding=False)
    adv64, _ = dual_gae(batch)
    batch.values = batch.values.float()
    adv32, _ = dual_gae(batch)
    assert adv32.dtype == torch.float32
    torch.testing.assert_close(adv32.double(), adv64, atol=1e-4, rtol=0)


def test_one_token_responses_equal_classic_gae():
    """gamma_tok = lam_tok = 1 and L_k = 1: the token level telescopes, leaving GAE over steps."""
    for seed in range(4):
        batch = random_batch(seed, n=4, k=9, t=1, zero_lengths=False, nan_padding=False)
        adv, ret = dual_gae(batch, 0.9, 0.7, 1.0, 1.0)
        step_adv, step_ret = classic_gae(
            batch.token_rewards[..., 0],
            batch.values[..., 0],
            batch.terminated,
            batch.truncated,
            bootstrap_values=batch.bootstrap_values,
            truncation_values=batch.truncation_values,
            gamma=0.9,
            lam=0.7,
        )
        torch.testing.assert_close(adv[..., 0], step_adv, atol=1e-9, rtol=0)
        torch.testing.assert_close(ret[..., 0], step_ret, atol=1e-9, rtol=0)


def test_telescoping_with_unit_token_discount():
    """gamma_tok = lam_tok = 1: A_{k,j} = sum_{i>=j} r + gamma*V_next - V_{k,j} + gamma*lam*(1-d)*A_{k+1,0}."""
    batch = random_batch(11, nan_padding=False)
    adv, _ = dual_gae(batch, 0.9, 0.8)
    v_next = next_state_values(
        batch.values[..., 0], batch.terminated, batch.truncated, batch.bootstrap_values, batch.truncation_values
    )
    s, k = 1, 2
    length = int(batch.lengths[s, k])
    a_next = adv[s, k + 1, 0] if batch.lengths[s, k + 1] > 0 else None
    if a_next is None or length == 0:
        pytest.skip("needs non-empty responses at the chosen turns")
    a_next = a_next * (1 - float(batch.dones[s, k]))
    rewards = batch.token_rewards[s, k, :length]
    for j in range(length):
        expected = rewards[j:].sum() + 0.9 * v_next[s, k] - batch.values[s, k, j] + 0.9 * 0.8 * a_next
        assert abs(float(adv[s, k, j] - expected)) < 1e-9


def test_hand_computed_two_turn_episode():
    """One slot, two turns (2 tokens, then 1 token that terminates), worked by hand."""
    batch = TurnBatch(
        token_rewards=torch.tensor([[[0.0, 1.0], [2.0, 0.0]]], dtype=torch.float64),
        response_mask=torch.tensor([[[True, True], [True, False]]]),
        terminated=torch.tensor([[False, True]]),
        truncated=torch.tensor([[False, False]]),
        values=torch.tensor([[[0.5, 0.25, 0.75], [1.0, 3.0, 99.0]]], dtype=torch.float64),
        bootstrap_values=torch.tensor([7.0], dtype=torch.float64),
    )
    gs, ls, gt, lt = 0.5, 0.5, 0.5, 1.0
    # turn 1 (terminal): bridge 0*... - V=3 -> -3; token 0: 2 + 0.5*3 - 1 + 0.5*(-3) = 1
    a1_bridge = -3.0
    a1_0 = 2.0 + gt * 3.0 - 1.0 + gt * lt * a1_bridge
    # turn 0: bridge = gs*V_{1,0} - V_{0,2} + gs*ls*A_{1,0}
    a0_bridge = gs * 1.0 - 0.75 + gs * ls * a1_0
    a0_1 = 1.0 + gt * 0.75 - 0.25 + gt * lt * a0_bridge
    a0_0 = 0.0 + gt * 0.25 - 0.5 + gt * lt * a0_1
    adv, ret = dual_gae(batch, gs, ls, gt, lt)
    torch.testing.assert_close(adv, torch.tensor([[[a0_0, a0_1], [a1_0, 0.0]]], dtype=torch.float64))
    expected_ret = [[a0_0 + 0.5, a0_1 + 0.25, a0_bridge + 0.75], [a1_0 + 1.0, a1_bridge + 3.0, 0.0]]
    torch.testing.assert_close(ret, torch.tensor([expected_ret], dtype=torch.float64))


def test_truncation_bootstraps_but_stops_the_recursion():
    def one_slot(truncated, truncation_value):
        return TurnBatch(
            token_rewards=torch.tensor([[[1.0], [5.0]]], dtype=torch.float64),
            response_mask=torch.ones(1, 2, 1, dtype=torch.bool),
            terminated=torch.tensor([[not truncated, False]]),
            truncated=torch.tensor([[truncated, False]]),
            values=torch.tensor([[[0.0, 0.0], [2.0, 2.0]]], dtype=torch.float64),
            bootstrap_values=torch.tensor([3.0], dtype=torch.float64),
            truncation_values=torch.tensor([[truncation_value, float("nan")]], dtype=torch.float64),
        )

    terminal, _ = dual_gae(one_slot(False, 10.0), 0.5, 1.0)
    cut, _ = dual_gae(one_slot(True, 10.0), 0.5, 1.0)
    cut_unknown, _ = dual_gae(one_slot(True, float("nan")), 0.5, 1.0)
    assert float(terminal[0, 0, 0]) == 1.0  # r, no bootstrap, nothing from the next episode
    assert float(cut[0, 0, 0]) == 1.0 + 0.5 * 10.0  # bootstraps from V(s_next of the cut episode)
    assert float(cut_unknown[0, 0, 0]) == 1.0  # unknown value: like terminal
    # the next turn (a new episode) is cut by the batch boundary: bootstraps from the slot value
    assert float(cut[0, 1, 0]) == 5.0 + 0.5 * 3.0 - 2.0


def test_zero_length_response_and_missing_bootstrap():
    batch = random_batch(1, n=2, k=2, t=3, nan_padding=False)
    batch.response_mask[:] = False
    batch.response_mask[0, 0, :2] = True
    adv, ret = dual_gae(batch)
    ref_adv, ref_ret = reference_dual_gae(batch, 0.99, 0.95, 1.0, 1.0)
    torch.testing.assert_close(adv, ref_adv)
    torch.testing.assert_close(ret, ref_ret)
    batch.bootstrap_values = None
    with pytest.raises(ValueError, match="bootstrap_values"):
        dual_gae(batch)
    batch.terminated[:, -1] = True
    dual_gae(batch)  # every slot's last turn is done: no bootstrap needed


def test_turn_batch_validation():
    with pytest.raises(ValueError, match="prefix"):
        TurnBatch(
            token_rewards=torch.zeros(1, 1, 3),
            response_mask=torch.tensor([[[True, False, True]]]),
            terminated=torch.zeros(1, 1),
            truncated=torch.zeros(1, 1),
        )
    with pytest.raises(ValueError, match="values"):
        TurnBatch(
            token_rewards=torch.zeros(1, 1, 3),
            response_mask=torch.ones(1, 1, 3),
            terminated=torch.zeros(1, 1),
            truncated=torch.zeros(1, 1),
            values=torch.zeros(1, 1, 3),
        )


@pytest.mark.parametrize("discount", [1.0, 0.9, 0.0])
def test_discounted_reverse_cumsum(discount):
    x = torch.randn(2, 3, 37, dtype=torch.float64)
    y = discounted_reverse_cumsum(x, discount, chunk_size=8)
    expected = torch.zeros_like(x)
    running = torch.zeros_like(x[..., 0])
    for j in reversed(range(x.shape[-1])):
        running = x[..., j] + discount * running
        expected[..., j] = running
    torch.testing.assert_close(y, expected, atol=1e-12, rtol=0)


def test_classic_gae_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 2.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 1.0, 1.5]], dtype=torch.float64)
    adv, ret = classic_gae(
        rewards,
        values,
        terminated=torch.tensor([[False, True, False]]),
        bootstrap_values=torch.tensor([4.0]),
        gamma=0.5,
        lam=0.5,
    )
    a2 = 2.0 + 0.5 * 4.0 - 1.5
    a1 = 0.0 - 1.0  # terminal
    a0 = 1.0 + 0.5 * 1.0 - 0.5 + 0.25 * a1
    torch.testing.assert_close(adv, torch.tensor([[a0, a1, a2]], dtype=torch.float64))
    torch.testing.assert_close(ret, adv + values)
