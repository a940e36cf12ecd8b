"""Durable graph state for LangGraph's server: episodes and conversations that survive a crash.

``verlog serve`` names :func:`checkpointer` in the ``checkpointer`` section of the
``langgraph.json`` it writes, so LangGraph's server keeps every thread's checkpoints in one of
LangGraph's own durable checkpointers instead of its in-memory one (which writes to disk only
every 10 seconds and when it stops):

* **SQLite** (the default, embedded): ``langgraph-checkpoint-sqlite``'s ``AsyncSqliteSaver`` on
  ``$VERLOG_STATE_DB`` (``verlog serve`` sets it to ``STATE_DIR/threads.sqlite``). Each
  checkpoint is committed as the graph writes it: a ``SIGKILL`` loses at most the step that was
  running.
* **Postgres** (where a team runs one): ``langgraph-checkpoint-postgres``'s
  ``AsyncPostgresSaver`` on ``$VERLOG_POSTGRES_URI`` (``verlog serve --postgres-uri``), shared by
  every server process pointed at it.

The server's own records of threads and runs stay in its runtime, written to its state folder
every 10 seconds. So that a crash cannot lose what the checkpointer kept:

* at start, every thread the checkpointer holds and the runtime does not know (created less
  than 10 s before the crash) is recorded again (:func:`restore_threads`): its state and history
  are there, and ``runs.wait(thread_id, graph, input=None)`` continues it;
* a run the crash cut off is retried by the server with its original input, which would start
  the episode again: the served graphs continue it from its last checkpoint instead
  (:func:`continued_input`, used by :mod:`verlog.serve.langgraph_app`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, AsyncIterator

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_STATE_DB", "checkpointer", "continued_input", "restore_threads"]

#: the SQLite file of the threads' checkpoints when ``$VERLOG_STATE_DB`` is not set: beside the
#: server's own records, in the folder it runs in
DEFAULT_STATE_DB = ".langgraph_api/verlog_threads.sqlite"


@contextlib.asynccontextmanager
async def checkpointer() -> AsyncIterator[Any]:
    """The checkpointer LangGraph's server keeps threads in (named in ``langgraph.json``):
    Postgres at ``$VERLOG_POSTGRES_URI`` if set, else SQLite at ``$VERLOG_STATE_DB``."""
    uri = os.environ.get("VERLOG_POSTGRES_URI")
    if uri:
        try:
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        except ImportError as exc:
            raise RuntimeError(
                "$VERLOG_POSTGRES_URI needs langgraph-checkpoint-postgres: pip install -e '.[serve]'"
            ) from exc
        opened = AsyncPostgresSaver.from_conn_string(uri)
    else:
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        opened = AsyncSqliteSaver.from_conn_string(os.environ.get("VERLOG_STATE_DB") or DEFAULT_STATE_DB)
    async with opened as saver:
        await saver.setup()
        await restore_threads(saver)
        yield saver


async def _thread_ids(saver: Any) -> list[str]:
    """Every thread id the checkpointer holds (LangGraph's SQLite and Postgres savers share the
    ``checkpoints`` table)."""
    query = "SELECT DISTINCT thread_id FROM checkpoints WHERE checkpoint_ns = ''"
    conn = saver.conn
    if hasattr(conn, "execute") and type(conn).__module__.startswith("aiosqlite"):
        async with conn.execute(query) as cursor:
            return [row[0] for row in await cursor.fetchall()]
    async with conn.cursor() as cursor:  # psycopg
        await cursor.execute(query)
        return [row["thread_id"] if isinstance(row, dict) else row[0] for row in await cursor.fetchall()]


async def restore_threads(saver: Any) -> int:
    """Record in LangGraph's in-memory runtime every thread ``saver`` holds that the runtime lost
    (created less than 10 s before a crash), with the graph and assistant of its last checkpoint;
    returns how many. Outside that runtime (e.g. LangGraph Platform, whose records are durable)
    it does nothing."""
    try:
        from langgraph_runtime_inmem.database import connect
        from langgraph_runtime_inmem.ops import Threads
    except ImportError:
        return 0
    known: set[str] = set()
    restored = 0
    async with connect() as conn:
        known = {str(t["thread_id"]) for t in conn.store.get("threads", [])}
        for thread_id in await _thread_ids(saver):
            if thread_id in known:
                continue
            latest = await saver.aget_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
            metadata = latest.metadata if latest is not None else {}
            record = {k: metadata[k] for k in ("graph_id", "assistant_id") if k in metadata}
            result = await Threads.put(conn, thread_id, metadata=record, if_exists="do_nothing")
            async for _ in result:
                pass
            restored += 1
    if restored:
        log.warning(
            "verlog: %d threads written less than 10 s before the server stopped were restored from the checkpointer",
            restored,
        )
    return restored


async def continued_input(graph: Any, input: Any, config: Any) -> Any:
    """The input a run of ``graph`` should start from: ``None`` (go on from the thread's last
    checkpoint) when that checkpoint was written by this very run, which can only be a run
    LangGraph's server retries (after a crash, or an error it retries); else ``input`` as given."""
    config = config or {}
    saver = getattr(graph, "checkpointer", None)
    configurable = config.get("configurable") or {}
    run_id, thread_id = configurable.get("run_id"), configurable.get("thread_id")
    if (
        input is None
        or not hasattr(saver, "aget_tuple")
        or not run_id
        or not thread_id
        or configurable.get("checkpoint_id")
    ):  # a run from a chosen checkpoint starts there
        return input
    latest = await saver.aget_tuple({"configurable": {"thread_id": str(thread_id), "checkpoint_ns": ""}})
    if latest is not None and str((latest.metadata or {}).get("run_id")) == str(run_id):
        log.warning(
            "verlog: run %s is retried: it goes on from its last checkpoint (step %s) instead of starting again",
            run_id,
            (latest.metadata or {}).get("step"),
        )
        return None
    return input
