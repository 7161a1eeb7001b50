"""The import graph has no cycle between the library and its experiments (issue 27), and the experiments are not part of
the library (issue 62): the lab, ``varbnn_lab`` (``lab/``), imports the library, never the other way round.
``tests/test_continual.py::test_the_library_does_not_import_its_experiments`` checks a few named modules at run time;
these tests check every source file of ``src/varbnn`` statically and every library module at run time, and that the
package built from ``src/`` holds no experiment code. The one exception: the ``varbnn`` command (``varbnn.cli``)
imports ``varbnn_lab.cli`` inside its ``main``, when the command runs, to forward the experiment commands."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import varbnn

PACKAGE = Path(varbnn.__file__).resolve().parent
ROOT = Path(__file__).resolve().parents[1]
# the one library module allowed to import the lab, and what it may import, inside a function only
CLI, CLI_IMPORTS = "varbnn.cli", {"varbnn_lab.cli", "varbnn_lab.cli.main"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _library_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _is_lab(name: str) -> bool:
    return name == "varbnn_lab" or name.startswith("varbnn_lab.")


def _imported_modules(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """Every module an ``import`` / ``from ... import`` in ``path`` (or in ``source``, as if it were that file) names,
    relative imports resolved, with its line; for ``from X import a`` both ``X`` and ``X.a`` (``a`` may be a
    submodule)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    text = path.read_text() if source is None else source
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            found.extend((node.lineno, f"{target}.{alias.name}") for alias in node.names)
    return found


def test_no_library_module_imports_the_experiments_statically():
    files = _library_files()
    assert len(files) > 20 and PACKAGE / "plots.py" in files and PACKAGE / "prune" / "__init__.py" in files
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
        for path in files
        for line, name in _imported_modules(path)
        if _is_lab(name) and not (_module_name(path) == CLI and name in CLI_IMPORTS)
    ]
    assert not offenders, "the library imports its experiments (an import cycle):\n" + "\n".join(offenders)


def test_the_command_line_imports_the_lab_only_when_it_runs():
    """varbnn.cli's import of the lab (to forward the experiment commands) is inside a function, not at module level."""
    path = PACKAGE / "cli.py"
    tree = ast.parse(path.read_text())
    functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
    inside = {line for f in functions for line, _ in _imported_modules(path, ast.unparse(f))}
    lab = [(line, name) for line, name in _imported_modules(path) if _is_lab(name)]
    assert lab, "varbnn.cli forwards to varbnn_lab.cli"
    top_level = [
        name for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)
        for _, name in _imported_modules(path, ast.unparse(node)) if _is_lab(name)
    ]  # fmt: skip
    assert not top_level and inside, (top_level, inside)


def test_the_static_check_sees_relative_and_absolute_imports():
    """The checker itself: it resolves the import forms a library module could use to reach the experiments."""
    top = _imported_modules(PACKAGE / "plots.py", "from varbnn_lab import runner\nimport varbnn_lab.engine\n")
    assert [name for _, name in top] == ["varbnn_lab", "varbnn_lab.runner", "varbnn_lab.engine"]
    assert all(_is_lab(name) for _, name in top) and not _is_lab("varbnn_labs") and not _is_lab("varbnn.lab")
    # in a subpackage a relative import goes up one more level; imports inside functions count
    sub = _imported_modules(PACKAGE / "prune" / "density.py", "def f():\n    from .. import plots\n")
    assert [name for _, name in sub] == ["varbnn", "varbnn.plots"]
    lazy = _imported_modules(PACKAGE / "cli.py", "def f():\n    import varbnn_lab.cli\n")
    assert [name for _, name in lazy] == ["varbnn_lab.cli"]
    init = _imported_modules(PACKAGE / "prune" / "__init__.py", "from .density import x\n")
    assert [name for _, name in init] == ["varbnn.prune.density", "varbnn.prune.density.x"]


def test_importing_every_library_module_loads_no_experiment():
    """Every module of src/varbnn, varbnn.cli included, imported where the lab is importable: none of it loads."""
    assert importlib.util.find_spec("varbnn_lab") is not None, "the lab is installed (pip install -e lab/)"
    modules = sorted({_module_name(p) for p in _library_files()} - {"varbnn"})
    assert CLI in modules
    code = (
        "import importlib, sys, varbnn\n"
        "assert not [m for m in sys.modules if m.startswith('varbnn_lab')], 'import varbnn'\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.startswith('varbnn_lab')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_the_package_built_from_src_holds_no_experiment_code():
    """What ``pip install varbnn`` installs: the packages setuptools finds under ``src/`` (pyproject.toml's
    ``[tool.setuptools.packages.find] where = ["src"]``) are varbnn and its subpackages, none of them the experiments;
    the lab's pyproject.toml builds ``varbnn_lab`` alone and depends on varbnn."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from setuptools import find_packages

    library = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert library["tool"]["setuptools"]["packages"]["find"] == {"where": ["src"]}
    packages = find_packages(where=str(ROOT / "src"))
    assert "varbnn" in packages and "varbnn.prune" in packages, packages
    assert all(p == "varbnn" or p.startswith("varbnn.") for p in packages), packages
    assert not [p for p in packages if p.split(".")[1:2] == ["experiments"]], packages
    assert not (ROOT / "src" / "varbnn" / "experiments").exists()
    lab = tomllib.loads((ROOT / "lab" / "pyproject.toml").read_text())
    assert lab["project"]["dependencies"] == ["varbnn"] and lab["project"]["version"] == library["project"]["version"]
    assert sorted(find_packages(where=str(ROOT / "lab"))) == ["varbnn_lab", "varbnn_lab.pages"]
