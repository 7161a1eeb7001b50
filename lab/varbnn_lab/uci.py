"""``varbnn reproduce uci``: the UCI regression benchmark (Hernandez-Lobato & Adams 2015 protocol; Oh et al. 2020,
section 5.1) with the same protocol for every family.

Per dataset and standard split: a network in-50-1 (100 hidden units for protein), inputs and targets standardised
with the training statistics, Gaussian likelihood with a Gamma(6, 6) prior and a Gamma variational posterior on the
noise precision (:class:`varbnn.likelihoods.GammaPrecisionGaussian`; by default q(tau) is set to its conjugate
optimum given q(w) after every step, ``noise_update="closed_form"``; ``"gradient"`` trains it with Adam, which
leaves it far from its optimum in this budget), the variant's family on the first layer and
MeanField on the output layer (Delta/MAP: Delta on both), Adam, batch 32, KL annealed linearly over the first quarter
of the steps. Epochs: 40 (the splits' ``n_epochs.txt``) but at least ``min_steps`` optimizer steps, so that the
small sets are not stopped after a few hundred steps.

Test metrics in the ORIGINAL target units, from S joint draws of (weights, tau):
RMSE of the predictive mean, and the per-point log-likelihood ``mean_n [logsumexp_s log N(y_n | f_s(x_n), y_std^2 /
tau_s) - log S]``. (The published RDP code's log-sum-exp runs over test points instead of draws, which inflates its
table; its numbers are not compared here.)

Every finished (dataset, variant, split) is appended to ``OUT/uci_runs.jsonl`` with a hash of the protocol, so a
killed run continues where it stopped and a rerun only fills in what is missing.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from varbnn import distributed as vdist
from varbnn.convert import bayesianize
from varbnn.data import load_uci
from varbnn.data.loaders import UCI_DATASETS
from varbnn.families import make_family
from varbnn.likelihoods import GammaPrecisionGaussian
from varbnn.objectives import linear_kl_annealing
from varbnn.predict import predict
from varbnn.priors import make_prior
from varbnn.training import default_optimizer, fit, seed_everything
from varbnn_lab.engine import RunKey, config_fields, fingerprint
from varbnn_lab.evaluation import log_likelihood_ceiling, predictive_log_likelihood
from varbnn_lab.pages.uci import NOISE_UPDATE_TEXT as NOISE_UPDATE_TEXT  # re-exported: the page's text
from varbnn_lab.pages.uci import REFERENCE_LL, render_uci_markdown, summarise_uci
from varbnn_lab.regression import (
    N_SPLITS,
    SMALLEST_FIRST,
    UCIVariant,
    regression_jobs,
    regression_network,
    run_regression,
)

__all__ = [
    "UCIVariant", "UCIConfig", "UCI_VARIANTS", "REFERENCE_LL", "run_uci", "render_uci_markdown", "uci_config",
    "predictive_log_likelihood", "log_likelihood_ceiling", "N_SPLITS", "SMALLEST_FIRST",
]  # fmt: skip


UCI_VARIANTS = (
    UCIVariant(
        "RDP (double)",
        "rdp",
        # the init and kappa parameterisation every saved RDP run used (see protocol_hash)
        {"grouping": "double", "radius_init": "even", "concentration_param": "softplus"},
        prior="radial_directional",
        prior_options={"global_scale": 1.0, "local_scale": 1.0},
    ),
    UCIVariant("mean-field", "meanfield", {"init_std": 1e-2}, output_options={"init_std": 1e-2}),
    UCIVariant("radial", "radial", {"init_std": 1e-2}, output_options={"init_std": 1e-2}),
    UCIVariant("2-tied", "ktied", {"rank": 2, "init_std": 1e-2}, output_options={"init_std": 1e-2}),
    UCIVariant("MAP (Delta)", "delta", output_family="delta"),
)


NOISE_UPDATES = ("closed_form", "gradient")


@dataclass(frozen=True)
class UCIConfig:
    datasets: tuple[str, ...] = UCI_DATASETS
    variants: tuple[UCIVariant, ...] = UCI_VARIANTS
    max_splits: int | None = None
    epochs: int = 40
    min_steps: int = 5000
    batch_size: int = 32
    lr: float = 1e-3
    anneal_fraction: float = 0.25
    samples: int = 100
    prior_shape: float = 6.0
    prior_rate: float = 6.0
    noise_update: str = "closed_form"
    name: str = "uci"
    only: tuple[str, ...] | None = None  # labels of the variants to run and show (a partial table; not in the hash)

    @property
    def active_variants(self) -> tuple[UCIVariant, ...]:
        """The variants this run trains and tabulates: all, or those named by ``only``."""
        return self.variants if self.only is None else tuple(v for v in self.variants if v.label in self.only)

    def __post_init__(self) -> None:
        if self.noise_update not in NOISE_UPDATES:
            raise ValueError(f"noise_update must be one of {NOISE_UPDATES}, got {self.noise_update!r}")
        a0, b0 = self.prior_shape, self.prior_rate
        if not (math.isfinite(a0) and math.isfinite(b0) and min(a0, b0) > 0):
            raise ValueError(f"the noise prior Gamma(a0, b0) needs a0, b0 > 0, got {self.prior_shape!r}, {self.prior_rate!r}")

    def protocol_hash(self) -> str:
        data = config_fields(self, drop=("datasets", "max_splits", "name", "only"))
        if data["noise_update"] == "gradient":  # the protocol before noise_update existed: its saved runs stay valid
            data.pop("noise_update")
        for variant in data["variants"]:  # likewise RDP's options from before they existed, at their old behaviour
            for option, old in (("radius_init", "even"), ("concentration_param", "softplus")):
                if variant["family_options"].get(option) == old:
                    variant["family_options"].pop(option)
        return fingerprint(data)


def uci_config(
    quick: bool = False,
    datasets: tuple[str, ...] | None = None,
    noise_update: str = "closed_form",
    noise_prior: tuple[float, float] = (6.0, 6.0),
    max_splits: int | None = None,
    rdp_defaults: bool = False,
    epochs: int | None = None,
    families: tuple[str, ...] | None = None,
) -> UCIConfig:
    """The full protocol, or its ``--quick`` form (yacht, 2 splits, a few hundred steps, 8 draws); ``max_splits`` runs
    only each set's first splits (a partial run: the tables count the splits per cell; the protocol hash is unchanged,
    so a later full run adds the missing splits). ``rdp_defaults``: only the RDP variant, with RadialDirectional's
    current defaults (``radius_init="prior"``, ``concentration_param="log"``) instead of the pinned published-code
    choices; its own protocol hash, so write it to its own ``--out`` directory. ``epochs``: training epochs per split
    (default 40; still at least ``min_steps`` steps), part of the protocol hash, so a run with another budget goes to
    its own ``--out`` directory. ``families``: only these columns, by family name (``rdp``, ``meanfield``, ``radial``,
    ``ktied``, ``delta``) or label; a partial table under the same protocol hash."""
    if max_splits is not None and (isinstance(max_splits, bool) or not isinstance(max_splits, int) or max_splits < 1):
        raise ValueError(f"max_splits must be a positive integer or None, got {max_splits!r}")
    config = UCIConfig(noise_update=noise_update, prior_shape=float(noise_prior[0]), prior_rate=float(noise_prior[1]))
    if quick:
        config = dataclasses.replace(
            config, datasets=("yacht",), max_splits=2, epochs=2, min_steps=60, samples=8, name="uci-quick"
        )
    if datasets:
        unknown = sorted(set(datasets) - set(UCI_DATASETS))
        if unknown:
            raise ValueError(f"unknown UCI datasets {unknown}; allowed: {list(UCI_DATASETS)}")
        config = dataclasses.replace(config, datasets=tuple(datasets))
    if max_splits is not None:
        config = dataclasses.replace(config, max_splits=max_splits)
    if epochs is not None:
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ValueError(f"epochs must be a positive integer, got {epochs!r}")
        config = dataclasses.replace(config, epochs=epochs)
    if rdp_defaults:
        rdp = dataclasses.replace(UCI_VARIANTS[0], label="RDP (double, library defaults)", family_options={"grouping": "double"})
        config = dataclasses.replace(config, variants=(rdp,))
    if families:
        allowed = sorted({v.family for v in config.variants} | {v.label for v in config.variants})
        unknown = sorted(set(families) - set(allowed))
        if unknown:
            raise ValueError(f"unknown UCI families {unknown}; allowed: {allowed}")
        only = tuple(v.label for v in config.variants if v.family in families or v.label in families)
        config = dataclasses.replace(config, only=only)
    return config


def build_regressor(variant: UCIVariant, in_features: int, dataset: str = "yacht") -> nn.Module:
    """The network of ``dataset`` (:func:`~varbnn_lab.regression.regression_network`) with the variant's
    families on its two layers under one prior."""
    plain = regression_network(dataset, in_features)
    prior = make_prior(variant.prior, **variant.prior_options)
    first = bayesianize(plain[0], make_family(variant.family, **variant.family_options), prior, pretrained=False)
    output = bayesianize(plain[2], make_family(variant.output_family, **variant.output_options), prior, pretrained=False)
    return nn.Sequential(first, nn.ReLU(), output)


def _run_key(config: UCIConfig, data_dir: str | None, dev: torch.device, progress: bool, key: RunKey) -> dict[str, Any]:
    """The engine's run function: run ``key = (dataset, variant label, split)``."""
    dataset, label, split = key
    variant = next(v for v in config.variants if v.label == label)
    seed_everything(split)
    data = load_uci(dataset, split, data_dir)
    model = build_regressor(variant, data.x_train.shape[1], dataset).to(dev)
    likelihood = GammaPrecisionGaussian(config.prior_shape, config.prior_rate).to(dev)
    n = data.x_train.shape[0]
    steps_per_epoch = math.ceil(n / config.batch_size)
    epochs = max(config.epochs, math.ceil(config.min_steps / steps_per_epoch))
    warmup = round(config.anneal_fraction * epochs * steps_per_epoch)
    x_train, y_train, batch = vdist.equal_share(data.x_train, data.y_train, config.batch_size)  # this rank's share
    loader = DataLoader(TensorDataset(x_train, y_train), batch_size=batch, shuffle=True)

    closed_form = config.noise_update == "closed_form"
    decay = max(0.0, 1.0 - config.batch_size / n)  # the running mean spans about one epoch

    def nll(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        f = out.squeeze(-1)
        if closed_form:
            likelihood.observe(y, f.detach(), decay)
        return -likelihood.expected_log_likelihood(y, f).mean() + likelihood.kl() / n

    def after_step(step: int, terms: Any) -> None:
        vdist.all_reduce_mean_([likelihood.mean_square])  # data-parallel: the union batch's residuals, on every rank
        likelihood.update_posterior_(n)  # q(tau) at its optimum given the current q(w)

    noise_parameters = [] if closed_form else list(likelihood.parameters())
    optimizer = default_optimizer([*model.parameters(), *noise_parameters], config.lr)
    t0 = time.perf_counter()
    fit(
        model, loader, n_data=n, epochs=epochs, optimizer=optimizer, nll=nll, device=dev, progress=progress,
        kl_weight=(lambda step: linear_kl_annealing(step, warmup)) if warmup else 1.0,
        on_step_end=after_step if closed_form else None,
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    model.eval()
    x_test = data.x_test.to(dev)
    with torch.no_grad():
        f = predict(model, x_test, samples=config.samples).squeeze(-1).cpu().double()  # [S, N], standardised units
        tau = likelihood.sample_precision(config.samples).cpu().double()  # [S]
    y_std, y_mean = float(data.y_std), float(data.y_mean)
    pred = f * y_std + y_mean
    y = data.y_test.double() * y_std + y_mean
    ll = predictive_log_likelihood(pred, y, y_std**2 / tau)
    rmse = float((pred.mean(0) - y).square().mean().sqrt())
    return {"dataset": dataset, "variant": variant.label, "split": split, "rmse": rmse, "ll": ll, "epochs": epochs,
            "steps": epochs * steps_per_epoch, "seconds": round(seconds, 2)}  # fmt: skip


def _mean_ceiling(config: UCIConfig, dataset: str, splits: list[int], data_dir: str | None) -> float | None:
    """The mean of :func:`log_likelihood_ceiling` over ``splits`` (None unless q(tau) is fitted in closed form)."""
    if config.noise_update != "closed_form" or not splits:
        return None
    values = []
    for split in splits:
        data = load_uci(dataset, split, data_dir)
        values.append(log_likelihood_ceiling(data.x_train.shape[0], float(data.y_std), config.prior_shape, config.prior_rate))
    return sum(values) / len(values)


def uci_jobs(config: UCIConfig, shard: tuple[int, int] | None = None) -> list[tuple[str, UCIVariant, int]]:
    """The (dataset, variant, split) jobs of ``config`` in their fixed order (smallest dataset first, variant by
    variant), or the ``shard=(k, n)`` share of them (:func:`~varbnn_lab.regression.regression_jobs`)."""
    return regression_jobs(config.datasets, config.active_variants, config.max_splits, shard)


def run_uci(
    config: UCIConfig,
    *, device: str | torch.device | None = "cpu", out_dir: str | os.PathLike[str] | None = None, data_dir: str | None = None,
    progress: bool = True, command: str | None = None, shard: tuple[int, int] | None = None, train: bool = True,
    workers: int = 1, distributed: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Run every (dataset, variant, split) not yet in ``OUT/<name>_runs*.jsonl``; write ``<name>.json`` / ``.md``.
    ``OUT``: ``out_dir``, by default ``benchmarks/results/<name>/`` (the Gamma(6, 6), 40-epoch protocol's folder; give
    another protocol its own, as the committed ``uci/gamma11``, ``uci/200-epochs``, ``uci/rdp-defaults`` are).

    The engine runs them (:func:`~varbnn_lab.regression.run_regression`): ``workers=N`` (> 1, CPU only) in N
    worker processes with one thread each; ``shard=(k, n)`` only every n-th job from the k-th, appended to
    ``<name>_runs.shard<k>.jsonl`` (shards may share one ``out_dir``; every runs file there is read back; the page waits
    for a call that is not a shard). Jobs run smallest dataset first. ``train=False`` only renders the table from the
    saved runs. ``distributed`` (under ``torchrun``): each run trains data-parallel, every rank on its equal share of
    the split with a batch of ``batch_size // world_size``, the noise posterior fitted to the union batch's residuals;
    rank 0 alone writes."""
    return run_regression(
        config, uci_jobs(config), functools.partial(_run_key, config, data_dir),
        lambda done: summarise_uci(config, done, lambda dataset, splits: _mean_ceiling(config, dataset, splits, data_dir)),
        render_uci_markdown, device=device, out_dir=out_dir, progress=progress, command=command, shard=shard, train=train,
        workers=workers, distributed=distributed,
    )  # fmt: skip
