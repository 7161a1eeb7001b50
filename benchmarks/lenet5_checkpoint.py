"""The finished lenet5-prune checkpoint and its data split, for the benchmarks that study its pruning
(prune_retraining.py, prune_capacity.py)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from varbnn_lab.config import ExperimentConfig
from varbnn_lab.registry import CONFIGS
from varbnn_lab.runner import _checkpoint_path, build_model, load_classification

Pair = tuple[torch.Tensor, torch.Tensor]


@dataclass
class TrainedLeNet:
    config: ExperimentConfig
    model: torch.nn.Module
    path: Path  # the checkpoint of the evaluated epoch
    epoch: int
    train: Pair  # the first 50,000 training images
    validation: Pair  # the last 10,000
    test: Pair


def load_trained(out: str | Path, data_dir: str | None, device: torch.device) -> TrainedLeNet:
    """lenet5-prune's model at its evaluated epoch (under ``out/.checkpoints/``, ``out`` being lenet5-prune's folder:
    ``benchmarks/results/lenet5-prune/`` by default), or exit naming the command that makes it."""
    config = CONFIGS["lenet5-prune"]
    variant = config.variants[0]
    path = _checkpoint_path(config, out, variant, config.seeds[0]).with_suffix(".best.pt")
    if not path.exists():
        sys.exit(f"no finished lenet5-prune checkpoint at {path}: run `varbnn reproduce lenet5-prune` first")
    torch.manual_seed(0)
    model = build_model(config, variant).to(device)
    best: dict[str, Any] = torch.load(path, map_location=device, weights_only=True)
    model.load_state_dict(best["model"])
    x_train, y_train = load_classification(config.dataset, "train", data_dir)
    n_val = config.validation_size
    return TrainedLeNet(
        config=config, model=model, path=path, epoch=int(best["epoch"]),
        train=(x_train[:-n_val], y_train[:-n_val]), validation=(x_train[-n_val:], y_train[-n_val:]),
        test=load_classification(config.dataset, "test", data_dir),
    )  # fmt: skip
