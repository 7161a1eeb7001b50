"""Argument checks shared by constructors and functions: numbers of any numeric type in, Python numbers out.

A numeric argument may be a Python ``int``/``float``, a NumPy scalar (``np.int64``, ``np.float32``, ...), a 0-d
NumPy array or a 0-d tensor; it comes back as a plain ``int`` or ``float`` (so that it can be stored in configs, printed
and compared). ``bool`` is refused where a number is expected (``True`` is an ``int`` to Python, never a sensible
count or scale), and so are NaN, infinities, numbers float32 cannot hold (a magnitude above 3.4e38, which becomes
inf, or a non-zero one below 1.2e-38, which becomes 0 or loses its precision: the parameters, the losses and the
tensors these numbers meet are float32 or narrower), strings and tensors with more than one element. Every error is a
``ValueError`` that names the argument and the allowed range (a non-number raises :class:`ArgumentTypeError`, which is
both a ``TypeError`` and a ``ValueError``, so ``except ValueError`` catches every bad argument).

    >>> as_positive_int(np.int64(2), "rank")
    2
    >>> as_float_in(torch.tensor(0.01), "init_std", 1e-8, 1e2)
    0.01
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import Any

import torch

__all__ = [
    "ArgumentTypeError", "FLOAT32_MAX", "FLOAT32_TINY", "as_int", "as_positive_int", "as_float", "as_float_in",
    "as_bool", "describe_range", "check_class_labels", "check_batch",
]  # fmt: skip


FLOAT32_MAX = 3.4028234663852886e38
"""The largest finite float32: a number above it in magnitude is infinite in a float32 tensor."""
FLOAT32_TINY = 1.1754943508222875e-38
"""The smallest normal float32: a non-zero number below it in magnitude is 0 or a denormal in a float32 tensor."""


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type (a bool, a string, a tensor with several elements where a number is expected)."""


def _prefix(name: str, owner: str | None) -> str:
    return f"{owner}: {name}" if owner else name


def _is_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return False
    if isinstance(value, torch.Tensor):
        return value.dtype == torch.bool
    return getattr(dtype, "kind", None) == "b"  # NumPy bool scalar or array


def _scalar(value: Any, what: str, name: str, owner: str | None) -> Any:
    """``value`` itself if it is a number-like scalar (Python, NumPy or a one-element 0-d tensor / array), else raise."""
    if _is_bool(value):
        raise ArgumentTypeError(f"{_prefix(name, owner)} must be {what}, got a bool ({value!r})")
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            shape = tuple(value.shape)
            raise ArgumentTypeError(f"{_prefix(name, owner)} must be {what} (a 0-d tensor at most), got shape {shape}")
        if value.is_complex():
            raise ArgumentTypeError(f"{_prefix(name, owner)} must be {what}, got a complex tensor")
        return value.detach().cpu()
    if isinstance(value, numbers.Real):
        return value
    if getattr(value, "shape", None) == () and getattr(getattr(value, "dtype", None), "kind", None) in ("i", "u", "f"):
        return value  # a 0-d NumPy array
    raise ArgumentTypeError(f"{_prefix(name, owner)} must be {what}, got {type(value).__name__} ({value!r})")


def describe_range(low: float | None, high: float | None, low_open: bool = False, high_open: bool = False) -> str:
    """``"in [1e-08, 100]"``, ``"> 0"``, ``">= 1"``, ...: the phrase the error messages use."""
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low:g}"
    if high is not None:
        return f"{'<' if high_open else '<='} {high:g}"
    return "finite"


def as_int(value: Any, name: str, low: int | None = None, high: int | None = None, *, owner: str | None = None) -> int:
    """``value`` as a Python ``int`` (via ``operator.index``: ints, NumPy integers, 0-d integer tensors), checked to lie in
    ``[low, high]`` (either bound may be None). Floats, even integral ones, are refused: counts are integers."""
    allowed = "an int" + ("" if low is None and high is None else f" {describe_range(low, high)}")
    scalar = _scalar(value, allowed, name, owner)
    try:
        number = operator.index(scalar)
    except TypeError:
        raise ArgumentTypeError(f"{_prefix(name, owner)} must be {allowed}, got {value!r}") from None
    if (low is not None and number < low) or (high is not None and number > high):
        raise ValueError(f"{_prefix(name, owner)} must be {allowed}, got {number}")
    return number


def as_positive_int(value: Any, name: str, *, owner: str | None = None) -> int:
    """``value`` as a Python ``int`` >= 1 (see :func:`as_int`)."""
    return as_int(value, name, low=1, owner=owner)


def as_float(value: Any, name: str, *, owner: str | None = None) -> float:
    """``value`` as a finite Python ``float`` (ints, floats, NumPy scalars, 0-d tensors; not bools, NaN or inf)."""
    return as_float_in(value, name, None, None, owner=owner)


def as_float_in(
    value: Any,
    name: str,
    low: float | None,
    high: float | None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    owner: str | None = None,
) -> float:
    """``value`` as a finite Python ``float`` in the interval from ``low`` to ``high`` (closed unless ``low_open`` /
    ``high_open``; a None bound is no bound). The error names the argument and the interval."""
    allowed = "a finite number" + ("" if low is None and high is None else f" {describe_range(low, high, low_open, high_open)}")
    number = float(_scalar(value, allowed, name, owner))
    too_low = low is not None and (number <= low if low_open else number < low)
    too_high = high is not None and (number >= high if high_open else number > high)
    if not math.isfinite(number) or too_low or too_high:
        raise ValueError(f"{_prefix(name, owner)} must be {allowed}, got {value!r}")
    if abs(number) > FLOAT32_MAX or 0 < abs(number) < FLOAT32_TINY:
        raise ValueError(
            f"{_prefix(name, owner)} must be {allowed} that float32 can hold (a magnitude from {FLOAT32_TINY:.4g} to "
            f"{FLOAT32_MAX:.4g}, or 0), got {value!r}: float32 turns it into {'inf' if abs(number) > 1 else '0'}"
        )
    return number


def as_bool(value: Any, name: str, *, owner: str | None = None) -> bool:
    """``value`` as a Python ``bool``: ``True``/``False``, a NumPy bool or a 0-d bool tensor; nothing else (a string
    such as ``"False"`` would otherwise read as true)."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and value.dtype == torch.bool:
        return bool(value.item())
    if _is_bool(value) and getattr(value, "shape", ()) == ():
        return bool(value)
    raise ArgumentTypeError(f"{_prefix(name, owner)} must be True or False, got {type(value).__name__} ({value!r})")


def check_class_labels(labels: torch.Tensor, classes: int, name: str, *, owner: str | None = None) -> None:
    """Refuse ``labels`` that are not integer class indices in ``[0, classes)`` (float or bool labels, e.g. regression
    targets, and out-of-range values such as cross-entropy's ignore index -100), with a ``ValueError`` naming them."""
    if labels.is_floating_point() or labels.dtype == torch.bool:
        raise ValueError(
            f"{_prefix(name, owner)} must hold integer class indices, got dtype {labels.dtype} (regression targets? "
            "use likelihood=Gaussian() or HeteroscedasticGaussian())"
        )
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= classes):
        raise ValueError(
            f"{_prefix(name, owner)} must hold class indices in [0, {classes}), got values from {int(labels.min())} "
            f"to {int(labels.max())}"
        )


def check_batch(batch: Any, index: int, owner: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A loader's batch as ``(x, y)`` tensors, or an :class:`ArgumentTypeError` naming ``owner`` and what the loader
    yielded instead (a dict, a tuple of another length, something other than tensors)."""
    head = f"{owner}: the loader must yield (x, y) batches of tensors; batch {index}"
    if isinstance(batch, dict):
        raise ArgumentTypeError(
            f"{head} is a dict with keys {sorted(map(str, batch))}: wrap the loader, e.g. ((b['image'], b['label']) for "
            "b in loader), or give the dataset a __getitem__ that returns (x, y)"
        )
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        what = f"a {type(batch).__name__} of {len(batch)} items" if isinstance(batch, (tuple, list)) else type(batch).__name__
        raise ArgumentTypeError(f"{head} is {what}")
    x, y = batch
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise ArgumentTypeError(
            f"{head} holds a {type(x).__name__} and a {type(y).__name__} (a DataLoader over a TensorDataset, or convert "
            "them with torch.as_tensor)"
        )
    return x, y
