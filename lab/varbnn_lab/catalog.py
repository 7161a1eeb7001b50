"""Every experiment of ``varbnn reproduce`` in one table: its name, what it reproduces, how its config is built, which
function runs it and which draws its page.

An experiment is registered once: here (:data:`SPECIAL`), or, for a config of the generic runner, with
:func:`varbnn_lab.registry.register_config`. :func:`experiments` lists both; each entry has three callables
that take the same arguments for every experiment:

- ``config(name, quick)``: the config (a frozen dataclass; ``--set FIELD=VALUE`` overrides its fields);
- ``run(config, *, device, out_dir, data_dir, progress, command, shard, train, workers, distributed)``: runs what is
  not saved yet through the engine (:mod:`varbnn_lab.engine`) and writes the page; returns the result, with
  ``written=False`` where this process wrote no page (a shard, a rank other than 0 of a distributed run);
- ``render(result, folder)``: the Markdown page of a saved result (``varbnn render``); ``None`` for the generic
  runner's configs, whose page :func:`varbnn_lab.render.render_markdown` draws.

The command line (:mod:`varbnn.cli`) and ``varbnn render`` dispatch through this table only. The experiment modules
are imported when an experiment is used, so ``varbnn list`` stays fast.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Experiment", "SPECIAL", "experiments", "experiment", "base_name"]


@dataclass(frozen=True)
class Experiment:
    """One experiment of ``varbnn reproduce NAME`` (see the module docstring for the three callables)."""

    name: str
    description: str
    config: Callable[[str, bool], Any]
    run: Callable[..., dict[str, Any]]
    render: Callable[[dict[str, Any], Path | None], str] | None = None
    generic: bool = False
    """A config of the generic runner (:func:`varbnn_lab.runner.run_experiment`: ``--variants`` applies)."""
    compiles: bool = False
    """``run`` takes ``compile=`` (``fit(compile=...)`` for its training; ``--compile``): the generic runner's configs
    and those marked so."""


def _attr(module: str, name: str) -> Any:
    return getattr(importlib.import_module(f"varbnn_lab.{module}"), name)


def _lazy(module: str, name: str) -> Callable[..., Any]:
    """``varbnn_lab.<module>.<name>``, imported at the first call."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return _attr(module, name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


def _figure(result: dict[str, Any], folder: Path | None, suffix: str = ".png") -> str | None:
    """The figure file ``NAME<suffix>`` to link on a re-rendered page, if it lies beside the JSON (or no folder given)."""
    file = f"{result['name']}{suffix}"
    return file if folder is None or (folder / file).exists() else None


def _soap_page(result: dict[str, Any], folder: Path | None) -> str:
    files = [_figure(result, folder, f"_{kind}.png") for kind in ("kernel", "training")]
    return _attr("soap_bubble", "render_soap_bubble_markdown")(result, [f for f in files if f is not None])


def _vcl_page(result: dict[str, Any], folder: Path | None) -> str:
    files = [_figure(result, folder, suffix) for suffix in (".png", "_heads.png")]
    return _attr("pages.continual", "render_vcl_markdown")(result, [f for f in files if f is not None])


def _page(module: str, renderer: str) -> Callable[[dict[str, Any], Path | None], str]:
    """A page renderer ``renderer(result, figure)`` of ``module`` as ``render(result, folder)``."""
    return lambda result, folder: _attr(module, renderer)(result, _figure(result, folder))


def _uci_learned_config(name: str, quick: bool) -> Any:
    return _attr("uci_learned", "quick_config")() if quick else _attr("uci_learned", "UCILearnedConfig")()


_SPECIAL = (
    Experiment(
        "uci", "UCI regression, 9 sets x standard splits, every family (Oh et al. 2020 Table 1 protocol)",
        lambda name, quick: _attr("uci", "uci_config")(quick), _lazy("uci", "run_uci"),
        lambda result, folder: _attr("pages.uci", "render_uci_markdown")(result),
    ),
    Experiment(
        "uci-learned", "UCI regression with learned noise and a validation search, every family and baseline",
        _uci_learned_config, _lazy("uci_learned", "run_uci_learned"),
        lambda result, folder: _attr("pages.uci_learned", "render_uci_learned_markdown")(result), compiles=True,
    ),
    *(
        Experiment(
            name, text, _lazy("retina", "retina_config"), _lazy("retina", "run_retina"),
            lambda result, folder: _attr("pages.retina", "render_retina_markdown")(result, f"{result['name']}.png"),
        )
        for name, text in (
            ("retina-referral", "Referral by mutual information on RetinaMNIST, radial vs mean-field, 5 seeds"),
            ("retina-robustness", "Random hyperparameter search, radial vs mean-field (Farquhar et al. 2020 Fig. 7)"),
        )
    ),
    Experiment(
        "soap-bubble", "Distance of samples from the mode: analytic/sampled densities and during training",
        lambda name, quick: _attr("soap_bubble", "soap_bubble_config")(quick), _lazy("soap_bubble", "run_soap_bubble"),
        _soap_page,
    ),
    *(
        Experiment(
            name, text, lambda name, quick: _attr("continual", "vcl_config")(quick, name), _lazy("continual", "run_vcl"),
            _vcl_page,
        )
        for name, text in (
            ("vcl-split-fmnist", "VCL on Split Fashion-MNIST, radial vs mean-field (Farquhar et al. 2020)"),
            ("vcl-split-fmnist-search", "vcl-split-fmnist's grid search: the same 8 settings for radial and mean-field"),
            ("vcl-split-fmnist-selected", "each family's setting chosen by vcl-split-fmnist-search, 5 seeds"),
        )
    ),
    *(
        Experiment(name, text, _lazy("graves", "graves_config"), _lazy(module, run), _page(*page))
        for name, text, module, run, page in (
            ("graves-mnist", "Graves 2011 table 1 on an MNIST MLP: delta/Gaussian posteriors x fixed/adaptive priors, MDL",
             "graves", "run_graves_mnist", ("pages.graves", "render_graves_markdown")),
            ("graves-mnist-lstm", "graves-mnist on a row LSTM (the recurrent case)", "graves", "run_graves_mnist",
             ("pages.graves", "render_graves_markdown")),
            ("graves-prune", "Graves 2011 table 2 and figures 3-4: pruning by |mu|/sigma < lambda, then retraining",
             "graves_prune", "run_graves_prune", ("graves_prune", "render_prune_markdown")),
            ("graves-prune-lstm", "graves-prune on the row LSTM of graves-mnist-lstm", "graves_prune", "run_graves_prune",
             ("graves_prune", "render_prune_markdown")),
        )
    ),
)  # fmt: skip


SPECIAL: dict[str, Experiment] = {e.name: e for e in _SPECIAL}
"""The experiments with a run function of their own (not the generic runner's)."""


def experiments() -> dict[str, Experiment]:
    """Every experiment by name: the generic runner's configs registered now (:data:`varbnn_lab.registry.CONFIGS`,
    including any a user registered with ``register_config``) and :data:`SPECIAL`."""
    from varbnn_lab.registry import CONFIGS, get_config

    generic = {
        name: Experiment(name, config.description, lambda name, quick: get_config(name, quick=quick),
                         _lazy("runner", "run_experiment"), generic=True, compiles=True)  # fmt: skip
        for name, config in CONFIGS.items()
    }
    return {**generic, **SPECIAL}


def base_name(name: str) -> str:
    """The experiment a saved result's ``name`` belongs to: ``uci-quick`` -> ``uci``, ``graves-prune-lstm-quick`` ->
    ``graves-prune-lstm``."""
    return name.removesuffix("-quick")


def experiment(name: str) -> Experiment:
    """The experiment called ``name`` (its ``-quick`` form's name too); an unknown name is an error listing them all."""
    every = experiments()
    found = every.get(base_name(name))
    if found is None:
        raise ValueError(f"unknown experiment {name!r}; allowed: {sorted(every)}")
    return found
