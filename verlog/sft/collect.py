"""Demonstrations: episodes of the user's graph, played by a source, kept by outcome, stored.

Each source of ``sft.demonstrations`` becomes a list of :class:`Demonstration` episodes:

* ``scripted`` and ``teacher``: the graph plays its episodes (seeds, or the split's rows) with verlog's
  chat model on a :class:`~verlog.sft.engine.DemonstrationEngine`, so the prompts are rendered by
  the policy's chat template and the answers encoded by its tokenizer;
* ``policy``: the graph plays with the policy itself on the embedded engine (its own ids);
* ``traces``: recorded production episodes (``verlog serve-model --record``) with feedback, trained as
  they were recorded: their ids are the served model's, so they suit a policy of the same tokenizer
  (a checkpoint of the same base).

The reward section scores every played episode as training does; a failed episode (the graph
raised, a demonstrator could not answer, a reward failed) is counted and never kept. What is kept
is written to ``<sft.run_dir>/demonstrations/*.jsonl`` (one episode a line), so a resumed run trains
on the same demonstrations.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from verlog.config import ConfigError, DemonstrationsConfig, VerlogConfig
from verlog.rollout.turn import Episode, Turn
from verlog.step_info import SUCCESS_KEY, episode_outcome

__all__ = ["Demonstration", "collect", "kept", "read_demonstrations", "source_config", "write_demonstrations"]

#: episodes a seed-made source plays when ``episodes`` is not given
DEFAULT_EPISODES = 256


@dataclass
class Demonstration:
    """One kept episode: its turns (prompt and answer ids, rewards, ends, images) and where it
    came from (``source``: ``scripted``, ``teacher``, ``traces``, ``policy``; ``key``: its seed, row
    or recorded episode id)."""

    episode_id: str
    source: str
    key: Any
    episode_return: float
    success: bool | None
    turns: list[Turn] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "episode_id": self.episode_id,
            "source": self.source,
            "key": self.key,
            "return": self.episode_return,
            "success": self.success,
            "turns": [
                {
                    "prompt_ids": t.prompt_ids,
                    "response_ids": t.response_ids,
                    "reward": t.reward,
                    "terminated": t.terminated,
                    "truncated": t.truncated,
                    "images": list(t.images),
                    "node": t.node,
                    **({"constraint": t.constraint, "grammar": t.grammar} if t.constraint else {}),
                }
                for t in self.turns
            ],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Demonstration":
        turns = [
            Turn(
                episode_id=data["episode_id"],
                turn_index=i,
                prompt_ids=list(t["prompt_ids"]),
                response_ids=list(t["response_ids"]),
                logprobs=[0.0] * len(t["response_ids"]),
                reward=float(t["reward"]),
                terminated=bool(t["terminated"]),
                truncated=bool(t["truncated"]),
                images=tuple(t.get("images") or ()),
                node=t.get("node"),
                constraint=t.get("constraint"),
                grammar=t.get("grammar"),
            )
            for i, t in enumerate(data["turns"])
        ]
        return cls(data["episode_id"], data["source"], data["key"], float(data["return"]), data["success"], turns)


def write_demonstrations(path: Path, demonstrations: Iterable[Demonstration]) -> None:
    """Write ``demonstrations`` to ``path`` (JSON lines), atomically: a kill leaves no half file."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        for demo in demonstrations:
            f.write(json.dumps(demo.to_json()) + "\n")
    os.replace(tmp, path)


def read_demonstrations(path: Path) -> list[Demonstration]:
    return [Demonstration.from_json(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def kept(episode: Episode, source: DemonstrationsConfig, episode_return: float | None = None) -> bool:
    """Whether an episode that ended well is a demonstration under ``source``'s filter: its return
    reaches ``min_reward`` (if set) and, with ``keep: success``, it was won (an episode whose game
    or reward says nothing of success counts as won when it reached ``min_reward``)."""
    value = episode.total_reward if episode_return is None else episode_return
    if source.min_reward is not None and value < source.min_reward:
        return False
    if source.keep == "all":
        return True
    won = episode_outcome(episode.info)
    return bool(won) if won is not None else source.min_reward is not None


def source_config(config: VerlogConfig, source: DemonstrationsConfig) -> VerlogConfig:
    """``config`` with the graph settings of ``source`` (its ``graph_kwargs`` over the config's)."""
    out = config.model_copy(deep=True)
    langgraph = out.multi_turn.langgraph
    langgraph.graph_kwargs = {**langgraph.graph_kwargs, **source.graph_kwargs}
    return out


async def collect(
    config: VerlogConfig,
    source: DemonstrationsConfig,
    *,
    name: str,
    policy_engine: Any = None,
    on_episode: Callable[[Episode], None] | None = None,
) -> tuple[list[Demonstration], list[Episode]]:
    """Play (or read) ``source``'s episodes; returns the demonstrations kept and every episode
    played (the failed and the rejected included, for the counts). ``policy_engine``: the engine
    of the policy being trained (``source: policy``)."""
    if source.source == "traces":
        return _from_traces(source, name), []
    from verlog.agent import load_agent
    from verlog.models import load_tokenizer

    played_config = source_config(config, source)
    tokenizer = load_tokenizer(config.model.path)
    engine = policy_engine
    if source.source != "policy":
        from verlog.sft.engine import DemonstrationEngine

        engine = DemonstrationEngine(demonstrator_of(source), tokenizer)
    elif engine is None:
        raise ValueError("source policy plays with the policy's engine: give policy_engine")
    agent = load_agent(played_config, engine=engine)
    episodes_n = source.episodes or (None if config.data is not None else DEFAULT_EPISODES)
    size = _rows_of(played_config, source) if config.data is not None else None
    if episodes_n is None:
        episodes_n = size
    task_of: dict[str, Any] = {}

    def started(episode_id: str, task: Any) -> None:
        task_of[episode_id] = task.key
        if engine is not policy_engine:
            engine.begin(episode_id, task)

    def ended(episode: Episode) -> None:
        if engine is not policy_engine:
            engine.end(episode.episode_id)
        if on_episode is not None:
            on_episode(episode)

    episodes = await agent.rollout(
        int(episodes_n),
        first_seed=source.seed,
        split=source.split,
        on_start=started,
        on_episode=ended,
        concurrency=source.concurrency,
    )
    demos = [
        Demonstration(
            episode_id=f"{name}/{e.episode_id}",
            source=name,
            key=task_of.get(e.episode_id),
            episode_return=e.total_reward,
            success=episode_outcome(e.info),
            turns=e.turns,
        )
        for e in episodes
        if not e.failed and e.turns and kept(e, source)
    ]
    return demos, episodes


def _rows_of(config: VerlogConfig, source: DemonstrationsConfig) -> int:
    from verlog.data import split_rows

    if config.data is None or config.data.split(source.split) is None:
        raise ConfigError(f"sft.demonstrations: split {source.split!r} is not in the data section")
    return max(0, len(split_rows(config, source.split)) - source.seed)


def demonstrator_of(source: DemonstrationsConfig) -> Any:
    """The demonstrator a ``scripted`` or ``teacher`` source names."""
    from verlog.sft import demonstrators as d

    if source.source == "teacher":
        assert source.endpoint is not None
        from verlog.traces.episode_model import episode_chat_openai

        endpoint = source.endpoint
        key = os.environ.get(endpoint.api_key_env) if endpoint.api_key_env else None
        if endpoint.api_key_env and not key:
            raise ConfigError(
                f"sft.demonstrations: the teacher's key is read from ${endpoint.api_key_env}, which is not set"
            )
        chat = episode_chat_openai(
            base_url=endpoint.base_url,
            model=endpoint.model,
            api_key=key or "none",
            temperature=source.temperature,
            **({"max_tokens": source.max_tokens} if source.max_tokens else {}),
        )
        return d.Teacher(chat)
    if source.agent == "game":
        return d.GameBot()
    if source.agent == "answer":
        return d.RowAnswer(source.answer_column)
    from verlog.rewards.functions import load_function

    return d.FunctionAgent(load_function(source.agent, where="sft.demonstrations.agent", what="agent file"))


def _from_traces(source: DemonstrationsConfig, name: str) -> list[Demonstration]:
    """The recorded episodes of ``source.store`` with feedback that pass the filter (their feedback
    reward as the return, their feedback's success), turns as recorded."""
    from verlog.traces import TraceStoreError, open_store

    assert source.store is not None
    try:
        store = open_store(source.store, create=False)
    except (TraceStoreError, FileNotFoundError) as exc:
        raise ConfigError(f"sft.demonstrations: store {source.store!r}: {exc}") from None
    demos = []
    with store:
        for record in store.episodes(with_feedback=True):
            turns = store.turns(record.episode_id)
            if not turns:
                continue
            # the episode's feedback is paid on its last turn, which ends it (as training from traces does)
            turns[-1].reward += record.reward or 0.0
            turns[-1].terminated = True
            if record.success is not None:
                turns[-1].info = {**turns[-1].info, SUCCESS_KEY: record.success}
            episode = Episode(record.episode_id, list(turns))
            if kept(episode, source, episode.total_reward):
                key = record.episode_id
                demos.append(
                    Demonstration(f"{name}/{key}", name, key, episode.total_reward, record.success, episode.turns)
                )
    return demos
