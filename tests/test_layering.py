"""The library is layered (issue 62): each module imports only from its own layer or the layers below it, the import
graph has no cycle (at most one, through an import made only for type checking), and no function body imports a
varbnn module except the few listed in :data:`LAZY_IMPORTS`, each with its reason.

The graph is read statically (``ast``) from ``src/varbnn``, without the experiments and the command line (they sit on
top of the library; ``tests/test_import_graph.py`` checks that the library never imports them). An import of
``a.b.c`` also imports the packages ``a.b`` (their ``__init__``) that are not already being imported around the
importing module: those edges are in the graph too, as Python runs them.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import NamedTuple

import varbnn

PACKAGE = Path(varbnn.__file__).resolve().parent
ROOT_NAME = "varbnn"
APPLICATIONS = ("varbnn.cli",)
"""On top of the library, outside this check (the command line forwards to the lab, varbnn_lab, outside the wheel)."""

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundations", ("varbnn._checks", "varbnn._transforms", "varbnn.special", "varbnn.philox", "varbnn.ops",
                     "varbnn._fast", "varbnn._fast.allocator", "varbnn.data")),
    ("distributions", ("varbnn.distributions",)),
    ("divergences and priors", ("varbnn.divergence", "varbnn.priors")),
    ("families", ("varbnn.families", "varbnn._fast.softplus")),
    ("layers", ("varbnn.nn",)),
    ("objectives and prediction", ("varbnn.likelihoods", "varbnn.objectives", "varbnn.moments", "varbnn.predict",
                                   "varbnn.metrics", "varbnn.convert")),
    ("methods and training", ("varbnn.calibration", "varbnn.baselines", "varbnn.laplace", "varbnn.training",
                              "varbnn.train", "varbnn.analysis", "varbnn.prune", "varbnn.continual", "varbnn.models",
                              "varbnn.distributed", "varbnn.plots", "varbnn.optim", "varbnn.adapters")),
    ("package", (ROOT_NAME,)),
    ("applications", APPLICATIONS),
]  # fmt: skip
"""Bottom to top. A name covers the module and everything under it; the longest name that covers a module decides
(``varbnn._fast.softplus`` sits above ``varbnn._fast``); ``varbnn`` itself covers only the package's ``__init__``."""

LAZY_IMPORTS: dict[tuple[str, str], str] = {
    ("varbnn.divergence", "varbnn.nn.model"): (
        "documented lazy loading: kl(model) forwards to the whole-model sum, which walks the layers built on divergence"
    ),
    ("varbnn.priors", "varbnn.nn.model"): (
        "documented lazy loading: priors.update_adaptive_priors forwards to nn.model, which walks the layers built on "
        "the priors"
    ),
    ("varbnn.prune.scores", "varbnn.plots"): "optional dependency: score_histograms draws with matplotlib (varbnn.plots)",
}
"""The function-body imports of varbnn modules that are allowed, ``(importing module, imported module)``: reason."""

TYPE_ONLY_CYCLE: tuple[str, str] | None = ("varbnn.priors", "varbnn.families.base")
"""The one import (under ``if TYPE_CHECKING:``) allowed to close a cycle: the priors annotate ``update_(posteriors)``
with the families' type, and the families annotate their priors. Nothing runs it."""


class Import(NamedTuple):
    line: int
    target: str  # the module imported (resolved to a module of the package where the name is a module)
    in_function: bool
    type_only: bool


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.lru_cache(maxsize=1)
def package_sources() -> dict[str, tuple[bool, str]]:
    """Every module of the package (the applications included): name -> (is a package ``__init__``, source)."""
    return {_module_name(p): (p.name == "__init__.py", p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}


def _is_under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _resolve(name: str, modules: frozenset[str]) -> str:
    """The longest prefix of ``name`` that is a module (``varbnn.priors.Normal`` -> ``varbnn.priors``)."""
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


@functools.lru_cache(maxsize=512)
def imports_of(module: str, is_package: bool, source: str, modules: frozenset[str]) -> list[Import]:
    """The imports of varbnn modules in ``source`` (the module ``module``), relative ones resolved; ``from X import a``
    names ``X.a`` when ``a`` is a module, else ``X``."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool, type_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            child_function = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            child_type_only = type_only or (
                isinstance(node, ast.If) and _is_type_checking(node.test) and child in node.body
            )
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if _is_under(alias.name, ROOT_NAME):
                        found.append(Import(child.lineno, _resolve(alias.name, modules), child_function, child_type_only))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                if _is_under(target, ROOT_NAME):
                    for alias in child.names:
                        found.append(
                            Import(child.lineno, _resolve(f"{target}.{alias.name}", modules), child_function, child_type_only)
                        )
            visit(child, child_function, child_type_only)

    visit(ast.parse(source), False, False)
    return [imp for imp in dict.fromkeys(found) if imp.target != module]


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module``'s layer; ``-1`` for a module no layer names."""
    best, best_len = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            covers = module == prefix if prefix == ROOT_NAME else _is_under(module, prefix)
            if covers and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    return best


def _implied(source_module: str, target: str) -> list[str]:
    """``target`` and the packages above it that importing it runs, except the root package and the packages
    ``source_module`` itself sits in (already being imported)."""
    parts = target.split(".")
    chain = [".".join(parts[:i]) for i in range(2, len(parts) + 1)]
    return [name for name in chain if not _is_under(source_module, name) or name == target]


class Report(NamedTuple):
    upward: list[str]
    cycles: list[list[str]]
    function_imports: list[str]
    unplaced: list[str]
    stale_lazy: list[tuple[str, str]]


def check(sources: dict[str, tuple[bool, str]]) -> Report:
    """The layering rules over ``sources`` (as :func:`package_sources`): upward imports, cycles, function-body imports
    that :data:`LAZY_IMPORTS` does not list, library modules without a layer, and listed lazy imports that no longer
    exist."""
    modules = frozenset(sources)
    library = sorted(m for m in modules if not any(_is_under(m, a) for a in APPLICATIONS))
    upward, function_imports, unplaced = [], [], []
    used_lazy: set[tuple[str, str]] = set()
    graph: dict[str, set[str]] = {m: set() for m in library}
    for module in library:
        if layer_of(module) < 0:
            unplaced.append(module)
        is_package, source = sources[module]
        for imp in imports_of(module, is_package, source, modules):
            lazy = imp.in_function and (module, imp.target) in LAZY_IMPORTS
            where = f"{module}:{imp.line} imports {imp.target}"
            if imp.in_function:
                if lazy:
                    used_lazy.add((module, imp.target))
                else:
                    function_imports.append(where)
            if lazy:
                continue  # runs on first call, after every module is loaded: neither an upward import nor a cycle
            if not imp.type_only and layer_of(imp.target) > layer_of(module):
                upward.append(
                    f"{where} ({LAYERS[layer_of(module)][0]} -> {LAYERS[layer_of(imp.target)][0]})"
                )
            if imp.type_only and (module, imp.target) == TYPE_ONLY_CYCLE:
                continue
            graph[module].update(t for t in _implied(module, imp.target) if t in graph)
    stale = [pair for pair in LAZY_IMPORTS if pair[0] in graph and pair not in used_lazy]
    return Report(upward, _cycles(graph), function_imports, unplaced, stale)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def connect(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return out


# ----------------------------------------------------------------------------------------------- the library


def test_every_library_module_has_a_layer():
    report = check(package_sources())
    assert not report.unplaced, f"modules without a layer (add them to LAYERS): {report.unplaced}"


def test_each_module_imports_only_from_its_own_or_lower_layers():
    report = check(package_sources())
    assert not report.upward, "imports pointing up the layers:\n" + "\n".join(report.upward)


def test_the_import_graph_has_no_cycle_but_the_one_type_only_import():
    report = check(package_sources())
    assert not report.cycles, f"import cycles: {report.cycles}"
    # the one allowed type-only cycle is an import under TYPE_CHECKING, and it does close a cycle
    assert TYPE_ONLY_CYCLE is not None
    sources = package_sources()
    module, target = TYPE_ONLY_CYCLE
    found = imports_of(module, sources[module][0], sources[module][1], frozenset(sources))
    assert any(imp.target == target and imp.type_only and not imp.in_function for imp in found)


def test_no_function_body_imports_a_varbnn_module_unless_listed_with_its_reason():
    report = check(package_sources())
    assert not report.function_imports, (
        "imports inside function bodies (hoist them, or list them in LAZY_IMPORTS with the reason):\n"
        + "\n".join(report.function_imports)
    )
    assert not report.stale_lazy, f"LAZY_IMPORTS lists imports that are gone (remove them): {report.stale_lazy}"
    assert all(reason.startswith(("optional dependency", "documented lazy loading")) for reason in LAZY_IMPORTS.values())


def test_the_documented_lazy_forwards_are_the_moved_functions():
    """``varbnn.divergence.kl(model)`` and ``varbnn.priors.update_adaptive_priors`` (public names kept where users
    import them) run :mod:`varbnn.nn.model`'s code."""
    import torch

    from varbnn.nn import BayesLinear
    from varbnn.nn import model as nn_model
    from varbnn.priors import Normal

    torch.manual_seed(0)
    layer = BayesLinear(3, 2, prior=Normal(0.0, 1.0, adaptive=True))
    assert torch.equal(varbnn.divergence.kl(layer), nn_model.model_kl(layer))
    assert varbnn.kl is varbnn.divergence.kl
    assert varbnn.priors.update_adaptive_priors(layer) == 1 == nn_model.update_adaptive_priors(layer)
    assert varbnn.update_adaptive_priors is varbnn.priors.update_adaptive_priors


# ----------------------------------------------------------------------------------------------- the checker itself


def _with(module: str, extra: str, *, prepend: bool = True) -> dict[str, tuple[bool, str]]:
    sources = dict(package_sources())
    is_package, source = sources[module]
    sources[module] = (is_package, extra + source if prepend else source + extra)
    return sources


def test_the_checker_finds_an_upward_import_and_the_cycle_it_makes():
    report = check(_with("varbnn.divergence", "from varbnn.nn.base import BayesianModule\n"))
    assert report.upward == ["varbnn.divergence:1 imports varbnn.nn.base (divergences and priors -> layers)"]
    assert report.cycles and "varbnn.divergence" in report.cycles[0] and "varbnn.nn.base" in report.cycles[0]


def test_the_checker_resolves_relative_imports_and_implied_packages():
    # a relative import one package up from varbnn/prune/density.py reaches varbnn.training: no upward import, but
    # importing varbnn.families.base runs varbnn.families, so a module of the distributions that imports it is upward
    sources = package_sources()
    names = frozenset(sources)
    found = imports_of("varbnn.prune.density", False, "from ..training import loop\nfrom . import scores\n", names)
    assert [imp.target for imp in found] == ["varbnn.training.loop", "varbnn.prune.scores"]
    found = imports_of("varbnn.nn", True, "from .base import BayesianModule\n", names)
    assert [imp.target for imp in found] == ["varbnn.nn.base"]
    assert _implied("varbnn.distributions.vmf", "varbnn.families.base") == ["varbnn.families", "varbnn.families.base"]
    assert _implied("varbnn.families.delta", "varbnn.families.base") == ["varbnn.families.base"]
    report = check(_with("varbnn.distributions.radial", "from .. import families\n"))
    assert [u.split(" (")[0] for u in report.upward] == ["varbnn.distributions.radial:1 imports varbnn.families"]


def test_the_checker_finds_a_function_body_import_and_a_stale_allowance():
    report = check(_with("varbnn.priors", "\n\ndef _late():\n    from varbnn.families import delta\n", prepend=False))
    assert len(report.function_imports) == 1 and "varbnn.priors:" in report.function_imports[0]
    assert report.function_imports[0].endswith("imports varbnn.families.delta")
    # not listed in LAZY_IMPORTS, it is also an upward import (priors sit below the families)
    assert [u.split(" (")[0] for u in report.upward] == [report.function_imports[0]]
    sources = dict(package_sources())
    is_package, source = sources["varbnn.prune.scores"]
    sources["varbnn.prune.scores"] = (is_package, source.replace("from varbnn.plots import", "from varbnn.metrics import"))
    assert ("varbnn.prune.scores", "varbnn.plots") in check(sources).stale_lazy


def test_the_checker_allows_only_the_listed_type_only_cycle():
    extra = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from varbnn.nn.base import BayesianModule\n"
    report = check(_with("varbnn.divergence", extra))
    assert not report.upward  # a type-only import may point up ...
    assert any("varbnn.divergence" in cycle for cycle in report.cycles)  # ... but not close a second cycle
