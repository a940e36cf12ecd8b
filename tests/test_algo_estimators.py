"""The advantage-estimator registry and each estimator against a case computed by hand from its
paper's formula: RLOO, REINFORCE++, GiGPO (two trajectories passing one anchor state at different
steps), DAPO's dynamic sampling; the registry's contract with the config and the storage."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from test_algo_advantages import grpo_batch

from verlog.algo import TurnBatch, dual_gae, whiten
from verlog.algo.estimators import TurnData, estimate_advantages, estimator_names, get_estimator
from verlog.algo.estimators.gigpo import gigpo_advantages, step_returns
from verlog.algo.estimators.reinforce_pp import reinforce_pp_advantages
from verlog.algo.estimators.rloo import rloo_advantages
from verlog.config import AlgorithmConfig, ConfigError, config_from_dict


def one_token_batch(turn_rewards, terminated, truncated=None):
    """``[N, K]`` turn rewards as a ``TurnBatch`` of one-token responses."""
    rewards = torch.tensor(turn_rewards, dtype=torch.float64).unsqueeze(-1)
    terminated = torch.tensor(terminated)
    truncated = torch.zeros_like(terminated) if truncated is None else torch.tensor(truncated)
    return TurnBatch(rewards, torch.ones_like(rewards, dtype=torch.bool), terminated, truncated)


# ---------------------------------------------------------------------- the registry


def test_registry_lists_every_estimator_and_what_it_needs():
    assert estimator_names() == ("gae", "gigpo", "grpo", "reinforce_pp", "reinforce_pp_baseline", "rloo", "zero")
    critic = {name: get_estimator(name).needs_critic for name in estimator_names()}
    assert critic == {
        "gae": True,
        "gigpo": False,
        "grpo": False,
        "reinforce_pp": False,
        "reinforce_pp_baseline": False,
        "rloo": False,
        "zero": True,
    }
    assert get_estimator("gigpo").needs == {"groups", "anchors", "episode_starts"}
    assert get_estimator("reinforce_pp").needs == frozenset()
    assert not get_estimator("zero").learns
    with pytest.raises(ValueError, match="allowed: gae, gigpo"):
        get_estimator("ppo")


def test_config_takes_the_allowed_values_from_the_registry():
    for name in estimator_names():
        assert AlgorithmConfig(estimator=name).estimator == name
    with pytest.raises(ConfigError) as err:
        config_from_dict({"multi_turn": {"langgraph": {"path": "g.py"}}, "algorithm": {"estimator": "ppo"}})
    message = str(err.value)
    assert (
        "algorithm.estimator" in message
        and "gae, gigpo, grpo, reinforce_pp, reinforce_pp_baseline, rloo, zero" in message
    )


def test_the_config_reads_the_registry_without_torch():
    code = "import sys, verlog.config; verlog.config.AlgorithmConfig(estimator='gigpo'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_missing_inputs_and_settings_that_do_not_combine_are_named():
    batch, groups = grpo_batch()
    with pytest.raises(ValueError, match="needs per-turn episode_starts, groups"):
        estimate_advantages(AlgorithmConfig(estimator="grpo"), batch, TurnData())
    with pytest.raises(ValueError, match="critic's values"):
        estimate_advantages(AlgorithmConfig(estimator="gae"), batch, TurnData())
    with pytest.raises(ValueError, match="algorithm.drop_uniform_groups"):
        estimate_advantages(AlgorithmConfig(estimator="reinforce_pp", drop_uniform_groups=True), batch, TurnData())
    starts = torch.ones(3, dtype=torch.bool)
    no_anchors = TurnData(groups, starts, torch.full_like(groups, -1))
    with pytest.raises(ValueError, match=r"info\['anchor'\]"):
        estimate_advantages(AlgorithmConfig(estimator="gigpo"), batch, no_anchors)


def gae_batch(seed: int) -> TurnBatch:
    """Two slots x three turns x four tokens of random rewards and critic values; slot 0's second
    turn ends its episode, slot 1's episode runs on."""
    g = torch.Generator().manual_seed(seed)
    return TurnBatch(
        torch.randn(2, 3, 4, generator=g, dtype=torch.float64),
        torch.ones(2, 3, 4, dtype=torch.bool),
        torch.tensor([[False, True, False], [False, False, False]]),
        torch.zeros(2, 3, dtype=torch.bool),
        values=torch.randn(2, 3, 5, generator=g, dtype=torch.float64),
        bootstrap_values=torch.zeros(2, dtype=torch.float64),
    )


def test_gae_and_zero_through_the_registry():
    batch = gae_batch(0)
    adv, ret = dual_gae(batch, 0.9, 0.8)
    out = estimate_advantages(AlgorithmConfig(estimator="gae", gamma_step=0.9, lam_step=0.8), batch, TurnData())
    torch.testing.assert_close(out.advantages, whiten(adv, batch.response_mask))
    torch.testing.assert_close(out.returns, ret)
    assert out.included is None
    zero = estimate_advantages(AlgorithmConfig(estimator="zero", gamma_step=0.9, lam_step=0.8), batch, TurnData())
    assert not zero.advantages.any()  # not whitened: nothing to learn from
    torch.testing.assert_close(zero.returns, ret)  # the critic still trains


# ---------------------------------------------------------------------- RLOO


def test_rloo_leave_one_out_by_hand():
    batch, groups = grpo_batch()
    adv, included = rloo_advantages(batch, groups)
    # group 0 (complete): A=1, C=3, E=2.  A_i = R_i - mean of the others:
    #   A: 1 - (3 + 2) / 2 = -1.5    C: 3 - (1 + 2) / 2 = 1.5    E: 2 - (1 + 3) / 2 = 0
    # group 1: only B is complete (no baseline: 0); D is still running (left out)
    per_turn = torch.tensor([[-1.5, -1.5, 0.0], [1.5, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(adv, torch.where(batch.response_mask, per_turn.unsqueeze(-1), 0.0))
    assert included.tolist() == [[True, True, True], [True, False, False], [True, True, True]]
    # = G/(G-1) * (R - mean): a scaled GRPO without the std
    assert adv[0, 0, 0].item() == pytest.approx(3 / 2 * (1 - 2))


# ---------------------------------------------------------------------- REINFORCE++


def test_reinforce_pp_discounted_whitened_returns_by_hand():
    # one slot, three turns of two tokens: turn 0 (a KL penalty of -0.1 on its first token),
    # turn 1 pays 1 on its last token and terminates, turn 2 opens an episode still running
    rewards = torch.tensor([[[-0.1, 0.0], [0.0, 1.0], [2.0, 0.0]]], dtype=torch.float64)
    mask = torch.ones(1, 3, 2, dtype=torch.bool)
    batch = TurnBatch(rewards, mask, torch.tensor([[False, True, False]]), torch.zeros(1, 3, dtype=torch.bool))
    adv, included = reinforce_pp_advantages(batch, gamma_step=0.5, gamma_token=1.0)
    # G_{k,j} = sum_{i>=j} r_{k,i} + gamma_step * G_{k+1,0}:
    #   turn 1: [1, 1];  turn 0: [-0.1 + 0 + 0.5 * 1, 0 + 0.5 * 1] = [0.4, 0.5];  turn 2: left out
    g = torch.tensor([0.4, 0.5, 1.0, 1.0], dtype=torch.float64)
    expected = (g - g.mean()) / g.std(unbiased=False)
    torch.testing.assert_close(adv[0, :2].reshape(-1), expected, atol=1e-6, rtol=0)
    assert included.tolist() == [[True, True, False]] and not adv[0, 2].any()


def test_reinforce_pp_token_discount_and_episodes_begun_earlier():
    rewards = torch.tensor([[[0.0, 1.0], [0.0, 0.0]]], dtype=torch.float64)
    batch = TurnBatch(
        rewards,
        torch.ones(1, 2, 2, dtype=torch.bool),
        torch.tensor([[True, True]]),
        torch.zeros(1, 2, dtype=torch.bool),
    )
    data = TurnData(episode_starts=torch.tensor([False]))  # the first episode began in an earlier batch
    out = estimate_advantages(AlgorithmConfig(estimator="reinforce_pp", gamma_token=0.5), batch, data)
    g = torch.tensor([0.5, 1.0, 0.0, 0.0], dtype=torch.float64)  # G_{0,0} = 0 + 0.5 * 1
    torch.testing.assert_close(out.advantages.reshape(-1), (g - g.mean()) / g.std(unbiased=False), atol=1e-6, rtol=0)
    assert out.included.all()  # every reward after each turn is in the batch: both take part


# ---------------------------------------------------------------------- GiGPO


def gigpo_batch():
    """Two slots of seed 7 pass anchor state s1 at different steps; a third slot plays seed 9.

    slot 0 (seed 7):  s0 -> s1 -> s2 (reward 1, terminated) | new episode (seed 8) s0', running
    slot 1 (seed 7):  s0 -> s0 -> s1 -> s2 (reward 0, truncated)
    slot 2 (seed 9):  s1 -> s2 (reward 1, terminated)        | new episode (seed 11) s0 -> s1, running
    """
    s0, s1, s2, s0b = 0, 1, 2, 3
    batch = one_token_batch(
        [[0, 0, 1, 0], [0, 0, 0, 0], [0, 1, 0, 0]],
        [[False, False, True, False], [False, False, False, False], [False, True, False, False]],
        [[False, False, False, False], [False, False, False, True], [False, False, False, False]],
    )
    groups = torch.tensor([[7, 7, 7, 8], [7, 7, 7, 7], [9, 9, 11, 11]])
    anchors = torch.tensor([[s0, s1, s2, s0b], [s0, s0, s1, s2], [s1, s2, s0, s1]])
    return batch, groups, anchors


def test_gigpo_step_returns():
    batch, _, _ = gigpo_batch()
    returns = step_returns(batch.token_rewards.squeeze(-1), batch.dones, gamma=0.5)
    assert returns[0].tolist() == [0.25, 0.5, 1.0, 0.0] and returns[1].tolist() == [0.0] * 4
    assert returns[2, :2].tolist() == [0.5, 1.0]


def test_gigpo_two_trajectories_share_an_anchor_state_at_different_steps():
    batch, groups, anchors = gigpo_batch()
    adv, included, metrics = gigpo_advantages(batch, groups, anchors, gamma=0.5, step_weight=1.0, scale_by_std=False)
    # Episode level (seed 7: R = 1 and 0, mean 0.5): A^E = +0.5 (slot 0), -0.5 (slot 1); seed 9 alone: 0.
    # Step returns (gamma 0.5): slot 0: 0.25, 0.5, 1;  slot 1: 0, 0, 0, 0.
    # Anchor groups of seed 7:  s0 = {0.25 (slot 0, step 0), 0 (slot 1, step 0), 0 (slot 1, step 1)}, mean 1/12
    #                           s1 = {0.5 (slot 0, step 1), 0 (slot 1, step 2)}, mean 0.25
    #                           s2 = {1 (slot 0, step 2), 0 (slot 1, step 3)}, mean 0.5
    # Seed 9's s1 and s2 are other groups (each visited once: no step term), whatever their ids.
    expected = torch.tensor(
        [
            [0.5 + (0.25 - 1 / 12), 0.5 + 0.25, 0.5 + 0.5, 0.0],
            [-0.5 - 1 / 12, -0.5 - 1 / 12, -0.5 - 0.25, -0.5 - 0.5],
            [0.0, 0.0, 0.0, 0.0],
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(adv.squeeze(-1), expected)
    assert included.tolist() == [[True, True, True, False], [True] * 4, [True, True, False, False]]
    assert metrics["step_group_frac"] == pytest.approx(7 / 9)  # 7 of the 9 scored turns share a state
    assert metrics["step_group_size"] == pytest.approx((3 * 3 + 2 * 2 + 2 * 2) / 7)


def test_gigpo_with_std_weight_and_unknown_anchors():
    batch, groups, anchors = gigpo_batch()
    adv, _, _ = gigpo_advantages(batch, groups, anchors, gamma=0.5, step_weight=0.5, scale_by_std=True, eps=0.0)
    episode = 0.5 / math.sqrt(0.5)  # (1 - 0.5) / unbiased std of {1, 0}
    s1_step = 0.25 / math.sqrt(0.125)  # (0.5 - 0.25) / unbiased std of {0.5, 0}
    assert adv[0, 1, 0].item() == pytest.approx(episode + 0.5 * s1_step)
    assert adv[1, 2, 0].item() == pytest.approx(-episode - 0.5 * s1_step)
    unknown = anchors.clone()
    unknown[0, 1] = -1  # slot 0 reported no anchor at step 1: s1 is visited once in seed 7
    adv, _, _ = gigpo_advantages(batch, groups, unknown, gamma=0.5, step_weight=0.5, scale_by_std=True, eps=0.0)
    assert adv[0, 1, 0].item() == pytest.approx(episode) and adv[1, 2, 0].item() == pytest.approx(-episode)


def test_gigpo_ignores_the_prompt_history():
    """Anchor ids come from the environment's state: turns with different prompts (history
    windows) in one state group together; the estimator never sees prompts."""
    batch, groups, anchors = gigpo_batch()
    out = estimate_advantages(
        AlgorithmConfig(estimator="gigpo", whiten_advantages=False, group_norm="mean", gigpo_gamma=0.5),
        batch,
        TurnData(groups, torch.ones(3, dtype=torch.bool), anchors),
    )
    assert out.advantages[1, 2, 0].item() == pytest.approx(-0.75)
    assert out.metrics["policy_token_frac"] == pytest.approx(9 / 12)


# ---------------------------------------------------------------------- DAPO's dynamic sampling


def test_dynamic_sampling_drops_groups_whose_returns_are_all_equal():
    # seed 1: two complete episodes, both return 1 (no signal); seed 2: returns 1 and 0
    batch = one_token_batch(
        [[0, 1], [1, 0], [1, 0], [0, 0]], [[False, True], [True, False], [True, False], [False, True]]
    )
    groups = torch.tensor([[1, 1], [1, 5], [2, 6], [2, 2]])
    data = TurnData(groups, torch.ones(4, dtype=torch.bool), None)
    settings = AlgorithmConfig(estimator="grpo", drop_uniform_groups=True, whiten_advantages=False, group_norm="mean")
    out = estimate_advantages(settings, batch, data)
    # seed 1 (uniform) and seeds 5, 6 (still running: never scored) do not count; seed 2 stays
    assert out.included.tolist() == [[False, False], [False, False], [True, False], [True, True]]
    assert out.advantages.squeeze(-1).tolist() == [[0, 0], [0, 0], [0.5, 0], [-0.5, -0.5]]
    assert out.metrics["dropped_group_frac"] == pytest.approx(1 / 2)  # of the 2 groups with complete episodes
    assert out.metrics["dropped_turn_frac"] == pytest.approx(3 / 8)
    assert out.metrics["policy_token_frac"] == pytest.approx(3 / 8)


# ---------------------------------------------------------------------- the storage side


def test_storage_anchor_ids_and_turn_data():
    from verlog.rollout.slots import SlotBatch
    from verlog.rollout.turn import Turn
    from verlog.train.storage import RolloutStorage, anchor_ids

    assert anchor_ids([{"anchor": "a"}, {}, {"anchor": "b"}, {"anchor": "a"}, {"anchor": ("x", 1)}]).tolist() == [
        0,
        -1,
        1,
        0,
        2,
    ]
    infos = [["0:red", "1:blue"], ["0:red", None]]
    turns = [
        [
            Turn(
                f"e{i}",
                k,
                [1, 2],
                [3],
                [-1.0],
                reward=float(k),
                terminated=k == 1,
                info={} if a is None else {"anchor": a},
            )
            for k, a in enumerate(slot)
        ]
        for i, slot in enumerate(infos)
    ]
    s = RolloutStorage.from_batch(SlotBatch(turns, [[1], [1]], [True, True], [[4, 4], [4, 4]]))
    data = s.turn_data()
    assert data.anchors.tolist() == [[0, 1], [0, -1]] and data.groups.tolist() == [[4, 4], [4, 4]]
    metrics = s.compute_advantages(AlgorithmConfig(estimator="gigpo", whiten_advantages=False, group_norm="mean"))
    # returns 1 and 1: no episode signal; step 0's state "0:red" is shared (step returns 0.95 and 0.95);
    # 2 of the 3 turns with an anchor share theirs
    assert not s.advantages.any() and s.policy_mask.all() and metrics["step_group_frac"] == pytest.approx(2 / 3)


def test_group_norm_defaults_follow_each_paper():
    """``group_norm: null``: GRPO divides by the group's std (DeepSeekMath), GiGPO does not
    (verl-agent's mean_norm)."""
    batch, groups, anchors = gigpo_batch()
    data = TurnData(groups, torch.ones(3, dtype=torch.bool), anchors)

    def adv(**kw):
        return estimate_advantages(AlgorithmConfig(whiten_advantages=False, **kw), batch, data).advantages

    torch.testing.assert_close(adv(estimator="gigpo"), adv(estimator="gigpo", group_norm="mean"))
    assert not torch.allclose(adv(estimator="gigpo"), adv(estimator="gigpo", group_norm="mean_std"))
    torch.testing.assert_close(adv(estimator="grpo"), adv(estimator="grpo", group_norm="mean_std"))
    assert not torch.allclose(adv(estimator="grpo"), adv(estimator="grpo", group_norm="mean"))
