"""torch.distributions subclasses used by varbnn's families and priors.

Every distribution here treats the WHOLE weight tensor as one event (``event_shape == tensor.shape``),
so ``log_prob`` returns one number per sample and a KL between two of them is a sum over weights.
"""

from varbnn.distributions.delta import Delta
from varbnn.distributions.improper import ImproperUniform
from varbnn.distributions.scale_mixture import ScaleMixtureNormal

__all__ = ["Delta", "ImproperUniform", "ScaleMixtureNormal"]
