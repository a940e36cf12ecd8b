"""Production traffic back to training (``serve-model --record``): what a served completion leaves
in the trace store.

:func:`episode_of` names the episode a completion is filed under (the client's
``X-Verlog-Episode`` header, else its ``user`` field, else one of its own); :func:`trace_headers`
are the answer's headers naming it and the model version; :func:`record_turn` hands the turn to
the recorder token-exact and waits until it is committed (unless the recorder writes behind);
:func:`attach_feedback` is ``POST /v1/feedback``'s work: a reward attached later to an episode or
a turn.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiohttp import web

from verlog.backends.base import Generation, SamplingParams
from verlog.serve import openai_protocol as proto
from verlog.serve.openai_protocol import APIError
from verlog.traces.recorder import TraceRecorder
from verlog.traces.records import EPISODE_HEADER, VERSION_HEADER, TracedTurn
from verlog.traces.store import UnknownEpisodeError

__all__ = ["attach_feedback", "episode_of", "record_turn", "sampling_info", "trace_headers"]

log = logging.getLogger(__name__)


def episode_of(request: web.Request, req: proto.ChatCompletionRequest, recording: bool) -> str | None:
    """The episode a recorded completion is filed under: the client's ``X-Verlog-Episode``
    header, else its ``user`` field, else a new one of its own (``None`` when not ``recording``)."""
    if not recording:
        return None
    named = request.headers.get(EPISODE_HEADER) or req.user
    if named is not None and (not 0 < len(named) <= 256 or "\x00" in named):
        raise APIError(
            400,
            f"the episode id ({EPISODE_HEADER} or 'user') must be 1 to 256 characters, without NUL",
            param="user",
        )
    return named or proto.completion_id()


def trace_headers(episode: str | None, version: str) -> dict[str, str]:
    """The answer's headers: the model version that wrote it and, when recorded, its episode."""
    headers = {VERSION_HEADER: version}
    if episode is not None:
        headers[EPISODE_HEADER] = episode
    return headers


def sampling_info(sampling: SamplingParams) -> dict[str, Any]:
    """The rest of a turn's sampling, kept beside it: the budget, the seed and stop strings if any."""
    info: dict[str, Any] = {"max_tokens": sampling.max_new_tokens}
    if sampling.seed is not None:
        info["seed"] = sampling.seed
    if sampling.stop:
        info["stop"] = list(sampling.stop)
    return info


async def record_turn(
    recorder: TraceRecorder | None,
    episode: str | None,
    prompt_ids: list[int],
    generation: Generation,
    sampling: SamplingParams,
    version: str,
    latency_s: float,
    text: str,
    messages: Any,
) -> None:
    """Hand the turn to the recorder and, unless it writes behind, wait until it is committed:
    the answer is sent after (a failed write is logged and counted; the answer still goes)."""
    if recorder is None or episode is None:
        return
    written = recorder.submit(
        TracedTurn(
            episode_id=episode,
            turn_index=-1,
            prompt_ids=list(prompt_ids),
            response_ids=list(generation.token_ids),
            logprobs=list(generation.logprobs),
            model_version=version,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            constraint=sampling.constraint.kind if sampling.constraint is not None else None,
            finish_reason=generation.finish_reason,
            latency_s=latency_s,
            created=time.time(),
            response_text=text,
            messages=messages,
            info=sampling_info(sampling),
        )
    )
    if written is not None and recorder.durable:
        try:  # a store that hangs (a lost database connection) must not hang the traffic itself
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(written)), recorder.wait_s)
        except asyncio.TimeoutError:
            recorder.late += 1
            log.warning(
                "turn of episode %s not written within %s s: answered before it is recorded", episode, recorder.wait_s
            )


async def attach_feedback(recorder: TraceRecorder, body: bytes) -> dict[str, Any]:
    """``POST /v1/feedback``'s body (``{"episode_id", "reward", "success"?, "info"?, "turn"?}``)
    attached in ``recorder``'s trace store; returns the answer's JSON (404 for an unknown episode
    or turn).

    Never waits for the recorder: a completion is answered once its turn is committed, so the
    turns a client was answered are in the store when it sends feedback on them."""
    feedback = proto.parse_feedback(proto.decode_body(body))
    store = recorder.store

    def attach() -> None:
        store.add_feedback(
            feedback.episode_id, feedback.reward, success=feedback.success, info=feedback.info, turn_index=feedback.turn
        )

    try:
        await asyncio.to_thread(attach)
    except UnknownEpisodeError as exc:
        raise APIError(
            404, str(exc), param="episode_id" if feedback.turn is None else "turn", code="episode_not_found"
        ) from None
    return {"object": "feedback", "episode_id": feedback.episode_id, "turn": feedback.turn}
