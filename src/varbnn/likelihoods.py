"""Likelihoods as objects: the training NLL, the Monte Carlo predictive and its metrics, in one place.

A :class:`Likelihood` turns the network's output ``f`` into a distribution over the target ``y``:

* :meth:`Likelihood.nll` -- the batch-mean negative log-likelihood ``-mean_n log p(y_n | f_n)`` of ONE weight draw,
  the data term of the ELBO (:func:`varbnn.train.fit` minimises ``nll + (beta * KL + likelihood.kl()) / N``);
* :meth:`Likelihood.log_predictive` -- per example, the Monte Carlo predictive log-density
  ``log (1/S) sum_s p(y_n | f_s(x_n))`` of ``S`` weight draws (log-sum-exp over the DRAWS, never over examples);
* :meth:`Likelihood.summary` and :meth:`Likelihood.metrics` -- the predictive (probabilities and entropies for
  classification; mean and aleatoric / epistemic variance for regression) and the numbers users report.

``outputs`` of the predictive methods are :func:`varbnn.predict`'s ``[S, N, ...]`` stack of network outputs.
Half-precision (float16 / bfloat16) outputs and targets are computed in float32: log-densities, summaries and
metrics come back in float32 (a squared residual above 256 overflows float16, and batch sums lose digits).

| likelihood | network output per example | p(y given f) |
|---|---|---|
| :class:`Categorical` | ``C`` logits | ``softmax(f)[y]`` |
| :class:`Gaussian` | 1 (or the target's shape) | ``N(y; f, sigma^2)``, sigma fixed or learned |
| :class:`HeteroscedasticGaussian` | 2: mean, log-variance | ``N(y; f_0, exp(f_1) + min_variance)`` |
| :class:`GammaPrecisionGaussian` | 1 | ``N(y; f, 1/tau)``, ``tau ~ q(tau) = Gamma(a, b)``; predictive Student-t |
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Gamma, Normal, StudentT, kl_divergence

from varbnn import metrics as _metrics
from varbnn._checks import as_float_in, as_positive_int, check_class_labels
from varbnn.families.meanfield import inverse_softplus
from varbnn.predict import ClassificationSummary, RegressionSummary, classification_summary

__all__ = [
    "Likelihood", "Categorical", "Gaussian", "HeteroscedasticGaussian", "GammaPrecisionGaussian", "as_likelihood",
    "LIKELIHOOD_NAMES",
]  # fmt: skip


def _wide(values: torch.Tensor) -> torch.Tensor:
    """``values`` in float32 if they are float16 / bfloat16 (or any float narrower than 32 bits), else as they are."""
    if values.is_floating_point() and torch.finfo(values.dtype).bits < 32:
        return values.float()
    return values


def _check_finite(values: torch.Tensor, name: str, owner: str) -> None:
    if values.is_floating_point() and not bool(torch.isfinite(values).all()):
        raise ValueError(f"{owner}: {name} contains NaN or infinite values; the metrics need finite {name}")


class Likelihood(nn.Module):
    """Base class: subclasses implement :meth:`log_prob` (and :meth:`summary`); the rest follows.

    A likelihood may own parameters (a learned noise level): :func:`varbnn.train.fit` then optimises them with the
    network's, and a likelihood with a variational posterior of its own adds :meth:`kl` to the ELBO's KL.
    """

    task: str = ""

    def log_prob(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Per-example ``log p(target | output)`` (nats), shape ``target.shape[:1]`` (summed over any event dims)."""
        raise NotImplementedError

    def nll(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The batch-mean negative log-likelihood of one weight draw (a scalar): the ELBO's data term."""
        return -self.log_prob(output, target).mean()

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Same as :meth:`nll`, so a likelihood can be passed wherever ``nll=`` takes a loss function."""
        return self.nll(output, target)

    def kl(self) -> torch.Tensor:
        """KL of the likelihood's own variational parameters (nats); 0 for point-estimated or fixed ones."""
        ref = next(self.parameters(), None)
        return torch.zeros((), device=ref.device if ref is not None else None)

    def log_predictive(self, outputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Per example, ``log (1/S) sum_s p(target | outputs[s])`` over the ``S`` draws in ``outputs [S, N, ...]``."""
        if outputs.dim() < 2 or outputs.shape[1] != target.shape[0]:
            raise ValueError(
                f"outputs must be [samples, N, ...] with N = {target.shape[0]} (the targets), got {tuple(outputs.shape)}"
            )
        per_draw = torch.stack([self.log_prob(o, target) for o in outputs])  # [S, N]
        return torch.logsumexp(per_draw, dim=0) - math.log(outputs.shape[0])

    def summary(self, outputs: torch.Tensor) -> ClassificationSummary | RegressionSummary:
        """The Monte Carlo predictive of ``outputs [S, N, ...]``."""
        raise NotImplementedError

    def metrics(self, outputs: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
        """The task's metrics of the predictive; ``nll`` is always ``-mean_n log_predictive`` (nats per example)."""
        raise NotImplementedError


class Categorical(Likelihood):
    """``p(y | f) = softmax(f)[y]``: classification with ``C`` logits per example; targets are class indices.

    Metrics: accuracy, NLL, ECE (15 bins), Brier score of the Monte Carlo mean probabilities.
    """

    task = "classification"

    @staticmethod
    def _check(output: torch.Tensor, target: torch.Tensor) -> None:
        if output.dim() != 2 or target.shape != output.shape[:1]:
            raise ValueError(
                f"Categorical: output must be logits [N, classes] and target class indices [N]; got output "
                f"{tuple(output.shape)} and target {tuple(target.shape)}"
            )
        if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
            raise ValueError(
                f"Categorical: target must hold integer class indices (any integer dtype), got dtype {target.dtype} "
                "(regression targets? use likelihood=Gaussian() or HeteroscedasticGaussian())"
            )

    def log_prob(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """``log softmax(f_n)[y_n] = f_{n, y_n} - logsumexp_c f_{n, c}`` per example, for logits ``[N, C]`` and class
        indices ``[N]`` (any integer dtype; half-precision logits in float32)."""
        self._check(output, target)
        return -F.cross_entropy(_wide(output), target.long(), reduction="none")

    def nll(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The batch-mean cross-entropy ``-mean_n log softmax(f_n)[y_n]`` of one weight draw (float32 for
        half-precision logits)."""
        self._check(output, target)
        return F.cross_entropy(_wide(output), target.long())

    def summary(self, outputs: torch.Tensor) -> ClassificationSummary:
        """:func:`varbnn.predict.classification_summary` of ``outputs [S, N, C]`` (in float32 for half precision)."""
        return classification_summary(_wide(outputs))

    def metrics(self, outputs: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
        if outputs.dim() != 3:
            raise ValueError(f"Categorical: outputs must be draws of logits [S, N, classes], got {tuple(outputs.shape)}")
        self._check(outputs[0], target)
        check_class_labels(target, outputs.shape[-1], "target", owner="Categorical")
        probs = self.summary(outputs).probs
        return {
            "accuracy": _metrics.accuracy(probs, target),
            "nll": _metrics.negative_log_likelihood(probs, target),
            "ece": _metrics.expected_calibration_error(probs, target),
            "brier": _metrics.brier_score(probs, target),
        }


def _mean_output(output: torch.Tensor, target: torch.Tensor, owner: str, width: int = 1) -> torch.Tensor:
    """The network's output as the target's shape: ``[N, width]`` outputs for ``[N]`` targets lose their last dim."""
    if width == 1 and output.shape == target.shape:
        return output
    if output.shape == (*target.shape, width):
        return output if width > 1 else output.squeeze(-1)
    expected = f"{tuple(target.shape)} or {(*target.shape, width)}" if width == 1 else f"{(*target.shape, width)}"
    raise ValueError(f"{owner}: output must have shape {expected} for targets {tuple(target.shape)}, got {tuple(output.shape)}")


def _sum_event(log_density: torch.Tensor) -> torch.Tensor:
    return log_density.flatten(1).sum(1) if log_density.dim() > 1 else log_density


def _check_regression_inputs(outputs: torch.Tensor, target: torch.Tensor, owner: str) -> None:
    if outputs.dim() < 2 or outputs.shape[0] == 0 or target.numel() == 0:
        raise ValueError(
            f"{owner}: outputs must be [samples >= 1, N >= 1, ...] draws and target non-empty, got outputs "
            f"{tuple(outputs.shape)} and target {tuple(target.shape)}"
        )
    _check_finite(outputs, "outputs", owner)
    _check_finite(target, "target", owner)


def _regression_metrics(summary: RegressionSummary, log_predictive: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    mean = summary.mean.reshape(target.shape) if summary.mean.numel() == target.numel() else summary.mean
    return {
        "rmse": _metrics.rmse(mean, target),
        "nll": float(-log_predictive.mean()),
        "mean_predictive_std": float(summary.variance.sqrt().mean()),
    }


class Gaussian(Likelihood):
    """Homoscedastic ``p(y | f) = N(y; f, sigma^2)``.

    The network outputs one number per target (shape ``target.shape`` or ``(*target.shape, 1)``). Predictive:
    mean ``mean_s f_s``, aleatoric variance ``sigma^2``, epistemic variance ``var_s f_s``.

    :param noise_std: a fixed sigma > 0; or ``None`` (default) to learn it: a point estimate that maximises the ELBO,
        parameterised as ``log sigma`` (an ``nn.Parameter``, so :func:`varbnn.train.fit` optimises it).
    :param init_noise_std: sigma's starting value when learned (default 1: the std of standardised targets).
    """

    task = "regression"

    def __init__(self, noise_std: float | None = None, *, init_noise_std: float = 1.0) -> None:
        super().__init__()
        self.learn_noise = noise_std is None
        start = as_float_in(init_noise_std, "init_noise_std", 0.0, None, low_open=True, owner="Gaussian")
        if noise_std is not None:
            start = as_float_in(noise_std, "noise_std", 0.0, None, low_open=True, owner="Gaussian")
        log_std = torch.tensor(math.log(start))
        if self.learn_noise:
            self.log_noise_std = nn.Parameter(log_std)
        else:
            self.register_buffer("log_noise_std", log_std)

    @property
    def noise_std(self) -> torch.Tensor:
        """sigma, ``exp(log_noise_std)`` (a 0-d tensor; learned or fixed)."""
        return self.log_noise_std.exp()

    def log_prob(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """``log N(y; f, sigma^2) = -(y - f)^2 / (2 sigma^2) - log sigma - log(2 pi) / 2`` per example (summed over
        any event dims)."""
        mean, target = _mean_output(_wide(output), _wide(target), "Gaussian"), _wide(target)
        # validate_args=False: the checks read device values (a wait per step on a GPU); the std is positive by
        # construction and fit checks the targets
        return _sum_event(Normal(mean, self.noise_std, validate_args=False).log_prob(target))

    def summary(self, outputs: torch.Tensor) -> RegressionSummary:
        """Predictive mean, aleatoric variance ``sigma^2`` and epistemic variance ``var_s f_s`` of ``outputs [S, N, ...]``."""
        outputs = _wide(outputs)
        means = outputs.squeeze(-1) if outputs.shape[-1] == 1 and outputs.dim() > 2 else outputs
        noise = self.noise_std.detach().square().to(means.dtype)
        return RegressionSummary(means.mean(0), noise.expand_as(means[0]), means.var(0, unbiased=False))

    def metrics(self, outputs: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
        """RMSE of the predictive mean, the predictive NLL and the mean predictive std (finite inputs only)."""
        _check_regression_inputs(outputs, target, "Gaussian")
        summary = self.summary(outputs)
        return _regression_metrics(summary, self.log_predictive(outputs, target), target)

    def extra_repr(self) -> str:
        return f"noise_std={float(self.noise_std.detach()):.4g}, learned={self.learn_noise}"


class HeteroscedasticGaussian(Likelihood):
    """``p(y | f) = N(y; f_0, exp(f_1) + min_variance)``: the network outputs a mean and a log-variance per target
    (last dim of size 2), so the noise level depends on the input (Nix & Weigend 1994; Kendall & Gal 2017).

    Predictive: mean ``mean_s f_0``, aleatoric variance ``mean_s sigma_s^2``, epistemic variance ``var_s f_0``.

    :param min_variance: a floor added to ``exp(f_1)`` (default 1e-6) so that the NLL stays finite when the network
        drives the log-variance to -inf on a point it fits exactly.
    """

    task = "regression"

    def __init__(self, min_variance: float = 1e-6) -> None:
        super().__init__()
        self.min_variance = as_float_in(min_variance, "min_variance", 0.0, None, low_open=True, owner="HeteroscedasticGaussian")

    def _split(self, output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        both = _mean_output(_wide(output), target, "HeteroscedasticGaussian", width=2)
        return both[..., 0], both[..., 1].exp() + self.min_variance

    def log_prob(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """``log N(y; f_0, v) = -(y - f_0)^2 / (2 v) - log(v) / 2 - log(2 pi) / 2`` with ``v = exp(f_1) + min_variance``,
        per example (summed over any event dims)."""
        mean, variance = self._split(output, target)
        return _sum_event(Normal(mean, variance.sqrt(), validate_args=False).log_prob(_wide(target)))  # (see Gaussian)

    def summary(self, outputs: torch.Tensor) -> RegressionSummary:
        """Predictive mean, aleatoric variance ``mean_s sigma_s^2`` and epistemic variance of ``outputs [S, N, ..., 2]``."""
        outputs = _wide(outputs)
        if outputs.dim() < 3 or outputs.shape[-1] != 2:
            raise ValueError(f"HeteroscedasticGaussian: outputs must be [samples, N, ..., 2], got {tuple(outputs.shape)}")
        means, variances = outputs[..., 0], outputs[..., 1].exp() + self.min_variance
        return RegressionSummary(means.mean(0), variances.mean(0), means.var(0, unbiased=False))

    def metrics(self, outputs: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
        """RMSE of the predictive mean, the predictive NLL and the mean predictive std (finite inputs only)."""
        _check_regression_inputs(outputs, target, "HeteroscedasticGaussian")
        return _regression_metrics(self.summary(outputs), self.log_predictive(outputs, target), target)

    def extra_repr(self) -> str:
        return f"min_variance={self.min_variance:g}"


class GammaPrecisionGaussian(Likelihood):
    """Gaussian likelihood ``y ~ N(f, 1/tau)`` whose noise precision has a Gamma prior and a Gamma variational
    posterior (Hernandez-Lobato & Adams 2015; Oh et al. 2020, section 5.1).

    ``expected_log_likelihood(y, f) = E_q[log N(y | f, 1/tau)] = (psi(a1) - log b1)/2 - log(2 pi)/2 - a1/b1 (y-f)^2/2``
    is what the ELBO needs; :meth:`kl` is KL(q(tau) || p(tau)).

    Two ways to fit q(tau): by gradient (its parameters in the optimizer), or in closed form with
    :meth:`observe` and :meth:`update_posterior_`. Given q(w), the ELBO's optimum over q(tau) is conjugate:
    ``Gamma(a0 + N/2, b0 + E_q(w)[SSE]/2)`` (:meth:`optimal_posterior`). The gradient route is slow in practice:
    Adam moves each softplus-parameter by about ``lr`` per step, so the shape climbs from a0 = 6 to a0 + N/2
    (e.g. 144 for yacht) only over tens of thousands of steps, and the noise is overestimated meanwhile.

    :param prior_shape: a0 of the prior Gamma(a0, b0) over tau (default 6 as in the papers; the published RDP code
        uses 1).
    :param prior_rate: b0, the prior's rate (default 6; the published RDP code uses 1).
    :param init_shape: a1 of the initial posterior Gamma(a1, b1) (default: ``prior_shape``).
    :param init_rate: b1 of the initial posterior (default: ``prior_rate``).
    """

    task = "regression"
    mean_square: torch.Tensor

    prior_shape: torch.Tensor
    prior_rate: torch.Tensor

    def __init__(
        self, prior_shape: float = 6.0, prior_rate: float = 6.0, init_shape: float | None = None, init_rate: float | None = None
    ) -> None:
        super().__init__()
        owner = "GammaPrecisionGaussian"
        shape0 = as_float_in(prior_shape, "prior_shape", 0.0, None, low_open=True, owner=owner)
        rate0 = as_float_in(prior_rate, "prior_rate", 0.0, None, low_open=True, owner=owner)
        shape1 = shape0 if init_shape is None else as_float_in(init_shape, "init_shape", 0.0, None, low_open=True, owner=owner)
        rate1 = rate0 if init_rate is None else as_float_in(init_rate, "init_rate", 0.0, None, low_open=True, owner=owner)
        self.register_buffer("prior_shape", torch.tensor(shape0))
        self.register_buffer("prior_rate", torch.tensor(rate0))
        self.shape_rho = nn.Parameter(torch.tensor(inverse_softplus(shape1)))
        self.rate_rho = nn.Parameter(torch.tensor(inverse_softplus(rate1)))
        self.register_buffer("mean_square", torch.tensor(float("nan")))  # running E_q[(y - f)^2] (closed form)

    @property
    def shape(self) -> torch.Tensor:
        """a1, the posterior's shape, ``softplus(shape_rho)``."""
        return F.softplus(self.shape_rho)

    @property
    def rate(self) -> torch.Tensor:
        """b1, the posterior's rate, ``softplus(rate_rho)``."""
        return F.softplus(self.rate_rho)

    def posterior(self) -> Gamma:
        """q(tau) = Gamma(a1, b1) as a ``torch.distributions.Gamma`` (rate parameterisation; mean a1 / b1)."""
        return Gamma(self.shape, self.rate)

    def expected_log_likelihood(self, y: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        """Elementwise ``E_q(tau)[log N(y | f, 1/tau)] = (psi(a1) - log b1) / 2 - log(2 pi) / 2 - (a1 / b1) (y - f)^2 / 2``
        (nats), from ``E[log tau] = psi(a1) - log b1`` and ``E[tau] = a1 / b1`` (float32 for half-precision inputs)."""
        if y.shape != f.shape:
            raise ValueError(f"y and f must have the same shape, got {tuple(y.shape)} and {tuple(f.shape)}")
        y, f = _wide(y), _wide(f)
        a, b = self.shape, self.rate
        return 0.5 * (torch.digamma(a) - b.log()) - 0.5 * math.log(2 * math.pi) - 0.5 * (a / b) * (y - f).square()

    def nll(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """``-mean_n E_q(tau)[log N(y_n | f_n, 1/tau)]``: the ELBO's data term (with :meth:`kl` in the KL)."""
        mean = _mean_output(output, target, "GammaPrecisionGaussian")
        return -_sum_event(self.expected_log_likelihood(target, mean)).mean()

    def _marginal(self, mean: torch.Tensor) -> StudentT:
        a, b = self.shape.detach().to(mean.dtype), self.rate.detach().to(mean.dtype)
        return StudentT(2 * a, mean, (b / a).sqrt())

    def log_prob(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """``log int N(y | f, 1/tau) q(tau) dtau``: with q(tau) = Gamma(a, b) a Student-t with ``2a`` degrees of
        freedom, location ``f`` and scale ``sqrt(b / a)`` (the predictive integrates tau exactly)."""
        mean = _mean_output(_wide(output), target, "GammaPrecisionGaussian")
        return _sum_event(self._marginal(mean).log_prob(_wide(target)))

    def summary(self, outputs: torch.Tensor) -> RegressionSummary:
        """Predictive mean, aleatoric variance ``E_q[1/tau] = b1 / (a1 - 1)`` (inf for a1 <= 1) and epistemic
        variance of ``outputs [S, N, ...]``."""
        outputs = _wide(outputs)
        means = outputs.squeeze(-1) if outputs.shape[-1] == 1 and outputs.dim() > 2 else outputs
        a, b = float(self.shape.detach()), float(self.rate.detach())
        noise = b / (a - 1) if a > 1 else float("inf")  # E_q[1/tau]
        aleatoric = torch.full_like(means[0], noise)
        return RegressionSummary(means.mean(0), aleatoric, means.var(0, unbiased=False))

    def metrics(self, outputs: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
        """RMSE of the predictive mean, the predictive NLL and the mean predictive std (finite inputs only)."""
        _check_regression_inputs(outputs, target, "GammaPrecisionGaussian")
        return _regression_metrics(self.summary(outputs), self.log_predictive(outputs, target), target)

    def kl(self) -> torch.Tensor:
        """KL(Gamma(a1, b1) || Gamma(a0, b0)) in nats, in closed form (torch's registered pair):
        ``(a1 - a0) psi(a1) - lgamma(a1) + lgamma(a0) + a0 (log b1 - log b0) + a1 (b0 - b1) / b1``."""
        posterior = Gamma(self.shape, self.rate, validate_args=False)  # positive by construction; no device read
        return kl_divergence(posterior, Gamma(self.prior_shape, self.prior_rate, validate_args=False))

    def optimal_posterior(self, expected_sse: torch.Tensor | float, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The q(tau) = Gamma(a, b) that maximises the ELBO given ``expected_sse = E_q(w)[sum_n (y_n - f_n)^2]`` over
        ``n`` training points: ``a = a0 + n/2``, ``b = b0 + expected_sse/2``."""
        n = as_positive_int(n, "n (the number of training points)", owner="GammaPrecisionGaussian")
        sse = torch.as_tensor(expected_sse, dtype=self.prior_rate.dtype, device=self.prior_rate.device)
        if not bool(torch.isfinite(sse)) or float(sse) < 0:
            raise ValueError(f"expected_sse must be finite and >= 0, got {float(sse)!r}")
        return self.prior_shape + n / 2, self.prior_rate + sse / 2

    @torch.no_grad()
    def set_posterior_(self, shape: torch.Tensor | float, rate: torch.Tensor | float) -> None:
        """Set q(tau) = Gamma(shape, rate) (both > 0)."""
        shape_t, rate_t = torch.as_tensor(shape, dtype=self.shape_rho.dtype), torch.as_tensor(rate, dtype=self.rate_rho.dtype)
        if not (bool(torch.isfinite(shape_t)) and bool(torch.isfinite(rate_t)) and shape_t > 0 and rate_t > 0):
            raise ValueError(f"shape and rate must be finite and > 0, got {float(shape_t)!r}, {float(rate_t)!r}")
        self.shape_rho.copy_(inverse_softplus(shape_t))
        self.rate_rho.copy_(inverse_softplus(rate_t))

    @torch.no_grad()
    def observe(self, y: torch.Tensor, f: torch.Tensor, decay: float) -> None:
        """Fold a batch's mean squared residual (f one draw of the network: unbiased for E_q(w)) into the running
        mean ``mean_square`` with ``mean <- decay * mean + (1 - decay) * batch`` (the first batch sets it)."""
        decay = as_float_in(decay, "decay", 0.0, 1.0, high_open=True, owner="GammaPrecisionGaussian.observe")
        if y.shape != f.shape:
            raise ValueError(f"y and f must have the same shape, got {tuple(y.shape)} and {tuple(f.shape)}")
        if y.numel() == 0:
            raise ValueError("GammaPrecisionGaussian.observe: y and f must hold at least one value, got empty tensors")
        batch = (_wide(y) - _wide(f)).square().mean().to(self.mean_square.dtype)
        if not torch.isfinite(batch):
            raise ValueError(
                "observe: the batch's squared residual is not finite (NaN or inf in y or f); the running mean is left as it was"
            )
        if torch.isnan(self.mean_square):
            self.mean_square.copy_(batch)
        else:
            self.mean_square.mul_(decay).add_((1 - decay) * batch)

    @torch.no_grad()
    def update_posterior_(self, n: int) -> None:
        """Set q(tau) to :meth:`optimal_posterior` with ``E[SSE] = n * mean_square`` (after :meth:`observe`)."""
        if torch.isnan(self.mean_square):
            raise RuntimeError("update_posterior_ needs observe() first: no residuals have been seen")
        shape, rate = self.optimal_posterior(n * self.mean_square, n)
        self.set_posterior_(shape, rate)

    def sample_precision(self, n: int) -> torch.Tensor:
        """``n`` draws of tau from the posterior (no gradient)."""
        with torch.no_grad():
            return self.posterior().sample((n,))

    def extra_repr(self) -> str:
        shape, rate = (float(torch.as_tensor(v).detach()) for v in (self.prior_shape, self.prior_rate))
        return f"prior=Gamma({shape:g}, {rate:g})"


LIKELIHOOD_NAMES: dict[str, type[Likelihood]] = {
    "categorical": Categorical, "gaussian": Gaussian, "heteroscedastic": HeteroscedasticGaussian,
    "gamma-precision": GammaPrecisionGaussian,
}  # fmt: skip
"""The likelihoods by the names :func:`as_likelihood` (and :func:`varbnn.objectives.default_kl_weight`) read."""


def as_likelihood(value: Likelihood | str) -> Likelihood:
    """A :class:`Likelihood` from itself or a name: ``"categorical"``, ``"heteroscedastic"``. Names of likelihoods
    with learned parameters (``"gaussian"``, ``"gamma-precision"``) are refused: the learned noise lives in the object,
    so create it and pass the same object to training and evaluation."""
    if isinstance(value, Likelihood):
        return value
    names = LIKELIHOOD_NAMES
    if isinstance(value, str) and value in names:
        made = names[value]()
        if any(p.requires_grad for p in made.parameters()):
            raise ValueError(
                f"likelihood={value!r} learns parameters (its noise) that evaluation needs afterwards: create it, e.g. "
                f"lik = varbnn.likelihoods.{type(made).__name__}(), and pass likelihood=lik to fit and to evaluate"
            )
        return made
    raise ValueError(f"likelihood must be a varbnn.likelihoods.Likelihood or one of {sorted(names)}, got {value!r}")
