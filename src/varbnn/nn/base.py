"""Base class of Bayesian layers: owns families + priors per tensor, returns only the output.

Sampling rule: a Bayesian layer draws its weights on EVERY forward pass, in ``model.train()`` and ``model.eval()``
alike. ``eval()`` keeps its torch meaning (dropout off, batch norm on running statistics) and does not touch the
weights; what a forward pass uses is chosen by ``sample_mode`` alone: ``"sample"`` (default), ``"mean"`` or ``"mode"``
of the posterior, set with :func:`set_sample_mode` or, for a block, :func:`sample_mode`. Monte Carlo prediction
(:func:`varbnn.predict`) relies on this: it evaluates in ``eval()`` and still samples.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributions import Distribution

from varbnn.families.base import SAMPLE_MODES, SampleMode, VariationalFamily
from varbnn.priors import Normal, Prior, PriorSpec, as_prior

__all__ = ["BayesianModule", "set_sample_mode", "sample_mode", "resolve_prior"]


def resolve_prior(prior: PriorSpec | None, name: str) -> Prior:
    """The prior of tensor ``name``: ``None`` gives ``Normal(0, 1)``; a ``Prior`` instance is used as is (shared); a
    torch ``Normal`` / ``Laplace`` with scalar parameters becomes the varbnn prior of the same name
    (:func:`varbnn.priors.as_prior`; other torch distributions are refused with a ``TypeError``); a callable is called
    with the tensor's name and may return either."""
    if prior is None:
        return Normal(0.0, 1.0)
    if isinstance(prior, (Prior, Distribution)):
        return as_prior(prior)
    if callable(prior):
        made = prior(name)
        if isinstance(made, Distribution):
            return as_prior(made)
        if not isinstance(made, Prior):
            raise TypeError(f"prior factory returned {type(made).__name__} for {name!r}; expected a varbnn Prior")
        return made
    return as_prior(prior)  # raises the TypeError that lists what is accepted


class BayesianModule(nn.Module):
    """A layer whose tensors are random variables with a posterior family and a prior each.

    ``sample_mode`` selects what forward passes use: ``"sample"`` (draw from q, the default), ``"mean"``
    or ``"mode"`` of q. Set it for a whole model with :func:`set_sample_mode` or :func:`sample_mode`.

    ``model.eval()`` does NOT stop the sampling: in eval mode every forward pass still draws new weights (this is
    what Monte Carlo prediction, :func:`varbnn.predict`, relies on). For a deterministic pass use
    ``with varbnn.sample_mode(model, "mean"): ...`` (or ``"mode"``), or :func:`varbnn.to_deterministic`.
    """

    layer_kind: str = ""

    def __init__(self) -> None:
        super().__init__()
        self.posteriors = nn.ModuleDict()
        self.priors = nn.ModuleDict()
        self.sample_mode: SampleMode = "sample"

    def _add_tensor(
        self,
        name: str,
        shape: tuple[int, ...],
        family: VariationalFamily,
        prior: PriorSpec | None,
        init: torch.Tensor | None,
    ) -> None:
        if not isinstance(family, VariationalFamily):
            raise TypeError(f"family for {name!r} must be a varbnn VariationalFamily, got {type(family).__name__}")
        if family.is_built:
            raise ValueError(f"family for {name!r} is already built; pass an unbuilt spec such as MeanField()")
        self._check_family(family)
        self.posteriors[name] = family.build(shape, init)
        self.priors[name] = resolve_prior(prior, name)
        self.posteriors[name].adapt_to_prior(self.priors[name])  # type: ignore[operator]

    def _check_family(self, family: VariationalFamily) -> None:
        """Raise a clear error if ``family``'s estimator cannot run in this layer (here: the family's table of layer
        kinds, :meth:`~varbnn.families.VariationalFamily.check_layer` of :attr:`layer_kind`)."""
        family.check_layer(self.layer_kind)

    def bayesian_tensors(self) -> Iterator[tuple[str, VariationalFamily, Prior]]:
        """(name, posterior, prior) for every random tensor of this layer."""
        for name, posterior in self.posteriors.items():
            yield name, posterior, self.priors[name]  # type: ignore[misc]

    def kl(self) -> torch.Tensor:
        """Sum of KL(q || p) over this layer's tensors (nats)."""
        total: torch.Tensor | None = None
        for _, posterior, prior in self.bayesian_tensors():
            term = posterior.kl(prior)
            total = term if total is None else total + term
        if total is None:
            raise ValueError(f"{type(self).__name__} has no Bayesian tensors to take the KL of")
        return total

    def _weight(self, name: str) -> torch.Tensor:
        return self.posteriors[name].weight(self.sample_mode)  # type: ignore[operator]

    def extra_repr(self) -> str:
        return f"sample_mode={self.sample_mode!r}"


def set_sample_mode(model: nn.Module, mode: SampleMode) -> nn.Module:
    """Set ``sample_mode`` (``"sample"``, ``"mean"`` or ``"mode"``) on every Bayesian layer; returns model."""
    if mode not in SAMPLE_MODES:
        raise ValueError(f"mode must be one of {SAMPLE_MODES}, got {mode!r}")
    for module in model.modules():
        if isinstance(module, BayesianModule):
            module.sample_mode = mode
    return model


@contextlib.contextmanager
def sample_mode(model: nn.Module, mode: SampleMode) -> Iterator[nn.Module]:
    """Context manager: use ``mode`` inside the block, then restore each layer's previous mode."""
    previous = [(m, m.sample_mode) for m in model.modules() if isinstance(m, BayesianModule)]
    set_sample_mode(model, mode)
    try:
        yield model
    finally:
        for module, old in previous:
            module.sample_mode = old
