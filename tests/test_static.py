"""The package's static checks, run with the tests so that CI keeps them: mypy over ``src/varbnn`` (the typed public
API ships ``py.typed``) and the lab, ``lab/varbnn_lab``, and ruff's lint rules (``pyproject.toml``) over the sources,
the lab, tests and benchmarks."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_type_checks(tmp_path):
    api = pytest.importorskip("mypy.api", reason="mypy is in the test extra: pip install -e '.[test]'")
    out, err, status = api.run([str(ROOT / "src" / "varbnn"), str(ROOT / "lab" / "varbnn_lab"),
                                "--cache-dir", str(tmp_path / "mypy-cache"),
                                "--config-file", str(ROOT / "pyproject.toml")])  # fmt: skip
    assert status == 0, out + err
    assert "Success" in out


def test_the_sources_pass_the_lint_rules():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is in the docs extra: pip install -e '.[docs]'")
    done = subprocess.run([ruff, "check", "src", "lab", "tests", "benchmarks"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
