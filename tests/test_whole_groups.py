"""Whole groups: with a group estimator each row's ``group_size`` plays start together and end in
one batch, or the group is dropped whole, counted, and its row played again.

LangGraph's prebuilt ReAct agent (``create_react_agent``) plays every test: once under the real
trainer and the tiny model, and on a scripted engine whose answers make the plays of one row take
1 to 8 model calls (tool calls before the answer), so groups drift, straddle batch boundaries and
must be dropped and replayed. The runner, recorder, storage and GRPO are the real ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch
from langchain_core.messages import HumanMessage

from verlog.cli import main
from verlog.config import AlgorithmConfig
from verlog.graph_file import load_graph_file
from verlog.llm import VerlogChatModel
from verlog.rollout.schedule import slot_seed
from verlog.rollout.slots import SlotBatch, SlotRunner
from verlog.testing import ScriptedEngine
from verlog.train.storage import RolloutStorage

ROOT = Path(__file__).resolve().parents[1]
REACT = load_graph_file(ROOT / "tests" / "graphs" / "prebuilt_react_agent.py")
GROUP = 4
TURNS = 8  # turns per slot and batch in the scripted runs


def slot_of(episode_id: str) -> int:
    return int(episode_id.split("-")[0].removeprefix("slot"))


def check_whole_groups(batch: SlotBatch, group_size: int) -> dict[int, list[str]]:
    """What every batch of whole groups must satisfy; returns the plays compared, by task."""
    assert batch.compared is not None
    where = {id(t): i for i, slot in enumerate(batch.turns) for t in slot}  # turn -> its slot in this batch
    seed_of = {id(t): s for slot, seeds in zip(batch.turns, batch.seeds) for t, s in zip(slot, seeds)}
    compared_turns = {id(t) for slot, flags in zip(batch.turns, batch.compared) for t, f in zip(slot, flags) if f}
    plays: dict[int, list[str]] = {}
    in_groups = set()
    for group in batch.whole_groups:
        assert len(group) == group_size  # exactly group_size plays ...
        slots = {slot_of(e.episode_id) for e in group}
        assert len(slots) == group_size and len({s // group_size for s in slots}) == 1  # one per slot of one group
        seeds = set()
        for episode in group:
            assert episode.status == "ok" and episode.turns[-1].done
            for turn in episode.turns:  # ... every turn of which lies in this batch: begun and ended in it
                assert where.get(id(turn)) == slot_of(episode.episode_id)
                seeds.add(seed_of[id(turn)])
                in_groups.add(id(turn))
        assert len(seeds) == 1  # all of one row
        seed = seeds.pop()
        assert seed not in plays  # a row is compared once in a batch
        plays[seed] = [e.episode_id for e in group]
    assert compared_turns == in_groups  # the turns compared are exactly the whole groups' turns
    return plays


# ---------------------------------------------------------------------- under the trainer


@pytest.mark.timeout(600)
def test_create_react_agent_groups_of_4_each_row_gets_exactly_4_plays_in_one_batch(tmp_path, monkeypatch):
    """``verlog train`` with GRPO, groups of 4 and the prebuilt agent on the tiny model: in every
    batch, each row compared has exactly 4 plays that began and ended in that batch; turns of
    any other play are out of the policy loss; the metrics count the groups."""
    from verlog.train import trainer

    batches: list[tuple[SlotBatch, RolloutStorage]] = []
    real = trainer.RolloutStorage.from_batch

    def recorded(batch):  # the real storage, kept to look at once the run is over
        storage = real(batch)
        batches.append((batch, storage))
        return storage

    monkeypatch.setattr(trainer.RolloutStorage, "from_batch", recorded)
    rows = tmp_path / "train.jsonl"
    rows.write_text(
        "".join(json.dumps({"prompt": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)}) + "\n" for i in range(40))
    )
    reward = tmp_path / "reward.py"
    reward.write_text(
        "def digits(completion: str) -> float:\n"
        "    return sum(c.isdigit() for c in completion) / max(1, len(completion))\n"
    )
    run_dir = tmp_path / "run"
    assert (
        main(
            [
                "train",
                str(ROOT / "configs" / "calculator.yaml"),
                f"multi_turn.langgraph.path={REACT.path}",
                "multi_turn.langgraph.graph_kwargs={}",
                "multi_turn.langgraph.graph_config={recursion_limit: 12}",
                f"data.train={rows}",
                "data.validation=null",
                "data.test=null",
                f'reward.functions=[{{"function": "{reward}:digits"}}]',
                "algorithm.estimator=grpo",
                f"trainer.run_dir={run_dir}",
                "trainer.num_envs=8",
                f"trainer.group_size={GROUP}",
                "trainer.turns_per_env=4",
                "trainer.total_updates=3",
                "trainer.save_every=0",
                "trainer.torch_threads=1",
                "sampling.max_tokens=12",
                "wandb.mode=disabled",
                "algorithm.mini_batch_turns=32",
                "eval.at_start=false",
                "eval.at_end=false",
            ]
        )
        == 0
    )

    updates = [
        r
        for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
        if r.get("kind", "update") == "update" and "groups_compared" in r
    ]
    assert len(updates) == len(batches) == 3
    compared = 0
    for (batch, storage), metrics in zip(batches, updates):
        plays = check_whole_groups(batch, GROUP)
        assert all(len(ids) == GROUP for ids in plays.values())
        assert metrics["groups_compared"] == len(batch.whole_groups) == len(plays)
        assert metrics["groups_dropped"] == batch.groups_dropped
        # the policy loss uses the compared turns' tokens, and nothing of any other play
        flags = torch.as_tensor([f for slot in batch.compared for f in slot])
        assert not storage.policy_mask[~flags].any()
        assert storage.policy_mask[flags].any(1).all()
        compared += len(plays)
    assert compared >= 2  # rows were compared (and their groups trained)
    assert updates[-1]["groups_dropped_total"] == sum(b.groups_dropped for b, _ in batches)


# ---------------------------------------------------------------------- plays of different lengths


def tool_call(expression: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'calculate', 'arguments': {'expression': expression}})}\n</tool_call>"


class Lengths:
    """The scripted model of the prebuilt agent: the ``k``-th play of task ``s`` to start makes
    ``calls(s, k)`` model calls (tool calls, then an answer). Each answer is tagged with its play,
    and the agent renders it back into the next prompt, so later calls know whose they are."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.started: Counter[int] = Counter()

    @staticmethod
    def calls(seed: int, k: int) -> int:
        # 1..3 calls, but 5..8 for every fifth task: a group that has seen only short plays starts
        # such a row with too few turns left in the batch for it, and it straddles the boundary
        return 8 - k if seed % 5 == 4 else 1 + (seed + k) % 3

    def __call__(self, prompt_ids: list[int]) -> str:
        text = self.tokenizer.decode(prompt_ids)
        seed = int(re.search(r"Task (\d+)\.", text).group(1))
        tag = re.search(r"\[play (\d+)\]", text)
        if tag is None:  # a play's first call
            k = self.started[seed]
            self.started[seed] += 1
        else:
            k = int(tag.group(1))
        made = text.count("<tool_response>")
        if made + 1 < self.calls(seed, k % GROUP):
            return f"[play {k}] {tool_call(f'{seed} + {made}')}"
        return f"[play {k}] The answer is {seed}."


#: the play whose scoring fails: slot 1's play of its group's row 2, first attempt
FAILING = "slot1-ep2"


def react_runner(tokenizer, **kwargs) -> SlotRunner:
    script = Lengths(tokenizer)

    async def scored(episode, seed):  # a return per play: its number of calls (GRPO has something to compare)
        if episode.episode_id == FAILING:
            raise RuntimeError("the reward function failed")  # the play fails: its group is short of one
        episode.turns[-1].reward += float(len(episode.turns))

    return SlotRunner(
        ScriptedEngine(tokenizer, script),
        lambda gated: REACT.build(VerlogChatModel(engine=gated, tokenizer=tokenizer, max_tokens=200)),
        lambda seed: {"messages": [HumanMessage(f"Task {seed}. What is {seed} + 1?")]},
        num_envs=8,
        turns_per_env=TURNS,
        group_size=GROUP,
        whole_groups=True,
        graph_config={"recursion_limit": 40},
        on_episode_end=scored,
        **kwargs,
    )


def check_grpo(batch: SlotBatch) -> None:
    """GRPO on the batch compares each whole group's plays, by hand; every other turn has advantage 0
    and no place in the policy loss."""
    storage = RolloutStorage.from_batch(batch)
    storage.compute_advantages(AlgorithmConfig(estimator="grpo"))
    row = {id(t): r for r, t in enumerate(batch.flat_turns())}
    trained = torch.zeros(storage.size, dtype=torch.bool)
    for group in batch.whole_groups:
        returns = torch.tensor([sum(t.reward for t in e.turns) for e in group])
        expected = (returns - returns.mean()) / (returns.std() + 1e-6)
        if returns.max() == returns.min():
            expected = torch.zeros_like(returns)
        for episode, advantage in zip(group, expected):
            for turn in episode.turns:
                r = row[id(turn)]
                trained[r] = True
                mask = storage.response_mask[r]
                assert torch.allclose(storage.advantages[r][mask], advantage.expand(int(mask.sum())), atol=1e-5)
                assert storage.policy_mask[r].equal(mask)
    assert not storage.advantages[~trained].any() and not storage.policy_mask[~trained].any()
    # every group estimator trains nothing of a play outside a whole group, and a batch without
    # one trains nothing at all
    nothing = dataclasses.replace(batch, compared=[[False] * len(slot) for slot in batch.turns])
    for name in ("rloo", "reinforce_pp_baseline"):  # (gigpo needs anchor states: test_train_estimators)
        for each, kept in ((batch, trained), (nothing, torch.zeros_like(trained))):
            other = RolloutStorage.from_batch(each)
            other.compute_advantages(AlgorithmConfig(estimator=name, drop_uniform_groups=True))
            assert not other.advantages[~kept].any() and not other.policy_mask[~kept].any(), name


async def collect(runner: SlotRunner, batches: int) -> list[SlotBatch]:
    out = []
    for _ in range(batches):
        out.append(await asyncio.wait_for(runner.collect(), 60))
    return out


@pytest.mark.timeout(300)
async def test_straddling_groups_are_dropped_whole_counted_and_replayed(tiny_tokenizer):
    """Plays of one row take 1 to 8 calls and a slot gives at most 8 per batch: a slot whose play
    ended waits for its group-mates (giving fewer turns), groups that straddle a boundary or lose
    a play to a failure are dropped whole and counted, and their rows played again until compared;
    a resumed runner (``state_dict``) goes on without skipping a row."""
    runner = react_runner(tiny_tokenizer)
    try:
        first = await collect(runner, 8)
        state = runner.state_dict()
    finally:
        await runner.aclose()
    resumed = react_runner(tiny_tokenizer)
    resumed.load_state_dict(json.loads(json.dumps(state)))  # as a checkpoint stores it
    try:
        second = await collect(resumed, 6)
        final = resumed.state_dict()
    finally:
        await resumed.aclose()

    compared: dict[int, int] = defaultdict(int)  # task -> times compared
    for batch in first + second:
        for seed, ids in check_whole_groups(batch, GROUP).items():
            compared[seed] += 1
            assert len(ids) == GROUP
        check_grpo(batch)
        assert all(len(slot) <= TURNS for slot in batch.turns)
    batches = first + second
    assert any(len(slot) < TURNS for b in batches for slot in b.turns)  # slots waited idle for their group
    assert any(len({len(e.turns) for e in g}) == GROUP for b in batches for g in b.whole_groups)  # 4 lengths, 1 group
    dropped = sum(b.groups_dropped for b in batches)
    assert dropped > 0 and final["counters"]["groups_dropped"] == dropped  # straddling groups were dropped, counted
    assert final["counters"]["groups_abandoned"] == 0
    # a dropped row was played again: a play of a later attempt (id "slotI-epJ.A") was compared
    assert any("." in e.episode_id for b in batches for g in b.whole_groups for e in g)
    # the group that lost a play to a failure was not compared; its row was, once played again
    assert [e.episode_id for b in batches for e in b.failed] == [FAILING]
    ids = [e.episode_id for b in batches for g in b.whole_groups for e in g]
    assert not {f"slot{i}-ep2" for i in range(GROUP)} & set(ids) and "slot1-ep2.1" in ids
    # every row a group began was compared exactly once, across the resume, except the rows it
    # still had in flight or to play again at the end
    groups = 8 // GROUP
    pending = {slot_seed(0, j, g, groups) for g, replays in enumerate(final["replays"]) for j, _ in replays}
    pending |= {slot_seed(0, j, i // GROUP, groups) for i, j in enumerate(final["in_flight"]) if j is not None}
    begun = {slot_seed(0, j, g, groups) for g in range(groups) for j in range(final["episodes_started"][g * GROUP])}
    assert set(compared) == begun - pending and set(compared.values()) == {1}
    assert len(compared) >= 8


# ---------------------------------------------------------------------- beside recorded episodes


@pytest.mark.timeout(300)
def test_whole_groups_train_beside_recorded_slots(tmp_path, monkeypatch):
    """GRPO with live groups of 2 and recorded slots (``data.traces``) in one batch: the live slots
    give whole groups (fewer turns when they wait), the recorded ones their full rows, and the
    recorded episodes are compared by their own ``group`` as before."""
    from rich.console import Console

    from verlog.config import load_config
    from verlog.models import load_tokenizer
    from verlog.traces import TracedTurn, open_store
    from verlog.train import train, trainer

    batches: list[tuple[SlotBatch, RolloutStorage]] = []
    real = trainer.RolloutStorage.from_batch
    monkeypatch.setattr(
        trainer.RolloutStorage, "from_batch", lambda batch: batches.append((batch, real(batch))) or batches[-1][1]
    )
    tokenizer = load_tokenizer("toy")
    store = open_store(tmp_path / "traces")
    prompt = list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "pos 0 of 4 cue red"}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
    )
    east = tokenizer.convert_tokens_to_ids("east")
    for e in range(8):  # two plays of each recorded task: a group of 2, with different returns
        store.record(
            [
                TracedTurn(
                    episode_id=f"e{e}",
                    turn_index=-1,
                    prompt_ids=prompt,
                    response_ids=[east],
                    logprobs=[-1.4],
                    model_version="agent/update_000001",
                )
                for _ in range(2)
            ]
        )
        store.add_feedback(f"e{e}", float(e % 2), success=bool(e % 2), info={"group": f"task{e // 2}"})
    store.close()
    config = load_config(
        ROOT / "configs" / "cue_corridor.yaml",
        [
            f"trainer.run_dir={tmp_path / 'run'}",
            "wandb.mode=disabled",
            f"data.traces.store={tmp_path / 'traces'}",
            "data.traces.fraction=0.5",
            "trainer.total_updates=2",
            "trainer.num_envs=4",
            "trainer.group_size=2",
            "trainer.turns_per_env=12",
            "algorithm.estimator=grpo",
            "eval.at_start=false",
            "eval.at_end=false",
            "algorithm.mini_batch_turns=16",
        ],
    )
    assert train(config, console=Console(quiet=True)).updates == 2
    assert len(batches) == 2
    for batch, storage in batches:
        live = SlotBatch(
            batch.turns[:2],
            batch.bootstrap_prompt_ids[:2],
            batch.starts_episode[:2],
            batch.seeds[:2],
            episodes=batch.episodes,
            compared=batch.compared[:2],
            whole_groups=batch.whole_groups,
        )
        check_whole_groups(live, 2)
        assert all(len(slot) == 12 for slot in batch.turns[2:]) and all(all(f) for f in batch.compared[2:])
        recorded = storage.grid[-24:]  # the recorded slots' turns keep their own places in the grid
        assert recorded.tolist() == [2 * batch.turns_per_env + k for k in range(12)] + [
            3 * batch.turns_per_env + k for k in range(12)
        ]
        assert storage.policy_mask[-24:].any()  # recorded groups with different returns train
    assert sum(len(batch.whole_groups) for batch, _ in batches) > 0


async def test_a_batch_every_turn_of_which_is_compared_trains_as_a_fixed_turn_batch(tiny_tokenizer):
    """The grid of whole groups, when every slot gives its full quota and every turn is compared,
    is the fixed-turn layout itself: GAE (with a critic's values) and GRPO give bit-identical
    advantages, returns and policy masks either way (the fixed-turn path is what group_size 1 and
    PPO take, unchanged)."""
    script = Lengths(tiny_tokenizer)
    plain = SlotRunner(
        ScriptedEngine(tiny_tokenizer, script),
        lambda gated: REACT.build(VerlogChatModel(engine=gated, tokenizer=tiny_tokenizer, max_tokens=200)),
        lambda seed: {"messages": [HumanMessage(f"Task {seed}. What is {seed} + 1?")]},
        num_envs=4,
        turns_per_env=5,
        group_size=2,
        graph_config={"recursion_limit": 40},
    )
    try:
        batch = await asyncio.wait_for(plain.collect(), 60)
    finally:
        await plain.aclose()
    assert batch.compared is None
    every = dataclasses.replace(batch, compared=[[True] * len(slot) for slot in batch.turns])
    generator = torch.Generator().manual_seed(0)
    for name in ("gae", "grpo"):
        out = []
        for each in (batch, every):
            storage = RolloutStorage.from_batch(each)
            storage.values = (
                torch.rand(storage.size, storage.response_mask.shape[1] + 1, generator=generator.manual_seed(1))
                * storage.value_mask
            )
            storage.bootstrap_values = torch.rand(storage.num_envs, generator=generator.manual_seed(2))
            storage.truncation_values = torch.full((storage.size,), float("nan"))
            storage.compute_advantages(AlgorithmConfig(estimator=name))
            out.append(storage)
        assert out[1].grid.tolist() == list(range(out[1].size))
        assert torch.equal(out[0].advantages, out[1].advantages) and torch.equal(out[0].policy_mask, out[1].policy_mask)
        assert (out[0].returns is None) == (out[1].returns is None)
        assert out[0].returns is None or torch.equal(out[0].returns, out[1].returns)
