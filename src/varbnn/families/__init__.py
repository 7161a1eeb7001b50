"""Variational families: each owns the variational parameters of ONE weight tensor.

A family object created by the user (``MeanField(init_std=0.01)``) is a *spec*: it holds hyperparameters
only. A layer calls :meth:`VariationalFamily.build` once per weight/bias tensor to get a materialised copy
with parameters of the right shape. To add a family, subclass :class:`VariationalFamily`, implement
``_materialize``, ``distribution``, ``mean`` and ``mode`` (and optionally ``moments``, ``forward_op`` fast
paths, a closed-form KL registered with :func:`varbnn.divergence.register_family_kl`), and add it to
:data:`FAMILIES` with the :func:`register_family` decorator.

Which of the library's fast paths a family takes is declared on its class (:attr:`VariationalFamily.has_normal_kl_parts`,
:attr:`VariationalFamily.softplus_group`, :attr:`VariationalFamily.has_fused_sample`,
:attr:`VariationalFamily.has_plain_scale`, :attr:`VariationalFamily.compile_unsupported`); a subclass that overrides
what one vouches for without declaring it again takes the safe path.

| family | paper | q over one tensor |
|---|---|---|
| :class:`Delta` | Graves 2011, section 5.1 | a point mass: maximum likelihood / MAP |
| :class:`MeanField` | Graves 2011, section 5.2; Blundell et al. 2015 | ``N(mu_i, softplus(rho_i)^2)`` per weight |
| :class:`KTied` | Swiatkowski et al. 2020, eq. 7-8 | mean field with a rank-k matrix of standard deviations ``U V^T`` |
| :class:`Radial` | Farquhar et al. 2020, eq. 3 | ``mu + sigma * (eps / norm(eps)) * r`` over the whole tensor, ``r ~ N(0, 1)`` |
| :class:`RadialDirectional` | Oh et al. 2020, eq. 2-10 | per row/column: vMF direction times a log-normal radius |
"""

from varbnn.families.base import FAMILIES, SampleMode, VariationalFamily, make_family, register_family
from varbnn.families.delta import Delta
from varbnn.families.ktied import KTied
from varbnn.families.meanfield import MeanField
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
    "register_family",
    "SampleMode",
]
