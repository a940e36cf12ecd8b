"""docs/production_loop.md's script, run as written: train an agent, serve it recording, production
episodes through ``episode_chat_openai``, feedback (curl and Python), a run of one update from the
traces alone, the reload that puts it in service, the store read back.

The block runs with bash in a fresh folder that sees the repository's ``configs/`` and
``graphs/`` (the page's commands are run from the repository's folder), with this checkout's
``verlog`` and ``python`` first on ``PATH`` and a free port in ``$PORT``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from langgraph_server import free_port

from verlog.traces import open_store

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "production_loop.md"


def _script() -> str:
    text = PAGE.read_text()
    section = text[text.index("### The whole loop in one script") :]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


@pytest.mark.timeout(900)
def test_the_pages_script_runs_as_written(tmp_path):
    for name in ("configs", "graphs"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {
        **os.environ,
        "PORT": str(free_port()),
        "PYTHONPATH": str(ROOT),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    done = subprocess.run(["bash", "-c", _script()], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-5000:])
    # the server said at start who may do what: with an API key and no admin key, its holders do all
    assert "open to: chat and models: API key; feedback: API key; reload: API key" in done.stderr, done.stderr[-3000:]
    assert '"swapped": true' in done.stdout and '"version": "from-traces/update_000001"' in done.stdout, done.stdout[
        -3000:
    ]
    store = open_store(tmp_path / "traces", create=False)
    episodes = {r.episode_id: r for r in store.episodes()}
    assert sorted(episodes) == [f"session-{i}" for i in range(4)]  # one episode per session, every turn in it
    assert all(r.has_feedback for r in episodes.values()) and episodes["session-0"].reward == 1.0
    turns = store.turns("session-0")
    assert len(turns) == episodes["session-0"].turns > 1 and turns[1].reward == -0.1
    assert {t.model_version for r in episodes for t in store.turns(r)} == {"agent/update_000001"}
    store.close()
    metrics = (tmp_path / "runs" / "from-traces" / "metrics.jsonl").read_text().splitlines()
    assert '"trace_turns"' in metrics[-1]  # the update trained on the recorded turns
