"""``varbnn reproduce soap-bubble``: the 'soap bubble' of high-dimensional Gaussians (Farquhar et al. 2020, Fig. 1, 3, 8).

1. Distance ``||w - mu||`` of samples from the mode for a 3x3x128x128 convolution kernel (D = 147,456) under a
   mean-field Gaussian and a radial posterior with the same sigma for every weight, at several sigma: histograms of
   samples against the analytic densities (Gaussian: ``sigma * chi_D``; radial: ``sigma * |N(0, 1)|``) (Fig. 3).
2. One model per family trained with the full ELBO (no KL down-weighting) on MNIST: per epoch, the average distance
   of sampled weights (all Bayesian tensors together) from the mode (Fig. 8) and the training accuracy of one weight
   draw against the training loss (Fig. 1).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from varbnn import distributed as vdist
from varbnn.convert import bayesianize
from varbnn.data import TensorBatches, load_mnist
from varbnn.distributions.radial import chi_log_density
from varbnn.families import make_family
from varbnn.models import mlp
from varbnn.nn.base import BayesianModule
from varbnn.priors import Normal
from varbnn.training import fit, seed_everything
from varbnn_lab.engine import RunKey, RunStore, config_fields, fingerprint, open_run
from varbnn_lab.render import markdown_table, provenance_lines

__all__ = [
    "SoapBubbleConfig", "soap_bubble_config", "run_soap_bubble", "render_soap_bubble_markdown", "distance_from_mode",
    "chi_log_density", "soap_bubble_store",
]  # fmt: skip


@dataclass(frozen=True)
class SoapBubbleConfig:
    name: str = "soap-bubble"
    kernel_shape: tuple[int, ...] = (128, 128, 3, 3)
    sigmas: tuple[float, ...] = (0.01, 0.03, 0.1)
    kernel_samples: int = 2000
    hidden: tuple[int, ...] = (1200, 1200)
    families: tuple[str, ...] = ("meanfield", "radial")
    init_std: float = math.log1p(math.exp(-6.0))
    epochs: int = 30
    batch_size: int = 128
    lr: float = 1e-3
    distance_samples: int = 8
    train_limit: int | None = None
    seed: int = 0


def soap_bubble_config(quick: bool = False) -> SoapBubbleConfig:
    """MLP 784-1200-1200-10 (2.4M weights), 30 epochs; ``quick``: a small kernel and a tiny run of the same code."""
    if quick:
        return SoapBubbleConfig(name="soap-bubble-quick", kernel_shape=(16, 8, 3, 3), kernel_samples=200, hidden=(32,), epochs=2,
                                train_limit=1000)  # fmt: skip
    return SoapBubbleConfig()


@torch.no_grad()
def distance_from_mode(model: nn.Module, samples: int = 8) -> float:
    """Average over ``samples`` draws of ``||w - mode||_2`` over every Bayesian tensor of ``model`` together."""
    total = 0.0
    for _ in range(samples):
        squared = 0.0
        for module in model.modules():
            if isinstance(module, BayesianModule):
                for _, posterior, _ in module.bayesian_tensors():
                    squared += float((posterior.rsample() - posterior.mode).square().sum())
        total += math.sqrt(squared)
    return total / samples


def _kernel_distances(config: SoapBubbleConfig, family_name: str, dev: torch.device) -> dict[str, Any]:
    """The kernel run of ``family_name``: ``kernel_samples`` distances from the mode at every sigma (6 digits)."""
    from varbnn.families import MeanField, Radial

    cls = {"meanfield": MeanField, "radial": Radial}[family_name]
    torch.manual_seed(config.seed)
    samples = {}
    for sigma in config.sigmas:
        family = cls(init_std=sigma).build(config.kernel_shape, torch.zeros(config.kernel_shape)).to(dev)
        with torch.no_grad():
            dist = torch.cat([
                (family.rsample((100,)) - family.mode).flatten(1).norm(dim=1).cpu()
                for _ in range(math.ceil(config.kernel_samples / 100))
            ])[: config.kernel_samples]  # fmt: skip
        samples[f"{family_name}@{sigma:g}"] = [float(f"{v:.6g}") for v in dist.tolist()]
    return {"run": "kernel", "family": family_name, "samples": samples}


def _train(config: SoapBubbleConfig, family_name: str, dev: torch.device, data_dir: str | None, progress: bool) -> dict[str, Any]:
    """The training run of ``family_name`` by :func:`varbnn.training.fit` (data-parallel under ``torchrun``): per epoch,
    the training loss (-ELBO / N), the training accuracy of the weight draw each batch was trained with, and the
    distance of sampled weights from the mode."""
    seed_everything(config.seed)
    x, y = load_mnist("train", data_dir)
    if config.train_limit:
        x, y = x[: config.train_limit], y[: config.train_limit]
    x, y = x.to(dev), y.to(dev)
    n = x.shape[0]
    family = make_family(family_name, init_std=config.init_std)
    model = bayesianize(mlp(784, config.hidden, 10), family, Normal(0, 1), pretrained=False).to(dev)
    history = [{"epoch": 0, "distance": distance_from_mode(model, config.distance_samples)}]
    counts = torch.zeros(2, dtype=torch.float64, device=dev)  # correct, seen: this epoch, this rank

    def nll(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        counts.add_(torch.stack([(logits.detach().argmax(-1) == target).sum(), torch.tensor(target.shape[0], device=dev)]))
        return F.cross_entropy(logits, target)

    def on_epoch_end(epoch: int, record: dict[str, float]) -> None:
        vdist.all_reduce_mean_([counts])  # the ranks' shares are equal: the mean of the counts is their sum's ratio
        history.append({"epoch": epoch, "train_loss": record["loss"], "train_accuracy": float(counts[0] / counts[1]),
                        "distance": distance_from_mode(model, config.distance_samples)})  # fmt: skip
        counts.zero_()

    t0 = time.perf_counter()
    fit(model, TensorBatches(*vdist.equal_share(x, y, config.batch_size)), n_data=n, epochs=config.epochs, nll=nll,
        kl_weight=1.0, optimizer=torch.optim.Adam(model.parameters(), lr=config.lr), device=dev, progress=progress,
        on_epoch_end=on_epoch_end, diagnose=False)  # fmt: skip
    return {"run": "train", "family": family_name, "history": history, "seconds": round(time.perf_counter() - t0, 1),
            "weights": sum(p.numel() for n_, p in model.named_parameters() if n_.endswith(".loc"))}  # fmt: skip


def _run_key(config: SoapBubbleConfig, data_dir: str | None, dev: torch.device, progress: bool, key: RunKey) -> dict[str, Any]:
    """The engine's run function: ``("kernel", family)`` or ``("train", family)``."""
    kind, family = key
    return _kernel_distances(config, family, dev) if kind == "kernel" else _train(config, family, dev, data_dir, progress)


def soap_bubble_store(config: SoapBubbleConfig, out: os.PathLike[str], shard: tuple[int, int] | None = None) -> RunStore:
    """The runs of ``config`` in folder ``out``, keyed by (``"kernel"`` or ``"train"``, family), under one protocol hash
    of every field but the name."""
    return RunStore.keyed(out, config.name, ("run", "family"), fingerprint(config_fields(config, drop=("name",))), shard)


def run_soap_bubble(
    config: SoapBubbleConfig,
    *, device: str | torch.device | None = "cpu", out_dir: str | os.PathLike[str] | None = None, data_dir: str | None = None,
    progress: bool = True, command: str | None = None, shard: tuple[int, int] | None = None, train: bool = True,
    workers: int = 1, distributed: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Run the kernel runs (both families) and the training runs (``config.families``) not yet in
    ``OUT/<name>_runs*.jsonl`` by the engine (:func:`varbnn_lab.engine.execute`: resumable, ``workers`` CPU
    processes, ``shard=(k, n)``, none if not ``train``; ``distributed``: each training run data-parallel under
    ``torchrun``, rank 0 writes), then write ``<name>.json``, ``.md`` and the figures (not for a shard).
    ``OUT``: ``out_dir``, by default ``benchmarks/results/<name>/``."""
    from varbnn_lab.figures import soap_bubble_figures

    call = open_run(config.name, out_dir, device, distributed, workers)
    out = call.out
    runs = [("kernel", "meanfield"), ("kernel", "radial"), *(("train", f) for f in config.families)]
    run = functools.partial(_run_key, config, data_dir, call.device, call.progress(progress))
    done = call.execute(runs, run, soap_bubble_store(config, out, shard), shard=shard, train=train)
    if not call.writes(shard):
        return {"name": config.name, "written": False}
    missing = [key for key in runs if key not in done]
    if missing:
        raise ValueError(f"{config.name}: runs {missing} are not saved in {out} (nothing to render; the page there is left "
                         "as it is)")  # fmt: skip
    samples = {k: v for family in ("meanfield", "radial") for k, v in done[("kernel", family)]["samples"].items()}
    kernel = {"dim": math.prod(config.kernel_shape), "sigmas": list(config.sigmas), "samples": samples}
    training = [{k: v for k, v in done[("train", f)].items() if k not in ("run", "protocol", "commit")}
                for f in config.families]  # fmt: skip
    result: dict[str, Any] = {
        "name": config.name,
        **call.provenance(command),
        "config": dataclasses.asdict(config),
        "kernel": {"dim": kernel["dim"], "mean_distance": {k: sum(v) / len(v) for k, v in samples.items()}},
        "training": training,
    }
    call.write_result(result, default=None)
    figures = soap_bubble_figures(kernel, training, out, config.name)
    return call.write_page(result, render_soap_bubble_markdown(result, figures))


def render_soap_bubble_markdown(result: dict[str, Any], figures: list[str]) -> str:
    """The page of a saved ``soap-bubble`` result (``figures``: the file names of its figures)."""
    config = result["config"]
    kernel_shape = tuple(config["kernel_shape"])
    distance = result["kernel"]["mean_distance"]
    kernel_rows = [
        [f"{s:g}", f"{distance[f'meanfield@{s:g}']:.4g}", f"{distance[f'radial@{s:g}']:.4g}"] for s in config["sigmas"]
    ]
    shown = (0, 1, 2, 5, 10, 20, 30, config["epochs"])  # the epochs in the training table
    training_rows = [
        [run["family"], f"{run['weights']:,}", str(h["epoch"]), f"{h.get('train_loss', float('nan')):.4f}",
         f"{h.get('train_accuracy', float('nan')):.4f}", f"{h['distance']:.4g}"]
        for run in result["training"]
        for h in run["history"]
        if h["epoch"] in shown and "train_loss" in h or h["epoch"] == 0
    ]  # fmt: skip
    lines = [
        f"# {result['name']}",
        "",
        "The soap bubble (Farquhar et al. 2020, Fig. 1, 3, 8): distance of weight samples from the mode.",
        "",
        *provenance_lines(result, seconds_digits=0),
        "",
        f"Kernel {kernel_shape} (D = {result['kernel']['dim']:,}), mean distance ||w - mu|| of {config['kernel_samples']} "
        "samples "
        "(analytic: Gaussian sigma * sqrt(2) Gamma((D+1)/2) / Gamma(D/2) ~ sigma sqrt(D) = "
        f"{math.sqrt(result['kernel']['dim']):.0f} sigma; "
        "radial sigma * sqrt(2/pi) = 0.80 sigma):",
        "",
        *markdown_table(["sigma", "mean-field", "radial"], kernel_rows),
        "",
        f"Training MLP 784-{'-'.join(map(str, config['hidden']))}-10 on MNIST with the full ELBO (no KL down-weighting), Adam "
        f"{config['lr']:g}, batch {config['batch_size']}, initial sigma {config['init_std']:.3g}, {config['epochs']} epochs:",
        "",
        *markdown_table(
            ["family", "weights", "epoch", "train loss (-ELBO / N)", "train accuracy (one draw)", "distance from mode"],
            training_rows,
        ),
        "",
        *[f"![{f}]({f})" for f in figures],
    ]
    return "\n".join(lines) + "\n"
