"""A LangChain ``ChatOpenAI`` whose every request names the episode of the graph run it is part of.

Naming the episode on the model (``model.bind(user=episode_id)``) does not survive how graphs
call models: ``bind_tools``, ``with_structured_output`` and prebuilt agents build new models from
the *unbound* one, so the binding is lost and each turn lands in an episode of its own. The run's
config does survive: LangGraph hands it to every node, sub-graph and model call of the run. So::

    from verlog.traces import episode_chat_openai

    model = episode_chat_openai(base_url="http://127.0.0.1:8000/v1", model="agent", api_key=KEY)
    graph = build_graph(model)                                         # once, for every session
    graph.invoke(state, {"configurable": {"episode_id": session_id}})  # every call of it: one episode

Every request of that run, through ``bind_tools``, structured output or a sub-graph, carries the
run's ``configurable.episode_id`` (else its LangGraph ``thread_id``) as OpenAI's ``user`` field,
which ``serve-model --record`` files turns under (a ``user`` the caller sets explicitly is kept).
``verlog serve`` builds its models with it, so each LangGraph thread is one episode.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EPISODE_CONFIG_KEYS", "episode_chat_openai", "run_episode_id"]

#: where a run's config names its episode, first found wins: the caller's own id, else the
#: LangGraph thread the run belongs to
EPISODE_CONFIG_KEYS = ("episode_id", "thread_id")

_CLASS: type | None = None


def run_episode_id() -> str | None:
    """The episode named by the config of the LangChain / LangGraph run being executed (see
    :data:`EPISODE_CONFIG_KEYS`); ``None`` outside a run or when it names none."""
    from langchain_core.runnables.config import ensure_config

    configurable = ensure_config().get("configurable") or {}
    for key in EPISODE_CONFIG_KEYS:
        value = configurable.get(key)
        if value is not None and str(value):
            return str(value)
    return None


def _episode_class() -> type:
    global _CLASS
    if _CLASS is None:
        try:
            from langchain_openai import ChatOpenAI
        except ImportError:
            raise ImportError("episode_chat_openai needs langchain-openai (pip install 'verlog[serve]')") from None

        class EpisodeChatOpenAI(ChatOpenAI):  # type: ignore[misc, valid-type]
            """``ChatOpenAI`` sending the current run's episode (:func:`run_episode_id`) as ``user``."""

            def _get_request_payload(self, input_: Any, *, stop: list[str] | None = None, **kwargs: Any) -> dict:
                payload = super()._get_request_payload(input_, stop=stop, **kwargs)
                episode = run_episode_id()
                if episode is not None and not payload.get("user"):
                    payload["user"] = episode
                return payload

        _CLASS = EpisodeChatOpenAI
    return _CLASS


def episode_chat_openai(**kwargs: Any) -> Any:
    """A ``langchain_openai.ChatOpenAI`` (built with ``kwargs``) that names each request's
    episode from the run's config (see the module doc). Its async requests use a pool of
    connections per event loop (:func:`verlog.llm.loop_http.loop_local_async_client`) unless
    ``kwargs`` give an ``http_async_client`` or an ``openai_proxy`` of their own."""
    cls = _episode_class()
    if "http_async_client" not in kwargs and not kwargs.get("openai_proxy"):
        from verlog.llm.loop_http import loop_local_async_client

        kwargs["http_async_client"] = loop_local_async_client()
    return cls(**kwargs)
