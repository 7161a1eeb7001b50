import functools
import http.server
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch

from varbnn import data
from varbnn.data.files import ChecksumError, fetch, resolve_data_dir

YACHT = "UCI_Datasets/yacht/data"


def test_data_dir_resolution_order(monkeypatch, tmp_path):
    monkeypatch.setenv("VARBNN_DATA", str(tmp_path / "env"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"
    assert resolve_data_dir() == tmp_path / "env"
    monkeypatch.delenv("VARBNN_DATA")
    assert resolve_data_dir() == tmp_path / "cache" / "varbnn"


def test_missing_file_without_download_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="n_splits.txt is missing.*VARBNN_DATA"):
        fetch(f"{YACHT}/n_splits.txt", tmp_path, download=False)


def test_unknown_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset file"):
        fetch("mnist/nothing.gz", tmp_path)


def test_corrupt_existing_file_is_reported_and_kept(tmp_path):
    target = tmp_path / YACHT / "n_splits.txt"
    target.parent.mkdir(parents=True)
    target.write_text("7\n")
    with pytest.raises(ChecksumError, match="sha256"):
        fetch(f"{YACHT}/n_splits.txt", tmp_path)
    assert target.read_text() == "7\n"  # never deleted


@pytest.fixture
def http_mirror(tmp_path):
    """A local HTTP server on 127.0.0.1 serving tmp_path/'served'."""
    root = tmp_path / "served"
    root.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep test output clean
        pass


def test_download_from_a_local_server_verifies_and_loads(http_mirror, data_dir, tmp_path, monkeypatch):
    served, url = http_mirror
    shutil.copytree(data_dir / YACHT, served / YACHT)
    target_dir = tmp_path / "cache"
    monkeypatch.setenv("VARBNN_MIRROR", url)
    split = data.load_uci("yacht", 2, target_dir)
    assert (target_dir / YACHT / "data.txt").exists()
    assert split.x_train.shape[1] == 6 and split.x_train.shape[0] + split.x_test.shape[0] == 308
    assert not list((target_dir / YACHT).glob(".*part")), "no temporary files left behind"


def test_corrupt_download_is_rejected_and_leaves_nothing(http_mirror, tmp_path):
    served, url = http_mirror
    (served / YACHT).mkdir(parents=True)
    (served / YACHT / "n_splits.txt").write_text("999\n")
    target_dir = tmp_path / "cache"
    with pytest.raises(FileNotFoundError, match="(?s)could not download.*does not match"):
        fetch(f"{YACHT}/n_splits.txt", target_dir, mirrors=[url])
    assert not any(p.is_file() for p in target_dir.rglob("*"))


def test_unreachable_server_is_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="could not download"):
        fetch(f"{YACHT}/n_splits.txt", tmp_path, mirrors=["http://127.0.0.1:9"], timeout=2)


def test_mnist_and_fashion_loaders(data_dir):
    x, y = data.load_mnist("test", data_dir)
    assert x.shape == (10000, 1, 28, 28) and x.dtype == torch.float32 and 0 <= x.min() and x.max() <= 1
    assert y.dtype == torch.int64 and torch.bincount(y).tolist()[:3] == [980, 1135, 1032]
    x, y = data.load_fashion_mnist("test", data_dir)
    assert torch.bincount(y).tolist() == [1000] * 10


def test_a_second_load_decodes_nothing_and_shares_no_memory(data_dir, monkeypatch):
    """The decoded IDX files are kept within the process: a second load of the same split gives equal tensors without
    decoding the file again, and writing into one load's tensors does not change the next load's."""
    from varbnn.data import loaders

    first_x, first_y = data.load_mnist("test", data_dir)
    monkeypatch.setattr(loaders, "_decode_idx", lambda path: pytest.fail(f"{path} decoded again"))
    again_x, again_y = data.load_mnist("test", data_dir)
    assert torch.equal(first_x, again_x) and torch.equal(first_y, again_y)
    first_x.zero_()
    first_y.zero_()
    third_x, third_y = data.load_mnist("test", data_dir)
    assert torch.equal(third_x, again_x) and torch.equal(third_y, again_y) and third_x.max() == 1


def test_uci_split_normalisation(data_dir):
    s = data.load_uci("concrete", 0, data_dir)
    assert s.x_train.shape[1] == 8 and s.x_train.shape[0] + s.x_test.shape[0] == 1030
    torch.testing.assert_close(s.x_train.mean(0), torch.zeros(8), atol=1e-5, rtol=0)
    assert abs(float(s.y_train.std(unbiased=False)) - 1) < 1e-4
    raw = data.load_uci("concrete", 0, data_dir, normalize=False)
    torch.testing.assert_close(raw.y_test, s.y_test * s.y_std + s.y_mean, rtol=1e-5, atol=1e-4)
    assert data.load_uci("protein-tertiary-structure", 4, data_dir).x_train.shape[1] == 9


def test_bad_loader_arguments_are_named(data_dir):
    with pytest.raises(ValueError, match="unknown UCI dataset.*allowed"):
        data.load_uci("year", 0, data_dir)
    with pytest.raises(ValueError, match=r"split must be an integer in \[0, 4\]"):
        data.load_uci("protein-tertiary-structure", 5, data_dir)
    with pytest.raises(ValueError, match="split must be one of"):
        data.load_mnist("validation", data_dir)


def test_digits_is_offline_and_stratified():
    x, y = data.load_digits("train")
    xt, yt = data.load_digits("test")
    assert x.shape[1] == 64 and len(x) + len(xt) == 1797 and x.max() <= 1
    assert set(yt.tolist()) == set(range(10))


def test_manifest_covers_the_shared_layout(data_dir):
    manifest = data.files.manifest()
    on_disk = {p.relative_to(data_dir).as_posix() for p in Path(data_dir).rglob("*") if p.is_file() and p.name != "README.md"}
    assert on_disk == set(manifest)


# --- the checksum cache (issue 25) ---------------------------------------------------------------------------------


@pytest.fixture
def copied_file(data_dir, tmp_path):
    """A fresh copy of a small verified dataset file: (data dir, relative path, path)."""
    from varbnn.data import files

    files.forget_verified()
    relative = f"{YACHT}/index_train_0.txt"
    target = tmp_path / relative
    target.parent.mkdir(parents=True)
    shutil.copyfile(data_dir / relative, target)
    yield tmp_path, relative, target
    files.forget_verified()


def _same_size_edit_keeping_the_mtime(path: Path) -> None:
    before = path.stat()
    content = bytearray(path.read_bytes())
    i = next(i for i, c in enumerate(content) if chr(c).isdigit())
    content[i] = ord("7") if content[i] != ord("7") else ord("3")
    path.write_bytes(bytes(content))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def test_same_size_edit_with_the_mtime_restored_is_caught(copied_file, monkeypatch):
    from varbnn.data import files

    root, relative, path = copied_file
    monkeypatch.setattr(files, "_RACY_SECONDS", 0.0)  # cache even a file written a moment ago
    time.sleep(0.05)  # past the coarse clock's tick, so that the edit gets a new ctime
    fetch(relative, root)
    assert len(files._verified) == 1  # remembered: the next fetch would not hash an unchanged file
    _same_size_edit_keeping_the_mtime(path)
    with pytest.raises(ChecksumError, match="index_train_0.txt: sha256 .* does not match"):
        fetch(relative, root)


def test_a_file_changed_just_before_its_check_is_not_cached(copied_file):
    # (path, size, mtime, ctime) of a file written in the last moment could survive an edit within the clock's tick
    from varbnn.data import files

    root, relative, path = copied_file
    fetch(relative, root)
    assert files._verified == {}
    _same_size_edit_keeping_the_mtime(path)
    with pytest.raises(ChecksumError, match="does not match"):
        fetch(relative, root)


def test_cache_hits_and_reverify(copied_file, data_dir, monkeypatch):
    from varbnn.data import files

    calls = []
    real = files.sha256_of
    monkeypatch.setattr(files, "sha256_of", lambda p: calls.append(p) or real(p))
    root, relative, _ = copied_file
    old = f"{YACHT}/index_test_0.txt"  # the shared copy, written long ago
    for _ in range(3):
        fetch(old, data_dir)
    assert len(calls) == 1
    fetch(old, data_dir, reverify=True)
    assert len(calls) == 2
    files.forget_verified()
    fetch(old, data_dir)
    assert len(calls) == 3
