"""The named experiment configs of ``varbnn reproduce NAME``; later work adds configs here, not loops."""

from __future__ import annotations

from varbnn.experiments.config import ExperimentConfig, Variant

__all__ = ["CONFIGS", "get_config", "register_config"]

CONFIGS: dict[str, ExperimentConfig] = {}


def register_config(config: ExperimentConfig) -> ExperimentConfig:
    if config.name in CONFIGS:
        raise ValueError(f"experiment {config.name!r} is already registered")
    CONFIGS[config.name] = config
    return config


def get_config(name: str, quick: bool = False) -> ExperimentConfig:
    """The config called ``name`` (its ``--quick`` form if ``quick``); allowed names: :data:`CONFIGS`."""
    try:
        config = CONFIGS[name]
    except KeyError:
        raise ValueError(f"unknown experiment {name!r}; allowed: {sorted(CONFIGS)}") from None
    return config.quick_variant() if quick else config


register_config(
    ExperimentConfig(
        name="demo",
        description="Plain MLP vs mean-field BNN on scikit-learn's bundled 8x8 digits (offline).",
        dataset="digits",
        model="mlp",
        model_options={"in_features": 64, "hidden": (128, 128), "out_features": 10},
        variants=(
            Variant("plain MLP", family="plain"),
            Variant("mean-field BNN", family="meanfield", family_options={"init_std": 1e-3, "estimator": "local"}),
        ),
        epochs=150,
        batch_size=64,
        lr=3e-3,
        seeds=(0,),
        eval_samples=64,
        quick={"epochs": 5},
    )
)

register_config(
    ExperimentConfig(
        name="mnist-mlp",
        description="MLP 784-400-400-10 on MNIST: plain, MAP (L2), and mean-field with each estimator.",
        dataset="mnist",
        model="mlp",
        model_options={"in_features": 784, "hidden": (400, 400), "out_features": 10},
        variants=(
            Variant("plain", family="plain"),
            Variant("MAP, Normal(0, 1) prior", family="delta"),
            Variant("mean-field, reparam", family_options={"init_std": 1e-3, "estimator": "reparam"}),
            Variant("mean-field, local", family_options={"init_std": 1e-3, "estimator": "local"}),
            Variant("mean-field, flipout", family_options={"init_std": 1e-3, "estimator": "flipout"}),
        ),
        epochs=20,
        batch_size=128,
        lr=1e-3,
        seeds=(0, 1, 2),
        eval_samples=32,
        quick={"epochs": 1, "seeds": (0,), "train_limit": 2000, "test_limit": 500, "eval_samples": 4},
    )
)
