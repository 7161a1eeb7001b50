"""Experiment configs: frozen dataclasses, one per reproduced table or figure."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Variant", "ExperimentConfig"]


@dataclass(frozen=True)
class Variant:
    """One row of a table: a model made Bayesian with ``family`` and ``prior`` (names from
    ``varbnn.families.FAMILIES`` / ``varbnn.priors.PRIORS``), or left plain with ``family="plain"``."""

    label: str
    family: str = "meanfield"
    family_options: dict[str, Any] = field(default_factory=dict)
    prior: str = "normal"
    prior_options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ExperimentConfig:
    """Everything one ``varbnn reproduce NAME`` run needs.

    ``quick`` holds field overrides for ``--quick`` (a CI-sized run of the same code path).
    """

    name: str
    description: str
    dataset: str
    model: str
    model_options: dict[str, Any]
    variants: tuple[Variant, ...]
    epochs: int = 10
    batch_size: int = 128
    lr: float = 1e-3
    seeds: tuple[int, ...] = (0,)
    eval_samples: int = 32
    train_limit: int | None = None
    test_limit: int | None = None
    figures: tuple[str, ...] = ("reliability",)
    quick: dict[str, Any] = field(default_factory=dict)

    def quick_variant(self) -> ExperimentConfig:
        """This config with its ``quick`` overrides applied."""
        return dataclasses.replace(self, **self.quick)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("quick")
        return data
