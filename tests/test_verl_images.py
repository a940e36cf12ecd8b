"""Image turns under verl, on CPU with verl's own classes.

verl's agent-loop worker (``AgentLoopWorkerTQ``) turns an agent loop's ``multi_modal_data``
(``{"images": [PIL.Image, ...]}``) into each row's ``multi_modal_inputs`` and ``position_ids``
with *its* processor (``HFModelConfig.processor``, from verl's ``hf_processor``), which verl 0.9.1
builds for Qwen2-VL-like models only. So:

* the tiny VLM (``tiny-vl``, Idefics3, on verlog's embedded engine) shows the sample of an image
  turn: the turn's exact prompt ids, its images as ``multi_modal_data``, the server sent
  ``image_data``; and that verl's real worker, which has no processor for Idefics3, never gets an
  image row (the episode fails naming why) instead of dropping the pixels;
* a tiny Qwen2-VL-shaped model (its processor built here: transformers' Qwen2-VL video processor
  needs torchvision, which CPU installs lack) runs through verl's real worker, whose
  ``hf_processor`` binds Qwen2-VL's M-RoPE: the rows' pixel inputs equal
  ``PromptRenderer.image_inputs`` of the turns' images, their positions are M-RoPE's over the
  exact ids, text rows stay text rows, and the mixed batch comes back from the queue intact for
  verl's actor (``extract_multi_modal_inputs``).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from types import SimpleNamespace

import pytest
import torch
import yaml
from verl_agent_loop import dataset_batch, rollout_step

from verlog.backends.base import Engine, Generation

GRAPH = '''
"""A picture game: step 0 asks in text, steps 1 and 2 show a picture; the history stays in the prompt."""
import base64
import io
from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph

from verlog.rollout.events import areport_reward

STEPS = 3


def picture(seed: int, step: int) -> bytes:
    from PIL import Image

    image = Image.new("RGB", (56, 56), (40 * step % 256, (70 * seed + 30) % 256, 200))
    image.putpixel((3, 5), (255, 17, 9 * step))  # not one flat colour
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


class State(MessagesState):
    seed: int
    step: int


def make_input(seed: int) -> dict[str, Any]:
    return {"messages": [], "seed": seed, "step": 0}


def build_graph(model):
    async def policy(state: State):
        seed, step = state["seed"], state["step"]
        text = f"game {seed}, step {step}: move?"
        if step == 0:
            question = HumanMessage(text)
        else:
            url = "data:image/png;base64," + base64.b64encode(picture(seed, step)).decode()
            question = HumanMessage(content=[{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}])
        answer = await model.ainvoke([*state["messages"], question])
        return {"messages": [question, answer]}

    async def env(state: State):
        step = state["step"] + 1
        done = step >= STEPS
        await areport_reward(1.0 if done else 0.0, terminated=done)
        return {"step": step}

    graph = StateGraph(State)
    graph.add_node("policy", policy)
    graph.add_node("env", env)
    graph.add_edge(START, "policy")
    graph.add_edge("policy", "env")
    graph.add_conditional_edges("env", lambda s: END if s["step"] >= STEPS else "policy")
    return graph.compile()
'''

_NS: dict = {}
exec(compile(GRAPH, "picture_graph", "exec"), _NS)  # the graph's own picture() for the expected pixels
picture = _NS["picture"]


def settings(model_path, **verlog) -> dict:
    return {
        "verlog": {"num_envs": 1, "turns_per_env": 2, "seed": 0, **verlog},
        "actor_rollout_ref": {
            "model": {"path": str(model_path)},
            "rollout": {
                "name": "sglang",
                "prompt_length": 512,
                "response_length": 6,
                "multi_turn": {"langgraph": {"path": "picture.py", "graph_config": {"recursion_limit": 40}}},
            },
        },
        "trainer": {"n_gpus_per_node": 1, "total_training_steps": 2},
    }


def run_worker(root, model_path, client, steps=(1,), **verlog):
    """verl's real agent-loop worker running the picture graph for ``steps``, served by ``client``."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    from verlog.integrations.verl.agent_loop import close_slots
    from verlog.integrations.verl.launch import compose_verl_config
    from verlog.integrations.verl.local import MemoryTransferQueue

    (root / "picture.py").write_text(GRAPH)
    config_file = root / "picture.yaml"
    config_file.write_text(yaml.safe_dump(settings(model_path, **verlog)))
    config = compose_verl_config(config_file)
    store = MemoryTransferQueue()
    keys: dict[int, list[str]] = {}

    async def run():
        worker = AgentLoopWorkerTQ.__ray_actor_class__(config, client, None, None)
        try:
            for step in steps:
                client.global_steps = step - 1
                keys[step] = await rollout_step(worker, store, dataset_batch(config.data.train_files, step))
        finally:
            await close_slots()
            await client.engine.aclose()
        return worker

    with store.patch():
        worker = asyncio.run(run())
    return SimpleNamespace(config=config, store=store, client=client, keys=keys, worker=worker)


def ordered_rows(world, step):
    rows = [(k, world.store.rows["train"][k]) for k in world.keys[step]]
    return sorted(rows, key=lambda kr: kr[1]["extra_fields"]["verlog_position"])


# ---------------------------------------------------------------------- the tiny VLM (Idefics3)


@pytest.fixture(scope="module")
def vl():
    from verlog.models import load_causal_lm, load_processor, resolve_model_path

    return SimpleNamespace(
        path=resolve_model_path("tiny-vl"), processor=load_processor("tiny-vl"), model=load_causal_lm("tiny-vl")
    )


def test_an_image_turn_of_the_tiny_vlm_becomes_a_verl_sample_with_its_images(vl):
    """The graph on the tiny VLM through verl's server interface: each turn's prompt ids are the
    ones the server got (with its images as ``image_data``, from which the engine's logprobs come
    exactly); its sample has those ids and the images as ``multi_modal_data``, whose pixel inputs
    are ``PromptRenderer.image_inputs`` of the turn's images. A text turn's sample is a text row."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

    from verlog.backends.embedded import EmbeddedEngine
    from verlog.integrations.verl.engine import LLMServerEngine
    from verlog.integrations.verl.local import EngineServerClient
    from verlog.integrations.verl.samples import bootstrap_output, turn_output
    from verlog.llm import VerlogChatModel
    from verlog.llm.images import open_images
    from verlog.llm.prompt import PromptRenderer
    from verlog.rollout import TurnRecorder, run_episode
    from verlog.testing.teacher_forced import teacher_forced_logprobs

    processor, tokenizer = vl.processor, vl.processor.tokenizer
    renderer = PromptRenderer(tokenizer, processor=processor)

    async def play():
        engine = EmbeddedEngine(vl.model, tokenizer, seed=0)
        client = EngineServerClient(engine, processor=processor)
        model = VerlogChatModel(
            engine=LLMServerEngine(client, tokenizer, request_prefix="p-"),
            tokenizer=tokenizer,
            processor=processor,
            max_tokens=5,
        )
        recorder = TurnRecorder("ep", render_prompt=model.render_prompt_ids)
        try:
            episode = await run_episode(_NS["build_graph"](model), _NS["make_input"](7), recorder=recorder)
        finally:
            await engine.aclose()
        return episode, client

    episode, client = asyncio.run(play())
    assert episode.status == "ok", episode.error
    assert [len(t.images) for t in episode.turns] == [0, 1, 2]  # the history's pictures come along
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    for turn, call in zip(episode.turns, client.calls, strict=True):
        sample = turn_output(turn, trajectory="t", position=turn.turn_index, episode_id="p-ep", steps=(0, 0))
        assert isinstance(sample, AgentLoopOutput)
        assert sample.prompt_ids == turn.prompt_ids == call["prompt_ids"]  # never re-tokenized
        assert sample.response_ids == turn.response_ids == call["token_ids"]
        if not turn.images:
            assert sample.multi_modal_data is None and call["image_data"] is None
            assert "multi_modal_data" not in sample.as_dict()  # a text row's fields, as before
            continue
        images = [base64.b64decode(x) for x in turn.images]
        assert images[-1] == picture(7, turn.turn_index)  # the very bytes the graph sent
        assert turn.prompt_ids.count(image_id) == 4 * len(images)
        sent, carried = call["image_data"], sample.multi_modal_data["images"]
        for a, b, c in zip(open_images(images), sent, carried, strict=True):
            assert a.tobytes() == b.tobytes() == c.tobytes() and a.size == b.size == c.size
        expected = renderer.image_inputs(images)
        got = dict(processor.image_processor(carried, return_tensors="pt"))
        assert set(got) == set(expected)
        for name in expected:
            assert torch.equal(got[name], expected[name])
        # the server's generation came from these pixels: its logprobs are the teacher-forced ones
        forced = teacher_forced_logprobs(vl.model, turn.prompt_ids, turn.response_ids, turn.temperature, expected)
        assert max(abs(a - b) for a, b in zip(forced, turn.logprobs)) < 1e-5
    # a held prompt's pictures ride on its bootstrap row
    last = episode.turns[-1]
    boot = bootstrap_output(
        last.prompt_ids, 0, trajectory="t", position=3, episode_id="e", turn_index=3, steps=(0, 0), images=last.images
    )
    assert [i.tobytes() for i in boot.multi_modal_data["images"]] == [
        i.tobytes() for i in open_images([base64.b64decode(x) for x in last.images])
    ]
    assert (
        bootstrap_output(
            [1, 2], 0, trajectory="t", position=0, episode_id="e", turn_index=0, steps=(0, 0)
        ).multi_modal_data
        is None
    )


def test_verls_worker_without_a_processor_for_the_model_never_gets_an_image_row(vl, tmp_path, caplog):
    """verl 0.9.1 builds no processor for Idefics3, so its worker would store an image row's
    placeholders without pixels: the image call fails its episode naming why, before the server
    sees it, the slot gives up after ``max_consecutive_failures`` and verl marks the row failed."""
    from verlog.backends.embedded import EmbeddedEngine
    from verlog.integrations.verl.local import EngineServerClient

    engine = EmbeddedEngine(vl.model, vl.processor.tokenizer, seed=0)
    client = EngineServerClient(engine, processor=vl.processor)
    with caplog.at_level(logging.ERROR):
        world = run_worker(tmp_path, vl.path, client, max_consecutive_failures=2)
    assert world.worker.processor is None  # verl's own view of the model
    assert world.keys[1] == []  # no row at all
    assert [tag["status"] for tag in world.store.tags["train"].values()] == ["failure"]
    assert client.calls and all(c["image_data"] is None for c in client.calls)  # only the text calls went out
    assert "verl has no processor for this model" in caplog.text and "Idefics3Processor" in caplog.text


def test_image_turns_are_refused_where_verl_would_process_other_pixels():
    from verlog.integrations.verl.agent_loop import images_refused

    verl_processor, verlog_processor = object(), object()
    assert images_refused(verl_processor, verlog_processor, {}) is None
    assert "no processor" in images_refused(None, verlog_processor, {})
    assert "data.mm_processor_kwargs={'max_pixels': 1024}" in images_refused(
        verl_processor, verlog_processor, {"max_pixels": 1024}
    )


def test_a_response_holding_the_image_placeholder_fails_its_episode(tiny_tokenizer):
    """verl's post-processing counts placeholders over prompt and response (its pixel inputs and
    M-RoPE positions fail on one without an image): such a response is an engine error."""
    from verl.workers.rollout.replica import TokenOutput

    from verlog.backends.base import EngineError, ImageInputs, SamplingParams
    from verlog.integrations.verl.engine import LLMServerEngine

    class Client:
        def __init__(self, ids):
            self.ids, self.kwargs = ids, []

        async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
            self.kwargs.append(kwargs)
            return TokenOutput(token_ids=self.ids, log_probs=[-0.5] * len(self.ids), stop_reason="stop")

    engine = LLMServerEngine(Client([5, 99, 6]), tiny_tokenizer, image_token_ids=(99,))
    with pytest.raises(EngineError, match="image placeholder"):
        asyncio.run(engine.generate([1, 2], SamplingParams()))
    ok = LLMServerEngine(Client([5, 6]), tiny_tokenizer, image_token_ids=(99,))
    assert asyncio.run(ok.generate([1, 2], SamplingParams())).token_ids == [5, 6]
    assert ok.client.kwargs == [{}]  # a text prompt sends no image_data
    png = picture(0, 1)
    refused = LLMServerEngine(Client([5]), tiny_tokenizer, images_refused="verl cannot")
    with pytest.raises(EngineError, match="this prompt has images, and verl cannot"):
        asyncio.run(refused.generate([1, 2], SamplingParams(), images=ImageInputs((png,), {})))
    assert refused.client.kwargs == []  # never sent


# ---------------------------------------------------------------------- a Qwen2-VL-shaped model


def _qwen_vl_processor(folder):
    """A Qwen2-VL processor on the tiny tokenizer (plus Qwen2-VL's vision tokens): the PIL image
    processor from ``folder``'s settings, and transformers' torchvision-less stand-in for the video
    processor (which this test never calls)."""
    import transformers
    from transformers import Qwen2VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from verlog.models import load_tokenizer

    tokenizer = load_tokenizer(folder)
    image_processor = Qwen2VLImageProcessorPil.from_pretrained(folder)
    video_processor = object.__new__(transformers.BaseVideoProcessor)
    return Qwen2VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=tokenizer.chat_template,
    )


def _build_qwen_vl_folder(out):
    """A Qwen2-VL model folder without weights (config, tokenizer, image processor settings)."""
    from transformers import Qwen2VLConfig
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from verlog.models.tiny import SPECIAL_TOKENS, _patch_tokenizer_config, build_tiny_tokenizer, chatml_tool_template

    tokenizer = build_tiny_tokenizer()
    vision = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tokenizer.add_special_tokens({"additional_special_tokens": [*SPECIAL_TOKENS[1:], *vision]})
    tokenizer.chat_template = chatml_tool_template(image_text="<|vision_start|><|image_pad|><|vision_end|>")
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ["<|endoftext|>", "<|im_end|>", *vision]}
    pad_id, eos_id = ids["<|endoftext|>"], ids["<|im_end|>"]
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
            "bos_token_id": pad_id,
            "eos_token_id": eos_id,
            "pad_token_id": pad_id,
        },
        vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "patch_size": 14},
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        pad_token_id=pad_id,
    )
    config.architectures = ["Qwen2VLForConditionalGeneration"]
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _patch_tokenizer_config(out)
    # 56 x 56 pictures stay 56 x 56: 4 x 4 patches of 14, merged 2 x 2 into 4 image tokens
    Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=2 * 56 * 56).save_pretrained(out)
    return out


class PictureEngine(Engine):
    """A fake vision-language engine behind verl's server interface: answers "ok" and the end of
    sequence, and records the images each prompt came with."""

    accepts_images = True

    def __init__(self, tokenizer):
        self.answer = [*tokenizer("ok", add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
        self.eos_token_ids = (tokenizer.eos_token_id,)
        self.seen: list = []

    async def generate(self, prompt_ids, sampling, *, request_id=None, images=None):
        self.seen.append((list(prompt_ids), images))
        return Generation(list(self.answer), [-0.25] * len(self.answer), "stop")


@pytest.fixture(scope="module")
def qwen_world(tmp_path_factory):
    """Two verl steps of the picture graph on the Qwen2-VL-shaped model: verl's real worker, whose
    ``HFModelConfig`` loads the folder (``AutoProcessor`` answers with the processor built here, as
    it would from the folder with torchvision installed) and binds M-RoPE's ``get_rope_index``."""
    import transformers

    from verlog.integrations.verl.local import EngineServerClient

    root = tmp_path_factory.mktemp("verl_qwen_vl")
    folder = _build_qwen_vl_folder(root / "qwen-vl")
    original = transformers.AutoProcessor.from_pretrained.__func__

    def from_pretrained(cls, path, *args, **kwargs):
        if str(path) == str(folder):
            return _qwen_vl_processor(folder)
        return original(cls, path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transformers.AutoProcessor, "from_pretrained", classmethod(from_pretrained))
        processor = _qwen_vl_processor(folder)
        client = EngineServerClient(PictureEngine(processor.tokenizer), processor=processor)
        world = run_worker(root, folder, client, steps=(1, 2))
    world.processor = processor
    return world


def test_image_rows_carry_verls_pixel_inputs_of_the_turns_images_and_mrope_positions(qwen_world):
    from verlog.llm.prompt import PromptRenderer

    world, processor = qwen_world, qwen_world.processor
    tokenizer = processor.tokenizer
    renderer = PromptRenderer(tokenizer, processor=processor)
    assert type(world.worker.processor).__name__ == "Qwen2VLProcessor"  # verl's own, M-RoPE bound
    image_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    # step 1: episode 0 (seed 0) turn 0 (text), turn 1 (one picture), its held turn 2 (two) as the bootstrap row
    # step 2: its turn 2, then episode 1 (seed 1) turn 0 (text) and its held turn 1 (one picture)
    expected_rows = {1: [(0, []), (0, [1]), (0, [1, 2])], 2: [(0, [1, 2]), (1, []), (1, [1])]}
    calls = iter(world.client.calls)
    for step in (1, 2):
        rows = ordered_rows(world, step)
        assert [row["extra_fields"]["verlog_kind"] for _, row in rows] == ["turn", "turn", "bootstrap"]
        for (_, row), (seed, shown) in zip(rows, expected_rows[step], strict=True):
            prompt = row["prompts"].tolist()
            if row["extra_fields"]["verlog_kind"] == "turn":
                assert row["extra_fields"]["verlog_seed"] == seed
                call = next(calls)
                assert prompt == call["prompt_ids"]  # exactly what the server got: never re-tokenized
                assert row["input_ids"].tolist() == call["prompt_ids"] + call["token_ids"]
                assert len(call["image_data"] or []) == len(shown)
            mm, positions = row["multi_modal_inputs"], row["position_ids"]
            assert positions.shape == (4, len(row["input_ids"]))  # verl's (text, t, h, w) positions
            assert positions[0].tolist() == list(range(len(row["input_ids"])))
            if not shown:
                assert mm == {}  # a text row stays a text row
                continue
            assert prompt.count(image_id) == 4 * len(shown)
            expected = renderer.image_inputs([picture(seed, s) for s in shown])
            assert set(mm) == {"pixel_values", "image_grid_thw", "images_seqlens"}
            assert torch.equal(mm["pixel_values"], expected["pixel_values"])
            assert torch.equal(mm["image_grid_thw"], expected["image_grid_thw"])
            assert mm["images_seqlens"].tolist() == [16] * len(shown)
            # M-RoPE over the exact ids: each picture's 2 x 2 tokens share a time, span 2 rows, 2 columns
            at = [i for i, t in enumerate(prompt) if t == image_id][:4]
            t, h, w = (positions[k, at].tolist() for k in (1, 2, 3))
            assert len(set(t)) == 1 and h == [h[0], h[0], h[0] + 1, h[0] + 1] and w == [w[0], w[0] + 1, w[0], w[0] + 1]
    assert next(calls, None) is None
    # the engine behind the server got the pictures' pixels with each image prompt
    for prompt_ids, images in world.client.engine.seen:
        assert (images is None) == (image_id not in prompt_ids)


def test_a_batch_mixing_image_and_text_rows_comes_back_intact_for_verls_actor(qwen_world):
    """The rows read back from the queue as verl's trainer reads a batch: tensors padded into a
    ``DataProto``, the pixel inputs gathered by verl's actor helper (``extract_multi_modal_inputs``)
    in row order, text rows contributing none."""
    from verl.protocol import DataProto
    from verl.utils.model import extract_multi_modal_inputs

    from verlog.llm.prompt import PromptRenderer

    world = qwen_world
    renderer = PromptRenderer(world.processor.tokenizer, processor=world.processor)
    keys = [k for step in (1, 2) for k, _ in ordered_rows(world, step)]
    data = world.store.kv_batch_get(keys, "train", ["prompts", "responses", "input_ids", "multi_modal_inputs"])
    batch = DataProto(batch=data.select("prompts", "responses", "input_ids").to_padded_tensor())
    assert len(batch) == 6
    for i, key in enumerate(keys):
        row = world.store.rows["train"][key]
        n = len(row["input_ids"])
        assert batch.batch["input_ids"][i, :n].tolist() == row["input_ids"].tolist()
    gathered = extract_multi_modal_inputs(data["multi_modal_inputs"])
    image_rows = [(0, [1]), (0, [1, 2]), (0, [1, 2]), (1, [1])]  # (seed, pictures) of the image rows, in order
    expected = [renderer.image_inputs([picture(seed, s) for s in shown]) for seed, shown in image_rows]
    assert torch.equal(gathered["pixel_values"], torch.cat([e["pixel_values"] for e in expected]))
    assert torch.equal(gathered["image_grid_thw"], torch.cat([e["image_grid_thw"] for e in expected]))


async def test_an_image_is_what_verls_own_agent_loops_hand_the_processor(qwen_world):
    """verl's agent loops pass a message's image through ``process_vision_info`` before the
    processor: RGB with an RGBA image composited on white, resized bicubically to whole image
    tokens (sides multiples of 2 x 14, at least 4 tokens). verlog's agent loop renders the same
    pixels: a 50 x 40 RGBA picture becomes 84 x 56 (6 tokens), its transparent half white; the
    turn keeps that image, and its pixel inputs are the processor's of it."""
    import io

    from langchain_core.messages import HumanMessage
    from PIL import Image

    from verlog.integrations.verl.agent_loop import LangGraphAgentLoop
    from verlog.integrations.verl.vision_info import MAX_ASPECT_RATIO, vision_info_size
    from verlog.llm.prompt import PromptRenderer

    processor = qwen_world.processor
    rgba = Image.new("RGBA", (50, 40), (200, 10, 10, 255))
    for x in range(25, 50):
        for y in range(40):
            rgba.putpixel((x, y), (0, 0, 255, 0 if y < 30 else 128))  # blue under no / half cover
    out = io.BytesIO()
    rgba.save(out, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()

    loop = object.__new__(LangGraphAgentLoop)  # what __init__ sets that the chat model reads
    loop.verlog_tokenizer, loop.verlog_processor, loop.processor = processor.tokenizer, processor, processor
    loop.spec = SimpleNamespace(model_path="qwen-vl", multi_turn=SimpleNamespace(chat_template_kwargs={}))
    loop.spec.response_length = 6
    engine = PictureEngine(processor.tokenizer)
    model = loop._chat_model(engine, {"temperature": 1.0})
    message = HumanMessage(
        content=[{"type": "text", "text": "move?"}, {"type": "image_url", "image_url": {"url": url}}]
    )
    answer = await model.ainvoke([message])
    [(prompt_ids, images)] = engine.seen
    [kept] = images.images
    shown = Image.open(io.BytesIO(kept))
    assert shown.mode == "RGB" and shown.size == (84, 56)
    on_white = Image.new("RGB", rgba.size, (255, 255, 255))
    on_white.paste(rgba, mask=rgba.split()[3])
    assert on_white.getpixel((40, 10)) == (255, 255, 255)  # not the blue under the transparent half
    assert list(shown.getdata()) == list(on_white.resize((84, 56), Image.Resampling.BICUBIC).getdata())
    assert prompt_ids.count(processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")) == 3 * 2
    assert answer.response_metadata["prompt_ids"] == prompt_ids
    expected = PromptRenderer(processor.tokenizer, processor=processor).image_inputs([kept])
    assert torch.equal(images.tensors["pixel_values"], expected["pixel_values"])
    # process_vision_info's rule on other sizes: a large picture keeps its sides' nearest multiples
    # of 28; past 16384 tokens it shrinks; Qwen3-VL's patches of 16 give multiples of 32
    assert vision_info_size(1000, 2000, 14) == (1008, 1988)
    assert vision_info_size(4000, 4000, 14) == (3584, 3584)
    assert vision_info_size(40, 50, 16) == (64, 96)
    with pytest.raises(ValueError, match="process_vision_info"):
        vision_info_size(10, 10 * MAX_ASPECT_RATIO + 10, 14)
