"""The speed machinery of the families whose sigma is ``softplus(rho)`` (MeanField, KTied's untied tensors, Radial): private,
not public API (names and behaviour may change; the families' public names are in :mod:`varbnn.families`).

What is here, and the measurement each part stands on:

* The per-step statistics: a training step's sigma, sigma^2 and the KL's ``sum(log sigma)``, ``sum(sigma^2)`` as the
  outputs of one autograd node per tensor (:class:`_SoftplusStats`, :class:`_SoftplusSample` for a draw), cached on
  the family until a backward pass reaches them (:func:`stats_per_step`, :func:`cache_until_backward`), so that the
  forward pass's and the KL's gradients meet in one backward; :class:`_CachedDraw` draws from a cached sigma.
* :class:`SoftplusGroup`: a model's softplus tensors' statistics in one node per step (host time):
  ``benchmarks/results/step-time/studies/ab_host_meanfield_softplus_group.md`` (0.807 of a step without it; local
  ``ab_host_meanfield_local_softplus_group.md`` 0.822, flipout ``ab_host_meanfield_flipout_softplus_group.md`` 0.814,
  Radial ``ab_host_radial_softplus_group.md`` 0.861; no change where the arithmetic dominates,
  ``ab_meanfield_softplus_group.md``).
* The KL's nodes with closed-form backwards (:func:`normal_kl_from_stats`, :func:`fused_normal_kl`).
* Inside a compiled step: :func:`softplus` traced as ``log1p(exp(min(rho, 20)))``
  (``benchmarks/results/step-time/studies/ab_meanfield_plain_softplus.md``, 0.980;
  ``ab_meanfield_local_plain_softplus.md`` 0.965, ``ab_radial_plain_softplus.md`` 0.968), and a tied sigma shared by
  the forward pass and the KL (:func:`share_sigmas_in_trace`: ``ab_ktied_shared_sigma.md`` 0.920), an elementwise one
  not (``ab_meanfield_shared_sigma.md``).

Which family takes which path is declared on its class (:attr:`~varbnn.families.VariationalFamily.softplus_group`,
:attr:`~varbnn.families.VariationalFamily.has_fused_sample`, :attr:`~varbnn.families.VariationalFamily.has_plain_scale`,
:attr:`~varbnn.families.VariationalFamily.share_sigma_in_trace`); this module only provides the paths.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from varbnn import philox
from varbnn._transforms import functorch_active as _functorch_active

__all__ = [
    "ScaleStats",
    "SOFTPLUS_THRESHOLD",
    "softplus",
    "step_key",
    "cache_until_backward",
    "share_sigmas_in_trace",
    "stats_per_step",
    "plain_stats",
    "SoftplusGroup",
    "join_softplus_groups",
    "group_stats",
    "cached_draw",
    "fused_sample",
    "softplus_sample",
    "softplus_stats",
    "cached_softplus",
    "normal_kl_from_stats",
    "fused_normal_kl",
]


def _clear_on_backward(family_ref: weakref.ref, attribute: str, grad: Any) -> None:  # type: ignore[type-arg]
    """Backward hook: a backward pass reached a per-step cached tensor; forget ``family.<attribute>`` (a plain attribute,
    set past ``nn.Module.__setattr__``'s checks: this runs once per cached tensor and step)."""
    family = family_ref()
    if family is not None:
        object.__setattr__(family, attribute, None)


def step_key(sources: tuple[torch.Tensor, ...]) -> tuple[Any, ...]:
    """Identity, version, storage, device and dtype of parameters: a per-step cache built from them is valid while this
    holds (the storage address catches ``param.data = ...``, e.g. ``vector_to_parameters``, which keeps the version)."""
    return tuple((id(t), t._version, t.data_ptr(), t.device, t.dtype) for t in sources)


def cache_until_backward(family: Any, attribute: str, tensors: Any) -> None:
    """Drop ``family.<attribute>`` as soon as a backward pass runs the autograd node that made any of ``tensors`` (None
    entries skipped).

    One pre-hook per distinct node (the outputs of one fused node, e.g. :class:`_SoftplusStats`, share one), so a step
    pays for one hook per cache rather than one per tensor; a leaf tensor gets a tensor hook. A gradient taken with
    respect to a cached tensor itself (``torch.autograd.grad(loss, [family.scale])``) does not run its node and leaves
    the cache in place; the cache's key (the parameters' versions) still retires it after the next optimiser step."""
    drop = functools.partial(_clear_on_backward, weakref.ref(family), attribute)
    nodes: list[Any] = []
    for tensor in tensors:
        if tensor is None:
            continue
        node = tensor.grad_fn
        if node is None:
            tensor.register_hook(drop)
        elif not any(node is seen for seen in nodes):
            nodes.append(node)
            node.register_prehook(drop)


ScaleStats = tuple[torch.Tensor, "torch.Tensor | None", torch.Tensor, torch.Tensor]

_step_sigmas: dict[int, torch.Tensor] | None = None  # a compiled training step's sigmas while torch.compile traces it


def share_sigmas_in_trace(active: bool) -> None:
    """Start (``True``) or end (``False``) sharing sigma within the compiled training step being traced
    (``fit(compile=...)``'s loss), for the families whose ``share_sigma_in_trace`` is true (KTied's tied tensors).
    Inside it the eager step's per-step node and cache are not used (they do not trace), so without sharing the forward
    pass and the KL each compute sigma and autograd runs sigma's backward once for each: for KTied, two pairs of its
    ``G V`` / ``G^T U`` GEMMs per tensor and step. An elementwise sigma (``softplus(rho)``) is not shared: inductor
    recomputes it inside the kernels that read it, where one shared node would be written out and read back (shared,
    a compiled MeanField step was 2.2% slower on the CPU:
    ``benchmarks/results/step-time/studies/ab_meanfield_shared_sigma.md``)."""
    global _step_sigmas
    _step_sigmas = {} if active else None


def _shared_sigma(family: Any, compute: Callable[[], torch.Tensor]) -> torch.Tensor | None:
    """The family's sigma shared within a compiled step's trace (computed by ``compute`` on first use), or None
    outside one."""
    if _step_sigmas is None or not getattr(family, "share_sigma_in_trace", False) or not torch.compiler.is_compiling():
        return None
    sigma = _step_sigmas.get(id(family))
    if sigma is None:
        sigma = _step_sigmas[id(family)] = compute()
    return sigma


def stats_per_step(
    family: Any,
    sources: tuple[torch.Tensor, ...],
    node: Callable[[bool], ScaleStats],
    plain: Callable[[bool], ScaleStats],
    with_square: bool = False,
) -> ScaleStats:
    """``(sigma, sigma^2 or None, sum(log sigma), sum(sigma^2))`` of a Gaussian family whose stds are computed from the
    parameters ``sources``, shared within a training step.

    While gradients are recorded, ``node(with_square)`` (an autograd Function whose backward can run more than once,
    e.g. :class:`_SoftplusStats`) is evaluated once per step and its outputs are shared by the forward pass (``sigma *
    eps``, or ``x^2 sigma^2`` with ``with_square``) and the KL (the two sums), so that all their gradients meet in the
    node's one backward. The cache (``family._scale_cache``) is keyed on the identity, version, device and dtype of the
    sources and dropped as soon as a backward pass reaches any output, so it never outlives the step; a cached node
    built without ``sigma^2`` serves it as ``sigma.square()``. Otherwise ``plain(with_square)``. The family must reset
    ``_scale_cache`` in ``__getstate__`` (copies, pickling).
    """
    if not _records_step(sources):
        shared = _shared_sigma(family, lambda: plain(False)[0])
        return plain(with_square) if shared is None else plain_stats(shared, with_square)
    key = step_key(sources)
    cached = _cached_stats(family, key)
    if cached is not None:
        sigma, square, sum_log, sum_sq = cached
        if with_square and square is None:
            square = sigma.square()
        return sigma, square, sum_log, sum_sq
    outputs = node(with_square)
    _cache_stats(family, key, outputs, sources)
    return outputs


def _records_step(sources: tuple[torch.Tensor, ...]) -> bool:
    """Whether this is a recorded training step that the fused nodes and the per-step cache serve: gradients recorded
    for a source, outside torch.func transforms and torch.compile (where the plain ops, which inductor fuses, are used:
    the fused node's ctx-held tensors and the cache's backward hooks do not trace to the same gradients)."""
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in sources)) or _functorch_active():
        return False
    return not torch.compiler.is_compiling()


def _cached_stats(family: Any, key: tuple[Any, ...]) -> ScaleStats | None:
    cache = family._scale_cache
    return cache[1] if cache is not None and cache[0] == key else None


def _cache_stats(family: Any, key: tuple[Any, ...], outputs: Any, sources: tuple[torch.Tensor, ...]) -> None:
    cache_until_backward(family, "_scale_cache", outputs)
    # the sources are held so that their ids stay theirs; a plain attribute, set past nn.Module.__setattr__
    object.__setattr__(family, "_scale_cache", (key, outputs, sources))


SOFTPLUS_THRESHOLD = 20.0
"""Above it ``softplus(x) = x`` in float arithmetic (torch's default threshold)."""


def softplus(rho: torch.Tensor) -> torch.Tensor:
    """``F.softplus(rho)``; while :func:`torch.compile` traces, the same values as ``log1p(t)`` with
    ``t = exp(min(rho, 20))`` (``rho`` itself above 20), so that autograd's derivative ``t / (1 + t)`` reuses ``t``:
    a compiled backward evaluates one exponential per element where softplus's own backward formula recomputes
    ``exp(rho)`` beside the ``exp(rho)`` of sigma's recomputation (inductor did not merge the two)."""
    if not torch.compiler.is_compiling():
        return F.softplus(rho)
    t = torch.exp(rho.clamp_max(SOFTPLUS_THRESHOLD))  # clamped: exp of a large rho would be inf, and 0 * inf NaN
    return torch.where(rho > SOFTPLUS_THRESHOLD, rho, torch.log1p(t))


def plain_stats(sigma: torch.Tensor, with_square: bool) -> ScaleStats:
    """The same four values computed directly from ``sigma`` (no fusion; outside training steps)."""
    flat = sigma.reshape(-1)
    return sigma, sigma.square() if with_square else None, torch.log(sigma).sum(), torch.dot(flat, flat)


class _SoftplusStats(torch.autograd.Function):
    """``sigma = softplus(rho)``, optionally ``sigma^2``, and the KL's sigma statistics ``sum(log sigma)`` and
    ``sum(sigma^2)`` as outputs of one node, so that everything a mean-field step does with sigma (the forward pass's
    ``sigma * eps`` or ``x^2 sigma^2``, and the KL) meets in one backward:

        d/d rho = sigmoid(rho) * (g_sigma + 2 sigma (g_square + g_sumsq) + g_sumlog / sigma)

    a handful of passes over the tensor instead of the separate backwards of the square, the KL and the softplus and
    the accumulations between them. The backward can run more than once, e.g. for the NLL and the KL differentiated
    apart (``rho`` and a detached ``sigma`` are kept on ``ctx`` rather than as saved tensors that autograd frees after
    the first backward)."""

    @staticmethod
    def forward(
        ctx, rho: torch.Tensor, with_square: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:  # type: ignore[override]
        sigma = F.softplus(rho)
        square = sigma * sigma if with_square else None
        flat = sigma.reshape(-1)
        sum_sq = square.sum() if square is not None else torch.dot(flat, flat)
        ctx.rho, ctx.sigma = rho, sigma.detach()
        ctx.set_materialize_grads(False)
        return sigma, square, torch.log(sigma).sum(), sum_sq

    @staticmethod
    def backward(  # type: ignore[override]
        ctx, g_sigma: torch.Tensor | None, g_square: torch.Tensor | None, g_log: torch.Tensor | None, g_sq: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, None]:
        parts = [None if g is None else [g] for g in (g_sigma, g_square, g_log, g_sq)]
        return _softplus_rho_grads([ctx.sigma], [ctx.rho.detach()], *parts)[0], None


class _SoftplusSample(_SoftplusStats):
    """``w = loc + softplus(rho) * eps`` together with :class:`_SoftplusStats`'s outputs ``(sigma, sum(log sigma),
    sum(sigma^2))``, one node: a reparameterised draw's own gradient meets the KL's in the same backward,

        d/d loc = g_w,   d/d rho = sigmoid(rho) * (g_w eps + g_sigma + 2 sigma g_sumsq + g_sumlog / sigma)

    (one node and one pass fewer per tensor and step than an ``addcmul`` after the statistics node)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, loc: torch.Tensor, rho: torch.Tensor, eps: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        sigma = F.softplus(rho)
        flat = sigma.reshape(-1)
        ctx.rho, ctx.sigma = rho, sigma.detach()
        ctx.save_for_backward(eps)  # as _CachedDraw does: activation checkpointing compares what both paths save
        ctx.set_materialize_grads(False)
        return torch.addcmul(loc, sigma, eps), sigma, torch.log(sigma).sum(), torch.dot(flat, flat)

    @staticmethod
    def backward(  # type: ignore[override]
        ctx, g_w: torch.Tensor | None, g_sigma: torch.Tensor | None, g_log: torch.Tensor | None, g_sq: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        if g_w is not None:  # eps only when the draw has a gradient: the KL's part may run again without it
            (eps,) = ctx.saved_tensors
            g_sigma = g_w * eps if g_sigma is None else torch.addcmul(g_sigma, g_w, eps)
        grad_rho = _SoftplusStats.backward(ctx, g_sigma, None, g_log, g_sq)[0]
        return g_w, grad_rho, None


def _softplus_rho_grads(
    sigmas: list[torch.Tensor],
    rhos: list[torch.Tensor],
    g_sigma: list[torch.Tensor] | None,
    g_square: list[torch.Tensor] | None,
    g_log: list[torch.Tensor] | None,
    g_sq: list[torch.Tensor] | None,
) -> list[torch.Tensor | None]:
    """``sigmoid(rho) * (g_sigma + 2 sigma (g_square + g_sumsq) + g_sumlog / sigma)`` (None parts left out; None if
    all are): the gradients of rho from those of sigma, sigma^2 and the two sums (:class:`_SoftplusStats`), for
    several tensors whose outputs got gradients alike (each part a list, or None for all), by ``torch._foreach_*``
    operations: one call per operation for all of them (on the CPU each tensor's own operation)."""
    grad: Any = None  # a list or tuple of tensors (torch._foreach_* return tuples)
    if g_square is not None:  # 2 sigma (g_square + g_sq)
        doubled = torch._foreach_mul(g_sq, 2) if g_sq is not None else None
        grad = torch._foreach_add(doubled, g_square, alpha=2) if doubled is not None else torch._foreach_mul(g_square, 2)
        torch._foreach_mul_(grad, sigmas)
    elif g_sq is not None:
        grad = torch._foreach_mul(sigmas, torch._foreach_mul(g_sq, 2))
    if g_log is not None:
        if grad is None:
            grad = torch._foreach_div(g_log, sigmas)
        else:
            torch._foreach_addcdiv_(grad, [g.expand_as(sigma) for g, sigma in zip(g_log, sigmas, strict=True)], sigmas)
    if g_sigma is not None:
        if grad is None:
            grad = [g.clone() for g in g_sigma]
        else:
            torch._foreach_add_(grad, g_sigma)
    if grad is None:
        return [None] * len(sigmas)
    torch._foreach_mul_(grad, torch._foreach_sigmoid(rhos))
    return list(grad)


class _SoftplusStatsGroup(torch.autograd.Function):
    """:class:`_SoftplusStats` for several tensors at once: inputs ``squares`` (per tensor, whether to output
    ``sigma^2``, as ``with_square``) and ``rho_1..rho_n``; outputs ``sigma_1..sigma_n``, ``sigma_1^2..`` (None where not
    asked for), ``sum(log sigma_1)..`` and ``sum(sigma_1^2)..``. The same operations per tensor, so the same numbers, in
    one autograd node and one Python backward for the whole group instead of a node, a backward hook and one or two
    Python backwards per tensor: the host time of a step (:class:`SoftplusGroup`)."""

    @staticmethod
    def forward(ctx, squares: tuple[bool, ...], *rhos: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        sigmas = [F.softplus(rho) for rho in rhos]
        squared = [sigma * sigma if square else None for sigma, square in zip(sigmas, squares, strict=True)]
        sum_logs = [torch.log(sigma).sum() for sigma in sigmas]
        sum_sqs = [
            torch.dot(sigma.reshape(-1), sigma.reshape(-1)) if square is None else square.sum()
            for sigma, square in zip(sigmas, squared, strict=True)
        ]
        ctx.rhos, ctx.sigmas = rhos, [sigma.detach() for sigma in sigmas]  # on ctx: the backward may run again
        ctx.set_materialize_grads(False)
        return (*sigmas, *squared, *sum_logs, *sum_sqs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        n = len(ctx.rhos)
        by_kind: dict[tuple[bool, ...], list[int]] = {}  # the tensors whose outputs got gradients alike
        for i in range(n):
            by_kind.setdefault(tuple(grads[k * n + i] is not None for k in range(4)), []).append(i)
        result: list[torch.Tensor | None] = [None] * n
        for kind, members in by_kind.items():
            parts: list[Any] = [[grads[k * n + i] for i in members] if kind[k] else None for k in range(4)]
            sigmas, rhos = [ctx.sigmas[i] for i in members], [ctx.rhos[i].detach() for i in members]
            for i, grad in zip(members, _softplus_rho_grads(sigmas, rhos, *parts), strict=True):
                result[i] = grad
        return (None, *result)


class SoftplusGroup:
    """A model's families whose ``sigma = softplus(rho)`` statistics are computed together in a training step.

    :func:`varbnn.kl` of a model (so every ELBO step) makes the group of its eligible families, per device and dtype
    (unpruned MeanField and Radial tensors whose sigma is softplus(rho), any estimator but Graves':
    ``_softplus_group_eligible``); in the next steps the first of them to need its statistics (its first draw, its
    sigma, or the KL) computes those of every member that records the step in one :class:`_SoftplusStatsGroup` node
    (with ``sigma^2`` for the local estimator's members), and a member's draw ``loc + sigma * eps`` is one
    ``torch.addcmul`` from its cached sigma. The numbers are those of the member's own nodes (:class:`_SoftplusSample`,
    :class:`_SoftplusStats`): the same operations, and ``eps`` drawn where the member's forward pass draws it. What
    changes is a step's host time (the Python, autograd and dispatch work that bounds an eager step on a GPU): a
    MeanField-reparam step of an 11-layer MLP of 8 units at batch 4 took 0.81x the time
    (``benchmarks/results/step-time/studies/ab_host_meanfield_softplus_group.md``)."""

    __slots__ = ("members", "ids", "__weakref__")

    def __init__(self, families: list[Any]) -> None:
        self.members = tuple(weakref.ref(family) for family in families)
        self.ids = frozenset(id(family) for family in families)

    def holds(self, families: list[Any]) -> bool:
        """Whether every one of ``families`` is a live member of this group."""
        return all(id(family) in self.ids and family.__dict__.get("_softplus_group") is self for family in families)

    def compute(self) -> bool:
        """The statistics of every live member that records this step and has none cached, in one node, cached as the
        members' step statistics; False (nothing done) if fewer than two members need them."""
        families, keys = [], []
        for ref in self.members:
            family = ref()
            if family is None or family.__dict__.get("_softplus_group") is not self or not family._softplus_group_eligible():
                continue
            rho = family.rho
            if not rho.requires_grad:
                continue
            key = step_key((rho,))
            if _cached_stats(family, key) is None:
                families.append(family)
                keys.append(key)
        n = len(families)
        if n < 2:
            return False
        squares = tuple(family.estimator == "local" for family in families)  # the local estimator's x^2 sigma^2
        outputs = _SoftplusStatsGroup.apply(squares, *(family.rho for family in families))
        refs = tuple(weakref.ref(family) for family in families)
        outputs[0].grad_fn.register_prehook(functools.partial(_clear_group_on_backward, refs))
        for i, family in enumerate(families):
            stats = (outputs[i], outputs[n + i], outputs[2 * n + i], outputs[3 * n + i])
            # the sources are held so that their ids stay theirs; "grouped": draws from it are plain addcmuls
            object.__setattr__(family, "_scale_cache", (keys[i], stats, (family.rho,), True))
        return True


def _clear_group_on_backward(refs: tuple[Any, ...], *_: Any) -> None:
    """Backward pre-hook of a group's statistics node: forget every member's step statistics."""
    for ref in refs:
        family = ref()
        if family is not None:
            object.__setattr__(family, "_scale_cache", None)


def join_softplus_groups(families: list[Any]) -> None:
    """Make ``families`` (eligible, one device and dtype each list) one :class:`SoftplusGroup`, unless they already
    belong to one (which may hold more: ``kl`` of a part of a model keeps the whole model's group); a family of an
    earlier group that is not in the list leaves it (``_softplus_group`` None)."""
    if not families:
        return
    group = families[0].__dict__.get("_softplus_group")
    if group is not None and group.holds(families):
        return
    if len(families) < 2:
        families[0].__dict__.pop("_softplus_group", None)
        return
    new = SoftplusGroup(families)
    for family in families:
        old = family.__dict__.get("_softplus_group")
        if old is not None and old is not new:
            for ref in old.members:  # an earlier group's members that are not in this one leave it
                member = ref()
                if member is not None and member.__dict__.get("_softplus_group") is old:
                    member.__dict__.pop("_softplus_group", None)
        object.__setattr__(family, "_softplus_group", new)


def group_stats(family: Any) -> ScaleStats | None:
    """The family's step statistics ``(sigma, sigma^2 or None, sum(log sigma), sum(sigma^2))`` from its
    :class:`SoftplusGroup` (``sigma^2`` for the local estimator's members; computed now, with those of the group's
    other members, if none are cached), within a recorded training step; None otherwise (no group, not a recorded step,
    statistics of this step made another way, or too few members needing them): the caller takes its usual path."""
    group = family.__dict__.get("_softplus_group")
    if group is None or id(family) not in group.ids:  # not a member: e.g. an nn.DataParallel replica's shallow copy
        return None
    rho = family.rho
    if not _records_step((rho,)):
        return None
    key = step_key((rho,))
    cache = family._scale_cache
    if cache is None or cache[0] != key:
        if not group.compute():
            return None
        cache = family._scale_cache
        if cache is None or cache[0] != key:
            return None
    return cache[1] if len(cache) > 3 else None


class _CachedDraw(torch.autograd.Function):
    """``loc + sigma * eps`` (as ``torch.addcmul``) saving only ``eps``, like the fused draw nodes: a draw from a step's
    cached sigma. Activation checkpointing (``torch.utils.checkpoint``, non-reentrant) recomputes a forward pass whose
    first run drew through :class:`_SoftplusSample` while the recomputation finds the statistics cached, and requires
    both runs to save tensors of the same shapes."""

    @staticmethod
    def forward(ctx, loc: torch.Tensor, sigma: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(eps)
        return torch.addcmul(loc, sigma, eps)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:  # type: ignore[override]
        (eps,) = ctx.saved_tensors
        return grad, grad * eps, None


def cached_draw(family: Any, sources: tuple[torch.Tensor, ...], sigma: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """``family.loc + sigma * eps``: through :class:`_CachedDraw` within a recorded training step (the fused draw's
    counterpart when the step's statistics are already cached), else ``torch.addcmul``."""
    if _records_step(sources) and not _cache_grouped(family):
        return _CachedDraw.apply(family.loc, sigma, eps)
    return torch.addcmul(family.loc, sigma, eps)


def _cache_grouped(family: Any) -> bool:
    """Whether the family's cached step statistics came from a :class:`SoftplusGroup` (its draws are then plain
    ``torch.addcmul`` calls: a recomputation under activation checkpointing finds the same cache and saves the same)."""
    cache = family._scale_cache
    return cache is not None and len(cache) > 3


def fused_sample(
    family: Any,
    sources: tuple[torch.Tensor, ...],
    draw: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]],
    noise: Callable[[], torch.Tensor] | None = None,
) -> torch.Tensor | None:
    """One reparameterised draw ``loc + sigma * eps`` through a node that also outputs sigma's statistics,
    ``draw(eps) -> (w, sigma, sum(log sigma), sum(sigma^2))`` (e.g. :class:`_SoftplusSample`), whose statistics become
    the step's cached ones (:func:`stats_per_step`), within a recorded training step whose statistics are not cached
    yet; ``None`` otherwise (the caller draws from the cached or plain statistics). ``noise()`` makes ``eps`` (default:
    ``N(0, I)`` of the weight's shape; Radial passes its direction times radius); it is called only when the node is
    used."""
    if not _records_step(sources):
        return None
    key = step_key(sources)
    if _cached_stats(family, key) is not None:
        return None
    loc = family.loc
    eps = noise() if noise is not None else philox.randn(loc.shape, dtype=loc.dtype, device=loc.device)
    w, sigma, sum_log, sum_sq = draw(eps)
    _cache_stats(family, key, (sigma, None, sum_log, sum_sq), sources)
    return w


def softplus_sample(family: Any, noise: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
    """:func:`fused_sample` for ``sigma = softplus(family.rho)`` through :class:`_SoftplusSample`."""
    loc, rho = family.loc, family.rho
    return fused_sample(family, (rho,), lambda eps: _SoftplusSample.apply(loc, rho, eps), noise)


def softplus_stats(family: Any, with_square: bool = False) -> ScaleStats:
    """:func:`stats_per_step` for ``sigma = softplus(family.rho)`` through one :class:`_SoftplusStats` node."""
    rho = family.rho
    if "_softplus_group" in family.__dict__:
        stats = group_stats(family)  # the group's statistics, computed now if none are cached
        if stats is not None and (stats[1] is not None or not with_square):
            return stats
    return stats_per_step(
        family,
        (rho,),
        lambda square: _SoftplusStats.apply(rho, square),
        lambda square: plain_stats(softplus(rho), square),
        with_square,
    )


def cached_softplus(family: Any) -> torch.Tensor:
    """``softplus(family.rho)``, shared within a training step by the forward pass and the KL (:func:`softplus_stats`):
    one softplus and one fused backward per step; outside training steps the softplus alone."""
    rho = family.rho
    if not _records_step((rho,)):
        shared = _shared_sigma(family, lambda: softplus(rho))
        return softplus(rho) if shared is None else shared
    return softplus_stats(family)[0]


def normal_kl_from_stats(
    loc: torch.Tensor,
    sum_log_sigma: torch.Tensor,
    sum_sq_sigma: torch.Tensor,
    prior_loc: torch.Tensor,
    prior_scale: torch.Tensor,
    var_scale: float = 1.0,
) -> torch.Tensor:
    """``sum[log s - log sigma + (var_scale sigma^2 + (loc - m)^2) / (2 s^2) - 1/2]`` for a SCALAR prior scale ``s``
    from the sigma statistics of :func:`softplus_stats` (prior mean ``m`` scalar or elementwise): the same value as
    :func:`fused_normal_kl`, with the sigma part's gradient flowing into the statistics' fused node."""
    if prior_scale.dim() != 0:
        raise ValueError(f"normal_kl_from_stats needs a scalar prior scale, got shape {tuple(prior_scale.shape)}")
    plain = _functorch_active()  # a torch.func transform: plain operations (the Functions are not transform-ready)
    if not (plain or prior_scale.requires_grad or prior_loc.requires_grad):  # one node with a closed-form backward
        return _NormalKLFromStats.apply(loc, sum_log_sigma, sum_sq_sigma, prior_loc, prior_scale, var_scale)
    n = loc.numel()
    half_precision = 0.5 / prior_scale.square()
    quadratic = (loc - prior_loc).square().sum() if plain else _SquaredDistance.apply(loc, prior_loc)
    if var_scale != 1.0:
        sum_sq_sigma = sum_sq_sigma * var_scale
    return n * prior_scale.log() - sum_log_sigma + (sum_sq_sigma + quadratic) * half_precision - 0.5 * n


class _NormalKLFromStats(torch.autograd.Function):
    """:func:`normal_kl_from_stats` as one autograd node (a prior that is not trained by gradient): the value from a
    handful of scalar operations, and the backward in closed form,

        dKL/dloc = (loc - m) / s^2,   dKL/d sum(log sigma) = -1,   dKL/d sum(sigma^2) = var_scale / (2 s^2),

    instead of a dozen recorded scalar operations and their backward nodes per tensor and step (host time, which
    bounds an eager step on a GPU)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        loc: torch.Tensor,
        sum_log_sigma: torch.Tensor,
        sum_sq_sigma: torch.Tensor,
        prior_loc: torch.Tensor,
        prior_scale: torch.Tensor,
        var_scale: float,
    ) -> torch.Tensor:
        n = loc.numel()
        diff = loc - prior_loc
        flat = diff.reshape(-1)
        half_precision = prior_scale.square().reciprocal().mul_(0.5)  # not 0.5 / t: Tensor.__rdiv__ is Python
        sum_sq = sum_sq_sigma * var_scale if var_scale != 1.0 else sum_sq_sigma
        ctx.save_for_backward(diff, half_precision)
        ctx.var_scale = var_scale
        return n * prior_scale.log() - sum_log_sigma + (sum_sq + torch.dot(flat, flat)) * half_precision - 0.5 * n

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        diff, half_precision = ctx.saved_tensors
        scaled = grad * half_precision
        grad_loc = diff * (2 * scaled) if ctx.needs_input_grad[0] else None
        grad_log = -grad if ctx.needs_input_grad[1] else None
        grad_sq = scaled * ctx.var_scale if ctx.needs_input_grad[2] else None
        return grad_loc, grad_log, grad_sq, None, None, None


class _SquaredDistance(torch.autograd.Function):
    """``sum((loc - m)^2)`` with the backward ``2 g (loc - m)`` for ``loc`` (one pass; none for the prior mean ``m``,
    which the priors never train by gradient)."""

    @staticmethod
    def forward(ctx, loc: torch.Tensor, prior_loc: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        diff = loc - prior_loc
        ctx.save_for_backward(diff)
        flat = diff.reshape(-1)
        return torch.dot(flat, flat)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (diff,) = ctx.saved_tensors
        return diff * (2 * grad), None


class _MeanFieldNormalKL(torch.autograd.Function):
    """KL(N(loc, v sigma^2) || N(m, s^2)) summed over the tensor (v = ``var_scale``, 1 for MeanField), up to the constant
    ``n log(v) / 2``, with its gradient in closed form:

        KL = sum[ log s - log sigma + (v sigma^2 + (loc - m)^2) / (2 s^2) - 1/2 ]
        dKL/dloc = (loc - m) / s^2,      dKL/dsigma = v sigma / s^2 - 1 / sigma

    ``sigma`` is the family's (cached) ``softplus(rho)``, so autograd adds the sigmoid(rho) factor once for
    the forward pass and the KL together. A handful of passes instead of the ~30 elementwise kernels of the
    generic distribution path. (``v = 1/D`` gives the radial family's closed form, whose elementwise variance is
    sigma^2 / D.)
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, loc: torch.Tensor, sigma: torch.Tensor, prior_loc: torch.Tensor, prior_scale: torch.Tensor, var_scale: float = 1.0
    ) -> torch.Tensor:
        diff = loc - prior_loc
        inv_var = prior_scale.reciprocal().square()
        if prior_scale.dim() == 0 and prior_loc.dim() == 0:
            flat_sigma, flat_diff = sigma.reshape(-1), diff.reshape(-1)
            quadratic = (var_scale * torch.dot(flat_sigma, flat_sigma) + torch.dot(flat_diff, flat_diff)) * inv_var
            log_prior = prior_scale.log() * loc.numel()
        else:
            quadratic = ((var_scale * sigma.square() + diff.square()) * inv_var).sum()
            log_prior = prior_scale.log().expand_as(loc).sum()
        ctx.save_for_backward(diff, sigma, inv_var)
        ctx.var_scale = var_scale
        return log_prior - sigma.log().sum() + 0.5 * quadratic - 0.5 * loc.numel()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        diff, sigma, inv_var = ctx.saved_tensors
        scaled = inv_var * grad
        grad_loc = diff * scaled
        grad_sigma = sigma.reciprocal().mul_(-grad).addcmul_(sigma, scaled * ctx.var_scale)
        return grad_loc, grad_sigma, None, None, None


def fused_normal_kl(
    loc: torch.Tensor, sigma: torch.Tensor, prior_loc: torch.Tensor, prior_scale: torch.Tensor, var_scale: float = 1.0
) -> torch.Tensor:
    """``sum[log s - log sigma + (var_scale sigma^2 + (loc - m)^2) / (2 s^2) - 1/2]`` with a closed-form backward: the
    Gaussian KL for ``var_scale=1``; the radial family's closed form (up to constants) for ``var_scale=1/D``."""
    return _MeanFieldNormalKL.apply(loc, sigma, prior_loc, prior_scale, var_scale)
