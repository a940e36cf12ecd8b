"""What the tests of verlog's verl agent loop share: verl's rollout batch of verlog's dataset rows,
built as verl's trainer builds one, and one call of verl's agent-loop worker on it."""

from __future__ import annotations

import asyncio
import uuid

import numpy as np


def dataset_batch(files, step, validate=False, episodes_started=None, in_flight=None):
    """A rollout batch of verlog's dataset rows, as verl's trainer builds one for step ``step``
    (``episodes_started`` and ``in_flight``: as the trainer restores them from a checkpoint)."""
    from verl.utils import tensordict_utils as tu
    from verl.utils.dataset.rl_dataset import collate_fn

    from verlog.integrations.verl.dataset import VerlogRows

    rows = VerlogRows(files)
    if episodes_started is not None:
        rows.episodes_started = episodes_started
    if in_flight is not None:
        rows.in_flight = in_flight
    data = collate_fn([rows[i] for i in range(len(rows))])
    data["uid"] = np.array([uuid.uuid4().hex for _ in range(len(rows))], dtype=object)
    batch = tu.get_tensordict(data)
    tu.assign_non_tensor_data(batch, "global_steps", step)
    if validate:
        tu.assign_non_tensor_data(batch, "validate", True)
    return batch


async def rollout_step(worker, store, batch, partition="train") -> list[str]:
    """One agent-loop call of verl's worker on ``batch``; the trajectory keys it added."""
    before = set(store.trajectory_keys(partition))
    await asyncio.wait_for(worker.generate_sequences(batch), 120)
    while worker.background_tasks:
        await asyncio.sleep(0.02)
    return [k for k in store.trajectory_keys(partition) if k not in before]
