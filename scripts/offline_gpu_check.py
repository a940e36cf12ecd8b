"""The GPU check of an air-gapped GPU machine: what ``scripts/offline_gpu_check.sh`` runs (docs/gpu.md).

It needs the machine's own Python with its CUDA torch, this source tree and the folder ``make
wheelhouse`` made elsewhere; no network. Its steps, each in a process of its own, each timed, each
recorded whatever the others did (a step that fails or runs out of time is recorded and the next
one runs), within ``--budget-s`` (600 s) in all:

1. **install**: the wheelhouse checked against its manifest (sizes, sha256), then installed with
   ``pip install --no-index --no-deps --target`` into a private folder (``--site``), put before the
   machine's packages on ``PYTHONPATH`` and after this source tree; the machine's torch and every
   other package of its own stay as they are.
2. **environment**: Python, torch, CUDA, the GPU's name and memory, the version of every package the
   embedded path takes from the machine or the wheelhouse; requirements of the carried wheels the
   machine does not meet, and verlog's own ranges the machine's versions are outside.
3. **imports**: every module the carried wheels install, and verlog's embedded path.
4. **GPU tests**: ``pytest -m gpu tests/test_gpu.py``.
5. **P6**: ``benchmarks/gpu_throughput.py decode``: the engine against transformers' ``generate``.
6. **training**: ``benchmarks/gpu_throughput.py train``: one PPO update's tokens/s and peak memory.
7. **make run**: what ``make run`` runs (``configs/quickstart.yaml``, ``model.device: auto``, then
   random valid actions on the same held-out levels): the win rates before and after training.

``--dry-run`` runs every step on the CPU with tiny sizes (what a machine without a GPU can check).
Writes ``results.json`` (rewritten after each step) and ``log.txt`` (every line every step printed)
into the output folder; exits 1 when a step failed or ran out of time. Only the standard library is
imported here: the steps bring the rest.

    python scripts/offline_gpu_check.py OUT_DIR [--dry-run] [--wheelhouse wheelhouse] [--site .offline-site]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
#: what each step may take at most (seconds; the whole budget bounds them all)
BUDGETS = {
    "install": 120,
    "environment": 60,
    "imports": 90,
    "GPU tests": 150,
    "P6": 180,
    "training": 180,
    "make run": 600,
}
#: a step is not started with less time than this left
MIN_STEP_S = 15
#: verlog's modules on the embedded path, imported by the imports step beside the carried wheels'
VERLOG_MODULES = (
    "verlog.cli",
    "verlog.train.trainer",
    "verlog.backends.embedded",
    "verlog.backends.grammar",
    "verlog.envs.babyai",
    "verlog.evaluation.baseline",
    "verlog.data.files",
    "llguidance.torch",
    "datasets",
)
#: `make run`'s training made tiny for a dry run
DRY_RUN_QUICKSTART = (
    "trainer.total_updates=1",
    "trainer.num_envs=4",
    "trainer.turns_per_env=2",
    "eval.episodes=4",
    "critic_warmup.buffer_multiplier=1",
    "critic_warmup.iterations=1",
    "model.device=cpu",
)
#: a step's last lines kept in results.json
TAIL_LINES = 40
OUT_OF_TIME = "skipped (out of time)"


@dataclass
class StepResult:
    """One step's record in results.json."""

    name: str
    status: str = "ok"
    wall_s: float = 0.0
    commands: list[str] = field(default_factory=list)
    figures: dict = field(default_factory=dict)
    tail: list[str] = field(default_factory=list)


class Check:
    """The steps' runner: the clock, the log, the child processes' environment, results.json."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.out: Path = args.out
        self.out.mkdir(parents=True, exist_ok=True)
        self.log = open(self.out / "log.txt", "a", buffering=1)
        self.started = time.monotonic()
        self.results: list[StepResult] = []
        site = str(args.site)
        self.env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(ROOT), site, *filter(None, [os.environ.get("PYTHONPATH")])]),
            PATH=os.pathsep.join([str(Path(site) / "bin"), os.environ.get("PATH", "")]),
            PYTHONUNBUFFERED="1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
        )
        if args.dry_run:
            self.env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU, even where a GPU is

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.log.write(line + "\n")

    def left_s(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.started)

    def run(self, step: StepResult, cmd: list[str], deadline: float) -> int | None:
        """Run ``cmd`` in ROOT, its lines to the console and the log; its exit code (``None``: it ran
        past ``deadline``, a ``time.monotonic()`` instant, and was stopped)."""
        step.commands.append(" ".join(cmd))
        self.say(f"$ {' '.join(cmd)}")
        tail: deque[str] = deque(maxlen=TAIL_LINES)
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,  # its own process group: stopped whole on a time-out
        )

        def pump() -> None:
            for line in proc.stdout:
                line = line.rstrip("\n")
                tail.append(line)
                self.say(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            code = None
        reader.join(timeout=10)
        step.tail = list(tail)
        return code

    def step(self, name: str, body: Callable[[StepResult, float], None]) -> None:
        """Run one step within its budget and the time left (``body(step, deadline)``); record it
        whatever happens."""
        step = StepResult(name)
        limit = min(BUDGETS[name], self.left_s())
        self.say(f"\n== {name} (at most {limit:.0f} s; {self.left_s():.0f} s of the budget left)")
        started = time.monotonic()
        if limit < MIN_STEP_S:
            step.status = OUT_OF_TIME
        else:
            try:
                body(step, started + limit)
            except Exception as exc:  # a step's own failure is its record, not the check's end
                step.status = f"FAILED: {type(exc).__name__}: {exc}"
        step.wall_s = round(time.monotonic() - started, 1)
        self.say(f"-- {name}: {step.status} ({step.wall_s} s)")
        self.results.append(step)
        self.write()

    def write(self) -> None:
        results = {
            "dry_run": self.args.dry_run,
            "budget_s": self.args.budget_s,
            "total_s": round(time.monotonic() - self.started, 1),
            "root": str(ROOT),
            "wheelhouse": str(self.args.wheelhouse),
            "site": str(self.args.site),
            "steps": [asdict(s) for s in self.results],
            "summary": {s.name: s.status for s in self.results},
        }
        tmp = self.out / "results.json.tmp"
        tmp.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
        os.replace(tmp, self.out / "results.json")


def _status(code: int | None, what: str = "exited") -> str:
    if code is None:
        return "FAILED: ran past its time and was stopped"
    return "ok" if code == 0 else f"FAILED: {what} {code}"


def failed(status: str) -> bool:
    """Whether a step's status fails the check (a failure, or a step the budget left no time for)."""
    return status.startswith("FAILED") or status == OUT_OF_TIME


# ---------------------------------------------------------------------- the steps


def install(check: Check, step: StepResult, deadline: float) -> None:
    py, wheelhouse, site = sys.executable, Path(check.args.wheelhouse), Path(check.args.site)
    code = check.run(step, [py, "scripts/wheelhouse.py", "check", "--dest", str(wheelhouse)], deadline)
    if code != 0:
        step.status = _status(code, "the wheelhouse check exited")
        return
    manifest = json.loads((wheelhouse / "manifest.json").read_text())
    shutil.rmtree(site, ignore_errors=True)  # a fresh target: nothing of an earlier wheelhouse stays
    wheels = [str(wheelhouse / w["file"]) for w in manifest["wheels"]]
    cmd = [py, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile", "--quiet", "--target", str(site)]
    code = check.run(step, cmd + wheels, deadline)
    step.status = _status(code, "pip exited")
    step.figures = {
        "wheels": len(wheels),
        "bytes": manifest["total_bytes"],
        "python": manifest["python"],
        "machine_python": platform.python_version(),
    }
    if manifest["python"] != "{}.{}".format(*sys.version_info[:2]):
        step.status = f"FAILED: the wheelhouse is for Python {manifest['python']}, this is {platform.python_version()}"


def probe(check: Check, step: StepResult, deadline: float, what: str) -> None:
    """Run one of this file's probes (``--probe``) in a child with the check's environment; its last
    line is its JSON figures."""
    cmd = [sys.executable, __file__, str(check.out), "--probe", what, "--wheelhouse", str(check.args.wheelhouse)]
    code = check.run(step, cmd + ["--site", str(check.args.site)], deadline)
    step.status = _status(code)
    if step.tail and step.tail[-1].startswith("{"):
        step.figures = json.loads(step.tail[-1])
        step.tail = step.tail[:-1]
    if step.status == "ok" and step.figures.get("problems"):
        step.status = "FAILED: " + "; ".join(step.figures["problems"])


def gpu_tests(check: Check, step: StepResult, deadline: float) -> None:
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider", "tests/test_gpu.py"]
    code = check.run(step, cmd, deadline)
    summary = next(
        (line for line in reversed(step.tail) if " in " in line and ("passed" in line or "skipped" in line)), ""
    )
    step.figures = {"summary": summary.strip("= ")}
    step.status = _status(code, "pytest exited")
    if code == 0 and "passed" not in summary:
        step.status = "skipped (no CUDA: every GPU test skipped, saying so)"


def throughput(check: Check, step: StepResult, deadline: float, what: str) -> None:
    figures = check.out / f"{'p6' if what == 'decode' else 'training'}.json"
    cmd = [sys.executable, "benchmarks/gpu_throughput.py", what, "--json", str(figures)]
    code = check.run(step, cmd + (["--dry-run"] if check.args.dry_run else []), deadline)
    step.status = _status(code)
    if code == 0:
        step.figures = json.loads(figures.read_text())


def make_run(check: Check, step: StepResult, deadline: float) -> None:
    run_dir = check.out / "quickstart"
    shutil.rmtree(run_dir, ignore_errors=True)
    train = [sys.executable, "-m", "verlog.cli", "train", "configs/quickstart.yaml", f"trainer.run_dir={run_dir}"]
    code = check.run(step, train + (list(DRY_RUN_QUICKSTART) if check.args.dry_run else []), deadline)
    if code != 0:
        step.status = _status(code, "verlog train exited")
        return
    baseline = [sys.executable, "-m", "verlog.evaluation.baseline", str(run_dir)]
    code = check.run(step, baseline, deadline)
    step.status = _status(code, "the baseline exited")
    table = {}
    for name, path, key in (
        ("before", run_dir / "eval.json", "before"),
        ("after", run_dir / "eval.json", "after"),
        ("random valid actions", run_dir / "baseline.json", "random_valid_actions"),
    ):
        if path.exists():
            for task in json.loads(path.read_text()).get(key) or []:
                table.setdefault(task["task"], {})[name] = {
                    k: task[k] for k in ("episodes", "win_rate", "win_rate_se", "length_mean")
                }
    step.figures = {"win_rates": table, "table": [line for line in step.tail if "│" in line or "┃" in line]}


# ---------------------------------------------------------------------- the probes (run in a child)


def probe_environment(args: argparse.Namespace) -> dict:
    """Versions, the GPU, and the requirements that the packages found do not meet."""
    from importlib import metadata

    import torch
    from packaging.requirements import Requirement

    manifest = json.loads((Path(args.wheelhouse) / "manifest.json").read_text())
    site = Path(args.site).resolve()

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    cuda = torch.cuda.is_available()
    gpu = {}
    if cuda:
        props = torch.cuda.get_device_properties(0)
        gpu = {
            "name": props.name,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "count": torch.cuda.device_count(),
        }
    machine = {m["name"]: version(m["name"]) for m in manifest["machine"]}
    problems = [f"{name} is not installed on this machine" for name, v in machine.items() if v is None]
    if site in Path(torch.__file__).resolve().parents:
        problems.append(f"torch was imported from {site}: the wheelhouse must not carry torch")
    unmet = []  # the carried wheels' requirements this environment does not meet
    for w in manifest["wheels"]:
        for text in metadata.requires(w["name"]) or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            found = version(req.name)
            if found is None or (req.specifier and not req.specifier.contains(found, prereleases=True)):
                unmet.append(f"{w['name']} needs {req}: {req.name} {found or 'is missing'}")
    outside = []  # verlog's ranges that the machine's versions are outside
    for text in manifest["requirements_on_machine"]:
        req = Requirement(text)
        found = version(req.name)
        if found is not None and req.specifier and not req.specifier.contains(found, prereleases=True):
            outside.append(f"{req.name} {found} (verlog's pyproject.toml: {req.specifier})")
    figures = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_file": torch.__file__,
        "cuda": cuda,
        "cuda_version": torch.version.cuda,
        "gpu": gpu,
        "machine_packages": machine,
        "carried_packages": {w["name"]: version(w["name"]) for w in manifest["wheels"]},
        "unmet_requirements": unmet,
        "outside_verlog_ranges": outside,
        "problems": problems + unmet,
    }
    print(f"Python {figures['python']}, torch {figures['torch']} ({torch.__file__})")
    print(
        f"CUDA: {gpu['name']} ({gpu['memory_gib']} GiB, {gpu['count']} device(s)), CUDA {torch.version.cuda}"
        if cuda
        else "CUDA: none (a CPU run)"
    )
    print("from the machine: " + ", ".join(f"{n} {v}" for n, v in machine.items()))
    print("from the wheelhouse: " + ", ".join(f"{n} {v}" for n, v in figures["carried_packages"].items()))
    for line in outside:
        print(f"outside verlog's range (the embedded path is tested with it: docs/gpu.md): {line}")
    for line in unmet:
        print(f"unmet: {line}")
    return figures


def probe_imports(args: argparse.Namespace) -> dict:
    """Import every top-level module the carried wheels installed, and verlog's embedded path."""
    import importlib
    from importlib import metadata

    manifest = json.loads((Path(args.wheelhouse) / "manifest.json").read_text())
    modules: list[str] = []
    for w in manifest["wheels"]:
        for file in metadata.files(w["name"]) or []:
            top = file.parts[0]
            if len(file.parts) == 1 and top.endswith(".py"):
                name = top[:-3]  # a module
            elif len(file.parts) == 2 and file.parts[1] == "__init__.py":
                name = top  # a package
            else:
                continue
            if not name.startswith("_") and name not in modules:
                modules.append(name)
    broken = {}
    everything = [*modules, *VERLOG_MODULES]
    for name in everything:
        try:
            importlib.import_module(name)
        except Exception as exc:  # every failure is a line of the record
            broken[name] = f"{type(exc).__name__}: {exc}"
            print(f"  FAILED: import {name}: {broken[name]}")
    print(f"imported {len(everything) - len(broken)} of {len(everything)} modules: {', '.join(everything)}")
    return {"modules": everything, "failed": broken, "problems": [f"import {n}" for n in broken]}


PROBES = {"environment": probe_environment, "imports": probe_imports}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder results.json and log.txt are written into")
    parser.add_argument("--dry-run", action="store_true", help="every step on the CPU with tiny sizes")
    parser.add_argument("--wheelhouse", type=Path, default=ROOT / "wheelhouse", help="make wheelhouse's folder")
    parser.add_argument("--site", type=Path, default=ROOT / ".offline-site", help="the private install target")
    parser.add_argument("--budget-s", type=float, default=600.0, help="the wall time of the whole check")
    parser.add_argument("--probe", choices=sorted(PROBES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(PROBES[args.probe](args)))
        return 0
    check = Check(args)
    check.say(
        f"verlog's offline GPU check{' (dry run: the CPU, tiny sizes)' if args.dry_run else ''}: "
        f"{platform.python_version()} at {sys.executable}, {ROOT}; results into {args.out}"
    )
    check.step("install", lambda s, t: install(check, s, t))
    check.step("environment", lambda s, t: probe(check, s, t, "environment"))
    check.step("imports", lambda s, t: probe(check, s, t, "imports"))
    check.step("GPU tests", lambda s, t: gpu_tests(check, s, t))
    check.step("P6", lambda s, t: throughput(check, s, t, "decode"))
    check.step("training", lambda s, t: throughput(check, s, t, "train"))
    check.step("make run", lambda s, t: make_run(check, s, t))
    check.say(
        f"\n== summary ({time.monotonic() - check.started:.0f} s of {args.budget_s:.0f}; {args.out / 'results.json'})"
    )
    for s in check.results:
        check.say(f"  {s.name:12s} {s.wall_s:6.1f} s  {s.status}")
    return 1 if any(failed(s.status) for s in check.results) else 0


if __name__ == "__main__":
    sys.exit(main())
