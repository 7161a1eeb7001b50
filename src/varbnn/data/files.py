"""Data-directory resolution, checksums and downloads."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import cast

__all__ = ["ChecksumError", "resolve_data_dir", "fetch", "manifest", "sha256_of", "forget_verified"]

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
    """The sha256 of a file's bytes as a hex string (read in 1 MiB blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# Files hashed in this process: a file is hashed again unless its identity and every timestamp are unchanged. The key
# holds the inode change time (ctime), which every write and every os.utime() call sets to "now" and which no user can
# set back, so a same-size edit with its mtime restored is hashed again (the key used to be (path, size, mtime)).
_verified: dict[tuple[str, int, int, int, int, int], str] = {}
# Timestamps have the granularity of the kernel's coarse clock (a few ms), so an edit in the same tick as the last
# change could keep the ctime. As git does with "racily clean" index entries, a file changed less than this long before
# it was hashed is not cached: it is hashed again at its next use.
_RACY_SECONDS = 2.0


def _stat_key(path: Path) -> tuple[tuple[str, int, int, int, int, int], int]:
    stat = path.stat()
    return (str(path.resolve()), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns), stat.st_ctime_ns


def forget_verified() -> None:
    """Forget which files were verified in this process: the next :func:`fetch` of each hashes it again."""
    _verified.clear()


def _verify(path: Path, expected: str, reverify: bool = False) -> None:
    key, ctime_ns = _stat_key(path)
    started_ns = time.time_ns()
    actual = None if reverify else _verified.get(key)
    if actual is None:
        actual = sha256_of(path)
    if actual != expected:
        _verified.pop(key, None)
        raise ChecksumError(
            f"{path}: sha256 {actual} does not match the expected {expected}; the file is corrupt or a different version"
        )
    after, _ = _stat_key(path)
    if after == key and started_ns - ctime_ns > _RACY_SECONDS * 1e9:
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
    reverify: bool = False,
) -> Path:
    """Path of a verified dataset file, downloading it if missing.

    An existing file is checked against the manifest's sha256. Within a process the result is remembered for the file's
    (path, device, inode, size, mtime, ctime): any write changes the ctime, which cannot be set back, so an edited file is
    hashed again even with its size and mtime restored; ``reverify=True`` hashes it regardless.

    :param relative_path: the file's path inside the data directory, as in ``manifest.json``
        (e.g. ``"mnist/train-images-idx3-ubyte.gz"``).
    :param data_dir: see :func:`resolve_data_dir`.
    :param download: download a missing file (otherwise raise ``FileNotFoundError``).
    :param mirrors: base URLs tried instead of the upstream ones (default: the comma-separated
        ``$VARBNN_MIRROR`` if set); the file is fetched from ``mirror + "/" + relative_path``.
    :param timeout: seconds per download attempt.
    :param reverify: hash the file even if it was verified before in this process and looks unchanged.
    """
    entries = manifest()
    if relative_path not in entries:
        raise ValueError(f"unknown dataset file {relative_path!r}; see varbnn/data/manifest.json for the known files")
    entry = entries[relative_path]
    expected = str(entry["sha256"])
    root = resolve_data_dir(data_dir)
    path = root / relative_path
    if path.exists():
        _verify(path, expected, reverify=reverify)
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
