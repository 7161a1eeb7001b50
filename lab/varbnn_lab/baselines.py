"""The baselines users pick instead of a BNN as variants of the generic runner (``Variant(family=NAME)``), so that they
are trained, evaluated and tabulated by exactly the same code as the Bayesian families.

| ``family`` | model | after training | options (``family_options``) |
|---|---|---|---|
| ``"temperature"`` | the plain network | :class:`varbnn.calibration.TemperatureScaled` fitted on the validation split | none |
| ``"mc-dropout"`` | :func:`varbnn.baselines.add_dropout` + :class:`varbnn.baselines.MCDropout` | -- | ``p`` (default 0.1) |
| ``"ensemble"`` | :class:`varbnn.baselines.DeepEnsemble` of plain networks, each trained in turn | -- | ``members`` (default 5) |
| ``"laplace"`` | the plain network | :class:`varbnn.laplace.LastLayerLaplace` on the training set | none |

The Laplace baseline's prior precision is chosen by the validation NLL when the config has a validation split, else by
the marginal likelihood. The marginal likelihood presumes a network trained as the MAP under that prior (weight decay
delta); the plain baselines here train without weight decay to a training loss near 0, where the KFAC curvature is
tiny and the evidence picks delta near 1: on the demo's digits MLP a predictive far wider than the data support.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from varbnn._checks import as_int

__all__ = ["BASELINES", "DETERMINISTIC", "build_baseline", "after_training", "members"]

BASELINES = ("temperature", "mc-dropout", "ensemble", "laplace")
DETERMINISTIC = ("plain", "delta", "temperature")
"""Variant kinds whose prediction needs one forward pass (no Monte Carlo draws)."""

_OPTIONS: dict[str, tuple[str, ...]] = {
    "temperature": (), "mc-dropout": ("p",), "ensemble": ("members", "member"), "laplace": (),
}  # fmt: skip


def _check_options(kind: str, options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - set(_OPTIONS[kind]))
    if unknown:
        raise ValueError(f"baseline {kind!r}: unknown family_options {unknown}; allowed: {list(_OPTIONS[kind])}")


def build_baseline(kind: str, make_plain: Any, options: dict[str, Any]) -> nn.Module:
    """The untrained model of baseline ``kind`` from ``make_plain()`` (a fresh plain network per call)."""
    from varbnn.baselines import DeepEnsemble, MCDropout, add_dropout

    if kind not in BASELINES:
        raise ValueError(f"unknown baseline {kind!r}; allowed: {list(BASELINES)}")
    _check_options(kind, options)
    if kind == "mc-dropout":
        return MCDropout(add_dropout(make_plain(), float(options.get("p", 0.1))))
    if kind == "ensemble":  # members: plain networks, or (member=<family name>) posteriors of that family at its defaults
        count = as_int(options.get("members", 5), "members", 2, owner="baseline 'ensemble'")
        member = options.get("member", "plain")
        if member == "plain":
            return DeepEnsemble([make_plain() for _ in range(count)])
        from varbnn.convert import bayesianize
        from varbnn.families import FAMILIES, make_family

        if member not in FAMILIES:
            raise ValueError(f"baseline 'ensemble': member must be 'plain' or a family name {sorted(FAMILIES)}, got {member!r}")
        return DeepEnsemble([bayesianize(make_plain(), make_family(member)) for _ in range(count)])
    return make_plain()


def members(model: nn.Module) -> list[nn.Module]:
    """What the training loop trains one after the other: an ensemble's members, else the model itself."""
    from varbnn.baselines import DeepEnsemble

    return list(model.members) if isinstance(model, DeepEnsemble) else [model]


def after_training(
    kind: str,
    model: nn.Module,
    train_loader: Iterable[tuple[torch.Tensor, torch.Tensor]],
    validation: tuple[torch.Tensor, torch.Tensor] | None,
    device: torch.device,
) -> nn.Module:
    """The post-hoc step of ``kind`` on the trained model (temperature, Laplace); others unchanged."""
    if kind == "temperature":
        from varbnn.calibration import TemperatureScaled

        if validation is None:
            raise ValueError("baseline 'temperature' fits T on the validation split: set the config's validation_size")
        return TemperatureScaled(model).to(device).fit(validation[0].to(device), validation[1].to(device))
    if kind == "laplace":
        from varbnn.laplace import LastLayerLaplace

        laplace = LastLayerLaplace(model).to(device)
        laplace.fit(train_loader)
        if validation is None:
            laplace.optimize_prior_precision()
        else:
            laplace.optimize_prior_precision(method="validation", x_val=validation[0].to(device), y_val=validation[1].to(device))
        return laplace
    return model
