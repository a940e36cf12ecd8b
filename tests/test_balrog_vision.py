"""BALROG's vision protocol (``max_image_history`` > 0): the games' images, the messages, the eval flag.

BALROG's settings pinned here, as read in balrog-ai/BALROG (commit af7d1f1):

* ``agent.max_image_history``: 0 in ``balrog/config/config.yaml`` (text), 1 in the VLM mode of
  ``docs/evaluation.md``; NetHack and MiniHack switch the NLE wrapper to its language view when
  it is above 0 (``vlm`` in ``make_nle_env`` / ``make_minihack_env``);
* images (``balrog/environments/*``): BabyAI ``get_pov_render(tile_size=16)`` (112x112), Crafter
  ``render()`` at ``crafter_kwargs.size`` 256x256, BabaIsAI ``render(mode="rgb_array")`` (32
  pixels a cell), NetHack/MiniHack ``render("tiles")`` (16x16 tiles of MiniHack's atlas, 21x79
  glyphs: 336x1264), TextWorld none; each ``Image.fromarray(...).convert("RGB")``;
* ``balrog/prompt_builder/history.py``: the window is the last ``2 * max(text, image)`` events;
  the newest ``max_image_history`` observations with an image carry it, their text ending with
  the image note;
* ``balrog/client.py`` (OpenAI): content parts, text first, then the image as a PNG data URL.

The prompts are compared with BALROG's history builder and OpenAI client written out from its
code (:func:`balrog_messages`); the image note is read from a BALROG-like layout
(``tests/balrog_layout.py``), not BALROG's own words.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import random
import threading
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from balrog_layout import EXPECTED, IMAGE_NOTE, RULE, write_balrog_layout
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from scripted_endpoint import ScriptedChatServer

from verlog.envs import balrog_vision, get_family
from verlog.envs.agent_graph import build_game_graph
from verlog.envs.balrog_protocol import build_prompt
from verlog.envs.balrog_source import ENV_VAR, BalrogSource, BalrogSourceError
from verlog.envs.base import TextEnv
from verlog.envs.registry import make_env

ROOT = Path(__file__).resolve().parents[1]
SEED = 1_000_000


@pytest.fixture(autouse=True)
def no_user_balrog(monkeypatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> Path:
    return write_balrog_layout(tmp_path_factory.mktemp("BALROG"))


def pixels(url: str) -> np.ndarray:
    """The RGB pixels of a PNG data URL."""
    from PIL import Image

    head, _, payload = url.partition(",")
    assert head == "data:image/png;base64"
    image = Image.open(io.BytesIO(base64.b64decode(payload)))
    assert image.format == "PNG" and image.mode == "RGB"
    return np.asarray(image)


# ------------------------------------------------------------------------------------- settings


def test_balrogs_vision_settings() -> None:
    assert balrog_vision.TEXT_ONLY == 0 and balrog_vision.IMAGE_HISTORY == 1
    assert balrog_vision.SETTING == "max_image_history"
    assert get_family("minihack").balrog.vision_kwargs == {"vlm": True}
    assert get_family("nethack").balrog.vision_kwargs == {"vlm": True}
    for name in ("babyai", "babaisai", "crafter", "textworld"):
        assert get_family(name).balrog.vision_kwargs == {}  # their text does not change
    for bad in (-1, True, 1.5, "1"):
        with pytest.raises(ValueError, match="max_image_history must be a whole number"):
            balrog_vision.check_image_history(bad)


def test_a_png_data_url_is_what_balrogs_client_sends() -> None:
    image = balrog_vision.rgb_image(np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3))
    url = balrog_vision.png_data_url(image)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")  # BALROG's process_image_openai
    assert url == "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    assert np.array_equal(pixels(url), np.asarray(image))
    assert balrog_vision.image_content("hi", url) == [
        {"type": "text", "text": "hi"},
        {"type": "image_url", "image_url": {"url": url}},
    ]


# ----------------------------------------------------------------------------------- the images


def test_babyai_image_is_the_agents_view_at_16_pixels_a_cell() -> None:
    env = make_env("babyai:putnext", protocol="balrog")
    env.reset(3)
    for action in ["turn left", "go forward", "turn right"]:
        image = env.observation_image()
        assert image.mode == "RGB" and image.size == (112, 112)  # 7x7 cells of 16 pixels
        assert np.array_equal(np.asarray(image), env.level.get_pov_render(tile_size=16))
        env.step(action)


def test_crafter_image_is_balrogs_frame_and_leaves_the_game_alone() -> None:
    import crafter

    from verlog.envs.crafter.env import _TextCrafter

    class Rendering(_TextCrafter):
        """The game as BALROG plays it: every frame really rendered (twice a step)."""

        def _obs(self):
            return crafter.Env.render(self)

        def rendered(self):
            self.last = crafter.Env.render(self)

    shown = make_env("crafter", protocol="balrog")  # asked for its image every step
    blind = make_env("crafter", protocol="balrog")  # never asked
    real = Rendering(seed=5, length=None, size=(256, 256))
    shown.reset(5), blind.reset(5)
    real.reset(), real.step(0), real.rendered()
    rng = np.random.default_rng(0)  # these random actions live into the first night
    nights = 0
    for _ in range(230):
        image = shown.observation_image()
        assert image.size == (256, 256) and np.array_equal(np.asarray(image), real.last)
        nights += real._world.daylight < 0.5
        action = int(rng.integers(0, 17))
        a, b = shown.step(shown.valid_actions()[action]), blind.step(blind.valid_actions()[action])
        real.step(action), real.rendered()
        assert a.observation == b.observation  # drawing the image draws nothing from the game
        if a.done:
            break
    assert nights > 20  # the night frames (noise from the game's generator) are BALROG's too


def test_babaisai_image_is_the_whole_level_at_32_pixels_a_cell() -> None:
    pytest.importorskip("cv2")
    from verlog.envs.babaisai import game
    from verlog.envs.babaisai.image import tile, top_kinds

    env = make_env("babaisai:two_room-goto_win", protocol="balrog")
    env.reset(1)
    state = env.state
    image = np.asarray(env.observation_image())
    assert image.shape == (32 * state.height, 32 * state.width, 3)
    assert (image[:32, :] == 100).all() and (image[:, :32] == 100).all()  # the border: grey squares
    cells = top_kinds(state)
    for (x, y), kind in cells.items():
        assert np.array_equal(image[32 * y : 32 * y + 32, 32 * x : 32 * x + 32], tile(kind, 0))
    empty = tile(None)
    assert (empty[0] == 100).all() and (empty[:, 0] == 100).all() and (empty[1:, 1:] == 0).all()  # grid lines
    assert tuple(tile(game.object_kind("ball"))[16, 16]) == (0, 255, 0)
    word = tile(game.noun_word("baba"))
    assert tuple(word[2, 2]) == (235, 235, 235) and tuple(word[5, 5]) == (0, 0, 0) and (word[8:24, 8:24] > 0).any()
    # the baba points the way the player last moved (right when the level starts)
    baba = game.object_kind("baba")

    def bulk(facing):  # where the white triangle's mass lies (row, column): behind its tip
        rows, columns = np.nonzero((tile(baba, facing) == 255).all(axis=2))
        return round(rows.mean(), 1), round(columns.mean(), 1)

    assert [bulk(f) for f in range(4)] == [(15.5, 11.0), (11.0, 15.5), (15.5, 20.0), (20.0, 15.5)]
    down = tile(baba, 1)
    env.step("down")
    you = env.state.you_positions()[0]
    assert env.facing == 1
    after = np.asarray(env.observation_image())
    assert np.array_equal(after[32 * you[1] : 32 * you[1] + 32, 32 * you[0] : 32 * you[0] + 32], down)


def test_nethack_image_is_the_map_in_minihacks_tiles_balrogs_atlas() -> None:
    pytest.importorskip("nle")
    pytest.importorskip("minihack")
    import minihack.tiles as minihack_tiles

    from verlog.envs.nle.tiles import tile_atlas

    # BALROG's balrog/environments/nle/tiles.pkl is MiniHack's file, and its glyph2tile MiniHack's table
    atlas_file = Path(minihack_tiles.__file__).parent / "tiles.pkl"
    assert hashlib.sha256(atlas_file.read_bytes()).hexdigest() == (
        "0c46a00805d2f3426c5fe22cb25fd155508f9d520ca9a1e87db47013b5feba63"
    )
    glyph2tile, atlas = tile_atlas()
    assert hashlib.sha256(np.asarray(glyph2tile, dtype=np.int64).tobytes()).hexdigest() == (
        "7f9e0972c260c3497931690eaea8d50c3967fdbdb92d50803a9d40b574ae251b"
    )
    env = make_env("minihack:MazeWalk-9x9", protocol="balrog", vlm=True)
    env.reset(1)
    image = np.asarray(env.observation_image())
    glyphs = env.raw_observation["glyphs"]
    assert glyphs.shape == (21, 79) and image.shape == (336, 1264, 3)
    for row, column in [(0, 0), (10, 40), tuple(np.argwhere(glyphs != glyphs[0, 0])[0])]:
        cell = image[16 * row : 16 * row + 16, 16 * column : 16 * column + 16]
        assert np.array_equal(cell, atlas[glyph2tile[glyphs[row, column]]])


def test_nethack_under_vision_shows_the_wrappers_language_view() -> None:
    pytest.importorskip("nle")
    pytest.importorskip("minihack")
    text = make_env("minihack:MazeWalk-9x9", protocol="balrog")
    vision = make_env("minihack:MazeWalk-9x9", protocol="balrog", vlm=True)
    hybrid, language = text.reset(1), vision.reset(1)
    assert "\nmap:\n" in hybrid and "\nmap:\n" not in language and "statistics:" not in hybrid
    assert language.startswith("statistics:\nStrength: ") and "\n\ninventory:\n" in language
    past = vision.history_observation
    assert past.startswith("message:\n") and "\n\nlanguage observation:\n" in past and "\n\ncursor:\n" in past
    assert language.endswith("\n" + past) and "statistics:" not in past
    assert "(x=" not in past  # the hybrid view's cursor position is not in the language view
    result = vision.step("north")
    assert result.observation.startswith("statistics:") and result.info["history_observation"] == (
        vision.history_observation
    )


def test_blstats_read_as_the_wrappers_own_test_expects() -> None:
    pytest.importorskip("nle")
    from verlog.envs.nle.balrog_text import text_blstats

    # the fake game of nle-language-wrapper's tests/conftest.py and the text its test expects
    blstats = np.array([66, 14, 19, 1, 4, 5, 6, 7, 8, 123, 11, 12, 9, 10, 1, 13, 1, 23, 7, 10, 5, 4, 2, 21, 10, 11, -1])
    expected = (
        "Strength: 1/19\nDexterity: 4\nConstitution: 5\nIntelligence: 6\nWisdom: 7\nCharisma: 8\nDepth: 9\n"
        "Gold: 10\nHP: 11/12\nEnergy: 1/13\nAC: 1\nXP: 7/10\nTime: 5\nPosition: 66|14\nHunger: Fainting\n"
        "Monster Level: 23\nEncumbrance: Stressed\nDungeon Number: 21\nLevel Number: 10\nScore: 123\n"
        "Alignment: Chaotic\nCondition: Food Poisoning Slimed Stoned"
    )
    assert text_blstats(blstats) == expected
    blstats[25] = 0
    assert text_blstats(blstats).endswith("Condition: None")
    blstats[25] = 2048
    assert text_blstats(blstats).endswith("Condition: Flying")


def test_textworld_has_no_image() -> None:
    from verlog.envs.textworld.env import TextWorldTextEnv

    assert TextWorldTextEnv.observation_image is TextEnv.observation_image  # None: text only


# ------------------------------------------------------------------------------ the messages


def balrog_messages(
    instruction: str,
    history: list[tuple[str, str]],
    images: list[str | None],
    observation: str,
    image: str | None,
    max_text: int,
    max_images: int,
    note: str,
    rule: str,
) -> list[dict[str, Any]]:
    """BALROG's naive agent's request, written out from its code: ``HistoryPromptBuilder``
    (``balrog/prompt_builder/history.py``) fed as the naive agent feeds it, its answer rule, and
    ``OpenAIWrapper.convert_messages`` (``balrog/client.py``). Images stand as their data URLs."""
    events: deque = deque(maxlen=max(max_text, max_images) * 2)
    for (text, answer), url in zip(history, images):
        events.append({"type": "observation", "text": text, "image": url})
        if answer:
            events.append({"type": "action", "action": answer})
    events.append({"type": "observation", "text": observation, "image": image})
    messages = [("user", instruction, None)]
    needed = max_text
    for event in reversed(events):
        if event["type"] == "observation":
            event["include_text"] = needed > 0 and event.get("text") is not None
            needed -= event["include_text"]
    needed = max_images
    for event in reversed(events):
        if event["type"] == "observation":
            event["include_image"] = needed > 0 and event.get("image") is not None
            needed -= event["include_image"]
    for index, event in enumerate(events):
        if event["type"] == "action":
            messages.append(("assistant", event["action"], None))
            continue
        parts = ["Current Observation:" if index == len(events) - 1 else "Observation:"]
        if event["include_text"]:
            parts.append(event["text"])
        attachment = None
        if event["include_image"]:
            attachment = event["image"]
            parts.append(note)
        messages.append(("user", "\n".join(parts), attachment))
    role, content, attachment = messages[-1]
    messages[-1] = (role, content + "\n\n" + rule, attachment)
    converted = []
    for role, content, attachment in messages:
        parts = [{"type": "text", "text": content}]
        if attachment is not None:
            parts.append(balrog_vision.image_part(attachment))
        converted.append({"role": role, "content": parts})
    return converted


def as_request(messages) -> list[dict[str, Any]]:
    """verlog's messages as content parts (a plain string is BALROG's single text part)."""
    out = []
    for message in messages:
        role = "assistant" if isinstance(message, AIMessage) else "user"
        content = message.content
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        out.append({"role": role, "content": parts})
    return out


def test_messages_are_balrogs_for_every_history() -> None:
    rng = random.Random(7)
    for case in range(400):
        steps = rng.randrange(0, 45)
        history = [(f"obs {i}\nline", rng.choice(["go forward", "", "turn left"])) for i in range(steps)]
        images = [rng.choice([f"data:image/png;base64,IMG{i}", None]) for i in range(steps)]
        image = rng.choice(["data:image/png;base64,NOW", None])
        max_text, max_images = rng.choice([1, 2, 16]), rng.choice([0, 1, 2, 3, 20])
        ours = build_prompt(
            "INSTRUCTION",
            history,
            "obs now",
            max_text,
            RULE,
            images=images,
            image=image,
            max_image_history=max_images,
            image_note=IMAGE_NOTE,
        )
        theirs = balrog_messages(
            "INSTRUCTION", history, images, "obs now", image, max_text, max_images, IMAGE_NOTE, RULE
        )
        assert as_request(ours) == theirs, case


def test_only_the_newest_observations_carry_their_image() -> None:
    urls = [f"data:image/png;base64,{n}" for n in ("A", "B", "C")]
    history = [("first", "go forward"), ("second", "turn left")]
    one = build_prompt("I", history, "third", 16, "RULE", images=urls[:2], image=urls[2], max_image_history=1)
    assert [m.type for m in one] == ["human", "human", "ai", "human", "ai", "human"]
    assert all(isinstance(m.content, str) for m in one[:-1])
    assert one[-1].content == [
        {"type": "text", "text": f"Current Observation:\nthird\n{balrog_vision.IMAGE_NOTE}\n\nRULE"},
        {"type": "image_url", "image_url": {"url": urls[2]}},
    ]
    two = build_prompt("I", history, "third", 16, "RULE", images=[urls[0], None], image=urls[2], max_image_history=2)
    pictured = [m for m in two if isinstance(m.content, list)]
    assert [m.content[1]["image_url"]["url"] for m in pictured] == [urls[0], urls[2]]  # the one without is skipped
    assert pictured[0].content[0]["text"] == f"Observation:\nfirst\n{balrog_vision.IMAGE_NOTE}"
    # under the text protocol the prompt is the text protocol's, images or not
    assert build_prompt("I", history, "third", 16, "RULE", images=urls[:2], image=urls[2]) == build_prompt(
        "I", history, "third", 16, "RULE"
    )
    # the window is 2 * max(text, images) events: images reach observations whose text is dropped
    wide = build_prompt("I", history, "third", 1, "RULE", images=urls[:2], image=urls[2], max_image_history=3)
    assert wide[1].content[0]["text"] == f"Observation:\n{balrog_vision.IMAGE_NOTE}"


# ------------------------------------------------------------------------------- through the graph


class Recording(GenericFakeChatModel):
    """A fake chat model keeping every prompt it is given."""

    prompts: list = []

    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):  # type: ignore[override]
        self.prompts.append(messages)
        return await super()._agenerate(messages, stop=stop, run_manager=run_manager, **kwargs)


async def play_recorded(env_name: str, answers: list[str], **kwargs) -> tuple[list, dict]:
    model = Recording(messages=iter(AIMessage(a) for a in answers))
    model.prompts = []
    graph = build_game_graph(model, env_name, protocol="balrog", max_steps=len(answers), **kwargs)
    state = await asyncio.wait_for(graph.ainvoke({"seed": SEED}), 120)
    return model.prompts, state


def image_urls(prompt) -> list[str]:
    return [p["image_url"]["url"] for m in prompt if isinstance(m.content, list) for p in m.content[1:]]


@pytest.mark.parametrize("max_images", [1, 2])
async def test_the_graph_sends_balrogs_images_with_the_layouts_note(layout: Path, max_images: int) -> None:
    answers = ["turn left", "go forward", "turn right"]
    prompts, state = await play_recorded(
        "babyai:goto", answers, balrog_source=str(layout), max_image_history=max_images
    )
    env = make_env("babyai:goto", protocol="balrog")
    env.reset(SEED)
    frames = [np.asarray(env.observation_image())]
    for answer in answers:
        env.step(answer)
        frames.append(np.asarray(env.observation_image()))
    assert len(prompts) == 3
    for step, prompt in enumerate(prompts):
        urls = image_urls(prompt)
        assert len(urls) == min(step + 1, max_images)  # at most max_image_history, the newest
        assert [pixels(u).shape for u in urls] == [(112, 112, 3)] * len(urls)
        assert np.array_equal(pixels(urls[-1]), frames[step])  # the current observation's image
        last = prompt[-1].content
        assert isinstance(last, list) and [p["type"] for p in last] == ["text", "image_url"]
        assert last[0]["text"].startswith("Current Observation:\n")
        assert last[0]["text"].endswith(f"\n{EXPECTED['image_note']}\n\n{RULE}")  # read from the layout
        assert isinstance(prompt[0].content, str) and all(isinstance(m.content, str) for m in prompt if m.type == "ai")
    if max_images == 2:
        assert np.array_equal(pixels(image_urls(prompts[2])[0]), frames[1])
    # the state keeps only the images a prompt can still show
    assert sum(u is not None for u in state["history_images"]) <= max_images
    assert len(state["history_images"]) == len(state["history"])


async def test_the_graph_under_vision_plays_nethacks_language_view() -> None:
    pytest.importorskip("nle")
    pytest.importorskip("minihack")
    prompts, _ = await play_recorded("minihack:MazeWalk-9x9", ["north", "east"], max_image_history=1)
    for prompt in prompts:
        text = prompt[-1].content[0]["text"]
        assert text.startswith("Current Observation:\nstatistics:\n") and "\nmap:\n" not in text
        assert pixels(image_urls(prompt)[0]).shape == (336, 1264, 3)


async def test_the_text_protocol_sends_no_image() -> None:
    prompts, state = await play_recorded("babyai:goto", ["go forward", "go forward"])
    assert all(isinstance(m.content, str) for prompt in prompts for m in prompt)
    assert "image" not in state and "history_images" not in state


def test_a_bad_image_history_is_refused_naming_it() -> None:
    model = GenericFakeChatModel(messages=iter([]))
    with pytest.raises(ValueError, match="max_image_history=1: images are BALROG's vision protocol"):
        build_game_graph(model, "babyai:goto", max_image_history=1)
    with pytest.raises(ValueError, match="max_image_history must be a whole number"):
        build_game_graph(model, "babyai:goto", protocol="balrog", max_image_history=-1)


def test_the_image_note_is_read_from_balrogs_prompt_builder(tmp_path: Path) -> None:
    root = write_balrog_layout(tmp_path / "a")
    source = BalrogSource(root)
    assert source.image_note == IMAGE_NOTE
    assert "balrog/prompt_builder/history.py" in source.provenance()["files"]
    builder = root / "balrog/prompt_builder/history.py"
    builder.write_text("class HistoryPromptBuilder:\n    pass\n")
    with pytest.raises(BalrogSourceError, match="history.py: no image note found"):
        _ = BalrogSource(root).image_note
    builder.unlink()
    source = BalrogSource(root)  # the text protocol does not need it
    assert source.answer_rule == RULE
    with pytest.raises(BalrogSourceError, match="prompt_builder/history.py is missing"):
        _ = source.image_note


# ----------------------------------------------------------------------------------- verlog eval


@pytest.fixture
def endpoint():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = ScriptedChatServer(default=lambda body: "go forward")  # keeps every request
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    yield server
    asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def _babyai_suite(tmp_path: Path) -> Path:
    suite = tmp_path / "mini.yaml"
    entry = {
        "config": str(ROOT / "configs" / "babyai.yaml"),
        "overrides": {"rollout.episode_timeout_s": None},
        "graph_kwargs": {"protocol": "balrog", "history_turns": 16, "max_tokens": 8192, "max_steps": None},
        "tasks": [{"name": "goto", "graph_kwargs": {"task": "goto"}}],
    }
    suite.write_text(yaml.safe_dump({"babyai": entry}))
    return suite


def test_eval_vision_sends_image_url_parts_to_the_endpoint(tmp_path: Path, layout: Path, endpoint, capsys) -> None:
    pytest.importorskip("langchain_openai")
    from verlog.cli import main

    out = tmp_path / "out"
    argv = [
        "eval",
        "--suite",
        str(_babyai_suite(tmp_path)),
        "--base-url",
        endpoint.url + "/v1",
        "--model",
        "a-vlm",
        "--vision",
        "--balrog",
        str(layout),
        "--episodes",
        "1",
        "--no-chart",
        "--graph-kwargs",
        '{"max_steps": 2}',
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert "images: BALROG's vision protocol in 1 task(s)" in said
    played = [b for b in endpoint.requests if b["messages"][0]["content"] != "Say OK."]  # not the start's probe
    assert len(played) == 2
    for body in played:
        *earlier, last = body["messages"]
        assert all(isinstance(m["content"], str) for m in earlier)  # no image but the current one
        text, image = last["content"]
        assert text["type"] == "text" and text["text"].endswith(f"\n{IMAGE_NOTE}\n\n{RULE}")
        assert image["type"] == "image_url" and pixels(image["image_url"]["url"]).shape == (112, 112, 3)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["not_the_suites_protocol"] == ["max_steps"]  # images at BALROG's setting are its protocol
    assert summary["balrog_images"] == "BALROG's vision protocol"
    assert summary["max_image_history"] == {"babyai/goto": 1}
    assert "(max_image_history 1)" in said
    # the budget the summary names is the one the requests carried (the graph's, BALROG's 8192)
    sent = {body.get("max_completion_tokens", body.get("max_tokens")) for body in played}
    assert sent == {summary["sampling"]["babyai/goto"]["max_tokens"]} == {8192}

    # another number of images is not the protocol, and the run's line names the number played
    argv[argv.index("--graph-kwargs") + 1] = '{"max_steps": 2, "max_image_history": 2}'
    assert main([*argv[:-1], str(tmp_path / "two")]) == 0
    assert "(max_image_history 2; BALROG's is 1)" in capsys.readouterr().out
    assert json.loads((tmp_path / "two" / "summary.json").read_text())["not_the_suites_protocol"] == [
        "max_image_history",
        "max_steps",
    ]


def test_eval_vision_needs_a_balrog_protocol_task(capsys) -> None:
    from verlog.cli import main

    code = main(["eval", str(ROOT / "configs" / "guess_number.yaml"), "model.path=tiny", "--vision", "--no-chart"])
    said = capsys.readouterr()
    assert code == 2 and "error: --vision is BALROG's vision protocol: no task here plays BALROG's protocol" in (
        said.out + said.err
    )


def test_the_suite_under_vision_is_its_protocol_and_other_images_are_named() -> None:
    from verlog.evaluation.suite_protocol import protocol_differences, with_vision
    from verlog.evaluation.tasks import plan_tasks

    def tasks():
        planned = plan_tasks([], [], suite="balrog")
        for task in planned:
            task.graph_kwargs["balrog_source"] = {"path": "/somewhere/BALROG", "sha256": "0" * 64}
        return planned

    text = tasks()
    assert protocol_differences(text, "balrog") == []
    text[0].graph_kwargs["max_image_history"] = 0  # the text protocol's own value, given
    assert protocol_differences(text, "balrog") == []
    text[0].graph_kwargs["max_image_history"] = 1  # images without --vision
    assert protocol_differences(text, "balrog") == ["max_image_history"]
    vision = tasks()
    assert len(with_vision(vision)) == len(vision)
    assert protocol_differences(vision, "balrog", vision=True) == []
    assert protocol_differences(tasks(), "balrog", vision=True) == ["max_image_history"]  # --vision, no images
    vision[0].graph_kwargs["max_image_history"] = 3
    assert protocol_differences(vision, "balrog", vision=True) == ["max_image_history"]


def test_every_graph_of_the_suite_builds_under_vision() -> None:
    from verlog.evaluation.suite_protocol import with_vision
    from verlog.evaluation.tasks import plan_tasks
    from verlog.graph_file import load_graph_file

    seen: dict[str, Any] = {}
    for task in plan_tasks([], [], suite="balrog"):
        seen.setdefault(task.env, task)
    assert len(with_vision(list(seen.values()))) == 6
    for task in seen.values():
        if task.env in ("minihack", "nethack"):
            pytest.importorskip("nle")
        build = load_graph_file(ROOT / task.config.multi_turn.langgraph.path).build
        assert task.graph_kwargs["max_image_history"] == 1
        assert build(GenericFakeChatModel(messages=iter([])), **task.graph_kwargs) is not None, task.env


def test_eval_vision_against_serve_model_with_the_tiny_vlm(tmp_path: Path, layout: Path, capsys) -> None:
    """The smoke run of BALROG's vision protocol on a real vision-language endpoint: ``serve-model``'s
    API on the tiny VLM (``tiny-vl``) plays BabyAI and Crafter from their pictures; each request's
    picture is rendered by the model's processor into its prompt tokens."""
    pytest.importorskip("langchain_openai")
    from verlog.backends.embedded import EmbeddedEngine
    from verlog.cli import main
    from verlog.models import load_causal_lm, load_processor
    from verlog.serve import OpenAIServer, serve_in_thread

    processor = load_processor("tiny-vl")
    engine = EmbeddedEngine(load_causal_lm("tiny-vl"), processor.tokenizer, seed=0)
    served = OpenAIServer(engine, processor.tokenizer, model_name="tiny-vl", processor=processor)
    suite = tmp_path / "vision.yaml"
    common = {"protocol": "balrog", "history_turns": 16, "max_tokens": 8, "max_steps": 2}
    suite.write_text(
        yaml.safe_dump(
            {
                "babyai": {
                    "config": str(ROOT / "configs" / "babyai.yaml"),
                    "graph_kwargs": common,
                    "tasks": [{"name": "goto", "graph_kwargs": {"task": "goto"}}],
                },
                "crafter": {"config": str(ROOT / "configs" / "crafter.yaml"), "graph_kwargs": common},
            }
        )
    )
    out = tmp_path / "out"
    try:
        with serve_in_thread(served) as base_url:
            argv = ["eval", "--suite", str(suite), "--base-url", base_url, "--model", "tiny-vl", "--vision"]
            argv += ["--balrog", str(layout), "--episodes", "1", "--no-chart", "--out", str(out)]
            assert main(argv) == 0, capsys.readouterr().out
    finally:
        engine.close()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["balrog_images"] == "BALROG's vision protocol"
    assert set(summary["max_image_history"].values()) == {1} and len(summary["max_image_history"]) == 2
    assert summary["overall"]["episodes"] == 2
    # two steps of each game, each with its picture (the start's probe has none)
    assert engine.stats.image_requests == 4 and engine.stats.images == 4
