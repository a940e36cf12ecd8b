"""``LangGraphAgentLoop``: verl's agent loop for verlog graphs (registered as ``verlog_langgraph``).

verl runs one agent loop per dataset row (and per ``rollout.n`` session) inside its agent-loop
worker processes. This one runs the graph file named by
``actor_rollout_ref.rollout.multi_turn.langgraph`` around a ``VerlogChatModel`` whose engine is
verl's ``LLMServerClient`` (``LLMServerEngine``), records every model call with verlog's
``TurnRecorder`` and returns **one ``AgentLoopOutput`` per turn** (``verlog.integrations.verl.samples``).

Two kinds of rows come from verlog's dataset (``verlog.integrations.verl.dataset``):

* **slot** rows (training): each is a persistent env slot. Its ``SlotRunner`` (one slot, built
  around its gated engine) lives in the worker process across verl steps; each step the slot
  gives exactly ``verlog.turns_per_env`` turns, then its next model call is held until the next
  step (after the weights are updated), so an episode cut by the boundary continues under the
  new weights. The held call's prompt comes back as a bootstrap row whose critic value
  bootstraps the cut turn. Slot ``i`` (``i = row * rollout.n + session``) is in group
  ``g = i // verlog.group_size``, and its ``j``-th episode plays ``slot_seed(seed, j, g, G)`` (``G``
  groups): the slots of a group play the same seeds, the groups grpo, rloo and gigpo compare. The
  episodes a slot has started are reported with each sample (the trainer saves them with its
  checkpoints) and a slot created afresh goes on from the count its row carries.
* **episode** rows (validation, or training with ``verlog.turns_per_env: null``): one whole
  episode from its seed; the last output's ``reward_score`` is the episode's return and its
  ``reward_extra_info`` has ``acc`` (success), so verl's validation metrics are win rates.

Graph nodes may be ``def`` (``model.invoke``) or ``async def`` (``model.ainvoke``): the slot
runner and the episode runner serve both. A truncated turn whose environment reported the
next prompt gets a next-state row (its value bootstraps the turn). A training turn sampled at
another temperature than ``actor_rollout_ref.rollout.temperature`` is refused
(``TurnTemperatureError``): verl's trainer scores every row at that one temperature.

**Images.** With a vision-language model (a folder with a processor config), the chat model
renders image blocks through verlog's processor (the turn's ids are the processor's expanded
ids) and the engine sends the images to verl's server as ``image_data``; the turn's sample
carries them as ``multi_modal_data`` (``verlog.integrations.verl.samples``), from which verl's
worker computes the row's pixel inputs and positions with *its* processor. Where verl cannot
(its ``hf_processor`` builds no processor for this model: verl 0.9.1 knows Qwen2-VL, Qwen2.5-VL,
Qwen3-VL, GLM-4V, GLM-4.6V, Mllama and Gemma4; or ``data.mm_processor_kwargs`` would make its
pixels differ from the ones verlog expanded the prompt for), every model call with images fails
its episode with the reason (``images_refused``), and a row with images raises
``ImageTurnError``: images are never dropped silently. Each image is first made what verl's own
agent loops make of it (``process_vision_info``: RGB on white, resized to whole image tokens;
``verlog.integrations.verl.vision_info``), so their pixels and verlog's are the same.

A failed episode (graph error, recursion limit, timeout, engine failure) yields no sample: an
episode row returns ``[]``; a slot drops the failed episode's turns in the batch being
collected, starts a new episode and refills its quota, and counts the failure
(``verlog/failed_episodes`` in the trainer's metrics). A slot that fails
``verlog.max_consecutive_failures`` episodes in a row raises ``SlotFailureError``, and verl marks
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

from verlog.config import SplitName
from verlog.episodes import EpisodePlan, build_scorer
from verlog.graph_file import GraphFile, load_graph_file
from verlog.integrations.verl.engine import LLMServerEngine
from verlog.integrations.verl.samples import (
    bootstrap_output,
    episode_summary,
    next_state_output,
    turn_output,
)
from verlog.integrations.verl.settings import AGENT_NAME, AgentSpec, agent_spec
from verlog.integrations.verl.vision_info import image_patch_size, vision_info_image
from verlog.llm.chat_model import VerlogChatModel
from verlog.rewards import RewardError
from verlog.rollout.interrupts import InterruptResponder
from verlog.rollout.recorder import TurnRecorder
from verlog.rollout.runner import run_episode
from verlog.rollout.schedule import slot_seed
from verlog.rollout.slots import SlotFailureError, SlotRunner
from verlog.rollout.turn import Episode, Turn
from verlog.step_info import episode_won
from verlog.tokens import pad_token_id

__all__ = [
    "AGENT_NAME",
    "ImageTurnError",
    "LangGraphAgentLoop",
    "TurnTemperatureError",
    "check_turn_temperature",
    "close_slots",
    "slot_key",
    "slot_seed",
]

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
def _processor(model_path: str, chat_template: str | None) -> Any:
    """verlog's processor of a vision-language model (None for a text model, or one whose
    processor does not load: its prompts then take no images), around the tokenizer of
    ``_tokenizer``; loaded once per worker process."""
    from verlog.models import load_processor

    try:
        return load_processor(model_path, _tokenizer(model_path, chat_template))
    except Exception as exc:  # e.g. a processor class this transformers cannot build here
        logger.warning("verlog: the processor of %s does not load (%s): its prompts take no images", model_path, exc)
        return None


@functools.lru_cache(maxsize=8)
def _graph_file(path: str) -> GraphFile:
    return load_graph_file(path)


#: this process's episode plans (tasks and reward scorer) by (graph path, settings, split)
_PLANS: dict[tuple[str, str, str], EpisodePlan] = {}


def _plan(spec: AgentSpec, split: SplitName, chat_model_for: Any) -> EpisodePlan:
    """The tasks of ``split`` (seeds, or ``verlog.data`` rows) and the scorer of ``verlog.reward``,
    built once per worker process (reward files imported once, judges' caches shared)."""
    key = (spec.multi_turn.langgraph.path, spec.settings.model_dump_json(), split)
    if key not in _PLANS:
        settings = spec.settings
        scorer = build_scorer(settings, chat_model_for=chat_model_for)
        _PLANS[key] = EpisodePlan(settings, _graph_file(spec.multi_turn.langgraph.path), split, scorer=scorer)
    return _PLANS[key]


@dataclass
class _Slot:
    """A persistent env slot of this worker process: its runner and what its engine saw."""

    runner: SlotRunner
    engine: LLMServerEngine
    #: the weights' versions (verl ``global_steps``) of the generations since the last batch
    steps: list[int] = field(default_factory=list)
    batches: int = 0


#: this process's env slots, by ``"{row index}:{session}"``; they outlive verl steps
_SLOTS: dict[str, _Slot] = {}
#: episodes started by slots that were closed (after repeated failures), so seeds go on
_EPISODES_STARTED: dict[str, int] = {}


def slot_key(index: int, session: int) -> str:
    """The name of the env slot of dataset row ``index``, ``rollout.n`` session ``session``."""
    return f"{index}:{session}"


async def close_slots() -> None:
    """Stop every env slot of this process (their running episodes are cancelled)."""
    slots = list(_SLOTS.values())
    _SLOTS.clear()
    _EPISODES_STARTED.clear()
    await asyncio.gather(*(s.runner.aclose() for s in slots), return_exceptions=True)


class TurnTemperatureError(ValueError):
    """A turn was sampled at a temperature verl's trainer would not score it at."""


class ImageTurnError(ValueError):
    """A row has images that verl could not train with their pixels (``images_refused``)."""


#: the vision-language processors verl 0.9.1's ``hf_processor`` builds (others come back None)
VERL_PROCESSORS = "Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V, GLM-4.6V, Mllama and Gemma4"


def images_refused(verl_processor: Any, verlog_processor: Any, mm_processor_kwargs: Any) -> str | None:
    """Why verl cannot train image turns of this model (``None``: it can).

    ``verl_processor``: the processor verl's worker built (``None`` where verl has none for the
    model: its worker would keep the prompt's image placeholders and drop the pixels);
    ``verlog_processor``: the one verlog renders prompts with (named in the message);
    ``mm_processor_kwargs``: verl's ``data.mm_processor_kwargs``, applied by verl's server and
    worker but not by verlog's rendering (the pixels, and so the number of image tokens, would
    differ from the prompt's)."""
    if verl_processor is None:
        name = type(verlog_processor).__name__ if verlog_processor is not None else "none"
        return (
            f"verl has no processor for this model (verl builds {VERL_PROCESSORS} processors; this model's is "
            f"{name}): its agent-loop worker would keep the prompt's image placeholders and drop the pixels. "
            "Train image turns of this model with verlog's own trainer (verlog train CONFIG)"
        )
    kwargs = dict(mm_processor_kwargs or {})
    if kwargs:
        return (
            f"data.mm_processor_kwargs={kwargs} is set: verl's server and trainer would process the images with "
            "those settings, verlog expanded the prompt's image placeholders with the processor's own. Put them in "
            "the model folder's processor config and leave data.mm_processor_kwargs empty"
        )
    return None


def check_turn_temperature(turn: Turn, rollout_temperature: float) -> None:
    """Refuse a training turn sampled at another temperature than verl scores every row at.

    verl 0.9.1's trainer recomputes old logprobs, the ratio, KL and entropy of a batch at one
    temperature (``actor_rollout_ref.rollout.temperature``, sent to its workers as a single
    number), so a node bound with ``model.bind(temperature=...)`` to another value would be
    trained with the wrong logprobs. Greedy calls (temperature 0) are scored at 1, as verl scores
    a temperature-0 rollout.
    """
    scored = float(rollout_temperature) if rollout_temperature > 0 else 1.0
    if abs(turn.scoring_temperature - scored) > 1e-6:
        raise TurnTemperatureError(
            f"node {turn.node or '?'!r} sampled at temperature {turn.temperature:g} but verl scores every turn at "
            f"actor_rollout_ref.rollout.temperature={rollout_temperature:g}: under verl, bind the same temperature "
            "in every node (or train with verlog's own trainer, which scores each turn at its own)"
        )


# ---------------------------------------------------------------------- the agent loop


@register(AGENT_NAME)
class LangGraphAgentLoop(AgentLoopBase):
    """Runs a verlog graph file and returns its model calls as per-turn verl samples."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.spec: AgentSpec = agent_spec(self.config)
        chat_template = self.config.actor_rollout_ref.model.get("custom_chat_template", None)
        self.verlog_tokenizer = _tokenizer(self.spec.model_path, chat_template)
        self.verlog_processor = _processor(self.spec.model_path, chat_template)
        self.graph_file = _graph_file(self.spec.multi_turn.langgraph.path)
        #: why image turns cannot train here (None: they can), and the placeholders a response must not hold
        self.images_refused = (
            None
            if self.verlog_processor is None
            else images_refused(self.processor, self.verlog_processor, self.mm_processor_kwargs)
        )
        self.image_token_ids = _placeholder_ids(self.processor)

    async def run(self, sampling_params: dict[str, Any], **row: Any) -> list[Any]:
        """One slot's share of a training batch, or one whole episode (see the module docstring)."""
        info = _row_extra(row)
        index = int(info.get("index", row.get("index", 0)))
        session = int(row.get("session_id", 0))
        call_id = f"{row.get('uid') or uuid.uuid4().hex}_{session}"
        if info.get("verlog_role") == "slot" and self.spec.settings.turns_per_env:
            return await self._run_slot(sampling_params, index, session, call_id, row, info)
        return await self._run_episode(sampling_params, index, session, call_id, row, info)

    # ------------------------------------------------------------------ pieces
    def _n(self) -> int:
        return max(1, self.spec.rollout_n)

    def _engine(self, prefix: str, on_output: Any = None) -> LLMServerEngine:
        return LLMServerEngine(
            self.server_manager,
            self.verlog_tokenizer,
            request_prefix=prefix,
            max_prompt_tokens=self.spec.prompt_length,
            max_response_tokens=self.spec.response_length,
            on_output=on_output,
            server=self.spec.rollout_name,
            images_refused=self.images_refused,
            image_token_ids=self.image_token_ids,
        )

    def _chat_model(self, engine: Any, sampling_params: dict[str, Any]) -> VerlogChatModel:
        top_k = int(sampling_params.get("top_k", -1))
        return VerlogChatModel(
            engine=engine,
            tokenizer=self.verlog_tokenizer,
            processor=self.verlog_processor,
            image_transform=(
                None
                if self.verlog_processor is None
                else functools.partial(vision_info_image, patch_size=image_patch_size(self.processor))
            ),
            model_name=self.spec.model_path,
            chat_template_kwargs=dict(self.spec.multi_turn.chat_template_kwargs),
            temperature=float(sampling_params.get("temperature", 1.0)),
            top_p=float(sampling_params.get("top_p", 1.0)),
            top_k=top_k if top_k > 0 else -1,
            max_tokens=self.spec.response_length,
        )

    def _graph(self, model: VerlogChatModel) -> Any:
        langgraph = self.spec.multi_turn.langgraph
        return self.graph_file.build(model, **langgraph.graph_kwargs)

    def _episodes(self, split: SplitName, sampling_params: dict[str, Any]) -> EpisodePlan:
        """The tasks and reward scorer of ``split``; a judge with ``embedded: policy`` asks verl's
        rollout server (the policy's current weights) outside any episode: never a training turn."""

        def chat_model_for(name: str) -> Any:
            return self._chat_model(self._engine(f"judge-{uuid.uuid4().hex[:8]}-"), sampling_params)

        return _plan(self.spec, split, chat_model_for)

    def _steps(self, seen: list[int], row: dict[str, Any]) -> tuple[int, int]:
        if seen:
            return min(seen), max(seen)
        fallback = int(row.get("global_steps", 1)) - 1  # the weights a sync step generates with
        return fallback, fallback

    def _training_outputs(
        self,
        turns: list[Turn],
        *,
        call_id: str,
        prefix: str,
        steps: tuple[int, int],
        summary: dict[str, Any],
        seeds: list[int],
        starts_episode: bool,
    ) -> list[Any]:
        """The rows of a training sample: one per turn (time order), then one value-query row per
        truncated turn whose next prompt is known (``next_state_output``).

        ``seeds``: each turn's episode's seed; ``starts_episode``: whether the first turn opens its
        episode (False when it continues one from the previous batch); a later turn opens one
        when the turn before it ended the previous episode."""
        for turn in turns:
            check_turn_temperature(turn, self.spec.rollout_temperature)
        outputs = [
            turn_output(
                t,
                trajectory=call_id,
                position=i,
                episode_id=prefix + t.episode_id,
                steps=steps,
                summary=summary if i == 0 else None,
                seed=seeds[i],
                starts_episode=starts_episode if i == 0 else turns[i - 1].episode_id != t.episode_id,
            )
            for i, t in enumerate(turns)
        ]
        for turn in turns:
            if turn.truncated and not turn.terminated and turn.next_prompt_ids:
                outputs.append(
                    next_state_output(
                        turn.next_prompt_ids,
                        self._pad_id(),
                        trajectory=call_id,
                        position=len(outputs),
                        episode_id=prefix + turn.episode_id,
                        turn_index=turn.turn_index,
                        steps=steps,
                    )
                )
        return outputs

    # ------------------------------------------------------------------ slots (fixed-turn batches)
    async def _run_slot(
        self,
        sampling_params: dict[str, Any],
        index: int,
        session: int,
        call_id: str,
        row: dict[str, Any],
        info: dict[str, Any],
    ) -> list[Any]:
        key = slot_key(index, session)
        slot = _SLOTS.get(key) or self._new_slot(key, index, session, sampling_params, info)
        slot.steps.clear()
        started = time.perf_counter()
        try:
            batch = await slot.runner.collect()
        except SlotFailureError:
            # the slot failed too often in a row: drop it (a fresh one starts next step, its seeds
            # going on) and let verl mark this group as failed
            _EPISODES_STARTED[key] = slot.runner.episodes_started[0]
            _SLOTS.pop(key, None)
            await slot.runner.aclose()
            raise
        slot.batches += 1
        prefix = slot.engine.request_prefix
        steps = self._steps(slot.steps, row)
        summary = episode_summary(batch.episodes, batch.failed)
        summary["seconds"] = time.perf_counter() - started
        summary["episodes_started"] = {key: slot.runner.episodes_started[0]}
        summary["in_flight"] = {key: slot.runner.state_dict()["in_flight"][0]}
        turns = batch.turns[0]
        # the runner counts its one slot's episodes (its "seeds" are j = 0, 1, ...): the real seeds
        seeds = [self._slot_seed(index, session, j) for j in batch.seeds[0]]
        outputs = self._training_outputs(
            turns,
            call_id=call_id,
            prefix=prefix,
            steps=steps,
            summary=summary,
            seeds=seeds,
            starts_episode=batch.starts_episode[0],
        )
        last = turns[-1]
        if not last.done:  # the boundary cut the episode: its next prompt is waiting at the gate
            outputs.append(
                bootstrap_output(
                    batch.bootstrap_prompt_ids[0],
                    self._pad_id(),
                    trajectory=call_id,
                    position=len(outputs),
                    episode_id=prefix + last.episode_id,
                    turn_index=last.turn_index + 1,
                    steps=steps,
                    images=batch.slot_images()[0],
                )
            )
        return self._checked_images(outputs)

    def _new_slot(
        self, key: str, index: int, session: int, sampling_params: dict[str, Any], info: dict[str, Any]
    ) -> _Slot:
        settings = self.spec.settings
        seen: list[int] = []
        engine = self._engine(f"{uuid.uuid4().hex[:8]}-s{index}.{session}-", on_output=_note_steps(seen))
        plan = self._episodes("train", sampling_params)
        models: list[VerlogChatModel] = []

        def build(gated: Any) -> Any:  # the graph around the runner's gated view of the engine
            models.append(self._chat_model(gated, sampling_params))
            return self._graph(models[-1])

        def make_input(j: int) -> Any:  # the slot's j-th episode: a seed, or a training row's task
            return plan.input(self._slot_seed(index, session, j))

        async def score(episode: Episode, j: int) -> None:  # reward functions and judges, as it ends
            await plan.score(episode, self._slot_seed(index, session, j))

        runner = SlotRunner(
            engine,
            build,
            make_input,
            num_envs=1,
            turns_per_env=int(settings.turns_per_env or 1),
            graph_config=self.spec.multi_turn.langgraph.graph_config,
            timeout_s=settings.episode_timeout_s,
            max_consecutive_failures=settings.max_consecutive_failures,
            render_prompt=lambda messages, tools: models[-1].render_prompt_ids(messages, tools),
            on_episode_end=score,
            slot_threads=settings.slot_threads,
            interrupts=InterruptResponder.from_config(self.spec.multi_turn.langgraph),
            keep_discarded=self.spec.multi_turn.langgraph.train_discarded_calls,
        )
        # episodes this slot started before: here before it was dropped, or (after a resume) in
        # the checkpoint, which the trainer hands to the dataset's rows with the round the slot had
        # in flight, played whole again first (so an epoch covers every row, killed or not; a slot
        # dropped for failing goes on with its next seeds)
        restored = (info.get("verlog_episodes_started") or {}).get(str(session), 0)
        dropped = _EPISODES_STARTED.pop(key, None)
        started = max(dropped or 0, int(restored or 0))
        in_flight = None if dropped is not None else (info.get("verlog_in_flight") or {}).get(str(session))
        if started or in_flight is not None:
            runner.load_state_dict(
                {
                    **runner.state_dict(),
                    "episodes_started": [started],
                    "in_flight": [None if in_flight is None else int(in_flight)],
                }
            )
        slot = _Slot(runner, engine, steps=seen)
        _SLOTS[key] = slot
        return slot

    def _group(self, index: int, session: int) -> int:
        """The slot group of dataset row ``index``'s session ``session``."""
        return (index * self._n() + session) // self.spec.settings.group_size

    def _slot_seed(self, index: int, session: int, j: int) -> int:
        """The seed of the ``j``-th episode of row ``index``'s session ``session`` (its group's)."""
        return slot_seed(self.spec.settings.seed, j, self._group(index, session), self.spec.num_groups)

    def _pad_id(self) -> int:
        return pad_token_id(self.verlog_tokenizer)

    def _checked_images(self, outputs: list[Any]) -> list[Any]:
        """``outputs``, refused (``ImageTurnError``) if a row has images verl could not train with
        their pixels (e.g. a held prompt with pictures, which never reached the engine)."""
        if self.images_refused is not None and any(o.multi_modal_data for o in outputs):
            raise ImageTurnError(f"a row's prompt has images, and {self.images_refused}")
        return outputs

    # ------------------------------------------------------------------ whole episodes
    async def _run_episode(
        self,
        sampling_params: dict[str, Any],
        index: int,
        session: int,
        call_id: str,
        row: dict[str, Any],
        info: dict[str, Any],
    ) -> list[Any]:
        settings = self.spec.settings
        evaluation = info.get("verlog_role") == "episode"
        rows = settings.data is not None
        if evaluation:  # validation episode i: seed eval_seed + i, or row i of data.validation
            count = settings.validation_episodes()
            seed = (0 if rows else settings.eval_seed) + index + session * count
            if rows and index + session * count >= count:
                return []  # the split has no more rows for this session
        else:  # training rows without fixed-turn batching: fresh seeds every step, one per slot group
            step = int(row.get("global_steps", 1))
            seed = settings.seed + (step - 1) * self.spec.num_groups + self._group(index, session)
        plan = self._episodes("validation" if evaluation and rows else "train", sampling_params)
        seen: list[int] = []
        engine = self._engine(f"{uuid.uuid4().hex[:8]}-", on_output=_note_steps(seen))
        model = self._chat_model(engine, sampling_params)
        episode_id = f"{plan.split}-row{plan.key(seed)}" if rows else f"seed{seed}"
        recorder = TurnRecorder(
            episode_id,
            render_prompt=model.render_prompt_ids,
            keep_discarded=self.spec.multi_turn.langgraph.train_discarded_calls,
        )
        episode = await run_episode(
            self._graph(model),
            plan.input(seed),
            episode_id=episode_id,
            graph_config=self.spec.multi_turn.langgraph.graph_config,
            timeout_s=settings.episode_timeout_s,
            recorder=recorder,
            interrupts=InterruptResponder.from_config(self.spec.multi_turn.langgraph),
        )
        if not episode.failed and episode.turns:
            try:
                await plan.score(episode, seed)
            except RewardError as exc:  # a reward function failed: the episode is failed, not scored 0
                episode.status, episode.error = "error", str(exc)
        if episode.failed or not episode.turns:
            logger.warning("verlog episode %s failed (%s): %s", episode_id, episode.status, episode.error)
            return []  # never a sample
        steps = self._steps(seen, row)
        summary = episode_summary([episode], [])
        if evaluation:  # validation trains nothing: every node may sample its own way
            outputs = [
                turn_output(
                    t,
                    trajectory=call_id,
                    position=i,
                    episode_id=engine.request_prefix + episode.episode_id,
                    steps=steps,
                    summary=summary if i == 0 else None,
                )
                for i, t in enumerate(episode.turns)
            ]
        else:
            outputs = self._training_outputs(
                episode.turns,
                call_id=call_id,
                prefix=engine.request_prefix,
                steps=steps,
                summary=summary,
                seeds=[seed] * len(episode.turns),
                starts_episode=True,
            )
        final = outputs[len(episode.turns) - 1]
        final.reward_score = float(episode.total_reward) if evaluation else final.reward_score
        # verl reads the episode's metrics from the last output (a next-state row may follow the last turn)
        for output in {id(final): final, id(outputs[-1]): outputs[-1]}.values():
            output.extra_fields["reward_extra_info"] = _episode_metrics(episode)
        return self._checked_images(outputs)


def _placeholder_ids(processor: Any) -> tuple[int, ...]:
    """The image and video placeholder ids of verl's processor (none without one)."""
    from verl.utils.tokenizer import get_processor_token_id

    found = (get_processor_token_id(processor, name) for name in ("image", "video"))
    return tuple(i for i in found if i is not None)


def _row_extra(row: dict[str, Any]) -> dict[str, Any]:
    extra = row.get("extra_info")
    extra = getattr(extra, "data", extra)
    return dict(extra) if isinstance(extra, dict) else {}


def _episode_metrics(episode: Episode) -> dict[str, float]:
    """verl's validation metrics of one episode (``acc``: success, as verl's win-rate key)."""
    info = episode.info
    success = float(episode_won(info))
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
