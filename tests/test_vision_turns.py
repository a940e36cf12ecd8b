"""Image turns: a graph sends images to the tiny vision-language model (Idefics3) on the embedded
engine; each turn records the prompt ids (every image's placeholder expanded into its tokens) and
the images themselves, and the logprobs a teacher-forced pass recomputes from them equal the
engine's. ``serve-model``'s API takes the same images as OpenAI ``image_url`` parts."""

from __future__ import annotations

import base64
import io

import pytest
import torch
from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.graph import END, START, MessagesState, StateGraph

from verlog.backends.embedded import EmbeddedEngine
from verlog.llm import VerlogChatModel
from verlog.llm.prompt import PromptRenderer
from verlog.models.tiny_vl import IMAGE_SEQ_LEN
from verlog.rollout import run_episode
from verlog.testing.teacher_forced import teacher_forced_logprobs


@pytest.fixture(scope="module")
def vl():
    """The tiny vision-language model, its processor and an embedded engine serving it."""
    from verlog.models import load_causal_lm, load_processor

    processor = load_processor("tiny-vl")
    model = load_causal_lm("tiny-vl")
    engine = EmbeddedEngine(model, processor.tokenizer, seed=0)
    yield model, processor, engine
    engine.close()


def png(color: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    image = Image.new("RGB", size, color)
    image.putpixel((3, 5), (255 - color[0], 17, 200))  # not one flat colour
    image.save(out, format="PNG")
    return out.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def image_graph(model):
    """One policy node: the game's picture (three block shapes) and a question."""
    shapes = (
        lambda d: {"type": "image_url", "image_url": {"url": data_url(d)}},  # OpenAI's
        lambda d: {"type": "image", "base64": base64.b64encode(d).decode(), "mime_type": "image/png"},  # LangChain's
        lambda d: {
            "type": "image",
            "source_type": "base64",
            "data": base64.b64encode(d).decode(),
            "mime_type": "image/png",
        },
    )

    async def policy(state: MessagesState) -> dict:
        turn = sum(m.type == "ai" for m in state["messages"])
        picture = shapes[turn % 3](png((40 * turn, 90, 200)))
        question = HumanMessage(content=[{"type": "text", "text": f"Turn {turn}: what do you see?"}, picture])
        answer = await model.ainvoke([SystemMessage("Describe the picture."), *state["messages"], question])
        return {"messages": [question, answer]}

    def more(state: MessagesState) -> str:
        return "policy" if sum(m.type == "ai" for m in state["messages"]) < 3 else END

    g = StateGraph(MessagesState)
    g.add_node("policy", policy)
    g.add_edge(START, "policy")
    g.add_conditional_edges("policy", more, ["policy", END])
    return g.compile()


async def test_image_turns_record_ids_and_images_and_their_logprobs_match(vl):
    model, processor, engine = vl
    tokenizer = processor.tokenizer
    chat = VerlogChatModel(engine=engine, tokenizer=tokenizer, processor=processor, max_tokens=8)
    episode = await run_episode(image_graph(chat), {"messages": []})
    assert episode.status == "ok", episode.error
    assert len(episode.turns) == 3
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    renderer = PromptRenderer(tokenizer, processor=processor)
    for k, turn in enumerate(episode.turns):
        # the history's pictures come along: turn k's prompt holds k + 1 images, each expanded
        assert len(turn.images) == k + 1
        assert turn.prompt_ids.count(image_id) == (k + 1) * IMAGE_SEQ_LEN
        images = [base64.b64decode(x) for x in turn.images]
        assert images[-1] == png((40 * k, 90, 200))  # the very bytes the graph sent
        pixels = renderer.image_inputs(images)
        recomputed = teacher_forced_logprobs(model, turn.prompt_ids, turn.response_ids, turn.temperature, pixels)
        assert max(abs(a - b) for a, b in zip(recomputed, turn.logprobs)) < 1e-5
        # the pixels are part of the computation: another picture gives other logprobs
        other = renderer.image_inputs([png((255, 255, 0))] * len(images))
        moved = teacher_forced_logprobs(model, turn.prompt_ids, turn.response_ids, turn.temperature, other)
        assert max(abs(a - b) for a, b in zip(moved, turn.logprobs)) > 1e-4


async def test_image_prompts_never_use_the_prefix_cache(vl):
    """Two pictures behind the same ids: neither reads KV cached for the other (the ids do not
    name the pixels), and text prompts beside them keep their cache."""
    model, processor, engine = vl
    tokenizer = processor.tokenizer
    chat = VerlogChatModel(engine=engine, tokenizer=tokenizer, processor=processor, max_tokens=4, temperature=0.0)
    renderer = PromptRenderer(tokenizer, processor=processor)
    before = engine.stats.cached_prompt_tokens
    answers = []
    for color in ((255, 0, 0), (0, 0, 255)):
        message = HumanMessage(
            content=[
                {"type": "text", "text": "Which?"},
                {"type": "image_url", "image_url": {"url": data_url(png(color))}},
            ]
        )
        answers.append((color, await chat.ainvoke([message])))
    assert engine.stats.cached_prompt_tokens == before
    (_, first), (_, second) = answers
    assert first.response_metadata["prompt_ids"] == second.response_metadata["prompt_ids"]
    for color, answer in answers:
        meta = answer.response_metadata
        pixels = renderer.image_inputs([png(color)])
        recomputed = teacher_forced_logprobs(model, meta["prompt_ids"], meta["response_ids"], 1.0, pixels)
        assert max(abs(a - b) for a, b in zip(recomputed, meta["logprobs"])) < 1e-5
    await chat.ainvoke("a text prompt")
    await chat.ainvoke("a text prompt")
    assert engine.stats.cached_prompt_tokens > before  # text still uses the cache


async def test_images_where_they_cannot_go_are_refused_clearly(vl, tiny_tokenizer):
    from verlog.testing.scripted_engine import ScriptedEngine

    _, processor, engine = vl
    picture = {"type": "image_url", "image_url": {"url": data_url(png((1, 2, 3)))}}
    text_model = VerlogChatModel(engine=ScriptedEngine(tiny_tokenizer, ["x"]), tokenizer=tiny_tokenizer)
    with pytest.raises(ValueError, match="vision-language model"):
        await text_model.ainvoke([HumanMessage(content=[picture])])
    no_images = VerlogChatModel(
        engine=ScriptedEngine(processor.tokenizer, ["x"]), tokenizer=processor.tokenizer, processor=processor
    )
    with pytest.raises(ValueError, match="does not take images"):
        await no_images.ainvoke([HumanMessage(content=[picture])])
    vision = VerlogChatModel(engine=engine, tokenizer=processor.tokenizer, processor=processor)
    with pytest.raises(ValueError, match="not fetched"):
        await vision.ainvoke(
            [HumanMessage(content=[{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}])]
        )
    with pytest.raises(ValueError, match="does not open"):
        await vision.ainvoke(
            [HumanMessage(content=[{"type": "image_url", "image_url": {"url": data_url(b"not a png")}}])]
        )


def test_serve_model_answers_image_url_parts_from_the_official_client(vl):
    """``OpenAIServer`` with the processor (what ``serve-model tiny-vl`` builds): the official
    ``openai`` client sends an ``image_url`` part; the prompt counts the image's tokens, a URL it
    would have to fetch is a 400 naming the part."""
    openai = pytest.importorskip("openai")
    from verlog.serve import OpenAIServer, serve_in_thread

    _, processor, engine = vl
    from verlog.serve.limits import ServerLimits

    limits = ServerLimits(max_prompt_tokens=2000)  # (a prompt bound reads the text before the images expand)
    server = OpenAIServer(engine, processor.tokenizer, model_name="tiny-vl", processor=processor, limits=limits)
    text = "What is in the picture?"
    with serve_in_thread(server) as base_url:
        client = openai.OpenAI(base_url=base_url, api_key="k", max_retries=0)
        content = [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": data_url(png((9, 99, 199)))}},
        ]
        reply = client.chat.completions.create(
            model="tiny-vl", messages=[{"role": "user", "content": content}], max_tokens=6
        )
        plain = client.chat.completions.create(
            model="tiny-vl", messages=[{"role": "user", "content": text}], max_tokens=6
        )
        assert reply.choices[0].message.content is not None
        # the image's placeholder became its tokens (and the two markers around them)
        assert reply.usage.prompt_tokens - plain.usage.prompt_tokens >= IMAGE_SEQ_LEN
        with pytest.raises(openai.BadRequestError, match="data URL"):
            client.chat.completions.create(
                model="tiny-vl",
                messages=[
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x.org/a.png"}}]}
                ],
                max_tokens=4,
            )


def test_verlog_train_trains_image_turns(tmp_path, capsys):
    """``verlog train`` on the picture game with the tiny vision-language model: 3 PPO updates
    with the critic; every batch's logprobs recomputed from the turns' ids and images equal the
    engine's (ratio 1), and batches cut mid-episode bootstrap from held prompts with pictures."""
    import json
    from pathlib import Path

    from verlog.cli import main

    root = Path(__file__).resolve().parents[1]
    run_dir = tmp_path / "run"
    code = main(
        [
            "train",
            str(root / "configs" / "color_picture.yaml"),
            f"trainer.run_dir={run_dir}",
            "trainer.turns_per_env=2",  # the 3-picture episodes are cut: held prompts hold pictures
            "eval.at_end=false",
        ]
    )
    assert code == 0, capsys.readouterr().out
    updates = [
        r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "rollout_logprob_gap" in r
    ]
    assert len(updates) == 3
    for record in updates:
        assert record["rollout_logprob_gap"] < 1e-5
        assert abs(record["ratio_max"] - 1.0) < 1e-4
        assert record["prompt_length"] > 2 * IMAGE_SEQ_LEN  # the pictures' tokens are in the prompts


async def test_a_truncated_turn_whose_next_state_has_pictures_bootstraps_from_nothing(vl):
    """``next_messages`` with a picture: the episode is fine, the state after the cut unknown."""
    from verlog.rollout import TurnRecorder, areport_reward

    model, processor, engine = vl
    chat = VerlogChatModel(engine=engine, tokenizer=processor.tokenizer, processor=processor, max_tokens=4)
    picture = {"type": "image_url", "image_url": {"url": data_url(png((5, 6, 7)))}}

    async def policy(state: MessagesState) -> dict:
        answer = await chat.ainvoke([HumanMessage(content=[{"type": "text", "text": "go"}, picture])])
        await areport_reward(0.0, truncated=True, next_messages=[HumanMessage(content=[picture])])
        return {"messages": [answer]}

    g = StateGraph(MessagesState)
    g.add_node("policy", policy)
    g.add_edge(START, "policy")
    g.add_edge("policy", END)
    recorder = TurnRecorder("cut", render_prompt=chat.render_prompt_ids)
    episode = await run_episode(g.compile(), {"messages": []}, recorder=recorder)
    assert episode.status == "ok", episode.error
    [turn] = episode.turns
    assert turn.truncated and turn.next_prompt_ids is None and len(turn.images) == 1


def test_the_doc_pages_commands_run_as_written(tmp_path, monkeypatch, capsys):
    """docs/vision_agents.md: roll out, train, evaluate the checkpoint (in a folder of its own)."""
    import shlex
    from pathlib import Path

    from doc_pages import doc_commands

    from verlog.cli import main

    root = Path(__file__).resolve().parents[1]
    for name in ("configs", "graphs"):
        (tmp_path / name).symlink_to(root / name)
    monkeypatch.chdir(tmp_path)
    commands = doc_commands("vision_agents.md")
    assert [c.split()[:2] for c in commands] == [["verlog", "rollout"], ["verlog", "train"], ["verlog", "eval"]]
    for command in commands:
        assert main(shlex.split(command)[1:]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "color_picture" in out and (tmp_path / "runs" / "color_picture" / "checkpoints" / "latest").exists()


def test_a_placeholder_token_in_the_response_is_a_plain_token(vl):
    """A model may generate its image placeholder: the engine decodes it as a plain token after
    the prompt's KV, and the trainer's pass does the same (only the prompt's placeholders take
    the pictures; one pass over the whole row would give the pictures to the response's too)."""
    from verlog.train.forward import PackedRows, pad_rows, policy_logprobs

    model, processor, _ = vl
    tokenizer = processor.tokenizer
    renderer = PromptRenderer(tokenizer, processor=processor)
    message = HumanMessage(
        content=[
            {"type": "text", "text": "Say it."},
            {"type": "image_url", "image_url": {"url": data_url(png((9, 8, 7)))}},
        ]
    )
    ids, images = renderer.render_images([message])
    response = [tokenizer.convert_tokens_to_ids("<image>"), *tokenizer("a red", add_special_tokens=False)["input_ids"]]
    pixels = renderer.image_inputs(list(images.images))
    expected = teacher_forced_logprobs(model, ids, response, 1.0, pixels)
    seq, mask = pad_rows([ids + response], 0, "cpu")
    rows = PackedRows(seq, mask, pixels=pixels, pixels_prompt_len=len(ids))
    with torch.no_grad():
        logp, _ = policy_logprobs(model, rows, torch.tensor([len(ids)]), torch.tensor([response]))
        assert max(abs(a - b) for a, b in zip(logp[0].tolist(), expected)) < 1e-5
        with pytest.raises(RuntimeError):  # the whole row in one pass: a placeholder without a picture
            model(input_ids=seq, **pixels)


async def test_serve_model_takes_images_in_every_role_and_checks_their_type(vl):
    """``serve-model`` on a vision model: images in system and assistant messages are rendered as
    the chat model renders them in a graph (not a 400 "takes no images"); a data URL whose type
    is no raster image (``text/plain`` holding PNG bytes, an SVG) is a 400 naming the part and the
    type, never PIL's message with a memory address; the chat model refuses the same URLs."""
    openai = pytest.importorskip("openai")
    from verlog.serve import OpenAIServer, serve_in_thread
    from verlog.serve.limits import ServerLimits

    _, processor, engine = vl
    picture = png((9, 99, 199))
    server = OpenAIServer(
        engine,
        processor.tokenizer,
        model_name="tiny-vl",
        processor=processor,
        limits=ServerLimits(max_prompt_tokens=4000),
    )

    def part(url: str) -> dict:
        return {"type": "image_url", "image_url": {"url": url}}

    with serve_in_thread(server) as base_url:
        client = openai.OpenAI(base_url=base_url, api_key="k", max_retries=0)
        shown = [{"type": "text", "text": "This is the board:"}, part(data_url(picture))]
        messages = [
            {"role": "system", "content": shown},
            {"role": "user", "content": "What do you see?"},
            {"role": "assistant", "content": [{"type": "text", "text": "This:"}, part(data_url(png((1, 2, 3))))]},
            {"role": "user", "content": "And now?"},
        ]
        reply = client.chat.completions.create(model="tiny-vl", messages=messages, max_tokens=4)
        text_only = [{"role": m["role"], "content": "x"} for m in messages]
        plain = client.chat.completions.create(model="tiny-vl", messages=text_only, max_tokens=4)
        assert reply.usage.prompt_tokens - plain.usage.prompt_tokens >= 2 * IMAGE_SEQ_LEN  # both images rendered
        as_text = "data:text/plain;base64," + base64.b64encode(picture).decode()
        svg = "data:image/svg+xml;base64," + base64.b64encode(b'<svg xmlns="http://www.w3.org/2000/svg"/>').decode()
        for url, says in ((as_text, "'text/plain' is not an image format"), (svg, "vector drawing")):
            with pytest.raises(openai.BadRequestError) as refused:
                client.chat.completions.create(
                    model="tiny-vl", messages=[{"role": "user", "content": [part(url)]}], max_tokens=4
                )
            error = refused.value.body
            assert error["param"] == "messages[0].content[0].image_url.url" and says in error["message"], error
            assert "0x" not in error["message"]
    vision = VerlogChatModel(engine=engine, tokenizer=processor.tokenizer, processor=processor)
    for url in (as_text, svg):
        with pytest.raises(ValueError, match="image"):
            await vision.ainvoke([HumanMessage(content=[part(url)])])
