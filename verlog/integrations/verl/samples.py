"""verlog turns as verl samples: one ``AgentLoopOutput`` per turn, what each carries, and back.

A verl agent loop may return a list of outputs; verl stores each as its own row (key
``{uid}_{session}_{index}``) and trains it as an independent sequence. verlog returns one
output per turn (a model call): ``prompt_ids`` exactly as the engine saw them, ``response_ids``
exactly as it produced them, one logprob per response id, ``response_mask`` all ones. What the
advantage step needs rides in ``extra_fields`` under the ``verlog_*`` keys below.

Besides turns, a sample may carry *value-query rows*: a prompt followed by one end-of-sequence
token with ``response_mask`` 0. They train nothing (verl builds its own no-op padding rows the
same way); they are there so that verl's critic computes the value of a state no turn starts from:

* a *next-state row* (``verlog_kind: next_state``) after each truncated turn whose environment
  reported the prompt that would have come next (``Turn.next_prompt_ids``): its value bootstraps
  the truncated turn (``TurnBatch.truncation_values``);
* one *bootstrap row* (``verlog_kind: bootstrap``), always last: the prompt a slot's next model
  call is waiting with at the batch boundary; its value ``V(s_{t+1})`` bootstraps the cut turn.

The rows of a sample come in this order (``verlog_position``): its turns in time order, then
its next-state rows, then the bootstrap row.

verl copies the last output's ``reward_score`` onto the others of the same list (it assumes one
reward per trajectory), so a turn's own reward is carried in ``verlog_reward`` and the trainer
rewrites ``rm_scores`` from it.

An image turn (``Turn.images``: a vision-language model's prompt) carries its images as verl's own
agent loops do: ``multi_modal_data={"images": [PIL.Image, ...]}``, RGB images opened from the very
bytes the turn keeps, in prompt order; its ``prompt_ids`` stay the turn's (the processor's
expanded ids). verl's agent-loop worker turns them into the row's ``multi_modal_inputs`` (its
processor's pixel inputs, e.g. ``pixel_values`` and ``image_grid_thw``) and ``position_ids``
(M-RoPE's for Qwen2-VL-like models), and drops the images themselves. A bootstrap row whose
held prompt has images carries them the same way (the critic values the prompt with its
pictures). A text row has no ``multi_modal_data``.

A turn row also carries what the advantage estimators of ``verlog.algo.estimators`` may need
besides rewards (``TurnData``): the seed of its episode (``verlog_seed``: episodes of one seed
form a group for grpo, rloo and gigpo), whether it opens its episode (``verlog_starts_episode``:
False for the first turn of an episode continued from an earlier batch) and the anchor state the
environment reported with its reward (``verlog_anchor``, from ``info["anchor"]``: gigpo).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Literal, Sequence

from verlog.rollout.turn import Episode, Turn
from verlog.step_info import ANCHOR_KEY, episode_outcomes

__all__ = [
    "BOOTSTRAP",
    "NEXT_STATE",
    "TURN",
    "RowInfo",
    "anchor_key",
    "bootstrap_output",
    "episode_summary",
    "multi_modal_data",
    "next_state_output",
    "row_info",
    "turn_output",
]

# ``extra_fields`` keys of a verlog row
KIND = "verlog_kind"  # "turn", "next_state" or "bootstrap"
TRAJECTORY = "verlog_trajectory"  # the agent-loop call the row came from (one slot's batch part)
POSITION = "verlog_position"  # the row's place in that call's list (time order; bootstrap last)
EPISODE_ID = "verlog_episode_id"
TURN_INDEX = "verlog_turn_index"  # the turn's index within its episode (a next-state row: its turn's)
REWARD = "verlog_reward"
TERMINATED = "verlog_terminated"
TRUNCATED = "verlog_truncated"
SUMMARY = "verlog_summary"  # on the first row of a call: episodes ended / failed meanwhile
SEED = "verlog_seed"  # a turn's episode's seed (its group), None where unknown
STARTS_EPISODE = "verlog_starts_episode"  # the turn opens its episode
ANCHOR = "verlog_anchor"  # the key of the state the turn acted in (``info["anchor"]``), None: none

TURN: Literal["turn"] = "turn"
BOOTSTRAP: Literal["bootstrap"] = "bootstrap"
NEXT_STATE: Literal["next_state"] = "next_state"


def anchor_key(info: dict[str, Any] | None) -> Any:
    """The anchor state a turn's environment reported (``info["anchor"]``) as a value rows can
    carry: the value itself when it is a str, int, float or bool, else its ``repr`` (the embedded
    trainer compares anchors the same way); None where there is none."""
    anchor = (info or {}).get(ANCHOR_KEY)
    if anchor is None or isinstance(anchor, (str, int, float, bool)):
        return anchor
    return repr(anchor)


def multi_modal_data(images: Sequence[str]) -> dict[str, Any] | None:
    """The ``multi_modal_data`` of a row whose prompt has ``images`` (base64 files, as
    ``Turn.images``): ``{"images": [PIL.Image, ...]}`` in prompt order, what verl's agent-loop
    worker computes the row's pixel inputs from; ``None`` for a text prompt."""
    if not images:
        return None
    from verlog.llm.images import open_images

    return {"images": open_images([base64.b64decode(x) for x in images])}


def _with_images(images: Sequence[str]) -> dict[str, Any]:
    """``AgentLoopOutput`` keyword arguments for a prompt's images (none for a text prompt: its
    row's fields stay exactly a text row's)."""
    data = multi_modal_data(images)
    return {} if data is None else {"multi_modal_data": data}


def _extra(
    *,
    kind: str,
    trajectory: str,
    position: int,
    episode_id: str,
    turn_index: int,
    reward: float,
    terminated: bool,
    truncated: bool,
    steps: tuple[int, int],
    summary: dict[str, Any] | None,
    seed: int | None = None,
    starts_episode: bool = False,
    anchor: Any = None,
) -> dict[str, Any]:
    return {
        KIND: kind,
        TRAJECTORY: trajectory,
        POSITION: position,
        EPISODE_ID: episode_id,
        TURN_INDEX: turn_index,
        REWARD: float(reward),
        TERMINATED: bool(terminated),
        TRUNCATED: bool(truncated),
        SUMMARY: summary,
        SEED: None if seed is None else int(seed),
        STARTS_EPISODE: bool(starts_episode),
        ANCHOR: anchor,
        # verl tags every row with the weights' versions it was generated with
        "min_global_steps": int(steps[0]),
        "max_global_steps": int(steps[1]),
        "reward_extra_info": {},
    }


def turn_output(
    turn: Turn,
    *,
    trajectory: str,
    position: int,
    episode_id: str,
    steps: tuple[int, int],
    summary: dict[str, Any] | None = None,
    seed: int | None = None,
    starts_episode: bool = False,
) -> Any:
    """The verl sample of one turn: its exact ids and logprobs (and its prompt's images), reward
    and done flags, and what estimators group it by (``seed``, ``starts_episode``: it opens its
    episode; its anchor)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    return AgentLoopOutput(
        prompt_ids=list(turn.prompt_ids),
        response_ids=list(turn.response_ids),
        response_mask=[1] * len(turn.response_ids),
        response_logprobs=list(turn.logprobs),
        reward_score=float(turn.reward),
        num_turns=2,  # verl counts chat messages of a sample: one prompt, one answer
        metrics=AgentLoopMetrics(),
        **_with_images(turn.images),
        extra_fields=_extra(
            kind=TURN,
            trajectory=trajectory,
            position=position,
            episode_id=episode_id,
            turn_index=turn.turn_index,
            reward=turn.reward,
            terminated=turn.terminated,
            truncated=turn.truncated,
            steps=steps,
            summary=summary,
            seed=seed,
            starts_episode=starts_episode,
            anchor=anchor_key(turn.info),
        ),
    )


def _value_query(
    kind: str,
    prompt_ids: Sequence[int],
    pad_id: int,
    *,
    trajectory: str,
    position: int,
    episode_id: str,
    turn_index: int,
    steps: tuple[int, int],
    images: Sequence[str] = (),
) -> Any:
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    return AgentLoopOutput(
        prompt_ids=list(prompt_ids),
        response_ids=[int(pad_id)],
        response_mask=[0],
        response_logprobs=[0.0],
        reward_score=0.0,
        num_turns=1,
        metrics=AgentLoopMetrics(),
        **_with_images(images),
        extra_fields=_extra(
            kind=kind,
            trajectory=trajectory,
            position=position,
            episode_id=episode_id,
            turn_index=turn_index,
            reward=0.0,
            terminated=False,
            truncated=False,
            steps=steps,
            summary=None,
        ),
    )


def bootstrap_output(
    prompt_ids: Sequence[int],
    pad_id: int,
    *,
    trajectory: str,
    position: int,
    episode_id: str,
    turn_index: int,
    steps: tuple[int, int],
    images: Sequence[str] = (),
) -> Any:
    """The value-query row of a slot's waiting prompt (``response_mask`` 0: it trains nothing),
    with the prompt's ``images`` (base64 files, as ``SlotBatch.slot_images()``) where it has some."""
    return _value_query(
        BOOTSTRAP,
        prompt_ids,
        pad_id,
        trajectory=trajectory,
        position=position,
        episode_id=episode_id,
        turn_index=turn_index,
        steps=steps,
        images=images,
    )


def next_state_output(
    prompt_ids: Sequence[int],
    pad_id: int,
    *,
    trajectory: str,
    position: int,
    episode_id: str,
    turn_index: int,
    steps: tuple[int, int],
) -> Any:
    """The value-query row of the state after truncated turn ``turn_index`` of ``episode_id``
    (its ``next_prompt_ids``; ``response_mask`` 0: it trains nothing)."""
    return _value_query(
        NEXT_STATE,
        prompt_ids,
        pad_id,
        trajectory=trajectory,
        position=position,
        episode_id=episode_id,
        turn_index=turn_index,
        steps=steps,
    )


def episode_summary(ended: Sequence[Episode], failed: Sequence[Episode]) -> dict[str, Any]:
    """What happened in a slot while a batch was collected (logged by the trainer)."""
    failures: dict[str, int] = {}
    for e in failed:
        status = e.status if e.failed else "empty"
        failures[status] = failures.get(status, 0) + 1
    return {
        "returns": [float(e.total_reward) for e in ended],
        "lengths": [len(e.turns) for e in ended],
        "success": [float(won) for won in episode_outcomes(e.info for e in ended)],
        "failed": failures,
    }


@dataclass(frozen=True)
class RowInfo:
    """verlog's facts about one row of a verl batch (``None`` for rows verlog did not make)."""

    kind: str
    trajectory: str
    position: int
    episode_id: str
    turn_index: int
    reward: float
    terminated: bool
    truncated: bool
    summary: dict[str, Any] | None
    #: the seed of the turn's episode (its group), None where unknown
    seed: int | None = None
    #: the turn opens its episode (False: it continues one from an earlier turn or batch)
    starts_episode: bool = False
    #: the anchor state's key (``anchor_key``), None where the environment reported none
    anchor: Any = None


def row_info(extra_fields: Any) -> RowInfo | None:
    """Read a row's ``extra_fields`` (a dict, or tensordict's wrapper of one)."""
    fields = getattr(extra_fields, "data", extra_fields)
    if not isinstance(fields, dict) or fields.get(KIND) not in (TURN, BOOTSTRAP, NEXT_STATE):
        return None
    return RowInfo(
        kind=fields[KIND],
        trajectory=str(fields[TRAJECTORY]),
        position=int(fields[POSITION]),
        episode_id=str(fields[EPISODE_ID]),
        turn_index=int(fields[TURN_INDEX]),
        reward=float(fields[REWARD]),
        terminated=bool(fields[TERMINATED]),
        truncated=bool(fields[TRUNCATED]),
        summary=fields.get(SUMMARY),
        seed=None if fields.get(SEED) is None else int(fields[SEED]),
        starts_episode=bool(fields.get(STARTS_EPISODE, False)),
        anchor=fields.get(ANCHOR),
    )
