"""benchmarks/ktied_gemms.py: KTied's thin matrix products timed three ways, each checked to give KTied's numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from ktied_gemms import PARTS, VARIANTS, products, tied_shapes  # type: ignore[import-not-found]  # noqa: E402

from varbnn.models import mlp, resnet18  # noqa: E402


def test_every_variant_computes_ktieds_products():
    g = torch.Generator().manual_seed(1)
    u, v, grad = torch.rand(7, 2, generator=g), torch.rand(11, 2, generator=g), torch.randn(7, 11, generator=g)
    sigma = u @ v.T
    want = (sigma, u.T @ u, v.T @ v, grad @ v, grad.T @ u)  # G^T U as the (n, k) matrix
    for name in VARIANTS:
        assert len(VARIANTS[name]) == len(PARTS)
        for got, expected, part in zip(products(name, u, v, grad), want, PARTS):
            torch.testing.assert_close(got, expected, msg=f"{name}: {part}")


def test_the_tied_shapes_are_the_weights_ktied_ties():
    assert tied_shapes(mlp(784, (400, 400), 10)) == [(400, 784), (400, 400), (10, 400)]
    shapes = tied_shapes(resnet18())
    assert (64, 27) in shapes and (512, 4608) in shapes and (10, 512) in shapes  # first conv, a 3x3 of layer4, fc
    assert all(len(s) == 2 and min(s) > 2 for s in shapes)


def test_the_benchmark_writes_its_table(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT / 'lab'}"}  # the library and the lab under test
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ktied_gemms.py"), "--model", "mlp", "--repeats", "2",
                           "--threads", "1", "--out", str(tmp_path)], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "ktied_gemms_mlp.json").read_text())
    assert [r["variant"] for r in result["rows"]] == list(VARIANTS)
    assert all(r["ms_per_step"] > 0 and set(r["parts_ms"]) == set(PARTS) for r in result["rows"])
    assert result["config"]["tied_weights"] == 3
