"""Mixed precision: float32 master weights with bf16 autocast move like float32 training, bf16
weights do not; float16 scales its loss; values stay float32; training refuses bf16 weights; a run
trained under bf16 autocast saves and reloads its float32 weights exactly (actor, critic, LoRA)."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import pytest
import torch

from verlog.backends.base import SamplingParams
from verlog.backends.embedded import EmbeddedEngine
from verlog.config import AlgorithmConfig, ConfigError, load_config
from verlog.rollout.slots import SlotBatch
from verlog.rollout.turn import Turn
from verlog.train.ppo import Learner, adamw, ppo_update, score_batch
from verlog.train.storage import RolloutStorage
from verlog.weights.actor_critic import ValueModel
from verlog.weights.precision import grad_scaler

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
#: the GPU recipes' actor learning rate (Verlog's)
RECIPE_LR = 1e-6


def batch(vocab: int, num_envs: int = 4, turns_per_env: int = 4, seed: int = 0) -> SlotBatch:
    g = torch.Generator().manual_seed(seed)
    turns = []
    for i in range(num_envs):
        slot = []
        for k in range(turns_per_env):
            response = torch.randint(4, vocab, (int(torch.randint(3, 8, (1,), generator=g)),), generator=g).tolist()
            slot.append(
                Turn(
                    episode_id=f"e{i}",
                    turn_index=k,
                    prompt_ids=torch.randint(4, vocab, (12,), generator=g).tolist(),
                    response_ids=response,
                    logprobs=[-1.0] * len(response),
                    reward=float(torch.rand(1, generator=g)),
                    terminated=k == turns_per_env - 1,
                )
            )
        turns.append(slot)
    bootstrap = [torch.randint(4, vocab, (5,), generator=g).tolist() for _ in range(num_envs)]
    return SlotBatch(turns, bootstrap, [True] * num_envs, [[i] * turns_per_env for i in range(num_envs)])


def one_recipe_step(
    lm: torch.nn.Module, *, weights: torch.dtype, compute: torch.dtype | None, device: torch.device = CPU
) -> tuple[list, list, dict]:
    """One PPO update of the actor (and critic) at the recipe's learning rate on ``device``; the
    actor's weights before and after, in float32 on the CPU, and the metrics."""
    torch.manual_seed(0)
    actor = copy.deepcopy(lm).to(device=device, dtype=weights)
    critic = ValueModel.from_causal_lm(copy.deepcopy(lm).to(device=device, dtype=weights))
    opts = AlgorithmConfig().model_copy()  # the defaults: clip, entropy, whitened GAE
    algo = opts.model_copy(update={"kl_coef": 0.0, "mini_batch_turns": 16, "ppo_epochs": 1})
    lr = type("Opts", (), {"lr": RECIPE_LR, "betas": (0.9, 0.999), "weight_decay": 0.0})
    learner = Learner(
        actor,
        critic,
        adamw(actor, lr),
        adamw(critic, lr),
        None,
        algo,
        pad_id=0,
        device=device,
        autocast=compute,
        actor_scaler=grad_scaler(device, compute),
        critic_scaler=grad_scaler(device, compute),
    )
    before = [p.detach().float().cpu().clone() for p in actor.parameters()]
    s = RolloutStorage.from_batch(batch(lm.config.vocab_size))
    metrics = score_batch(s, learner)
    s.old_logprobs = s.old_logprobs + 0.05  # ratios != 1
    metrics |= ppo_update(s, learner, generator=torch.Generator().manual_seed(0))
    after = [p.detach().float().cpu().clone() for p in actor.parameters()]
    return before, after, metrics


def moved_fraction(before: list, after: list) -> float:
    changed = sum(int((a != b).sum()) for a, b in zip(after, before))
    return changed / sum(b.numel() for b in before)


def update_cosine(x: tuple[list, list], y: tuple[list, list]) -> float:
    dx = torch.cat([(a - b).flatten() for b, a in zip(*x)])
    dy = torch.cat([(a - b).flatten() for b, a in zip(*y)])
    return float(torch.nn.functional.cosine_similarity(dx, dy, dim=0))


def test_a_bf16_recipe_step_moves_the_weights_like_float32(tiny_model):
    """At lr 1e-6, float32 master weights under bf16 autocast change like float32 training (every
    weight, in the same direction); stepping bf16 weights directly (the old recipe) leaves most
    of them where they were."""
    fp32 = one_recipe_step(tiny_model, weights=torch.float32, compute=None)
    mixed = one_recipe_step(tiny_model, weights=torch.float32, compute=torch.bfloat16)
    pure = one_recipe_step(tiny_model, weights=torch.bfloat16, compute=None)
    moved = {name: moved_fraction(*run[:2]) for name, run in (("fp32", fp32), ("mixed", mixed), ("bf16", pure))}
    assert moved["fp32"] > 0.99 and moved["mixed"] > 0.99, moved
    assert moved["bf16"] < 0.5 * moved["mixed"], moved
    assert update_cosine(mixed[:2], fp32[:2]) > 0.9
    # the step's size is the learning rate's, as in float32
    size = lambda run: torch.cat([(a - b).abs().flatten() for b, a in zip(*run[:2])]).mean()  # noqa: E731
    assert float(size(mixed)) == pytest.approx(float(size(fp32)), rel=0.1)
    for metrics in (fp32[2], mixed[2]):
        assert all(torch.isfinite(torch.tensor(v)) for k, v in metrics.items() if "loss" in k)


def test_float16_compute_scales_the_loss(tiny_model):
    """float16 autocast: the backward pass runs on a scaled loss, the step unscales it and moves the
    float32 weights like float32 training."""
    fp32 = one_recipe_step(tiny_model, weights=torch.float32, compute=None)
    half = one_recipe_step(tiny_model, weights=torch.float32, compute=torch.float16)
    assert moved_fraction(*half[:2]) > 0.99
    assert update_cosine(half[:2], fp32[:2]) > 0.9
    assert torch.isfinite(torch.tensor(half[2]["actor_grad_norm"]))
    assert grad_scaler(CPU, torch.bfloat16) is None and grad_scaler(CPU, None) is None


def test_values_are_float32_under_autocast(tiny_model):
    critic = ValueModel.from_causal_lm(copy.deepcopy(tiny_model))
    torch.nn.init.normal_(critic.value_head.weight, std=0.1)
    ids = torch.randint(4, 1000, (2, 9))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = critic.backbone(input_ids=ids).last_hidden_state
        values = critic.values(hidden)
    assert values.dtype == torch.float32
    exact = critic.value_head(hidden.float()).squeeze(-1)
    assert torch.equal(values, exact)  # the head itself ran in float32, not autocast's bf16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rounded = critic.value_head(hidden).squeeze(-1).float()
    assert not torch.equal(rounded, exact)


def test_the_engine_generates_under_autocast(tiny_model, tiny_tokenizer):
    """The engine's forward passes run in the compute dtype; its logprobs are those of a
    teacher-forced pass under the same autocast (what the trainer recomputes)."""
    engine = EmbeddedEngine(tiny_model, tiny_tokenizer, autocast=torch.bfloat16)
    prompt = tiny_tokenizer("the weather today", add_special_tokens=False)["input_ids"]
    gen = asyncio.run(engine.generate(prompt, SamplingParams(temperature=1.0, max_new_tokens=12, seed=3)))
    engine.close()
    ids = torch.tensor([prompt + gen.token_ids])
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = tiny_model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    forced = torch.log_softmax(logits, -1).gather(1, torch.tensor(gen.token_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(gen.logprobs), forced, atol=0.05)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_training_refuses_weights_below_float32(dtype, tmp_path):
    from verlog.train import train

    config = load_config(
        ROOT / "configs" / "cue_corridor.yaml",
        [f"model.dtype={dtype}", "model.autocast=bfloat16", f"trainer.run_dir={tmp_path}"],
    )
    with pytest.raises(
        ConfigError, match=r"model.dtype: training keeps float32 master weights.*model.autocast: bfloat16"
    ):
        train(config)
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_autocast_is_validated():
    with pytest.raises(
        ConfigError, match=r"model.autocast.*'none', 'bfloat16' or 'float16'|model.autocast.*none.*bfloat16"
    ):
        load_config(ROOT / "configs" / "cue_corridor.yaml", ["model.autocast=int8"])


@pytest.mark.parametrize("name", ["babyai_gpu", "babaisai_gpu", "crafter_gpu"])
def test_gpu_recipes_use_float32_master_weights_with_bf16_autocast(name):
    config = load_config(ROOT / "configs" / f"{name}.yaml")
    assert config.model.dtype == "float32" and config.model.autocast == "bfloat16"


# ---------------------------------------------------------------------- saved and reloaded in float32


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_bf16_autocast_training_saves_and_reloads_float32_master_weights(lora, tmp_path, monkeypatch):
    """Trained under bf16 autocast, the actor (or its LoRA adapter) and the critic are saved as the
    float32 weights that were trained, bit for bit, and a resumed run reloads exactly those: a
    checkpoint written in bf16 (what float32 master weights exist to prevent) fails here."""
    from rich.console import Console
    from safetensors import safe_open

    from verlog.train import train
    from verlog.train.trainer import _Run
    from verlog.weights import checkpoint as ckpt

    trained: dict[str, dict[str, torch.Tensor]] = {}
    real_save = ckpt.save_checkpoint

    def save_and_keep(run_dir, update, *, save_actor, critic, **kwargs):  # the real save, watched
        run = save_actor.__self__
        if run.peft_actor is not None:
            from peft import get_peft_model_state_dict

            trained["adapter"] = {k: v.detach().clone() for k, v in get_peft_model_state_dict(run.peft_actor).items()}
        trained["actor"] = _weights(run.learner.actor)
        trained["critic"] = _weights(critic)
        return real_save(run_dir, update, save_actor=save_actor, critic=critic, **kwargs)

    monkeypatch.setattr(ckpt, "save_checkpoint", save_and_keep)
    overrides = [
        f"trainer.run_dir={tmp_path / 'run'}",
        "wandb.mode=disabled",
        "model.autocast=bfloat16",
        "trainer.total_updates=2",
        "trainer.save_every=1",
        "trainer.num_envs=4",
        "trainer.turns_per_env=3",
        "critic_warmup.buffer_multiplier=1",
        "critic_warmup.iterations=1",
        "algorithm.mini_batch_turns=6",
        "eval.at_start=false",
        "eval.at_end=false",
        "actor.lr=1e-2",
        "critic.lr=1e-2",
        *(["actor.lora.rank=4"] if lora else []),
    ]
    config = load_config(ROOT / "configs" / "cue_corridor.yaml", overrides)
    start = _weights(_load_toy(config))
    train(config, console=Console(quiet=True))
    latest = ckpt.latest_checkpoint(tmp_path / "run")
    assert trained and latest.name == "update_000002"
    for name, weights in trained.items():  # the live master weights: float32, and training moved them
        assert all(v.dtype == torch.float32 for v in weights.values() if v.is_floating_point()), name
    assert any(not torch.equal(start[k], v) for k, v in trained["actor"].items() if k in start) or lora

    # on disk: float32 tensors equal to the trained ones
    files = {"critic": latest / ckpt.CRITIC_FILE}
    files["adapter" if lora else "actor"] = (
        latest / ckpt.ADAPTER_FOLDER / "adapter_model.safetensors"
        if lora
        else latest / ckpt.ACTOR_FOLDER / "model.safetensors"
    )
    for name, path in files.items():
        with safe_open(str(path), "pt") as f:
            saved = {k: f.get_tensor(k) for k in f.keys()}
        live = trained[name]
        if name == "actor":  # tied embeddings are saved once
            live = {k: v for k, v in live.items() if k in saved}
        assert set(saved) == set(live), name
        for k, v in saved.items():
            assert v.dtype == torch.float32 and torch.equal(v, live[k]), (name, k)

    # reloaded by a resumed run: the same weights again
    async def reload() -> dict[str, dict[str, torch.Tensor]]:
        run = _Run.build(load_config(ROOT / "configs" / "cue_corridor.yaml", overrides), latest, Console(quiet=True))
        try:
            return {"actor": _weights(run.learner.actor), "critic": _weights(run.learner.critic)}
        finally:
            await run.aclose()

    again = asyncio.run(reload())
    for name in ("actor", "critic"):
        assert again[name].keys() == trained[name].keys()
        for k, v in again[name].items():
            assert v.dtype == trained[name][k].dtype and torch.equal(v, trained[name][k]), (name, k)


def _load_toy(config):
    from verlog.models import load_causal_lm

    return load_causal_lm(config.model.path)


def test_cpu_training_passes_flush_subnormal_floats():
    """On a CPU the trainer's thread treats subnormal floats as zero (a sharpening policy's
    backward passes fill with them, which a CPU computes many times slower); the setting is the
    calling thread's, so it is checked in a thread of its own (the test process keeps its own)."""
    import threading

    from verlog.weights.precision import flush_subnormals

    tiny = 1e-39  # below float32's smallest normal number (1.2e-38)
    seen = {}

    def in_a_thread() -> None:
        seen["before"] = (torch.tensor([tiny]) * 1.0).item()
        seen["flushed"] = flush_subnormals(torch.device("cpu"))
        seen["after"] = (torch.tensor([tiny]) * 1.0).item()
        seen["elsewhere"] = flush_subnormals(torch.device("meta"))

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert seen["before"] == pytest.approx(tiny) and seen["flushed"] is True
    assert seen["after"] == 0.0 and seen["elsewhere"] is False
    assert (torch.tensor([tiny]) * 1.0).item() == pytest.approx(tiny)  # this thread is untouched
