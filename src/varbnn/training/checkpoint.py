"""The checkpoint file format (:data:`CHECKPOINT_FORMAT`, version :data:`CHECKPOINT_VERSION`): plain data only,
loaded with ``weights_only=True``, a sha256 checksum as the zip comment, atomic writes; the random states a resumed
run restores; :func:`_resume`, what :func:`varbnn.training.fit` resumes from."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import random
import re
import struct
import tempfile
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from torch import nn

from varbnn.training.checks import NonFiniteError, _listing, _nonfinite_names
from varbnn.training.setup import resolve_device


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
    if optimizer is not None and optimizer_state is not None:
        _check_optimizer_fits(path, optimizer_state, optimizer)  # before the model is touched
    before = {k: v.detach().clone() for k, v in model.state_dict().items()} if optimizer is not None else None
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, KeyError, TypeError, ValueError) as error:
        raise CheckpointError(path, f"does not fit the model: {error}") from None
    if optimizer is not None and optimizer_state is not None:
        try:
            optimizer.load_state_dict(optimizer_state)
        except (RuntimeError, KeyError, TypeError, ValueError) as error:
            if before is not None:  # nothing half-loaded: the model as it was
                model.load_state_dict(before)
            raise CheckpointError(path, f"does not fit the optimizer: {error}") from None


def _check_optimizer_fits(path: Path, saved: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
    """Refuse (:class:`CheckpointError`) an optimizer state whose parameter groups do not hold as many tensors as the
    optimizer's: the checkpoint of a model with other parameters (e.g. a layer shared at two places, which has one set
    of parameters, against one with two separate layers of the same shapes)."""
    groups = saved.get("param_groups")
    if not isinstance(groups, list) or not all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups):
        raise CheckpointError(path, "its optimizer state has no list of parameter groups: not written by an optimizer")
    held = [len(g["params"]) for g in optimizer.param_groups]
    stored = [len(g["params"]) for g in groups]
    if held != stored:
        raise CheckpointError(
            path,
            f"does not fit the optimizer: it holds optimizer state for {stored} parameter tensors (per group), the "
            f"optimizer has {held}: a checkpoint of a model with other parameters (another architecture, or modules "
            "shared or tied differently); nothing was loaded",
        )


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
