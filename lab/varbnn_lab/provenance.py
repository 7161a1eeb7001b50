"""Which code made a run: its commit, whether the code had uncommitted changes, and a hash of the code it ran.

A run is reused by its protocol hash (the config's fields: :class:`varbnn_lab.engine.RunStore`), which says nothing of
the code. So every record also carries the code that made it, and ``varbnn reproduce`` compares it with the code of
today: a record made by other code is **stale**.

The code path (what :func:`code_hash` is taken over; one rule, kept simple on purpose):

- every file of the installed library: the folder of the imported ``varbnn`` package (``varbnn.__file__``), all files
  under it except ``__pycache__`` folders and compiled ``*.pyc`` / ``*.pyo`` files: **any change to the library marks
  every run stale** (a docstring too: the hash does not know which changes cannot move a number);
- the experiment's lab modules: the module that defines the run function the engine calls (a ``functools.partial``
  unwrapped) and every ``varbnn_lab`` module that its source imports (at any level of the file, transitively),
  except the modules that only store, schedule or present results (:data:`NOT_CODE_PATH`: the engine, this module,
  the pages, the figures, the command line, the catalog and the registry of configs, whose values the protocol hash
  covers).

Each file enters the hash as its path (``varbnn/...`` or ``varbnn_lab/...``, sorted) and its bytes.

Fields of a run record (one line of ``NAME_runs.jsonl``; the engine adds them to every new record,
:func:`varbnn_lab.engine.execute`):

- ``commit``: :func:`varbnn_lab.engine.git_commit` as before (``<sha>``, ``<sha>+dirty``, ``$VARBNN_COMMIT`` or
  ``unknown``);
- ``code_hash``: :func:`code_hash` of the run's code path (64 hex digits);
- ``dirty``: ``true`` when tracked files under ``src/`` or ``lab/`` had uncommitted changes when the invocation
  started (:func:`dirty_files`), ``false`` when not, ``null`` outside a git checkout.

A record of the experiment's protocol whose ``code_hash`` differs from today's (or that has none: made before this
field) is stale. ``varbnn reproduce`` retrains it by default and moves the old record aside, to
``NAME_runs.stale.jsonl`` beside the runs file (never deleted), once the new record is saved; ``--reuse-stale``
(:func:`provenance_policy`) reuses it instead, and ``--no-train`` renders it: the page then says so.

Fields of the result ``OUT/NAME.json`` (every experiment's; what a docs generator reads to flag a page):

- ``code_hash``: this invocation's code hash (``null`` where it ran no runs through the engine);
- ``dirty``: as in the records, for this invocation;
- ``stale_runs``: the runs shown on the page that are stale, each ``{<key fields>..., "commit", "code_hash"}`` (e.g.
  ``{"variant": "mf", "seed": 0, "commit": "abc...", "code_hash": null}``; the key fields are the runs file's, or
  ``"run": [...]`` where the store does not name them); ``[]`` when every run is today's code. Its length is the count.

Writing into a committed results folder (any folder under the repository's ``benchmarks/results/``) from a tree with
uncommitted changes to tracked files under ``src/`` or ``lab/`` is refused (:func:`check_tree`) unless
``--allow-dirty``; elsewhere (a user's own folder) it is allowed and recorded (``dirty: true``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import importlib.util
import re
import subprocess
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "NOT_CODE_PATH",
    "CODE_FOLDERS",
    "code_hash",
    "code_path",
    "lab_modules",
    "module_of",
    "repository_root",
    "current_commit",
    "dirty_files",
    "committed_results",
    "check_tree",
    "ProvenancePolicy",
    "provenance_policy",
    "current_policy",
    "is_stale",
    "stale_runs",
]

NOT_CODE_PATH = (
    "varbnn_lab",  # the package's __init__: re-exports only
    "varbnn_lab.engine",
    "varbnn_lab.provenance",
    "varbnn_lab.render",
    "varbnn_lab.figures",
    "varbnn_lab.cli",
    "varbnn_lab.catalog",
    "varbnn_lab.registry",
    "varbnn_lab.pages",
)
"""The lab modules left out of a code path (and ``varbnn_lab.pages.*``): they store, schedule or present results, or
(the registry) hold configs that the protocol hash covers."""

CODE_FOLDERS = ("src", "lab")
"""The folders of the repository whose uncommitted changes make a tree dirty (:func:`dirty_files`)."""


def module_of(run: Callable[..., Any]) -> str | None:
    """The name of the module that defines ``run`` (``functools.partial`` objects unwrapped), or ``None``."""
    while isinstance(run, functools.partial):
        run = run.func
    name = getattr(run, "__module__", None)
    return name if isinstance(name, str) else None


def _excluded(name: str) -> bool:
    return name in NOT_CODE_PATH or name.startswith("varbnn_lab.pages.")


def _lab_file(name: str) -> Path | None:
    """The source file of lab module ``name``, or ``None`` where there is none."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    return Path(origin) if origin and origin.endswith(".py") else None


_FROM_IMPORT = re.compile(r"^[ \t]*from[ \t]+(varbnn_lab(?:\.\w+)*)[ \t]+import[ \t]+(?:\(([^)]*)\)|([^\n]*))", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+(varbnn_lab(?:\.\w+)*)", re.M)


def _imports(path: Path) -> set[str]:
    """The ``varbnn_lab`` modules that the source at ``path`` imports, on a line of its own at any level of the file
    (``from varbnn_lab.X import ...``, ``from varbnn_lab import X``, ``import varbnn_lab.X``): read as text, not run."""
    text = path.read_text(encoding="utf-8", errors="replace")
    found = {m[1] for m in _IMPORT.finditer(text)}
    for match in _FROM_IMPORT.finditer(text):
        found.add(match[1])
        for name in re.findall(r"\w+", match[2] or match[3] or ""):  # `from varbnn_lab import runner`: a submodule
            if name != "as" and _lab_file(f"{match[1]}.{name}") is not None:
                found.add(f"{match[1]}.{name}")
    return found


def lab_modules(modules: Iterable[str]) -> list[str]:
    """The lab modules of a code path: those of ``modules`` in ``varbnn_lab`` and every ``varbnn_lab`` module their
    sources import (transitively), less :data:`NOT_CODE_PATH`; sorted. Modules outside ``varbnn_lab`` (a user's own
    run function) are left out: only the library stands for them."""
    todo = [m for m in modules if m.split(".")[0] == "varbnn_lab"]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _lab_file(name)
        if path is not None:
            todo.extend(_imports(path) - seen)
    return sorted(name for name in seen if not _excluded(name) and _lab_file(name) is not None)


def code_path(modules: Iterable[str] = ()) -> list[tuple[str, Path]]:
    """The files :func:`code_hash` reads, as ``(name, path)`` sorted by name: every file of the imported ``varbnn``
    package (``varbnn/<relative path>``, without ``__pycache__`` and compiled files) and the lab modules of
    :func:`lab_modules` (``varbnn_lab/<relative path>``)."""
    import varbnn

    library = Path(varbnn.__file__).resolve().parent
    files = [
        (f"varbnn/{p.relative_to(library).as_posix()}", p)
        for p in library.rglob("*")
        if p.is_file() and "__pycache__" not in p.relative_to(library).parts and p.suffix not in (".pyc", ".pyo")
    ]
    lab_root = Path(__file__).resolve().parent
    for name in lab_modules(modules):
        path = _lab_file(name)
        if path is not None:
            path = path.resolve()
            try:
                files.append((f"varbnn_lab/{path.relative_to(lab_root).as_posix()}", path))
            except ValueError:  # a varbnn_lab module found elsewhere than this package's folder
                files.append((f"varbnn_lab/{name}", path))
    return sorted(files)


def code_hash(modules: Iterable[str] = ()) -> str:
    """The SHA-256 (64 hex digits) of the code path of a run whose run function lives in ``modules`` (module names,
    e.g. ``["varbnn_lab.runner"]``; none: the library alone): each file of :func:`code_path` as its name, a NUL, its
    length, a NUL and its bytes, in the sorted order. See the module docstring for the rule."""
    digest = hashlib.sha256()
    for name, path in code_path(modules):
        data = path.read_bytes()
        digest.update(name.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return digest.hexdigest()


def repository_root() -> Path:
    """The checkout the lab runs from (the folder above ``lab/``): where :func:`dirty_files` looks and whose
    ``benchmarks/results/`` holds the committed results."""
    return Path(__file__).resolve().parents[2]


def _git(root: Path, *args: str) -> str | None:
    """``git ARGS``'s output in ``root``, or ``None`` where git is missing or ``root`` is not a git checkout."""
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout


def dirty_files(root: Path | None = None) -> list[str] | None:
    """The tracked files under :data:`CODE_FOLDERS` (``src/``, ``lab/``) of the checkout ``root`` (default
    :func:`repository_root`) that have uncommitted changes (staged or not), as paths relative to ``root``, sorted;
    ``None`` where ``root`` is not a git checkout (or git is missing)."""
    root = repository_root() if root is None else Path(root)
    if _git(root, "rev-parse", "--is-inside-work-tree") is None:
        return None
    text = _git(root, "status", "--porcelain", "--untracked-files=no", "--", *CODE_FOLDERS)
    if text is None:
        return None
    files = []
    for line in text.splitlines():
        if len(line) > 3:
            files.append(line[3:].split(" -> ")[-1].strip('"'))
    return sorted(files)


def current_commit(root: Path | None = None) -> tuple[str, bool] | None:
    """``(HEAD's hash, dirty)`` of the checkout ``root`` (default :func:`repository_root`): ``dirty`` when
    :func:`dirty_files` names any file; ``None`` where ``root`` is not a git checkout."""
    root = repository_root() if root is None else Path(root)
    head = _git(root, "rev-parse", "HEAD")
    files = dirty_files(root)
    if head is None or files is None:
        return None
    return head.strip(), bool(files)


def committed_results(out: str | Path, root: Path | None = None) -> bool:
    """Whether the folder ``out`` is a committed results folder: ``benchmarks/results`` of the checkout ``root``
    (default :func:`repository_root`) or a folder under it."""
    root = repository_root() if root is None else Path(root)
    results = (root / "benchmarks" / "results").resolve()
    target = Path(out).resolve()
    return target == results or results in target.parents


@dataclass(frozen=True)
class ProvenancePolicy:
    """What ``varbnn reproduce`` does with a dirty tree and with stale runs (see :func:`provenance_policy`)."""

    allow_dirty: bool = False
    """Write into a committed results folder even when the code has uncommitted changes (``--allow-dirty``)."""
    reuse_stale: bool = False
    """Reuse the stale runs (made by other code) instead of retraining them (``--reuse-stale``); the page flags them."""


_POLICY: contextvars.ContextVar[ProvenancePolicy | None] = contextvars.ContextVar("varbnn_provenance", default=None)


@contextlib.contextmanager
def provenance_policy(allow_dirty: bool = False, reuse_stale: bool = False) -> Iterator[ProvenancePolicy]:
    """Within the block, every experiment run (:func:`varbnn_lab.engine.open_run`, :func:`varbnn_lab.engine.execute`,
    :func:`varbnn_lab.runner.run_experiment`) writes into a committed results folder from a dirty tree (``allow_dirty``)
    and reuses stale runs (``reuse_stale``); outside any block (the default), neither. ``varbnn reproduce
    --allow-dirty / --reuse-stale`` run their experiment in such a block."""
    for name, value in (("allow_dirty", allow_dirty), ("reuse_stale", reuse_stale)):
        if not isinstance(value, bool):
            raise TypeError(f"provenance_policy: {name} must be True or False, got {value!r}")
    policy = ProvenancePolicy(allow_dirty, reuse_stale)
    token = _POLICY.set(policy)
    try:
        yield policy
    finally:
        _POLICY.reset(token)


def current_policy() -> ProvenancePolicy:
    """The :class:`ProvenancePolicy` in force (:func:`provenance_policy`)."""
    return _POLICY.get() or ProvenancePolicy()


def check_tree(out: str | Path, allow_dirty: bool | None = None, root: Path | None = None) -> bool | None:
    """The ``dirty`` flag of an invocation writing into ``out`` (``None`` outside a git checkout), after refusing it:
    a ``ValueError`` when ``out`` is a committed results folder (:func:`committed_results`) and tracked files under
    ``src/`` or ``lab/`` have uncommitted changes (:func:`dirty_files`; the first five named), unless ``allow_dirty``
    (``None``: the :func:`provenance_policy` in force)."""
    allow = current_policy().allow_dirty if allow_dirty is None else allow_dirty
    files = dirty_files(root)
    if files is None:
        return None
    if files and not allow and committed_results(out, root):
        shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
        raise ValueError(
            f"out_dir {out} is a committed results folder (under benchmarks/results/) and the code has uncommitted "
            f"changes to tracked files under src/ or lab/ ({shown}): commit them first, so that the runs name the code "
            "that made them, or pass --allow-dirty (allow_dirty=True; the records then say dirty: true)"
        )
    return bool(files)


def is_stale(record: Mapping[str, Any], code: str) -> bool:
    """Whether ``record`` was made by other code than ``code``: its ``code_hash`` differs or it has none."""
    return record.get("code_hash") != code


def stale_runs(
    records: Mapping[Any, Mapping[str, Any]], keys: Sequence[Any], code: str, fields: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """The ``stale_runs`` entries of a result (see the module docstring): of ``keys`` (in their order), those whose
    record in ``records`` is stale against ``code``; each its key fields (``fields``, else ``"run"``: the key as a
    list), its ``commit`` and its ``code_hash``."""
    entries = []
    for key in keys:
        record = records.get(key)
        if record is None or not is_stale(record, code):
            continue
        named: dict[str, Any] = dict(zip(fields, key)) if fields and len(fields) == len(key) else {"run": list(key)}
        entries.append({**named, "commit": record.get("commit"), "code_hash": record.get("code_hash")})
    return entries
