"""The docstrings are the API reference (docs/gen_pages.py renders them), so they are checked like code.

1. Every name a docstring points to exists. Every docstring of every module of the package and of the lab (modules,
   classes, functions, methods, and attribute docstrings: every string statement the source holds) is read; each
   Sphinx role target (``:func:`x```, ``:class:`~a.B```, ``:meth:``, ``:mod:``, ``:attr:``, ``:data:``, ``:exc:``,
   ``:obj:``, ``:const:``) and each double-backticked dotted name starting with ``varbnn.`` (or ``varbnn_lab.``) must
   resolve to an object by importlib + getattr. A role target is tried as written (absolute), then relative to the enclosing
   classes (innermost first), then to the module, then to the module's package: what Sphinx would find.
   A dataclass field or an annotated instance attribute counts as an attribute of its class.
2. Every name in every public module's ``__all__`` exists and has a docstring of its own. Classes, functions and
   modules need a non-empty ``__doc__`` (a class's own, not one inherited from ``object``/``nn.Module``).
   Constants (anything else: numbers, strings, tuples, dicts, type aliases, singletons) are exempt from ``__doc__``
   (most types cannot carry one) but must be documented in the source: an attribute docstring (a string statement
   right after the assignment, which the API reference renders) in the module that defines them, or a mention of
   the name in the docstring of the module whose ``__all__`` lists it.
3. ``import varbnn`` alone exposes every entry point the README, the user guide and the tutorials write as
   ``varbnn.<name>`` (the list :data:`ENTRY_POINTS`, plus every such name found in those pages), without
   importing matplotlib.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import varbnn
import varbnn_lab

ROOT = Path(__file__).resolve().parents[1]

# the library's modules and the lab's (varbnn_lab, lab/: the experiments, outside the installed package)
MODULES = sorted(
    ["varbnn", "varbnn_lab"]
    + [m.name for m in pkgutil.walk_packages(varbnn.__path__, "varbnn.")]
    + [m.name for m in pkgutil.walk_packages(varbnn_lab.__path__, "varbnn_lab.")]
)

# The public modules: each is a page of the API reference (docs/gen_pages.py), plus the prune package's submodules.
PUBLIC = [
    "varbnn", "varbnn.convert", "varbnn.families", "varbnn.nn", "varbnn.priors", "varbnn.divergence",
    "varbnn.objectives", "varbnn.likelihoods", "varbnn.training", "varbnn.optim", "varbnn.predict", "varbnn.metrics",
    "varbnn.calibration", "varbnn.baselines", "varbnn.laplace", "varbnn.adapters", "varbnn.continual", "varbnn.prune",
    "varbnn.prune.density", "varbnn.prune.scores", "varbnn.prune.thresholds", "varbnn.prune.export",
    "varbnn.prune.retrain", "varbnn.distributions", "varbnn.special", "varbnn.data", "varbnn.models", "varbnn.plots",
    "varbnn.analysis", "varbnn.distributed", "varbnn.ops",
    "varbnn_lab", "varbnn_lab.figures",
]

# Names in the lab (varbnn_lab: its cli.py and the experiments) that are known to fail and belong to whoever owns those
# files: (module, name) for the __all__ check, (module, class qualname) for the member check, (module, target) for the
# reference check. They are strict xfails: once fixed, the test passes unexpectedly and fails, so that the entry is
# removed. Empty when all is well.
KNOWN_BROKEN: dict[tuple[str, str], str] = {}


def _params(cases: list[Any], key: Any, ids: list[str]) -> list[Any]:
    """``cases`` as ``pytest.param``s, the KNOWN_BROKEN ones marked as strict xfails."""
    out = []
    for case, case_id in zip(cases, ids):
        reason = KNOWN_BROKEN.get(key(case))
        marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
        out.append(pytest.param(*case, marks=marks, id=case_id))
    return out


_ROLE = re.compile(r":(?:py:)?(func|class|meth|mod|attr|data|exc|obj|const):`([^`]+)`")
_VARBNN_CODE = re.compile(r"``(varbnn(?:_lab)?(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


# ----------------------------------------------------------------------------------------------- resolution


def _import_longest(parts: list[str]) -> tuple[Any, int] | None:
    """The object named by the longest importable module prefix of ``parts``, and how many parts it used."""
    for i in range(len(parts), 0, -1):
        try:
            return importlib.import_module(".".join(parts[:i])), i
        except ImportError:
            continue
    return None


def _has_attribute(obj: Any, name: str) -> bool:
    if hasattr(obj, name):
        return True
    if inspect.isclass(obj):
        if dataclasses.is_dataclass(obj) and name in {f.name for f in dataclasses.fields(obj)}:
            return True
        for klass in obj.__mro__:
            if name in getattr(klass, "__annotations__", {}) or name in getattr(klass, "__slots__", ()):
                return True
            if name in _instance_attributes(klass):
                return True
    return False


def _instance_attributes(klass: type) -> set[str]:
    """``self.<name> = ...`` assignments in a class's methods (attributes set in ``__init__`` and friends)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
    except (OSError, TypeError, SyntaxError):
        return set()
    names = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                names.add(target.attr)
    return names


def _getattr_chain(obj: Any, names: list[str]) -> bool:
    for i, name in enumerate(names):
        if not _has_attribute(obj, name):
            return False
        if not hasattr(obj, name):  # a field or instance attribute: nothing further to follow
            return i == len(names) - 1
        obj = getattr(obj, name)
    return True


def resolves(dotted: str) -> bool:
    """``dotted`` names an existing object: import its longest module prefix, then getattr the rest."""
    parts = dotted.split(".")
    if len(parts) == 1 and hasattr(builtins, parts[0]):
        return True
    found = _import_longest(parts)
    if found is None:
        return False
    obj, used = found
    return _getattr_chain(obj, parts[used:])


def resolves_from(target: str, module: str, classes: list[str], role: str = "func") -> bool:
    """Sphinx's lookup: as written, then relative to the enclosing classes, the module and its package. A bare name
    (no dot) counts as absolute only for ``:mod:`` or a builtin, so that ``:func:`copy``` cannot pass as the module."""
    target = target.strip().lstrip("~").removesuffix("()").lstrip(".")
    if not target:
        return False
    candidates = [target] if "." in target or role == "mod" or hasattr(builtins, target) else []
    for depth in range(len(classes), 0, -1):
        candidates.append(".".join([module, *classes[:depth], target]))
    candidates.append(f"{module}.{target}")
    if "." in module:
        candidates.append(f"{module.rsplit('.', 1)[0]}.{target}")
    return any(resolves(candidate) for candidate in candidates)


# ----------------------------------------------------------------------------------------------- collection


def _docstrings(module: str) -> list[tuple[str, list[str], int, str]]:
    """(qualname of the owner, enclosing classes, line, text) for every string statement in ``module``'s source."""
    spec = importlib.util.find_spec(module)
    path = Path(spec.origin)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[str, list[str], int, str]] = []

    def visit(node: ast.AST, scope: list[str], classes: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Expr) and isinstance(child.value, ast.Constant) and isinstance(
                    child.value.value, str):
                found.append((".".join([module, *scope]), list(classes), child.lineno, child.value.value))
            if isinstance(child, ast.ClassDef):
                visit(child, [*scope, child.name], [*classes, child.name])
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, [*scope, child.name], classes)
            elif not isinstance(child, ast.Expr):
                visit(child, scope, classes)

    visit(tree, [], [])
    return found


def _references() -> list[tuple[str, str, int, str, list[str], str]]:
    refs = []
    for module in MODULES:
        for owner, classes, line, text in _docstrings(module):
            for role, target in _ROLE.findall(text):
                refs.append((module, owner, line, target, classes, role))
            for dotted in _VARBNN_CODE.findall(text):
                refs.append((module, owner, line, dotted, [], "obj"))
    return refs


REFERENCES = _references()


def test_the_walk_sees_the_whole_package() -> None:
    assert {"varbnn.cli", "varbnn_lab.runner", "varbnn.prune.thresholds", "varbnn.train"} <= set(MODULES)
    assert len(REFERENCES) > 100


def test_the_resolver_catches_missing_names() -> None:
    assert resolves_from("fit", "varbnn.train", [])
    assert resolves_from("~varbnn.likelihoods.Gaussian", "varbnn.train", [], "class")
    assert resolves_from("take_score", "varbnn.families.rdp", ["RadialDirectional"], "meth")
    assert resolves_from("varbnn.objectives.ELBOTerms.negative_elbo", "varbnn", [], "attr")
    assert resolves_from("varbnn.objectives.ELBOTerms.loss", "varbnn", [], "attr")  # a dataclass field
    assert not resolves_from("fitt", "varbnn.train", [])
    assert not resolves_from("varbnn.fitt", "varbnn", [])
    assert not resolves_from("copy", "varbnn.metrics", [])  # a module's name is not a function of this one
    assert not resolves_from("varbnn.train.fit.nothing", "varbnn", [])


@pytest.mark.parametrize("module", MODULES)
def test_docstrings_name_only_what_exists(module: str) -> None:
    broken = [
        f"{owner} (line {line}): {target}"
        for mod, owner, line, target, classes, role in REFERENCES
        if mod == module and (mod, target) not in KNOWN_BROKEN and not resolves_from(target, mod, classes, role)
    ]
    assert not broken, f"{module}: docstrings name objects that do not exist:\n  " + "\n  ".join(broken)


# ----------------------------------------------------------------------------------------------- public names


def _attribute_docstring(module: Any, name: str) -> bool:
    """``name = ...`` followed by a string statement somewhere in the package module that defines ``name``."""
    for candidate in [module.__name__, *MODULES]:
        try:
            source = Path(importlib.util.find_spec(candidate).origin).read_text(encoding="utf-8")
        except (AttributeError, TypeError, OSError):
            continue
        body = ast.parse(source).body
        for statement, following in zip(body, body[1:]):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target] if isinstance(
                statement, ast.AnnAssign) else []
            if any(isinstance(t, ast.Name) and t.id == name for t in targets) and isinstance(
                    following, ast.Expr) and isinstance(following.value, ast.Constant) and isinstance(
                    following.value.value, str) and following.value.value.strip():
                return True
    return False


def _own_doc(obj: Any) -> str:
    if inspect.isclass(obj):
        return obj.__dict__.get("__doc__") or ""
    return getattr(obj, "__doc__", None) or ""


PUBLIC_NAMES = [(module, name) for module in PUBLIC for name in getattr(importlib.import_module(module), "__all__", [])]


@pytest.mark.parametrize("module", PUBLIC)
def test_public_modules_declare_all_and_a_docstring(module: str) -> None:
    mod = importlib.import_module(module)
    assert isinstance(getattr(mod, "__all__", None), list) and mod.__all__, f"{module} has no __all__"
    assert (mod.__doc__ or "").strip(), f"{module} has no module docstring"
    assert len(set(mod.__all__)) == len(mod.__all__), f"{module}.__all__ repeats a name"


@pytest.mark.parametrize(
    "module, name", _params(PUBLIC_NAMES, lambda case: case, [f"{m}.{n}" for m, n in PUBLIC_NAMES])
)
def test_public_names_exist_and_are_documented(module: str, name: str) -> None:
    mod = importlib.import_module(module)
    assert hasattr(mod, name), f"{module}.__all__ lists {name!r}, which does not exist"
    obj = getattr(mod, name)
    if inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj):
        assert _own_doc(obj).strip(), f"{module}.{name} has no docstring"
    elif name != "__version__":
        documented = _attribute_docstring(mod, name) or re.search(rf"\b{re.escape(name)}\b", mod.__doc__ or "")
        assert documented, f"constant {module}.{name} has neither an attribute docstring nor a mention in {module}'s docstring"


def _public_classes() -> list[tuple[str, type]]:
    seen: dict[type, str] = {}
    for module, name in PUBLIC_NAMES:
        obj = getattr(importlib.import_module(module), name, None)
        if inspect.isclass(obj) and obj.__module__.startswith("varbnn") and obj not in seen:
            seen[obj] = f"{obj.__module__}.{obj.__qualname__}"
    return sorted(((path, cls) for cls, path in seen.items()), key=lambda item: item[0])


PUBLIC_CLASSES = _public_classes()


@pytest.mark.parametrize(
    "path, cls",
    _params(PUBLIC_CLASSES, lambda case: (case[1].__module__, case[1].__qualname__), [p for p, _ in PUBLIC_CLASSES]),
)
def test_public_methods_are_documented(path: str, cls: type) -> None:
    """A public method or property a varbnn class defines has a docstring, or overrides one that has: the API
    reference shows only documented members, so an undocumented one is invisible. Overrides of torch's own methods
    (``forward``, ``extra_repr``, ``log_prob``, ...) are documented by torch and exempt."""
    missing = []
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        function = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
        if not (inspect.isfunction(function) or isinstance(member, property)):
            continue
        if (function.__doc__ or "").strip():
            continue
        bases = [base for base in cls.__mro__[1:] if name in vars(base)]
        if any(not base.__module__.startswith("varbnn") for base in bases):
            continue  # overrides torch's (documented there)
        documented = [base for base in bases if (getattr(vars(base)[name], "__doc__", None) or "").strip()
                      or (isinstance(vars(base)[name], property) and (vars(base)[name].fget.__doc__ or "").strip())]
        if not documented:
            missing.append(name)
    assert not missing, f"{path}: public members without a docstring: {missing}"


# ----------------------------------------------------------------------------------------------- entry points

# What the README, the user guide and the tutorials tell a user to write after ``import varbnn``.
ENTRY_POINTS = [
    "varbnn.bayesianize", "varbnn.to_deterministic", "varbnn.fit", "varbnn.evaluate", "varbnn.predict",
    "varbnn.classification_summary", "varbnn.regression_summary", "varbnn.kl", "varbnn.elbo_loss",
    "varbnn.linear_kl_annealing", "varbnn.sample_mode", "varbnn.set_sample_mode", "varbnn.MeanField",
    "varbnn.Radial", "varbnn.KTied", "varbnn.RadialDirectional", "varbnn.Delta", "varbnn.VariationalFamily",
    "varbnn.BayesLinear", "varbnn.BayesConv2d", "varbnn.BayesLSTM",
    "varbnn.training.fit", "varbnn.training.evaluate", "varbnn.training.save_checkpoint", "varbnn.training.load_checkpoint",
    "varbnn.likelihoods.Categorical", "varbnn.likelihoods.Gaussian", "varbnn.metrics.expected_calibration_error",
    "varbnn.priors.Normal", "varbnn.priors.ScaleMixture", "varbnn.divergence.kl",
    "varbnn.objectives.mdl_report", "varbnn.objectives.score_correction",
    "varbnn.calibration.TemperatureScaled", "varbnn.baselines.MCDropout", "varbnn.baselines.DeepEnsemble",
    "varbnn.laplace.LastLayerLaplace", "varbnn.continual.set_posterior_as_prior", "varbnn.prune.unit_scores",
    "varbnn.prune.prune_by_density_ratio", "varbnn.prune.export", "varbnn.distributions.VonMisesFisher",
    "varbnn.distributions.Radial", "varbnn.distributions.vmf.householder_sample", "varbnn.special.bessel_ratio",
    "varbnn.special.log_bessel_iv", "varbnn.data.load_digits", "varbnn.models.MODELS", "varbnn.analysis.std_matrix",
    "varbnn.analysis.GradientSNR", "varbnn.distributed", "varbnn.ops", "varbnn.convert.bayesianize",
    "varbnn.families.MeanField", "varbnn.nn.BayesLinear", "varbnn.plots",
]

# ``varbnn.cli`` is a command (``python -m varbnn.cli``), not an attribute; the lab (``varbnn_lab``) is not varbnn's.
NOT_ATTRIBUTES = {"varbnn.cli"}
DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _documented_entry_points() -> list[str]:
    found = set(ENTRY_POINTS)
    for page in DOC_PAGES:
        for dotted in re.findall(r"\bvarbnn(?:\.[A-Za-z_][A-Za-z0-9_]*)+", page.read_text(encoding="utf-8")):
            if not any(dotted == n or dotted.startswith(n + ".") for n in NOT_ATTRIBUTES):
                found.add(dotted)
    return sorted(found)


def test_import_varbnn_exposes_every_documented_entry_point() -> None:
    names = _documented_entry_points()
    script = textwrap.dedent(f"""
        import sys, varbnn
        assert "matplotlib" not in sys.modules, "import varbnn imported matplotlib"
        missing = []
        for dotted in {names!r}:
            obj = varbnn
            try:
                for part in dotted.split(".")[1:]:
                    obj = getattr(obj, part)
            except AttributeError:
                missing.append(dotted)
        assert not missing, "after `import varbnn` alone these do not work: " + ", ".join(missing)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


def test_import_varbnn_stays_cheap() -> None:
    """No matplotlib, scipy, experiments or CLI at import: those load when first used."""
    script = ("import sys, varbnn; heavy = [m for m in ('matplotlib', 'scipy', 'varbnn_lab', 'varbnn.cli', "
              "'varbnn.plots') if m in sys.modules]; assert not heavy, heavy")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
