"""Plain reference architectures (no torchvision), to be ``bayesianize``d."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

__all__ = ["mlp", "lenet5", "MODELS", "make_model"]


def mlp(in_features: int, hidden: Sequence[int], out_features: int, activation: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    """Flatten -> [Linear -> activation] * len(hidden) -> Linear."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = in_features
    for h in hidden:
        layers += [nn.Linear(width, h), activation()]
        width = h
    layers.append(nn.Linear(width, out_features))
    return nn.Sequential(*layers)


def lenet5(in_channels: int = 1, num_classes: int = 10) -> nn.Sequential:
    """LeNet-5-Caffe for 28x28 inputs: conv(20, 5x5) - pool - conv(50, 5x5) - pool - fc 500 - fc classes."""
    return nn.Sequential(
        nn.Conv2d(in_channels, 20, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(20, 50, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(50 * 4 * 4, 500),
        nn.ReLU(),
        nn.Linear(500, num_classes),
    )


MODELS = {"mlp": mlp, "lenet5": lenet5}


def make_model(name: str, **kwargs: object) -> nn.Module:
    """Build a plain model by name; allowed names: the keys of :data:`MODELS`."""
    try:
        return MODELS[name](**kwargs)  # type: ignore[operator]
    except KeyError:
        raise ValueError(f"unknown model name {name!r}; allowed: {sorted(MODELS)}") from None
