"""What the UCI regression experiments (``uci``, :mod:`varbnn_lab.uci`; ``uci-learned``,
:mod:`varbnn_lab.uci_learned`) share: the datasets in the order they run, their split counts, a column of
their tables (:class:`UCIVariant`), the network in-hidden-1, standardisation by training statistics, their jobs and
the frame of their run functions (:func:`run_regression`). Each experiment module keeps its protocol only."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from varbnn.data.loaders import UCI_DATASETS
from varbnn_lab.engine import RunKey, RunStore, open_run, select_shard

__all__ = ["SMALLEST_FIRST", "N_SPLITS", "UCIVariant", "hidden_units", "regression_network", "standardise", "regression_jobs",
           "run_regression"]  # fmt: skip

SMALLEST_FIRST = (  # the sets by number of rows, the order in which the runners work through them
    "yacht",
    "bostonHousing",
    "energy",
    "concrete",
    "wine-quality-red",
    "kin8nm",
    "power-plant",
    "naval-propulsion-plant",
    "protein-tertiary-structure",
)
N_SPLITS = {name: 5 if name.startswith("protein") else 20 for name in UCI_DATASETS}


@dataclass(frozen=True)
class UCIVariant:
    """One column of a table: ``family`` on the first layer, ``output_family`` on the output layer."""

    label: str
    family: str
    family_options: dict[str, Any] = field(default_factory=dict)
    output_family: str = "meanfield"
    output_options: dict[str, Any] = field(default_factory=dict)
    prior: str = "normal"
    prior_options: dict[str, Any] = field(default_factory=dict)


def hidden_units(dataset: str) -> int:
    """The benchmark's hidden layer width: 100 units for protein, 50 for the other sets."""
    return 100 if dataset.startswith("protein") else 50


def regression_network(dataset: str, in_features: int, outputs: int = 1, dropout: float | None = None) -> nn.Sequential:
    """The benchmark's network: in-:func:`hidden_units`-``outputs``, ReLU, optionally dropout before the output
    layer."""
    hidden = hidden_units(dataset)
    middle: list[nn.Module] = [nn.ReLU()] if dropout is None else [nn.ReLU(), nn.Dropout(dropout)]
    return nn.Sequential(nn.Linear(in_features, hidden), *middle, nn.Linear(hidden, outputs))


def standardise(x: torch.Tensor, y: torch.Tensor) -> tuple[Any, Any]:
    """(mean, std) of the inputs (std 1 for constant features, which stay at 0) and of the targets."""
    x_std = x.std(0, unbiased=False)
    return (x.mean(0), torch.where(x_std > 0, x_std, torch.ones_like(x_std))), (y.mean(), y.std(unbiased=False))


def regression_jobs(
    datasets: Iterable[str],
    variants: Iterable[UCIVariant],
    max_splits: int | None,
    shard: tuple[int, int] | None = None,
    split_major: bool = False,
) -> list[tuple[str, UCIVariant, int]]:
    """The (dataset, variant, split) jobs in their fixed order: smallest dataset first; within one, variant by variant,
    or (``split_major``) split by split, every variant of a split before the next split (a partial run then compares
    the variants on the same splits). ``max_splits``: only each set's first splits. ``shard=(k, n)``: every n-th job
    from the k-th (:func:`varbnn_lab.engine.select_shard`)."""
    order = sorted(datasets, key=lambda d: SMALLEST_FIRST.index(d) if d in SMALLEST_FIRST else len(SMALLEST_FIRST))
    variants = tuple(variants)
    jobs = []
    for dataset in order:
        splits = range(N_SPLITS[dataset] if max_splits is None else min(max_splits, N_SPLITS[dataset]))
        if split_major:
            jobs += [(dataset, variant, split) for split in splits for variant in variants]
        else:
            jobs += [(dataset, variant, split) for variant in variants for split in splits]
    return select_shard(jobs, shard)


def run_regression(
    config: Any,
    jobs: list[tuple[str, UCIVariant, int]],
    run: Callable[[torch.device, bool, RunKey], dict[str, Any]],
    summarise: Callable[[Mapping[RunKey, dict[str, Any]]], list[dict[str, Any]]],
    render: Callable[[dict[str, Any]], str],
    *,
    device: str | torch.device | None,
    out_dir: str | os.PathLike[str] | None,
    progress: bool,
    command: str | None,
    shard: tuple[int, int] | None,
    train: bool,
    workers: int,
    distributed: bool,
    figures: Callable[[dict[str, Any], Path], list[str]] | None = None,
) -> dict[str, Any]:
    """The run function of a UCI experiment: run every job ``(dataset, variant label, split)`` of ``jobs`` (of its
    ``shard`` share) not yet saved in ``OUT/<name>_runs*.jsonl`` under ``config.protocol_hash()``, by the engine
    (resumable, ``workers`` processes, ``distributed`` under torchrun); ``run(device, progress, key)``, a module-level
    function or a ``functools.partial`` of one, trains and scores one. Then, unless a shard or a rank other than 0,
    write ``<name>.json`` with ``summarise(records)`` as its rows and ``<name>.md`` as ``render(result)``; ``figures(result,
    OUT)`` writes the page's figures first and returns their file names (``result["figures"]``)."""
    call = open_run(config.name, out_dir, device, distributed, workers)
    protocol = config.protocol_hash()
    store = RunStore.keyed(call.out, config.name, ("dataset", "variant", "split"), protocol, shard)
    report = call.reporter(progress, lambda key, r: f"{' '.join(map(str, key))}: ll={r['ll']:.4g} rmse={r['rmse']:.4g}"
                           + (f" knob={r['knob']} epochs={r['epochs']}" if "knob" in r else ""))  # fmt: skip
    keys = [(dataset, variant.label, split) for dataset, variant, split in jobs]
    run_one = functools.partial(run, call.device, call.progress(progress))  # picklable for worker processes
    done = call.execute(keys, run_one, store, report, shard=shard, train=train)
    result: dict[str, Any] = {"name": config.name, "rows": [], "written": False}
    if not call.writes(shard):
        return result
    extra = f"; jobs in {workers} worker processes of 1 thread" if workers > 1 and train else ""
    result = {"name": config.name, **call.provenance(command, call.device_text() + extra),
              "config": dataclasses.asdict(config), "protocol": protocol, "rows": summarise(done)}  # fmt: skip
    if figures is not None:
        result["figures"] = figures(result, call.out)
    call.write_result(result)
    return call.write_page(result, render(result))
