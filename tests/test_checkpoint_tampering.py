"""Checkpoints from untrusted hands, through the three loaders that read them: ``verlog
serve-model``, ``verlog eval --checkpoint`` and ``verlog train --resume``.

Each tampering is applied to a fresh copy of a real training run (the toy model, one update; a
LoRA run for the adapter cases), then each loader that reads the tampered part is run through
the command line. Every one must refuse: exit status 2, exactly one ``error:`` line naming the
tampered file, no traceback; no pickle payload runs (it would touch a marker file); no model is
served or evaluated with missing weights; and nothing in the run folder (or around it) is deleted
or changed (but the ``config.yaml`` a resume writes once the checkpoint is known to be the run's,
when only the run's own models can tell the tampering). The untampered run loads in all three,
so the refusals are the tamperings' doing.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch
from safetensors.torch import load_file, save_file

from verlog.cli import main
from verlog.serve import commands as serve_commands
from verlog.serve import openai_server

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "configs" / "cue_corridor.yaml")
LOADERS = ("serve-model", "eval", "resume")
#: the loaders that take a checkpoint's model to play with (a resume continues a run folder; it
#: trains with model.path's tokenizer, yet checks the checkpoint's, which the run is served with)
SERVING = ("serve-model", "eval")
#: tamperings only this run's models can tell (the critic's and adapters' shapes against the
#: base model, the slots' counters): a resume finds them once the checkpoint is known to be the
#: run's and its config.yaml has been written again
FOUND_AT_LOAD = {
    "slot counters of another run",
    "critic of another shape",
    "adapters missing a tensor",
    "adapters of another rank",
    "weights all NaN",
    "adapters all NaN",
}


class _Payload:
    """Unpickling this runs ``touch <marker>``: what a crafted checkpoint file would do."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _overrides(run_dir: Path, *extra: str) -> list[str]:
    from verlog.models import toy_model_dir

    return [
        f"model.path={toy_model_dir()}",
        f"trainer.run_dir={run_dir}",
        "wandb.mode=disabled",
        "trainer.total_updates=1",
        "trainer.num_envs=2",
        "trainer.turns_per_env=2",
        "trainer.save_every=1",
        "critic_warmup.buffer_multiplier=0",
        "eval.at_start=false",
        "eval.at_end=false",
        "algorithm.mini_batch_turns=4",
        "eval.episodes=1",
        *extra,
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A full fine-tuning run and a LoRA run, one update each (never modified: tests copy them)."""
    base = tmp_path_factory.mktemp("runs")
    made = {}
    for kind, extra in (("full", ()), ("lora", ("actor.lora.rank=4", "actor.lr=1e-2"))):
        run_dir = base / kind
        assert main(["train", CONFIG, *_overrides(run_dir, *extra)]) == 0
        made[kind] = run_dir
    return made


# ------------------------------------------------------------------------------ tamperings
def _weights(c: Path) -> Path:
    return c / "actor" / "model.safetensors"


def _edit_tensors(path: Path, edit: Callable[[dict], dict]) -> None:
    save_file(edit(load_file(path)), path)


def _drop_one(t: dict) -> dict:
    return dict(list(t.items())[1:])


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _pickle_to(path: Path, marker: Path) -> None:
    with open(path, "wb") as f:
        pickle.dump({"weights": _Payload(marker)}, f)


def _outside_copy(c: Path, name: str) -> Path:
    """A copy of ``c/name`` outside the run folder (what a link would lead to)."""
    elsewhere = c.parents[3] / "elsewhere" / name.replace("/", "_")
    elsewhere.parent.mkdir(exist_ok=True)
    (shutil.copytree if (c / name).is_dir() else shutil.copy)(c / name, elsewhere)
    return elsewhere


def _link_out(c: Path, name: str) -> None:
    target = _outside_copy(c, name)
    (shutil.rmtree if (c / name).is_dir() else os.remove)(c / name)
    os.symlink(target, c / name)


def _write(name: str, text: str) -> Callable[[Path, Path, Path], None]:
    return lambda run, c, marker: (c / name).write_text(text)


#: (name, run kind, loaders that read the tampered part, the file the error must name, tampering(run, checkpoint, marker))
TAMPERINGS: list[tuple[str, str, tuple[str, ...], str, Callable[[Path, Path, Path], None]]] = [
    ("weights without tensors", "full", LOADERS, "model.safetensors", lambda run, c, m: save_file({}, _weights(c))),
    (
        "weights missing a tensor",
        "full",
        LOADERS,
        "model.safetensors",
        lambda run, c, m: _edit_tensors(_weights(c), _drop_one),
    ),
    (
        "weights with an extra tensor",
        "full",
        LOADERS,
        "model.safetensors",
        lambda run, c, m: _edit_tensors(_weights(c), lambda t: {**t, "model.backdoor.weight": torch.zeros(2)}),
    ),
    (
        "a tensor of another shape",
        "full",
        LOADERS,
        "model.safetensors",
        lambda run, c, m: _edit_tensors(
            _weights(c), lambda t: {k: (v[:-1] if k == "model.norm.weight" else v) for k, v in t.items()}
        ),
    ),
    ("weights that are a pickle", "full", LOADERS, "model.safetensors", lambda run, c, m: _pickle_to(_weights(c), m)),
    (
        "pickled weights instead",
        "full",
        LOADERS,
        "pytorch_model.bin",
        lambda run, c, m: (_weights(c).unlink(), _pickle_to(c / "actor" / "pytorch_model.bin", m)),
    ),
    (
        "truncated weights",
        "full",
        LOADERS,
        "model.safetensors",
        lambda run, c, m: _weights(c).write_bytes(_weights(c).read_bytes()[:1000]),
    ),
    ("config nested 100k deep", "full", LOADERS, "config.json", _write("actor/config.json", _nested(100_000))),
    ("config not JSON", "full", LOADERS, "config.json", _write("actor/config.json", "{not json")),
    (
        "config over the size limit",
        "full",
        LOADERS,
        "config.json",
        _write("actor/config.json", json.dumps({"model_type": "qwen2", "pad": "x" * (17 << 20)})),
    ),
    (
        "config asking for remote code",
        "full",
        LOADERS,
        "config.json",
        _write("actor/config.json", json.dumps({"model_type": "evil", "auto_map": {"AutoConfig": "evil.Config"}})),
    ),
    (
        "tokenizer linked to /dev/zero",
        "full",
        LOADERS,
        "tokenizer.json",
        lambda run, c, m: (
            (c / "actor" / "tokenizer.json").unlink(),
            os.symlink("/dev/zero", c / "actor" / "tokenizer.json"),
        ),
    ),
    (
        "tokenizer config a pipe",
        "full",
        LOADERS,
        "tokenizer_config.json",
        lambda run, c, m: (
            (c / "actor" / "tokenizer_config.json").unlink(),
            os.mkfifo(c / "actor" / "tokenizer_config.json"),
        ),
    ),
    ("tokenizer not a tokenizer", "full", LOADERS, "tokenizer.json", _write("actor/tokenizer.json", '{"version": 7}')),
    (
        "chat template that does not parse",
        "full",
        LOADERS,
        "chat_template.jinja",
        _write("actor/chat_template.jinja", "{% if messages %}{{ messages[0]"),
    ),
    (
        "chat template that raises",
        "full",
        LOADERS,
        "chat_template.jinja",
        _write("actor/chat_template.jinja", "{{ raise_exception('no') }}"),
    ),
    (
        "chat template escaping the sandbox",
        "full",
        LOADERS,
        "chat_template.jinja",
        _write(
            "actor/chat_template.jinja",
            "{{ cycler.__init__.__globals__.os.system('touch ' ~ messages[0]['content']) }}{{ messages[0]['content'] }}",
        ),
    ),
    (
        "weights linked to another model outside",
        "full",
        LOADERS,
        "model.safetensors",
        lambda run, c, m: _link_out(c, "actor/model.safetensors"),
    ),
    ("actor folder linked outside", "full", LOADERS, "actor", lambda run, c, m: _link_out(c, "actor")),
    (
        "checkpoint folder linked outside",
        "full",
        LOADERS,
        "update_000001",
        lambda run, c, m: _link_out(c.parent, "update_000001"),
    ),
    (
        "latest naming an absolute path outside",
        "full",
        LOADERS,
        "latest",
        lambda run, c, m: (c.parent / "latest").write_text(str(_outside_copy(c.parent, "update_000001"))),
    ),
    (
        "latest naming a path up and out",
        "full",
        LOADERS,
        "latest",
        lambda run, c, m: (c.parent / "latest").write_text("../../elsewhere"),
    ),
    (
        "latest naming a missing checkpoint",
        "full",
        LOADERS,
        "update_000009",
        lambda run, c, m: (c.parent / "latest").write_text("update_000009"),
    ),
    ("state.json missing", "full", LOADERS, "state.json", lambda run, c, m: (c / "state.json").unlink()),
    ("state.json not JSON", "full", LOADERS, "state.json", _write("state.json", "\xff\xfe garbage")),
    ("state.json nested 100k deep", "full", LOADERS, "state.json", _write("state.json", _nested(100_000))),
    (
        "state.json of another update",
        "full",
        LOADERS,
        "state.json",
        lambda run, c, m: (c / "state.json").write_text(
            json.dumps({**json.loads((c / "state.json").read_text()), "update": 7})
        ),
    ),
    (
        "optimizers pickled",
        "full",
        LOADERS,
        "optimizers.pt",
        lambda run, c, m: (
            (c / "optimizers.json").unlink(),
            (c / "optimizers.safetensors").unlink(),
            _pickle_to(c / "optimizers.pt", m),
        ),
    ),
    (
        "critic linked outside",
        "full",
        LOADERS,
        "critic.safetensors",
        lambda run, c, m: _link_out(c, "critic.safetensors"),
    ),
    (
        "slot counters of another run",
        "full",
        ("resume",),
        "state.json",
        lambda run, c, m: (c / "state.json").write_text(json.dumps({"update": 1, "warmup_done": True, "runner": [5]})),
    ),
    ("RNG states nested 100k deep", "full", ("resume",), "rng.json", _write("rng.json", _nested(100_000))),
    (
        "RNG states of the wrong kind",
        "full",
        ("resume",),
        "rng.json",
        lambda run, c, m: (c / "rng.json").write_text(
            json.dumps(
                {
                    "format": "verlog-checkpoint",
                    "version": 1,
                    "part": "rng",
                    "tree": {"torch": [1], "python": 2, "numpy": 3, "generators": {}},
                }
            )
        ),
    ),
    (
        "critic of another shape",
        "full",
        ("resume",),
        "critic.safetensors",
        lambda run, c, m: _edit_tensors(c / "critic.safetensors", _drop_one),
    ),
    (
        "adapters missing a tensor",
        "lora",
        LOADERS,
        "adapter_model.safetensors",
        lambda run, c, m: _edit_tensors(c / "actor_adapter" / "adapter_model.safetensors", _drop_one),
    ),
    (
        "adapters that are a pickle",
        "lora",
        LOADERS,
        "adapter_model.safetensors",
        lambda run, c, m: _pickle_to(c / "actor_adapter" / "adapter_model.safetensors", m),
    ),
    (
        "pickled adapters instead",
        "lora",
        LOADERS,
        "adapter_model.bin",
        lambda run, c, m: (
            (c / "actor_adapter" / "adapter_model.safetensors").unlink(),
            _pickle_to(c / "actor_adapter" / "adapter_model.bin", m),
        ),
    ),
    (
        "adapters of another rank",
        "lora",
        LOADERS,
        "adapter_model.safetensors",
        lambda run, c, m: _edit_tensors(
            c / "actor_adapter" / "adapter_model.safetensors",
            lambda t: {k: torch.cat([v, v], dim=0 if "lora_A" in k else 1) for k, v in t.items()},
        ),
    ),
    (
        "weights all NaN",
        "full",
        LOADERS,
        "holds NaN",
        lambda run, c, m: _edit_tensors(
            _weights(c), lambda t: {k: torch.full_like(v, float("nan")) for k, v in t.items()}
        ),
    ),
    (
        "adapters all NaN",
        "lora",
        LOADERS,
        "holds NaN",
        lambda run, c, m: _edit_tensors(
            c / "actor_adapter" / "adapter_model.safetensors",
            lambda t: {k: torch.full_like(v, float("nan")) for k, v in t.items()},
        ),
    ),
    (
        "adapter settings of another method",
        "lora",
        LOADERS,
        "adapter_config.json",
        lambda run, c, m: (c / "actor_adapter" / "adapter_config.json").write_text(
            json.dumps({"peft_type": "PROMPT_TUNING"})
        ),
    ),
]


def _snapshot(folder: Path) -> dict[str, str]:
    """Every entry under ``folder``: file contents' hash, link target, or kind."""
    out = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        if path.is_symlink():
            out[key] = "link:" + os.readlink(path)
        elif path.is_fifo():
            out[key] = "fifo"
        elif path.is_file():
            out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[key] = "dir"
    return out


def _run_loader(loader: str, run_dir: Path, kind: str, monkeypatch) -> int:
    served: list[str] = []
    monkeypatch.setattr(openai_server, "run_server", lambda server, on_start=None: served.append(server.model_name))
    extra = ("actor.lora.rank=4",) if kind == "lora" else ()
    if loader == "serve-model":
        code = serve_commands.main(["serve-model", str(run_dir), "--device", "cpu"])
        assert code != 0 or served, "serve-model returned 0 without serving"
        return code
    if loader == "eval":
        return main(
            [
                "eval",
                CONFIG,
                *_overrides(run_dir, *extra),
                "--checkpoint",
                str(run_dir),
                "--episodes",
                "1",
                "--no-chart",
                "--out",
                str(run_dir.parent / f"eval-out-{kind}"),
            ]
        )
    return main(["train", CONFIG, *_overrides(run_dir, *extra), "trainer.total_updates=2", "--resume"])


def _one_error_line(capsys) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err[-3000:]
    return errors[0]


@pytest.mark.parametrize("loader", LOADERS)
def test_an_untampered_run_loads_in_every_loader(runs, tmp_path, loader, monkeypatch, capsys):
    for kind in ("full", "lora"):
        run_dir = tmp_path / kind
        shutil.copytree(runs[kind], run_dir)
        assert _run_loader(loader, run_dir, kind, monkeypatch) == 0, capsys.readouterr().err[-3000:]


@pytest.mark.parametrize("what,kind,readers,names,tamper", TAMPERINGS, ids=[t[0] for t in TAMPERINGS])
def test_a_tampered_checkpoint_is_refused_in_one_line(
    runs, tmp_path, what, kind, readers, names, tamper, monkeypatch, capsys
):
    root = tmp_path / "root"
    run_dir = root / "runs" / kind
    shutil.copytree(runs[kind], run_dir)
    checkpoint = run_dir / "checkpoints" / "update_000001"
    marker = tmp_path / "payload-ran"
    tamper(run_dir, checkpoint, marker)
    before = _snapshot(root)
    for loader in readers:
        code = _run_loader(loader, run_dir, kind, monkeypatch)
        line = _one_error_line(capsys)
        assert code == 2, (loader, line)
        assert names in line, (loader, line)
        assert not marker.exists(), f"{loader}: the pickle payload ran"
        after = _snapshot(root)
        rewritten = {f"runs/{kind}/config.yaml"} if loader == "resume" and what in FOUND_AT_LOAD else set()
        assert {k: v for k, v in after.items() if k in before and k not in rewritten} == {
            k: v for k, v in before.items() if k not in rewritten
        }, f"{loader} changed the run's files"
        new = {k for k in set(after) - set(before) if not k.startswith("runs/eval-out-")}
        assert not new, (loader, new)


def test_the_suite_covers_at_least_27_tamperings_over_three_loaders():
    assert len(TAMPERINGS) >= 27
    assert sum(len(t[2]) for t in TAMPERINGS) >= 27 * 3


@pytest.mark.parametrize("loader", SERVING)
def test_a_linked_actor_named_by_its_own_path_is_refused_too(runs, tmp_path, loader, monkeypatch, capsys):
    """``CHECKPOINT/actor`` given as the model folder is read as its checkpoint, under the same link rule."""
    run_dir = tmp_path / "root" / "runs" / "full"
    shutil.copytree(runs["full"], run_dir)
    checkpoint = run_dir / "checkpoints" / "update_000001"
    _link_out(checkpoint, "actor")
    served: list[str] = []
    monkeypatch.setattr(openai_server, "run_server", lambda server, on_start=None: served.append(server.model_name))
    actor = str(checkpoint / "actor")
    if loader == "serve-model":
        code = serve_commands.main(["serve-model", actor, "--device", "cpu"])
    else:
        code = main(
            [
                "eval",
                CONFIG,
                *_overrides(run_dir),
                "--checkpoint",
                actor,
                "--episodes",
                "1",
                "--no-chart",
                "--out",
                str(tmp_path / "eval-out"),
            ]
        )
    line = _one_error_line(capsys)
    assert code == 2 and not served and "is a symbolic link" in line and "actor" in line, line
