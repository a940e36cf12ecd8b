"""The verl integration's parts on their own: the engine adapter over verl's ``LLMServerClient``, the
rows -> ``TurnBatch`` layout, the dataset rows, and the critic pre-training schedule."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch


# ---------------------------------------------------------------------- LLMServerEngine


class _Client:
    """Answers every ``generate`` with one fixed ``TokenOutput`` (or raises)."""

    def __init__(self, out=None, error=None):
        self.out, self.error, self.seen = out, error, []

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        self.seen.append((request_id, list(prompt_ids), dict(sampling_params)))
        if self.error is not None:
            raise self.error
        return self.out


def _token_output(ids, logprobs, stop_reason="stop", step=3):
    from verl.workers.rollout.replica import TokenOutput

    return TokenOutput(token_ids=ids, log_probs=logprobs, stop_reason=stop_reason,
                       extra_fields={"global_steps": step, "max_global_steps": step, "min_global_steps": step})


def _generate(engine, prompt, sampling, request_id="ep1"):
    return asyncio.run(engine.generate(prompt, sampling, request_id=request_id))


def test_engine_sends_verl_sampling_params_and_keeps_ids_and_logprobs(tiny_tokenizer):
    from verlog.backends.base import SamplingParams
    from verlog.integrations.verl.engine import LLMServerEngine

    client = _Client(_token_output([5, 6, 7], [-0.1, -0.2, -0.3], stop_reason="length"))
    engine = LLMServerEngine(client, tiny_tokenizer, request_prefix="w1-", max_response_tokens=64)
    gen = _generate(engine, [1, 2, 3], SamplingParams(temperature=0.7, top_k=5, max_new_tokens=100, seed=4))
    assert (gen.token_ids, gen.logprobs, gen.finish_reason) == ([5, 6, 7], [-0.1, -0.2, -0.3], "length")
    assert gen.info["max_global_steps"] == 3
    request_id, prompt, params = client.seen[0]
    assert request_id == "w1-ep1" and prompt == [1, 2, 3]
    assert params == {"temperature": 0.7, "top_p": 1.0, "top_k": 5, "repetition_penalty": 1.0, "max_new_tokens": 64,
                      "logprobs": True, "stop_token_ids": [tiny_tokenizer.eos_token_id], "seed": 4}


def test_engine_applies_stop_strings_itself(tiny_tokenizer):
    from verlog.backends.base import SamplingParams
    from verlog.integrations.verl.engine import LLMServerEngine

    ids = tiny_tokenizer("think first. ACTION: go forward and more", add_special_tokens=False)["input_ids"]
    engine = LLMServerEngine(_Client(_token_output(ids, [-1.0] * len(ids), stop_reason="length")), tiny_tokenizer)
    gen = _generate(engine, [1], SamplingParams(stop=("ACTION:",)))
    n = len(gen.token_ids)
    assert gen.finish_reason == "stop" and gen.token_ids == ids[:n] and gen.logprobs == [-1.0] * n
    assert "ACTION:" in tiny_tokenizer.decode(gen.token_ids) and "ACTION:" not in tiny_tokenizer.decode(ids[: n - 1])


@pytest.mark.parametrize(
    "client, prompt, match",
    [
        (_Client(_token_output([1], None)), [1], "no logprobs"),
        (_Client(_token_output([], [], stop_reason="aborted")), [1], "aborted"),
        (_Client(error=RuntimeError("replica died")), [1], "replica died"),
        (_Client(_token_output([1], [0.0])), list(range(9)), "prompt_length=8"),
    ],
)
def test_engine_failures_are_engine_errors(client, prompt, match, tiny_tokenizer):
    from verlog.backends.base import EngineError, SamplingParams
    from verlog.integrations.verl.engine import LLMServerEngine

    engine = LLMServerEngine(client, tiny_tokenizer, max_prompt_tokens=8)
    with pytest.raises(EngineError, match=match):
        _generate(engine, prompt, SamplingParams())


# ---------------------------------------------------------------------- rows -> TurnBatch


def _info(trajectory, position, kind="turn", reward=0.0, terminated=False):
    from verlog.integrations.verl.samples import RowInfo

    return RowInfo(kind, trajectory, position, f"{trajectory}-ep", position, reward, terminated, False, None)


def test_layout_right_aligns_short_trajectories_and_matches_dual_gae_on_each():
    from verlog.algo import TurnBatch, dual_gae
    from verlog.integrations.verl.layout import rows_to_turn_batch

    # rows in shuffled order: trajectory a (3 turns + bootstrap row), b (2 turns, ended), a verl pad row
    infos = [_info("b", 1, reward=1.0, terminated=True), _info("a", 3, kind="bootstrap"), _info("a", 0),
             None, _info("a", 2, reward=0.5), _info("b", 0), _info("a", 1)]
    lengths = [2, 1, 3, 1, 1, 4, 2]
    mask = torch.zeros(7, 4, dtype=torch.bool)
    for row, n in enumerate(lengths):
        mask[row, :n] = True
    mask[1] = False  # the bootstrap row trains nothing
    values = torch.randn(7, 4)
    rewards = torch.zeros(7, 4)
    rewards[0, 1], rewards[4, 0] = 1.0, 0.5
    batch, layout = rows_to_turn_batch(mask, values, rewards, infos)
    assert layout.trajectories == ["a", "b"] and layout.turn_counts == [3, 2] and layout.has_bootstrap == [True, False]
    assert batch.lengths.tolist() == [[3, 2, 1], [0, 4, 2]]  # b is right-aligned behind an empty terminated turn
    assert batch.terminated.tolist() == [[False, False, False], [True, False, True]]
    assert batch.bootstrap_values.tolist() == pytest.approx([values[1, 0].item(), 0.0])

    adv, _ = dual_gae(batch)
    alone = TurnBatch(rewards[[5, 0]][None], mask[[5, 0]][None], torch.tensor([[False, True]]),
                      torch.zeros(1, 2, dtype=torch.bool),
                      values=torch.cat([values[[5, 0]], torch.zeros(2, 1)], -1)[None], bootstrap_values=None)
    expected, _ = dual_gae(alone)
    torch.testing.assert_close(adv[1, 1:], expected[0])
    scattered = layout.scatter(adv, 4)
    assert scattered[3].abs().sum() == 0 and scattered[1].abs().sum() == 0  # pad row, bootstrap row
    torch.testing.assert_close(scattered[2, :3], adv[0, 0, :3])


def test_layout_needs_the_bootstrap_row_of_a_cut_trajectory():
    from verlog.integrations.verl.layout import rows_to_turn_batch

    mask = torch.ones(2, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="no bootstrap row"):
        rows_to_turn_batch(mask, torch.zeros(2, 2), torch.zeros(2, 2), [_info("a", 0), _info("a", 1)])
    with pytest.raises(ValueError, match="same verlog_position"):
        rows_to_turn_batch(mask, torch.zeros(2, 2), torch.zeros(2, 2), [_info("a", 0), _info("a", 0, terminated=True)])


# ---------------------------------------------------------------------- dataset rows


def test_dataset_rows_name_slots_and_validation_episodes():
    from verl.utils.dataset.rl_dataset import collate_fn

    from verlog.integrations.verl.dataset import RowsSpec, VerlogRows, rows_uri

    rows = VerlogRows(rows_uri("slots", 3, "babyai:goto"))
    assert len(rows) == 3 and RowsSpec.parse(rows_uri("episodes", 7)).role == "episodes"
    batch = collate_fn([rows[i] for i in range(3)])
    assert list(batch["agent_name"]) == ["verlog_langgraph"] * 3
    assert [e["verlog_role"] for e in batch["extra_info"]] == ["slot"] * 3
    assert list(batch["data_source"]) == ["babyai:goto"] * 3
    assert len(VerlogRows(rows_uri("episodes", 10), max_samples=4)) == 4
    with pytest.raises(ValueError, match="not a verlog row set"):
        VerlogRows("data/train.parquet")


# ---------------------------------------------------------------------- critic pre-training


def test_critic_pretraining_collects_once_then_fits_the_critic_on_random_subsets(monkeypatch):
    """Verlog's schedule inside verl's trainer: W rollout batches, then S critic-only updates,
    values and GAE recomputed over the whole buffer before each; the actor does not move."""
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from verlog.algo import CriticWarmup
    from verlog.integrations.verl.local import MemoryTransferQueue
    from verlog.integrations.verl.trainer import VerlogPPOTrainer

    events: list = []
    collected: list[KVBatchMeta] = []

    def sample(**kwargs):
        w = len(collected)
        meta = KVBatchMeta(keys=[f"b{w}_{i}" for i in range(4)], tags=[{}] * 4, partition_id="train")
        collected.append(meta)
        return meta, {}

    trainer = object.__new__(VerlogPPOTrainer)
    trainer.config = SimpleNamespace(data=SimpleNamespace(train_batch_size=4),
                                     actor_rollout_ref=SimpleNamespace(rollout=SimpleNamespace(temperature=1.0)))
    trainer.critic_warmup = CriticWarmup(buffer_multiplier=3, iterations=2, subset_fraction=0.5, seed=0)
    trainer.global_steps = 1
    trainer.replay_buffer = SimpleNamespace(sample=sample)
    trainer.checkpoint_manager = SimpleNamespace(
        sleep_replicas=lambda: events.append("sleep"), update_weights=lambda step: events.append(("wake", step)))
    trainer.prepare_step = lambda: events.append("rollout")
    trainer._balance_batch = lambda batch, metrics, logging_prefix: batch
    trainer._compute_values = lambda batch, metrics: events.append(("values", tuple(batch.keys)))
    trainer._compute_advantage = lambda batch, metrics, initial_policy: events.append(("gae", tuple(batch.keys)))

    def update_critic(batch, metrics):
        events.append(("critic", tuple(batch.keys)))
        metrics["critic/vf_loss"] = 0.5

    trainer._update_critic = update_critic
    trainer._update_actor = lambda *a, **k: pytest.fail("the actor moved during critic pre-training")
    monkeypatch.setattr(PPOTrainer, "step", lambda self, metrics, timing: "the usual step")
    store = MemoryTransferQueue()
    for key in [f"b{w}_{i}" for w in range(3) for i in range(4)]:
        store.kv_put(key, "train", tag={"status": "success"})
    metrics: dict = {}
    with store.patch():
        assert trainer.step(metrics, {}) == "the usual step"
        assert trainer.step({}, {}) == "the usual step"  # pre-training happens once

    assert events[:4] == ["rollout"] * 3 + ["sleep"]
    buffer = [k for b in collected for k in b.keys]
    updates = [keys for kind, *rest in events[4:] if kind == "critic" for keys in rest]
    assert len(updates) == 2 and all(len(u) == 6 and set(u) <= set(buffer) for u in updates)
    assert updates[0] != updates[1]  # a fresh random subset each iteration
    per_iteration = events[4:-1]
    for i in range(2):  # values then GAE over all 3 batches, then one critic update
        chunk = per_iteration[i * 7:(i + 1) * 7]
        assert [e[0] for e in chunk] == ["values", "gae"] * 3 + ["critic"]
    assert events[-1] == ("wake", 0)
    assert store.trajectory_keys() == [] and not store.tags["train"]  # the buffer is released
    assert metrics["verlog/critic_warmup/batches"] == 3 and metrics["verlog/critic_warmup/vf_loss"] == 0.5
