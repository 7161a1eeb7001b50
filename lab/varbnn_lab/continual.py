"""``varbnn reproduce vcl-split-fmnist``: variational continual learning on Split Fashion-MNIST (Farquhar et al. 2020,
section 3.1 and Appendix C.1-C.2).

Five tasks of two classes in the conventional order ({0,1}, {2,3}, ..., {8,9}); an MLP with four hidden layers of 200
units; prior N(0, 1) on the first task, then each task's posterior as the next task's prior
(:func:`varbnn.continual.set_posterior_as_prior`); AMSGrad, learning rate 1e-3, batch 1024 with the final incomplete
batch dropped; 90% of the training set to train on, 10% held out for validation; means He-initialised, rho = -6
(sigma = softplus(-6) = 2.5e-3) for both families; no coresets. Multi-head: one two-class head per task, trained with
the trunk on its task; single-head: one ten-class head for every task. Inputs standardised with the training set's
mean and standard deviation. Loss per task: mean NLL + KL / N_task (the task's training examples).

After each task, the test accuracy of every head seen so far (the Monte Carlo predictive, ``eval_samples`` draws) is
recorded; each finished (variant, seed) is appended to ``OUT/<name>_runs.jsonl`` so that a rerun fills in only what is
missing.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from varbnn import distributed as vdist
from varbnn.continual import MultiHeadNet, set_posterior_as_prior
from varbnn.convert import bayesianize
from varbnn.data import TensorBatches, load_fashion_mnist
from varbnn.families import make_family
from varbnn.models import mlp
from varbnn.predict import classification_summary, predict
from varbnn.priors import Normal
from varbnn.training import fit, seed_everything
from varbnn_lab.engine import RunKey, RunStore, config_fields, expand, fingerprint, open_run
from varbnn_lab.pages.continual import render_vcl_markdown, selection, summarise_vcl

__all__ = [
    "VCLVariant", "VCLConfig", "vcl_config", "run_vcl", "vcl_store", "render_vcl_markdown", "TensorBatches", "SPLIT_TASKS",
    "SEARCH_VARIANTS", "SELECTED_VARIANTS", "VCL_NAMES", "selection",
]  # fmt: skip

SPLIT_TASKS: tuple[tuple[int, ...], ...] = ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9))
SIGMA_RHO_MINUS_6 = math.log1p(math.exp(-6.0))


@dataclass(frozen=True)
class VCLVariant:
    """One curve of the figure: ``family`` ("radial" or "meanfield", or any family with a prior form) trained
    ``epochs`` per task, multi-head or single-head."""

    label: str
    family: str
    epochs: int
    multi_head: bool = True
    family_options: dict[str, Any] = field(default_factory=dict)
    lr: float | None = None
    """The learning rate of this variant (``None``: the config's)."""


VCL_VARIANTS = (
    VCLVariant("radial, multi-head", "radial", 20, True, {"init_std": SIGMA_RHO_MINUS_6}),
    VCLVariant("mean-field, multi-head", "meanfield", 60, True, {"init_std": SIGMA_RHO_MINUS_6}),
    VCLVariant("radial, single-head", "radial", 20, False, {"init_std": SIGMA_RHO_MINUS_6}),
    VCLVariant("mean-field, single-head", "meanfield", 60, False, {"init_std": SIGMA_RHO_MINUS_6}),
)


@dataclass(frozen=True)
class VCLConfig:
    name: str = "vcl-split-fmnist"
    variants: tuple[VCLVariant, ...] = VCL_VARIANTS
    tasks: tuple[tuple[int, ...], ...] = SPLIT_TASKS
    hidden: tuple[int, ...] = (200, 200, 200, 200)
    batch_size: int = 1024
    lr: float = 1e-3
    amsgrad: bool = True
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    validation_fraction: float = 0.1
    eval_samples: int = 32
    train_limit: int | None = None
    test_limit: int | None = None
    epochs_override: int | None = None

    def protocol_hash(self, variant: VCLVariant) -> str:
        data = {**config_fields(self, drop=("name", "variants", "seeds")), "variant": dataclasses.asdict(variant)}
        if variant.lr is None:  # a field added later: the variants without it keep their saved runs
            data["variant"].pop("lr")
        return fingerprint(data)


# The same grid for both families (issue 30): learning rate x epochs per task x initial std (the paper's rho = -6, or
# the family's library default), multi-head, prior handling as VCL (each task's posterior is the next task's prior).
SEARCH_VARIANTS = tuple(
    VCLVariant(
        f"{name}, lr {lr:g}, {epochs} epochs, init {init}", family, epochs, True,
        {"init_std": SIGMA_RHO_MINUS_6} if init == "rho=-6" else {}, lr,
    )  # fmt: skip
    for family, name in (("radial", "radial"), ("meanfield", "mean-field"))
    for lr in (1e-3, 3e-3)
    for epochs in (20, 60)
    for init in ("rho=-6", "default")
)


# Each family's setting chosen by vcl-split-fmnist-search (benchmarks/results/vcl-split-fmnist-search/: the highest
# validation mean accuracy after task 5, seed 0); vcl-split-fmnist-selected runs them for 5 seeds.
SELECTED_LABELS = ("radial, lr 0.001, 60 epochs, init default", "mean-field, lr 0.001, 20 epochs, init default")
SELECTED_VARIANTS = tuple(v for v in SEARCH_VARIANTS if v.label in SELECTED_LABELS)
VCL_NAMES = ("vcl-split-fmnist", "vcl-split-fmnist-search", "vcl-split-fmnist-selected")


def vcl_config(quick: bool = False, name: str = "vcl-split-fmnist") -> VCLConfig:
    """The paper's protocol, or ``--quick`` (one seed, 300 training and 200 test images per task, 1 epoch);
    ``name="vcl-split-fmnist-search"``: the same grid for both families (:data:`SEARCH_VARIANTS`), one seed, judged by
    the validation mean accuracy after the last task; ``"vcl-split-fmnist-selected"``: each family's chosen setting
    (:data:`SELECTED_VARIANTS`), 5 seeds."""
    if name not in VCL_NAMES:
        raise ValueError(f"unknown VCL experiment {name!r}; allowed: {', '.join(VCL_NAMES)}")
    config = VCLConfig()
    if name.endswith("-search"):
        config = dataclasses.replace(config, name=name, variants=SEARCH_VARIANTS, seeds=(0,))
    if name.endswith("-selected"):
        config = dataclasses.replace(config, name=name, variants=SELECTED_VARIANTS)
    if quick:
        variants = config.variants[:: len(config.variants) // 2] if name.endswith("-search") else config.variants
        return dataclasses.replace(
            config, name=f"{name}-quick", variants=variants, seeds=(0,), train_limit=300, test_limit=200,
            epochs_override=1, eval_samples=4, batch_size=128,
        )  # fmt: skip
    return config


def _task_data(
    x: torch.Tensor, y: torch.Tensor, classes: tuple[int, ...], multi_head: bool, limit: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    keep = torch.isin(y, torch.tensor(classes))
    xs, ys = x[keep], y[keep]
    if limit is not None:
        xs, ys = xs[:limit], ys[:limit]
    if multi_head:  # labels become the index within the task's classes
        ys = torch.searchsorted(torch.tensor(classes), ys)
    return xs, ys


def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, samples: int, dev: torch.device) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, x.shape[0], 2000):
            logits = predict(model, x[start : start + 2000].to(dev), samples=samples)
            correct += int((classification_summary(logits).probs.argmax(-1).cpu() == y[start : start + 2000]).sum())
    return correct / max(x.shape[0], 1)


def _run_one(
    config: VCLConfig, variant: VCLVariant, seed: int, data_dir: str | None, dev: torch.device, progress: bool
) -> dict[str, Any]:
    x_all, y_all = load_fashion_mnist("train", data_dir)
    x_test, y_test = load_fashion_mnist("test", data_dir)
    split = torch.randperm(x_all.shape[0], generator=torch.Generator().manual_seed(12345))  # one split for every run
    n_val = int(round(config.validation_fraction * x_all.shape[0]))
    train_idx, val_idx = split[n_val:], split[:n_val]
    mean, std = x_all[train_idx].mean(), x_all[train_idx].std()
    flat = lambda t: ((t - mean) / std).reshape(t.shape[0], -1)  # noqa: E731
    x_train, y_train = flat(x_all[train_idx]), y_all[train_idx]
    x_val, y_val = flat(x_all[val_idx]), y_all[val_idx]
    x_te = flat(x_test)

    seed_everything(seed)
    prior = Normal(0.0, 1.0)
    family = make_family(variant.family, **variant.family_options)
    width = config.hidden[-1]
    trunk = bayesianize(mlp(x_train.shape[1], config.hidden[:-1], width), family, prior, pretrained=False)
    trunk = nn.Sequential(trunk, nn.ReLU())
    n_heads = len(config.tasks) if variant.multi_head else 1
    n_out = len(config.tasks[0]) if variant.multi_head else int(y_all.max()) + 1
    heads = [bayesianize(nn.Linear(width, n_out), family, prior, pretrained=False) for _ in range(n_heads)]
    model = MultiHeadNet(trunk, heads).to(dev)
    epochs = config.epochs_override or variant.epochs

    accuracy: list[list[float]] = []
    val_accuracy: list[list[float]] = []
    t0 = time.perf_counter()
    for t, classes in enumerate(config.tasks):
        task_model = model.task_model(t if variant.multi_head else 0)
        xs, ys = _task_data(x_train, y_train, classes, variant.multi_head, config.train_limit)
        n_task = xs.shape[0]
        xs, ys, batch = vdist.equal_share(xs, ys, config.batch_size)  # data-parallel: this rank's share
        loader = TensorBatches(xs, ys, batch, shuffle=True, drop_last=xs.shape[0] >= batch)
        optimizer = torch.optim.Adam(task_model.parameters(), lr=variant.lr or config.lr, amsgrad=config.amsgrad)
        fit(task_model, loader, n_data=n_task, epochs=epochs, optimizer=optimizer, kl_weight=1.0, device=dev,
            progress=progress and vdist.is_main_process())  # fmt: skip
        row, val_row = [], []
        for j, seen in enumerate(config.tasks[: t + 1]):
            head_model = model.task_model(j if variant.multi_head else 0)
            xe, ye = _task_data(x_te, y_test, seen, variant.multi_head, config.test_limit)
            row.append(_accuracy(head_model, xe, ye, config.eval_samples, dev))
            xv, yv = _task_data(x_val, y_val, seen, variant.multi_head, config.test_limit)
            val_row.append(_accuracy(head_model, xv, yv, config.eval_samples, dev))
        accuracy.append(row)
        val_accuracy.append(val_row)
        if progress:
            print(f"[vcl] {variant.label} seed {seed} after task {t + 1}: " + " ".join(f"{a:.3f}" for a in row), file=sys.stderr)
        set_posterior_as_prior(task_model)  # trunk and this task's head; later heads keep N(0, 1)
    return {"variant": variant.label, "seed": seed, "accuracy": accuracy, "val_accuracy": val_accuracy,
            "epochs_per_task": epochs, "seconds": round(time.perf_counter() - t0, 2)}  # fmt: skip


def _run_key(config: VCLConfig, data_dir: str | None, dev: torch.device, progress: bool, key: RunKey) -> dict[str, Any]:
    """The engine's run function: train ``key = (variant label, seed)`` through every task."""
    label, seed = key
    return _run_one(config, next(v for v in config.variants if v.label == label), seed, data_dir, dev, progress)


def vcl_store(config: VCLConfig, out: os.PathLike[str], shard: tuple[int, int] | None = None) -> RunStore:
    """The runs of ``config`` in folder ``out``, keyed by (variant label, seed), each variant under its own hash."""
    return RunStore.keyed(out, config.name, ("variant", "seed"), {v.label: config.protocol_hash(v) for v in config.variants},
                          shard)  # fmt: skip


def run_vcl(
    config: VCLConfig,
    *, device: str | torch.device | None = "cpu", out_dir: str | os.PathLike[str] | None = None, data_dir: str | None = None,
    progress: bool = True, command: str | None = None, shard: tuple[int, int] | None = None, train: bool = True,
    workers: int = 1, distributed: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Run every (variant, seed) not yet in ``OUT/<name>_runs*.jsonl``; write ``<name>.json``, ``.md`` and the figure.
    ``distributed`` (under ``torchrun``): every process trains each run on its equal share of each task with a batch of
    ``batch_size // world_size`` (gradients averaged by ``fit``); rank 0 alone writes.
    ``OUT``: ``out_dir``, by default ``benchmarks/results/<name>/``. The engine runs them
    (:func:`varbnn_lab.engine.execute`): ``workers`` > 1 in CPU processes, ``shard=(k, n)`` only its share
    (appended to ``<name>_runs.shard<k>.jsonl``; the page waits for all shards), none if not ``train``."""
    call = open_run(config.name, out_dir, device, distributed, workers)
    hashes = {v.label: config.protocol_hash(v) for v in config.variants}
    run = functools.partial(_run_key, config, data_dir, call.device, call.progress(progress))
    done = call.execute(expand(variant=hashes, seed=config.seeds), run, vcl_store(config, call.out, shard), shard=shard,
                        train=train)  # fmt: skip
    if not call.writes(shard):
        return {"name": config.name, "rows": [], "written": False}
    rows = summarise_vcl(config, done)
    result = {
        "name": config.name,
        **call.provenance(command, call.device_text("DistributedDataParallel")),
        "run_devices": sorted({r["device"] for r in done.values() if r["variant"] in hashes}),
        "train_seconds": {
            v.label: [done[(v.label, s)]["seconds"] for s in config.seeds if (v.label, s) in done] for v in config.variants
        },  # fmt: skip
        "config": dataclasses.asdict(config),
        "rows": rows,
    }
    call.write_result(result)
    from varbnn.plots import continual_figure, continual_heads_figure

    figures = [continual_figure(result, call.out / f"{config.name}.png").name]
    if len(config.variants) <= 6:  # the paper's layout, one panel per variant (a search's settings are too many)
        figures.append(continual_heads_figure(result, call.out / f"{config.name}_heads.png").name)
    return call.write_page(result, render_vcl_markdown(result, figures))
