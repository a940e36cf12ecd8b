"""Training from recorded episodes: decoupled PPO's maths, the staleness rule, trace batches laid
out as fixed-turn slots, the ``data.traces`` section, and a run mixing live and recorded slots."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from rich.console import Console

from verlog.algo.losses import ppo_policy_loss
from verlog.algo.off_policy import OffPolicyCorrection, decoupled_advantages, decoupled_policy_loss, staleness_weights
from verlog.config import ConfigError, config_from_dict, load_config
from verlog.traces import TracedTurn, open_store
from verlog.train import train
from verlog.train.storage import RolloutStorage
from verlog.train.trace_batches import TraceSource, lineage_staleness, merge_batches

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------- the maths
def test_decoupled_ppo_is_ppo_against_the_proximal_policy_with_weighted_advantages():
    torch.manual_seed(0)
    b, t = 6, 5
    logp = (torch.randn(b, t) * 0.3 - 1).requires_grad_()
    prox, behav = torch.randn(b, t) * 0.3 - 1, torch.randn(b, t) * 0.3 - 1
    adv, mask = torch.randn(b, t), torch.rand(b, t) > 0.2
    turns = torch.tensor([1.0, 0.5, 0.25, 1.0, 0.0, 1.0])
    correction = OffPolicyCorrection(behaviour_weight_cap=1.5)
    scaled, metrics = decoupled_advantages(adv, prox, behav, mask, turns, correction)
    ours, _ = ppo_policy_loss(logp, prox, scaled, mask, clip_eps=0.2, dual_clip=None)
    written = decoupled_policy_loss(logp, prox, behav, adv, mask, clip_eps=0.2, cap=1.5, turn_weights=turns)
    assert ours.item() == pytest.approx(written.item(), rel=1e-6)
    (g1,) = torch.autograd.grad(ours, logp)
    (g2,) = torch.autograd.grad(written, logp)
    torch.testing.assert_close(g1, g2)
    w = torch.exp(prox - behav).clamp(max=1.5) * turns.unsqueeze(1)
    assert metrics["behaviour_weight"] == pytest.approx((w * mask).sum().item() / mask.sum().item(), rel=1e-6)
    assert 0 < metrics["behaviour_weight_truncated"] < 1  # some tokens' weights exceed the cap here
    # on-policy (behaviour == proximal) it is plain PPO
    same, _ = decoupled_advantages(adv, prox, prox, mask, torch.ones(b), correction)
    torch.testing.assert_close(same, adv * mask)


def test_staleness_rule_down_weights_and_drops():
    lags = torch.tensor([0, 1, 2, 3])
    assert staleness_weights(lags, None, 1.0).tolist() == [1, 1, 1, 1]
    assert staleness_weights(lags, None, 0.5).tolist() == [1, 0.5, 0.25, 0.125]
    assert staleness_weights(lags, 1, 0.5).tolist() == [1, 0.5, 0, 0]
    with pytest.raises(ValueError, match="decay must be in"):
        OffPolicyCorrection(decay=0)
    with pytest.raises(ValueError, match="behaviour_weight_cap must be >= 1"):
        OffPolicyCorrection(behaviour_weight_cap=0.5)


# ------------------------------------------------------------------------------- trace batches
def _traced(episode: str, i: int, version: str) -> TracedTurn:
    return TracedTurn(
        episode_id=episode,
        turn_index=-1,
        prompt_ids=[1, 2, 100 + i],
        response_ids=[5, 6][: 1 + i % 2],
        logprobs=[-0.5, -0.25][: 1 + i % 2],
        model_version=version,
        temperature=0.9,
    )


def _traces_config(store: Path, **settings):
    return config_from_dict(
        {
            "multi_turn": {"langgraph": {"path": str(ROOT / "graphs" / "cue_corridor.py")}},
            "data": {"traces": {"store": str(store), **settings}},
        }
    ).data.traces


def test_trace_batches_lay_episodes_out_as_slots(tmp_path):
    store = open_store(tmp_path / "t")
    store.record([_traced("a", i, "run/update_000001") for i in range(3)])
    store.record([_traced("b", i, "run/update_000002") for i in range(2)])
    store.record([_traced("c", i, "run/update_000003") for i in range(2)])
    store.record([_traced("open", 0, "run/update_000003")])  # no feedback: not trained
    store.add_feedback("a", 1.0, success=True)
    store.add_feedback("b", 0.5, info={"group": "task-7"})
    store.add_feedback("c", -1.0)
    store.add_feedback("c", 0.25, turn_index=0)
    settings = _traces_config(tmp_path / "t", staleness={"max_versions": 1, "decay": 0.5})
    source = TraceSource(settings, num_slots=2, turns_per_env=2, seed=0)
    batch = source.next_batch()
    turns = batch.flat_turns()
    assert {t.episode_id for t in turns} <= {"b", "c"}  # a (2 versions behind) is dropped whole, open has no feedback
    by_episode: dict[str, list] = {}
    for turn, weight in zip(turns, [w for slot in batch.turn_weights for w in slot]):
        by_episode.setdefault(turn.episode_id, []).append((turn, weight))
    for episode, rows in by_episode.items():
        assert [t.turn_index for t, _ in rows] == list(range(len(rows)))
        assert all(w == (0.5 if episode == "b" else 1.0) for _, w in rows)  # b is one version behind
        assert rows[-1][0].terminated and not any(t.terminated for t, _ in rows[:-1])
    assert [t.reward for t, _ in by_episode["c"]] == [0.25, -1.0]  # turn feedback, then the outcome
    assert [t.reward for t, _ in by_episode["b"]] == [0.0, 0.5]
    assert batch.starts_episode == [True, True] and batch.trace_turns == 4
    assert batch.seeds[0][0] != batch.seeds[1][0]
    storage = RolloutStorage.from_batch(batch)
    assert storage.turn_weights.tolist() == [w for slot in batch.turn_weights for w in slot]
    assert storage.temperatures.tolist() == pytest.approx([0.9] * 4)

    # a slot cut mid-episode is bootstrapped from the episode's next recorded turn
    source = TraceSource(_traces_config(tmp_path / "t"), num_slots=2, turns_per_env=1, seed=1)
    cut = source.next_batch()
    assert not cut.turns[0][0].done  # every episode here has two turns or more
    assert cut.bootstrap_prompt_ids[0] == cut.turns[1][0].prompt_ids and cut.starts_episode == [True, False]
    assert cut.turns[1][0].episode_id == cut.turns[0][0].episode_id

    live = TraceSource(_traces_config(tmp_path / "t"), num_slots=1, turns_per_env=1).next_batch()
    merged = merge_batches(cut, live)  # cut's slots as the live ones: they weigh 1 and name no version
    assert merged.num_envs == 3 and len(merged.turn_weights) == 3
    assert merged.turns == cut.turns + live.turns and merged.seeds == cut.seeds + live.seeds
    assert merged.turn_weights == [[1.0], [1.0]] + live.turn_weights
    assert merged.versions == [[None], [None]] + live.versions and live.versions[0][0] is not None
    assert merged.trace_turns == live.trace_turns == 1
    assert merge_batches(None, live) is live and merge_batches(cut, None) is cut
    store.close()


def test_staleness_follows_the_checkpoint_lineage_after_a_rollback(tmp_path):
    """Served v1, then v2, then v1 again (a rollback): staleness is counted from the weights being
    trained, by the run's update order, never by when a version first answered."""
    v1, v2 = "run/update_000001", "run/update_000002"
    store = open_store(tmp_path / "t")
    for episode, version in (("first", v1), ("second", v2), ("again", v1)):
        store.record([_traced(episode, i, version) for i in range(2)])
        store.add_feedback(episode, 1.0)
    assert lineage_staleness(store.versions(), ("run", 2)) == {v1: 1.0, v2: 0.0}
    assert lineage_staleness(store.versions(), ("run", 1)) == {v1: 0.0, v2: math.inf}
    assert lineage_staleness(store.versions()) == {v1: 1.0, v2: 0.0}  # no trainer: the newest checkpoint
    assert lineage_staleness(["smollm2", "other/update_000009", v1], ("run", 3)) == {
        "smollm2": 3.0,
        "other/update_000009": 3.0,
        v1: 2.0,
    }  # what the run started from: all its updates behind
    settings = _traces_config(tmp_path / "t", staleness={"max_versions": 0})

    def trained_episodes(trained: tuple[str, int]) -> set[str]:
        source = TraceSource(settings, num_slots=1, turns_per_env=4, seed=0, store=open_store(tmp_path / "t"))
        source.trained = trained
        episodes = {t.episode_id for t in source.next_batch().flat_turns()}
        source.close()
        return episodes

    assert trained_episodes(("run", 2)) == {"second"}  # the trainer holds v2: v1's traffic is one update behind
    # rolled back to v1 (the trainer resumed from it): v1's traffic, old and new, is on-policy; v2's is off the lineage
    assert trained_episodes(("run", 1)) == {"first", "again"}
    assert staleness_weights(torch.tensor([math.inf, 0.0]), None, 1.0).tolist() == [0.0, 1.0]
    store.close()


def test_a_store_without_feedback_is_a_clear_error(tmp_path):
    store = open_store(tmp_path / "empty")
    store.record([_traced("x", 0, "v0")])
    with pytest.raises(ConfigError, match="holds no episode to train on \\(1 episodes, none with feedback"):
        TraceSource(_traces_config(tmp_path / "empty"), num_slots=1, turns_per_env=1).next_batch()
    store.close()


def test_traces_section_is_validated():
    base = {"multi_turn": {"langgraph": {"path": "graphs/cue_corridor.py"}}}
    with pytest.raises(ConfigError, match="data.traces.fraction"):
        config_from_dict({**base, "data": {"traces": {"store": "x", "fraction": 0}}})
    with pytest.raises(ConfigError, match="data.traces.staleness.decay"):
        config_from_dict({**base, "data": {"traces": {"store": "x", "staleness": {"decay": 2}}}})
    with pytest.raises(ConfigError, match="data.traces.store"):
        config_from_dict({**base, "data": {"traces": {"fraction": 0.5}}})


# ------------------------------------------------------------------------------- a mixed run
@pytest.mark.timeout(300)
def test_a_run_mixes_live_slots_and_recorded_ones(tmp_path):
    """Half the slots play the corridor live, half replay recorded episodes (served by an older
    version: down-weighted); the run trains on both and logs what it took from the store."""
    from verlog.models import load_tokenizer

    tokenizer = load_tokenizer("toy")
    store = open_store(tmp_path / "traces")
    prompt = tokenizer.apply_chat_template(
        [{"role": "system", "content": "walk the corridor"}, {"role": "user", "content": "pos 0 of 4 cue red"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
    )
    prompt = list(prompt["input_ids"])
    east = tokenizer.convert_tokens_to_ids("east")
    for e, version in enumerate(("agent/update_000040",) * 4):  # the checkpoint this run starts from
        store.record(
            [
                TracedTurn(
                    episode_id=f"e{e}",
                    turn_index=-1,
                    prompt_ids=prompt,
                    response_ids=[east],
                    logprobs=[-1.4],
                    model_version=version,
                )
                for _ in range(4)
            ]
        )
        store.add_feedback(f"e{e}", 1.0, success=True)
    store.close()
    config = load_config(
        ROOT / "configs" / "cue_corridor.yaml",
        [
            f"trainer.run_dir={tmp_path / 'run'}",
            "wandb.mode=disabled",
            f"data.traces.store={tmp_path / 'traces'}",
            "data.traces.fraction=0.5",
            "data.traces.staleness.decay=0.5",
            "trainer.total_updates=2",
            "trainer.num_envs=4",
            "trainer.turns_per_env=4",
            "critic_warmup.buffer_multiplier=0",
            "eval.at_start=false",
            "eval.at_end=false",
            "algorithm.mini_batch_turns=8",
        ],
    )
    result = train(config, console=Console(quiet=True))
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    updates = [m for m in logged if m.get("trace_turns")]
    assert result.updates == 2 and len(updates) == 2
    assert all(m["trace_turns"] == 8 and m["trace_episodes"] == 2 for m in updates)
    # the served weights are the run's starting point: the traces are on the lineage's first version at the
    # first update (weight 1), one update behind at the second (0.5; the live turns weigh 1)
    assert updates[0]["staleness_weight"] == 1.0 and 0.5 < updates[1]["staleness_weight"] < 1
    assert (tmp_path / "run" / "checkpoints" / "update_000002").is_dir()


def test_the_verl_path_refuses_a_traces_section():
    from verlog.integrations.verl.launch import compose_verl_config
    from verlog.integrations.verl.trainer import check_verl_config

    with pytest.raises(ConfigError, match="data.traces: training on recorded episodes runs on the embedded trainer"):
        check_verl_config(
            compose_verl_config(
                ROOT / "configs" / "verl_calculator.yaml",
                ["actor_rollout_ref.model.path=tiny", "verlog.data.traces.store=traces/"],
            )
        )


def test_trace_slots_keep_the_live_slots_whole_groups(tmp_path):
    from verlog.train.trace_batches import trace_slots

    settings = _traces_config(tmp_path, fraction=0.3)
    assert trace_slots(settings, 32) == 10
    assert trace_slots(settings, 32, group_size=8) == 16  # 22 live slots would split a group: 16 live
    assert trace_slots(_traces_config(tmp_path, fraction=1.0), 32, group_size=8) == 32
    assert trace_slots(_traces_config(tmp_path, fraction=0.01), 4) == 1  # at least one


def test_traces_train_a_graph_without_make_input_and_without_a_data_section(tmp_path):
    """The production ReAct calculator (no make_input, no verlog import) trained from recorded
    episodes alone: no rows, no reward section (feedback is the reward), no evaluation to play."""
    import yaml

    from verlog.models import load_tokenizer

    tokenizer = load_tokenizer("tiny")
    prompt = list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
    )
    answer = tokenizer("5", add_special_tokens=False)["input_ids"]
    store = open_store(tmp_path / "traces")
    for e in range(4):
        store.record(
            [
                TracedTurn(
                    episode_id=f"e{e}",
                    turn_index=-1,
                    prompt_ids=prompt,
                    response_ids=answer,
                    logprobs=[-1.0] * len(answer),
                    model_version="tiny",
                )
                for _ in range(2)
            ]
        )
        store.add_feedback(f"e{e}", 1.0 if e % 2 else 0.0)
    store.close()
    raw = yaml.safe_load((ROOT / "configs" / "calculator.yaml").read_text())
    raw.pop("reward")
    raw["data"] = {"traces": {"store": str(tmp_path / "traces")}}
    raw["multi_turn"]["langgraph"]["path"] = str(ROOT / "graphs" / "calculator.py")
    raw["trainer"] |= {
        "run_dir": str(tmp_path / "run"),
        "total_updates": 1,
        "num_envs": 8,
        "turns_per_env": 2,
        "save_every": 1,
    }
    raw["wandb"] = {"mode": "disabled"}
    config = config_from_dict(raw)
    assert config.eval.at_end  # asked for, and skipped with a note: there is nothing to play
    result = train(config, console=Console(quiet=True))
    logged = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert result.updates == 1 and logged["trace_turns"] == 16 and result.eval_end is None
    assert (tmp_path / "run" / "checkpoints" / "update_000001" / "actor").is_dir()
