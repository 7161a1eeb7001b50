"""Checkpoints under faults (issue 25): a run killed at any point -- between steps, or in the middle of writing a
checkpoint -- and resumed with ``fit(resume=True)`` ends bit-identical to the uninterrupted run, with a seeded loader
generator and an epoch callback that draws random numbers; every flipped byte is detected; temp files of killed saves
are removed; the runner's best-of-last selection stays consistent with the epoch checkpoint."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import varbnn
import varbnn.training.checkpoint as checkpoint_module
import varbnn.training.loop as train_module
from varbnn.training import CheckpointError, fit, read_checkpoint, save_checkpoint, seed_everything
from varbnn_lab import ExperimentConfig, Variant, run_experiment

EPOCHS = 4
STEPS_PER_EPOCH = 4  # 64 examples, batches of 16


class Killed(BaseException):
    """Stands for SIGKILL: nothing in the library catches it."""


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    return x, (x[:, 0] - x[:, 2] > 0).long()


def _run(path: Path, *, kill_step: int | None = None, loader_generator: bool = True, draws: bool = True):
    """One process's worth of training: fresh seeds, model, optimizer and loader, then fit(resume=True)."""
    seed_everything(123)  # what a restarted script does first
    x, y = _data()
    model = varbnn.bayesianize(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), varbnn.MeanField())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0) if loader_generator else None
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=generator)

    def on_epoch_end(epoch: int, record: dict[str, float]) -> None:
        if draws:  # random draws between epochs: they shift every later weight-noise draw and shuffle
            record["draws"] = random.random() + float(np.random.rand()) + float(torch.rand(()))

    def on_step_end(step: int, terms: object) -> None:
        if step == kill_step:
            raise Killed(f"killed after step {step}")

    history = fit(
        model, loader, n_data=64, epochs=EPOCHS, optimizer=optimizer, progress=False, checkpoint=path, resume=True,
        on_epoch_end=on_epoch_end, on_step_end=on_step_end,
    )  # fmt: skip
    return model, history


def _assert_same(a: nn.Module, b: nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("loader_generator,draws", [(True, False), (False, True)], ids=["loader-generator", "callback-draws"])
def test_resume_is_bit_identical(tmp_path, loader_generator, draws):
    straight, straight_history = _run(tmp_path / "straight.pt", loader_generator=loader_generator, draws=draws)
    with pytest.raises(Killed):
        _run(tmp_path / "killed.pt", kill_step=2 * STEPS_PER_EPOCH + 1, loader_generator=loader_generator, draws=draws)
    assert read_checkpoint(tmp_path / "killed.pt")["epoch"] == 2
    resumed, resumed_history = _run(tmp_path / "killed.pt", loader_generator=loader_generator, draws=draws)
    assert resumed_history == straight_history
    _assert_same(straight, resumed)


def _kill_plans() -> list[list[tuple[str, int]]]:
    """Seeded random kill points, in the order a run reaches them: ("step", k) raises after optimizer step k;
    ("save", e) dies half-way through writing epoch e's checkpoint."""
    rng = random.Random(25)
    steps = rng.sample(range(1, EPOCHS * STEPS_PER_EPOCH + 1), 3)
    saves = rng.sample(range(1, EPOCHS + 1), 2)
    plans = [[("step", steps[0]), ("save", saves[0])], [("save", saves[1]), ("step", steps[1])], [("step", steps[2])]]
    progress = {"step": lambda k: k, "save": lambda e: e * STEPS_PER_EPOCH + 0.5}  # a save follows its epoch's steps
    return [sorted(plan, key=lambda kill: progress[kill[0]](kill[1])) for plan in plans]


@pytest.mark.parametrize("plan", _kill_plans(), ids=lambda plan: "-".join(f"{k}{v}" for k, v in plan))
def test_training_killed_at_random_points_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch, plan):
    straight, straight_history = _run(tmp_path / "straight.pt")
    path = tmp_path / "run" / "ckpt.pt"
    write_bytes = checkpoint_module._write_bytes
    for kind, at in plan:
        done = read_checkpoint(path)["epoch"] if path.exists() else 0
        assert (kind == "save" and at > done) or (kind == "step" and at > done * STEPS_PER_EPOCH)
        if kind == "save":
            calls = {"n": done}  # this process's first save is epoch done + 1

            def dying_write(file, data, chunk=1 << 24, at=at, calls=calls):
                calls["n"] += 1
                if calls["n"] == at:
                    file.write(data[: len(data) // 2])
                    file.flush()
                    raise Killed("killed while writing the checkpoint")
                write_bytes(file, data, chunk)

            monkeypatch.setattr(checkpoint_module, "_write_bytes", dying_write)
            with pytest.raises(Killed):
                _run(path)
            monkeypatch.setattr(checkpoint_module, "_write_bytes", write_bytes)
            completed = at - 1  # the half-written epoch-`at` checkpoint never replaced the previous one
        else:
            with pytest.raises(Killed):
                _run(path, kill_step=at)
            completed = (at - 1) // STEPS_PER_EPOCH
        assert (read_checkpoint(path)["epoch"] if path.exists() else 0) == completed
        if path.parent.exists():  # no temp file left behind
            assert sorted(p.name for p in path.parent.iterdir()) == (["ckpt.pt"] if path.exists() else [])
    resumed, resumed_history = _run(path)
    assert resumed_history == straight_history
    _assert_same(straight, resumed)


def test_every_flipped_byte_is_detected(tmp_path):
    model = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    path = save_checkpoint(tmp_path / "c.pt", model, optimizer, epoch=3, history=[{"loss": 1.0}] * 3, step=7)
    data = path.read_bytes()
    damaged = tmp_path / "damaged.pt"
    positions = sorted({*range(0, len(data), 37), *range(len(data) - 120, len(data))})  # the trailer's every byte
    for position in positions:
        for mask in (0x01, 0xFF):
            flipped = bytearray(data)
            flipped[position] ^= mask
            damaged.write_bytes(flipped)
            with pytest.raises(CheckpointError, match="damaged|cannot be read") as info:
                read_checkpoint(damaged)
            assert "weights_only=False" not in str(info.value) and str(damaged) in str(info.value)
    assert torch.load(path, weights_only=True)["model"].keys() == model.state_dict().keys()  # still a torch file


def test_saves_are_fsynced_and_remove_the_temp_files_of_killed_saves(tmp_path, monkeypatch):
    model = nn.Linear(2, 2)
    path = save_checkpoint(tmp_path / "c.pt", model, epoch=1)
    old = [tmp_path / ".c.pt.abcd1234.tmp", tmp_path / ".c.pt.zz_9yx87.tmp"]  # what two killed saves left
    for orphan in old:
        orphan.write_bytes(b"partial")
        os.utime(orphan, (1e9, 1e9))
    others = [tmp_path / ".c.pt.x.abcd1234.tmp", tmp_path / ".d.pt.abcd1234.tmp", tmp_path / "notes.tmp"]
    for other in others:  # another checkpoint's temp files and unrelated files are left alone
        other.write_bytes(b"keep")
        os.utime(other, (1e9, 1e9))
    synced: list[int] = []
    fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), fsync(fd))[1])
    save_checkpoint(path, model, epoch=2)
    assert len(synced) >= 2  # the temp file before the rename, the directory after it
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["c.pt", *(o.name for o in others)])
    assert read_checkpoint(path)["epoch"] == 2


def _best_config(epochs: int = 4) -> ExperimentConfig:
    return ExperimentConfig(
        name="best-kill", description="", dataset="digits", model="mlp",
        model_options={"in_features": 64, "hidden": (8,), "out_features": 10},
        variants=(Variant("mf", family_options={"init_std": 1e-2}),),
        epochs=epochs, batch_size=512, lr=1e-2, seeds=(0,), eval_samples=2, figures=(), resumable=True,
        select_best_of_last=3,
    )  # fmt: skip


def test_runner_best_of_last_stays_consistent_with_the_epoch_checkpoint_across_kills(tmp_path, monkeypatch):
    """The best-of-last state is committed inside the epoch checkpoint: neither a kill between the epoch
    checkpoint and ``<ckpt>.best.pt`` (best file one epoch behind) nor one after the best file was written but
    before the checkpoint (best file one epoch ahead) changes the epoch that is evaluated."""
    config = _best_config()
    out = tmp_path / "killed"
    save = train_module.save_checkpoint
    stale: dict[str, bytes] = {}

    def dying_save(path, model, optimizer=None, **extra):
        best_file = Path(path).with_suffix(".best.pt")
        if extra["epoch"] == 3:
            stale["bytes"] = best_file.read_bytes()  # the best file of epoch 3
        if extra["epoch"] == 4:  # .best.pt already holds epoch 4; its epoch checkpoint is never written
            raise Killed("killed before the epoch-4 checkpoint")
        return save(path, model, optimizer, **extra)

    monkeypatch.setattr(train_module, "save_checkpoint", dying_save)
    with pytest.raises(Killed):
        run_experiment(config, out_dir=out, progress=False)
    monkeypatch.setattr(train_module, "save_checkpoint", save)
    (checkpoint,) = (out / ".checkpoints").glob("best-kill-*/mf-seed0.pt")
    best_file = checkpoint.with_suffix(".best.pt")
    assert read_checkpoint(checkpoint)["epoch"] == 3
    assert read_checkpoint(checkpoint)["extra"]["best"]["epoch"] == 3
    assert torch.load(best_file, weights_only=True)["epoch"] == 4  # ahead of the checkpoint

    resumed = run_experiment(config, out_dir=out, progress=False)["rows"][0]
    assert resumed["selected_epoch"] == 4  # the training NLL falls every epoch here: the last one is the best

    (out / "best-kill_runs.jsonl").unlink()  # re-evaluate the finished checkpoint
    best_file.write_bytes(stale["bytes"])  # the finished checkpoint (epoch 4) beside the best file of epoch 3
    again = run_experiment(config, out_dir=out, progress=False)["rows"][0]
    assert again["selected_epoch"] == 4 and again["accuracy"] == resumed["accuracy"] and again["nll"] == resumed["nll"]
    assert torch.load(best_file, weights_only=True)["epoch"] == 4  # the export follows the committed state


def test_runner_reconciles_a_best_file_one_epoch_behind_an_old_checkpoint(tmp_path):
    """Checkpoints written before the best state was committed with them: the best file missed the checkpoint's
    last epoch (a kill between the two writes) -> that epoch is applied as the selector would have."""
    from varbnn_lab.hooks import BestOfLast as _BestOfLast

    model = nn.Linear(2, 1)
    checkpoint = tmp_path / "run.pt"
    selector = _BestOfLast(model, epochs=5, last=3, checkpoint=checkpoint)
    for epoch, nll in enumerate([0.5, 0.4, 0.3], start=1):
        with torch.no_grad():
            model.weight.fill_(float(epoch))
        selector(epoch, {"nll": nll})
    with torch.no_grad():
        model.weight.fill_(4.0)
    # epoch 4 (nll 0.2) reached the old-style checkpoint (no committed best) but not the best file
    history = [{"nll": v} for v in (0.5, 0.4, 0.3, 0.2)]
    torch.save({"model": model.state_dict(), "optimizer": None, "epoch": 4, "history": history}, checkpoint)
    with torch.no_grad():
        model.weight.fill_(0.0)
    assert _BestOfLast(model, epochs=5, last=3, checkpoint=checkpoint).restore() == 4
    assert float(model.weight[0, 0]) == 4.0


def test_the_best_of_last_export_is_a_verified_checkpoint_and_a_damaged_one_is_named(tmp_path):
    """``<ckpt>.best.pt`` carries fit's format and checksum: read back (old-style checkpoints only) through
    read_checkpoint, so a flipped byte is a CheckpointError naming the file, not a silently different model."""
    from varbnn_lab.hooks import BestOfLast as _BestOfLast

    model = nn.Linear(2, 1)
    checkpoint = tmp_path / "run.pt"
    selector = _BestOfLast(model, epochs=5, last=3, checkpoint=checkpoint)
    selector(3, {"nll": 0.3})
    best_file = checkpoint.with_suffix(".best.pt")
    assert read_checkpoint(best_file)["epoch"] == 3  # verified, no warning
    torch.save({"model": model.state_dict(), "optimizer": None, "epoch": 3, "history": [{"nll": 0.3}] * 3}, checkpoint)
    data = bytearray(best_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    best_file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"run\.best\.pt"):
        _BestOfLast(model, epochs=5, last=3, checkpoint=checkpoint)
