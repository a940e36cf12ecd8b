"""Write ``crafter_balrog_texts.json``: what BALROG's model reads of Crafter after each step of a
few long episodes, made by BALROG's own Crafter language wrapper.

    python tests/data/crafter_balrog_texts.py PATH/TO/BALROG

loads ``balrog/environments/crafter/env.py`` from a BALROG checkout and plays, for each seed of
:data:`SEEDS`, ``crafter.Env`` with BALROG's settings (``crafter_kwargs`` of its config: a 64x64
world, the 9x9 view, 256x256 images) in BALROG's ``CrafterLanguageWrapper``: the reset (with its
``Noop``), then the actions of :func:`random_actions`, the player's health set back to 9 after
each step so that the episode lasts through nights (zombies kill a random walker), until the game
ends or :data:`STEPS`. The wrapper renders the image of every observation as BALROG's does, so the
game's random stream is BALROG's. Two changes, both for reproducibility, which
``tests/test_balrog_protocol.py`` applies alike to verlog's game: a creature to remove is picked
from the chunk's creatures sorted by position (Crafter picks from a ``set``, whose order follows
memory addresses), and the wrapper's imports of ``gym`` (only ``gym.Wrapper``), ``scipy`` (only
for ``edge_only_items``, empty in BALROG's config) and ``balrog.environments.Strings`` are given
minimal stand-ins so that the file runs without BALROG's dependencies. Each observation is kept
as :func:`text_key` of the newest observation's text (short-term part, a line break, long-term
part) and of the long-term part the history keeps.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import types
from pathlib import Path
from typing import Any, Iterator

SEEDS = (0, 1, 2)
STEPS = 2000
OUT = Path(__file__).with_suffix(".json")


def text_key(current: str, past: str) -> str:
    """Short digests of an observation's two texts: ``current|past``."""
    return f"{hashlib.sha1(current.encode()).hexdigest()[:8]}|{hashlib.sha1(past.encode()).hexdigest()[:8]}"


def random_actions(seed: int) -> Iterator[int]:
    """The actions (Crafter's indices) the episodes play: mostly moves, ``Noop`` and ``Do``,
    sometimes any of the 17, from ``random.Random(seed)``."""
    rng = random.Random(seed)
    while True:
        yield rng.randrange(17) if rng.random() < 0.3 else rng.randrange(6)


def sorted_despawns(chunk_objects: Any) -> list[Any]:
    """A chunk's objects in the order the creature to remove is picked from (by position)."""
    return sorted(chunk_objects, key=lambda obj: (int(obj.pos[0]), int(obj.pos[1])))


def _balrog_wrapper(root: Path) -> Any:
    """BALROG's ``CrafterLanguageWrapper`` and ``ACTIONS``, from its file, with stand-ins for its
    imports from outside Crafter (see the module docstring)."""

    class Wrapper:
        def __init__(self, env: Any) -> None:
            self.env = env

        def step(self, action: Any) -> Any:
            return self.env.step(action)

        def render(self, *args: Any, **kwargs: Any) -> Any:
            return self.env.render(*args, **kwargs)

        def __getattr__(self, name: str) -> Any:
            if name == "env":
                raise AttributeError(name)
            return getattr(self.env, name)

    class Strings:
        def __init__(self, values: list[str]) -> None:
            self._values = values
            self._dict = {value: i for i, value in enumerate(values)}

        def map(self, action: str) -> int:
            return self._dict[action]

    stand_ins = {
        "gym": {"Wrapper": Wrapper},
        "scipy": {},
        "scipy.ndimage": {},
        "balrog": {},
        "balrog.environments": {"Strings": Strings},
    }
    for name, attributes in stand_ins.items():
        module = types.ModuleType(name)
        module.__dict__.update(attributes)
        sys.modules[name] = module
    sys.modules["scipy"].ndimage = sys.modules["scipy.ndimage"]  # type: ignore[attr-defined]
    path = root / "balrog" / "environments" / "crafter" / "env.py"
    module = types.ModuleType("balrog_crafter_env")
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    return module


def record(root: Path) -> dict[str, list[str]]:
    import crafter

    balrog = _balrog_wrapper(root)

    class Game(crafter.Env):
        def _balance_chunk(self, chunk: Any, objs: Any) -> None:
            super()._balance_chunk(chunk, sorted_despawns(objs))

    def texts(obs: dict[str, Any]) -> str:
        text = obs["text"]
        current = "\n".join(part for part in (text["short_term_context"], text["long_term_context"]) if part)
        return text_key(current, text["long_term_context"])

    episodes = {}
    for seed in SEEDS:
        game = Game(area=(64, 64), view=(9, 9), size=(256, 256), reward=True, seed=seed)
        env = balrog.CrafterLanguageWrapper(
            game,
            "default",
            max_episode_steps=STEPS,
            unique_items=True,
            precise_location=False,
            skip_items=[],
            edge_only_items=[],
        )
        keys = [texts(env.reset())]
        for _, action in zip(range(STEPS), random_actions(seed)):
            obs, _, done, _ = env.step(balrog.ACTIONS[action])
            keys.append(texts(obs))
            game._player.health = 9
            if done:
                break
        episodes[str(seed)] = keys
    return episodes


def main(argv: list[str]) -> None:
    if len(argv) != 1 or not (Path(argv[0]) / "balrog" / "environments" / "crafter" / "env.py").is_file():
        raise SystemExit("usage: crafter_balrog_texts.py PATH (a checkout of balrog-ai/BALROG)")
    episodes = record(Path(argv[0]))
    OUT.write_text(json.dumps(episodes, separators=(",", ":")) + "\n")
    print(f"wrote {OUT}: {', '.join(f'seed {s}: {len(k)} observations' for s, k in episodes.items())}")


if __name__ == "__main__":
    main(sys.argv[1:])
