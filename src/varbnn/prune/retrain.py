"""Retraining of pruned plain models: fine-tuning with optional distillation of a Bayesian model's predictive,
re-initialisation (the random-initialisation control), and staged prune-and-retrain towards a size budget
(:func:`iterative_budget`)."""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn

from varbnn.nn.base import BayesianModule
from varbnn.predict import classification_summary, predict
from varbnn.prune.export import _export_plain
from varbnn.prune.scores import ThresholdSpec
from varbnn.prune.thresholds import _budget_search, _check_budget, _check_xy, _RankedGroups, classification_error

__all__ = ["LR_SCHEDULES", "finetune", "reinitialize", "predictive_targets", "iterative_budget"]

LR_SCHEDULES = ("constant", "cosine")
"""The learning-rate schedules of :func:`finetune`: constant, or a cosine decay to 0 over the retraining."""


def _check_retraining(
    train: tuple[torch.Tensor, torch.Tensor],
    lr: float,
    schedule: str,
    soft_targets: torch.Tensor | None,
    distill_weight: float,
) -> None:
    """The arguments :func:`finetune` and :func:`iterative_budget` share, checked before any work."""
    x, y = train
    _check_xy(x, y)
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise ValueError(f"lr must be positive, got {lr!r}")
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"schedule must be one of {LR_SCHEDULES}, got {schedule!r}")
    if not (isinstance(distill_weight, (int, float)) and 0.0 <= distill_weight <= 1.0):
        raise ValueError(f"distill_weight must be in [0, 1], got {distill_weight!r}")
    if distill_weight > 0:
        if soft_targets is None:
            raise ValueError("distill_weight > 0 needs soft_targets (class probabilities for every training example)")
        if soft_targets.dim() != 2 or soft_targets.shape[0] != x.shape[0]:
            raise ValueError(f"soft_targets must be [len(x), classes] = [{x.shape[0]}, C], got {tuple(soft_targets.shape)}")
        if not torch.isfinite(soft_targets).all() or bool((soft_targets < 0).any()):
            raise ValueError("soft_targets must be finite, non-negative class probabilities")


def finetune(
    model: nn.Module,
    train: tuple[torch.Tensor, torch.Tensor],
    validation: tuple[torch.Tensor, torch.Tensor],
    *,
    epochs: int = 10,
    lr: float = 1e-4,
    batch_size: int = 100,
    seed: int = 0,
    schedule: str = "constant",
    soft_targets: torch.Tensor | None = None,
    distill_weight: float = 0.0,
    progress: bool = False,
) -> tuple[nn.Module, dict[str, Any]]:
    """Retrain a plain classifier (e.g. the model :func:`export` returns) with cross-entropy and Adam for ``epochs``
    epochs, in place, and restore the epoch with the lowest validation error (epoch 0: as given, so retraining never
    makes the validation error worse). ``schedule``: the learning rate stays ``lr`` (``"constant"``, default) or
    decays from ``lr`` to 0 along a half cosine over the steps (``"cosine"``). ``soft_targets`` (``[len(x), classes]``
    class probabilities, e.g. a Bayesian model's predictive from :func:`predictive_targets`) with ``distill_weight``
    = w > 0: the loss is ``(1 - w) CE(labels) + w CE(soft_targets)`` (distillation of the predictive into the small
    model; Hinton et al. 2015 at temperature 1, Korattikara et al. 2015's Bayesian dark knowledge). Returns the model
    and ``{"epoch", "validation_error", "history"}``."""
    if not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be a non-negative integer, got {epochs!r}")
    x, y = train
    _check_retraining(train, lr, schedule, soft_targets, distill_weight)
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    scheduler = None
    if schedule == "cosine" and epochs:
        steps = epochs * math.ceil(x.shape[0] / batch_size)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    best_error = classification_error(model, *validation)
    best_epoch, best_state = 0, {k: v.detach().clone() for k, v in model.state_dict().items()}
    history = [{"epoch": 0, "validation_error": best_error}]
    epochs_range: Any = range(1, epochs + 1)
    if progress:
        from tqdm.auto import tqdm

        epochs_range = tqdm(epochs_range, desc="finetune", leave=False)
    for epoch in epochs_range:
        model.train()
        for index in torch.randperm(x.shape[0], generator=generator).split(batch_size):
            optimizer.zero_grad(set_to_none=True)
            logits = model(x[index].to(device))
            loss = nn.functional.cross_entropy(logits, y[index].to(device))
            if distill_weight > 0:
                assert soft_targets is not None
                soft = nn.functional.cross_entropy(logits, soft_targets[index].to(device, logits.dtype))
                loss = (1 - distill_weight) * loss + distill_weight * soft
            loss.backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
        err = classification_error(model, *validation)
        lr_now = optimizer.param_groups[0]["lr"]
        history.append({"epoch": epoch, "validation_error": err, "train_loss": float(loss.detach()), "lr": lr_now})
        if err < best_error:
            best_error, best_epoch = err, epoch
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.load_state_dict(best_state)
    model.eval()
    return model, {"epoch": best_epoch, "validation_error": best_error, "history": history}


def reinitialize(model: nn.Module, seed: int = 0) -> nn.Module:
    """A copy of a plain model (e.g. :func:`export`'s) with every layer's parameters re-drawn by the layer's own
    ``reset_parameters`` (PyTorch's default initialisation), seeded by ``seed`` without touching the global random
    state. Buffers (the kept-feature indices of :class:`SelectFeatures`) are kept, so the architecture is the same:
    retraining it with :func:`finetune` is the random-initialisation control of Liu et al. (2019), "Rethinking the
    value of network pruning" (is it the pruned weights or only the pruned architecture that matters?)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if any(isinstance(module, BayesianModule) for module in model.modules()):
        raise ValueError("reinitialize takes a plain model (e.g. prune.export's); this one has Bayesian layers")
    fresh = copy.deepcopy(model)
    devices = list({p.device for p in fresh.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for module in fresh.modules():
            reset = getattr(module, "reset_parameters", None)
            if module is not fresh and callable(reset) and any(True for _ in module.parameters(recurse=False)):
                reset()
    return fresh


@torch.no_grad()
def predictive_targets(
    model: nn.Module, x: torch.Tensor, samples: int = 16, *, batch_size: int = 1000, seed: int = 0
) -> torch.Tensor:
    """Class probabilities of a Bayesian classifier's Monte Carlo predictive, ``mean_s softmax(f_s(x))`` over
    ``samples`` weight draws (:func:`varbnn.predict`, seeded), ``[len(x), classes]``: the soft targets for
    :func:`finetune`'s distillation."""
    was_training = model.training
    model.eval()
    out = []
    for start in range(0, x.shape[0], batch_size):
        chunk = x[start : start + batch_size].to(next(model.parameters()).device)
        logits = predict(model, chunk, samples, chunk_size=min(samples, 4), seed=seed + start)
        out.append(classification_summary(logits).probs.cpu())
    model.train(was_training)
    return torch.cat(out)


def iterative_budget(
    model: nn.Module,
    train: tuple[torch.Tensor, torch.Tensor],
    validation: tuple[torch.Tensor, torch.Tensor],
    *,
    max_flops: int | None = None,
    max_parameters: int | None = None,
    stages: int = 4,
    epochs: int = 5,
    final_epochs: int | None = None,
    lr: float = 1e-3,
    batch_size: int = 100,
    seed: int = 0,
    schedule: str = "constant",
    soft_targets: torch.Tensor | None = None,
    distill_weight: float = 0.0,
    start: ThresholdSpec = "gap",
    min_gap: float = 1.0,
    step: float = 0.05,
    mode: str = "mode",
    eval_batch_size: int = 1000,
    progress: bool = False,
) -> tuple[nn.Sequential, dict[str, Any]]:
    """:func:`budget_units` in ``stages`` steps with retraining in between: prune-and-retrain towards a size budget.

    From the ``start`` rule's model (size ``F0`` FLOPs, ``P0`` parameters), stage ``s`` of ``S`` runs the budget rule
    to ``max(max_flops, F0^(1 - s/S) max_flops^(s/S))`` FLOPs (likewise parameters: equal steps in log size), exports
    the plain model and retrains it with :func:`finetune` (``epochs`` epochs, ``final_epochs`` in the last stage, at
    ``lr`` with ``schedule``, distilling ``soft_targets`` with ``distill_weight``; the epoch with the lowest validation
    error is kept); the retrained weights replace the point weights of the kept units for the next stage. The
    posterior's scores still decide which units of a layer go, in every stage; the validation set decides how many,
    and what the retraining keeps. With ``stages=1`` this is :func:`budget_units` followed by :func:`finetune`.

    Returns the last stage's retrained plain model and a report: :func:`export`'s ``architecture``, ``parameters``,
    ``flops``, the ``validation_error`` of the returned model, ``reached`` (the final budget), and per stage its
    budget, architecture, sizes, validation error before and after retraining and the retraining epoch kept."""
    _check_budget("iterative_budget", max_flops, max_parameters, step)
    if not isinstance(stages, int) or stages < 1:
        raise ValueError(f"stages must be a positive integer, got {stages!r}")
    final_epochs = epochs if final_epochs is None else final_epochs
    for name, value in (("epochs", epochs), ("final_epochs", final_epochs)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    _check_xy(*validation)
    _check_retraining(train, lr, schedule, soft_targets, distill_weight)
    groups = _RankedGroups(model, *validation, start, min_gap, mode, eval_batch_size)
    removed = dict(groups.start)
    params0, flops0 = groups.size(removed)

    def towards(target: int | None, first: int, fraction: float) -> int | None:
        if target is None:
            return None
        return max(target, round(math.exp((1 - fraction) * math.log(first) + fraction * math.log(target))))

    history: list[dict[str, Any]] = []
    exported: nn.Sequential | None = None
    report: dict[str, Any] = {}
    reached = False
    stage_range: Any = range(1, stages + 1)
    if progress:
        from tqdm.auto import tqdm

        stage_range = tqdm(stage_range, desc="prune and retrain", leave=False)
    for stage in stage_range:
        fraction = stage / stages
        stage_flops, stage_params = towards(max_flops, flops0, fraction), towards(max_parameters, params0, fraction)
        removed, reached = _budget_search(groups, removed, stage_flops, stage_params, step, progress)
        before = groups.error(removed)
        exported, report = _export_plain(groups.dense, groups.x[:2], groups.masks(removed), groups.shapes)
        _, tuned = finetune(
            exported, train, validation, epochs=final_epochs if stage == stages else epochs, lr=lr,
            batch_size=batch_size, seed=seed + stage, schedule=schedule, soft_targets=soft_targets,
            distill_weight=distill_weight, progress=progress,
        )  # fmt: skip
        groups.load_exported(exported, report)
        history.append({
            "stage": stage, "max_flops": stage_flops, "max_parameters": stage_params, "reached": reached,
            "architecture": report["architecture"], "parameters": report["parameters"], "flops": report["flops"],
            "validation_error_before": before, "validation_error": tuned["validation_error"], "epoch": tuned["epoch"],
        })  # fmt: skip
    assert exported is not None
    return exported, {
        "architecture": report["architecture"],
        "parameters": report["parameters"],
        "flops": report["flops"],
        "validation_error": history[-1]["validation_error"],
        "epoch": history[-1]["epoch"],
        "reached": reached,
        "max_flops": max_flops,
        "max_parameters": max_parameters,
        "stages": history,
        "keep_out": report["keep_out"],
        "keep_in": report["keep_in"],
    }
