"""Issue 25, "Numbers and arguments": every input of the audit, and what it gives now.

Each row feeds exactly the audited input: infinite Bessel arguments and orders, the tiny argument where log I_0 was 5%
off, RDP's init_log_std=10 and init_std=1e-44 (refused by name with the allowed range), NumPy and tensor numbers
(accepted), the CLI's --threads and --device (one-line errors, exit status 2), a same-size dataset edit with its mtime
restored (caught), and the Radial distribution's support, expand and KL (fixed).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from bad_input_table import BadInput, check, params
from conftest import DATA_DIR

from varbnn import cli, kl
from varbnn.data import files
from varbnn.distributions import Radial
from varbnn.distributions.radial import radial_kl
from varbnn.families import KTied, MeanField, RadialDirectional, make_family
from varbnn.families import Radial as RadialFamily
from varbnn.nn import BayesLinear, set_sample_mode
from varbnn.priors import Normal, RadialDirectionalPrior
from varbnn.special import bessel_ratio, log_bessel_iv, log_bessel_iv_over_power

INF = math.inf
ORDERS = torch.tensor([0.0, 0.5, 3.0, 1e4], dtype=torch.float64)


# --- expectations --------------------------------------------------------------------------------------------------


def all_equal(value: float) -> Callable[[Any], None]:
    def expect(result: Any) -> None:
        for tensor in result if isinstance(result, tuple) else (result,):
            assert (tensor == value).all(), tensor

    return expect


def relative_to(want: float, tolerance: float) -> Callable[[Any], None]:
    def expect(result: Any) -> None:
        assert abs(float(result) / want - 1) < tolerance, (float(result), want)

    return expect


def gradient_at_infinity(fn: Callable[[torch.Tensor], torch.Tensor], dtype: torch.dtype) -> Callable[[], torch.Tensor]:
    def call() -> torch.Tensor:
        z = torch.full((4,), INF, dtype=dtype, requires_grad=True)
        (grad,) = torch.autograd.grad(fn(z).sum(), z)
        return grad

    return call


def float32_layer_is_finite(spec: Callable[[], Any], prior: Any) -> Callable[[], Any]:
    """call=: a float32 BayesLinear's sample / mean / mode outputs, loss and gradients; expect with :func:`finite`."""

    def call() -> list[torch.Tensor]:
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            layer = BayesLinear(20, 30, family=spec(), prior=prior)
        x, tensors = torch.randn(8, 20), []
        for mode in ("sample", "mean", "mode"):
            set_sample_mode(layer, mode)
            layer.zero_grad()
            out = layer(x)
            loss = out.square().mean() + kl(layer) / 100
            loss.backward()
            tensors += [out, loss] + [p.grad for p in layer.parameters() if p.grad is not None]
        return tensors

    return call


def finite(tensors: list[torch.Tensor]) -> None:
    assert all(t.dtype == torch.float32 and bool(torch.isfinite(t).all()) for t in tensors)


def stored(**want: Any) -> Callable[[Any], None]:
    """expect=: the family spec holds these hyperparameters as plain Python numbers."""

    def expect(family: Any) -> None:
        for name, value in want.items():
            got = family._hyperparameters[name]
            assert got == value and type(got) is type(value), (name, got, value)
        family.build((3, 4))

    return expect


def run_cli(*argv: str) -> Callable[[], tuple[int, str]]:
    """call=: ``varbnn argv`` in-process: (exit status, stderr)."""

    def call() -> tuple[int, str]:
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            try:
                status = cli.main(list(argv))
            except SystemExit as stop:
                status = stop.code if isinstance(stop.code, int) else 1
        return status, stderr.getvalue()

    return call


def one_line_error(pattern: str) -> Callable[[tuple[int, str]], None]:
    def expect(result: tuple[int, str]) -> None:
        import re

        status, text = result
        assert status == 2, (status, text)
        lines = text.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in text, text
        assert re.search(pattern, lines[0]), lines[0]

    return expect


def same_size_edit_with_mtime_restored() -> Path:
    """call=: copy a dataset file, verify it (cached), edit one digit in place, restore its mtime, and fetch it again."""
    if not (DATA_DIR / "UCI_Datasets").exists():
        pytest.skip(f"shared datasets not found at {DATA_DIR}")
    relative = "UCI_Datasets/yacht/data/index_train_1.txt"
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / relative
        target.parent.mkdir(parents=True)
        shutil.copyfile(DATA_DIR / relative, target)
        files.forget_verified()
        racy, files._RACY_SECONDS = files._RACY_SECONDS, 0.0  # cache even this fresh copy
        try:
            time.sleep(0.05)
            files.fetch(relative, tmp)
            before = target.stat()
            content = bytearray(target.read_bytes())
            content[0] = ord("9") if content[0] != ord("9") else ord("8")
            target.write_bytes(bytes(content))
            os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
            assert (target.stat().st_size, target.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
            return files.fetch(relative, tmp)
        finally:
            files._RACY_SECONDS = racy
            files.forget_verified()


def radial_kl_with_seed() -> tuple[float, float]:
    q = Radial(torch.zeros(4, 3, dtype=torch.float64), torch.full((4, 3), 0.5, dtype=torch.float64))
    p = Normal(0.0, 1.0).to(torch.float64).distribution((4, 3))
    return tuple(float(radial_kl(q, p, samples=10, generator=torch.Generator().manual_seed(3))) for _ in range(2))


def equal_pair(result: tuple[float, float]) -> None:
    assert result[0] == result[1]


RANGE = r"must be a finite number in \[1e-08, 100\], got 1e-44"
N_THREADS = cli.max_threads()
CUDA = torch.cuda.is_available()

CASES = [
    # -- special functions at infinity, and a tiny argument
    BadInput("bessel_ratio-z-inf", lambda: bessel_ratio(ORDERS, torch.full((4,), INF)), expect=all_equal(1.0)),
    BadInput("bessel_ratio-z-inf-float64", lambda: bessel_ratio(ORDERS, torch.full((4,), INF, dtype=torch.float64)),
             expect=all_equal(1.0)),
    BadInput("bessel_ratio-z-inf-python-float", lambda: bessel_ratio(3.0, INF), expect=all_equal(1.0)),
    BadInput("log_bessel_iv-z-inf", lambda: log_bessel_iv(ORDERS, torch.full((4,), INF)), expect=all_equal(INF)),
    BadInput("log_bessel_iv-z-inf-python-float", lambda: log_bessel_iv(0.0, INF), expect=all_equal(INF)),
    BadInput("log_bessel_iv_over_power-z-inf", lambda: log_bessel_iv_over_power(3.0, INF), expect=all_equal(INF)),
    BadInput("bessel_ratio-gradient-at-z-inf", gradient_at_infinity(lambda z: bessel_ratio(ORDERS, z), torch.float32),
             expect=all_equal(0.0)),
    BadInput("log_bessel_iv-gradient-at-z-inf", gradient_at_infinity(lambda z: log_bessel_iv(ORDERS, z), torch.float64),
             expect=all_equal(1.0)),
    BadInput("bessel_ratio-nu-inf", lambda: bessel_ratio(INF, 1.0), raises=ValueError,
             match=r"bessel_ratio: the order nu must be >= 0 and finite, i\.e\. in \[0, inf\) \(got inf\)"),
    BadInput("log_bessel_iv-nu-inf", lambda: log_bessel_iv(torch.tensor([1.0, INF]), 1.0), raises=ValueError,
             match=r"log_bessel_iv: the order nu must be >= 0 and finite"),
    BadInput("log_bessel_iv-nu-inf-z-inf", lambda: log_bessel_iv(INF, INF), raises=ValueError,
             match=r"the order nu must be >= 0 and finite"),
    BadInput("log_bessel_iv-z-nan", lambda: log_bessel_iv(1.0, math.nan), raises=ValueError,
             match=r"the argument z must be >= 0 and not NaN, i\.e\. in \[0, inf\]"),
    BadInput("log_bessel_iv-0-at-5.8e-8", lambda: log_bessel_iv(0.0, torch.tensor(5.8e-8, dtype=torch.float64)),
             expect=relative_to(5.8e-8**2 / 4, 1e-14)),
    BadInput("log_bessel_iv-0-at-5.8e-8-float32", lambda: log_bessel_iv(0.0, torch.tensor(5.8e-8)),
             expect=relative_to(float(torch.tensor(5.8e-8)) ** 2 / 4, 2**-23)),
    BadInput("log_bessel_iv-numpy-numbers", lambda: log_bessel_iv(np.int64(2), np.float32(3.0)),
             expect=relative_to(float(log_bessel_iv(2.0, 3.0)), 1e-7)),
    BadInput("bessel_ratio-tensor-numbers", lambda: bessel_ratio(torch.tensor(2), torch.tensor(3.0)),
             expect=relative_to(float(bessel_ratio(2.0, 3.0)), 1e-7)),
    BadInput("bessel_ratio-bool-order", lambda: bessel_ratio(True, 1.0), raises=ValueError,
             match="the order nu must be a real number or a real tensor, got a bool"),
    # -- init arguments: allowed ranges, checked by name
    BadInput("rdp-double-init_log_std-10", lambda: RadialDirectional(grouping="double", init_log_std=10), raises=ValueError,
             match=r"RadialDirectional: init_log_std must be a finite number in \[1e-08, 1\], got 10"),
    BadInput("rdp-double-init_log_std-1-float32-finite",
             float32_layer_is_finite(lambda: RadialDirectional(grouping="double", init_log_std=1.0),
                                     RadialDirectionalPrior()), expect=finite),
    BadInput("rdp-init_resultant-1", lambda: RadialDirectional(init_resultant=1.0), raises=ValueError,
             match=r"init_resultant must be a finite number in \[1e-06, 0.999999\]"),
    BadInput("rdp-fallback_init_std-1e-44", lambda: RadialDirectional(fallback_init_std=1e-44), raises=ValueError,
             match="RadialDirectional: fallback_init_std " + RANGE),
    BadInput("meanfield-init_std-1e-44", lambda: MeanField(init_std=1e-44), raises=ValueError,
             match="MeanField: init_std " + RANGE),
    BadInput("ktied-init_std-1e-44", lambda: KTied(init_std=1e-44), raises=ValueError, match="KTied: init_std " + RANGE),
    BadInput("radial-init_std-1e-44", lambda: RadialFamily(init_std=1e-44), raises=ValueError, match="Radial: init_std " + RANGE),
    BadInput("meanfield-init_std-1e-8-float32-finite",
             float32_layer_is_finite(lambda: MeanField(init_std=1e-8, estimator="local"), Normal(0.0, 1.0)), expect=finite),
    BadInput("meanfield-init_std-inf", lambda: MeanField(init_std=INF), raises=ValueError, match=r"init_std must be a finite"),
    BadInput("meanfield-init_std-tensor", lambda: MeanField(init_std=torch.tensor(0.25)), expect=stored(init_std=0.25)),
    BadInput("meanfield-init_std-numpy", lambda: MeanField(init_std=np.float32(0.25)), expect=stored(init_std=0.25)),
    BadInput("ktied-rank-numpy", lambda: KTied(rank=np.int64(2)), expect=stored(rank=2)),
    BadInput("ktied-rank-tensor", lambda: KTied(rank=torch.tensor(3), init_std=np.float64(0.5)),
             expect=stored(rank=3, init_std=0.5)),
    BadInput("radial-kl_samples-numpy", lambda: RadialFamily(kl_samples=np.int64(4)), expect=stored(kl_samples=4)),
    BadInput("rdp-init_log_std-tensor", lambda: make_family("rdp", init_log_std=torch.tensor(0.25, dtype=torch.float64)),
             expect=stored(init_log_std=0.25)),
    BadInput("init_std-bool", lambda: MeanField(init_std=True), raises=ValueError, match="init_std must be .*got a bool"),
    # -- the command line
    BadInput("cli-threads-100000", run_cli("demo", "--threads", "100000"),
             expect=one_line_error(rf"varbnn demo: error: --threads must be an integer in \[1, {N_THREADS}\].*got 100000")),
    BadInput("cli-threads-10000", run_cli("reproduce", "mlp-mnist", "--threads", "10000"),
             expect=one_line_error(rf"varbnn reproduce: error: --threads must be an integer in \[1, {N_THREADS}\]")),
    BadInput("cli-threads-0", run_cli("demo", "--threads", "0"), expect=one_line_error(r"--threads must be an integer in \[1,")),
    BadInput("cli-device-foo", run_cli("demo", "--device", "foo"),
             expect=one_line_error(r"--device 'foo' is not a device name; allowed: cpu, cuda, cuda:N .*, mps, or auto")),
    BadInput("cli-device-cuda-99", run_cli("demo", "--device", "cuda:99"),
             expect=one_line_error(r"this machine has \d+ CUDA device\(s\)" if CUDA else r"CUDA is not available")),
    BadInput("cli-device-meta", run_cli("reproduce", "mlp-mnist", "--device", "meta"),
             expect=one_line_error(r"device type 'meta' is not supported; allowed: cpu")),
    # -- the dataset checksum cache
    BadInput("data-same-size-edit-mtime-restored", same_size_edit_with_mtime_restored, raises=files.ChecksumError,
             match=r"index_train_1.txt: sha256 \w+ does not match the expected"),
    # -- the Radial distribution
    BadInput("radial-support-event_dim", lambda: Radial(torch.zeros(4, 3), torch.ones(4, 3)).support.event_dim,
             expect=lambda event_dim: assert_equal(event_dim, 2)),
    BadInput("radial-expand", lambda: Radial(torch.zeros(4, 3), torch.ones(4, 3)).expand((5,)).rsample((2,)).shape,
             expect=lambda shape: assert_equal(shape, (2, 5, 4, 3))),
    BadInput("radial-kl-seeded", radial_kl_with_seed, expect=equal_pair),
]  # fmt: skip


def assert_equal(got: Any, want: Any) -> None:
    assert got == want, (got, want)


@pytest.mark.parametrize("case", params(CASES))
def test_bad_input(case: BadInput) -> None:
    check(case)


@pytest.mark.parametrize("threads", [1, N_THREADS])
def test_cli_accepts_threads_within_the_bound(threads, monkeypatch):
    """Both ends of [1, 4 x cores] get through to torch.set_num_threads (the run itself is stubbed out)."""
    import varbnn_lab

    monkeypatch.setattr(varbnn_lab, "run_experiment", lambda *a, **k: {"written": False})
    before = torch.get_num_threads()
    try:
        assert cli.main(["demo", "--threads", str(threads), "--device", "auto"]) == 0
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
