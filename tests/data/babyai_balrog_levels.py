"""Write ``babyai_balrog_levels.json``: BALROG's BabyAI levels for seeds 0-299 of each task, made
by BabyAI-Text's own generator (the ``minigrid`` fork BALROG installs, BartekCupial/Minigrid),
and ``babyai_balrog_texts.json``: the text BALROG's model reads after each step of an episode
played with random actions (:func:`random_actions`), seeds 0-19 of each task.

    python tests/data/babyai_balrog_levels.py PATH/TO/BartekCupial-Minigrid

runs, in a child process that imports the fork's ``minigrid`` from ``PATH`` instead of the
installed one, what BALROG's ``make_babyai_env`` does for ``BabyAI-MixedTrainLocal-v0/<task>``
(make the level with ``num_dists=0`` until its mission kind is the task's), then resets it with
each seed, as BALROG's evaluator does (``env.reset(seed=seed)``). Each level is kept as
:func:`level_key` (the grid's encoding digest, the agent's cell and direction, the mission and
the step cap); ``tests/test_balrog_protocol.py`` checks verlog's levels give the same keys. Each
text is BALROG's BabyAI-Text wrapper's (the level's descriptions, one a line, without ``You see
``), kept as :func:`text_key`.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

TASKS = ("goto", "pickup", "open", "putnext", "pick_up_seq_go_to")
SEEDS = 300
TEXT_SEEDS = 20
OUT = Path(__file__).with_suffix(".json")
TEXTS = Path(__file__).with_name("babyai_balrog_texts.json")
#: BabyAI's six actions in minigrid's order (BALROG's names)
ACTIONS = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle")


def text_key(text: str) -> str:
    """A short digest of one observation text."""
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def random_actions(seed: int):
    """The actions (indices into :data:`ACTIONS`) the text episodes play: uniform, from
    ``random.Random(seed)``."""
    import random

    rng = random.Random(seed)
    while True:
        yield rng.randrange(len(ACTIONS))


def level_key(level: Any) -> str:
    """What identifies a generated level: ``grid digest|x,y|direction|mission|step cap``."""
    digest = hashlib.sha1(level.grid.encode().tobytes()).hexdigest()[:16]
    x, y = (int(v) for v in level.agent_pos)
    return f"{digest}|{x},{y}|{int(level.agent_dir)}|{level.mission}|{level.max_steps}"


def _child(task: str) -> dict[str, Any]:
    import contextlib
    import io

    from minigrid.envs.babyai.mixed_seq_levels import Level_MixedTrainLocal

    def text(info: dict[str, Any]) -> str:
        return "\n".join(line.replace("You see ", "") for line in info["descriptions"])

    keys, texts = [], []
    for seed in range(SEEDS):
        while True:
            level = Level_MixedTrainLocal(num_dists=0)
            if level.action_kinds[0].replace(" ", "_") == task:
                break
        with contextlib.redirect_stdout(io.StringIO()):  # the generator prints each rejected sample
            _, info = level.reset(seed=seed)
        keys.append(level_key(level))
        if seed < TEXT_SEEDS:
            episode = [text_key(text(info))]
            for action in random_actions(seed):
                _, _, terminated, truncated, info = level.step(action)
                episode.append(text_key(text(info)))
                if terminated or truncated:
                    break
            texts.append(episode)
    return {"levels": keys, "texts": texts}


def main(argv: list[str]) -> None:
    if len(argv) == 2 and argv[0] == "--child":
        print(json.dumps(_child(argv[1])))
        return
    if len(argv) != 1 or not (Path(argv[0]) / "minigrid" / "envs" / "babyai" / "mixed_seq_levels.py").is_file():
        raise SystemExit("usage: babyai_balrog_levels.py PATH (a checkout of BartekCupial/Minigrid)")
    env = {**os.environ, "PYTHONPATH": str(Path(argv[0]).resolve())}
    levels, texts = {}, {}
    for task in TASKS:
        done = subprocess.run(
            [sys.executable, __file__, "--child", task], env=env, capture_output=True, text=True, check=True
        )
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        levels[task], texts[task] = answer["levels"], answer["texts"]
    OUT.write_text(json.dumps(levels, indent=0) + "\n")
    TEXTS.write_text(json.dumps(texts, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({SEEDS} seeds) and {TEXTS} ({TEXT_SEEDS} episodes) of {', '.join(TASKS)}")


if __name__ == "__main__":
    main(sys.argv[1:])
