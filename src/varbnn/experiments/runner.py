"""One runner for every classification config: train each variant for each seed, evaluate, write results.

Results go to ``OUT/NAME.json`` (``{"name", "command", "commit", "device", "seconds", "config", "rows"}``)
and ``OUT/NAME.md`` (the table rendered from the JSON), plus figures named ``OUT/NAME_<figure>.png``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from varbnn import data as datasets
from varbnn.convert import bayesianize
from varbnn.experiments.config import ExperimentConfig, Variant
from varbnn.families import make_family
from varbnn.models import make_model
from varbnn.plots import reliability_diagram
from varbnn.priors import make_prior
from varbnn.train import evaluate_classifier, fit, resolve_device, seed_everything

__all__ = ["run_experiment", "render_markdown", "load_classification", "build_model", "describe_device", "git_commit"]

DEFAULT_OUT = Path("benchmarks/results")

_LOADERS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    "digits": lambda split, data_dir: datasets.load_digits(split),
    "mnist": lambda split, data_dir: datasets.load_mnist(split, data_dir),
    "fashion-mnist": lambda split, data_dir: datasets.load_fashion_mnist(split, data_dir),
    "retinamnist": lambda split, data_dir: datasets.load_retinamnist(split, data_dir),
}


def load_classification(name: str, split: str, data_dir: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and labels of a classification dataset by name (keys of the loader table)."""
    if name not in _LOADERS:
        raise ValueError(f"unknown dataset {name!r}; allowed: {sorted(_LOADERS)}")
    return _LOADERS[name](split, data_dir)


def build_model(config: ExperimentConfig, variant: Variant) -> torch.nn.Module:
    """The config's plain model, made Bayesian with the variant's family and prior (unless ``plain``)."""
    plain = make_model(config.model, **config.model_options)
    if variant.family == "plain":
        return plain
    family = make_family(variant.family, **variant.family_options)
    prior = make_prior(variant.prior, **variant.prior_options)
    return bayesianize(plain, family, prior)


def git_commit() -> str:
    """HEAD's hash (with ``+dirty`` if the tree has uncommitted changes), or ``unknown``."""
    try:
        root = Path(__file__).resolve().parents[3]
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def describe_device(device: torch.device) -> str:
    """``"cuda: <GPU name>"`` or ``"cpu: <processor>, <threads> threads"``."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {name}, {torch.get_num_threads()} threads"


def _mean_sem(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, float("nan")
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(var / len(values))


def run_experiment(
    config: ExperimentConfig,
    *,
    device: str | torch.device | None = "cpu",
    out_dir: str | os.PathLike[str] = DEFAULT_OUT,
    data_dir: str | None = None,
    progress: bool = True,
    command: str | None = None,
) -> dict[str, Any]:
    """Train and evaluate every variant of ``config`` for every seed; write JSON, Markdown and figures."""
    start = time.perf_counter()
    commit = git_commit()  # the code that runs is the code at the start, not whatever HEAD is at the end
    dev = resolve_device(device)
    x_train, y_train = load_classification(config.dataset, "train", data_dir)
    x_test, y_test = load_classification(config.dataset, "test", data_dir)
    if config.train_limit:
        x_train, y_train = x_train[: config.train_limit], y_train[: config.train_limit]
    if config.test_limit:
        x_test, y_test = x_test[: config.test_limit], y_test[: config.test_limit]
    rows: list[dict[str, Any]] = []
    first_seed_predictions: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for variant in config.variants:
        per_seed: list[dict[str, float]] = []
        for seed in config.seeds:
            seed_everything(seed)
            model = build_model(config, variant)
            loader = DataLoader(TensorDataset(x_train, y_train), batch_size=config.batch_size, shuffle=True)
            t0 = time.perf_counter()
            history = fit(model, loader, n_data=len(x_train), epochs=config.epochs, lr=config.lr, device=dev, progress=progress)
            train_seconds = time.perf_counter() - t0
            samples = 1 if variant.family in ("plain", "delta") else config.eval_samples
            scores, probs = evaluate_classifier(model, x_test, y_test, samples=samples, device=dev)
            scores.update(train_seconds=train_seconds, final_train_loss=history[-1]["loss"] if history else float("nan"))
            per_seed.append(scores)
            if seed == config.seeds[0]:
                first_seed_predictions[variant.label] = (probs, y_test)
            if progress:
                print(
                    f"[{config.name}] {variant.label} seed {seed}: " + ", ".join(f"{k}={v:.4f}" for k, v in scores.items()),
                    file=sys.stderr,
                )
        row: dict[str, Any] = {"variant": variant.label, "family": variant.family, "prior": variant.prior, "seeds": len(per_seed)}
        for key in per_seed[0]:
            mean, sem = _mean_sem([s[key] for s in per_seed])
            row[key] = mean
            row[f"{key}_sem"] = sem
        rows.append(row)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figures = []
    if "reliability" in config.figures:
        path = reliability_diagram(
            first_seed_predictions, out / f"{config.name}_reliability.png", title=f"{config.name} (seed {config.seeds[0]})"
        )
        figures.append(path.name)
    result = {
        "name": config.name,
        "command": command or "varbnn " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "commit": commit,
        "device": describe_device(dev),
        "seconds": round(time.perf_counter() - start, 2),
        "config": config.to_dict(),
        "figures": figures,
        "rows": rows,
    }
    (out / f"{config.name}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / f"{config.name}.md").write_text(render_markdown(result))
    return result


def _format(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        return f"{value:.4g}"
    return str(value)


def render_markdown(result: dict[str, Any]) -> str:
    """The results table (metrics as ``mean ± sem`` over seeds) with its provenance."""
    rows = result["rows"]
    keys = [k for k in rows[0] if not k.endswith("_sem")] if rows else []
    lines = [
        f"# {result['name']}",
        "",
        result["config"].get("description", ""),
        "",
        f"- command: `{result['command']}`",
        f"- commit: `{result['commit']}`",
        f"- device: {result['device']}",
        f"- wall time: {result['seconds']:.1f} s",
        "",
        "| " + " | ".join(keys) + " |",
        "|" + "---|" * len(keys),
    ]
    for row in rows:
        cells = []
        for key in keys:
            cell = _format(row[key])
            sem = row.get(f"{key}_sem")
            if isinstance(sem, float) and not math.isnan(sem):
                cell += f" ± {_format(sem)}"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    for figure in result.get("figures", []):
        lines += ["", f"![{figure}]({figure})"]
    return "\n".join(lines) + "\n"
