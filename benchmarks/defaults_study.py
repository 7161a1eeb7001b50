"""How the library's defaults were chosen: every family over a grid of KL weights (and the mean-field family over two
ways to initialise the posterior means) on three small tasks, scored on VALIDATION data only.

Tasks (the test sets are never loaded):
* ``digits-mlp``: scikit-learn's 8x8 digits (the train split of :func:`varbnn.data.load_digits`; its last 300 images
  are the validation set), MLP 64-128-128-10, 150 epochs, batch 64, Adam 3e-3 (the demo's network and budget);
* ``digits-cnn``: the same images as 1x8x8, a small CNN (conv 16 - pool - conv 32 - pool - linear), 100 epochs;
* ``fmnist-mlp``: the first 12,000 Fashion-MNIST training images (10,000 train, 2,000 validation), MLP
  784-400-400-10, 20 epochs, batch 128, Adam 1e-3;
* ``fmnist-lenet5``: the same images as 1x28x28, LeNet-5-Caffe (:func:`varbnn.models.lenet5`, the network of the
  uncertainty benchmark), 10 epochs, batch 128, Adam 1e-3 (not in the committed study's default task list: run it
  with ``--tasks fmnist-lenet5 --library-defaults --out benchmarks/results/defaults-lenet5``).

Each run: ``varbnn.bayesianize`` with the family at its class defaults and a ``Normal(0, 1)`` prior
(``RadialDirectionalPrior()`` for RDP), trained by ``varbnn.train.fit`` with a constant KL weight ``beta``; the plain
network is trained the same way. Validation metrics from 32 Monte Carlo draws.

Selection rule (stated before the runs): per family, the ``beta`` with the lowest mean over tasks and seeds of the
validation NLL divided by the plain network's validation NLL on the same task and seed.

    .venv/bin/python benchmarks/defaults_study.py [--workers 2] [--seeds 0,1] [--tasks ...] [--module-init]
        [--library-defaults]

``--library-defaults`` runs only what a user who changes nothing gets, over every beta: each family as the library
builds it by default (``bayesianize(net, family)``: the module's weights as means, Radial's per-element initial std),
to check the chosen KL weights on another task.

Writes ``benchmarks/results/defaults/defaults_runs.jsonl`` (one line per finished run: resumable), and
``defaults.json`` + ``defaults.md`` + ``defaults.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

OUT = ROOT / "benchmarks" / "results" / "defaults"
BETAS = (1.0, 0.3, 0.1, 0.03, 0.01)
FAMILIES = ("meanfield", "radial", "ktied", "rdp", "delta")
EXTRA_FAMILIES = ("radial-element",)
"""``radial-element``: Radial with a per-element initial std of 1e-2 (``init_std=None``, sigma = 1e-2 sqrt(D)); the
``radial`` rows use ``init_std=1e-2`` (sigma = 1e-2, the class default until this study showed it stays practically
deterministic: mutual information 0.0000 on fmnist-mlp)."""
_FAMILY_OPTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "radial": ("radial", {"init_std": 1e-2}),
    "radial-element": ("radial", {"init_std": None}),
}


_SCRATCH_WIDTHS: dict[str, dict[str, Any]] = {"rdp": {"init_resultant": 0.95}}
"""The from-scratch initial widths, pinned for the ``module`` rows: ``bayesianize(pretrained=True)`` starts RDP
narrower around trained weights (``benchmarks/conversion_study.py``), which the study's fresh networks are not."""


@dataclass(frozen=True)
class Run:
    task: str
    family: str  # "plain" or a FAMILIES name
    beta: float
    init: str  # "family": the layer's own initialisation of the means; "module": the plain module's weights
    seed: int

    @property
    def key(self) -> str:
        return f"{self.task}|{self.family}|{self.beta:g}|{self.init}|{self.seed}"


TASKS: dict[str, dict[str, Any]] = {
    "digits-mlp": {"epochs": 150, "batch": 64, "lr": 3e-3},
    "digits-cnn": {"epochs": 100, "batch": 64, "lr": 3e-3},
    "fmnist-mlp": {"epochs": 20, "batch": 128, "lr": 1e-3},
    "fmnist-lenet5": {"epochs": 10, "batch": 128, "lr": 1e-3},
}
DEFAULT_TASKS = ("digits-mlp", "digits-cnn", "fmnist-mlp")
"""The committed study's tasks (``fmnist-lenet5`` is run on its own: see the module docstring)."""


def _data(task: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from varbnn.data import load_digits, load_fashion_mnist

    if task.startswith("digits"):
        x, y = load_digits("train")
        if task == "digits-cnn":
            x = x.view(-1, 1, 8, 8)
        return x[:-300], y[:-300], x[-300:], y[-300:]
    x, y = load_fashion_mnist("train")
    x = x.reshape(x.shape[0], -1)[:12_000].float()
    if x.max() > 1:
        x = x / 255.0
    if task == "fmnist-lenet5":
        x = x.view(-1, 1, 28, 28)
    y = y[:12_000]
    return x[:10_000], y[:10_000], x[10_000:], y[10_000:]


def _network(task: str) -> nn.Module:
    from varbnn.models import lenet5, mlp

    if task == "fmnist-lenet5":
        return lenet5()
    if task == "digits-mlp":
        return mlp(64, (128, 128), 10)
    if task == "digits-cnn":
        return nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 2 * 2, 10),
        )  # fmt: skip
    return mlp(784, (400, 400), 10)


def _model(run: Run) -> nn.Module:
    import varbnn
    from varbnn.families import make_family
    from varbnn.priors import Normal, RadialDirectionalPrior

    net = _network(run.task)
    if run.family == "plain":
        return net
    prior = RadialDirectionalPrior() if run.family == "rdp" else Normal(0.0, 1.0)
    name, options = family_options(run.family)
    if run.init == "module":  # a FRESH network's weights copied: keep the from-scratch widths the runs were made with
        options = {**_SCRATCH_WIDTHS.get(name, {}), **options}  # (bayesianize(pretrained=True) narrows these since)
    return varbnn.bayesianize(net, make_family(name, **options), prior, pretrained=run.init == "module")


def execute(run: Run) -> dict[str, Any]:
    """Train and validate one run in this process (1 thread); returns its record."""
    import varbnn
    from varbnn import metrics
    from varbnn.training import fit, seed_everything

    torch.set_num_threads(1)
    settings = TASKS[run.task]
    x, y, xv, yv = _data(run.task)
    seed_everything(run.seed)
    model = _model(run)
    loader = DataLoader(TensorDataset(x, y), batch_size=settings["batch"], shuffle=True,
                        generator=torch.Generator().manual_seed(run.seed))  # fmt: skip
    start = time.perf_counter()
    fit(model, loader, n_data=x.shape[0], epochs=settings["epochs"], lr=settings["lr"], kl_weight=run.beta, progress=False)
    seconds = time.perf_counter() - start
    model.eval()
    logits = varbnn.predict(model, xv, samples=1 if run.family == "plain" else 32, seed=run.seed)
    summary = varbnn.classification_summary(logits)
    return {
        **asdict(run),
        "key": run.key,
        "accuracy": metrics.accuracy(summary.probs, yv),
        "nll": metrics.negative_log_likelihood(summary.probs, yv),
        "ece": metrics.expected_calibration_error(summary.probs, yv),
        "brier": metrics.brier_score(summary.probs, yv),
        "mutual_information": float(summary.mutual_information.mean()),
        # signed: mean confidence minus accuracy (> 0 overconfident, < 0 underconfident; ECE has no sign)
        "confidence_gap": float(summary.probs.max(-1).values.mean()) - metrics.accuracy(summary.probs, yv),
        "seconds": round(seconds, 2),
    }


MODULE_INIT_BETAS = (1.0, 0.1, 0.03)


def plan(seeds: tuple[int, ...], tasks: tuple[str, ...], module_init: bool = False, extra: bool = False) -> list[Run]:
    """Every family over :data:`BETAS` with its own initialisation, mean-field also from the module's weights; with
    ``module_init`` also the other families from the module's weights at :data:`MODULE_INIT_BETAS`."""
    runs = []
    for task in tasks:
        for seed in seeds:
            runs.append(Run(task, "plain", 0.0, "module", seed))
            for family in FAMILIES:
                for beta in BETAS:
                    runs.append(Run(task, family, beta, "family", seed))
            for beta in BETAS:
                runs.append(Run(task, "meanfield", beta, "module", seed))
            for family in FAMILIES if module_init else ():
                for beta in MODULE_INIT_BETAS if family != "meanfield" else ():
                    runs.append(Run(task, family, beta, "module", seed))
            for family in EXTRA_FAMILIES if extra else ():
                for beta in BETAS:
                    runs.append(Run(task, family, beta, "module", seed))
    return runs


LIBRARY_DEFAULT_FAMILIES = ("meanfield", "radial-element", "ktied", "rdp", "delta")
"""Each family as ``bayesianize(net, family)`` builds it by default (``radial-element``: Radial's default start)."""


INIT_STD_FAMILIES = ("meanfield", "ktied")
"""The families ``--init-stds`` starts narrower (``init_std``, default 1e-2 for both)."""


def family_options(family: str) -> tuple[str, dict[str, Any]]:
    """``(make_family name, options)`` of a study family: ``radial-element`` etc. (:data:`_FAMILY_OPTIONS`), or
    ``NAME@STD`` (``--init-stds``): the family at its defaults but ``init_std=STD``."""
    if "@" in family:
        name, std = family.split("@")
        return name, {"init_std": float(std)}
    return _FAMILY_OPTIONS.get(family, (family, {}))


def plan_library_defaults(
    seeds: tuple[int, ...], tasks: tuple[str, ...], only_default_beta: bool = False, init_stds: tuple[float, ...] = ()
) -> list[Run]:
    """The plain network and every family as the library builds it by default (``module`` init) over :data:`BETAS`,
    or (``only_default_beta``) at its default KL weight alone; ``init_stds`` adds :data:`INIT_STD_FAMILIES` started at
    each of those initial stds (``NAME@STD``), at the same betas."""
    defaults = library_betas(init_stds)
    families = (*LIBRARY_DEFAULT_FAMILIES, *(f"{f}@{std:g}" for f in INIT_STD_FAMILIES for std in init_stds))
    return [
        run
        for task in tasks
        for seed in seeds
        for run in [Run(task, "plain", 0.0, "module", seed)]
        + [
            Run(task, family, beta, "module", seed)
            for family in families
            for beta in ((defaults[family],) if only_default_beta else BETAS)
        ]
    ]


def _read(path: Path) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    records = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            records[record["key"]] = record
    return records


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean validation NLL ratio (to plain, same task and seed) per (family, init, beta), and the selected beta."""
    plain = {(r["task"], r["seed"]): r for r in records if r["family"] == "plain"}
    table: dict[tuple[str, str, float], dict[str, list[float]]] = {}
    for r in records:
        if r["family"] == "plain" or (r["task"], r["seed"]) not in plain:
            continue
        base = plain[(r["task"], r["seed"])]
        cell = table.setdefault((r["family"], r["init"], r["beta"]), {})
        cell.setdefault("nll_ratio", []).append(r["nll"] / base["nll"])
        cell.setdefault("ece_diff", []).append(r["ece"] - base["ece"])
        for metric in ("nll", "ece", "accuracy", "mutual_information", "confidence_gap"):
            if metric in r:  # confidence_gap: recorded since the LeNet-5 check
                cell.setdefault(f"{r['task']}:{metric}", []).append(r[metric])
    rows = []
    for (family, init, beta), cell in sorted(table.items(), key=lambda kv: (kv[0][0], kv[0][1], -kv[0][2])):
        row: dict[str, Any] = {"family": family, "init": init, "beta": beta, "runs": len(cell["nll_ratio"])}
        row.update({k: sum(v) / len(v) for k, v in cell.items()})
        rows.append(row)
    selected = {}
    for family in {(r["family"], r["init"]) for r in rows}:
        candidates = [r for r in rows if (r["family"], r["init"]) == family]
        best = min(candidates, key=lambda r: r["nll_ratio"])
        selected[f"{family[0]}/{family[1]}"] = {k: best[k] for k in ("beta", "nll_ratio", "ece_diff")}
    plain_rows = {}
    for (task, _seed), r in plain.items():
        for metric in ("nll", "ece", "accuracy", "confidence_gap"):
            if metric in r:
                plain_rows.setdefault(f"{task}:{metric}", []).append(r[metric])
    return {"rows": rows, "selected": selected, "plain": {k: sum(v) / len(v) for k, v in plain_rows.items()}}


def render(result: dict[str, Any]) -> str:
    tasks = result["tasks"]
    heading = (
        f"# Defaults check on {', '.join(tasks)}: each family as the library builds it by default, over the KL weight"
        if result.get("library_defaults")
        else "# Defaults study: which KL weight and initialisation each family gets by default"
    )
    lines = [
        heading,
        "",
        f"Command: `{result['command']}`  ",
        f"Commit of this invocation: `{result['commit']}`; the runs' own commits (each run records the code it ran): "
        + ", ".join(f"`{c[:7]}` ({n} runs)" for c, n in result["run_commits"].items())
        + f"; device: {result['device']}; {result['seconds']:.0f} s of runs ({result['runs']} runs, seeds {result['seeds']}).",
        "",
        "Validation data only (no test set is loaded). `nll ratio` = validation NLL / the plain network's (same task and "
        "seed), averaged over tasks and seeds: below 1 beats the plain net. `ECE diff` = ECE minus the plain net's. "
        "Selection rule: per family, the beta with the lowest mean NLL ratio.",
        "",
        "| family | init | beta | nll ratio | ECE diff | " + " | ".join(f"{t} NLL | {t} ECE | {t} MI" for t in tasks) + " |",
        "|---|---|---|---|---|" + "---|---|---|" * len(tasks),
    ]
    for r in result["summary"]["rows"]:
        chosen = result["summary"]["selected"].get(f"{r['family']}/{r['init']}", {}).get("beta") == r["beta"]
        cells = [f"{r['family']}", r["init"], f"**{r['beta']:g}**" if chosen else f"{r['beta']:g}",
                 f"{r['nll_ratio']:.3f}", f"{r['ece_diff']:+.3f}"]  # fmt: skip
        for t in tasks:
            cells += [f"{r.get(f'{t}:nll', math.nan):.3f}", f"{r.get(f'{t}:ece', math.nan):.3f}",
                      f"{r.get(f'{t}:mutual_information', math.nan):.4f}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    plain = result["summary"]["plain"]
    lines += ["", "Plain network (mean over seeds): " + "; ".join(
        f"{t}: NLL {plain.get(f'{t}:nll', math.nan):.3f}, ECE {plain.get(f'{t}:ece', math.nan):.3f}, "
        f"accuracy {plain.get(f'{t}:accuracy', math.nan):.3f}" for t in tasks) + ".", ""]  # fmt: skip
    lines += ["Selected (bold above):", ""]
    for name, s in sorted(result["summary"]["selected"].items()):
        lines.append(f"- {name}: beta = {s['beta']:g} (NLL ratio {s['nll_ratio']:.3f}, ECE diff {s['ece_diff']:+.3f})")
    decision = _check_defaults(result["summary"]) if result.get("library_defaults") else _decision(result["summary"])
    lines += ["", *decision, "", "![validation NLL ratio against beta](defaults.png)", ""]
    return "\n".join(lines)


def library_betas(init_stds: tuple[float, ...] = ()) -> dict[str, float]:
    """Each family's default KL weight in the library as it is (``default_kl_weight``, what ``fit(kl_weight=None)`` uses);
    the ``NAME@STD`` families of ``init_stds`` too."""
    from varbnn.families import make_family

    families = (*LIBRARY_DEFAULT_FAMILIES, *(f"{f}@{std:g}" for f in INIT_STD_FAMILIES for std in init_stds))
    return {family: float(type(make_family(family_options(family)[0])).default_kl_weight) for family in families}


def _check_defaults(summary: dict[str, Any]) -> list[str]:
    """A ``--library-defaults`` run: each family's default KL weight against this task's best, and whether the family
    at its default beats the plain network on validation NLL and ECE."""
    rows = {(r["family"], r["beta"]): r for r in summary["rows"] if r["init"] == "module"}
    lines = ["## The library's defaults on this task", "",
             "| family | default beta | NLL ratio at it | ECE diff at it | best beta here | NLL ratio at best | "
             "default beats plain on NLL and ECE |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    stds = sorted({float(r["family"].split("@")[1]) for r in summary["rows"] if "@" in r["family"]})
    for family, beta in library_betas(tuple(stds)).items():
        at = rows.get((family, beta))
        best = summary["selected"].get(f"{family}/module")
        if at is None or best is None:
            continue
        beats = "yes" if at["nll_ratio"] < 1 and at["ece_diff"] < 0 else "no"
        lines.append(f"| {family} | {beta:g} | {at['nll_ratio']:.3f} | {at['ece_diff']:+.4f} | {best['beta']:g} | "
                     f"{best['nll_ratio']:.3f} | {beats} |")  # fmt: skip
    gaps = {(r["family"], r["beta"]): r[key] for r in summary["rows"] for key in r if key.endswith(":confidence_gap")}
    if gaps:
        plain_gap = {k: v for k, v in summary["plain"].items() if k.endswith(":confidence_gap")}
        lines += ["", "Mean confidence minus accuracy on the validation set (> 0: overconfident, < 0: underconfident): "
                  + ", ".join(f"{family} {gaps[(family, beta)]:+.4f}" for family, beta in library_betas(tuple(stds)).items()
                              if (family, beta) in gaps)
                  + "".join(f"; plain {v:+.4f}" for v in plain_gap.values()) + "."]  # fmt: skip
    return lines


def _decision(summary: dict[str, Any]) -> list[str]:
    """How the library's defaults follow from the table (the rule was stated before the runs)."""
    selected = summary["selected"]
    lines = ["## How the library's defaults follow", ""]
    lines.append("Initialisation of the means (`bayesianize(pretrained=...)`), best ratio of each start:")
    lines.append("")
    for family in FAMILIES:
        own, module = selected.get(f"{family}/family"), selected.get(f"{family}/module")
        if own and module:
            better = "module" if module["nll_ratio"] < own["nll_ratio"] else "family"
            lines.append(f"- {family}: the layer's own {own['nll_ratio']:.3f}, the module's weights {module['nll_ratio']:.3f} "
                         f"(better: {better})")  # fmt: skip
    wins = sum(
        1 for f in FAMILIES
        if f"{f}/module" in selected and f"{f}/family" in selected
        and selected[f"{f}/module"]["nll_ratio"] < selected[f"{f}/family"]["nll_ratio"]
    )  # fmt: skip
    lines += [
        "",
        f"On these fresh networks the module's weights are the better start for {wins} of {len(FAMILIES)} families. The "
        "initialisation default is a product decision, not this table's: `pretrained=True` keeps a trained network's "
        "weights, which is what converting a network is for (converting a trained net without it threw its training "
        "away); for a fresh network `pretrained=False` is the measured-better start for the families above. The default "
        "KL weight of each family is then its `module` row's selected beta:",
        "",
    ]
    for family in FAMILIES:
        module = selected.get(f"{family}/module")
        if module:
            lines.append(f"- {family}: beta = {module['beta']:g} (NLL ratio {module['nll_ratio']:.3f})")
    element = selected.get("radial-element/module")
    radial = selected.get("radial/module")
    if element and radial:
        if radial["nll_ratio"] <= element["nll_ratio"]:
            keep = "sigma = 1e-2 stays the default"
        else:
            keep = f"the per-element start is Radial's default (`init_std=None`), with its beta = {element['beta']:g}"
        lines += ["", f"Radial's initial scale: sigma = 1e-2 {radial['nll_ratio']:.3f} vs a per-element std of 1e-2 "
                      f"{element['nll_ratio']:.3f}: {keep}."]  # fmt: skip
    return lines


def figure(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = result["tasks"]
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.4), squeeze=False)
    plain = result["summary"]["plain"]
    lines = sorted({(r["family"], r["init"]) for r in result["summary"]["rows"]})
    colors = {line: plt.get_cmap("tab20")(i % 20) for i, line in enumerate(lines)}
    for ax, task in zip(axes[0], tasks):
        for family, init in lines:
            rows = [r for r in result["summary"]["rows"] if (r["family"], r["init"]) == (family, init)]
            rows.sort(key=lambda r: r["beta"])
            betas = [r["beta"] for r in rows if f"{task}:nll" in r]
            values = [r[f"{task}:nll"] for r in rows if f"{task}:nll" in r]
            label = family if init == "family" else f"{family} ({init} init)"
            ax.plot(betas, values, marker="o", label=label, linestyle="-" if init == "family" else "--",
                    color=colors[(family, init)])  # fmt: skip
        if f"{task}:nll" in plain:
            ax.axhline(plain[f"{task}:nll"], color="black", linewidth=1, label="plain")
        ax.set_xscale("log")
        ax.set_xlabel("KL weight beta")
        ax.set_ylabel("validation NLL (nats)")
        ax.set_title(task)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="worker processes of one thread each (default 2)")
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds (default 0,1)")
    parser.add_argument("--tasks", default=",".join(DEFAULT_TASKS),
                        help=f"comma-separated tasks (default: {','.join(DEFAULT_TASKS)}; allowed: {','.join(TASKS)})")
    parser.add_argument("--out", default=str(OUT), help="output folder")
    parser.add_argument("--extra", action="store_true", help=f"also {EXTRA_FAMILIES} (module init) over every beta")
    parser.add_argument("--module-init", action="store_true",
                        help=f"also every other family initialised from the module's weights, beta in {MODULE_INIT_BETAS}")
    parser.add_argument("--library-defaults", action="store_true",
                        help="only the plain network and each family as the library builds it by default, every beta")
    parser.add_argument("--default-beta-only", action="store_true",
                        help="with --library-defaults: each family at its default KL weight only")
    parser.add_argument("--init-stds", default="",
                        help=f"with --library-defaults: also {INIT_STD_FAMILIES} started at these comma-separated "
                        "initial stds (e.g. 3e-3,1e-3; the default is 1e-2)")
    args = parser.parse_args(argv)
    from varbnn_lab.runner import describe_device, git_commit

    seeds = tuple(int(s) for s in args.seeds.split(","))
    tasks = tuple(t for t in args.tasks.split(",") if t)
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        parser.error(f"--tasks: unknown {unknown}; allowed: {list(TASKS)}")
    if not 1 <= args.workers <= 64:
        parser.error(f"--workers must be in [1, 64], got {args.workers}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs_path = out / "defaults_runs.jsonl"
    done = _read(runs_path)
    if args.default_beta_only and not args.library_defaults:
        parser.error("--default-beta-only needs --library-defaults")
    try:
        init_stds = tuple(float(v) for v in args.init_stds.split(",") if v.strip())
    except ValueError:
        parser.error(f"--init-stds must be comma-separated numbers, got {args.init_stds!r}")
    if init_stds and not args.library_defaults:
        parser.error("--init-stds needs --library-defaults")
    planned = (
        plan_library_defaults(seeds, tasks, args.default_beta_only, init_stds)
        if args.library_defaults
        else plan(seeds, tasks, args.module_init, args.extra)
    )
    todo = [r for r in planned if r.key not in done]
    commit = git_commit()
    print(f"{len(done)} runs done, {len(todo)} to go", flush=True)
    from tqdm.auto import tqdm

    with mp.get_context("spawn").Pool(args.workers) as pool, runs_path.open("a") as sink:
        for record in tqdm(pool.imap_unordered(execute, todo), total=len(todo), disable=not sys.stderr.isatty()):
            record["commit"] = commit
            sink.write(json.dumps(record) + "\n")
            sink.flush()
            done[record["key"]] = record
            print(f"{record['key']}: nll {record['nll']:.4f} ece {record['ece']:.4f} ({record['seconds']} s)", flush=True)
    wanted = {r.key for r in planned}
    records = [r for k, r in done.items() if k in wanted]
    result = {
        "name": "defaults",
        "command": "python benchmarks/defaults_study.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": commit,
        "device": describe_device(torch.device("cpu")) + f" ({args.workers} worker processes of 1 thread)",
        "seconds": sum(r["seconds"] for r in records),
        "runs": len(records),
        "run_commits": {c: sum(r.get("commit") == c for r in records) for c in sorted({r.get("commit", "?") for r in records})},
        "seeds": list(seeds),
        "tasks": list(tasks),
        "library_defaults": bool(args.library_defaults),
        "summary": summarise(records),
        "records": records,
    }
    (out / "defaults.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "defaults.md").write_text(render(result))
    figure(result, out / "defaults.png")
    print(f"wrote {out / 'defaults.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
