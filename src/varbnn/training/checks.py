"""Non-finite detection in training (:class:`NonFiniteError`), the deferred checks of a GPU step, and the checks of
the loader against ``n_data``."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import torch

from varbnn.objectives import (
    ELBOTerms,
)


class NonFiniteError(ValueError, FloatingPointError):
    """A NaN or infinite value met in training.

    ``kind`` says where: ``"data"`` (a batch's inputs or floating-point targets), ``"loss"`` (the step's loss),
    ``"gradient"`` (a parameter's gradient after ``backward``, before ``optimizer.step``) or ``"parameters"`` (a
    parameter, checked before a checkpoint is written); ``epoch`` (1-based), ``step`` (the global optimizer step the
    batch was for, 1-based, as in ``on_step_end``) and ``batch`` (0-based index within the epoch) say when, ``None``
    outside a training step. Both a ``ValueError`` (bad data) and a ``FloatingPointError`` (numerics), so either
    ``except`` clause catches it.
    """

    def __init__(
        self, message: str, *, kind: str = "", epoch: int | None = None, step: int | None = None, batch: int | None = None
    ) -> None:
        super().__init__(message)
        self.kind, self.epoch, self.step, self.batch = kind, epoch, step, batch


def _nonfinite_names(named: Iterable[tuple[str, Any]]) -> list[str]:
    return [
        name
        for name, value in named
        if isinstance(value, torch.Tensor)
        and (value.is_floating_point() or value.is_complex())
        and not bool(torch.isfinite(value).all())
    ]


def _listing(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


_KINDS = ("data", "loss", "gradient")


class _DeferredChecks:
    """``fit``'s loss and gradient checks without a host read per step (a read makes the host wait for the device,
    so that the next step's host work cannot overlap this step's kernels).

    Each step computes, on the device, a flag (1: the loss is NaN/inf, 2: a gradient is, the loss finite) and a sticky
    halt flag that the optimizer receives as ``found_inf``: the fused Adam kernel then leaves the parameters and its
    state unchanged for that step and every later one, so when :meth:`check` reads the flags (every :attr:`EVERY` steps
    and at the end of each epoch; one read) and raises for the first bad step, the model is what it was before that
    step, as with the per-step checks. The epoch's loss, NLL and KL are summed on the device in float64, in the same
    order as the per-step path sums Python floats (the same values). Used off the CPU with an optimizer that takes
    ``found_inf`` (torch's fused Adam, fit's default), and not with distributed training, the Graves estimator,
    ``skip_nonfinite`` or adaptive priors (each needs a per-step decision on the host)."""

    EVERY = 50
    DEVICES: ClassVar[tuple[str, ...]] = ("cuda",)  # (the tests add "cpu" to run it here)

    def __init__(self, device: torch.device, named: Sequence[tuple[str, torch.Tensor]]) -> None:
        self.device = device
        self.named = list(named)  # (name, parameter) of everything the optimizer steps
        self.halt = torch.zeros((), dtype=torch.float32, device=device)  # the fused kernels read found_inf as float
        self.sums = torch.zeros(3, dtype=torch.float64, device=device)
        # each step since the last check: (flag, where, epoch, step, batch, its loss, nll and kl, the indices of the
        # parameters that had gradients, whether each of those was finite)
        self.window: list[tuple[torch.Tensor, str, int, int, int, torch.Tensor, list[int], torch.Tensor | None]] = []

    @classmethod
    def applies(cls, device: torch.device, optimizer: torch.optim.Optimizer, excluded: bool) -> bool:
        return (
            not excluded
            and device.type in cls.DEVICES
            # the fused Adam and AdamW: a found_inf step leaves their state as it was (their step counters are put
            # back); others, e.g. the fused SGD with momentum, would keep uninitialised state from a skipped first step
            and type(optimizer) in (torch.optim.Adam, torch.optim.AdamW)
            and bool(getattr(optimizer, "_step_supports_amp_scaling", False))
            and not hasattr(optimizer, "found_inf")  # a caller's own use of it (e.g. a GradScaler) is left alone
        )

    def pending(self, error: BaseException) -> None:
        """Before another error leaves fit: a bad step waiting in the window is reported first (the model stopped
        updating there), with the other error as its context."""
        try:
            self.check()
        except NonFiniteError as found:
            raise found from error

    def step(
        self, terms: ELBOTerms, optimizer: torch.optim.Optimizer, where: str, epoch: int, step: int, batch: int
    ) -> None:
        loss = terms.loss.detach()
        loss_bad = ~torch.isfinite(loss)
        held = [i for i, (_, p) in enumerate(self.named) if p.grad is not None and p.grad.numel() > 0]
        finite: torch.Tensor | None = None
        if held:
            peaks = torch._foreach_norm([self.named[i][1].grad for i in held], float("inf"))  # type: ignore[misc]
            finite = torch.isfinite(torch.stack([peak.to(torch.float64) for peak in peaks]))
            grad_bad = ~finite.all()
        else:
            grad_bad = torch.zeros((), dtype=torch.bool, device=self.device)
        flag = torch.where(loss_bad, 1.0, torch.where(grad_bad, 2.0, 0.0)).to(self.device)
        torch.maximum(self.halt, (flag > 0).to(self.halt.dtype), out=self.halt)
        optimizer.found_inf = self.halt  # type: ignore[attr-defined]
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf  # type: ignore[attr-defined]
        values = torch.stack([v.to(torch.float64) for v in (loss, terms.nll.detach(), terms.kl.detach())])
        self.sums += values
        self.window.append((flag, where, epoch, step, batch, values, held, finite))

    def check(self) -> None:
        """One host read of the window's flags; raises :class:`NonFiniteError` for its first bad step."""
        if not self.window:
            return
        flags = torch.stack([entry[0] for entry in self.window]).tolist()
        window, self.window = self.window, []
        bad = next((i for i, flag in enumerate(flags) if flag), None)
        if bad is None:
            return
        _, where, epoch, step, batch, values, held, finite = window[bad]
        loss, nll, kl = values.tolist()
        if flags[bad] == 1:
            kind, detail = "loss", _loss_detail(loss, nll, kl)
        else:
            good = finite.tolist() if finite is not None else []
            kind, detail = "gradient", _gradient_detail([self.named[i][0] for i, ok in zip(held, good) if not ok], loss)
        last = window[-1][3]
        note = (
            f" (read at the check after step {last}: on {self.device.type} fit reads its checks every {self.EVERY} "
            f"steps without waiting for the device; steps {step} to {last} left the parameters unchanged)"
        )
        raise _nonfinite_error(kind, detail + note, where, epoch, step, batch, False)

    def take_totals(self) -> dict[str, float]:
        """The epoch's summed loss, NLL and KL (one host read), and a fresh sum for the next epoch."""
        loss, nll, kl = self.sums.tolist()
        self.sums.zero_()
        return {"loss": loss, "nll": nll, "kl": kl}


def _loss_detail(loss: float, nll: float, kl: float) -> str:
    """What a non-finite loss says about its cause: the NLL, the KL, or the KL term's weight."""
    head = f"the loss is {loss} (nll {nll}, kl {kl}) although the batch's data are finite"
    if not math.isfinite(nll):
        return f"{head}: the NLL is not finite (the optimisation diverged: lower lr?), or nll is undefined for these targets"
    if not math.isfinite(kl):
        return (
            f"{head}: the KL is not finite (a posterior scale at 0 or inf, or parameters that overflowed: the optimisation "
            "diverged, lower lr?)"
        )
    return (
        f"{head}: the KL term beta * kl / n_data overflowed although the NLL and the KL are finite: beta (the KL weight) "
        "is too large"
    )


def _gradient_detail(names: list[str], loss: float) -> str:
    return f"the gradients of {_listing(names)} hold NaN or inf (the loss, {loss}, is finite)"


def _nonfinite_error(
    kind: str, detail: str, where: str, epoch: int, step: int, batch: int, skipping: bool
) -> NonFiniteError:
    advice = {
        "data": "clean the data (skip_nonfinite does not skip bad data)",
        "loss": "the parameters were not updated" + ("" if skipping else "; skip_nonfinite=True skips such batches"),
        "gradient": "the parameters were not updated" + ("" if skipping else "; skip_nonfinite=True skips such batches"),
    }[kind]
    return NonFiniteError(f"non-finite {kind} at {where}: {detail}; {advice}", kind=kind, epoch=epoch, step=step, batch=batch)


def _nonfinite_data(x: torch.Tensor, y: torch.Tensor) -> str | None:
    """What is wrong with a batch, or ``None``: NaN/inf in the inputs or in floating-point targets."""
    for label, tensor in (("inputs", x), ("targets", y)):
        if isinstance(tensor, torch.Tensor) and (tensor.is_floating_point() or tensor.is_complex()):
            # a finite sum proves every element finite (NaN and inf propagate into it): one reduction without a
            # tensor of flags (0.13 -> 0.007 ms for a batch of 128 MNIST images, ~6% of a plain MLP step); only a
            # non-finite sum (a bad element, or finite data whose sum overflows) is checked element by element
            if tensor.numel() and bool(torch.isfinite(tensor.sum())):
                continue
            finite = torch.isfinite(tensor)
            if not bool(finite.all()):
                nan = int(torch.isnan(tensor).sum())
                inf = tensor.numel() - int(finite.sum()) - nan
                return f"training {label} contain NaN or infinite values ({nan} NaN, {inf} inf of {tensor.numel()})"
    return None


def _all_finite(norms: Sequence[torch.Tensor]) -> bool:
    peaks = list(norms)
    if len({peak.dtype for peak in peaks}) > 1:  # stack needs one dtype; a norm is representable in its own
        peaks = [peak.to(torch.float64) for peak in peaks]
    return bool(torch.stack(peaks).isfinite().all())


def _gradients_finite(parameters: Sequence[torch.Tensor]) -> bool:
    grads = [p.grad for p in parameters if p.grad is not None and p.grad.numel() > 0]
    if not grads:
        return True
    try:
        # a finite 2-norm per tensor proves every element finite (NaN and inf propagate into it); one fused kernel,
        # ~25x faster on the CPU than the max |g| (0.02 vs 0.5 ms for the 199k gradients of the MLP 784-200-200-10: 15%
        # of its plain training step). Only where a 2-norm is not finite (a bad element, or finite gradients whose
        # squares overflow the dtype) does the exact max |g| decide.
        if _all_finite(torch._foreach_norm(grads)):
            return True
        return _all_finite(torch._foreach_norm(grads, float("inf")))
    except (RuntimeError, TypeError, NotImplementedError):  # sparse gradients, mixed devices, ...
        return all(bool(torch.isfinite(g.coalesce().values() if g.is_sparse else g).all()) for g in grads)


def _distinct_examples_per_epoch(loader: object) -> int | None:
    """How many distinct examples a ``DataLoader`` yields per epoch, where its sampler says so (sequential, or
    shuffled without replacement); ``None`` for other loaders and samplers."""
    from torch.utils.data import DataLoader, RandomSampler, SequentialSampler, SubsetRandomSampler
    from torch.utils.data.distributed import DistributedSampler

    if not isinstance(loader, DataLoader) or loader.batch_sampler is None:
        return None
    sampler = getattr(loader.batch_sampler, "sampler", None)
    try:
        if isinstance(sampler, RandomSampler) and not sampler.replacement:
            count = min(len(sampler), len(sampler.data_source))  # type: ignore[arg-type]
        elif isinstance(sampler, (SequentialSampler, SubsetRandomSampler, DistributedSampler)):
            count = len(sampler)
        else:
            return None
        if getattr(loader.batch_sampler, "drop_last", False):
            count = min(count, len(loader.batch_sampler) * int(loader.batch_sampler.batch_size))  # type: ignore[attr-defined, arg-type]
    except (TypeError, AttributeError):
        return None
    return count


def _draws_with_replacement(loader: object) -> bool:
    samplers = (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None))
    return any(getattr(s, "replacement", False) is True for s in samplers)

