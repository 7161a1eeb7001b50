"""A small training loop: ELBO steps, adaptive-prior updates, progress bar, checkpoints, evaluation."""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from varbnn import metrics
from varbnn.objectives import ELBOTerms, elbo_loss, graves_gradients, uses_graves_estimator
from varbnn.predict import classification_summary, predict
from varbnn.priors import update_adaptive_priors

__all__ = [
    "fit",
    "default_optimizer",
    "evaluate_classifier",
    "evaluate_weight_samples",
    "save_checkpoint",
    "load_checkpoint",
    "seed_everything",
    "resolve_device",
]

NLLFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
BetaSchedule = Callable[[int], float]


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None``/"auto" -> cuda if available else cpu; otherwise the named device, checked to exist."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but torch.cuda.is_available() is False")
    return dev


def save_checkpoint(
    path: str | os.PathLike[str], model: nn.Module, optimizer: torch.optim.Optimizer | None = None, **extra: Any
) -> Path:
    """Write ``{"model", "optimizer", **extra}`` state dicts atomically (temp file + rename): an interrupted
    save never destroys the previous checkpoint. ``extra`` values must be plain data (numbers, strings, lists,
    dicts, tensors) so that :func:`load_checkpoint` can use ``weights_only=True``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict() if optimizer else None, **extra}
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def load_checkpoint(
    path: str | os.PathLike[str],
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    map_location: str | torch.device = "cpu",
) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` (``torch.load(weights_only=True)``); returns it."""
    state = torch.load(path, map_location=map_location, weights_only=True)
    model.load_state_dict(state["model"])
    if optimizer is not None and state.get("optimizer") is not None:
        optimizer.load_state_dict(state["optimizer"])
    return state


def _has_adaptive_prior(model: nn.Module) -> bool:
    from varbnn.priors import Prior

    return any(isinstance(m, Prior) and m.adaptive for m in model.modules())


_FUSED_ADAM_DEVICES = ("cpu", "cuda")


def default_optimizer(
    params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]], lr: float = 1e-3, amsgrad: bool = False
) -> torch.optim.Optimizer:
    """What :func:`fit` (and the experiment runners) use when given no optimizer: ``torch.optim.Adam(params, lr,
    amsgrad)``, with ``fused=True`` (one kernel per tensor for the whole update) where torch supports it for every
    parameter (floating point, on the CPU or a GPU), else the default implementation. Same algorithm; the fused update
    rounds differently in the last bits, and on the CPU it is several times faster for models with many tensors (a
    Bayesian layer has two or more per weight)."""
    groups: list[Any] = list(params)
    tensors = [t for g in groups for t in (g["params"] if isinstance(g, dict) else [g])]
    fused = bool(tensors) and all(t.is_floating_point() and t.device.type in _FUSED_ADAM_DEVICES for t in tensors)
    return torch.optim.Adam(groups, lr=lr, amsgrad=amsgrad, fused=fused or None)


def fit(
    model: nn.Module,
    loader: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    n_data: int,
    epochs: int,
    optimizer: torch.optim.Optimizer | None = None,
    lr: float = 1e-3,
    nll: NLLFunction = F.cross_entropy,
    beta: float | BetaSchedule = 1.0,
    device: str | torch.device | None = "cpu",
    progress: bool = True,
    checkpoint: str | os.PathLike[str] | None = None,
    resume: bool = False,
    on_epoch_end: Callable[[int, dict[str, float]], None] | None = None,
    on_step_end: Callable[[int, ELBOTerms], None] | None = None,
    distributed: bool | None = None,
    mc_samples: int = 1,
) -> list[dict[str, float]]:
    """Minimise ``nll(model(x), y) + beta * kl(model) / n_data`` with Adam (:func:`default_optimizer`) or ``optimizer``.

    Adaptive priors are set to their optimum after every step. Models with a ``MeanField(estimator="graves")`` tensor
    take their gradients from :func:`varbnn.objectives.graves_gradients` (a weight draw per example, Fisher
    variance gradient) instead of ``loss.backward()``. ``beta`` is a number or a function of the
    global step (e.g. ``lambda s: linear_kl_annealing(s, 1000)``). Returns one dict per epoch with the mean
    loss, NLL (nats), KL (nats) and beta; ``checkpoint`` is rewritten (atomically) after each epoch.
    With ``resume`` and an existing ``checkpoint``, training continues after the last completed epoch (model,
    optimizer, step count, history and RNG states restored), so a killed run loses at most one epoch; a finished
    checkpoint returns its history at once.

    ``on_step_end(step, terms)`` runs after every optimizer step (``step`` counts from 1; the parameters'
    ``.grad`` still hold that step's gradients, e.g. for :class:`varbnn.analysis.GradientSNR`). A callback that
    evaluates the model may switch it to eval mode; training mode is restored after it returns.

    ``mc_samples`` (S, default 1): each step's gradient averages S independent weight draws, computed as S
    forward/backward passes accumulated in ``.grad`` (the loss of each is the full one-draw ELBO / S), so memory
    does not grow with S; the logged loss, NLL and KL are the means over the S draws. Not with the Graves estimator
    (it already draws per example).

    ``distributed`` (default: automatic, i.e. whenever :func:`varbnn.distributed.setup` initialised a process group
    of more than one process): the model is wrapped in ``DistributedDataParallel`` (parameters broadcast from rank
    0, gradients averaged), each rank's weight noise is seeded by its rank (:func:`varbnn.distributed.rank_seed`
    of ``torch.initial_seed()``), ``loader.sampler.set_epoch`` is called every epoch, the returned history is
    averaged over the ranks and only rank 0 writes ``checkpoint`` (the unwrapped model's state dict, loadable in a
    single process). The per-rank loss is ``mean NLL of the shard + beta * KL / n_data``, so with averaged gradients
    the KL counts once per global step (see :mod:`varbnn.distributed`). Models with the Graves estimator are not
    wrapped: their gradients (per-example Fisher) are averaged with an all-reduce instead.
    """
    from varbnn import distributed as vdist

    if epochs < 0:
        raise ValueError(f"epochs must be >= 0, got {epochs}")
    if isinstance(mc_samples, bool) or not isinstance(mc_samples, int) or mc_samples < 1:
        raise ValueError(f"mc_samples must be a positive integer, got {mc_samples!r}")
    if distributed is None:
        distributed = vdist.is_distributed()
    elif distributed and not vdist.is_distributed():
        raise ValueError(
            "distributed=True needs an initialised process group of more than one process: launch with torchrun "
            "and call varbnn.distributed.setup() first"
        )
    dev = resolve_device(device)
    model.to(dev)
    optimizer = optimizer or default_optimizer(model.parameters(), lr)
    adaptive = _has_adaptive_prior(model)
    graves = uses_graves_estimator(model)
    if graves and mc_samples != 1:
        raise ValueError("mc_samples > 1 is not available with MeanField(estimator='graves'): it draws weights per example")
    net: nn.Module = model
    if distributed:
        if graves:
            _broadcast_state(model)
        else:
            from torch.nn.parallel import DistributedDataParallel

            net = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    if adaptive:
        update_adaptive_priors(model)
    schedule: BetaSchedule = beta if callable(beta) else (lambda _step: float(beta))  # type: ignore[misc, assignment]
    history: list[dict[str, float]] = []
    step = 0
    first_epoch = 0
    if resume and checkpoint is not None and Path(checkpoint).exists():
        state = load_checkpoint(checkpoint, model, optimizer, map_location=dev)
        first_epoch, history, step = int(state["epoch"]), list(state["history"]), int(state.get("step", 0))
        if "rng" in state:
            torch.set_rng_state(state["rng"])
        if first_epoch > epochs:
            raise ValueError(f"checkpoint {checkpoint} is at epoch {first_epoch}, beyond epochs={epochs}")
    if distributed:  # every rank its own weight noise (after DDP's broadcast made the parameters equal)
        torch.manual_seed(vdist.rank_seed(torch.initial_seed() + 7919 * (first_epoch + 1)))
    bar = tqdm(range(first_epoch, epochs), desc="epochs", disable=not progress, leave=False, initial=first_epoch, total=epochs)
    for epoch in bar:
        model.train()
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)  # type: ignore[union-attr]
        totals = {"loss": 0.0, "nll": 0.0, "kl": 0.0}
        batches = 0
        for x, y in loader:
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            if x.is_floating_point() and not torch.isfinite(x).all():
                raise ValueError("training inputs contain NaN or infinite values")
            optimizer.zero_grad(set_to_none=True)
            if graves:
                terms = graves_gradients(model, x, y, n_data=n_data, nll=nll, beta=schedule(step))
                if distributed:
                    vdist.all_reduce_mean_([p.grad for p in model.parameters() if p.grad is not None])
            else:
                terms = _accumulated_elbo_gradient(net, model, x, y, nll, n_data, schedule(step), mc_samples)
            optimizer.step()
            if adaptive:
                update_adaptive_priors(model)
            if on_step_end is not None:
                on_step_end(step + 1, terms)
                model.train()
            totals["loss"] += float(terms.loss.detach())
            totals["nll"] += float(terms.nll)
            totals["kl"] += float(terms.kl)
            batches += 1
            step += 1
        record = {k: v / max(batches, 1) for k, v in totals.items()}
        if distributed:
            means = torch.tensor([record["loss"], record["nll"], record["kl"]], dtype=torch.float64, device=dev)
            vdist.all_reduce_mean_([means])
            record.update(loss=float(means[0]), nll=float(means[1]), kl=float(means[2]))
        record.update(epoch=epoch + 1, beta=schedule(step))
        history.append(record)
        bar.set_postfix(loss=f"{record['loss']:.4f}", nll=f"{record['nll']:.4f}")
        if checkpoint is not None and vdist.is_main_process():
            save_checkpoint(checkpoint, model, optimizer, epoch=epoch + 1, history=history, step=step, rng=torch.get_rng_state())
        if on_epoch_end is not None:
            on_epoch_end(epoch + 1, record)
    return history


def _accumulated_elbo_gradient(
    net: nn.Module, model: nn.Module, x: torch.Tensor, y: torch.Tensor, nll: NLLFunction, n_data: int, beta: float, samples: int
) -> ELBOTerms:
    """``samples`` one-draw ELBO gradients averaged into ``.grad`` (one backward per draw; DDP all-reduces once)."""
    import contextlib

    parts = []
    for s in range(samples):
        last = s == samples - 1
        no_sync = getattr(net, "no_sync", None)
        context = no_sync() if (no_sync is not None and not last) else contextlib.nullcontext()
        with context:
            terms = elbo_loss(nll(net(x), y), model, n_data, beta)
            (terms.loss / samples if samples > 1 else terms.loss).backward()
        parts.append(terms)
    if samples == 1:
        return parts[0]
    mean = lambda values: torch.stack(values).mean()  # noqa: E731
    return ELBOTerms(loss=mean([t.loss.detach() for t in parts]), nll=mean([t.nll for t in parts]),
                     kl=mean([t.kl for t in parts]), beta=float(beta), n_data=n_data)  # fmt: skip


@torch.no_grad()
def _broadcast_state(model: nn.Module) -> None:
    """Make every rank's parameters and buffers equal to rank 0's (what DDP does at construction)."""
    import torch.distributed as dist

    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.data, src=0)


@torch.no_grad()
def evaluate_classifier(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    samples: int = 16,
    batch_size: int = 1000,
    device: str | torch.device | None = "cpu",
) -> tuple[dict[str, float], torch.Tensor]:
    """Monte Carlo predictive metrics (accuracy, NLL, ECE, Brier) and the mean probabilities ``[N, C]``."""
    dev = resolve_device(device)
    model.to(dev).eval()
    probs = []
    for start in range(0, x.shape[0], batch_size):
        logits = predict(model, x[start : start + batch_size].to(dev), samples=samples)
        probs.append(classification_summary(logits).probs.cpu())
    p = torch.cat(probs)
    out = {
        "accuracy": metrics.accuracy(p, y),
        "nll": metrics.negative_log_likelihood(p, y),
        "ece": metrics.expected_calibration_error(p, y),
        "brier": metrics.brier_score(p, y),
    }
    return out, p


@torch.no_grad()
def evaluate_weight_samples(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    n_train: int,
    samples: int = 100,
    batch_size: int = 1000,
    seed: int = 0,
    nll: NLLFunction = F.cross_entropy,
    device: str | torch.device | None = "cpu",
) -> dict[str, torch.Tensor]:
    """Per-weight-sample evaluation (Swiatkowski et al. 2020, Fig. 6): for each of ``samples`` draws,

    * ``nll`` -- mean negative log-likelihood of ``(x, y)`` under that one draw (nats per example),
    * ``accuracy`` -- accuracy of that draw's argmax,
    * ``nelbo`` -- ``nll + KL / n_train``: the -ELBO per training example estimated on ``(x, y)``.

    Returns ``{name: tensor[samples]}`` (float64); report their mean and SEM. One draw is shared by all batches
    of ``x``: each batch replays the same seeded random stream (``seed`` and the draw index) in a forked RNG, so
    estimators that draw whole weights (``reparam``) see identical weights in every batch; the global RNG is left
    untouched. (Local reparameterization and flipout draw per example; their per-draw numbers are then
    per-example draws, still unbiased for the expected NLL.)
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be a positive integer, got {samples!r}")
    if isinstance(n_train, bool) or not isinstance(n_train, int) or n_train < 1:
        raise ValueError(f"n_train must be a positive integer (the training-set size), got {n_train!r}")
    if x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(f"x and y must hold the same positive number of examples, got {x.shape[0]} and {y.shape[0]}")
    from varbnn.divergence import kl as model_kl

    dev = resolve_device(device)
    model.to(dev).eval()
    devices = [dev] if dev.type == "cuda" else []
    out = {k: torch.empty(samples, dtype=torch.float64) for k in ("nll", "accuracy", "nelbo")}
    for s in range(samples):
        draw_seed = (seed * 1_000_003 + s) % 2**63
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(draw_seed)
            kl_total = float(model_kl(model))  # closed form for Normal families; one Monte Carlo draw otherwise
        total_nll, correct = 0.0, 0
        for start in range(0, x.shape[0], batch_size):
            xb, yb = x[start : start + batch_size].to(dev), y[start : start + batch_size].to(dev)
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(draw_seed)
                logits = model(xb)
            total_nll += float(nll(logits, yb)) * xb.shape[0]
            correct += int((logits.argmax(-1) == yb).sum())
        out["nll"][s] = total_nll / x.shape[0]
        out["accuracy"][s] = correct / x.shape[0]
        out["nelbo"][s] = out["nll"][s] + kl_total / n_train
    return out
