"""torch.distributions subclasses used by varbnn's families and priors.

Every distribution here treats the WHOLE weight tensor as one event (``event_shape == tensor.shape``),
so ``log_prob`` returns one number per sample and a KL between two of them is a sum over weights. The
exceptions are the distributions on the sphere (``VonMisesFisher``, ``HypersphericalUniform``), whose event is
one vector (``event_shape == (d,)``), as in scipy and TFP.
"""

from varbnn.distributions.delta import Delta
from varbnn.distributions.improper import ImproperUniform
from varbnn.distributions.radial import Radial
from varbnn.distributions.scale_mixture import ScaleMixtureNormal
from varbnn.distributions.vmf import HypersphericalUniform, RejectionSamplingError, VonMisesFisher

__all__ = [
    "Delta",
    "HypersphericalUniform",
    "ImproperUniform",
    "Radial",
    "RejectionSamplingError",
    "ScaleMixtureNormal",
    "VonMisesFisher",
]
