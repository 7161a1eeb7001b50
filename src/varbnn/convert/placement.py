"""A replacement takes the place of the module it replaces: the plain module's device, the posteriors in its floating
dtype, and its forward and backward hooks (for :func:`bayesianize` and :func:`to_deterministic`).
"""

from __future__ import annotations

from torch import nn

from varbnn.nn.base import BayesianModule

# Forward and backward hooks registered on a module, carried over to the module that replaces it.
_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_backward_pre_hooks",
    "_backward_hooks",
)


def _place_like(new: nn.Module, source: nn.Module) -> None:
    """Put a converted module on the device of the plain one (its priors too), and its posteriors in its floating
    dtype (float16, bfloat16, float64 ...); the priors keep theirs, so that the KL is not summed in half precision."""
    reference = next(iter(source.parameters()), None)
    if reference is None:
        return
    new.to(device=reference.device)
    if reference.is_floating_point():
        targets = list(new.posteriors.values()) if isinstance(new, BayesianModule) else [new]
        for target in targets:
            target.to(dtype=reference.dtype)


def _carry_hooks(source: nn.Module, new: nn.Module) -> None:
    """The forward (pre-)hooks and backward hooks registered on the plain module run on its replacement too."""
    for attribute in _HOOK_DICTS:
        hooks, target = getattr(source, attribute, None), getattr(new, attribute, None)
        if hooks and target is not None:
            target.update(hooks)
    if source._backward_hooks or source._backward_pre_hooks:
        new._is_full_backward_hook = source._is_full_backward_hook
