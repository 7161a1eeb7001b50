"""``varbnn reproduce retina-referral`` and ``retina-robustness``: referral under uncertainty and robustness to
hyperparameters (Farquhar et al. 2020, section 3.2, Fig. 6-7, Appendix C.3), on the RetinaMNIST stand-in.

The paper's Kaggle diabetic-retinopathy images (256x256, ~11k training images) cannot be had here; RetinaMNIST
(MedMNIST v2: 28x28 colour fundus images, 1080/120/400 train/validation/test, grades 0-4) stands in, with the
binary target "referable" = grade >= 2 (43% of the training set). Inputs are standardised per channel with the
training set's statistics; no augmentation.

Model: a VGG-style Bayesian CNN without dropout (three blocks of two 3x3 convolutions and a max-pool, channels
``width``, 2x, 4x), then the concatenated global mean and max pool and one dense layer (the paper's head), every
layer made Bayesian with the variant's family and a N(0, 1) prior. Training is :func:`varbnn.training.fit` with the full
ELBO (beta = 1, no KL down-weighting); the first epoch trains only the means on the NLL (posterior means as weights),
as the paper does. ``samples`` weight draws per step average the ELBO (fit's ``mc_samples``). The model state with the
best validation accuracy (checked every epoch) is the one evaluated; a non-finite loss or gradient stops a run
(counted as diverged) and keeps that state.

Evaluation: 64-draw Monte Carlo predictive on the test set; AUROC of p(referable); test points ranked by mutual
information (most certain first) and AUROC / accuracy on the retained points when 0-50% are referred.

Robustness: ``configs`` random hyperparameter configurations from the paper's ranges (SGD with Nesterov momentum 0.9,
lr in {1e-2, 1e-3, 1e-4}, per-epoch decay in {1, 0.98, 0.96}; or AMSGrad, lr in {1e-3, 1e-4, 1e-5}; batch size in
{16, 32, 64, 128, 256}; training samples in {1, 2, 4}; initial rho in {-6, -4, -2, 0}), the SAME configurations for
both families. Reported: the share of configurations no better than chance (test AUROC < ``chance_auroc``) and the
share reaching a good AUROC (>= the best test AUROC of any run minus ``good_margin``; an absolute threshold means
little on a stand-in dataset), plus the histogram.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import random
import time
from dataclasses import dataclass
from typing import Any

import torch

from varbnn import distributed as vdist
from varbnn.convert import bayesianize
from varbnn.data import TensorBatches, load_retinamnist
from varbnn.families import make_family
from varbnn.metrics import auroc, referral_curve
from varbnn.models import vgg_small
from varbnn.nn.base import sample_mode
from varbnn.priors import Normal
from varbnn.training import NonFiniteError, fit, seed_everything
from varbnn_lab.engine import RunKey, RunStore, config_fields, expand, fingerprint, open_run
from varbnn_lab.evaluation import predictive_probs
from varbnn_lab.hooks import BestState
from varbnn_lab.pages.retina import draw_retina_figure, render_retina_markdown, summarise_retina

__all__ = [
    "RetinaRun", "RetinaConfig", "retina_config", "run_retina", "vgg_small", "sample_hyperparameters", "retina_runs",
    "retina_store", "render_retina_markdown", "REFERRAL_FRACTIONS",
]  # fmt: skip

REFERRAL_FRACTIONS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
FAMILIES = ("radial", "meanfield")


@dataclass(frozen=True)
class RetinaRun:
    """Hyperparameters of one training run (family aside)."""

    optimizer: str = "amsgrad"  # "amsgrad" or "sgd" (Nesterov, momentum 0.9)
    lr: float = 1e-3
    decay: float = 1.0  # per-epoch learning-rate factor (SGD only)
    batch_size: int = 64
    samples: int = 1
    init_rho: float = -6.0

    def key(self) -> str:
        return f"{self.optimizer}-lr{self.lr:g}-d{self.decay:g}-b{self.batch_size}-s{self.samples}-rho{self.init_rho:g}"


@dataclass(frozen=True)
class RetinaConfig:
    name: str
    kind: str  # "referral" (one configuration, many seeds) or "robustness" (many configurations, one seed)
    runs: tuple[RetinaRun, ...]
    seeds: tuple[int, ...]
    families: tuple[str, ...] = FAMILIES
    epochs: int = 100
    width: int = 16
    eval_samples: int = 64
    chance_auroc: float = 0.6
    good_margin: float = 0.05
    train_limit: int | None = None

    def protocol_hash(self) -> str:
        data = config_fields(self, drop=("name", "runs", "seeds", "families"))
        return fingerprint({**data, "training": "fit"})  # since 0.2.0+ trained by fit (the earlier loop's runs do not count)


def sample_hyperparameters(count: int, seed: int = 0) -> tuple[RetinaRun, ...]:
    """``count`` configurations drawn uniformly from the paper's ranges (Appendix C.3)."""
    rng = random.Random(seed)
    runs = []
    for _ in range(count):
        if rng.random() < 0.5:
            optimizer, lr, decay = "sgd", rng.choice((1e-2, 1e-3, 1e-4)), rng.choice((1.0, 0.98, 0.96))
        else:
            optimizer, lr, decay = "amsgrad", rng.choice((1e-3, 1e-4, 1e-5)), 1.0
        batch_size, samples = rng.choice((16, 32, 64, 128, 256)), rng.choice((1, 2, 4))
        init_rho = rng.choice((-6.0, -4.0, -2.0, 0.0))
        runs.append(RetinaRun(optimizer, lr, decay, batch_size, samples, init_rho))
    return tuple(runs)


def retina_config(name: str, quick: bool = False) -> RetinaConfig:
    """``retina-referral``: AMSGrad 1e-3, batch 64, 1 sample, rho -6 (close to the paper's radial choice), 5 seeds;
    ``retina-robustness``: 30 sampled configurations, seed 0, 60 epochs. ``quick``: a CI-sized run of the same code."""
    if name == "retina-referral":
        config = RetinaConfig(name, "referral", (RetinaRun(),), seeds=(0, 1, 2, 3, 4), epochs=100)
    elif name == "retina-robustness":
        config = RetinaConfig(name, "robustness", sample_hyperparameters(30), seeds=(0,), epochs=60)
    else:
        raise ValueError(f"unknown retina experiment {name!r}; allowed: ['retina-referral', 'retina-robustness']")
    if quick:
        config = dataclasses.replace(
            config, name=f"{name}-quick", runs=config.runs[:2], seeds=config.seeds[:1], epochs=2, width=4, eval_samples=4,
            train_limit=256,
        )  # fmt: skip
    return config


@functools.lru_cache(maxsize=2)
def _data(data_dir: str | None, limit: int | None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The data, loaded once per process (in-process runs and each worker process share it)."""
    splits = {s: load_retinamnist(s, data_dir) for s in ("train", "val", "test")}
    x_train = splits["train"][0]
    mean, std = x_train.mean(dim=(0, 2, 3), keepdim=True), x_train.std(dim=(0, 2, 3), keepdim=True)
    out = {s: ((x - mean) / std, (y >= 2).long()) for s, (x, y) in splits.items()}
    if limit is not None:
        out["train"] = (out["train"][0][:limit], out["train"][1][:limit])
    return out


def referral_metrics(probs: torch.Tensor, labels: torch.Tensor, uncertainty: torch.Tensor) -> list[dict[str, float]]:
    """AUROC and accuracy on the points kept after referring the most uncertain fraction (``REFERRAL_FRACTIONS``):
    :func:`varbnn.metrics.referral_curve` with its AUROC column."""
    return referral_curve(probs, labels, uncertainty, REFERRAL_FRACTIONS, with_auroc=True)


def _train_one(
    config: RetinaConfig, run: RetinaRun, family_name: str, seed: int, data: dict[str, Any], dev: torch.device
) -> dict[str, Any]:
    """One run, trained by :func:`varbnn.training.fit` in two calls: epoch 1 on the means alone (the weights at their means,
    the NLL alone: ``beta = 0``), then the full ELBO with ``run.samples`` weight draws per step and the learning-rate
    decay; the state with the best validation accuracy after any epoch is evaluated. A non-finite loss or gradient
    stops the run (``diverged``), keeping that best state."""
    seed_everything(seed)
    init_std = math.log1p(math.exp(run.init_rho))
    family = make_family(family_name, init_std=init_std)
    model = bayesianize(vgg_small(width=config.width), family, Normal(0.0, 1.0), pretrained=False).to(dev)
    x_train, y_train = (t.to(dev) for t in data["train"])
    n, world = x_train.shape[0], vdist.world_size()
    x_train, y_train, batch = vdist.equal_share(x_train, y_train, run.batch_size)  # data-parallel: this rank's share
    loader = TensorBatches(x_train, y_train, batch, shuffle=True, drop_last=world > 1 and x_train.shape[0] >= batch)
    means = [p for name, p in model.named_parameters() if name.endswith(".loc")]

    def make_optimizer(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        if run.optimizer == "sgd":
            return torch.optim.SGD(params, lr=run.lr, momentum=0.9, nesterov=True)
        return torch.optim.Adam(params, lr=run.lr, amsgrad=True)

    best = BestState(model, from_start=False)  # scored by minus the validation accuracy

    def validate(epoch: int) -> None:
        probs, _ = predictive_probs(model, data["val"][0], 8, dev)
        best.offer(epoch, -float((probs.argmax(-1) == data["val"][1]).double().mean()))

    t0 = time.perf_counter()
    diverged = False
    common = {"n_data": n, "device": dev, "progress": False}
    try:
        with sample_mode(model, "mean"):  # epoch 1: means only, NLL only, weights at their means
            fit(model, loader, epochs=1, optimizer=make_optimizer(means), kl_weight=0.0, diagnose=False, **common)
        validate(1)
        if config.epochs > 1:
            optimizer = make_optimizer(list(model.parameters()))
            decay = torch.optim.lr_scheduler.ExponentialLR(optimizer, run.decay) if run.decay != 1.0 else None

            def on_epoch_end(epoch: int, record: dict[str, float]) -> None:
                if decay is not None:
                    decay.step()
                validate(epoch + 1)

            fit(model, loader, epochs=config.epochs - 1, optimizer=optimizer, kl_weight=1.0, mc_samples=run.samples,
                on_epoch_end=on_epoch_end, **common)  # fmt: skip
    except NonFiniteError as error:
        if error.kind == "data":
            raise
        diverged = True
    seconds = time.perf_counter() - t0
    best_epoch = best.restore()
    probs, mi = predictive_probs(model, data["test"][0], config.eval_samples, dev)
    labels = data["test"][1]
    try:
        test_auroc = auroc(probs[:, 1], labels) if torch.isfinite(probs).all() else float("nan")
    except ValueError:
        test_auroc = float("nan")
    return {
        "family": family_name,
        "run": dataclasses.asdict(run),
        "key": run.key(),
        "seed": seed,
        "auroc": test_auroc,
        "accuracy": float((probs.argmax(-1) == labels).double().mean()),
        "best_epoch": best_epoch,
        "val_accuracy": -best.score if best.state is not None else -1.0,
        "diverged": diverged,
        "referral": referral_metrics(probs, labels, mi) if torch.isfinite(probs).all() else [],
        "seconds": round(seconds, 2),
    }


def _run_key(config: RetinaConfig, data_dir: str | None, dev: torch.device, key: RunKey) -> dict[str, Any]:
    """The engine's run function: train ``key = (family, configuration key, seed)``."""
    family_name, run_key, seed = key
    run = next(r for r in config.runs if r.key() == run_key)
    return _train_one(config, run, family_name, seed, _data(data_dir, config.train_limit), dev)


def retina_runs(config: RetinaConfig) -> list[RunKey]:
    """Every (family, configuration key, seed) of ``config`` in its fixed order (the shards' order)."""
    return [(f, r, s) for r, s, f in expand(run=[r.key() for r in config.runs], seed=config.seeds, family=config.families)]


def retina_store(config: RetinaConfig, out: os.PathLike[str], shard: tuple[int, int] | None = None) -> RunStore:
    """The runs of ``config`` in folder ``out``, keyed by (family, configuration key, seed), one protocol hash."""
    return RunStore.keyed(out, config.name, ("family", "key", "seed"), config.protocol_hash(), shard)


def run_retina(
    config: RetinaConfig,
    *, device: str | torch.device | None = "cpu", out_dir: str | os.PathLike[str] | None = None, data_dir: str | None = None,
    progress: bool = True, command: str | None = None, shard: tuple[int, int] | None = None, train: bool = True,
    workers: int = 1, distributed: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Train every (family, configuration, seed) not yet in ``OUT/<name>_runs*.jsonl`` (only those of ``shard``
    ``(k, n)`` if given, appended to ``<name>_runs.shard<k>.jsonl``; none if not ``train``; in ``workers`` CPU processes
    if > 1: :func:`varbnn_lab.engine.execute`), then write ``<name>.json``, ``.md`` and the figure from every run
    found (not for a shard: the page waits for all of them). ``OUT``: ``out_dir``, by default
    ``benchmarks/results/<name>/``. ``distributed`` (under ``torchrun``): each run trains data-parallel, every rank on
    its share with its own weight noise, gradients averaged; rank 0 writes."""
    call = open_run(config.name, out_dir, device, distributed, workers)
    report = call.reporter(progress, lambda key, record: f"{key[0]} {key[1]} seed {key[2]}: test AUROC {record['auroc']:.4f}")
    run = functools.partial(_run_key, config, data_dir, call.device)
    call.execute(retina_runs(config), run, retina_store(config, call.out, shard), report, shard=shard, train=train)
    if not call.writes(shard):
        return {"name": config.name, "rows": [], "figures": [], "written": False}
    done = retina_store(config, call.out).load()
    records = [
        done[(f, r.key(), s)] for r in config.runs for s in config.seeds for f in config.families if (f, r.key(), s) in done
    ]
    result: dict[str, Any] = {
        "name": config.name,
        **call.provenance(command),
        "run_devices": sorted({r["device"] for r in records}),
        "run_commits": sorted({r["commit"] for r in records}),
        "train_seconds": round(sum(r["seconds"] for r in records), 1),
        "config": dataclasses.asdict(config),
        "rows": summarise_retina(config, records, REFERRAL_FRACTIONS),
    }
    call.write_result(result)
    figure = call.out / f"{config.name}.png"
    draw_retina_figure(config, records, figure, REFERRAL_FRACTIONS)
    result["figures"] = [figure.name]
    return call.write_page(result, render_retina_markdown(result, figure.name))
