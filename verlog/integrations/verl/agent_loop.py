"""``LangGraphAgentLoop``: verl's agent loop for verlog graphs (registered as ``verlog_langgraph``).

verl runs one agent loop per dataset row (and per ``rollout.n`` session) inside its agent-loop
worker processes. This one runs the graph file named by
``actor_rollout_ref.rollout.multi_turn.langgraph`` around a ``VerlogChatModel`` whose engine is
verl's ``LLMServerClient`` (``LLMServerEngine``), records every model call with verlog's
``TurnRecorder`` and returns **one ``AgentLoopOutput`` per turn** (``verlog.integrations.verl.samples``).

Two kinds of rows come from verlog's dataset (``verlog.integrations.verl.dataset``):

* **slot** rows (training): each is a persistent env slot. Its ``SlotRunner`` lives in the worker
  process across verl steps; each step the slot gives exactly ``verlog.turns_per_env`` turns,
  then its next model call is held until the next step (after the weights are updated), so an
  episode cut by the boundary continues under the new weights. The held call's prompt comes
  back as a bootstrap row whose critic value bootstraps the cut turn.
* **episode** rows (validation, or training with ``verlog.turns_per_env: null``): one whole
  episode from its seed; the last output's ``reward_score`` is the episode's return and its
  ``reward_extra_info`` has ``acc`` (success), so verl's validation metrics are win rates.

A failed episode (graph error, recursion limit, timeout, engine failure) yields no sample: an
episode row returns ``[]``; a slot drops the failed episode's turns, starts a new episode and
refills its quota, and counts the failure (``verlog/failed_episodes`` in the trainer's metrics).
A slot that fails ``verlog.max_consecutive_failures`` episodes in a row raises, and verl marks
the row's group as failed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, register

from verlog.graph_file import GraphFile, load_graph_file
from verlog.llm.chat_model import VerlogChatModel
from verlog.rollout.runner import run_episode
from verlog.rollout.slots import SlotRunner, TurnGate
from verlog.rollout.turn import Episode
from verlog.integrations.verl.engine import LLMServerEngine
from verlog.integrations.verl.samples import bootstrap_output, episode_summary, turn_output
from verlog.integrations.verl.settings import AGENT_NAME, AgentSpec, agent_spec

__all__ = ["AGENT_NAME", "LangGraphAgentLoop", "close_slots", "open_slots"]

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------- per-process resources


@functools.lru_cache(maxsize=8)
def _tokenizer(model_path: str, chat_template: str | None) -> Any:
    """The policy's tokenizer, loaded once per worker process (verlog's loader: the exact ids
    of verlog's own models; ``AutoTokenizer`` for every other folder)."""
    from verlog.models import load_tokenizer

    tokenizer = load_tokenizer(model_path)
    if chat_template:
        tokenizer.chat_template = chat_template
    return tokenizer


@functools.lru_cache(maxsize=8)
def _graph_file(path: str) -> GraphFile:
    return load_graph_file(path)


@dataclass
class _Slot:
    """A persistent env slot of this worker process: its runner and what its engine saw."""

    runner: SlotRunner
    #: the weights' versions (verl ``global_steps``) of the generations since the last batch
    steps: list[int] = field(default_factory=list)
    batches: int = 0


#: this process's env slots, by ``"{row index}:{session}"``; they outlive verl steps
_SLOTS: dict[str, _Slot] = {}
#: episodes started by slots that were closed (after repeated failures), so seeds go on
_EPISODES_STARTED: dict[str, int] = {}


def open_slots() -> list[str]:
    """The keys of the env slots alive in this process (for tests and debugging)."""
    return sorted(_SLOTS)


async def close_slots() -> None:
    """Stop every env slot of this process (their running episodes are cancelled)."""
    slots = list(_SLOTS.values())
    _SLOTS.clear()
    _EPISODES_STARTED.clear()
    await asyncio.gather(*(s.runner.aclose() for s in slots), return_exceptions=True)


# ---------------------------------------------------------------------- the agent loop


@register(AGENT_NAME)
class LangGraphAgentLoop(AgentLoopBase):
    """Runs a verlog graph file and returns its model calls as per-turn verl samples."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.spec: AgentSpec = agent_spec(self.config)
        chat_template = self.config.actor_rollout_ref.model.get("custom_chat_template", None)
        self.verlog_tokenizer = _tokenizer(self.spec.model_path, chat_template)
        self.graph_file = _graph_file(self.spec.multi_turn.langgraph.path)

    async def run(self, sampling_params: dict[str, Any], **row: Any) -> list[Any]:
        """One slot's share of a training batch, or one whole episode (see the module docstring)."""
        info = _row_extra(row)
        index = int(info.get("index", row.get("index", 0)))
        session = int(row.get("session_id", 0))
        call_id = f"{row.get('uid') or uuid.uuid4().hex}_{session}"
        if info.get("verlog_role") == "slot" and self.spec.settings.turns_per_env:
            return await self._run_slot(sampling_params, index, session, call_id, row)
        return await self._run_episode(sampling_params, index, session, call_id, row, info)

    # ------------------------------------------------------------------ pieces
    def _n(self) -> int:
        return max(1, self.spec.rollout_n)

    def _engine(self, prefix: str, on_output: Any = None) -> LLMServerEngine:
        return LLMServerEngine(
            self.server_manager, self.verlog_tokenizer, request_prefix=prefix,
            max_prompt_tokens=self.spec.prompt_length, max_response_tokens=self.spec.response_length,
            on_output=on_output,
        )

    def _chat_model(self, engine: Any, sampling_params: dict[str, Any]) -> VerlogChatModel:
        top_k = int(sampling_params.get("top_k", -1))
        return VerlogChatModel(
            engine=engine,
            tokenizer=self.verlog_tokenizer,
            model_name=self.spec.model_path,
            chat_template_kwargs=dict(self.spec.multi_turn.chat_template_kwargs),
            temperature=float(sampling_params.get("temperature", 1.0)),
            top_p=float(sampling_params.get("top_p", 1.0)),
            top_k=top_k if top_k > 0 else -1,
            max_tokens=self.spec.response_length,
        )

    def _graph(self, engine: Any, sampling_params: dict[str, Any]) -> Any:
        langgraph = self.spec.multi_turn.langgraph
        return self.graph_file.build(self._chat_model(engine, sampling_params), **langgraph.graph_kwargs)

    def _steps(self, seen: list[int], row: dict[str, Any]) -> tuple[int, int]:
        if seen:
            return min(seen), max(seen)
        fallback = int(row.get("global_steps", 1)) - 1  # the weights a sync step generates with
        return fallback, fallback

    # ------------------------------------------------------------------ slots (fixed-turn batches)
    async def _run_slot(
        self, sampling_params: dict[str, Any], index: int, session: int, call_id: str, row: dict[str, Any]
    ) -> list[Any]:
        key = f"{index}:{session}"
        slot = _SLOTS.get(key) or self._new_slot(key, index, session, sampling_params)
        slot.steps.clear()
        started = time.perf_counter()
        try:
            batch = await slot.runner.collect()
        except RuntimeError:
            # the slot failed too often in a row: drop it (a fresh one starts next step) and
            # let verl mark this group as failed
            _EPISODES_STARTED[key] = slot.runner.slots[0].episodes_started
            _SLOTS.pop(key, None)
            await slot.runner.aclose()
            raise
        slot.batches += 1
        prefix = slot.runner.gate.engine.request_prefix
        steps = self._steps(slot.steps, row)
        summary = episode_summary(batch.episodes, batch.failed)
        summary["seconds"] = time.perf_counter() - started
        turns = batch.turns[0]
        outputs = [
            turn_output(
                t, trajectory=call_id, position=i, episode_id=prefix + t.episode_id, steps=steps,
                summary=summary if i == 0 else None,
            )
            for i, t in enumerate(turns)
        ]
        last = turns[-1]
        if not last.done:  # the boundary cut the episode: its next prompt is waiting at the gate
            outputs.append(
                bootstrap_output(
                    batch.bootstrap_prompt_ids[0], self._pad_id(), trajectory=call_id, position=len(turns),
                    episode_id=prefix + last.episode_id, turn_index=last.turn_index + 1, steps=steps,
                )
            )
        return outputs

    def _new_slot(self, key: str, index: int, session: int, sampling_params: dict[str, Any]) -> _Slot:
        settings = self.spec.settings
        slot_id = index * self._n() + session  # over all rows and sessions
        stride = settings.num_envs * self._n()
        seen: list[int] = []
        engine = self._engine(f"{uuid.uuid4().hex[:8]}-s{index}.{session}-", on_output=_note_steps(seen))
        gate = TurnGate(engine, quota=settings.turns_per_env)
        graph_file = self.graph_file

        def make_input(j: int) -> Any:  # the slot's j-th episode
            return graph_file.episode_input(settings.seed + j * stride + slot_id)

        runner = SlotRunner(
            self._graph(gate, sampling_params), make_input, gate, num_envs=1,
            graph_config=self.spec.multi_turn.langgraph.graph_config, timeout_s=settings.episode_timeout_s,
            max_consecutive_failures=settings.max_consecutive_failures,
        )
        started = _EPISODES_STARTED.pop(key, 0)
        if started:
            runner.load_state_dict({"episodes_started": [started], "counters": runner.counters})
        slot = _Slot(runner, steps=seen)
        _SLOTS[key] = slot
        return slot

    def _pad_id(self) -> int:
        tok = self.verlog_tokenizer
        for candidate in (getattr(tok, "eos_token_id", None), getattr(tok, "pad_token_id", None)):
            if isinstance(candidate, int):
                return candidate
        return 0

    # ------------------------------------------------------------------ whole episodes
    async def _run_episode(
        self, sampling_params: dict[str, Any], index: int, session: int, call_id: str,
        row: dict[str, Any], info: dict[str, Any],
    ) -> list[Any]:
        settings = self.spec.settings
        evaluation = info.get("verlog_role") == "episode"
        if evaluation:
            seed = settings.eval_seed + index + session * settings.eval_episodes
        else:  # training rows without fixed-turn batching: fresh seeds every step
            step = int(row.get("global_steps", 1))
            seed = settings.seed + ((step - 1) * settings.num_envs + index) * self._n() + session
        seen: list[int] = []
        engine = self._engine(f"{uuid.uuid4().hex[:8]}-", on_output=_note_steps(seen))
        graph = self._graph(engine, sampling_params)
        episode = await run_episode(
            graph, self.graph_file.episode_input(seed), episode_id=f"seed{seed}",
            graph_config=self.spec.multi_turn.langgraph.graph_config, timeout_s=settings.episode_timeout_s,
        )
        if episode.failed or not episode.turns:
            logger.warning("verlog episode seed %s failed (%s): %s", seed, episode.status, episode.error)
            return []  # never a sample
        steps = self._steps(seen, row)
        summary = episode_summary([episode], [])
        outputs = [
            turn_output(
                t, trajectory=call_id, position=i, episode_id=engine.request_prefix + episode.episode_id,
                steps=steps, summary=summary if i == 0 else None,
            )
            for i, t in enumerate(episode.turns)
        ]
        final = outputs[-1]
        final.reward_score = float(episode.total_reward) if evaluation else final.reward_score
        final.extra_fields["reward_extra_info"] = _episode_metrics(episode)
        return outputs


def _row_extra(row: dict[str, Any]) -> dict[str, Any]:
    extra = row.get("extra_info")
    extra = getattr(extra, "data", extra)
    return dict(extra) if isinstance(extra, dict) else {}


def _episode_metrics(episode: Episode) -> dict[str, float]:
    """verl's validation metrics of one episode (``acc``: success, as verl's win-rate key)."""
    info = episode.info
    success = float(bool(info.get("success", False)))
    return {
        "acc": success,
        "episode_return": float(episode.total_reward),
        "episode_turns": float(len(episode.turns)),
        "progression": float(info.get("progression", success)),
    }


def _note_steps(seen: list[int]) -> Any:
    """A ``LLMServerEngine.on_output`` callback collecting the weights' versions it sees."""

    def note(out: Any) -> None:
        step = (getattr(out, "extra_fields", None) or {}).get("max_global_steps")
        if isinstance(step, int):
            seen.append(step)

    return note
