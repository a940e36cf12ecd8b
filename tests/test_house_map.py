"""The house's maps match the code: README's "How data flows" and the package docstring name every
subpackage and every top-level module of ``verlog/`` (a new one must be placed on both maps)."""

from __future__ import annotations

from conftest import ROOT

import verlog


def _parts() -> tuple[list[str], list[str]]:
    root = ROOT / "verlog"
    packages = sorted(p.name for p in root.iterdir() if (p / "__init__.py").is_file())
    modules = sorted(p.stem for p in root.glob("*.py") if p.stem != "__init__")
    return packages, modules


def test_the_readme_map_names_every_subpackage_and_module():
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## How data flows")
    section = readme[start : readme.index("\n## ", start + 1)]
    packages, modules = _parts()
    assert packages and modules
    missing = [f"verlog/{p}" for p in packages if f"verlog/{p}" not in section]
    missing += [f"verlog/{m}.py" for m in modules if f"verlog/{m}.py" not in section]
    assert not missing, f"README's map leaves out {missing}"


def test_the_package_docstring_names_every_subpackage_and_module():
    packages, modules = _parts()
    missing = [name for name in packages + modules if f"``verlog.{name}``" not in verlog.__doc__]
    assert not missing, f"verlog/__init__.py's docstring leaves out {missing}"


def test_no_function_in_the_package_is_over_100_lines():
    import ast

    long = []
    for path in sorted((ROOT / "verlog").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 100:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, f"functions over 100 lines (split them by job): {long}"
