"""The results pages of the site, generated at build time from ``benchmarks/results/`` (called by ``gen_pages.py``).

One page per experiment folder (``results/<folder>.md``): a header with the paper, its claim, varbnn's number and
whether it reproduces (the human-written part, :data:`CLAIMS` below), the command, commit, device and seconds read from
the folder's JSON files, then the folder's committed Markdown page(s), its variants (sub-folders), its ``studies/``
(A/B runs and profiles behind the tables, indexed by ``studies/README.md``), its ``history/`` and links to every file
of the folder (copied next to the page). ``results/index.md`` is the one-table summary, one row
per seed experiment; ``results/journal.md`` renders ``benchmarks/results/README.md``, the experiment journal.

:data:`CLAIMS` is the one reviewed place for claims and verdicts. Every number in a claim's text must appear in one of
its ``sources`` (committed files; ``tests/test_results_pages.py`` checks it), so nothing on these pages is a number
that no committed file holds. A paper number that no committed file holds is stated in words instead.
"""

from __future__ import annotations

import ast
import bisect
import json
import math
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SITE = "results"  # the pages' folder in the site
JOURNAL = "journal.md"
STUDIES = "studies"  # an experiment folder's A/B and profiling pages, beside its tables; never a variant

PAPERS: dict[str, str] = {
    "graves": "Graves (2011), Practical Variational Inference for Neural Networks",
    "radial": "Farquhar, Osborne, Gal (2020), Radial Bayesian Neural Networks",
    "ktied": "Swiatkowski et al. (2020), The k-tied Normal Distribution",
    "rdp": "Oh, Adamczewski, Park (2020), Radial and Directional Posteriors for Bayesian Deep Learning",
    "varbnn": "varbnn's own (the library's issues: defaults, speed, demo)",
}
"""The four seed papers (their text extracts are kept beside the repository, not in it) and the library's own."""

NAV_GROUPS: dict[str, str] = {
    "graves": "Graves 2011",
    "radial": "Radial BNNs (Farquhar et al. 2020)",
    "ktied": "k-tied Normal (Swiatkowski et al. 2020)",
    "rdp": "RDP (Oh et al. 2020)",
    "varbnn": "varbnn's own",
}

VERDICTS = ("yes", "partly", "no", "n/a", "not run")
"""``n/a``: a diagnostic or a measurement with no claim to reproduce; ``not run``: a seed experiment with no result."""


VERDICT_RULE = (
    "A claim that compares A against B over seeds (or data splits) is judged on the per-seed differences d_s = A_s - "
    "B_s, signed so that a positive d_s goes the paper's way (for a metric where lower is better, d_s = B_s - A_s). "
    "**yes** when d_s > 0 on a majority of the seeds and mean(d) > SE(d) = std(d, ddof=1) / sqrt(n); **no** when the "
    "reverse holds the same way (d_s < 0 on a majority and -mean(d) > SE(d)); **partly** otherwise. A single seed has "
    "no standard error, so one seed gives at most **partly**. A claim made of several comparisons is **yes** when "
    "every comparison is, **no** when every one is, and **partly** otherwise; its hand-written verdict must equal "
    "that (tests/test_verdict_rule.py). Comparisons marked as evidence only are shown but do not decide."
)
"""The rule every per-seed verdict follows, as the results index states it."""


@dataclass(frozen=True)
class SeedStats:
    """The rule's inputs and output for one comparison: seeds, how many went the paper's way / the other way, the mean
    difference, its standard error (NaN for one seed) and the verdict."""

    n: int
    wins: int
    losses: int
    mean: float
    se: float
    verdict: str


def verdict_rule(diffs: Sequence[float]) -> SeedStats:
    """:data:`VERDICT_RULE` on the per-seed differences ``diffs`` (positive: the paper's direction). Raises a
    ValueError for no differences or a non-finite one."""
    values = [float(d) for d in diffs]
    if not values:
        raise ValueError("diffs: expected at least one per-seed difference, got none")
    if not all(math.isfinite(d) for d in values):
        raise ValueError(f"diffs: expected finite numbers, got {values}")
    n = len(values)
    mean = sum(values) / n
    wins, losses = sum(d > 0 for d in values), sum(d < 0 for d in values)
    if n < 2:
        return SeedStats(n, wins, losses, mean, math.nan, "partly")
    se = math.sqrt(sum((d - mean) ** 2 for d in values) / (n - 1)) / math.sqrt(n)
    if 2 * wins > n and mean > se:
        verdict = "yes"
    elif 2 * losses > n and -mean > se:
        verdict = "no"
    else:
        verdict = "partly"
    return SeedStats(n, wins, losses, mean, se, verdict)


def combine_verdicts(verdicts: Sequence[str]) -> str:
    """Several comparisons' verdicts as one: ``yes`` when all are, ``no`` when all are, ``partly`` otherwise."""
    if not verdicts:
        raise ValueError("verdicts: expected at least one verdict, got none")
    unknown = [v for v in verdicts if v not in ("yes", "partly", "no")]
    if unknown:
        raise ValueError(f"verdicts: expected 'yes', 'partly' or 'no', got {unknown}")
    if all(v == "yes" for v in verdicts):
        return "yes"
    if all(v == "no" for v in verdicts):
        return "no"
    return "partly"


@dataclass(frozen=True)
class Comparison:
    """A per-seed comparison a claim declares: row ``a`` against row ``b`` of the records in ``file`` (a path or glob
    from the repository root: a runs ``.jsonl``, or a JSON whose list of records sits at ``records``, a ``/`` path; a
    dict of lists there gives records ``{"key": k, "seed": i, "value": item}``), paired by the field ``seed``; the
    value of a record is read at ``metric`` (see :func:`read_path`); ``better`` says which way the paper's claim goes
    for ``a`` ("higher" or "lower"). ``decides``: False for evidence shown beside a claim whose verdict rests on
    something else (a count over data sets, a published number)."""

    label: str
    file: str
    a: tuple[tuple[str, Any], ...]
    b: tuple[tuple[str, Any], ...]
    metric: str
    better: str = "higher"
    seed: str = "seed"
    records: str = ""
    decides: bool = True

    def __post_init__(self) -> None:
        if self.better not in ("higher", "lower"):
            raise ValueError(f"better: expected 'higher' or 'lower', got {self.better!r}")


def read_path(value: Any, path: str) -> Any:
    """The part of ``value`` at ``path``: ``/``-separated steps, each a dict key, a list index (``-1``: the last),
    ``[key=v]`` (the first list element whose ``key`` equals ``v``, compared as numbers where both are) or, as the
    last step, ``mean`` (the mean of a list of numbers)."""
    for step in [s for s in path.split("/") if s]:
        select = re.fullmatch(r"\[([^=\]]+)=([^\]]*)\]", step)
        if select:
            key, want = select.groups()
            value = next(item for item in value if _same(item.get(key), want))
        elif step == "mean" and isinstance(value, list):
            value = sum(value) / len(value)
        elif isinstance(value, list):
            value = value[int(step)]
        else:
            value = value[step]
    return value


def _same(have: Any, want: str) -> bool:
    try:
        return math.isclose(float(have), float(want), rel_tol=0, abs_tol=1e-12)
    except (TypeError, ValueError):
        return str(have) == want


def load_records(comparison: Comparison, root: Path | None = None) -> list[dict[str, Any]]:
    """The records of ``comparison.file`` (every file the glob matches, in name order)."""
    base = ROOT if root is None else root
    paths = sorted(base.glob(comparison.file))
    if not paths:
        raise FileNotFoundError(f"{comparison.label}: no file matches {comparison.file}")
    out: list[dict[str, Any]] = []
    for path in paths:
        if path.suffix == ".jsonl":
            out += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            continue
        data = read_path(json.loads(path.read_text(encoding="utf-8")), comparison.records)
        if isinstance(data, dict):
            out += [{"key": k, "seed": i, "value": item} for k, items in data.items() for i, item in enumerate(items)]
        else:
            out += list(data)
    return out


def paired_values(comparison: Comparison, root: Path | None = None) -> list[tuple[Any, float, float, float]]:
    """(seed, a's value, b's value, the signed difference) for every seed both rows have, in seed order."""
    records = load_records(comparison, root)

    def side(selector: tuple[tuple[str, Any], ...]) -> dict[Any, float]:
        rows = [r for r in records if all(_same(r.get(k), str(v)) for k, v in selector)]
        return {r[comparison.seed]: float(read_path(r, comparison.metric)) for r in rows}

    a, b = side(comparison.a), side(comparison.b)
    seeds = sorted(set(a) & set(b), key=lambda s: (str(type(s)), s))
    if not seeds:
        raise ValueError(f"{comparison.label}: rows a and b share no {comparison.seed!r} in {comparison.file}")
    sign = 1.0 if comparison.better == "higher" else -1.0
    return [(s, a[s], b[s], sign * (a[s] - b[s])) for s in seeds]


def compare(comparison: Comparison, root: Path | None = None) -> SeedStats:
    """:func:`verdict_rule` on ``comparison``'s per-seed differences."""
    return verdict_rule([d for *_, d in paired_values(comparison, root)])



@dataclass(frozen=True)
class Claim:
    """One seed experiment: its folder under ``benchmarks/results/`` (None: not run), the paper (a key of
    :data:`PAPERS`), what the paper claims, varbnn's result, the verdict (one of :data:`VERDICTS`), why, the committed
    files (paths from the repository root) that hold every number of the texts, and the per-seed comparisons
    (:class:`Comparison`) its verdict rests on, judged by :data:`VERDICT_RULE`.

    The numbers of ``claim`` (the paper's or the issue's, quoted) may come from any source; every number of
    ``result`` and ``why`` must be one that ``claim`` states, one of a data file among the sources (``.json``,
    ``.jsonl``, ``.csv``: what a committed command wrote; a ``.py`` source holds published reference values) or one
    the comparisons compute, never one only a Markdown page holds."""

    folder: str | None
    title: str
    paper: str
    claim: str
    result: str
    verdict: str
    why: str
    sources: tuple[str, ...]
    comparisons: tuple[Comparison, ...] = ()


def rule_verdict(claim: Claim) -> str | None:
    """The verdict the rule gives ``claim`` from its deciding comparisons (None: it declares none)."""
    deciding = [c for c in claim.comparisons if c.decides]
    return combine_verdicts([compare(c).verdict for c in deciding]) if deciding else None


J = "benchmarks/results/README.md"  # the journal: the headline of every result
R = "benchmarks/results/"

CLAIMS: tuple[Claim, ...] = (
    # --- Graves 2011 ---------------------------------------------------------------------------------------------
    Claim(
        folder="graves-mnist",
        title="graves-mnist: Graves (2011) table 1 on MNIST",
        paper="graves",
        claim="Table 1 (TIMIT, an LSTM network): Gaussian posteriors beat delta posteriors and the fully adaptive one "
        "(adaptive weight noise) scores best; L2 is no better than maximum likelihood; adaptive L1 and L2 fail because "
        "their priors become excessively narrow (b = 0.002 for L1); adaptive weight noise compresses the training "
        "targets to 0.29 of a uniform code. The paper trains 384 epochs.",
        result="MLP with two hidden layers of 150 units, one seed, 30 epochs, test error of the mode: weight noise 1.75%, "
        "L2 1.96%, adaptive-mean L2 1.97%, maximum likelihood 2.02%, adaptive weight noise 2.74%, adaptive-prior weight "
        "noise 3.23%; adaptive L1 / L2 collapse (15.59% / 18.74%; b = 0.002111); adaptive weight noise compresses the "
        "targets to 0.1189 of a uniform code (rerun at 909bcba; f77ee61's page in history/).",
        verdict="partly",
        why="Only the collapse of the adaptive L1 / L2 priors and its cause reproduce; the ranking does not: fixed "
        "weight noise is best and adaptive weight noise trails L2 and maximum likelihood. One seed and 30 epochs "
        "against the paper's 384, so by the verdict rule no comparison can be more than partly. MNIST replaces TIMIT, "
        "whose data cannot be had here.",
        sources=(J, R + "graves-mnist/graves-mnist.md"),
        comparisons=(
        Comparison(
            "adaptive weight noise vs maximum likelihood, test error of the mode",
            R + "graves-mnist/graves-mnist_runs.jsonl",
            (("variant", "adaptive weight noise"),),
            (("variant", "maximum likelihood"),),
            "test_error_mode",
            better="lower",
        ),
        Comparison(
            "weight noise vs maximum likelihood, test error of the mode",
            R + "graves-mnist/graves-mnist_runs.jsonl",
            (("variant", "weight noise"),),
            (("variant", "maximum likelihood"),),
            "test_error_mode",
            better="lower",
        ),
        ),
    ),
    Claim(
        folder="graves-prune",
        title="graves-prune: Graves (2011) table 2 and figures 3-4",
        paper="graves",
        claim="Table 2: pruning the adaptive-weight-noise network at |mu|/sigma < lambda, the error rises slowly up to "
        "lambda = 0.5 and sharply after, consistent with the 'safe' threshold lambda = 0.83; retraining after pruning "
        "improves the error in some cases.",
        result="Weights kept / error right after pruning / after up to 2 retraining epochs (unpruned: 2.75%): lambda "
        "0.2: 84.8% / 2.80% / 2.52%; 0.5: 8.0% / 2.77% / 5.58%; 0.83: 4.8% / 3.01% / 7.75%; 2: 1.6% / 17.25% / "
        "10.40%.",
        verdict="partly",
        why="The shape reproduces: the error moves by at most 0.05 points up to lambda = 0.5 and jumps after, and "
        "retraining beats the unpruned network at lambda = 0.2. One seed, and the retraining here is at most 2 epochs, "
        "far shorter than the paper's. The rest does not: in the paper retraining never "
        "raises the error by much and lowers it at lambda = 0.5 and 2, while here 2 epochs of retraining under the "
        "adaptive prior more than double it at lambda = 0.5 and 0.83 (the 'safe' threshold); far fewer weights are "
        "kept at lambda = 0.5 (8.0%).",
        sources=(J, R + "graves-prune/graves-prune.md"),
    ),
    Claim(
        folder=None,
        title="graves-mnist-lstm, graves-prune-lstm: tables 1 and 2 on a row LSTM",
        paper="graves",
        claim="The paper's networks are recurrent (LSTM): the same two tables on a recurrent network.",
        result="Not run.",
        verdict="not run",
        why="The configs exist (`varbnn reproduce graves-mnist-lstm`, `graves-prune-lstm`); Graves' variance gradient "
        "needs per-example gradients, which through nn.LSTM take a slow path on the CPU.",
        sources=(),
    ),
    # --- Radial BNNs (Farquhar et al. 2020) ------------------------------------------------------------------------
    Claim(
        folder="soap-bubble",
        title="soap-bubble: the soap bubble (Farquhar et al. figures 1, 3, 8)",
        paper="radial",
        claim="Mean-field samples of a large weight tensor lie on a thin shell far from the mean (about sigma sqrt(D) "
        "away), radial samples do not; under the full ELBO mean-field training accepts a falling training accuracy as "
        "its variances grow, radial does not.",
        result="3x3x128x128 kernel (D = 147,456 weights), sigma 0.1: Gaussian samples at distance 38.4 from the mode "
        "(sigma sqrt(D)), radial samples at 0.0786, about sigma (matching the analytic densities); MLP with two hidden "
        "layers of 1,200 units, 30 epochs: mean-field samples drift to distance 1,273 while its "
        "one-draw training accuracy falls from 0.9885 (epoch 5) to 0.9749; radial: distance 13.17, accuracy 0.9967.",
        verdict="partly",
        why="All three figures' effects appear (rerun on the CPU at e838a27, one clean commit; the earlier H100 run, in "
        "history/, gave the same: 1,273 and 12.4). The sampling geometry holds as the densities say "
        "(no training, no seed to vary), but the training part ran on one seed, and by the verdict rule one seed gives "
        "at most partly.",
        sources=(J, R + "soap-bubble/soap-bubble.json", R + "soap-bubble/history/soap-bubble_8010591.json"),
    ),
    Claim(
        folder="vcl-split-fmnist",
        title="vcl-split-fmnist: variational continual learning (Farquhar et al. figure 5)",
        paper="radial",
        claim="Figure 5: in variational continual learning on Split Fashion-MNIST (multi-head), radial posteriors keep "
        "a higher accuracy over the tasks than mean-field (the issue's goal: radial's mean accuracy over the 5 heads "
        "after task 5 >= 0.97 and above mean-field's).",
        result="Mean accuracy over the 5 heads after task 5, 5 seeds (all retrained on the CPU at 5c1cf14): radial "
        "0.977 ± 0.001, mean-field 0.984 ± 0.0005; single-head: both forget (0.25 vs 0.29).",
        verdict="no",
        why="Radial reaches 0.97, but mean-field is above it on 5 of 5 seeds (radial minus mean-field -0.0071 ± 0.0012 "
        "per seed; the earlier H100 / CPU runs, in history/, gave the same verdict): the reverse of the paper's "
        "figure. The paper tuned both families by a grid search; here one setting each ran (the paper's tuned "
        "epochs). vcl-split-fmnist-search and -selected give both the same grid.",
        sources=(J,),
        comparisons=(
        Comparison(
            "radial vs mean-field, multi-head: mean accuracy over the 5 heads after task 5",
            R + "vcl-split-fmnist/vcl-split-fmnist_runs.jsonl",
            (("variant", "radial, multi-head"),),
            (("variant", "mean-field, multi-head"),),
            "accuracy/-1/mean",
        ),
        ),
    ),
    Claim(
        folder="vcl-split-fmnist-search",
        title="vcl-split-fmnist-search: the same grid for radial and mean-field",
        paper="radial",
        claim="Issue 30: give both families the same grid (learning rate, epochs per task, initial std, prior handling) "
        "and select each family's setting by the validation mean accuracy after task 5.",
        result="8 settings per family (lr 0.001 / 0.003 x 20 / 60 epochs x initial std rho=-6 / the family's default), "
        "seed 0, CPU (rerun at 539aba9, one clean commit; d221832's page in history/). Chosen: radial lr 0.001, 60 epochs, "
        "default init (validation 0.9857; 0.9855 before); mean-field lr 0.001, 20 epochs, default init (validation "
        "0.9874; 0.9880 before): the same settings as the earlier run.",
        verdict="n/a",
        why="A selection step; its test columns play no part in it. Prior handling is VCL's only (each task's posterior "
        "is the next task's prior). vcl-split-fmnist-selected runs the chosen settings for 5 seeds.",
        sources=(J, R + "vcl-split-fmnist-search/vcl-split-fmnist-search.md",
                 R + "vcl-split-fmnist-search/vcl-split-fmnist-search_runs.jsonl",
                 R + "vcl-split-fmnist-search/history/vcl-split-fmnist-search_d221832_runs.jsonl"),
    ),
    Claim(
        folder="vcl-split-fmnist-selected",
        title="vcl-split-fmnist-selected: each family at its validation-chosen setting, 5 seeds",
        paper="radial",
        claim="Figure 5 after the paper's search: with each family tuned, radial keeps a higher mean accuracy over the "
        "5 heads after task 5 than mean-field.",
        result="Radial (lr 0.001, 60 epochs, default init) 0.9836 ± 0.0010; mean-field (lr 0.001, 20 epochs, default "
        "init) 0.9847 ± 0.0009; 5 seeds, rerun on the CPU at 539aba9 (one clean commit; d221832's runs, 0.9838 and "
        "0.9854, in history/).",
        verdict="partly",
        why="With the same grid and validation selection the two are level: radial is below mean-field on 3 of 5 seeds "
        "by -0.0011 ± 0.0013, less than one standard error of the difference, so by the verdict rule neither direction "
        "holds (the earlier runs, 0.9838 against 0.9854, were just past one standard error: 'no'). Radial keeps head 1 "
        "better (0.9920 vs 0.9862), mean-field heads 3, 4 and 5 (0.9970, 0.9982, 0.9933 vs 0.9932, 0.9960, 0.9884; head "
        "2 level). Both beat the one-setting run of vcl-split-fmnist.",
        sources=(R + "vcl-split-fmnist-selected/vcl-split-fmnist-selected.md",
                 R + "vcl-split-fmnist-selected/vcl-split-fmnist-selected.json",
                 R + "vcl-split-fmnist-selected/history/vcl-split-fmnist-selected_d221832.json"),
        comparisons=(
        Comparison(
            "radial vs mean-field at their selected settings: mean accuracy over the 5 heads after task 5",
            R + "vcl-split-fmnist-selected/vcl-split-fmnist-selected_runs.jsonl",
            (("variant", "radial, lr 0.001, 60 epochs, init default"),),
            (("variant", "mean-field, lr 0.001, 20 epochs, init default"),),
            "accuracy/-1/mean",
        ),
        ),
    ),
    Claim(
        folder="retina-referral",
        title="retina-referral: referral by uncertainty (Farquhar et al. figure 7 left)",
        paper="radial",
        claim="Figure 7 (diabetic retinopathy): referring the most uncertain test points raises the AUROC on the rest, "
        "more for radial than for mean-field (the issue's goal: radial at or above mean-field at every fraction "
        "referred).",
        result="RetinaMNIST stand-in, 5 seeds (rerun on the CPU at a8427a7, one clean commit; the H100 runs of 26298c0 "
        "in history/), AUROC at 0% / 20% / 50% referred: radial 0.788 / 0.782 / 0.794, mean-field 0.781 / 0.767 / 0.703.",
        verdict="partly",
        why="Per fraction referred, by the verdict rule: radial is clearly above mean-field from 30% on (on 3, 5 and 5 "
        "of 5 seeds, mean differences +0.034, +0.064 and +0.091 at 30%, 40% and 50%); below 30% it is above only within "
        "one standard error: at 0% on 4 of 5 seeds (+0.007 ± 0.008), at 10% on 2 of 5 (+0.006 ± 0.009), at 20% on 3 of "
        "5 (+0.015 ± 0.016). The H100 runs of 26298c0 said the same (clear from 30%, level at 0-20%). The 28x28 "
        "RetinaMNIST images stand in for the paper's retinopathy data, which cannot be had here.",
        sources=(J, "lab/varbnn_lab/retina.py", R + "retina-referral/retina-referral.json",
                 R + "retina-referral/retina-referral_runs.jsonl"),
        comparisons=(
        Comparison(
            "radial vs mean-field, AUROC at 0% referred",
            R + "retina-referral/retina-referral_runs.jsonl",
            (("family", "radial"),),
            (("family", "meanfield"),),
            "referral/[referred=0.0]/auroc",
        ),
        Comparison(
            "radial vs mean-field, AUROC at 10% referred",
            R + "retina-referral/retina-referral_runs.jsonl",
            (("family", "radial"),),
            (("family", "meanfield"),),
            "referral/[referred=0.1]/auroc",
        ),
        Comparison(
            "radial vs mean-field, AUROC at 20% referred",
            R + "retina-referral/retina-referral_runs.jsonl",
            (("family", "radial"),),
            (("family", "meanfield"),),
            "referral/[referred=0.2]/auroc",
        ),
        Comparison(
            "radial vs mean-field, AUROC at 30% referred",
            R + "retina-referral/retina-referral_runs.jsonl",
            (("family", "radial"),),
            (("family", "meanfield"),),
            "referral/[referred=0.3]/auroc",
        ),
        Comparison(
            "radial vs mean-field, AUROC at 40% referred",
            R + "retina-referral/retina-referral_runs.jsonl",
            (("family", "radial"),),
            (("family", "meanfield"),),
            "referral/[referred=0.4]/auroc",
        ),
        Comparison(
            "radial vs mean-field, AUROC at 50% referred",
            R + "retina-referral/retina-referral_runs.jsonl",
            (("family", "radial"),),
            (("family", "meanfield"),),
            "referral/[referred=0.5]/auroc",
        ),
        ),
    ),
    Claim(
        folder="retina-robustness",
        title="retina-robustness: robustness to hyperparameters (Farquhar et al. figure 7 right)",
        paper="radial",
        claim="Figure 7: over random hyperparameter configurations mean-field is no better than chance in 82% of them "
        "and good in 11%; radial in 39% and 44%.",
        result="30 random configurations (29 distinct), both families: no better than chance: radial 0%, mean-field "
        "37%; good (within 0.05 of the best run): radial 77%, mean-field 40%.",
        verdict="partly",
        why="The direction reproduces: radial is far more robust to its hyperparameters. The measure differs: 'good' "
        "here is relative (within 0.05 of the best run), not the paper's absolute AUC, and the shares differ "
        "(RetinaMNIST stand-in, 60 epochs per run).",
        sources=(J, R + "retina-robustness/retina-robustness.md"),
    ),
    # --- k-tied Normal (Swiatkowski et al. 2020) -------------------------------------------------------------------
    Claim(
        folder="ktied-mnist",
        title="ktied-mnist: k-tied vs mean-field on the MNIST MLP (Swiatkowski et al. figure 6)",
        paper="ktied",
        claim="Figure 6 (MNIST MLP): the 2-tied Normal reaches the mean-field accuracy (96.8% both) with about half "
        "the parameters, its gradients have a far higher signal-to-noise ratio early in training, and it converges "
        "faster in -ELBO.",
        result="25 epochs, 3 seeds: parameters 956,820 (mean-field) vs 484,008 (2-tied); validation -ELBO at "
        "step 5000: 13.96 vs 2.45; test accuracy 98.2% vs 95.8%; gradient SNR at step 1000: 4,887 vs 440.",
        verdict="partly",
        why="Half the parameters and the faster -ELBO convergence reproduce (2-tied lower on 3 of 3 seeds). Accuracy: "
        "after 25 epochs mean-field is still far from its ELBO optimum (KL/N = 6.6 nats) and more accurate. SNR: "
        "mean-field's is the higher on 3 of 3 seeds. That it comes from the KL weight of this short schedule is "
        "refuted by ktied-snr-anneal (the paper's schedule, mean-field still higher). Its statistic study explains "
        "the size: mean-field std elements that get no likelihood gradient over the window (inactive inputs) have a "
        "nearly constant KL-only gradient and enormous ratios that set the per-element mean; the median is higher "
        "for 2-tied on 3 of 3 seeds under this schedule too.",
        sources=(J,),
        comparisons=(
        Comparison(
            "2-tied vs mean-field, gradient SNR at step 1000",
            R + "ktied-mnist/ktied-mnist.json",
            (("key", "2-tied"),),
            (("key", "mean-field"),),
            "value/[step=1000]/snr",
            records="traces",
        ),
        Comparison(
            "2-tied vs mean-field, validation -ELBO at step 5000",
            R + "ktied-mnist/ktied-mnist.json",
            (("key", "2-tied"),),
            (("key", "mean-field"),),
            "value/[step=5000]/val_nelbo",
            better="lower",
            records="traces",
        ),
        ),
    ),
    Claim(
        folder="ktied-snr-anneal",
        title="ktied-snr-anneal: the SNR under the paper's KL schedule (diagnostic)",
        paper="ktied",
        claim="As ktied-mnist: k-tied gradients have a higher signal-to-noise ratio than mean-field's; tested with the "
        "KL annealed over the paper's 300 epochs instead of 25.",
        result="13 epochs, 3 seeds: accuracy 0.9794 (2-tied) vs 0.978 (mean-field) with 484,008 vs 956,820 "
        "parameters; validation -ELBO at step 5000: 10.28 vs 25.77; SNR at step 1000: 1247 vs 4516. The statistic "
        "study (studies/, its own reruns to step 1000): per-element mean 2073 vs 8916, median 0.571 vs 0.095 (25-epoch "
        "schedule: 1.393 vs 0.930); likelihood gradient alone, mean 0.125 vs 0.115.",
        verdict="partly",
        why="Under the paper's schedule 2-tied matches mean-field's accuracy with half the parameters and has the lower "
        "validation -ELBO (3 of 3 seeds), but mean-field's SNR at step 1000, read as the paper defines it (the mean "
        "over the std tensor's elements of E[g]^2/Var[g]), stays the higher (3 of 3 seeds): the SNR claim does not "
        "reproduce on that statistic, and the short KL schedule does not explain it. The statistic study does: 4-10% "
        "of mean-field's std elements get no likelihood gradient over the 10-step window (their inputs are inactive), "
        "so their gradient is the KL term's alone, nearly constant, and their enormous ratios dominate the mean; "
        "k-tied's shared u, v parameters nearly always see data. The median, which such elements cannot move, is "
        "higher for 2-tied on 3 of 3 seeds under both schedules (the paper's direction), and the likelihood-only "
        "gradients have about the same SNR in both families (about 0.1). The deciding comparison stays the paper's "
        "statistic; the median is shown beside it.",
        sources=(R + "ktied-snr-anneal/ktied-snr-anneal.md", R + "ktied-snr-anneal/studies/snr-statistic-anneal300.json",
                 R + "ktied-snr-anneal/studies/snr-statistic-anneal25.json"),
        comparisons=(
        Comparison(
            "2-tied vs mean-field, gradient SNR at step 1000",
            R + "ktied-snr-anneal/ktied-snr-anneal.json",
            (("key", "2-tied"),),
            (("key", "mean-field"),),
            "value/[step=1000]/snr",
            records="traces",
        ),
        Comparison(
            "2-tied vs mean-field, validation -ELBO at step 5000",
            R + "ktied-snr-anneal/ktied-snr-anneal.json",
            (("key", "2-tied"),),
            (("key", "mean-field"),),
            "value/[step=5000]/val_nelbo",
            better="lower",
            records="traces",
        ),
        Comparison(
            "2-tied vs mean-field, median SNR over the std elements at step 1000 (statistic study, 300-epoch schedule)",
            R + "ktied-snr-anneal/studies/snr-statistic-anneal300.json",
            (("family", "2-tied"),),
            (("family", "mean-field"),),
            "snr_median_whole",
            records="records",
            decides=False,
        ),
        Comparison(
            "2-tied vs mean-field, mean SNR of the likelihood gradient alone at step 1000 (statistic study, 300 epochs)",
            R + "ktied-snr-anneal/studies/snr-statistic-anneal300.json",
            (("family", "2-tied"),),
            (("family", "mean-field"),),
            "snr_mean_likelihood",
            records="records",
            decides=False,
        ),
        ),
    ),
    Claim(
        folder="ktied-posthoc",
        title="ktied-posthoc: low rank of trained mean-field stds (Swiatkowski et al. figures 3-4, table 2)",
        paper="ktied",
        claim="The std matrices of a trained mean-field network are close to low rank; replacing them by their rank-1 "
        "or rank-2 approximation costs little.",
        result="The first singular value carries most of each std matrix's variance and far less of the means' (read "
        "from the committed figure only: no data file holds these shares); stds replaced by rank 2: accuracy 98.05% vs "
        "98.12% (full), test -ELBO 4.545 vs 4.63; rank 1: 97.65% (rerun at 909bcba: every score equal to the last "
        "digit to the 9fd73c0 runs in history/).",
        verdict="yes",
        why="As in the paper, on the MNIST MLP (the paper also shows a CNN and an LSTM), on each of the 3 seeds: with "
        "rank-2 stds the test accuracy is 0.9798 / 0.9808 / 0.9808 against 0.9805 / 0.9816 / 0.9816 with the full "
        "ones (at most 0.08 points lower) and the test -ELBO lower, 4.5038 / 4.5776 / 4.5524 against 4.5884 / 4.6656 / "
        "4.6374; rank 1 costs more accuracy (0.9748 / 0.977 / 0.9778).",
        sources=(J, R + "ktied-posthoc/ktied-posthoc_runs.jsonl"),
    ),
    Claim(
        folder="ktied-lstm",
        title="ktied-lstm: k-tied on an LSTM (the paper's IMDB case, on MNIST rows)",
        paper="ktied",
        claim="The LSTM case (IMDB reviews): k-tied posteriors on the LSTM kernels come close to mean-field's accuracy "
        "with fewer parameters and converge faster in -ELBO.",
        result="Row-MNIST LSTM, 3 seeds: accuracy 0.9883 (mean-field, 164,372 parameters) vs 0.9777 (2-tied, 86,860); "
        "validation -ELBO at step 5000: 4.427 vs 1.65; SNR of the recurrent kernel's stds at step 1000: 0.2288 vs "
        "1.659.",
        verdict="yes",
        why="2-tied converges much faster with about half the parameters and is about 1 point less accurate (the "
        "paper's LSTM also loses some accuracy with k-tied); here the SNR is the higher for 2-tied, unlike on the MLP. "
        "MNIST rows stand in for IMDB, which cannot be had here.",
        sources=(R + "ktied-lstm/ktied-lstm.md",),
        comparisons=(
        Comparison(
            "2-tied vs mean-field, validation -ELBO at step 5000",
            R + "ktied-lstm/ktied-lstm.json",
            (("key", "2-tied"),),
            (("key", "mean-field"),),
            "value/[step=5000]/val_nelbo",
            better="lower",
            records="traces",
        ),
        Comparison(
            "2-tied vs mean-field, recurrent kernel's gradient SNR at step 1000",
            R + "ktied-lstm/ktied-lstm.json",
            (("key", "2-tied"),),
            (("key", "mean-field"),),
            "value/[step=1000]/snr",
            records="traces",
            decides=False,
        ),
        ),
    ),
    Claim(
        folder=None,
        title="k-tied on CIFAR-100 (CNN) and ResNet-18",
        paper="ktied",
        claim="The same low-rank structure and k-tied results on a CNN and a ResNet-18 on CIFAR.",
        result="Not run.",
        verdict="not run",
        why="Needs the CIFAR data and a GPU; the models are supported (`bayesianize` of `varbnn.models.resnet18`).",
        sources=(),
    ),
    # --- RDP (Oh et al. 2020) ------------------------------------------------------------------------------------
    Claim(
        folder="uci",
        title="uci: UCI regression (Oh et al. table 1)",
        paper="rdp",
        claim="Table 1: RDP's test log-likelihood on the UCI sets. The published numbers come from an evaluation that "
        "log-sum-exps over test points, so the issue compares with the best of VI / PBP / Dropout / VMG (e.g. yacht "
        "-1.30, naval 3.80) and asks the best varbnn family to beat it on 6 of 9 sets.",
        result="Gamma(6,6) noise prior, 40 epochs, every run (each set, split and family): the best family is above "
        "the reference on 1 of 9 sets (naval 5.38 vs 3.80); kin8nm passes at 400 epochs (1.11 vs 1.10). RDP is the "
        "weakest family on kin8nm, naval and energy.",
        verdict="no",
        why="Under the Gamma(6,6) protocol the closed-form noise posterior caps the expected test LL below the "
        "references of energy (-1.19 vs -1.06) and yacht (-2.05 vs -1.30); the other gaps are to Dropout / VMG "
        "numbers from other protocols. Longer training moves kin8nm and power toward them. Issue 30's learned-noise "
        "protocol is the main table now (uci-learned).",
        sources=(J, "lab/varbnn_lab/uci.py"),
    ),
    Claim(
        folder="lenet5-prune",
        title="lenet5-prune: LeNet-5 structured pruning (Oh et al. table 2)",
        paper="rdp",
        claim="Table 2: RDP prunes LeNet-5-Caffe to 4-7-110-66 (20K parameters, 125K FLOPs) at 1.0% test error; the "
        "issue's goal: <= 1.0% with <= 15K parameters and <= 120K FLOPs.",
        result="200 epochs; the budget in 4 prune-and-retrain stages: 3-13-136-63, 10,337 parameters, 117K FLOPs, "
        "1.23% test error; the validation rule: 18-25-186-55, 22,588 parameters, 1.00M FLOPs, 0.93% after retraining; "
        "unpruned predictive accuracy 0.9936.",
        verdict="no",
        why="The posterior keeps 18-20 of 20 conv1 filters, so the budget is met only by cutting into them; the same "
        "random-initialisation control at 3-13-136-63 gets 1.18% (one seed), and a budget architecture "
        "(3-13-164-60) trained from a random initialisation 1.09% ± 0.05% over 5 seeds (prune-capacity): the "
        "budget, not only the posterior, stops the goal. The paper set its thresholds by hand.",
        sources=(J, R + "prune-capacity/prune_capacity.json"),
    ),
    Claim(
        folder="lenet5-prune-published",
        title="lenet5-prune-published: the published code's radius split and KL annealing",
        paper="rdp",
        claim="As lenet5-prune (4-7-110-66 at 1.0%), with the published code's two training choices: the initial "
        "radius split evenly over the log-normal factors and KL annealing over 100 epochs.",
        result="Gap rule 1-12-192-29: 6,235 parameters, 40,841 FLOPs, 1.48% test error (unpruned predictive accuracy "
        "0.9841).",
        verdict="no",
        why="These settings switch off all but one conv1 filter: far under the budget, too few filters for the error. "
        "With lenet5-prune (18-20 filters kept) it brackets the goal.",
        sources=(J, R + "lenet5-prune/lenet5-prune.json"),
    ),
    Claim(
        folder="lenet5-radius-init",
        title="lenet5-radius-init: RDP's initial radius split (diagnostic)",
        paper="rdp",
        claim="Diagnostic for lenet5-prune: the published code's even split of the initial radius over the log-normal "
        "factors, against a split by the prior.",
        result="4 epochs: radius_init=even 3.16% test error (training loss 2887), radius_init=prior 1.09% (2.111).",
        verdict="n/a",
        why="The even split starts from a huge KL (its training loss is still 2887 after 4 epochs) that kills units "
        "(the first lenet5-prune run kept 1-16-256-19); "
        "the library's default is the split by the prior.",
        sources=(J, R + "lenet5-radius-init/lenet5-radius-init.md", R + "lenet5-prune/history/lenet5-prune_96631ae.json"),
    ),
    Claim(
        folder="lenet5-radius-prior",
        title="lenet5-radius-prior: which radius prior leaves 4-8 conv1 filters (issue 30)",
        paper="rdp",
        claim="Issue 30's untried route to the error-FLOPs front: a radius prior between lenet5-prune's (18-20 of 20 "
        "conv1 filters kept) and the published code's settings (1 kept), chosen as the one whose gap rule keeps 4-8 "
        "conv1 filters with the lowest validation error.",
        result="60 epochs, seed 0, CPU. Gap rule / validation rule (FLOPs, test error): lenet5-prune's prior "
        "20-33-467-454 (0.70%) / 15-29-358-171 (985,605, 0.83%); local scale 1e-3 20-46-515-493 (0.74%) / "
        "15-25-318-173 (883,167, 0.99%); local scale 2e-4 20-37-495-473 (0.74%) / 17-29-330-163 (1,100,841, 0.81%); "
        "global scale 1e-5 20-38-487-438 (0.65%) / 13-27-272-134 (795,948, 0.96%); the even radius split 1-14-224-30 "
        "(45,332 FLOPs, 1.77%) / 1-14-170-28 (43,350, validation 2.08%, test 2.06%).",
        verdict="no",
        why="No prior of the five leaves 4-8 conv1 filters: the four scale changes keep all 20, the even split keeps 1 "
        "(as the published run did) at about twice the error. The knob moves conv1 from all to one filter with "
        "nothing between, so lenet5-front keeps lenet5-prune's prior and reaches its small budgets by the staged "
        "rule. Not tried: the annealing the issue also names (every run keeps lenet5-prune's KL annealing over its "
        "first 20 epochs), and more than one seed per prior.",
        sources=(J, R + "lenet5-radius-prior/lenet5-radius-prior.md"),
    ),
    Claim(
        folder="lenet5-front",
        title="lenet5-front: an error-FLOPs front of LeNet-5 pruning (issue 30)",
        paper="rdp",
        claim="Issue 30: at FLOPs budgets of 60K-1M, the model chosen on validation reaches <= 1.0% test error at <= "
        "160K FLOPs and <= 1.1% at <= 120K, and matches or beats every row of Oh et al.'s Table 2 (RDP 4-7-110-66 at "
        "1.0%, BC-GNJ, BC-GHS, FDOO, GL, GD, SBP), except rows the random-initialisation control shows unreachable.",
        result="Seeds 0-2 (CPU). Staged rule, mean test error over the three seeds (random-initialisation control at "
        "the same architecture): 60K 2.17% (1.28%); 120K 1.56% (1.06%); 160K 1.39% (1.16%); 310K 0.98% (0.93%); 1M "
        "0.85% (0.69%). Seed 2's architectures: 2-7-64-60, 3-12-140-63, 3-20-198-80, 6-21-264-62, 16-26-382-228. "
        "Unpruned predictive accuracy 0.9932 / 0.9928 / 0.9934.",
        verdict="no",
        why="Neither goal is met (1.39% at 160K, 1.56% at 120K), on any seed (at 160K 1.54%, 1.30%, 1.33%; at 120K "
        "1.83%, 1.42%, 1.44%). No row of Table 2 is matched: the 310K point's 0.98% "
        "is at 294,925 mean FLOPs, above BC-GNJ's size as recomputed by the paper's formulas (lenet5-front.md; with two "
        "seeds it was matched). The verdict rule does not decide it: the goals are fixed thresholds and Table 2's "
        "published rows, not two variants compared over seeds (each seed's record holds the staged rule's front and "
        "its control side by side, which the rule's comparisons, one row against another, do not pair). At 60K-160K "
        "the random-initialisation control at the staged rule's architecture does better than the posterior's "
        "retrained weights on each of the three seeds: the posterior chooses the architecture, its weights do not help "
        "the retraining. A pipeline that "
        "takes the control as a second candidate and keeps the lower validation error reaches 1.06% at 120K (the "
        "1.1% goal) but 1.16% at 160K. At the paper's own RDP widths (4-7-112-66) random init gives 1.15% +- 0.04% "
        "over 5 seeds (prune-capacity).",
        sources=(J, R + "lenet5-front/lenet5-front.md", R + "prune-capacity/prune_capacity.json"),
    ),
    Claim(
        folder="prune-capacity",
        title="prune-capacity: posterior vs random initialisation at the goal's budget (diagnostic)",
        paper="rdp",
        claim="Diagnostic for lenet5-prune's goal: is the budget (<= 1.0% within 15K parameters, 120K FLOPs) a matter "
        "of retraining or of the posterior?",
        result="Architecture 3-13-164-60 (11,576 parameters, 118,670 FLOPs): posterior init 1.25%; random init, "
        "distilled: 1.09% ± 0.05% over 5 seeds (the validation-chosen seed 1.04%); the paper's widths 4-7-112-66: "
        "1.15% ± 0.04%.",
        verdict="n/a",
        why="Neither reaches 1.0% under validation selection: at this budget the architecture itself sits at the goal's "
        "edge. No per-seed rule applies: a diagnostic with no verdict, whose posterior initialisation ran on one seed "
        "(the random ones on 5), so the two are not paired over seeds.",
        sources=(J,),
    ),
    Claim(
        folder="prune-retraining",
        title="prune-retraining: lenet5-prune's retraining settings (diagnostic)",
        paper="rdp",
        claim="Diagnostic: how lenet5-prune's retraining (stages, learning-rate schedule, distillation) was chosen, "
        "by validation error.",
        result="4 stages of 5 epochs, cosine schedule, distillation weight 0.7: 3-13-136-63, validation 1.26%, test "
        "1.23% (the other settings 1.42%-1.51% test error).",
        verdict="n/a",
        why="A selection on validation data; the chosen setting is lenet5-prune's config.",
        sources=(R + "prune-retraining/prune_retraining.md",),
    ),
    Claim(
        folder="vmf",
        title="vmf: von Mises-Fisher sampling and Bessel functions",
        paper="rdp",
        claim="RDP's KL uses the average of two Bessel-ratio bounds (the paper's supplementary); the issue's goals: an "
        "accurate method as well (the tests hold it below 1e-12 relative error against mpmath) and vMF rsample >= 10x "
        "scipy's throughput at d >= 100.",
        result="Accurate Bessel ratio: max relative error 7.7e-15 (the paper's bound average: 23% of the grid off by "
        "more than 1e-6; scipy: 34% NaN, inf or wrong); rsample 7.9-9.9x scipy at d=100 (float32), 73-87x at d=1000, "
        "more than 10^4x at d=10000 (rerun at bc7ec5f on an AMD EPYC, 2 threads, 159 s, nothing else running; "
        "4e61193's page in history/).",
        verdict="partly",
        why="The accuracy goal is met; the throughput goal from d = 1000 on, not at d = 100. On an H200 (the quick form, "
        "n = 2,000; code 21b4286) 8.0-9.1x at d = 100 and 295-355x at d = 1000: at that n a call is bound by its fixed cost.",
        sources=(J, "tests/test_special.py", "src/varbnn/special.py", R + "vmf/vmf.json"),
    ),
    Claim(
        folder="uci-learned",
        title="uci-learned: UCI regression with learned noise, every family and the baselines",
        paper="rdp",
        claim="Issue 30: under one learned-noise protocol (prior scale and training length chosen on a validation split "
        "of each training split), the best varbnn family above the best of VI/PBP/Dropout/VMG on >= 6 of 9 sets and "
        "above the deep ensembles' published numbers on >= 4 of 9; RDP at or above mean-field on >= 5 of 9.",
        result="All 9 sets, 20 splits each (protein 5), 1,155 runs on the CPU. Test LL, the families then MC dropout and the "
        "5-member ensemble (published: best of four, deep ensembles). yacht: MAP (Delta) -1.45 ± 0.23, radial -1.51, "
        "mean-field -1.61, RDP -1.83, 2-tied -2.01; -0.88, -0.68 (-1.30, -1.18). bostonHousing: radial -2.48 ± 0.05, RDP "
        "-2.55, mean-field -2.56, MAP -2.66, 2-tied -2.74; -2.51, -2.45 (-2.46, -2.41). energy: MAP -0.84 ± 0.07, radial "
        "-1.37, mean-field -1.44, RDP -1.99, 2-tied -2.15; -1.20, -1.42 (-1.06, -1.38). concrete: radial -3.10 ± 0.02, "
        "mean-field -3.13, RDP -3.19, MAP -3.19, 2-tied -3.24; -3.06, -3.13 (-3.01, -3.06). wine: radial -0.960, RDP "
        "-0.961, mean-field -0.962, 2-tied -0.972, MAP -0.980; -0.958, -1.00 (-0.93, -0.94). kin8nm: MAP 1.035, "
        "mean-field 1.024, radial 1.024, 2-tied 1.015, RDP 0.994; 0.990, 1.131 (1.10, 1.20). power: MAP -2.831 ± 0.008, "
        "mean-field -2.834, radial -2.834, 2-tied -2.838, RDP -2.846; -2.826, -2.802 (-2.80, -2.79). naval: MAP 5.16 ± "
        "0.05, RDP 4.36, 2-tied 4.31, mean-field 4.20, radial 4.16; 4.46, 5.39 (3.80, 5.63). protein: MAP -2.962, radial "
        "-2.964, mean-field -2.967, 2-tied -2.974, RDP -2.978; -2.960, -2.878 (-2.84, -2.83). "
        "IVON (mean-field) with its mean step clipped at 0.001 (issue 63's column; the recipe chosen on the validation "
        "splits, ivon-recipe.json; 165 runs at ad5dd79, every split) against the Adam-trained mean-field network on the "
        "same splits: yacht -1.105 against -1.610 (above on 19 of 20), energy -1.042 against -1.442 (20 of 20), "
        "bostonHousing -2.769 / -2.561 (6 of 20), concrete -3.150 / -3.134, wine -0.983 / -0.962 (5 of 20), kin8nm "
        "1.032 / 1.024, power -2.840 / -2.834, naval 4.185 / 4.204, protein -2.956 / -2.967 (4 of 5).",
        verdict="no",
        why="The goals are not met. Without the IVON column the best column is above the best-of-four reference on "
        "2 of 9 sets, but on both (energy, naval) the best column is MAP, a point estimate and no Bayesian win: the "
        "Bayesian families trained by Adam are above it on 1 of 9 (naval, where every family is above 3.80; best RDP "
        "4.36) against 6 asked, and above the deep-ensemble paper on 1 of 9 (energy: radial -1.37 against -1.38, MAP "
        "-0.84) against 4; the IVON column (below) brings these to 3 and 2 of 9. RDP is at or above "
        "mean-field on 3 of 9 set means (boston by 0.01 and wine by 0.001, naval by 0.16) against 5; per split (the "
        "per-seed table) that is clear only on naval (16 of 20 splits), level on boston and wine, and RDP is below "
        "on the other six. Against the paper's own RDP column (AAAI Table 1, transcribed in paper_rdp_column.json), "
        "this RDP is at or above it on 3 of 9 sets (yacht -1.83 against -2.36, boston -2.55 against -2.60, naval 4.36 "
        "against 3.05) and below it on six, by far on those where the paper's numbers are above what any column here "
        "reaches (kin8nm 0.994 against 2.17, power -2.846 against -0.14, protein -2.978 against 1.38, wine -0.961 "
        "against -0.45; also energy -1.99 against -1.18, concrete -3.19 against -2.61): the published code's "
        "log-likelihood takes its log-sum-exp over test points instead of weight draws (lab/varbnn_lab/uci.py), which "
        "inflates it, so the column is shown, not taken as a target. "
        "On kin8nm, naval and protein every variant is bound by the "
        "10,000-step cap (the same budget for every family), and on power and protein every family is within 0.03 "
        "of the others and 0.03-0.12 below the references. The baselines do better: MC dropout is above every family "
        "on yacht (by 0.57), concrete (0.04), power (0.005), wine and protein (0.002 each), and the 5-member ensemble is the best column on six sets. On yacht the "
        "ensemble and MC dropout are above both references, the Bayesian families with the full ELBO below them. A "
        "trace of energy split 0's search run (rdp-trace.md, reproducing the saved run) points at RDP's one "
        "concentration per layer and grouping: it settles at nearly the same point from both starts (A = 0.92, the "
        "same ~38% direction noise on every row), the validation LL peaks at epoch 125 and ends 0.6 nats below "
        "mean-field's, the score correction does not change it, and with one concentration per group "
        "(shared_concentration=False, an option beyond the paper) the same run ends 0.15 nats below mean-field's "
        "(-1.77 against -1.62); on concrete split 0 the validation-chosen values are within 0.02 nats either way. "
        "The IVON column adds two Bayesian wins over the best-of-four reference, yacht (-1.105 against -1.30) and "
        "energy (-1.042 against -1.06), both also above the deep-ensemble paper (-1.18, -1.38), and is the best "
        "family on protein (-2.956; MAP -2.962): with it the Bayesian families are above the best-of-four reference "
        "on 3 of 9 sets and above the deep-ensemble paper on 2 of 9, still short of the goals. Against the "
        "Adam-trained mean-field network (per split, by the verdict rule) it is above on yacht, energy and protein "
        "(+0.011 ± 0.006, 4 of 5), level within one standard error on concrete, kin8nm and naval, and below on "
        "bostonHousing (-0.208 ± 0.070), wine (-0.022 ± 0.008) and power (-0.006 ± 0.004). At IVON's defaults (no clipping; the 41 runs of d20625e, in history/) its mean update ran "
        "away on the larger sets: a trace of protein split 0's search run (ivon-noise-trace.json, "
        "benchmarks/ivon_noise_trace.py) shows the means jumping (the largest |m| from 1.731 to 11.2639 in epoch 2 at "
        "the defaults; from 2.1927 to 528.6356 in epoch 4 with plain_hess 100) as the smallest curvature falls (0.2887 "
        "to 0.1398); the clip chosen on validation (mean rank 1.67 of 4 against the defaults' 3.11, "
        "benchmarks/ivon_regression_recipe.py) removed the divergence (every one of the 165 runs finite).",
        sources=(J, R + "uci-learned/uci-learned.md", R + "uci-learned/rdp-trace.md", "lab/varbnn_lab/pages/uci.py",
                 R + "uci-learned/uci-learned.json", R + "uci-learned/paper_rdp_column.json",
                 R + "uci-learned/ivon-noise-trace.json", R + "uci-learned/ivon-recipe.json"),
        comparisons=(
        *(Comparison(
            f"IVON (clip 0.001) vs mean-field (Adam), test LL on {dataset} (per split)",
            R + "uci-learned/uci-learned_runs.jsonl",
            (("dataset", dataset), ("variant", "IVON (mean-field)")),
            (("dataset", dataset), ("variant", "mean-field")),
            "ll",
            seed="split",
            decides=False,
        ) for dataset in ("yacht", "bostonHousing", "energy", "concrete", "wine-quality-red", "kin8nm", "power-plant",
                          "naval-propulsion-plant", "protein-tertiary-structure")),
        Comparison(
            "RDP vs mean-field, test LL on yacht (per split)",
            R + "uci-learned/uci-learned_runs.jsonl",
            (("dataset", "yacht"), ("variant", "RDP (double)")),
            (("dataset", "yacht"), ("variant", "mean-field")),
            "ll",
            seed="split",
            decides=False,
        ),
        Comparison(
            "RDP vs mean-field, test LL on bostonHousing (per split)",
            R + "uci-learned/uci-learned_runs.jsonl",
            (("dataset", "bostonHousing"), ("variant", "RDP (double)")),
            (("dataset", "bostonHousing"), ("variant", "mean-field")),
            "ll",
            seed="split",
            decides=False,
        ),
        Comparison(
            "RDP vs mean-field, test LL on energy (per split)",
            R + "uci-learned/uci-learned_runs.jsonl",
            (("dataset", "energy"), ("variant", "RDP (double)")),
            (("dataset", "energy"), ("variant", "mean-field")),
            "ll",
            seed="split",
            decides=False,
        ),
        Comparison(
            "RDP vs mean-field, test LL on concrete (per split)",
            R + "uci-learned/uci-learned_runs.jsonl",
            (("dataset", "concrete"), ("variant", "RDP (double)")),
            (("dataset", "concrete"), ("variant", "mean-field")),
            "ll",
            seed="split",
            decides=False,
        ),
        Comparison(
            "RDP vs mean-field, test LL on wine-quality-red (per split)",
            R + "uci-learned/uci-learned_runs.jsonl",
            (("dataset", "wine-quality-red"), ("variant", "RDP (double)")),
            (("dataset", "wine-quality-red"), ("variant", "mean-field")),
            "ll",
            seed="split",
            decides=False,
        ),
        Comparison(
            "RDP vs mean-field, test LL on kin8nm (per split)",
            R + "uci-learned/uci-learned_runs.jsonl",
            (("dataset", "kin8nm"), ("variant", "RDP (double)")),
            (("dataset", "kin8nm"), ("variant", "mean-field")),
            "ll",
            seed="split",
            decides=False,
        ),
        Comparison(
            "RDP vs mean-field, test LL on power-plant (per split)",
            R + "uci-learned/uci-learned_runs.jsonl",
            (("dataset", "power-plant"), ("variant", "RDP (double)")),
            (("dataset", "power-plant"), ("variant", "mean-field")),
            "ll",
            seed="split",
            decides=False,
        ),
        Comparison(
            "RDP vs mean-field, test LL on naval-propulsion-plant (per split)",
            R + "uci-learned/uci-learned_runs.jsonl",
            (("dataset", "naval-propulsion-plant"), ("variant", "RDP (double)")),
            (("dataset", "naval-propulsion-plant"), ("variant", "mean-field")),
            "ll",
            seed="split",
            decides=False,
        ),
        Comparison(
            "RDP vs mean-field, test LL on protein-tertiary-structure (per split)",
            R + "uci-learned/uci-learned_runs.jsonl",
            (("dataset", "protein-tertiary-structure"), ("variant", "RDP (double)")),
            (("dataset", "protein-tertiary-structure"), ("variant", "mean-field")),
            "ll",
            seed="split",
            decides=False,
        ),
        ),
    ),
    # --- varbnn's own --------------------------------------------------------------------------------------------
    Claim(
        folder="demo",
        title="demo: the BNN at the library's defaults vs the plain network",
        paper="varbnn",
        claim="`varbnn demo` (offline digits, at the library's defaults) shows the BNN beating the plain network on "
        "NLL, ECE and out-of-distribution detection, and the plain network with early stopping and temperature scaling "
        "on NLL and out-of-distribution detection.",
        result="1077 training digits (270 held out for validation), one seed. BNN at the defaults vs plain vs plain + "
        "early stopping + temperature: NLL 0.1015 vs 0.1877 vs 0.1481, ECE 0.0194 vs 0.0214 vs 0.0146, rotated-digit "
        "AUROC 0.9300 vs 0.5125 vs 0.4029. The BNN by the same recipe (patience 5): NLL 0.1156, AUROC 0.5087.",
        verdict="partly",
        why="One seed (rerun at 4e61193, fit's early stopping now on the moment predictive: the same numbers as at "
        "fccbd97, 7.8 s on 2 CPU threads; the earlier run trained on every training digit, none held out); by the "
        "verdict rule one seed gives at most partly. The BNN's ECE is above the tempered plain net's. Early stopping with patience "
        "5 stops the BNN at epoch 16 of 150, before its out-of-distribution detection forms: on this small set the "
        "recipe helps the plain network and hurts the BNN.",
        sources=(J, R + "demo/demo.md"),
    ),
    Claim(
        folder="defaults",
        title="defaults: how the library's defaults were chosen",
        paper="varbnn",
        claim="Defaults chosen once, on validation data only, so that a user who changes nothing gets a BNN better "
        "than the plain network.",
        result="288 runs (every family, KL weights 1-0.01, two mean initialisations, three small tasks, seeds 0-1): at "
        "its defaults every family's validation NLL is 0.69-0.79 of the plain net's.",
        verdict="partly",
        why="On the three small tasks the claim holds; on LeNet-5 it does not carry over, so partly (the verdict rule on "
        "the LeNet-5 check: no family at its defaults beats the plain net's validation NLL on both seeds, Delta is "
        "worse on both). The selection rule (lowest mean validation NLL ratio) was stated before the runs. Radial needed a "
        "per-element initial std: with sigma = 1e-2 it had no epistemic uncertainty. The check on LeNet-5 (variant "
        "lenet5/: 10 epochs on Fashion-MNIST, 2 seeds) does not carry the claim over: at the defaults the "
        "validation NLL ratio is 0.975-1.030 and every family's ECE is above the plain net's (+0.001 to +0.011); no KL "
        "weight from 1 to 0.01 makes KTied, RDP or Delta clearly better than the plain net. The extra ECE is "
        "underconfidence (variant lenet5-gap, seed 0: mean confidence minus accuracy -0.010 to -0.018 for the Bayesian "
        "families, +0.001 for the plain net). A narrower start is no fix (variant lenet5-init-std, 2 seeds): MeanField "
        "at init_std 1e-3 instead of 1e-2 has the plain net's calibration (gap +0.000, ECE +0.000) but a worse NLL "
        "ratio (0.992 against 0.981) and almost no epistemic uncertainty (mutual information 0.0002 against 0.0069); "
        "KTied at 1e-3 beats the plain net on both (0.978, -0.000) with mutual information 0.0007.",
        sources=(J, R + "defaults/lenet5/defaults.md", R + "defaults/lenet5-gap/defaults.md",
                 R + "defaults/lenet5-init-std/defaults.md"),
        comparisons=(
        Comparison(
            "meanfield at its defaults vs plain, LeNet-5 validation NLL",
            R + "defaults/lenet5-init-std/defaults.json",
            (("family", "meanfield"),),
            (("family", "plain"),),
            "nll",
            better="lower",
            records="records",
        ),
        Comparison(
            "radial-element at its defaults vs plain, LeNet-5 validation NLL",
            R + "defaults/lenet5-init-std/defaults.json",
            (("family", "radial-element"),),
            (("family", "plain"),),
            "nll",
            better="lower",
            records="records",
        ),
        Comparison(
            "ktied at its defaults vs plain, LeNet-5 validation NLL",
            R + "defaults/lenet5-init-std/defaults.json",
            (("family", "ktied"),),
            (("family", "plain"),),
            "nll",
            better="lower",
            records="records",
        ),
        Comparison(
            "rdp at its defaults vs plain, LeNet-5 validation NLL",
            R + "defaults/lenet5-init-std/defaults.json",
            (("family", "rdp"),),
            (("family", "plain"),),
            "nll",
            better="lower",
            records="records",
        ),
        Comparison(
            "delta at its defaults vs plain, LeNet-5 validation NLL",
            R + "defaults/lenet5-init-std/defaults.json",
            (("family", "delta"),),
            (("family", "plain"),),
            "nll",
            better="lower",
            records="records",
        ),
        ),
    ),
    Claim(
        folder="conversion-defaults",
        title="conversion-defaults: how wide a converted network's posterior starts",
        paper="varbnn",
        claim="Issue 26: what bayesianize does with a trained model's weights, chosen on validation data: the initial "
        "posterior width around the copied weights.",
        result="Validation NLL, 2 seeds, LeNet-5 on Fashion-MNIST converted after 5 epochs and trained 2 more: RDP "
        "0.2903 at init_resultant 0.95, 0.2748 at 0.99, 0.2553 at 0.999; MeanField 0.2645 at init_std 0.01, 0.2588 at "
        "0.001; plain 0.2740, the plain network trained 2 more epochs 0.2517 (rerun at 909bcba, the same selections "
        "as 46de9db's runs in history/).",
        verdict="n/a",
        why="A defaults study, not a claim: RDP's 0.999 is adopted for bayesianize(pretrained=True); MeanField's 0.001 is "
        "not (pretrained=True is also its measured-better start on fresh networks, which this study did not measure). "
        "On this split the extra training explains much of the converted networks' gain.",
        sources=(R + "conversion-defaults/conversion-defaults.md", R + "conversion-defaults/conversion-defaults.json",
                 "benchmarks/conversion_study.py"),
    ),
    Claim(
        folder="mnist-mlp",
        title="mnist-mlp: the Gaussian estimators side by side",
        paper="varbnn",
        claim="Reparameterization, local reparameterization and flipout give the same expected loss and gradient (a "
        "tested identity); a side-by-side run on the MNIST MLP.",
        result="MLP 784-400-400-10, 20 epochs, 3 seeds, test accuracy: plain 0.9815, MAP 0.9811, mean-field reparam "
        "0.9823, local 0.9728, flipout 0.9814 (rerun at 909bcba; 20c1d7e's page in history/).",
        verdict="n/a",
        why="No paper number to match. Local reparameterization reaches a much lower training loss (-ELBO/N 2.27 vs "
        "5.74 nats): it moves further toward the ELBO optimum, trading accuracy for a smaller KL. The rerun keeps a "
        "runs file: on each of the 3 seeds local reparameterization has the lowest training loss and the lowest test "
        "accuracy of the three estimators. A side-by-side measurement has no claim to decide.",
        sources=(J, R + "mnist-mlp/mnist-mlp.json", R + "mnist-mlp/mnist-mlp_runs.jsonl"),
    ),
    Claim(
        folder="step-time",
        title="step-time: training-step time against the deterministic network and the peers",
        paper="varbnn",
        claim="CPU MLP targets (issue 8): MeanField-local <= 1.8x the deterministic step, Radial <= 2.5x, RDP <= 3.5x, "
        "KTied not slower than MeanField, every family faster than the fastest peer.",
        result="Like for like only: an eager step against the eager deterministic step and the eager peers of the same "
        "process; a compiled step (fit(compile=True)) or a CUDA-graph step (fit(compile='reduce-overhead')) against the "
        "deterministic network compiled the same way in the same process (step_time_summary.md's like-for-like table, "
        "written from the tables by benchmarks/step_time_summary.py), beside what its first compiled step costs. "
        "On the CPU the peers are compiled too (benchmarks/step_time.py --compile: their loss through torch.compile "
        "with the same settings); on a GPU they are not yet. "
        "CPU MLP 784-400-400-10, batch 128, AMD EPYC, 2 threads, one process (code 169adfc). Eager: MeanField reparam "
        "2.52x, local 2.75x, flipout 3.66x, KTied 2.51x / 2.87x, Radial 2.67x, RDP row 3.71x, double 6.92x the "
        "deterministic step; torchbnn 2.79x, bayesian-torch 3.28x; floors 1.47x / 1.81x. Compiled, over the compiled "
        "deterministic step: MeanField reparam 1.66x, local 2.14x, flipout 2.44x, KTied 1.58x / 2.13x, Radial 1.78x, "
        "RDP row 2.06x, double 3.29x; the peers compiled the same way: bayesian-torch 1.92x (reparameterization) / "
        "2.89x (flipout), torchbnn 3.41x (slower than its eager step); the first compiled step (compile_time.json, code "
        "e043f36, the same machine) takes 46.0 s for MeanField reparam, 38.8-95.9 s per family with a cold compile "
        "cache and 7.8-26.5 s with a warm one. "
        "CPU LeNet-5, batch 100, the same machine (code 169adfc). Eager: MeanField reparam 1.35x, local 2.49x, KTied "
        "1.36x, Radial 1.40x, RDP 1.64x / 2.17x; torchbnn 1.21x, bayesian-torch 1.45x. Compiled, over the compiled "
        "deterministic step: MeanField reparam 1.17x, local 2.00x, KTied 1.31x, Radial 1.32x, RDP 1.35x / 1.61x; "
        "bayesian-torch 1.23x, torchbnn 1.43x; the first compiled step (compile_time_lenet5.json, code 87e2002) 74.0 s "
        "for MeanField reparam, 47.5-115.8 s per family cold, 7.7-35.3 s warm. "
        "H200 (code 21b4286): MLP eager MeanField reparam 4.72x against torchbnn 3.42x and bayesian-torch 3.75x, "
        "compiled 1.33x the compiled deterministic step; LeNet-5 compiled MeanField reparam 1.47x, local 1.80x, KTied "
        "2.18x, Radial 1.50x; with CUDA graphs (code 022ea0f) MeanField reparam 1.67x, local 1.57x, KTied 1.72x, "
        "Radial 1.67x the deterministic network with CUDA graphs. H100 (code bb019df), eager: LeNet-5 MeanField "
        "reparam 4.05x against torchbnn 4.11x and bayesian-torch 4.68x; ResNet-18, batch 128, MeanField reparam 2.17x "
        "against torchbnn 2.17x and bayesian-torch 2.51x; compiled ResNet-18 MeanField reparam 1.88x, Radial 1.90x, "
        "KTied 3.71x the compiled deterministic step. No first compile was timed on a GPU.",
        verdict="no",
        why="Issue 8's targets by the like-for-like numbers (CPU MLP, code 169adfc). Eager, none is met in full: "
        "MeanField-local 2.75x, Radial 2.67x, RDP row 3.71x are above their targets; KTied is level with MeanField "
        "(2.51x / 2.87x against 2.52x / 2.75x); MeanField reparam, KTied reparam and Radial are faster than torchbnn "
        "(2.79x), local, flipout, KTied local and RDP are not. Compiled, over the compiled deterministic step: Radial "
        "1.78x and RDP row 2.06x meet theirs, RDP double 3.29x does not, nor does MeanField-local 2.14x (its target "
        "lies below the estimator's own mandatory work: the local floor is 1.81x eager); KTied is not slower than "
        "MeanField (1.58x / 2.13x against 1.66x / 2.14x); against the fastest compiled peer (bayesian-torch "
        "reparameterization, 1.92x) the compiled reparameterized families are faster (MeanField 1.66x, KTied 1.58x, "
        "Radial 1.78x), and the local estimators (2.14x, 2.13x) are faster than its flipout (2.89x) but not than its "
        "reparameterization. Compiling pays only after the first compiled step's 38.8-95.9 s (MLP) or 47.5-115.8 s "
        "(LeNet-5) with a cold cache. On the CPU LeNet-5 eager MeanField reparam (1.35x) is slower than torchbnn "
        "(1.21x), and compiled (1.17x of the compiled deterministic step, 30.25 ms) it beats the compiled peers "
        "(bayesian-torch 1.23x, torchbnn 1.43x) but not torchbnn's eager step (29.99 ms): on that network the fastest "
        "step is still a peer's. On a GPU the eager varbnn step is slower than the peers' on the H200 "
        "MLP and level with torchbnn on the H100 LeNet-5 and ResNet-18; the earlier headline ratios divided compiled "
        "or CUDA-graph steps by the eager deterministic step, which the deterministic network's own compiled step "
        "changes (with CUDA graphs it takes 0.54x its eager step on the H200 LeNet-5, compiled on the H100 ResNet-18 "
        "0.65x). Missing: compiled peers on a GPU (python benchmarks/step_time.py --model lenet5 --device cuda "
        "--compile --compile-mode reduce-overhead, in scripts/gpu_speed.sh), the first "
        "compile on a GPU (python benchmarks/compile_time.py --model lenet5 --device cuda --compile-mode "
        "reduce-overhead), the H200 LeNet-5 eager varbnn rows in the same process as the peers, RDP with CUDA graphs "
        "beside a deterministic CUDA-graph row, and a CPU counterpart of CUDA graphs (none: CUDA only). The history of "
        "the ratios (issue 29's targets, per-round tables, A/B studies) is in the journal and the history pages.",
        sources=(
            R + "step-time/step_time_summary.md",
            R + "step-time/step_time_summary.json",
            R + "step-time/compile_time.md",
            R + "step-time/compile_time_lenet5.md",
            R + "step-time/step_time.json",
            R + "step-time/step_time_lenet5.json",
            J,
        ),
    ),
    Claim(
        folder="predict-time",
        title="predict-time: vectorised Monte Carlo prediction",
        paper="varbnn",
        claim="64 draws of a Bayesian LeNet-5 on 10,000 images, vectorised: <= 0.5x the time of 64 sequential passes, "
        "within 2 GB, identical output for the same seed.",
        result="H100 (code bb019df): MeanField-reparam 0.41-0.45x, MeanField-local 0.46-0.50x, Radial 0.28-0.31x, "
        "KTied(rank=2) 0.39-0.42x; at chunk_size=16, batch_size=1000 the peak is 1,958 / 1,562 / 1,958 / 1,959 MiB; the "
        "same seed gives identical output. RadialDirectional(row) 1.04x / 1.06x at chunk_size 64 / 16 (vmap refused its "
        "autograd Functions: the loop over draws), 0.37x at chunk_size=8, batch_size=2500. The H200 table of 21b4286 had "
        "MeanField-reparam 0.41-0.44x, local 0.39-0.44x, Radial 0.26-0.28x.",
        verdict="partly",
        why="Time, memory and determinism together for MeanField, Radial and KTied; RDP fell back to the loop over draws "
        "and was not faster than the sequential passes (its draws run under vmap since bad3b39, not yet timed on a GPU). "
        "On the CPU (predict_time.md, code 169adfc, 1 thread, 16 draws of 500 images) the batched pass is slower than "
        "the loop for every family on LeNet-5 (1.23-1.99x) and mostly faster on dense networks (MLP 0.54-0.99x for "
        "MeanField and Radial, 1.07-1.28x for KTied and RDP; UCI-sized 0.19-0.48x), so predict loops there by default "
        "for Bayesian convolutions only.",
        sources=(J, R + "predict-time/predict_time.json", R + "predict-time/predict_time_mlp.json",
                 R + "predict-time/predict_time_uci.json"),
    ),
    Claim(
        folder="ivon",
        title="ivon: IVON's training step against Adam's",
        paper="varbnn",
        claim="Issue 63: IVON (varbnn.optim) trains a MeanField posterior at close to Adam's cost; its step on the CPU "
        "MLP within 1.3x of Adam's.",
        result="CPU MLP 784-400-400-10, batch 128, 2 threads (code 169adfc, 30 interleaved rounds): IVON 9.46 ms "
        "per step, 0.81x MeanField + Adam's 11.51 ms and 2.30x the plain network's Adam step (4.01 ms). The absolute "
        "times are higher than the previous run's (code fccbd97: 5.60, 7.52 and 2.10 ms; in history/): another "
        "machine of the same kind and a load average of 1.9 against 0.7; the interleaved ratios moved less (0.72x "
        "and 2.71x there); IVON's update is the same arithmetic (738048f changed only how it reads the family's "
        "sigma).",
        verdict="partly",
        why="Within 1.3x of Adam on the same Bayesian model (0.81x), not of the plain network's Adam step (2.30x). The "
        "families draw from the sigma IVON holds (one addcmul; d loss / d sigma lands in the held tensor, no softplus "
        "forward or backward), and the update is the paper's arithmetic regrouped (fused addcdiv / lerp forms, states "
        "in place, two scratch buffers, rho = log(expm1(sigma)) where it cannot overflow), the same numbers up to "
        "rounding (tests/test_ivon_speed_equivalence.py holds it to the earlier step). What is left is the weight "
        "noise: torch's CPU generator fills each tensor on one thread, about half a plain step here, a floor for any "
        "method that draws weights.",
        sources=(R + "ivon/ivon_step.md", R + "ivon/ivon_step.json", R + "ivon/history/ivon_step_fccbd97.json"),
    ),
    Claim(
        folder="finetune-cpu",
        title="finetune-cpu: Bayesian fine-tuning of a pretrained ViT with few labels, variational adapters against LoRA",
        paper="varbnn",
        claim="Issue 65, item 3: a small vision transformer pretrained on MNIST and fine-tuned on 1,000 Fashion-MNIST "
        "images (3+ seeds, validation-chosen settings only); the best variational adapter beats plain LoRA + temperature "
        "scaling on NLL and ECE and matches the LoRA ensemble's NLL at <= 1.5x one LoRA's training time.",
        result="Means of 3 seeds (ViT pretrained 5 epochs on MNIST, test accuracy 0.9637, pretrained anew on this "
        "machine; 1,000 labels; OOD the MNIST test set; adapters on the patch embedding, each self-attention's packed "
        "query / key / value projection and the feed-forward layers; rerun at 5645b9e with the variational adapters "
        "started as wide as A itself (std_scale 1.0, chosen on validation in studies/adapter-std)). Test NLL / "
        "ECE: LoRA 0.7676 / 0.0614, LoRA + TS 0.7392 / 0.0283, 5 LoRAs 0.6583 / 0.0291, last-layer Laplace 0.7552 / "
        "0.0427, full fine-tuning 0.7257 / 0.0355, variational adapters 0.7058 / 0.0197, with TS 0.7077 / 0.0150, "
        "trained by IVON 0.7410 / 0.0227. OOD AUROC: the LoRA ensemble 0.7862, variational adapters 0.6941, LoRA + TS "
        "0.6572. Training time of the variational adapters 4.24x one LoRA's (1.59x without fit's validation passes); "
        "LoRA's validation-chosen learning rate is 0.01 here (13 epochs), the adapters' 0.003 (23 epochs).",
        verdict="no",
        why="The variational adapters (std_scale 1.0, no temperature) now beat LoRA + TS on NLL on 3 of 3 "
        "seeds (0.7058 vs 0.7392) and on ECE on 2 of 3 (0.0197 vs 0.0283), and every single LoRA model, full "
        "fine-tuning included (0.7257). But their NLL is above the LoRA ensemble's (0.6583) on every seed, 7% above it "
        "where the goal allows 5%, and their training costs 4.24x one LoRA's: 1.59x in training steps (more epochs "
        "than LoRA's), the rest fit's 8-draw validation passes, which the adapter-std study found cannot drop to 2 "
        "draws without stopping too early. The page before (169adfc, history/), with the posterior started at 1e-2, "
        "had the adapters level with LoRA + TS (0.7427 vs 0.7409). Adapting the attention too lowered every LoRA "
        "method's NLL (the run without it: 8178ce7, history/).",
        sources=(R + "finetune-cpu/summary.json", R + "finetune-cpu/pretrain.json", "benchmarks/finetune_cpu.py",
                 R + "finetune-cpu/history/summary-8178ce7-no-attention-adapters.json",
                 R + "finetune-cpu/history/summary-169adfc.json", R + "finetune-cpu/studies/adapter-std.json"),
        comparisons=(
            Comparison(
                "variational adapters vs the LoRA ensemble, test NLL",
                R + "finetune-cpu/runs.jsonl",
                (("method", "vlora"),),
                (("method", "lora-ens"),),
                "nll",
                better="lower",
            ),
            *(
                Comparison(
                    f"variational adapters vs LoRA + TS, test {metric.upper()}",
                    R + "finetune-cpu/runs.jsonl",
                    (("method", "vlora"),),
                    (("method", "lora-ts"),),
                    metric,
                    better="lower",
                    decides=False,
                )
                for metric in ("nll", "ece")
            ),
        ),
    ),
    Claim(
        folder="uncertainty-cpu",
        title="uncertainty-cpu: the library's recipe against what a careful user picks instead (CPU form)",
        paper="varbnn",
        claim="Issue 63, on 10,000 training images (MLP 784-200-200-10; 3 seeds; validation 5,000; OOD the other data "
        "set): (a) every family by the library's recipe below the early-stopped plain net on NLL and ECE; (b) the best "
        "varbnn method below plain + early stopping + temperature scaling and MC dropout on NLL, above both on OOD "
        "AUROC; (c) the best single method within 5% of a 5-member deep ensemble's NLL at <= 1.5x plain's training "
        "time, and a 5-member mixture of posteriors below the ensemble's NLL at equal training time; (d) prediction "
        "at no more than ten times one plain forward pass.",
        result="Means of 3 seeds, test NLL; every page rerun at 0abe3a0 from a clean worktree (1 thread per process, two "
        "processes side by side on the 2 cores: times compare within a page only). The Fashion-MNIST MLP's scores equal "
        "4db6fa7's to the last digit; the MNIST MLP's moved from fe3502f's (history/), plain's too, with no library "
        "change in between that touches plain training. Fashion-MNIST MLP: plain + ES + TS 0.4151, MC dropout 0.4061, "
        "ensemble 0.3936; MeanField 0.3967, KTied 0.3985, Radial 0.4067, IVON 0.4065 (each early-stopped + TS), IVON "
        "mixture 0.3997; OOD AUROC IVON 0.8900 vs MC dropout 0.8694 and plain + ES + TS 0.8574. MNIST MLP: plain + ES + "
        "TS 0.1694, MC dropout 0.1519, ensemble 0.1526; IVON 0.1374 (0.1365 on the moment predictive), KTied 0.1421, "
        "MeanField 0.1540; IVON mixture 0.1253; OOD AUROC IVON (moments) 0.9343 vs 0.7956 and 0.6444. Training time of "
        "IVON (early-stopped + TS) 3.81x / 4.48x the plain net's 20 epochs; the converted path (the early-stopped plain "
        "net converted to MeanField, 2 more epochs, TS on the moment predictive) 1.37x / 1.49x at NLL 0.4130 / 0.1710, "
        "and trained by IVON instead of Adam (rows added at 492b592, run the same way) 1.16x / 1.10x at NLL 0.4044 / "
        "0.1626, below plain + ES + TS on 3 of 3 seeds on both; "
        "32 draws cost 43x-59x one plain forward pass, the moment predictive 4x-6x. LeNet-5 on Fashion-MNIST (3 seeds "
        "for every row now; KTied, the moment and the converted rows added; Radial and the IVON mixture not run): "
        "MeanField 0.3402, KTied 0.3480, IVON 0.3478 (early-stopped + TS), plain + ES + TS 0.3416, MC dropout 0.3284, "
        "ensemble 0.3125; OOD AUROC IVON 0.7974 vs MC dropout 0.6876; the IVON-converted net (added at 492b592) 0.3371 "
        "with TS, the lowest single-model NLL there, at 2.08x plain's training (the plain net's early stopping alone "
        "1.49x).",
        verdict="partly",
        why="(a) met on all three pages (every family with early stopping and temperature scaling below the early-"
        "stopped plain net on NLL and ECE, by the rule; without temperature scaling on MNIST and LeNet-5, not on the "
        "Fashion-MNIST MLP). (b) met on MNIST by IVON (all three forms) and KTied on 3 of 3 seeds; not on Fashion-MNIST, "
        "where the best on NLL, MeanField, is above both baselines on OOD AUROC on 1 and 0 of 3 seeds, and IVON, above "
        "both on OOD AUROC on 3 of 3 seeds, is level with MC dropout on NLL (0.4065 vs 0.4061; lower on 2 of 3 seeds); "
        "not on LeNet-5, where no family is below MC dropout on NLL (MeanField on 1 of 3 seeds) and IVON, the best "
        "detector on 3 of 3 seeds, is above plain + ES + TS on NLL on 3 of 3. (c) for a single method: each page's line "
        "tests the method with the lowest NLL (3.86x / 4.26x / 2.08x plain's training: not met); the cheapest within "
        "5% of the ensemble is the IVON-converted MeanField on the Fashion-MNIST MLP (0.4044 vs 0.3936 at 1.16x, "
        "within 5% on 2 of 3 seeds; the Adam-converted one 0.4130 at 1.37x), MeanField on the moment recipe on MNIST "
        "(3.06x; the converted ones are 7% and 12% above the ensemble there), none on LeNet-5 (the IVON-converted net "
        "is 8% above the ensemble, below plain + ES + TS on 1 of 3 seeds). Plain's step is so cheap on this CPU MLP that the weight noise alone costs a large "
        "part of it, and early stopping trains up to 36 epochs against plain's 20. The 5-member IVON mixture beats the "
        "ensemble on MNIST (0.1253 vs 0.1526, 3 of 3 seeds, 3.35x its training time) and not on Fashion-MNIST (0.3997 "
        "vs 0.3936, 0 of 3); at equal training time (the first k members that fit in the ensemble's seconds) IVON "
        "beats the ensemble on MNIST on 2 of 3 seeds (k = 1 and 2; on the third one member takes as long as the "
        "ensemble), on Fashion-MNIST on none (k = 1-2). (d) not met by predict's default (16 weight draws, 21.4x on "
        "moment-predictive's timing; the pages score 32); met on the MLPs by the opt-in moment predictive, whose recipe "
        "rows (fit's validation, the temperature, the test predictions) give MeanField 0.3973 / 0.1539, KTied 0.3988 / "
        "0.1392 and IVON 0.4076 / 0.1365 against 0.3967 / 0.1540, 0.3985 / 0.1421 and 0.4065 / 0.1374 with weight draws "
        "(moment-predictive: untempered it is up to 9.5% above 64 draws' validation NLL on MNIST, so it is not "
        "predict's default); on LeNet-5 it costs 7x-8x. IVON's default stays clip=None: the regression recipe's clip "
        "0.001 raised the best validation NLL of this benchmark's IVON grid on both MLPs (studies/ivon-clip). The "
        "20-epoch GPU form (uncertainty-mnist / -fmnist) holds these rows too, waiting for a GPU.",
        sources=(R + "uncertainty-cpu/fashion-mnist-mlp.json", R + "uncertainty-cpu/mnist-mlp.json",
                 R + "uncertainty-cpu/fashion-mnist-lenet5.json", "benchmarks/uncertainty_cpu.py",
                 R + "moment-predictive/summary.json", R + "moment-predictive/timing.json",
                 R + "uncertainty-cpu/history/fashion-mnist-mlp-6e6152f-validation-by-draws.json",
                 R + "uncertainty-cpu/history/mnist-mlp-6e6152f-validation-by-draws.json",
                 R + "uncertainty-cpu/history/fashion-mnist-mlp-4e61193.json",
                 R + "uncertainty-cpu/history/mnist-mlp-4e61193.json",
                 R + "uncertainty-cpu/history/fashion-mnist-mlp-4db6fa7.json",
                 R + "uncertainty-cpu/history/mnist-mlp-fe3502f.json",
                 R + "uncertainty-cpu/history/fashion-mnist-lenet5-a3f1c6c.json",
                 R + "uncertainty-cpu/studies/ivon-clip.json"),
        comparisons=tuple(
            Comparison(
                f"{label}: IVON (ES + TS) vs {base}, {metric}",
                R + "uncertainty-cpu/runs.jsonl",
                (("dataset", dataset), ("model", "mlp"), ("method", "ivon-es-ts")),
                (("dataset", dataset), ("model", "mlp"), ("method", base)),
                metric,
                better="lower" if metric == "nll" else "higher",
                decides=False,
            )
            for label, dataset in (("Fashion-MNIST", "fashion-mnist"), ("MNIST", "mnist"))
            for base in ("plain-es-ts", "dropout-es")
            for metric in ("nll", "ood_auroc_entropy")
        ),
    ),
    Claim(
        folder="moment-predictive",
        title="moment-predictive: a single-pass predictive against weight draws",
        paper="varbnn",
        claim="Issue 63 (d): the default predictive costs at most 10x one plain forward pass on the CPU benchmark; "
        "predict defaults to the fewest draws that keep the validation NLL within 1% of 64 draws'; optionally a "
        "single-pass predictive (moment propagation, Wu et al. 2019) where it is accurate.",
        result="The CPU benchmark's MLP 784-200-200-10 over 20,000 images (1 thread, 10 interleaved rounds): 32 weight "
        "draws cost 49.4x one plain pass, 8 draws 9.6x, the moment predictive 4.5x. Its validation NLL against 64 "
        "weight draws (MeanField, KTied and IVON, early-stopped, 3 seeds each): Fashion-MNIST -0.7% to +0.8% (within 1% "
        "on 9 of 9 runs); MNIST +0.4% to +9.5% (within 1% on 2 of 9; IVON 0.1555 vs 0.1451 on the mean). With a "
        "temperature fitted on the validation split to each predictive, the test NLL of the moment predictive is -0.2% "
        "to +0.8% from the weight draws' on Fashion-MNIST and -3.2% to +2.1% on MNIST (lower on 6 of 9 there; IVON "
        "0.1346 vs 0.1349), its OOD AUROC 0.2 to 2.8 points lower on MNIST.",
        verdict="partly",
        why="The moment predictive meets the cost goal (4.5x) and, within the library's recipe (a temperature on "
        "validation), the weight draws' NLL; untempered it misses the 1% criterion on MNIST (met on 2 of 9 runs), so "
        "predict's default stays Monte Carlo at 16 weight draws (21.4x) and the moment predictive is opt-in "
        "(predictive='moments' or 'auto'). The drawn costs of each run are on the page, taken under load; the timing "
        "row is the like-for-like measure. On LeNet-5 (Fashion-MNIST, MeanField and IVON, 3 seeds), where max pooling "
        "takes maxima of outputs that share a kernel as independent, the moment predictive is further off: validation NLL "
        "+0.2% to +3.0% (within 1% on 2 of 6 runs), with a temperature -0.4% to +3.4%, OOD AUROC 1.8 to 5.5 points lower.",
        sources=(R + "moment-predictive/summary.json", R + "moment-predictive/timing.json",
                 "benchmarks/moment_predictive.py"),
    ),
    Claim(
        folder="regression-defaults",
        title="regression-defaults: the KL weight chosen on regression validation data",
        paper="varbnn",
        claim="Issue 63: the default KL weight 0.1 was chosen on classification only and gave 78% coverage of nominal "
        "95% intervals on diabetes (RMSE 68.4; beta = 1: 98% and 56.5): choose the regression defaults on regression "
        "validation data and report interval coverage.",
        result="Six regression tasks (diabetes and five UCI sets, 5 splits each), MeanField and KTied, learned noise, "
        "early stopping on validation (rerun at 0abe3a0 from a clean worktree: every score equal to the last digit to "
        "169adfc's, where fit early-stops on the moment predictive by default and made the same choice as 6352cc4; the "
        "runs without early stopping equal to 70fe079's): the validation NLL picks kl_weight 0.01 for both (regret 0.010 and 0.016 nats "
        "against 0.063 for MeanField at 0.1); test coverage of the 95% intervals 0.945 at 0.01 and 0.956 at 0.1 "
        "(means over tasks); diabetes at 0.1: coverage 0.959, RMSE 53.99 (linear regression 52.90). Without early "
        "stopping (MeanField, split 0, 400 epochs) the validation picks 0.3 and 0.01 is the worst choice (regret 0.476); "
        "diabetes at 0.1 then covers 0.727 of its test points.",
        verdict="partly",
        why="The regression defaults were chosen on regression validation data and coverage is reported, but the choice "
        "flips with early stopping (0.01 with it, 0.3 without), so no regression default was set: 0.1 is close to the "
        "best on both paths (regret 0.063 and 0.202). The library's recipe (early stopping on a validation split) is what "
        "fixes the reported under-coverage on diabetes. The data sizes (222 to 1151 points) do not support a KL weight "
        "that grows with n.",
        sources=(R + "regression-defaults/summary.json", R + "regression-defaults/summary-no-early-stopping.json",
                 "benchmarks/regression_defaults.py", R + "regression-defaults/history/summary-6352cc4.json",
                 R + "regression-defaults/history/summary-169adfc.json",
                 R + "regression-defaults/history/summary-no-early-stopping-70fe079.json"),
    ),
    Claim(
        folder="validation-predictive",
        title="validation-predictive: early stopping on weight draws or on the moment predictive",
        paper="varbnn",
        claim="Issue 63 (training cost): fit's early stopping reads the one-pass moment predictive instead of 8 weight "
        "draws per epoch with no loss of NLL, so that it becomes fit's default (the rule, fixed before the runs: the "
        "moment-stopped model's NLL within 1% of the draw-stopped one's, with and without temperature scaling, for every "
        "data set and family, at fewer training seconds).",
        result="MLP 784-200-200-10, 10,000 training images, 3 seeds, scores on a selection split the test set does not "
        "enter (rerun at 4e61193, one process, 1 thread; the machine also ran short tests beside it, 1-minute load up to "
        "2.1). NLL with TS, weight draws / moments: Fashion-MNIST MeanField 0.3887 / 0.3887, KTied 0.4079 / 0.3902, "
        "IVON 0.3988 / 0.3990; MNIST MeanField 0.1513 / 0.1513, KTied 0.1448 / 0.1415, IVON 0.1403 / 0.1398 (the same "
        "numbers as the two earlier runs). fit's seconds 0.74-0.88x on five of the six, 1.16x for KTied on "
        "Fashion-MNIST (27.0 epochs against 19.3). The earlier runs of the same code path: 0.99x for that pair at "
        "6e6152f (one process, idle machine), 1.19x at b9d8088 (two processes at once).",
        verdict="partly",
        why="The moment predictive stopped at the same epoch in most runs (the same models) and never cost more than "
        "0.16% of NLL; where it stopped elsewhere (KTied) it chose a later, better epoch (-4.35% and -2.29% with TS). "
        "The time part of the rule fails for KTied on Fashion-MNIST on 2 of the 3 runs (0.99x, 1.19x, 1.16x): per "
        "epoch the moment predictive costs less, but it trains about 40% more epochs there to the better model. fit's "
        "default became 'auto' (738048f) on the run that met the rule, before this rerun; we keep it, weighing a 4% "
        "lower NLL against up to 1.19x the seconds in one of six pairs, and state it here rather than call the rule "
        "met. validation_predictive='sample' gives the draws.",
        sources=(R + "validation-predictive/validation-predictive.json", "benchmarks/validation_predictive.py",
                 R + "validation-predictive/history/run-b9d8088-two-processes.json",
                 R + "validation-predictive/history/run-6e6152f-single-process.json"),
    ),
    Claim(
        folder="profiles",
        title="profiles: where the training step goes",
        paper="varbnn",
        claim="A measurement for step-time (torch.profiler): operators, kernel launches and host syncs per step.",
        result="RDP MLP step on the CPU: 3,197 (row) / 5,879 (double) aten ops, about a quarter fewer than before "
        "its sampler and Householder map became single autograd nodes (README); on the H100 1,792 kernel launches and "
        "6 host syncs per RDP row step vs 277 / 0 for MeanField-local (the profiled window's closing synchronisation "
        "included).",
        verdict="n/a",
        why="A measurement, no target.",
        sources=(R + "profiles/README.md", R + "step-time/step_time_summary.json"),
    ),
    Claim(
        folder="uncertainty-mnist",
        title="uncertainty-mnist: every family at the defaults against what users pick instead (MNIST)",
        paper="varbnn",
        claim="Issue 26, LeNet-5 on MNIST, OOD Fashion-MNIST: (a) every family's NLL and ECE below the plain network's; "
        "(b) the best family below temperature scaling and MC dropout on NLL and above both on OOD AUROC; (c) the best "
        "family within 10% of a 5-member ensemble's NLL at <= half its training time.",
        result="20 epochs (the config's own), 3 seeds (uncertainty-mnist/20-epochs), means: NLL / ECE plain 0.0381 / "
        "0.0054; KTied 0.0240 / 0.0045, RDP 0.0253 / 0.0030, Radial 0.0271 / 0.0036, MeanField 0.0289 / 0.0031, Delta "
        "0.0311 / 0.0048; temperature scaling 0.0269, MC dropout 0.0229, Laplace 0.0300, ensemble 0.0177; OOD AUROC "
        "KTied 0.9930, temperature scaling 0.9914, MC dropout 0.9906. "
        "5 epochs (a CPU budget), 3 seeds. NLL / ECE: plain 0.0288 / "
        "0.0025; MeanField 0.0267 / 0.0016; Radial 0.0306, KTied 0.0340, RDP 0.0317, Delta 0.0306; temperature "
        "scaling 0.0297, MC dropout 0.0256, ensemble 0.0214. OOD AUROC (entropy): MeanField 0.9930, plain 0.9878, "
        "ensemble 0.9931.",
        verdict="partly",
        why="At 20 epochs, by the verdict rule on the 3 seeds: goal (a) holds on NLL for every family and on ECE for "
        "all but Delta (its ECE below plain's on 2 of 3 seeds, within one standard error); 'every family below plain' "
        "holds on the 3-seed means only: on seed 1 MeanField's NLL 0.0336 and Delta's 0.0335 are above plain's 0.0323. "
        "(b) does not hold: KTied (the best family on the means) is below MC dropout's NLL on 1 of 3 seeds, and the "
        "best family of each seed (KTied 0.0211, RDP 0.0247, MeanField 0.0229) is below MC dropout's on seeds 0 and 2 "
        "but not on seed 1 (RDP 0.0247 against 0.0221); KTied is above MC dropout on OOD AUROC on 3 of 3 seeds. (c) "
        "does not hold (KTied's NLL 0.0240 against the ensemble's 0.0177, more than 10% above it, at 1465 s of "
        "training against 5259 s). "
        "At 5 epochs only MeanField beats the plain network on both NLL and ECE: the plain network is hardly overfit "
        "(ECE 0.0025) and temperature scaling makes its test NLL worse.",
        sources=(J, R + "uncertainty-mnist/uncertainty-mnist.md", R + "uncertainty-mnist/20-epochs/uncertainty-mnist.md"),
        comparisons=(
        Comparison(
            "KTied vs plain, NLL (goal a)",
            R + "uncertainty-mnist/20-epochs/uncertainty-mnist_runs.jsonl",
            (("variant", "KTied"),),
            (("variant", "plain"),),
            "scores/0/1/nll",
            better="lower",
        ),
        Comparison(
            "KTied vs plain, ECE (goal a)",
            R + "uncertainty-mnist/20-epochs/uncertainty-mnist_runs.jsonl",
            (("variant", "KTied"),),
            (("variant", "plain"),),
            "scores/0/1/ece",
            better="lower",
        ),
        Comparison(
            "RDP vs plain, NLL (goal a)",
            R + "uncertainty-mnist/20-epochs/uncertainty-mnist_runs.jsonl",
            (("variant", "RDP"),),
            (("variant", "plain"),),
            "scores/0/1/nll",
            better="lower",
        ),
        Comparison(
            "RDP vs plain, ECE (goal a)",
            R + "uncertainty-mnist/20-epochs/uncertainty-mnist_runs.jsonl",
            (("variant", "RDP"),),
            (("variant", "plain"),),
            "scores/0/1/ece",
            better="lower",
        ),
        Comparison(
            "Radial vs plain, NLL (goal a)",
            R + "uncertainty-mnist/20-epochs/uncertainty-mnist_runs.jsonl",
            (("variant", "Radial"),),
            (("variant", "plain"),),
            "scores/0/1/nll",
            better="lower",
        ),
        Comparison(
            "Radial vs plain, ECE (goal a)",
            R + "uncertainty-mnist/20-epochs/uncertainty-mnist_runs.jsonl",
            (("variant", "Radial"),),
            (("variant", "plain"),),
            "scores/0/1/ece",
            better="lower",
        ),
        Comparison(
            "MeanField vs plain, NLL (goal a)",
            R + "uncertainty-mnist/20-epochs/uncertainty-mnist_runs.jsonl",
            (("variant", "MeanField"),),
            (("variant", "plain"),),
            "scores/0/1/nll",
            better="lower",
        ),
        Comparison(
            "MeanField vs plain, ECE (goal a)",
            R + "uncertainty-mnist/20-epochs/uncertainty-mnist_runs.jsonl",
            (("variant", "MeanField"),),
            (("variant", "plain"),),
            "scores/0/1/ece",
            better="lower",
        ),
        Comparison(
            "Delta (MAP) vs plain, NLL (goal a)",
            R + "uncertainty-mnist/20-epochs/uncertainty-mnist_runs.jsonl",
            (("variant", "Delta (MAP)"),),
            (("variant", "plain"),),
            "scores/0/1/nll",
            better="lower",
        ),
        Comparison(
            "Delta (MAP) vs plain, ECE (goal a)",
            R + "uncertainty-mnist/20-epochs/uncertainty-mnist_runs.jsonl",
            (("variant", "Delta (MAP)"),),
            (("variant", "plain"),),
            "scores/0/1/ece",
            better="lower",
        ),
        Comparison(
            "KTied (the best family on the means) vs MC dropout, NLL (goal b)",
            R + "uncertainty-mnist/20-epochs/uncertainty-mnist_runs.jsonl",
            (("variant", "KTied"),),
            (("variant", "MC dropout (p = 0.1)"),),
            "scores/0/1/nll",
            better="lower",
        ),
        Comparison(
            "KTied vs plain + temperature scaling, NLL (goal b)",
            R + "uncertainty-mnist/20-epochs/uncertainty-mnist_runs.jsonl",
            (("variant", "KTied"),),
            (("variant", "plain + temperature scaling"),),
            "scores/0/1/nll",
            better="lower",
        ),
        Comparison(
            "KTied vs MC dropout, OOD AUROC (entropy) (goal b)",
            R + "uncertainty-mnist/20-epochs/uncertainty-mnist_runs.jsonl",
            (("variant", "KTied"),),
            (("variant", "MC dropout (p = 0.1)"),),
            "scores/0/1/ood_auroc_entropy",
        ),
        ),
    ),
    Claim(
        folder="uncertainty-fmnist",
        title="uncertainty-fmnist: every family at the defaults against what users pick instead (Fashion-MNIST)",
        paper="varbnn",
        claim="Issue 26's goals (a)-(c) on Fashion-MNIST with LeNet-5, OOD MNIST.",
        result="20 epochs (the config's own), 3 seeds (uncertainty-fmnist/20-epochs; plain, MC dropout and the "
        "Gaussian-form families on an H200, RDP and the other baselines on the CPU), means, NLL / ECE: plain 0.3624 / "
        "0.0528; KTied 0.2516 / 0.0081, RDP 0.2902 / 0.0309, MeanField 0.2932 / 0.0367, Radial 0.3072 / 0.0389, Delta "
        "0.3300 / 0.0464; temperature scaling 0.2605, MC dropout 0.2352, Laplace 0.3205, ensemble 0.2205. OOD AUROC "
        "(entropy): Laplace 0.8997, ensemble 0.8503, KTied 0.8138, MC dropout 0.7577, plain 0.6425. "
        "5 epochs, 3 seeds. NLL / ECE: plain 0.2878 / 0.0094; Delta 0.2892, Radial 0.2923 / 0.0096, MeanField "
        "0.2932 / 0.0118, RDP 0.2959, KTied 0.2962 / 0.0081; temperature scaling 0.2871, MC dropout 0.2771, Laplace "
        "0.2864, ensemble 0.2555. OOD AUROC (entropy): KTied 0.7727, Laplace 0.7722, MC dropout 0.7634, plain 0.6990.",
        verdict="partly",
        why="At 20 epochs, by the verdict rule on the 3 seeds: goal (a) holds, every family below the overfit plain "
        "network on NLL and ECE on 3 of 3 seeds; (b) holds but for MC dropout's NLL: KTied (the best family on every "
        "seed) is below temperature scaling on NLL on 3 of 3 seeds and above it and MC dropout on OOD AUROC (3 of 3 and "
        "2 of 3 seeds, each beyond one standard error), but above MC dropout's NLL on 3 of 3 seeds. (c) does not hold, "
        "judged on the means (a ratio, which the rule's per-seed differences do not express): KTied's NLL 0.2516 is "
        "more than a tenth above the ensemble's 0.2205; the times come from two devices and are not compared. "
        "At 5 epochs (shown, not judged by the rule), with the third seed (whose plain network is the best of the "
        "three, NLL 0.2710) no family is below the plain network's NLL on the means; the best family (Delta, 0.2892) "
        "is above temperature scaling and MC dropout on NLL and more than a tenth above the ensemble's 0.2555, at 102 s "
        "of training against the ensemble's 512 s. KTied's OOD AUROC matches Laplace's.",
        sources=(J, R + "uncertainty-fmnist/uncertainty-fmnist.md", R + "uncertainty-fmnist/20-epochs/uncertainty-fmnist.md"),
        comparisons=tuple(
            Comparison(
                f"{family} vs plain, {name} (goal a)",
                R + "uncertainty-fmnist/20-epochs/uncertainty-fmnist_runs.jsonl",
                (("variant", family),),
                (("variant", "plain"),),
                f"scores/0/1/{metric}",
                better="lower",
            )
            for family in ("KTied", "RDP", "MeanField", "Radial", "Delta (MAP)")
            for name, metric in (("NLL", "nll"), ("ECE", "ece"))
        )
        + tuple(
            Comparison(
                f"KTied (the best family on every seed) vs {other}, {name} (goal b)",
                R + "uncertainty-fmnist/20-epochs/uncertainty-fmnist_runs.jsonl",
                (("variant", "KTied"),),
                (("variant", other),),
                f"scores/0/1/{metric}",
                better=better,
            )
            for name, metric, better in (("NLL", "nll", "lower"), ("OOD AUROC (entropy)", "ood_auroc_entropy", "higher"))
            for other in ("MC dropout (p = 0.1)", "plain + temperature scaling")
        ),
    ),
    Claim(
        folder="uncertainty-fmnist-converted",
        title="uncertainty-fmnist-converted: the user's path, a trained network converted and trained 2 more epochs",
        paper="varbnn",
        claim="Issue 26's goals (a)-(c) on Fashion-MNIST when each family starts from the trained plain network "
        "(bayesianize(pretrained=True), 2 more epochs at the family's defaults).",
        result="5 + 2 epochs, 3 seeds. NLL / ECE: plain 0.2878 / 0.0094; KTied 0.2685 / 0.0067, MeanField 0.2726 / "
        "0.0131, Delta 0.2781, Radial 0.2798, RDP 0.2904 / 0.0096 (below its first run's NLL on 3 of 3 seeds, by 0.0266 "
        "on average: that run's converted directions started at the from-scratch concentration, history/); "
        "temperature scaling 0.2871, MC dropout 0.2771, Laplace 0.2864. "
        "OOD AUROC (entropy): KTied 0.7155, MC dropout 0.7634, Laplace 0.7722, plain 0.6990.",
        verdict="partly",
        why="By the verdict rule on the 3 seeds: converted, KTied is below the plain network on NLL and ECE and below "
        "temperature scaling and MC dropout on NLL, each on 3 of 3 seeds. Not met: (a) for MeanField, Radial and Delta, "
        "whose ECE is above plain's (on 3, 2 and 3 of 3 seeds; their NLL is below it), and RDP, below plain on 2 of 3 "
        "seeds on NLL and on ECE, within one standard error; (b) on OOD AUROC: MC dropout's is above KTied's on 3 of 3 "
        "seeds, and temperature scaling's below it on 2 of 3, within one standard error. Goal (c), judged on the means "
        "across the two pages (a ratio, which the rule's per-seed differences do not express), holds: KTied's NLL "
        "0.2685 is within a tenth of the 5-member ensemble's on uncertainty-fmnist (0.2555), and its training, the "
        "plain network's 5 epochs included, took 210 s against the ensemble's 512 s there (the same CPU, one thread). "
        "The control, the plain network trained the same 2 epochs more without converting it, reaches NLL 0.2796 and "
        "ECE 0.0197 with a lower OOD AUROC (0.6486); KTied and MeanField are below it on NLL and ECE on 3 of 3 seeds: "
        "their gains are not the extra training's.",
        sources=(J, R + "uncertainty-fmnist-converted/uncertainty-fmnist-converted.md",
                 R + "uncertainty-fmnist-converted/history/uncertainty-fmnist-converted_rdp-init-0.95.md",
                 R + "uncertainty-fmnist/uncertainty-fmnist.md", R + "uncertainty-fmnist/uncertainty-fmnist.json"),
        comparisons=tuple(
            Comparison(
                f"{family}, converted vs plain, {name} (goal a)",
                R + "uncertainty-fmnist-converted/uncertainty-fmnist-converted_runs.jsonl",
                (("variant", f"{family}, converted"),),
                (("variant", "plain"),),
                f"scores/0/1/{metric}",
                better="lower",
            )
            for family in ("KTied", "MeanField", "Delta (MAP)", "Radial", "RDP")
            for name, metric in (("NLL", "nll"), ("ECE", "ece"))
        )
        + tuple(
            Comparison(
                f"KTied, converted (the best family on the means) vs {other}, {name} (goal b)",
                R + "uncertainty-fmnist-converted/uncertainty-fmnist-converted_runs.jsonl",
                (("variant", "KTied, converted"),),
                (("variant", other),),
                f"scores/0/1/{metric}",
                better=better,
            )
            for name, metric, better in (("NLL", "nll", "lower"), ("OOD AUROC (entropy)", "ood_auroc_entropy", "higher"))
            for other in ("MC dropout (p = 0.1)", "plain + temperature scaling")
        )
        + tuple(
            Comparison(
                f"{family}, converted vs the plain network trained 2 more epochs, {name} (the control)",
                R + "uncertainty-fmnist-converted/uncertainty-fmnist-converted_runs.jsonl",
                (("variant", f"{family}, converted"),),
                (("variant", "plain, 2 more epochs"),),
                f"scores/0/1/{metric}",
                better="lower",
                decides=False,
            )
            for family in ("KTied", "MeanField")
            for name, metric in (("NLL", "nll"), ("ECE", "ece"))
        )
        + (
            Comparison(
                "RDP, converted at init_resultant 0.999 (this page) vs at 0.95 (history/), NLL",
                R + "uncertainty-fmnist-converted/**/uncertainty-fmnist-converted*_runs.jsonl",
                (("variant", "RDP, converted"), ("commit", "0da35f517184368baa9bacfd47b1d1875a0f7fba")),
                (("variant", "RDP, converted"), ("commit", "4a5b32a8235e61fb9056c391bff0890039a1c41e+dirty")),
                "scores/0/1/nll",
                better="lower",
                decides=False,
            ),
        ),
    ),
    Claim(
        folder="uncertainty-mnist-converted",
        title="uncertainty-mnist-converted: the user's path on MNIST, a trained network converted and trained 2 more epochs",
        paper="varbnn",
        claim="Issue 26's goals (a)-(c) on MNIST when each family starts from the trained plain network "
        "(bayesianize(pretrained=True), 2 more epochs at the family's defaults).",
        result="5 + 2 epochs, 3 seeds. NLL / ECE: plain 0.0288 / 0.0025, the plain network trained 2 more epochs 0.0263 / "
        "0.0024; MeanField 0.0255 / 0.0024, RDP 0.0259 / 0.0023, Delta 0.0277, Radial 0.0292, KTied 0.0295; temperature "
        "scaling 0.0297, MC dropout 0.0256, Laplace 0.0298; the 5-member ensemble 0.0214 (uncertainty-mnist). OOD AUROC "
        "(entropy): RDP 0.9919, temperature scaling 0.9899, MC dropout 0.9897, plain 0.9878.",
        verdict="partly",
        why="By the verdict rule on the 3 seeds almost nothing is settled either way: of goal (a)'s ten comparisons only "
        "RDP's NLL below plain's holds (2 of 3 seeds, beyond one standard error); every other family's NLL and ECE goes "
        "either way against plain's over the seeds, within one standard error (on seed 0 all five families' NLL is above "
        "plain's 0.0258, on seed 1, whose plain network is the worst at 0.0343, all five are below it). On the means "
        "MeanField and RDP, converted, are below the plain network on NLL and ECE and below temperature scaling on NLL, "
        "and RDP has the highest OOD AUROC of all but the ensemble (above MC dropout's on 3 of 3 seeds); Radial and KTied "
        "are above plain's NLL and Delta above its ECE. (b): MeanField, the best family on the means, is below MC "
        "dropout and temperature scaling on NLL on 2 of 3 seeds and above them on OOD AUROC on 1 of 3, each within one "
        "standard error. (c) does not hold, judged on the means (a ratio, which the rule's per-seed differences do not "
        "express): MeanField's NLL 0.0255 is more than a tenth above the ensemble's 0.0214.",
        sources=(J, R + "uncertainty-mnist-converted/uncertainty-mnist-converted.md",
                 R + "uncertainty-mnist/uncertainty-mnist.md", R + "uncertainty-mnist/uncertainty-mnist.json"),
        comparisons=tuple(
            Comparison(
                f"{family}, converted vs plain, {name} (goal a)",
                R + "uncertainty-mnist-converted/uncertainty-mnist-converted_runs.jsonl",
                (("variant", f"{family}, converted"),),
                (("variant", "plain"),),
                f"scores/0/1/{metric}",
                better="lower",
            )
            for family in ("MeanField", "RDP", "Delta (MAP)", "Radial", "KTied")
            for name, metric in (("NLL", "nll"), ("ECE", "ece"))
        )
        + tuple(
            Comparison(
                f"MeanField, converted (the best family on the means) vs {other}, {name} (goal b)",
                R + "uncertainty-mnist-converted/uncertainty-mnist-converted_runs.jsonl",
                (("variant", "MeanField, converted"),),
                (("variant", other),),
                f"scores/0/1/{metric}",
                better=better,
            )
            for name, metric, better in (("NLL", "nll", "lower"), ("OOD AUROC (entropy)", "ood_auroc_entropy", "higher"))
            for other in ("MC dropout (p = 0.1)", "plain + temperature scaling")
        )
        + (
            Comparison(
                "RDP, converted vs MC dropout, OOD AUROC (entropy)",
                R + "uncertainty-mnist-converted/uncertainty-mnist-converted_runs.jsonl",
                (("variant", "RDP, converted"),),
                (("variant", "MC dropout (p = 0.1)"),),
                "scores/0/1/ood_auroc_entropy",
                decides=False,
            ),
        ),
    ),
)


NOT_ATTEMPTED: tuple[tuple[str, str], ...] = (
    ("graves", "Table 1 and 2 on TIMIT with the paper's LSTM (phoneme error rates): the TIMIT corpus is licensed and "
     "not available offline here; MNIST and a row LSTM stand in (graves-mnist, graves-prune; the LSTM configs are not "
     "run)."),
    ("radial", "Figure 7 on the Kaggle diabetic-retinopathy images (256x256): that data cannot be had here; the "
     "retina pages use RetinaMNIST (MedMNIST's 28x28 fundus images, 1,080 training images), a real but far smaller "
     "stand-in, so neither the paper's AUROC levels nor its network size are compared."),
    ("ktied", "The CIFAR-10/100 CNN and ResNet-18 results and the IMDB LSTM: the datasets are not available offline "
     "here and the CIFAR runs are GPU-sized; ktied-lstm puts MNIST rows through an LSTM instead of IMDB reviews."),
    ("rdp", "The Year Prediction MSD set of Table 1 (varbnn's UCI loader and its offline data do not hold "
     "it, and it is by far the largest set) and the "
     "claim that RDP beats VMG and the other baselines on UCI: the published RDP column's log-likelihood log-sum-exps "
     "over test points instead of weight draws (lab/varbnn_lab/uci.py), so its numbers are not comparable and are "
     "not compared; the uci pages compare with the best of VI/PBP/Dropout/VMG instead."),
)
"""The seed papers' claims not attempted, with the reason (rendered on the results index)."""

NO_JSON = frozenset({"profiles"})
"""Folders without a result JSON (text profiles and their README): rendered, but exempt from the JSON rule."""

_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?")


# --- staleness -------------------------------------------------------------------------------------------------------


LIBRARY_PATHS = (
    "src/varbnn/families",
    "src/varbnn/nn",
    "src/varbnn/objectives.py",
    "src/varbnn/divergence.py",
    "src/varbnn/training",
    "src/varbnn/train.py",
    "src/varbnn/priors.py",
    "src/varbnn/distributions",
)
"""The library code a result depends on. A folder's page is stale when a commit not in its runs' history (one that
came after them) changed a file under these paths, or when a run's commit is marked ``+dirty`` (its code is
unknown). Changes elsewhere (the lab, the CLI, plots, docs) do not count: they change how a run is set up or shown,
and its record names its own protocol."""

IVON_FOLDERS = (
    "ivon", "moment-predictive", "uci-learned", "uncertainty-cpu", "uncertainty-fmnist", "uncertainty-mnist",
    "validation-predictive",
)
"""The folders whose experiments train with :class:`varbnn.optim.IVON` (the only importers of ``src/varbnn/optim``:
``lab/varbnn_lab/uci_learned.py``, the lab runner's ``optimizer="ivon"`` variants of the uncertainty configs, and
the benchmark scripts ``ivon_step``, ``ivon_noise_trace``, ``ivon_regression_recipe``, ``moment_predictive``,
``uncertainty_cpu``, ``validation_predictive`` and ``finetune_cpu``; a test checks that no other lab module or benchmark
script uses it)."""

FOLDER_LIBRARY_PATHS: dict[str, tuple[str, ...]] = {
    "finetune-cpu": ("src/varbnn/adapters", "src/varbnn/laplace.py", "src/varbnn/optim"),
    **{folder: ("src/varbnn/optim",) for folder in IVON_FOLDERS},
}
"""Library code that only some folders' runs use, watched for those folders on top of :data:`LIBRARY_PATHS`: the
adapters and the last-layer Laplace (the fine-tuning benchmark and its studies alone call them) and the IVON optimizer
(:data:`IVON_FOLDERS` and the fine-tuning benchmark)."""


def _watchers() -> dict[tuple[str, ...], list[str]]:
    """The paths of :data:`FOLDER_LIBRARY_PATHS` grouped by the folders that watch them (for the rule's text)."""
    folders: dict[str, list[str]] = {}
    for folder, paths in FOLDER_LIBRARY_PATHS.items():
        for path in paths:
            folders.setdefault(path, []).append(folder)
    grouped: dict[tuple[str, ...], list[str]] = {}
    for path, watching in folders.items():
        grouped.setdefault(tuple(watching), []).append(path)
    return grouped


def library_paths(folder: str) -> tuple[str, ...]:
    """The library paths whose changes make ``folder``'s runs stale: :data:`LIBRARY_PATHS` and the folder's
    :data:`FOLDER_LIBRARY_PATHS`."""
    return LIBRARY_PATHS + FOLDER_LIBRARY_PATHS.get(folder, ())


STALE_RULE = (
    "A page is **stale** when the library code its numbers came from has changed since: some commit after the runs' "
    "commit (one not among that commit's ancestors) changed a file under " + ", ".join(f"`{p}`" for p in LIBRARY_PATHS)
    + ", or a run's commit is marked `+dirty` (its code is unknown). The runs' commits are those the folder's run "
    "records name (the runs files, the JSON's `run_commits` and `records`), else the JSON's own `commit`; `history/` "
    "is left out. Library code that only some experiments use is watched for their folders too: "
    + "; ".join(f"{', '.join(f'`{p}`' for p in paths)} for {', '.join(f'`{f}`' for f in folders)}"
                for folders, paths in _watchers().items())
    + ". A commit that changed only comments, docstrings or type-checker comments of those files (the same "
    "Python syntax tree, docstrings left out) does not count. Where some of a folder's result files are current and "
    "others stale, the banner lists each file with "
    "its commits and state. Stale means \"rerun to be sure\", not \"wrong\"."
)


@dataclass(frozen=True)
class Staleness:
    """A folder's runs' commits (short hashes, ``+dirty`` kept), whether it is stale, the first library commit after
    them (None: not stale, or stale by a dirty commit only), and the commits git does not know (shallow history)."""

    commits: tuple[str, ...]
    stale: bool
    since: str | None
    unknown: tuple[str, ...] = ()


@dataclass(frozen=True)
class _History:
    order: dict[str, int]  # full hash -> position in `git rev-list HEAD` (0: HEAD)
    parents: dict[str, tuple[str, ...]]
    touching: tuple[str, ...]  # commits that changed LIBRARY_PATHS, newest first


_HISTORY: dict[Path, _History | None] = {}
_TOUCHING: dict[tuple[Path, tuple[str, ...]], tuple[str, ...] | None] = {}


def git_history(root: Path | None = None) -> _History | None:
    """The commit graph of HEAD and the commits that changed :data:`LIBRARY_PATHS` (two git calls, cached per
    repository; None without git or outside a repository)."""
    root = ROOT if root is None else root
    if root in _HISTORY:
        return _HISTORY[root]
    history: _History | None = None
    try:
        graph = subprocess.run(["git", "rev-list", "--parents", "HEAD"], cwd=root, capture_output=True, text=True,
                               check=True, timeout=30).stdout.split("\n")  # fmt: skip
        touching = _commits_touching(root, LIBRARY_PATHS)
        order, parents = {}, {}
        for i, line in enumerate(row for row in graph if row.strip()):
            commit, *rest = line.split()
            order[commit], parents[commit] = i, tuple(rest)
        history = _History(order, parents, tuple(touching))
    except (OSError, subprocess.SubprocessError):
        history = None
    _HISTORY[root] = history
    return history


def _touching(history: _History, root: Path, paths: tuple[str, ...]) -> tuple[str, ...]:
    """The commits that changed ``paths``, newest first: the history's own for :data:`LIBRARY_PATHS`, else one git call
    (cached per repository and paths; none where git fails)."""
    if paths == LIBRARY_PATHS:
        return history.touching
    key = (root, paths)
    if key not in _TOUCHING:
        try:
            _TOUCHING[key] = tuple(_commits_touching(root, paths))
        except (OSError, subprocess.SubprocessError):
            _TOUCHING[key] = None
    return _TOUCHING[key] or ()


def _commits_touching(root: Path, paths: Sequence[str]) -> list[str]:
    """``git log`` of HEAD limited to ``paths``: the full hashes of the commits that changed them, newest first (git's
    errors raised)."""
    return subprocess.run(["git", "log", "--full-history", "--no-merges", "--format=%H", "HEAD", "--", *paths], cwd=root,
                          capture_output=True, text=True, check=True, timeout=30).stdout.split()  # fmt: skip


def _ancestors(history: _History, commit: str) -> set[str]:
    seen, todo = set(), [commit]
    while todo:
        c = todo.pop()
        if c not in seen:
            seen.add(c)
            todo += history.parents.get(c, ())
    return seen


def run_commits(folder: Path) -> list[str]:
    """The commits a results folder's runs name: every ``commit`` of its runs files (``*runs*.jsonl``) and of its
    JSONs' ``records``, and their ``run_commits``; where there are none, the JSONs' own ``commit``. ``history/`` is
    left out."""
    runs: set[str] = set()
    own: set[str] = set()
    for path in sorted(folder.rglob("*.json*")):
        if "history" in path.relative_to(folder).parts or path.suffix not in (".json", ".jsonl"):
            continue
        try:
            if path.suffix == ".jsonl":
                runs |= {str(r["commit"]) for r in _jsonl(path) if isinstance(r, dict) and r.get("commit")}
                continue
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        if data.get("commit"):
            own.add(str(data["commit"]))
        runs |= {str(c) for c in (data.get("run_commits") or [])}
        records = data.get("records")
        if isinstance(records, list):
            runs |= {str(r["commit"]) for r in records if isinstance(r, dict) and r.get("commit")}
    return sorted(runs or own)


def file_commits(path: Path) -> list[str]:
    """The commits one result JSON names: its ``records``' and ``run_commits``, else its own ``commit`` (a
    comma-separated ``commit`` names several); [] for a file that is not such a JSON."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict):
        return []
    runs = {str(c) for c in (data.get("run_commits") or [])}
    records = data.get("records")
    if isinstance(records, list):
        runs |= {str(r["commit"]) for r in records if isinstance(r, dict) and r.get("commit")}
    if runs:
        return sorted(runs)
    own = data.get("commit")
    return sorted({c.strip() for c in str(own).split(",") if c.strip()}) if own else []


def file_staleness(folder: str) -> list[tuple[str, Staleness]]:
    """Each result JSON of a folder (``history/`` left out) with the staleness of the commits it names
    (:func:`file_commits`): what the page's banner breaks down when its files differ."""
    out = []
    for path in sorted((RESULTS / folder).rglob("*.json")):
        if "history" in path.relative_to(RESULTS / folder).parts:
            continue
        commits = file_commits(path)
        info = staleness(commits, paths=library_paths(folder)) if commits else None
        if info is not None:
            out.append((str(path.relative_to(RESULTS / folder)), info))
    return out


def _jsonl(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


_NEUTRAL: dict[tuple[Path, str, tuple[str, ...]], bool] = {}


def _code_of(source: str) -> str | None:
    """What runs of a Python source: its AST dump with docstrings (every bare string statement) left out; comments,
    ``# type: ignore`` included, are not in an AST. None where it does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block:
                kept = [
                    n for n in block
                    if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str))
                ]  # fmt: skip
                setattr(node, name, kept or [ast.Pass()])
    return ast.dump(tree)


def neutral_commit(commit: str, root: Path | None = None, paths: tuple[str, ...] = LIBRARY_PATHS) -> bool:
    """Whether ``commit`` left the library code that runs as it was: each file under ``paths`` (default
    :data:`LIBRARY_PATHS`) it changed
    is a modified ``.py`` file whose AST, docstrings left out (:func:`_code_of`), is the same before and after (a
    change of comments, docstrings or ``# type: ignore`` comments only). Added, deleted or renamed files, other files
    and anything git cannot answer count as changes. Cached per repository, commit and paths."""
    root = ROOT if root is None else root
    key = (root, commit, paths)
    if key not in _NEUTRAL:
        neutral = False
        try:
            listing = subprocess.run(["git", "diff-tree", "--no-commit-id", "-r", "--name-status", commit, "--",
                                      *paths], cwd=root, capture_output=True, text=True, check=True,
                                     timeout=30).stdout.splitlines()  # fmt: skip
            changes = [line.split("\t") for line in listing if line.strip()]
            neutral = bool(changes)
            for change in changes:
                if len(change) != 2 or change[0] != "M" or not change[1].endswith(".py"):
                    neutral = False
                    break
                before, after = (subprocess.run(["git", "show", f"{rev}:{change[1]}"], cwd=root, capture_output=True,
                                                text=True, check=True, timeout=30).stdout
                                 for rev in (f"{commit}^", commit))  # fmt: skip
                code = _code_of(after)
                if code is None or code != _code_of(before):
                    neutral = False
                    break
        except (OSError, subprocess.SubprocessError):
            neutral = False
        _NEUTRAL[key] = neutral
    return _NEUTRAL[key]


def staleness(commits: Sequence[str], root: Path | None = None, paths: tuple[str, ...] = LIBRARY_PATHS) -> Staleness | None:
    """Whether results run at ``commits`` are stale under :data:`STALE_RULE` (None without git); ``paths``: the library
    code watched (a folder's :func:`library_paths`; default :data:`LIBRARY_PATHS`)."""
    history = git_history(root)
    if history is None:
        return None
    touching = _touching(history, ROOT if root is None else root, paths)
    short = tuple(sorted({c[:7] + ("+dirty" if c.endswith("+dirty") else "") for c in commits}))
    dirty = any(c.endswith("+dirty") for c in commits)
    later: set[str] = set()
    unknown = []
    for commit in {c.removesuffix("+dirty") for c in commits}:
        full = [h for h in history.order if h.startswith(commit)] if len(commit) >= 7 else []
        if len(full) != 1:
            unknown.append(commit[:7])
            continue
        ancestors = _ancestors(history, full[0])
        later |= {t for t in touching if t not in ancestors and not neutral_commit(t, root, paths)}
    since = max(later, key=lambda c: history.order[c])[:7] if later else None  # the oldest of them
    return Staleness(short, bool(later) or dirty, since, tuple(sorted(unknown)))


def folder_staleness(folder: str) -> Staleness | None:
    """:func:`staleness` of a results folder's :func:`run_commits` (None without git, or without commits)."""
    commits = run_commits(RESULTS / folder)
    return staleness(commits, paths=library_paths(folder)) if commits else None


def stale_runs(folder: str) -> list[str]:
    """The ``stale_runs`` entries of the folder's result JSONs (written by the runner beside ``code_hash``), as
    ``file: entry`` lines."""
    out = []
    for path in sorted((RESULTS / folder).rglob("*.json")):
        if "history" in path.relative_to(RESULTS / folder).parts:
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("stale_runs"):
            entries = data["stale_runs"]
            items = entries if isinstance(entries, list) else [entries]
            out += [f"{path.relative_to(RESULTS).as_posix()}: {json.dumps(e) if not isinstance(e, str) else e}" for e in items]
    return out


# --- numbers of the claims --------------------------------------------------------------------------------------------


DATA_SUFFIXES = (".json", ".jsonl", ".csv")
"""The files a claim's measured numbers must come from: what a committed command wrote, never a hand-written page."""

_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")
_REFERENCE = re.compile(r"\b(?:issues?|[Tt]ables?|[Ff]igures?|[Ff]ig\.|sections?|[Ee]q\.)\s+\d+(?:\s*(?:-|and|,)\s*\d+)*")


def claim_numbers(text: str) -> list[tuple[str, bool]]:
    """The numbers written in a claim's text, each with whether a ``%`` follows it; commit hashes and references to
    issues, tables, figures and sections are not numbers."""
    text = _REFERENCE.sub(" ", _HASH.sub(" ", text))
    return [(m.group(0).rstrip(","), text[m.end() : m.end() + 1] == "%") for m in _NUMBER.finditer(text)]


def data_values(path: Path) -> list[float]:
    """Every number of a data file: a JSON's or JSON-lines file's numeric values and the numbers written in its
    strings (a command's ``--seeds 0,1``, a device's ``2 threads``), a CSV's numbers; as absolute values."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".csv":
        return [abs(_to_float(n)) for n in _NUMBER.findall(_HASH.sub(" ", text))]
    out: list[float] = []

    def walk(value: Any) -> None:
        if isinstance(value, bool) or value is None:
            return
        if isinstance(value, (int, float)):
            if math.isfinite(value):
                out.append(abs(float(value)))
        elif isinstance(value, str):
            out.extend(abs(_to_float(n)) for n in _NUMBER.findall(_HASH.sub(" ", value)))
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(key)
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    lines = text.splitlines() if path.suffix == ".jsonl" else [text]
    for line in lines:
        if line.strip():
            walk(json.loads(line))
    return out


def claim_data_files(claim: Claim) -> list[Path]:
    """The data files that back a claim's numbers: its data sources and every ``.json``, ``.jsonl`` and ``.csv`` of
    its folder (variants, studies and history included), each written by a committed command."""
    files = [ROOT / s for s in claim.sources if Path(s).suffix in DATA_SUFFIXES]
    if claim.folder is not None and (RESULTS / claim.folder).is_dir():
        files += sorted(p for p in (RESULTS / claim.folder).rglob("*") if p.suffix in DATA_SUFFIXES and p.is_file())
    return list(dict.fromkeys(files))


def _to_float(written: str) -> float:
    return float(written.replace(",", ""))


def number_matches(written: str, values: Sequence[float], percent: bool = False) -> bool:
    """Whether the number ``written`` (as a claim writes it: ``0.0073``, ``1,273``, ``7.7e-15``) is some value of
    ``values`` (sorted absolute values) rounded to the digits written: within half a unit of its last digit (``0.0073``
    matches 0.00726 and 0.00734, not 0.0075). With ``percent`` (a ``%`` follows), a value 100 times smaller matches
    too (``1.76%`` matches 0.0176)."""
    number = written.replace(",", "")
    mantissa, _, exponent = number.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    target = float(number)
    half = 0.5 * 10.0 ** (-decimals + (int(exponent) if exponent else 0))
    for scale in (1.0, 100.0) if percent else (1.0,):
        low, high = (target - half) / scale, (target + half) / scale
        i = bisect.bisect_left(values, low * (1 - 1e-12))
        if i < len(values) and values[i] <= high * (1 + 1e-12):
            return True
    return False


# --- reading the folders -----------------------------------------------------------------------------------------------


def experiment_folders() -> list[str]:
    """The experiment folders of ``benchmarks/results/`` (every directory but hidden ones such as ``.checkpoints``, and
    but one that holds nothing else yet: a first run still training, whose page comes when it ends)."""
    return sorted(
        p.name
        for p in RESULTS.iterdir()
        if p.is_dir() and not p.name.startswith((".", "_")) and any(not c.name.startswith(".") for c in p.iterdir())
    )


def claims_by_folder() -> dict[str, Claim]:
    return {c.folder: c for c in CLAIMS if c.folder is not None}


def current_pages(folder: Path) -> list[Path]:
    """The folder's current pages: its ``*.md`` files (``README.md`` only where there is no other)."""
    pages = sorted(p for p in folder.glob("*.md") if p.name != "README.md")
    return pages or sorted(folder.glob("README.md"))


def variant_folders(folder: Path) -> list[Path]:
    """Sub-folders other than ``history/`` and ``studies/`` that hold a page: variants of the experiment (e.g.
    ``uci/200-epochs``)."""
    return sorted(
        p for p in folder.iterdir() if p.is_dir() and p.name not in ("history", STUDIES) and list(p.glob("*.md"))
    )


def study_pages(folder: Path) -> list[Path]:
    """The pages of the folder's ``studies/`` (A/B runs, profiles, micro-benchmarks behind its tables), without its
    index ``studies/README.md``."""
    studies = folder / STUDIES
    return sorted(p for p in studies.glob("*.md") if p.name != "README.md") if studies.is_dir() else []


def history_pages(folder: Path) -> list[Path]:
    history = folder / "history"
    return sorted(history.glob("*.md")) if history.is_dir() else []


def result_json(page: Path) -> Path | None:
    """The JSON beside a page (same stem), or None."""
    path = page.with_suffix(".json")
    return path if path.exists() else None


def provenance(json_path: Path) -> dict[str, Any]:
    """command, commit, device, seconds of a result JSON (and, where the runs were trained by earlier invocations,
    their commits, devices and training seconds)."""
    data = json.loads(json_path.read_text())
    out = {key: data.get(key) for key in ("command", "commit", "device", "seconds")}
    for key in ("run_commits", "run_devices"):
        value = data.get(key)
        if value:
            out[key] = list(value)  # a list, or the keys of a {commit: runs} dict
    if isinstance(data.get("train_seconds"), (int, float)):
        out["train_seconds"] = data["train_seconds"]
    return out


# --- rendering -----------------------------------------------------------------------------------------------------------


def _anchor(path: Path) -> str:
    """The section id of an included page: its path under ``benchmarks/results/`` without ``.md``, slugged."""
    rel = path.relative_to(RESULTS).with_suffix("").as_posix()
    return re.sub(r"[^A-Za-z0-9_-]+", "-", rel).strip("-").lower()


def _page_of(path: Path) -> str:
    """The generated page (relative to ``results/``) that shows ``path`` of ``benchmarks/results/``."""
    rel = path.relative_to(RESULTS)
    if not rel.parts or rel.as_posix() == ".":
        return "index.md"
    if rel.as_posix() == "README.md":
        return JOURNAL
    return f"{rel.parts[0]}.md"


def rewrite_links(text: str, source: Path, assets: set[Path]) -> str:
    """Rewrite the relative links of a page of ``benchmarks/results/`` (``source``) for the site, where every page
    sits in ``results/`` and every other file at ``results/<its path under benchmarks/results>``: a page becomes the
    generated page that shows it (with the section's anchor), a folder that folder's page, any other file a link to
    its copy (added to ``assets``). A link that leaves ``benchmarks/results`` or points nowhere becomes plain text."""

    def replace(match: re.Match[str]) -> str:
        bang, label, target = match.groups()
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            return match.group(0)
        path_part, _, fragment = target.partition("#")
        resolved = (source.parent / path_part).resolve()
        try:
            rel = resolved.relative_to(RESULTS.resolve())
        except ValueError:
            return label if not bang else f"`{path_part}`"
        path = RESULTS / rel
        if not path.exists():
            return label if not bang else f"`{path_part}`"
        if path.is_dir():
            page = _page_of(path)
            anchor = "#history" if "history" in rel.parts else "#studies" if STUDIES in rel.parts else ""
            return f"[{label}]({page}{anchor})"
        if path.suffix == ".md":
            page = _page_of(path)
            if page in ("index.md", JOURNAL) or len(rel.parts) == 1:
                return f"[{label}]({page})"
            if path.name == "README.md" and path.parent.name == STUDIES:  # a studies index: the page's Studies section
                return f"[{label}]({page}#studies)"
            anchor = fragment or _anchor(path)
            single = len(current_pages(RESULTS / rel.parts[0])) == 1 and path.parent == RESULTS / rel.parts[0]
            return f"[{label}]({page})" if single else f"[{label}]({page}#{anchor})"
        assets.add(path)
        return f"{bang}[{label}]({rel.as_posix()})"

    return _LINK.sub(replace, text)


def _shift_headings(text: str, levels: int) -> str:
    """Demote every Markdown heading by ``levels`` (outside fenced code), at most to level 6."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and re.match(r"^#{1,6} ", line):
            hashes = len(line) - len(line.lstrip("#"))
            line = "#" * min(6, hashes + levels) + line[hashes:]
        out.append(line)
    return "\n".join(out)


def _body(page: Path, assets: set[Path], levels: int) -> tuple[str, str]:
    """A page's first heading and its body (without that heading), links rewritten, headings demoted."""
    text = page.read_text(encoding="utf-8")
    title = page.name
    first = re.match(r"^# (.+)\n", text)
    if first:
        title, text = first.group(1).strip(), text[first.end() :]
    return title, _shift_headings(rewrite_links(text, page, assets), levels).strip() + "\n"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _seconds(value: object) -> str:
    if not isinstance(value, (int, float)):
        return "–"
    return f"{value:,.2f} s" if value < 10 else f"{value:,.0f} s"


def provenance_table(pages: list[Path]) -> list[str]:
    """One row per result JSON: page, command, commit, device, seconds (read from the JSON)."""
    lines = ["| file | command | commit | device | seconds |", "|---|---|---|---|---|"]
    for page in pages:
        path = result_json(page)
        if path is None:
            continue
        info = provenance(path)
        commit = f"`{info['commit']}`"
        if info.get("run_commits"):
            commit += " (runs: " + ", ".join(f"`{c}`" for c in info["run_commits"]) + ")"
        device = str(info["device"])
        if info.get("run_devices"):
            device += " (runs: " + "; ".join(info["run_devices"]) + ")"
        seconds = _seconds(info["seconds"])
        if "train_seconds" in info:
            seconds += f" (training: {_seconds(info['train_seconds'])})"
        rel = path.relative_to(RESULTS).as_posix()
        lines.append(
            f"| [{_cell(path.name)}]({rel}) | `{_cell(info['command'])}` | {_cell(commit)} | {_cell(device)} | {seconds} |"
        )
    return lines if len(lines) > 2 else []



def _num(value: float) -> str:
    """A value for the evidence tables: four significant digits."""
    return f"{value:.4g}" if math.isfinite(value) else "–"


def evidence_lines(claim: Claim) -> list[str]:
    """The page's per-seed section: each comparison's seeds, differences, mean ± SE and the rule's verdict."""
    if not claim.comparisons:
        return []
    lines = [
        "## Per-seed evidence {#per-seed}",
        "",
        "Computed at build time from the committed records by the [verdict rule](index.md#the-verdict-rule): d = A - B "
        "signed so that positive goes the paper's way; SE = std(d, ddof=1)/sqrt(n).",
        "",
        "| comparison (A vs B, metric) | file | per seed: A / B (d) | the paper's way | the other way | mean d ± SE | rule | "
        "decides |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for comparison in claim.comparisons:
        pairs = paired_values(comparison)
        stats = verdict_rule([d for *_, d in pairs])
        seeds = "; ".join(f"{s}: {_num(a)} / {_num(b)} ({d:+.3g})" for s, a, b, d in pairs)
        spread = f"{stats.mean:+.3g} ± {_num(stats.se)}" if stats.n > 1 else f"{stats.mean:+.3g} (one seed: no SE)"
        lines.append(
            f"| {_cell(comparison.label)} ({comparison.better} is the paper's way) | `{_cell(comparison.file)}` | "
            f"{_cell(seeds)} | {stats.wins} of {stats.n} | {stats.losses} of {stats.n} | {spread} | "
            f"**{stats.verdict}** | {'yes' if comparison.decides else 'evidence only'} |"
        )
    combined = rule_verdict(claim)
    if combined is not None:
        lines += ["", f"The rule's verdict from the deciding comparisons: **{combined}** (the claim's: **{claim.verdict}**)."]
    return lines + [""]


def stale_lines(folder: str) -> list[str]:
    """The page's staleness banner (or a note where git is not at hand)."""
    info = folder_staleness(folder)
    entries = stale_runs(folder)
    lines: list[str] = []
    if info is None:
        if git_history() is None:
            lines += ["!!! note", "    Staleness not checked: git was not available when this page was built.", ""]
    elif info.stale:
        since = f"stale since `{info.since}`" if info.since else "stale: a run's commit is marked +dirty (its code is unknown)"
        lines += [
            '!!! warning "' + since.split(":")[0] + '"',
            f"    The runs' commits ({', '.join(f'`{c}`' for c in info.commits)}) predate a change of the library "
            "code these numbers depend on" + (f" (first: `{info.since}`)" if info.since else "") + "; see the "
            "[staleness rule](index.md#the-verdict-rule). The numbers stand for the code they name, not for HEAD.",
            "",
        ]
        files = file_staleness(folder)
        if len({f.stale for _, f in files}) > 1:  # some result files are current: say which
            lines += ["Per result file:", ""]
            lines += [
                f"- `{name}` ({', '.join(f'`{c}`' for c in f.commits[:3])}{' ...' if len(f.commits) > 3 else ''}): "
                + (f"stale since `{f.since}`" if f.stale and f.since else "stale (+dirty)" if f.stale else "current")
                for name, f in files
            ]
            lines.append("")
    if entries:
        lines += ["Runs the runner marks stale (`stale_runs`):", "", *[f"- `{_cell(e)}`" for e in entries], ""]
    return lines


def _commits_cell(info: Staleness | None) -> str:
    if info is None:
        return "–"
    shown = [f"`{c}`" for c in info.commits[:2]]
    more = len(info.commits) - len(shown)
    return ", ".join(shown) + (f" (+{more} more)" if more else "")


def _stale_cell(info: Staleness | None) -> str:
    if info is None:
        return "–"
    if info.stale:
        return f"since `{info.since}`" if info.since else "yes (+dirty)"
    return "? (commit not in history)" if info.unknown else "no"


def header(claim: Claim | None, folder: str) -> list[str]:
    if claim is None:
        return [
            "!!! warning",
            f"    No reviewed claim for `{folder}` yet: add one to `CLAIMS` in `docs/gen_results.py`.",
            "",
        ]
    source, claimed = ("Source", "The goal") if claim.paper == "varbnn" else ("Paper", "The paper's claim")
    return [
        "| | |",
        "|---|---|",
        f"| **{source}** | {_cell(PAPERS[claim.paper])} |",
        f"| **{claimed}** | {_cell(claim.claim)} |",
        f"| **varbnn's result** | {_cell(claim.result)} |",
        f"| **Reproduced** | **{claim.verdict}**: {_cell(claim.why)} |",
        "",
    ]


def _files(folder: Path, assets: set[Path]) -> list[str]:
    lines = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix != ".md"):
        if any(part.startswith(".") for part in path.relative_to(RESULTS).parts):
            continue
        assets.add(path)
        rel = path.relative_to(RESULTS).as_posix()
        lines.append(f"- [`{path.relative_to(folder).as_posix()}`]({rel})")
    return lines


def render_folder(folder: str) -> tuple[str, set[Path]]:
    """The page ``results/<folder>.md`` and the files it needs copied (paths under ``benchmarks/results/``)."""
    path = RESULTS / folder
    claim = claims_by_folder().get(folder)
    assets: set[Path] = set()
    pages = current_pages(path)
    title = claim.title if claim else folder
    lines = [f"# {title}", "", *stale_lines(folder), *header(claim, folder)]
    if claim is not None:
        lines += evidence_lines(claim)
    table = provenance_table(pages)
    if table:
        lines += ["Read from the result JSON:", "", *table, ""]
    if len(pages) == 1:
        page_title, body = _body(pages[0], assets, 1)
        lines += [f"## The committed page: {page_title}", "", f"From `benchmarks/results/{folder}/{pages[0].name}`.", ""]
        lines += [body]
    else:
        lines += ["## The committed pages", ""]
        for page in pages:
            page_title, body = _body(page, assets, 2)
            lines += [f"### {page.name}: {page_title} {{#{_anchor(page)}}}", "", body]
    variants = variant_folders(path)
    if variants:
        lines += ["## Variants", ""]
        for variant in variants:
            for page in current_pages(variant):
                page_title, body = _body(page, assets, 3)
                rel = page.relative_to(path).as_posix()
                lines += [f"### {rel}: {page_title} {{#{_anchor(page)}}}", "", *provenance_table([page]), "", body]
    studies = study_pages(path)
    if studies or (path / STUDIES / "README.md").is_file():
        lines += ["## Studies {#studies}", ""]
        lines += [f"From `benchmarks/results/{folder}/{STUDIES}/`: the A/B runs, profiles and micro-benchmarks behind "
                  "the pages above.", ""]  # fmt: skip
        index = path / STUDIES / "README.md"
        if index.is_file():
            _, body = _body(index, assets, 1)
            lines += [body]
        if studies:
            lines += ["### The study pages", ""]
        for page in studies:
            page_title, body = _body(page, assets, 4)
            lines += [f"#### {page.name} {{#{_anchor(page)}}}", "", *provenance_table([page]), ""]
            lines += [f'??? note "{page.name}: {page_title}"', ""]
            lines += [("    " + line) if line.strip() else "" for line in body.splitlines()]
            lines += [""]
    history = history_pages(path)
    history_dirs = sorted(p for p in (path / "history").glob("*") if p.is_dir()) if (path / "history").is_dir() else []
    if history or history_dirs:
        lines += ["## History {#history}", "", "Superseded pages, kept as they were committed.", ""]
        for page in history:
            page_title, body = _body(page, assets, 3)
            lines += [f"### {page.name} {{#{_anchor(page)}}}", "", *provenance_table([page]), ""]
            lines += [f'??? note "{page.name}: {page_title}"', ""]
            lines += [("    " + line) if line.strip() else "" for line in body.splitlines()]
            lines += [""]
        for directory in history_dirs:
            lines += [f"### {directory.name}/", "", *_files(directory, assets), ""]
    lines += ["## Files", "", f"Everything in `benchmarks/results/{folder}/` except the pages above:", ""]
    lines += [*_files(path, assets), ""]
    return "\n".join(lines), assets


def render_index() -> str:
    """The one-table summary: one row per seed experiment, grouped by paper."""
    folders = set(experiment_folders())
    lines = [
        "# Results",
        "",
        "Every seed experiment of the four papers varbnn implements, and the library's own measurements: what the "
        "paper claims, what varbnn measured, and whether that reproduces the claim. Each page shows the command, "
        "commit and device that produced its numbers (read from the committed JSON in `benchmarks/results/`), the "
        "committed result page itself and its history. `n/a`: a diagnostic or a measurement with no claim to "
        "reproduce. The commands and the full headline of every run are in the [experiment journal](journal.md).",
        "",
        "## The verdict rule {#the-verdict-rule}",
        "",
        VERDICT_RULE,
        "",
        STALE_RULE,
        "",
        "## The experiments",
        "",
        "| paper | experiment | the paper's claim (or the goal) | varbnn's result | reproduced | why | runs' commit | "
        "stale |",
        "|---|---|---|---|---|---|---|---|",
    ]
    git_missing = git_history() is None
    for claim in ordered_claims():
        name = claim.title.split(":")[0]
        experiment = f"[{name}]({claim.folder}.md)" if claim.folder in folders else name
        info = folder_staleness(claim.folder) if claim.folder in folders else None
        lines.append(
            f"| {_cell(NAV_GROUPS[claim.paper])} | {experiment} | {_cell(claim.claim)} | {_cell(claim.result)} | "
            f"**{claim.verdict}** | {_cell(claim.why)} | {_commits_cell(info)} | {_stale_cell(info)} |"
        )
    unclaimed = sorted(folders - set(claims_by_folder()))
    for folder in unclaimed:
        lines.append(f"| – | [{folder}]({folder}.md) | not reviewed yet | – | – | – | – | – |")
    if git_missing:
        lines += ["", "_git was not available when this page was built: the runs' commit and stale columns are empty._"]
    lines += ["", "## Not attempted", "", "The papers' claims varbnn has not tried to reproduce, and why:", ""]
    lines += [f"- **{_cell(NAV_GROUPS[paper])}**: {text}" for paper, text in NOT_ATTEMPTED]
    lines += ["", "Papers:", ""] + [f"- {NAV_GROUPS[key]}: {title}" for key, title in PAPERS.items()]
    return "\n".join(lines) + "\n"


def render_journal() -> tuple[str, set[Path]]:
    assets: set[Path] = set()
    text = (RESULTS / "README.md").read_text(encoding="utf-8")
    note = "\n_Rendered from `benchmarks/results/README.md`; links lead to the results pages of this site._\n"
    first = re.match(r"^# .+\n", text)
    if first:
        text = text[: first.end()] + note + text[first.end() :]
    return rewrite_links(text, RESULTS / "README.md", assets), assets


def ordered_claims() -> list[Claim]:
    order = list(PAPERS)
    return sorted(CLAIMS, key=lambda c: order.index(c.paper))


def nav() -> list[tuple[str, list[tuple[str, str]]]]:
    """The Results block of mkdocs.yml's nav: (group, [(title, page)]), the summary and journal first and last."""
    folders = experiment_folders()
    groups: list[tuple[str, list[tuple[str, str]]]] = []
    for key, group in NAV_GROUPS.items():
        entries = [(c.folder, f"{SITE}/{c.folder}.md") for c in ordered_claims() if c.paper == key and c.folder in folders]
        if entries:
            groups.append((group, entries))  # type: ignore[arg-type]
    unclaimed = [(f, f"{SITE}/{f}.md") for f in folders if f not in claims_by_folder()]
    if unclaimed:
        groups.append(("Not reviewed yet", unclaimed))
    return groups


def nav_yaml() -> str:
    """The Results block as it belongs in mkdocs.yml."""
    lines = ["  - Results:", f"      - {SITE}/index.md"]
    for group, entries in nav():
        lines.append(f"      - {group}:")
        lines += [f"          - {title}: {page}" for title, page in entries]
    lines.append(f"      - Experiment journal: {SITE}/{JOURNAL}")
    return "\n".join(lines)


def numbers(text: str) -> list[str]:
    """The numbers written in ``text`` (as written: thousands separators and exponents kept)."""
    return [n.rstrip(",") for n in _NUMBER.findall(text)]


def write_pages() -> None:
    """Write every results page and copy the files they link (called by ``gen_pages.py`` under mkdocs-gen-files)."""
    import mkdocs_gen_files

    copied: set[Path] = set()

    def write(name: str, text: str, assets: set[Path]) -> None:
        with mkdocs_gen_files.open(f"{SITE}/{name}", "w") as handle:
            handle.write(text)
        for asset in sorted(assets - copied):
            with mkdocs_gen_files.open(f"{SITE}/{asset.relative_to(RESULTS).as_posix()}", "wb") as handle:
                handle.write(asset.read_bytes())
            copied.add(asset)

    write("index.md", render_index(), set())
    text, assets = render_journal()
    write(JOURNAL, text, assets)
    for folder in experiment_folders():
        text, assets = render_folder(folder)
        write(f"{folder}.md", text, assets)
