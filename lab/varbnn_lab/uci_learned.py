"""``varbnn reproduce uci-learned``: UCI regression under a learned-noise protocol, the same for every family and
for the baselines (issue 30's main table; issue 26's regression benchmark).

Per dataset and standard split (20; 5 for protein):

* **Data**: the standard split; a validation set of ``validation_fraction`` of the training split (a permutation
  seeded by the split) is carved out for the search. Inputs and targets are standardised by the statistics of the
  data each run trains on (the 80% during the search, the whole training split for the final run).
* **Noise**: homoscedastic Gaussian with the noise std learned with the network, a point estimate maximising the
  ELBO (:class:`varbnn.likelihoods.Gaussian`, ``noise_std=None``). Why not a Gamma posterior under a vague prior:
  with n >= 300 points the posterior of one precision is concentrated, so its mean is the point estimate to within
  a few percent, and the Gamma(6, 6) protocol showed how a prior on it can cap the test log-likelihood.
* **Network**: in-50-1 (100 hidden units for protein); a family on the first layer, its ``output_family`` on the
  output layer (as :data:`varbnn_lab.uci.UCI_VARIANTS`), at the library's default options; full ELBO
  (``kl_weight`` 1) with the KL weight annealed linearly over the first quarter of the shortest training length;
  Adam 1e-3, batch 32. The IVON column: the mean-field network trained by :class:`varbnn.optim.IVON` at its defaults
  but for the mean step clipped at 0.001 (:data:`IVON_OPTIONS`, chosen on the validation splits: lr 0.1,
  ``hess_init`` from the initial std, ``kl_weight`` 1: ``ess`` = the training-set size; the prior enters
  its update, so there is no KL term to anneal), the learned noise std as one of its plain parameters (SGD with
  momentum at ``lr``). Baselines: MC dropout (dropout before the output layer, rate searched) and a deep ensemble
  of 5 plain networks with a mean and a variance output (:class:`~varbnn.likelihoods.HeteroscedasticGaussian`, as
  Lakshminarayanan et al. 2017 without their adversarial training).
* **Search** (the hyperparameters the reference papers also chose per dataset): the prior scale (``prior_scales``;
  the Normal prior's std, RDP's global scale, MAP's weight-decay prior; MC dropout searches ``dropout_rates``
  instead; the ensemble has no such knob) x the training length (``epochs``, each capped at ``max_steps``
  optimizer steps), judged by the validation log-likelihood (``validation_samples`` draws). One training run per
  knob value gives every length (the validation set is scored at each length as training passes it), so every
  family gets the same budget: ``len(prior_scales)`` runs of the longest length. The ensemble's search trains one
  member.
* **Test**, once, with the chosen setting retrained on the whole training split: per-point log-likelihood (log-sum-
  exp over ``samples`` draws; an ensemble's members are its draws) and RMSE of the predictive mean, original units.
"""

from __future__ import annotations

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
from varbnn.baselines import DeepEnsemble, MCDropout
from varbnn.convert import bayesianize
from varbnn.data import load_uci
from varbnn.data.loaders import UCI_DATASETS
from varbnn.families import make_family
from varbnn.likelihoods import Gaussian, HeteroscedasticGaussian, Likelihood
from varbnn.objectives import linear_kl_annealing
from varbnn.optim import IVON
from varbnn.predict import RegressionSummary, predict
from varbnn.priors import make_prior
from varbnn.training import default_optimizer, fit, seed_everything
from varbnn.training.checks import NonFiniteError
from varbnn.training.compiled import compile_mode
from varbnn_lab.engine import RunKey, config_fields, fingerprint
from varbnn_lab.pages.uci_learned import (
    BASELINE_FAMILIES,
    DEEP_ENSEMBLE_LL,
    render_uci_learned_markdown,
    summarise_uci_learned,
    uci_learned_figures,
)
from varbnn_lab.regression import (
    SMALLEST_FIRST,
    UCIVariant,
    hidden_units,
    regression_jobs,
    regression_network,
    run_regression,
)
from varbnn_lab.regression import standardise as _standardise

__all__ = [
    "UCILearnedConfig", "LEARNED_VARIANTS", "DEEP_ENSEMBLE_LL", "quick_config", "run_uci_learned", "render_uci_learned_markdown",
]  # fmt: skip

LEARNED_VARIANTS = (
    UCIVariant("RDP (double)", "rdp", {"grouping": "double"}, prior="radial_directional"),
    UCIVariant("mean-field", "meanfield"),
    UCIVariant("radial", "radial"),
    UCIVariant("2-tied", "ktied", {"rank": 2}),
    UCIVariant("MAP (Delta)", "delta", output_family="delta"),
    UCIVariant("MC dropout", "mc-dropout"),
    UCIVariant("deep ensemble (5)", "ensemble", {"members": 5}),
    UCIVariant("IVON (mean-field)", "ivon"),
)

IVON_FAMILY = "ivon"
"""The ``family`` of the IVON column: mean-field layers (``MeanField()``) trained by :class:`varbnn.optim.IVON`."""

IVON_OPTIONS: dict[str, Any] = {"clip": 0.001}
"""Keyword arguments of :class:`varbnn.optim.IVON` for the IVON column on top of ``n_data`` and ``kl_weight``: each
element's mean step clipped at 0.001, the recipe ``benchmarks/ivon_regression_recipe.py`` chose on the protocol's
validation splits (splits 0-2 of the nine sets; mean rank 1.67 of 4 against 3.11 for IVON's defaults, which diverged
on protein: ``benchmarks/results/uci-learned/ivon-recipe.md``). Before 2026-12-07 the column ran IVON's defaults."""

ADDED_VARIANTS = ("IVON (mean-field)",)
"""Columns added after the protocol's runs were saved (issue 63 added IVON): left out of
:meth:`UCILearnedConfig.protocol_hash`, so the saved runs of the other columns stay valid; each added column's definition
is the module's."""


@dataclass(frozen=True)
class UCILearnedConfig:
    """The learned-noise protocol (see the module docstring); ``only``: labels of the variants to run and show."""

    name: str = "uci-learned"
    datasets: tuple[str, ...] = SMALLEST_FIRST
    variants: tuple[UCIVariant, ...] = LEARNED_VARIANTS
    max_splits: int | None = None
    prior_scales: tuple[float, ...] = (0.1, 1.0)
    dropout_rates: tuple[float, ...] = (0.01, 0.1)
    epochs: tuple[int, ...] = (40, 100, 400, 1000)
    max_steps: int = 10_000
    validation_fraction: float = 0.2
    batch_size: int = 32
    lr: float = 1e-3
    kl_weight: float = 1.0
    samples: int = 100
    validation_samples: int = 32
    only: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.datasets) - set(UCI_DATASETS))
        if unknown:
            raise ValueError(f"{self.name}: unknown UCI datasets {unknown}; allowed: {list(UCI_DATASETS)}")
        if not self.epochs or any(isinstance(e, bool) or not isinstance(e, int) or e < 1 for e in self.epochs):
            raise ValueError(f"{self.name}: epochs must be positive integers, got {self.epochs!r}")
        if not 0 < self.validation_fraction < 1:
            raise ValueError(f"{self.name}: validation_fraction must be in (0, 1), got {self.validation_fraction!r}")
        for label, grid in (("prior_scales", self.prior_scales), ("dropout_rates", self.dropout_rates)):
            if not grid or any(not (isinstance(v, (int, float)) and v > 0) for v in grid):
                raise ValueError(f"{self.name}: {label} must be positive numbers, got {grid!r}")
        if any(not 0 < p < 1 for p in self.dropout_rates):
            raise ValueError(f"{self.name}: dropout_rates must lie in (0, 1), got {self.dropout_rates!r}")

    @property
    def active_variants(self) -> tuple[UCIVariant, ...]:
        return self.variants if self.only is None else tuple(v for v in self.variants if v.label in self.only)

    def protocol_hash(self) -> str:
        data = config_fields(self, drop=("datasets", "max_splits", "name", "only"))
        data["variants"] = [v for v in data["variants"] if v["label"] not in ADDED_VARIANTS]  # see ADDED_VARIANTS
        return fingerprint(data)

    def grid(self, variant: UCIVariant) -> tuple[float | None, ...]:
        """The searched knob's values for ``variant``: prior scales, dropout rates, or none (the ensemble)."""
        return {"mc-dropout": self.dropout_rates, "ensemble": (None,)}.get(variant.family, self.prior_scales)


def quick_config() -> UCILearnedConfig:
    """The ``--quick`` form: yacht, one split, lengths of 2 and 4 epochs, 8 test and 4 validation draws (seconds)."""
    return UCILearnedConfig(name="uci-learned-quick", datasets=("yacht",), max_splits=1, epochs=(2, 4), samples=8,
                            validation_samples=4)  # fmt: skip


def _build(variant: UCIVariant, knob: float | None, in_features: int, dataset: str, members: int) -> tuple[nn.Module, Likelihood]:
    """The model and likelihood of ``variant`` with its searched knob set; ``members``: ensemble size to build."""
    if variant.family == "ensemble":
        nets = [regression_network(dataset, in_features, outputs=2) for _ in range(members)]
        return (DeepEnsemble(nets) if members > 1 else nets[0]), HeteroscedasticGaussian()  # the search trains one
    if knob is None:
        raise ValueError(f"{variant.label}: no value of its searched knob (a prior scale or a dropout rate)")
    if variant.family == "mc-dropout":
        return MCDropout(regression_network(dataset, in_features, dropout=float(knob))), Gaussian()
    scale_key = "global_scale" if variant.prior == "radial_directional" else "scale"
    prior = make_prior(variant.prior, **{**variant.prior_options, scale_key: float(knob)})
    hidden = hidden_units(dataset)  # each layer made Bayesian as it is built (the seeded draws' order)
    family = "meanfield" if variant.family == IVON_FAMILY else variant.family
    first = bayesianize(nn.Linear(in_features, hidden), make_family(family, **variant.family_options), prior)
    output = bayesianize(nn.Linear(hidden, 1), make_family(variant.output_family, **variant.output_options), prior)
    return nn.Sequential(first, nn.ReLU(), output), Gaussian()


def _log_likelihood(
    model: nn.Module, likelihood: Likelihood, x: torch.Tensor, y: torch.Tensor, samples: int, y_std: torch.Tensor
) -> tuple[float, float, torch.Tensor]:
    """Per-point predictive log-likelihood and RMSE in original units (``y`` standardised, ``y_std`` its scale). Under
    data-parallel training both are averaged over the ranks (each drew its own weights), so that every rank makes the
    same validation choice."""
    model.eval()
    with torch.no_grad():
        outputs = predict(model, x, samples=samples)
        ll = (likelihood.log_predictive(outputs, y) - y_std.log()).mean()
        summary = likelihood.summary(outputs)
        if not isinstance(summary, RegressionSummary):
            raise TypeError(f"a regression likelihood was expected, got {type(likelihood).__name__}")
        mean = summary.mean.reshape(y.shape)
        scores = torch.stack([ll, (mean - y).square().mean().sqrt() * y_std]).double()
        vdist.all_reduce_mean_([scores])
    model.train()
    return float(scores[0]), float(scores[1]), outputs


def _train(
    config: UCILearnedConfig, variant: UCIVariant, knob: float | None, x: torch.Tensor, y: torch.Tensor, epochs: int,
    dev: torch.device, dataset: str, members: int, at_epoch: Any = None, compile: bool | str = False,
    ivon_options: dict[str, Any] | None = None,
) -> tuple[nn.Module, Likelihood]:  # fmt: skip
    """Train ``variant`` with ``knob`` on standardised ``(x, y)`` for ``epochs``; ``at_epoch(epoch, model,
    likelihood)`` after every epoch (the search scores the validation set there); ``compile``: ``fit``'s;
    ``ivon_options``: the IVON column's optimizer options (default :data:`IVON_OPTIONS`)."""
    ivon_options = IVON_OPTIONS if ivon_options is None else ivon_options
    model, likelihood = _build(variant, knob, x.shape[1], dataset, members)
    model, likelihood = model.to(dev), likelihood.to(dev)
    steps_per_epoch = math.ceil(x.shape[0] / config.batch_size)
    warmup = round(0.25 * min(_lengths(config, x.shape[0])) * steps_per_epoch)
    bayesian = variant.family not in BASELINE_FAMILIES
    ivon = variant.family == IVON_FAMILY  # the prior is in IVON's update: no KL term, nothing to anneal
    trained = list(model.members) if isinstance(model, DeepEnsemble) else [model]
    x_share, y_share, batch = vdist.equal_share(x, y, config.batch_size)  # data-parallel: this rank's share
    for net in trained:  # an ensemble's members one after the other (its likelihood has no parameters to share)
        loader = DataLoader(TensorDataset(x_share, y_share), batch_size=batch, shuffle=True)
        optimizer = (IVON(nn.ModuleList([net, likelihood]), n_data=x.shape[0], kl_weight=config.kl_weight, **ivon_options) if ivon
                     else default_optimizer([*net.parameters(), *likelihood.parameters()], config.lr))  # fmt: skip
        fit(
            net, loader, n_data=x.shape[0], epochs=epochs, device=dev, progress=False, likelihood=likelihood,
            optimizer=optimizer,
            kl_weight=(lambda step: config.kl_weight * linear_kl_annealing(step, warmup)) if bayesian and not ivon else None,
            on_epoch_end=(lambda epoch, record: at_epoch(epoch, model, likelihood)) if at_epoch is not None else None,
            compile=compile,
        )  # fmt: skip
    return model, likelihood


def _lengths(config: UCILearnedConfig, n: int) -> list[int]:
    """The candidate training lengths (epochs) for ``n`` training points: each capped at ``max_steps`` steps."""
    cap = max(1, math.ceil(config.max_steps / math.ceil(n / config.batch_size)))
    return sorted({min(e, cap) for e in config.epochs})


def _search(
    config: UCILearnedConfig, variant: UCIVariant, dataset: str, split: int, x_all: torch.Tensor, y_all: torch.Tensor,
    dev: torch.device, compile: bool | str = False, ivon_options: dict[str, Any] | None = None,
    diverged: list[float | None] | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """The protocol's search on a training split ``(x_all, y_all)`` (original units): a permutation seeded by ``split``
    holds out ``validation_fraction`` of it, the rest (standardised by its own statistics) trains ``variant`` once per
    knob value for the longest candidate length, and the validation log-likelihood is scored at every candidate
    length: ``[{"knob", "epochs", "val_ll"}, ...]``. ``ivon_options``: :func:`_train`'s. ``diverged``: when a list, a
    knob whose training stops on a non-finite loss is appended to it and the search goes on (the recipe study);
    else the error propagates (the protocol's runs)."""
    order = torch.randperm(len(x_all), generator=torch.Generator().manual_seed(split))
    n_val = max(1, round(config.validation_fraction * len(x_all)))
    fit_idx, val_idx = order[n_val:], order[:n_val]
    (xm, xs), (ym, ys) = _standardise(x_all[fit_idx], y_all[fit_idx])
    x_fit, y_fit = ((x_all[fit_idx] - xm) / xs).to(dev), ((y_all[fit_idx] - ym) / ys).to(dev)
    x_val, y_val = ((x_all[val_idx] - xm) / xs).to(dev), ((y_all[val_idx] - ym) / ys).to(dev)
    lengths = _lengths(config, len(fit_idx))
    search: list[dict[str, Any]] = []
    for knob in config.grid(variant):
        seed_everything(split)

        def score(epoch: int, model: nn.Module, likelihood: Likelihood, knob: float | None = knob) -> None:
            if epoch in lengths:
                draws = 1 if variant.family == "ensemble" else config.validation_samples  # one deterministic member
                ll = _log_likelihood(model, likelihood, x_val, y_val, draws, ys)[0]
                search.append({"knob": knob, "epochs": epoch, "val_ll": ll})

        try:
            _train(config, variant, knob, x_fit, y_fit, max(lengths), dev, dataset, members=1, at_epoch=score,
                   compile=compile, ivon_options=ivon_options)  # fmt: skip
        except NonFiniteError:
            if diverged is None:
                raise
            diverged.append(knob)
    return search


def _run_key(
    config: UCILearnedConfig, data_dir: str | None, dev: torch.device, progress: bool, key: RunKey, compile: bool | str = False
) -> dict[str, Any]:
    """The engine's run function: search, retrain and test ``key = (dataset, variant label, split)``; ``compile``:
    ``fit``'s for every training of the run (a runtime choice, recorded in the run's record, not part of the protocol)."""
    dataset, label, split = key
    variant = next(v for v in config.variants if v.label == label)
    start = time.perf_counter()
    data = load_uci(dataset, split, data_dir, normalize=False)
    x_all, y_all = data.x_train, data.y_train
    search = _search(config, variant, dataset, split, x_all, y_all, dev, compile=compile)
    finite = [s for s in search if math.isfinite(s["val_ll"])] or search
    best = max(finite, key=lambda s: s["val_ll"])
    # the final run: the whole training split, the chosen knob; the chosen length in epochs, re-capped for its size
    (xm, xs), (ym, ys) = _standardise(x_all, y_all)
    epochs = min(best["epochs"], max(1, math.ceil(config.max_steps / math.ceil(len(x_all) / config.batch_size))))
    seed_everything(split)
    members = int(variant.family_options.get("members", 5)) if variant.family == "ensemble" else 1
    model, likelihood = _train(config, variant, best["knob"], ((x_all - xm) / xs).to(dev), ((y_all - ym) / ys).to(dev),
                               epochs, dev, dataset, members, compile=compile)  # fmt: skip
    x_test, y_test = ((data.x_test - xm) / xs).to(dev), ((data.y_test - ym) / ys).to(dev)
    ll, rmse, _ = _log_likelihood(model, likelihood, x_test, y_test, config.samples, ys.to(dev))
    record = {"dataset": dataset, "variant": label, "split": split, "ll": ll, "rmse": rmse, "knob": best["knob"],
              "epochs": epochs, "search": search, "seconds": round(time.perf_counter() - start, 2)}  # fmt: skip
    if variant.family == IVON_FAMILY:
        record["ivon_options"] = dict(IVON_OPTIONS)  # the column's recipe, with the run
    if compile is not False:
        mode = compile_mode(compile)  # True: the default mode, on a GPU CUDA graphs for each fit whose batches have one shape
        record["compile"] = (
            "reduce-overhead where the batches have one shape, else default" if (compile is True and dev.type == "cuda") else mode
        )
        torch._dynamo.reset()  # every fit compiled its own graphs: let them go with the run
    return record


def run_uci_learned(
    config: UCILearnedConfig, *, device: str | torch.device | None = "cpu", out_dir: str | os.PathLike[str] | None = None,
    data_dir: str | None = None, progress: bool = True, command: str | None = None, shard: tuple[int, int] | None = None,
    train: bool = True, workers: int = 1, distributed: bool = False, compile: bool | str = False,
) -> dict[str, Any]:  # fmt: skip
    """Run every (dataset, variant, split) not yet saved in ``OUT/<name>_runs*.jsonl`` (smallest set first, split by
    split; resumable, ``workers`` processes, ``shard=(k, n)``) and write ``<name>.json`` / ``.md`` (not for a shard);
    ``train=False`` only renders (:func:`~varbnn_lab.regression.run_regression`). ``distributed`` (under
    ``torchrun``): each run trains data-parallel, every rank on its equal share with a batch of
    ``batch_size // world_size``; validation and test scores are averaged over the ranks; rank 0 alone writes.
    ``compile``: every training step through ``fit(compile=...)`` (``True`` or a torch.compile mode; a runtime choice
    like ``device``: the protocol hash does not change, each record names its mode, the page counts them). On the CPU
    the compiled step drew the eager step's random numbers until 2026-11-28 (RDP's Wood proposals too since commit
    7128299; before it, in one fixed batch); since then its weight noise comes from :mod:`varbnn.philox`: the same
    distribution, another random stream."""
    if compile is not False:
        compile_mode(compile)  # a ValueError naming the allowed values before any run
        if distributed:  # what fit would refuse in the first run, after the data are loaded: refused before it
            raise ValueError("compile is not available with distributed training yet (fit refuses it): drop one of the two")
    jobs = regression_jobs(config.datasets, config.active_variants, config.max_splits, split_major=True)
    return run_regression(
        config, jobs, functools.partial(_run_key, config, data_dir, compile=compile),
        functools.partial(summarise_uci_learned, config),
        render_uci_learned_markdown, device=device, out_dir=out_dir, progress=progress, command=command, shard=shard,
        train=train, workers=workers, distributed=distributed, figures=uci_learned_figures,
    )  # fmt: skip
