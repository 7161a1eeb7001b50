"""Modified Bessel functions of the first kind for von Mises-Fisher distributions, torch-native.

A vMF distribution on the sphere S^{d-1} needs ``log I_{d/2-1}(kappa)`` (its normaliser) and the ratio
``A_d(kappa) = I_{d/2}(kappa) / I_{d/2-1}(kappa)`` (its mean resultant length, entropy, KL and gradients), for
d up to ~1e4 and kappa from ~0 to ~1e5. ``scipy.special.ive`` under/overflows over much of that range, and
torch has no ``I_nu`` of non-integer order. Everything here is elementwise on tensors, works in float32 and
float64 on any device (internally float64, except on devices without it) and is differentiable in ``z``
(double-differentiable too); orders ``nu`` are data, not parameters, and get no gradient. On the CPU, inputs of at
most 8 elements (a layer's one concentration) are evaluated with the same formulas in Python floats, which is ~10x
faster than dispatching the tensor operations; the tests hold both paths to the same oracle.

**Methods.** ``bessel_ratio(nu, z, method=...)`` -- ``I_nu(z) / I_{nu-1}(z)``:

* ``"accurate"`` (default): a power series for ``sqrt(nu^2 + z^2) < 26`` (positive terms only, no cancellation)
  and Debye's uniform asymptotic expansion with 14 terms elsewhere, written so that it stays finite as
  ``nu -> 0`` (it becomes Hankel's large-argument expansion). Relative error below 1e-12 in float64 on the
  oracle grid (see ``tests/test_special.py`` and ``benchmarks/results/vmf/vmf.json``).
* ``"bounds"``: Oh et al. (2020), supplementary eq. 33: the average of the two Ruiz-Antolin & Segura (2016,
  Theorem 5) bounds ``B_2 < ratio < B_0``. Purely algebraic and cheap; the baseline.
* ``"bounds-amos"``: the average of the Amos-type bounds of Theorem 4 (supplementary eq. 32).

``log_bessel_iv(nu, z, method=...)`` -- ``log I_nu(z)``:

* ``"accurate"`` (default): the same series / Debye split.
* ``"approx"``: the paper's piecewise approximation (supplementary eq. 44).
* ``"ratio-series"``: the paper's log-ratio series (supplementary eq. 45): ``log I_{nu - floor(nu)}`` plus a sum of
  ``floor(nu)`` log-ratios from the Theorem-5 average. O(nu) work per element; for comparison only.

``bessel_ratio_bounds(nu, z, theorem=5)`` returns the (lower, upper) pair of either theorem.

**Arguments and limits.** ``nu`` and ``z`` are tensors or numbers of any numeric type (``int``, ``float``, NumPy
scalars and arrays; not ``bool``). Allowed: ``0 <= nu < inf`` and ``0 <= z <= inf``; NaN, negative values and an
infinite order raise a ``ValueError`` naming the argument (an infinite order is not a sphere's: vMF orders are ``d/2 - 1``, and at
``nu = z = inf`` the ratio has no limit). The end points take their limits: ``I_nu(z) / I_{nu-1}(z)`` is 1 at
``z = inf`` and 0 at ``z = 0`` (+inf for ``nu = 0``); ``log I_nu`` is +inf at ``z = inf`` and at ``z = 0`` it is 0 for
``nu = 0``, -inf otherwise. Where the value is finite, so is the derivative (``dR/dz`` is ``1 / (2 nu)`` at 0 and 0 at
inf; ``d log I_nu / dz`` is 1 at inf and 0 at ``nu = z = 0``). For small ``z`` the series is summed as
``log I_nu(z) = nu log(z/2) - lgamma(nu + 1) + log1p(z^2 / (4 (nu + 1)) + ...)``, so ``log I_0(z) ~ z^2 / 4`` keeps
its relative accuracy down to the smallest ``z`` (the plain ``log`` of the sum lost it below ``z ~ 1e-7``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from functools import cache
from typing import Any, Literal

import torch
from torch import Tensor

from varbnn._checks import ArgumentTypeError, as_int

__all__ = [
    "RATIO_METHODS",
    "LOG_IV_METHODS",
    "bessel_ratio",
    "bessel_ratio_bounds",
    "log_bessel_iv",
    "log_bessel_iv_over_power",
    "log_bessel_iv_over_power_and_ratio",
]

RATIO_METHODS = ("accurate", "bounds", "bounds-amos")
"""The ``method`` values of :func:`bessel_ratio` (see the module docstring)."""
LOG_IV_METHODS = ("accurate", "approx", "ratio-series")
"""The ``method`` values of :func:`log_bessel_iv` (see the module docstring)."""

RatioMethod = Literal["accurate", "bounds", "bounds-amos"]
LogIvMethod = Literal["accurate", "approx", "ratio-series"]

# Below this value of sqrt(nu^2 + z^2) the power series is used, above it the Debye expansion; with
# _DEBYE_TERMS terms the first omitted Debye term is < 1e-15 relative there (checked against mpmath).
_SERIES_RADIUS = 26.0
_DEBYE_TERMS = 14
_SERIES_TERMS = 72  # (z^2/4)^k / (k! (nu+1)_k) < 1e-18 of the sum for z < 26 by k = 72


# ---------------------------------------------------------------------------------------------------------
# Debye polynomials (DLMF 10.41.10-12), generated exactly once with rational arithmetic.
# u_k(t) and v_k(t) both equal t^k times a polynomial; we store those polynomials (p_k, q_k) so that the
# k-th term u_k(t) / nu^k = p_k(t) / S^k with S = sqrt(nu^2 + z^2) is finite at nu = 0.
# ---------------------------------------------------------------------------------------------------------


def _poly_derivative(p: list[Fraction]) -> list[Fraction]:
    return [i * c for i, c in enumerate(p)][1:] or [Fraction(0)]


def _poly_mul(p: list[Fraction], q: list[Fraction]) -> list[Fraction]:
    out = [Fraction(0)] * (len(p) + len(q) - 1)
    for i, a in enumerate(p):
        for j, b in enumerate(q):
            out[i + j] += a * b
    return out


def _poly_add(p: list[Fraction], q: list[Fraction]) -> list[Fraction]:
    n = max(len(p), len(q))
    return [(p[i] if i < len(p) else Fraction(0)) + (q[i] if i < len(q) else Fraction(0)) for i in range(n)]


def _poly_integral(p: list[Fraction]) -> list[Fraction]:
    return [Fraction(0)] + [c / (i + 1) for i, c in enumerate(p)]


@cache
def _debye_coefficients(terms: int) -> tuple[tuple[tuple[float, ...], ...], tuple[tuple[float, ...], ...]]:
    """Coefficients (in t, lowest degree first) of p_k = u_k / t^k and q_k = v_k / t^k, k < terms."""
    u: list[list[Fraction]] = [[Fraction(1)]]
    half_t2_1mt2 = [Fraction(0), Fraction(0), Fraction(1, 2), Fraction(0), Fraction(-1, 2)]  # t^2 (1 - t^2) / 2
    one_minus_5t2 = [Fraction(1), Fraction(0), Fraction(-5)]
    for _ in range(1, terms):
        prev = u[-1]
        nxt = _poly_add(
            _poly_mul(half_t2_1mt2, _poly_derivative(prev)), [c / 8 for c in _poly_integral(_poly_mul(one_minus_5t2, prev))]
        )
        u.append(nxt)
    v: list[list[Fraction]] = [[Fraction(1)]]
    t_t2m1 = [Fraction(0), Fraction(-1), Fraction(0), Fraction(1)]  # t (t^2 - 1)
    for k in range(1, terms):
        inner = _poly_add([c / 2 for c in u[k - 1]], _poly_mul([Fraction(0), Fraction(1)], _poly_derivative(u[k - 1])))
        v.append(_poly_add(u[k], _poly_mul(t_t2m1, inner)))

    def strip(p: list[Fraction], k: int) -> tuple[float, ...]:
        if any(c != 0 for c in p[:k]):
            raise AssertionError("Debye polynomial without a t^k factor")  # pragma: no cover
        return tuple(float(c) for c in p[k:])

    return tuple(strip(p, k) for k, p in enumerate(u)), tuple(strip(p, k) for k, p in enumerate(v))


@cache
def _debye_matrices(terms: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """[degree+1, terms] coefficient matrices so that powers_of_t @ M evaluates every p_k (or q_k) at once."""
    ps, qs = _debye_coefficients(terms)
    degree = max(len(p) for p in ps + qs)
    mu = torch.zeros(degree, terms, dtype=torch.float64)
    mv = torch.zeros(degree, terms, dtype=torch.float64)
    for k, (p, q) in enumerate(zip(ps, qs)):
        mu[: len(p), k] = torch.tensor(p, dtype=torch.float64)
        mv[: len(q), k] = torch.tensor(q, dtype=torch.float64)
    return mu.to(device=device, dtype=dtype), mv.to(device=device, dtype=dtype)


# ---------------------------------------------------------------------------------------------------------
# Input handling
# ---------------------------------------------------------------------------------------------------------


def _work_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64


def _as_real_tensor(value: Any, argument: str, name: str, dtype: torch.dtype) -> Tensor:
    """A tensor argument as it is, or a number of any numeric type (Python, NumPy scalar or array, list) as a tensor of
    ``dtype``; bools, complex numbers and non-numbers are refused."""
    if isinstance(value, Tensor):
        tensor = value
    else:
        if _is_bool_like(value):
            raise ArgumentTypeError(f"{name}: {argument} must be a real number or a real tensor, got a bool ({value!r})")
        try:
            tensor = torch.as_tensor(value)  # its own dtype, to refuse bools and complex numbers
            if tensor.dtype != torch.bool and not tensor.is_complex():
                tensor = torch.as_tensor(value, dtype=dtype)  # from the value itself: a Python float is not rounded
        except (TypeError, ValueError, RuntimeError):
            raise ArgumentTypeError(
                f"{name}: {argument} must be a real number or a real tensor, got {type(value).__name__} ({value!r})"
            ) from None
    if tensor.dtype == torch.bool or tensor.is_complex():
        raise ArgumentTypeError(f"{name}: {argument} must be a real number or a real tensor, got dtype {tensor.dtype}")
    return tensor


def _is_bool_like(value: Any) -> bool:
    return isinstance(value, bool) or getattr(getattr(value, "dtype", None), "kind", None) == "b"


def _prepare(nu: Tensor | float, z: Tensor | float, name: str, validate: bool = True) -> tuple[Tensor, Tensor, torch.dtype]:
    """Broadcast nu and z to float tensors of a working precision; returns (nu, z, output dtype).

    ``nu`` and ``z`` may be tensors or numbers of any numeric type (``int``, ``float``, NumPy scalars); a non-tensor
    ``z`` takes torch's default dtype, an integer tensor ``z`` too. The allowed ranges are ``0 <= nu < inf`` and
    ``0 <= z <= inf`` (``z = +inf`` gives the limits: ratio 1, ``log I_nu`` +inf). ``validate=False`` skips the range
    checks, which cost a device-to-host synchronisation on GPUs (out-of-range inputs then give NaN or inf).
    """
    z_t = _as_real_tensor(z, "the argument z", name, torch.get_default_dtype())
    if not (z_t.is_floating_point()):
        z_t = z_t.to(torch.get_default_dtype())
    out_dtype = z_t.dtype
    work = _work_dtype(z_t.device)
    if type(nu) in (int, float):  # made on the device (a fill): a host tensor's copy would wait for the device
        nu_t = torch.full((), float(nu), dtype=work, device=z_t.device)
    else:
        nu_t = _as_real_tensor(nu, "the order nu", name, torch.float64).to(device=z_t.device)
    nu_t, z_t = torch.broadcast_tensors(nu_t.to(work), z_t.to(work))
    if validate and not torch.compiler.is_compiling():
        bad_nu = ~(torch.isfinite(nu_t) & (nu_t >= 0))
        if bool(bad_nu.any()):
            raise ValueError(
                f"{name}: the order nu must be >= 0 and finite, i.e. in [0, inf) (got {float(nu_t[bad_nu][0]):.4g})"
            )
        bad_z = torch.isnan(z_t) | (z_t < 0)
        if bool(bad_z.any()):
            raise ValueError(
                f"{name}: the argument z must be >= 0 and not NaN, i.e. in [0, inf] (got {float(z_t[bad_z][0]):.4g})"
            )
    return nu_t, z_t, out_dtype


# ---------------------------------------------------------------------------------------------------------
# The accurate method: power series for small sqrt(nu^2 + z^2), Debye elsewhere
# ---------------------------------------------------------------------------------------------------------


def _series_tails(nu: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
    """T_nu = S_nu - 1 = sum_{k >= 1} (z^2/4)^k / (k! (nu+1)_k) and T_{nu+1}, both >= 0 (positive terms; exact in relative
    terms). The series is ``S_nu = 1 + T_nu``; ``log S_nu`` is taken as ``log1p(T_nu)``, which keeps its relative accuracy
    when ``T_nu ~ z^2 / (4 (nu + 1))`` is below the float64 resolution of 1 (``log I_0(z) ~ z^2 / 4`` for z < 1e-8)."""
    k = torch.arange(1, _SERIES_TERMS + 1, dtype=z.dtype, device=z.device)
    q = (z * z / 4).unsqueeze(-1)
    nu_ = nu.unsqueeze(-1)
    t0 = torch.cumprod(q / (k * (nu_ + k)), dim=-1).sum(-1)
    t1 = torch.cumprod(q / (k * (nu_ + 1 + k)), dim=-1).sum(-1)
    return t0, t1


@torch.compiler.assume_constant_result
def _debye_constants(terms: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """:func:`_debye_matrices`, which torch.compile evaluates once while tracing and keeps as constants (its exact
    rational arithmetic cannot be traced)."""
    return _debye_matrices(terms, device, dtype)


def _debye_sums(nu: Tensor, z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """S = sqrt(nu^2 + z^2), U = sum_k u_k(t)/nu^k and V = sum_k v_k(t)/nu^k with t = nu/S."""
    s = torch.hypot(nu, z)  # no overflow of nu^2 + z^2 for z > 1e154
    t = nu / s
    mu, mv = _debye_constants(_DEBYE_TERMS, z.device, z.dtype)
    degree = mu.shape[0]
    powers_t = torch.cumprod(torch.cat([torch.ones_like(t).unsqueeze(-1), t.unsqueeze(-1).expand(*t.shape, degree - 1)], -1), -1)
    inv_s = (1 / s).unsqueeze(-1)
    powers_s = torch.cumprod(torch.cat([torch.ones_like(inv_s), inv_s.expand(*s.shape, _DEBYE_TERMS - 1)], -1), -1)
    u = ((powers_t @ mu) * powers_s).sum(-1)
    v = ((powers_t @ mv) * powers_s).sum(-1)
    return s, u, v


def _use_masked(device: torch.device) -> bool:
    """Whether to evaluate both branches on every element (no host synchronisation) instead of on subsets: on every
    device but the CPU, and everywhere under torch.compile (one graph, no data-dependent shapes)."""
    return device.type != "cpu" or torch.compiler.is_compiling()


def _two_branches(
    nu: Tensor, z: Tensor, series: Callable[[Tensor, Tensor], Tensor], debye: Callable[[Tensor, Tensor], Tensor]
) -> Tensor:
    """series(nu, z) where sqrt(nu^2 + z^2) < _SERIES_RADIUS, debye(nu, z) elsewhere.

    On the CPU each branch runs only on its own elements (the series is the expensive one). On other devices (and
    under torch.compile) both run on every element, masked with torch.where, so that no call waits for a
    device-to-host copy.
    """
    small = torch.hypot(nu, z) < _SERIES_RADIUS
    if not _use_masked(z.device):
        out = torch.empty_like(z)
        if bool(small.any()):
            out[small] = series(nu[small], z[small])
        large = ~small
        if bool(large.any()):
            out[large] = debye(nu[large], z[large])
        return out
    safe_z = torch.where(small & (z > 0), z, torch.ones_like(z))
    series_out = series(torch.where(small, nu, torch.zeros_like(nu)), safe_z)
    debye_out = debye(nu, torch.where(small, torch.full_like(z, _SERIES_RADIUS), z))
    return torch.where(small, series_out, debye_out)


def _ratio_series(nu: Tensor, z: Tensor) -> Tensor:
    # 1/R = 2 nu / z + z / (2 (nu + 1)) * S_{nu+1} / S_nu
    t0, t1 = _series_tails(nu, z)
    return z / (2 * nu + z * z / (2 * (nu + 1)) * ((1 + t1) / (1 + t0)))


def _ratio_debye(nu: Tensor, z: Tensor) -> Tensor:
    # 1/R = I'_nu / I_nu + nu / z = (S / z) V / U + nu / z
    s, u, v = _debye_sums(nu, z)
    return z / (s * v / u + nu)


def _log_iv_series(nu: Tensor, z: Tensor) -> Tensor:
    # log I_nu(z) = nu log(z/2) - lgamma(nu + 1) + log1p(z^2 / (4 (nu + 1)) + ...)   (DLMF 10.25.2)
    t0, _ = _series_tails(nu, z)
    return torch.xlogy(nu, z) - nu * math.log(2) - torch.lgamma(nu + 1) + torch.log1p(t0)


def _log_iv_debye(nu: Tensor, z: Tensor) -> Tensor:
    s, u, _ = _debye_sums(nu, z)
    # nu * log(z / (nu + S)) with the nu = 0 limit 0
    return s + torch.xlogy(nu, z / (nu + s)) - 0.5 * torch.log(2 * math.pi * s) + torch.log(u)


def _log_iv_over_power_series(nu: Tensor, z: Tensor) -> Tensor:
    t0, _ = _series_tails(nu, z)
    return -nu * math.log(2) - torch.lgamma(nu + 1) + torch.log1p(t0)


def _log_iv_over_power_debye(nu: Tensor, z: Tensor) -> Tensor:
    s, u, _ = _debye_sums(nu, z)
    return s - nu * torch.log(nu + s) - 0.5 * torch.log(2 * math.pi * s) + torch.log(u)


def _accurate_ratio(nu: Tensor, z: Tensor) -> Tensor:
    out = _two_branches(nu, z, _ratio_series, _ratio_debye)
    out = torch.where(z == 0, torch.where(nu == 0, torch.full_like(z, math.inf), torch.zeros_like(z)), out)
    return torch.where(torch.isposinf(z), torch.ones_like(z), out)  # R_nu(z) -> 1 as z -> inf (any finite nu)


def _accurate_log_iv(nu: Tensor, z: Tensor) -> Tensor:
    out = _two_branches(nu, z, _log_iv_series, _log_iv_debye)
    at_zero = torch.where(nu == 0, torch.zeros_like(z), torch.full_like(z, -math.inf))
    return torch.where(torch.isposinf(z), z, torch.where(z == 0, at_zero, out))  # log I_nu(inf) = inf


def _accurate_log_iv_over_power(nu: Tensor, z: Tensor) -> Tensor:
    """log(I_nu(z) / z^nu): the same two branches with the nu * log z term cancelled analytically."""
    out = _two_branches(nu, z, _log_iv_over_power_series, _log_iv_over_power_debye)
    return torch.where(torch.isposinf(z), z, out)  # ~ z - (nu + 1/2) log z -> inf


# ---------------------------------------------------------------------------------------------------------
# The accurate method on a few CPU scalars: the same series / Debye split in Python floats. A layer's vMF has ONE
# concentration, and ~130 tensor operations on 0-d tensors cost ~0.3 ms a call where these loops cost ~30 us.
# ---------------------------------------------------------------------------------------------------------

_SCALAR_MAX = 8  # CPU inputs with at most this many elements take the Python-float path


def _scalar_path(z: Tensor) -> bool:
    return z.device.type == "cpu" and z.numel() <= _SCALAR_MAX and not torch.compiler.is_compiling()


def _series_tail_scalar(nu: float, z: float) -> float:
    """T_nu of :func:`_series_tails` for one (nu, z)."""
    q, term, total = z * z / 4, 1.0, 0.0
    for k in range(1, _SERIES_TERMS + 1):
        term *= q / (k * (nu + k))
        total += term
    return total


def _debye_sums_scalar(nu: float, z: float) -> tuple[float, float, float]:
    """(S, U, V) of :func:`_debye_sums` for one (nu, z) (each polynomial by Horner's rule)."""
    s = math.hypot(nu, z)
    t = nu / s
    u = v = 0.0
    inv_s_power = 1.0
    for p, q in zip(*_debye_coefficients(_DEBYE_TERMS)):
        u += inv_s_power * _horner(p, t)
        v += inv_s_power * _horner(q, t)
        inv_s_power /= s
    return s, u, v


def _horner(coefficients: tuple[float, ...], t: float) -> float:
    out = 0.0
    for c in reversed(coefficients):
        out = out * t + c
    return out


def _scalar_ratio(nu: float, z: float) -> float:
    """:func:`_accurate_ratio` for one (nu, z)."""
    if z == 0:
        return math.inf if nu == 0 else 0.0
    if z == math.inf:
        return 1.0
    if math.hypot(nu, z) < _SERIES_RADIUS:
        ratio = (1 + _series_tail_scalar(nu + 1, z)) / (1 + _series_tail_scalar(nu, z))
        return z / (2 * nu + z * z / (2 * (nu + 1)) * ratio)
    s, u, v = _debye_sums_scalar(nu, z)
    return z / (s * v / u + nu)


def _scalar_log_iv_over_power(nu: float, z: float) -> float:
    """:func:`_accurate_log_iv_over_power` for one (nu, z)."""
    if z == math.inf:
        return math.inf
    if math.hypot(nu, z) < _SERIES_RADIUS:
        return -nu * math.log(2) - math.lgamma(nu + 1) + math.log1p(_series_tail_scalar(nu, z))
    s, u, _ = _debye_sums_scalar(nu, z)
    return s - nu * math.log(nu + s) - 0.5 * math.log(2 * math.pi * s) + math.log(u)


def _scalar_log_iv(nu: float, z: float) -> float:
    """:func:`_accurate_log_iv` for one (nu, z)."""
    if z == 0:
        return 0.0 if nu == 0 else -math.inf
    if z == math.inf:
        return math.inf
    if math.hypot(nu, z) < _SERIES_RADIUS:
        return nu * (math.log(z) - math.log(2)) - math.lgamma(nu + 1) + math.log1p(_series_tail_scalar(nu, z))
    s, u, _ = _debye_sums_scalar(nu, z)
    return s + (nu * (math.log(z) - math.log(nu + s)) if nu != 0 else 0.0) - 0.5 * math.log(2 * math.pi * s) + math.log(u)


def _elementwise(fn: Callable[[float, float], float], nu: Tensor, z: Tensor) -> Tensor:
    """``fn`` on every (nu, z) pair of two same-shape CPU tensors, as a tensor like ``z``."""
    values = [fn(n, x) for n, x in zip(nu.reshape(-1).tolist(), z.reshape(-1).tolist())]
    return torch.tensor(values, dtype=z.dtype).reshape(z.shape)


# ---------------------------------------------------------------------------------------------------------
# The paper's bound-based approximations (Oh et al. 2020, supplementary Sections 3 and 5)
# ---------------------------------------------------------------------------------------------------------


def _bounds(nu: Tensor, z: Tensor, theorem: int) -> tuple[Tensor, Tensor]:
    """(lower, upper) of the theorem, with their limits at the end points: both are 1 at ``z = inf``; at ``z = 0`` both
    are 0 for nu > 0 and +inf for nu = 0 (as I_0 / I_1), except Theorem 5's upper bound at nu = 1/2, which is 1 for
    every z > 0. The formulas are evaluated at z = 1 at the end points, so that no NaN reaches a gradient."""
    infinite, zero = torch.isposinf(z), z == 0
    lower, upper = _finite_bounds(nu, torch.where(infinite | zero, torch.ones_like(z), z), theorem)
    one = torch.ones_like(lower)
    at_zero = torch.where(nu == 0, torch.full_like(lower, math.inf), torch.zeros_like(lower))
    upper_at_zero = torch.where(nu == 0.5, one, at_zero) if theorem == 5 else at_zero
    lower = torch.where(infinite, one, torch.where(zero, at_zero, lower))
    upper = torch.where(infinite, one, torch.where(zero, upper_at_zero, upper))
    return lower, upper


def _finite_bounds(nu: Tensor, z: Tensor, theorem: int) -> tuple[Tensor, Tensor]:
    """The theorem's bounds for finite z > 0."""
    if theorem == 4:  # Ruiz-Antolin & Segura (2016) Theorem 4 (Amos-type), valid for nu >= 0
        lower = z / (nu - 0.5 + torch.sqrt((nu + 0.5) ** 2 + z * z))
        upper = z / (nu - 1 + torch.sqrt((nu + 1) ** 2 + z * z))
        return lower, upper
    if theorem == 5:  # Theorem 5: B_2 < ratio < B_0, valid for nu >= 1/2

        def b(alpha: float) -> Tensor:
            lam = nu + (alpha - 1) / 2
            delta = (nu - 0.5) + lam / (2 * torch.sqrt(lam * lam + z * z))
            return z / (delta + torch.sqrt(delta * delta + z * z))

        return b(2.0), b(0.0)
    raise ValueError(f"theorem must be 4 or 5 (Ruiz-Antolin & Segura 2016), got {theorem!r}")


def _approx_log_iv(nu: Tensor, z: Tensor) -> Tensor:
    """Supplementary eq. 44: the averaged Ifantis-Siafarikas bound for z < nu, Hankel's leading term otherwise."""
    eta = (nu + 0.5) / (2 * (nu + 1))
    zc = z.clamp_min(torch.finfo(z.dtype).tiny)
    below = nu * torch.log(zc) + eta * zc - (eta + nu) * math.log(2) - torch.lgamma(nu + 1)
    above = zc - 0.5 * torch.log(zc) - 0.5 * math.log(2 * math.pi)
    out = torch.where(z < nu, below, above)
    at_zero = torch.where(nu == 0, torch.zeros_like(z), torch.full_like(z, -math.inf))  # the exact values at 0 and inf
    return torch.where(torch.isposinf(z), z, torch.where(z == 0, at_zero, out))


def _ratio_series_log_iv(nu: Tensor, z: Tensor, chunk: int = 2048) -> Tensor:
    """Supplementary eq. 45: log I_{nu - floor(nu)}(z) + sum_{n < floor(nu)} log B(nu - n, z), B = Theorem-5 average.

    The Theorem-5 bounds need order >= 1/2, so an order nu - n in [1/2, 1) uses them too and the base order is
    nu - floor(nu) (or nu - floor(nu) + 1 when that would leave the base below 1/2 with a ratio order < 1/2).
    """
    flat_nu, flat_z = nu.reshape(-1), z.reshape(-1)
    out = torch.empty_like(flat_nu)
    for start in range(0, flat_nu.numel(), chunk):
        n_c, z_c = flat_nu[start : start + chunk], flat_z[start : start + chunk]
        steps = torch.floor(n_c)
        # orders of the ratios: nu, nu - 1, ..., base + 1, all >= 1/2 (base = nu - steps >= 0)
        steps = torch.where(n_c - steps + 1 < 0.5, steps - 1, steps).clamp_min(0)
        base = n_c - steps
        total = _LogBessel.apply(base, z_c, False)  # with its closed-form derivative (finite at z = 0 and inf)
        max_steps = int(steps.max().item()) if steps.numel() else 0
        if max_steps > 0:
            n = torch.arange(max_steps, dtype=n_c.dtype, device=n_c.device)
            orders = n_c.unsqueeze(-1) - n
            valid = n < steps.unsqueeze(-1)
            # z = 0 and inf (where the base term already has the value, 0 or -inf and inf) are evaluated at z = 1
            finite_z = torch.where((z_c == 0) | torch.isposinf(z_c), torch.ones_like(z_c), z_c)
            lower, upper = _finite_bounds(orders.clamp_min(0.5), finite_z.unsqueeze(-1).expand_as(orders), 5)
            logs = torch.log((lower + upper) / 2)
            total = total + torch.where(valid, logs, torch.zeros_like(logs)).sum(-1)
        out[start : start + chunk] = total
    out = out.reshape(nu.shape)
    at_zero = torch.where(nu == 0, torch.zeros_like(out), torch.full_like(out, -math.inf))  # the exact log I_nu(0)
    return torch.where(z == 0, at_zero, out)


# ---------------------------------------------------------------------------------------------------------
# Autograd wrappers
# ---------------------------------------------------------------------------------------------------------


def _ratio_derivative(nu: Tensor, z: Tensor, r: Tensor) -> Tensor:
    """dR_nu/dz = 1 - (2 nu - 1) R / z - R^2, with its limits 1 / (2 nu) at z = 0 (R ~ z / (2 nu)) and 0 at z = inf
    (R -> 1). The formula is evaluated at z = 1 where z = 0, so that the branch torch.where drops has no NaN (which
    would leak into a second derivative)."""
    at_zero = z == 0
    safe_z = torch.where(at_zero, torch.ones_like(z), z)
    return torch.where(at_zero, 0.5 / nu, 1 - (2 * nu - 1) * r / safe_z - r * r)


class _BesselRatio(torch.autograd.Function):
    """R_nu(z) = I_nu(z) / I_{nu-1}(z); dR/dz = 1 - (2 nu - 1) R / z - R^2 (from the recurrences)."""

    generate_vmap_rule = True  # forward apart from setup_context: usable under torch.func.grad and vjp (not under vmap
    # of batched arguments: the CPU scalar path reads values and the two-branch path indexes by masks)

    @staticmethod
    def forward(nu: Tensor, z: Tensor) -> Tensor:  # type: ignore[override]
        return _elementwise(_scalar_ratio, nu, z) if _scalar_path(z) else _accurate_ratio(nu, z)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
        ctx.save_for_backward(*inputs, output)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[None, Tensor]:  # type: ignore[override]
        nu, z, r = ctx.saved_tensors
        return None, grad * _ratio_derivative(nu, z, r)


class _LogBessel(torch.autograd.Function):
    """log I_nu(z) (``over_power=False``; d/dz = I'_nu / I_nu = R_{nu+1}(z) + nu / z, no cancellation) or
    log(I_nu(z) / z^nu) (``over_power=True``; d/dz = R_{nu+1}(z): the nu / z terms cancel analytically)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(nu: Tensor, z: Tensor, over_power: bool) -> Tensor:  # type: ignore[override]
        if _scalar_path(z):
            return _elementwise(_scalar_log_iv_over_power if over_power else _scalar_log_iv, nu, z)
        return _accurate_log_iv_over_power(nu, z) if over_power else _accurate_log_iv(nu, z)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, Tensor, bool], output: Tensor) -> None:
        nu, z, ctx.over_power = inputs
        ctx.save_for_backward(nu, z)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[None, Tensor, None]:  # type: ignore[override]
        nu, z = ctx.saved_tensors
        derivative = _BesselRatio.apply(nu + 1, z)
        if not ctx.over_power:  # + nu / z, whose nu = 0 term is 0 also at z = 0 (I_0 is even: d log I_0 / dz = 0 there)
            derivative = derivative + nu / torch.where((nu == 0) & (z == 0), torch.ones_like(z), z)
        return None, grad * derivative, None


class _LogNormalizerAndRatio(torch.autograd.Function):
    """(log(I_nu(z) / z^nu), R_{nu+1}(z)) together: the two Bessel quantities of a vMF log-normaliser and mean resultant
    length (nu = d/2 - 1). Both derivatives are closed forms of the ratio (d/dz log(I_nu / z^nu) = R_{nu+1},
    dR_{nu+1}/dz = 1 - (2 nu + 1) R / z - R^2), so the backward pass evaluates no Bessel function."""

    generate_vmap_rule = True

    @staticmethod
    def forward(nu: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        if _scalar_path(z):
            return _elementwise(_scalar_log_iv_over_power, nu, z), _elementwise(_scalar_ratio, nu + 1, z)
        return _accurate_log_iv_over_power(nu, z), _accurate_ratio(nu + 1, z)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, Tensor], output: tuple[Tensor, Tensor]) -> None:
        ctx.save_for_backward(*inputs, output[1])

    @staticmethod
    def backward(ctx, grad_log: Tensor | None, grad_ratio: Tensor | None) -> tuple[None, Tensor]:  # type: ignore[override]
        nu, z, r = ctx.saved_tensors
        total = torch.zeros_like(z)
        if grad_log is not None:
            total = total + grad_log * r
        if grad_ratio is not None:
            total = total + grad_ratio * _ratio_derivative(nu + 1, z, r)
        return None, total


# ---------------------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------------------


def bessel_ratio(nu: Tensor | float, z: Tensor | float, method: RatioMethod = "accurate", validate: bool = True) -> Tensor:
    """``R_nu(z) = I_nu(z) / I_{nu-1}(z)`` elementwise (broadcasting ``nu`` against ``z``), differentiable in ``z``
    (twice too), with ``dR/dz = 1 - (2 nu - 1) R / z - R^2`` from the recurrences (no Bessel call in the backward).

    For a vMF on S^{d-1} the mean resultant length is ``A_d(kappa) = R_{d/2}(kappa)``. ``"bounds"`` is Oh et al.
    (2020) supplementary eq. 33, ``(B_2 + B_0) / 2`` of :func:`bessel_ratio_bounds` (Theorem 5); ``"bounds-amos"``
    is eq. 32, the average of the Theorem-4 bounds.

    :param nu: order(s), finite and >= 0 (``"bounds"`` needs >= 1/2); a number or a tensor; gets no gradient.
    :param z: argument(s), in ``[0, inf]`` (1 at ``z = inf``); the output has ``z``'s dtype and device.
    :param method: ``"accurate"`` (default; < 1e-12 relative error in float64), ``"bounds"`` (the paper's average
        of the Theorem-5 bounds) or ``"bounds-amos"`` (average of the Theorem-4 bounds).
    :param validate: check ``nu >= 0`` and ``z >= 0`` (a host synchronisation on GPUs); off inside
        ``VonMisesFisher``, whose parameters are checked once at construction.
    """
    nu_t, z_t, out_dtype = _prepare(nu, z, "bessel_ratio", validate)
    if method == "accurate":
        return _BesselRatio.apply(nu_t, z_t).to(out_dtype)
    if method in ("bounds", "bounds-amos"):
        if validate and method == "bounds" and not torch.compiler.is_compiling() and bool(torch.any(nu_t < 0.5)):
            raise ValueError("bessel_ratio(method='bounds'): the Theorem-5 bounds need nu >= 1/2")
        lower, upper = _bounds(nu_t, z_t, 5 if method == "bounds" else 4)
        return ((lower + upper) / 2).to(out_dtype)
    raise ValueError(f"bessel_ratio: unknown method {method!r}; choose one of {RATIO_METHODS}")


def bessel_ratio_bounds(nu: Tensor | float, z: Tensor | float, theorem: int = 5) -> tuple[Tensor, Tensor]:
    """(lower, upper) bounds on ``I_nu(z) / I_{nu-1}(z)`` from Ruiz-Antolin & Segura (2016), Theorem 4 (valid for
    nu >= 0) or 5 (nu >= 1/2); ``theorem`` is an integer, 4 or 5. Same ``nu`` and ``z`` as :func:`bessel_ratio`; both
    bounds are 1 at ``z = inf``.

    * Theorem 4 (Amos-type): ``z / (nu - 1/2 + sqrt((nu + 1/2)^2 + z^2)) < R_nu(z) < z / (nu - 1 + sqrt((nu + 1)^2 +
      z^2))`` (the two terms of Oh et al. 2020, supplementary eq. 32).
    * Theorem 5: ``B_2(nu, z) < R_nu(z) < B_0(nu, z)`` with ``B_a = z / (delta_a + sqrt(delta_a^2 + z^2))``,
      ``delta_a = nu - 1/2 + lambda / (2 sqrt(lambda^2 + z^2))`` and ``lambda = nu + (a - 1) / 2`` (supplementary
      eq. 33 averages the two).
    """
    theorem = as_int(theorem, "theorem", owner="bessel_ratio_bounds")
    if theorem not in (4, 5):
        raise ValueError(f"bessel_ratio_bounds: theorem must be 4 or 5 (Ruiz-Antolin & Segura 2016), got {theorem!r}")
    nu_t, z_t, out_dtype = _prepare(nu, z, "bessel_ratio_bounds")
    lower, upper = _bounds(nu_t, z_t, theorem)
    return lower.to(out_dtype), upper.to(out_dtype)


def log_bessel_iv(nu: Tensor | float, z: Tensor | float, method: LogIvMethod = "accurate", validate: bool = True) -> Tensor:
    """``log I_nu(z)`` elementwise, stable for nu up to 1e4+ and z from 1e-6 to 1e6+, differentiable in ``z``.

    :param nu: order(s), finite and >= 0; a number or a tensor; gets no gradient.
    :param z: argument(s), in ``[0, inf]`` (``log I_nu(0)`` is 0 for nu = 0 and -inf otherwise; ``log I_nu(inf) = inf``).
    :param method: ``"accurate"`` (default), ``"approx"`` (the paper's eq. 44) or ``"ratio-series"`` (eq. 45).
    :param validate: as for :func:`bessel_ratio`.

    ``"approx"`` (Oh et al. 2020, supplementary eq. 41, 43-44): ``nu log z + eta z - (eta + nu) log 2 -
    lgamma(nu + 1)`` with ``eta = (nu + 1/2) / (2 (nu + 1))`` for ``z < nu`` (the averaged Ifantis-Siafarikas bounds),
    ``z - log(z) / 2 - log(2 pi) / 2`` otherwise (Hankel's leading term). ``"ratio-series"`` (eq. 45):
    ``log I_{nu - n}(z) + sum_{j < n} log B(nu - j, z)`` with ``n = floor(nu)`` and B the Theorem-5 average.
    """
    nu_t, z_t, out_dtype = _prepare(nu, z, "log_bessel_iv", validate)
    if method == "accurate":
        return _LogBessel.apply(nu_t, z_t, False).to(out_dtype)
    if method == "approx":
        return _approx_log_iv(nu_t, z_t).to(out_dtype)
    if method == "ratio-series":
        return _ratio_series_log_iv(nu_t, z_t).to(out_dtype)
    raise ValueError(f"log_bessel_iv: unknown method {method!r}; choose one of {LOG_IV_METHODS}")


def log_bessel_iv_over_power(nu: Tensor | float, z: Tensor | float, validate: bool = True) -> Tensor:
    """``log(I_nu(z) / z^nu)``, analytic at ``z = 0`` (value ``-nu log 2 - lgamma(nu + 1)``), derivative ``R_{nu+1}(z)``.
    Accurate method; arguments as :func:`log_bessel_iv` (``nu`` >= 0, ``z`` in ``[0, inf]``).

    This is the part of a von Mises-Fisher log-normaliser that depends on the concentration. Computing it as
    ``log_bessel_iv(nu, z) - nu * log(z)`` would cancel catastrophically for small ``z`` at large ``nu`` (both
    terms ~ nu |log z|) -- in the value and even more in the gradient.
    """
    nu_t, z_t, out_dtype = _prepare(nu, z, "log_bessel_iv_over_power", validate)
    return _LogBessel.apply(nu_t, z_t, True).to(out_dtype)


def log_bessel_iv_over_power_and_ratio(nu: Tensor | float, z: Tensor | float, validate: bool = True) -> tuple[Tensor, Tensor]:
    """``(log(I_nu(z) / z^nu), I_{nu+1}(z) / I_nu(z))`` in one call (accurate method), differentiable in ``z`` with no
    Bessel evaluation in the backward pass: what a von Mises-Fisher KL needs (``nu = d/2 - 1``: the log-normaliser and
    the mean resultant length A_d). Same arguments as :func:`log_bessel_iv_over_power`."""
    nu_t, z_t, out_dtype = _prepare(nu, z, "log_bessel_iv_over_power_and_ratio", validate)
    log_iv, ratio = _LogNormalizerAndRatio.apply(nu_t, z_t)
    return log_iv.to(out_dtype), ratio.to(out_dtype)
