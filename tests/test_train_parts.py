"""The trainer's parts: turn tensors, forward passes at the right positions, micro-batching that
does not change the maths, checkpoints that survive a kill."""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path
from typing import Sequence

import pytest
import torch

from verlog.algo import TurnBatch, dual_gae
from verlog.config import AlgorithmConfig, load_config
from verlog.rollout.slots import SlotBatch
from verlog.rollout.turn import Turn
from verlog.train.forward import micro_batches, pack_rows, policy_logprobs, values_at_positions
from verlog.train.ppo import Learner, build_token_masks, ppo_update, score_batch
from verlog.train.storage import RolloutStorage
from verlog.train.trainer import every_core
from verlog.weights import checkpoint as ckpt
from verlog.weights.actor_critic import ValueModel


@pytest.fixture(scope="module")
def toy():
    from verlog.models import load_causal_lm, load_tokenizer, toy_model_dir

    folder = toy_model_dir()
    return load_causal_lm(folder), load_tokenizer(folder)


def random_batch(num_envs=3, turns_per_env=4, vocab=40, seed=0, prefix: Sequence[int] = ()) -> SlotBatch:
    """Turns with random prompts (each after ``prefix``, e.g. an instruction every turn repeats) and
    responses of varied lengths, some done."""
    g = torch.Generator().manual_seed(seed)
    turns = []
    for i in range(num_envs):
        slot = []
        for k in range(turns_per_env):
            p = int(torch.randint(3, 9, (1,), generator=g))
            length = int(torch.randint(1, 5, (1,), generator=g))
            response = torch.randint(4, vocab, (length,), generator=g).tolist()
            slot.append(
                Turn(
                    episode_id=f"e{i}",
                    turn_index=k,
                    prompt_ids=[*prefix, *torch.randint(4, vocab, (p,), generator=g).tolist()],
                    response_ids=response,
                    logprobs=[-1.0] * length,
                    reward=float(torch.rand(1, generator=g)),
                    terminated=bool(k == 1 and i == 0),
                    truncated=bool(k == 2 and i == 1),
                )
            )
        turns.append(slot)
    bootstrap = [torch.randint(4, vocab, (5,), generator=g).tolist() for _ in range(num_envs)]
    seeds = [[i] * turns_per_env for i in range(num_envs)]
    return SlotBatch(turns, bootstrap, [True] * num_envs, seeds)


def test_micro_batches_fit_the_budget_and_cover_every_row():
    lengths = [5, 40, 7, 12, 3, 100, 9]
    groups = micro_batches(range(len(lengths)), lengths, token_budget=30)
    assert sorted(r for g in groups for r in g) == list(range(len(lengths)))
    for g in groups:
        assert len(g) == 1 or len(g) * max(lengths[r] for r in g) <= 30


def test_storage_layout_rewards_and_advantages():
    batch = random_batch()
    s = RolloutStorage.from_batch(batch)
    turns = batch.flat_turns()
    assert s.size == 12 and s.response_ids.shape[1] == max(len(t.response_ids) for t in turns)
    for row, turn in enumerate(turns):  # slot-major rows; reward on the last response token
        n = len(turn.response_ids)
        assert s.sequences[row] == turn.prompt_ids + turn.response_ids
        assert s.response_mask[row].sum() == n and s.value_mask[row].sum() == n + 1
        assert s.token_rewards[row, n - 1] == pytest.approx(turn.reward) and s.token_rewards[
            row
        ].sum() == pytest.approx(turn.reward)
    s.values = torch.randn(s.size, s.response_ids.shape[1] + 1) * s.value_mask
    s.bootstrap_values = torch.randn(3)
    algo = AlgorithmConfig(whiten_advantages=False)
    s.compute_advantages(algo)
    expected, returns = dual_gae(
        TurnBatch(
            s.token_rewards.view(3, 4, -1),
            s.response_mask.view(3, 4, -1),
            s.terminated.view(3, 4),
            s.truncated.view(3, 4),
            s.values.view(3, 4, -1),
            s.bootstrap_values,
        )
    )
    assert torch.allclose(s.advantages, expected.view(12, -1)) and torch.allclose(s.returns, returns.view(12, -1))
    s.compute_advantages(AlgorithmConfig(estimator="zero"))
    assert not s.advantages.any()


def test_forward_reads_the_right_positions(toy):
    lm, _ = toy
    batch = random_batch()
    s = RolloutStorage.from_batch(batch)
    rows = pack_rows(s.sequences, 0, "cpu")
    with torch.no_grad():
        logp, entropy = policy_logprobs(lm, rows, s.prompt_lengths, s.response_ids, with_entropy=True)
        critic = ValueModel.from_causal_lm(copy.deepcopy(lm))
        torch.nn.init.normal_(critic.value_head.weight)
        values = values_at_positions(critic, rows, s.prompt_lengths, s.response_ids.shape[1] + 1)
        for row, seq in enumerate(s.sequences):  # each sequence alone, unpadded
            p, n = int(s.prompt_lengths[row]), int(s.response_mask[row].sum())
            full = torch.log_softmax(lm(torch.tensor([seq])).logits[0], -1)
            expected = full[p - 1 : p - 1 + n].gather(1, torch.tensor(seq[p:])[:, None])[:, 0]
            assert torch.allclose(logp[row, :n], expected, atol=1e-5)
            alone = critic(torch.tensor([seq]))[0]
            assert torch.allclose(values[row, : n + 1], alone[p - 1 : p + n], atol=1e-5)
    assert (entropy[s.response_mask] > 0).all()


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean"])
def test_micro_batching_does_not_change_the_update(toy, aggregation):
    """Nor does it under either loss aggregation: the entropy bonus is weighed as the policy loss
    (a large coefficient, so that a token-mean bonus under ``sequence_mean`` would show)."""
    lm, _ = toy
    algo = AlgorithmConfig(
        ppo_epochs=1, mini_batch_turns=12, entropy_coef=0.5, kl_coef=0.0, value_clip=0.5, loss_aggregation=aggregation
    )

    def one_update(token_budget):
        torch.manual_seed(0)
        actor = copy.deepcopy(lm)
        critic = ValueModel.from_causal_lm(copy.deepcopy(lm))
        learner = Learner(
            actor,
            critic,
            torch.optim.SGD(actor.parameters(), lr=0.1),
            torch.optim.SGD(critic.parameters(), lr=0.1),
            None,
            algo.model_copy(update={"micro_batch_tokens": token_budget}),
            pad_id=0,
            device=torch.device("cpu"),
        )
        s = RolloutStorage.from_batch(random_batch())
        score_batch(s, learner)
        s.old_logprobs = s.old_logprobs + 0.05  # ratios != 1: the clipped branches matter too
        metrics = ppo_update(s, learner, generator=torch.Generator().manual_seed(0))
        return actor, critic, metrics

    a1, c1, m1 = one_update(10_000)  # one micro-batch
    a2, c2, m2 = one_update(12)  # one or two turns per micro-batch
    for p, q in zip([*a1.parameters(), *c1.parameters()], [*a2.parameters(), *c2.parameters()]):
        assert torch.allclose(p, q, atol=1e-6)
    assert m1["policy_loss"] == pytest.approx(m2["policy_loss"], abs=1e-6)
    assert m1["value_loss"] == pytest.approx(m2["value_loss"], abs=1e-6)
    assert m1["entropy"] == pytest.approx(m2["entropy"], abs=1e-6)


def _toy_learner(lm, tokenizer, algo: AlgorithmConfig, masks: bool = False) -> Learner:
    from verlog.tokens import eos_token_ids
    from verlog.train.grammar_masks import ResponseMasks

    actor, critic = copy.deepcopy(lm), ValueModel.from_causal_lm(copy.deepcopy(lm))
    vocab = actor.get_output_embeddings().weight.shape[0]
    return Learner(
        actor,
        critic,
        torch.optim.AdamW(actor.parameters(), lr=1e-2),
        torch.optim.AdamW(critic.parameters(), lr=1e-2),
        None,
        algo,
        pad_id=0,
        device=torch.device("cpu"),
        token_masks=ResponseMasks(tokenizer, vocab, eos_token_ids(tokenizer, actor)) if masks else None,
    )


def test_the_actors_and_the_critics_epochs_apart_take_the_steps_they_take_together(toy):
    """Overlapped updates in processes train the actor and the critic in two processes, each from the
    same shuffling state: the same mini-batches, the same weights after, as in one ``ppo_update``."""
    lm, tokenizer = toy
    algo = AlgorithmConfig(ppo_epochs=2, mini_batch_turns=4, kl_coef=0.0)
    together, apart = (_toy_learner(lm, tokenizer, algo) for _ in range(2))
    s = RolloutStorage.from_batch(random_batch())
    score_batch(s, together)
    s.old_logprobs = s.old_logprobs + 0.05  # ratios != 1
    ppo_update(s, together, generator=torch.Generator().manual_seed(3))
    actor_gen, critic_gen = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    actor = ppo_update(s, apart, update_critic=False, generator=actor_gen)
    critic = ppo_update(s, apart, update_actor=False, generator=critic_gen)
    assert "value_loss" not in actor and "policy_loss" not in critic
    assert torch.equal(actor_gen.get_state(), critic_gen.get_state())  # the same draws
    for p, q in zip(
        [*together.actor.parameters(), *together.critic.parameters()],
        [*apart.actor.parameters(), *apart.critic.parameters()],
    ):
        assert torch.allclose(p, q, atol=1e-6)
    assert any(
        not torch.equal(p, q)
        for p, q in zip(together.critic.parameters(), _toy_learner(lm, tokenizer, algo).critic.parameters())
    )


def test_a_mini_batch_with_no_policy_token_does_not_step_the_actor(toy):
    """Every turn out of the policy loss (DAPO dropped every group): the actor is not stepped (AdamW
    on zero gradients would still move it by its momentum and weight decay); the critic trains."""
    lm, tokenizer = toy
    learner = _toy_learner(lm, tokenizer, AlgorithmConfig(ppo_epochs=1, mini_batch_turns=6, kl_coef=0.0))
    actor, critic = learner.actor, learner.critic
    s = RolloutStorage.from_batch(random_batch())
    score_batch(s, learner)
    ppo_update(s, learner, generator=torch.Generator().manual_seed(0))  # the optimizers gain momentum
    before = [p.detach().clone() for p in actor.parameters()]
    critic_before = [p.detach().clone() for p in critic.parameters()]
    score_batch(s, learner)
    s.policy_mask = torch.zeros_like(s.policy_mask)
    metrics = ppo_update(s, learner, generator=torch.Generator().manual_seed(0))
    assert all(torch.equal(p, q) for p, q in zip(actor.parameters(), before))
    assert "policy_loss" not in metrics and "actor_grad_norm" not in metrics
    assert any(not torch.equal(p, q) for p, q in zip(critic.parameters(), critic_before))


def test_a_step_with_non_finite_gradients_is_skipped(toy):
    """A NaN in the loss (here: one turn's advantage) leaves the actor's weights as they were and
    is counted (``actor_skipped_steps``); its norm is kept out of the mean; the critic still trains."""
    lm, tokenizer = toy
    learner = _toy_learner(lm, tokenizer, AlgorithmConfig(ppo_epochs=1, mini_batch_turns=12, kl_coef=0.0))
    s = RolloutStorage.from_batch(random_batch())
    score_batch(s, learner)
    s.advantages[0, 0] = float("nan")
    before = [p.detach().clone() for p in learner.actor.parameters()]
    critic_before = [p.detach().clone() for p in learner.critic.parameters()]
    metrics = ppo_update(s, learner, generator=torch.Generator().manual_seed(0))
    assert all(torch.equal(p, q) for p, q in zip(learner.actor.parameters(), before))
    assert metrics["actor_skipped_steps"] == 1 and "actor_grad_norm" not in metrics
    assert any(not torch.equal(p, q) for p, q in zip(learner.critic.parameters(), critic_before))
    assert "critic_skipped_steps" not in metrics


def test_constrained_turns_are_scored_under_their_rebuilt_masks(toy):
    """A turn sampled under a regex is scored under the tokens the grammar allowed at each of its
    positions (old logprobs, the PPO pass and its entropy), rebuilt from ``Turn.grammar``; a turn
    with no recorded grammar, or with a token the grammar forbids, is scored under the whole
    distribution and counted; unconstrained turns are untouched."""
    lm, tokenizer = toy
    ids = {w: tokenizer.convert_tokens_to_ids(w) for w in ("up", "down", "left", "right", "red", "north")}
    batch = random_batch(num_envs=2, turns_per_env=3)
    constrained = {  # row: (grammar, response)
        0: ("(up|down) (red|north)", [ids["up"], ids["north"]]),
        1: ("left|right", [ids["right"]]),
        2: ("up|down", [ids["red"]]),  # a token the grammar forbids: not masked
    }
    rows = [t for slot in batch.turns for t in slot]
    for row, (grammar, response) in constrained.items():
        rows[row].response_ids, rows[row].logprobs = response, [-1.0] * len(response)
        rows[row].constraint, rows[row].grammar = "regex", grammar
    rows[3].constraint = "regex"  # constrained, its grammar unknown (e.g. a stored trace)
    algo = AlgorithmConfig(ppo_epochs=1, mini_batch_turns=6, kl_coef=0.0, entropy_coef=0.01)
    masked = _toy_learner(lm, tokenizer, algo, masks=True)
    whole = _toy_learner(lm, tokenizer, algo, masks=False)
    s, plain = RolloutStorage.from_batch(batch), RolloutStorage.from_batch(batch)
    metrics = score_batch(s, masked)
    score_batch(plain, whole)
    assert metrics["masked_turns"] == 2 and metrics["unmasked_constrained_turns"] == 2
    assert sorted(s.token_masks) == [0, 1]
    full = plain.old_logprobs
    # the masked logprob: the logit's log-softmax over the allowed tokens alone
    logp = torch.log_softmax(_toy_logits(masked.actor, rows[0]), dim=-1)
    allowed_first = [ids["up"], ids["down"]]
    allowed_second = [ids["red"], ids["north"]]
    expect = [
        logp[0, ids["up"]] - torch.logsumexp(logp[0, allowed_first], 0),
        logp[1, ids["north"]] - torch.logsumexp(logp[1, allowed_second], 0),
    ]
    assert torch.allclose(s.old_logprobs[0, :2], torch.stack(expect), atol=1e-5)
    assert (s.old_logprobs[:2] > full[:2] + 0.1).masked_select(s.response_mask[:2]).all()
    unconstrained = [r for r in range(s.size) if r not in (0, 1)]
    assert torch.equal(s.old_logprobs[unconstrained], full[unconstrained])
    # the critic warm-up's buffer joins batches: its rows keep their constraints
    again = RolloutStorage.from_batch(batch)
    score_batch(again, whole)  # (scored without masks: the joined rows are rebuilt)
    joined = RolloutStorage.cat([s, again])
    assert joined.constraints == s.constraints * 2 and joined.unknown_grammars == 2 and joined.token_masks is None
    assert build_token_masks(joined, masked)["masked_turns"] == 4 and sorted(joined.token_masks) == [0, 1, 6, 7]
    update = ppo_update(s, masked, generator=torch.Generator().manual_seed(0))
    assert math.isfinite(update["entropy"]) and update["actor_grad_norm"] > 0


def _toy_logits(lm, turn: Turn) -> torch.Tensor:
    """The logits ``[len(response), V]`` that predict each response token of ``turn``."""
    ids = torch.tensor([turn.prompt_ids + turn.response_ids])
    with torch.no_grad():
        logits = lm(input_ids=ids).logits[0]
    p = len(turn.prompt_ids)
    return logits[p - 1 : p - 1 + len(turn.response_ids)].float()


def test_checkpoints_are_atomic_rotated_and_found(tmp_path):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    g = torch.Generator().manual_seed(1)

    def save(update):
        return ckpt.save_checkpoint(
            tmp_path,
            update,
            save_actor=lambda d: (d / "actor").mkdir(),
            critic=model,
            optimizers={"actor": opt, "critic": None},
            rng=ckpt.get_rng_state({"g": g}),
            state={"runner": {"n": update}},
            keep=2,
        )

    for update in (1, 2, 3):
        save(update)
    names = [p.name for p in ckpt.checkpoint_dirs(tmp_path)]
    assert names == ["update_000002", "update_000003"]  # the oldest was dropped
    (tmp_path / "checkpoints" / ".tmp-update_000004-1").mkdir()  # a save killed midway
    latest = ckpt.latest_checkpoint(tmp_path)
    assert latest.name == "update_000003" and ckpt.read_state(latest) == {"runner": {"n": 3}, "update": 3}
    (tmp_path / "checkpoints" / "latest").unlink()  # even without the pointer
    assert ckpt.latest_checkpoint(tmp_path).name == "update_000003"
    assert ckpt.resolve_checkpoint(tmp_path) == latest
    before = torch.rand(3, generator=g)
    ckpt.set_rng_state(ckpt.load_rng(latest), {"g": g})
    assert torch.equal(torch.rand(3, generator=g), before)  # the generator replays from the save
    assert json.loads((latest / "state.json").read_text())["update"] == 3


def shared_prompt_batch(num_envs=3, turns_per_env=4, prefix_len=40, seed=1) -> SlotBatch:
    """Turns whose prompts all start with the same ``prefix_len`` tokens (a game's instruction)."""
    batch = random_batch(num_envs, turns_per_env, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    prefix = torch.randint(4, 40, (prefix_len,), generator=g).tolist()
    for turn in batch.flat_turns():
        turn.prompt_ids = prefix + turn.prompt_ids
    return batch


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "gradient-checkpointing"])
def test_shared_prefix_pass_equals_the_unshared_one(toy, checkpointing):
    """Logprobs, values and parameter gradients with the instruction computed once per
    micro-batch equal those of the plain pass (1e-5 relative), with and without gradient
    checkpointing; checkpointed, the shared pass keeps a fraction of the activations."""
    lm, _ = toy
    s = RolloutStorage.from_batch(shared_prompt_batch())
    rows = pack_rows(s.sequences, 0, "cpu", first_read=s.prompt_lengths - 1, min_shared=8)
    plain = pack_rows(s.sequences, 0, "cpu")
    assert rows.offset >= 40 and plain.offset == 0
    torch.manual_seed(0)
    lm = copy.deepcopy(lm).train()
    critic = ValueModel.from_causal_lm(copy.deepcopy(lm)).train()
    torch.nn.init.normal_(critic.value_head.weight)
    if checkpointing:
        lm.gradient_checkpointing_enable()
        critic.gradient_checkpointing_enable()
    width = s.response_ids.shape[1]

    def run(packed):
        lm.zero_grad(set_to_none=True)
        critic.zero_grad(set_to_none=True)
        saved = []

        def pack(t):
            saved.append(t.numel() * t.element_size())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logp, entropy = policy_logprobs(
                lm, packed, s.prompt_lengths, s.response_ids, temperature=torch.full((s.size,), 0.8), with_entropy=True
            )
            values = values_at_positions(critic, packed, s.prompt_lengths, width + 1)
        loss = (logp * s.response_mask).sum() + (entropy * s.response_mask).sum() + (values * s.value_mask).sum()
        loss.backward()
        grads = {
            n: p.grad.clone() for n, p in [*lm.named_parameters(), *critic.named_parameters()] if p.grad is not None
        }
        return logp.detach() * s.response_mask, values.detach() * s.value_mask, grads, sum(saved)

    logp_a, values_a, grads_a, _ = run(plain)
    logp_b, values_b, grads_b, saved_b = run(rows)
    assert torch.allclose(logp_a, logp_b, rtol=1e-5, atol=1e-6)
    assert torch.allclose(values_a, values_b, rtol=1e-5, atol=1e-6)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        rel = (grads_a[name] - grads_b[name]).norm() / grads_a[name].norm().clamp(min=1e-12)
        assert rel < 1e-5, (name, float(rel))
    if checkpointing:  # the layers' activations were not kept: a fraction of the same pass without
        lm.gradient_checkpointing_disable()
        critic.backbone.gradient_checkpointing_disable()
        *_, saved_full = run(rows)
        assert saved_b < 0.6 * saved_full, (saved_b, saved_full)
    # the layers are left as they were (Hugging Face's own checkpointing, no override)
    assert all("forward" not in vars(m) for m in lm.modules())


def test_score_and_update_are_the_same_with_shared_prefixes(toy):
    """The trainer's passes (old logprobs, values, bootstrap values, PPO step) do not depend on
    prefix sharing."""
    lm, _ = toy
    results = []
    for share in (0, 8):
        torch.manual_seed(0)
        actor = copy.deepcopy(lm)
        critic = ValueModel.from_causal_lm(copy.deepcopy(lm))
        torch.nn.init.normal_(critic.value_head.weight, std=0.1)
        algo = AlgorithmConfig(shared_prefix_min_tokens=share, kl_coef=0.0, mini_batch_turns=12)
        learner = Learner(
            actor,
            critic,
            torch.optim.SGD(actor.parameters(), lr=0.1),
            torch.optim.SGD(critic.parameters(), lr=0.1),
            None,
            algo,
            pad_id=0,
            device=torch.device("cpu"),
        )
        s = RolloutStorage.from_batch(shared_prompt_batch())
        score_batch(s, learner)
        metrics = ppo_update(s, learner, generator=torch.Generator().manual_seed(0))
        results.append((s, metrics, [p.detach().clone() for p in actor.parameters()]))
    (a, ma, pa), (b, mb, pb) = results
    for name in ("old_logprobs", "values", "bootstrap_values", "advantages", "returns"):
        assert torch.allclose(getattr(a, name), getattr(b, name), rtol=1e-5, atol=1e-5), name
    assert ma["policy_loss"] == pytest.approx(mb["policy_loss"], rel=1e-4, abs=1e-6)
    assert all(torch.allclose(x, y, rtol=1e-4, atol=1e-6) for x, y in zip(pa, pb))


def test_training_the_last_layers_moves_only_them_and_exactly_as_full_training_would(toy):
    """``train_layers: 1``: embeddings, the lower blocks and the tied LM head keep their weights;
    the last block, the final norm (and the critic's value head) take the very step full training
    gives them (their gradients do not depend on what is frozen below)."""
    from verlog.config import ActorConfig, ConfigError
    from verlog.train.ppo import adamw
    from verlog.weights.actor_critic import train_last_layers

    lm, _ = toy
    algo = AlgorithmConfig(ppo_epochs=1, mini_batch_turns=12, kl_coef=0.0)

    def one_update(layers):
        torch.manual_seed(0)
        actor, critic = copy.deepcopy(lm), ValueModel.from_causal_lm(copy.deepcopy(lm))
        train_last_layers(actor, layers, section="actor")
        train_last_layers(critic, layers, section="critic")
        sgd = [torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.1) for m in (actor, critic)]
        learner = Learner(actor, critic, *sgd, None, algo, pad_id=0, device=torch.device("cpu"))
        s = RolloutStorage.from_batch(random_batch())
        score_batch(s, learner)
        s.old_logprobs = s.old_logprobs + 0.05
        ppo_update(s, learner, generator=torch.Generator().manual_seed(0))
        return dict(actor.named_parameters()), dict(critic.named_parameters())

    full_actor, full_critic = one_update(None)
    part_actor, part_critic = one_update(1)
    start = dict(lm.named_parameters())
    last = f"layers.{lm.config.num_hidden_layers - 1}."
    trained = [n for n in start if last in n or n.endswith("norm.weight") and "layers." not in n]
    assert trained and len(trained) < len(start)
    for name, p in part_actor.items():
        if name in trained:
            assert torch.allclose(p, full_actor[name], atol=1e-6) and not torch.equal(p, start[name]), name
        else:
            assert torch.equal(p, start[name]), name  # embeddings, lower blocks, the LM head
    assert not torch.equal(part_critic["value_head.weight"], torch.zeros_like(part_critic["value_head.weight"]))
    assert torch.allclose(part_critic["value_head.weight"], full_critic["value_head.weight"], atol=1e-6)
    frozen = copy.deepcopy(lm)
    train_last_layers(frozen, 1, section="actor")
    assert len(adamw(frozen, ActorConfig()).param_groups[0]["params"]) == len(trained)
    with pytest.raises(ConfigError, match=r"actor.train_layers: 99 is more than the model's \d+ layers"):
        train_last_layers(copy.deepcopy(lm), 99, section="actor")
    with pytest.raises(ValueError, match="actor.train_layers and actor.lora.rank > 0 are two ways"):
        ActorConfig(train_layers=2, lora={"rank": 4})


@pytest.mark.parametrize("prefix", [0, 12], ids=["no-prefix", "shared-prefix"])
def test_a_shared_frozen_trunk_runs_once_and_changes_nothing(toy, prefix):
    """Actor and critic training only their last block share the frozen block below: it runs once
    per batch, every pass starts from its states, and the logprobs, values and both models' updates
    are those of the passes that run every block (with a prefix every turn shares: computed once
    per micro-batch in the trunk, as in the passes without one). Different frozen weights are never
    shared."""
    from verlog.train.forward import shared_trunk_depth
    from verlog.weights.actor_critic import train_last_layers

    lm, _ = toy
    depth = lm.config.num_hidden_layers - 1
    algo = AlgorithmConfig(
        ppo_epochs=1, mini_batch_turns=6, kl_coef=0.0, entropy_coef=0.01, shared_prefix_min_tokens=8 if prefix else 0
    )
    instruction = list(range(4, 4 + prefix))

    def one_update(shared: bool):
        torch.manual_seed(0)
        actor, critic = copy.deepcopy(lm), ValueModel.from_causal_lm(copy.deepcopy(lm))
        train_last_layers(actor, 1, section="actor")
        train_last_layers(critic, 1, section="critic")
        trunk = shared_trunk_depth(actor.base_model, critic.backbone, depth) if shared else None
        assert (trunk == depth) if shared else trunk is None
        learner = Learner(
            actor,
            critic,
            *(torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2) for m in (actor, critic)),
            None,
            algo,
            pad_id=0,
            device=torch.device("cpu"),
            trunk_depth=trunk,
        )
        s = RolloutStorage.from_batch(random_batch(prefix=instruction))
        metrics = score_batch(s, learner)
        assert ("trunk_s" in metrics) == shared and (s.trunk_states is not None) == shared
        scored = (s.old_logprobs.clone(), s.values.clone(), s.advantages.clone())
        metrics |= ppo_update(s, learner, generator=torch.Generator().manual_seed(0))
        return scored, dict(actor.named_parameters()), dict(critic.named_parameters()), metrics

    (lp1, v1, a1), actor1, critic1, m1 = one_update(False)
    (lp2, v2, a2), actor2, critic2, m2 = one_update(True)
    assert (
        torch.allclose(lp1, lp2, atol=1e-5) and torch.allclose(v1, v2, atol=1e-5) and torch.allclose(a1, a2, atol=1e-4)
    )
    for one, two in ((actor1, actor2), (critic1, critic2)):
        for name, p in one.items():
            assert torch.allclose(p, two[name], atol=1e-5), name
    assert m1["policy_loss"] == pytest.approx(m2["policy_loss"], abs=1e-5)
    assert m1["value_loss"] == pytest.approx(m2["value_loss"], abs=1e-5)
    # a critic whose frozen blocks are other weights (or trainable) shares nothing
    actor, critic = copy.deepcopy(lm), ValueModel.from_causal_lm(copy.deepcopy(lm))
    train_last_layers(actor, 1, section="actor")
    train_last_layers(critic, 1, section="critic")
    with torch.no_grad():
        next(critic.backbone.layers[0].parameters()).add_(0.01)
    assert shared_trunk_depth(actor.base_model, critic.backbone, depth) is None
    assert shared_trunk_depth(copy.deepcopy(lm).base_model, None, depth) is None  # nothing frozen
    assert shared_trunk_depth(actor.base_model, None, depth) == depth  # no critic: the actor's passes alone


def test_the_trunk_runs_a_shared_prefix_once_with_the_same_states(toy):
    """``trunk_states`` with ``min_shared``: the leading tokens of a micro-batch's sequences run once
    (fewer tokens through the blocks), and every sequence's states equal those of its own pass."""
    from verlog.train.forward import trunk_states

    lm, _ = toy
    backbone, depth = lm.base_model, lm.config.num_hidden_layers - 1
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(4, 40, (20,), generator=g).tolist()
    seqs = [
        prefix + torch.randint(4, 40, (int(n),), generator=g).tolist() for n in torch.randint(1, 9, (7,), generator=g)
    ]
    seqs.append(prefix[:15] + [5, 6])  # shares less than the rest: the micro-batch's common part is 15

    embedded: list[int] = []
    hook = backbone.embed_tokens.register_forward_hook(lambda m, args, out: embedded.append(args[0].numel()))
    try:
        alone = [trunk_states(backbone, [q], depth, 0, "cpu", 4096)[0] for q in seqs]
        embedded.clear()
        whole = trunk_states(backbone, seqs, depth, 0, "cpu", 4096)
        padded = sum(embedded)
        embedded.clear()
        shared = trunk_states(backbone, seqs, depth, 0, "cpu", 4096, min_shared=8)
        once = sum(embedded)
    finally:
        hook.remove()
    assert once == 15 + len(seqs) * max(len(q) - 15 for q in seqs) < padded == len(seqs) * max(map(len, seqs))
    for mine, one, two in zip(alone, whole, shared):
        assert mine.shape == one.shape == two.shape
        assert torch.allclose(mine, one, atol=1e-5) and torch.allclose(mine, two, atol=1e-5)
    # under min_shared, nothing is shared
    embedded_again: list[int] = []
    hook = backbone.embed_tokens.register_forward_hook(lambda m, args, out: embedded_again.append(args[0].numel()))
    try:
        trunk_states(backbone, seqs, depth, 0, "cpu", 4096, min_shared=16)
    finally:
        hook.remove()
    assert sum(embedded_again) == padded


def test_passes_nothing_runs_beside_take_every_core_and_give_them_back():
    """An alternating update (and the critic's pre-training) runs with every core unless
    trainer.torch_threads says otherwise; the rollout's thread count comes back after it."""
    root = Path(__file__).resolve().parents[1]
    config = load_config(root / "configs" / "cue_corridor.yaml", ["trainer.torch_threads=null"])  # (it pins 1)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with every_core(config):
            assert torch.get_num_threads() == os.cpu_count()
        assert torch.get_num_threads() == 1
        with every_core(load_config(root / "configs" / "cue_corridor.yaml", ["trainer.torch_threads=1"])):
            assert torch.get_num_threads() == 1  # the user's setting stands
    finally:
        torch.set_num_threads(before)
