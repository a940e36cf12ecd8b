"""The embedded trainer: ``verlog train CONFIG`` — multi-turn PPO on a LangGraph graph, in one process.

One update, top to bottom:

1. **rollout** — ``num_envs`` env slots play the graph (seeds, or the training rows of the data
   section in shuffled epochs); the embedded engine that answers their model calls runs the
   actor's own weights. An episode that ends is scored by the reward section's functions and
   judges before its turns can enter a batch. ``SlotRunner.collect`` returns exactly
   ``turns_per_env`` turns per slot, plus the prompt each slot holds at the boundary; with a
   group estimator and ``group_size`` > 1 it plays whole groups instead (a slot waiting for its
   group-mates gives fewer turns; only groups played whole in the batch are compared, the others
   are dropped whole and their rows played again); ranking judges then score the batch's groups.
2. **score** — old logprobs (teacher-forced), the critic's values (and the held prompts' values
   for cut episodes), KL-in-reward to the reference policy, dual-discount GAE, whitening.
3. **update** — PPO epochs over shuffled mini-batches (token-budget micro-batches), actor and
   critic, holding the engine's weights lock. The engine sees the new weights at once: it
   shares the actor module.
4. **report / save** — metrics to ``metrics.jsonl``, wandb and the terminal; a checkpoint every
   ``save_every`` updates.

With ``trainer.overlap`` the rollout does not wait for the update: batches come from a
``BatchPipeline`` (``verlog.train.pipeline``) that plays batch ``k + 1`` while update ``k`` trains in
a process of its own (a CPU learner: ``verlog.train.update_process``) or on a thread (a GPU one), the
engine serving its own copy of the actor until the update publishes the new weights; live turns sampled by older weights (overlapped, or carried by straggler-tolerant
batches) are trained with decoupled PPO against the weights the update starts from.

Before the first update the critic is pre-trained (``critic_warmup``) on a large buffer
collected once with the initial policy. ``--resume`` restores weights, optimizers, RNGs and the
slot counters (so the position in the data's epoch) from the latest checkpoint and goes on with
the next update (episodes that were in flight are not saved: each slot starts a fresh episode with
its next task).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import yaml
from rich.console import Console

from verlog.agent import build_chat_model, embedded_engine, judge_chat_models, load_agent, pick_device
from verlog.algo import CriticWarmup
from verlog.algo.estimators import check_estimator_settings, get_estimator
from verlog.algo.off_policy import OffPolicyCorrection
from verlog.backends.embedded import EmbeddedEngine, torch_cpu_threads
from verlog.backends.engine_process import EngineProcess
from verlog.config import EVAL_SPLITS, ConfigError, VerlogConfig
from verlog.data import shared_rows, split_rows
from verlog.data.provenance import check_same_data, write_data_files_record
from verlog.episodes import EpisodePlan, build_scorer
from verlog.evaluation import TaskResult, evaluate, print_results
from verlog.models import load_tokenizer
from verlog.rewards import RewardScorer
from verlog.rollout.interrupts import InterruptResponder
from verlog.rollout.slots import SlotBatch, SlotCounters, SlotRunner
from verlog.tokens import eos_token_ids, pad_token_id
from verlog.train.forward import shared_trunk_depth
from verlog.train.grammar_masks import ResponseMasks
from verlog.train.metrics import RunLogger, memory_metrics, rollout_metrics
from verlog.train.pipeline import BatchPipeline, live_correction
from verlog.train.ppo import Learner, adamw, ppo_update, score_batch
from verlog.train.storage import RolloutStorage
from verlog.train.trace_batches import TraceBatch, TraceSource, merge_batches, trace_slots
from verlog.train.update_process import UpdateProcess
from verlog.weights import checkpoint as ckpt
from verlog.weights.actor_critic import (
    load_actor,
    load_critic,
    load_reference,
    pixel_inputs,
    save_actor,
    train_last_layers,
)
from verlog.weights.policy import check_finite_weights
from verlog.weights.precision import autocast_dtype, check_master_dtype, flush_subnormals, grad_scaler
from verlog.weights.rollout_copy import publish_weights, rollout_copy

__all__ = ["TrainResult", "train"]


@dataclass
class TrainResult:
    """What a run leaves behind (also written to the run folder)."""

    run_dir: Path
    updates: int
    eval_start: list[TaskResult] | None = None
    eval_end: list[TaskResult] | None = None
    history: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0


def train(config: VerlogConfig, *, resume: bool = False, console: Console | None = None) -> TrainResult:
    """Run (or, with ``resume``, continue) the training run described by ``config``."""
    return asyncio.run(_train(config, resume=resume, console=console or Console()))


async def _train(config: VerlogConfig, *, resume: bool, console: Console) -> TrainResult:
    started = time.perf_counter()
    t = config.trainer
    _check_trainable(config)
    start = _init_source(config)
    checkpoint = _prepare_run_dir(Path(t.run_dir), config, resume)
    _warn_shared_rows(config, console)
    run = _Run.build(config, checkpoint, console, start)
    result = TrainResult(run_dir=run.run_dir, updates=run.state["update"])
    with RunLogger(
        config,
        run.run_dir,
        console=console,
        start_update=run.state["update"],
        wandb_id=run.state.get("wandb_id"),
        resume=checkpoint is not None,
    ) as logger:
        run.logger = logger
        evaluable = run.slots_agent.evaluable
        if not evaluable and (config.eval.at_start or config.eval.at_end or t.eval_every):
            console.print(
                f"no evaluations: {config.multi_turn.langgraph.path} defines no make_input(seed) and the "
                "config has no data rows (training from recorded episodes alone); evaluate its checkpoints "
                "with verlog eval on a config with rows"
            )
        try:
            if config.eval.at_start and checkpoint is None and evaluable:
                result.eval_start = await run.evaluate(0, "evaluating the initial policy", split=config.eval.split)
                print_results(result.eval_start, console, "before training")
            if not run.state["warmup_done"]:
                await _pretrain_critic(run)
                run.state["warmup_done"] = True

            await _updates(run, result, evaluable, console)

            if run.state["update"] > 0 and not (t.save_every and run.state["update"] % t.save_every == 0):
                await run.save(run.state["update"])  # the final weights are always saved
            if config.eval.at_end and evaluable:
                result.eval_end = await run.evaluate(
                    run.state["update"], "evaluating the final policy", split=config.eval.split
                )
        finally:
            await run.aclose()
    if result.eval_end is not None:
        print_results(result.eval_end, console, f"after {result.updates} updates")
        _write_eval_json(run.run_dir / "eval.json", result)
    result.seconds = time.perf_counter() - started
    return result


async def _updates(run: "_Run", result: TrainResult, evaluable: bool, console: Console) -> None:
    """The updates, from the one after the run's last to ``trainer.total_updates`` (or an early stop):
    each takes the next batch, trains on it, reports, saves and evaluates as configured."""
    config, t, logger = run.config, run.config.trainer, run.logger
    assert logger is not None
    # (masked constrained turns are scored as the engine sampled them: nothing to warn of)
    warned_masked = config.algorithm.recompute_logprobs or config.algorithm.constrained_logprobs == "masked"
    # batches in order; with overlapped updates the slots play the next one while this one trains
    pipeline = BatchPipeline(run.collect, first=run.state["update"] + 1, max_staleness=run.overlap)
    try:
        for update in range(run.state["update"] + 1, t.total_updates + 1):
            # 1. rollout: every slot gives turns_per_env turns (alternating: under the current weights)
            logger.status("rollout", every_update=True)
            batch, waits = await pipeline.next()
            warned_masked = warned_masked or _warn_masked_logprobs(batch, console)
            # 2-3. score the batch (old logprobs, values, GAE) and run the PPO epochs
            logger.status("update", every_update=True)
            metrics = await run.update(batch, update)
            if run.overlap:  # the slots sample with the new weights from their next call on
                run.publish(update)
                pipeline.publish(update)
            # 4. report, save, evaluate
            counters = run.counters(batch)
            logger.log(
                update,
                metrics
                | waits
                | rollout_metrics(batch)
                | _trace_metrics(batch)
                | counters
                | run.judge_failures()
                | memory_metrics(),
            )
            result.history.append({"update": update, **metrics})
            result.updates = run.state["update"] = update
            steps_done = t.stop_at_env_steps is not None and counters["turns_total"] >= t.stop_at_env_steps
            if t.save_every and update % t.save_every == 0:
                await run.save(update)
            if steps_done:
                console.print(
                    f"{int(counters['turns_total'])} environment steps played at update {update} "
                    f"(stop_at_env_steps {t.stop_at_env_steps}): stopping"
                )
                break
            if t.eval_every and update % t.eval_every == 0 and update < t.total_updates and evaluable:
                # validation seeds: the final evaluation is not selected on
                checked = await run.evaluate(update, "evaluating", seed=config.eval.validation_seed, split="validation")
                win_rate = sum(r.win_rate for r in checked) / len(checked)
                if t.stop_at_win_rate is not None and win_rate >= t.stop_at_win_rate:
                    console.print(f"win rate {win_rate:.3f} >= {t.stop_at_win_rate} at update {update}: stopping")
                    break
            if not run.overlap:  # alternating: the next batch is played with these weights
                run.runner.policy_version = update
                pipeline.publish(update)
    finally:
        await pipeline.aclose()  # (a batch being played ahead is not trained: its slots stop)
        run.runner.hold()


async def _pretrain_critic(run: "_Run") -> None:
    """Verlog's critic pre-training: one big buffer from the initial policy, then several
    critic-only passes over random parts of it, values and GAE recomputed before each."""
    w, logger, learner = run.config.critic_warmup, run.logger, run.learner
    if learner.critic is None or w.buffer_multiplier == 0 or w.iterations == 0:
        return
    schedule = CriticWarmup(w.buffer_multiplier, w.iterations, w.subset_fraction, seed=run.config.trainer.seed)
    buffer: list[RolloutStorage] = []
    for i in range(w.buffer_multiplier):
        logger.status(f"critic warm-up: collecting batch {i + 1}/{w.buffer_multiplier}")
        buffer.append(RolloutStorage.from_batch(await run.collect()))
    size = sum(s.size for s in buffer)
    for it, subset in enumerate(schedule.subsets(size)):
        logger.status(f"critic warm-up: iteration {it + 1}/{w.iterations}")
        fits = [score_batch(s, learner, logprobs=it == 0)["explained_variance"] for s in buffer]
        everything = RolloutStorage.cat(buffer)  # with this iteration's values and returns
        with every_core(run.config):
            metrics = ppo_update(everything, learner, update_actor=False, epochs=1, rows=subset, generator=run.shuffle)
        metrics |= {"explained_variance": sum(fits) / len(fits), "buffer_turns": float(size)}
        logger.log(it + 1, metrics, step_kind="critic_warmup")


@dataclass
class _Run:
    """What a training run holds: models and optimizers (``learner``), the engine sharing the
    actor, the slot runner, the RNGs, and the counters saved in checkpoints."""

    config: VerlogConfig
    run_dir: Path
    tokenizer: Any
    learner: Learner
    peft_actor: Any
    engine: EmbeddedEngine | EngineProcess
    runner: SlotRunner
    slots_agent: "_SlotsAgent"
    shuffle: torch.Generator
    state: dict[str, Any]
    logger: RunLogger | None = None
    #: recorded production episodes (``data.traces``) filling ``traces.num_slots`` slots of each batch
    traces: TraceSource | None = None
    #: slots played live by the graph (0: the batches are recorded turns only)
    live_slots: int = 0
    #: the training episodes' failed verdicts counted before an evaluation, for the next update's metrics
    judge_failed: dict[str, float] = field(default_factory=dict)
    #: overlapped updates' staleness bound (``trainer.overlap.max_staleness``); 0: alternating
    overlap: int = 0
    #: the correction of live turns sampled by older weights (overlapped updates, stragglers), else ``None``
    live_correction: OffPolicyCorrection | None = None
    #: with overlapped updates: the thread the updates run on (the event loop goes on playing meanwhile) ...
    update_thread: ThreadPoolExecutor | None = None
    #: ... or, for a learner on the CPU, the process they run in (started at the first update)
    update_process: UpdateProcess | None = None
    #: the slot runner's state at the cut of the last batch trained (what its checkpoint resumes from)
    trained_state: dict[str, Any] | None = None

    @classmethod
    def build(
        cls, config: VerlogConfig, checkpoint: Path | None, console: Console, start: Path | None = None
    ) -> "_Run":
        """Load the models (from ``checkpoint`` when resuming, else from ``start``: the checkpoint
        ``trainer.init_from`` names), the engine and the slots."""
        t = config.trainer
        _seed_everything(t.seed)
        # this thread's training passes; the engine sets its own. Oversubscribed cores make torch's
        # threads wait on each other: all cores but one, like the engine, is the safe default.
        torch.set_num_threads(torch_cpu_threads(t.torch_threads))
        device = torch.device(pick_device(config.model.device))
        flush_subnormals(device)
        compute = autocast_dtype(config.model.autocast)  # float32 master weights, passes under autocast

        tokenizer = load_tokenizer(config.model.path)
        learner, peft_actor = _learner(config, checkpoint, tokenizer, device, compute, start)
        if start is not None and checkpoint is None:
            critic = (
                "and its critic" if os.path.lexists(start / ckpt.CRITIC_FILE) and learner.critic else "(a new critic)"
            )
            console.print(f"starting from [bold]{start}[/]'s policy {critic}")
        actor = learner.actor

        # rollout: the graph's slots, their model calls gated into fixed-turn batches; the
        # reward section scores each episode as it ends (a judge may reuse the policy's engine).
        # Alternating updates share the actor with the engine; overlapped ones give it its own copy.
        engine = embedded_engine(
            config, rollout_copy(actor) if t.overlap.enabled else actor, tokenizer, autocast=compute
        )
        scorer = build_scorer(
            config,
            cache_dir=Path(t.run_dir),
            chat_model_for=judge_chat_models(config, build_chat_model(config, engine, tokenizer)),
        )
        traced = config.data.traces if config.data is not None else None
        recorded = trace_slots(traced, t.num_envs, t.group_size) if traced is not None else 0
        slots_agent = _SlotsAgent(config, scorer, plays=t.num_envs - recorded > 0)
        if recorded:
            console.print(
                f"batches: {t.num_envs - recorded} live slots and {recorded} of recorded turns "
                f"({traced.store}) x {t.turns_per_env} turns"
            )
        runner = SlotRunner(  # without live slots it never plays (its slots are not started)
            engine,
            slots_agent.build,
            slots_agent.episode_input,
            num_envs=t.num_envs - recorded or t.group_size,
            turns_per_env=t.turns_per_env,
            graph_config=config.multi_turn.langgraph.graph_config,
            timeout_s=config.rollout.episode_timeout_s,
            seed=config.rollout.seed if config.data is None or config.data.train is None else 0,
            group_size=t.group_size,
            whole_groups=_whole_groups(config),
            max_consecutive_failures=t.max_consecutive_failures,
            render_prompt=slots_agent.render_prompt,
            on_episode_end=slots_agent.on_episode_end,
            interrupts=InterruptResponder.from_config(config.multi_turn.langgraph),
            keep_discarded=config.multi_turn.langgraph.train_discarded_calls,
            sampling_seed=config.rollout.seed,
            max_turns_per_env=_straggler_cap(config),
            slot_threads=config.rollout.slot_threads,
        )
        run = cls(
            config,
            Path(t.run_dir),
            tokenizer,
            learner,
            peft_actor,
            engine,
            runner,
            slots_agent,
            torch.Generator().manual_seed(t.seed),
            {"update": 0, "warmup_done": False},
            traces=TraceSource(traced, recorded, t.turns_per_env, seed=t.seed) if traced else None,
            live_slots=t.num_envs - recorded,
            overlap=t.overlap.max_staleness if t.overlap.enabled else 0,
        )
        if t.overlap.enabled or t.stragglers.enabled:  # live turns may be sampled by older weights
            run.live_correction = OffPolicyCorrection(t.overlap.behaviour_weight_cap, t.overlap.max_staleness)
        if t.overlap.enabled and _update_in(config) == "thread":
            threads = torch_cpu_threads(t.torch_threads)
            run.update_thread = ThreadPoolExecutor(
                1, "verlog-update", initializer=torch.set_num_threads, initargs=(threads,)
            )
        if checkpoint is not None:
            run.restore(checkpoint)
            console.print(f"resuming [bold]{run.run_dir}[/] from {checkpoint.name} (update {run.state['update']})")
        run.runner.policy_version = run.state["update"]
        if t.overlap.enabled:  # (LoRA adapters are restored after the engine's copy was made)
            run.publish(run.state["update"])
        return run

    # ------------------------------------------------------------------ checkpoints
    def _optimizers(self) -> dict[str, torch.optim.Optimizer | None]:
        return {"actor": self.learner.actor_optimizer, "critic": self.learner.critic_optimizer}

    def _generators(self) -> dict[str, torch.Generator]:
        return {"engine": self.engine.sampling_generator, "shuffle": self.shuffle}

    async def save(self, update: int) -> Path:
        """Checkpoint ``update`` (atomically; the engine, when it shares the actor, is paused meanwhile)."""
        if self.update_process is not None:  # the optimizers' state lives in the update process
            await self.update_process.optimizer_states()
        with self.engine.weights_lock() if not self.overlap else contextlib.nullcontext():
            return ckpt.save_checkpoint(
                self.run_dir,
                update,
                save_actor=self._save_actor,
                critic=self.learner.critic,
                optimizers=self._optimizers(),
                rng=ckpt.get_rng_state(self._generators()),
                state={
                    "warmup_done": self.state["warmup_done"],
                    "runner": self.trained_state or self.runner.state_dict(),
                    "wandb_id": self.logger.wandb_id if self.logger else None,
                },
                keep=self.config.trainer.keep_checkpoints,
            )

    def _save_actor(self, folder: Path) -> None:
        save_actor(folder, self.learner.actor, self.peft_actor, self.tokenizer, self.config.model.path)

    def restore(self, checkpoint: Path) -> None:
        """Weights not loaded with the actor, optimizers, RNGs, slot counters."""
        self.state = ckpt.read_state(checkpoint)
        if self.peft_actor is not None:
            from verlog.models.safe_load import load_adapter_weights

            load_adapter_weights(self.peft_actor, ckpt.folder_file(checkpoint, ckpt.ADAPTER_FOLDER))
        if self.learner.critic is not None:
            ckpt.load_critic_weights(self.learner.critic, checkpoint)
        for model in (self.learner.actor, self.learner.critic):  # a diverged run's NaNs are not trained on
            if model is not None:
                check_finite_weights(model, str(checkpoint))
        ckpt.load_optimizers(checkpoint, self._optimizers())
        ckpt.set_rng_state(ckpt.load_rng(checkpoint), self._generators())
        try:
            self.runner.load_state_dict(self.state["runner"])
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ckpt.CheckpointError(
                f"{checkpoint / 'state.json'}: not the slots' counters of this run's "
                f"trainer.num_envs ({ckpt.first_line(exc)})"
            ) from None

    # ------------------------------------------------------------------ the update
    async def update(self, batch: SlotBatch, update: int) -> dict[str, float]:
        """Score ``batch`` (old logprobs, values, GAE) and run the PPO epochs: update ``update``.

        Alternating, on this thread, the engine (sharing the actor) waiting meanwhile; overlapped,
        on the update thread while the event loop goes on playing the next batch with the engine's
        copy. Live turns sampled by older weights (overlapped updates, stragglers) are trained with
        decoupled PPO against the weights this update starts from (``verlog.train.pipeline``)."""
        storage = RolloutStorage.from_batch(batch)
        correction, metrics = self.traces.correction if self.traces else None, {}
        if self.live_correction is not None and not isinstance(batch, TraceBatch):
            storage.turn_weights, metrics = live_correction(batch, update, self.live_correction)
            correction = self.live_correction
        self.trained_state = batch.runner_state
        tick = time.perf_counter()
        if self.overlap and _update_in(self.config) == "process":
            if self.update_process is None:  # after the critic's pre-training and any resume
                threads = torch_cpu_threads(self.config.trainer.torch_threads)
                self.update_process = UpdateProcess(self.learner, self.shuffle, threads)
            metrics |= await self.update_process.update(storage, correction)
        elif self.update_thread is None:
            with self.engine.weights_lock(), every_core(self.config):
                metrics |= self._train(storage, correction)
        else:
            metrics |= await asyncio.get_running_loop().run_in_executor(
                self.update_thread, self._train, storage, correction
            )
        metrics["update_s"] = time.perf_counter() - tick
        return metrics

    def _train(self, storage: RolloutStorage, correction: OffPolicyCorrection | None) -> dict[str, float]:
        metrics = score_batch(storage, self.learner, off_policy=correction)
        return metrics | ppo_update(storage, self.learner, generator=self.shuffle)

    def publish(self, update: int) -> None:
        """Overlapped updates: the engine's copy takes the actor's new weights (between two of its
        decode steps), and the slots' calls admitted from now on record ``update`` as their version."""
        with self.engine.weights_lock():
            publish_weights(self.learner.actor, self.engine.model)
        self.runner.policy_version = update

    # ------------------------------------------------------------------ the rest
    async def collect(self) -> SlotBatch:
        """The next fixed-turn batch, its groups scored by the ranking judges; with ``data.traces``,
        its recorded slots beside the live ones (or alone)."""
        batch = None
        if self.live_slots:
            batch = await self.runner.collect()
            await self.slots_agent.rank(batch)
        if self.traces is not None:  # staleness counts from the weights this update starts from
            self.traces.trained = (self.run_dir.name, int(self.state["update"]))
        return merge_batches(batch, self.traces.next_batch() if self.traces is not None else None)

    def judge_failures(self) -> dict[str, float]:
        """The training episodes' verdicts that failed since the last update, by judge and reason
        (an evaluation's are in its own error counts)."""
        scorer = self.slots_agent.scorer
        taken, self.judge_failed = self.judge_failed, {}
        for key, n in (scorer.take_judge_failures() if scorer is not None else {}).items():
            taken[key] = taken.get(key, 0.0) + n
        return taken

    def counters(self, batch: SlotBatch | None = None) -> dict[str, float]:
        """Run totals, as of ``batch``'s cut when given (overlapped updates play ahead of it)."""
        state = batch.runner_state if batch is not None else None
        c = SlotCounters.from_dict(state["counters"]) if state is not None else self.runner.counters
        out = {
            "turns_total": float(c.turns),
            "episodes_total": float(c.episodes),
            "failed_total": float(sum(c.failed.values())),
        }
        if c.moved:  # episodes played again on threads after a blocking call (rollout.slot_threads: auto)
            out["episodes_moved_total"] = float(c.moved)
        if self.runner.whole_groups:
            out |= {
                "groups_dropped_total": float(c.groups_dropped),
                "groups_abandoned_total": float(c.groups_abandoned),
            }
        rows = self.slots_agent.plan.size if self.slots_agent.plan is not None else None
        if rows:  # how far the training rows' epochs have gone: rounds begun x groups / rows
            groups = self.runner.num_envs // self.runner.group_size
            started = state["episodes_started"] if state is not None else self.runner.episodes_started
            out["data_epoch"] = max(started) * groups / rows
        elif self.runner.highest_task is not None:  # seeds: the highest one an episode has started with
            out["seed_max"] = float(self.runner.highest_task)
        return out

    async def evaluate(
        self, update: int, status: str, seed: int | None = None, split: str = "test"
    ) -> list[TaskResult]:
        """Held-out episodes on the engine (the slots are all held meanwhile): seeds from
        ``seed``, or the rows of a data ``split``."""
        self.logger.status(status)
        self.judge_failed = self.judge_failures()  # kept for the next update's metrics
        results = await evaluate(
            self.config, self.engine, self.tokenizer, seed=seed, split=split, scorer=self.slots_agent.scorer
        )
        if self.slots_agent.scorer is not None:  # the evaluation's own failures are in its error counts
            self.slots_agent.scorer.take_judge_failures()
        self.logger.log_eval(update, results, validation=seed is not None)
        return results

    async def aclose(self) -> None:
        await self.runner.aclose()
        await self.engine.aclose()
        if self.update_thread is not None:
            self.update_thread.shutdown()
        if self.update_process is not None:
            self.update_process.close()
        if self.traces is not None:
            self.traces.close()


# ---------------------------------------------------------------------- helpers


def _learner(
    config: VerlogConfig,
    checkpoint: Path | None,
    tokenizer: Any,
    device: torch.device,
    compute: torch.dtype | None,
    start: Path | None = None,
) -> tuple[Learner, Any]:
    """The models and their optimizers: the actor (from ``checkpoint`` when resuming a full
    fine-tuning; shared with the engine), the critic, the frozen reference; and the actor's
    ``PeftModel`` (``None`` without LoRA). ``start``: the checkpoint ``trainer.init_from`` names
    (``model.path`` is already its policy): its critic, when it saved one, starts the critic."""
    algo = config.algorithm
    where = {"dtype": config.model.dtype, "device": str(device)}
    full_actor_saved = checkpoint is not None and config.actor.lora.rank == 0
    actor, peft_actor = load_actor(
        checkpoint / ckpt.ACTOR_FOLDER if full_actor_saved else config.model.path, lora=config.actor.lora, **where
    )
    critic = load_critic(config.model.path, **where) if get_estimator(algo.estimator).needs_critic else None
    if critic is not None and start is not None and checkpoint is None and os.path.lexists(start / ckpt.CRITIC_FILE):
        ckpt.load_critic_weights(critic, start)
    reference = load_reference(config.model.path, **where) if algo.kl_coef > 0 else None
    for model, opts, section in ((actor, config.actor, "actor"), (critic, config.critic, "critic")):
        if model is not None:
            train_last_layers(model, opts.train_layers, section=section)
            if opts.gradient_checkpointing:
                model.gradient_checkpointing_enable()
    learner = Learner(
        actor,
        critic,
        adamw(actor, config.actor),
        adamw(critic, config.critic) if critic else None,
        reference,
        algo,
        pad_id=pad_token_id(tokenizer),
        device=device,
        actor_max_grad_norm=config.actor.max_grad_norm,
        critic_max_grad_norm=config.critic.max_grad_norm,
        autocast=compute,
        actor_scaler=grad_scaler(device, compute),
        critic_scaler=grad_scaler(device, compute) if critic else None,
        trunk_depth=_trunk_depth(config, actor, critic),
        image_inputs=pixel_inputs(config.model.path, tokenizer),
        token_masks=_token_masks(config, tokenizer, actor),
    )
    return learner, peft_actor


def _token_masks(config: VerlogConfig, tokenizer: Any, actor: Any) -> ResponseMasks | None:
    """What rebuilds constrained turns' token masks (``algorithm.constrained_logprobs: masked``)
    for the actor's logits, ending responses on the engine's end tokens."""
    if config.algorithm.constrained_logprobs != "masked":
        return None
    vocab = actor.get_output_embeddings().weight.shape[0]
    return ResponseMasks(tokenizer, vocab, eos_token_ids(tokenizer, actor))


class _SlotsAgent:
    """The configured graph file, built by the slot runner around its gated engine, and what its
    episodes play (``EpisodePlan`` of the training split) and are scored by. Its chat model
    renders truncated turns' next prompts exactly as it renders calls."""

    def __init__(self, config: VerlogConfig, scorer: RewardScorer | None, *, plays: bool = True):
        self.config, self.scorer = config, scorer
        #: whether live slots play episodes (without, recorded turns fill every slot: no episode
        #: input is needed, so a graph without make_input and a config without rows train too)
        self.plays = plays
        self.agent: Any = None
        self.plan: EpisodePlan | None = None

    def build(self, engine: Any) -> Any:
        self.agent = load_agent(self.config, engine=engine)
        if self.plays:
            self.plan = EpisodePlan(
                self.config,
                self.agent.graph_file,
                "train",
                scorer=self.scorer,
                keep_trajectories=bool(self.scorer and self.scorer.ranking),
            )
        return self.agent.graph

    @property
    def evaluable(self) -> bool:
        """Whether evaluations have episodes to play: the config's rows, or the graph's seeds."""
        data = self.config.data
        return (data is not None and data.has_rows()) or self.agent.graph_file.make_input is not None

    def episode_input(self, task: int) -> Any:
        return self.plan.input(task)

    async def on_episode_end(self, episode: Any, task: int) -> None:
        await self.plan.score(episode, task)

    async def rank(self, batch: SlotBatch) -> None:
        """Ranking judges on the episodes that ended in ``batch``, grouped by task (the groups a
        group estimator compares); their verdicts go onto each episode's last turn. A judge that
        cannot give a verdict stops the run (``RewardError``; resume from the last checkpoint)."""
        if self.scorer is None or not self.scorer.ranking:
            return
        kept = self.plan.take_trajectories([e.episode_id for e in batch.episodes])
        groups: dict[Any, list[Any]] = {}
        if batch.compared is not None:  # whole groups: exactly the groups compared (not a dropped one's plays)
            for g, whole in enumerate(batch.whole_groups):
                groups[g] = [e for e in whole if e.episode_id in kept]
        else:
            for episode in batch.episodes:
                if episode.episode_id in kept:
                    groups.setdefault(kept[episode.episode_id][0], []).append(episode)
        outcomes = await asyncio.gather(
            *(self.scorer.rank([kept[e.episode_id][1] for e in group]) for group in groups.values())
        )
        for group, results in zip(groups.values(), outcomes):
            for episode, outcome in zip(group, results):
                outcome.apply(episode)

    def render_prompt(self, messages: Any, tools: Any) -> list[int]:
        return self.agent.chat_model.render_prompt_ids(messages, tools)


def _trunk_depth(config: VerlogConfig, actor: Any, critic: Any) -> int | None:
    """With ``train_layers`` on the actor (and on the critic, if there is one), the blocks below
    the lowest trained one are frozen in both: where they are the same weights, they run once per
    batch for every pass (``Learner.trunk_depth``)."""
    trained = [config.actor.train_layers, *([config.critic.train_layers] if critic is not None else [])]
    if any(n is None for n in trained):
        return None
    depth = len(actor.base_model.layers) - max(trained)  # type: ignore[type-var]
    return shared_trunk_depth(actor.base_model, critic.backbone if critic is not None else None, depth)


def _whole_groups(config: VerlogConfig) -> bool:
    """Whether the slots play whole groups: a group estimator compares ``group_size`` > 1 plays
    of each row (``SlotRunner(whole_groups=True)``)."""
    return config.trainer.group_size > 1 and get_estimator(config.algorithm.estimator).compares_groups


@contextlib.contextmanager
def every_core(config: VerlogConfig) -> Iterator[None]:
    """Torch's CPU threads on this thread for a pass that nothing runs beside (an alternating update,
    the critic's pre-training): every core, unless ``trainer.torch_threads`` sets them; the rollout's
    rule (all cores but one: ``torch_cpu_threads``) again afterwards. On 2 cores an alternating update of
    ``make run``'s config took 9.2 s with one thread, 5.7 s with two (that config pins one)."""
    if config.trainer.torch_threads is not None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _update_in(config: VerlogConfig) -> str:
    """Where overlapped updates run: a process of their own for a learner on the CPU (``auto``), a
    thread of this process otherwise (``verlog.train.update_process``)."""
    chosen = config.trainer.overlap.update_in
    if chosen != "auto":
        return chosen
    return "process" if pick_device(config.model.device) == "cpu" else "thread"


def _straggler_cap(config: VerlogConfig) -> int | None:
    """The most turns a slot gives a batch with straggler-tolerant batches (``None``: off)."""
    s = config.trainer.stragglers
    if not s.enabled:
        return None
    return s.max_turns_per_env or 2 * config.trainer.turns_per_env


def _check_rollout_mode(config: VerlogConfig) -> None:
    """Overlapped updates and straggler-tolerant batches train live slots only; stragglers give
    slots different numbers of turns, which whole groups (group estimators) cannot compare."""
    t = config.trainer
    traced = config.data is not None and config.data.traces is not None
    if t.overlap.enabled and traced:
        raise ConfigError(
            "trainer.overlap.enabled: overlapped updates train live slots only, not recorded episodes "
            "(data.traces): set trainer.overlap.enabled: false, or train the traces in a run of their own"
        )
    if t.stragglers.enabled and (traced or get_estimator(config.algorithm.estimator).compares_groups):
        why = (
            "recorded episodes (data.traces) fill whole slots"
            if traced
            else f"algorithm.estimator {config.algorithm.estimator!r} compares groups of plays in one batch"
        )
        raise ConfigError(
            f"trainer.stragglers.enabled: straggler-tolerant batches give slots different numbers of turns, and {why}: "
            "set trainer.stragglers.enabled: false, or train with an estimator that compares no groups (gae...)"
        )


def _init_source(config: VerlogConfig) -> Path | None:
    """The checkpoint ``trainer.init_from`` names (a run folder's latest, or a checkpoint), checked
    whole; ``model.path`` becomes its policy (so the actor, the critic's backbone, the reference of
    the KL and the tokenizer are that policy's). ``None`` without ``init_from``."""
    source = config.trainer.init_from
    if source is None:
        return None
    try:
        start = ckpt.resolve_checkpoint(Path(source).expanduser())
    except FileNotFoundError as exc:
        raise ConfigError(f"trainer.init_from: {exc}") from None
    ckpt.verify_checkpoint(start)
    if not os.path.lexists(start / ckpt.ACTOR_FOLDER):
        raise ConfigError(
            f"trainer.init_from: {start} holds LoRA adapters, not a full policy; start from their base with the same "
            "actor.lora settings, or fine-tune without LoRA (actor.train_layers) to start a run from it"
        )
    config.model.path = str(start / ckpt.ACTOR_FOLDER)
    return start


def _check_trainable(config: VerlogConfig) -> None:
    try:
        check_master_dtype(config.model.dtype, config.model.autocast)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    _check_data(config)
    _check_rollout_mode(config)
    if config.engine.kind != "embedded":
        raise ConfigError(
            f"engine.kind: the embedded trainer needs the embedded engine (got {config.engine.kind!r}); "
            "training on SGLang runs through verl (verlog.integrations.verl)"
        )
    if config.sampling.temperature <= 0:
        raise ConfigError("sampling.temperature: training samples from the policy; use a temperature > 0")
    try:
        check_estimator_settings(config.algorithm)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _check_data(config: VerlogConfig) -> None:
    """A data section names the splits this run plays: the training rows, the validation rows of
    the periodic evaluations, the split of the final one (``eval.split``)."""
    data, ev, t = config.data, config.eval, config.trainer
    if data is None:
        return
    if data.train is None and data.traces is None:
        raise ConfigError(
            "data.train: training plays the rows of the training split (or recorded episodes, "
            "data.traces); give its file"
        )
    if not data.has_rows():  # recorded episodes alone: live slots and evaluations play seeds
        return
    if t.eval_every and data.validation is None:
        raise ConfigError(
            "trainer.eval_every: the periodic evaluations play data.validation, which is not set "
            "(give a validation split, or set trainer.eval_every: 0)"
        )
    if (ev.at_start or ev.at_end) and data.split(ev.split) is None:
        raise ConfigError(
            f"eval.split: the evaluations before/after training play data.{ev.split}, which is not set "
            "(give that split, choose the other with eval.split, or set eval.at_start/at_end: false)"
        )


def _warn_shared_rows(config: VerlogConfig, console: Console) -> None:
    """Say so when an evaluation split repeats training rows (it would measure memory)."""
    if config.data is None or config.data.train is None:
        return
    train = split_rows(config, "train")
    for split in EVAL_SPLITS:
        if config.data.split(split) is not None:
            shared = shared_rows(train, split_rows(config, split))
            if shared:
                console.print(
                    f"[yellow]warning:[/] {shared} of the {split} rows are also training rows "
                    f"(same content): their {split} scores measure memory, not skill"
                )


def _trace_metrics(batch: SlotBatch) -> dict[str, float]:
    """What a batch took from the trace store: recorded turns and episodes, their staleness weight."""
    if not isinstance(batch, TraceBatch):
        return {}
    recorded = [
        w for slot, kinds in zip(batch.turn_weights, batch.versions) for w, v in zip(slot, kinds) if v is not None
    ]
    return {
        "trace_turns": float(batch.trace_turns),
        "trace_episodes": float(batch.trace_episodes),
        "trace_dropped_turns": float(sum(w == 0 for w in recorded)),
    }


def _warn_masked_logprobs(batch: SlotBatch, console: Console) -> bool:
    """With ``recompute_logprobs: false`` and ``constrained_logprobs: policy``, say so when
    constrained turns are trained: their engine logprobs are the masked distribution's, so PPO's
    first ratio is not 1 (large KL and clipping from the first step). Returns whether it warned."""
    constrained = sum(1 for turn in batch.flat_turns() if turn.constraint)
    if constrained:
        console.print(
            f"[yellow]warning:[/] {constrained} turns of this batch were sampled under a constraint "
            "(structured output, a forced tool call) and algorithm.recompute_logprobs is false: their "
            "old logprobs are the masked distribution's, not the policy's; set recompute_logprobs: true "
            "or constrained_logprobs: masked"
        )
    return bool(constrained)


def _prepare_run_dir(run_dir: Path, config: VerlogConfig, resume: bool) -> Path | None:
    """The checkpoint to resume from, checked whole before anything in ``run_dir`` is written.

    A new run refuses a folder that holds checkpoints. ``--resume`` never deletes or overwrites
    what it cannot first prove belongs to the run it resumes: checkpoints that cannot be trusted
    (``latest`` naming something else, an unreadable ``state.json``, a tampered actor) are a
    ``CheckpointError``, and a folder without a checkpoint is refused (a run is started without
    ``--resume``: a mistyped ``trainer.run_dir`` must not quietly begin from scratch)."""
    latest = ckpt.latest_checkpoint(run_dir)
    if latest is not None and not resume:
        raise ConfigError(
            f"trainer.run_dir: {str(run_dir)!r} already holds a run (checkpoint {latest.name}); "
            "pass --resume to continue it, or choose another trainer.run_dir"
        )
    if resume and latest is not None:
        ckpt.verify_checkpoint(latest)
        saved_lora = os.path.lexists(latest / ckpt.ADAPTER_FOLDER)
        if saved_lora != (config.actor.lora.rank > 0):
            raise ConfigError(
                f"actor.lora.rank: {latest.name} holds {'LoRA adapters' if saved_lora else 'a full actor'}"
                f" but actor.lora.rank is {config.actor.lora.rank}: resume with the run's own setting"
            )
        _check_same_estimator(run_dir, latest, config)
        check_same_data(run_dir, config)  # the rows the run's epochs are drawn over
    if resume and latest is None:
        earlier = [p for p in (ckpt.checkpoints_root(run_dir), run_dir / "metrics.jsonl") if os.path.lexists(p)]
        if earlier:
            raise ConfigError(
                f"trainer.run_dir: {str(run_dir)!r} holds {earlier[0].name} of an earlier run but no checkpoint to "
                "resume from; nothing was changed: start a new run in another trainer.run_dir (or empty this one)"
            )
        raise ConfigError(
            f"trainer.run_dir: --resume, but {str(run_dir)!r} holds no checkpoint to resume from; nothing was "
            "changed: check trainer.run_dir, or start a new run there without --resume"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    write_data_files_record(run_dir, config)
    return latest


def _check_same_estimator(run_dir: Path, latest: Path, config: VerlogConfig) -> None:
    """``--resume`` continues the run's own estimator: one that differs from the run's saved
    ``config.yaml``, or whose critic the checkpoint lacks or has in excess, is a ``ConfigError``
    (a gae run resumed as grpo would drop its critic and write checkpoints without one)."""
    estimator = config.algorithm.estimator
    saved_file = run_dir / "config.yaml"
    saved = None
    if saved_file.is_file():
        try:
            saved = ((yaml.safe_load(saved_file.read_text()) or {}).get("algorithm") or {}).get("estimator")
        except (yaml.YAMLError, AttributeError):
            saved = None
    if saved is not None and saved != estimator:
        raise ConfigError(
            f"algorithm.estimator: the run in {str(run_dir)!r} was trained with {saved!r}, not "
            f"{estimator!r}: resume with algorithm.estimator={saved} (or start a new run in another "
            "trainer.run_dir)"
        )
    has_critic = os.path.lexists(latest / ckpt.CRITIC_FILE)
    if has_critic != get_estimator(estimator).needs_critic:
        held = "holds a critic" if has_critic else "holds no critic"
        needs = "trains with one" if not has_critic else "has none"
        raise ConfigError(
            f"algorithm.estimator: {latest.name} {held} but {estimator!r} {needs}: resume with the "
            "estimator the run was trained with"
        )


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _write_eval_json(path: Path, result: TrainResult) -> None:
    import json

    data = {
        "updates": result.updates,
        "before": [r.as_dict() for r in result.eval_start] if result.eval_start else None,
        "after": [r.as_dict() for r in result.eval_end] if result.eval_end else None,
    }
    path.write_text(json.dumps(data, indent=1))
