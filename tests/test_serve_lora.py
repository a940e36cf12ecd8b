"""A LoRA run served: ``verlog serve-model`` on a run trained with ``actor.lora.rank > 0`` (the run
folder, its checkpoint or its ``actor_adapter/``) merges the adapters into the base model and
answers as ``verlog eval --checkpoint`` plays: the same tokens and the same logprobs, which the
base model alone does not give."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from langgraph_server import free_port, server_process

from verlog.cli import main
from verlog.config import load_config
from verlog.evaluation.players import EngineModel
from verlog.llm import VerlogChatModel
from verlog.weights.policy import find_policy, load_policy

openai = pytest.importorskip("openai")
pytest.importorskip("peft")

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "cue_corridor.yaml"
MESSAGES = [{"role": "user", "content": "position 1 cue red"}]


def _overrides(run_dir: Path) -> list[str]:
    from verlog.models import toy_model_dir

    return [
        f"model.path={toy_model_dir()}",
        f"trainer.run_dir={run_dir}",
        "wandb.mode=disabled",
        "trainer.total_updates=2",
        "trainer.num_envs=4",
        "trainer.turns_per_env=3",
        "critic_warmup.buffer_multiplier=0",
        "eval.at_start=false",
        "eval.at_end=false",
        "algorithm.mini_batch_turns=6",
        "actor.lora.rank=4",
        "actor.lr=5e-2",
    ]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("lora") / "run"
    assert main(["train", str(CONFIG), *_overrides(run_dir)]) == 0
    assert not (run_dir / "checkpoints" / "update_000002" / "actor").exists()  # adapters only
    return run_dir


async def _eval_answer(run_dir: Path) -> tuple[str, list[float]]:
    """What `verlog eval --checkpoint RUN` plays with: its model, greedy, on MESSAGES."""
    config = load_config(CONFIG, _overrides(run_dir))
    player = EngineModel(config, str(run_dir))
    await player.start()
    try:
        chat = VerlogChatModel(engine=player.engine, tokenizer=player.tokenizer, temperature=0.0, max_tokens=6)
        message = await chat.ainvoke(MESSAGES)
    finally:
        await player.aclose()
    return message.content, message.response_metadata["logprobs"]


def _served_answer(base_url: str, name: str) -> tuple[str, list[float]]:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    answer = client.chat.completions.create(model=name, messages=MESSAGES, temperature=0, max_tokens=6, logprobs=True)
    return answer.choices[0].message.content, [e.logprob for e in answer.choices[0].logprobs.content]


async def test_serve_model_answers_a_lora_run_as_eval_plays_it(lora_run, tmp_path):
    port = free_port()
    log = tmp_path / "serve.log"
    command = [
        sys.executable,
        "-m",
        "verlog.serve",
        "serve-model",
        str(lora_run),
        "--device",
        "cpu",
        "--port",
        str(port),
        "--served-model-name",
        "agent",
    ]
    with server_process(command, dict(os.environ), ROOT, port, log, ready="/health", ready_timeout_s=120) as (url, _):
        served = _served_answer(f"{url}/v1", "agent")
    assert "with the LoRA adapters of" in log.read_text()
    content, logprobs = await _eval_answer(lora_run)
    assert served[0] == content
    assert served[1] == pytest.approx(logprobs, abs=1e-5)


def test_run_checkpoint_and_adapter_folder_give_the_same_merged_weights(lora_run):
    checkpoint = lora_run / "checkpoints" / "update_000002"
    merged = []
    for spec in (lora_run, checkpoint, checkpoint / "actor_adapter"):
        source = find_policy(spec)
        assert source.adapter == checkpoint / "actor_adapter"
        model, tokenizer = load_policy(source)
        assert tokenizer.chat_template
        merged.append(model.state_dict())
    base = load_policy(
        find_policy(
            json.loads((checkpoint / "actor_adapter" / "adapter_config.json").read_text())["base_model_name_or_path"]
        )
    )[0].state_dict()
    assert merged[0].keys() == merged[1].keys() == merged[2].keys() == base.keys()
    for name in merged[0]:
        assert torch.equal(merged[0][name], merged[1][name]) and torch.equal(merged[0][name], merged[2][name])
    # the adapters moved the weights they target: the merged model is not the base
    assert any(not torch.equal(merged[0][n], base[n]) for n in base if "q_proj" in n)


def test_a_missing_base_model_is_one_clear_error(lora_run, tmp_path, capsys):
    from verlog.serve.commands import main as serve_main

    adapter = lora_run / "checkpoints" / "update_000002" / "actor_adapter"
    assert serve_main(["serve-model", str(adapter), "--base-model", str(tmp_path / "gone"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert "the base model of the adapters" in line and "--base-model" in line
