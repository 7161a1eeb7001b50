"""varbnn: variational Bayesian neural networks for PyTorch.

The user story is four calls: :func:`bayesianize` a plain model (or build one from :mod:`varbnn.nn` layers),
:func:`fit` it, draw Monte Carlo predictions with ``varbnn.predict(model, x, samples=S)`` (the function
:func:`varbnn.predict.predict`; ``import varbnn`` binds the name ``varbnn.predict`` to it) and :func:`evaluate` them.
The loss convention (see :mod:`varbnn.divergence`): ``loss = mean NLL over the batch + beta * KL_total / N_train``.

After ``import varbnn`` every public module is an attribute: ``varbnn.families``, ``varbnn.priors``, ``varbnn.nn``,
``varbnn.convert``, ``varbnn.divergence``, ``varbnn.objectives``, ``varbnn.likelihoods``, ``varbnn.training``
(also under its first name ``varbnn.train``),
``varbnn.metrics``, ``varbnn.calibration``, ``varbnn.baselines``, ``varbnn.laplace``, ``varbnn.adapters``, ``varbnn.continual``,
``varbnn.prune``, ``varbnn.distributions``, ``varbnn.special``, ``varbnn.data``, ``varbnn.models``,
``varbnn.analysis``, ``varbnn.distributed``, ``varbnn.ops``, ``varbnn.plots`` (matplotlib) and ``varbnn.cli`` (the
``varbnn`` command); those the training path does not need (``adapters``, ``analysis``, ``continual``, ``data``,
``distributed``, ``laplace``, ``models``, ``prune``, ``plots``, ``cli``) are imported on first access, so ``import varbnn`` stays
cheap. ``__version__`` is the package version. The experiments are not part of the package: they are the lab,
``varbnn_lab`` (``lab/`` of a clone, ``pip install -e lab/``), which imports varbnn and is never imported by it.
"""

import importlib as _importlib
from typing import Any as _Any

from varbnn import (
    baselines,
    calibration,
    convert,
    distributions,
    divergence,
    families,
    likelihoods,
    metrics,
    nn,
    objectives,
    ops,
    optim,
    priors,
    special,
    train,
    training,
)
from varbnn.convert import (
    ConversionReport,
    ConversionWarning,
    bayesianize,
    conversion_report,
    recalibrate_batchnorm,
    register_converter,
    register_deterministic,
    register_left_deterministic,
    to_deterministic,
)
from varbnn.divergence import kl, kl_divergence
from varbnn.families import Delta, KTied, MeanField, Radial, RadialDirectional, VariationalFamily
from varbnn.nn import (
    BayesConv1d,
    BayesConv2d,
    BayesConv3d,
    BayesEmbedding,
    BayesGRU,
    BayesianModule,
    BayesLinear,
    BayesLSTM,
    sample_mode,
    set_sample_mode,
)
from varbnn.objectives import ELBOTerms, elbo_loss, linear_kl_annealing
from varbnn.predict import classification_summary, predict, regression_summary
from varbnn.priors import RadialDirectionalPrior, RadialPrior, update_adaptive_priors
from varbnn.training import evaluate, fit

__version__ = "0.2.0"

__all__ = [
    "adapters",
    "analysis",
    "baselines",
    "calibration",
    "continual",
    "convert",
    "data",
    "distributed",
    "divergence",
    "laplace",
    "likelihoods",
    "models",
    "objectives",
    "ops",
    "optim",
    "prune",
    "special",
    "train",
    "training",
    "fit",
    "evaluate",
    "distributions",
    "families",
    "metrics",
    "nn",
    "priors",
    "bayesianize",
    "to_deterministic",
    "register_converter",
    "register_deterministic",
    "register_left_deterministic",
    "conversion_report",
    "recalibrate_batchnorm",
    "ConversionReport",
    "ConversionWarning",
    "kl",
    "kl_divergence",
    "Delta",
    "MeanField",
    "KTied",
    "Radial",
    "RadialDirectional",
    "RadialDirectionalPrior",
    "RadialPrior",
    "VariationalFamily",
    "BayesLinear",
    "BayesConv1d",
    "BayesConv2d",
    "BayesConv3d",
    "BayesEmbedding",
    "BayesLSTM",
    "BayesGRU",
    "BayesianModule",
    "sample_mode",
    "set_sample_mode",
    "ELBOTerms",
    "elbo_loss",
    "linear_kl_annealing",
    "predict",
    "classification_summary",
    "regression_summary",
    "update_adaptive_priors",
    "__version__",
]

# Imported on first use (PEP 562), so that ``import varbnn`` costs no more than the modules above: the figures
# (matplotlib), the command line, and the modules the training path does not need.
_LAZY_MODULES = ("adapters", "analysis", "continual", "data", "distributed", "laplace", "models", "prune", "plots", "cli")


def __getattr__(name: str) -> _Any:
    """The modules of ``_LAZY_MODULES`` (``varbnn.prune``, ``varbnn.plots``, ...): imported on first access."""
    if name in _LAZY_MODULES:
        return _importlib.import_module(f"varbnn.{name}")
    raise AttributeError(f"module 'varbnn' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_MODULES))
