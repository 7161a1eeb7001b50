"""Datasets: where they live, how they are checked, and loaders returning tensors.

The data directory is resolved as: the ``data_dir`` argument, then the ``VARBNN_DATA`` environment variable,
then the user cache directory (``$XDG_CACHE_HOME/varbnn`` or ``~/.cache/varbnn``). Every file is checked
against the sha256 in ``manifest.json``; a missing file is downloaded from its upstream URL (tried in order),
written to a temporary file, verified and only then moved into place, so a failed or corrupt download never
replaces or leaves behind anything.
"""

from varbnn.data.batches import TensorBatches
from varbnn.data.files import ChecksumError, fetch, resolve_data_dir
from varbnn.data.loaders import (
    UCI_DATASETS,
    UCISplit,
    load_digits,
    load_fashion_mnist,
    load_mnist,
    load_retinamnist,
    load_uci,
)

__all__ = [
    "ChecksumError",
    "fetch",
    "resolve_data_dir",
    "UCI_DATASETS",
    "UCISplit",
    "load_digits",
    "load_mnist",
    "load_fashion_mnist",
    "load_retinamnist",
    "load_uci",
    "TensorBatches",
]
