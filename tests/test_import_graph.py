"""The import graph has no cycle between the library and its experiments (issue 27): ``varbnn.experiments`` imports the
library, never the other way round. ``tests/test_continual.py::test_the_library_does_not_import_its_experiments``
checks a few named modules at run time; these tests check every source file statically and every library module at run
time."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import varbnn

PACKAGE = Path(varbnn.__file__).resolve().parent
# the only modules allowed to import the experiments: the experiments themselves and the command line
ALLOWED = ("varbnn.experiments", "varbnn.cli")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _library_files() -> list[Path]:
    files = sorted(PACKAGE.rglob("*.py"))
    return [p for p in files if not _module_name(p).startswith(ALLOWED)]


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
        if name == "varbnn.experiments" or name.startswith("varbnn.experiments.")
    ]
    assert not offenders, "the library imports its experiments (an import cycle):\n" + "\n".join(offenders)


def test_the_static_check_sees_relative_and_absolute_imports():
    """The checker itself: it resolves the import forms a library module could use to reach the experiments."""
    top = _imported_modules(PACKAGE / "plots.py", "from .experiments import runner\nimport varbnn.experiments.engine\n")
    assert [name for _, name in top] == ["varbnn.experiments", "varbnn.experiments.runner", "varbnn.experiments.engine"]
    # in a subpackage a relative import goes up one more level
    sub = _imported_modules(PACKAGE / "prune" / "density.py", "def f():\n    from .. import experiments\n")
    assert [name for _, name in sub] == ["varbnn", "varbnn.experiments"]
    init = _imported_modules(PACKAGE / "prune" / "__init__.py", "from .density import x\n")
    assert [name for _, name in init] == ["varbnn.prune.density", "varbnn.prune.density.x"]


def test_importing_every_library_module_loads_no_experiment():
    modules = sorted({_module_name(p) for p in _library_files()} - {"varbnn"})
    code = (
        "import importlib, sys, varbnn\n"
        "assert not [m for m in sys.modules if m.startswith('varbnn.experiments')], 'import varbnn'\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.startswith('varbnn.experiments')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
