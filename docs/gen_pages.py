"""Pages generated at build time (mkdocs-gen-files): the API reference, the results pages and the changelog.

Nothing here is committed as Markdown: every build renders the reference from the docstrings and the results from
``benchmarks/results/``, so neither can drift from its source.
"""

from __future__ import annotations

import sys
from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

# Names that griffe cannot show on their module's page because a submodule of the same name shadows them
# (``varbnn.predict`` the function vs ``varbnn.predict`` the module): rendered from their defining module.
SHADOWED: dict[str, list[str]] = {
    "varbnn": ["varbnn.predict.predict"],
    "varbnn.prune": ["varbnn.prune.export.export"],
}

# (module, title, one line): the public modules, in the order a reader meets them.
REFERENCE: list[tuple[str, str, str]] = [
    ("varbnn", "varbnn", "The top-level names: bayesianize, fit, predict, evaluate, the families and layers."),
    ("varbnn.convert", "convert", "bayesianize / to_deterministic: turning an nn.Module into a Bayesian one and back."),
    ("varbnn.families", "families", "Variational posteriors over one weight tensor."),
    ("varbnn.nn", "nn", "Bayesian layers and the sample mode."),
    ("varbnn.priors", "priors", "Prior factories and adaptive (empirical-Bayes) priors."),
    ("varbnn.divergence", "divergence", "kl(model) and the KL registry."),
    ("varbnn.objectives", "objectives", "The ELBO / MDL objective, KL weights and annealing, Graves' gradients."),
    ("varbnn.likelihoods", "likelihoods", "Likelihoods as objects: NLL for training, Monte Carlo predictive."),
    ("varbnn.optim", "optim", "Variational optimizers: IVON trains MeanField posteriors at about Adam's cost."),
    ("varbnn.training", "training", "fit, evaluate, checkpoints (also importable as varbnn.train, its first name)."),
    ("varbnn.predict", "predict", "Vectorised Monte Carlo prediction and its summaries."),
    ("varbnn.moments", "moments", "A single-pass predictive: means and variances propagated layer by layer."),
    ("varbnn.metrics", "metrics", "Accuracy, NLL, ECE, Brier, AUROC, referral, regression metrics."),
    ("varbnn.calibration", "calibration", "Temperature scaling."),
    ("varbnn.baselines", "baselines", "MC dropout and deep ensembles on the same predict path."),
    ("varbnn.laplace", "laplace", "Last-layer Laplace approximation (KFAC)."),
    ("varbnn.adapters", "adapters", "Variational LoRA adapters: Bayesian fine-tuning of a pretrained network."),
    ("varbnn.continual", "continual", "Variational continual learning."),
    ("varbnn.prune", "prune", "Density pruning, structured pruning, thresholds, export, retraining."),
    ("varbnn.distributions", "distributions", "torch.distributions subclasses: von Mises-Fisher, Radial, ..."),
    ("varbnn.special", "special", "Log-Bessel functions and Bessel-ratio bounds in torch."),
    ("varbnn.data", "data", "Dataset loaders, data directories, checksums and downloads."),
    ("varbnn.models", "models", "The reference architectures of the papers."),
    ("varbnn.plots", "plots", "Figures."),
    ("varbnn.analysis", "analysis", "Post-hoc analyses: SVD of trained stds, gradient signal-to-noise ratio."),
    ("varbnn.distributed", "distributed", "Data-parallel training under torchrun."),
    ("varbnn.ops", "ops", "Fused elementwise operations."),
    ("varbnn.philox", "philox", "Counter-based random numbers (Philox4x32-10): fit(compile=True)'s CPU draws."),
    ("varbnn_lab", "experiments", "The lab (lab/ of a clone, not installed with varbnn): experiment configs, runner."),
    ("varbnn_lab.catalog", "experiments-catalog", "Every experiment of varbnn reproduce: config, run, page."),
    ("varbnn_lab.engine", "experiments-engine", "Runs, records, resuming, workers, shards, provenance."),
    ("varbnn_lab.hooks", "experiments-hooks", "Training hooks of the experiments: traces, best-state selection."),
    ("varbnn_lab.regression", "experiments-regression", "What the UCI regression experiments share."),
    ("varbnn_lab.figures", "experiments-figures", "The papers' figures of the experiments' pages (the generic ones: plots)."),
]


def write_reference() -> None:
    lines = ["# API reference", "", "One page per public module; each lists the names in its `__all__`.", "",
             "| module | what it holds |", "|---|---|"]
    for module, title, what in REFERENCE:
        lines.append(f"| [`{module}`]({title}.md) | {what} |")
        extra = "".join(
            f"\n::: {name}\n    options:\n      heading_level: 2\n      show_root_full_path: false\n"
            for name in SHADOWED.get(module, [])
        )
        with mkdocs_gen_files.open(f"reference/{title}.md", "w") as fh:
            fh.write(f"# `{module}`\n\n{what}\n\n::: {module}\n    options:\n      show_root_heading: false\n{extra}")
        source = "lab" if module.split(".")[0] == "varbnn_lab" else "src"  # the lab is a package of its own, lab/
        mkdocs_gen_files.set_edit_path(f"reference/{title}.md", Path(source, *module.split(".")).as_posix())
    with mkdocs_gen_files.open("reference/index.md", "w") as fh:
        fh.write("\n".join(lines) + "\n")


def write_changelog() -> None:
    with mkdocs_gen_files.open("changelog.md", "w") as fh:
        fh.write((ROOT / "CHANGELOG.md").read_text(encoding="utf-8"))


write_reference()
write_changelog()
try:  # the results pages: docs/gen_results.py
    import gen_results
except ModuleNotFoundError:  # pragma: no cover - until the results generator exists
    gen_results = None
if gen_results is not None:
    gen_results.write_pages()
