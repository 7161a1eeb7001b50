"""Whether a torch.func transform (vmap, grad, jacrev, ...) is active: most hand-written autograd Functions of the
families and KLs are not transform-ready (no ``setup_context``; the Bessel Functions of :mod:`varbnn.special` are, for
grad and vjp), so under a transform their callers take plain torch operations with the same values, which autograd
and vmap handle by themselves."""

from __future__ import annotations

import torch


def functorch_active() -> bool:
    """True inside a torch.func transform (e.g. ``varbnn.predict``'s vmap over draws)."""
    active = getattr(torch._C, "_are_functorch_transforms_active", None)
    return bool(active()) if active is not None else False
