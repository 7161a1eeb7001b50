"""IVON, the improved variational online Newton optimizer (Shen et al., ICML 2024, "Variational Learning is Effective
for Large Deep Networks", Algorithm 1), written from the paper for varbnn's :class:`~varbnn.families.MeanField`
posteriors: it trains a diagonal Gaussian posterior at about Adam's cost, and what it trains is an ordinary MeanField
model (``predict``, ``evaluate``, calibration, pruning, saving and ``to_deterministic`` work unchanged).

The posterior of every MeanField tensor is ``q(w) = N(m, sigma^2)`` with the family's own ``loc`` as ``m`` and

    sigma^2 = 1 / (ess * (h + delta)),

where ``h`` is a per-weight curvature estimate (the optimizer's state), ``delta = 1 / (ess * s^2)`` the prior
precision per example of the tensor's Normal(m0, s^2) prior, and ``ess`` the effective sample size: the training-set
size divided by the KL weight (``ess = n_data / kl_weight``; ``kl_weight=1`` is the posterior of the ELBO, a smaller
weight tempers it). After each step the family's ``rho`` is set to ``inverse_softplus(sigma)``, so the model samples
and reports exactly the posterior IVON holds. One step, after ``loss.backward()`` of the batch-mean NLL at one weight
draw ``w = m + sigma * eps`` (the forward pass of any MeanField estimator: reparam, local or flipout):

1. ``g = d loss / d m``; the curvature estimate by the reparameterisation (Price/Stein) identity,
   ``h_hat = (d loss / d sigma) / sigma`` (``= g * eps / sigma`` for the reparam estimator: no per-example gradients);
2. ``gbar = beta1 gbar + (1 - beta1) g`` (momentum, debiased by ``1 - beta1^t``);
3. ``h = beta2 h + (1 - beta2) h_hat + (1 - beta2)^2 (h - h_hat)^2 / (2 (h + delta))`` (the Riemannian correction that
   keeps ``h + delta`` positive);
4. ``m = m - lr (gbar_hat + delta (m - m0)) / (h + delta)``, each element's step clipped to ``[-clip, clip]`` when
   ``clip`` is set.

The prior enters through ``delta``, not through a KL term: train with ``fit(model, loader, n_data=N, epochs=E,
optimizer=IVON(model, n_data=N))``; ``fit`` then leaves the KL out of the loss (``kl_weight`` is the optimizer's).
Parameters that are not MeanField tensors (plain layers, batch norm, a likelihood's learned noise) take step 4 with a
fixed curvature ``h = plain_hess`` and no prior: SGD with momentum at rate ``lr / plain_hess``.

Cost: with the reparam estimator (``bayesianize``'s default) each family draws from the sigma the optimizer holds
(:meth:`~varbnn.families.MeanField.hold_scale_`): the draw is one ``addcmul`` and its backward leaves
``d loss / d sigma`` in the held tensor, so neither softplus nor its gradient is computed in the step (the local and
flipout estimators, and a step after ``rho`` was changed from outside, take the path through ``rho.grad``, the same
numbers). The update of a MeanField tensor is about 17 elementwise passes over it, written into its states in place and
into two scratch tensors (of the largest MeanField tensor's size, per device and dtype) that the optimizer keeps, so
that a step allocates nothing of a weight's size. On the CPU MLP of ``benchmarks/ivon_step.py`` (784-400-400-10, 2
threads) a whole IVON step (forward, backward, update) costs 0.72x a MeanField + Adam step and 2.71x a plain + Adam
step (``benchmarks/results/ivon/ivon_step.md``): the weight noise alone (torch's CPU generator fills one tensor on one
thread) costs about half a plain step there, a floor for every weight-noise method on this CPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from varbnn._checks import as_float_in, as_positive_int
from varbnn.families.base import VariationalFamily
from varbnn.families.meanfield import MeanField, inverse_softplus
from varbnn.priors import Normal as NormalPrior

__all__ = ["IVON"]

_SOFTPLUS_THRESHOLD = 20.0  # F.softplus's default: sigma = rho (slope 1) above it


# sigma below which expm1(sigma) is finite, with a margin (log of the dtype's largest value, less 2)
_EXPM1_SAFE = {dtype: math.log(torch.finfo(dtype).max) - 2.0 for dtype in (torch.float16, torch.bfloat16, torch.float32,
                                                                          torch.float64)}


class IVON(torch.optim.Optimizer):
    """Natural-gradient variational learning of a model's MeanField posteriors at about Adam's cost (module docstring).

    :param model: a network whose Bayesian tensors are all :class:`~varbnn.families.MeanField` (any estimator but
        Graves') with a :class:`~varbnn.priors.Normal` prior of scalar scale (``bayesianize(net)``'s default); other
        families are refused.
    :param n_data: the training-set size N (as ``fit``'s ``n_data``).
    :param lr: the step size of the Newton-like mean update (default 0.1).
    :param kl_weight: the KL weight the posterior corresponds to: ``ess = n_data / kl_weight`` (default 1.0, the
        ELBO's posterior).
    :param hess_init: the initial curvature ``h0`` of every MeanField weight, > 0; ``None`` (default): taken from the
        family's current sigma, ``h0 = 1 / (ess sigma^2) - delta`` (so a converted network keeps its initial
        ``init_std``), at least ``1e-8``.
    :param beta1: momentum of the gradient (default 0.9), in ``[0, 1)``.
    :param beta2: momentum of the curvature (default 0.99999), in ``[0, 1)``: close to 1, as in the paper.
    :param clip: bound on each element's mean step (default ``None``: no clipping). For regression with a learned
        noise, ``clip=1e-3`` is the recipe chosen on the UCI protocol's validation splits
        (``benchmarks/results/uci-learned/ivon-recipe.md``): unclipped, the mean update ran away on the larger sets.
        Not the default because it hurt classification: on the CPU uncertainty benchmark's validation splits it raised
        the best validation NLL by 2.7% (Fashion-MNIST MLP) and 6.6% (MNIST MLP)
        (``benchmarks/results/uncertainty-cpu/studies/ivon-clip.md``).
    :param plain_hess: the fixed curvature of parameters that are not MeanField tensors (default 1.0).
    """

    includes_prior = True
    """The prior is part of the update (through ``delta``): :func:`varbnn.fit` leaves the KL out of the loss."""

    def __init__(
        self,
        model: nn.Module,
        *,
        n_data: int,
        lr: float = 0.1,
        kl_weight: float = 1.0,
        hess_init: float | None = None,
        beta1: float = 0.9,
        beta2: float = 0.99999,
        clip: float | None = None,
        plain_hess: float = 1.0,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"IVON: model must be a torch.nn.Module, got {type(model).__name__}")
        n_data = as_positive_int(n_data, "n_data", owner="IVON")
        lr = as_float_in(lr, "lr", 0.0, None, low_open=True, owner="IVON")
        kl_weight = as_float_in(kl_weight, "kl_weight", 0.0, None, low_open=True, owner="IVON")
        if hess_init is not None:
            hess_init = as_float_in(hess_init, "hess_init (or None)", 0.0, None, low_open=True, owner="IVON")
        beta1 = as_float_in(beta1, "beta1", 0.0, 1.0, high_open=True, owner="IVON")
        beta2 = as_float_in(beta2, "beta2", 0.0, 1.0, high_open=True, owner="IVON")
        if clip is not None:
            clip = as_float_in(clip, "clip (or None)", 0.0, None, low_open=True, owner="IVON")
        plain_hess = as_float_in(plain_hess, "plain_hess", 0.0, None, low_open=True, owner="IVON")
        self.ess = n_data / kl_weight
        self.n_data, self.kl_weight = n_data, kl_weight
        families: list[tuple[str, MeanField, NormalPrior]] = []
        for name, module in model.named_modules():
            for tensor, posterior, prior in getattr(module, "bayesian_tensors", lambda: ())():
                where = f"{name}.{tensor}" if name else tensor
                families.append((where, self._check_family(where, posterior), self._check_prior(where, prior)))
        if not families:
            raise ValueError("IVON: the model has no MeanField tensors to train (bayesianize it first)")
        in_families = {id(p) for _, family, _ in families for p in family.parameters()}
        plain = [p for p in model.parameters() if p.requires_grad and id(p) not in in_families]
        groups: list[dict[str, Any]] = [
            {"params": [family.loc, family.rho], "kind": "meanfield", "family": family, "prior_loc": float(prior.loc),
             "delta": 1.0 / (self.ess * float(prior.scale) ** 2), "name": where}
            for where, family, prior in families
        ]  # fmt: skip
        if plain:
            groups.append({"params": plain, "kind": "plain", "delta": 0.0})
        defaults = dict(lr=lr, beta1=beta1, beta2=beta2, clip=clip, hess_init=hess_init, plain_hess=plain_hess)
        super().__init__(groups, defaults)
        for group in self.param_groups:
            if group["kind"] == "meanfield":
                self._init_curvature(group)

    @staticmethod
    def _check_family(where: str, posterior: VariationalFamily) -> MeanField:
        if type(posterior) is not MeanField:
            raise ValueError(
                f"IVON trains MeanField posteriors (a diagonal Gaussian), got {type(posterior).__name__} at {where!r}: "
                "bayesianize the model with MeanField() (the default), or train this family with fit's Adam"
            )
        if posterior.estimator == "graves":
            raise ValueError(f"IVON: {where!r} uses MeanField(estimator='graves'), whose gradients are not the loss's: "
                             "use 'reparam', 'local' or 'flipout'")  # fmt: skip
        if not posterior.learn_std or not isinstance(posterior.rho, nn.Parameter):
            raise ValueError(f"IVON: {where!r} has learn_std=False: IVON sets sigma from its curvature estimate, which "
                             "needs the gradient of sigma")  # fmt: skip
        return posterior

    @staticmethod
    def _check_prior(where: str, prior: Any) -> NormalPrior:
        if not isinstance(prior, NormalPrior) or prior.adaptive or prior.scale.numel() != 1 or prior.loc.numel() != 1:
            raise ValueError(
                f"IVON: the prior of {where!r} is {prior!r}; IVON's prior is a Normal of scalar loc and scale (its "
                "precision is the weight decay delta): use varbnn.priors.Normal(loc, scale), not adaptive"
            )
        return prior

    @torch.no_grad()
    def _init_curvature(self, group: dict[str, Any]) -> None:
        family: MeanField = group["family"]
        state = self.state[family.loc]
        sigma = F.softplus(family.rho)
        if group["hess_init"] is None:
            h = (1.0 / (self.ess * sigma.double() ** 2) - group["delta"]).clamp_min(1e-8).to(sigma.dtype)
        else:
            h = torch.full_like(sigma, group["hess_init"])
        state["hess"] = h
        state["momentum"] = torch.zeros_like(family.loc)
        state["step"] = 0
        self._set_sigma(group)

    @torch.no_grad()
    def _set_sigma(self, group: dict[str, Any]) -> None:
        family: MeanField = group["family"]
        h = self.state[family.loc]["hess"]
        sigma = torch.rsqrt(self.ess * (h + group["delta"]))
        family.rho.copy_(inverse_softplus(sigma))
        self._hold(family, sigma)

    @staticmethod
    @torch.no_grad()
    def _hold(family: MeanField, sigma: torch.Tensor) -> None:
        """Give the family the sigma just written into its rho (:meth:`MeanField.hold_scale_`): its reparameterised
        draw is then one ``addcmul`` whose backward leaves ``d loss / d sigma`` in the held tensor's grad, the
        curvature estimate's input, without softplus forward or backward. Local and flipout estimators draw outputs,
        not weights, and keep the path through ``rho.grad``."""
        if family.estimator != "reparam" or family.weight_mask is not None:
            return
        leaf = family.held_scale(ended=True)
        if leaf is None or leaf.shape != sigma.shape or leaf.dtype != sigma.dtype or leaf.device != sigma.device:
            leaf = torch.empty_like(sigma).requires_grad_(True)
        leaf.copy_(sigma)
        leaf.grad = None
        family.hold_scale_(leaf)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """torch's ``zero_grad``, and the gradients of the sigmas the families draw from (:meth:`_hold`)."""
        super().zero_grad(set_to_none)
        for group in self.param_groups:
            held = group["family"].held_scale(ended=True) if group["kind"] == "meanfield" else None
            if held is not None and held.grad is not None:
                if set_to_none:
                    held.grad = None
                else:
                    held.grad.zero_()

    def sigma(self, family: MeanField) -> torch.Tensor:
        """The posterior standard deviations IVON holds for ``family`` (``1 / sqrt(ess (h + delta))``)."""
        for group in self.param_groups:
            if group.get("family") is family:
                return torch.rsqrt(self.ess * (self.state[family.loc]["hess"] + group["delta"]))
        raise ValueError("IVON.sigma: this family is not one of the optimizer's")

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One IVON update from the gradients of the last backward (see the module docstring); returns the closure's
        loss when one is given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["kind"] == "meanfield":
                self._meanfield_step(group)
                continue
            lr, beta1, clip = group["lr"], group["beta1"], group["clip"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum" not in state:
                    state["momentum"], state["step"] = torch.zeros_like(p), 0
                state["step"] += 1
                state["momentum"].mul_(beta1).add_(p.grad, alpha=1.0 - beta1)
                direction = state["momentum"] / ((1.0 - beta1 ** state["step"]) * group["plain_hess"]) * lr
                if clip is not None:
                    direction.clamp_(-clip, clip)
                p.sub_(direction)
        return loss

    def _buffers(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Two scratch tensors of ``like``'s shape, dtype and device: views into two flat buffers per device and dtype
        that the optimizer keeps (of its largest tensor's size), so that a step allocates nothing (a fresh tensor of
        a weight's size costs its page faults on the CPU) and writes every intermediate into memory already mapped."""
        key = (like.device, like.dtype)
        scratch: dict[tuple[torch.device, torch.dtype], torch.Tensor] = self.__dict__.setdefault("_scratch", {})
        n = like.numel()
        flat = scratch.get(key)
        if flat is None or flat.shape[1] < n:
            flat = scratch[key] = torch.empty((2, n), dtype=like.dtype, device=like.device)
        return flat[0, :n].view(like.shape), flat[1, :n].view(like.shape)

    def _meanfield_step(self, group: dict[str, Any]) -> None:
        """Steps 1-4 of the module docstring for one MeanField tensor, then ``rho = inverse_softplus(sigma)``: the
        paper's operations, regrouped into about 15 elementwise passes over the tensor (fused ``addcdiv`` / ``lerp``
        forms of the same expressions) that write into the states in place and into the optimizer's scratch tensors,
        so that a step allocates no tensor of the weight's size."""
        family: MeanField = group["family"]
        m, rho = family.loc, family.rho
        if m.grad is None:
            return
        lr, beta1, beta2, clip, delta = group["lr"], group["beta1"], group["beta2"], group["clip"], group["delta"]
        state = self.state[m]
        state["step"] += 1
        h, momentum = state["hess"], state["momentum"]
        a, b = self._buffers(m)
        held = family.held_scale(ended=True)
        held_grad = held.grad if held is not None else None
        if rho.grad is not None or held_grad is not None:  # this step's curvature: h_hat = (d loss / d sigma) / sigma
            if rho.grad is None:  # every draw of the step came from the held sigma (rho unchanged since: its value)
                torch.addcdiv(h, held_grad, held, value=-1.0, out=a)  # type: ignore[arg-type]  # h - h_hat
            else:
                torch.ops.aten.softplus.out(rho, 1.0, _SOFTPLUS_THRESHOLD, out=a)  # sigma = softplus(rho)
                # d loss / d sigma = (d loss / d rho) / sigmoid(rho); above softplus's threshold (sigma = rho, slope
                # 1) sigmoid(rho) is within 2.1e-9 of 1 (1 in float32)
                torch.div(rho.grad, torch.sigmoid(rho, out=b), out=b)
                if held_grad is not None:  # some draws from the held sigma, some (after a change of rho) from rho
                    b.add_(held_grad)
                torch.addcdiv(h, b, a, value=-1.0, out=a)  # h - h_hat
            torch.add(h, delta, out=b)  # h + delta before the update
            # beta2 h + (1 - beta2) h_hat = h - (1 - beta2) (h - h_hat), plus (1 - beta2)^2 (h - h_hat)^2 / (2 (h + delta))
            h.sub_(a, alpha=1.0 - beta2).addcdiv_(a.square_(), b, value=0.5 * (1.0 - beta2) ** 2)
            h.clamp_(min=-delta + 1e-12)  # h + delta stays positive (the correction guarantees it up to rounding)
        momentum.lerp_(m.grad, 1.0 - beta1)  # beta1 momentum + (1 - beta1) g
        debias, ess = 1.0 - beta1 ** state["step"], self.ess
        # s = ess (h + delta) = 1 / sigma^2, one pass (a 0-d tensor's broadcast); the mean's step
        # lr (momentum / debias + delta (m - m0)) / (h + delta) = (lr ess / debias) (momentum + debias delta (m - m0)) / s
        s = torch.add(torch.tensor(ess * delta, dtype=h.dtype), h, alpha=ess, out=a)
        if group["prior_loc"]:
            numerator = torch.add(momentum, torch.sub(m, group["prior_loc"], out=b), alpha=debias * delta, out=b)
        else:
            numerator = torch.add(momentum, m, alpha=debias * delta, out=b)
        if clip is None:
            m.addcdiv_(numerator, s, value=-lr * ess / debias)
        else:
            m.sub_(numerator.div_(s).mul_(lr * ess / debias).clamp_(-clip, clip))
        sigma = s.pow_(-0.5)  # rsqrt (the same numbers; pow's kernel was the faster on the CPU)
        # rho = inverse_softplus(sigma): log(expm1(sigma)) (two passes) on the CPU where expm1 cannot overflow (one
        # reduction checks it), else the stable sigma + log(-expm1(-sigma)) (no host synchronisation on a GPU)
        if sigma.device.type == "cpu" and sigma.numel() and float(sigma.amax()) < _EXPM1_SAFE.get(sigma.dtype, 0.0):
            torch.log(torch.expm1(sigma, out=rho), out=rho)
        else:
            torch.add(sigma, torch.neg(sigma, out=b).expm1_().neg_().log_(), out=rho)
        self._hold(family, sigma)

    def state_dict(self) -> dict[str, Any]:
        """torch's optimizer state (the curvature ``hess``, the momentum and the step of every tensor), without the
        family objects the groups hold (plain data: it goes into ``fit``'s checkpoints)."""
        state = super().state_dict()
        for group in state["param_groups"]:
            group.pop("family", None)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s content (the groups' families stay this optimizer's)."""
        families = [group.get("family") for group in self.param_groups]
        super().load_state_dict(state_dict)
        for group, family in zip(self.param_groups, families):
            if family is not None:
                group["family"] = family

    def __repr__(self) -> str:
        count = sum(1 for g in self.param_groups if g["kind"] == "meanfield")
        return f"IVON(ess={self.ess:g}, lr={self.defaults['lr']:g}, {count} MeanField tensors)"

