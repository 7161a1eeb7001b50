"""varbnn: variational Bayesian neural networks for PyTorch.

The loss convention (see :mod:`varbnn.divergence`): ``loss = mean NLL over the batch + beta * KL_total / N_train``.
"""

from varbnn import baselines, calibration, distributions, families, likelihoods, metrics, nn, priors, train
from varbnn.convert import (
    ConversionReport,
    ConversionWarning,
    bayesianize,
    conversion_report,
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
from varbnn.train import evaluate, fit

__version__ = "0.2.0"

__all__ = [
    "baselines",
    "calibration",
    "likelihoods",
    "train",
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
