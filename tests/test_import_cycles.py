"""verlog's modules import each other without cycles (module-level imports; imports inside
functions and under ``TYPE_CHECKING`` are lazy on purpose and not counted), and the game
families' declarations import no game package (listing environments stays cheap)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "verlog"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The verlog modules ``name`` imports at module level (``from pkg import submodule`` counts
    as the submodule)."""
    out: set[str] = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = (
                ".".join(package[: len(package) - node.level + 1] + [node.module or ""]) if node.level else node.module
            )
            base = (base or "").strip(".")
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in modules else base)
    return {m for m in out if m in modules and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert "verlog.envs.babyai" in graph["verlog.envs.registry"]  # the check sees real edges
    assert _cycles(graph) == []


def test_listing_environments_imports_no_game_package() -> None:
    code = (
        "import sys; from verlog.envs import list_envs; names = list_envs(); "
        "heavy = [m for m in ('minigrid', 'crafter', 'textworld', 'nle', 'minihack') if m in sys.modules]; "
        "print(len(names), heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    count, heavy = out.stdout.strip().split(" ", 1)
    assert int(count) > 40 and heavy == "[]"


def _all_imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at module level or inside a function (``from pkg import
    name`` counts as ``pkg``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def test_the_environments_import_no_model_even_lazily() -> None:
    """The word-level models are built from the games' words (``verlog.models`` imports
    ``verlog.envs``); the environments never import the models back, not even inside a function
    (a circle that only laziness keeps from failing): the cache folder they share lives in
    ``verlog.cache``."""
    envs = [p for p in (PACKAGE / "envs").rglob("*.py")]
    assert len(envs) > 20
    back = {
        str(p.relative_to(ROOT)): sorted(m for m in _all_imports(p) if m.split(".")[:2] == ["verlog", "models"])
        for p in envs
    }
    assert {path: names for path, names in back.items() if names} == {}
    assert "verlog.envs.crafter.env" in _all_imports(PACKAGE / "models" / "crafter_words.py")  # the one direction
