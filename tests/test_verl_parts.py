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

    return TokenOutput(
        token_ids=ids,
        log_probs=logprobs,
        stop_reason=stop_reason,
        extra_fields={"global_steps": step, "max_global_steps": step, "min_global_steps": step},
    )


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
    assert params == {
        "temperature": 0.7,
        "top_p": 1.0,
        "top_k": 5,
        "repetition_penalty": 1.0,
        "max_new_tokens": 64,
        "logprobs": True,
        "stop_token_ids": [tiny_tokenizer.eos_token_id],
        "sampling_seed": 4,
    }
    vllm = LLMServerEngine(client, tiny_tokenizer, server="vllm")
    assert vllm.sampling_params(SamplingParams(seed=4, stop=("ACTION:",)))["seed"] == 4  # vLLM's own name


def test_engine_sends_sglang_no_stop_strings_only_single_token_ids(tiny_tokenizer):
    """verl's SGLang runs without a tokenizer: a stop string that is one token becomes a stop id,
    a longer one is cut client-side; the fake server refuses ``stop`` and ``seed`` as SGLang would."""
    from verlog.backends.base import SamplingParams
    from verlog.integrations.verl.engine import LLMServerEngine, single_token_ids
    from verlog.integrations.verl.local import EngineServerClient

    newline = tiny_tokenizer.encode("\n", add_special_tokens=False)
    assert len(newline) == 1
    ids, longer = single_token_ids(tiny_tokenizer, ("\n", "ACTION:"))
    assert ids == newline and longer == ("ACTION:",)
    engine = LLMServerEngine(_Client(), tiny_tokenizer)
    params = engine.sampling_params(SamplingParams(stop=("\n", "ACTION:"), seed=1))
    assert "stop" not in params and "seed" not in params and params["sampling_seed"] == 1
    assert params["stop_token_ids"] == sorted({newline[0], tiny_tokenizer.eos_token_id})

    class _Plain:  # an engine that ignores stops: the server side of "generates on"
        eos_token_ids = ()

        async def generate(self, prompt_ids, sampling, *, request_id=None):
            from verlog.backends.base import Generation

            ids = tiny_tokenizer("one ACTION: two three", add_special_tokens=False)["input_ids"]
            return Generation(ids, [-0.5] * len(ids), "length")

    client = EngineServerClient(_Plain())
    with pytest.raises(ValueError, match="no stop strings"):
        asyncio.run(client.generate("r", prompt_ids=[1], sampling_params={"stop": ["x"]}))
    with pytest.raises(ValueError, match="seed"):
        asyncio.run(client.generate("r", prompt_ids=[1], sampling_params={"seed": 1}))
    gen = _generate(LLMServerEngine(client, tiny_tokenizer), [1], SamplingParams(stop=("ACTION:",), seed=3))
    assert tiny_tokenizer.decode(gen.token_ids).endswith("ACTION:") and gen.finish_reason == "stop"


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
    infos = [
        _info("b", 1, reward=1.0, terminated=True),
        _info("a", 3, kind="bootstrap"),
        _info("a", 0),
        None,
        _info("a", 2, reward=0.5),
        _info("b", 0),
        _info("a", 1),
    ]
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
    assert batch.lengths.tolist() == [[3, 2, 1], [0, 4, 2]]  # b is right-aligned behind an empty turn
    assert batch.terminated.tolist() == [[False, False, False], [False, False, True]]  # part of b's first episode
    assert batch.bootstrap_values.tolist() == pytest.approx([values[1, 0].item(), 0.0])

    adv, _ = dual_gae(batch)
    alone = TurnBatch(
        rewards[[5, 0]][None],
        mask[[5, 0]][None],
        torch.tensor([[False, True]]),
        torch.zeros(1, 2, dtype=torch.bool),
        values=torch.cat([values[[5, 0]], torch.zeros(2, 1)], -1)[None],
        bootstrap_values=None,
    )
    expected, _ = dual_gae(alone)
    torch.testing.assert_close(adv[1, 1:], expected[0])
    scattered = layout.scatter(adv, 4)
    assert scattered[3].abs().sum() == 0 and scattered[1].abs().sum() == 0  # pad row, bootstrap row
    torch.testing.assert_close(scattered[2, :3], adv[0, 0, :3])


def test_turn_data_of_a_short_trajectory_continuing_an_episode():
    """A short trajectory sits right-aligned behind empty turns that belong to its first
    episode: its seed group, no anchor, and its episode-start flag. Here b's first turn ends an
    episode begun in an earlier batch, so GRPO leaves it out of the policy loss (were the empty
    turn a finished episode of its own, b's first turn would open a complete episode and be
    compared with a's episode of seed 7)."""
    from dataclasses import replace

    from verl.protocol import DataProto

    from verlog.integrations.verl.advantage import compute_turn_advantages
    from verlog.integrations.verl.layout import rows_to_turn_batch, turn_data
    from verlog.integrations.verl.settings import EstimatorSettings

    def turn(trajectory, position, seed, starts, reward=0.0, terminated=False, anchor=None):
        info = _info(trajectory, position, reward=reward, terminated=terminated)
        return replace(info, seed=seed, starts_episode=starts, anchor=anchor)

    infos = [
        turn("b", 1, 9, True, reward=0.5, terminated=True, anchor="s0"),
        turn("a", 0, 7, True, reward=0.0, terminated=True, anchor="s0"),
        None,  # verl's padding row
        turn("a", 1, 8, True, anchor="s1"),
        turn("b", 0, 7, False, reward=1.0, terminated=True),
        turn("a", 2, 8, False, reward=2.0, terminated=True, anchor="s1"),
    ]
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]])
    batch, layout = rows_to_turn_batch(mask.bool(), None, torch.zeros(6, 3), infos)
    assert batch.values is None and batch.bootstrap_values is None  # no critic, no values
    data = turn_data(infos, layout)
    g7, g8, g9 = data.groups[0, 0].item(), data.groups[0, 1].item(), data.groups[1, 2].item()
    s0, s1 = data.anchors[0, 0].item(), data.anchors[0, 1].item()
    assert len({g7, g8, g9}) == 3 and s0 != s1 and min(s0, s1) >= 0
    assert data.groups.tolist() == [[g7, g8, g8], [g7, g7, g9]]  # b's empty turn: its first turn's group
    assert data.anchors.tolist() == [[s0, s1, s1], [-1, -1, s0]]
    assert data.episode_starts.tolist() == [True, False]

    out = DataProto.from_dict({"response_mask": mask.clone()})
    out, metrics = compute_turn_advantages(out, infos, EstimatorSettings(estimator="grpo", whiten_advantages=False))
    assert out.batch["response_mask"].tolist() == [[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1], [0, 0, 0], [1, 0, 0]]
    assert out.batch["advantages"].abs().sum() == 0  # every group has one complete episode: no baseline
    assert metrics["verlog/adv/policy_token_frac"] == pytest.approx(7 / 9)


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


def _warmup_rows(store, batch: int) -> list[str]:
    """One rollout batch in the store, as verl's agent-loop worker writes it: two trajectories of
    turns of unequal lengths (one ended, one cut with a bootstrap row)."""
    from verlog.integrations.verl.samples import bootstrap_output, turn_output
    from verlog.rollout.turn import Turn

    keys = []
    plan = {"a": [5, 2, 7], "b": [3, 6]}
    for name, lengths in plan.items():
        trajectory = f"w{batch}{name}"
        outputs = []
        for i, n in enumerate(lengths):
            turn = Turn(
                f"ep-{trajectory}",
                i,
                list(range(1, 4 + i)),
                [9] * n,
                [-0.5] * n,
                reward=float(i),
                terminated=name == "a" and i == len(lengths) - 1,
            )
            outputs.append(
                turn_output(turn, trajectory=trajectory, position=i, episode_id=turn.episode_id, steps=(0, 0))
            )
        if name == "b":
            outputs.append(
                bootstrap_output(
                    [1, 2, 3, 4],
                    0,
                    trajectory=trajectory,
                    position=len(lengths),
                    episode_id=f"ep-{trajectory}",
                    turn_index=len(lengths),
                    steps=(0, 0),
                )
            )
        for i, out in enumerate(outputs):
            key = f"{trajectory}_0_{i}"
            prompt, response = torch.tensor(out.prompt_ids), torch.tensor(out.response_ids)
            ids = torch.cat([prompt, response])
            store.rows["train"][key] = {
                "prompts": prompt,
                "responses": response,
                "input_ids": ids,
                "attention_mask": torch.ones_like(ids),
                "position_ids": torch.arange(len(ids)),
                "response_mask": torch.tensor(out.response_mask),
                "rollout_log_probs": torch.tensor(out.response_logprobs),
                "rm_scores": torch.zeros(len(response)),
                "extra_fields": out.extra_fields,
            }
            store.tags["train"][key] = {"status": "success", "seq_len": len(ids)}
            keys.append(key)
    return keys


def _value_loss_as_verls_critic(store, keys):
    """What verl's critic worker does with a mini-batch (``workers/utils/losses.value_loss``):
    predictions at each row's own response length, the stored per-token fields padded, verl's
    ``compute_value_loss``. Checked on every micro-batch of one or two rows."""
    from itertools import combinations

    from verl.trainer.ppo.core_algos import compute_value_loss

    for group in [[k] for k in keys] + [list(pair) for pair in combinations(keys, 2)]:
        data = store.kv_batch_get(group, "train", ["values", "returns", "response_mask", "responses"])
        vpreds = torch.zeros(len(group), int(data["responses"].offsets().diff().max()))
        padded = data.select("values", "returns", "response_mask").to_padded_tensor()
        compute_value_loss(
            vpreds=vpreds,
            values=padded["values"],
            returns=padded["returns"],
            response_mask=padded["response_mask"].bool(),
            cliprange_value=0.5,
            loss_agg_mode="token-mean",
        )


def test_critic_pretraining_pads_with_verls_balance_batch_before_values_and_gae(monkeypatch):
    """Verlog's schedule inside verl's trainer, with verl's real ``_balance_batch`` on rows of
    unequal lengths: W rollout batches, then S critic-only updates, each on a random subset that
    verl pads, values and GAE recomputed over the whole buffer before each; every row the critic
    trains on has per-token fields of its own length (verl's value loss runs on each); the actor
    does not move. Padding after values/GAE (the old order) breaks verl's value loss."""
    from omegaconf import OmegaConf
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from verlog.algo import CriticWarmup
    from verlog.integrations.verl.local import MemoryTransferQueue
    from verlog.integrations.verl.settings import EstimatorSettings, VerlSettings
    from verlog.integrations.verl.trainer import VerlogPPOTrainer

    store = MemoryTransferQueue()
    batches = [_warmup_rows(store, w) for w in range(3)]  # 6 rows each (5 turns + 1 bootstrap row)
    events: list = []
    collected: list[KVBatchMeta] = []

    def sample(**kwargs):
        keys = batches[len(collected)]
        meta = KVBatchMeta(keys=list(keys), tags=[dict(store.tags["train"][k]) for k in keys], partition_id="train")
        collected.append(meta)
        return meta, {}

    trainer = object.__new__(VerlogPPOTrainer)
    trainer.config = OmegaConf.create(
        {
            "data": {"train_batch_size": 2},
            "actor_rollout_ref": {"rollout": {"temperature": 1.0, "n": 1}, "actor": {"ppo_mini_batch_size": 4}},
            "critic": {"ppo_mini_batch_size": 4},
            "trainer": {"critic_warmup": 0},
            "algorithm": {"use_kl_in_reward": False, "kl_penalty": "kl"},
        }
    )
    trainer.spec = SimpleNamespace(settings=VerlSettings(), advantage_settings=lambda: EstimatorSettings())
    trainer.slot_episodes, trainer.slot_in_flight = {}, {}
    trainer.use_critic = True
    trainer.tokenizer = SimpleNamespace(eos_token_id=0)
    trainer.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": [0, 1]})  # 2 data-parallel ranks
    trainer.critic_warmup = CriticWarmup(buffer_multiplier=3, iterations=2, subset_fraction=0.4, seed=0)
    trainer.global_steps = 1
    trainer.replay_buffer = SimpleNamespace(sample=sample)
    trainer.checkpoint_manager = SimpleNamespace(
        sleep_replicas=lambda: events.append("sleep"), update_weights=lambda step: events.append(("wake", step))
    )
    trainer.prepare_step = lambda: events.append("rollout")
    gen = torch.Generator().manual_seed(0)

    def compute_values(batch, metrics):  # verl's critic: a value per response token of each row
        events.append(("values", tuple(batch.keys)))
        data = store.kv_batch_get(batch.keys, "train", ["response_mask"])
        lengths = data["response_mask"].offsets().diff().tolist()
        values = torch.nested.as_nested_tensor([torch.randn(n, generator=gen) for n in lengths], layout=torch.jagged)
        from tensordict import TensorDict

        store.kv_batch_put(batch.keys, "train", fields=TensorDict({"values": values}, batch_size=len(lengths)))

    trained: list = []

    def update_critic(batch, metrics):
        events.append(("critic", tuple(batch.keys)))
        assert len(batch) % 4 == 0  # verl's padding made it fit the critic's mini-batches
        _value_loss_as_verls_critic(store, batch.keys)
        trained.append(batch)
        metrics["critic/vf_loss"] = 0.5

    trainer._compute_values = compute_values
    trainer._update_critic = update_critic
    trainer._update_actor = lambda *a, **k: pytest.fail("the actor moved during critic pre-training")
    original_gae = VerlogPPOTrainer._compute_advantage

    def gae(self, batch, metrics, initial_policy=False):
        events.append(("gae", tuple(batch.keys)))
        return original_gae(self, batch, metrics, initial_policy=initial_policy)

    monkeypatch.setattr(VerlogPPOTrainer, "_compute_advantage", gae)
    monkeypatch.setattr(PPOTrainer, "step", lambda self, metrics, timing: "the usual step")
    metrics: dict = {}
    with store.patch():
        assert trainer.step(metrics, {}) == "the usual step"
        assert trainer.step({}, {}) == "the usual step"  # pre-training happens once

        assert events[:4] == ["rollout"] * 3 + ["sleep"]
        buffer = [k for b in batches for k in b]
        updates = [[k for k in keys if k in buffer] for kind, *rest in events[4:] if kind == "critic" for keys in rest]
        assert len(updates) == 2 and all(len(u) == 7 for u in updates)  # 40 % of 18 rows
        assert updates[0] != updates[1]  # a fresh random subset each iteration
        assert all(any(t.get("is_padding") for t in b.tags) for b in trained)  # verl padded every subset
        for i in range(2):  # values over the 3 batches, then GAE over all of them, then the critic
            chunk = [e[0] for e in events[4:-1] if e != "sleep"][i * 5 : (i + 1) * 5]
            assert chunk == ["values"] * 3 + ["gae", "critic"]
        assert events[-1] == ("wake", 0)
        assert store.trajectory_keys() == [] and not store.tags["train"]  # the buffer is released
        assert metrics["verlog/critic_warmup/batches"] == 3 and metrics["verlog/critic_warmup/vf_loss"] == 0.5

        # the old order: values and GAE first, then verl pads the subset -> verl's value loss fails
        keys = _warmup_rows(store, 9)
        part = KVBatchMeta(keys=keys, tags=[dict(store.tags["train"][k]) for k in keys], partition_id="train")
        compute_values(part, {})
        original_gae(trainer, part, {}, initial_policy=True)
        length = {k: len(store.rows["train"][k]["responses"]) for k in keys}
        longest, short = max(keys, key=length.get), next(k for k in keys if length[k] == 2)
        chosen = [longest, short]  # verl's padding rows copy the first: 7 values, for a 1-token response
        subset = KVBatchMeta(keys=chosen, tags=[dict(store.tags["train"][k]) for k in chosen], partition_id="train")
        subset = trainer._balance_batch(subset, metrics={})
        with pytest.raises(RuntimeError, match="size of tensor"):
            _value_loss_as_verls_critic(store, subset.keys)


# ---------------------------------------------------------------------- truncation


def test_a_truncated_turn_bootstraps_from_its_next_state_row_and_a_terminated_one_does_not():
    """The next-state row of a truncated turn gives ``truncation_values``; swapping the turn's
    ``terminated`` and ``truncated`` flags changes the advantages verl trains with."""
    from verl.protocol import DataProto

    from verlog.integrations.verl.advantage import compute_turn_advantages
    from verlog.integrations.verl.samples import RowInfo
    from verlog.integrations.verl.settings import EstimatorSettings

    def infos(truncated: bool):
        done = dict(terminated=not truncated, truncated=truncated)
        return [
            RowInfo("turn", "a", 0, "ep", 0, 0.0, False, False, None),
            RowInfo("turn", "a", 1, "ep", 1, 1.0, **done, summary=None),
            RowInfo("next_state", "a", 2, "ep", 1, 0.0, False, False, None),
        ]

    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]], dtype=torch.bool)
    values = torch.tensor([[0.2, 0.3, 0.1], [0.5, 0.4, 0.0], [2.0, 0.0, 0.0]])
    gae = EstimatorSettings(estimator="gae", whiten_advantages=False)
    results = {}
    for truncated in (True, False):
        data = DataProto.from_dict({"response_mask": mask.float(), "values": values.clone()})
        data, metrics = compute_turn_advantages(data, infos(truncated), gae)
        results[truncated] = (data.batch["advantages"], data.batch["returns"], metrics)
    (adv_trunc, ret_trunc, m_trunc), (adv_term, ret_term, m_term) = results[True], results[False]
    assert not torch.allclose(adv_trunc, adv_term)
    # the truncated last turn's return: its reward plus gamma_step times the next state's value
    assert ret_trunc[1, 0].item() == pytest.approx(1.0 + 0.99 * 2.0)
    assert ret_term[1, 0].item() == pytest.approx(1.0)
    assert adv_trunc[2].abs().sum() == 0  # the next-state row trains nothing
    assert m_trunc["verlog/truncated_turns_bootstrapped"] == 1 and m_term["verlog/truncated_turns_bootstrapped"] == 0


# ---------------------------------------------------------------------- per-turn temperature, checkpoints


def test_a_turn_sampled_at_another_temperature_than_verl_scores_is_refused_in_one_line():
    from verlog.integrations.verl.agent_loop import TurnTemperatureError, check_turn_temperature
    from verlog.rollout.turn import Turn

    turn = Turn("ep", 0, [1], [2], [-0.1], temperature=0.7, node="think")
    with pytest.raises(TurnTemperatureError) as info:
        check_turn_temperature(turn, 1.0)
    message = str(info.value)
    assert "\n" not in message and "'think'" in message and "0.7" in message and "temperature=1" in message
    check_turn_temperature(Turn("ep", 0, [1], [2], [-0.1], temperature=0.7), 0.7)
    check_turn_temperature(Turn("ep", 0, [1], [2], [-0.1], temperature=0.0), 1.0)  # greedy: scored at 1


def test_slot_episode_counters_are_saved_with_verls_checkpoint_and_restored(tmp_path, monkeypatch):
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from verlog.integrations.verl.dataset import VerlogRows, rows_uri
    from verlog.integrations.verl.samples import RowInfo
    from verlog.integrations.verl.trainer import SLOTS_FILE, VerlogPPOTrainer

    monkeypatch.setattr(PPOTrainer, "_save_checkpoint", lambda self: None)
    monkeypatch.setattr(PPOTrainer, "_load_checkpoint", lambda self: setattr(self, "global_steps", 7))
    config = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path), "resume_mode": "auto"}})

    def trainer():
        t = object.__new__(VerlogPPOTrainer)
        t.config, t.slot_episodes, t.slot_in_flight, t.global_steps = config, {}, {}, 7
        t.train_dataset = VerlogRows(rows_uri("slots", 2))
        return t

    first = trainer()
    summary = {"episodes_started": {"0:0": 5, "1:0": 9}, "in_flight": {"0:0": 4, "1:0": None}}
    first._note_slot_episodes([RowInfo("turn", "a", 0, "e", 0, 0.0, False, False, summary), None])
    first._save_checkpoint()
    assert (tmp_path / "global_step_7" / SLOTS_FILE).is_file()
    resumed = trainer()
    resumed._load_checkpoint()
    assert resumed.slot_episodes == {"0:0": 5, "1:0": 9} and resumed.slot_in_flight == {"0:0": 4, "1:0": None}
    assert resumed.train_dataset[1]["extra_info"]["verlog_episodes_started"] == {"0": 9}
    # the round in flight travels with the row (slot 0's episode 4 is played again, whole, first)
    assert resumed.train_dataset[0]["extra_info"]["verlog_in_flight"] == {"0": 4}
    assert resumed.train_dataset[1]["extra_info"]["verlog_in_flight"] == {}


def test_the_verl_settings_share_the_verlog_configs_defaults():
    """Settings of one meaning in a verlog config and in a verl config's ``verlog:`` block have one
    default, kept in ``verlog.config``."""
    from verlog.config import DEFAULT_EVAL_EPISODES, EvalConfig, RolloutConfig, TrainerConfig
    from verlog.integrations.verl.settings import VerlSettings

    verl, trainer, rollout = VerlSettings(), TrainerConfig(), RolloutConfig()
    for name in ("num_envs", "turns_per_env", "group_size", "max_consecutive_failures"):
        assert getattr(verl, name) == getattr(trainer, name), name
    assert (verl.seed, verl.episode_timeout_s) == (rollout.seed, rollout.episode_timeout_s)
    assert (verl.eval_episodes, verl.eval_seed) == (DEFAULT_EVAL_EPISODES, EvalConfig().seed)
