"""Variational optimizers: natural-gradient variational learning that trains varbnn posteriors directly.

:class:`IVON` (Shen et al., ICML 2024) trains a model's :class:`~varbnn.families.MeanField` posteriors at about Adam's
cost; the result is an ordinary MeanField model.
"""

from varbnn.optim.ivon import IVON

__all__ = ["IVON"]
