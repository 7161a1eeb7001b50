"""Whole-model operations over a model's Bayesian layers: the KL sum and the adaptive-prior update.

They walk every :class:`~varbnn.nn.base.BayesianModule` of a model, so they live above the layers (and the families and
priors below them). The public names stay where users import them: :func:`varbnn.divergence.kl` (``kl(model)``)
and :func:`varbnn.priors.update_adaptive_priors` forward here on first use (documented lazy loading: a module-level
import would make ``divergence`` / ``priors`` import the layers built on them, an import cycle).
"""

from __future__ import annotations

import itertools
from typing import Any, cast

import torch
from torch import nn

from varbnn._fast import softplus as _fast_softplus
from varbnn._transforms import functorch_active as _functorch_active
from varbnn.divergence import NormalKLParts, family_kl_parts, normal_kl_sum
from varbnn.families.base import VariationalFamily
from varbnn.nn.base import BayesianModule
from varbnn.priors import Prior

__all__ = ["model_kl", "update_adaptive_priors"]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _low_precision(family: nn.Module) -> bool:
    """Whether a family holds float16 / bfloat16 parameters, whose KL (a sum over every weight) must be taken in float32:
    in float16 a sum of 10^5 log-scales overflows (its largest number is 65504) and bfloat16 keeps 8 bits of it."""
    return any(t.dtype in _LOW_PRECISION for t in itertools.chain(family.parameters(), family.buffers()))


class _KLOf(nn.Module):
    """A module whose forward is ``posterior.kl(prior)``: :func:`torch.func.functional_call` then swaps float32 copies
    of both's tensors in for the call (the gradient flows back through the casts to the low-precision parameters)."""

    def __init__(self, posterior: nn.Module, prior: nn.Module) -> None:
        super().__init__()
        self.posterior, self.prior = posterior, prior

    def forward(self) -> torch.Tensor:
        return self.posterior.kl(self.prior)  # type: ignore[operator]


def _float32_kl(posterior: nn.Module, prior: nn.Module) -> torch.Tensor:
    """KL(q || p) of a low-precision family computed in float32 from float32 copies of its (and its prior's) tensors."""
    wrapper = _KLOf(posterior, prior)
    upcast = lambda t: t.float() if t.dtype in _LOW_PRECISION else t  # noqa: E731
    tensors = {name: upcast(t) for name, t in itertools.chain(wrapper.named_parameters(), wrapper.named_buffers())}
    return torch.func.functional_call(wrapper, tensors, (), tie_weights=False, strict=False).float()


def _model_kl(model: nn.Module) -> torch.Tensor | None:
    """The sum of KL(q || p) over the model's Bayesian tensors, None if it has none: the tensors whose KL has
    :class:`~varbnn.divergence.NormalKLParts` in one :func:`~varbnn.divergence.normal_kl_sum` per device and dtype
    (outside ``torch.compile`` and torch.func transforms, which take each tensor's own KL), the others one by one.
    Outside them it also makes the tensors whose sigma is ``softplus(rho)`` (declared by
    :attr:`~varbnn.families.VariationalFamily.softplus_group`) one :class:`~varbnn._fast.softplus.SoftplusGroup` per
    device and dtype, whose statistics the next steps compute in one node. A family's
    :class:`~varbnn.divergence.NormalKLParts` stand in for its ``kl`` only where its class declares
    :attr:`~varbnn.families.VariationalFamily.has_normal_kl_parts`."""
    batch = not (torch.compiler.is_compiling() or _functorch_active())
    groups: dict[tuple[torch.device, torch.dtype], list[NormalKLParts]] = {}
    softplus: dict[tuple[torch.device, torch.dtype], list[Any]] = {}
    total: torch.Tensor | None = None
    for module in model.modules():
        if not isinstance(module, BayesianModule):
            continue
        if not batch or type(module).kl is not BayesianModule.kl or not module.posteriors:
            term = module.kl()
            total = term if total is None else total + term
            continue
        for _, posterior, prior in module.bayesian_tensors():
            if _low_precision(posterior):
                term = _float32_kl(posterior, prior)
                total = term if total is None else total + term
                continue
            # the capabilities a family class declares (VariationalFamily's defaults; none for another posterior type)
            if getattr(posterior, "softplus_group", False) and posterior._softplus_group_eligible():
                loc = cast(torch.Tensor, posterior.loc)
                softplus.setdefault((loc.device, loc.dtype), []).append(posterior)
            parts = family_kl_parts(posterior, prior) if getattr(posterior, "has_normal_kl_parts", False) else None
            if parts is None:
                term = posterior.kl(prior)
                total = term if total is None else total + term
            else:
                groups.setdefault((parts.loc.device, parts.loc.dtype), []).append(parts)
    for parts_list in groups.values():
        term = normal_kl_sum(parts_list)
        total = term if total is None else total + term
    if softplus:  # the next steps compute these tensors' sigma statistics together (host time)
        for families in softplus.values():  # looked up on the module at each call, as before the move
            _fast_softplus.join_softplus_groups(families)
    return total


def model_kl(model: nn.Module) -> torch.Tensor:
    """``KL_total`` of ``model``: the SUM of KL(q || p) over every Bayesian tensor, each against its own prior (a 0-d
    tensor, nats; 0 on the device of the model's first parameter for a model without Bayesian layers). This is what
    ``varbnn.kl(model)`` (:func:`varbnn.divergence.kl`) returns; see there for the convention and the batched closed
    forms."""
    total = _model_kl(model)
    if total is None:
        param = next(model.parameters(), None)
        return torch.zeros((), device=param.device if param is not None else None)
    return total


@torch.no_grad()
def update_adaptive_priors(model: nn.Module) -> int:
    """Set every adaptive prior in ``model`` to its optimum given the current posteriors (Graves 2011 section 6:
    "the prior parameters should be set to their optimal values after every update"); :func:`varbnn.train.fit` calls
    it after every optimiser step. Also importable as :func:`varbnn.priors.update_adaptive_priors` and
    ``varbnn.update_adaptive_priors``.

    Tensors that share one prior object are pooled (e.g. a Normal prior gets ``loc = mean_i mu_i`` and
    ``scale^2 = mean_i [sigma_i^2 + (mu_i - loc)^2]`` over all of them, eq. 15). Returns the number of priors updated.
    """
    groups: dict[int, tuple[Prior, list[VariationalFamily]]] = {}
    for module in model.modules():
        if isinstance(module, BayesianModule):
            for _, posterior, prior in module.bayesian_tensors():
                if prior.adaptive:
                    groups.setdefault(id(prior), (prior, []))[1].append(posterior)
    for prior, posteriors in groups.values():
        prior.update_(posteriors)
    return len(groups)
