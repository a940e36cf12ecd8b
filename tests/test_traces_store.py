"""The trace store: token-exact round trips, turn order, feedback, privacy, bounds, on SQLite and
(where a PostgreSQL server can be started here) on PostgreSQL."""

from __future__ import annotations

import sqlite3
import time

import pytest
from postgres_server import running_postgres

from verlog.traces import (
    SQLITE_FILE,
    RecordingPolicy,
    TracedTurn,
    TraceRecorder,
    TraceStoreError,
    UnknownEpisodeError,
    open_store,
)


def _turn(
    episode: str, n: int = 3, version: str = "v0", text: str | None = "hello", created: float = 0.0
) -> TracedTurn:
    return TracedTurn(
        episode_id=episode,
        turn_index=-1,
        prompt_ids=list(range(1, 40)),
        response_ids=[7 + n, 8, 9][:n] + [5] * (n - 3),
        logprobs=[-0.1234567890123, -1e-9, -17.000000001][:n] + [-0.5] * (n - 3),
        model_version=version,
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        constraint="json_schema",
        finish_reason="stop",
        latency_s=0.01,
        created=created,
        response_text=text,
        messages=[{"role": "user", "content": "héllo"}] if text else None,
    )


@pytest.fixture(params=["sqlite", "postgres"])
def store_target(request, tmp_path):
    if request.param == "sqlite":
        return tmp_path / "traces"
    return request.getfixturevalue("postgres_uri")


@pytest.fixture(scope="module")
def postgres_uri():
    with running_postgres() as uri:
        yield uri


def test_turns_round_trip_token_exact_in_order(store_target):
    with open_store(store_target) as store:
        episode = f"ep-{time.time_ns()}"
        indices = store.record([_turn(episode), _turn(episode, version="v1"), _turn(f"{episode}-b")])
        assert indices == [0, 1, 0]
        turns = store.turns(episode)
        assert [t.turn_index for t in turns] == [0, 1]
        first = turns[0]
        original = _turn(episode)
        assert first.prompt_ids == original.prompt_ids and first.response_ids == original.response_ids
        assert first.logprobs == original.logprobs  # bit-exact floats
        assert (first.temperature, first.top_p, first.top_k, first.constraint) == (0.7, 0.9, 20, "json_schema")
        assert first.response_text == "hello" and first.messages == [{"role": "user", "content": "héllo"}]
        assert [t.model_version for t in turns] == ["v0", "v1"]
        versions = store.versions()
        assert versions["v1"] > versions["v0"]
        assert store.episode(episode).turns == 2 and not store.episode(episode).has_feedback


def test_feedback_on_episodes_and_turns(store_target):
    with open_store(store_target) as store:
        episode = f"fb-{time.time_ns()}"
        store.record([_turn(episode), _turn(episode)])
        assert episode not in [e.episode_id for e in store.episodes(with_feedback=True)]
        store.add_feedback(episode, 0.5, success=False, info={"judge": "thumbs"})
        store.add_feedback(episode, 1.0, success=True)  # the latest feedback is the episode's
        record = store.episode(episode)
        assert (record.reward, record.success, record.info) == (1.0, True, {})
        assert episode in [e.episode_id for e in store.episodes(with_feedback=True)]
        store.add_feedback(episode, -0.25, turn_index=1)
        assert [t.reward for t in store.turns(episode)] == [0.0, -0.25]
        with pytest.raises(UnknownEpisodeError, match="no episode 'nobody'"):
            store.add_feedback("nobody", 1.0)
        with pytest.raises(UnknownEpisodeError, match="no turn 5"):
            store.add_feedback(episode, 1.0, turn_index=5)
        with pytest.raises(ValueError, match="reward must be a number"):
            store.add_feedback(episode, "good")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="feedback needs a reward"):
            store.add_feedback(episode, None, turn_index=0)


def test_ids_only_keeps_no_text(tmp_path):
    with open_store(tmp_path / "private", RecordingPolicy(privacy="ids_only")) as store:
        store.record([_turn("p")])
        turn = store.turns("p")[0]
        assert turn.response_text is None and turn.messages is None and turn.response_ids == _turn("p").response_ids
    raw = sqlite3.connect(tmp_path / "private" / SQLITE_FILE)
    assert raw.execute("SELECT response_text, messages FROM turns").fetchall() == [(None, None)]
    assert b"hello" not in (tmp_path / "private" / SQLITE_FILE).read_bytes()


def test_retention_and_size_bounds_delete_the_oldest_episodes(tmp_path):
    day = 86400.0
    now = time.time()
    with open_store(tmp_path / "r", RecordingPolicy(retention_days=7, max_bytes=None)) as store:
        store.record([_turn("old", created=now - 8 * day), _turn("new", created=now - 1 * day)])
        assert store.enforce_bounds(now) == 1
        assert [e.episode_id for e in store.episodes()] == ["new"] and store.turns("old") == []
    one = _turn("x").nbytes
    with open_store(tmp_path / "s", RecordingPolicy(retention_days=None, max_bytes=3 * one)) as store:
        for i in range(5):
            store.record([_turn(f"e{i}", created=now + i)])
        assert store.size_bytes() == 5 * one
        assert store.enforce_bounds(now) == 2
        assert [e.episode_id for e in store.episodes()] == ["e2", "e3", "e4"]
        assert store.size_bytes() <= 3 * one


def test_recording_policy_and_targets_are_checked(tmp_path):
    with pytest.raises(ValueError, match="privacy must be one of full, ids_only"):
        RecordingPolicy(privacy="none")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="retention_days must be > 0"):
        RecordingPolicy(retention_days=0)
    (tmp_path / "file.sqlite").write_text("not a database")
    with pytest.raises(TraceStoreError, match="file.sqlite"):
        open_store(tmp_path / "file.sqlite")
    with pytest.raises(
        TraceStoreError, match="cannot connect to the trace store postgresql://u:\\*\\*\\*@127.0.0.1:1/x"
    ):
        open_store("postgresql://u:secret@127.0.0.1:1/x?connect_timeout=2")


def test_recorder_writes_in_the_background_and_flushes(tmp_path):
    store = open_store(tmp_path / "bg")
    recorder = TraceRecorder(store)
    for _ in range(50):
        recorder.submit(_turn("bg"))
    assert recorder.flush()
    assert store.episode("bg").turns == 50 and recorder.written == 50
    recorder.close()
    recorder.submit(_turn("bg"))  # after close: dropped, counted
    assert recorder.dropped == 1
    store.close()


def test_a_submitted_turn_is_readable_elsewhere_once_its_future_is_done(store_target):
    """What the server waits for before answering: the turn committed, seen by another connection
    (another process's, a trainer's); and rewards are held to the same bounds on both databases."""
    store = open_store(store_target)
    recorder = TraceRecorder(store)
    reader = open_store(store_target, create=False)
    futures = [recorder.submit(_turn(f"durable-{i}")) for i in range(5)]
    assert all(f.result(timeout=60) for f in futures)
    assert [len(reader.turns(f"durable-{i}")) for i in range(5)] == [1] * 5
    for bad in (float("inf"), float("nan"), 10**400, 2e6, True):
        with pytest.raises(ValueError, match="reward"):
            store.add_feedback("durable-0", bad)
    assert reader.episode("durable-0").reward is None
    recorder.close()
    reader.close()
    store.close()
