"""Plain reference architectures (no torchvision), to be ``bayesianize``d."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = [
    "mlp", "lenet5", "RowLSTM", "row_lstm", "BasicBlock", "ResNet", "resnet18", "vgg_small", "MODELS", "make_model",
]  # fmt: skip


def mlp(in_features: int, hidden: Sequence[int], out_features: int, activation: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    """``Flatten -> [Linear -> activation] * len(hidden) -> Linear``: ``in_features`` inputs (after flattening), one
    hidden layer per entry of ``hidden`` (its width), ``out_features`` outputs, ``activation`` a module class (default
    ``nn.ReLU``)."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = in_features
    for h in hidden:
        layers += [nn.Linear(width, h), activation()]
        width = h
    layers.append(nn.Linear(width, out_features))
    return nn.Sequential(*layers)


def lenet5(in_channels: int = 1, num_classes: int = 10, widths: tuple[int, int, int] = (20, 50, 500)) -> nn.Sequential:
    """LeNet-5-Caffe for 28x28 inputs: conv(c1, 5x5) - pool - conv(c2, 5x5) - pool - fc h - fc classes, with
    ``widths = (c1, c2, h)`` (default the original 20-50-500; smaller ones, e.g. a pruned architecture's, for a model
    trained from scratch at that size)."""
    if len(widths) != 3 or not all(isinstance(w, int) and w > 0 for w in widths):
        raise ValueError(f"widths must be three positive integers (conv1, conv2, fc1 outputs), got {widths!r}")
    c1, c2, hidden = widths
    return nn.Sequential(
        nn.Conv2d(in_channels, c1, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(c2 * 4 * 4, hidden),
        nn.ReLU(),
        nn.Linear(hidden, num_classes),
    )


class RowLSTM(nn.Module):
    """Reads an image one row at a time: ``[N, (C,) rows, features]`` -> LSTM -> last hidden state -> Linear.

    The stand-in for the k-tied paper's IMDB LSTM (whose data cannot be had here): an MNIST image is 28 steps
    of 28 features. The LSTM is ``self.lstm`` and the classifier ``self.head``.
    """

    def __init__(self, rows: int = 28, features: int = 28, hidden: int = 128, num_classes: int = 10, num_layers: int = 1) -> None:
        super().__init__()
        self.rows, self.features = rows, features
        self.lstm = nn.LSTM(features, hidden, num_layers=num_layers, batch_first=True)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() != x.shape[0] * self.rows * self.features:
            raise ValueError(
                f"RowLSTM expects {self.rows} rows of {self.features} features per example, got input of shape {tuple(x.shape)}"
            )
        out, _ = self.lstm(x.reshape(x.shape[0], self.rows, self.features))
        return self.head(out[:, -1])


def row_lstm(rows: int = 28, features: int = 28, hidden: int = 128, num_classes: int = 10, num_layers: int = 1) -> RowLSTM:
    """:class:`RowLSTM` (defaults: MNIST rows, 128 hidden units, 10 classes): ``rows`` time steps of ``features``
    inputs, an LSTM of ``num_layers`` layers of ``hidden`` units, a Linear head to ``num_classes`` logits."""
    return RowLSTM(rows, features, hidden, num_classes, num_layers)


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 convolutions with batch norm, identity (or 1x1 projection) shortcut."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet for 32x32 inputs (He et al. 2016, CIFAR variant: 3x3 stem, no max-pool), global average pool, Linear.

    ``blocks``: basic blocks in each of the 4 stages (default ``(2, 2, 2, 2)``: ResNet-18); the stages have ``width``,
    2, 4 and 8 times ``width`` channels (default 64), the last three starting with a stride of 2; ``in_channels``
    image channels (default 3), ``num_classes`` logits (default 10).
    """

    def __init__(
        self, blocks: Sequence[int] = (2, 2, 2, 2), num_classes: int = 10, in_channels: int = 3, width: int = 64
    ) -> None:
        super().__init__()
        if len(blocks) != 4 or any(b < 1 for b in blocks):
            raise ValueError(f"ResNet: blocks must be 4 positive counts, got {tuple(blocks)}")
        self.conv1 = nn.Conv2d(in_channels, width, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        stages: list[nn.Module] = []
        in_planes = width
        for i, count in enumerate(blocks):
            planes = width * 2**i
            for j in range(count):
                stages.append(BasicBlock(in_planes, planes, stride=2 if (i > 0 and j == 0) else 1))
                in_planes = planes
        self.layers = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.pool(self.layers(out)).flatten(1)
        return self.fc(out)


def resnet18(num_classes: int = 10, in_channels: int = 3, width: int = 64) -> ResNet:
    """ResNet-18 for 32x32 images (11.2M parameters at width 64, 10 classes); defined here, no torchvision."""
    return ResNet((2, 2, 2, 2), num_classes, in_channels, width)


def vgg_small(in_channels: int = 3, width: int = 16, num_classes: int = 2) -> nn.Module:
    """Three VGG blocks (two 3x3 convolutions + ReLU each, then 2x2 max-pool; ``width``, 2x, 4x channels), the
    concatenated global mean and max pool, one dense layer."""
    layers: list[nn.Module] = []
    channels = in_channels
    for out in (width, 2 * width, 4 * width):
        layers += [
            nn.Conv2d(channels, out, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(out, out, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        ]
        channels = out
    return nn.Sequential(*layers, _MeanMaxPool(), nn.Linear(2 * channels, num_classes))


class _MeanMaxPool(nn.Module):
    """The global mean and the global max pool of each channel, concatenated: ``[N, C, H, W] -> [N, 2C]``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x.mean(dim=(2, 3)), x.amax(dim=(2, 3))], dim=1)


MODELS = {"mlp": mlp, "lenet5": lenet5, "row_lstm": row_lstm, "resnet18": resnet18, "vgg_small": vgg_small}
"""Every model builder by the name experiment configs use (:func:`make_model`)."""


def make_model(name: str, **kwargs: object) -> nn.Module:
    """``MODELS[name](**kwargs)``: a plain model by name; allowed names: the keys of :data:`MODELS` (another name
    raises a ``ValueError`` listing them)."""
    try:
        return MODELS[name](**kwargs)  # type: ignore[operator]
    except KeyError:
        raise ValueError(f"unknown model name {name!r}; allowed: {sorted(MODELS)}") from None
