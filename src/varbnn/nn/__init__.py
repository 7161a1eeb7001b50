"""Bayesian layers. Each returns only its output; ``varbnn.kl(model)`` sums the KL of all of them."""

from varbnn.nn.base import BayesianModule, sample_mode, set_sample_mode
from varbnn.nn.layers import BayesConv2d, BayesLinear, BayesLSTM

__all__ = ["BayesianModule", "BayesLinear", "BayesConv2d", "BayesLSTM", "set_sample_mode", "sample_mode"]
