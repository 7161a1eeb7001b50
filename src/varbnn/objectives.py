"""The training objective: negative ELBO per training example, and its MDL (bits) reading.

    loss = mean NLL over the batch + beta * KL_total / N_train        (Graves 2011, eq. 18)

Multiplied by ``N_train`` this is the negative ELBO (Graves' L(alpha, beta, D) = L^E + L^C, eq. 3): the
error loss L^E (expected NLL of the training targets) plus the complexity loss L^C (the KL, i.e. the
bits-back cost of the weights). See :mod:`varbnn.divergence` for how the KL is summed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from varbnn.divergence import kl as model_kl

__all__ = ["ELBOTerms", "elbo_loss", "score_correction", "linear_kl_annealing", "NATS_PER_BIT"]

NATS_PER_BIT = math.log(2.0)


@dataclass(frozen=True)
class ELBOTerms:
    """The loss to minimise and its parts (all in nats unless the name says bits).

    Attributes:
        loss: ``nll + beta * kl / n_data`` (a scalar tensor with gradient).
        nll: mean negative log-likelihood of the batch, per example (detached).
        kl: total KL of the model, summed over all weights (detached).
        beta: the KL weight used.
        n_data: the number of training examples the KL is spread over.
    """

    loss: torch.Tensor
    nll: torch.Tensor
    kl: torch.Tensor
    beta: float
    n_data: int

    @property
    def nll_bits(self) -> float:
        return float(self.nll) / NATS_PER_BIT

    @property
    def kl_bits(self) -> float:
        return float(self.kl) / NATS_PER_BIT

    @property
    def negative_elbo(self) -> float:
        """-ELBO per training example (beta = 1), nats."""
        return float(self.nll) + float(self.kl) / self.n_data

    def as_dict(self) -> dict[str, float]:
        return {
            "loss": float(self.loss.detach()),
            "nll": float(self.nll),
            "kl": float(self.kl),
            "nll_bits": self.nll_bits,
            "kl_bits": self.kl_bits,
            "beta": self.beta,
        }


def elbo_loss(nll: torch.Tensor, model: nn.Module, n_data: int, beta: float = 1.0) -> ELBOTerms:
    """``loss = nll + beta * kl(model) / n_data``, with the parts returned for logging.

    Args:
        nll: the MEAN negative log-likelihood over the batch (a scalar), nats.
        model: the model whose Bayesian layers contribute ``varbnn.kl(model)``.
        n_data: number of training examples (not the batch size), > 0.
        beta: KL weight (1 for the true ELBO; < 1 during annealing), >= 0.
    """
    if not isinstance(nll, torch.Tensor) or nll.dim() != 0:
        shape = tuple(nll.shape) if isinstance(nll, torch.Tensor) else type(nll).__name__
        raise ValueError(f"nll must be a scalar tensor (the batch-mean NLL), got {shape}")
    if isinstance(n_data, bool) or not isinstance(n_data, int) or n_data < 1:
        raise ValueError(f"n_data must be a positive integer (the training-set size), got {n_data!r}")
    if not (math.isfinite(beta) and beta >= 0):
        raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
    kl_total = model_kl(model)
    loss = nll + (beta / n_data) * kl_total if beta else nll + 0.0 * kl_total
    score = score_correction(model)
    if score is not None:  # value 0: only the gradient changes (rejection-sampling correction, RDP / vMF)
        loss = loss + nll.detach() * score
    return ELBOTerms(loss=loss, nll=nll.detach(), kl=kl_total.detach(), beta=float(beta), n_data=n_data)


def score_correction(model: nn.Module) -> torch.Tensor | None:
    """Sum of the pending score terms of the model's families (see ``VariationalFamily.take_score``), or None."""
    from varbnn.families.base import VariationalFamily

    total: torch.Tensor | None = None
    for module in model.modules():
        if isinstance(module, VariationalFamily):
            score = module.take_score()
            if score is not None:
                total = score if total is None else total + score
    return total


def linear_kl_annealing(step: int, warmup_steps: int) -> float:
    """beta rising linearly from 0 at step 0 to 1 at ``warmup_steps`` (and 1 after); 1 if warmup is 0."""
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if warmup_steps == 0:
        return 1.0
    return min(1.0, max(0.0, step / warmup_steps))
