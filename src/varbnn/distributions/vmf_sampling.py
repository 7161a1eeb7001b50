"""Sampling the von Mises-Fisher distribution: Wood's (1994) rejection sampler and the Householder map.

A vMF draw on S^{d-1} (:meth:`varbnn.distributions.VonMisesFisher.rsample`, and the directions of
:class:`varbnn.families.RadialDirectional`) is built in two steps, both here:

- :func:`wood_sample`: the component ``omega = loc . x`` by Wood's rejection sampler (:func:`wood_accepted_proposals`:
  vectorised over every sample and batch element, a bounded number of rounds on the CPU, a fixed batch of proposals
  off it, inside torch.compile and under torch.func transforms), differentiable in the concentration with the accepted
  proposal held fixed, and optionally the rejection-sampling score (Naesseth et al. 2017);
- :func:`householder_sample`: a uniform tangent direction and a Householder reflection that maps the first basis
  vector to ``loc`` (chosen so that it never divides by a small number), as one autograd node.

Both are re-exported by :mod:`varbnn.distributions.vmf`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from varbnn import philox
from varbnn._transforms import functorch_active
from varbnn.special import RatioMethod, bessel_ratio

__all__ = [
    "RejectionSamplingError",
    "householder_sample",
    "wood_accepted_proposals",
    "wood_constants",
    "wood_sample",
    "fixed_rejection_rounds",
]


class RejectionSamplingError(RuntimeError):
    """Wood's sampler did not accept a proposal for every element within ``max_rejection_rounds`` rounds."""


def _compact(t: Tensor) -> Tensor:
    """A 0-d view of ``t`` if every element is the same memory (an ``expand`` of one value, e.g. a concentration shared by
    many rows), else ``t``: scalar-only work (Bessel functions) then runs once instead of once per element. Gradients
    flow back through the view to the shared value."""
    if t.dim() > 0 and t.numel() > 1 and all(stride == 0 for stride in t.stride()):
        return t[(0,) * t.dim()]
    return t


PROPOSALS_FIRST_ROUND = 8
PROPOSALS_PER_ROUND = 4
PROPOSALS_FIXED = 32
"""Proposals per element when the rejection loop does not wait on the host (off the CPU, compiled or not, and under
torch.func transforms: :func:`_without_host_sync`; a compiled step on the CPU runs the eager sampler as one opaque
operation instead, :func:`_wood_pool_op` or :func:`_wood_rounds_op`): all drawn at once and the first accepted kept. Wood's
acceptance rate is at least 0.63 for every d and kappa (tests/test_vmf.py checks d from 2 to 1000 over kappa in
[1e-3, 1e6]; the lowest is on the circle, d = 2): an element has none accepted with probability <= 0.37^32 ~ 2e-14;
it then keeps its last proposal (a draw from Wood's envelope, not the target).
The price: four times the eager first round's Gamma draws (Gamma((d-1)/2) samples are not cheap on the CPU)."""
_fixed_rounds = False  # tests: the compiled path's draws in an eager step (see fixed_rejection_rounds)


def _wood_root_and_b(dim: int, kappa: Any) -> tuple[Any, Any]:
    """``S = sqrt(4 kappa^2 + (d-1)^2)`` and ``b = (d-1) / (2 kappa + S)`` (no cancellation at large kappa), for a
    tensor or a Python float ``kappa``."""
    m1 = dim - 1.0
    root = (4 * kappa * kappa + m1 * m1) ** 0.5
    return root, m1 / (2 * kappa + root)


def wood_constants(dim: int, kappa: Any) -> tuple[Any, Any]:
    """b and 1 - x0 of Wood's (1994) envelope on S^{dim-1}, in forms without cancellation at large kappa (``kappa`` a
    tensor or a Python float)."""
    _, b = _wood_root_and_b(dim, kappa)
    return b, 2 * b / (1 + b)


def _wood_proposals(
    dim: int, kappa: Tensor | float, k: int, n: int, work: torch.dtype, device: torch.device
) -> tuple[Tensor, Tensor]:
    """``k`` Beta proposals for each of ``n`` elements ([k, n]) and whether Wood's test accepts each; ``kappa`` is
    ``[n]``, 0-d or a Python float (one concentration shared by all: the envelope's constants are computed once)."""
    m1 = dim - 1.0
    b, one_minus_x0 = wood_constants(dim, kappa)
    log = math.log if isinstance(kappa, float) else torch.log
    log_1mx0_sq = log(one_minus_x0) + log(2 / (1 + b))  # log(1 - x0^2) = log((1 - x0)(1 + x0))
    x0 = 1 - one_minus_x0
    # Beta(a, a) with a = (d - 1)/2 from ONE Gamma(a) draw g and a normal z (half the Gamma draws of g1 / (g1 + g2),
    # which dominate the sampler's cost): z / sqrt(2 g / (d - 1)) is Student-t with d - 1 degrees of freedom, and
    # (1 + t / sqrt(d - 1 + t^2)) / 2 = (1 + z / r) / 2 with r = sqrt(z^2 + 2 g); for z < 0 as g / (r (r - z)), without
    # cancellation near 0
    g = torch._standard_gamma(torch.full((k, n), m1 / 2, dtype=work, device=device))
    z = torch.randn((k, n), dtype=work, device=device)
    r = torch.sqrt(z * z + 2 * g).clamp_min(torch.finfo(work).tiny)
    e = torch.where(z < 0, g / (r * (r - z)), (r + z) / (2 * r))  # Beta(alpha, alpha), [k, n]
    one_minus_omega = 2 * b * e / (1 - (1 - b) * e)
    log_u = torch.log(torch.rand(e.shape, dtype=work, device=device))
    # kappa (omega - x0) + (d - 1) log((1 - x0 omega) / (1 - x0^2)) >= log u, written without cancellation
    t = kappa * (one_minus_x0 - one_minus_omega) + m1 * (torch.log(one_minus_x0 + x0 * one_minus_omega) - log_1mx0_sq)
    return e, t >= log_u


def _without_host_sync(device: torch.device) -> bool:
    """Whether Wood's sampler draws its fixed proposals at once instead of rounds that read the acceptance on the host:
    on every device but the CPU (a read waits for the device: one per layer and step), inside torch.compile (one
    graph; :func:`wood_accepted_proposals` takes the CPU's compiled case out first: the eager rounds as one opaque
    operation) and under a torch.func transform (batched proposals, no data-dependent control flow)."""
    return device.type != "cpu" or torch.compiler.is_compiling() or functorch_active()


@torch.library.custom_op("varbnn::wood_accepted_proposals", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def _wood_rounds_op(kappa: Tensor, dim: int, max_rounds: int) -> Tensor:
    """The eager rejection rounds on the CPU as one opaque operation of a compiled graph: a host read costs nothing
    there, and the rounds draw about 8 Beta proposals per element where the fixed batch draws 32 (each a Gamma draw,
    the dearest part of an RDP step on the CPU). It draws from torch's generator in the eager step's order, so a
    compiled CPU step draws the eager step's directions."""
    return _wood_rounds(dim, kappa, max_rounds)


@_wood_rounds_op.register_fake
def _(kappa: Tensor, dim: int, max_rounds: int) -> Tensor:
    return kappa.new_empty(kappa.shape)  # contiguous, as the rounds' result, whatever kappa's strides


@torch.library.custom_op("varbnn::wood_pool", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def _wood_pool_op(kappa: Tensor, dim: int, n: int, max_rounds: int) -> Tensor:
    """:func:`_wood_pool` for ``n`` draws of one concentration (0-d ``kappa``) as one opaque operation of a compiled CPU
    graph, drawing what the eager step draws."""
    return _wood_pool(dim, float(kappa), n, kappa.dtype, kappa.device, max_rounds)


@_wood_pool_op.register_fake
def _(kappa: Tensor, dim: int, n: int, max_rounds: int) -> Tensor:
    return kappa.new_empty((n,))


def wood_accepted_proposals(dim: int, kappa: Tensor, max_rounds: int = 1000) -> Tensor:
    """Draw eps ~ Beta((d-1)/2, (d-1)/2) until Wood's acceptance test passes, for every element of ``kappa``
    (detached, any shape; the result has its shape).

    Each round draws proposals for every element still pending and keeps the first accepted one, which is the
    sequential sampler's draw (the proposals are i.i.d.). The first round draws ``PROPOSALS_FIRST_ROUND`` (8) per
    element without any boolean indexing, so the common case costs one host synchronisation (the check that all
    were accepted): with an acceptance rate >= 0.63 for all d and kappa (see ``PROPOSALS_FIXED``), an element needs
    a second round with probability <= 0.37^8 ~ 4e-4; those go through rounds of ``PROPOSALS_PER_ROUND`` (4)
    proposals. On the CPU a concentration expanded from one value (a layer's) is read once as a Python float and its
    elements share one pool of proposals instead (:func:`_wood_pool`: the accepted ones of ~1.6 proposals per element,
    in order; a fifth of the Gamma draws). That loop runs on the CPU, where Gamma draws are dear and a host read is
    free; inside torch.compile on the CPU it runs as one opaque operation of the graph (``varbnn::wood_pool`` or
    ``varbnn::wood_accepted_proposals``), drawing what the eager step draws. On every other device (compiled or
    not), under a torch.func transform (e.g. ``varbnn.predict``'s vmap over draws, where the proposals are batched)
    and within :func:`fixed_rejection_rounds`, it is replaced by ``PROPOSALS_FIXED`` (32) proposals drawn at once,
    without a host synchronisation (:func:`_without_host_sync`).
    """
    if not _fixed_rounds and kappa.device.type == "cpu" and torch.compiler.is_compiling() and not functorch_active():
        shared = _compact(kappa.detach())
        if shared.dim() == 0:  # a shared concentration (e.g. a layer's): the eager pool, as a 0-d input (a graph would
            # pass the expanded tensor materialised, and the op could no longer tell that it is shared)
            return _wood_pool_op(shared, dim, kappa.numel(), max_rounds).reshape(kappa.shape)
        return _wood_rounds_op(kappa.detach(), dim, max_rounds)  # compiled on the CPU: the eager rounds, opaque
    if _fixed_rounds or _without_host_sync(kappa.device):
        return _wood_fixed(dim, kappa)
    return _wood_rounds(dim, kappa, max_rounds)


def _wood_fixed(dim: int, kappa: Tensor) -> Tensor:
    """``PROPOSALS_FIXED`` proposals per element at once, the first accepted kept (the last if none): no host read."""
    shape, work, device = kappa.shape, kappa.dtype, kappa.device
    n = kappa.numel()
    shared = _compact(kappa.detach())
    kappa_arg = shared if shared.dim() == 0 else shared.reshape(-1)
    e, accept = _wood_proposals(dim, kappa_arg, PROPOSALS_FIXED, n, work, device)
    accept = torch.cat([accept[:-1], torch.ones_like(accept[-1:])])
    first = accept.to(torch.uint8).argmax(0)
    return e.gather(0, first.unsqueeze(0)).squeeze(0).reshape(shape)


def _first_accepted(accept: Tensor) -> Tensor:
    """Index of the first ``True`` of each column of ``accept`` (``[k, n]``; 0 where none), as ``argmax(0)`` gives it:
    taken along contiguous rows of the transpose, which the CPU reduces about 3x faster than down the columns."""
    return accept.to(torch.uint8).t().contiguous().argmax(1)


def _wood_rounds(dim: int, kappa: Tensor, max_rounds: int) -> Tensor:
    """Rounds of proposals for the pending elements until each is accepted (a host read per round; see
    :func:`wood_accepted_proposals`)."""
    shape, work, device = kappa.shape, kappa.dtype, kappa.device
    n = kappa.numel()
    shared = _compact(kappa.detach())
    kappa_all: Tensor | None = None
    kappa_arg: Tensor | float
    if shared.dim() == 0:
        if device.type == "cpu":
            return _wood_pool(dim, float(shared), n, work, device, max_rounds).reshape(shape)
        kappa_arg = shared
    else:
        kappa_all = kappa_arg = shared.reshape(-1)
    e, accept = _wood_proposals(dim, kappa_arg, PROPOSALS_FIRST_ROUND, n, work, device)
    first = _first_accepted(accept)  # index of the first accepted proposal (0 if none)
    eps = e.gather(0, first.unsqueeze(0)).squeeze(0)
    done = accept.any(0)
    if bool(done.all()):
        return eps.reshape(shape)
    pending = (~done).nonzero().squeeze(-1)
    for _ in range(1, max_rounds):
        pending_kappa = kappa_arg if kappa_all is None else kappa_all[pending]
        e, accept = _wood_proposals(dim, pending_kappa, PROPOSALS_PER_ROUND, pending.numel(), work, device)
        first = _first_accepted(accept)
        done = accept.any(0)
        eps[pending[done]] = e.gather(0, first.unsqueeze(0)).squeeze(0)[done]
        pending = pending[~done]
        if pending.numel() == 0:
            return eps.reshape(shape)
    raise RejectionSamplingError(
        f"VonMisesFisher.rsample: Wood's sampler left {pending.numel()} of {n} elements unaccepted after "
        f"max_rejection_rounds={max_rounds} rounds (d={dim}, kappa in "
        f"[{float(shared.min()):.3g}, {float(shared.max()):.3g}])"
    )


POOL_FACTOR = 1.6
POOL_EXTRA = 16
"""A shared concentration's pool (:func:`_wood_pool`): ``ceil(POOL_FACTOR * n) + POOL_EXTRA`` proposals for ``n``
pending draws, enough at Wood's acceptance rate of 0.63 or more (0.7-0.75 at a BNN layer's d and kappa) that a
second round is rare."""


def _wood_pool(dim: int, kappa: float, n: int, work: torch.dtype, device: torch.device, max_rounds: int) -> Tensor:
    """``n`` accepted proposals (``[n]``) of ONE concentration shared by every element: the accepted ones of a flat
    sequence of i.i.d. proposals, in order, which are i.i.d. draws of Wood's target like the sequential sampler's.
    About ``POOL_FACTOR`` proposals per element (Gamma draws are the dearest part of an RDP step on the CPU) where
    per-element rounds draw ``PROPOSALS_FIRST_ROUND``; a round draws again for the draws still missing."""
    parts: list[Tensor] = [torch.empty(0, dtype=work, device=device)]
    missing = n
    for _ in range(max_rounds):
        if missing == 0:
            break
        e, accept = _wood_proposals(dim, kappa, 1, math.ceil(POOL_FACTOR * missing) + POOL_EXTRA, work, device)
        accepted = e[accept][:missing]
        parts.append(accepted)
        missing -= accepted.numel()
    if missing:
        raise RejectionSamplingError(
            f"VonMisesFisher.rsample: Wood's sampler left {missing} of {n} elements unaccepted after "
            f"max_rejection_rounds={max_rounds} rounds (d={dim}, kappa={kappa:.3g})"
        )
    return parts[1] if len(parts) == 2 else torch.cat(parts)


@contextlib.contextmanager
def fixed_rejection_rounds() -> Iterator[None]:
    """Eager draws take the path a compiled step takes (``PROPOSALS_FIXED`` proposals at once, no host
    synchronisation): the same random numbers in the same order, so a compiled step can be checked against an eager
    one for the same seed."""
    global _fixed_rounds
    before, _fixed_rounds = _fixed_rounds, True
    try:
        yield
    finally:
        _fixed_rounds = before


def wood_sample(
    dim: int,
    kappa: Tensor,
    max_rounds: int = 1000,
    score: bool = False,
    ratio_method: RatioMethod = "accurate",
    resultant: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Wood's component of a vMF draw on S^{dim-1} for every element of ``kappa``: ``(omega, sin_theta, score)``.

    ``omega = h(eps, kappa)`` for an accepted proposal ``eps`` (:func:`wood_accepted_proposals`), differentiable in
    ``kappa`` with ``eps`` fixed (the pathwise part), and ``sin_theta = sqrt(1 - omega^2)``, both computed from ``1 -
    omega`` and ``1 + omega`` without cancellation. With ``score=True`` also the rejection-sampling correction: a tensor
    whose value is 0 and whose gradient in ``kappa`` is ``d/dkappa log pi(eps; kappa)``, the score of the accepted
    proposal's density (Naesseth et al. 2017), i.e. ``d/dkappa [log q(omega; kappa) + log |d omega / d eps|]`` (Oh et
    al. 2020, supp. eq. 20); ``resultant`` is A_d(kappa) if the caller already has it (its value is used, not its
    gradient). Shapes and dtype of ``kappa`` (the working precision).
    """
    eps = wood_accepted_proposals(dim, kappa, max_rounds)
    plain = functorch_active()  # a torch.func transform: plain operations, differentiated by autograd
    if plain:  # a proposal of (nearly) 0 or 1 made sqrt's and log's derivatives (and the score) NaN or infinite there;
        # the Function's closed form has no such point; the clamp moves only proposals within 2e-16 of an end
        floor = torch.finfo(eps.dtype).eps
        eps = eps.clamp(floor, 1 - floor)
    if not score:
        if plain:
            omega, sin_theta, _ = _wood_values(kappa, eps, dim)
            return omega, sin_theta, None
        omega, sin_theta, _ = _WoodTransform.apply(kappa, eps, None, dim)
        return omega, sin_theta, None
    if resultant is None:
        a_d = bessel_ratio(dim / 2, _compact(kappa.detach()), method=ratio_method, validate=False)
    else:
        a_d = resultant.detach()
    if plain:
        return _wood_plain_with_score(kappa, eps, a_d, dim)
    return _WoodTransform.apply(kappa, eps, a_d, dim)


def _wood_values(kappa: Tensor, eps: Tensor, dim: int) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
    """``(omega, sin_theta, (root, b, denom))`` of :class:`_WoodTransform`'s forward, in plain operations."""
    root, b = _wood_root_and_b(dim, kappa)
    denom = 1 - (1 - b) * eps
    one_minus = 2 * b * eps / denom
    sin_theta = torch.sqrt(one_minus * (2 * (1 - eps) / denom))  # sqrt((1 - omega)(1 + omega))
    return 1 - one_minus, sin_theta, (root, b, denom)


def _wood_plain_with_score(kappa: Tensor, eps: Tensor, a_d: Tensor, dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """:class:`_WoodTransform` with a score in plain operations: ``score = log pi - log pi.detach()`` with ``log pi``
    of its docstring, whose value is 0 and whose autograd gradient in ``kappa`` is the Function's."""
    omega, sin_theta, (root, b, denom) = _wood_values(kappa, eps, dim)
    log_one_minus_sq = torch.log(4 * b * eps * (1 - eps)) - 2 * torch.log(denom)  # log(1 - omega^2)
    log_pi = (
        -(kappa - kappa.detach()) * a_d
        + kappa * omega
        + 0.5 * (dim - 3) * log_one_minus_sq
        + torch.log(2 * b)
        - 2 * torch.log(denom)
    )
    return omega, sin_theta, log_pi - log_pi.detach()


class _WoodTransform(torch.autograd.Function):
    """``(omega, sin_theta, score)`` of :func:`wood_sample` from ``kappa`` and the accepted proposals ``eps``, with a
    closed-form backward in ``kappa`` (one node instead of ~100 recorded operations per layer).

    With ``m = d - 1``, ``S = sqrt(4 kappa^2 + m^2)``, ``b = m / (2 kappa + S)``, ``D = 1 - (1 - b) eps``:
    ``1 - omega = 2 b eps / D``, ``1 - omega^2 = 4 b eps (1 - eps) / D^2``, ``db/dkappa = -2 b / S``, so
    ``domega/dkappa = -2 eps (1 - eps) / D^2 db/dkappa`` and ``dlog(1 - omega^2)/dkappa = -2 / S - 2 eps / D db/dkappa``.
    The score (value 0) is ``log pi - log pi.detach()`` with ``log pi = -(kappa - kappa.detach()) A_d + kappa omega +
    (d - 3)/2 log(1 - omega^2) + log(2 b) - 2 log D`` (the density of omega times |d omega / d eps|), whose derivative
    is ``-A_d + omega + kappa domega/dkappa + (d - 3)/2 dlog(1 - omega^2)/dkappa - 2 / S - 2 eps / D db/dkappa``.
    ``a_d`` None: no score (the third output is None)."""

    @staticmethod
    def forward(ctx, kappa: Tensor, eps: Tensor, a_d: Tensor | None, dim: int) -> tuple[Tensor, Tensor, Tensor | None]:  # type: ignore[override]
        omega, sin_theta, (root, b, denom) = _wood_values(kappa, eps, dim)
        ctx.save_for_backward(kappa, eps, root, b, denom, omega, sin_theta, a_d)
        ctx.dim = dim
        ctx.mark_non_differentiable(eps)
        return omega, sin_theta, (torch.zeros_like(omega) if a_d is not None else None)

    @staticmethod
    def backward(  # type: ignore[override]
        ctx, g_omega: Tensor | None, g_sin: Tensor | None, g_score: Tensor | None
    ) -> tuple[Tensor | None, None, None, None]:
        kappa, eps, root, b, denom, omega, sin_theta, a_d = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        db = -2 * b / root
        d_omega = -2 * eps * (1 - eps) / denom.square() * db
        d_log_q = -2 / root - 2 * eps / denom * db
        terms = []
        if g_omega is not None:
            terms.append(g_omega * d_omega)
        if g_sin is not None:
            terms.append(g_sin * (0.5 * sin_theta * d_log_q))
        if g_score is not None and a_d is not None:
            d_score = omega - a_d + kappa * d_omega + 0.5 * (ctx.dim - 3) * d_log_q - 2 / root - 2 * eps / denom * db
            terms.append(g_score * d_score)
        grad = sum(terms[1:], terms[0]) if terms else torch.zeros_like(omega)
        return grad, None, None, None


def _householder_values(
    mu: Tensor, x: Tensor, omega: Tensor, sin_theta: Tensor, radius: Tensor, normalize: bool, inplace: bool = False
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """The output of :class:`_HouseholderMap` and what its backward needs, in plain operations (differentiable by
    autograd, and what a torch.func transform runs; ``inplace``: the Function's forward, one output buffer)."""
    dtype = mu.dtype
    v_norm = torch.linalg.vector_norm(x[..., 1:], dim=-1)
    squared_norm = torch.linalg.vector_norm(mu, dim=-1).square()
    dot = torch.linalg.vecdot(x[..., 1:], mu[..., 1:])
    first = mu[..., 0]
    s = torch.where(first >= 0, 1.0, -1.0).to(dtype)
    if normalize:  # as F.normalize: a zero row stays finite
        inv_n = squared_norm.clamp_min(torch.finfo(dtype).tiny).rsqrt()
        q = squared_norm * inv_n.square()
    else:
        inv_n, q = torch.ones_like(squared_norm), squared_norm
    fh, dn = first * inv_n, dot * inv_n
    u1 = fh + s
    p = 0.5 * (1 + q) + s * fh
    ss = sin_theta / v_norm
    c = (u1 * omega + ss * dn) / p
    sr = s * radius
    alpha = sr * c * inv_n
    first_out = -sr * (omega - c * u1)
    if inplace:
        out = x * (-sr * ss).unsqueeze(-1)
        out.addcmul_(mu, alpha.unsqueeze(-1))
        out[..., 0] = first_out
    else:  # out of place: vmap has no batching rule for addcmul_, and autograd records these operations
        rest = torch.addcmul(x[..., 1:] * (-sr * ss).unsqueeze(-1), mu[..., 1:], alpha.unsqueeze(-1))
        out = torch.cat([first_out.unsqueeze(-1), rest], dim=-1)
    return out, (mu, x, omega, radius, s, squared_norm, inv_n, q, fh, dn, u1, p, ss, c, v_norm, alpha)


class _HouseholderMap(torch.autograd.Function):
    """The whole map of :func:`householder_sample` as one autograd node: row statistics, the per-row scalars and the
    output pass in the forward; in the backward two row dot products, the scalars' chain rule written out, and one
    pass for ``mu``.

    Per row, with ``f = mu_1``, ``n = |mu|`` (1 if not ``normalize``), ``q = |mu|^2 / n^2``, ``s = sign(f)``, ``fh = f / n``,
    ``dn = (mu_rest . v) / n``, ``ss = sin_theta / |v|``: ``u1 = fh + s``, ``P = |u|^2 / 2 = (1 + q) / 2 + s fh``,
    ``c = (u1 omega + ss dn) / P`` and, with ``sr = s r``, ``out_rest = (sr c / n) mu_rest - sr ss v``, ``out_1 = -sr
    (omega - c u1)``."""

    @staticmethod
    def forward(ctx, mu: Tensor, x: Tensor, omega: Tensor, sin_theta: Tensor, radius: Tensor, normalize: bool) -> Tensor:  # type: ignore[override]
        out, saved = _householder_values(mu, x, omega, sin_theta, radius, normalize, inplace=True)
        ctx.save_for_backward(*saved)
        ctx.normalize = normalize
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        mu, x, omega, radius, s, squared_norm, inv_n, q, fh, dn, u1, p, ss, c, v_norm, alpha = ctx.saved_tensors
        rest = grad[..., 1:]
        g_alpha = torch.linalg.vecdot(rest, mu[..., 1:])
        g_beta = torch.linalg.vecdot(rest, x[..., 1:])
        g_gamma = grad[..., 0]
        sr = s * radius
        # alpha = sr c / n, beta = -sr ss, gamma = -sr (omega - c u1)
        g_c = sr * (g_alpha * inv_n + g_gamma * u1)
        g_radius = s * (g_alpha * c * inv_n - g_beta * ss - g_gamma * (omega - c * u1))
        g_u1 = g_gamma * sr * c + g_c * omega / p
        g_omega = -g_gamma * sr + g_c * u1 / p
        g_ss = -g_beta * sr + g_c * dn / p
        g_dn = g_c * ss / p
        g_p = -g_c * c / p
        g_fh = g_u1 + s * g_p  # u1 = fh + s, P = (1 + q) / 2 + s fh
        g_q = 0.5 * g_p
        g_first, g_dot = g_fh * inv_n, g_dn * inv_n
        if ctx.normalize:  # fh = f / n, dn = dot / n, q = |mu|^2 / n^2, alpha = sr c / n, n = sqrt(max(|mu|^2, tiny))
            g_n = -(g_alpha * alpha + g_fh * fh + g_dn * dn + 2 * g_q * q) * inv_n
            unclamped = squared_norm > torch.finfo(mu.dtype).tiny
            g_sq = g_q * inv_n.square() + torch.where(unclamped, 0.5 * g_n * inv_n, 0.0)
        else:
            g_sq = g_q
        g_mu = None
        if ctx.needs_input_grad[0]:
            g_mu = grad * alpha.unsqueeze(-1)
            g_mu.addcmul_(x, g_dot.unsqueeze(-1))
            if g_mu.shape != mu.shape:
                g_mu = g_mu.sum_to_size(mu.shape)
                g_sq, g_first = g_sq.sum_to_size(mu.shape[:-1]), g_first.sum_to_size(mu.shape[:-1])
            g_mu.addcmul_(mu, 2 * g_sq.unsqueeze(-1))
            g_mu[..., 0] = g_first + 2 * g_sq * mu[..., 0]
            if mu.is_contiguous():  # in the parameter's layout (a transposed gradient, e.g. a column grouping's, would
                g_mu = g_mu.contiguous()  # be copied by autograd's accumulation, outside the compiled graph)
        return (
            g_mu,
            None,
            g_omega if ctx.needs_input_grad[2] else None,
            g_ss / v_norm if ctx.needs_input_grad[3] else None,
            g_radius if ctx.needs_input_grad[4] else None,
            None,
        )


def householder_sample(
    mu: Tensor,
    omega: Tensor,
    sin_theta: Tensor,
    radius: Tensor | None = None,
    normalize: bool = False,
    noise: Tensor | None = None,
) -> Tensor:
    """``radius * Q [omega, sin_theta * v / |v|]`` with ``v ~ N(0, I_{d-1})`` and Q orthogonal with ``Q e_1 = mu / |mu|``:
    the vMF sample built from Wood's component ``omega`` (and ``sin_theta = sqrt(1 - omega^2)``).

    ``mu`` is ``[..., d]``; ``omega``, ``sin_theta`` and ``radius`` are ``[*S, ...]`` (per sample and row). With
    ``normalize=False`` ``mu`` must already have unit norm; with ``normalize=True`` it may have any nonzero norm and the
    map uses ``mu / |mu|`` (the gradient then flows through the normalisation) without ever forming that matrix.

    Q = -s H with H the Householder reflection along ``u = mu/|mu| + s e_1``, ``s = sign(mu_1)``: ``|u|^2 = 2(1 +
    |mu_1|/|mu|) >= 2`` is never small, and H maps e_1 to ``-s mu/|mu|``. Every d-sized quantity is either a row
    statistic (``|mu|^2``, ``mu_rest . v``, ``|v|``) or the one output pass ``alpha mu + beta v``, and the whole map is
    one autograd node with a hand-written backward (``_HouseholderMap``; the tests check it by gradcheck). ``noise``
    (``[*S, ..., d]``, column 0 unused) replaces the normal draw (tests); without it ``v`` is drawn by
    :func:`varbnn.philox.randn`: torch's generator, or Philox's counter stream inside
    :func:`~varbnn.philox.counter_draws` (a compiled CPU step's draws, in its fused kernels rather than one generator
    call per tensor).
    """
    shape = omega.shape
    d, dtype = mu.shape[-1], mu.dtype
    x = philox.randn(torch.Size(shape) + (d,), dtype=dtype, device=mu.device) if noise is None else noise
    radius_t = torch.ones((), dtype=dtype, device=mu.device).expand(shape) if radius is None else radius.to(dtype)
    if functorch_active():  # e.g. predict's vmap over draws: plain operations (the Function is not transform-ready)
        return _householder_values(mu, x, omega.to(dtype), sin_theta.to(dtype), radius_t, normalize)[0]
    return _HouseholderMap.apply(mu, x, omega.to(dtype), sin_theta.to(dtype), radius_t, normalize)
