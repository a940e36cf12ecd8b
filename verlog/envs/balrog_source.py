"""BALROG's own wording and TextWorld games, read from the user's BALROG.

verlog does not carry BALROG's prose: under ``protocol="balrog"`` its games speak verlog's wording
of BALROG's instructions, answer rule and invalid-answer note (the same facts in other words).
Point verlog at a BALROG checkout (github.com/balrog-ai/BALROG) or an installed copy of its
package, with ``verlog eval --balrog PATH`` or ``$VERLOG_BALROG``, and the games use BALROG's own
texts, verbatim, and TextWorld plays BALROG's own game files. ``PATH`` is the folder that holds
the ``balrog`` package (a checkout's root) or the package folder itself.

What is read, from that folder (:class:`BalrogSource`):

* **each game's instruction**: the ``get_instruction_prompt`` function of
  ``balrog/environments/<game>/__init__.py``, called as BALROG's evaluator calls it
  (:class:`PromptCall`; the calls are declared with each family's BALROG settings in
  each game folder's ``__init__``, e.g. :mod:`verlog.envs.babyai`). The module runs without its import lines: a name it imports from a
  sibling module is read from that module when it is a plain value there (Crafter's action list
  from ``crafter/env.py``), and the few names it needs from other packages (the NLE language
  wrapper's action table for MiniHack) are given by verlog. This runs code of the user's BALROG.
* **the answer rule**: the ``naive_instruction`` text of ``balrog/agents/naive.py``.
* **the invalid-answer note**: the f-string ``balrog/evaluator.py`` puts before the observation
  after an invalid answer, filled with the action that ran instead.
* **the image note** (BALROG's vision protocol only): the line ``balrog/prompt_builder/history.py``
  adds to an observation's text when its image is attached (the text appended to the message's
  parts where the event's ``include_image`` flag is set).
* **TextWorld's games**: the ``*.ulx`` then ``*.z8`` files under BALROG's games folder
  (``envs.textworld_kwargs.textworld_games_path`` of ``balrog/config/config.yaml``, ``tw_games``
  by default, next to the package), grouped by the name of the folder holding each file (BALROG's
  task names), each group sorted as BALROG sorts it; with each, the ``.json`` beside it.

:meth:`BalrogSource.provenance` names the folder and a SHA-256 of every file read, of every file
of every game (:func:`game_files`) and of the other files that decide a game's text or rules
(:meth:`BalrogSource.rule_files`), which ``verlog eval`` records in ``summary.json`` and checks
when a run is resumed. A folder that lacks one of these files,
or whose file no longer has the expected shape, is refused with an error naming the file.
"""

from __future__ import annotations

import ast
import builtins
import glob
import hashlib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

#: the environment variable naming the user's BALROG (used when no path is given)
ENV_VAR = "VERLOG_BALROG"
#: where BALROG keeps TextWorld's games when its config names none
DEFAULT_GAMES_FOLDER = "tw_games"
#: BALROG's environment packages whose instruction functions are read
PROMPT_PACKAGES: tuple[str, ...] = ("babyai_text", "babaisai", "crafter", "textworld", "minihack", "nle")
#: the files read besides the environment packages (relative to the folder holding ``balrog``)
NAIVE_AGENT = Path("balrog/agents/naive.py")
EVALUATOR = Path("balrog/evaluator.py")
CONFIG = Path("balrog/config/config.yaml")
PROMPT_BUILDER = Path("balrog/prompt_builder/history.py")
#: BALROG's files outside the environment packages whose rules verlog plays by (hashed, not read)
RULE_FILES_ALSO: tuple[Path, ...] = (
    Path("balrog/environments/__init__.py"),
    Path("balrog/environments/env_wrapper.py"),
)
#: the kinds of file in BALROG's environment packages that decide a game's text or rules
RULE_SUFFIXES = frozenset({".py", ".json", ".yaml", ".txt"})


class BalrogSourceError(ValueError):
    """A folder given as BALROG's is not, or lacks what verlog reads from it."""


@dataclass(frozen=True)
class PromptCall:
    """How BALROG's evaluator asks one game for its instruction: ``package``'s
    ``get_instruction_prompt(*args, **kwargs)``; ``names`` are given to the module for what it
    would import from outside BALROG."""

    package: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    names: Mapping[str, Any] = field(default_factory=dict)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def find_root(path: str | os.PathLike) -> Path:
    """The folder holding BALROG's ``balrog`` package, from a checkout's root or the package
    folder; a :class:`BalrogSourceError` saying what is missing otherwise."""
    given = Path(path).expanduser()
    if not given.exists():
        raise BalrogSourceError(f"BALROG folder {str(given)!r} does not exist")
    for root in (given, given.parent):
        if (root / NAIVE_AGENT).is_file():
            return root.resolve()
    raise BalrogSourceError(
        f"{str(given)!r} is not BALROG (github.com/balrog-ai/BALROG): no {NAIVE_AGENT} in it; give the folder "
        "holding BALROG's balrog package (a checkout's root) or the package folder itself"
    )


def _parse(path: Path) -> ast.Module:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        raise BalrogSourceError(f"cannot read {path}: {exc}") from None


def _literal_assignments(path: Path) -> dict[str, Any]:
    """The module-level names of ``path`` bound to plain Python literals."""
    values: dict[str, Any] = {}
    if not path.is_file():
        return values
    for node in _parse(path).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return values


class BalrogSource:
    """The user's BALROG: its texts (see the module docstring) and TextWorld games.

    Reading is lazy and cached; one instance can serve many games and threads.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.root = find_root(path)
        self._lock = threading.Lock()
        self._modules: dict[str, dict[str, Any]] = {}
        self._answer_rule: str | None = None
        self._note: Callable[[str], str] | None = None
        self._image_note: str | None = None
        self._games: dict[str, list[Path]] | None = None
        self._provenance: dict[str, Any] | None = None
        for relative in self.required_files():
            if not (self.root / relative).is_file():
                raise BalrogSourceError(f"{self.root} is not a complete BALROG: {relative} is missing")

    def __repr__(self) -> str:
        return f"BalrogSource({str(self.root)!r})"

    # -- files ------------------------------------------------------------------------------

    @staticmethod
    def required_files() -> list[Path]:
        """The files every BALROG has and verlog reads, relative to the root."""
        packages = [Path("balrog/environments") / p / "__init__.py" for p in PROMPT_PACKAGES]
        return [NAIVE_AGENT, EVALUATOR, *packages]

    def text_files(self) -> list[Path]:
        """Every file the texts come from, relative to the root: :meth:`required_files`, the
        sibling modules the environment packages import from (Crafter's ``env.py``), BALROG's
        config (where the TextWorld games are) and its prompt builder (the image note)."""
        files = self.required_files() + [path for path in (CONFIG, PROMPT_BUILDER) if (self.root / path).is_file()]
        for package in PROMPT_PACKAGES:
            folder = Path("balrog/environments") / package
            for node in _parse(self.root / folder / "__init__.py").body:
                if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                    sibling = folder / f"{node.module.replace('.', '/')}.py"
                    if (self.root / sibling).is_file() and sibling not in files:
                        files.append(sibling)
        return files

    def rule_files(self) -> list[Path]:
        """The other files of BALROG that decide what its model reads and how its games are
        played, relative to the root: each environment package's code and data (its wrappers,
        text renderers, NetHack's achievements table), the shared environment wrappers and the
        prompt builder. verlog does not read them (it plays by their rules, checked by its
        tests); their digests record which BALROG the run was measured against, and a resumed
        run refuses episodes played while they differed. Those absent are left out."""
        folders = [Path("balrog/environments") / p for p in PROMPT_PACKAGES] + [Path("balrog/environments/wrappers")]
        found = [path for path in RULE_FILES_ALSO if (self.root / path).is_file()]
        for folder in folders:
            if (self.root / folder).is_dir():
                found += sorted(
                    path.relative_to(self.root)
                    for path in (self.root / folder).rglob("*")
                    if path.is_file() and path.suffix in RULE_SUFFIXES
                )
        read = set(self.text_files())
        return [path for path in dict.fromkeys(found) if path not in read]

    @property
    def games_folder(self) -> Path:
        """BALROG's TextWorld games folder (from its config when it names one)."""
        folder = DEFAULT_GAMES_FOLDER
        config = self.root / CONFIG
        if config.is_file():
            import yaml

            try:
                data = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
                folder = data["envs"]["textworld_kwargs"]["textworld_games_path"] or folder
            except (yaml.YAMLError, KeyError, TypeError):
                pass
        return self.root / folder

    # -- the texts --------------------------------------------------------------------------

    @property
    def answer_rule(self) -> str:
        """The naive agent's rule appended to the newest observation."""
        if self._answer_rule is None:
            path = self.root / NAIVE_AGENT
            for node in ast.walk(_parse(path)):
                if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "naive_instruction" for t in node.targets
                ):
                    value = eval(compile(ast.Expression(node.value), str(path), "eval"), {"__builtins__": {}})
                    if isinstance(value, str):
                        self._answer_rule = value
                        break
            else:
                raise BalrogSourceError(f"{path}: no naive_instruction text found (not BALROG's naive agent?)")
        return self._answer_rule

    def invalid_note(self, action: str) -> str:
        """The note BALROG's evaluator puts before the next observation after an invalid answer."""
        if self._note is None:
            path = self.root / EVALUATOR
            template = None
            for node in ast.walk(_parse(path)):
                if (
                    isinstance(node, ast.BinOp)
                    and isinstance(node.op, ast.Add)
                    and isinstance(node.left, ast.JoinedStr)
                    and isinstance(node.right, ast.Subscript)
                    and isinstance(node.right.slice, ast.Constant)
                    and node.right.slice.value == "long_term_context"
                ):
                    template = node.left
                    break
            names = {n.id for n in ast.walk(template) if isinstance(n, ast.Name)} if template is not None else set()
            if template is None or names - {"action"}:
                raise BalrogSourceError(
                    f"{path}: no invalid-answer note found (an f-string of `action` added before the "
                    "observation's long_term_context)"
                )
            code = compile(ast.Expression(template), str(path), "eval")
            self._note = lambda action: str(eval(code, {"__builtins__": {}}, {"action": action}))
        return self._note(action)

    @property
    def image_note(self) -> str:
        """The line BALROG's prompt builder adds to an observation's text when its image is
        attached (BALROG's vision protocol): the text appended to the message's parts under the
        ``include_image`` test of ``balrog/prompt_builder/history.py``."""
        if self._image_note is None:
            path = self.root / PROMPT_BUILDER
            if not path.is_file():
                raise BalrogSourceError(f"{self.root} is not a complete BALROG: {PROMPT_BUILDER} is missing")
            for node in ast.walk(_parse(path)):
                if not isinstance(node, ast.If) or not any(
                    isinstance(n, ast.Constant) and n.value == "include_image" for n in ast.walk(node.test)
                ):
                    continue
                for call in (n for statement in node.body for n in ast.walk(statement)):
                    if (
                        isinstance(call, ast.Call)
                        and isinstance(call.func, ast.Attribute)
                        and call.func.attr == "append"
                        and len(call.args) == 1
                        and isinstance(call.args[0], ast.Constant)
                        and isinstance(call.args[0].value, str)
                    ):
                        self._image_note = call.args[0].value
                        break
                if self._image_note is not None:
                    break
            else:
                raise BalrogSourceError(
                    f"{path}: no image note found (a text appended to the message's parts under the "
                    "event's include_image test)"
                )
        return self._image_note

    def _module(self, package: str) -> dict[str, Any]:
        """The namespace of ``balrog/environments/<package>/__init__.py``, run without its imports."""
        with self._lock:
            if package in self._modules:
                return self._modules[package]
            path = self.root / "balrog" / "environments" / package / "__init__.py"
            tree = _parse(path)
            namespace: dict[str, Any] = {
                "__name__": f"balrog.environments.{package}",
                "__file__": str(path),
                "__builtins__": builtins,
            }
            for node in tree.body:
                if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                    sibling = _literal_assignments(path.parent / f"{node.module.replace('.', '/')}.py")
                    for alias in node.names:
                        if alias.name in sibling:
                            namespace[alias.asname or alias.name] = sibling[alias.name]
            for node in tree.body:
                if not isinstance(node, (ast.Assign, ast.AnnAssign, ast.FunctionDef)):
                    continue  # imports, classes, expressions: not needed for the instruction
                try:
                    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
                except NameError:
                    continue  # a value built from something imported (e.g. __all__ = [a class])
            self._modules[package] = namespace
            return namespace

    def instruction(self, call: PromptCall) -> str:
        """The instruction BALROG's ``get_instruction_prompt`` gives for ``call``."""
        namespace = self._module(call.package)
        function = namespace.get("get_instruction_prompt")
        path = self.root / "balrog" / "environments" / call.package / "__init__.py"
        if not callable(function):
            raise BalrogSourceError(f"{path}: no get_instruction_prompt function")
        namespace.update(call.names)
        try:
            text = function(*call.args, **dict(call.kwargs))
        except Exception as exc:
            raise BalrogSourceError(
                f"{path}: get_instruction_prompt failed under verlog ({type(exc).__name__}: {exc})"
            ) from exc
        if not isinstance(text, str):
            raise BalrogSourceError(f"{path}: get_instruction_prompt returned {type(text).__name__}, not text")
        return text

    # -- TextWorld's games -------------------------------------------------------------------

    def _all_games(self) -> dict[str, list[Path]]:
        """Every game file under BALROG's games folder, by task, in BALROG's order."""
        with self._lock:
            if self._games is None:
                games: dict[str, list[Path]] = {}
                for pattern in ("*.ulx", "*.z8"):
                    found = glob.glob(os.path.join(str(self.games_folder), f"**/{pattern}"), recursive=True)
                    for entry in sorted(found):
                        games.setdefault(Path(entry).parent.name, []).append(Path(entry))
                self._games = games
            return self._games

    def textworld_games(self, task: str) -> list[Path]:
        """BALROG's game files of TextWorld task ``task`` (``treasure_hunter``,
        ``the_cooking_game``, ``coin_collector``), in BALROG's order: Glulx files first, then
        Z-machine files, each sorted by path."""
        found = self._all_games().get(task, [])
        if not found:
            raise BalrogSourceError(
                f"no TextWorld games for {task!r} under {self.games_folder} (BALROG's games go in "
                f"{self.games_folder}/{task}/; see BALROG's balrog/environments/textworld/README.md)"
            )
        return list(found)

    # -- provenance ---------------------------------------------------------------------------

    def provenance(self) -> dict[str, Any]:
        """Where the texts and games come from: the root, each file's SHA-256 (the files read,
        :meth:`rule_files`, and every file of each game: :func:`game_files`), one SHA-256 over
        them all, and the number of games per TextWorld task (recorded in ``summary.json``).
        Computed once per source."""
        if self._provenance is not None:
            return self._provenance
        files = {str(relative): _sha256(self.root / relative) for relative in self.text_files() + self.rule_files()}
        games = self._all_games()
        for paths in games.values():
            for game in paths:
                for path in game_files(game):
                    files[os.path.relpath(path, self.root)] = _sha256(path)
        total = hashlib.sha256("".join(f"{name}\t{digest}\n" for name, digest in sorted(files.items())).encode())
        self._provenance = {
            "path": str(self.root),
            "sha256": total.hexdigest(),
            "files": files,
            "textworld_games": {task: len(paths) for task, paths in sorted(games.items())},
        }
        return self._provenance


def game_files(game: Path) -> list[Path]:
    """Every file that decides TextWorld game ``game``: the game file and the files beside it
    that share its name (the ``.json`` game description, from which TextWorld reads the goal,
    the walkthrough and the score of a Z-machine game, and from which verlog rebuilds a Glulx
    one; an Inform source ``.ni`` when there is one), sorted."""
    return sorted({game, *(p for p in game.parent.glob(f"{glob.escape(game.stem)}.*") if p.is_file())})


def changed_files(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """The files (relative paths) of two provenances' ``files`` whose content differs, or that
    only one of them has, sorted."""
    return sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))


def open_source(spec: str | os.PathLike | Mapping[str, Any] | None = None, fresh: bool = False) -> BalrogSource | None:
    """The user's BALROG: ``spec`` is its folder, or ``{"path": ..., "sha256": ...}`` to insist on
    the very files a run started with (:meth:`BalrogSource.provenance`); without one,
    ``$VERLOG_BALROG``; ``None`` when neither is set (the games then speak verlog's wording).
    Sources are cached by folder; ``fresh`` reads the folder again (what a run starting does, so
    that files edited since an earlier run in this process are seen) and caches that reading."""
    expected = None
    if isinstance(spec, Mapping):
        unknown = sorted(set(spec) - {"path", "sha256"})
        if unknown or "path" not in spec:
            raise BalrogSourceError(f"balrog_source: expected a path or {{path, sha256}}, got keys {sorted(spec)}")
        spec, expected = spec["path"], spec.get("sha256")
    chosen = spec if spec else os.environ.get(ENV_VAR) or None
    if not chosen:
        return None
    root = find_root(chosen)
    with _SOURCES_LOCK:
        source = None if fresh else _SOURCES.get(root)
        if source is None:
            source = _SOURCES[root] = BalrogSource(root)
    if expected is not None and source.provenance()["sha256"] != expected:
        raise BalrogSourceError(
            f"the BALROG files at {root} changed since this run read them (sha256 now "
            f"{source.provenance()['sha256'][:12]}, the run's {str(expected)[:12]}): its episodes would mix two "
            "versions of BALROG's texts or games; evaluate into another --out folder"
        )
    return source


_SOURCES: dict[Path, BalrogSource] = {}
_SOURCES_LOCK = threading.Lock()
