"""``varbnn reproduce graves-prune`` (and ``-lstm``): Graves (2011) table 2 and figures 3-4 on the adaptive-weight-noise
network of ``graves-mnist`` (:mod:`varbnn_lab.graves`): prune at each lambda the weights whose relative
density at zero is high (|mu|/sigma < lambda), evaluate, retrain, evaluate again; heat maps of the per-weight
complexity cost."""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from varbnn.objectives import NATS_PER_BIT, complexity_costs, transmitted_weights
from varbnn.prune import prune_by_density_ratio
from varbnn.training import seed_everything
from varbnn_lab.config import results_dir
from varbnn_lab.engine import RunKey, RunStore, fingerprint, open_run, select_shard
from varbnn_lab.evaluation import mode_error
from varbnn_lab.graves import (
    AWN,
    GravesConfig,
    _awn_checkpoint,
    _data,
    _run_variant,
    _train,
    build_graves_model,
    network_experiment,
)
from varbnn_lab.render import markdown_table, provenance_lines

__all__ = ["run_graves_prune", "render_prune_markdown", "prune_claims", "prune_store", "prune_protocol"]


def _bits_per_kept_weight(model: nn.Module) -> float:
    costs = complexity_costs(model)
    return float(sum(c.sum() for c in costs.values())) / NATS_PER_BIT / max(transmitted_weights(model), 1)


def run_graves_prune(
    config: GravesConfig,
    *,
    device: str | torch.device | None = "cpu",
    out_dir: str | os.PathLike[str] | None = None,
    data_dir: str | None = None,
    progress: bool = True,
    command: str | None = None,
    network_dir: str | os.PathLike[str] | None = None,
    shard: tuple[int, int] | None = None,
    train: bool = True,
    workers: int = 1,
    distributed: bool = False,
) -> dict[str, Any]:
    """Table 2 analogue: prune the adaptive-weight-noise network (trained by ``graves-mnist``'s protocol; trained here
    if its checkpoint is missing) at every lambda, evaluate, retrain ``retrain_epochs`` with the same optimisation and
    evaluate again; per-weight complexity heat maps of ``config.heatmap_tensor`` (figures 3-4).

    Each lambda is one run of the engine (:func:`varbnn_lab.engine.execute`; records in
    ``OUT/<name>_runs*.jsonl`` under :func:`prune_protocol`): resumable, ``workers`` CPU processes, ``shard=(k, n)``
    (the page is written once all shards are done), ``train=False`` only renders (none saved at all is a ``ValueError``
    naming the folder), ``distributed`` retrains
    data-parallel under ``torchrun`` (rank 0 writes). ``OUT``: ``out_dir``, by default ``benchmarks/results/<name>/``.
    ``network_dir``: the folder whose ``.checkpoints/`` holds the trained network (a missing one is trained and saved
    there); by default ``out_dir`` when that is given, else the folder of the experiment that trains it
    (:func:`network_experiment`, e.g. ``graves-mnist``'s)."""
    call = open_run(config.name, out_dir, device, distributed, workers)
    dev, out = call.device, call.out
    if network_dir is None:
        network_dir = out if out_dir is not None else results_dir(network_experiment(config.name))
    variant = next(v for v in config.variants if v.label == AWN)
    checkpoint = _awn_checkpoint(Path(network_dir), config, config.seeds[0])
    runs = select_shard([(lam,) for lam in config.lambdas], shard) if train else []  # this call's (for the check below)
    store = prune_store(config, out, shard)
    if not checkpoint.exists() and any(key not in store.load() for key in runs):
        if shard is not None:  # shards would each train (and on a GPU, differ in) the network they prune
            raise ValueError(
                f"--shard prunes one trained network: {checkpoint} is missing; train it first (`varbnn reproduce "
                f"{network_experiment(config.name)}`, or {config.name} without --shard)"
            )
        _run_variant(config, variant, config.seeds[0], data_dir, dev, Path(network_dir), progress)  # before any worker
    run = functools.partial(_prune_run, config, data_dir, dev, checkpoint, call.progress(progress))
    # the engine shards the runs; with train=False it only reads them (none saved at all: its nothing_saved error)
    done = call.execute([(lam,) for lam in config.lambdas], run, store, call.reporter(progress, lambda key, row: (
        f"lambda {row['lambda']}: {row['percent']:.1f}% kept, error {row['initial_error']:.4f} -> {row['retrain_error']:.4f}"
    )), shard=shard, train=train)  # fmt: skip
    if not call.writes(shard):
        return {"name": config.name, "rows": [], "written": False}
    rows = [done[(lam,)] for lam in config.lambdas if (lam,) in done]
    if not rows:
        raise ValueError(f"no runs of {config.name} saved in {out} (nothing to render; the page there is left as it is)")
    result = {
        "name": config.name,
        **call.provenance(command),
        "run_devices": sorted({r["device"] for r in rows}),
        "config": dataclasses.asdict(config),
        "heatmap_layer": config.heatmap_tensor,
        "rows": rows,
        "claims": prune_claims(rows),
    }
    call.write_result(result)
    figures = []
    if checkpoint.exists():  # figures 3-4 from the network (the masks are the rule's, recomputed: no training)
        from varbnn_lab.figures import complexity_heatmaps

        trained = _load_network(config, checkpoint, dev)
        layer_key = config.heatmap_tensor
        module_name, tensor_name = layer_key.rsplit(".", 1)
        costs = {k: v.cpu() for k, v in complexity_costs(trained).items()}
        kept = {}
        for lam in config.heatmap_lambdas:
            model = copy.deepcopy(trained)
            prune_by_density_ratio(model, lam)
            mask = model.get_submodule(module_name).posteriors[tensor_name].weight_mask  # type: ignore[index, union-attr]
            if mask is not None:
                kept[lam] = mask.cpu()
        figures.append(complexity_heatmaps(costs[layer_key] / NATS_PER_BIT, kept, out / f"{config.name}.png",
                                           title=layer_key).name)  # fmt: skip
    return call.write_page(result, render_prune_markdown(result, figures[0] if figures else None))


def prune_protocol(config: GravesConfig) -> str:
    """The protocol hash of ``graves-prune``'s runs: the network's (:meth:`GravesConfig.protocol_hash` of adaptive
    weight noise), its seed and the retraining length."""
    variant = next(v for v in config.variants if v.label == AWN)
    return fingerprint([config.protocol_hash(variant), config.seeds[0], config.retrain_epochs, config.heatmap_tensor])


def prune_store(config: GravesConfig, out: os.PathLike[str], shard: tuple[int, int] | None = None) -> RunStore:
    """The runs of ``graves-prune`` in folder ``out``, one per lambda, keyed by ``(lambda,)``."""
    return RunStore.keyed(out, config.name, ("lambda",), prune_protocol(config), shard)


def _load_network(config: GravesConfig, checkpoint: Path, dev: torch.device) -> nn.Module:
    variant = next(v for v in config.variants if v.label == AWN)
    model = build_graves_model(config, variant).to(dev)
    model.load_state_dict(torch.load(checkpoint, map_location=dev, weights_only=True)["model"])
    return model


def _prune_run(
    config: GravesConfig, data_dir: str | None, dev: torch.device, checkpoint: Path, progress: bool, key: RunKey
) -> dict[str, Any]:
    """The engine's run function of ``graves-prune``: prune the trained network at ``key = (lambda,)``, evaluate,
    retrain and evaluate again."""
    (lam,) = key
    data = _data(config, data_dir, False)
    model = _load_network(config, checkpoint, dev)
    if config.heatmap_tensor not in complexity_costs(model):
        raise ValueError(
            f"heatmap_tensor {config.heatmap_tensor!r} is not a Bayesian tensor of the model; allowed: "
            f"{sorted(complexity_costs(model))}"
        )
    report = prune_by_density_ratio(model, lam)
    row: dict[str, Any] = {
        "lambda": lam,
        "weights": report["kept"],
        "total": report["total"],
        "percent": 100.0 * report["fraction"],
        "initial_error": mode_error(model, data["x_test"], data["y_test"]),
        "bits_per_weight": _bits_per_kept_weight(model),
    }
    if lam > 0 and config.retrain_epochs > 0:
        seed_everything(config.seeds[0] + 1)
        log, epoch = _train(config, model, data, config.retrain_epochs, False, dev, progress)
        row.update(retrain_error=mode_error(model, data["x_test"], data["y_test"]), retrain_epochs=epoch,
                   retrain_bits_per_weight=_bits_per_kept_weight(model), retrain_log=log)  # fmt: skip
    else:
        row.update(retrain_error=row["initial_error"], retrain_epochs=0, retrain_bits_per_weight=row["bits_per_weight"])
    return row


def prune_claims(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The paper's claims about table 2, checked on ``rows``: error rises slowly up to lambda = 0.5 and sharply after;
    retraining after pruning can improve the error."""
    by_lambda = {r["lambda"]: r for r in rows}
    base = by_lambda.get(0.0)
    out: dict[str, Any] = {}
    if base is None:
        return out
    upto = [r["initial_error"] - base["initial_error"] for r in rows if 0 < r["lambda"] <= 0.5]
    after = [r["initial_error"] - base["initial_error"] for r in rows if r["lambda"] > 0.5]
    out["max_rise_up_to_0.5"] = max(upto) if upto else None
    out["max_rise_above_0.5"] = max(after) if after else None
    out["slow_then_sharp"] = bool(upto and after and max(after) > 2 * max(max(upto), 1e-4))
    improved = [r["lambda"] for r in rows if r["lambda"] > 0 and r["retrain_error"] < base["initial_error"]]
    out["retrain_beats_unpruned_at"] = improved
    return out


def render_prune_markdown(result: dict[str, Any], figure: str | None = None) -> str:
    """The page of a saved ``graves-prune`` result: table 2's analogue, one row per lambda, and the paper's claims."""
    config, claims = result["config"], result["claims"]
    lines = [
        f"# {result['name']}",
        "",
        "Graves (2011) table 2 analogue: the adaptive-weight-noise MLP of `graves-mnist` pruned at each lambda (weights "
        "with |mu|/sigma < lambda fixed at 0, biases included), test error of the mode right after pruning and after "
        f"retraining up to {config['retrain_epochs']} epochs (same optimisation; evaluated at the retrain epoch with the "
        "lowest training error loss, 'retrain epochs'). Bits/weight = mean complexity cost (eq. 13) of the kept weights, "
        "after pruning / after retraining.",
        "",
        # results saved by the engine list the runs' devices; their runs are in the runs file
        *provenance_lines(result, runs_note="run_devices" in result, run_devices=True),
        "",
    ]
    header = ["lambda", "weights", "percent", "initial error %", "retrain error %", "retrain epochs", "bits/weight",
              "bits/weight after retrain"]  # fmt: skip
    rows = [
        [str(r["lambda"]), f"{r['weights']:,}", f"{r['percent']:.1f}%", f"{100 * r['initial_error']:.2f}",
         f"{100 * r['retrain_error']:.2f}", str(r["retrain_epochs"]), f"{r['bits_per_weight']:.2f}",
         f"{r['retrain_bits_per_weight']:.2f}"]
        for r in result["rows"]
    ]  # fmt: skip
    lines += markdown_table(header, rows)
    if claims:
        rise, sharp = claims["max_rise_up_to_0.5"], claims["max_rise_above_0.5"]
        lines += [
            "",
            "Claims of the paper, checked:",
            f"- error rises slowly up to lambda = 0.5 (largest rise {100 * (rise or 0):.2f} points) and sharply after "
            f"(largest rise {100 * (sharp or 0):.2f} points): {'yes' if claims['slow_then_sharp'] else 'no'}",
            "- retraining after pruning gives a lower error than the unpruned network at lambda = "
            + (", ".join(str(v) for v in claims["retrain_beats_unpruned_at"]) or "none"),
        ]
    if figure:
        lines += ["", f"![{figure}]({figure})"]
    return "\n".join(lines) + "\n"
