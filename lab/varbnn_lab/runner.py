"""One runner for every classification config: train each variant for each seed, evaluate, write results.

Results go to ``OUT/NAME.json`` (``{"name", "command", "commit", "device", "seconds", "code_hash", "dirty",
"stale_runs", "config", "rows", ...}``; the code's provenance fields: :mod:`varbnn_lab.provenance`) and
``OUT/NAME.md`` (the table rendered from the JSON), plus figures named ``OUT/NAME_<figure>.png``.
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
import pickle
import shlex
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from varbnn import data as datasets
from varbnn.analysis import replace_stds_with_rank_k, std_matrix, variance_explained
from varbnn.convert import bayesianize
from varbnn.families import make_family
from varbnn.families.gaussian import MeanField
from varbnn.metrics import mean_and_standard_error
from varbnn.models import make_model
from varbnn.nn.base import BayesianModule
from varbnn.objectives import default_kl_weight, linear_kl_annealing
from varbnn.plots import (
    ood_histograms,
    overview_figure,
    reliability_diagram,
    std_heatmaps,
    trace_figure,
    variance_explained_figure,
)
from varbnn.priors import make_prior
from varbnn.training import default_optimizer, fit, seed_everything
from varbnn.training.checkpoint import _check_plain_data, _reason, _write_atomically
from varbnn.training.compiled import _fit_compile_mode
from varbnn_lab.baselines import BASELINES, DETERMINISTIC, after_training, build_baseline, members
from varbnn_lab.config import OPTIMIZERS, ExperimentConfig, Variant, results_dir
from varbnn_lab.engine import (
    _FAIL_FAST,
    RunsFailed,
    RunStore,
    describe_device,
    execute,
    expand,
    fingerprint,
    git_commit,
    nothing_saved,
    processes,
    select_shard,
)
from varbnn_lab.evaluation import evaluate_variant, ood_scores, parameter_count, prune_scores
from varbnn_lab.figures import cost_figure, front_figure
from varbnn_lab.hooks import BestOfLast, Sidecar, Tracer, committed_state
from varbnn_lab.render import render_markdown, render_saved  # noqa: F401 (re-exported)

__all__ = [
    "run_experiment",
    "render_markdown",
    "render_saved",
    "load_classification",
    "build_model",
    "describe_device",
    "git_commit",
]


def _rotated_digits(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The digits images turned by 90 degrees (an out-of-distribution set for the digits task; labels kept)."""
    x, y = datasets.load_digits(split)
    return torch.rot90(x.view(-1, 8, 8), 1, dims=(1, 2)).reshape(-1, 64).contiguous(), y


def _noise_digits(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform noise in [0, 1] of the digits' shape and count (seeded; labels are placeholders)."""
    x, y = datasets.load_digits(split)
    return torch.rand(x.shape, generator=torch.Generator().manual_seed(0)), torch.zeros_like(y)


_LOADERS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    "digits": lambda split, data_dir: datasets.load_digits(split),
    "digits-rotated": lambda split, data_dir: _rotated_digits(split),
    "digits-noise": lambda split, data_dir: _noise_digits(split),
    "mnist": lambda split, data_dir: datasets.load_mnist(split, data_dir),
    "fashion-mnist": lambda split, data_dir: datasets.load_fashion_mnist(split, data_dir),
    "retinamnist": lambda split, data_dir: datasets.load_retinamnist(split, data_dir),
}


def load_classification(name: str, split: str, data_dir: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and labels of a classification dataset by name (keys of the loader table)."""
    if name not in _LOADERS:
        raise ValueError(f"unknown dataset {name!r}; allowed: {sorted(_LOADERS)}")
    return _LOADERS[name](split, data_dir)


def build_model(config: ExperimentConfig, variant: Variant, trained: torch.nn.Module | None = None) -> torch.nn.Module:
    """The config's plain model, made Bayesian with the variant's family and prior (unless ``plain``); modules
    named in ``variant.module_families`` get their own family (sharing the one prior). ``trained``: a trained plain
    network to convert instead (``bayesianize(pretrained=True)``: its weights become the posterior means)."""
    if variant.family in BASELINES:
        return build_baseline(variant.family, lambda: make_model(config.model, **config.model_options), variant.family_options)
    plain = make_model(config.model, **config.model_options) if trained is None else trained
    if variant.family == "plain":
        return plain
    names = dict(plain.named_modules())
    missing = sorted(set(variant.module_families) - set(names))
    if missing:
        raise ValueError(
            f"{variant.label}: module_families names unknown modules {missing}; modules: {sorted(n for n in names if n)}"
        )
    prior = make_prior(variant.prior, **variant.prior_options)
    initial: dict[str, Any] = {} if config.pretrained is None else {"pretrained": config.pretrained}
    if trained is not None:
        initial = {"pretrained": True}
    model = bayesianize(
        plain, make_family(variant.family, **variant.family_options), prior, exclude=tuple(variant.module_families), **initial
    )
    for name, spec in variant.module_families.items():
        options = dict(spec)
        family = make_family(options.pop("family", "meanfield"), **options)
        module = model.get_submodule(name)
        converted = bayesianize(module, family, prior, **initial)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, converted)
    return model


def _kl_weight(config: ExperimentConfig, warmup: int, model: torch.nn.Module) -> dict[str, Any]:
    """``fit``'s ``kl_weight`` argument: annealed from 0 over ``warmup`` steps to ``config.kl_weight`` (``None``: the
    model's library default, :func:`varbnn.objectives.default_kl_weight`); none at all (fit's default) when
    ``kl_weight`` is None and nothing is annealed."""
    if config.kl_weight is None and not warmup:
        return {}
    final = default_kl_weight(model) if config.kl_weight is None else float(config.kl_weight)
    if warmup:
        return {"kl_weight": lambda step: final * linear_kl_annealing(step, warmup)}
    return {"kl_weight": final}


def make_optimizer(name: str, parameters: Any, lr: float) -> torch.optim.Optimizer:
    """``"adam"`` or ``"amsgrad"`` (Adam with the AMSGrad correction), fused where torch supports it
    (:func:`varbnn.training.default_optimizer`)."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; allowed: {OPTIMIZERS}")
    return default_optimizer(parameters, lr, amsgrad=name == "amsgrad")


def _variant_optimizer(config: ExperimentConfig, variant: Variant, model: torch.nn.Module, n_train: int) -> torch.optim.Optimizer:
    """The optimizer of one training: ``variant.optimizer`` (``"ivon"``: :class:`varbnn.optim.IVON` of ``model`` with
    the variant's options) or else the config's."""
    if variant.optimizer == "ivon":
        from varbnn.optim import IVON

        return IVON(model, n_data=n_train, **variant.optimizer_options)
    return make_optimizer(variant.optimizer or config.optimizer, model.parameters(), config.lr)


def _checkpoint_path(config: ExperimentConfig, out_dir: str | os.PathLike[str], variant: Variant, seed: int) -> Path:
    """``OUT/.checkpoints/NAME-<hash>/<variant>-seed<seed>.pt``, the hash over :meth:`ExperimentConfig.training_dict`
    with this variant alone: a changed training setup never resumes a stale run; a changed evaluation or pruning, or
    another variant added to the table, reuses the finished one."""
    digest = fingerprint(_one_variant(config.training_dict(), config, variant))
    slug = "".join(c if c.isalnum() else "-" for c in variant.label).strip("-")
    return Path(out_dir) / ".checkpoints" / f"{config.name}-{digest}" / f"{slug}-seed{seed}.pt"


def run_experiment(
    config: ExperimentConfig,
    *,
    device: str | torch.device | None = "cpu",
    out_dir: str | os.PathLike[str] | None = None,
    data_dir: str | None = None,
    progress: bool = True,
    command: str | None = None,
    distributed: bool = False,
    shard: tuple[int, int] | None = None,
    train: bool = True,
    workers: int = 1,
    only: Sequence[str] | None = None,
    compile: bool | str = False,
    fail_fast: bool | None = None,
) -> dict[str, Any]:
    """Train and evaluate every variant of ``config`` for every seed (``only``: just the runs of these variant labels;
    the page still shows every run saved); write JSON, Markdown and figures to ``out_dir``
    (default: ``benchmarks/results/NAME/``, see :func:`~varbnn_lab.config.results_dir`).

    ``compile``: train with ``fit(compile=...)`` (``True`` or a torch.compile mode; see :func:`varbnn.fit`), a runtime
    choice like the device: not part of the protocol, so a compiled run resumes an eager one's checkpoint and the other
    way round. Each record it trains says ``"compile"``, and the page counts a compiled step as a device of its own
    (times compare only within one). Refused for a variant with the Graves estimator, which ``fit`` cannot compile.

    The runs, one per (variant label, seed), go through :mod:`varbnn_lab.engine`: each finished run is one line
    of ``OUT/NAME_runs.jsonl`` (a rerun skips it; a killed invocation keeps it, and the run in progress resumes from its
    epoch checkpoint when ``config.resumable``); ``workers`` > 1 runs them in that many CPU processes, ``shard=(k, n)``
    only every n-th from the k-th (into ``NAME_runs.shardK.jsonl``; nothing is rendered), ``train=False`` only renders
    the runs saved (a batch with one run to train runs in this process, and its ``prune_front`` points in the
    ``workers`` processes; none saved at all is a ``ValueError`` naming the folder, raised before any data is loaded).
    The first seed's run of each variant saves what the figures need next to the checkpoints, as plain tensors (the
    Bayesian model as its state dict), read back with ``torch.load(weights_only=True)``: a file there that does not load
    so (written by an older varbnn, which pickled the whole model, or not varbnn's) is never unpickled; a training call
    moves it aside (``.refused``, with a warning) and redoes that run, a ``train=False`` call stops with a
    ``ValueError`` naming it.

    A run that raises is reported at once (its key and traceback, on stderr); the other runs go on and a
    :class:`~varbnn_lab.engine.RunsFailed` naming the failed runs is raised at the end, before any page is
    written (every finished run is saved). ``fail_fast=True`` stops at the first failure instead (the queued runs are
    not started, the worker processes ended); ``None``: the engine's
    :func:`~varbnn_lab.engine.failure_policy` (``False`` by default).

    With ``distributed`` (launch with ``torchrun``; see :mod:`varbnn.distributed`) every process trains on its shard
    with a per-process batch of ``batch_size // world_size`` (the global batch stays ``batch_size``), gradients are
    averaged by ``DistributedDataParallel``, and only rank 0 writes checkpoints and results."""
    from varbnn import distributed as vdist
    from varbnn_lab import provenance as prov

    start = time.perf_counter()
    commit = git_commit()  # the code that runs is the code at the start, not whatever HEAD is at the end
    code = prov.code_hash([__name__])
    out_dir = results_dir(config.name, out_dir)
    dirty = prov.check_tree(out_dir)  # a committed results folder from a dirty tree: refused unless allowed
    reuse_stale = prov.current_policy().reuse_stale
    if compile is not False and train:
        _check_compile(config, only, compile, distributed)
    dev, world = processes(device, distributed, workers)
    progress = progress and vdist.is_main_process()
    labels = [v.label for v in config.variants]
    if len(set(labels)) != len(labels):
        raise ValueError(f"{config.name}: variant labels must be unique, got {labels}")
    unknown = sorted(set(only or ()) - set(labels))
    if unknown:
        raise ValueError(f"{config.name}: unknown variants {unknown}; allowed: {labels}")
    protocols = {v.label: _protocol(config, v) for v in config.variants}
    runs = expand(variant=labels, seed=config.seeds)
    known = set(runs)
    store = RunStore(
        Path(out_dir), config.name, key=lambda r: (r.get("variant"), r.get("seed")),
        protocol=lambda k: protocols[k[0]] if k in known else None, shard=shard, readonly=not vdist.is_main_process(),
        check=_check_record, fields=("variant", "seed"),
    )  # fmt: skip
    if not train and not set(runs) & set(store.load()):  # before any data is loaded (or downloaded)
        raise nothing_saved(store, len(runs))  # an empty page (or a plotting library's error) otherwise
    data = _data(config, data_dir)
    n_train, total_steps = data["n_train"], data["total_steps"]
    run = functools.partial(_run_seed, config, data_dir, str(out_dir), dev, distributed, progress, compile=compile)
    if train:
        pending = [k for k in select_shard(runs, shard) if only is None or k[0] in only]
        post_hoc = {v.label for v in config.variants if v.family in POST_HOC or v.convert_epochs}
        saved = store.load()
        redo = _refused_figure_data(config, out_dir, saved, pending) if vdist.is_main_process() else set()
        stale_keys = set() if reuse_stale else {k for k in pending if k in saved and prov.is_stale(saved[k], code)}
        if stale_keys and vdist.is_main_process():  # retrained from scratch: their checkpoints are older code's
            _set_aside_checkpoints(config, out_dir, sorted(stale_keys, key=str))
        redo |= stale_keys
        failed: dict[tuple[Any, ...], str] = {}
        # seed by seed (a partial run still compares every variant), the post-hoc baselines and the converted networks
        # after the plain run whose training they reuse
        for batch in _batches(pending, config.seeds, post_hoc, workers):
            # a batch of one run to train runs in this process: the idle workers take its front points
            alone = len([k for k in batch if k not in saved or k in redo]) == 1 and not distributed
            try:
                execute(batch, functools.partial(run, workers=workers if alone else 1), store, device=dev,
                        workers=workers, commit=commit, fail_fast=fail_fast, redo=redo, code_hash=code, dirty=dirty,
                        reuse_stale=reuse_stale)  # fmt: skip
            except RunsFailed as error:
                failed.update(error.failed)
                if _FAIL_FAST.get() if fail_fast is None else fail_fast:  # nothing more starts
                    left = [k for k in pending if k not in failed and k not in error.records]
                    raise RunsFailed(config.name, failed, error.records, left, store.path) from None
        if failed:
            raise RunsFailed(config.name, failed, store.load(), (), None if store.readonly else store.path)
    done = store.load()
    if shard is not None:
        return {"name": config.name, "rows": [], "figures": [], "written": False, "runs_file": str(store.path)}
    rows: list[dict[str, Any]] = []
    traces: dict[str, list[list[dict[str, float]]]] = {}
    first_seed_predictions: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    first_seed_models: dict[str, torch.nn.Module] = {}
    first_seed_entropies: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    validation_cuts: dict[str, dict[tuple[str, str], float]] = {}
    missing = [k for k in runs if k not in done]
    if missing and vdist.is_main_process():
        print(f"[{config.name}] {len(missing)} of {len(runs)} runs not done yet: {missing}", file=sys.stderr)
    for variant in config.variants:
        per_seed: dict[str, list[dict[str, Any]]] = {}
        for seed in config.seeds:
            record = done.get((variant.label, seed))
            if record is None:
                continue
            for label, scores in record["scores"]:
                per_seed.setdefault(label, []).append(scores)
            if record.get("traces") is not None:
                traces.setdefault(variant.label, []).append(record["traces"])
        path = _figure_data_path(config, out_dir, variant, config.seeds[0])
        if (variant.label, config.seeds[0]) in done and path.exists() and vdist.is_main_process():
            figure_data = _load_figure_data(path, variant)
            label = figure_data["label"]
            first_seed_predictions[label] = figure_data["predictions"]
            if figure_data["model_state"] is not None:
                first_seed_models[label] = _rebuild_model(config, variant, figure_data["model_state"], path)
            if "entropies" in figure_data:
                first_seed_entropies[label] = figure_data["entropies"]
            if "validation_cuts" in figure_data:
                validation_cuts[label] = figure_data["validation_cuts"]
        for label, seed_scores in per_seed.items():
            row: dict[str, Any] = {"variant": label, "family": variant.family, "prior": variant.prior, "seeds": len(seed_scores)}
            for key in seed_scores[0]:
                values = [s[key] for s in seed_scores]
                if all(isinstance(v, str) for v in values):  # e.g. the pruned architecture, one per seed
                    row[key] = " / ".join(values)  # type: ignore[arg-type]
                    continue
                mean, sem = mean_and_standard_error(values)
                row[key] = mean
                row[f"{key}_sem"] = sem
            rows.append(row)
    out = Path(out_dir)
    if not vdist.is_main_process():  # rank 0 writes the results
        return {"name": config.name, "rows": rows, "figures": [], "written": False}
    out.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in out.glob("*.png") if p.stem == config.name or p.stem.startswith(f"{config.name}_")}
    provenance = _run_provenance([done[k] for k in runs if k in done])
    figures = _figures(
        config, out, first_seed_predictions, first_seed_models, traces, validation_cuts, first_seed_entropies, rows,
        provenance["variant_devices"],
    )  # fmt: skip
    stale = sorted(before - set(figures))
    if stale:  # e.g. a page rendered where the first seed's figure data (next to the checkpoints) is not
        print(
            f"[{config.name}] not redrawn, so left off the page (their data is not under {out}/.checkpoints; the files "
            f"stay as they were): {', '.join(stale)}",
            file=sys.stderr,
        )
    result = {
        "name": config.name,
        "command": command or "varbnn " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "commit": commit,
        "device": describe_device(dev) + (f" x {world} processes (DistributedDataParallel)" if world > 1 else ""),
        "seconds": round(time.perf_counter() - start, 2),
        "code_hash": code,
        "dirty": dirty,
        "stale_runs": prov.stale_runs(done, runs, code, ("variant", "seed")),
        "config": config.to_dict(),
        "n_train": n_train,
        "steps": total_steps,
        "figures": figures,
        "rows": rows,
        "traces": traces,
        **provenance,
    }
    (out / f"{config.name}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / f"{config.name}.md").write_text(render_markdown(result))
    return result


def _check_compile(config: ExperimentConfig, only: Sequence[str] | None, compile: bool | str, distributed: bool) -> None:
    """Refuse ``compile`` before any run starts (a ``ValueError``) where ``fit`` would refuse it in the first run: not
    ``True`` or a mode (:func:`varbnn.training.compiled.compile_mode`), with distributed training, or for a variant to run that
    uses the Graves estimator."""
    from varbnn.training.compiled import compile_mode

    compile_mode(compile)
    if distributed:
        raise ValueError("compile is not available with distributed training yet (fit refuses it): drop one of the two")
    graves = [v.label for v in config.variants
              if (only is None or v.label in only) and v.family_options.get("estimator") == "graves"]  # fmt: skip
    if graves:
        raise ValueError(
            f"{config.name}: compile is not available for {graves} (the Graves estimator's per-example gradients do not "
            "come from the loss's backward); run them without it, e.g. leave them out with --variants"
        )


def _device_label(record: Mapping[str, Any]) -> str:
    """A record's device for the page, with ``, compiled step`` when it trained with ``fit(compile=...)``."""
    device = str(record.get("device", "unknown"))
    compiled = record.get("compile")
    if compiled:
        device += ", compiled step" + (f" ({compiled})" if isinstance(compiled, str) and compiled != "default" else "")
    return device


def _run_provenance(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Where the saved runs ``records`` (lines of a ``_runs.jsonl`` file) were trained: ``run_commits`` and
    ``run_devices`` (sorted, each once) and ``variant_devices`` (each device's variant labels, in the records' order),
    so that a page assembled from runs of several machines (e.g. part on a GPU, part on the CPU) says which is which.
    A compiled training step counts as a device of its own (:func:`_device_label`)."""
    by_device: dict[str, list[str]] = {}
    for record in records:
        labels = by_device.setdefault(_device_label(record), [])
        if record["variant"] not in labels:
            labels.append(record["variant"])
    return {
        "run_commits": sorted({str(r["commit"]) for r in records if r.get("commit")}),
        "run_devices": sorted(by_device),
        "variant_devices": by_device,
    }


def _data(config: ExperimentConfig, data_dir: str | None) -> dict[str, Any]:
    """The tensors every run of ``config`` uses (train / validation / test / OOD splits and the step counts), loaded
    once per process (worker processes load them themselves rather than receive them)."""
    cache_key = (json.dumps(config.to_dict(), sort_keys=True, default=str), data_dir)
    if cache_key in _DATA_CACHE:
        return _DATA_CACHE[cache_key]
    x_train, y_train = load_classification(config.dataset, "train", data_dir)
    x_test, y_test = load_classification(config.dataset, "test", data_dir)
    validation = None
    if config.validation_size:
        if config.validation_size >= len(x_train):
            raise ValueError(
                f"{config.name}: validation_size {config.validation_size} leaves no training data ({len(x_train)} examples)"
            )
        validation = (x_train[-config.validation_size :], y_train[-config.validation_size :])
        x_train, y_train = x_train[: -config.validation_size], y_train[: -config.validation_size]
    if config.train_limit:
        x_train, y_train = x_train[: config.train_limit], y_train[: config.train_limit]
    if config.test_limit:
        x_test, y_test = x_test[: config.test_limit], y_test[: config.test_limit]
    x_ood = load_classification(config.ood_dataset, "test", data_dir)[0] if config.ood_dataset else None
    if x_ood is not None and config.test_limit:
        x_ood = x_ood[: config.test_limit]
    if x_ood is not None and x_ood.shape[1:] != x_test.shape[1:]:
        raise ValueError(
            f"{config.name}: ood_dataset {config.ood_dataset!r} has inputs of shape {tuple(x_ood.shape[1:])}, the test set "
            f"{tuple(x_test.shape[1:])}"
        )
    n_train = len(x_train)
    steps_per_epoch = math.ceil(n_train / config.batch_size)
    total_steps = steps_per_epoch * config.epochs
    warmup = round(config.kl_annealing_epochs * steps_per_epoch)
    _DATA_CACHE.clear()
    _DATA_CACHE[cache_key] = data = dict(
        x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test, validation=validation, x_ood=x_ood,
        n_train=n_train, total_steps=total_steps, warmup=warmup,
    )  # fmt: skip
    return data


_DATA_CACHE: dict[tuple[str, str | None], dict[str, Any]] = {}


def _protocol(config: ExperimentConfig, variant: Variant) -> str:
    """The protocol hash of one variant's records: over everything such a record depends on (training and evaluation;
    of the variants, this one alone), so a changed evaluation re-evaluates the finished checkpoints (keyed by
    :meth:`ExperimentConfig.training_dict` only) and a variant added to or removed from the table leaves the others'
    records standing."""
    fields = {k: v for k, v in config.to_dict().items() if k not in ("name", "description")}
    return fingerprint(_one_variant(fields, config, variant), 16)


def _one_variant(fields: dict[str, Any], config: ExperimentConfig, variant: Variant) -> dict[str, Any]:
    """``fields`` (from :meth:`ExperimentConfig.to_dict`) with its ``variants`` list cut down to ``variant``'s entry."""
    return {**fields, "variants": [fields["variants"][config.variants.index(variant)]]}


def _figure_data_path(config: ExperimentConfig, out_dir: str | os.PathLike[str], variant: Variant, seed: int) -> Path:
    """Where the first seed's run keeps what the figures need (test probabilities, OOD entropies, the trained model,
    validation thresholds): ``OUT/.checkpoints/NAME-<protocol>/<variant>-seed<seed>.figures`` (a torch file)."""
    slug = "".join(c if c.isalnum() else "-" for c in variant.label).strip("-")
    return Path(out_dir) / ".checkpoints" / f"{config.name}-{_protocol(config, variant)}" / f"{slug}-seed{seed}.figures"


_FIGURE_FORMAT = "varbnn-figure-data-2"
"""The ``format`` entry of a figure-data file: plain tensors, numbers, strings, tuples and dicts only (the Bayesian
model as its state dict), so that it loads with ``torch.load(weights_only=True)``."""


def _model_state(model: torch.nn.Module) -> dict[str, Any] | None:
    """What the figures need of a trained model: its state dict on the CPU when it has Bayesian layers (the figures
    draw those only), else ``None``."""
    if not any(isinstance(m, BayesianModule) for m in model.modules()):
        return None
    state = model.state_dict()
    return {name: value.detach().cpu() if isinstance(value, torch.Tensor) else value for name, value in state.items()}


def _load_figure_data(path: Path, variant: Variant) -> dict[str, Any]:
    """The figure data at ``path`` (:func:`_figure_data_path`), loaded with ``torch.load(weights_only=True)``: nothing
    in it is run. A file that does not load so, or is not of :data:`_FIGURE_FORMAT`, is a ``ValueError`` naming it."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        reason = "it holds Python objects other than plain data (tensors, numbers, strings, lists, dicts): not unpickled"
    except Exception as error:  # noqa: BLE001 -- a damaged archive: RuntimeError, EOFError, OSError, ...
        reason = f"it is not a readable torch file ({_reason(error)})"
    else:
        if isinstance(data, dict) and data.get("format") == _FIGURE_FORMAT and "label" in data and "predictions" in data:
            data.setdefault("model_state", None)
            return data
        reason = f"it is not figure data of format {_FIGURE_FORMAT!r}"
    raise ValueError(
        f"{path}: the figure data of {variant.label!r}'s first seed cannot be used: {reason}. It was written by an older "
        "varbnn (which pickled the whole model) or it is not varbnn's file. Rerun the command without --no-train (that "
        "run is redone and the file written again), or delete the file (the page is then drawn without that variant's "
        "figures)"
    )


def _rebuild_model(config: ExperimentConfig, variant: Variant, state: Mapping[str, Any], path: Path) -> torch.nn.Module:
    """``variant``'s model (:func:`build_model`; in its :class:`~varbnn.calibration.TemperatureScaled` for a
    ``temperature`` variant) holding the saved ``state`` of the figure-data file ``path``."""
    model = build_model(config, variant)
    if variant.temperature:
        from varbnn.calibration import TemperatureScaled

        model = TemperatureScaled(model)
    try:
        model.load_state_dict(state)
    except (RuntimeError, ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"{path}: the saved model of {variant.label!r} does not fit the config's model ({str(error).splitlines()[0]}); "
            "delete the file and rerun the command without --no-train"
        ) from None
    return model


def _refused_figure_data(
    config: ExperimentConfig, out_dir: str | os.PathLike[str], saved: Mapping[tuple[Any, ...], Any], pending: Sequence[Any]
) -> set[tuple[Any, ...]]:
    """The finished first-seed runs of ``pending`` whose figure-data file cannot be used (:func:`_load_figure_data`):
    each file is moved aside (``.refused``, with a warning) and its run is redone, which writes it again."""
    redo: set[tuple[Any, ...]] = set()
    for variant in config.variants:
        key = (variant.label, config.seeds[0])
        path = _figure_data_path(config, out_dir, variant, config.seeds[0])
        if key not in saved or key not in pending or not path.exists():
            continue
        try:
            _load_figure_data(path, variant)
        except ValueError as error:
            aside = path.with_name(path.name + ".refused")
            os.replace(path, aside)
            warnings.warn(f"{str(error).split('. It was')[0]}; moved to {aside.name}, redoing run {key!r} to write it again",
                          UserWarning, stacklevel=3)  # fmt: skip
            redo.add(key)
    return redo


def _check_record(record: Mapping[str, Any]) -> str | None:
    """What the page needs of a run's record (:class:`~varbnn_lab.engine.RunStore`'s ``check``): ``scores`` a
    list of ``[label, {name: number or text}]`` pairs, ``traces`` a list or null; ``None`` when it holds them."""
    scores = record.get("scores")
    if not isinstance(scores, list) or not scores:
        return "'scores' must be a non-empty list of [label, scores] pairs"
    for entry in scores:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) and isinstance(entry[1], dict)):
            return f"'scores' entry {entry!r:.80} is not a [label, {{name: value}}] pair"
        for name, value in entry[1].items():
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                return f"score {name!r} of {entry[0]!r} is {value!r:.40}, not a number or text"
    if record.get("traces") is not None and not isinstance(record["traces"], list):
        return "'traces' must be a list or null"
    return None


def _run_seed(
    config: ExperimentConfig,
    data_dir: str | None,
    out_dir: str,
    device: torch.device,
    distributed: bool,
    progress: bool,
    key: tuple[str, int],
    compile: bool | str = False,
    workers: int = 1,
) -> dict[str, Any]:
    """Train and evaluate one run, ``key = (variant label, seed)``; its record holds the scores of every evaluated
    model (the trained one, and its rank-k versions) and the traces (and ``compile`` when it trained with
    ``fit(compile=...)``). The first seed's run also saves what the figures need (:func:`_figure_data_path`), on the
    main process only. ``workers`` > 1: the points of ``prune_front`` in that many CPU processes
    (:func:`~varbnn_lab.evaluation.front_points`)."""
    from varbnn import distributed as vdist

    label_wanted, seed = key
    variant = next(v for v in config.variants if v.label == label_wanted)
    dev = device
    world = vdist.world_size() if distributed else 1
    d = _data(config, data_dir)
    x_train, y_train, x_test, y_test = d["x_train"], d["y_train"], d["x_test"], d["y_test"]
    validation, x_ood, n_train = d["validation"], d["x_ood"], d["n_train"]
    total_steps, warmup = d["total_steps"], d["warmup"]
    scored: list[tuple[str, dict[str, Any]]] = []
    figure_data: dict[str, Any] = {}
    seed_everything(seed)
    if distributed:
        loader = vdist.data_loader(TensorDataset(x_train, y_train), max(1, config.batch_size // world), seed=seed)
    else:
        loader = DataLoader(TensorDataset(x_train, y_train), batch_size=config.batch_size, shuffle=True)
    plain_seconds = 0.0
    if variant.convert_epochs:  # the user's path: the plain network trained as the plain run trains it, then converted
        trained_plain, plain_seconds = _train_plain(
            config, out_dir, seed, loader, n_train, warmup, dev, progress, distributed, compile
        )
        model = build_model(config, variant, trained=trained_plain).to(dev)
    else:
        model = build_model(config, variant).to(dev)
    tracer = None
    if (config.log_every or config.log_steps) and variant.family not in ("plain", *BASELINES):
        tracer = Tracer(config, model, validation, n_train, total_steps, seed, dev)
    t0 = time.perf_counter()
    checkpoint = _checkpoint_path(config, out_dir, variant, seed) if config.resumable else None
    _reuse_plain_training(config, out_dir, variant, seed, checkpoint)
    trained = members(model)  # a deep ensemble's members are trained one after the other, each with its checkpoint
    parts: list[Path | None] = [checkpoint] * len(trained)
    if checkpoint is not None and len(trained) > 1:
        parts = [checkpoint.with_name(f"{checkpoint.stem}-member{i}{checkpoint.suffix}") for i in range(len(trained))]
    sidecar = Sidecar(checkpoint, tracer, t0, parts=[p for p in parts if p is not None])
    best, selected_epoch = None, None
    if config.select_best_of_last:
        best = BestOfLast(model, config.epochs, config.select_best_of_last, checkpoint)
    callbacks = [c for c in (sidecar if checkpoint is not None else None, best) if c is not None]

    def on_epoch_end(epoch: int, record: dict[str, float], callbacks: list[Any] = callbacks) -> None:
        for callback in callbacks:
            callback(epoch, record)

    def checkpoint_extra(sidecar: Sidecar = sidecar, best: BestOfLast | None = best) -> dict[str, Any]:
        return {"traces": sidecar.state(), **({"best": best.state()} if best is not None else {})}

    for member, member_checkpoint in zip(trained, parts):
        history = fit(
            member, loader, n_data=n_train, epochs=variant.convert_epochs or config.epochs, device=dev, progress=progress,
            optimizer=_variant_optimizer(config, variant, member, n_train),
            **({} if variant.optimizer == "ivon" else _kl_weight(config, 0 if variant.convert_epochs else warmup, member)),
            on_step_end=tracer, checkpoint=member_checkpoint, resume=config.resumable,
            on_epoch_end=on_epoch_end if callbacks else None, distributed=distributed,
            checkpoint_extra=checkpoint_extra if member_checkpoint is not None else None,
            mc_samples=config.mc_samples if variant.family not in (*DETERMINISTIC, *BASELINES) else 1, compile=compile,
            **_early_stopping(variant, validation, dev),
        )  # fmt: skip
        if variant.early_stopping and history:
            selected_epoch = history[-1].get("best_epoch")
    selected_epoch = best.restore() if best is not None else selected_epoch  # before any post-hoc step fits on it
    if variant.family in BASELINES:
        model = after_training(variant.family, model, loader, validation, dev)
    if variant.temperature:
        model = _temperature_scaled(config, variant, model, validation, dev)
    train_seconds = plain_seconds + sidecar.previous_seconds + time.perf_counter() - t0 - (tracer.seconds if tracer else 0.0)
    results: dict[str, tuple[torch.nn.Module, str]] = {"": (model, variant.label)}
    for rank in config.posthoc_ranks if variant.family not in ("plain", *BASELINES) else ():
        results[f"rank-{rank}"] = (replace_stds_with_rank_k(model, rank), f"{variant.label}, stds -> rank-{rank}")
    for which, (evaluated, label) in results.items():
        scores, probs = evaluate_variant(config, variant, evaluated, (x_test, y_test), n_train, seed, dev)
        if which == "":
            scores.update(
                parameters=float(parameter_count(model)),
                train_seconds=train_seconds,
                final_train_loss=history[-1]["loss"] if history else float("nan"),
            )
            if selected_epoch is not None:
                scores["selected_epoch"] = float(selected_epoch)
            if x_ood is not None:
                ood, entropies = ood_scores(config, variant, model, x_test, x_ood, dev)
                scores.update(ood)
                if seed == config.seeds[0]:
                    figure_data["entropies"] = entropies
            if config.prune and variant.family not in ("plain", *BASELINES):
                pruned, thresholds = prune_scores(
                    config, model, (x_test, y_test), (x_train, y_train), validation, seed, dev, progress, workers
                )
                scores.update(pruned)
                if thresholds is not None and seed == config.seeds[0]:
                    figure_data["validation_cuts"] = thresholds
            for record in tracer.records if tracer else []:
                if record["step"] in config.log_steps:
                    for name in ("snr", "val_nelbo"):
                        if name in record:
                            scores[f"{name}@{int(record['step'])}"] = record[name]
        scored.append((label, scores))
        if seed == config.seeds[0] and which == "":
            figure_data.update(format=_FIGURE_FORMAT, label=label, predictions=(probs, y_test), model_state=_model_state(model))
        if progress:
            summary = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in scores.items())
            print(f"[{config.name}] {label} seed {seed}: {summary}", file=sys.stderr)
    if figure_data and vdist.is_main_process():
        path = _figure_data_path(config, out_dir, variant, seed)
        _check_plain_data(figure_data, "figure data")  # what weights_only=True loads back, nothing else
        buffer = io.BytesIO()
        torch.save(figure_data, buffer)
        _write_atomically(path, buffer.getvalue())
    return {
        "variant": variant.label,
        "seed": seed,
        "scores": [[label, scores] for label, scores in scored],
        "traces": tracer.records if tracer is not None else None,
        # the mode fit used (True: CUDA graphs on a GPU when the batches have one shape, else the default mode)
        **({"compile": _fit_compile_mode(compile, dev, loader)} if compile is not False else {}),
    }


def _set_aside_checkpoints(config: ExperimentConfig, out_dir: str | os.PathLike[str], keys: Sequence[tuple[str, int]]) -> None:
    """Before the stale runs ``keys`` are trained again: rename their checkpoint files (the run's, its ensemble
    members', its converted network's: ``<variant>-seed<seed>.*`` and ``<variant>-seed<seed>-*`` in its checkpoint
    folder) to ``*.stale``, so that the run trains from the start with today's code instead of resuming (or, finished,
    merely re-evaluating) a network that older code trained. Nothing is deleted; a ``.stale`` file there before is
    replaced."""
    for label, seed in keys:
        variant = next((v for v in config.variants if v.label == label), None)
        if variant is None:
            continue
        checkpoint = _checkpoint_path(config, out_dir, variant, seed)
        if not checkpoint.parent.is_dir():
            continue
        stem = checkpoint.stem
        for path in sorted(checkpoint.parent.iterdir()):
            ours = path.name.startswith(f"{stem}.") or path.name.startswith(f"{stem}-")
            if ours and path.is_file() and path.suffix != ".stale":
                os.replace(path, path.with_name(path.name + ".stale"))


def _batches(
    pending: Sequence[tuple[str, int]], seeds: Sequence[int], post_hoc: set[str], workers: int
) -> list[list[tuple[str, int]]]:
    """The order of ``pending`` runs, in batches that run one after the other: seed by seed (a partial invocation still
    compares every variant on the seeds it finished), a post-hoc run (``post_hoc`` labels: it reuses the plain run's
    network) after the plain run of its seed. One process, or runs without post-hoc ones, run as one batch in that
    order. Worker processes (``workers`` > 1) pick runs in any order within a batch, so with post-hoc runs each seed's
    trainings are a batch and that seed's post-hoc runs go first into the next seed's batch (they are short and their
    plain run has finished): a batch never holds a post-hoc run beside the training it needs, and an invocation cut
    off during seed ``s`` has every run of the seeds before ``s - 1`` and seed ``s - 1``'s trainings. The price: at
    most one seed's trainings (plus the carried post-hoc runs) run at once."""
    ordered = sorted(pending, key=lambda k: (list(seeds).index(k[1]), k[0] in post_hoc))
    if workers <= 1 or not any(k[0] in post_hoc for k in ordered):  # nothing waits: every run in one batch
        return [ordered] if ordered else []
    batches: list[list[tuple[str, int]]] = []
    carried: list[tuple[str, int]] = []
    for seed in seeds:
        trains = [k for k in ordered if k[1] == seed and k[0] not in post_hoc]
        if trains or carried:
            batches.append(carried + trains)
        carried = [k for k in ordered if k[1] == seed and k[0] in post_hoc]
    if carried:
        batches.append(carried)
    return batches


def _early_stopping(variant: Variant, validation: tuple[torch.Tensor, torch.Tensor] | None, dev: torch.device) -> dict[str, Any]:
    """``fit``'s early-stopping arguments of ``variant`` (none when its ``early_stopping`` is 0)."""
    if not variant.early_stopping:
        return {}
    assert validation is not None  # ExperimentConfig refuses early_stopping without a validation_size
    return {"validation": (validation[0].to(dev), validation[1].to(dev)), "early_stopping": variant.early_stopping}


def _temperature_scaled(
    config: ExperimentConfig, variant: Variant, model: torch.nn.Module, validation: tuple[torch.Tensor, torch.Tensor] | None,
    dev: torch.device,
) -> torch.nn.Module:  # fmt: skip
    """``model`` wrapped in a :class:`~varbnn.calibration.TemperatureScaled` fitted on the validation split to the
    predictive the evaluation uses (``eval_samples`` draws; one pass for a deterministic model)."""
    from varbnn.calibration import TemperatureScaled

    assert validation is not None  # ExperimentConfig refuses temperature without a validation_size
    samples = None if variant.family in DETERMINISTIC else config.eval_samples
    return TemperatureScaled(model).to(dev).fit(validation[0].to(dev), validation[1].to(dev), samples=samples)


POST_HOC = ("temperature", "laplace")
"""Baselines that are a post-hoc step on the plain network, trained exactly as the ``plain`` variant trains it."""


def _train_plain(
    config: ExperimentConfig, out_dir: str, seed: int, loader: Any, n_train: int, warmup: int, dev: torch.device,
    progress: bool, distributed: bool, compile: bool | str = False,
) -> tuple[torch.nn.Module, float]:  # fmt: skip
    """The config's plain network for seed ``seed``, trained exactly as the ``plain`` variant's run trains it (its
    finished checkpoint copied and resumed, so nothing is trained twice; else trained here from the same seed), and
    its training seconds."""
    plain = config.plain_variant
    assert plain is not None  # ExperimentConfig refuses convert_epochs without a plain variant
    seed_everything(seed)
    model = build_model(config, plain).to(dev)
    checkpoint = _checkpoint_path(config, out_dir, plain, seed)
    checkpoint = checkpoint.with_name(f"{checkpoint.stem}-for-conversion{checkpoint.suffix}")
    _copy_plain_checkpoint(config, out_dir, seed, checkpoint)
    t0 = time.perf_counter()
    sidecar = Sidecar(checkpoint, None, t0)
    fit(model, loader, n_data=n_train, epochs=config.epochs, device=dev, progress=progress,
        optimizer=make_optimizer(config.optimizer, model.parameters(), config.lr), **_kl_weight(config, warmup, model),
        checkpoint=checkpoint, resume=True, on_epoch_end=sidecar, distributed=distributed, compile=compile,
        checkpoint_extra=lambda: {"traces": sidecar.state()})  # fmt: skip
    return model, sidecar.previous_seconds + time.perf_counter() - t0


def _copy_plain_checkpoint(config: ExperimentConfig, out_dir: str, seed: int, checkpoint: Path) -> None:
    """Copy the ``plain`` variant's finished checkpoint for ``seed`` (if there is one) to ``checkpoint`` (if that does
    not exist yet). Under data-parallel training rank 0 copies and every rank waits for it."""
    from varbnn import distributed as vdist

    plain = config.plain_variant
    if plain is not None and not checkpoint.exists() and vdist.is_main_process():
        source = _checkpoint_path(config, out_dir, plain, seed)
        state = committed_state(source)
        if state is not None and state.get("epoch") == config.epochs:
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            tmp = checkpoint.with_suffix(f".copy{os.getpid()}")
            shutil.copyfile(source, tmp)
            os.replace(tmp, checkpoint)
    vdist.barrier()


def _reuse_plain_training(config: ExperimentConfig, out_dir: str, variant: Variant, seed: int, checkpoint: Path | None) -> None:
    """Temperature scaling and last-layer Laplace start from the plain network trained exactly as the config's
    ``plain`` variant trains it (the same initial weights, batches and optimizer for the same seed): when that run's
    final checkpoint exists, copy it to this run's checkpoint, so that ``fit`` resumes at the last epoch instead of
    training the same network again. The copied checkpoint carries the plain run's training seconds, so the record's
    ``train_seconds`` still counts the training (plus the post-hoc fit). Resumable configs only."""
    if checkpoint is not None and variant.family in POST_HOC:
        _copy_plain_checkpoint(config, out_dir, seed, checkpoint)


def _figures(
    config: ExperimentConfig,
    out: Path,
    predictions: dict[str, tuple[torch.Tensor, torch.Tensor]],
    models: dict[str, torch.nn.Module],
    traces: dict[str, list[list[dict[str, float]]]],
    validation_cuts: dict[str, dict[tuple[str, str], float]] | None = None,
    entropies: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
    rows: list[dict[str, Any]] | None = None,
    variant_devices: dict[str, list[str]] | None = None,
) -> list[str]:
    """Draw ``config.figures``; ``variant_devices`` (from :func:`_run_provenance`): the training time of a row trained on
    another device than the plain network's is not comparable, so the cost figure leaves such rows out and says so."""
    seed = config.seeds[0]
    paths: list[Path] = []
    if "prune_front" in config.figures and rows:
        from varbnn_lab.render import front_budgets, published_lenet5_sizes

        published = [(m, f, f2, p, p2, e) for m, _, f, f2, p, p2, e in published_lenet5_sizes()]
        title = f"{config.name}: test error against size, the front and Oh et al.'s Table 2"
        paths.append(front_figure(rows, front_budgets(rows), published, out / f"{config.name}_front.png", title=title))
    if "cost" in config.figures and rows:
        from varbnn_lab.uncertainty import comparable_times

        shown, other = comparable_times(rows, variant_devices)
        note = f"not shown (trained on another device than the plain network): {', '.join(other)}" if other else ""
        title = f"{config.name}: test NLL against training cost"
        paths.append(cost_figure(shown, out / f"{config.name}_cost.png", title=title, note=note))
    if "overview" in config.figures and entropies:
        title = f"{config.name}: calibration on the {config.dataset} test set, and test vs {config.ood_dataset} (seed {seed})"
        paths.append(overview_figure(predictions, entropies, out / f"{config.name}.png", title=title))
    if "ood" in config.figures and entropies:
        title = f"{config.name}: {config.dataset} test vs {config.ood_dataset} (seed {seed})"
        paths.append(ood_histograms(entropies, out / f"{config.name}_ood.png", title=title))
    if "reliability" in config.figures:
        paths.append(
            reliability_diagram(predictions, out / f"{config.name}_reliability.png", title=f"{config.name} (seed {seed})")
        )
    if "traces" in config.figures and traces:
        paths.append(trace_figure(traces, out / f"{config.name}_traces.png", title=config.name))
    bayesian = {label: m for label, m in models.items() if any(isinstance(x, BayesianModule) for x in m.modules())}
    if "variance_explained" in config.figures and bayesian:
        label, model = next(iter(bayesian.items()))
        spectra: dict[str, torch.Tensor] = {}
        for name, module in model.named_modules():
            if isinstance(module, BayesianModule):
                for tensor, posterior, _ in module.bayesian_tensors():
                    if isinstance(posterior, MeanField) and posterior.shape is not None and len(posterior.shape) >= 2:
                        spectra[f"{name}.{tensor} stds"] = variance_explained(std_matrix(posterior))
                        spectra[f"{name}.{tensor} means"] = variance_explained(
                            posterior.mean.detach().reshape(std_matrix(posterior).shape)
                        )
        if spectra:
            paths.append(
                variance_explained_figure(spectra, out / f"{config.name}_variance_explained.png", title=f"{label} (seed {seed})")
            )
    if "prune_histograms" in config.figures and bayesian:
        from varbnn.prune import score_histograms

        label, model = next(iter(bayesian.items()))
        path = out / f"{config.name}_prune_histograms.png"
        second = (validation_cuts or {}).get(label)
        title = f"{label} (seed {seed}); red dashed: {config.prune_threshold} rule"
        if second is not None:
            title += f", green dotted: validation rule (tolerance {config.prune_validation_tolerance:g})"
        paths.append(score_histograms(model, path, config.prune_threshold, config.prune_min_gap, title=title, second=second))
    if "std_heatmaps" in config.figures and bayesian and config.heatmap_module:
        label, model = next(iter(bayesian.items()))
        module = model.get_submodule(config.heatmap_module)
        if not isinstance(module, BayesianModule):
            raise ValueError(f"heatmap_module {config.heatmap_module!r} is not a Bayesian layer")
        matrix = std_matrix(module.posteriors["weight"])  # type: ignore[arg-type]
        paths.append(
            std_heatmaps(matrix, out / f"{config.name}_std_heatmaps.png", title=f"{label}: {config.heatmap_module}.weight stds")
        )
    return [p.name for p in paths]
