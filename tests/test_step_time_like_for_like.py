"""benchmarks/step_time_summary.py's like-for-like table: each compiled (CUDA-graph) step over the deterministic
network's step compiled the same way in the same table, and the first compiled step's seconds beside them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from test_step_time_summary import _tables

ROOT = Path(__file__).resolve().parents[1]
CUDA = "cuda: NVIDIA H200; host cpu: x, 2 threads"
CONFIG = {"model": "LeNet-5-Caffe", "batch": 100, "optimizer": "Adam, fused where supported"}


def _table(path: Path, rows: dict[str, float]) -> None:
    """A step-time table of median steps (ms); each ratio over the first (eager deterministic) row's."""
    base = next(iter(rows.values()))
    table = [{"model": k, "median_ms": v, "ratio": round(v / base, 2), "images_per_s": 1.0, "steps": 1}
             for k, v in rows.items()]  # fmt: skip
    data = {"name": "step_time", "command": "c", "commit": "x", "device": CUDA, "seconds": 1.0, "config": CONFIG,
            "rows": table}  # fmt: skip
    path.write_text(json.dumps(data))


def _summary(folder: Path) -> tuple[dict, str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT / 'lab'}{os.pathsep}{ROOT / 'benchmarks'}"}
    command = [sys.executable, str(ROOT / "benchmarks" / "step_time_summary.py"), "--results", str(folder),
               "--profiles", str(folder / "none")]  # fmt: skip
    subprocess.run(command, check=True, env=env, capture_output=True, text=True)
    return json.loads((folder / "step_time_summary.json").read_text()), (folder / "step_time_summary.md").read_text()


def test_compiled_rows_are_put_over_the_deterministic_step_compiled_the_same_way(tmp_path: Path) -> None:
    _table(tmp_path / "step_time_lenet5_compiled_cuda.json", {"deterministic": 2.0, "deterministic, compiled": 2.5,
           "varbnn MeanField-reparam, fit(compile=True)": 3.5})  # fmt: skip
    _table(tmp_path / "step_time_lenet5_cuda_reduce_overhead.json", {"deterministic": 2.0,
           "deterministic, compiled (reduce-overhead)": 1.0, "varbnn MeanField-reparam, fit(compile='reduce-overhead')": 1.8,
           "torchbnn": 7.0})  # fmt: skip
    # a table without a compiled deterministic row: its compiled row has a ratio, no like-for-like one
    _table(tmp_path / "step_time_lenet5_rdp_compiled_cuda.json", {"deterministic": 2.0,
           "varbnn RadialDirectional(row), fit(compile=True)": 5.0})  # fmt: skip
    (tmp_path / "compile_time_lenet5.json").write_text(json.dumps({
        "name": "compile_time", "command": "c", "commit": "x", "device": "cpu: AMD EPYC, 2 threads", "seconds": 1.0,
        "config": {"model": "LeNet-5-Caffe", "batch": 100, "compile_mode": "default"},
        "rows": [{"family": "varbnn MeanField-reparam", "cold_first_s": 74.05, "warm_first_s": 12.44}]}))  # fmt: skip
    summary, page = _summary(tmp_path)
    same = summary["same_mode_ratios"]
    assert same["MeanField-reparam"] == {"LeNet-5 b100, H200 compiled": 1.4, "LeNet-5 b100, H200 CUDA graphs": 1.8}
    assert same["deterministic"] == {"LeNet-5 b100, H200 compiled": 1.0, "LeNet-5 b100, H200 CUDA graphs": 1.0}
    assert "RadialDirectional(row)" not in same and "torchbnn" not in same  # no same-mode step to divide by
    assert summary["ratios"]["MeanField-reparam"]["LeNet-5 b100, H200 CUDA graphs"] == 0.9  # the eager-based ratio
    assert summary["compile_seconds"]["MeanField-reparam"] == {
        "LeNet-5 b100, CPU AMD EPYC 2t": {"cold_first_s": 74.05, "warm_first_s": 12.44}
    }
    assert summary["compile_sources"] == ["compile_time_lenet5.json"]
    (columns, rows), (eager_columns, eager_based), (compile_columns, firsts) = _tables(page)
    # the main table: like for like (the eager columns over the eager deterministic step, which this group's first
    # file timed; the compiled ones over the deterministic step compiled the same way)
    assert columns == ["candidate", "LeNet-5 b100, H200: eager", "LeNet-5 b100, H200: compiled",
                       "LeNet-5 b100, H200: CUDA graphs"]  # fmt: skip
    assert rows["deterministic"] == ["1.00x", "1.00x", "1.00x"]
    assert rows["MeanField-reparam"] == ["", "1.40x", "1.80x"]
    assert rows["RadialDirectional(row)"] == ["", "", ""]  # no same-mode deterministic step: in the second table
    assert rows["torchbnn"] == ["3.50x", "", ""]
    # the second table: compiled and CUDA-graph steps over the eager deterministic step (issue 29's measure)
    assert eager_columns == ["candidate", "LeNet-5 b100, H200: compiled", "LeNet-5 b100, H200: CUDA graphs"]
    assert eager_based["MeanField-reparam"] == ["1.75x", "0.90x"]
    assert eager_based["RadialDirectional(row)"] == ["2.50x", ""]
    assert "torchbnn" not in eager_based  # eager only
    # the third: the first compiled step's seconds, cold / warm cache
    assert compile_columns == ["candidate", "LeNet-5 b100, CPU AMD EPYC 2t"]
    assert firsts == {"MeanField-reparam": ["74.0 / 12.4"]}
