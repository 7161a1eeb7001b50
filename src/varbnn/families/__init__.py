"""Variational families: each owns the variational parameters of ONE weight tensor.

A family object created by the user (``MeanField(init_std=0.01)``) is a *spec*: it holds hyperparameters
only. A layer calls :meth:`VariationalFamily.build` once per weight/bias tensor to get a materialised copy
with parameters of the right shape. To add a family, subclass :class:`VariationalFamily`, implement
``_materialize``, ``distribution``, ``mean`` and ``mode`` (and optionally ``moments``, ``forward_op`` fast
paths, a closed-form KL registered in :mod:`varbnn.divergence`), and add it to :data:`FAMILIES`.
"""

from varbnn.families.base import FAMILIES, SampleMode, VariationalFamily, make_family
from varbnn.families.delta import Delta
from varbnn.families.gaussian import MeanField
from varbnn.families.ktied import KTied
from varbnn.families.radial import Radial
from varbnn.families.rdp import RadialDirectional

__all__ = [
    "VariationalFamily",
    "Delta",
    "MeanField",
    "KTied",
    "Radial",
    "RadialDirectional",
    "FAMILIES",
    "make_family",
    "SampleMode",
]
