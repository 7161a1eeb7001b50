"""What a training run is set up with: the device, the seeds, the default optimizer."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

from varbnn.priors import Prior

NLLFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


BetaSchedule = Callable[[int], float]


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def resolve_device(device: str | torch.device | None, model: nn.Module | None = None) -> torch.device:
    """``None``/"auto" -> cuda if available else cpu; ``"model"`` -> the device of ``model``'s first parameter (or
    buffer; cpu for a model with neither); otherwise the named device, checked to exist."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device, str) and device == "model":
        if model is None:
            raise ValueError("device='model' needs a model to take the device from")
        tensor = next(itertools.chain(model.parameters(), model.buffers()), None)
        return tensor.device if tensor is not None else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"device must be 'model', 'auto', None, or a torch device such as 'cpu', 'cuda' or 'cuda:1'; got {device!r}"
        ) from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but torch.cuda.is_available() is False")
    return dev


def _has_adaptive_prior(model: nn.Module) -> bool:
    return any(isinstance(m, Prior) and m.adaptive for m in model.modules())


_FUSED_ADAM_DEVICES = ("cpu", "cuda")


def default_optimizer(
    params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]], lr: float = 1e-3, amsgrad: bool = False
) -> torch.optim.Optimizer:
    """What :func:`fit` (and the experiment runners) use when given no optimizer: ``torch.optim.Adam(params, lr,
    amsgrad)``, with ``fused=True`` (one kernel per tensor for the whole update) where torch supports it for every
    parameter (floating point, on the CPU or a GPU), else the default implementation. Same algorithm; the fused update
    rounds differently in the last bits, and on the CPU it is several times faster for models with many tensors (a
    Bayesian layer has two or more per weight)."""
    groups: list[Any] = list(params)
    tensors = [t for g in groups for t in (g["params"] if isinstance(g, dict) else [g])]
    fused = bool(tensors) and all(t.is_floating_point() and t.device.type in _FUSED_ADAM_DEVICES for t in tensors)
    return torch.optim.Adam(groups, lr=lr, amsgrad=amsgrad, fused=fused or None)
