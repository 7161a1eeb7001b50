"""The compiled training step of ``fit(compile=...)``: :func:`torch.compile` modes, CUDA graphs, the families' inductor
options."""

from __future__ import annotations

import math
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from varbnn import philox
from varbnn._fast.softplus import share_sigmas_in_trace
from varbnn.families.base import VariationalFamily
from varbnn.objectives import (
    ELBOTerms,
    elbo_objective,
)
from varbnn.training.setup import NLLFunction

_COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile_mode(compile: bool | str) -> str:
    """The torch.compile mode of ``fit(compile=...)``'s value (``True``: ``"default"``; a mode string as it is), or a
    ``ValueError`` naming the allowed values (``False`` is not a mode: the caller skips compiling)."""
    if compile is True:
        return "default"
    if isinstance(compile, str) and compile in _COMPILE_MODES:
        return compile
    raise ValueError(f"compile must be True, False or one of the modes {list(_COMPILE_MODES)}, got {compile!r}")


def _static_batches(loader: object) -> bool:
    """Whether every batch of ``loader`` has the same shape: a ``DataLoader`` of a fixed ``batch_size`` with
    ``drop_last``, or whose sampler's count it divides (a map-style dataset). Other iterables: not known, False."""
    from torch.utils.data import BatchSampler, DataLoader, IterableDataset

    if not isinstance(loader, DataLoader) or not isinstance(loader.batch_size, int) or loader.batch_size < 1:
        return False
    if loader.drop_last:
        return True
    if isinstance(loader.dataset, IterableDataset) or type(loader.batch_sampler) is not BatchSampler:
        return False  # (its workers each end with a partial batch; a custom batch sampler: not known)
    try:
        return len(loader.sampler) % loader.batch_size == 0  # type: ignore[arg-type]  # the sampler's count
    except TypeError:  # a sampler without a length
        return False


def _uses_cudagraphs(mode: str, device: torch.device) -> bool:
    """Whether torch.compile's ``mode`` records CUDA graphs on ``device`` ("reduce-overhead", "max-autotune" on CUDA)."""
    import torch._inductor

    return device.type == "cuda" and bool(torch._inductor.list_mode_options(mode).get("triton.cudagraphs"))


def _fit_compile_mode(compile: bool | str, device: torch.device, loader: object) -> str:
    """``fit``'s torch.compile mode: a mode string as given; ``True`` is ``"reduce-overhead"`` (CUDA graphs: the
    step's kernels replay as one launch) on a CUDA device when every batch has the same shape, else ``"default"``."""
    mode = compile_mode(compile)
    if compile is True and device.type == "cuda" and _static_batches(loader):
        return "reduce-overhead"
    return mode


def _own_code(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with a code object of its own. torch.compile keeps its cache of compiled graphs, and counts
    recompilations against ``torch._dynamo.config.recompile_limit`` (8), per code object: every ``fit(compile=True)``
    shares its loss function's code, so the models of one process (one per structure: family, estimator, layers)
    would fill one cache, and from the ninth on the step would run eager with only a log warning. A copy per step keeps
    each fit's graphs to itself, and frees them with it."""
    return types.FunctionType(
        function.__code__.replace(), function.__globals__, function.__name__, function.__defaults__, function.__closure__
    )


def _family_inductor_options(model: nn.Module) -> dict[str, Any]:
    """The inductor options a model's families ask for (:attr:`~varbnn.families.VariationalFamily.inductor_options`),
    merged; ``realize_opcount_threshold`` takes the lowest asked for (every family asks for a lower one than
    inductor's default or none)."""
    options: dict[str, Any] = {}
    for module in model.modules():
        if isinstance(module, VariationalFamily):
            for key, value in module.inductor_options.items():
                options[key] = min(options[key], value) if key == "realize_opcount_threshold" and key in options else value
    return options


COMPILED_DRAWS = ("counter", "generator", "inductor")


"""Where a compiled step's weight noise can come from (``_compiled_elbo_step``'s ``draws``)."""


def _compiled_elbo_step(
    model: nn.Module,
    nll: NLLFunction,
    n_data: int,
    device: torch.device,
    compile: bool | str,
    *,
    graves: bool = False,
    distributed: bool = False,
    draws: str | None = None,
    backend: str | Callable[..., Any] = "inductor",
) -> Callable[[torch.Tensor, torch.Tensor, float, int], ELBOTerms]:
    """``fit(compile=...)``'s step: ``step(x, y, beta, samples)`` accumulates the same ``.grad`` as
    :func:`~varbnn.training.loop._accumulated_elbo_gradient` from a :func:`torch.compile`-d loss (the forward, the NLL,
    the KL and the score correction of :func:`varbnn.objectives.elbo_loss`; ``beta`` a 0-d tensor input). ``draws``:
    where the weight noise comes from: ``"counter"`` (the CPU's default) :mod:`varbnn.philox`'s generator inside the
    compiled kernels, one key per call drawn from torch's generator; ``"inductor"`` (every other device's default)
    inductor's own in-kernel generator; ``"generator"`` torch's generator, called as the eager step calls it (the same
    numbers for the same seed). Other random calls (RDP's rejection rounds) use torch's generator in every mode but
    ``"inductor"``. ``backend`` another torch.compile backend, a name or a callable (the tests trace every family with
    ``"aot_eager"``: the same graph capture and compiled backward, without inductor's slow code generation)."""
    mode = compile_mode(compile)
    if graves:
        raise ValueError(
            "compile= is not available with MeanField(estimator='graves'): its per-example Fisher gradients "
            "(varbnn.objectives.graves_gradients) do not come from the loss's backward, which is what compile= compiles"
        )
    if distributed:
        raise ValueError("compile= is not available with distributed training yet: train with compile=False")

    refused = {type(m).__name__: m.compile_unsupported for m in model.modules()
               if isinstance(m, VariationalFamily) and m.compile_unsupported}  # fmt: skip
    if refused:
        reasons = "; ".join(f"{name}: {why}" for name, why in sorted(refused.items()))
        raise ValueError(f"compile= is not available yet for this model ({reasons}); train it with compile=False")

    if draws is None:
        draws = "counter" if device.type == "cpu" else "inductor"
    if draws not in COMPILED_DRAWS:
        raise ValueError(f"draws must be one of {COMPILED_DRAWS}, got {draws!r}")
    counter = draws == "counter"

    def loss_terms(
        x: torch.Tensor, y: torch.Tensor, beta: torch.Tensor, key: torch.Tensor | None
    ) -> tuple[torch.Tensor, ...]:
        share_sigmas_in_trace(True)  # one sigma per Gaussian family for the forward pass and the KL
        if key is not None:
            philox.begin_counter_draws(key)
        try:
            nll_value = nll(model(x), y)
            if not isinstance(nll_value, torch.Tensor) or nll_value.dim() != 0:
                raise ValueError("nll must return a scalar tensor (the batch-mean NLL)")
            loss, kl_total = elbo_objective(nll_value, model, n_data, beta)
        finally:
            share_sigmas_in_trace(False)
            if key is not None:
                philox.end_counter_draws()
        return loss, nll_value.detach(), kl_total.detach()

    import torch._inductor

    options = dict(torch._inductor.list_mode_options(mode))
    options["fallback_random"] = draws != "inductor"
    if device.type == "cpu":
        options.update(_family_inductor_options(model))
    # CUDA graphs ("reduce-overhead", "max-autotune"): each step is a new generation of torch's cudagraph trees (the
    # previous step's outputs may be overwritten), so the step marks its start and returns copies of its 0-d outputs
    cudagraphs = _uses_cudagraphs(mode, device)
    # torch.compile turns torch.distributions' global argument validation off (when it is called, and again while it
    # traces) and leaves it off: the user's setting is read before and restored after each, or every distribution
    # built after fit(compile=True) would stop validating
    validate = torch.distributions.Distribution._validate_args
    try:
        if backend == "inductor":
            compiled = torch.compile(_own_code(loss_terms), options=options)
        else:
            compiled = torch.compile(_own_code(loss_terms), backend=backend)
    finally:
        torch.distributions.Distribution.set_default_validate_args(validate)

    # beta's tensor, refilled each step: fill_ with a number is a kernel argument, where torch.tensor(beta, device=...)
    # would copy from host memory and (a blocking copy) wait for the device every step
    beta_t = torch.zeros((), device=device)

    def step(x: torch.Tensor, y: torch.Tensor, beta: float, samples: int) -> ELBOTerms:
        if not (math.isfinite(beta) and beta >= 0):
            raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
        beta_t.fill_(float(beta))
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        parts = []
        for _ in range(samples):
            try:
                key = philox.new_key(device) if counter else None
                loss, nll_value, kl_total = compiled(x, y, beta_t, key)
                (loss / samples if samples > 1 else loss).backward()
            finally:
                torch.distributions.Distribution.set_default_validate_args(validate)
            if cudagraphs:  # the graph's output buffers are reused by the next replay
                nll_value, kl_total = nll_value.clone(), kl_total.clone()
                parts.append((loss.detach().clone(), nll_value, kl_total))
            else:
                parts.append((loss.detach(), nll_value, kl_total))
        if samples == 1:
            loss, nll_value, kl_total = parts[0]
        else:
            loss, nll_value, kl_total = (torch.stack(values).mean() for values in zip(*parts))
        return ELBOTerms(loss=loss, nll=nll_value, kl=kl_total, kl_weight=float(beta), n_data=n_data)

    return step
