"""The training objective: negative ELBO per training example, and its MDL (bits) reading.

    loss = mean NLL over the batch + beta * KL_total / N_train        (Graves 2011, eq. 18)

Multiplied by ``N_train`` this is the negative ELBO, Graves' variational free energy (eq. 2-3) read as the MDL
loss ``L(alpha, beta, D) = L^E + L^C`` (eq. 6): the error loss L^E (expected NLL of the training targets, eq. 4)
plus the complexity loss L^C (the KL, eq. 5, i.e. the bits-back cost of the weights). See :mod:`varbnn.divergence`
for how the KL is summed.
"""

from __future__ import annotations

import math
import numbers
import operator
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from varbnn._checks import ArgumentTypeError, as_float_in
from varbnn.divergence import kl as model_kl
from varbnn.families.base import VariationalFamily
from varbnn.families.delta import Delta
from varbnn.families.meanfield import MeanField, normal_kl_elementwise
from varbnn.likelihoods import LIKELIHOOD_NAMES as _LIKELIHOOD_NAMES
from varbnn.likelihoods import Likelihood
from varbnn.nn.base import BayesianModule
from varbnn.predict import predict
from varbnn.priors import Normal, Uniform

__all__ = [
    "ELBOTerms",
    "elbo_loss",
    "elbo_objective",
    "score_correction",
    "linear_kl_annealing",
    "default_kl_weight",
    "NATS_PER_BIT",
    "per_example_gradients",
    "graves_gradients",
    "uses_graves_estimator",
    "MDLReport",
    "mdl_report",
    "complexity_costs",
    "complexity_is_finite",
    "transmitted_weights",
]

NATS_PER_BIT = math.log(2.0)
"""``ln 2``: nats per bit (divide a length in nats by it for bits)."""


@dataclass(frozen=True)
class ELBOTerms:
    """The loss to minimise and its parts (all in nats unless the name says bits).

    :ivar loss: ``nll + kl_weight * kl / n_data`` (a scalar tensor with gradient).
    :ivar nll: mean negative log-likelihood of the batch, per example (detached).
    :ivar kl: total KL of the model, summed over all weights (detached).
    :ivar kl_weight: the KL weight used (beta in the papers' notation; also :attr:`beta`).
    :ivar n_data: the number of training examples the KL is spread over.
    """

    loss: torch.Tensor
    nll: torch.Tensor
    kl: torch.Tensor
    kl_weight: float
    n_data: int

    @property
    def beta(self) -> float:
        """The KL weight, under the papers' name: the same as :attr:`kl_weight`."""
        return self.kl_weight

    @property
    def nll_bits(self) -> float:
        """``nll / ln 2``: the batch's mean NLL in bits per example."""
        return float(self.nll) / NATS_PER_BIT

    @property
    def kl_bits(self) -> float:
        """``kl / ln 2``: the model's total KL in bits."""
        return float(self.kl) / NATS_PER_BIT

    @property
    def negative_elbo(self) -> float:
        """-ELBO per training example at a KL weight of 1, ``nll + kl / n_data`` (nats), whatever weight was used."""
        return float(self.nll) + float(self.kl) / self.n_data

    def as_dict(self) -> dict[str, float]:
        """``{"loss", "nll", "kl", "nll_bits", "kl_bits", "beta"}`` as Python floats (for logs and JSON; ``"beta"`` is the
        KL weight, under the key fit's history and the saved results use)."""
        return {
            "loss": float(self.loss.detach()),
            "nll": float(self.nll),
            "kl": float(self.kl),
            "nll_bits": self.nll_bits,
            "kl_bits": self.kl_bits,
            "beta": self.kl_weight,
        }


def check_kl_weight(value: Any, owner: str) -> float:
    """``value`` as a KL weight: a finite number >= 0 that float32 can hold, or a ``ValueError`` naming ``kl_weight``."""
    return as_float_in(value, "kl_weight", 0.0, None, owner=owner)


def kl_weight_alias(kl_weight: Any, beta: Any, default: Any, owner: str) -> Any:
    """The KL weight of a call that may still use the earlier keyword ``beta``: ``kl_weight``, or ``beta`` with a
    ``FutureWarning`` (an error when both are given)."""
    if beta is None:
        return kl_weight
    if kl_weight is not default:
        raise ValueError(f"{owner}: pass the KL weight as kl_weight= only (beta= is its earlier name), not both")
    warnings.warn(f"{owner}(beta=...) is now {owner}(kl_weight=...): beta= will be removed", FutureWarning, stacklevel=3)
    return beta


def _training_set_size(n_data: Any, name: str = "n_data") -> int:
    """``n_data`` (the number of training examples the KL is spread over) as a Python ``int``.

    Any integral number is accepted: a Python or NumPy integer, a 0-d tensor holding an integer, or a float with no
    fractional part (``1000.0``); refused with a ``ValueError`` naming ``name``: bools, fractional or non-finite
    numbers, tensors of more than one element, anything else, and values < 1.
    """
    value: int | None = None
    if isinstance(n_data, torch.Tensor) and n_data.dim() == 0 and n_data.dtype != torch.bool:
        n_data = n_data.item()
    if not isinstance(n_data, (bool, torch.Tensor)) and type(n_data).__name__ != "bool_":
        try:
            value = operator.index(n_data)
        except TypeError:
            if isinstance(n_data, numbers.Real) and math.isfinite(n_data) and float(n_data).is_integer():
                value = int(float(n_data))
    if value is None or value < 1:
        raise ValueError(f"{name} must be a positive integer (the training-set size), got {n_data!r}")
    return value


def elbo_loss(
    nll: torch.Tensor, model: nn.Module, n_data: int, kl_weight: float = 1.0, *, beta: float | None = None
) -> ELBOTerms:
    """``loss = nll + kl_weight * kl(model) / n_data``, with the parts returned for logging (an :class:`ELBOTerms`).

    At ``kl_weight = 1`` this is the negative ELBO per training example, Graves' online loss (2011, eq. 18,
    ``L^C / B + L^E(b_j)``) divided by the batch size; ``kl(model)`` is :func:`varbnn.divergence.kl`, the KL summed
    over every weight. When the model holds vMF directions drawn by rejection sampling, ``nll.detach() * score`` (value
    0) is added so that the concentration gradient is unbiased (:func:`score_correction`).

    :param nll: the MEAN negative log-likelihood over the batch (a scalar), nats.
    :param model: the model whose Bayesian layers contribute ``varbnn.kl(model)``.
    :param n_data: number of training examples (not the batch size), > 0: any integral number (e.g. ``np.int64``).
    :param kl_weight: the KL weight (beta in the papers; 1 for the true ELBO, < 1 during annealing), >= 0.
    :param beta: the earlier name of ``kl_weight`` (a ``FutureWarning``).
    """
    if not isinstance(nll, torch.Tensor) or nll.dim() != 0:
        shape = tuple(nll.shape) if isinstance(nll, torch.Tensor) else type(nll).__name__
        raise ValueError(f"nll must be a scalar tensor (the batch-mean NLL), got {shape}")
    n_data = _training_set_size(n_data)
    weight = check_kl_weight(kl_weight_alias(kl_weight, beta, 1.0, "elbo_loss"), "elbo_loss")
    loss, kl_total = elbo_objective(nll, model, n_data, weight)
    return ELBOTerms(loss=loss, nll=nll.detach(), kl=kl_total.detach(), kl_weight=weight, n_data=n_data)


def elbo_objective(
    nll: torch.Tensor, model: nn.Module, n_data: int, beta: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss of :func:`elbo_loss` and the model's total KL, without the argument checks: ``nll + beta / n_data *
    kl(model)`` plus the score correction. ``beta`` may be a 0-d tensor, so that a compiled step
    (``fit(compile=True)``) takes it as an input and an annealing schedule does not recompile."""
    kl_total = model_kl(model)
    if isinstance(beta, torch.Tensor):
        loss = nll + beta / n_data * kl_total
    else:
        loss = nll + (beta / n_data) * kl_total if beta else nll + 0.0 * kl_total
    score = score_correction(model)
    if score is not None:  # value 0: only the gradient changes (rejection-sampling correction, RDP / vMF)
        loss = loss + nll.detach() * score
    return loss, kl_total


def score_correction(model: nn.Module) -> torch.Tensor | None:
    """Sum of the pending score terms of the model's families (see
    :meth:`varbnn.families.VariationalFamily.take_score`), or None when there are none. Each is 0 in value; its
    gradient times the NLL is the rejection-sampling correction of the vMF draws (Naesseth et al. 2017; Oh et al.
    2020 supp. eq. 20), which :func:`elbo_loss` adds as ``nll.detach() * score``. Taking the terms clears them."""
    total: torch.Tensor | None = None
    for module in model.modules():
        if isinstance(module, VariationalFamily):
            score = module.take_score()
            if score is not None:
                total = score if total is None else total + score
    return total


def default_kl_weight(
    model: nn.Module, likelihood: Likelihood | str | Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
) -> float:
    """The KL weight :func:`varbnn.train.fit` uses when given ``kl_weight=None``.

    For a regression likelihood -- a :class:`varbnn.likelihoods.Likelihood` whose ``task`` is ``"regression"``
    (:class:`~varbnn.likelihoods.Gaussian`, :class:`~varbnn.likelihoods.HeteroscedasticGaussian`,
    :class:`~varbnn.likelihoods.GammaPrecisionGaussian`), or one of their names -- each family's
    ``default_regression_kl_weight`` (chosen on regression validation data, ``benchmarks/results/regression-defaults/``;
    a family without one uses its ``default_kl_weight``). Otherwise (``None``, a classification likelihood, or any other
    loss function) each family's ``default_kl_weight`` (chosen on classification validation data,
    ``benchmarks/results/defaults/``). The smallest of the model's families' values if it mixes families
    (:class:`varbnn.families.VariationalFamily`); 1 for a model without Bayesian tensors.

    :param model: the network whose families set the weight.
    :param likelihood: fit's data term: a :class:`~varbnn.likelihoods.Likelihood`, a likelihood name (as
        :func:`varbnn.likelihoods.as_likelihood` takes), a loss function, or ``None`` (default: none given, the
        classification default). Another name is a ``ValueError``, another type an ``ArgumentTypeError`` (a ``TypeError``).
    """
    if isinstance(likelihood, str):
        if likelihood not in _LIKELIHOOD_NAMES:
            raise ValueError(f"default_kl_weight: likelihood must be a Likelihood, one of {sorted(_LIKELIHOOD_NAMES)}, a "
                             f"loss function or None, got {likelihood!r}")  # fmt: skip
        task = _LIKELIHOOD_NAMES[likelihood].task
    elif isinstance(likelihood, Likelihood):
        task = likelihood.task
    elif likelihood is None or callable(likelihood):
        task = ""
    else:
        raise ArgumentTypeError(
            f"default_kl_weight: likelihood must be a varbnn.likelihoods.Likelihood, one of {sorted(_LIKELIHOOD_NAMES)}, "
            f"a loss function or None, got {type(likelihood).__name__}"
        )
    regression = task == "regression"
    weights = []
    for module in model.modules():
        if isinstance(module, VariationalFamily):
            family = type(module)
            weight = family.default_regression_kl_weight if regression else None
            weights.append(family.default_kl_weight if weight is None else weight)
    return float(min(weights)) if weights else 1.0


def linear_kl_annealing(step: int, warmup_steps: int) -> float:
    """The KL weight ``beta = min(1, max(0, step / warmup_steps))``: rising linearly from 0 at step 0 to 1 at
    ``warmup_steps`` and 1 after; 1 when ``warmup_steps`` is 0 (no annealing). ``warmup_steps`` must be >= 0."""
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if warmup_steps == 0:
        return 1.0
    return min(1.0, max(0.0, step / warmup_steps))


# ---------------------------------------------------------------------------------------------------------
# Graves (2011) gradient estimator: per-example weight samples, variance gradient from the empirical Fisher
# ---------------------------------------------------------------------------------------------------------


WEIGHT_DRAWS = ("example", "batch")


def per_example_gradients(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    nll: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
    *,
    wrt: Iterable[str] | None = None,
    weight_draws: str = "example",
    chunk_size: int | None = None,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Gradient of ``nll(model(x_n), y_n)`` for each example n separately (``torch.func``: ``vmap`` over examples of
    ``grad_and_value`` of a ``functional_call``; no Python loop). Returns ``({parameter name: [N, *shape]}, losses [N])``.
    Batch normalisation in training mode couples the examples and is refused.

    :param model: the network (Bayesian or plain); its parameters are read, not changed.
    :param x: inputs ``[N, ...]``.
    :param y: targets ``[N, ...]``.
    :param nll: per-example loss ``nll(output, target)`` of one example's output and target (default
        ``F.cross_entropy``).
    :param wrt: names of the parameters to differentiate (default: all); the others enter as constants.
    :param weight_draws: ``"example"`` (default): an independent weight draw per example (Graves 2011, section 6);
        ``"batch"``: one draw shared by the batch (cheaper: the draw is not repeated per example).
    :param chunk_size: how many examples are vectorised at once (memory: ``chunk_size x parameters``).
    """
    from torch.func import functional_call, grad_and_value, vmap

    if x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(f"x and y must hold the same positive number of examples, got {x.shape[0]} and {y.shape[0]}")
    if weight_draws not in WEIGHT_DRAWS:
        raise ValueError(f"weight_draws must be one of {WEIGHT_DRAWS}, got {weight_draws!r}")
    named = {name: p.detach() for name, p in model.named_parameters()}
    names = set(named) if wrt is None else set(wrt)
    unknown = names - set(named)
    if unknown:
        raise ValueError(f"wrt names parameters the model does not have: {sorted(unknown)}")
    coupled = [name or type(model).__name__ for name, m in model.named_modules() if _couples_examples(m)]
    if coupled:
        raise ValueError(
            f"per-example gradients (Graves' estimator) are undefined for batch normalisation in training mode, which "
            f"couples the examples of a batch: {coupled[:3]}{' ...' if len(coupled) > 3 else ''}. Put those modules in "
            f"eval mode, replace them (e.g. nn.GroupNorm), or use estimator='reparam', 'local' or 'flipout'"
        )
    params = {k: v for k, v in named.items() if k in names}
    constants = {k: v for k, v in named.items() if k not in names}
    buffers = dict(model.named_buffers())

    def loss(p: dict[str, torch.Tensor], xn: torch.Tensor, yn: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, ({**p, **constants}, buffers), (xn.unsqueeze(0),))
        return nll(out, yn.unsqueeze(0))

    randomness = "different" if weight_draws == "example" else "same"
    grads, values = vmap(grad_and_value(loss), in_dims=(None, 0, 0), randomness=randomness, chunk_size=chunk_size)(params, x, y)
    score_correction(model)  # drop score terms a rejection-sampling family recorded inside the transform
    return grads, values


def _couples_examples(module: nn.Module) -> bool:
    """Batch normalisation in training mode: its output for one example depends on the rest of the batch."""
    return isinstance(module, nn.modules.batchnorm._BatchNorm) and module.training


def uses_graves_estimator(model: nn.Module) -> bool:
    """Whether any Gaussian family of ``model`` has ``estimator="graves"``."""
    return any(isinstance(m, MeanField) and m.estimator == "graves" and m.is_built for m in model.modules())


def graves_gradients(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    n_data: int,
    nll: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
    kl_weight: float = 1.0,
    weight_draws: str = "example",
    chunk_size: int | None = None,
    beta: float | None = None,
) -> ELBOTerms:
    """Accumulate into ``.grad`` (as ``loss.backward()`` would) the gradient of ``mean_n E_q[nll_n] + kl_weight KL /
    n_data`` (``beta``: the earlier name of ``kl_weight``)
    by Graves' (2011) estimator, and return the loss terms.

    With ``weight_draws="example"`` (default) every example gets its own weight draw (eq. 16-17); ``"batch"`` shares
    one draw across the batch (cheaper, same expectation). Means, and every parameter of other families, get the batch
    mean of the per-example gradients (eq. 11, 16). For Gaussian families with ``estimator="graves"`` the standard
    deviations get, instead of the reparameterization gradient, the diagonal empirical Fisher form (eq. 12, 17):

        d mean_n E[nll_n] / d sigma_i^2  ~=  1/2 mean_n (d nll_n / d w_i)^2,   i.e. d/d sigma_i = sigma_i mean_n g_ni^2,

    which autograd carries to ``rho`` (or to k-tied's U, V). The KL's gradient is exact (closed form where
    registered). Per-example gradients come from :func:`per_example_gradients`.
    """
    n_data = _training_set_size(n_data)
    beta = check_kl_weight(kl_weight_alias(kl_weight, beta, 1.0, "graves_gradients"), "graves_gradients")
    fisher_families: list[tuple[MeanField, str]] = []
    replaced: set[str] = set()
    for prefix, module in model.named_modules():
        if isinstance(module, MeanField) and module.estimator == "graves" and module.is_built and module.learn_std:
            dot = f"{prefix}." if prefix else ""
            fisher_families.append((module, f"{dot}loc"))
            replaced.update(f"{dot}{name}" for name, _ in module.named_parameters() if name != "loc")
    wrt = [name for name, p in model.named_parameters() if p.requires_grad and name not in replaced]
    grads, values = per_example_gradients(model, x, y, nll, wrt=wrt, weight_draws=weight_draws, chunk_size=chunk_size)
    for name, param in model.named_parameters():
        if name not in grads:
            continue
        g = grads[name].mean(0)
        param.grad = g if param.grad is None else param.grad + g
    for family, loc_name in fisher_families:
        fisher = grads[loc_name].square().mean(0)
        with torch.enable_grad():
            sigma = family.scale
            torch.autograd.backward(sigma, fisher * sigma.detach())
    kl_total = model_kl(model)
    if beta and kl_total.requires_grad:
        ((beta / n_data) * kl_total).backward()
    nll_mean = values.mean().detach()
    loss = nll_mean + (beta / n_data) * kl_total.detach()
    return ELBOTerms(loss=loss, nll=nll_mean, kl=kl_total.detach(), kl_weight=float(beta), n_data=n_data)


# ---------------------------------------------------------------------------------------------------------
# Minimum description length (Graves 2011, section 4)
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MDLReport:
    """The MDL reading of a trained network on a dataset (Graves 2011, eq. 3-6).

    :ivar error_nats: L^E, the expected negative log-likelihood of the targets SUMMED over the dataset (nats).
    :ivar complexity_nats: L^C, the KL of the whole posterior from the prior (nats; bits-back cost of the weights),
        or None when it is not a finite description length (a delta posterior or an improper uniform prior:
        the discretisation constant is infinite).
    :ivar n_targets: number of targets described.
    :ivar n_classes: number of classes (for the uniform-code reference), or None.
    :ivar n_weights: number of weights transmitted (pruned weights excluded).

    Derived lengths in bits are ``nats / ln 2`` (:data:`NATS_PER_BIT`).
    """

    error_nats: float
    complexity_nats: float | None
    n_targets: int
    n_classes: int | None
    n_weights: int

    @property
    def error_bits(self) -> float:
        """L^E in bits."""
        return self.error_nats / NATS_PER_BIT

    @property
    def complexity_bits(self) -> float | None:
        """L^C in bits, or None when it is not finite."""
        return None if self.complexity_nats is None else self.complexity_nats / NATS_PER_BIT

    @property
    def total_bits(self) -> float | None:
        """``L = L^E + L^C`` in bits (Graves 2011 eq. 6), the MDL loss; None when L^C is not finite."""
        c = self.complexity_bits
        return None if c is None else self.error_bits + c

    @property
    def uniform_bits(self) -> float | None:
        """Length of the targets under a uniform code over the classes, ``n_targets * log2(n_classes)``."""
        return None if not self.n_classes else self.n_targets * math.log2(self.n_classes)

    @property
    def ratio(self) -> float | None:
        """Compression ratio (Graves' table 1 "Ratio"): ``(L^E + L^C) / uniform code length``; < 1 means the network
        compresses the targets. None where L^C or the class count is not defined."""
        total, uniform = self.total_bits, self.uniform_bits
        return None if total is None or not uniform else total / uniform

    @property
    def bits_per_weight(self) -> float | None:
        """L^C / ``n_weights`` in bits; None when L^C is not finite or nothing is transmitted."""
        c = self.complexity_bits
        return None if c is None or self.n_weights == 0 else c / self.n_weights

    def as_dict(self) -> dict[str, float | int | None]:
        """The fields and the derived lengths as a flat dict (for JSON)."""
        return {
            "error_nats": self.error_nats,
            "error_bits": self.error_bits,
            "complexity_nats": self.complexity_nats,
            "complexity_bits": self.complexity_bits,
            "total_bits": self.total_bits,
            "uniform_bits": self.uniform_bits,
            "ratio": self.ratio,
            "bits_per_weight": self.bits_per_weight,
            "n_targets": self.n_targets,
            "n_weights": self.n_weights,
        }


def _tensors(model: nn.Module) -> Iterator[tuple[str, Any, Any]]:
    for prefix, module in model.named_modules():
        if isinstance(module, BayesianModule):
            for name, posterior, prior in module.bayesian_tensors():
                yield (f"{prefix}.{name}" if prefix else name), posterior, prior


def complexity_is_finite(model: nn.Module) -> bool:
    """True when L^C is a finite description length: no delta posterior, no improper (uniform) prior."""
    tensors = list(_tensors(model))
    return bool(tensors) and not any(isinstance(q, Delta) or isinstance(p, Uniform) for _, q, p in tensors)


def transmitted_weights(model: nn.Module) -> int:
    """Number of weights of the Bayesian tensors, pruned ones (fixed at 0) excluded."""
    return sum(q.kept if isinstance(q, MeanField) else math.prod(q.shape) for _, q, _ in _tensors(model))


@torch.no_grad()
def complexity_costs(model: nn.Module) -> dict[str, torch.Tensor]:
    """Each weight's complexity cost in nats (Graves 2011 eq. 13's summands), ``{tensor name: tensor of its shape}``.

    Gaussian posteriors against a Normal prior: ``log(s / sigma_i) + ((mu_i - m)^2 + sigma_i^2 - s^2) / (2 s^2)``
    (0 for pruned weights); delta posteriors: ``-log p(w_i)`` without the discretisation constant; other pairs: the
    elementwise closed-form KL of their torch distributions. Divide by ``ln 2`` for bits. Raises ``ValueError`` for
    pairs with no elementwise closed form (e.g. an improper uniform prior, whose cost is infinite).
    """
    from torch.distributions import Independent
    from torch.distributions import kl_divergence as torch_kl

    out: dict[str, torch.Tensor] = {}
    for name, q, p in _tensors(model):
        if isinstance(p, Uniform):
            raise ValueError(f"complexity cost of {name!r} is not finite: its prior is the improper Uniform()")
        if isinstance(q, MeanField) and isinstance(p, Normal):
            cost = normal_kl_elementwise(q.loc, q.scale, p.loc, p.scale)
            out[name] = cost if q.weight_mask is None else cost * q.weight_mask
        elif isinstance(q, Delta):
            out[name] = -p.distribution(q.shape).base_dist.log_prob(q.value)  # type: ignore[attr-defined]
        else:
            qd, pd = q.distribution(), p.distribution(q.shape)
            try:
                if not (isinstance(qd, Independent) and isinstance(pd, Independent)):
                    raise NotImplementedError
                out[name] = torch_kl(qd.base_dist, pd.base_dist)
            except NotImplementedError:
                raise ValueError(
                    f"complexity cost of {name!r}: no elementwise closed-form KL for {type(q).__name__} against "
                    f"{type(p).__name__}"
                ) from None
    return {k: v.detach() for k, v in out.items()}


@torch.no_grad()
def mdl_report(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    samples: int = 10,
    n_classes: int | None = None,
    batch_size: int = 1000,
) -> MDLReport:
    """The MDL reading (Graves 2011, eq. 3-6) of a classifier on ``(x, y)``, as an :class:`MDLReport`.

    ``L^E = sum_n (1/S) sum_s -log p(y_n | x_n, w_s)`` with ``S = samples`` weight draws per example (the Monte Carlo
    estimate of eq. 4, eq. 9), summed over the dataset; ``L^C = KL(q || p)`` of the whole model (eq. 5; closed form
    where registered), or None when it is not a finite description length (:func:`complexity_is_finite`); and the
    derived bits, bits per weight and compression ratio.

    :param model: a trained classifier returning logits.
    :param x: inputs ``[N, ...]``.
    :param y: class labels ``[N]``.
    :param samples: weight draws S per example, an int >= 1 (default 10).
    :param n_classes: classes of the uniform reference code (default: the model's output width).
    :param batch_size: examples per forward pass (default 1000; memory only).
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be a positive integer, got {samples!r}")
    if x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(f"x and y must hold the same positive number of examples, got {x.shape[0]} and {y.shape[0]}")
    device = next(model.parameters()).device
    error, width = 0.0, None
    for start in range(0, x.shape[0], batch_size):
        xb, yb = x[start : start + batch_size].to(device), y[start : start + batch_size].to(device)
        logits = predict(model, xb, samples=samples)  # [S, B, C]
        width = logits.shape[-1]
        per_draw = F.cross_entropy(logits.flatten(0, 1), yb.repeat(samples), reduction="sum")
        error += float(per_draw) / samples
    complexity = float(model_kl(model)) if complexity_is_finite(model) else None
    return MDLReport(
        error_nats=error,
        complexity_nats=complexity,
        n_targets=int(x.shape[0]),
        n_classes=n_classes or width,
        n_weights=transmitted_weights(model),
    )
