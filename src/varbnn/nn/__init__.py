"""Bayesian layers. Each returns only its output; ``varbnn.kl(model)`` sums the KL of all of them.

Every Bayesian layer samples its weights in ``model.eval()`` as well: only ``sample_mode`` ("sample", "mean", "mode")
decides what a forward pass uses (see :class:`BayesianModule`).
"""

from varbnn.nn.attention import BayesMultiheadAttention
from varbnn.nn.base import BayesianModule, sample_mode, set_sample_mode
from varbnn.nn.layers import BayesConv1d, BayesConv2d, BayesConv3d, BayesEmbedding, BayesGRU, BayesLinear, BayesLSTM

__all__ = [
    "BayesianModule",
    "BayesLinear",
    "BayesConv1d",
    "BayesConv2d",
    "BayesConv3d",
    "BayesEmbedding",
    "BayesLSTM",
    "BayesGRU",
    "BayesMultiheadAttention",
    "set_sample_mode",
    "sample_mode",
]
