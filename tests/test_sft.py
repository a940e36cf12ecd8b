"""``verlog sft``: a warm start from demonstrations of the user's unchanged graph, each source
through the command a user runs, the demonstrations' ids exactly what the policy sees, the
fine-tuned checkpoint taken by ``train --init-from``, ``eval --checkpoint`` and resumes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from verlog.cli import main
from verlog.serve import serve_in_thread

ROOT = Path(__file__).resolve().parents[1]
CORRIDOR = str(ROOT / "configs" / "cue_corridor.yaml")

#: a user's scripted agent for the cue corridor: reads the cue in the prompt, answers its move
CORRIDOR_AGENT = """
from graphs.cue_corridor import RIGHT_MOVE

def answer(call):
    cue = call.messages[-1].content.split()[-1]
    return RIGHT_MOVE[cue]
"""


def corridor_sft(run_dir: Path, agent: Path, *extra: str) -> list[str]:
    from verlog.models import toy_model_dir

    return [
        CORRIDOR,
        f"model.path={toy_model_dir()}",
        f"sft.run_dir={run_dir}",
        f"sft.demonstrations=[{{source: scripted, agent: '{agent}:answer', episodes: 48}}]",
        "sft.epochs=6",
        "sft.lr=0.01",
        "sft.batch_turns=32",
        "eval.episodes=32",
        *extra,
    ]


@pytest.fixture
def corridor_agent(tmp_path: Path) -> Path:
    path = tmp_path / "corridor_agent.py"
    path.write_text(CORRIDOR_AGENT)
    return path


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_scripted_agent_teaches_the_corridor_and_ppo_goes_on_from_it(tmp_path, corridor_agent, capsys):
    run_dir = tmp_path / "sft"
    assert main(["sft", *corridor_sft(run_dir, corridor_agent, "eval.at_start=true")]) == 0
    out = capsys.readouterr().out
    assert "kept 48 of 48 episodes" in out
    result = json.loads((run_dir / "eval.json").read_text())
    before, after = result["before"][0]["win_rate"], result["after"][0]["win_rate"]
    assert before <= 0.25 and after >= 0.9, (before, after)  # imitation alone solves it
    lines = records(run_dir)
    epochs = [r for r in lines if r["kind"] == "sft_epoch"]
    assert len(epochs) == 6 and epochs[-1]["token_accuracy"] > 0.95
    assert epochs[-1]["sft_loss"] < epochs[0]["sft_loss"]
    assert "held_out_loss" in epochs[-1] and "held_out_accuracy" in epochs[-1]
    # every kept episode is on disk, one per line, with the answer ids it was trained on
    [demo_file] = (run_dir / "demonstrations").glob("*.jsonl")
    demos = [json.loads(line) for line in demo_file.read_text().splitlines()]
    assert len(demos) == 48 and all(d["success"] for d in demos)

    # PPO from the fine-tuned policy: an ordinary run folder
    ppo = tmp_path / "ppo"
    args = [
        CORRIDOR,
        f"trainer.run_dir={ppo}",
        "trainer.total_updates=1",
        "trainer.num_envs=8",
        "critic_warmup.buffer_multiplier=0",
        "eval.episodes=16",
        "--init-from",
        str(run_dir),
    ]
    assert main(["train", *args]) == 0
    out = capsys.readouterr().out
    assert "starting from" in out and "update_" in out
    assert json.loads((ppo / "eval.json").read_text())["after"][0]["win_rate"] >= 0.75
    # and verlog eval takes the fine-tuned checkpoint as it is
    assert main(["eval", CORRIDOR, "--checkpoint", str(run_dir), "--episodes", "8"]) == 0


def test_demonstration_ids_are_the_policys_own_rendering(tmp_path, tiny_dir, tiny_tokenizer):
    """BabyAI's bot plays graphs/babyai.py: each turn's prompt ids are the policy's chat template
    applied to the messages the graph sent, its answer the bot's action in the policy's ids."""
    from verlog.config import load_config
    from verlog.sft.collect import collect

    config = load_config(
        ROOT / "configs" / "babyai_warm_start.yaml",
        [f"model.path={tiny_dir}", f"sft.run_dir={tmp_path}", "sft.demonstrations=[{source: scripted, episodes: 4}]"],
    )
    import asyncio

    kept_rounds = []

    def seen(episode):
        kept_rounds.append(episode)

    config.rollout.concurrency = 4
    demos, episodes = asyncio.run(collect(config, config.sft.demonstrations[0], name="bot", on_episode=seen))
    assert len(demos) == 4 and all(d.success for d in demos)
    eos = tiny_tokenizer.eos_token_id
    actions = {"turn left", "turn right", "go forward", "pick up", "drop", "toggle"}
    for episode in episodes:
        assert episode.status == "ok"
    for demo in demos:
        for turn in demo.turns:
            assert turn.response_ids[-1] == eos
            answer = tiny_tokenizer.decode(turn.response_ids[:-1])
            assert answer in actions
            assert turn.response_ids[:-1] == tiny_tokenizer.encode(answer, add_special_tokens=False)
    # the prompt ids: the tokenizer's own template on the graph's messages (kept by the recorder)
    from verlog.agent import load_agent
    from verlog.sft.demonstrators import GameBot
    from verlog.sft.engine import DemonstrationEngine

    engine = DemonstrationEngine(GameBot(), tiny_tokenizer)
    agent = load_agent(config, engine=engine)

    async def one():
        return await agent.rollout(1, first_seed=7, keep_messages=True, on_start=engine.begin)

    [episode] = asyncio.run(one())
    for turn in episode.turns:
        messages = [
            {"role": {"human": "user", "ai": "assistant"}.get(m.type, m.type), "content": m.content}
            for m in turn.messages
        ]
        text = tiny_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert turn.prompt_ids == tiny_tokenizer.encode(text, add_special_tokens=False)


def test_answers_outside_the_calls_grammar_fail_their_episode(tmp_path, tiny_dir, capsys):
    """A scripted answer the call's constraint forbids (constrain_answers' regex) fails its episode,
    which is counted and never kept."""
    agent = tmp_path / "bad.py"
    agent.write_text("def answer(call):\n    return 'dance'\n")
    args = [
        str(ROOT / "configs" / "babyai_warm_start.yaml"),
        f"model.path={tiny_dir}",
        f"sft.run_dir={tmp_path / 'run'}",
        f"sft.demonstrations=[{{source: scripted, agent: '{agent}:answer', episodes: 3}}]",
        "eval.at_end=false",
    ]
    assert main(["sft", *args]) == 2
    captured = capsys.readouterr()
    assert "3 episodes failed" in captured.out and "does not follow the call's regex constraint" in captured.out
    assert "kept none of its 3 episodes" in captured.err


def test_row_answers_train_the_calculator_agent(tmp_path, tiny_dir, capsys):
    """agent: answer — each data row's answer column demonstrates the calculator graph (a tool agent
    built with bind_tools); the reward function scores every demonstration."""
    run_dir = tmp_path / "run"
    args = [
        str(ROOT / "configs" / "calculator.yaml"),
        f"model.path={tiny_dir}",
        f"sft.run_dir={run_dir}",
        "sft.demonstrations=[{source: scripted, agent: answer, episodes: 6}]",
        "sft.epochs=1",
        "eval.at_end=false",
        "wandb.mode=disabled",
    ]
    assert main(["sft", *args]) == 0
    assert "kept 6 of 6 episodes" in capsys.readouterr().out
    from verlog.models import load_tokenizer
    from verlog.sft.collect import read_demonstrations

    [path] = (run_dir / "demonstrations").glob("*.jsonl")
    tokenizer = load_tokenizer(tiny_dir)
    answers = {tokenizer.decode(d.turns[-1].response_ids[:-1]) for d in read_demonstrations(path)}
    assert len(answers) == 6 and all(a.strip() for a in answers)
    assert (run_dir / "checkpoints" / "latest").is_file()


def test_sft_resumes_and_refuses_to_overwrite(tmp_path, corridor_agent, capsys):
    run_dir = tmp_path / "sft"
    base = corridor_sft(run_dir, corridor_agent, "eval.at_end=false", "sft.save_every=2")
    assert main(["sft", *base, "sft.epochs=1"]) == 0
    first = [r for r in records(run_dir) if r["kind"] == "sft_epoch"]
    assert main(["sft", *base, "sft.epochs=1"]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(["sft", *base, "sft.epochs=2", "--resume"]) == 0
    out = capsys.readouterr().out
    assert "resuming" in out and "agent" not in out.split("resuming")[1].split("\n")[0]
    epochs = [r for r in records(run_dir) if r["kind"] == "sft_epoch"]
    assert [r["epoch"] for r in epochs] == [1.0, 2.0] and epochs[0] == first[0]
    state = json.loads(
        (run_dir / "checkpoints" / "latest")
        .parent.joinpath((run_dir / "checkpoints" / "latest").read_text().strip(), "state.json")
        .read_text()
    )
    assert state["epoch"] == 2 and state["kind"] == "sft"


def test_the_policys_own_successes_rounds(tmp_path, corridor_agent, capsys):
    """source: policy — rejection sampling: the policy plays, its won episodes are kept and fitted,
    round after round (a scripted source seeds the first round's skill)."""
    run_dir = tmp_path / "sft"
    args = [
        *corridor_sft(run_dir, corridor_agent, "eval.at_end=false", "sft.epochs=2"),
        f"sft.demonstrations=[{{source: scripted, agent: '{corridor_agent}:answer', episodes: 16}}, "
        "{source: policy, episodes: 16, rounds: 2}]",
    ]
    assert main(["sft", *args]) == 0
    names = sorted(p.name for p in (run_dir / "demonstrations").glob("*.jsonl"))
    assert names == ["0_scripted.jsonl", "1_policy_round1.jsonl", "1_policy_round2.jsonl"]
    for name in names[1:]:
        counts = yaml.safe_load((run_dir / "demonstrations" / name.replace(".jsonl", ".counts.yaml")).read_text())
        kept = [json.loads(line) for line in (run_dir / "demonstrations" / name).read_text().splitlines()]
        assert counts["played"] == 16 and counts["kept"] == len(kept) and all(d["success"] for d in kept)
    rounds = {r["round"] for r in records(run_dir) if r["kind"] == "sft_epoch"}
    assert rounds == {0.0, 1.0, 2.0}  # the scripted demonstrations first, then two rounds of the policy


def test_monte_carlo_critic_is_saved_and_taken_by_init_from(tmp_path, corridor_agent, capsys):
    run_dir = tmp_path / "sft"
    args = corridor_sft(run_dir, corridor_agent, "eval.at_end=false", "sft.epochs=1", "sft.critic=monte_carlo")
    assert main(["sft", *args]) == 0
    latest = run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip()
    assert (latest / "critic.safetensors").is_file()
    assert any(r["kind"] == "sft_critic" for r in records(run_dir))
    ppo = tmp_path / "ppo"
    train = [
        CORRIDOR,
        f"trainer.run_dir={ppo}",
        "trainer.total_updates=1",
        "trainer.num_envs=4",
        "critic_warmup.buffer_multiplier=0",
        "eval.at_end=false",
        "--init-from",
        str(run_dir),
    ]
    assert main(["train", *train]) == 0
    assert "and its critic" in capsys.readouterr().out


def test_a_config_without_an_sft_section_is_one_line(capsys):
    assert main(["sft", CORRIDOR]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sft" in err


def test_turns_that_share_their_prefix_train_in_one_pass(tiny_model, tiny_tokenizer):
    """An episode whose later prompts hold its earlier turns' very ids is one row; the logprobs
    of every answer read from that one pass equal those of each turn's own pass."""
    from verlog.rollout.turn import Turn
    from verlog.sft.collect import Demonstration
    from verlog.sft.dataset import rows_of
    from verlog.train.forward import answer_logprobs, pad_rows, policy_logprobs

    first_prompt = tiny_tokenizer.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    first_answer = tiny_tokenizer.encode("hi there") + [tiny_tokenizer.eos_token_id]
    second_prompt = first_prompt + first_answer + tiny_tokenizer.encode("\n<|im_start|>user\nmore<|im_end|>\n")
    second_answer = tiny_tokenizer.encode("ok") + [tiny_tokenizer.eos_token_id]
    other_prompt = tiny_tokenizer.encode("<|im_start|>user\nelse<|im_end|>\n")
    turns = [
        Turn("e", 0, first_prompt, first_answer, [0.0] * len(first_answer)),
        Turn("e", 1, second_prompt, second_answer, [0.0] * len(second_answer)),
        Turn("e", 2, other_prompt, second_answer, [0.0] * len(second_answer)),  # history rewritten: its own row
    ]
    rows = rows_of([Demonstration("e", "test", 0, 1.0, True, turns)])
    assert [r.turns for r in rows] == [2, 1]
    joined = rows[0]
    ids, mask = pad_rows([joined.ids], 0, "cpu")
    from verlog.train.forward import PackedRows

    positions = torch.as_tensor([joined.answers])
    with torch.no_grad():
        logp, _ = answer_logprobs(tiny_model, PackedRows(ids, mask), positions - 1, ids[:, positions[0]])
        separate = []
        for turn in turns[:2]:
            seq = turn.prompt_ids + turn.response_ids
            ids1, mask1 = pad_rows([seq], 0, "cpu")
            lp, _ = policy_logprobs(
                tiny_model,
                PackedRows(ids1, mask1),
                torch.as_tensor([len(turn.prompt_ids)]),
                torch.as_tensor([turn.response_ids]),
            )
            separate.append(lp[0])
    assert torch.allclose(logp[0], torch.cat(separate), atol=1e-5)


def test_held_out_split_is_by_whole_episode():
    from verlog.rollout.turn import Turn
    from verlog.sft.collect import Demonstration
    from verlog.sft.dataset import split_episodes

    demos = [Demonstration(f"ep{i}", "s", i, 1.0, True, [Turn(f"ep{i}", 0, [1], [2], [0.0])]) for i in range(400)]
    train, held = split_episodes(demos, 0.1, seed=3)
    assert 20 <= len(held) <= 60 and len(train) + len(held) == 400
    assert {d.episode_id for d in train}.isdisjoint(d.episode_id for d in held)
    assert split_episodes(demos, 0.1, seed=3) == (train, held)  # stable


def test_source_settings_are_checked():
    from verlog.config import ConfigError, load_config

    for bad, words in (
        ("[{source: teacher}]", "needs endpoint"),
        ("[{source: traces}]", "needs store"),
        ("[{source: scripted, rounds: 2}]", "rounds is for source policy"),
        ("[{source: scripted, agent: robot}]", "game, answer or file.py:function"),
        ("[{source: oracle}]", "sft.demonstrations.0.source"),
    ):
        with pytest.raises(ConfigError, match=words):
            load_config(CORRIDOR, [f"sft.demonstrations={bad}"])


def test_a_teacher_endpoint_answers_the_graphs_calls(tmp_path, corridor_agent, capsys):
    """source: teacher — an OpenAI-compatible endpoint (a real HTTP server) answers each call with the
    graph's own messages; its answers are re-rendered in the policy's ids and fitted."""
    from scripted_endpoint import ScriptedChatServer

    from graphs.cue_corridor import RIGHT_MOVE

    def teach(body: dict) -> str:
        return RIGHT_MOVE[body["messages"][-1]["content"].split()[-1]]

    server = ScriptedChatServer(default=teach)
    with serve_in_thread(server) as base_url:
        run_dir = tmp_path / "sft"
        source = f"[{{source: teacher, endpoint: {{base_url: '{base_url}', model: big}}, episodes: 24}}]"
        args = [*corridor_sft(run_dir, corridor_agent, "eval.episodes=16"), f"sft.demonstrations={source}"]
        assert main(["sft", *args]) == 0
        assert "kept 24 of 24 episodes" in capsys.readouterr().out
        first = server.requests[0]
        assert first["model"] == "big" and [m["role"] for m in first["messages"]] == ["system", "user"]
    assert json.loads((run_dir / "eval.json").read_text())["after"][0]["win_rate"] >= 0.75


def test_a_teachers_tool_calls_are_written_as_the_policy_writes_them(tmp_path, tiny_dir, tiny_tokenizer):
    """A teacher's OpenAI tool call becomes the policy's <tool_call> block: the chat model parses it
    back into the same call, the graph runs the tool, and the turn's ids are the policy's."""
    import asyncio

    from scripted_endpoint import ScriptedChatServer

    from verlog.config import load_config
    from verlog.sft.collect import collect

    def teach(body: dict) -> dict | str:
        if body["messages"][-1]["role"] == "tool":
            return "The answer is " + body["messages"][-1]["content"]
        call = {
            "id": "c1",
            "type": "function",
            "function": {"name": "calculate", "arguments": '{"expression": "2 + 3"}'},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}

    server = ScriptedChatServer(default=teach)
    with serve_in_thread(server) as base_url:
        config = load_config(
            ROOT / "configs" / "calculator.yaml",
            [
                f"model.path={tiny_dir}",
                f"sft.run_dir={tmp_path}",
                f"sft.demonstrations=[{{source: teacher, endpoint: {{base_url: '{base_url}', model: t}}, "
                "episodes: 2, keep: all}]",
            ],
        )
        demos, episodes = asyncio.run(collect(config, config.sft.demonstrations[0], name="teacher"))
        assert server.requests[0]["tools"][0]["function"]["name"] == "calculate"
    assert [e.status for e in episodes] == ["ok", "ok"] and len(demos) == 2
    first, last = demos[0].turns[0], demos[0].turns[-1]
    text = tiny_tokenizer.decode(first.response_ids[:-1])
    assert text == '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 + 3"}}\n</tool_call>'
    assert tiny_tokenizer.decode(last.response_ids[:-1]) == "The answer is 5"


def test_recorded_traces_with_good_feedback_are_demonstrations(tmp_path, tiny_dir, tiny_model, tiny_tokenizer, capsys):
    """source: traces — production episodes served by serve-model --record (the policy's own ids),
    filtered by their feedback, fitted as recorded."""
    import asyncio

    import aiohttp

    from verlog.backends.embedded import EmbeddedEngine
    from verlog.graph_file import load_graph_file
    from verlog.serve import OpenAIServer
    from verlog.traces import TraceRecorder, episode_chat_openai, open_store

    store_dir = tmp_path / "traces"
    store = open_store(store_dir)
    recorder = TraceRecorder(store)
    engine = EmbeddedEngine(tiny_model, tiny_tokenizer, seed=0)
    graph_file = load_graph_file(ROOT / "graphs" / "cue_corridor.py")

    async def production() -> None:
        async with OpenAIServer(engine, tiny_tokenizer, model_name="tiny", api_key="k", recorder=recorder) as server:
            model = episode_chat_openai(base_url=server.base_url, model="tiny", api_key="k", max_retries=0)
            graph = graph_file.build(model, max_turns=2)
            for i in range(4):
                await graph.ainvoke(graph_file.make_input(i), {"configurable": {"episode_id": f"user{i}"}})
            recorder.flush()
            async with aiohttp.ClientSession(headers={"Authorization": "Bearer k"}) as session:
                for i, reward in enumerate((1.0, 0.0, 1.0, 0.0)):
                    url = f"{server.base_url}/feedback"
                    async with session.post(url, json={"episode_id": f"user{i}", "reward": reward}) as r:
                        assert r.status == 200, await r.text()

    asyncio.run(production())
    recorder.close()
    engine.close()
    recorded = {e.episode_id: store.turns(e.episode_id) for e in store.episodes()}
    store.close()
    run_dir = tmp_path / "sft"
    args = [
        CORRIDOR,
        f"model.path={tiny_dir}",
        f"sft.run_dir={run_dir}",
        f"sft.demonstrations=[{{source: traces, store: '{store_dir}', min_reward: 1.0, keep: all}}]",
        "sft.epochs=1",
        "eval.at_end=false",
    ]
    assert main(["sft", *args]) == 0
    assert "kept 2 of 2 episodes" in capsys.readouterr().out
    from verlog.sft.collect import read_demonstrations

    [path] = (run_dir / "demonstrations").glob("*.jsonl")
    kept = {d.key: d for d in read_demonstrations(path)}
    assert set(kept) == {"user0", "user2"}
    for key, demo in kept.items():
        assert [t.prompt_ids for t in demo.turns] == [t.prompt_ids for t in recorded[key]]
        assert [t.response_ids for t in demo.turns] == [t.response_ids for t in recorded[key]]


def test_lora_and_a_frozen_trunk_fine_tune_and_serve_like_training(tmp_path, corridor_agent, capsys):
    """actor.lora and actor.train_layers choose what trains, as in verlog train; the LoRA run's
    checkpoint holds its adapters, which eval and serve-model merge onto the base."""
    pytest.importorskip("peft")
    from verlog.weights.policy import find_policy, load_policy

    lora = tmp_path / "lora"
    args = corridor_sft(lora, corridor_agent, "eval.at_end=false", "sft.epochs=1", "actor.lora.rank=4")
    assert main(["sft", *args]) == 0
    source = find_policy(lora)
    assert source.adapter is not None and source.checkpoint is not None  # what serve-model loads
    model, _ = load_policy(source)
    assert model is not None
    assert main(["eval", CORRIDOR, f"model.path={source.model}", "--checkpoint", str(lora), "--episodes", "4"]) == 0

    trunk = tmp_path / "trunk"
    args = corridor_sft(trunk, corridor_agent, "eval.at_end=false", "sft.epochs=1", "actor.train_layers=1")
    assert main(["sft", *args]) == 0
    from verlog.models import load_causal_lm, toy_model_dir

    before, after = load_causal_lm(toy_model_dir()), load_causal_lm(find_policy(trunk).model)
    layers = len(before.model.layers)
    for name, tensor in before.state_dict().items():
        moved = not torch.equal(tensor, after.state_dict()[name])
        last = f"layers.{layers - 1}." in name or "norm.weight" == name.split("model.")[-1] or "lm_head" in name
        assert moved <= last, name  # only the last layer (and the final norm, the head) may move


def test_init_from_names_what_it_cannot_start_from(tmp_path, corridor_agent, capsys):
    common = [CORRIDOR, f"trainer.run_dir={tmp_path / 'ppo'}", "trainer.total_updates=1"]
    assert main(["train", *common, "--init-from", str(tmp_path / "nowhere")]) == 2
    assert "trainer.init_from" in capsys.readouterr().err
    pytest.importorskip("peft")
    lora = tmp_path / "lora"
    args = corridor_sft(lora, corridor_agent, "eval.at_end=false", "sft.epochs=1", "actor.lora.rank=4")
    assert main(["sft", *args]) == 0
    capsys.readouterr()
    assert main(["train", *common, "--init-from", str(lora)]) == 2
    err = capsys.readouterr().err
    assert "LoRA adapters" in err and err.count("\n") == 1
