"""``varbnn reproduce graves-mnist``: Graves (2011), "Practical Variational Inference for Neural Networks", table 1
(``graves-prune``, table 2 and figures 3-4, is :mod:`varbnn_lab.graves_prune`), on MNIST instead of TIMIT
(whose hierarchical MDRNN cannot be had here).

Network: MLP 784-150-150-10 (141,510 weights and biases, close to the paper's 139,536), He-initialised means. Every
posterior/prior pair of the paper's table 1 with its fixed values (sigma_i = 0.075, sigma^2 = 0.1, b = 1/12).
Optimiser: Adam (the paper: steepest descent with momentum per sequence), batch 100, a weight draw per example for the
Gaussian posteriors (local reparameterization for the fixed-variance ones; the Graves estimator with per-example
gradients for adaptive weight noise). Adaptive priors are set to their closed-form optimum after every update.

Early stopping as in the paper: the networks with a Gaussian posterior AND a proper Gaussian prior train on all 60,000
training images and are evaluated at the epoch with the lowest training error loss L^E; all others hold out the last
5,000 training images and are evaluated at the epoch with the lowest validation error (of the mode). "Epochs" is that
epoch. Test error is reported both ways the paper discusses: the mode ("remove weight noise") and the Monte Carlo
predictive. The MDL columns (error loss, complexity loss, ratio vs a uniform code over 10 classes) are defined only
where L^C is finite (Gaussian posterior, proper prior).

Each finished variant is appended to ``OUT/<name>_runs.jsonl`` (with a protocol hash) so that a rerun fills in only
what is missing; the adaptive-weight-noise network is also saved under ``OUT/.checkpoints/`` for ``graves-prune``, which
reads it from ``graves-mnist``'s folder (``OUT`` defaults to ``benchmarks/results/<name>/``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from varbnn import distributed as vdist
from varbnn.convert import bayesianize
from varbnn.data import TensorBatches
from varbnn.divergence import kl as model_kl
from varbnn.families import make_family
from varbnn.models import mlp, row_lstm
from varbnn.objectives import NATS_PER_BIT, complexity_is_finite, mdl_report
from varbnn.priors import make_prior
from varbnn.prune import SAFE_LAMBDA
from varbnn.training import fit, save_checkpoint, seed_everything
from varbnn_lab.engine import RunKey, RunStore, config_fields, expand, fingerprint, open_run
from varbnn_lab.evaluation import mode_error, predictive_metrics
from varbnn_lab.hooks import BestState
from varbnn_lab.pages.graves import render_graves_markdown, summarise_graves

__all__ = [
    "GravesVariant", "GravesConfig", "graves_config", "graves_store", "run_graves_mnist", "network_experiment",
    "GRAVES_VARIANTS",
]  # fmt: skip

AWN = "adaptive weight noise"


@dataclass(frozen=True)
class GravesVariant:
    """One row of table 1: a posterior (``family``: "delta" or "meanfield") and a prior, by name and options."""

    label: str
    family: str
    prior: str
    family_options: dict[str, Any] = field(default_factory=dict)
    prior_options: dict[str, Any] = field(default_factory=dict)
    early_stopping: bool = True
    posterior_text: str = ""
    prior_text: str = ""


_WN = {"init_std": 0.075, "learn_std": False, "estimator": "local"}
GRAVES_VARIANTS: tuple[GravesVariant, ...] = (
    GravesVariant("adaptive L1", "delta", "laplace", {}, {"adaptive": True}, True, "Delta", "Laplace"),
    GravesVariant("adaptive L2", "delta", "normal", {}, {"adaptive": True}, True, "Delta", "Gauss"),
    GravesVariant("adaptive mean L2", "delta", "normal", {}, {"scale": math.sqrt(0.1), "adaptive": "loc"}, True, "Delta",
                  "Gauss sigma^2 = 0.1"),  # fmt: skip
    GravesVariant("L2", "delta", "normal", {}, {"scale": math.sqrt(0.1)}, True, "Delta", "Gauss mu = 0, sigma^2 = 0.1"),
    GravesVariant("maximum likelihood", "delta", "uniform", {}, {}, True, "Delta", "Uniform"),
    GravesVariant("L1", "delta", "laplace", {}, {"scale": 1 / 12}, True, "Delta", "Laplace mu = 0, b = 1/12"),
    GravesVariant("adaptive mean L1", "delta", "laplace", {}, {"scale": 1 / 12, "adaptive": "loc"}, True, "Delta",
                  "Laplace b = 1/12"),  # fmt: skip
    GravesVariant("weight noise", "meanfield", "uniform", _WN, {}, True, "Gauss sigma_i = 0.075", "Uniform"),
    GravesVariant("adaptive prior weight noise", "meanfield", "normal", _WN, {"adaptive": True}, False,
                  "Gauss sigma_i = 0.075", "Gauss"),  # fmt: skip
    GravesVariant(AWN, "meanfield", "normal", {"init_std": 0.075, "estimator": "graves"}, {"adaptive": True}, False,
                  "Gauss (Graves estimator)", "Gauss"),  # fmt: skip
    GravesVariant("adaptive weight noise, reparameterization gradient", "meanfield", "normal",
                  {"init_std": 0.075, "estimator": "local"}, {"adaptive": True}, False, "Gauss (local reparam.)", "Gauss"),
)  # fmt: skip

PRUNE_LAMBDAS = (0.0, 0.01, 0.05, 0.1, 0.2, 0.5, round(SAFE_LAMBDA, 2), 1.0, 2.0)


MODELS = ("mlp", "row_lstm")


@dataclass(frozen=True)
class GravesConfig:
    """``model``: ``"mlp"`` (784-hidden-10) or ``"row_lstm"`` (an LSTM of ``lstm_hidden`` units reading the 28 image rows,
    the recurrent case; its fixed-variance and reparameterization variants draw one weight sample per batch, since
    local reparameterization does not apply to recurrent weights). ``heatmap_tensor`` is the weight of figures 3-4."""

    name: str = "graves-mnist"
    variants: tuple[GravesVariant, ...] = GRAVES_VARIANTS
    model: str = "mlp"
    hidden: tuple[int, ...] = (150, 150)
    lstm_hidden: int = 64
    epochs: int = 30
    batch_size: int = 100
    lr: float = 1e-3
    validation_size: int = 5000
    seeds: tuple[int, ...] = (0,)
    eval_samples: int = 16
    mdl_samples: int = 4
    weight_draws: str = "batch"
    train_limit: int | None = None
    test_limit: int | None = None
    # graves-prune
    lambdas: tuple[float, ...] = PRUNE_LAMBDAS
    retrain_epochs: int = 2
    heatmap_lambdas: tuple[float, ...] = (0.2, round(SAFE_LAMBDA, 2), 2.0)
    heatmap_tensor: str = "3.weight"

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"{self.name}: model must be one of {MODELS}, got {self.model!r}")

    def protocol_hash(self, variant: GravesVariant) -> str:
        data = config_fields(self, drop=("name", "variants", "seeds", "lambdas", "retrain_epochs", "heatmap_lambdas",
                                         "heatmap_tensor"))  # fmt: skip
        if data["model"] == "mlp":  # the LSTM fields do not change the MLP protocol (and keep its earlier hashes)
            data.pop("model")
            data.pop("lstm_hidden")
        return fingerprint({**data, "variant": dataclasses.asdict(variant)})


GRAVES_EXPERIMENTS = ("graves-mnist", "graves-prune", "graves-mnist-lstm", "graves-prune-lstm")


def graves_config(name: str = "graves-mnist", quick: bool = False) -> GravesConfig:
    """The full protocol, or ``--quick`` (two epochs on 1,200 training and 500 test images, one retrain epoch).

    ``graves-*-lstm``: the same grid on the row LSTM, trained on the first 20,000 training images for 15 epochs."""
    if name not in GRAVES_EXPERIMENTS:
        raise ValueError(f"unknown Graves experiment {name!r}; allowed: {list(GRAVES_EXPERIMENTS)}")
    options: dict[str, Any] = {"name": name}
    if name.endswith("-lstm"):
        options.update(model="row_lstm", train_limit=20000, epochs=15, heatmap_tensor="lstm.weight_hh_l0")
    if quick:
        options.update(name=f"{name}-quick", epochs=2, train_limit=1200, test_limit=500, validation_size=200,
                       eval_samples=4, mdl_samples=2, retrain_epochs=1, lambdas=(0.0, 0.83, 2.0))  # fmt: skip
    return GravesConfig(**options)


def _data(config: GravesConfig, data_dir: str | None, early_stopping: bool) -> dict[str, torch.Tensor]:
    from varbnn.data import load_mnist

    x, y = load_mnist("train", data_dir)
    xt, yt = load_mnist("test", data_dir)
    x, xt = x.reshape(x.shape[0], -1), xt.reshape(xt.shape[0], -1)
    if config.train_limit is not None:
        x, y = x[: config.train_limit], y[: config.train_limit]
    if config.test_limit is not None:
        xt, yt = xt[: config.test_limit], yt[: config.test_limit]
    out = {"x_test": xt, "y_test": yt}
    if early_stopping:  # the last validation_size training images are held out
        n = x.shape[0] - config.validation_size
        out.update(x_train=x[:n], y_train=y[:n], x_val=x[n:], y_val=y[n:])
    else:
        out.update(x_train=x, y_train=y)
    return out


def build_graves_model(config: GravesConfig, variant: GravesVariant) -> nn.Module:
    """The MLP (or row LSTM) made Bayesian with the variant's posterior and ONE prior shared by every tensor (Graves'
    single prior)."""
    options = dict(variant.family_options)
    if config.model == "row_lstm" and options.get("estimator") == "local":
        options["estimator"] = "reparam"
    family = make_family(variant.family, **options)
    prior = make_prior(variant.prior, **variant.prior_options)
    plain = mlp(784, config.hidden, 10) if config.model == "mlp" else row_lstm(hidden=config.lstm_hidden)
    return bayesianize(plain, family, prior, pretrained=False)


def _train(
    config: GravesConfig, model: nn.Module, data: dict[str, torch.Tensor], epochs: int, early_stopping: bool,
    dev: torch.device, progress: bool,
) -> tuple[list[dict[str, Any]], int]:  # fmt: skip
    """Train ``epochs`` and load the selected epoch's state (0 = before training); returns the per-epoch log
    and that epoch."""
    n = data["x_train"].shape[0]
    finite = complexity_is_finite(model)
    log: list[dict[str, Any]] = []
    best = BestState(model)

    def on_epoch_end(epoch: int, record: dict[str, float]) -> None:
        entry: dict[str, Any] = {
            "epoch": epoch,
            "train_error_loss_bits": record["nll"] * n / NATS_PER_BIT,  # online L^E estimate over the epoch's batches
            "test_error": mode_error(model, data["x_test"], data["y_test"]),
        }
        if finite:
            entry["complexity_bits"] = float(model_kl(model).detach()) / NATS_PER_BIT
            entry["ratio"] = (entry["train_error_loss_bits"] + entry["complexity_bits"]) / (n * math.log2(10))
        if early_stopping:
            entry["val_error"] = mode_error(model, data["x_val"], data["y_val"])
        best.offer(epoch, entry["val_error"] if early_stopping else entry["train_error_loss_bits"])
        log.append(entry)

    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    batches = TensorBatches(*vdist.equal_share(data["x_train"], data["y_train"], config.batch_size))  # data-parallel: a share
    fit(model, batches, n_data=n, epochs=epochs, optimizer=optimizer, kl_weight=1.0, device=dev, progress=progress,
        on_epoch_end=on_epoch_end)  # fmt: skip
    return log, best.restore()


def _evaluate(config: GravesConfig, model: nn.Module, data: dict[str, torch.Tensor]) -> dict[str, Any]:
    mc = predictive_metrics(model, data["x_test"], data["y_test"], config.eval_samples)
    report = mdl_report(model, data["x_train"], data["y_train"], samples=config.mdl_samples, n_classes=10)
    out: dict[str, Any] = {
        "test_error_mode": mode_error(model, data["x_test"], data["y_test"]),
        "test_error_mc": mc["error"],
        "test_nll_mc": mc["nll"],
        "mdl": report.as_dict(),
    }
    from varbnn.priors import Prior

    out["prior_after_training"] = sorted({repr(p) for p in model.modules() if isinstance(p, Prior)})
    return out


def network_experiment(name: str) -> str:
    """The experiment whose run trains the network that ``graves-prune*`` prunes: ``graves-prune`` -> ``graves-mnist``,
    ``graves-prune-lstm`` -> ``graves-mnist-lstm`` (``-quick`` names likewise)."""
    return name.replace("graves-prune", "graves-mnist", 1)


def _awn_checkpoint(out: Path, config: GravesConfig, seed: int) -> Path:
    variant = next(v for v in config.variants if v.label == AWN)
    return out / ".checkpoints" / f"graves-awn-{config.protocol_hash(variant)}-seed{seed}.pt"


def _run_variant(
    config: GravesConfig, variant: GravesVariant, seed: int, data_dir: str | None, dev: torch.device, out: Path, progress: bool
) -> dict[str, Any]:
    data = _data(config, data_dir, variant.early_stopping)
    seed_everything(seed)
    model = build_graves_model(config, variant).to(dev)
    t0 = time.perf_counter()
    log, best_epoch = _train(config, model, data, config.epochs, variant.early_stopping, dev, progress)
    seconds = time.perf_counter() - t0
    if variant.label == AWN and vdist.is_main_process():
        save_checkpoint(_awn_checkpoint(out, config, seed), model, epoch=best_epoch)
    vdist.barrier()  # data-parallel: the checkpoint is written before any rank reads it
    record = {"variant": variant.label, "seed": seed, "epochs": best_epoch, "train_seconds": round(seconds, 1),
              "n_train": int(data["x_train"].shape[0]), "log": log, **_evaluate(config, model, data)}  # fmt: skip
    if progress and vdist.is_main_process():
        print(f"[graves] {variant.label}: mode error {record['test_error_mode']:.4f} (epoch {best_epoch}), "
              f"{seconds:.0f} s", file=sys.stderr)  # fmt: skip
    return record


def _run_key(
    config: GravesConfig, data_dir: str | None, dev: torch.device, out: Path, progress: bool, key: RunKey
) -> dict[str, Any]:
    """The engine's run function: train and evaluate ``key = (variant label, seed)``."""
    label, seed = key
    variant = next(v for v in config.variants if v.label == label)
    return _run_variant(config, variant, seed, data_dir, dev, out, progress)


def graves_store(config: GravesConfig, out: os.PathLike[str], shard: tuple[int, int] | None = None) -> RunStore:
    """The runs of ``config`` in folder ``out``, keyed by (variant label, seed); each variant has its own protocol hash
    (:meth:`GravesConfig.protocol_hash`), so adding a variant leaves the others' runs valid."""
    return RunStore.keyed(out, config.name, ("variant", "seed"), {v.label: config.protocol_hash(v) for v in config.variants},
                          shard)  # fmt: skip


def run_graves_mnist(
    config: GravesConfig,
    *, device: str | torch.device | None = "cpu", out_dir: str | os.PathLike[str] | None = None, data_dir: str | None = None,
    progress: bool = True, command: str | None = None, shard: tuple[int, int] | None = None, train: bool = True,
    workers: int = 1, distributed: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Table 1 analogue: train every (variant, seed) not yet in ``OUT/<name>_runs*.jsonl``; write ``<name>.json``/``.md``
    /``.png``. ``OUT``: ``out_dir``, by default ``benchmarks/results/<name>/``. The engine runs them
    (:func:`varbnn_lab.engine.execute`): ``workers`` > 1 in CPU processes, ``shard=(k, n)`` only its share
    (appended to ``<name>_runs.shard<k>.jsonl``; the page is written once all shards are done), none if not ``train``.
    ``distributed`` (under ``torchrun``): each run trains data-parallel (every rank an equal share of the training set,
    batch ``batch_size // world_size``; the Graves estimator's per-example gradients averaged like the others'); rank 0
    alone writes."""
    call = open_run(config.name, out_dir, device, distributed, workers)
    hashes = {v.label: config.protocol_hash(v) for v in config.variants}
    run = functools.partial(_run_key, config, data_dir, call.device, call.out, call.progress(progress))
    runs = expand(variant=hashes, seed=config.seeds)
    done = call.execute(runs, run, graves_store(config, call.out, shard), shard=shard, train=train)
    if not call.writes(shard):
        return {"name": config.name, "rows": [], "written": False}
    rows = summarise_graves(config, done)
    result = {
        "name": config.name,
        **call.provenance(command),
        "run_devices": sorted({r["device"] for r in done.values()}),
        "config": dataclasses.asdict(config),
        "rows": rows,
    }
    call.write_result(result)
    from varbnn_lab.figures import graves_curves

    figure = graves_curves([done[k] for k in done if k[0] in hashes], call.out / f"{config.name}.png")
    return call.write_page(result, render_graves_markdown(result, figure.name))
