"""Which task each env slot's episodes play: the slot schedule shared by the embedded trainer's
``SlotRunner`` and verl's agent loop.

Slots come in groups of ``group_size`` consecutive slots (the episodes a group estimator
compares); ``groups`` groups in all. Round ``j`` of group ``g`` plays task

    first + j * groups + (g + j) % groups

(a seed, or the index of a training row's task, see ``verlog.data.tasks``). Every task
``first .. first + (j + 1) * groups - 1`` is played by the first ``j + 1`` rounds of every group,
each by one group (by all of its slots), and group ``g`` moves to another residue each round, so
tasks that make a game fail are spread over the slots instead of pinning one slot to them.
"""

from __future__ import annotations

__all__ = ["slot_seed"]


def slot_seed(first: int, j: int, group: int, groups: int) -> int:
    """The task of round ``j`` of slot group ``group`` (``groups`` groups in all)."""
    return first + j * groups + (group + j) % groups
