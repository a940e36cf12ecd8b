"""Production traffic back to training: served completions recorded token-exact, feedback as rewards.

* :mod:`verlog.traces.records` — a recorded turn (:class:`TracedTurn`), an episode's record and
  feedback, the operator's :class:`RecordingPolicy` (privacy ``full`` / ``ids_only``, size and
  retention bounds);
* :mod:`verlog.traces.store` — the store: SQLite in a folder by default, PostgreSQL by URL
  (:func:`open_store`); ``TraceStore.add_feedback`` is the Python call that attaches a reward;
* :mod:`verlog.traces.recorder` — the background writer ``verlog serve-model --record`` uses;
* :mod:`verlog.traces.feedback` — feedback sent to a server over HTTP (``POST /v1/feedback``);
* :mod:`verlog.traces.episode_model` — a ``ChatOpenAI`` whose requests name the run's episode
  (survives ``bind_tools``, structured output and sub-graphs).

Training reads the store through the config's ``data.traces`` section
(:mod:`verlog.train.trace_batches`); the off-policy correction is :mod:`verlog.algo.off_policy`.
"""

from verlog.traces.episode_model import episode_chat_openai
from verlog.traces.feedback import send_feedback
from verlog.traces.recorder import TraceRecorder
from verlog.traces.records import (
    EPISODE_HEADER,
    PRIVACY_MODES,
    VERSION_HEADER,
    PrivacyMode,
    RecordingPolicy,
    TracedEpisode,
    TracedTurn,
)
from verlog.traces.store import SQLITE_FILE, TraceStore, TraceStoreError, UnknownEpisodeError, open_store

__all__ = [
    "EPISODE_HEADER",
    "PRIVACY_MODES",
    "SQLITE_FILE",
    "VERSION_HEADER",
    "PrivacyMode",
    "RecordingPolicy",
    "TraceRecorder",
    "TraceStore",
    "TraceStoreError",
    "TracedEpisode",
    "TracedTurn",
    "UnknownEpisodeError",
    "episode_chat_openai",
    "open_store",
    "send_feedback",
]
