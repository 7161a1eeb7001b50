"""benchmarks/step_time_summary.py: the side-by-side table is built from the step-time result files it is given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _table(path: Path, device: str, rows: dict[str, float], model: str = "LeNet-5-Caffe") -> None:
    config = {"model": model, "batch": 100, "optimizer": "Adam, fused where supported (varbnn.train.default_optimizer)"}
    table = [{"model": k, "median_ms": v, "ratio": v, "images_per_s": 1.0, "steps": 1} for k, v in rows.items()]
    data = {"name": "step_time", "command": "c", "commit": "x", "device": device, "seconds": 1.0, "config": config,
            "rows": table}  # fmt: skip
    path.write_text(json.dumps(data))


def _tables(page: str) -> list[tuple[list[str], dict[str, list[str]]]]:
    """Each Markdown table of a page, in order: (header cells, {first cell: the other cells})."""
    out: list[tuple[list[str], dict[str, list[str]]]] = []
    lines = page.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("| ") and (i == 0 or not lines[i - 1].startswith("|")):
            header = [c.strip() for c in line.strip("|").split("|")]
            body: dict[str, list[str]] = {}
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                cells = [c.strip() for c in row.strip("|").split("|")]
                body[cells[0]] = cells[1:]
            out.append((header, body))
    return out


def test_summary_puts_eager_and_compiled_rows_of_each_device_side_by_side(tmp_path):
    results, profiles = tmp_path / "step-time", tmp_path / "profiles"
    results.mkdir()
    profiles.mkdir()
    cuda = "cuda: NVIDIA H200; host cpu: x, 2 threads"
    _table(results / "step_time_lenet5_cuda.json", cuda, {"deterministic": 1.0, "varbnn MeanField-reparam": 3.57,
                                                            "torchbnn": 3.3})  # fmt: skip
    _table(results / "step_time_lenet5_compiled_cuda.json", cuda, {"deterministic": 1.0, "deterministic, compiled": 1.21,
           "varbnn MeanField-reparam, fit(compile=True)": 1.78, "varbnn MeanField-reparam, S=2 draws per step": 7.0})  # fmt: skip
    _table(results / "step_time_lenet5.json", "cpu: AMD EPYC 7B13, 2 threads", {"deterministic": 1.0,
           "varbnn MeanField-reparam": 1.27, "floor: deterministic + one N(0, 1) draw per weight": 0.99})  # fmt: skip
    # a table taken with another allocator setting is not one of the group's
    _table(results / "step_time_lenet5_keep_heap.json", "cpu: AMD EPYC 7B13, 2 threads", {"deterministic": 1.0,
           "varbnn MeanField-reparam": 0.5, "varbnn KTied(rank=2)-reparam": 0.6})  # fmt: skip
    (profiles / "profile_mlp_cuda_varbnn_MeanField_local.txt").write_text(
        "# varbnn MeanField-local, mlp, cuda, 5 steps\nkernel launches per step: 277\n"
        "cudaDeviceSynchronize per step: 0.2\naten ops per step: 528\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT / 'lab'}{os.pathsep}{ROOT / 'benchmarks'}"}
    command = [sys.executable, str(ROOT / "benchmarks" / "step_time_summary.py"), "--results", str(results),
               "--profiles", str(profiles)]  # fmt: skip
    subprocess.run(command, check=True, env=env, capture_output=True, text=True)
    page = (results / "step_time_summary.md").read_text()
    (columns, rows), (eager_columns, eager_based), _ = _tables(page)[:3]
    # groups in the order of the sorted file names (step_time_lenet5.json first); no compiled column for the CPU
    assert columns == ["candidate", "LeNet-5 b100, CPU AMD EPYC 2t: eager", "LeNet-5 b100, H200: eager",
                       "LeNet-5 b100, H200: compiled"]  # fmt: skip
    # like for like: the compiled MeanField step (1.78) over the compiled deterministic step (1.21) of its own table
    assert rows["deterministic"] == ["1.00x", "1.00x", "1.00x"]
    assert rows["MeanField-reparam"] == ["1.27x", "3.57x", "1.47x"]
    assert rows["torchbnn"] == ["", "3.30x", ""]
    # the second table: compiled steps over the eager deterministic step (issue 29's measure), compiled columns only
    assert eager_columns == ["candidate", "LeNet-5 b100, H200: compiled"]
    assert eager_based == {"deterministic": ["1.21x"], "MeanField-reparam": ["1.78x"]}
    assert not any("S=2" in name for name in rows)  # several-draws rows are left out
    assert not any("KTied" in name for name in rows)  # the _keep_heap table is not read
    order = list(rows)
    assert order.index("MeanField-reparam") < order.index("floor: deterministic + one N(0, 1) draw per weight")
    assert order.index("floor: deterministic + one N(0, 1) draw per weight") < order.index("torchbnn")
    profile = _tables(page)[-1][1]
    assert profile["varbnn MeanField-local"][:4] == ["mlp", "cuda", "528", "277"]  # the profile table
    assert profile["varbnn MeanField-local"][4] == "0.2"
    summary = json.loads((results / "step_time_summary.json").read_text())
    assert summary["ratios"]["MeanField-reparam"]["LeNet-5 b100, H200 compiled"] == 1.78


def test_summary_gives_cuda_graph_rows_a_column_of_their_own(tmp_path):
    cuda = "cuda: NVIDIA H200; host cpu: x, 2 threads"
    _table(tmp_path / "step_time_lenet5_cuda.json", cuda, {"deterministic": 1.0, "deterministic, compiled": 1.21,
           "varbnn MeanField-reparam, fit(compile=True)": 1.78})  # fmt: skip
    _table(tmp_path / "step_time_lenet5_cuda_reduce_overhead.json", cuda, {"deterministic": 1.0,
           "deterministic, compiled (reduce-overhead)": 0.54,
           "varbnn MeanField-reparam, fit(compile='reduce-overhead')": 0.9,
           "varbnn Radial, fit(compile='default')": 1.5})  # fmt: skip
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT / 'lab'}{os.pathsep}{ROOT / 'benchmarks'}"}
    command = [sys.executable, str(ROOT / "benchmarks" / "step_time_summary.py"), "--results", str(tmp_path),
               "--profiles", str(tmp_path / "none")]  # fmt: skip
    subprocess.run(command, check=True, env=env, capture_output=True, text=True)
    ratios = json.loads((tmp_path / "step_time_summary.json").read_text())["ratios"]
    assert ratios["MeanField-reparam"] == {"LeNet-5 b100, H200 compiled": 1.78, "LeNet-5 b100, H200 CUDA graphs": 0.9}
    assert ratios["deterministic"]["LeNet-5 b100, H200 CUDA graphs"] == 0.54
    assert ratios["Radial"] == {"LeNet-5 b100, H200 compiled": 1.5}  # another named mode: compiled, not CUDA graphs
    header = next(line for line in (tmp_path / "step_time_summary.md").read_text().splitlines() if "| candidate" in line)
    assert header.rstrip(" |").endswith("LeNet-5 b100, H200: CUDA graphs")


def test_summary_refuses_a_folder_without_tables(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT / 'lab'}{os.pathsep}{ROOT / 'benchmarks'}"}
    command = [sys.executable, str(ROOT / "benchmarks" / "step_time_summary.py"), "--results", str(tmp_path)]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    assert result.returncode != 0 and "--results" in result.stderr and "step_time" in result.stderr
