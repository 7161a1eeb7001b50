"""Data-directory resolution, checksums and downloads."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import cast

__all__ = ["ChecksumError", "resolve_data_dir", "fetch", "manifest", "sha256_of"]

ENV_VAR = "VARBNN_DATA"
MIRROR_ENV_VAR = "VARBNN_MIRROR"


class ChecksumError(RuntimeError):
    """A file's sha256 differs from the manifest."""


@lru_cache(maxsize=1)
def manifest() -> dict[str, dict[str, object]]:
    """``{relative path: {"sha256", "bytes", "urls"}}`` for every known dataset file."""
    return json.loads((Path(__file__).with_name("manifest.json")).read_text())


def resolve_data_dir(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """``data_dir`` if given, else ``$VARBNN_DATA``, else the user cache directory."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "varbnn"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


_verified: dict[tuple[str, int, float], str] = {}


def _verify(path: Path, expected: str) -> None:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime)
    actual = _verified.get(key) or sha256_of(path)
    if actual != expected:
        raise ChecksumError(
            f"{path}: sha256 {actual} does not match the expected {expected}; the file is corrupt or a different version"
        )
    _verified[key] = actual


def _download(url: str, destination: Path, expected: str, timeout: float) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp_name = tempfile.mkstemp(dir=destination.parent, prefix=f".{destination.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(handle, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310
            for block in iter(lambda: response.read(1 << 20), b""):
                out.write(block)
        actual = sha256_of(tmp)
        if actual != expected:
            raise ChecksumError(f"download from {url}: sha256 {actual} does not match the expected {expected}")
        os.replace(tmp, destination)
    finally:
        tmp.unlink(missing_ok=True)


def fetch(
    relative_path: str,
    data_dir: str | os.PathLike[str] | None = None,
    *,
    download: bool = True,
    mirrors: Sequence[str] | None = None,
    timeout: float = 60.0,
) -> Path:
    """Path of a verified dataset file, downloading it if missing.

    Args:
        relative_path: the file's path inside the data directory, as in ``manifest.json``
            (e.g. ``"mnist/train-images-idx3-ubyte.gz"``).
        data_dir: see :func:`resolve_data_dir`.
        download: download a missing file (otherwise raise ``FileNotFoundError``).
        mirrors: base URLs tried instead of the upstream ones (default: the comma-separated
            ``$VARBNN_MIRROR`` if set); the file is fetched from ``mirror + "/" + relative_path``.
    """
    entries = manifest()
    if relative_path not in entries:
        raise ValueError(f"unknown dataset file {relative_path!r}; see varbnn/data/manifest.json for the known files")
    entry = entries[relative_path]
    expected = str(entry["sha256"])
    root = resolve_data_dir(data_dir)
    path = root / relative_path
    if path.exists():
        _verify(path, expected)
        return path
    if not download:
        raise FileNotFoundError(
            f"{path} is missing; pass download=True, or point data_dir / ${ENV_VAR} at a directory that holds it"
        )
    if mirrors is None and os.environ.get(MIRROR_ENV_VAR):
        mirrors = [m for m in os.environ[MIRROR_ENV_VAR].split(",") if m.strip()]
    upstream = cast(list[str], entry["urls"])
    urls = [f"{m.strip().rstrip('/')}/{relative_path}" for m in mirrors] if mirrors else list(upstream)
    errors = []
    for url in urls:
        try:
            _download(url, path, expected, timeout)
            return path
        except (urllib.error.URLError, OSError, ChecksumError) as error:
            errors.append(f"{url}: {error}")
    raise FileNotFoundError(f"could not download {relative_path} into {root}:\n  " + "\n  ".join(errors))
