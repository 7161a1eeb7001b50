"""What the generic runner (:mod:`varbnn_lab.runner`) measures on a trained run: test metrics (and per-draw
ELBO terms), out-of-distribution AUROC by entropy and mutual information, and the pruning rules' exported models; and
the measures of the paper experiments that are not paper-specific: a classifier's (:func:`mode_error`,
:func:`predictive_metrics`, :func:`predictive_probs`) and a Gaussian regressor's (:func:`predictive_log_likelihood`,
:func:`log_likelihood_ceiling`)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import torch

from varbnn.metrics import auroc
from varbnn.nn.base import sample_mode
from varbnn.predict import classification_summary, predict
from varbnn.prune import classification_error
from varbnn.training import evaluate_classifier, evaluate_weight_samples
from varbnn_lab.baselines import BASELINES, DETERMINISTIC
from varbnn_lab.config import ExperimentConfig, Variant

__all__ = [
    "evaluate_variant", "uncertainties", "ood_scores", "prune_scores", "front_points", "sizes", "parameter_count",
    "mode_error", "predictive_metrics", "predictive_probs", "predictive_log_likelihood", "log_likelihood_ceiling",
]  # fmt: skip


def _sem(values: torch.Tensor) -> float:
    return float(values.std() / math.sqrt(values.numel())) if values.numel() > 1 else float("nan")


def draws(config: ExperimentConfig, variant: Variant, model: torch.nn.Module) -> int:
    """Monte Carlo draws of one evaluation: 1 for a deterministic variant, else ``eval_samples``, rounded up to a
    multiple of a mixture's members when they are stochastic (each member weighs the same)."""
    if variant.family in DETERMINISTIC:
        return 1
    count = len(getattr(model, "members", ())) if variant.family_options.get("member", "plain") != "plain" else 0
    return -(-config.eval_samples // count) * count if count else config.eval_samples


def evaluate_variant(
    config: ExperimentConfig,
    variant: Variant,
    model: torch.nn.Module,
    test: tuple[torch.Tensor, torch.Tensor],
    n_train: int,
    seed: int,
    dev: torch.device,
) -> tuple[dict[str, float], torch.Tensor]:
    """The test metrics of one trained run (:func:`varbnn.training.evaluate_classifier`: accuracy, NLL, ECE, Brier,
    ``eval_samples`` draws; one for a deterministic model) and the prediction time, plus, with ``eval_weight_samples``,
    each weight draw's -ELBO, NLL and accuracy (mean and ``_wsem``, the standard error over draws); and the predictive
    probabilities (for the figures)."""
    deterministic = variant.family in DETERMINISTIC
    start = time.perf_counter()
    scores, probs = evaluate_classifier(model, *test, samples=draws(config, variant, model), device=dev)
    scores["predict_seconds"] = time.perf_counter() - start
    if config.eval_weight_samples and variant.family not in ("plain", *BASELINES):
        per_draw = evaluate_weight_samples(
            model, *test, n_train=n_train, samples=1 if deterministic else config.eval_weight_samples, seed=seed, device=dev
        )
        for key, label in (("nelbo", "nelbo"), ("nll", "sample_nll"), ("accuracy", "sample_accuracy")):
            scores[label] = float(per_draw[key].mean())
            scores[f"{label}_wsem"] = _sem(per_draw[key])
    return scores, probs


@torch.no_grad()
def uncertainties(model: torch.nn.Module, x: torch.Tensor, samples: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Predictive entropy and mutual information per example (nats), batches of 1,000."""
    model.eval()
    entropy, information = [], []
    for start in range(0, x.shape[0], 1000):
        summary = classification_summary(predict(model, x[start : start + 1000].to(dev), samples=samples))
        entropy.append(summary.predictive_entropy.cpu())
        information.append(summary.mutual_information.cpu())
    return torch.cat(entropy), torch.cat(information)


def ood_scores(
    config: ExperimentConfig,
    variant: Variant,
    model: torch.nn.Module,
    x_test: torch.Tensor,
    x_ood: torch.Tensor,
    dev: torch.device,
) -> tuple[dict[str, float], tuple[torch.Tensor, torch.Tensor]]:
    """AUROC of telling ``x_ood`` (positives) from ``x_test`` by predictive entropy and by mutual information, and the
    two entropy vectors (for the figure). A deterministic model's mutual information is 0 everywhere: AUROC 0.5."""
    samples = draws(config, variant, model)
    h_in, mi_in = uncertainties(model, x_test, samples, dev)
    h_out, mi_out = uncertainties(model, x_ood, samples, dev)
    labels = torch.cat([torch.zeros(len(h_in)), torch.ones(len(h_out))])
    scores = {
        "ood_auroc_entropy": auroc(torch.cat([h_in, h_out]), labels),
        "ood_auroc_mi": auroc(torch.cat([mi_in, mi_out]), labels),
    }
    return scores, (h_in, h_out)


def prune_scores(
    config: ExperimentConfig,
    model: torch.nn.Module,
    test: tuple[torch.Tensor, torch.Tensor],
    train: tuple[torch.Tensor, torch.Tensor],
    validation: tuple[torch.Tensor, torch.Tensor] | None,
    seed: int,
    dev: torch.device,
    progress: bool,
    workers: int = 1,
) -> tuple[dict[str, Any], dict[tuple[str, str], float] | None]:
    """The exported model by the config's threshold rule (``pruned_*``) and, given a validation set, by
    :func:`varbnn.prune.validation_thresholds` (``prune_validation_tolerance``; ``val_pruned_*``) and by
    :func:`varbnn.prune.budget_units` (``prune_budget``; ``budget_pruned_*``), each optionally retrained
    (``*_finetuned_test_error``), and by :func:`varbnn.prune.iterative_budget` (``prune_stages``; ``iter_pruned_*``,
    always retrained), and at each budget of ``prune_front`` (``front{B}_*``; :func:`front_points`, its points in
    ``workers`` CPU processes). Returns the scores and the validation rule's thresholds (for the figure)."""
    from varbnn.prune import (
        budget_units,
        classification_error,
        export,
        finetune,
        iterative_budget,
        predictive_targets,
        reinitialize,
        validation_thresholds,
    )

    x_test, y_test = test
    example = x_test[:2].to(dev)
    exported, report = export(model, example, threshold=config.prune_threshold, min_gap=config.prune_min_gap)
    scores: dict[str, Any] = {
        **sizes("pruned", report),
        "dense_parameters": float(report["dense_parameters"]),  # type: ignore[arg-type]
        "pruned_test_error": classification_error(exported, x_test, y_test),
    }
    if validation is None:
        return scores, None
    rules: list[tuple[str, Any]] = []
    if config.prune_validation_tolerance:
        rules.append(("val", lambda: validation_thresholds(
            model, *validation, tolerance=config.prune_validation_tolerance, start=config.prune_threshold,
            min_gap=config.prune_min_gap, progress=progress,
        )))  # fmt: skip
    if config.prune_budget is not None:
        rules.append(("budget", lambda: budget_units(
            model, *validation, max_flops=config.prune_budget[0], max_parameters=config.prune_budget[1],
            start=config.prune_threshold, min_gap=config.prune_min_gap, progress=progress,
        )))  # fmt: skip
    soft_targets = None  # the trained model's predictive on the training set, distilled by every retraining
    if config.prune_distill_weight and (config.prune_finetune_epochs or config.prune_stages):
        soft_targets = predictive_targets(model, train[0], config.prune_distill_samples, seed=seed)
    cuts = None
    for prefix, rule in rules:
        keep, search = rule()
        exported, report = export(model, example, keep=keep)
        scores.update({
            **sizes(f"{prefix}_pruned", report),
            f"{prefix}_pruned_validation_error": float(search["error"]),
            f"{prefix}_pruned_test_error": classification_error(exported, x_test, y_test),
        })  # fmt: skip
        if config.prune_finetune_epochs:
            retrained_model, retrained = finetune(
                exported, train, validation, epochs=config.prune_finetune_epochs, lr=config.prune_finetune_lr,
                batch_size=config.batch_size, seed=seed, schedule=config.prune_finetune_schedule, progress=progress,
                soft_targets=soft_targets, distill_weight=config.prune_distill_weight,
            )  # fmt: skip
            scores[f"{prefix}_pruned_finetuned_epoch"] = float(retrained["epoch"])
            scores[f"{prefix}_pruned_finetuned_test_error"] = classification_error(retrained_model, x_test, y_test)
        if prefix == "val":
            cuts = search["thresholds"]
    if config.prune_stages and config.prune_budget is not None:
        staged, staged_report = iterative_budget(
            model, train, validation, max_flops=config.prune_budget[0], max_parameters=config.prune_budget[1],
            stages=config.prune_stages, epochs=config.prune_stage_epochs, final_epochs=config.prune_finetune_epochs,
            lr=config.prune_finetune_lr, batch_size=config.batch_size, seed=seed, schedule=config.prune_finetune_schedule,
            start=config.prune_threshold, min_gap=config.prune_min_gap, progress=progress, soft_targets=soft_targets,
            distill_weight=config.prune_distill_weight,
        )  # fmt: skip
        scores.update({
            "iter_pruned_stages": " > ".join(str(stage["architecture"]) for stage in staged_report["stages"]),
            **sizes("iter_pruned", staged_report),
            "iter_pruned_validation_error": float(staged_report["validation_error"]),
            "iter_pruned_test_error": classification_error(staged, x_test, y_test),
        })  # fmt: skip
        if config.prune_scratch_epochs:  # the same architecture from a random initialisation (Liu et al. 2019)
            scratch, retrained = finetune(
                reinitialize(staged, seed=seed), train, validation, epochs=config.prune_scratch_epochs,
                lr=config.prune_finetune_lr, batch_size=config.batch_size, seed=seed,
                schedule=config.prune_finetune_schedule, progress=progress, soft_targets=soft_targets,
                distill_weight=config.prune_distill_weight,
            )  # fmt: skip
            scores.update({
                **sizes("scratch_pruned", staged_report),
                "scratch_pruned_validation_error": float(retrained["validation_error"]),
                "scratch_pruned_finetuned_epoch": float(retrained["epoch"]),
                "scratch_pruned_finetuned_test_error": classification_error(scratch, x_test, y_test),
            })  # fmt: skip
    if config.prune_front:  # the error-FLOPs front: the staged rule to each FLOPs budget alone
        scores.update(front_points(config, model, train, validation, test, seed, progress, soft_targets, workers))
    return scores, cuts


def front_points(
    config: ExperimentConfig,
    model: torch.nn.Module,
    train: tuple[torch.Tensor, torch.Tensor],
    validation: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
    seed: int,
    progress: bool,
    soft_targets: torch.Tensor | None,
    workers: int = 1,
) -> dict[str, Any]:
    """Every point of ``config.prune_front`` (:func:`_front_point`), in budget order. ``workers`` > 1 on the CPU runs
    the points in that many spawned processes of one thread each (the points are independent: each retraining draws
    from its own seeded generator, so a point's scores do not depend on the process or the order; only the thread
    count can change the last bits of a convolution), and this process waits for them; the points of a run whose
    model is on a GPU run here one after the other. Each point is about 170 epochs of a small network's retraining,
    whose steps are too short for a second thread to help: lenet5-front's five points took about an hour by the clock
    in two processes (seed 1), where seed 0's took about 1.5 hours one after another in one thread beside another job."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    budgets = list(config.prune_front)
    on_cpu = all(p.device.type == "cpu" for p in model.parameters())
    scores: dict[str, Any] = {}
    if workers == 1 or len(budgets) == 1 or not on_cpu:
        for budget in budgets:
            scores.update(_front_point(config, model, budget, train, validation, test, seed, progress, soft_targets))
        return scores
    from varbnn_lab.engine import worker_pool

    with worker_pool(min(workers, len(budgets))) as pool:
        futures = [
            pool.submit(_front_point, config, model, budget, train, validation, test, seed, False, soft_targets)
            for budget in budgets
        ]
        for budget, future in zip(budgets, futures):
            scores.update(future.result())
            if progress:
                print(f"[{config.name}] front point {budget:,} FLOPs done", flush=True)
    return scores


def _front_point(
    config: ExperimentConfig,
    model: torch.nn.Module,
    budget: int,
    train: tuple[torch.Tensor, torch.Tensor],
    validation: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
    seed: int,
    progress: bool,
    soft_targets: torch.Tensor | None,
) -> dict[str, Any]:
    """One point of ``prune_front``: :func:`varbnn.prune.iterative_budget` to ``budget`` FLOPs (no parameter cap) and,
    with ``prune_scratch_epochs``, the random-initialisation control at its architecture; keys ``front{budget}_*``."""
    from varbnn.prune import classification_error, finetune, iterative_budget, reinitialize

    prefix = f"front{budget}"
    staged, report = iterative_budget(
        model, train, validation, max_flops=budget, stages=config.prune_stages, epochs=config.prune_stage_epochs,
        final_epochs=config.prune_finetune_epochs, lr=config.prune_finetune_lr, batch_size=config.batch_size, seed=seed,
        schedule=config.prune_finetune_schedule, start=config.prune_threshold, min_gap=config.prune_min_gap,
        progress=progress, soft_targets=soft_targets, distill_weight=config.prune_distill_weight,
    )  # fmt: skip
    scores: dict[str, Any] = {
        **sizes(prefix, report),
        f"{prefix}_reached": float(report["reached"]),
        f"{prefix}_validation_error": float(report["validation_error"]),
        f"{prefix}_test_error": classification_error(staged, *test),
    }
    if config.prune_scratch_epochs:
        scratch, retrained = finetune(
            reinitialize(staged, seed=seed), train, validation, epochs=config.prune_scratch_epochs,
            lr=config.prune_finetune_lr, batch_size=config.batch_size, seed=seed, schedule=config.prune_finetune_schedule,
            progress=progress, soft_targets=soft_targets, distill_weight=config.prune_distill_weight,
        )  # fmt: skip
        scores.update({
            f"{prefix}_scratch_validation_error": float(retrained["validation_error"]),
            f"{prefix}_scratch_test_error": classification_error(scratch, *test),
        })  # fmt: skip
    return scores


def sizes(prefix: str, report: Mapping[str, Any]) -> dict[str, Any]:
    """An exported model's ``architecture``, ``parameters`` and ``FLOPs`` as the score keys ``{prefix}_...``."""
    return {
        f"{prefix}_architecture": str(report["architecture"]),
        f"{prefix}_parameters": float(report["parameters"]),
        f"{prefix}_flops": float(report["flops"]),
    }


def parameter_count(model: torch.nn.Module) -> int:
    """The number of trained parameters (the variational parameters of a Bayesian model)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@torch.no_grad()
def mode_error(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 5000) -> float:
    """Classification error of the posterior mode (weight noise removed)."""
    with sample_mode(model, "mode"):
        return classification_error(model, x, y, batch_size)


@torch.no_grad()
def predictive_metrics(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, samples: int) -> dict[str, float]:
    """Error and NLL of the Monte Carlo predictive (``samples`` draws), in batches of 2,000. (Not
    :func:`varbnn.training.evaluate_classifier`: its sums differ in the last digits, and saved records use these.)"""
    dev = next(model.parameters()).device
    model.eval()
    wrong, nll = 0, 0.0
    for s in range(0, x.shape[0], 2000):
        logits = predict(model, x[s : s + 2000].to(dev), samples=samples)
        probs = logits.softmax(-1).mean(0).cpu()
        yb = y[s : s + 2000]
        wrong += int((probs.argmax(-1) != yb).sum())
        nll -= float(probs.gather(1, yb[:, None]).clamp_min(1e-12).log().sum())
    return {"error": wrong / max(x.shape[0], 1), "nll": nll / max(x.shape[0], 1)}


@torch.no_grad()
def predictive_probs(
    model: torch.nn.Module, x: torch.Tensor, samples: int, dev: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Monte Carlo predictive probabilities ``[N, C]`` of ``samples`` draws on all of ``x`` at once, and each
    point's mutual information (:func:`varbnn.predict.classification_summary`), on the CPU."""
    model.eval()
    summary = classification_summary(predict(model, x.to(dev), samples=samples))
    return summary.probs.cpu(), summary.mutual_information.cpu()


def predictive_log_likelihood(pred: torch.Tensor, y: torch.Tensor, noise_var: torch.Tensor) -> float:
    """``mean_n [logsumexp_s log N(y_n | pred[s, n], noise_var[s]) - log S]``: the Monte Carlo predictive density of
    each test point (log-sum-exp over the S draws, not over the points), averaged over points. (Not
    :func:`varbnn.metrics.gaussian_log_likelihood`, the same quantity: its sums differ in the last digit.)"""
    if pred.dim() != 2 or y.shape != pred.shape[1:] or noise_var.shape != pred.shape[:1]:
        raise ValueError(
            f"need pred [S, N], y [N], noise_var [S]; got {tuple(pred.shape)}, {tuple(y.shape)}, {tuple(noise_var.shape)}"
        )
    var = noise_var[:, None]
    log_density = -0.5 * (math.log(2 * math.pi) + var.log() + (y[None] - pred).square() / var)
    return float((torch.logsumexp(log_density, dim=0) - math.log(pred.shape[0])).mean())


def log_likelihood_ceiling(n_train: int, y_std: float, prior_shape: float, prior_rate: float) -> float:
    """Upper bound on the expected test log-likelihood (original units) of ANY network when q(tau) is the closed-form
    posterior of a Gamma(a0, b0) noise prior: ``Gamma(a0 + n/2, b0 + E[SSE]/2)`` has shape ``a = a0 + n/2`` and rate
    ``b >= b0``, and every test point's predictive density is at most ``mean_s sqrt(tau_s / 2 pi) / y_std`` (a perfect
    prediction). By Jensen, ``E[log mean_s sqrt(tau_s)] <= log E[sqrt(tau)] = log Gamma(a + 1/2) - log Gamma(a) - log(b) /
    2 <= the same with b0``, so

        LL <= lgamma(a + 1/2) - lgamma(a) - log(b0) / 2 - log(2 pi) / 2 - log(y_std).

    A reference above this cannot be beaten under the protocol, whatever the family: with few, nearly noise-free
    training points (yacht, energy) the prior's rate b0 keeps the noise estimate high."""
    if n_train < 1 or not (y_std > 0 and prior_shape > 0 and prior_rate > 0):
        raise ValueError(
            f"need n_train >= 1 and y_std, prior_shape, prior_rate > 0; got {n_train!r}, {y_std!r}, {prior_shape!r}, "
            f"{prior_rate!r}"
        )
    a = prior_shape + n_train / 2
    return math.lgamma(a + 0.5) - math.lgamma(a) - 0.5 * math.log(prior_rate) - 0.5 * math.log(2 * math.pi) - math.log(y_std)
