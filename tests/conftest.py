"""Shared fixtures: the tiny offline model and its tokenizer (built once per test session)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# no test reaches the Hugging Face hub: a model path that is no local folder is looked up in the
# local cache only (verlog.models.hub), whatever network the machine has
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# under pytest-xdist (`make test`: one worker per core) each worker gets its share of the cores, for
# torch here and for OpenMP in the processes a test starts, instead of every worker using them all
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
if _WORKERS > 1:
    _SHARE = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    os.environ.setdefault("OMP_NUM_THREADS", _SHARE)
    os.environ.setdefault("MKL_NUM_THREADS", _SHARE)

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the project's `tools` and `graphs` folders


@pytest.fixture(scope="session")
def tiny_dir():
    from verlog.models import resolve_model_path

    return resolve_model_path("tiny")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_dir):
    from verlog.models import load_tokenizer

    return load_tokenizer(tiny_dir)


@pytest.fixture(scope="session")
def tiny_model(tiny_dir):
    from verlog.models import load_causal_lm

    return load_causal_lm(tiny_dir)


@pytest.fixture
def recorder(tmp_path):
    """A trace recorder over a fresh SQLite store (``verlog serve-model --record``'s)."""
    from verlog.traces import TraceRecorder, open_store

    store = open_store(tmp_path / "traces")
    recorder = TraceRecorder(store)
    yield recorder
    recorder.close()
    store.close()


@pytest.fixture(autouse=True)
def _fresh_openai_http_clients():
    """``langchain_openai`` keeps one async HTTP client per base URL for the process; its pooled
    connections belong to the event loop that opened them. Every test runs its own loop and a
    server's port can come round again in a later test, whose plain ``ChatOpenAI`` would find the
    old loop's connections (``Event loop is closed``): each test starts with none. (verlog's own
    ``ChatOpenAI`` models keep a pool per loop, ``verlog.llm.loop_http``, and need none of this.)"""
    yield
    _client_utils = sys.modules.get("langchain_openai.chat_models._client_utils")
    if _client_utils is None:  # not imported: nothing cached
        return
    for cached in ("_cached_async_httpx_client", "_cached_sync_httpx_client"):
        clear = getattr(getattr(_client_utils, cached, None), "cache_clear", None)
        if clear is not None:
            clear()
