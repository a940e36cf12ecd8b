"""The trace store: served completions, token-exact, grouped into episodes, with their feedback.

``open_store(target)`` opens one: a folder (or a ``.sqlite`` file) is an embedded SQLite database
(the standard library's ``sqlite3``, WAL mode: a trainer reads while the server writes); a
``postgresql://`` URL is a team's PostgreSQL server (``psycopg``), shared by several servers and
trainers. Both hold the same three tables:

* ``episodes`` — one row per episode id: its turn count, when it was created and last written,
  and its feedback (reward, success, info);
* ``turns`` — one row per completion: prompt ids, response ids, logprobs (binary columns), the
  sampling, the model version that answered, latency, and (privacy ``full`` only) the request's
  messages and the answer's text;
* ``versions`` — every model version that has answered, in the order they first did (how stale
  a turn is follows the checkpoint lineage, not this order: ``verlog.train.trace_batches``).

Bounds (:class:`~verlog.traces.records.RecordingPolicy`): episodes older than the retention are
deleted, then the least recently written episodes until the store is under its size bound.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from verlog.traces.records import (
    RecordingPolicy,
    TracedEpisode,
    TracedTurn,
    check_reward,
    pack_floats,
    pack_ids,
    unpack_floats,
    unpack_ids,
)

__all__ = ["SQLITE_FILE", "TraceStore", "TraceStoreError", "UnknownEpisodeError", "open_store"]

#: the database file a store folder holds
SQLITE_FILE = "traces.sqlite"
_POSTGRES_SCHEMES = ("postgresql://", "postgres://")


class TraceStoreError(RuntimeError):
    """The trace store cannot be opened or written (a bad target, a database error)."""


class UnknownEpisodeError(TraceStoreError, KeyError):
    """Feedback names an episode (or a turn of one) that the store does not hold."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


_TURN_COLUMNS = (
    "episode_id",
    "turn_index",
    "created",
    "model_version",
    "latency_s",
    "prompt_ids",
    "response_ids",
    "logprobs",
    "temperature",
    "top_p",
    "top_k",
    "constraint_kind",
    "finish_reason",
    "reward",
    "response_text",
    "messages",
    "info",
    "nbytes",
)


def _schema(blob: str, real: str, serial: str) -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS episodes (
            episode_id TEXT PRIMARY KEY, turns INTEGER NOT NULL, created {real} NOT NULL,
            updated {real} NOT NULL, nbytes BIGINT NOT NULL DEFAULT 0, reward {real}, success INTEGER,
            info TEXT, feedback_at {real})""",
        f"""CREATE TABLE IF NOT EXISTS turns (
            id {serial}, episode_id TEXT NOT NULL, turn_index INTEGER NOT NULL, created {real} NOT NULL,
            model_version TEXT NOT NULL, latency_s {real}, prompt_ids {blob} NOT NULL,
            response_ids {blob} NOT NULL, logprobs {blob} NOT NULL, temperature {real}, top_p {real},
            top_k INTEGER, constraint_kind TEXT, finish_reason TEXT, reward {real} NOT NULL DEFAULT 0,
            response_text TEXT, messages TEXT, info TEXT, nbytes BIGINT NOT NULL,
            UNIQUE (episode_id, turn_index))""",
        f"CREATE TABLE IF NOT EXISTS versions (seq {serial}, version TEXT UNIQUE NOT NULL, first_seen {real} NOT NULL)",
        "CREATE INDEX IF NOT EXISTS episodes_updated ON episodes (updated)",
    ]


class TraceStore:
    """Reads and writes traces in one database (SQLite or PostgreSQL: see :func:`open_store`).

    Thread-safe: one connection, used under a lock (the server writes from one recorder
    thread; feedback and trainers read and write from others).
    """

    #: the SQL placeholder of the database's driver
    _mark = "?"

    def __init__(self, connection: Any, policy: RecordingPolicy, where: str):
        self._db = connection
        self.policy = policy
        #: where the store is (a file path or the URL without its password), for messages
        self.where = where
        self._lock = threading.RLock()
        self._versions: dict[str, int] = {}

    # ------------------------------------------------------------------ plumbing
    def _sql(self, text: str) -> str:
        return text if self._mark == "?" else text.replace("?", self._mark)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Callable[..., list[tuple]]]:
        """One transaction: yields ``execute(sql, params) -> rows``; commits at the end, rolls
        back (and raises :class:`TraceStoreError`) on any failure."""
        with self._lock:
            try:
                cursor = self._db.cursor()

                def execute(text: str, params: Sequence[Any] = ()) -> list[tuple]:
                    cursor.execute(self._sql(text), tuple(params))
                    return cursor.fetchall() if cursor.description else []

                yield execute
                self._db.commit()
            except Exception as exc:
                self._db.rollback()
                if isinstance(exc, TraceStoreError):
                    raise
                raise TraceStoreError(f"trace store {self.where}: {type(exc).__name__}: {_one_line(exc)}") from exc

    def _run(self, statements: Iterable[tuple[str, Sequence[Any]]]) -> list[list[tuple]]:
        """Run ``statements`` in one transaction; the rows each returned."""
        with self._transaction() as execute:
            return [execute(text, params) for text, params in statements]

    def _query(self, text: str, params: Sequence[Any] = ()) -> list[tuple]:
        return self._run([(text, params)])[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> "TraceStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ writing
    def record(self, turns: Sequence[TracedTurn]) -> list[int]:
        """Append ``turns`` (in order) to their episodes; returns the turn index each was given
        (its episode's turn count before it). Fields the privacy mode forbids are not written."""
        indices: list[int] = []
        with self._lock:
            for version in dict.fromkeys(t.model_version for t in turns):  # in serving order
                if version not in self._versions:
                    self._register_version(version)
            with self._transaction() as execute:  # one transaction for the whole batch
                for turn in turns:
                    indices.append(self._record_one(execute, turn))
        return indices

    def _register_version(self, version: str) -> None:
        self._run(
            [
                (
                    "INSERT INTO versions (version, first_seen) VALUES (?, ?) ON CONFLICT DO NOTHING",
                    (version, time.time()),
                )
            ]
        )
        self._versions = self.versions()

    def _record_one(self, execute: Callable[..., list[tuple]], turn: TracedTurn) -> int:
        full = self.policy.privacy == "full"
        created = turn.created or time.time()
        nbytes = (turn if full else dataclasses.replace(turn, messages=None, response_text=None)).nbytes
        # the episode's row first: its turn count, raised atomically, is this turn's index
        counted = execute(
            "INSERT INTO episodes (episode_id, turns, created, updated, nbytes) VALUES (?, 1, ?, ?, ?) "
            "ON CONFLICT (episode_id) DO UPDATE SET turns = episodes.turns + 1, updated = excluded.updated, "
            "nbytes = episodes.nbytes + excluded.nbytes RETURNING turns",
            (turn.episode_id, created, created, nbytes),
        )
        index = int(counted[0][0]) - 1
        values = (
            turn.episode_id,
            index,
            created,
            turn.model_version,
            turn.latency_s,
            pack_ids(turn.prompt_ids),
            pack_ids(turn.response_ids),
            pack_floats(turn.logprobs),
            turn.temperature,
            turn.top_p,
            turn.top_k,
            turn.constraint,
            turn.finish_reason,
            turn.reward,
            turn.response_text if full else None,
            json.dumps(turn.messages, ensure_ascii=False) if full and turn.messages is not None else None,
            json.dumps(turn.info) if turn.info else None,
            nbytes,
        )
        execute(f"INSERT INTO turns ({', '.join(_TURN_COLUMNS)}) VALUES ({', '.join('?' for _ in values)})", values)
        return index

    def add_feedback(
        self,
        episode_id: str,
        reward: float,
        *,
        success: bool | None = None,
        info: dict[str, Any] | None = None,
        turn_index: int | None = None,
    ) -> None:
        """Attach feedback to an episode, or to one of its turns.

        Episode feedback (``turn_index`` None) is the episode's outcome: ``reward`` is paid on its
        last turn when it is trained, ``success`` and ``info`` are kept beside it, and the episode
        counts as finished from then on. Feedback given again replaces the earlier one. Turn
        feedback sets that turn's own reward (paid on that turn). Unknown episodes and turns raise
        :class:`UnknownEpisodeError`.
        """
        if reward is None:  # an outcome without one would be trained as a reward of 0
            raise ValueError("feedback needs a reward (a finite number): nothing was stored")
        reward = check_reward(reward)
        now = time.time()
        if turn_index is None:
            done = self._run(
                [
                    (
                        "UPDATE episodes SET reward = ?, success = ?, info = ?, feedback_at = ?, updated = ? "
                        "WHERE episode_id = ? RETURNING turns",
                        (
                            float(reward),
                            None if success is None else int(bool(success)),
                            json.dumps(info or {}),
                            now,
                            now,
                            episode_id,
                        ),
                    )
                ]
            )[0]
            if not done:
                raise UnknownEpisodeError(f"no episode {episode_id!r} in the trace store")
            return
        done = self._run(
            [
                (
                    "UPDATE turns SET reward = ? WHERE episode_id = ? AND turn_index = ? RETURNING turn_index",
                    (float(reward), episode_id, int(turn_index)),
                )
            ]
        )[0]
        if not done:
            raise UnknownEpisodeError(f"no turn {turn_index} in episode {episode_id!r} of the trace store")

    # ------------------------------------------------------------------ bounds
    def size_bytes(self) -> int:
        """The bytes the stored turns take (as the size bound counts them)."""
        return int(self._query("SELECT COALESCE(SUM(nbytes), 0) FROM episodes")[0][0])

    def enforce_bounds(self, now: float | None = None) -> int:
        """Delete episodes past the retention, then the least recently written ones until the
        store is under its size bound; returns how many episodes were deleted."""
        now = time.time() if now is None else now
        deleted = 0
        if self.policy.retention_days is not None:
            old = [
                r[0]
                for r in self._query(
                    "SELECT episode_id FROM episodes WHERE updated < ?", (now - self.policy.retention_days * 86400.0,)
                )
            ]
            deleted += self._delete(old)
        if self.policy.max_bytes is not None:
            total = self.size_bytes()
            if total > self.policy.max_bytes:
                doomed, freed = [], 0
                for episode_id, nbytes in self._query("SELECT episode_id, nbytes FROM episodes ORDER BY updated"):
                    if total - freed <= self.policy.max_bytes:
                        break
                    doomed.append(episode_id)
                    freed += int(nbytes)
                deleted += self._delete(doomed)
        return deleted

    def _delete(self, episode_ids: list[str]) -> int:
        for start in range(0, len(episode_ids), 500):
            part = episode_ids[start : start + 500]
            marks = ", ".join("?" for _ in part)
            self._run(
                [
                    (f"DELETE FROM turns WHERE episode_id IN ({marks})", part),
                    (f"DELETE FROM episodes WHERE episode_id IN ({marks})", part),
                ]
            )
        return len(episode_ids)

    # ------------------------------------------------------------------ reading
    def versions(self) -> dict[str, int]:
        """Every model version that has answered, with its rank in serving order (0 = the first)."""
        rows = self._query("SELECT version FROM versions ORDER BY seq")
        return {row[0]: rank for rank, row in enumerate(rows)}

    def episodes(self, *, with_feedback: bool = False) -> list[TracedEpisode]:
        """The store's episodes, oldest first (only those that have episode feedback, if asked)."""
        # (an outcome without a reward, as an older verlog stored one, is no feedback to train on)
        where = " WHERE feedback_at IS NOT NULL AND reward IS NOT NULL" if with_feedback else ""
        rows = self._query(f"SELECT {_EPISODE_COLUMNS} FROM episodes{where} ORDER BY created, episode_id")
        return [_episode(row) for row in rows]

    def episode(self, episode_id: str) -> TracedEpisode:
        """One episode's record; :class:`UnknownEpisodeError` if the store does not hold it."""
        rows = self._query(f"SELECT {_EPISODE_COLUMNS} FROM episodes WHERE episode_id = ?", (episode_id,))
        if not rows:
            raise UnknownEpisodeError(f"no episode {episode_id!r} in the trace store")
        return _episode(rows[0])

    def turns(self, episode_id: str) -> list[TracedTurn]:
        """An episode's turns in order (an unknown episode has none)."""
        rows = self._query(
            f"SELECT {', '.join(_TURN_COLUMNS)} FROM turns WHERE episode_id = ? ORDER BY turn_index", (episode_id,)
        )
        return [self._turn(row) for row in rows]

    @staticmethod
    def _turn(row: tuple) -> TracedTurn:
        r = dict(zip(_TURN_COLUMNS, row))
        return TracedTurn(
            episode_id=r["episode_id"],
            turn_index=int(r["turn_index"]),
            prompt_ids=unpack_ids(r["prompt_ids"]),
            response_ids=unpack_ids(r["response_ids"]),
            logprobs=unpack_floats(r["logprobs"]),
            model_version=r["model_version"],
            temperature=float(r["temperature"]),
            top_p=float(r["top_p"]),
            top_k=int(r["top_k"]),
            constraint=r["constraint_kind"],
            finish_reason=r["finish_reason"] or "",
            latency_s=float(r["latency_s"] or 0.0),
            created=float(r["created"]),
            reward=float(r["reward"]),
            response_text=r["response_text"],
            messages=json.loads(r["messages"]) if r["messages"] else None,
            info=json.loads(r["info"]) if r["info"] else {},
        )


_EPISODE_COLUMNS = "episode_id, turns, created, updated, reward, success, info, feedback_at"


def _episode(r: tuple) -> TracedEpisode:
    return TracedEpisode(
        r[0],
        int(r[1]),
        float(r[2]),
        float(r[3]),
        None if r[4] is None else float(r[4]),
        None if r[5] is None else bool(r[5]),
        json.loads(r[6]) if r[6] else {},
        None if r[7] is None else float(r[7]),
    )


class _PostgresStore(TraceStore):
    """psycopg's placeholders are ``%s`` (it sends ``bytes`` as ``bytea``, as sqlite3 sends them as BLOBs)."""

    _mark = "%s"


def _one_line(exc: BaseException) -> str:
    """A driver's message on one line (psycopg's span several)."""
    return " ".join(str(exc).split())


def _redacted(url: str) -> str:
    """A database URL without its password (for messages)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def _sqlite_path(path: Path, create: bool) -> Path:
    """The database file of the SQLite store at ``path`` (a folder, or a ``.sqlite`` / ``.db``
    file), its folder made when ``create``; a one-line :class:`TraceStoreError` otherwise."""
    is_file = path.suffix in (".sqlite", ".db")
    folder = path.parent if is_file else path
    database = path if is_file else path / SQLITE_FILE
    if os.path.lexists(folder) and not folder.is_dir():
        raise TraceStoreError(
            f"the trace store {path} must be a folder (or a .sqlite file), but {folder} is a file: give a folder's path"
        )
    if is_file and path.is_dir():
        raise TraceStoreError(
            f"the trace store {path} is a folder, but its name ends in {path.suffix}: name the "
            f"folder without it, or the database file inside it ({path / SQLITE_FILE})"
        )
    if not create:
        if not database.is_file():
            raise TraceStoreError(
                f"no trace store at {path} ({database} does not exist): give the folder or "
                "URL that serve-model --record wrote to"
            )
        return database
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TraceStoreError(f"cannot create the trace store {path}: {_one_line(exc)}") from None
    return database


def open_store(target: str | os.PathLike, policy: RecordingPolicy | None = None, *, create: bool = True) -> TraceStore:
    """The trace store at ``target``: a folder (created; the database is ``traces.sqlite`` in
    it), a ``.sqlite`` / ``.db`` file, or a ``postgresql://`` URL. The tables are created if
    missing.

    ``create=False`` (a trainer reading what a server recorded): a folder or file that does not
    exist is a :class:`TraceStoreError` naming it, not a new empty store. Every refusal is one
    ``TraceStoreError`` line (a file where a folder is expected, a folder without write access).
    """
    policy = policy or RecordingPolicy()
    text = os.fspath(target)
    if text.startswith(_POSTGRES_SCHEMES):
        try:
            import psycopg
        except ImportError:
            raise TraceStoreError("a postgresql:// trace store needs psycopg (pip install 'psycopg[binary]')") from None
        try:
            connection = psycopg.connect(text)
        except Exception as exc:
            raise TraceStoreError(f"cannot connect to the trace store {_redacted(text)}: {_one_line(exc)}") from None
        store: TraceStore = _PostgresStore(connection, policy, _redacted(text))
        statements = _schema("BYTEA", "DOUBLE PRECISION", "BIGSERIAL PRIMARY KEY")
    else:
        path = _sqlite_path(Path(text).expanduser(), create)
        try:
            connection = sqlite3.connect(path, check_same_thread=False, timeout=30.0)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            raise TraceStoreError(f"cannot open the trace store {path}: {_one_line(exc)}") from None
        store = TraceStore(connection, policy, str(path))
        statements = _schema("BLOB", "REAL", "INTEGER PRIMARY KEY AUTOINCREMENT")
    store._run([(s, ()) for s in statements])
    store._versions = store.versions()
    return store
