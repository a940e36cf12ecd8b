"""Feedback over HTTP: attach a reward to an episode a server recorded (``POST /v1/feedback``).

In the process that owns the store, call ``TraceStore.add_feedback`` instead.
"""

from __future__ import annotations

from typing import Any

import httpx

__all__ = ["FeedbackError", "send_feedback"]


class FeedbackError(RuntimeError):
    """The server refused the feedback (unknown episode, bad value, wrong API key...)."""


def send_feedback(
    base_url: str,
    episode_id: str,
    reward: float,
    *,
    success: bool | None = None,
    info: dict[str, Any] | None = None,
    turn: int | None = None,
    api_key: str | None = None,
    timeout_s: float = 30.0,
) -> dict[str, Any]:
    """Send feedback for ``episode_id`` (or its turn ``turn``) to the server at ``base_url``
    (``http://host:port/v1``, as OpenAI clients take it), with its API key if it needs one."""
    body: dict[str, Any] = {"episode_id": episode_id}
    for key, value in (("reward", reward), ("success", success), ("info", info), ("turn", turn)):
        if value is not None:
            body[key] = value
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    answer = httpx.post(f"{base_url.rstrip('/')}/feedback", json=body, headers=headers, timeout=timeout_s)
    if answer.status_code != 200:
        try:
            message = answer.json()["error"]["message"]
        except Exception:
            message = answer.text[:200]
        raise FeedbackError(f"feedback for episode {episode_id!r} refused ({answer.status_code}): {message}")
    return answer.json()
