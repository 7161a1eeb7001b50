"""What :func:`~varbnn.training.loop.fit` resolves before its first step: the data term, the KL weight's schedule,
the distributed flag, the optimizer, what the Graves estimator cannot train, and where training starts (a resumed
checkpoint, or a refusal to overwrite another run's)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from varbnn import distributed as vdist
from varbnn.likelihoods import Likelihood, as_likelihood
from varbnn.objectives import check_kl_weight, default_kl_weight
from varbnn.training.checkpoint import _resume
from varbnn.training.diagnose import TrainingWarning
from varbnn.training.setup import BetaSchedule, NLLFunction, default_optimizer


def _data_term(nll: NLLFunction, likelihood: Likelihood | str | None, n_data: int) -> tuple[Likelihood | None, NLLFunction]:
    """fit's data term: the likelihood object (or ``None``) and the batch-mean NLL function it trains with."""
    if likelihood is not None:
        if nll is not F.cross_entropy:
            raise ValueError("pass either nll= (a loss function) or likelihood= (a Likelihood), not both")
        lik = as_likelihood(likelihood)
        return lik, _likelihood_loss(lik, n_data)
    return None, _default_cross_entropy if nll is F.cross_entropy else nll


def _kl_weight_schedule(
    beta: float | BetaSchedule | None, model: nn.Module, data_term: Likelihood | NLLFunction | None = None
) -> BetaSchedule:
    """fit's ``kl_weight`` as a function of the global step (``None``: the model's families' default KL weight for
    ``data_term``, fit's likelihood or nll: :func:`varbnn.objectives.default_kl_weight`)."""
    if beta is None:
        beta = default_kl_weight(model, data_term)
    elif not callable(beta):
        try:
            beta = check_kl_weight(beta, "fit")
        except ValueError as error:
            raise type(error)(f"{error} (the KL weight: a finite number >= 0, a function of the step, or None for the "
                              "family default)") from None  # fmt: skip
    if callable(beta):
        return beta
    weight = float(beta)
    return lambda _step: weight


def _distributed(distributed: bool | None) -> bool:
    """fit's ``distributed`` resolved: ``None`` follows the process group; ``True`` needs one of several processes."""
    if distributed is None:
        return vdist.is_distributed()
    if distributed and not vdist.is_distributed():
        raise ValueError(
            "distributed=True needs an initialised process group of more than one process: launch with torchrun "
            "and call varbnn.distributed.setup() first"
        )
    return distributed


def _optimizer(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    lr: float,
    extra_parameters: list[nn.Parameter],
    lik: Likelihood | None,
) -> torch.optim.Optimizer:
    """fit's default optimizer over the model's and the likelihood's parameters, or the given one, checked to hold them."""
    if optimizer is None:
        return default_optimizer([*model.parameters(), *extra_parameters], lr)
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    trainable = [p for p in model.parameters() if p.requires_grad]
    if trainable and not any(id(p) in held for p in trainable):
        raise ValueError(
            "the given optimizer holds none of the model's trainable parameters (built over another model, or "
            "over a copy?): build it over model.parameters() after converting the model, or leave optimizer=None"
        )
    if any(id(p) not in held for p in extra_parameters):
        raise ValueError(
            f"the likelihood {type(lik).__name__} has learnable parameters that the given optimizer does not hold: "
            "build it over [*model.parameters(), *likelihood.parameters()], or leave optimizer=None"
        )
    return optimizer


def _check_graves(graves: bool, extra_parameters: list[nn.Parameter], lik: Likelihood | None, mc_samples: int) -> None:
    """What the Graves estimator (per-example Fisher gradients of the model's parameters) cannot train."""
    if graves and extra_parameters:
        raise ValueError(
            f"the likelihood {type(lik).__name__} has learnable parameters, which MeanField(estimator='graves') does not "
            "train (its gradients are per-example Fisher estimates of the model's parameters only): fix them (e.g. "
            "Gaussian(noise_std=...)) or use another estimator"
        )
    if graves and mc_samples != 1:
        raise ValueError("mc_samples > 1 is not available with MeanField(estimator='graves'): it draws weights per example")


def _start(
    checkpoint: str | os.PathLike[str] | None,
    resume: bool,
    overwrite: bool,
    epochs: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: object,
    dev: torch.device,
    lik: Likelihood | None,
    default_rate: bool,
) -> tuple[int, list[dict[str, float]], int]:
    """Where fit starts: ``(completed epochs, history, step)``, restored from ``checkpoint`` with ``resume`` (an
    existing file without ``resume`` is refused unless ``overwrite``)."""
    if checkpoint is None and resume:
        warnings.warn("fit(resume=True) without checkpoint=: there is nothing to resume from, training starts afresh",
                      TrainingWarning, stacklevel=3)  # fmt: skip
    if checkpoint is not None and Path(checkpoint).is_dir():
        raise ValueError(f"fit: checkpoint must be a file path, {str(checkpoint)!r} is a directory (e.g. give "
                         f"{str(Path(checkpoint) / 'run.pt')!r})")  # fmt: skip
    if not resume and not overwrite and checkpoint is not None and Path(checkpoint).exists():
        raise ValueError(
            f"fit(checkpoint={str(checkpoint)!r}): the file exists (another run's?) and resume=False would replace it: "
            "pass resume=True to continue it, overwrite=True to replace it, or another checkpoint path"
        )
    if not (resume and checkpoint is not None and Path(checkpoint).exists()):
        return 0, [], 0
    rates = [group.get("lr") for group in optimizer.param_groups]
    first_epoch, history, step = _resume(Path(checkpoint), model, optimizer, loader, dev, lik)
    restored = [group.get("lr") for group in optimizer.param_groups]
    if default_rate and restored != rates:
        warnings.warn(
            f"fit(resume=True): the optimizer state from {checkpoint} keeps its learning rate {restored}, not the "
            f"{rates} this call set up; to change it, set optimizer.param_groups[i]['lr'] in on_epoch_end, or "
            "start a new checkpoint",
            TrainingWarning,
            stacklevel=3,
        )
    if first_epoch > epochs:
        raise ValueError(f"checkpoint {checkpoint} is at epoch {first_epoch}, beyond epochs={epochs}")
    return first_epoch, history, step


def _default_cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``fit``'s default data term, ``F.cross_entropy``, refusing floating-point targets of another shape than the
    output: regression targets, which cross-entropy would read as soft labels and train on without an error (soft
    labels, probabilities of the output's shape, pass)."""
    if target.is_floating_point() and (output.dim() < 2 or target.shape != output.shape):
        raise ValueError(
            f"fit's default nll is F.cross_entropy (class indices [N], or probabilities of the output's shape), but "
            f"the targets are floating point of shape {tuple(target.shape)} against outputs {tuple(output.shape)}: for "
            "regression pass likelihood=varbnn.likelihoods.Gaussian() (or HeteroscedasticGaussian()), or your own nll="
        )
    return F.cross_entropy(output, target)


def _likelihood_loss(lik: Likelihood, n_data: int) -> NLLFunction:
    """The data term of a likelihood, with its own KL (e.g. a Gamma noise posterior's) spread over the data."""
    if type(lik).kl is Likelihood.kl:
        return lik.nll
    return lambda output, target: lik.nll(output, target) + lik.kl() / n_data
