"""Faults only a GPU run of verl would hit, reproduced on CPU with verl's own classes: a bf16 critic's
values, an empty generation from the rollout server, and a machine missing GPUs, Ray CPUs or
flash-attn (the pre-flight lines); the attention implementation follows flash-attn."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from test_verl_pipeline import (
    GRAPH,
    NUM_ENVS,
    TURNS,
    _by_slot,
    _expected_advantages,
    _rollout_world,
    advantage_trainer,
)

ROOT = Path(__file__).resolve().parents[1]
OFFLINE_MODEL = "actor_rollout_ref.model.path=tiny"
#: a reward bf16 cannot hold (it would be stored as 0.902344)
ODD_REWARD = 0.901563


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


class EmptyOnce:
    """verl's LLMServerClient stand-in whose answer to one call is no token at all (what verl's SGLang
    server returns on a logprob-length mismatch): the second call of the first training episode."""

    def __init__(self, engine):
        from verlog.integrations.verl.local import EngineServerClient

        self.inner = EngineServerClient(engine)
        self.emptied: str | None = None
        self._seen: dict[str, int] = {}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __setattr__(self, name, value):
        if name == "global_steps":
            self.inner.global_steps = value
        else:
            object.__setattr__(self, name, value)

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        out = await self.inner.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs)
        self._seen[request_id] = self._seen.get(request_id, 0) + 1
        if self.emptied is None and "-slot" in request_id and self._seen[request_id] == 2:
            self.emptied = request_id
            return TokenOutput(token_ids=[], log_probs=[], stop_reason="stop", extra_fields=out.extra_fields)
        return out


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_dir):
    """Two verl training steps through verl's real agent-loop worker; one generation comes back empty."""
    return _rollout_world(
        tmp_path_factory.mktemp("verl_faults"),
        "countdown",
        GRAPH,
        {
            "verlog": {"num_envs": NUM_ENVS, "turns_per_env": TURNS},
            "actor_rollout_ref": {
                "model": {"path": "tiny"},
                "rollout": {
                    "name": "sglang",
                    "prompt_length": 256,
                    "response_length": 6,
                    "multi_turn": {
                        "langgraph": {
                            "path": "countdown.py",
                            "graph_config": {"recursion_limit": 60},
                            "graph_kwargs": {"fail_seeds": [2]},
                        }
                    },
                },
            },
            "trainer": {"n_gpus_per_node": 1, "total_training_steps": 2},
        },
        tiny_dir,
        client_class=EmptyOnce,
    )


# ---------------------------------------------------------------------- empty generations


def test_an_empty_generation_fails_its_episode_and_the_slot_fills_its_quota(world):
    """The episode whose call came back empty has no row (no turn of zero tokens reaches verl's
    post-processing); it is counted as a failed episode and its slot still gives its turns."""
    emptied = world.client.emptied
    assert emptied is not None
    rows = {k: world.store.rows["train"][k] for s in (1, 2) for k in world.keys[s]}
    assert all(len(r["responses"]) > 0 for r in rows.values())
    episodes = {r["extra_fields"]["verlog_episode_id"] for r in rows.values()}
    assert not any(emptied.endswith(e) or e in emptied for e in episodes)
    for step in (1, 2):
        for slot, slot_rows in _by_slot(world, step).items():
            turns = [e for _, _, e in slot_rows if e["verlog_kind"] == "turn"]
            assert len(turns) == TURNS, (step, slot)
    failed = {}
    for r in rows.values():
        summary = r["extra_fields"]["verlog_summary"] or {}
        for status, n in (summary.get("failed") or {}).items():
            failed[status] = failed.get(status, 0) + n
    assert failed.get("error", 0) >= 2  # the empty generation and seed 2's crash


def test_the_engine_refuses_an_empty_generation_in_one_line(tiny_tokenizer):
    import asyncio

    from verlog.backends.base import EngineError, SamplingParams
    from verlog.integrations.verl.engine import LLMServerEngine

    class Client:
        async def generate(self, request_id, *, prompt_ids, sampling_params):
            return SimpleNamespace(token_ids=[], log_probs=[], stop_reason="stop", extra_fields={})

    engine = LLMServerEngine(Client(), tiny_tokenizer)
    with pytest.raises(EngineError, match=r"returned no token for request .*the episode fails"):
        asyncio.run(engine.generate([1, 2], SamplingParams()))


# ---------------------------------------------------------------------- a bf16 critic


@pytest.mark.parametrize("mode", ["kl_in_reward", "critic_pretraining"])
def test_advantages_returns_and_scores_are_float32_from_a_bf16_critic(world, mode):
    """verl's critic under bf16 autocast writes bf16 values; the trainer's advantage step writes
    float32 advantages, returns and scores, equal to the float32 maths on those values (a reward
    bf16 cannot hold stays exact)."""
    from omegaconf import open_dict
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size

    store = copy.deepcopy(world.store)
    config = copy.deepcopy(world.config)
    with open_dict(config):
        config.algorithm.use_kl_in_reward = True
    keys = list(world.keys[2])
    odd = next(k for k in keys if store.rows["train"][k]["extra_fields"]["verlog_kind"] == "turn")
    store.rows["train"][odd]["extra_fields"]["verlog_reward"] = ODD_REWARD
    gen = torch.Generator().manual_seed(3)
    values, kl = {}, {}
    for key in keys:
        row = store.rows["train"][key]
        length = len(row["responses"])
        bf16 = torch.randn(length, generator=gen).to(torch.bfloat16)  # what verl's critic writes under autocast
        row.update(values=bf16)
        values[key] = bf16.float()
        if mode == "kl_in_reward":
            old = row["rollout_log_probs"] + 0.01 * torch.randn(length, generator=gen)
            ref = old - 0.5 * torch.rand(length, generator=gen)
            row.update(old_log_probs=old, ref_log_prob=ref)
            kl[key] = 0.001 * (old - ref)
    tags = [dict(store.tags["train"][k]) for k in keys]
    trainer = advantage_trainer(config)
    with store.patch():
        batch = KVBatchMeta(keys=keys, tags=tags, partition_id="train")
        batch = upsample_batch_to_divisible_size(batch, 5, world.tokenizer.eos_token_id)
        for key in batch.keys:  # verl's padding rows copy a real row, values included: bf16 too
            assert store.rows["train"][key]["values"].dtype == torch.bfloat16
        trainer._compute_advantage(batch, {}, initial_policy=mode == "critic_pretraining")

    expected_adv, expected_ret, where = _expected_advantages(
        SimpleNamespace(store=store), keys, values, kl or None, trainer.spec.settings.advantage
    )
    for key in keys:
        row = store.rows["train"][key]
        for field in ("advantages", "returns", "token_level_rewards", "rm_scores"):
            assert row[field].dtype == torch.float32, (field, row[field].dtype)
        if key in where:
            i, j, length = where[key]
            torch.testing.assert_close(row["advantages"], expected_adv[i, j, :length], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(row["returns"], expected_ret[i, j, :length], atol=1e-5, rtol=1e-5)
    assert store.rows["train"][odd]["rm_scores"][-1].item() == torch.tensor(ODD_REWARD).item()
    assert torch.tensor(ODD_REWARD).to(torch.bfloat16).item() != torch.tensor(ODD_REWARD).item()


# ---------------------------------------------------------------------- attention and pre-flight


def compose(*overrides: str, has=None):
    from verlog.integrations.verl import launch

    if has is not None:  # what this "machine" has installed
        original = launch.has_package
        launch.has_package = has
        try:
            return launch.compose_verl_config(ROOT / "configs" / "verl_babyai.yaml", [OFFLINE_MODEL, *overrides])
        finally:
            launch.has_package = original
    return launch.compose_verl_config(ROOT / "configs" / "verl_babyai.yaml", [OFFLINE_MODEL, *overrides])


def test_attention_is_sdpa_without_flash_attn_and_flash_attention_2_with_it():
    from verlog.integrations.verl.launch import wire_attention

    config = compose()
    no_flash = copy.deepcopy(config)
    for key in ("actor_rollout_ref.model.override_config", "critic.model.override_config"):
        OmegaConf.update(no_flash, key, {}, merge=False)
    assert wire_attention(no_flash, has=lambda name: False) == "sdpa"
    assert no_flash.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert no_flash.critic.model.override_config.attn_implementation == "sdpa"
    assert (
        no_flash.actor_rollout_ref.model.use_remove_padding is False
        and no_flash.critic.model.use_remove_padding is False
    )
    flash = copy.deepcopy(config)
    for key in ("actor_rollout_ref.model.override_config", "critic.model.override_config"):
        OmegaConf.update(flash, key, {}, merge=False)
    OmegaConf.update(flash, "actor_rollout_ref.model.use_remove_padding", True)
    assert wire_attention(flash, has=lambda name: name == "flash_attn") == "flash_attention_2"
    assert flash.actor_rollout_ref.model.use_remove_padding is True


def test_attention_is_configurable_from_the_command_line():
    """verl's own key, refused before (its override_config dict was closed in struct mode)."""
    config = compose("actor_rollout_ref.model.override_config.attn_implementation=eager")
    assert config.actor_rollout_ref.model.override_config.attn_implementation == "eager"
    assert config.critic.model.override_config.attn_implementation == "eager"
    config = compose(
        "actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "critic.model.override_config.attn_implementation=eager",
    )
    assert config.critic.model.override_config.attn_implementation == "eager"


def test_packed_sequences_without_flash_attention_are_refused_in_one_line():
    from verlog.config import ConfigError

    with pytest.raises(
        ConfigError,
        match=r"actor_rollout_ref.model.use_remove_padding: packed sequences need "
        r"flash_attention_2, but .*attn_implementation is sdpa",
    ):
        compose(
            "actor_rollout_ref.model.override_config.attn_implementation=sdpa",
            "actor_rollout_ref.model.use_remove_padding=true",
        )


def test_preflight_names_each_missing_thing_in_one_line():
    from verlog.integrations.verl.preflight import preflight

    config = compose("trainer.n_gpus_per_node=1")
    lines = {f.what: f for f in preflight(config, gpus=lambda: 0, cpus=lambda: 2, has=lambda name: False)}
    assert not lines["GPUs"].ok and lines["GPUs"].line.startswith(
        "GPUs: trainer.n_gpus_per_node=1 but 0 CUDA device(s) are visible here"
    )
    assert not lines["Ray CPUs"].ok and "Ray CPUs: 2 (the machine's cores), verl holds 7" in lines["Ray CPUs"].line
    assert "ray_kwargs.ray_init.num_cpus=7" in lines["Ray CPUs"].line
    assert lines["flash-attn"].ok and "actor and critic use sdpa attention" in lines["flash-attn"].line
    assert not lines["rollout engine"].ok and "the vllm package is not installed" in lines["rollout engine"].line
    assert all("\n" not in f.line for f in lines.values())

    ready = {f.what: f for f in preflight(config, gpus=lambda: 1, cpus=lambda: 16, has=lambda name: True)}
    assert all(f.ok for f in ready.values()), ready
    forced = compose(
        "trainer.n_gpus_per_node=1", "actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2"
    )
    flash = {
        f.what: f for f in preflight(forced, gpus=lambda: 1, cpus=lambda: 16, has=lambda name: name != "flash_attn")
    }
    assert not flash["flash-attn"].ok and "attn_implementation=sdpa" in flash["flash-attn"].line
    cluster = compose("trainer.n_gpus_per_node=1")
    OmegaConf.update(cluster, "ray_kwargs.ray_init.address", "auto", force_add=True)
    joined = {f.what: f for f in preflight(cluster, gpus=lambda: 1, cpus=lambda: 2, has=lambda name: True)}
    assert joined["Ray CPUs"].ok and "not checked" in joined["Ray CPUs"].line


def test_a_launch_on_this_cpu_machine_stops_at_once_naming_what_is_missing(capsys):
    """No GPU here: the launch stops before Ray starts, one line per missing thing."""
    import time

    from verlog.cli import main

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the pre-flight passes here")
    started = time.perf_counter()
    code = main(["train", "--engine", "verl", str(ROOT / "configs" / "verl_babyai.yaml"), OFFLINE_MODEL])
    err = capsys.readouterr().err.replace("\n", " ")
    assert code == 2, err
    assert "verl cannot start on this machine" in err and "GPUs: trainer.n_gpus_per_node=8 but 0 CUDA device(s)" in err
    assert time.perf_counter() - started < 120


def test_the_dry_run_prints_the_preflight_lines(capsys):
    from verlog.cli import main

    assert (
        main(["train", "--engine", "verl", str(ROOT / "configs" / "verl_babyai.yaml"), OFFLINE_MODEL, "--dry-run"]) == 0
    )
    err = capsys.readouterr().err
    for what in ("GPUs:", "Ray CPUs:", "flash-attn:", "rollout engine:"):
        assert "pre-flight: " in err and what in err


def test_critic_pretraining_padding_values_take_the_critics_dtype():
    """verl's padding rows get zero values in the dtype the bf16 critic wrote, so reading the
    batch's values stacks every row (float32 zeros beside bf16 values would not)."""
    from tensordict import TensorDict

    from verlog.integrations.verl.local import MemoryTransferQueue
    from verlog.integrations.verl.trainer import VerlogPPOTrainer

    store = MemoryTransferQueue()
    masks = torch.nested.as_nested_tensor(
        [torch.ones(3, dtype=torch.long), torch.ones(1, dtype=torch.long)], layout=torch.jagged
    )
    store.kv_batch_put(["real", "pad"], "train", fields=TensorDict({"response_mask": masks}, batch_size=2))
    bf16 = torch.nested.as_nested_tensor([torch.randn(3).to(torch.bfloat16)], layout=torch.jagged)
    store.kv_batch_put(["real"], "train", fields=TensorDict({"values": bf16}, batch_size=1))
    trainer = object.__new__(VerlogPPOTrainer)
    with store.patch():
        trainer._zero_padding_values(["pad"], like="real")
        values = store.kv_batch_get(["real", "pad"], "train", select_fields=["values"])["values"]
    assert values.dtype == torch.bfloat16
    assert store.rows["train"]["pad"]["values"].tolist() == [0.0]
