"""``VerlogPPOTrainer``: verl's synchronous v1 PPO trainer with verlog's advantages and critic
pre-training (registered with verl as ``trainer.v1.trainer_mode: verlog``).

It changes these things in verl's ``PPOTrainerSync`` and leaves the rest (Ray worker groups,
FSDP/Megatron engines, SGLang/vLLM replicas, weight sync, checkpoints, validation) to verl:

1. **Advantages** (``_compute_advantage``): the batch's per-turn rows are read from verl's
   TransferQueue, grouped by the agent-loop call they came from (one env slot's consecutive
   turns, ordered by turn) and given to verlog's estimator registry as a ``TurnBatch`` and its
   ``TurnData`` (``verlog.integrations.verl.advantage``; the estimator is
   ``algorithm.adv_estimator``, one of ``verlog.algo.estimators``); advantages, returns, rewards
   (and the policy-loss mask, when the estimator leaves turns out) go back to the queue for
   verl's actor and critic updates. verl builds a critic exactly when the estimator has one
   (``check_verl_config``).
2. **Critic pre-training** (``step``, first step only, estimators with a critic): Verlog's schedule. ``W`` batches are
   collected with the initial policy (``verlog.critic_warmup.buffer_multiplier``), then ``S``
   critic-only updates (``iterations``) each recompute values and GAE over the whole buffer and
   fit the critic on a random ``subset_fraction`` of its rows (``verlog.algo.CriticWarmup``).
   Each subset is padded (verl's ``_balance_batch``) *before* that iteration's values and GAE:
   verl's padding rows copy a real row's fields, so padding after them would hand the critic a
   1-token row carrying another row's per-token values and returns.
3. **Synchronous semantics under a new name**: verl chooses its replay buffer and dataloader
   granularity by ``trainer_mode == "sync"``; this trainer is synchronous (each step's rollout
   finishes before the update, then the weights are synced), so it keeps those code paths.
4. **Slot episode counters in checkpoints**: each step's rows report how many episodes every
   env slot has started; they are saved next to verl's checkpoint (``verlog_slots.json`` in
   ``global_step_N/``) and, on resume, handed back to the slots through the dataset's rows, so
   seeds go on where they stopped.

Import this module (or run ``verlog train --engine verl``, whose Ray task runner imports it) before
verl looks the trainer up: registration happens at import time, in the process that imports it.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import torch
import transfer_queue as tq
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.debug import marked_timer
from verl.workers.utils.padding import response_to_nested

from verlog.algo import CriticWarmup
from verlog.algo.estimators import check_estimator_settings, get_estimator
from verlog.config import ConfigError
from verlog.integrations.verl.advantage import compute_turn_advantages
from verlog.integrations.verl.samples import TURN, RowInfo, row_info
from verlog.integrations.verl.settings import ESTIMATOR_KEY, TRAINER_NAME, AgentSpec, agent_spec

__all__ = ["SLOTS_FILE", "VerlogPPOTrainer", "check_verl_config", "row_infos"]

logger = logging.getLogger(__name__)

#: the file next to verl's checkpoint holding the env slots' episode counters
SLOTS_FILE = "verlog_slots.json"


def check_verl_config(config: Any) -> AgentSpec:
    """Validate what this trainer needs from a verl config (errors name the key, in one line).

    The estimator (``algorithm.adv_estimator``) must be one of verlog's registry and its settings
    (``verlog.advantage``) must combine (``check_estimator_settings``); verl must build a critic
    exactly when the estimator has one (verl's own ``need_critic``: ``critic.enable``, which the
    launcher sets from the estimator); the group estimators need slot groups
    (``verlog.group_size`` > 1); GAE's ``lam_token`` must be 1 (verl's critic has no value after a
    response's last token).
    """
    from verl.trainer.ppo.utils import need_critic

    spec = agent_spec(config)
    estimator = get_estimator(spec.estimator)
    settings = spec.advantage_settings()
    try:
        check_estimator_settings(settings)
    except ValueError as exc:  # the registry names the embedded trainer's key, algorithm.<name>
        raise ConfigError(str(exc).replace("algorithm.", "verlog.advantage.", 1)) from None
    critic = bool(need_critic(config))
    if estimator.needs_critic and not critic:
        raise ConfigError(
            f"critic.enable=false: {ESTIMATOR_KEY}={estimator.name} trains with a critic; "
            "leave critic.enable unset (the launcher sets it from the estimator)"
        )
    if critic and not estimator.needs_critic:
        raise ConfigError(
            f"critic.enable=true: {ESTIMATOR_KEY}={estimator.name} has no critic (verl would build and train one "
            "for nothing); leave critic.enable unset (the launcher sets it from the estimator)"
        )
    if estimator.needs_critic and settings.lam_token != 1.0:
        raise ConfigError(
            f"verlog.advantage.lam_token={settings.lam_token:g}: must be 1.0 under verl with {ESTIMATOR_KEY}="
            f"{estimator.name}: verl's critic gives no value after a response's last token, which dual-discount "
            "GAE needs when lam_token < 1"
        )
    if estimator.compares_groups and spec.settings.group_size == 1:
        raise ConfigError(
            f"verlog.group_size=1: {ESTIMATOR_KEY}={estimator.name} compares the episodes of a slot group (slots "
            "playing the same seeds); with groups of one slot every advantage is 0: set verlog.group_size > 1 "
            f"dividing verlog.num_envs x rollout.n = {spec.num_slots}"
        )
    return spec


def row_infos(extra_fields: Any, tags: list[dict], response_lengths: list[int]) -> list[RowInfo | None]:
    """verlog's facts about each row of a sampled batch; ``None`` for verl's padding rows (their
    tag says so; they also carry a copy of a real row's extra fields, with no response token)."""
    infos: list[RowInfo | None] = []
    for fields, tag, length in zip(list(extra_fields), tags, response_lengths, strict=True):
        info = None if tag.get("is_padding", False) else row_info(fields)
        if info is not None and info.kind == TURN and length == 0:
            info = None
        infos.append(info)
    return infos


@register_trainer(TRAINER_NAME)
class VerlogPPOTrainer(PPOTrainerSync):
    """verl's synchronous PPO trainer training verlog's per-turn samples (see the module docstring)."""

    def __init__(self, config: Any):
        self.spec = check_verl_config(config)
        warmup = self.spec.settings.critic_warmup
        self.critic_warmup = CriticWarmup(
            warmup.buffer_multiplier, warmup.iterations, warmup.subset_fraction, seed=self.spec.settings.seed
        )
        #: episodes started per env slot (``"{row}:{session}"``), as the latest rows reported
        self.slot_episodes: dict[str, int] = {}
        #: the round each env slot had in flight at its latest report (``None``: none), by the same keys
        self.slot_in_flight: dict[str, int | None] = {}
        #: tokens the latest advantages left in the policy loss (0: the actor update is skipped)
        self._policy_tokens: int | None = None
        super().__init__(config)

    # ------------------------------------------------------------------ verl hooks
    def _build_replay_buffer(self) -> Any:
        # verl selects its synchronous replay buffer and dataloader settings by this name
        self.trainer_mode = "sync"
        return super()._build_replay_buffer()

    def step(self, metrics: dict, timing_raw: dict) -> KVBatchMeta:
        # no critic, nothing to pre-train (as in the embedded trainer)
        if (
            self.use_critic
            and self.critic_warmup.enabled
            and self.global_steps <= 1
            and not getattr(self, "_critic_pretrained", False)
        ):
            self._critic_pretrained = True
            with marked_timer("verlog_critic_pretrain", timing_raw, color="cyan"):
                self._pretrain_critic(metrics)
        return super().step(metrics, timing_raw)

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict, *, initial_policy: bool = False) -> KVBatchMeta:
        """The estimator's advantages over the batch's per-turn rows (``verlog.algo.estimators``).

        ``initial_policy``: the batch was generated by the initial weights and the actor has not
        moved (critic pre-training): the policy equals the reference, so KL-in-reward is exactly
        0, and no old logprobs were computed for it.
        """
        from verl.protocol import DataProto

        algorithm = self.config.algorithm
        use_kl = bool(algorithm.use_kl_in_reward) and not initial_policy
        settings = self.spec.advantage_settings()
        critic = get_estimator(settings.estimator).needs_critic
        fields = ["response_mask", "extra_fields"] + (["values"] if critic else [])
        if use_kl:
            fields += ["old_log_probs", "ref_log_prob"]
        correction = None if initial_policy else self._rollout_correction()
        if correction is not None:
            fields += [f for f in ("old_log_probs", "rollout_log_probs") if f not in fields]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        nested_mask = data["response_mask"]
        extra = data.pop("extra_fields")
        infos = row_infos(extra, batch.tags, nested_mask.offsets().diff().tolist())
        data = DataProto(batch=data.to_padded_tensor())

        # the estimator on the turns as sampled (each response mask a prefix) ...
        sampled_mask = data.batch["response_mask"]
        data, adv_metrics = compute_turn_advantages(
            data,
            infos,
            settings,
            kl_ctrl=self.kl_ctrl_in_reward if use_kl else None,
            kl_penalty=algorithm.kl_penalty,
        )
        metrics.update(adv_metrics)
        self._note_slot_episodes(infos)
        # each turn's own reward (verl copied the call's last reward onto all of its rows)
        data.batch["rm_scores"] = data.batch["token_level_scores"]
        written = ["advantages", "returns", "token_level_rewards", "rm_scores"]
        if data.batch["response_mask"] is not sampled_mask:
            # the estimator left turns out of the policy loss: verl's losses read response_mask, and
            # its engines count a batch's tokens (the token-mean's denominator) from loss_mask,
            # stored as the sampled response_mask: both lose those turns
            data.batch["loss_mask"] = data.batch["response_mask"]
            written += ["response_mask", "loss_mask"]
        # every turn left out (e.g. DAPO dropped every group: all of them tied): no policy token to
        # correct or train; verl's correction refuses an empty mask and its token-mean would be 0/0
        self._policy_tokens = int(data.batch["response_mask"].sum())
        if correction is not None and self._policy_tokens:  # ... then verl's correction may mask tokens out
            from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

            data, corr_metrics = compute_rollout_correction_and_add_to_batch(data, correction)
            metrics.update(corr_metrics)
            if "response_mask" not in written:
                written.append("response_mask")
            if "rollout_is_weights" in data.batch:
                written.append("rollout_is_weights")
        output = TensorDict(
            {name: response_to_nested(data.batch[name], nested_mask) for name in written}, batch_size=len(batch)
        )
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=output)

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """verl's actor update, skipped when the estimator left every turn of the batch out of the
        policy loss (nothing to learn from; the embedded trainer skips such a step too)."""
        if self._policy_tokens == 0:
            metrics["verlog/actor_update_skipped"] = 1.0
            logger.warning(
                "step %s: every turn is out of the policy loss; the actor update is skipped", self.global_steps
            )
            return batch
        metrics["verlog/actor_update_skipped"] = 0.0
        return super()._update_actor(batch, metrics)

    def _rollout_correction(self) -> Any:
        """verl's rollout-correction config when it applies (decoupled mode with engine logprobs)."""
        config = self.config.algorithm.get("rollout_correction", None)
        if config is None or config.get("bypass_mode", False):
            return None
        if not self.config.actor_rollout_ref.rollout.get("calculate_log_probs", False):
            return None
        return config

    # ------------------------------------------------------------------ critic pre-training
    def _pretrain_critic(self, metrics: dict) -> None:
        """Verlog's critic pre-training: collect ``W`` batches once with the initial policy, then
        ``S`` critic-only updates on random subsets of them, values and GAE recomputed each time."""
        warmup = self.critic_warmup
        batches = [self._collect_batch() for _ in range(warmup.buffer_multiplier)]
        self.checkpoint_manager.sleep_replicas()  # rollout is done: free its memory for the critic
        buffer = KVBatchMeta(
            keys=[k for b in batches for k in b.keys],
            tags=[t for b in batches for t in b.tags],
            partition_id="train",
        )
        prep: dict = {}
        # whole batches (GAE needs each slot's turns together), padded for the critic's workers
        balanced = [self._balance_batch(b, metrics=prep, logging_prefix="verlog_warmup_seqlen") for b in batches]
        used = set(buffer.keys)
        for iteration, subset in enumerate(warmup.subsets(len(buffer))):
            step_metrics: dict = {}
            chosen = subset.tolist()
            sample = KVBatchMeta(
                keys=[buffer.keys[i] for i in chosen], tags=[buffer.tags[i] for i in chosen], partition_id="train"
            )
            # pad the subset first: verl's padding rows copy the subset's first row, whatever
            # per-token fields it has; values and GAE below rewrite them at the padding row's length
            sample = self._balance_batch(sample, metrics=step_metrics, logging_prefix="verlog_warmup_seqlen")
            pads = [(k, t) for k, t in zip(sample.keys, sample.tags) if k not in used]
            for part in balanced:
                self._compute_values(part, metrics=step_metrics)
            if pads:
                self._zero_padding_values([k for k, _ in pads], like=balanced[0].keys[0])
            everything = KVBatchMeta(
                keys=[k for part in balanced for k in part.keys] + [k for k, _ in pads],
                tags=[t for part in balanced for t in part.tags] + [t for _, t in pads],
                partition_id="train",
            )
            self._compute_advantage(everything, metrics=step_metrics, initial_policy=True)
            sample.extra_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
            self._update_critic(sample, metrics=step_metrics)
            used.update(sample.keys)
            loss = step_metrics.get("critic/vf_loss")
            if loss is not None:
                metrics["verlog/critic_warmup/vf_loss"] = float(loss)
            logger.info("verlog critic pre-training %d/%d: vf_loss %s", iteration + 1, warmup.iterations, loss)
        for part in balanced:
            used.update(part.keys)
        metrics["verlog/critic_warmup/batches"] = float(len(batches))
        metrics["verlog/critic_warmup/buffer_rows"] = float(len(buffer))
        tq.kv_clear(keys=sorted(used), partition_id="train")
        # wake the replicas for the first training batch (the actor has not moved)
        self.checkpoint_manager.update_weights(self.global_steps - 1)

    def _zero_padding_values(self, keys: list[str], like: str) -> None:
        """Give verl's padding rows a value at each of their own response tokens (one, masked
        out of every loss), in place of the copy of another row's values they were made with; in
        the dtype of the critic's values (row ``like``'s: bf16 under autocast), so the batch's
        rows stack."""
        data = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["response_mask"])
        lengths = data["response_mask"].offsets().diff().tolist()
        dtype = tq.kv_batch_get(keys=[like], partition_id="train", select_fields=["values"])["values"].dtype
        values = torch.nested.as_nested_tensor([torch.zeros(n, dtype=dtype) for n in lengths], layout=torch.jagged)
        tq.kv_batch_put(keys=keys, partition_id="train", fields=TensorDict({"values": values}, batch_size=len(keys)))

    def _collect_batch(self) -> KVBatchMeta:
        """One rollout batch with the current weights (no update follows)."""
        self.prepare_step()
        batch, _ = self.replay_buffer.sample(
            global_steps=self.global_steps, partition_id="train", batch_size=self.config.data.train_batch_size
        )
        batch.extra_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
        return batch

    # ------------------------------------------------------------------ slot counters
    def _note_slot_episodes(self, infos: list[RowInfo | None]) -> None:
        """Keep the slots' episode counters and rounds in flight the rows report; the dataset's
        next rows carry them (a slot started afresh, as after a resume, goes on from there: first
        the episode it had in flight, played whole again, then its next seeds)."""
        for info in infos:
            summary = (info.summary or {}) if info is not None else {}
            for key, count in (summary.get("episodes_started") or {}).items():
                self.slot_episodes[str(key)] = max(int(count), self.slot_episodes.get(str(key), 0))
            for key, round_ in (summary.get("in_flight") or {}).items():
                self.slot_in_flight[str(key)] = None if round_ is None else int(round_)
        dataset = getattr(self, "train_dataset", None)
        if dataset is not None and hasattr(dataset, "episodes_started"):
            dataset.episodes_started = dict(self.slot_episodes)
            dataset.in_flight = dict(self.slot_in_flight)

    def _save_checkpoint(self) -> None:
        # before verl's own save, which ends by naming this step the latest checkpoint
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, SLOTS_FILE), "w") as f:
            json.dump({"episodes_started": self.slot_episodes, "in_flight": self.slot_in_flight}, f)
        super()._save_checkpoint()

    def _load_checkpoint(self) -> None:
        super()._load_checkpoint()
        if not self.global_steps:
            return
        folder = (
            self.config.trainer.get("resume_from_path") if self.config.trainer.resume_mode == "resume_path" else None
        )
        folder = folder or os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        if not os.path.isabs(folder):
            folder = os.path.join(os.getcwd(), folder)
        path = os.path.join(folder, SLOTS_FILE)
        if not os.path.exists(path):
            logger.warning("no %s in %s: env slots start their seeds from episode 0", SLOTS_FILE, folder)
            return
        with open(path) as f:
            saved = json.load(f)
        self.slot_episodes = {str(k): int(v) for k, v in saved.get("episodes_started", {}).items()}
        # an older file has no rounds in flight: those slots go on with their next seeds
        self.slot_in_flight = {str(k): None if v is None else int(v) for k, v in saved.get("in_flight", {}).items()}
        self._note_slot_episodes([])
