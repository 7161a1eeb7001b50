"""Evaluation of a trained model: the Monte Carlo predictive's metrics."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from varbnn import metrics
from varbnn._checks import as_int, as_positive_int
from varbnn.divergence import kl as model_kl
from varbnn.likelihoods import Likelihood, as_likelihood
from varbnn.predict import classification_summary, predict
from varbnn.training.setup import NLLFunction, resolve_device


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    likelihood: Likelihood | str = "categorical",
    samples: int = 32,
    batch_size: int = 1000,
    seed: int | None = 0,
    device: str | torch.device | None = "model",
    predictive: str = "sample",
) -> dict[str, float]:
    """The likelihood's metrics of the Monte Carlo predictive of ``samples`` draws on ``(x, y)``: accuracy, NLL, ECE and
    Brier for ``"categorical"``; RMSE, NLL (``-mean_n log (1/S) sum_s p(y_n | f_s)``) and the mean predictive std for
    the Gaussian likelihoods. The model is put in eval mode (a Bayesian layer still samples: see
    :mod:`varbnn.nn.base`); ``seed`` makes the draws reproducible without touching the global random state.

    Cost: ``samples`` forward passes over ``x`` (vectorised by :func:`varbnn.predict.predict`), ``batch_size`` examples
    at a time.

    :param model: a trained network (Bayesian or plain: a plain one gives ``samples`` equal draws).
    :param x: inputs ``[N, ...]``.
    :param y: targets: class indices ``[N]`` or regression targets.
    :param likelihood: a :class:`~varbnn.likelihoods.Likelihood` or the name of one without learned parameters
        (default ``"categorical"``); pass the same object ``fit`` trained with when it has learned noise.
    :param samples: Monte Carlo weight draws S, an int >= 1 (default 32).
    :param batch_size: examples per vectorised pass (default 1000; memory only).
    :param seed: seed of the draws (default 0), or ``None`` for the global random state.
    :param device: where to evaluate (default ``"model"``: the model's device; as in :func:`fit`).
    :param predictive: ``"sample"``, ``"moments"`` or ``"auto"``, as :func:`varbnn.predict` (default ``"sample"``).
    :returns: ``{metric name: value}`` as Python floats (:meth:`varbnn.likelihoods.Likelihood.metrics`).
    """
    lik = as_likelihood(likelihood)
    batch_size = as_positive_int(batch_size, "batch_size", owner="evaluate")
    if seed is not None:
        seed = as_int(seed, "seed (or None)", owner="evaluate")
    floating = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.get_default_dtype())
    x, y = _as_tensor(x, "x", floating), _as_tensor(y, "y", None)
    if x.dim() == 0 or y.dim() == 0:
        raise ValueError(f"evaluate: x and y must have an example dimension, got shapes {tuple(x.shape)} and {tuple(y.shape)}")
    if x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(f"x and y must hold the same positive number of examples, got {x.shape[0]} and {y.shape[0]}")
    dev = resolve_device(device, model)
    model.to(dev).eval()
    lik.to(dev)
    outputs = torch.cat(
        [
            predict(model, x[i : i + batch_size].to(dev), samples=samples, seed=seed, predictive=predictive)
            for i in range(0, x.shape[0], batch_size)
        ],
        dim=1,
    )
    return lik.metrics(outputs, y.to(dev))


def _as_tensor(value: Any, name: str, floating: torch.dtype | None) -> torch.Tensor:
    """``value`` as a tensor: a tensor as it is; a NumPy array converted, a floating one to ``floating`` (the model's
    dtype, as :func:`~varbnn.predict.predict` does) when given; anything else a ``TypeError`` naming the argument."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        tensor = torch.from_numpy(value)
        return tensor.to(floating) if floating is not None and tensor.is_floating_point() else tensor
    raise TypeError(f"evaluate: {name} must be a torch.Tensor or a NumPy array, got {type(value).__name__}")


@torch.no_grad()
def evaluate_classifier(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    samples: int = 16,
    batch_size: int = 1000,
    device: str | torch.device | None = "model",
) -> tuple[dict[str, float], torch.Tensor]:
    """Monte Carlo predictive metrics of a classifier (accuracy, NLL, ECE with 15 bins, Brier score; see
    :mod:`varbnn.metrics`) of ``samples`` draws on ``(x, y)``, and the mean probabilities ``[N, C]``
    (``mean_s softmax(f_s(x))``). Uses the global random state; :func:`evaluate` is the seeded, likelihood-aware
    version."""
    dev = resolve_device(device, model)
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
    device: str | torch.device | None = "model",
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

    dev = resolve_device(device, model)
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
