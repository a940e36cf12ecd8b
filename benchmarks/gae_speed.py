"""Speed of the vectorized dual-discount GAE against a per-token Python loop.

The loop is the usual way this estimator is written: backwards over turns and over the tokens
of each turn in Python, vectorized over env slots only. Both run on the same float64 batch of
32 slots x 8 turns x 512-token responses (256 turns, lengths drawn in 1..512, some episodes
ending inside the batch); the script prints both times, the speed-up and the largest
difference, for the default discounts (gamma_tok = lam_tok = 1) and for gamma_tok * lam_tok < 1.

    python benchmarks/gae_speed.py
"""

from __future__ import annotations

import statistics
import time

import torch

from verlog.algo import TurnBatch, dual_gae

N_ENVS, TURNS, MAX_LEN = 32, 8, 512


def make_batch(seed: int = 0) -> TurnBatch:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, MAX_LEN + 1, (N_ENVS, TURNS), generator=g)
    mask = torch.arange(MAX_LEN) < lengths.unsqueeze(-1)
    rewards = torch.randn(N_ENVS, TURNS, MAX_LEN, generator=g, dtype=torch.float64) * 0.01 * mask
    rewards.view(-1, MAX_LEN)[torch.arange(N_ENVS * TURNS), lengths.view(-1) - 1] += torch.randn(
        N_ENVS * TURNS, generator=g, dtype=torch.float64
    )  # the env reward on the last response token
    truncated = torch.rand(N_ENVS, TURNS, generator=g) < 0.05
    return TurnBatch(
        token_rewards=rewards,
        response_mask=mask,
        terminated=torch.rand(N_ENVS, TURNS, generator=g) < 0.1,
        truncated=truncated,
        values=torch.randn(N_ENVS, TURNS, MAX_LEN + 1, generator=g, dtype=torch.float64),
        bootstrap_values=torch.randn(N_ENVS, generator=g, dtype=torch.float64),
        truncation_values=torch.randn(N_ENVS, TURNS, generator=g, dtype=torch.float64),
    )


@torch.no_grad()
def loop_gae(batch: TurnBatch, gamma_step, lam_step, gamma_tok, lam_tok):
    """Per-turn, per-token Python loop, vectorized over env slots only."""
    n, k_turns, t_max = batch.token_rewards.shape
    values, rewards, mask = batch.values, batch.token_rewards, batch.response_mask
    lengths = batch.lengths
    done = batch.dones
    advantages = torch.zeros(n, k_turns, t_max + 1, dtype=values.dtype)
    a = torch.zeros(n, dtype=values.dtype)  # A_{k+1,0}
    for k in reversed(range(k_turns)):
        if k + 1 < k_turns:
            following = values[:, k + 1, 0]
        else:
            following = batch.bootstrap_values
        v_next = torch.where(batch.truncated[:, k], batch.truncation_values[:, k], following)
        v_next = torch.where(batch.terminated[:, k], torch.zeros_like(v_next), v_next)
        a = torch.where(done[:, k], torch.zeros_like(a), a)
        v_last = values[:, k].gather(1, lengths[:, k : k + 1]).squeeze(1)
        a = gamma_step * v_next - v_last + gamma_step * lam_step * a
        bridge = a  # A_{k,L_k}
        for j in reversed(range(t_max)):
            valid = mask[:, k, j]
            delta = rewards[:, k, j] + gamma_tok * values[:, k, j + 1] - values[:, k, j]
            a = torch.where(valid, delta + gamma_tok * lam_tok * a, a)
            advantages[:, k, j] = torch.where(valid, a, torch.zeros_like(a))
        advantages[:, k].scatter_(1, lengths[:, k : k + 1], bridge.unsqueeze(1))
    value_mask = batch.value_mask
    returns = torch.where(value_mask, advantages + values, torch.zeros_like(values))
    token_advantages = torch.where(mask, advantages[..., :t_max], torch.zeros_like(rewards))
    return token_advantages, returns


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main() -> None:
    torch.manual_seed(0)
    batch = make_batch()
    print(
        f"dual-discount GAE, {N_ENVS} slots x {TURNS} turns x {MAX_LEN} tokens (float64, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__})"
    )
    worst_ratio = float("inf")
    for gammas in [(0.99, 0.95, 1.0, 1.0), (0.99, 0.95, 0.99, 0.95)]:
        dual_gae(batch, *gammas)  # warm-up
        t_loop, (adv_loop, ret_loop) = timed(lambda gammas=gammas: loop_gae(batch, *gammas), 5)
        t_vec, (adv_vec, ret_vec) = timed(lambda gammas=gammas: dual_gae(batch, *gammas), 20)
        diff = max((adv_vec - adv_loop).abs().max().item(), (ret_vec - ret_loop).abs().max().item())
        ratio = t_loop / t_vec
        worst_ratio = min(worst_ratio, ratio)
        print(
            f"  gamma_step={gammas[0]} lam_step={gammas[1]} gamma_tok={gammas[2]} lam_tok={gammas[3]}: "
            f"loop {t_loop * 1e3:8.1f} ms | vectorized {t_vec * 1e3:6.2f} ms | "
            f"speed-up {ratio:6.1f}x | max |diff| {diff:.2e}"
        )
        assert diff < 1e-6, f"vectorized and loop GAE differ by {diff}"
    print(f"goal: >= 20x and equal within 1e-6 -> {'OK' if worst_ratio >= 20 else 'TOO SLOW'}")


if __name__ == "__main__":
    main()
