"""Dataset loaders returning float32 inputs and int64 (classification) or float32 (regression) targets.

The file-backed loaders share three arguments: ``split`` (``"train"`` or ``"test"``; RetinaMNIST also has ``"val"``),
``data_dir`` (where the files live; see :func:`varbnn.data.resolve_data_dir`) and ``download`` (fetch a missing file
from its upstream URL, checked against ``manifest.json``; default True). Each returns ``(inputs, labels)`` tensors."""

from __future__ import annotations

import gzip
import os
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from varbnn.data.files import fetch

__all__ = [
    "load_digits",
    "load_mnist",
    "load_fashion_mnist",
    "load_retinamnist",
    "load_uci",
    "UCISplit",
    "UCI_DATASETS",
    "SPLITS",
]

SPLITS = ("train", "test")
"""The ``split`` values of the image loaders."""
UCI_DATASETS = (
    "bostonHousing",
    "concrete",
    "energy",
    "kin8nm",
    "naval-propulsion-plant",
    "power-plant",
    "protein-tertiary-structure",
    "wine-quality-red",
    "yacht",
)
"""The UCI regression sets :func:`load_uci` reads, by the names of Hernandez-Lobato & Adams' (2015) split files."""

PathLike = str | os.PathLike[str] | None


def _check_split(split: str, allowed: tuple[str, ...] = SPLITS) -> None:
    if split not in allowed:
        raise ValueError(f"split must be one of {allowed}, got {split!r}")


def _check_finite(array: np.ndarray, what: str) -> None:
    if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
        raise ValueError(f"{what} contains NaN or infinite values")


def load_digits(split: str = "train", test_fraction: float = 0.25, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's bundled 8x8 digits (1797 images, offline): inputs ``[N, 64]`` in [0, 1], labels ``[N]``.

    A fixed stratified split (``test_fraction``, ``seed``) separates train from test.
    """
    from sklearn.datasets import load_digits as sk_digits
    from sklearn.model_selection import train_test_split

    _check_split(split)
    data = sk_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        data.data / 16.0, data.target, test_size=test_fraction, random_state=seed, stratify=data.target
    )
    x, y = (x_train, y_train) if split == "train" else (x_test, y_test)
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.int64)


_IDX_CACHE: OrderedDict[tuple[str, int, int, int], torch.Tensor] = OrderedDict()
_IDX_CACHE_SIZE = 8  # MNIST's and Fashion-MNIST's four files each: about 110 MB of uint8 tensors


def _read_idx(path: os.PathLike[str]) -> torch.Tensor:
    """The IDX file's uint8 tensor, decoded once per process while the file's size, mtime and ctime stay the same (experiments
    load the same split once per variant). Callers convert it (a new tensor) and never hand the cached one out."""
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if key in _IDX_CACHE:
        _IDX_CACHE.move_to_end(key)
        return _IDX_CACHE[key]
    array = torch.from_numpy(_decode_idx(path).copy())
    _IDX_CACHE[key] = array
    while len(_IDX_CACHE) > _IDX_CACHE_SIZE:
        _IDX_CACHE.popitem(last=False)
    return array


def _decode_idx(path: os.PathLike[str]) -> np.ndarray:
    with gzip.open(path, "rb") as handle:
        raw = handle.read()
    magic = int.from_bytes(raw[:4], "big")
    if magic >> 8 != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file (magic {magic:#x})")
    ndim = magic & 0xFF
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _load_idx_pair(folder: str, split: str, data_dir: PathLike, download: bool) -> tuple[torch.Tensor, torch.Tensor]:
    _check_split(split)
    prefix = "train" if split == "train" else "t10k"
    images = _read_idx(fetch(f"{folder}/{prefix}-images-idx3-ubyte.gz", data_dir, download=download))
    labels = _read_idx(fetch(f"{folder}/{prefix}-labels-idx1-ubyte.gz", data_dir, download=download))
    # torch's uint8 -> float32 conversion and division: the same float32 values as numpy's, in a fraction of the time
    x = images.to(torch.float32).div_(255.0).unsqueeze(1)
    return x, labels.to(torch.int64)


def load_mnist(split: str = "train", data_dir: PathLike = None, download: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """MNIST: inputs ``[N, 1, 28, 28]`` in [0, 1], labels ``[N]`` (60,000 train / 10,000 test)."""
    return _load_idx_pair("mnist", split, data_dir, download)


def load_fashion_mnist(
    split: str = "train", data_dir: PathLike = None, download: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fashion-MNIST: inputs ``[N, 1, 28, 28]`` in [0, 1], labels ``[N]`` (60,000 train / 10,000 test)."""
    return _load_idx_pair("fashion-mnist", split, data_dir, download)


def load_retinamnist(split: str = "train", data_dir: PathLike = None, download: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """RetinaMNIST (MedMNIST v2, 28x28 RGB): inputs ``[N, 3, 28, 28]`` in [0, 1], grades 0..4 ``[N]``."""
    _check_split(split, ("train", "val", "test"))
    with np.load(fetch("retinamnist/retinamnist.npz", data_dir, download=download), allow_pickle=False) as arrays:
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
    x = torch.from_numpy(images.astype(np.float32) / 255.0).permute(0, 3, 1, 2).contiguous()
    return x, torch.from_numpy(labels.reshape(-1).astype(np.int64))


@dataclass(frozen=True)
class UCISplit:
    """One standard train/test split of a UCI regression set, with the train-set normalisation.

    ``x_*`` and ``y_*`` are normalised with the TRAINING mean/std when ``normalized``; predictions ``p`` in
    normalised units map back as ``p * y_std + y_mean``.

    :ivar x_train: training inputs ``[N_train, D]``.
    :ivar y_train: training targets ``[N_train]``.
    :ivar x_test: test inputs ``[N_test, D]``.
    :ivar y_test: test targets ``[N_test]``.
    :ivar x_mean: per-feature mean of the raw training inputs.
    :ivar x_std: per-feature standard deviation of the raw training inputs.
    :ivar y_mean: mean of the raw training targets.
    :ivar y_std: standard deviation of the raw training targets.
    :ivar normalized: whether the tensors above are normalised.
    """

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    x_mean: torch.Tensor
    x_std: torch.Tensor
    y_mean: torch.Tensor
    y_std: torch.Tensor
    normalized: bool


def _read_ints(path: os.PathLike[str]) -> np.ndarray:
    return np.loadtxt(path, dtype=np.int64, ndmin=1)


def load_uci(name: str, split: int = 0, data_dir: PathLike = None, *, normalize: bool = True, download: bool = True) -> UCISplit:
    """Split ``split`` of the UCI set ``name`` (one of :data:`UCI_DATASETS`), as used by Hernandez-Lobato &
    Adams 2015 and Gal & Ghahramani 2016 (20 splits; 5 for protein)."""
    if name not in UCI_DATASETS:
        raise ValueError(f"unknown UCI dataset {name!r}; allowed: {list(UCI_DATASETS)}")
    base = f"UCI_Datasets/{name}/data"
    n_splits = int(_read_ints(fetch(f"{base}/n_splits.txt", data_dir, download=download))[0])
    if isinstance(split, np.integer):
        split = int(split)
    if isinstance(split, bool) or not (isinstance(split, int) and 0 <= split < n_splits):
        raise ValueError(f"split must be an integer in [0, {n_splits - 1}] for {name}, got {split!r}")
    data = np.loadtxt(fetch(f"{base}/data.txt", data_dir, download=download), dtype=np.float64)
    _check_finite(data, f"{name}/data.txt")
    features = _read_ints(fetch(f"{base}/index_features.txt", data_dir, download=download))
    target = int(_read_ints(fetch(f"{base}/index_target.txt", data_dir, download=download))[0])
    train = _read_ints(fetch(f"{base}/index_train_{split}.txt", data_dir, download=download))
    test = _read_ints(fetch(f"{base}/index_test_{split}.txt", data_dir, download=download))
    x, y = data[:, features], data[:, target]
    x_mean, x_std = x[train].mean(0), x[train].std(0)
    x_std[x_std == 0] = 1.0  # constant features (naval) stay at 0 after centring
    y_mean, y_std = y[train].mean(), y[train].std()
    if not normalize:
        x_mean, x_std, y_mean, y_std = np.zeros_like(x_mean), np.ones_like(x_std), 0.0, 1.0
    xn, yn = (x - x_mean) / x_std, (y - y_mean) / y_std

    def t(a: np.ndarray | float) -> torch.Tensor:
        return torch.as_tensor(a, dtype=torch.float32)

    return UCISplit(t(xn[train]), t(yn[train]), t(xn[test]), t(yn[test]), t(x_mean), t(x_std), t(y_mean), t(y_std), normalize)
