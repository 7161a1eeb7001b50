"""A small training loop: ELBO steps, adaptive-prior updates, progress bar, checkpoints, evaluation.

The four calls of the user story are ``bayesianize`` -> :func:`fit` -> :func:`varbnn.predict.predict` ->
:func:`evaluate`; :func:`fit` and :func:`evaluate` are also ``varbnn.fit`` and ``varbnn.evaluate``. Checkpoints are
written by :func:`save_checkpoint` (format :data:`CHECKPOINT_FORMAT`, version :data:`CHECKPOINT_VERSION`) and read
back by :func:`read_checkpoint` / :func:`load_checkpoint`.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import logging
import math
import os
import pickle
import random
import re
import struct
import sys
import tempfile
import time
import types
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from varbnn import metrics, philox
from varbnn._checks import as_bool, as_float_in, as_int, as_positive_int
from varbnn.data.batches import fast_batches
from varbnn.likelihoods import Likelihood, as_likelihood
from varbnn.objectives import (
    ELBOTerms,
    _training_set_size,
    default_kl_weight,
    elbo_loss,
    graves_gradients,
    uses_graves_estimator,
)
from varbnn.predict import classification_summary, predict
from varbnn.priors import update_adaptive_priors

__all__ = [
    "fit",
    "evaluate",
    "TrainingWarning",
    "NonFiniteError",
    "CheckpointError",
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_VERSION",
    "read_checkpoint",
    "default_optimizer",
    "evaluate_classifier",
    "evaluate_weight_samples",
    "save_checkpoint",
    "load_checkpoint",
    "seed_everything",
    "resolve_device",
    "keep_freed_memory",
]

logger = logging.getLogger("varbnn.train")
"""Every finished epoch of :func:`fit` is logged here at INFO (loss, NLL, KL, beta): ``logging.basicConfig(level=INFO)``."""

NLLFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
BetaSchedule = Callable[[int], float]


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's largest M_MMAP_THRESHOLD on 64-bit systems


def keep_freed_memory(trim_threshold: int = 1 << 30, mmap_threshold: int = _MMAP_THRESHOLD_MAX) -> bool:
    """Ask glibc's allocator (Linux) to keep the memory a training step frees for the next step, instead of returning
    the top of its heap to the system after each step and faulting it back in, page by page, on the next: a process-wide
    setting, for CPU training, made once before training (it does not affect GPU memory).

    A Bayesian step allocates and frees tensors of its weights' size every step (noise, draws, gradients), which glibc's
    defaults return to the system and fault back in, page by page. In interleaved A/B runs
    (``benchmarks/ab_step.py``, ``benchmarks/results/step-time/studies/ab_*_glibc_keep_heap.md``) the setting made compiled
    MeanField reparam steps 12% faster, eager ones 7%, compiled RadialDirectional (double grouping) 18%, torchbnn's
    5%, and left the plain network's step unchanged. The process keeps up to ``trim_threshold`` bytes of freed heap
    that it would otherwise give back (its resident memory stays at its peak), and tensors up to ``mmap_threshold``
    bytes come from the heap rather than from their own mappings. The same from the shell, without code:
    ``MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_MMAP_THRESHOLD_=33554432 python train.py``.

    :param trim_threshold: bytes of free memory at the heap's top that glibc keeps (default 1 GiB), an int >= 0.
    :param mmap_threshold: allocations of at least this many bytes get their own mapping (default 32 MiB, glibc's
        largest), an int in ``[0, 32 MiB]``.
    :returns: ``True`` when glibc took both settings, ``False`` where there is no glibc (macOS, Windows, musl):
        nothing changes there.
    """
    trim_threshold = as_int(trim_threshold, "trim_threshold", low=0, owner="keep_freed_memory")
    mmap_threshold = as_int(mmap_threshold, "mmap_threshold", low=0, high=_MMAP_THRESHOLD_MAX, owner="keep_freed_memory")
    import ctypes
    import ctypes.util

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # no C library with mallopt (e.g. musl)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_TRIM_THRESHOLD, min(trim_threshold, 2**31 - 1))) and bool(
        mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
    )


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


class NonFiniteError(ValueError, FloatingPointError):
    """A NaN or infinite value met in training.

    ``kind`` says where: ``"data"`` (a batch's inputs or floating-point targets), ``"loss"`` (the step's loss),
    ``"gradient"`` (a parameter's gradient after ``backward``, before ``optimizer.step``) or ``"parameters"`` (a
    parameter, checked before a checkpoint is written); ``epoch`` (1-based), ``step`` (the global optimizer step the
    batch was for, 1-based, as in ``on_step_end``) and ``batch`` (0-based index within the epoch) say when, ``None``
    outside a training step. Both a ``ValueError`` (bad data) and a ``FloatingPointError`` (numerics), so either
    ``except`` clause catches it.
    """

    def __init__(
        self, message: str, *, kind: str = "", epoch: int | None = None, step: int | None = None, batch: int | None = None
    ) -> None:
        super().__init__(message)
        self.kind, self.epoch, self.step, self.batch = kind, epoch, step, batch


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used: empty, truncated or not a torch file; not written by
    :func:`save_checkpoint` (other Python objects, or a dict without a ``"model"`` entry); damaged (its sha256 checksum
    does not match its content); missing the entries a resume needs; holding NaN/inf parameters or optimizer state; or
    not fitting the model. The message names the file (also in ``path``) and what is wrong."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        super().__init__(f"checkpoint {os.fspath(path)}: {problem}")
        self.path, self.problem = Path(path), problem

    def __reduce__(self) -> tuple[Any, ...]:  # picklable (e.g. across worker processes)
        return type(self), (self.path, self.problem)


CHECKPOINT_FORMAT = "varbnn-checkpoint"
"""The ``"format"`` entry of every file :func:`save_checkpoint` writes (and the start of its checksum trailer)."""
CHECKPOINT_VERSION = 1
"""The ``"version"`` entry of the checkpoints this version writes; :func:`read_checkpoint` reads versions 1 to this one
and refuses newer files."""
_RESERVED_KEYS = ("format", "version", "model", "optimizer")


_PLAIN_SCALARS = (type(None), bool, int, float, complex, str, torch.dtype, torch.device)


def _check_plain_data(value: Any, where: str) -> None:
    """Refuse (``TypeError``, naming the entry) anything ``torch.load(weights_only=True)`` would not load back."""
    kind = type(value)
    if kind in _PLAIN_SCALARS:
        return
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_quantized:
            raise TypeError(f"checkpoint entry {where}: only dense tensors can be stored, got layout {value.layout}")
    elif kind in (dict, OrderedDict):
        for key, item in value.items():
            _check_plain_data(key, f"{where} (a key)")
            _check_plain_data(item, f"{where}[{key!r}]")
    elif kind in (list, tuple, torch.Size):
        for index, item in enumerate(value):
            _check_plain_data(item, f"{where}[{index}]")
    else:
        raise TypeError(
            f"checkpoint entry {where} is a {kind.__module__}.{kind.__qualname__}: checkpoints hold plain data only "
            "(None, bool, int, float, str, tensors, and dicts, lists and tuples of these), so that they load with "
            "torch.load(weights_only=True)"
        )


# The checksum trailer: the zip archive's comment (after the end-of-central-directory record) holds the sha256 of
# every byte of the file before it, so any flipped bit or byte, anywhere, is detected; torch.load ignores it.
_EOCD_SIGNATURE = b"PK\x05\x06"
_EOCD_SIZE = 22
_TRAILER_PREFIX = b"varbnn-checkpoint v1 sha256="
_TRAILER_SIZE = len(_TRAILER_PREFIX) + 64


def _with_checksum(archive: bytes) -> bytes:
    """``archive`` (torch.save's zip, no comment) with the checksum trailer as its zip comment."""
    if len(archive) < _EOCD_SIZE or archive[-_EOCD_SIZE : -_EOCD_SIZE + 4] != _EOCD_SIGNATURE or archive[-2:] != b"\0\0":
        raise RuntimeError("torch.save wrote an unexpected archive layout: cannot append the checksum")
    body = archive[:-2] + struct.pack("<H", _TRAILER_SIZE) + _TRAILER_PREFIX
    return body + hashlib.sha256(body).hexdigest().encode()


def _verify_checksum(path: Path, data: bytes) -> bool:
    """True when ``data`` ends with a checksum trailer that matches (``CheckpointError`` when one is there but does
    not match); False when there is none (a file not written by :func:`save_checkpoint`, or written before
    checksums existed)."""
    eocd = len(data) - _TRAILER_SIZE - _EOCD_SIZE
    if eocd < 0 or data[eocd : eocd + 4] != _EOCD_SIGNATURE:
        return False
    body, stored = data[: -64], data[-64:]
    if data[-_TRAILER_SIZE:-64] != _TRAILER_PREFIX or data[eocd + 20 : eocd + 22] != struct.pack("<H", _TRAILER_SIZE):
        raise CheckpointError(path, "damaged: its checksum trailer is corrupt (a flipped bit or byte at the end of the file)")
    if hashlib.sha256(body).hexdigest().encode() != stored:
        raise CheckpointError(
            path,
            "damaged: its sha256 checksum does not match its content (a flipped bit or byte, or a partial write); "
            "restore it from a copy or delete it to start over",
        )
    return True


_TMP_NAME = re.compile(r"\.(?P<name>.+)\.[A-Za-z0-9_]{8}\.tmp")


def _write_bytes(file: BinaryIO, data: bytes, chunk: int = 1 << 24) -> None:
    view = memoryview(data)
    for start in range(0, len(view), chunk):
        file.write(view[start : start + chunk])


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file in the same directory: write, flush, ``fsync`` the file, ``os.replace``,
    then ``fsync`` the directory (best effort). An interrupted write leaves the previous file intact; temp files left
    by earlier saves that were killed (``.<name>.XXXXXXXX.tmp``, older than this one) are removed afterwards."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        created = os.stat(handle).st_mtime_ns
        with os.fdopen(handle, "wb") as file:
            _write_bytes(file, data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError:  # not supported everywhere (e.g. Windows); the rename itself is done
        pass
    _remove_orphaned_temp_files(path, created)


def _remove_orphaned_temp_files(path: Path, before_ns: int) -> None:
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return
    for entry in entries:
        match = _TMP_NAME.fullmatch(entry.name)
        if match is None or match["name"] != path.name:
            continue
        try:
            if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime_ns < before_ns:
                os.unlink(entry.path)
        except OSError:  # removed meanwhile, or not ours to remove
            pass


def _nonfinite_names(named: Iterable[tuple[str, Any]]) -> list[str]:
    return [
        name
        for name, value in named
        if isinstance(value, torch.Tensor)
        and (value.is_floating_point() or value.is_complex())
        and not bool(torch.isfinite(value).all())
    ]


def _listing(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def save_checkpoint(
    path: str | os.PathLike[str],
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    allow_nonfinite: bool = False,
    **extra: Any,
) -> Path:
    """Write ``{"format", "version", "model", "optimizer", **extra}`` with a sha256 checksum, atomically and durably.

    ``model`` and ``optimizer`` are stored as state dicts; ``extra`` values must be plain data (None, bool, int,
    float, str, tensors, and dicts, lists and tuples of these; a ``TypeError`` otherwise), so that the file loads
    with ``torch.load(weights_only=True)``. The file is ``torch.save``'s zip archive whose zip comment (the last
    92 bytes) is ``varbnn-checkpoint v1 sha256=<hex>``: the sha256 of every byte before it, verified by
    :func:`read_checkpoint`, so a flipped bit or byte anywhere is detected. It is still an ordinary torch file:
    ``torch.load(path, weights_only=True)["model"]`` works.

    The write goes to a temp file in the same directory, is flushed and ``fsync``-ed, renamed over ``path``
    (``os.replace``) and the directory is ``fsync``-ed: a save interrupted at any point leaves the previous checkpoint
    intact. Temp files of earlier saves that were killed are removed. Parameters holding NaN or inf are refused
    (:class:`NonFiniteError`, nothing written) unless ``allow_nonfinite``.
    """
    path = Path(path)
    reserved = sorted(set(extra) & set(_RESERVED_KEYS))
    if reserved:
        raise ValueError(f"save_checkpoint: {reserved} are reserved checkpoint entries, not allowed in extra")
    if not allow_nonfinite:
        bad = _nonfinite_names(model.named_parameters())
        if bad:
            raise NonFiniteError(
                f"refusing to write checkpoint {path}: parameters {_listing(bad)} hold NaN or inf values (the "
                "previous checkpoint, if any, is kept; pass allow_nonfinite=True to write it anyway)",
                kind="parameters",
            )
    state: dict[str, Any] = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer else None,
        **extra,
    }
    _write_checkpoint_state(path, state)
    return path


def _write_checkpoint_state(path: Path, state: dict[str, Any]) -> None:
    """``state`` (plain data) as a checkpoint file: ``format`` and ``version`` added where missing, torch.save'd with
    the checksum trailer, written atomically (:func:`save_checkpoint`'s file; read back by :func:`read_checkpoint`)."""
    state = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, **state}
    _check_plain_data(state, "checkpoint")
    buffer = io.BytesIO()
    torch.save(state, buffer)
    _write_atomically(path, _with_checksum(buffer.getvalue()))


def _reason(error: BaseException) -> str:
    """The first line of an exception's message, shortened; never torch's advice about ``weights_only``."""
    lines = str(error).strip().splitlines()
    text = (lines[0] if lines else "").split(". ")[0]
    if "weights_only" in text or "weights only" in text.lower():
        text = ""
    if len(text) > 160:
        text = text[:157] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def read_checkpoint(path: str | os.PathLike[str], map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The verified content of a checkpoint written by :func:`save_checkpoint`, loaded with ``weights_only=True``.

    Raises :class:`CheckpointError` naming the file and the problem when it is empty, truncated or not a torch file,
    holds objects other than plain data, is not a dict with a ``"model"`` entry, or its checksum does not match its
    bytes (a flipped bit or byte anywhere); ``FileNotFoundError`` when it does not exist. A file written before
    checksums existed (a dict with ``"model"``, no ``"format"`` entry and no checksum) is loaded unverified with a
    ``UserWarning``; saving it again adds the checksum. ``map_location``: where to load the tensors (a device, checked
    first: an unknown name or an absent CUDA is a ``ValueError``, not a damaged-file error).
    """
    if not callable(map_location) and not isinstance(map_location, dict):
        map_location = resolve_device(map_location)
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if not path.is_file():
        raise CheckpointError(path, "is not a file")
    data = path.read_bytes()
    if not data:
        raise CheckpointError(path, "the file is empty (0 bytes): an interrupted copy or write")
    verified = _verify_checksum(path, data)
    if not data.startswith(b"PK\x03\x04"):
        raise CheckpointError(
            path,
            f"not a checkpoint: not the zip archive torch.save writes (it starts with {data[:8]!r}); damaged, or "
            "another kind of file",
        )
    try:
        state = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(
            path,
            "not a varbnn checkpoint: it holds Python objects other than plain data (tensors, numbers, strings, "
            "lists, dicts), which save_checkpoint never writes (or it is damaged)",
        ) from None
    except Exception as error:  # noqa: BLE001 -- torch raises RuntimeError, EOFError, OSError, KeyError, ...
        raise CheckpointError(
            path,
            f"cannot be read ({len(data)} bytes): truncated, damaged or not a file written by torch.save ({_reason(error)})",
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(path, f"not a varbnn checkpoint: it holds a {type(state).__name__}, not a dict")
    if not verified:
        if "format" in state:
            raise CheckpointError(path, "damaged: its checksum trailer is missing (a truncated or altered end of the file)")
        if "model" not in state:
            keys = _listing([repr(k) for k in state], 8) or "none"
            raise CheckpointError(path, f"not a varbnn checkpoint: a dict without a 'model' entry (keys: {keys})")
        warnings.warn(
            f"checkpoint {path} has no checksum (written before varbnn checkpoint format {CHECKPOINT_VERSION}): "
            "loaded unverified; saving it again adds one",
            UserWarning,
            stacklevel=2,
        )
        return state
    if state.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(path, f"not a varbnn checkpoint (format {state.get('format')!r}, expected {CHECKPOINT_FORMAT!r})")
    version = state.get("version")
    if type(version) is not int or not 1 <= version <= CHECKPOINT_VERSION:
        raise CheckpointError(
            path, f"format version {version!r} is not one this varbnn reads (1 to {CHECKPOINT_VERSION}): from a newer varbnn?"
        )
    if not isinstance(state.get("model"), dict):
        raise CheckpointError(path, "not a varbnn checkpoint: no 'model' state dict")
    return state


def load_checkpoint(
    path: str | os.PathLike[str],
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    map_location: str | torch.device = "cpu",
    *,
    allow_nonfinite: bool = False,
) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` into ``model`` (and ``optimizer``, when the file holds
    its state); returns the file's content (:func:`read_checkpoint`: ``weights_only=True``, checksum verified).

    Raises :class:`CheckpointError` naming the file when :func:`read_checkpoint` does, when the state does not fit
    the model or optimizer, or when parameters or optimizer state hold NaN or inf (unless ``allow_nonfinite``;
    nothing is loaded then).
    """
    state = read_checkpoint(path, map_location)
    _apply_checkpoint(Path(path), state, model, optimizer, allow_nonfinite=allow_nonfinite)
    return state


def _apply_checkpoint(
    path: Path, state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer | None, *, allow_nonfinite: bool
) -> None:
    if not isinstance(state.get("model"), dict):
        raise CheckpointError(path, "not a varbnn checkpoint: its 'model' entry is not a state dict")
    optimizer_state = state.get("optimizer")
    if optimizer_state is not None and not isinstance(optimizer_state, dict):
        raise CheckpointError(path, f"its 'optimizer' entry is a {type(optimizer_state).__name__}, not a state dict")
    if not allow_nonfinite:
        parameters = {name for name, _ in model.named_parameters()}
        bad = _nonfinite_names((k, v) for k, v in state["model"].items() if k in parameters)
        if optimizer is not None and optimizer_state is not None:
            for index, entry in dict(optimizer_state.get("state", {})).items():
                if isinstance(entry, dict):
                    bad += [f"optimizer state {index}.{key}" for key in _nonfinite_names(entry.items())]
        if bad:
            raise CheckpointError(
                path, f"holds NaN or inf values in {_listing(bad)}: refusing to load it (allow_nonfinite=True loads it)"
            )
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, KeyError, TypeError, ValueError) as error:
        raise CheckpointError(path, f"does not fit the model: {error}") from None
    if optimizer is not None and optimizer_state is not None:
        try:
            optimizer.load_state_dict(optimizer_state)
        except (RuntimeError, KeyError, TypeError, ValueError) as error:
            raise CheckpointError(path, f"does not fit the optimizer: {error}") from None


def _loader_generators(loader: object) -> dict[str, torch.Generator]:
    """The ``torch.Generator`` objects a loader draws from: ``loader.generator`` (a ``DataLoader``'s: the workers'
    base seed), ``loader.sampler.generator`` and ``loader.batch_sampler.sampler.generator`` (shuffling), each once."""
    owners = {
        "loader": loader,
        "sampler": getattr(loader, "sampler", None),
        "batch_sampler.sampler": getattr(getattr(loader, "batch_sampler", None), "sampler", None),
    }
    found: dict[str, torch.Generator] = {}
    for name, owner in owners.items():
        generator = getattr(owner, "generator", None) if owner is not None else None
        if isinstance(generator, torch.Generator) and all(generator is not g for g in found.values()):
            found[name] = generator
    return found


def _rng_state(loader: object) -> dict[str, Any]:
    """Every random-number state a training run draws from, as plain data (see :func:`fit`)."""
    version, mt_state, gauss_next = random.getstate()
    name, keys, position, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": {"version": int(version), "state": torch.tensor(mt_state, dtype=torch.int64), "gauss_next": gauss_next},
        "numpy": {
            "name": str(name),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    generators = _loader_generators(loader)
    if generators:
        state["loader"] = {name: g.get_state() for name, g in generators.items()}
    return state


_HISTORY_KEYS = ("epoch", "loss", "nll", "kl")


def _check_rng_state(state: Any, path: Path) -> None:
    """Refuse (:class:`CheckpointError`) an ``rng`` entry that :func:`_restore_rng_state` could not restore, before
    anything is loaded: every state fit saves must have its keys and types."""
    if isinstance(state, torch.Tensor):
        if state.dtype != torch.uint8 or state.dim() != 1:
            raise CheckpointError(path, f"its 'rng' entry is a {state.dtype} tensor of shape {tuple(state.shape)}, not a "
                                  "torch random state (uint8, one dimension)")  # fmt: skip
        return
    if not isinstance(state, dict):
        raise CheckpointError(path, f"its 'rng' entry is a {type(state).__name__}, not the random states fit saves")

    def require(ok: bool, what: str) -> None:
        if not ok:
            raise CheckpointError(path, f"its random states cannot be restored: {what}")

    tensor = lambda value, dtype: isinstance(value, torch.Tensor) and value.dtype == dtype and value.dim() == 1  # noqa: E731
    py = state.get("python")
    if py is not None:
        require(isinstance(py, dict) and type(py.get("version")) is int and tensor(py.get("state"), torch.int64)
                and py["state"].numel() == 625 and (py.get("gauss_next") is None or type(py["gauss_next"]) is float),
                "'rng.python' is not Python's random state (version, 625 state words, gauss_next)")  # fmt: skip
    npy = state.get("numpy")
    if npy is not None:
        require(isinstance(npy, dict) and npy.get("name") == "MT19937" and tensor(npy.get("keys"), torch.int64)
                and npy["keys"].numel() == 624 and all(type(npy.get(k)) is int for k in ("pos", "has_gauss"))
                and type(npy.get("cached_gaussian")) is float,
                "'rng.numpy' is not NumPy's MT19937 state (name, 624 keys, pos, has_gauss, cached_gaussian)")  # fmt: skip
    size = torch.get_rng_state().numel()
    if "torch" in state:
        require(tensor(state["torch"], torch.uint8) and state["torch"].numel() == size,
                f"'rng.torch' is not a torch CPU random state (a uint8 tensor of {size} bytes)")  # fmt: skip
    if "cuda" in state:
        require(isinstance(state["cuda"], list) and all(tensor(s, torch.uint8) for s in state["cuda"]),
                "'rng.cuda' is not a list of CUDA random states (uint8 tensors)")  # fmt: skip
    loader = state.get("loader", {})
    require(isinstance(loader, dict) and all(isinstance(k, str) and tensor(v, torch.uint8) and v.numel() == size
                                             for k, v in loader.items()),
            f"'rng.loader' is not the loader generators' states (names to uint8 tensors of {size} bytes)")  # fmt: skip


def _restore_rng_state(state: Any, loader: object, path: Path) -> None:
    if isinstance(state, torch.Tensor):  # checkpoints written before the other states were saved
        torch.set_rng_state(state.cpu())
        return
    if not isinstance(state, dict):
        raise CheckpointError(path, f"its 'rng' entry is a {type(state).__name__}, not the random states fit saves")
    try:
        if "python" in state:
            py = state["python"]
            gauss = py["gauss_next"]
            random.setstate((int(py["version"]), tuple(int(v) for v in py["state"].tolist()), gauss))
        if "numpy" in state:
            npy = state["numpy"]
            keys = npy["keys"].cpu().numpy().astype(np.uint32)
            np.random.set_state((npy["name"], keys, int(npy["pos"]), int(npy["has_gauss"]), float(npy["cached_gaussian"])))
        if "torch" in state:
            torch.set_rng_state(state["torch"].cpu())
        if "cuda" in state and torch.cuda.is_available():
            saved = [s.cpu() for s in state["cuda"]]
            if len(saved) != torch.cuda.device_count():
                warnings.warn(
                    f"checkpoint {path} holds the CUDA random states of {len(saved)} devices, this machine has "
                    f"{torch.cuda.device_count()}: restored for the first {min(len(saved), torch.cuda.device_count())}",
                    stacklevel=3,
                )
            for index, device_state in enumerate(saved[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(device_state, index)
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as error:
        raise CheckpointError(path, f"its random states cannot be restored ({_reason(error)})") from None
    saved_generators = state.get("loader", {})
    generators = _loader_generators(loader)
    for name, generator in generators.items():
        if name in saved_generators:
            generator.set_state(saved_generators[name].cpu())
    unmatched = sorted(set(generators) ^ set(saved_generators))
    if unmatched:
        warnings.warn(
            f"resuming from {path}: the loader's random generators ({sorted(generators)}) are not those saved "
            f"({sorted(saved_generators)}); {unmatched} not restored, so the data order differs from an "
            "uninterrupted run",
            stacklevel=3,
        )


def _has_adaptive_prior(model: nn.Module) -> bool:
    from varbnn.priors import Prior

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


def fit(
    model: nn.Module,
    loader: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    n_data: int,
    epochs: int,
    optimizer: torch.optim.Optimizer | None = None,
    lr: float = 1e-3,
    nll: NLLFunction = F.cross_entropy,
    likelihood: Likelihood | str | None = None,
    beta: float | BetaSchedule | None = None,
    device: str | torch.device | None = "model",
    progress: bool = True,
    checkpoint: str | os.PathLike[str] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    on_epoch_end: Callable[[int, dict[str, float]], None] | None = None,
    on_step_end: Callable[[int, ELBOTerms], None] | None = None,
    distributed: bool | None = None,
    mc_samples: int = 1,
    skip_nonfinite: bool = False,
    checkpoint_extra: Callable[[], dict[str, Any]] | None = None,
    diagnose: bool = True,
    compile: bool | str = False,
) -> list[dict[str, float]]:
    """Minimise ``nll(model(x), y) + beta * kl(model) / n_data`` with Adam (:func:`default_optimizer`) or ``optimizer``.

    The loss is the negative ELBO per training example (Graves 2011 eq. 18 divided by the batch size; see
    :mod:`varbnn.divergence` for the convention): the batch-mean NLL of one weight draw plus the model's KL, SUMMED
    over every weight, times ``beta / n_data``. Each step is one forward pass, ``loss.backward()`` and one optimizer
    step, followed by :func:`varbnn.priors.update_adaptive_priors`. The paragraphs below say what each argument does;
    the parameter list at the end sums them up.

    ``likelihood`` (a :class:`varbnn.likelihoods.Likelihood`, or the name of one without learned parameters:
    ``"categorical"``, ``"heteroscedastic"``) replaces ``nll``: its :meth:`~varbnn.likelihoods.Likelihood.nll` is
    the data term, its own parameters (e.g. a learned noise level) are trained with the model's (added to the default
    optimizer; a given ``optimizer`` must already hold them) and saved in the checkpoint, and its
    :meth:`~varbnn.likelihoods.Likelihood.kl` (a noise posterior's) joins the KL term at weight 1. Default: ``nll``,
    the cross-entropy of a classifier's logits.

    ``beta`` (the KL weight): ``None`` (default) is the library's default for the model's families
    (:func:`varbnn.objectives.default_kl_weight`; the value and its evidence are on the defaults results page);
    ``1.0`` is the true ELBO, as the papers train.

    ``diagnose`` (default True): after training, one :class:`TrainingWarning` if the run shows a problem the library
    can see -- a posterior within 0.25 nats per weight of its prior while the training NLL stayed at its first-epoch
    level (runs of 3 epochs or more) and, for class labels, above half the NLL of predicting the label frequencies
    (the KL pulled the weights back to the prior; a converted trained network that fits from its first epoch is not
    flagged), or a posterior whose standard deviations are below 1e-3 of its means' magnitude (predictions
    practically deterministic).

    Adaptive priors are set to their optimum after every step. Models with a ``MeanField(estimator="graves")`` tensor
    take their gradients from :func:`varbnn.objectives.graves_gradients` (a weight draw per example, Fisher
    variance gradient) instead of ``loss.backward()``. ``beta`` is a number or a function of the
    global step (e.g. ``lambda s: linear_kl_annealing(s, 1000)``). Returns one dict per epoch with the mean
    loss, NLL (nats), KL (nats) and beta.

    ``n_data`` is the training-set size (the number of examples the KL is spread over): any integral number >= 1
    (Python or NumPy integer, 0-d tensor, integer-valued float). A ``ValueError`` names it when a batch, or the
    distinct examples a ``DataLoader`` yields per epoch (sequential or shuffled without replacement), outnumber it;
    a loader that yields no batches in an epoch is a ``ValueError`` too.

    Non-finite values stop training with a :class:`NonFiniteError` that says which (``kind``: ``"data"`` -- NaN/inf
    in a batch's inputs or floating-point targets, checked before the forward pass; ``"loss"``; ``"gradient"`` --
    after ``backward``, before ``optimizer.step``; ``"parameters"`` -- checked before each checkpoint) and where
    (epoch, global step, batch index). The optimizer never steps on a non-finite loss or gradient, and no
    checkpoint with non-finite parameters is written, so the last good checkpoint survives. With
    ``skip_nonfinite=True`` a batch whose loss or gradient is non-finite is skipped instead (gradients dropped, no
    optimizer step, no ``on_step_end``, the step counter not advanced) and counted in each epoch's record as
    ``skipped``; the epoch's means are over the other batches. Non-finite data still raise (the same batch would be
    skipped every epoch), and so does an epoch in which every batch was skipped. On a GPU with fit's default
    optimizer (the fused Adam) and without ``skip_nonfinite``, distributed training, the Graves estimator or adaptive
    priors, the loss and gradient checks do not make the host wait for the device every step: each step's flag is
    computed on the device and handed to the optimizer as ``found_inf`` (a bad step, and every one after it, leaves
    the parameters and the optimizer state unchanged), and the flags are read every 50 steps and at the end of each
    epoch; the error then names the first bad step, and the model is as it was before it, as with per-step checks.
    ``on_step_end`` is called for the steps between the bad one and that read.

    ``checkpoint`` is rewritten (:func:`save_checkpoint`: atomically, with a checksum) after each epoch, once
    ``on_epoch_end`` has returned; ``checkpoint_extra()``, when given, is called then and its dict (plain data) is
    stored in the same file under ``"extra"`` (e.g. a callback's own state, which then stays consistent with the
    epoch; read it back with :func:`read_checkpoint`). With ``resume`` and an existing ``checkpoint`` training
    continues after the last completed epoch, so a killed run loses at most one epoch; a finished checkpoint returns
    its history at once. A checkpoint that is damaged, lacks the ``epoch``/``history``/``model`` entries or holds
    NaN/inf parameters or optimizer state is refused (:class:`CheckpointError`, naming the file). Restored on resume:
    the model, the optimizer state, the step count, the history, and every random state the run draws from --
    Python's ``random``, NumPy's global generator, torch's CPU generator, the CUDA generators of all devices (when
    CUDA was initialised), and the loader's ``torch.Generator`` objects (``loader.generator``, which draws the
    workers' base seed, and ``loader.sampler.generator`` / ``loader.batch_sampler.sampler.generator``, which
    shuffle); all are saved after ``on_epoch_end``, so the resumed run draws exactly what the uninterrupted one
    would, including a callback's random draws and a ``DataLoader(shuffle=True, generator=g)``'s order. The
    sampler's epoch needs no state: ``loader.sampler.set_epoch(epoch)`` is called at every epoch. Not restored:
    other generators a callback or dataset keeps itself, the random state inside ``persistent_workers`` processes
    (non-persistent workers are reseeded from the loader's generator every epoch, so they are reproduced), and, in
    distributed runs, the other ranks' states (the checkpoint holds rank 0's; each rank's weight noise is reseeded
    from it by rank, so a resumed distributed run is not bit-identical to an uninterrupted one).

    ``on_step_end(step, terms)`` runs after every optimizer step (``step`` counts from 1; the parameters'
    ``.grad`` still hold that step's gradients, e.g. for :class:`varbnn.analysis.GradientSNR`). A callback that
    evaluates the model may switch it to eval mode; training mode is restored after it returns.

    ``mc_samples`` (S, default 1): each step's gradient averages S independent weight draws, computed as S
    forward/backward passes accumulated in ``.grad`` (the loss of each is the full one-draw ELBO / S), so memory
    does not grow with S; the logged loss, NLL and KL are the means over the S draws. Not with the Graves estimator
    (it already draws per example).

    ``distributed`` (default: automatic, i.e. whenever :func:`varbnn.distributed.setup` initialised a process group
    of more than one process): the model is wrapped in ``DistributedDataParallel`` (parameters broadcast from rank
    0, gradients averaged), each rank's weight noise is seeded by its rank (:func:`varbnn.distributed.rank_seed`
    of ``torch.initial_seed()``), ``loader.sampler.set_epoch`` is called every epoch, the returned history is
    averaged over the ranks and only rank 0 writes ``checkpoint`` (the unwrapped model's state dict, loadable in a
    single process). The per-rank loss is ``mean NLL of the shard + beta * KL / n_data``, so with averaged gradients
    the KL counts once per global step (see :mod:`varbnn.distributed`). Models with the Graves estimator are not
    wrapped: their gradients (per-example Fisher) are averaged with an all-reduce instead. Non-finite checks are
    agreed on by all ranks (every rank raises, or skips, together).

    ``compile`` (default False): ``True`` runs each step's loss -- the model's forward pass, the NLL (or likelihood)
    and the KL -- through :func:`torch.compile` (inductor), whose backward is compiled with it; on a CUDA device whose
    loader yields batches of one shape (a ``DataLoader`` with ``drop_last=True``, or whose batch size divides the
    dataset) in mode ``"reduce-overhead"``, which records the step in CUDA graphs (on an H200's LeNet-5, 0.85x-1.70x
    the plain network's eager step for every family, against 1.78x-3.71x without graphs), elsewhere in the default
    mode. A string (``"default"``, ``"reduce-overhead"``, ``"max-autotune"``, ``"max-autotune-no-cudagraphs"``) is
    passed as its ``mode`` as it is. ``beta`` enters as a tensor, so an annealing schedule does not recompile. The
    weight noise is drawn where it is cheapest: inside the compiled kernels, on the CPU by :mod:`varbnn.philox`'s
    counter-based generator (one key per step from torch's generator, so ``torch.manual_seed`` still makes a run
    reproducible; torch's own CPU generator fills a tensor on one thread), on other devices by inductor's. Either is
    another random stream than the eager step's, equal in distribution; RDP's rejection rounds draw from torch's
    generator on the CPU as the eager step does. The first steps are slow (compilation); a new batch
    shape (e.g. a last, smaller batch) compiles once more. Refused (``ValueError``) with the Graves estimator (its
    per-example gradients bypass the loss and its backward), with ``distributed`` training, and with any family whose
    ``compile_unsupported`` says why. Verified against the eager step on the CPU (same seed and the same draws, same
    loss and gradients): MeanField (every estimator but Graves'), KTied, Delta, Radial and RadialDirectional (its
    rejection rounds run as one opaque op).

    Every finished epoch is also logged at INFO level on the ``varbnn.train`` logger (loss, NLL, KL, beta).

    :param model: the network to train (Bayesian layers from :func:`varbnn.convert.bayesianize` or
        :mod:`varbnn.nn`; a plain network trains as maximum likelihood). Moved to ``device``; trained in place.
    :param loader: an iterable of ``(x, y)`` batches, e.g. a ``torch.utils.data.DataLoader``; iterated once per epoch.
        A ``DataLoader`` that only shuffles (or not) and stacks the rows of a ``TensorDataset`` is read by one index per
        batch instead of one ``__getitem__`` per example (:func:`varbnn.data.batches.fast_batches`): the same batches
        and random draws, so the same training.
    :param n_data: the training-set size N the KL is spread over (not the batch size).
    :param epochs: the number of passes over ``loader`` (total, counting epochs restored by ``resume``).
    :param optimizer: a ready optimizer over the model's parameters (default: Adam with learning rate ``lr``).
    :param lr: the learning rate of the default optimizer (default 1e-3; not used with ``optimizer``).
    :param nll: the data term ``nll(output, target)``, the batch-mean NLL (default ``F.cross_entropy``).
    :param likelihood: a likelihood object or name, used instead of ``nll`` (see above).
    :param beta: the KL weight: a number >= 0, a function of the global step, or ``None`` for the family default.
    :param device: where to train (default ``"model"``: where the model's parameters already are, so a model moved
        to a GPU trains there; ``None`` or ``"auto"``: CUDA when available; or a device such as ``"cpu"`` or ``"cuda"``,
        to which the model is moved).
    :param progress: show an epoch progress bar (default True; it turns itself off when stderr is not a terminal).
    :param checkpoint: a file rewritten after each epoch (default ``None``: none).
    :param resume: continue from ``checkpoint`` when it exists (default False).
    :param overwrite: replace an existing ``checkpoint`` that ``resume`` does not continue (default False: a
        ``ValueError`` before anything is trained, so another run's file is never overwritten by accident; with
        ``overwrite=True`` the file is replaced at the end of the first epoch).
    :param on_epoch_end: ``callback(epoch, record)`` after each epoch (``epoch`` from 1; ``record`` as returned).
    :param on_step_end: ``callback(step, terms)`` after each optimizer step (``terms`` an
        :class:`~varbnn.objectives.ELBOTerms`).
    :param distributed: data-parallel training across a process group (default ``None``: automatic).
    :param mc_samples: weight draws S averaged per step, an int >= 1 (default 1).
    :param skip_nonfinite: skip a batch with a non-finite loss or gradient instead of raising (default False).
    :param checkpoint_extra: a function returning plain data stored in each checkpoint under ``"extra"``.
    :param diagnose: warn (:class:`TrainingWarning`) about a run that went wrong in a way the library can see
        (default True).
    :param compile: compile each step's loss and backward with :func:`torch.compile`: ``True`` (CUDA graphs on a
        GPU when the batches have one shape, see above), or a mode string (default False: eager). The first step
        compiles: on a 2-core CPU 38-96 s for an MNIST MLP the first time, 8-26 s once torch's on-disk cache holds
        the graphs, so that compiling pays after thousands of steps there (the training guide's "Compiled steps").
    On return the model is in ``eval()`` mode (dropout off, batch normalisation using its running statistics), so that
    predicting right after training does not update batch-norm statistics from the test inputs; Bayesian layers still
    sample (see :mod:`varbnn.nn.base`). Each epoch switches it back to ``train()``.

    :returns: the history: one dict per epoch (restored ones included) with ``epoch``, the epoch's mean ``loss``,
        ``nll`` and ``kl`` (nats; ``kl`` is the model's total), ``beta`` the schedule's value after the epoch's last
        step (the next step's weight), and ``skipped`` with ``skip_nonfinite``.
    """
    from varbnn import distributed as vdist

    n_data = _training_set_size(n_data)
    epochs = as_int(epochs, "epochs", low=0, owner="fit")
    lr = as_float_in(lr, "lr", 0.0, None, low_open=True, owner="fit")
    mc_samples = as_positive_int(mc_samples, "mc_samples", owner="fit")
    resume = as_bool(resume, "resume", owner="fit")
    overwrite = as_bool(overwrite, "overwrite", owner="fit")
    progress = as_bool(progress, "progress", owner="fit")
    skip_nonfinite = as_bool(skip_nonfinite, "skip_nonfinite", owner="fit")
    diagnose = as_bool(diagnose, "diagnose", owner="fit")
    if distributed is not None:
        distributed = as_bool(distributed, "distributed", owner="fit")
    if not isinstance(model, nn.Module):
        raise TypeError(f"fit: model must be a torch.nn.Module, got {type(model).__name__}")
    _refuse_posthoc_wrappers(model)
    _warn_if_not_sampling(model)
    lik: Likelihood | None = None
    if likelihood is not None:
        if nll is not F.cross_entropy:
            raise ValueError("pass either nll= (a loss function) or likelihood= (a Likelihood), not both")
        lik = as_likelihood(likelihood)
        nll = _likelihood_loss(lik, n_data)
    elif nll is F.cross_entropy:
        nll = _default_cross_entropy
    if beta is None:
        beta = default_kl_weight(model)
    elif not callable(beta):
        try:
            beta = as_float_in(beta, "beta", 0.0, None, owner="fit")
        except ValueError as error:
            raise type(error)(f"{error} (beta is the KL weight: a finite number >= 0, a function of the step, or None "
                              "for the family default)") from None  # fmt: skip
    per_epoch = _distinct_examples_per_epoch(loader)
    if per_epoch is not None and per_epoch > n_data:
        raise ValueError(
            f"n_data={n_data} is smaller than the {per_epoch} distinct examples the loader yields per epoch: n_data "
            "must be the training-set size (the number of examples the KL is spread over), not a batch size"
        )
    check_batch_size = not _draws_with_replacement(loader)
    if distributed is None:
        distributed = vdist.is_distributed()
    elif distributed and not vdist.is_distributed():
        raise ValueError(
            "distributed=True needs an initialised process group of more than one process: launch with torchrun "
            "and call varbnn.distributed.setup() first"
        )
    dev = resolve_device(device, model)
    model.to(dev)
    extra_parameters: list[nn.Parameter] = []
    if lik is not None:
        lik.to(dev)
        extra_parameters = [p for p in lik.parameters() if p.requires_grad]
    default_rate = optimizer is None  # fit's own Adam at lr: a resumed state keeps the checkpoint's rate instead
    if optimizer is None:
        optimizer = default_optimizer([*model.parameters(), *extra_parameters], lr)
    else:
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        trainable = [p for p in model.parameters() if p.requires_grad]
        if trainable and not any(id(p) in held for p in trainable):
            raise ValueError(
                "the given optimizer holds none of the model's trainable parameters (built over another model, or "
                "over a copy?): build it over model.parameters() after converting the model, or leave optimizer=None"
            )
        if any(id(p) not in held for p in extra_parameters):
            raise ValueError(
                f"the likelihood {type(lik).__name__} has learnable parameters that the given optimizer does not hold: "
                "build it over [*model.parameters(), *likelihood.parameters()], or leave optimizer=None"
            )
    adaptive = _has_adaptive_prior(model)
    graves = uses_graves_estimator(model)
    if graves and extra_parameters:
        raise ValueError(
            f"the likelihood {type(lik).__name__} has learnable parameters, which MeanField(estimator='graves') does not "
            "train (its gradients are per-example Fisher estimates of the model's parameters only): fix them (e.g. "
            "Gaussian(noise_std=...)) or use another estimator"
        )
    if graves and mc_samples != 1:
        raise ValueError("mc_samples > 1 is not available with MeanField(estimator='graves'): it draws weights per example")
    compiled_step, mode = None, None
    compiled_shapes: set[tuple[int, ...]] = set()  # the batch shapes the compiled step has met (each compiled once)
    if compile is not False:
        mode = _fit_compile_mode(compile, dev, loader)
        compiled_step = _compiled_elbo_step(model, nll, n_data, dev, mode, graves=graves, distributed=distributed)
    net: nn.Module = model
    if distributed:
        if graves:
            _broadcast_state(model)
        else:
            from torch.nn.parallel import DistributedDataParallel

            net = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    if adaptive:
        update_adaptive_priors(model)
    schedule: BetaSchedule = beta if callable(beta) else (lambda _step: float(beta))  # type: ignore[misc, assignment]
    history: list[dict[str, float]] = []
    step = 0
    first_epoch = 0
    if not resume and not overwrite and checkpoint is not None and Path(checkpoint).exists():
        raise ValueError(
            f"fit(checkpoint={str(checkpoint)!r}): the file exists (another run's?) and resume=False would replace it: "
            "pass resume=True to continue it, overwrite=True to replace it, or another checkpoint path"
        )
    if resume and checkpoint is not None and Path(checkpoint).exists():
        rates = [group.get("lr") for group in optimizer.param_groups]
        first_epoch, history, step = _resume(Path(checkpoint), model, optimizer, loader, dev, lik)
        restored = [group.get("lr") for group in optimizer.param_groups]
        if default_rate and restored != rates:
            warnings.warn(
                f"fit(resume=True): the optimizer state from {checkpoint} keeps its learning rate {restored}, not the "
                f"{rates} this call set up; to change it, set optimizer.param_groups[i]['lr'] in on_epoch_end, or "
                "start a new checkpoint",
                TrainingWarning,
                stacklevel=2,
            )
        if first_epoch > epochs:
            raise ValueError(f"checkpoint {checkpoint} is at epoch {first_epoch}, beyond epochs={epochs}")
    if distributed:  # every rank its own weight noise (after DDP's broadcast made the parameters equal)
        torch.manual_seed(vdist.rank_seed(torch.initial_seed() + 7919 * (first_epoch + 1)))
    parameters = [*model.parameters(), *extra_parameters]
    # parameters the optimizer steps that DDP does not see (a likelihood's learned noise, anything the caller added):
    # their gradients are averaged across ranks by hand, or the ranks would drift apart
    in_model = {id(p) for p in model.parameters()}
    outside = [p for group in optimizer.param_groups for p in group["params"] if id(p) not in in_model and p.requires_grad]
    # disable=None: tqdm turns the bar off by itself when stderr is not a terminal (a redirected run logs no frames)
    bar = tqdm(range(first_epoch, epochs), desc="epochs", disable=None if progress else True, leave=False,
               initial=first_epoch, total=epochs)  # fmt: skip
    seen_labels: list[torch.Tensor] = []  # a few batches' class labels: the NLL of their marginal, for _diagnose
    # off the CPU, the loss and gradient checks run without waiting for the device (see _DeferredChecks)
    deferred = _DeferredChecks.applies(dev, optimizer, distributed or graves or skip_nonfinite or adaptive)
    named = [*model.named_parameters(), *((f"likelihood.{n}", p) for n, p in (lik.named_parameters() if lik else ())
                                          if any(p is q for q in extra_parameters))]  # what `parameters` holds
    checks = _DeferredChecks(dev, named) if deferred else None
    for epoch in bar:
        model.train()
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)  # type: ignore[union-attr]
        totals = {"loss": 0.0, "nll": 0.0, "kl": 0.0}
        batches = used = skipped = 0
        distinct: set[tuple[int, int, int]] = set()  # (storage, offset, count): the same batch yielded again counts once
        try:
            for x, y in fast_batches(loader):  # a DataLoader over a TensorDataset: the same batches by one index each
                if diagnose and len(seen_labels) < _DIAGNOSE_LABEL_BATCHES and _class_labels(y):
                    seen_labels.append(y.detach().reshape(-1).to("cpu", torch.long))
                where = f"epoch {epoch + 1}, step {step + 1} (batch index {batches} of the epoch)"
                batches += 1
                if per_epoch is None and epoch == first_epoch and x.dim() > 0:
                    distinct.add((x.untyped_storage().data_ptr(), x.storage_offset(), x.shape[0]))
                kind, detail = None, _nonfinite_data(x, y)  # before the transfer: no wait on the device for a CPU batch
                x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
                if check_batch_size and x.dim() > 0 and x.shape[0] > n_data:
                    raise ValueError(
                        f"n_data={n_data} is smaller than one batch ({x.shape[0]} examples at {where}): n_data must be "
                        "the training-set size (the number of examples the KL is spread over), not a batch size"
                    )
                if detail is not None:
                    kind = "data"
                    if not distributed:
                        raise _nonfinite_error(kind, detail, where, epoch + 1, step + 1, batches - 1, skip_nonfinite)
                optimizer.zero_grad(set_to_none=True)
                if graves:
                    terms = graves_gradients(model, x, y, n_data=n_data, nll=nll, beta=schedule(step))
                    if distributed:
                        vdist.all_reduce_mean_([p.grad for p in model.parameters() if p.grad is not None])
                elif compiled_step is not None:
                    compiling = tuple(x.shape) not in compiled_shapes  # a first step, or a new batch shape: compiles
                    if compiling:  # (torch.compile compiles again for a second shape, then one graph for any shape)
                        bar.set_postfix_str("compiling the step" if not compiled_shapes else "a new batch shape")
                        logger.info("first training step with batches of shape %s: torch.compile (mode %r) %s (on a "
                                    "CPU, a minute or more the first time)", tuple(x.shape), mode,
                                    "compiles the step first" if not compiled_shapes
                                    else "may compile the step again for it")  # fmt: skip
                        began = time.perf_counter()
                    terms = compiled_step(x, y, schedule(step), mc_samples)
                    if compiling:
                        compiled_shapes.add(tuple(x.shape))
                        logger.info("the first training step with batches of shape %s took %.1f s (its compilation "
                                    "included)", tuple(x.shape), time.perf_counter() - began)  # fmt: skip
                        bar.set_postfix_str("")
                else:
                    terms = _accumulated_elbo_gradient(net, model, x, y, nll, n_data, schedule(step), mc_samples)
                if distributed and outside:
                    has = torch.tensor([p.grad is not None for p in outside], dtype=torch.float32, device=dev)
                    vdist.all_reduce_mean_([has])  # a parameter no rank has a gradient for keeps none (the optimizer skips it)
                    for p in outside:
                        if p.grad is None:
                            p.grad = torch.zeros_like(p)
                    vdist.all_reduce_mean_([p.grad for p in outside])
                    for p, anyone in zip(outside, has.tolist()):
                        if anyone == 0:
                            p.grad = None
                if checks is not None:  # the checks and the sums on the device; one read every _DeferredChecks.EVERY steps
                    checks.step(terms, optimizer, where, epoch + 1, step + 1, batches - 1)
                    if on_step_end is not None:
                        on_step_end(step + 1, terms)
                        model.train()
                    used += 1
                    step += 1
                    if len(checks.window) >= checks.EVERY:
                        checks.check()
                    continue
                loss = float(terms.loss.detach())
                if kind is None and not math.isfinite(loss):
                    kind, detail = "loss", _loss_detail(loss, float(terms.nll), float(terms.kl))
                if kind is None and not _gradients_finite(parameters):
                    names = _nonfinite_names((n, p.grad) for n, p in model.named_parameters() if p.grad is not None)
                    kind, detail = "gradient", _gradient_detail(names, loss)
                if distributed:
                    flags = torch.tensor([kind == k for k in _KINDS], dtype=torch.float32, device=dev)
                    vdist.all_reduce_mean_([flags])
                    if kind is None and bool((flags > 0).any()):
                        kind = _KINDS[int((flags > 0).nonzero()[0, 0])]
                        detail = f"another rank met a non-finite {kind}"
                if kind is not None:
                    if kind == "data" or not skip_nonfinite:
                        raise _nonfinite_error(kind, str(detail), where, epoch + 1, step + 1, batches - 1, skip_nonfinite)
                    optimizer.zero_grad(set_to_none=True)
                    skipped += 1
                    continue
                optimizer.step()
                if adaptive:
                    update_adaptive_priors(model)
                if on_step_end is not None:
                    on_step_end(step + 1, terms)
                    model.train()
                totals["loss"] += loss
                totals["nll"] += float(terms.nll)
                totals["kl"] += float(terms.kl)
                used += 1
                step += 1
        except BaseException as error:  # (a bad step in the deferred window is reported first)
            if checks is not None:  # (after check() itself raised, its window is empty: nothing more to report)
                checks.pending(error)
            raise
        if batches == 0:
            raise ValueError(
                f"the loader yielded no batches in epoch {epoch + 1}: nothing to train on (an empty dataset, or "
                "batch_size larger than the dataset with drop_last=True?)"
            )
        if used == 0:
            raise NonFiniteError(
                f"every batch of epoch {epoch + 1} ({batches}) had a non-finite loss or gradient and was skipped "
                "(skip_nonfinite=True): the model or the optimisation has diverged",
                kind="loss",
                epoch=epoch + 1,
                step=step + 1,
            )
        examples = sum(count for _, _, count in distinct)
        if per_epoch is None and check_batch_size and not distributed and examples > n_data:  # first epoch only
            raise ValueError(  # a loader whose size is not known before (a list, a generator): counted in the epoch
                f"n_data={n_data} is smaller than the {examples} distinct examples the loader yielded in epoch "
                f"{epoch + 1}: n_data must be the training-set size (the number of examples the KL is spread over)"
            )
        if checks is not None:
            checks.check()
            totals = checks.take_totals()
        record: dict[str, float] = {k: v / used for k, v in totals.items()}
        if distributed:
            means = torch.tensor([record["loss"], record["nll"], record["kl"]], dtype=torch.float64, device=dev)
            vdist.all_reduce_mean_([means])
            record.update(loss=float(means[0]), nll=float(means[1]), kl=float(means[2]))
        record.update(epoch=epoch + 1, beta=float(schedule(step)))
        if skip_nonfinite:
            record["skipped"] = skipped
        history.append(record)
        logger.info("epoch %d/%d: loss %.6g, nll %.6g, kl %.6g, beta %.4g", epoch + 1, epochs, record["loss"],
                    record["nll"], record["kl"], record["beta"])  # fmt: skip
        bar.set_postfix(loss=f"{record['loss']:.4f}", nll=f"{record['nll']:.4f}", kl=f"{record['kl']:.4g}")
        if on_epoch_end is not None:
            on_epoch_end(epoch + 1, record)
        bad = _nonfinite_names(model.named_parameters())
        if bad:
            raise NonFiniteError(
                f"non-finite parameters after epoch {epoch + 1}: {_listing(bad)} hold NaN or inf"
                + (f"; checkpoint {checkpoint} keeps the last good epoch" if checkpoint is not None else ""),
                kind="parameters",
                epoch=epoch + 1,
            )
        if checkpoint is not None and vdist.is_main_process():
            extra: dict[str, Any] = {"extra": checkpoint_extra()} if checkpoint_extra is not None else {}
            if lik is not None:
                extra["likelihood"] = lik.state_dict()
            save_checkpoint(
                checkpoint, model, optimizer, epoch=epoch + 1, history=history, step=step, rng=_rng_state(loader), **extra
            )
    if compiled_step is not None and mode is not None and _uses_cudagraphs(mode, dev):
        # the last step's gradients live in the CUDA graphs' memory, which the next compiled graph to run (another
        # fit's) overwrites: drop them rather than leave .grad tensors that fail when read later
        optimizer.zero_grad(set_to_none=True)
    model.eval()  # predict/evaluate right after fit: batch norm uses its running statistics, dropout is off
    if diagnose and history and first_epoch < epochs and vdist.is_main_process():
        _diagnose(model, history, n_data, _label_entropy(seen_labels))
    return history


def _refuse_posthoc_wrappers(model: nn.Module) -> None:
    """Wrappers whose training is not one fit of their forward pass get a clear error instead of a silent wrong run."""
    from varbnn.baselines import DeepEnsemble
    from varbnn.laplace import LastLayerLaplace

    if isinstance(model, DeepEnsemble):
        raise ValueError(
            "fit(DeepEnsemble) would train the members jointly through their mean output, not independently: train "
            "each member with fit (or use varbnn.baselines.train_ensemble), then wrap them in a DeepEnsemble"
        )
    if isinstance(model, LastLayerLaplace):
        raise ValueError(
            "fit(LastLayerLaplace) would leave the fitted curvature stale: train the plain network with fit, then "
            "build LastLayerLaplace(network).fit(loader)"
        )


class TrainingWarning(UserWarning):
    """Something in a finished :func:`fit` run that a user should act on (see :func:`fit`'s ``diagnose``)."""


def _warn_if_not_sampling(model: nn.Module) -> None:
    """Warn (:class:`TrainingWarning`) when Bayesian layers are set to a deterministic ``sample_mode``: their forward
    passes use the posterior's mean or mode, so the NLL gives the posterior's widths no gradient."""
    from varbnn.nn.base import BayesianModule

    modes = sorted({m.sample_mode for m in model.modules() if isinstance(m, BayesianModule) and m.sample_mode != "sample"})
    if modes:
        warnings.warn(
            f"fit: the model's Bayesian layers are in sample_mode {modes} (set_sample_mode, or fit inside a "
            "`with sample_mode(...)` block), so training draws no weights and the NLL trains only the means: call "
            "varbnn.set_sample_mode(model, 'sample') first, unless that is what you want",
            TrainingWarning,
            stacklevel=3,
        )


def _default_cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``fit``'s default data term, ``F.cross_entropy``, refusing floating-point targets of another shape than the
    output: regression targets, which cross-entropy would read as soft labels and train on without an error (soft
    labels, probabilities of the output's shape, pass)."""
    if target.is_floating_point() and (output.dim() < 2 or target.shape != output.shape):
        raise ValueError(
            f"fit's default nll is F.cross_entropy (class indices [N], or probabilities of the output's shape), but "
            f"the targets are floating point of shape {tuple(target.shape)} against outputs {tuple(output.shape)}: for "
            "regression pass likelihood=varbnn.likelihoods.Gaussian() (or HeteroscedasticGaussian()), or your own nll="
        )
    return F.cross_entropy(output, target)


def _likelihood_loss(lik: Likelihood, n_data: int) -> NLLFunction:
    """The data term of a likelihood, with its own KL (e.g. a Gamma noise posterior's) spread over the data."""
    if type(lik).kl is Likelihood.kl:
        return lik.nll
    return lambda output, target: lik.nll(output, target) + lik.kl() / n_data


_DETERMINISTIC_RATIO = 1e-3
_PRIOR_KL_PER_WEIGHT = 0.25
_DIAGNOSE_LABEL_BATCHES = 20


def _class_labels(y: Any) -> bool:
    """Whether a batch's targets look like class labels (integer, non-negative is checked later): the case in which
    the NLL of always predicting the label frequencies (their entropy) is known."""
    return isinstance(y, torch.Tensor) and not (y.is_floating_point() or y.is_complex() or y.dtype == torch.bool)


def _label_entropy(labels: list[torch.Tensor]) -> float | None:
    """Entropy (nats) of the class frequencies in ``labels``: the training NLL of a classifier that ignores its input.
    ``None`` without labels (regression, or a run resumed past its first batches)."""
    if not labels:
        return None
    flat = torch.cat(labels)
    if flat.numel() == 0 or int(flat.min()) < 0:
        return None
    p = torch.bincount(flat).double()
    p = p[p > 0] / p.sum()
    return float(-(p * p.log()).sum())


@torch.no_grad()
def _diagnose(model: nn.Module, history: list[dict[str, float]], n_data: int, label_entropy: float | None = None) -> None:
    """One :class:`TrainingWarning` naming what went wrong, in words a user can act on (see :func:`fit`).

    ``label_entropy`` (classification): the NLL of predicting the label frequencies. A posterior near its prior is
    a problem only while the NLL stays near that marginal NLL; a network that fits from its first epoch (e.g. one
    converted with its trained weights) and keeps fitting is not warned about, however close to the prior its
    unused weights went."""
    import warnings

    from varbnn.families.base import VariationalFamily
    from varbnn.families.delta import Delta

    first, recent = history[0]["nll"], sum(r["nll"] for r in history[-3:]) / len(history[-3:])
    problems = []
    weights = sum(m.mean.numel() for m in model.modules() if isinstance(m, VariationalFamily) and m.is_built)
    kl_per_weight = history[-1]["kl"] / max(weights, 1)
    near_marginal = label_entropy is None or recent > 0.5 * label_entropy
    barely_fell = recent > first - 0.1 * abs(first)  # fell by less than 10% of its first value, whatever its sign
    if len(history) >= 3 and weights and kl_per_weight < _PRIOR_KL_PER_WEIGHT and barely_fell and near_marginal:
        problems.append(
            f"the posterior sits on the prior (KL {kl_per_weight:.3g} nats per weight) and the training NLL did not fall "
            f"by 10% of its first-epoch value ({first:.4g} -> {recent:.4g} over the last epochs): the data barely "
            "moved the weights. Unless the targets carry that little signal, lower the KL weight (fit(beta=...)), train "
            "longer or at a larger learning rate, or use more data"
        )
    ratios = []
    for module in model.modules():
        if isinstance(module, VariationalFamily) and not isinstance(module, Delta) and module.is_built:
            try:
                mean, variance = module.moments()
            except NotImplementedError:
                continue
            ratios.append(float(variance.clamp_min(0).sqrt().mean() / mean.abs().mean().clamp_min(1e-12)))
    if ratios and max(ratios) < _DETERMINISTIC_RATIO:
        problems.append(
            f"the posterior is practically deterministic: its standard deviations are below {_DETERMINISTIC_RATIO:g} of "
            f"its means' magnitude in every tensor (largest ratio {max(ratios):.2g}), so predictive draws barely differ "
            "and the uncertainty is that of a plain network. Raise the family's init_std or the KL weight (beta)"
        )
    if problems:
        warnings.warn("fit: " + "; and ".join(problems) + ".", TrainingWarning, stacklevel=3)


_KINDS = ("data", "loss", "gradient")


class _DeferredChecks:
    """``fit``'s loss and gradient checks without a host read per step (a read makes the host wait for the device,
    so that the next step's host work cannot overlap this step's kernels).

    Each step computes, on the device, a flag (1: the loss is NaN/inf, 2: a gradient is, the loss finite) and a sticky
    halt flag that the optimizer receives as ``found_inf``: the fused Adam kernel then leaves the parameters and its
    state unchanged for that step and every later one, so when :meth:`check` reads the flags (every :attr:`EVERY` steps
    and at the end of each epoch; one read) and raises for the first bad step, the model is what it was before that
    step, as with the per-step checks. The epoch's loss, NLL and KL are summed on the device in float64, in the same
    order as the per-step path sums Python floats (the same values). Used off the CPU with an optimizer that takes
    ``found_inf`` (torch's fused Adam, fit's default), and not with distributed training, the Graves estimator,
    ``skip_nonfinite`` or adaptive priors (each needs a per-step decision on the host)."""

    EVERY = 50
    DEVICES: ClassVar[tuple[str, ...]] = ("cuda",)  # (the tests add "cpu" to run it here)

    def __init__(self, device: torch.device, named: Sequence[tuple[str, torch.Tensor]]) -> None:
        self.device = device
        self.named = list(named)  # (name, parameter) of everything the optimizer steps
        self.halt = torch.zeros((), dtype=torch.float32, device=device)  # the fused kernels read found_inf as float
        self.sums = torch.zeros(3, dtype=torch.float64, device=device)
        # each step since the last check: (flag, where, epoch, step, batch, its loss, nll and kl, the indices of the
        # parameters that had gradients, whether each of those was finite)
        self.window: list[tuple[torch.Tensor, str, int, int, int, torch.Tensor, list[int], torch.Tensor | None]] = []

    @classmethod
    def applies(cls, device: torch.device, optimizer: torch.optim.Optimizer, excluded: bool) -> bool:
        return (
            not excluded
            and device.type in cls.DEVICES
            # the fused Adam and AdamW: a found_inf step leaves their state as it was (their step counters are put
            # back); others, e.g. the fused SGD with momentum, would keep uninitialised state from a skipped first step
            and type(optimizer) in (torch.optim.Adam, torch.optim.AdamW)
            and bool(getattr(optimizer, "_step_supports_amp_scaling", False))
            and not hasattr(optimizer, "found_inf")  # a caller's own use of it (e.g. a GradScaler) is left alone
        )

    def pending(self, error: BaseException) -> None:
        """Before another error leaves fit: a bad step waiting in the window is reported first (the model stopped
        updating there), with the other error as its context."""
        try:
            self.check()
        except NonFiniteError as found:
            raise found from error

    def step(
        self, terms: ELBOTerms, optimizer: torch.optim.Optimizer, where: str, epoch: int, step: int, batch: int
    ) -> None:
        loss = terms.loss.detach()
        loss_bad = ~torch.isfinite(loss)
        held = [i for i, (_, p) in enumerate(self.named) if p.grad is not None and p.grad.numel() > 0]
        finite: torch.Tensor | None = None
        if held:
            peaks = torch._foreach_norm([self.named[i][1].grad for i in held], float("inf"))  # type: ignore[misc]
            finite = torch.isfinite(torch.stack([peak.to(torch.float64) for peak in peaks]))
            grad_bad = ~finite.all()
        else:
            grad_bad = torch.zeros((), dtype=torch.bool, device=self.device)
        flag = torch.where(loss_bad, 1.0, torch.where(grad_bad, 2.0, 0.0)).to(self.device)
        torch.maximum(self.halt, (flag > 0).to(self.halt.dtype), out=self.halt)
        optimizer.found_inf = self.halt  # type: ignore[attr-defined]
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf  # type: ignore[attr-defined]
        values = torch.stack([v.to(torch.float64) for v in (loss, terms.nll.detach(), terms.kl.detach())])
        self.sums += values
        self.window.append((flag, where, epoch, step, batch, values, held, finite))

    def check(self) -> None:
        """One host read of the window's flags; raises :class:`NonFiniteError` for its first bad step."""
        if not self.window:
            return
        flags = torch.stack([entry[0] for entry in self.window]).tolist()
        window, self.window = self.window, []
        bad = next((i for i, flag in enumerate(flags) if flag), None)
        if bad is None:
            return
        _, where, epoch, step, batch, values, held, finite = window[bad]
        loss, nll, kl = values.tolist()
        if flags[bad] == 1:
            kind, detail = "loss", _loss_detail(loss, nll, kl)
        else:
            good = finite.tolist() if finite is not None else []
            kind, detail = "gradient", _gradient_detail([self.named[i][0] for i, ok in zip(held, good) if not ok], loss)
        last = window[-1][3]
        note = (
            f" (read at the check after step {last}: on {self.device.type} fit reads its checks every {self.EVERY} "
            f"steps without waiting for the device; steps {step} to {last} left the parameters unchanged)"
        )
        raise _nonfinite_error(kind, detail + note, where, epoch, step, batch, False)

    def take_totals(self) -> dict[str, float]:
        """The epoch's summed loss, NLL and KL (one host read), and a fresh sum for the next epoch."""
        loss, nll, kl = self.sums.tolist()
        self.sums.zero_()
        return {"loss": loss, "nll": nll, "kl": kl}


def _loss_detail(loss: float, nll: float, kl: float) -> str:
    """What a non-finite loss says about its cause: the NLL, the KL, or the KL term's weight."""
    head = f"the loss is {loss} (nll {nll}, kl {kl}) although the batch's data are finite"
    if not math.isfinite(nll):
        return f"{head}: the NLL is not finite (the optimisation diverged: lower lr?), or nll is undefined for these targets"
    if not math.isfinite(kl):
        return (
            f"{head}: the KL is not finite (a posterior scale at 0 or inf, or parameters that overflowed: the optimisation "
            "diverged, lower lr?)"
        )
    return (
        f"{head}: the KL term beta * kl / n_data overflowed although the NLL and the KL are finite: beta (the KL weight) "
        "is too large"
    )


def _gradient_detail(names: list[str], loss: float) -> str:
    return f"the gradients of {_listing(names)} hold NaN or inf (the loss, {loss}, is finite)"


def _nonfinite_error(
    kind: str, detail: str, where: str, epoch: int, step: int, batch: int, skipping: bool
) -> NonFiniteError:
    advice = {
        "data": "clean the data (skip_nonfinite does not skip bad data)",
        "loss": "the parameters were not updated" + ("" if skipping else "; skip_nonfinite=True skips such batches"),
        "gradient": "the parameters were not updated" + ("" if skipping else "; skip_nonfinite=True skips such batches"),
    }[kind]
    return NonFiniteError(f"non-finite {kind} at {where}: {detail}; {advice}", kind=kind, epoch=epoch, step=step, batch=batch)


def _nonfinite_data(x: torch.Tensor, y: torch.Tensor) -> str | None:
    """What is wrong with a batch, or ``None``: NaN/inf in the inputs or in floating-point targets."""
    for label, tensor in (("inputs", x), ("targets", y)):
        if isinstance(tensor, torch.Tensor) and (tensor.is_floating_point() or tensor.is_complex()):
            finite = torch.isfinite(tensor)
            if not bool(finite.all()):
                nan = int(torch.isnan(tensor).sum())
                inf = tensor.numel() - int(finite.sum()) - nan
                return f"training {label} contain NaN or infinite values ({nan} NaN, {inf} inf of {tensor.numel()})"
    return None


def _gradients_finite(parameters: Sequence[torch.Tensor]) -> bool:
    grads = [p.grad for p in parameters if p.grad is not None and p.grad.numel() > 0]
    if not grads:
        return True
    try:  # max |g| per tensor, NaN-propagating: one fused kernel instead of one isfinite per tensor
        peaks = list(torch._foreach_norm(grads, float("inf")))
        if len({peak.dtype for peak in peaks}) > 1:  # stack needs one dtype; a max |g| is representable in its own
            peaks = [peak.to(torch.float64) for peak in peaks]
        return bool(torch.stack(peaks).isfinite().all())
    except (RuntimeError, TypeError, NotImplementedError):  # sparse gradients, mixed devices, ...
        return all(bool(torch.isfinite(g.coalesce().values() if g.is_sparse else g).all()) for g in grads)


def _distinct_examples_per_epoch(loader: object) -> int | None:
    """How many distinct examples a ``DataLoader`` yields per epoch, where its sampler says so (sequential, or
    shuffled without replacement); ``None`` for other loaders and samplers."""
    from torch.utils.data import DataLoader, RandomSampler, SequentialSampler, SubsetRandomSampler
    from torch.utils.data.distributed import DistributedSampler

    if not isinstance(loader, DataLoader) or loader.batch_sampler is None:
        return None
    sampler = getattr(loader.batch_sampler, "sampler", None)
    try:
        if isinstance(sampler, RandomSampler) and not sampler.replacement:
            count = min(len(sampler), len(sampler.data_source))  # type: ignore[arg-type]
        elif isinstance(sampler, (SequentialSampler, SubsetRandomSampler, DistributedSampler)):
            count = len(sampler)
        else:
            return None
        if getattr(loader.batch_sampler, "drop_last", False):
            count = min(count, len(loader.batch_sampler) * int(loader.batch_sampler.batch_size))  # type: ignore[attr-defined, arg-type]
    except (TypeError, AttributeError):
        return None
    return count


def _draws_with_replacement(loader: object) -> bool:
    samplers = (getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None))
    return any(getattr(s, "replacement", False) is True for s in samplers)


def _resume(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, loader: object, dev: torch.device,
    likelihood: nn.Module | None = None,
) -> tuple[int, list[dict[str, float]], int]:
    """Load a checkpoint written by :func:`fit` into the model and optimizer, restore the random states; returns
    (completed epochs, history, step)."""
    state = read_checkpoint(path, map_location=dev)
    missing = [key for key in ("epoch", "history") if key not in state]
    if missing:
        entries = " or ".join(repr(k) for k in missing)
        raise CheckpointError(path, f"has no {entries} entry: not written by fit, so training cannot resume from it")
    epoch, history, step = state["epoch"], state["history"], state.get("step", 0)
    if type(epoch) is not int or epoch < 0 or type(step) is not int or step < 0:
        raise CheckpointError(path, f"its epoch ({epoch!r}) and step ({step!r}) must be integers >= 0")
    if not isinstance(history, list) or len(history) != epoch or not all(isinstance(r, dict) for r in history):
        raise CheckpointError(path, f"its history is not one record per completed epoch ({epoch})")
    for index, record in enumerate(history):  # what fit reads from the restored records (the diagnosis, the callers)
        bad = [key for key in _HISTORY_KEYS if type(record.get(key)) not in (int, float)]
        if bad:
            raise CheckpointError(
                path, f"its history record {index + 1} lacks numbers for {bad} (each of fit's records holds "
                f"{list(_HISTORY_KEYS)}): not written by fit, or altered"
            )  # fmt: skip
    if "rng" in state:  # checked before anything is loaded into the model: a bad entry leaves the model as it was
        _check_rng_state(state["rng"], path)
    if likelihood is not None and any(p.requires_grad for p in likelihood.parameters()) and "likelihood" not in state:
        raise CheckpointError(
            path, f"has no 'likelihood' entry, but the run trains {type(likelihood).__name__}'s parameters: resuming would "
            "restart them from their initial values (was it written by a run without likelihood=?)"
        )
    _apply_checkpoint(path, state, model, optimizer, allow_nonfinite=False)
    if likelihood is not None and "likelihood" in state:
        try:
            likelihood.load_state_dict(state["likelihood"])
        except (RuntimeError, KeyError, TypeError) as error:
            raise CheckpointError(path, f"its likelihood state does not fit {type(likelihood).__name__}: {error}") from None
    if "rng" in state:
        _restore_rng_state(state["rng"], loader, path)
    return epoch, list(history), step


def _accumulated_elbo_gradient(
    net: nn.Module, model: nn.Module, x: torch.Tensor, y: torch.Tensor, nll: NLLFunction, n_data: int, beta: float, samples: int
) -> ELBOTerms:
    """``samples`` one-draw ELBO gradients averaged into ``.grad`` (one backward per draw; DDP all-reduces once)."""
    import contextlib

    parts = []
    for s in range(samples):
        last = s == samples - 1
        no_sync = getattr(net, "no_sync", None)
        context = no_sync() if (no_sync is not None and not last) else contextlib.nullcontext()
        with context:
            terms = elbo_loss(nll(net(x), y), model, n_data, beta)
            (terms.loss / samples if samples > 1 else terms.loss).backward()
        parts.append(terms)
    if samples == 1:
        return parts[0]
    mean = lambda values: torch.stack(values).mean()  # noqa: E731
    return ELBOTerms(loss=mean([t.loss.detach() for t in parts]), nll=mean([t.nll for t in parts]),
                     kl=mean([t.kl for t in parts]), beta=float(beta), n_data=n_data)  # fmt: skip


_COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile_mode(compile: bool | str) -> str:
    """The torch.compile mode of ``fit(compile=...)``'s value (``True``: ``"default"``; a mode string as it is), or a
    ``ValueError`` naming the allowed values (``False`` is not a mode: the caller skips compiling)."""
    if compile is True:
        return "default"
    if isinstance(compile, str) and compile in _COMPILE_MODES:
        return compile
    raise ValueError(f"compile must be True, False or one of the modes {list(_COMPILE_MODES)}, got {compile!r}")


def _static_batches(loader: object) -> bool:
    """Whether every batch of ``loader`` has the same shape: a ``DataLoader`` of a fixed ``batch_size`` with
    ``drop_last``, or whose sampler's count it divides (a map-style dataset). Other iterables: not known, False."""
    from torch.utils.data import BatchSampler, DataLoader, IterableDataset

    if not isinstance(loader, DataLoader) or not isinstance(loader.batch_size, int) or loader.batch_size < 1:
        return False
    if loader.drop_last:
        return True
    if isinstance(loader.dataset, IterableDataset) or type(loader.batch_sampler) is not BatchSampler:
        return False  # (its workers each end with a partial batch; a custom batch sampler: not known)
    try:
        return len(loader.sampler) % loader.batch_size == 0  # type: ignore[arg-type]  # the sampler's count
    except TypeError:  # a sampler without a length
        return False


def _uses_cudagraphs(mode: str, device: torch.device) -> bool:
    """Whether torch.compile's ``mode`` records CUDA graphs on ``device`` ("reduce-overhead", "max-autotune" on CUDA)."""
    import torch._inductor

    return device.type == "cuda" and bool(torch._inductor.list_mode_options(mode).get("triton.cudagraphs"))


def _fit_compile_mode(compile: bool | str, device: torch.device, loader: object) -> str:
    """``fit``'s torch.compile mode: a mode string as given; ``True`` is ``"reduce-overhead"`` (CUDA graphs: the
    step's kernels replay as one launch) on a CUDA device when every batch has the same shape, else ``"default"``."""
    mode = compile_mode(compile)
    if compile is True and device.type == "cuda" and _static_batches(loader):
        return "reduce-overhead"
    return mode


def _own_code(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with a code object of its own. torch.compile keeps its cache of compiled graphs, and counts
    recompilations against ``torch._dynamo.config.recompile_limit`` (8), per code object: every ``fit(compile=True)``
    shares its loss function's code, so the models of one process (one per structure: family, estimator, layers)
    would fill one cache, and from the ninth on the step would run eager with only a log warning. A copy per step keeps
    each fit's graphs to itself, and frees them with it."""
    return types.FunctionType(
        function.__code__.replace(), function.__globals__, function.__name__, function.__defaults__, function.__closure__
    )


def _family_inductor_options(model: nn.Module) -> dict[str, Any]:
    """The inductor options a model's families ask for (:attr:`~varbnn.families.VariationalFamily.inductor_options`),
    merged; ``realize_opcount_threshold`` takes the lowest asked for (every family asks for a lower one than
    inductor's default or none)."""
    from varbnn.families.base import VariationalFamily

    options: dict[str, Any] = {}
    for module in model.modules():
        if isinstance(module, VariationalFamily):
            for key, value in module.inductor_options.items():
                options[key] = min(options[key], value) if key == "realize_opcount_threshold" and key in options else value
    return options


COMPILED_DRAWS = ("counter", "generator", "inductor")
"""Where a compiled step's weight noise can come from (``_compiled_elbo_step``'s ``draws``)."""


def _compiled_elbo_step(
    model: nn.Module,
    nll: NLLFunction,
    n_data: int,
    device: torch.device,
    compile: bool | str,
    *,
    graves: bool = False,
    distributed: bool = False,
    draws: str | None = None,
    backend: str | Callable[..., Any] = "inductor",
) -> Callable[[torch.Tensor, torch.Tensor, float, int], ELBOTerms]:
    """``fit(compile=...)``'s step: ``step(x, y, beta, samples)`` accumulates the same ``.grad`` as
    :func:`_accumulated_elbo_gradient` from a :func:`torch.compile`-d loss (the forward, the NLL, the KL and the score
    correction of :func:`varbnn.objectives.elbo_loss`; ``beta`` a 0-d tensor input). ``draws``: where the weight
    noise comes from: ``"counter"`` (the CPU's default) :mod:`varbnn.philox`'s generator inside the compiled kernels,
    one key per call drawn from torch's generator; ``"inductor"`` (every other device's default) inductor's own
    in-kernel generator; ``"generator"`` torch's generator, called as the eager step calls it (the same numbers for
    the same seed). Other random calls (RDP's rejection rounds) use torch's generator in every mode but
    ``"inductor"``.
    ``backend`` another torch.compile backend, a name or a callable (the tests trace every family with
    ``"aot_eager"``: the same graph capture and compiled backward, without inductor's slow code generation)."""
    mode = compile_mode(compile)
    if graves:
        raise ValueError(
            "compile= is not available with MeanField(estimator='graves'): its per-example Fisher gradients "
            "(varbnn.objectives.graves_gradients) do not come from the loss's backward, which is what compile= compiles"
        )
    if distributed:
        raise ValueError("compile= is not available with distributed training yet: train with compile=False")
    from varbnn.families.base import VariationalFamily
    from varbnn.families.gaussian import share_sigmas_in_trace
    from varbnn.objectives import elbo_objective

    refused = {type(m).__name__: m.compile_unsupported for m in model.modules()
               if isinstance(m, VariationalFamily) and m.compile_unsupported}  # fmt: skip
    if refused:
        reasons = "; ".join(f"{name}: {why}" for name, why in sorted(refused.items()))
        raise ValueError(f"compile= is not available yet for this model ({reasons}); train it with compile=False")

    if draws is None:
        draws = "counter" if device.type == "cpu" else "inductor"
    if draws not in COMPILED_DRAWS:
        raise ValueError(f"draws must be one of {COMPILED_DRAWS}, got {draws!r}")
    counter = draws == "counter"

    def loss_terms(
        x: torch.Tensor, y: torch.Tensor, beta: torch.Tensor, key: torch.Tensor | None
    ) -> tuple[torch.Tensor, ...]:
        share_sigmas_in_trace(True)  # one sigma per Gaussian family for the forward pass and the KL
        if key is not None:
            philox.begin_counter_draws(key)
        try:
            nll_value = nll(model(x), y)
            if not isinstance(nll_value, torch.Tensor) or nll_value.dim() != 0:
                raise ValueError("nll must return a scalar tensor (the batch-mean NLL)")
            loss, kl_total = elbo_objective(nll_value, model, n_data, beta)
        finally:
            share_sigmas_in_trace(False)
            if key is not None:
                philox.end_counter_draws()
        return loss, nll_value.detach(), kl_total.detach()

    import torch._inductor

    options = dict(torch._inductor.list_mode_options(mode))
    options["fallback_random"] = draws != "inductor"
    if device.type == "cpu":
        options.update(_family_inductor_options(model))
    # CUDA graphs ("reduce-overhead", "max-autotune"): each step is a new generation of torch's cudagraph trees (the
    # previous step's outputs may be overwritten), so the step marks its start and returns copies of its 0-d outputs
    cudagraphs = _uses_cudagraphs(mode, device)
    # torch.compile turns torch.distributions' global argument validation off (when it is called, and again while it
    # traces) and leaves it off: the user's setting is read before and restored after each, or every distribution
    # built after fit(compile=True) would stop validating
    validate = torch.distributions.Distribution._validate_args
    try:
        if backend == "inductor":
            compiled = torch.compile(_own_code(loss_terms), options=options)
        else:
            compiled = torch.compile(_own_code(loss_terms), backend=backend)
    finally:
        torch.distributions.Distribution.set_default_validate_args(validate)

    # beta's tensor, refilled each step: fill_ with a number is a kernel argument, where torch.tensor(beta, device=...)
    # would copy from host memory and (a blocking copy) wait for the device every step
    beta_t = torch.zeros((), device=device)

    def step(x: torch.Tensor, y: torch.Tensor, beta: float, samples: int) -> ELBOTerms:
        if not (math.isfinite(beta) and beta >= 0):
            raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
        beta_t.fill_(float(beta))
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        parts = []
        for _ in range(samples):
            try:
                key = philox.new_key(device) if counter else None
                loss, nll_value, kl_total = compiled(x, y, beta_t, key)
                (loss / samples if samples > 1 else loss).backward()
            finally:
                torch.distributions.Distribution.set_default_validate_args(validate)
            if cudagraphs:  # the graph's output buffers are reused by the next replay
                nll_value, kl_total = nll_value.clone(), kl_total.clone()
                parts.append((loss.detach().clone(), nll_value, kl_total))
            else:
                parts.append((loss.detach(), nll_value, kl_total))
        if samples == 1:
            loss, nll_value, kl_total = parts[0]
        else:
            loss, nll_value, kl_total = (torch.stack(values).mean() for values in zip(*parts))
        return ELBOTerms(loss=loss, nll=nll_value, kl=kl_total, beta=float(beta), n_data=n_data)

    return step


@torch.no_grad()
def _broadcast_state(model: nn.Module) -> None:
    """Make every rank's parameters and buffers equal to rank 0's (what DDP does at construction)."""
    import torch.distributed as dist

    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.data, src=0)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    likelihood: Likelihood | str = "categorical",
    samples: int = 32,
    batch_size: int = 1000,
    seed: int | None = 0,
    device: str | torch.device | None = "model",
) -> dict[str, float]:
    """The likelihood's metrics of the Monte Carlo predictive of ``samples`` draws on ``(x, y)``: accuracy, NLL, ECE and
    Brier for ``"categorical"``; RMSE, NLL (``-mean_n log (1/S) sum_s p(y_n | f_s)``) and the mean predictive std for
    the Gaussian likelihoods. The model is put in eval mode (a Bayesian layer still samples: see
    :mod:`varbnn.nn.base`); ``seed`` makes the draws reproducible without touching the global random state.

    Cost: ``samples`` forward passes over ``x`` (vectorised by :func:`varbnn.predict.predict`), ``batch_size`` examples
    at a time.

    :param model: a trained network (Bayesian or plain: a plain one gives ``samples`` equal draws).
    :param x: inputs ``[N, ...]``.
    :param y: targets: class indices ``[N]`` or regression targets.
    :param likelihood: a :class:`~varbnn.likelihoods.Likelihood` or the name of one without learned parameters
        (default ``"categorical"``); pass the same object ``fit`` trained with when it has learned noise.
    :param samples: Monte Carlo weight draws S, an int >= 1 (default 32).
    :param batch_size: examples per vectorised pass (default 1000; memory only).
    :param seed: seed of the draws (default 0), or ``None`` for the global random state.
    :param device: where to evaluate (default ``"model"``: the model's device; as in :func:`fit`).
    :returns: ``{metric name: value}`` as Python floats (:meth:`varbnn.likelihoods.Likelihood.metrics`).
    """
    lik = as_likelihood(likelihood)
    batch_size = as_positive_int(batch_size, "batch_size", owner="evaluate")
    if x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(f"x and y must hold the same positive number of examples, got {x.shape[0]} and {y.shape[0]}")
    dev = resolve_device(device, model)
    model.to(dev).eval()
    lik.to(dev)
    outputs = torch.cat(
        [predict(model, x[i : i + batch_size].to(dev), samples=samples, seed=seed) for i in range(0, x.shape[0], batch_size)],
        dim=1,
    )
    return lik.metrics(outputs, y.to(dev))


@torch.no_grad()
def evaluate_classifier(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    samples: int = 16,
    batch_size: int = 1000,
    device: str | torch.device | None = "model",
) -> tuple[dict[str, float], torch.Tensor]:
    """Monte Carlo predictive metrics of a classifier (accuracy, NLL, ECE with 15 bins, Brier score; see
    :mod:`varbnn.metrics`) of ``samples`` draws on ``(x, y)``, and the mean probabilities ``[N, C]``
    (``mean_s softmax(f_s(x))``). Uses the global random state; :func:`evaluate` is the seeded, likelihood-aware
    version."""
    dev = resolve_device(device, model)
    model.to(dev).eval()
    probs = []
    for start in range(0, x.shape[0], batch_size):
        logits = predict(model, x[start : start + batch_size].to(dev), samples=samples)
        probs.append(classification_summary(logits).probs.cpu())
    p = torch.cat(probs)
    out = {
        "accuracy": metrics.accuracy(p, y),
        "nll": metrics.negative_log_likelihood(p, y),
        "ece": metrics.expected_calibration_error(p, y),
        "brier": metrics.brier_score(p, y),
    }
    return out, p


@torch.no_grad()
def evaluate_weight_samples(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    n_train: int,
    samples: int = 100,
    batch_size: int = 1000,
    seed: int = 0,
    nll: NLLFunction = F.cross_entropy,
    device: str | torch.device | None = "model",
) -> dict[str, torch.Tensor]:
    """Per-weight-sample evaluation (Swiatkowski et al. 2020, Fig. 6): for each of ``samples`` draws,

    * ``nll`` -- mean negative log-likelihood of ``(x, y)`` under that one draw (nats per example),
    * ``accuracy`` -- accuracy of that draw's argmax,
    * ``nelbo`` -- ``nll + KL / n_train``: the -ELBO per training example estimated on ``(x, y)``.

    Returns ``{name: tensor[samples]}`` (float64); report their mean and SEM. One draw is shared by all batches
    of ``x``: each batch replays the same seeded random stream (``seed`` and the draw index) in a forked RNG, so
    estimators that draw whole weights (``reparam``) see identical weights in every batch; the global RNG is left
    untouched. (Local reparameterization and flipout draw per example; their per-draw numbers are then
    per-example draws, still unbiased for the expected NLL.)
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be a positive integer, got {samples!r}")
    if isinstance(n_train, bool) or not isinstance(n_train, int) or n_train < 1:
        raise ValueError(f"n_train must be a positive integer (the training-set size), got {n_train!r}")
    if x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(f"x and y must hold the same positive number of examples, got {x.shape[0]} and {y.shape[0]}")
    from varbnn.divergence import kl as model_kl

    dev = resolve_device(device, model)
    model.to(dev).eval()
    devices = [dev] if dev.type == "cuda" else []
    out = {k: torch.empty(samples, dtype=torch.float64) for k in ("nll", "accuracy", "nelbo")}
    for s in range(samples):
        draw_seed = (seed * 1_000_003 + s) % 2**63
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(draw_seed)
            kl_total = float(model_kl(model))  # closed form for Normal families; one Monte Carlo draw otherwise
        total_nll, correct = 0.0, 0
        for start in range(0, x.shape[0], batch_size):
            xb, yb = x[start : start + batch_size].to(dev), y[start : start + batch_size].to(dev)
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(draw_seed)
                logits = model(xb)
            total_nll += float(nll(logits, yb)) * xb.shape[0]
            correct += int((logits.argmax(-1) == yb).sum())
        out["nll"][s] = total_nll / x.shape[0]
        out["accuracy"][s] = correct / x.shape[0]
        out["nelbo"][s] = out["nll"][s] + kl_total / n_train
    return out
