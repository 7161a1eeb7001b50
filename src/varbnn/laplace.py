"""Last-layer Laplace approximation for a trained classifier (the post-hoc baseline of Daxberger et al. 2021).

The network is kept at its trained (MAP) weights except the last ``nn.Linear``, whose parameters
``theta = vec(W~)``, ``W~ = [W, b]`` (``C x D``, row-major; ``D`` counts the bias column), get a Gaussian posterior

    q(theta) = N(theta*, P^-1),   P = A (x) G + delta I,

with the generalized Gauss-Newton of the summed cross-entropy in its Kronecker-factored (KFAC) form
(Ritter, Botev & Barber 2018, "A Scalable Laplace Approximation for Neural Networks", eq. 7-8; Martens & Grosse
2015) and an isotropic prior ``N(0, delta^-1 I)``. With features ``phi~_n = [phi(x_n), 1]`` (the input of the last
layer, the 1 only when it has a bias) and softmax probabilities ``p_n`` the exact GGN is

    H = sum_n Lambda_n (x) phi~_n phi~_n^T,        Lambda_n = diag(p_n) - p_n p_n^T,

because the logits ``f_n = W~ phi~_n`` have the Jacobian ``J_n = I_C (x) phi~_n^T`` w.r.t. ``vec(W~)`` and the
cross-entropy's Hessian w.r.t. the logits is ``Lambda_n``; the logits are linear in ``theta``, so the GGN IS the
Hessian. KFAC factorises the expectation:

    H ~= A (x) G,   A = sum_n Lambda_n (C x C),   G = (1/N) sum_n phi~_n phi~_n^T (D x D),

exact for ``N = 1``. (Here ``A`` is the output-side factor, as in the Laplace Redux notation; Martens & Grosse call
the input-side factor ``A``.) With ``A = U_A diag(a) U_A^T`` and ``G = U_G diag(g) U_G^T``:

    P^-1 = (U_A (x) U_G) diag(1 / (a_i g_j + delta)) (U_A (x) U_G)^T,
    W~_s = W~* + U_A [E_s * (a g^T + delta)^(-1/2)] U_G^T,   E_s ~ N(0, I_{C x D}),

(row-major ``vec(X M Y^T) = (X (x) Y) vec(M)``), and the Laplace evidence (Daxberger et al. 2021, eq. 4; MacKay 1992)

    log Z(delta) = log p(D | theta*) - delta/2 ||theta*||^2 + (CD/2) log delta - 1/2 sum_ij log(a_i g_j + delta),

which is the full Laplace approximation of ``log p(D | delta)`` (the ``2 pi`` terms of prior and Gaussian integral
cancel) with the KFAC Hessian. The prior precision is chosen by maximising it over a grid (laplace-torch's default,
``method="marglik"``) or by the validation NLL of the Monte Carlo predictive (``method="validation"``).

Daxberger, Kristiadi, Immer, Eschenhagen, Bauer, Hennig (2021), "Laplace Redux -- Effortless Bayesian Deep
Learning", NeurIPS. :class:`LastLayerLaplace` plugs into :func:`varbnn.predict` through ``predictive_draws``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from varbnn._checks import as_float_in, check_batch, check_class_labels

__all__ = ["LastLayerLaplace"]

_DEFAULT_GRID = (-4.0, 4.0, 81)  # log10 range and number of points of the default prior-precision grid


def _check_precision(value: float, name: str = "prior_precision") -> float:
    """``value`` as a finite Python float > 0 (numbers, NumPy scalars, 0-d tensors; not bools or strings)."""
    return as_float_in(value, name, 0.0, None, low_open=True)


def _is_integer_labels(labels: object) -> bool:
    return isinstance(labels, torch.Tensor) and not (
        labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool
    )


class LastLayerLaplace(nn.Module):
    """KFAC last-layer Laplace approximation around a trained classifier ``model`` (see the module docstring).

    Usage:

        la = LastLayerLaplace(net).fit(train_loader)
        la.optimize_prior_precision()
        logits = varbnn.predict(la, x_test, samples=32)   # [32, N, C]

    ``forward`` returns the MAP logits (``model(x)``). The layers before the last run in whatever mode the model is
    in (call ``.eval()`` for dropout / batch norm; :meth:`fit` itself always runs in eval mode).

    :param model: a trained network mapping inputs to logits ``[N, C]``; its output must be the output of its LAST
        ``nn.Linear`` (the last one met in ``model.modules()``), e.g. no softmax after it. The model is shared,
        not copied: changing its weights after :meth:`fit` makes the fit stale.
    :param prior_precision: ``delta`` of the prior ``N(0, delta^-1 I)`` on the last layer's weights and bias (> 0);
        :meth:`optimize_prior_precision` replaces it.
    """

    # varbnn.fit refuses this class with this message (a declaration, so that the training loop imports no baseline)
    _varbnn_fit_refusal = (
        "fit(LastLayerLaplace) would leave the fitted curvature stale: train the plain network with fit, then "
        "build LastLayerLaplace(network).fit(loader)"
    )

    #: Largest number of last-layer parameters :meth:`posterior_covariance` builds densely (a 5,000 x 5,000
    #: float64 matrix is 200 MB).
    max_dense_parameters: int = 5_000

    output_factor: torch.Tensor | None
    input_factor: torch.Tensor | None

    def __init__(self, model: nn.Module, prior_precision: float = 1.0) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        linears: list[tuple[str, nn.Linear]] = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        if not linears:
            raise ValueError(
                f"model ({type(model).__name__}) has no nn.Linear layer; LastLayerLaplace needs a classifier whose "
                "output is the output of its last nn.Linear"
            )
        self.model = model
        self.layer_name: str = linears[-1][0]  # "" when model is itself an nn.Linear
        self._prior_precision = _check_precision(prior_precision)
        self.num_data = 0
        self.log_likelihood = float("nan")
        self.output_factor = None  # A = sum_n Lambda_n, C x C, float64
        self.input_factor = None  # G = (1/N) sum_n phi~_n phi~_n^T, D x D, float64
        self._map: torch.Tensor | None = None  # W~* = [W, b], C x D, float64
        self._eig: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # a, U_A, g, U_G

    @property
    def layer(self) -> nn.Linear:
        """The last ``nn.Linear`` of the model (looked up by name, so it is not registered twice in ``state_dict``)."""
        layer = self.model.get_submodule(self.layer_name)
        assert isinstance(layer, nn.Linear)
        return layer

    @property
    def prior_precision(self) -> float:
        """``delta`` of the prior ``N(0, delta^-1 I)`` (a finite number > 0; checked when set)."""
        return self._prior_precision

    @prior_precision.setter
    def prior_precision(self, value: float) -> None:
        self._prior_precision = _check_precision(value)

    # ------------------------------------------------------------------ features
    def _features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits, phi~)``: one forward pass of the model, the last layer's input captured by a hook."""
        captured: dict[str, torch.Tensor] = {}

        def hook(_module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            captured["input"], captured["output"] = inputs[0], output

        handle = self.layer.register_forward_hook(hook)
        try:
            logits = self.model(x.to(self.layer.weight.device))
        finally:
            handle.remove()
        where = f"the last nn.Linear ({self.layer_name!r}, {self.layer.in_features} -> {self.layer.out_features})"
        if "output" not in captured:
            raise ValueError(f"{where} was not called by model(x); its output must be the model's output (the logits)")
        output = captured["output"]
        if not isinstance(logits, torch.Tensor) or logits.shape != output.shape or (
            logits is not output and not bool(((logits == output) | (logits.isnan() & output.isnan())).all())
        ):  # (NaN-aware: NaN logits are reported below as what they are)
            raise ValueError(
                f"the model's output is not the output of {where}; LastLayerLaplace requires the model to return that "
                "layer's output (the logits) unchanged, e.g. no softmax or other layer after it"
            )
        if logits.dim() != 2:
            raise ValueError(f"the model must return logits of shape [N, C], got shape {tuple(logits.shape)}")
        if not torch.isfinite(logits).all():
            if x.is_floating_point() and not bool(torch.isfinite(x).all()):
                raise ValueError("the inputs x hold NaN or inf values: LastLayerLaplace needs finite inputs")
            raise ValueError("the model's logits contain NaN or infinite values (the inputs are finite: check the "
                             "model's parameters with torch.isfinite)")
        phi = captured["input"]
        if self.layer.bias is not None:
            phi = torch.cat([phi, phi.new_ones(phi.shape[0], 1)], dim=1)
        return logits, phi

    def _layer_parameters(self) -> torch.Tensor:
        """``W~ = [W, b]`` in float64, ``C x D``."""
        weight = self.layer.weight.detach().double()
        if self.layer.bias is None:
            return weight.clone()
        return torch.cat([weight, self.layer.bias.detach().double().unsqueeze(1)], dim=1)

    # ------------------------------------------------------------------ fitting
    @torch.no_grad()
    def fit(self, loader: Iterable[Sequence[torch.Tensor]]) -> LastLayerLaplace:
        """Accumulate the KFAC factors ``A = sum_n Lambda_n`` and ``G = (1/N) sum_n phi~_n phi~_n^T`` (float64), the
        number of examples ``N`` and ``log p(D | theta*) = -sum_n CE(f_n, y_n)`` over ``loader`` (batches ``(x, y)``,
        ``y`` integer class labels of any integer dtype, in ``[0, C)``), then eigendecompose both factors. Features and
        logits of a float16 / bfloat16 model are accumulated in float64 like any other.

        Cost: ONE forward pass over the data in eval mode without gradients, plus ``O(N (C^2 + D^2))`` for the
        factors and ``O(C^3 + D^3)`` for the eigendecompositions. Returns ``self``.
        """
        was_training = self.model.training
        self.model.eval()
        try:
            total_a: torch.Tensor | None = None
            total_g: torch.Tensor | None = None
            count = 0
            log_likelihood = 0.0
            for index, batch in enumerate(loader):
                x, y = check_batch(batch, index, "LastLayerLaplace.fit")
                if not _is_integer_labels(y):
                    kind = y.dtype if isinstance(y, torch.Tensor) else type(y).__name__
                    raise ValueError(f"labels y must be an integer tensor of class indices (any integer dtype), got {kind}")
                logits, phi = self._features(x)
                classes = logits.shape[1]
                if y.shape != logits.shape[:1]:
                    raise ValueError(f"labels y must have shape [N] = {tuple(logits.shape[:1])}, got {tuple(y.shape)}")
                y = y.to(device=logits.device, dtype=torch.long)
                if y.numel() and (int(y.min()) < 0 or int(y.max()) >= classes):
                    raise ValueError(f"labels y must lie in [0, {classes}), got values in [{int(y.min())}, {int(y.max())}]")
                logits64, phi64 = logits.double(), phi.double()
                probs = torch.softmax(logits64, dim=1)
                batch_a = torch.diag(probs.sum(0)) - probs.T @ probs  # sum_n diag(p_n) - p_n p_n^T
                batch_g = phi64.T @ phi64  # sum_n phi~_n phi~_n^T
                total_a = batch_a if total_a is None else total_a + batch_a
                total_g = batch_g if total_g is None else total_g + batch_g
                log_likelihood -= float(F.cross_entropy(logits64, y, reduction="sum"))
                count += int(x.shape[0])
        finally:
            self.model.train(was_training)
        if count == 0 or total_a is None or total_g is None:
            raise ValueError("loader yielded no examples; fit needs at least one (x, y) batch with data")
        self.num_data = count
        self.log_likelihood = log_likelihood
        self.output_factor = total_a
        self.input_factor = total_g / count
        self._map = self._layer_parameters()
        a, u_a = torch.linalg.eigh(self.output_factor)
        g, u_g = torch.linalg.eigh(self.input_factor)
        # both factors are positive semi-definite (A has rank C - 1: its rows sum to 0); clip round-off negatives
        self._eig = (a.clamp_min(0.0), u_a, g.clamp_min(0.0), u_g)
        return self

    def _fitted(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._eig is None:
            raise RuntimeError("LastLayerLaplace is not fitted: call .fit(train_loader) first")
        return self._eig

    @property
    def num_parameters(self) -> int:
        """``P = C * D``: the number of last-layer parameters (weights and bias) with a posterior."""
        return self.layer.out_features * (self.layer.in_features + (self.layer.bias is not None))

    # ------------------------------------------------------------------ evidence
    def log_marginal_likelihood(self, prior_precision: float | None = None) -> float:
        """Laplace evidence ``log Z(delta) = log p(D|theta*) - delta/2 ||theta*||^2 + (P/2) log delta
        - 1/2 sum_ij log(a_i g_j + delta)`` (Daxberger et al. 2021, eq. 4, with the KFAC Hessian; ``P = C D``) at
        ``prior_precision`` (default: the current one)."""
        a, _, g, _ = self._fitted()
        delta = self.prior_precision if prior_precision is None else _check_precision(prior_precision)
        assert self._map is not None
        log_det = torch.log(torch.outer(a, g) + delta).sum()
        value = (
            self.log_likelihood
            - 0.5 * delta * float(self._map.pow(2).sum())
            + 0.5 * self.num_parameters * math.log(delta)
            - 0.5 * float(log_det)
        )
        return value

    def optimize_prior_precision(
        self,
        grid: Sequence[float] | torch.Tensor | None = None,
        *,
        method: Literal["marglik", "validation"] = "marglik",
        x_val: torch.Tensor | None = None,
        y_val: torch.Tensor | None = None,
        samples: int = 64,
        seed: int = 0,
    ) -> float:
        """Choose ``delta`` on ``grid`` (default ``10^-4 .. 10^4``, 81 log-spaced points), store it as
        ``self.prior_precision`` and return it (the first best grid point on ties).

        ``method="marglik"`` (default, as laplace-torch): maximise :meth:`log_marginal_likelihood`; costs
        ``O(len(grid) C D)``, no data pass. ``method="validation"``: minimise the validation NLL
        ``-1/M sum_m log (1/S sum_s softmax(f_s(x_m))[y_m])`` of the Monte Carlo predictive with ``samples`` draws
        from the same seeded stream for every grid point (common random numbers; the same draws as
        ``varbnn.predict(self, x_val, samples, seed=seed)``, kept in float64 here whatever the model's dtype). The
        features of ``x_val`` are computed once; ``y_val`` holds class indices in ``[0, C)`` (any integer dtype).
        """
        self._fitted()
        if grid is None:
            low, high, count = _DEFAULT_GRID
            values = torch.logspace(low, high, int(count), dtype=torch.float64).tolist()
        else:
            values = [float(v) for v in (grid.flatten().tolist() if isinstance(grid, torch.Tensor) else grid)]
            if not values:
                raise ValueError("grid must contain at least one prior precision")
            for v in values:
                _check_precision(v, "every grid value")
        if method == "marglik":
            scores = [self.log_marginal_likelihood(v) for v in values]
        elif method == "validation":
            if x_val is None or y_val is None:
                raise ValueError('method="validation" needs x_val and y_val')
            if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
                raise ValueError(f"samples must be a positive integer, got {samples!r}")
            if not _is_integer_labels(y_val):
                kind = y_val.dtype if isinstance(y_val, torch.Tensor) else type(y_val).__name__
                raise ValueError(f"y_val must be an integer tensor of class indices (any integer dtype), got {kind}")
            if isinstance(x_val, torch.Tensor) and x_val.dim() > 0 and x_val.shape[0] == 0:
                raise ValueError(f"x_val must hold at least one example, got shape {tuple(x_val.shape)}")
            with torch.no_grad():
                logits, phi = self._features(x_val)
            if y_val.shape != logits.shape[:1]:
                raise ValueError(f"y_val must have shape [N] = {tuple(logits.shape[:1])}, got {tuple(y_val.shape)}")
            check_class_labels(y_val, logits.shape[1], "y_val")
            y_val = y_val.to(device=logits.device, dtype=torch.long)
            scores = []
            for v in values:
                devices = [logits.device] if logits.device.type == "cuda" else []
                with torch.random.fork_rng(devices=devices):
                    torch.manual_seed(seed)
                    draws = self._draws_from_features(logits, phi, samples, v, dtype=torch.float64)
                log_probs = torch.log_softmax(draws, dim=-1).gather(-1, y_val.expand(samples, -1).unsqueeze(-1))
                predictive = torch.logsumexp(log_probs.squeeze(-1), dim=0) - math.log(samples)
                scores.append(float(predictive.mean()))  # mean log-likelihood: maximise = minimise the NLL
        else:
            raise ValueError(f'method must be "marglik" or "validation", got {method!r}')
        best = max(range(len(values)), key=lambda i: (scores[i], -i))
        self.prior_precision = values[best]
        return self.prior_precision

    # ------------------------------------------------------------------ posterior
    def _scale(self, prior_precision: float) -> torch.Tensor:
        """``(a g^T + delta)^(-1/2)``, ``C x D``."""
        a, _, g, _ = self._fitted()
        return (torch.outer(a, g) + prior_precision).rsqrt()

    def posterior_covariance(self) -> torch.Tensor:
        """Dense ``P^-1 = (U_A (x) U_G) diag(1/(a_i g_j + delta)) (U_A (x) U_G)^T`` (``CD x CD``, float64, row-major
        ``vec(W~)``). Refuses above :attr:`max_dense_parameters` parameters (use :meth:`posterior_variance` or
        :meth:`sample_parameters` instead)."""
        a, u_a, g, u_g = self._fitted()
        if self.num_parameters > self.max_dense_parameters:
            raise ValueError(
                f"posterior_covariance is dense ({self.num_parameters} x {self.num_parameters}); it is built only up to "
                f"max_dense_parameters = {self.max_dense_parameters} last-layer parameters. Use posterior_variance() "
                "or sample_parameters() instead"
            )
        basis = torch.kron(u_a, u_g)
        inverse = 1.0 / (torch.outer(a, g) + self.prior_precision).flatten()
        return (basis * inverse) @ basis.T

    def posterior_variance(self) -> torch.Tensor:
        """Marginal variances of ``W~`` (``C x D``, float64): ``Var W~_cd = sum_ij U_A[c,i]^2 U_G[d,j]^2 / (a_i g_j
        + delta)``, the diagonal of :meth:`posterior_covariance` without building it."""
        _, u_a, _, u_g = self._fitted()
        return u_a.pow(2) @ self._scale(self.prior_precision).pow(2) @ u_g.pow(2).T

    @property
    def posterior_mean(self) -> torch.Tensor:
        """``W~* = [W, b]`` at fit time (``C x D``, float64)."""
        self._fitted()
        assert self._map is not None
        return self._map

    def _perturbations(self, samples: int, prior_precision: float) -> torch.Tensor:
        """``U_A [E_s * (a g^T + delta)^(-1/2)] U_G^T`` for ``s < samples``: ``[samples, C, D]`` float64 draws of
        ``W~ - W~*`` (``E`` from torch's global RNG)."""
        _, u_a, _, u_g = self._fitted()
        scale = self._scale(prior_precision)
        noise = torch.randn(samples, *scale.shape, dtype=torch.float64, device=scale.device)
        return u_a @ (noise * scale) @ u_g.T

    def sample_parameters(self, samples: int) -> torch.Tensor:
        """``samples`` posterior draws of ``W~ = [W, b]``: ``[samples, C, D]`` float64 (torch's global RNG)."""
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ValueError(f"samples must be a positive integer, got {samples!r}")
        return self.posterior_mean + self._perturbations(samples, self.prior_precision)

    # ------------------------------------------------------------------ prediction
    def _draws_from_features(
        self, logits: torch.Tensor, phi: torch.Tensor, samples: int, prior_precision: float, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        """``[S, N, C]`` logit draws in ``dtype`` (default the logits' dtype, float32 for float16 / bfloat16 logits,
        whose range a wide posterior overflows); summed in float64 first."""
        perturbations = self._perturbations(samples, prior_precision).to(phi.device)  # [S, C, D]
        noise = torch.einsum("nd,scd->snc", phi.double(), perturbations)
        if dtype is None:
            dtype = logits.dtype if torch.finfo(logits.dtype).bits >= 32 else torch.float32
        return (logits.double().unsqueeze(0) + noise).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The MAP logits ``model(x)``."""
        return self.model(x)

    @torch.no_grad()
    def predictive_draws(self, x: torch.Tensor, samples: int) -> torch.Tensor:
        """Logits of ``samples`` last-layer draws, ``[samples, N, C]``: ``f_s(x) = W~_s phi~(x)``, computed as the MAP
        logits plus ``(W~_s - W~*) phi~(x)`` (in the model's dtype; float32 for a float16 / bfloat16 model, whose
        range the draws of a wide posterior overflow). The features run once; the draws use torch's global RNG, so
        ``varbnn.predict(self, x, samples, seed=...)`` is reproducible. This is the hook :func:`varbnn.predict` calls."""
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ValueError(f"samples must be a positive integer, got {samples!r}")
        self._fitted()
        logits, phi = self._features(x)
        return self._draws_from_features(logits, phi, samples, self.prior_precision)

    def extra_repr(self) -> str:
        state = f"fitted on N={self.num_data}" if self._eig is not None else "not fitted"
        return f"layer={self.layer_name!r}, parameters={self.num_parameters}, prior_precision={self.prior_precision:.4g}, {state}"
