"""Checkpoints hold no pickle: optimizer and RNG state round-trip exactly through JSON +
safetensors, and a checkpoint carrying a pickle (an older verlog, another tool, a crafted file) is
refused without running anything."""

from __future__ import annotations

import os
import pickle
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from verlog.weights import checkpoint as ckpt
from verlog.weights.checkpoint import CheckpointError

ROOT = Path(__file__).resolve().parents[1]


class _Payload:
    """Unpickling this runs ``touch <marker>``: what a crafted checkpoint file would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _trained(steps: int = 3, seed: int = 0) -> tuple[torch.nn.Module, dict[str, torch.optim.Optimizer]]:
    torch.manual_seed(seed)
    actor, critic = torch.nn.Linear(4, 3), torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    optimizers = {
        "actor": torch.optim.AdamW(actor.parameters(), lr=1e-2, betas=(0.8, 0.95), weight_decay=0.1),
        "critic": torch.optim.Adam(critic.parameters(), lr=3e-3, amsgrad=True),
    }
    for _ in range(steps):
        x = torch.randn(8, 4)
        loss = actor(x).pow(2).mean() + critic(x).pow(2).mean()
        loss.backward()
        for o in optimizers.values():
            o.step()
            o.zero_grad()
    return torch.nn.ModuleDict({"actor": actor, "critic": critic}), optimizers


def _save(run_dir, optimizers, rng=None, update=1):
    return ckpt.save_checkpoint(
        run_dir,
        update,
        save_actor=lambda d: (d / "actor").mkdir(),
        critic=None,
        optimizers=optimizers,
        rng=rng if rng is not None else ckpt.get_rng_state(),
        state={"runner": {}},
        keep=2,
    )


def _assert_same(a, b):
    """Equal trees: same types (a tuple stays a tuple), equal tensors with equal dtypes."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


def test_optimizer_state_round_trips_exactly(tmp_path):
    models, optimizers = _trained()
    saved = _save(tmp_path, optimizers)
    assert not list(saved.glob("*.pt"))  # no pickle written
    assert {p.name for p in saved.iterdir()} >= {
        "optimizers.json",
        "optimizers.safetensors",
        "rng.json",
        "rng.safetensors",
        "state.json",
    }

    fresh_models, fresh = _trained(steps=0, seed=1)
    fresh_models.load_state_dict(models.state_dict())
    ckpt.load_optimizers(saved, fresh)
    for name in optimizers:
        _assert_same(optimizers[name].state_dict(), fresh[name].state_dict())
    state = fresh["actor"].state_dict()["state"][0]
    assert float(state["step"]) == 3 and state["exp_avg"].abs().sum() > 0 and state["exp_avg_sq"].abs().sum() > 0
    assert fresh["actor"].param_groups[0]["betas"] == (0.8, 0.95)

    # one more step from either side lands on the same weights
    x = torch.randn(8, 4)
    for ms, os_ in ((models, optimizers), (fresh_models, fresh)):
        (ms["actor"](x).pow(2).mean() + ms["critic"](x).pow(2).mean()).backward()
        for o in os_.values():
            o.step()
    for p, q in zip(models.parameters(), fresh_models.parameters()):
        assert torch.equal(p, q)


def test_rng_states_round_trip_exactly(tmp_path):
    g = torch.Generator().manual_seed(7)
    torch.rand(5, generator=g)
    random.random(), np.random.rand(), torch.rand(1)
    random.gauss(0, 1), np.random.randn()  # python and numpy hold a cached gaussian now
    rng = ckpt.get_rng_state({"engine": g})
    saved = _save(tmp_path, {}, rng=rng)
    draws = (
        random.random(),
        random.gauss(0, 1),
        np.random.rand(3),
        np.random.randn(),
        torch.rand(3),
        torch.rand(3, generator=g),
    )

    loaded = ckpt.load_rng(saved)
    _assert_same(rng, loaded)  # the very same values and types (tuples stay tuples)
    ckpt.set_rng_state(loaded, {"engine": g})
    again = (
        random.random(),
        random.gauss(0, 1),
        np.random.rand(3),
        np.random.randn(),
        torch.rand(3),
        torch.rand(3, generator=g),
    )
    assert draws[0] == again[0] and draws[1] == again[1] and draws[3] == again[3]
    assert np.array_equal(draws[2], again[2])
    assert torch.equal(draws[4], again[4]) and torch.equal(draws[5], again[5])


def _pickle_checkpoint(tmp_path, marker, part: str):
    """A checkpoint whose ``part`` (optimizers | rng) is a pickle carrying the payload, as an older
    verlog (torch.save) would have written it."""
    _, optimizers = _trained(steps=1)
    saved = _save(tmp_path / "run", optimizers)
    (saved / f"{part}.json").unlink()
    (saved / f"{part}.safetensors").unlink()
    torch.save({"actor": _Payload(marker)}, saved / f"{part}.pt")
    return saved, optimizers


def test_the_payload_is_live(tmp_path):
    """The crafted file really runs code when unpickled (so the tests below prove something)."""
    marker = tmp_path / "proof"
    pickle.loads(pickle.dumps(_Payload(marker)))
    assert marker.exists()


@pytest.mark.parametrize("part", ["optimizers", "rng"])
def test_a_pickled_part_is_refused_and_nothing_runs(tmp_path, part):
    marker = tmp_path / "marker"
    saved, optimizers = _pickle_checkpoint(tmp_path, marker, part)
    with pytest.raises(CheckpointError) as info:
        if part == "optimizers":
            ckpt.load_optimizers(saved, optimizers)
        else:
            ckpt.load_rng(saved)
    message = str(info.value)
    assert f"{part}.pt is a pickle file" in message and "\n" not in message
    assert not marker.exists()


def test_a_pickle_under_a_safetensors_name_is_refused(tmp_path):
    marker = tmp_path / "marker"
    _, optimizers = _trained(steps=1)
    saved = _save(tmp_path / "run", optimizers)
    with open(saved / "optimizers.safetensors", "wb") as f:
        pickle.dump({"actor": _Payload(marker)}, f)
    with pytest.raises(CheckpointError, match="optimizers.safetensors: not a readable safetensors file"):
        ckpt.load_optimizers(saved, optimizers)
    assert not marker.exists()


def test_other_tools_files_are_refused_in_one_line(tmp_path):
    _, optimizers = _trained(steps=1)
    saved = _save(tmp_path / "run", optimizers)
    (saved / "optimizers.json").write_text('{"state": {}, "param_groups": []}')  # not ours
    with pytest.raises(CheckpointError, match="is not a verlog checkpoint file"):
        ckpt.load_optimizers(saved, optimizers)
    shutil.copy(saved / "rng.json", saved / "optimizers.json")  # ours, but the wrong part
    with pytest.raises(CheckpointError, match="is not a verlog checkpoint file"):
        ckpt.load_optimizers(saved, optimizers)
    (saved / "optimizers.json").unlink()
    with pytest.raises(CheckpointError, match="optimizers.json is missing"):
        ckpt.load_optimizers(saved, optimizers)


def test_an_optimizer_of_another_model_is_a_clear_error(tmp_path):
    _, optimizers = _trained(steps=1)
    saved = _save(tmp_path / "run", optimizers)
    other = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(9))])
    with pytest.raises(CheckpointError, match="the saved actor optimizer does not fit"):
        ckpt.load_optimizers(saved, {"actor": other})


def test_resuming_from_a_pickled_checkpoint_is_one_error_line(tmp_path, capsys):
    """Through ``verlog train --resume``: exit 2, one ``error:`` line, and the payload never ran."""
    from verlog.cli import main
    from verlog.models import toy_model_dir

    run_dir, marker = tmp_path / "run", tmp_path / "marker"
    args = [
        "train",
        str(ROOT / "configs" / "cue_corridor.yaml"),
        f"model.path={toy_model_dir()}",
        f"trainer.run_dir={run_dir}",
        "wandb.mode=disabled",
        "trainer.total_updates=1",
        "trainer.num_envs=2",
        "trainer.turns_per_env=2",
        "critic_warmup.buffer_multiplier=0",
        "eval.at_start=false",
        "eval.at_end=false",
        "algorithm.mini_batch_turns=4",
    ]
    assert main(args) == 0
    saved = ckpt.latest_checkpoint(run_dir)
    for name in ("optimizers.json", "optimizers.safetensors"):
        (saved / name).unlink()
    torch.save({"actor": _Payload(marker)}, saved / "optimizers.pt")  # what an older verlog wrote
    capsys.readouterr()

    assert main([*args, "trainer.total_updates=2", "--resume"]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert f"{saved}: optimizers.pt is a pickle file" in line
    assert not marker.exists()


def test_a_hub_cache_snapshot_loads_but_a_link_out_of_a_folder_does_not(tmp_path):
    """Hugging Face's hub cache keeps a model's files in ``blobs/`` and links them from
    ``snapshots/<revision>/``: such a snapshot loads; the same link in any other folder is refused."""
    from verlog.models import load_causal_lm, load_tokenizer, tiny_model_dir

    repo = tmp_path / "models--verlog--tiny"
    snapshot, blobs = repo / "snapshots" / "0123abc", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, source in enumerate(sorted(tiny_model_dir().iterdir())):
        shutil.copy(source, blobs / f"blob{i}")
        os.symlink(f"../../blobs/blob{i}", snapshot / source.name)
    assert load_tokenizer(snapshot).chat_template and load_causal_lm(snapshot) is not None

    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(snapshot, elsewhere)  # the files themselves ...
    (elsewhere / "model.safetensors").unlink()  # ... but the weights, a link to the cache's blob
    os.symlink((snapshot / "model.safetensors").resolve(), elsewhere / "model.safetensors")
    with pytest.raises(CheckpointError, match="is a symbolic link to .* outside"):
        load_causal_lm(elsewhere)
