"""``fit(validation=..., early_stopping=...)``: the validation NLL of the model's predictive after every epoch, and
early stopping on it with the best epoch's state restored (kept in fit's checkpoint, so a resumed run stops at the
same epoch and restores the same state)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from varbnn._checks import ArgumentTypeError, as_positive_int
from varbnn.likelihoods import Likelihood
from varbnn.predict import PREDICTIVES, _is_stochastic, _prediction_mode, predict
from varbnn.training.checkpoint import CheckpointError, read_checkpoint
from varbnn.training.evaluation import evaluate
from varbnn.training.prepare import _default_cross_entropy
from varbnn.training.setup import NLLFunction, resolve_device

VALIDATION_SEED = 0


"""The seed of the validation draws (the same every epoch, so epochs are compared on common random numbers; forked,
so the global random state is left as it was)."""


VALIDATION_BATCH_SIZE = 1000


"""Validation examples per vectorised pass (memory only)."""


class ValidationWatch:
    """fit's validation set, the metrics it records and (with ``patience``) the early-stopping state: the best epoch
    (1-based), its NLL and state dicts (the model's, the likelihood's), and the count of epochs since it."""

    def __init__(
        self, x: torch.Tensor, y: torch.Tensor, samples: int, patience: int | None, nll: NLLFunction,
        likelihood: Likelihood | None, predictive: str = "auto",
    ) -> None:  # fmt: skip
        self.x, self.y, self.samples, self.patience, self.predictive = x, y, samples, patience, predictive
        # the predictive's likelihood when fit knows it: fit's likelihood, a Likelihood passed as nll, or the default
        # cross-entropy with class labels; None: a custom nll (or soft labels), averaged over the draws
        self.likelihood: Likelihood | str | None = likelihood
        if likelihood is None and isinstance(nll, Likelihood):
            self.likelihood = nll
        elif likelihood is None and nll is _default_cross_entropy and not (y.is_floating_point() or y.is_complex()):
            self.likelihood = "categorical"
        self.nll = nll
        self.best_epoch: int | None = None
        self.best_nll = math.inf
        self.bad_epochs = 0
        self.stopped = False
        self.best_model: dict[str, Any] | None = None
        self.best_likelihood: dict[str, Any] | None = None

    def measure(self, model: nn.Module) -> dict[str, float]:
        """``val_nll`` (and ``val_accuracy`` for a categorical likelihood) of ``model``'s predictive on the validation
        set; the model's (and every submodule's) training flag is as it was afterwards."""
        samples = self.samples if _is_stochastic(model) else 1  # a deterministic model: every draw is the same
        try:
            with _prediction_mode(model), torch.no_grad():
                if self.likelihood is not None:
                    metrics = evaluate(model, self.x, self.y, likelihood=self.likelihood, samples=samples,
                                       batch_size=VALIDATION_BATCH_SIZE, seed=VALIDATION_SEED,
                                       predictive=self.predictive)  # fmt: skip
                    out = {"val_nll": metrics["nll"]}
                    if "accuracy" in metrics:
                        out["val_accuracy"] = metrics["accuracy"]
                    return out
                return {"val_nll": _mean_draw_nll(model, self.x, self.y, self.nll, samples, self.predictive)}
        except (ValueError, TypeError) as error:
            kind = TypeError if isinstance(error, TypeError) and not isinstance(error, ValueError) else ValueError
            raise kind(f"fit(validation=(x, y)): the validation set does not fit the model: {error}") from error

    def after_epoch(self, epoch: int, epochs: int, record: dict[str, float], model: nn.Module, lik: nn.Module | None) -> bool:
        """Add the validation metrics to epoch ``epoch``'s (1-based) ``record``; with ``patience``, keep the state of a
        new best epoch (a strictly lower, finite ``val_nll``), add ``best_epoch`` (and ``stopped_early``) to the record;
        returns whether training stops here."""
        record.update(self.measure(model))
        if self.patience is None:
            return False
        value = record["val_nll"]
        if math.isfinite(value) and value < self.best_nll:
            self.best_epoch, self.best_nll, self.bad_epochs = epoch, value, 0
            self.best_model = _copy(model.state_dict())
            self.best_likelihood = _copy(lik.state_dict()) if lik is not None else None
        else:
            self.bad_epochs += 1
        if self.best_epoch is not None:
            record["best_epoch"] = self.best_epoch
        if self.bad_epochs >= self.patience and epoch < epochs:
            self.stopped = True
            record["stopped_early"] = 1.0
        return self.stopped

    def checkpoint_entry(self) -> dict[str, Any] | None:
        """The ``"early_stopping"`` entry of fit's checkpoint (plain data), or ``None`` without ``patience``."""
        if self.patience is None:
            return None
        return {"best_epoch": self.best_epoch, "best_val_nll": float(self.best_nll), "bad_epochs": self.bad_epochs,
                "stopped": self.stopped, "model": self.best_model, "likelihood": self.best_likelihood}  # fmt: skip

    def resume(self, path: str | os.PathLike[str], dev: torch.device, model: nn.Module, lik: nn.Module | None) -> None:
        """The early-stopping state of a resumed checkpoint (its ``"early_stopping"`` entry, checked against the model);
        a checkpoint without one (older, or of a run without early stopping) leaves it fresh: the best epoch is then
        one of those trained from now on."""
        if self.patience is None:
            return
        entry = read_checkpoint(path, map_location=dev).get("early_stopping")
        if entry is None:
            return
        path = Path(path)

        def require(ok: bool, what: str) -> None:
            if not ok:
                raise CheckpointError(path, f"its 'early_stopping' entry cannot be resumed: {what}")

        require(isinstance(entry, dict), f"a {type(entry).__name__}, not a dict")
        best, value, bad = entry.get("best_epoch"), entry.get("best_val_nll"), entry.get("bad_epochs")
        require(best is None or (type(best) is int and best >= 1), f"best_epoch {best!r} is not None or an int >= 1")
        require(type(value) is float and not math.isnan(value), f"best_val_nll {value!r} is not a number")
        require(type(bad) is int and bad >= 0, f"bad_epochs {bad!r} is not an int >= 0")
        require(type(entry.get("stopped")) is bool, f"stopped {entry.get('stopped')!r} is not True or False")
        if best is not None:  # the best state must fit what it is restored into
            _require_fits(require, "model", entry.get("model"), model)
            if lik is not None and list(lik.state_dict()):
                _require_fits(require, "likelihood", entry.get("likelihood"), lik)
        self.best_epoch, self.best_nll, self.bad_epochs = best, value, bad
        self.stopped = entry["stopped"]
        self.best_model, self.best_likelihood = entry.get("model"), entry.get("likelihood")

    @torch.no_grad()
    def restore(self, model: nn.Module, lik: nn.Module | None) -> None:
        """Load the best epoch's state into ``model`` (and ``lik``); nothing without ``patience`` or a best epoch."""
        if self.patience is None or self.best_model is None:
            return
        model.load_state_dict(self.best_model)
        if lik is not None and self.best_likelihood is not None:
            lik.load_state_dict(self.best_likelihood)


def validation_watch(
    validation: Any,
    samples: Any,
    early_stopping: Any,
    *,
    nll: NLLFunction,
    likelihood: Likelihood | None,
    distributed: bool,
    predictive: Any = "auto",
) -> ValidationWatch | None:
    """fit's ``validation``, ``validation_samples`` and ``early_stopping`` checked (a ``ValueError`` or ``TypeError``
    naming the argument and what is allowed); ``None`` without ``validation``."""
    samples = as_positive_int(samples, "validation_samples", owner="fit")
    if predictive not in PREDICTIVES:
        raise ValueError(f"fit: validation_predictive must be one of {PREDICTIVES}, got {predictive!r}")
    patience = None if early_stopping is None else as_positive_int(early_stopping, "early_stopping (or None)", owner="fit")
    if validation is None:
        if patience is not None:
            raise ValueError(f"fit: early_stopping={patience} needs validation=(x, y), the held-out set whose NLL it "
                             "watches; pass validation=, or early_stopping=None")  # fmt: skip
        return None
    if not isinstance(validation, (tuple, list)) or len(validation) != 2:
        what = f"a {type(validation).__name__} of {len(validation)} items" if isinstance(validation, (tuple, list)) \
            else f"a {type(validation).__name__}"  # fmt: skip
        raise ArgumentTypeError(f"fit: validation must be a tuple (x, y) of tensors or None, got {what}")
    x, y = validation
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise ArgumentTypeError(f"fit: validation must be a tuple (x, y) of tensors, got a {type(x).__name__} and a "
                                f"{type(y).__name__} (convert them with torch.as_tensor)")  # fmt: skip
    if x.dim() == 0 or y.dim() == 0 or x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(f"fit: validation=(x, y) must hold the same positive number of examples (the first dimension), "
                         f"got shapes {tuple(x.shape)} and {tuple(y.shape)}")  # fmt: skip
    for name, tensor in (("x", x), ("y", y)):
        if (tensor.is_floating_point() or tensor.is_complex()) and not bool(torch.isfinite(tensor).all()):
            nan = int(torch.isnan(tensor).sum())
            raise ValueError(f"fit: validation {name} contains NaN or infinite values ({nan} NaN, "
                             f"{tensor.numel() - int(torch.isfinite(tensor).sum()) - nan} inf of {tensor.numel()})")  # fmt: skip
    if distributed:
        raise ValueError("fit: validation= is not available with distributed training yet: evaluate on one process "
                         "after fit (varbnn.evaluate), or train without distributed")  # fmt: skip
    return ValidationWatch(x.detach(), y.detach(), samples, patience, nll, likelihood, predictive)


def _require_fits(require: Any, name: str, state: Any, module: nn.Module) -> None:
    """``require`` that ``state`` is a state dict of ``module``'s entries and tensor shapes."""
    own = module.state_dict()
    fits = (
        isinstance(state, dict)
        and set(state) == set(own)
        and all(
            not isinstance(v, torch.Tensor) or (isinstance(state[k], torch.Tensor) and state[k].shape == v.shape)
            for k, v in own.items()
        )
    )
    require(fits, f"its {name} state does not fit the {name} (other entries or shapes)")


def _copy(state: dict[str, Any]) -> dict[str, Any]:
    """A state dict's tensors copied (where they are), so that later steps do not change them."""
    return {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


@torch.no_grad()
def _mean_draw_nll(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, nll: NLLFunction, samples: int, predictive: str = "sample"
) -> float:
    """``mean_s nll(f_s(x), y)`` over ``samples`` seeded draws (per example, for a batch-mean ``nll``): the expected
    NLL of a custom loss, whose predictive fit does not know how to form."""
    dev = resolve_device("model", model)
    total, count = 0.0, int(x.shape[0])
    for start in range(0, count, VALIDATION_BATCH_SIZE):
        xb, yb = x[start : start + VALIDATION_BATCH_SIZE].to(dev), y[start : start + VALIDATION_BATCH_SIZE].to(dev)
        draws = predict(model, xb, samples=samples, seed=VALIDATION_SEED, predictive=predictive)
        total += sum(float(nll(draw, yb)) for draw in draws) * xb.shape[0]
    return total / (count * samples)
