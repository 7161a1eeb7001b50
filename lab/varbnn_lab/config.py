"""Experiment configs: frozen dataclasses, one per reproduced table or figure."""

from __future__ import annotations

import ast
import dataclasses
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Variant", "ExperimentConfig", "OPTIMIZERS", "FIGURES", "RESULTS_DIR", "results_dir", "apply_overrides"]

RESULTS_DIR = Path("benchmarks/results")
"""The committed results, relative to the repository root (where the commands run): one folder per experiment."""


def results_dir(name: str, out_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder experiment ``name`` writes to (and reads its own runs and checkpoints from): ``out_dir`` when given,
    else ``benchmarks/results/NAME/``. The one rule for every ``varbnn reproduce NAME`` and every benchmark script, so
    that each experiment's page, JSON, figures, runs and ``history/`` sit in one folder."""
    return Path(out_dir) if out_dir is not None else RESULTS_DIR / name


OPTIMIZERS = ("adam", "amsgrad")
# fields that do not change what is trained (see ExperimentConfig.training_dict)
_AFTER_TRAINING = (
    "description", "figures", "eval_samples", "eval_weight_samples", "posthoc_ranks", "heatmap_module",
    "prune", "prune_threshold", "prune_min_gap", "prune_validation_tolerance", "prune_budget", "prune_finetune_epochs",
    "prune_finetune_lr", "prune_finetune_schedule", "prune_stages", "prune_stage_epochs", "prune_distill_weight",
    "prune_distill_samples", "prune_scratch_epochs", "prune_front", "ood_dataset",
)  # fmt: skip
FIGURES = (
    "reliability", "traces", "variance_explained", "std_heatmaps", "prune_histograms", "prune_front", "ood", "overview",
    "cost",
)  # fmt: skip


@dataclass(frozen=True)
class Variant:
    """One row of a table: a model made Bayesian with ``family`` and ``prior`` (names from
    ``varbnn.families.FAMILIES`` / ``varbnn.priors.PRIORS``), or left plain with ``family="plain"``."""

    label: str
    family: str = "meanfield"
    family_options: dict[str, Any] = field(default_factory=dict)
    prior: str = "normal"
    prior_options: dict[str, Any] = field(default_factory=dict)
    module_families: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per-module overrides ``{qualified module name: {"family": name, **options}}`` (e.g. a mean-field head
    under a k-tied LSTM); every other layer gets ``family``. All layers share the one prior."""
    convert_epochs: int = 0
    """0 (default): the Bayesian model is trained from its initialisation for the config's ``epochs``. N > 0: the
    user's path for a network they already have: the config's ``plain`` network is trained first (exactly as the
    ``plain`` variant trains it; its finished checkpoint is reused), converted with ``bayesianize(pretrained=True)``
    (its weights become the posterior means) and trained N more epochs with the family's defaults. The training time
    counts both phases. On a ``plain`` variant, N > 0 is the control for that extra training: the same trained
    network, not converted, trained N more epochs with a fresh optimizer (the same schedule the converted ones get)."""

    early_stopping: int = 0
    """0 (default): the run trains the config's ``epochs``. N > 0: ``fit(validation=..., early_stopping=N)`` on the
    config's validation split (``validation_size``): training stops after N epochs without a lower validation NLL and
    the best epoch's weights are restored; the config's ``epochs`` is then the limit."""
    optimizer: str = ""
    """"" (default): the config's ``optimizer``. ``"ivon"``: :class:`varbnn.optim.IVON` built for the model (each member
    of a mixture gets its own) with ``optimizer_options`` (e.g. ``{"lr": 0.03, "hess_init": 0.1}``); the KL weight is
    then IVON's (``kl_weight`` in the options, default 1), not the config's. ``"adam"`` / ``"amsgrad"``: that one."""
    optimizer_options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the variant's ``optimizer`` (``"ivon"`` only)."""
    temperature: bool = False
    """True: after training, a :class:`~varbnn.calibration.TemperatureScaled` over the model's predictive, its
    temperature fitted on the validation split (``eval_samples`` weight draws for a Bayesian model); its seconds count
    as training. With ``early_stopping`` this is the library's recipe (docs/guide/choosing.md)."""

    def __post_init__(self) -> None:
        if isinstance(self.early_stopping, bool) or not isinstance(self.early_stopping, int) or self.early_stopping < 0:
            raise ValueError(f"{self.label}: early_stopping must be an integer >= 0 (0: off), got {self.early_stopping!r}")
        if self.optimizer not in ("", *OPTIMIZERS, "ivon"):
            raise ValueError(f"{self.label}: optimizer must be one of {['', *OPTIMIZERS, 'ivon']}, got {self.optimizer!r}")
        if self.optimizer_options and self.optimizer != "ivon":
            raise ValueError(f"{self.label}: optimizer_options apply to optimizer='ivon', got optimizer={self.optimizer!r}")
        if self.optimizer == "ivon" and self.family in ("plain", "delta", "temperature", "laplace", "mc-dropout"):
            raise ValueError(f"{self.label}: optimizer='ivon' trains MeanField posteriors (family='meanfield', or an "
                             f"'ensemble' of them), got family={self.family!r}")  # fmt: skip
        if not isinstance(self.temperature, bool):
            raise ValueError(f"{self.label}: temperature must be True or False, got {self.temperature!r}")
        if (self.early_stopping or self.temperature) and self.family in ("temperature", "laplace"):
            raise ValueError(
                f"{self.label}: early_stopping and temperature apply to a trained model, not to the post-hoc baseline "
                f"{self.family!r} (use family='plain' with temperature=True for plain + temperature scaling)"
            )
        if self.early_stopping and self.convert_epochs:
            raise ValueError(f"{self.label}: early_stopping and convert_epochs cannot be combined")
        if isinstance(self.convert_epochs, bool) or not isinstance(self.convert_epochs, int) or self.convert_epochs < 0:
            raise ValueError(f"{self.label}: convert_epochs must be an integer >= 0, got {self.convert_epochs!r}")
        if self.convert_epochs and self.family in ("temperature", "laplace", "mc-dropout", "ensemble"):
            raise ValueError(
                f"{self.label}: convert_epochs applies to the varbnn families and to 'plain' (the control), "
                f"not to {self.family!r}"
            )


@dataclass(frozen=True)
class ExperimentConfig:
    """Everything one ``varbnn reproduce NAME`` run needs.

    ``quick`` holds field overrides for ``--quick`` (a CI-sized run of the same code path).

    Training: ``optimizer`` is ``"adam"`` or ``"amsgrad"``; ``kl_annealing_epochs`` > 0 raises the KL weight
    linearly from 0 to 1 over that many epochs (Sønderby et al. 2016), then keeps it at 1. ``validation_size``
    holds out the LAST that many training examples (not trained on; N_train excludes them).

    Traces (logged during training, table columns ``name@step``): every ``log_every`` steps and at each of
    ``log_steps``, the validation -ELBO per training example (beta = 1, ``trace_samples`` weight draws; needs
    ``validation_size``) and, if ``snr_tensor`` names a random tensor (``"<module>.<tensor>"``), the mean gradient
    signal-to-noise ratio of its standard-deviation parameters (everything but the mean) over the last ``snr_window`` steps.

    Training: ``mc_samples`` weight draws per step, their gradients averaged (see :func:`varbnn.training.fit`).

    Evaluation: Monte Carlo predictive metrics with ``eval_samples`` draws; if ``eval_weight_samples`` > 0 also
    per-weight-sample test -ELBO, expected NLL and accuracy (mean and SEM over those draws, Swiatkowski et al.
    2020 Fig. 6); ``posthoc_ranks`` adds, per rank k, a row for the trained model with every mean-field std
    matrix replaced by its rank-k approximation (their Table 2).

    ``resumable``: each (variant, seed) checkpoints after every epoch under ``OUT/.checkpoints/`` and a rerun of the
    same command continues where a killed one stopped. ``prune``: after training, :func:`varbnn.prune.export` the
    model with ``prune_threshold`` (``"gap"``: :func:`varbnn.prune.gap_threshold` with ``prune_min_gap``) and report
    the exported plain model's architecture, parameters, FLOPs and test error; ``prune_validation_tolerance`` > 0
    (needs ``validation_size``) adds the model pruned by :func:`varbnn.prune.validation_thresholds` with that tolerance,
    ``prune_budget`` = (max FLOPs, max parameters) the model pruned to that budget by :func:`varbnn.prune.budget_units`,
    and ``prune_finetune_epochs`` > 0 the retraining of each by :func:`varbnn.prune.finetune` (learning rate
    ``prune_finetune_lr``, ``prune_finetune_schedule`` ``"constant"`` or ``"cosine"``). ``prune_stages`` > 0 (needs
    ``prune_budget``) adds the model pruned to the budget in that many prune-and-retrain stages by
    :func:`varbnn.prune.iterative_budget` (``prune_stage_epochs`` epochs of retraining after each stage but the last,
    ``prune_finetune_epochs`` after the last, at the same learning rate and schedule). ``prune_distill_weight`` = w > 0:
    every retraining also fits the trained model's Monte Carlo predictive on the training set
    (:func:`varbnn.prune.predictive_targets` with ``prune_distill_samples`` draws), loss ``(1 - w) CE + w CE(soft)``.
    ``prune_scratch_epochs`` > 0 (needs ``prune_stages``): the staged rule's architecture again, every weight re-drawn
    (:func:`varbnn.prune.reinitialize`) and trained by :func:`varbnn.prune.finetune` for that many epochs with the same
    learning rate, schedule and distillation: the random-initialisation control of Liu et al. (2019).
    ``prune_front`` = FLOPs budgets (increasing; needs ``prune_stages``): an error-FLOPs front, the staged rule run to
    each budget alone (no parameter cap; its retraining as above) and, with ``prune_scratch_epochs``, its random-init
    control at each budget's architecture; score keys ``front{B}_*`` (figure ``prune_front``: test error against FLOPs
    and parameters beside the published LeNet-5 rows).

    ``select_best_of_last`` = K > 0: evaluate (and prune) not the model after the last epoch but the one, among the
    last K epochs, with the lowest mean training NLL of its epoch (Oh et al. 2020's choice for LeNet-5: "the best
    training cross-entropy during last 10 epochs"); the table reports it as ``selected_epoch``. 0 (default): the last.

    ``kl_weight``: the constant KL weight beta of the ELBO after any annealing (1, the default: the true ELBO, as the
    papers); ``None``: the library's default of :func:`varbnn.training.fit` (what a user who changes nothing gets).
    ``pretrained``: whether :func:`varbnn.bayesianize` starts the posterior means from the plain network's weights
    (False, the default: each family's own initialisation, as the papers); ``None``: the library's default.

    ``ood_dataset``: the name of a dataset (``varbnn_lab.runner`` loader table, its test split) whose inputs
    are out of distribution for ``dataset``; adds the AUROC of telling them from the test inputs by predictive
    entropy (``ood_auroc_entropy``) and by mutual information (``ood_auroc_mi``), and the figures ``ood`` (entropy
    histograms) and ``overview`` (reliability diagrams above the entropy histograms, one column per variant).
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
    mc_samples: int = 1
    train_limit: int | None = None
    test_limit: int | None = None
    figures: tuple[str, ...] = ("reliability",)
    optimizer: str = "adam"
    kl_annealing_epochs: float = 0.0
    validation_size: int = 0
    log_every: int = 0
    log_steps: tuple[int, ...] = ()
    trace_samples: int = 4
    snr_tensor: str | None = None
    snr_window: int = 10
    eval_weight_samples: int = 0
    posthoc_ranks: tuple[int, ...] = ()
    heatmap_module: str | None = None
    resumable: bool = False
    prune: bool = False
    prune_threshold: float | str = "gap"
    prune_min_gap: float = 1.0
    prune_validation_tolerance: float = 0.0
    prune_budget: tuple[int, int] | None = None
    prune_finetune_epochs: int = 0
    prune_finetune_lr: float = 1e-4
    prune_finetune_schedule: str = "constant"
    prune_stages: int = 0
    prune_stage_epochs: int = 5
    prune_distill_weight: float = 0.0
    prune_distill_samples: int = 16
    prune_scratch_epochs: int = 0
    prune_front: tuple[int, ...] = ()
    select_best_of_last: int = 0
    kl_weight: float | None = 1.0
    pretrained: bool | None = False
    ood_dataset: str = ""
    quick: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"{self.name}: optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        unknown = set(self.figures) - set(FIGURES)
        if unknown:
            raise ValueError(f"{self.name}: unknown figures {sorted(unknown)}; allowed: {FIGURES}")
        for name in ("epochs", "batch_size", "validation_size", "log_every", "eval_weight_samples", "mc_samples"):
            value, least = getattr(self, name), 1 if name in ("batch_size", "mc_samples") else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                kind = "a positive" if least else "a non-negative"
                raise ValueError(f"{self.name}: {name} must be {kind} integer, got {value!r}")
        if isinstance(self.eval_samples, bool) or not isinstance(self.eval_samples, int) or self.eval_samples < 1:
            raise ValueError(f"{self.name}: eval_samples must be a positive integer, got {self.eval_samples!r}")
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not 0 < self.lr < math.inf:
            raise ValueError(f"{self.name}: lr must be a finite number > 0, got {self.lr!r}")
        if not self.seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in self.seeds):
            raise ValueError(f"{self.name}: seeds must be a non-empty tuple of integers, got {self.seeds!r}")
        for name in ("train_limit", "test_limit"):
            limit = getattr(self, name)
            if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
                raise ValueError(f"{self.name}: {name} must be None (all) or a positive integer, got {limit!r}")
        if self.kl_annealing_epochs < 0:
            raise ValueError(f"{self.name}: kl_annealing_epochs must be >= 0, got {self.kl_annealing_epochs!r}")
        if (self.log_every or self.log_steps) and not (self.validation_size or self.snr_tensor):
            raise ValueError(f"{self.name}: traces need a validation_size (for the -ELBO) or an snr_tensor")
        if self.trace_samples < 1 or self.snr_window < 2:
            raise ValueError(f"{self.name}: trace_samples must be >= 1 and snr_window >= 2")
        if not isinstance(self.select_best_of_last, int) or not 0 <= self.select_best_of_last <= self.epochs:
            raise ValueError(
                f"{self.name}: select_best_of_last must be an integer in [0, epochs={self.epochs}], "
                f"got {self.select_best_of_last!r}"
            )
        recipe = [v.label for v in self.variants if v.early_stopping or v.temperature]
        if recipe and not self.validation_size:
            raise ValueError(f"{self.name}: early_stopping and temperature ({recipe}) need a validation_size")
        if recipe and self.select_best_of_last and any(v.early_stopping for v in self.variants):
            raise ValueError(f"{self.name}: select_best_of_last and a variant's early_stopping both pick an epoch: use one")
        ensembles = [v.label for v in self.variants if v.family == "ensemble"]
        if self.select_best_of_last and ensembles:  # its members train one after the other: epochs would mix them
            raise ValueError(
                f"{self.name}: select_best_of_last applies to one training, not to a deep ensemble's members trained one "
                f"after the other; set it to 0 or run {ensembles} in a config of their own"
            )
        if not 0 <= self.prune_validation_tolerance < 1:
            raise ValueError(
                f"{self.name}: prune_validation_tolerance must be a fraction in [0, 1), got {self.prune_validation_tolerance!r}"
            )
        if (self.prune_validation_tolerance or self.prune_budget is not None) and not self.validation_size:
            raise ValueError(f"{self.name}: prune_validation_tolerance and prune_budget need a validation_size")
        if self.prune_budget is not None and (
            len(self.prune_budget) != 2 or any(not isinstance(v, int) or v < 1 for v in self.prune_budget)
        ):
            raise ValueError(f"{self.name}: prune_budget must be (max FLOPs, max parameters), got {self.prune_budget!r}")
        if not isinstance(self.prune_finetune_epochs, int) or self.prune_finetune_epochs < 0:
            raise ValueError(f"{self.name}: prune_finetune_epochs must be a non-negative integer")
        if self.prune_finetune_epochs and not (
            self.prune_validation_tolerance or self.prune_budget is not None or self.prune_front
        ):
            raise ValueError(
                f"{self.name}: prune_finetune_epochs retrains the validation, budget or front rules' models: set one of them"
            )
        for name in ("prune_stages", "prune_stage_epochs"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"{self.name}: {name} must be a non-negative integer, got {getattr(self, name)!r}")
        if self.prune_finetune_schedule not in ("constant", "cosine"):
            raise ValueError(
                f"{self.name}: prune_finetune_schedule must be 'constant' or 'cosine', got {self.prune_finetune_schedule!r}"
            )
        if not 0.0 <= self.prune_distill_weight <= 1.0:
            raise ValueError(f"{self.name}: prune_distill_weight must be in [0, 1], got {self.prune_distill_weight!r}")
        if not isinstance(self.prune_distill_samples, int) or self.prune_distill_samples < 1:
            raise ValueError(f"{self.name}: prune_distill_samples must be a positive integer")
        if not isinstance(self.prune_scratch_epochs, int) or self.prune_scratch_epochs < 0:
            raise ValueError(
                f"{self.name}: prune_scratch_epochs must be a non-negative integer, got {self.prune_scratch_epochs!r}"
            )
        if self.prune_scratch_epochs and not self.prune_stages:
            raise ValueError(f"{self.name}: prune_scratch_epochs retrains the staged rule's architecture: set prune_stages")
        if self.prune_stages and self.prune_budget is None and not self.prune_front:
            raise ValueError(f"{self.name}: prune_stages prunes to prune_budget (or prune_front) in stages: set one of them")
        front = self.prune_front
        if (
            not isinstance(front, tuple)
            or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in front)
            or list(front) != sorted(set(front))
        ):
            raise ValueError(f"{self.name}: prune_front must be a tuple of increasing positive FLOPs budgets, got {front!r}")
        if front and not (self.prune and self.prune_stages and self.validation_size):
            raise ValueError(
                f"{self.name}: prune_front prunes (prune=True) in prune_stages stages on the validation set: set all three"
            )
        if "prune_front" in self.figures and not front:
            raise ValueError(f"{self.name}: the 'prune_front' figure draws prune_front's points: set prune_front")
        converted = [v.label for v in self.variants if v.convert_epochs]
        if converted and self.plain_variant is None:
            raise ValueError(f"{self.name}: {converted} convert the plain network: add a variant with family='plain'")
        if converted and not self.resumable:
            raise ValueError(f"{self.name}: {converted} reuse the plain run's checkpoint: set resumable=True")
        if converted and self.select_best_of_last:
            raise ValueError(f"{self.name}: select_best_of_last is not supported with convert_epochs")
        if self.select_best_of_last and any(v.family == "ensemble" for v in self.variants):
            raise ValueError(f"{self.name}: select_best_of_last is not supported for the 'ensemble' baseline (members)")
        if {"ood", "overview"} & set(self.figures) and not self.ood_dataset:
            raise ValueError(f"{self.name}: the 'ood' and 'overview' figures need an ood_dataset")
        if self.kl_weight is not None and not (isinstance(self.kl_weight, (int, float)) and 0 <= self.kl_weight < float("inf")):
            raise ValueError(f"{self.name}: kl_weight must be a finite number >= 0 or None, got {self.kl_weight!r}")
        if any(not isinstance(k, int) or k < 1 for k in self.posthoc_ranks):
            raise ValueError(f"{self.name}: posthoc_ranks must be positive integers, got {self.posthoc_ranks!r}")

    def quick_variant(self) -> ExperimentConfig:
        """This config with its ``quick`` overrides applied."""
        return dataclasses.replace(self, **self.quick)

    @property
    def plain_variant(self) -> Variant | None:
        """The ``plain`` variant (family ``"plain"``, no options, not trained further) whose trained network the
        post-hoc baselines and the converted variants reuse, or None."""
        return next((v for v in self.variants if v.family == "plain" and not v.family_options and not v.convert_epochs), None)

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data for the results JSON: every field except ``quick``, with the fields added after
        the first protocols left out while they hold their defaults (so older runs keep their protocol hashes)."""
        data = dataclasses.asdict(self)
        data.pop("quick")
        for variant in data["variants"]:  # added later: variants trained from scratch keep their hashes
            later: tuple[tuple[str, Any], ...] = (("convert_epochs", 0), ("early_stopping", 0), ("temperature", False),
                                                   ("optimizer", ""), ("optimizer_options", {}))  # fmt: skip
            for key, value in later:
                if variant.get(key) == value:
                    variant.pop(key)
        for name, default in (("select_best_of_last", 0), ("kl_weight", 1.0), ("pretrained", False), ("ood_dataset", ""),
                              ("prune_front", ())):  # fmt: skip
            if data[name] == default:  # added later: configs that keep the default keep their checkpoint hashes
                data.pop(name)
        return data

    def training_dict(self) -> dict[str, Any]:
        """:meth:`to_dict` without the fields that only act after training (evaluation, pruning, figures, wording):
        what a resumable run's checkpoint hash covers, so that changing how a finished run is evaluated or pruned
        reuses its training instead of starting over."""
        data = self.to_dict()
        for name in _AFTER_TRAINING:
            data.pop(name, None)
        return data


_NOT_OVERRIDABLE = ("name", "description", "quick", "variants")


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """``value`` (parsed by :func:`ast.literal_eval`) as the type ``hint`` of a config field, or ValueError."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        for option in args:
            try:
                return _coerce(value, option, where)
            except ValueError:
                pass
        names = " or ".join("None" if a is type(None) else getattr(a, "__name__", str(a)) for a in args)
        raise ValueError(f"{where}: expected {names}, got {value!r}")
    if hint is type(None):
        if value is None:
            return None
        raise ValueError(f"{where}: expected None, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ValueError(f"{where}: expected float, got {value!r}")
    if hint in (int, str, bool):
        if isinstance(value, hint) and (hint is bool or not isinstance(value, bool)):
            return value
        raise ValueError(f"{where}: expected {hint.__name__}, got {value!r}")
    if origin is tuple:
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            value = (value,)  # --set seeds=3 means (3,)
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where}: expected a tuple, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], where) for v in value)
        if len(args) != len(value):
            raise ValueError(f"{where}: expected {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, where) for v, a in zip(value, args))
    if origin is dict:
        if isinstance(value, dict):
            return dict(value)
        raise ValueError(f"{where}: expected a dict, got {value!r}")
    raise ValueError(f"{where}: fields of type {hint} cannot be set from the command line")


def apply_overrides(config: Any, overrides: typing.Sequence[str]) -> Any:
    """``config`` (any experiment config dataclass) with ``FIELD=VALUE`` overrides applied (``varbnn reproduce NAME
    --set FIELD=VALUE``). ``VALUE`` is a Python literal (``5``, ``0.1``, ``(0, 1, 2)``, ``None``, ``'adam'``) or a bare
    word taken as a string; it is checked against the field's type (an int where a float is expected is converted,
    one value where a tuple is expected becomes a 1-tuple). The config's own checks run on the result. Changing a
    field that training depends on changes the protocol hash: write to its own ``--out``."""
    if not overrides:
        return config
    fields = {f.name: f for f in dataclasses.fields(config)}
    hints = typing.get_type_hints(type(config))
    changes: dict[str, Any] = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--set expects FIELD=VALUE, got {item!r}")
        settable = sorted(n for n, f in fields.items() if n not in _NOT_OVERRIDABLE)
        if key not in fields or key in _NOT_OVERRIDABLE:
            raise ValueError(f"--set {key}: not a settable field of {type(config).__name__}; allowed: {settable}")
        try:
            value = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            value = text.strip()  # a bare word: a string
        changes[key] = _coerce(value, hints[key], f"--set {key}={text}")
    return dataclasses.replace(config, **changes)
