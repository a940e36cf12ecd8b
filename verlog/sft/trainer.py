"""``verlog sft CONFIG``: supervised fine-tuning of the config's policy on demonstrations of its graph.

Top to bottom:

1. **demonstrations** — each source of ``sft.demonstrations`` is played through the graph (or read
   from a trace store) once and the episodes its filter keeps are written to
   ``<run_dir>/demonstrations/`` (:mod:`verlog.sft.collect`); a ``policy`` source plays with the
   policy being trained, once per round;
2. **rows** — the kept episodes' turns become rows (turns sharing their prefix in one pass,
   :mod:`verlog.sft.dataset`), whole episodes split off for the held-out loss;
3. **epochs** — shuffled mini-batches of ``batch_turns`` turns, each one AdamW step on the
   token-mean cross-entropy of the answer tokens (:func:`verlog.algo.sft.sft_loss`), accumulated
   over ``algorithm.micro_batch_tokens`` micro-batches; the part of the model that trains is the
   actor's (``actor.train_layers``: the frozen trunk's states are computed once per round; or
   ``actor.lora``);
4. **report / save** — ``sft_loss`` and ``token_accuracy`` as steps go, the held-out loss and
   accuracy at each epoch's end, to ``metrics.jsonl``, wandb and the terminal; a checkpoint at each
   epoch's end (or every ``save_every`` steps) in the training run's format, so ``verlog train
   --init-from RUN`` (or ``model.path=RUN``), ``verlog eval --checkpoint RUN`` and ``verlog
   serve-model RUN`` take it as it is;
5. with ``sft.critic: monte_carlo``, a critic (the tuned policy's backbone and a value head) fitted to
   the demonstrations' discounted returns, saved with the last checkpoint.

Rounds (a ``policy`` source with ``rounds`` > 1: expert iteration) repeat 1-4 on everything kept so
far. ``--resume`` continues from the latest checkpoint: the same demonstrations (read back), the
same shuffles, the next mini-batch.
"""

from __future__ import annotations

import asyncio
import copy
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import yaml
from rich.console import Console

from verlog.agent import pick_device
from verlog.algo import sft_loss
from verlog.config import ConfigError, DemonstrationsConfig, OptimConfig, VerlogConfig
from verlog.evaluation import TaskResult, evaluate, print_results
from verlog.models import load_tokenizer
from verlog.sft.collect import Demonstration, collect, read_demonstrations, write_demonstrations
from verlog.sft.critic import fit_critic
from verlog.sft.dataset import SftRow, rows_of, split_episodes
from verlog.tokens import pad_token_id
from verlog.train.forward import (
    PackedRows,
    Trunk,
    answer_logprobs,
    micro_batches,
    pack_rows,
    pad_rows,
    pad_states,
    shared_trunk_depth,
    trunk_states,
)
from verlog.train.metrics import RunLogger, memory_metrics
from verlog.train.ppo import adamw
from verlog.weights import checkpoint as ckpt
from verlog.weights.actor_critic import (
    ValueModel,
    load_actor,
    pixel_inputs,
    save_actor,
    train_last_layers,
    trainable_parameters,
)
from verlog.weights.policy import check_finite_weights
from verlog.weights.precision import autocast, autocast_dtype, check_master_dtype, flush_subnormals

__all__ = ["SftResult", "sft"]

#: the folder of a run's demonstrations
DEMONSTRATIONS = "demonstrations"
#: how often (in optimizer steps) a line of training figures is written within an epoch
LOG_EVERY = 10


@dataclass
class SftResult:
    """What ``verlog sft`` leaves behind (also in the run folder)."""

    run_dir: Path
    steps: int
    demonstrations: dict[str, dict[str, int]] = field(default_factory=dict)
    eval_start: list[TaskResult] | None = None
    eval_end: list[TaskResult] | None = None
    history: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0


def sft(config: VerlogConfig, *, resume: bool = False, console: Console | None = None) -> SftResult:
    """Run (or, with ``resume``, continue) the supervised warm start ``config.sft`` describes."""
    return asyncio.run(_sft(config, resume=resume, console=console or Console()))


async def _sft(config: VerlogConfig, *, resume: bool, console: Console) -> SftResult:
    started = time.perf_counter()
    if config.sft is None:
        raise ConfigError("sft: the config has no sft section (demonstrations, epochs, lr...): see docs/warm_start.md")
    try:
        check_master_dtype(config.model.dtype, config.model.autocast)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    run = _SftRun.build(config, resume, console)
    result = SftResult(run.run_dir, run.state["step"])
    try:
        if config.eval.at_start and run.checkpoint is None and run.evaluable:
            result.eval_start = await run.evaluate(0, "evaluating the initial policy")
            print_results(result.eval_start, console, "before fine-tuning")
        for source_index, source in enumerate(run.s.demonstrations):
            if source.source != "policy":
                result.demonstrations[_name(source_index, source)] = await run.demonstrations_of(source_index, source)
        # round 0 fits the fixed sources' demonstrations (if any); each later round first plays the
        # policy sources with the weights fitted so far, then fits everything kept
        fixed = any(d.source != "policy" for d in run.s.demonstrations)
        plays = max((d.rounds for d in run.s.demonstrations if d.source == "policy"), default=0)
        rounds = range(0 if fixed else 1, plays + 1)
        for round_ in rounds:
            if round_ < run.state["round"]:
                continue
            for source_index, source in enumerate(run.s.demonstrations):
                if source.source == "policy" and round_ <= source.rounds and round_ > 0:
                    name = _name(source_index, source, round_ - 1)
                    result.demonstrations[name] = await run.demonstrations_of(source_index, source, round_ - 1)
            run.state["round"] = round_
            result.history += run.fit(round_)
            if round_ != rounds[-1]:  # (the last round's epochs may go on: a resume with more sft.epochs)
                run.state["round"], run.state["epoch"], run.state["batch"] = round_ + 1, 0, 0
        if run.s.critic == "monte_carlo" and not run.state.get("critic_done"):
            result.history += run.fit_critic()
            run.state["critic_done"] = True
        run.save(force=True)
        result.steps = run.state["step"]
        if config.eval.at_end and run.evaluable:
            result.eval_end = await run.evaluate(run.state["step"], "evaluating the fine-tuned policy")
    finally:
        await run.aclose()
    if result.eval_end is not None:
        print_results(result.eval_end, console, f"after {result.steps} fine-tuning steps")
        _write_eval_json(run.run_dir / "eval.json", result)
    result.seconds = time.perf_counter() - started
    return result


def _name(index: int, source: DemonstrationsConfig, round_: int | None = None) -> str:
    """A source's name in the run (its demonstrations' file and episode ids)."""
    return f"{index}_{source.source}" + (f"_round{round_ + 1}" if round_ is not None else "")


class _SftRun:
    """What a fine-tuning run holds: the actor (and the engine sharing it), its optimizer, the
    demonstrations, the counters saved in checkpoints."""

    def __init__(self, config: VerlogConfig, console: Console):
        assert config.sft is not None
        self.config, self.s, self.console = config, config.sft, console
        self.run_dir = Path(self.s.run_dir)
        self.checkpoint: Path | None = None
        self.state: dict[str, Any] = {"step": 0, "round": 0, "epoch": 0, "batch": 0}
        self.demos: dict[str, list[Demonstration]] = {}
        self.logger: RunLogger | None = None
        self.engine: Any = None
        self.critic: ValueModel | None = None
        self.trunk: dict[int, torch.Tensor] = {}
        self.shuffle = torch.Generator()

    # ------------------------------------------------------------------ set-up
    @classmethod
    def build(cls, config: VerlogConfig, resume: bool, console: Console) -> "_SftRun":
        run = cls(config, console)
        run.checkpoint = _prepare_run_dir(run.run_dir, config, resume)
        s, t = run.s, config.trainer
        random.seed(s.seed)
        np.random.seed(s.seed)
        torch.manual_seed(s.seed)
        from verlog.backends.embedded import torch_cpu_threads  # (loaded with the engine, as below)

        torch.set_num_threads(torch_cpu_threads(t.torch_threads))
        run.device = torch.device(pick_device(config.model.device))
        flush_subnormals(run.device)
        run.compute = autocast_dtype(config.model.autocast)
        run.tokenizer = load_tokenizer(config.model.path)
        run.pad_id = pad_token_id(run.tokenizer)
        full_saved = run.checkpoint is not None and config.actor.lora.rank == 0
        where = {"dtype": config.model.dtype, "device": str(run.device)}
        source = run.checkpoint / ckpt.ACTOR_FOLDER if full_saved else config.model.path
        run.actor, run.peft_actor = load_actor(source, lora=config.actor.lora, **where)
        train_last_layers(run.actor, config.actor.train_layers, section="actor")
        if config.actor.gradient_checkpointing:
            run.actor.gradient_checkpointing_enable()
        run.optimizer = adamw(run.actor, OptimConfig(lr=s.lr, weight_decay=s.weight_decay))
        run.trunk_depth = None
        if config.actor.train_layers is not None:
            depth = len(run.actor.base_model.layers) - config.actor.train_layers
            run.trunk_depth = shared_trunk_depth(run.actor.base_model, None, depth)
        run.image_inputs = pixel_inputs(config.model.path, run.tokenizer)
        if run.checkpoint is not None:
            run.restore(run.checkpoint)
            run.say(f"resuming [bold]{run.run_dir}[/] from {run.checkpoint.name} (step {run.state['step']})")
        return run

    def say(self, text: str, **kwargs: Any) -> None:
        """A line on the console, written at once (a log file sees each phase as it begins)."""
        self.console.print(text, **kwargs)
        self.console.file.flush()

    @property
    def evaluable(self) -> bool:
        from verlog.graph_file import load_graph_file

        data = self.config.data
        graph = load_graph_file(self.config.multi_turn.langgraph.path)
        return (data is not None and data.has_rows()) or graph.make_input is not None

    def policy_engine(self) -> Any:
        """The embedded engine on the actor being tuned (the policy source's episodes, evaluations)."""
        if self.engine is None:
            from verlog.backends.embedded import EmbeddedEngine

            c = self.config
            self.engine = EmbeddedEngine(
                self.actor,
                self.tokenizer,
                max_batch_size=c.engine.max_batch_size,
                batch_wait_ms=c.engine.batch_wait_ms,
                seed=c.rollout.seed,
                prefix_cache_bytes=int(c.engine.prefix_cache_mb * 2**20),
                autocast=self.compute,
            )
        return self.engine

    def log(self, step: int, metrics: dict[str, float], kind: str = "sft") -> None:
        if self.logger is None:
            self.logger = RunLogger(
                self.config,
                self.run_dir,
                console=self.console,
                start_update=self.state["step"],
                wandb_id=self.state.get("wandb_id"),
                resume=self.checkpoint is not None,
                total=self.state.get("total_steps", 0) or None,
                step_kind="sft",
            ).__enter__()
            self.state["wandb_id"] = self.logger.wandb_id
        self.logger.log(step, metrics, step_kind=kind)

    async def evaluate(self, step: int, status: str) -> list[TaskResult]:
        from verlog.episodes import build_scorer

        self.say(status)
        self.actor.eval()
        scorer = build_scorer(self.config, cache_dir=self.run_dir)
        results = await evaluate(
            self.config, self.policy_engine(), self.tokenizer, split=self.config.eval.split, scorer=scorer
        )
        if self.logger is not None:
            self.logger.log_eval(step, results)
        return results

    async def aclose(self) -> None:
        if self.engine is not None:
            await self.engine.aclose()
        if self.logger is not None:
            self.logger.__exit__(None, None, None)

    # ------------------------------------------------------------------ demonstrations
    async def demonstrations_of(
        self, index: int, source: DemonstrationsConfig, round_: int | None = None
    ) -> dict[str, int]:
        """``source``'s kept demonstrations (played now, or read back from an earlier sitting);
        returns the counts: played, failed, kept, turns."""
        name = _name(index, source, round_)
        folder = self.run_dir / DEMONSTRATIONS
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.jsonl"
        counts_path = folder / f"{name}.counts.yaml"
        if path.is_file() and counts_path.is_file():
            self.demos[name] = read_demonstrations(path)
            return dict(yaml.safe_load(counts_path.read_text()))
        what = {"scripted": f"agent {source.agent}", "teacher": "the teacher", "traces": "the trace store"}
        self.say(
            f"demonstrations {name}: {what.get(source.source, 'the policy')} playing "
            f"{source.episodes or 'the default number of'} episodes"
            if source.source != "traces"
            else f"demonstrations {name}: reading {source.store}"
        )
        tick = time.perf_counter()
        played = [0]

        def progress(episode: Any) -> None:
            played[0] += 1
            if played[0] % 64 == 0:
                self.say(f"  {played[0]} episodes played", highlight=False)

        engine = None
        if source.source == "policy":
            self.actor.eval()
            engine = self.policy_engine()
        demos, episodes = await collect(self.config, source, name=name, policy_engine=engine, on_episode=progress)
        failed = [e for e in episodes if e.failed]
        counts = {
            "played": len(episodes) if source.source != "traces" else len(demos),
            "failed": len(failed),
            "kept": len(demos),
            "turns": sum(len(d.turns) for d in demos),
            "seconds": round(time.perf_counter() - tick, 1),
        }
        if failed:
            self.say(f"  [yellow]{len(failed)} episodes failed[/] (not kept), e.g.: {failed[0].error}")
        if episodes and not demos and source.source == "policy":
            self.say(f"  [yellow]the policy won none of its {len(episodes)} episodes this round[/]")
        elif episodes and not demos:
            raise ConfigError(
                f"sft.demonstrations: {name} kept none of its {len(episodes)} episodes (failed: {len(failed)}); "
                "check the source and its filter (keep, min_reward)"
            )
        self.say(
            f"  kept {counts['kept']} of {counts['played']} episodes ({counts['turns']} turns) in {counts['seconds']} s"
        )
        write_demonstrations(path, demos)
        counts_path.write_text(yaml.safe_dump(counts))
        self.demos[name] = demos
        return counts

    # ------------------------------------------------------------------ the actor
    def fit(self, round_: int) -> list[dict[str, float]]:
        """The epochs of one round over every demonstration kept so far."""
        s = self.s
        everything = [d for demos in self.demos.values() for d in demos]
        train, held = split_episodes(everything, s.held_out_fraction, s.seed)
        rows, held_rows = rows_of(train), rows_of(held)
        if not rows:
            raise ConfigError("sft: no demonstration turn to train on (every kept episode has no answer tokens)")
        batches_per_epoch = len(_mini_batches(rows, s.batch_turns, torch.arange(len(rows))))
        self.state["total_steps"] = self.state["step"] + (s.epochs - self.state["epoch"]) * batches_per_epoch
        if self.logger is not None:
            self.logger.total = self.state["total_steps"]
            self.logger.progress.update(self.logger.task, total=self.state["total_steps"])
        self.say(
            f"round {round_}: {sum(r.turns for r in rows)} turns in {len(rows)} rows "
            f"({len(train)} episodes), held out {len(held)} episodes; {batches_per_epoch} steps an epoch"
        )
        self._trunk_of(rows + held_rows)
        history = []
        for epoch in range(self.state["epoch"], s.epochs):
            order = torch.randperm(
                len(rows), generator=self.shuffle.manual_seed(s.seed * 1_000_003 + round_ * 1009 + epoch)
            )
            batches = _mini_batches(rows, s.batch_turns, order)
            sums: dict[str, float] = {}
            first = self.state["batch"]
            for b in range(first, len(batches)):
                tick = time.perf_counter()
                metrics = self._step(rows, batches[b])
                metrics["step_s"] = time.perf_counter() - tick
                self.state["step"] += 1
                self.state["batch"] = b + 1
                for key, value in metrics.items():
                    sums[key] = sums.get(key, 0.0) + value
                if self.state["step"] % LOG_EVERY == 0 or b + 1 == len(batches):
                    self.log(self.state["step"], {**metrics, "epoch": epoch + b / len(batches), "round": float(round_)})
                if s.save_every and self.state["step"] % s.save_every == 0 and b + 1 < len(batches):
                    self.save()
            ran = max(1, len(batches) - first)
            figures = {k: v / ran for k, v in sums.items()}
            figures |= self._held_out(held_rows) | memory_metrics()
            figures |= {"epoch": float(epoch + 1), "round": float(round_)}
            self.log(self.state["step"], figures, kind="sft_epoch")
            history.append({"step": self.state["step"], **figures})
            self.state["epoch"], self.state["batch"] = epoch + 1, 0
            self.save()
        self.trunk = {}
        return history

    def _trunk_of(self, rows: Sequence[SftRow]) -> None:
        """The frozen trunk's output for every row without images (once per round)."""
        self.trunk = {}
        if self.trunk_depth is None:
            return
        plain = [i for i, r in enumerate(rows) if not r.images]
        tick = time.perf_counter()
        with autocast(self.device, self.compute):
            states = trunk_states(
                self.actor.base_model,
                [rows[i].ids for i in plain],
                self.trunk_depth,
                self.pad_id,
                self.device,
                self.config.algorithm.micro_batch_tokens,
                min_shared=self.config.algorithm.shared_prefix_min_tokens,
            )
        for i, state in zip(plain, states):
            self.trunk[id(rows[i])] = state.detach()
        self.say(f"  the frozen trunk's states of {len(plain)} rows: {time.perf_counter() - tick:.0f} s")

    def _micro(self, rows: Sequence[SftRow], group: list[int]) -> tuple[PackedRows, Trunk | None]:
        """Rows ``group`` laid out for one pass (from the trunk's states when they are kept)."""
        if len(group) == 1 and rows[group[0]].images:
            row = rows[group[0]]
            ids, mask = pad_rows([row.ids], self.pad_id, self.device)
            return PackedRows(ids, mask, pixels=self._pixels(row.images), pixels_prompt_len=row.prompt_len), None
        trunk = None
        if self.trunk:
            trunk = Trunk(self.trunk_depth, pad_states([self.trunk[id(rows[r])] for r in group]).to(self.device))
        share = 0 if trunk is not None else self.config.algorithm.shared_prefix_min_tokens
        packed = pack_rows(
            [rows[r].ids for r in group],
            self.pad_id,
            self.device,
            first_read=[rows[r].first_answer - 1 for r in group],
            min_shared=share,
        )
        return packed, trunk

    def _pixels(self, images: Sequence[str]) -> dict[str, torch.Tensor]:
        import base64

        if self.image_inputs is None:
            raise ConfigError("a demonstration holds images, and the model being tuned has no image processor")
        made = self.image_inputs([base64.b64decode(x) for x in images])
        return {k: v.to(self.device) for k, v in made.items()}

    def _groups(self, rows: Sequence[SftRow], picked: Sequence[int]) -> list[list[int]]:
        alone = [[r] for r in picked if rows[r].images]
        plain = [r for r in picked if not rows[r].images]
        return micro_batches(plain, [len(r.ids) for r in rows], self.config.algorithm.micro_batch_tokens) + alone

    def _answers(self, rows: Sequence[SftRow], group: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``read_at``, ``targets`` and the mask ``[b, M]`` of the answer tokens of ``group``."""
        width = max(len(rows[r].answers) for r in group)
        read_at = torch.zeros(len(group), width, dtype=torch.long)
        targets = torch.zeros(len(group), width, dtype=torch.long)
        mask = torch.zeros(len(group), width, dtype=torch.bool)
        for i, r in enumerate(group):
            positions = torch.as_tensor(rows[r].answers)
            read_at[i, : len(positions)] = positions - 1
            targets[i, : len(positions)] = torch.as_tensor(rows[r].ids)[positions]
            mask[i, : len(positions)] = True
        return read_at, targets, mask

    def _step(self, rows: Sequence[SftRow], picked: Sequence[int]) -> dict[str, float]:
        """One optimizer step on the rows ``picked``: the token mean over all their answer tokens."""
        self.actor.train()
        total = sum(len(rows[r].answers) for r in picked)
        loss_sum, hits_sum = 0.0, 0.0
        for group in self._groups(rows, picked):
            read_at, targets, mask = self._answers(rows, group)
            packed, trunk = self._micro(rows, group)
            with autocast(self.device, self.compute):
                logp, hits = answer_logprobs(self.actor, packed, read_at, targets, trunk=trunk)
            mask = mask.to(logp.device)
            loss, _ = sft_loss(logp.float(), mask)
            share = float(mask.sum()) / total
            (loss * share).backward()
            loss_sum += float(loss.detach()) * share
            hits_sum += float((hits & mask).sum())
        lr = self.s.lr * min(1.0, (self.state["step"] + 1) / self.s.warmup_steps) if self.s.warmup_steps else self.s.lr
        for group_ in self.optimizer.param_groups:
            group_["lr"] = lr
        params = trainable_parameters(self.actor)
        norm = torch.nn.utils.clip_grad_norm_(params, self.s.max_grad_norm or float("inf"))
        skipped = not torch.isfinite(norm)
        if not skipped:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.actor.eval()
        return {
            "sft_loss": loss_sum,
            "token_accuracy": hits_sum / max(1, total),
            "grad_norm": float(norm) if not skipped else float("nan"),
            "skipped_steps": float(skipped),
            "lr": lr,
            "answer_tokens": float(total),
            "turns": float(sum(rows[r].turns for r in picked)),
        }

    @torch.no_grad()
    def _held_out(self, rows: Sequence[SftRow]) -> dict[str, float]:
        """The mean loss and token accuracy over the held-out episodes' answers."""
        if not rows:
            return {}
        self.actor.eval()
        nll, hits, tokens = 0.0, 0.0, 0
        for group in self._groups(rows, range(len(rows))):
            read_at, targets, mask = self._answers(rows, group)
            packed, trunk = self._micro(rows, group)
            with autocast(self.device, self.compute):
                logp, hit = answer_logprobs(self.actor, packed, read_at, targets, trunk=trunk)
            mask = mask.to(logp.device)
            nll -= float((logp.float() * mask).sum())
            hits += float((hit & mask).sum())
            tokens += int(mask.sum())
        return {"held_out_loss": nll / max(1, tokens), "held_out_accuracy": hits / max(1, tokens)}

    # ------------------------------------------------------------------ the critic
    def fit_critic(self) -> list[dict[str, float]]:
        """A critic fitted to the demonstrations' returns (:mod:`verlog.sft.critic`)."""
        self.say(
            f"the critic: fitting the demonstrations' discounted returns (gamma_step {self.config.algorithm.gamma_step})"
        )
        policy = self.actor if self.peft_actor is None else copy.deepcopy(self.peft_actor).merge_and_unload()
        history: list[dict[str, float]] = []

        def log(figures: dict[str, float]) -> None:
            self.log(self.state["step"], figures, kind="sft_critic")
            history.append(figures)

        demos = [d for demos in self.demos.values() for d in demos]
        self.critic = fit_critic(
            self.config, policy, demos, pad_id=self.pad_id, device=self.device, compute=self.compute, log=log
        )
        return history

    # ------------------------------------------------------------------ checkpoints
    def save(self, *, force: bool = False) -> Path | None:
        """Checkpoint the current step (``force``: even if this step is saved already)."""
        latest = ckpt.latest_checkpoint(self.run_dir)
        if latest is not None and not force and ckpt.read_state(latest)["update"] == self.state["step"]:
            return latest
        if self.state["step"] == 0 and self.critic is None:
            return None
        state = {k: v for k, v in self.state.items() if k != "update"}
        return ckpt.save_checkpoint(
            self.run_dir,
            self.state["step"],
            save_actor=lambda folder: save_actor(
                folder, self.actor, self.peft_actor, self.tokenizer, self.config.model.path
            ),
            critic=self.critic,
            optimizers={"actor": self.optimizer},
            rng=ckpt.get_rng_state(),
            state={**state, "kind": "sft"},
            keep=self.s.keep_checkpoints,
        )

    def restore(self, checkpoint: Path) -> None:
        """The weights not loaded with the actor, the optimizer, the RNGs, the counters."""
        saved = ckpt.read_state(checkpoint)
        self.state.update(
            {
                k: v
                for k, v in saved.items()
                if k in ("round", "epoch", "batch", "wandb_id", "critic_done", "total_steps")
            }
        )
        self.state["step"] = int(saved["update"])
        if self.peft_actor is not None:
            from verlog.models.safe_load import load_adapter_weights

            load_adapter_weights(self.peft_actor, ckpt.folder_file(checkpoint, ckpt.ADAPTER_FOLDER))
        check_finite_weights(self.actor, str(checkpoint))
        ckpt.load_optimizers(checkpoint, {"actor": self.optimizer})
        ckpt.set_rng_state(ckpt.load_rng(checkpoint))


def _mini_batches(rows: Sequence[SftRow], batch_turns: int, order: torch.Tensor) -> list[list[int]]:
    """``order``'s rows in consecutive groups of about ``batch_turns`` turns each (a row holding
    several turns counts them all)."""
    batches, current, turns = [], [], 0
    for r in order.tolist():
        current.append(r)
        turns += rows[r].turns
        if turns >= batch_turns:
            batches.append(current)
            current, turns = [], 0
    if current:
        batches.append(current)
    return batches


def _prepare_run_dir(run_dir: Path, config: VerlogConfig, resume: bool) -> Path | None:
    """The checkpoint to resume from. A new run refuses a folder that holds a run; ``--resume``
    refuses a folder without one (nothing is changed either way)."""
    latest = ckpt.latest_checkpoint(run_dir)
    began = (run_dir / DEMONSTRATIONS).is_dir() or (run_dir / "metrics.jsonl").is_file()
    if (latest is not None or began) and not resume:
        raise ConfigError(
            f"sft.run_dir: {str(run_dir)!r} already holds a run; pass --resume to continue it, or choose another "
            "sft.run_dir"
        )
    if resume and latest is None and not began:
        raise ConfigError(
            f"sft.run_dir: --resume, but {str(run_dir)!r} holds no run to resume; nothing was changed: check "
            "sft.run_dir, or start it without --resume"
        )
    if latest is not None:
        ckpt.verify_checkpoint(latest)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return latest


def _write_eval_json(path: Path, result: SftResult) -> None:
    import json

    data = {
        "steps": result.steps,
        "before": [r.as_dict() for r in result.eval_start] if result.eval_start else None,
        "after": [r.as_dict() for r in result.eval_end] if result.eval_end else None,
    }
    path.write_text(json.dumps(data, indent=1))
