"""TextWorld game files: generated offline from (family, settings, seed), cached on disk.

A game is made by TextWorld's own generators (``textworld.challenges``, what ``tw-make`` runs)
and compiled to a Z-machine file (``game.z8``) with the Inform 7 compiler shipped in the
``textworld`` wheel. Each one is cached under
``verlog_cache_dir()/textworld/<family>-<settings>/seed-<seed>/`` (built in a temporary folder,
then renamed into place, so concurrent processes never see half a game).

**Generation runs in a child process** (``python -m verlog.envs.textworld.games``): TextWorld's
generator, compiler and game loader share module-level state (one ``tatsu`` logic parser, the
knowledge base), so two games generated or loaded at once in one process corrupt each other
(``IndexError: pop from empty list``, parse errors). A child process shares nothing with the
games being played here, and several children can build games in parallel (at most one per CPU
core at a time). Loading and playing games in this process is serialised by
:data:`ENGINE_LOCK` (see :mod:`verlog.envs.textworld.env`). The child answers TextWorld's
constraint checks with :mod:`verlog.envs.textworld.generator`, which gives the same games from
the same seeds, 10 to 100 times faster for BALROG's level-30 treasure hunter.

**Candidate seeds**: a seed whose settings admit no game (TextWorld raises
``QuestGenerationError``, or its walkthrough search does not end: see
:mod:`verlog.envs.textworld.generator`), or whose game fails a filter of the settings
(``walkthrough_length``), moves on to the next candidate ``seed + k * 1_000_003``,
deterministically; the seed actually used is returned (and reported as ``info["game_seed"]``). A
rejected candidate is remembered by a ``seed-<n>.failed`` file, so it is not generated twice.

**Settings** are the challenge's own keyword arguments (``level``; ``recipe``, ``take``, ``go``,
``open``, ``cook``, ``cut``, ``drop``, ``split``, ``recipe_seed``) plus two of verlog's:

* ``only_last_action``: TextWorld's grammar option that states only the last step of the quest
  in the goal text ("retrieve the passkey from the floor of the kitchen") instead of the whole
  route ("go west, then open the door, ..."); the ``custom-tw-make`` script BALROG's games were
  made with turns it on for every challenge;
* ``walkthrough_length``: keep only games whose walkthrough has exactly this many commands
  (BALROG kept level-30 treasure hunter games with 20-command walkthroughs).

Cooking without ``recipe_seed`` samples the recipe from the game seed (verlog's variant);
``recipe_seed=0`` keeps the challenge's default recipe draw (``tw-make``'s default, BALROG's).

**Glulx games** (``.ulx``, what TextWorld before 1.7 compiled; BALROG ships some) cannot be played
by TextWorld 1.7. :func:`zmachine_game` rebuilds one as a Z-machine file from the TextWorld game
description (``.json``) saved beside it, with the same compiler, once (cached under
``verlog_cache_dir()/textworld/zmachine/<sha256 of the .json>/``, in a child process).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Mapping

#: family -> TextWorld challenge name
CHALLENGES: Mapping[str, str] = {
    "treasure_hunter": "tw-treasure_hunter",
    "coin_collector": "tw-coin_collector",
    "cooking": "tw-cooking",
}
#: settings that are verlog's, not the challenge's
VERLOG_KEYS = ("only_last_action", "walkthrough_length")
#: candidate seeds tried per requested seed before giving up
MAX_GENERATION_TRIES = 20
SEED_STRIDE = 1_000_003  # candidate k of seed s is s + k * stride

#: one lock for every call into TextWorld's engine in this process (loading a game parses its
#: logic with TextWorld's module-level parser; resets and steps run its state tracking)
ENGINE_LOCK = threading.RLock()

_KEY_LOCKS: dict[Path, threading.Lock] = {}
_KEY_LOCKS_GUARD = threading.Lock()
_GENERATORS = threading.BoundedSemaphore(max(1, os.cpu_count() or 1))


def cache_root() -> Path:
    """Where generated games are cached: ``verlog_cache_dir()/textworld``."""
    from verlog.cache import verlog_cache_dir

    return verlog_cache_dir() / "textworld"


def settings_tag(settings: Mapping[str, Any]) -> str:
    """The cache folder's name part for ``settings`` (``level30-only_last_action-...``)."""
    parts = []
    for key, value in sorted(settings.items()):
        if isinstance(value, bool):
            parts.append(key if value else f"no{key}")
        elif value is None:
            continue
        else:
            parts.append(f"{key}{value}")
    return "-".join(parts)


def game_dir(family: str, settings: Mapping[str, Any], seed: int, root: Path | None = None) -> Path:
    """The cache folder of one game (it holds ``game.z8`` and ``game.json`` once built)."""
    return (root or cache_root()) / f"{family}-{settings_tag(settings)}" / f"seed-{seed}"


def candidates(seed: int) -> list[int]:
    """The generation seeds tried, in order, for ``seed``."""
    return [seed + k * SEED_STRIDE for k in range(MAX_GENERATION_TRIES)]


def cached_game(
    family: str, settings: Mapping[str, Any], seed: int, root: Path | None = None
) -> tuple[Path, int] | None:
    """The cached game of ``seed`` (path, seed used), or ``None`` when it must be generated."""
    for candidate in candidates(seed):
        final = game_dir(family, settings, candidate, root)
        if (final / "game.z8").is_file():
            return final / "game.z8", candidate
        if not _failed_marker(final).is_file():
            return None
    return None


def build_game(family: str, settings: Mapping[str, Any], seed: int, root: Path | None = None) -> tuple[Path, int]:
    """The compiled game file of (family, settings, seed) and the seed used, generated on first
    use in a child process (see the module docstring). Thread-safe."""
    if family not in CHALLENGES:
        raise ValueError(f"unknown TextWorld family {family!r}; valid: {', '.join(CHALLENGES)}")
    found = cached_game(family, settings, seed, root)
    if found is not None:
        return found
    key = game_dir(family, settings, seed, root)
    with _KEY_LOCKS_GUARD:
        lock = _KEY_LOCKS.setdefault(key, threading.Lock())
    with lock:  # one builder per game in this process; the others wait for its result
        found = cached_game(family, settings, seed, root)
        if found is not None:
            return found
        with _GENERATORS:
            return _build_in_child(family, settings, seed, root)


def _build_in_child(family: str, settings: Mapping[str, Any], seed: int, root: Path | None) -> tuple[Path, int]:
    request = {"family": family, "settings": dict(settings), "seed": seed, "root": str(root or cache_root())}
    done = subprocess.run(
        [sys.executable, "-m", "verlog.envs.textworld.games", json.dumps(request)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-15:]
        raise RuntimeError(f"building the TextWorld {family} game of seed {seed} failed:\n" + "\n".join(tail))
    answer = json.loads(lines[-1])
    return Path(answer["path"]), int(answer["seed"])


def build_game_here(family: str, settings: Mapping[str, Any], seed: int, root: Path | None = None) -> tuple[Path, int]:
    """:func:`build_game` in this very process (what the child process runs). Not thread-safe
    with any other TextWorld use in the process: call it from a process of its own. It swaps
    verlog's changes into TextWorld's generator (:mod:`verlog.envs.textworld.generator`: the same
    games, a level-30 treasure hunter in seconds instead of minutes, and no endless walkthrough
    search)."""
    from textworld.generator import QuestGenerationError

    from verlog.envs.textworld.generator import install

    install()

    for candidate in candidates(seed):
        final = game_dir(family, settings, candidate, root)
        if (final / "game.z8").is_file():
            return final / "game.z8", candidate
        failed = _failed_marker(final)
        if failed.is_file():
            continue
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            game = _generate(family, settings, candidate)
        except QuestGenerationError as exc:
            _write_atomic(failed, f"QuestGenerationError: {str(exc).strip().splitlines()[0]}\n")
            continue
        wanted = settings.get("walkthrough_length")
        walkthrough = list(game.metadata.get("walkthrough") or [])
        if wanted is not None and len(walkthrough) != int(wanted):
            _write_atomic(failed, f"walkthrough of {len(walkthrough)} commands (wanted {wanted})\n")
            continue
        _compile(
            game,
            final,
            {"family": family, "settings": dict(settings), "seed": candidate, "walkthrough_length": len(walkthrough)},
        )
        return final / "game.z8", candidate
    raise RuntimeError(
        f"TextWorld could not generate a {family} game for seed {seed} "
        f"({MAX_GENERATION_TRIES} candidate seeds tried) with settings {dict(settings)}"
    )


def _generate(family: str, settings: Mapping[str, Any], seed: int) -> Any:
    """A ``textworld.Game`` of ``family`` for ``seed`` (may raise ``QuestGenerationError``)."""
    from textworld.challenges import CHALLENGES as TW_CHALLENGES
    from textworld.generator.game import GameOptions

    options = GameOptions()
    options.seeds = seed
    options.grammar.only_last_action = bool(settings.get("only_last_action", False))
    challenge_settings = {k: v for k, v in settings.items() if k not in VERLOG_KEYS}
    if family == "cooking":
        challenge_settings.setdefault("recipe_seed", seed)
    make = TW_CHALLENGES[CHALLENGES[family]][1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make(challenge_settings, options)


def _compile(game: Any, final: Path, meta: Mapping[str, Any]) -> None:
    from textworld.generator import compile_game
    from textworld.generator.game import GameOptions

    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        options = GameOptions()
        options.path = str(tmp / "game.z8")
        options.force_recompile = True
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile_game(game, options)
        (tmp / "game.ni").unlink(missing_ok=True)
        (tmp / "meta.json").write_text(json.dumps(dict(meta), indent=1))
        try:
            os.rename(tmp, final)
        except OSError:  # another process finished the same game first
            if not (final / "game.z8").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def zmachine_game(path: str | os.PathLike, root: Path | None = None) -> Path:
    """A game file TextWorld 1.7 can play for ``path``: the file itself unless it is a Glulx
    game, which is rebuilt as a Z-machine one from its ``.json`` (see the module docstring)."""
    path = Path(path)
    if path.suffix != ".ulx":
        return path
    description = path.with_suffix(".json")
    if not description.is_file():
        raise ValueError(
            f"{path}: a Glulx game, which TextWorld 1.7 cannot play, and no {description.name} beside it to "
            "rebuild it as a Z-machine game"
        )
    import hashlib

    digest = hashlib.sha256(description.read_bytes()).hexdigest()[:20]
    final = (root or cache_root()) / "zmachine" / digest
    if (final / "game.z8").is_file():
        return final / "game.z8"
    with _KEY_LOCKS_GUARD:
        lock = _KEY_LOCKS.setdefault(final, threading.Lock())
    with lock, _GENERATORS:
        if not (final / "game.z8").is_file():
            request = {"zmachine": str(description), "final": str(final)}
            done = subprocess.run(
                [sys.executable, "-m", "verlog.envs.textworld.games", json.dumps(request)],
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
            )
            if done.returncode != 0 or not (final / "game.z8").is_file():
                tail = (done.stderr or done.stdout).strip().splitlines()[-15:]
                raise RuntimeError(f"rebuilding {path} as a Z-machine game failed:\n" + "\n".join(tail))
    return final / "game.z8"


def _zmachine_here(description: Path, final: Path) -> None:
    """Compile the game described by ``description`` (a TextWorld ``.json``) into ``final``."""
    import textworld

    final.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        game = textworld.Game.load(str(description))
    _compile(game, final, {"rebuilt_from": str(description)})


def _failed_marker(final: Path) -> Path:
    return final.with_name(final.name + ".failed")


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    """The child process: build one game, print ``{"path": ..., "seed": ...}`` as the last line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("request", help='JSON: {"family", "settings", "seed", "root"} or {"zmachine", "final"}')
    args = parser.parse_args(argv)
    request = json.loads(args.request)
    if "zmachine" in request:
        _zmachine_here(Path(request["zmachine"]), Path(request["final"]))
        print(json.dumps({"path": str(Path(request["final"]) / "game.z8")}))
        return
    path, used = build_game_here(request["family"], request["settings"], int(request["seed"]), Path(request["root"]))
    print(json.dumps({"path": str(path), "seed": used}))


if __name__ == "__main__":
    main()
