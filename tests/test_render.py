"""``varbnn render``: every committed result page of `varbnn reproduce NAME` re-rendered from its saved JSON by today's
renderers has the committed page's tables, number for number."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from varbnn_lab import CONFIGS
from varbnn_lab.render import SPECIAL_PAGES, render_result, render_saved, renderer_for

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _base(name: str) -> str:
    return name.removesuffix("-quick").removesuffix("-lstm")


def _saved_results() -> list[Path]:
    """The committed JSON files of `varbnn reproduce NAME` (any NAME) that have their page beside them; not those under
    ``history/`` (archived pages in the layout of their day; their numbers are in their JSON)."""
    found = []
    for path in sorted(RESULTS.rglob("*.json")):
        if "history" in path.relative_to(RESULTS).parts:
            continue
        try:
            result = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue
        name = result.get("name") if isinstance(result, dict) else None
        if not isinstance(name, str) or not path.with_suffix(".md").exists():
            continue
        if _base(name) in SPECIAL_PAGES or name in CONFIGS or name == "demo":
            found.append(path)
    return found


SAVED = _saved_results()


def _tables(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def test_every_special_page_has_committed_results():
    names = {_base(json.loads(p.read_text())["name"]) for p in SAVED}
    assert set(SPECIAL_PAGES) <= names
    assert {"mnist-mlp", "ktied-mnist", "lenet5-prune"} <= names


@pytest.mark.parametrize("path", SAVED, ids=[str(p.relative_to(RESULTS)) for p in SAVED])
def test_rerendered_tables_equal_the_committed_page(path: Path):
    result = json.loads(path.read_text())
    page = render_result(result, path.parent, rendered_at="test")
    committed = path.with_suffix(".md").read_text()
    assert _tables(page), f"{path}: no table rendered"
    assert _tables(page) == _tables(committed)


def test_render_saved_writes_the_page_of_any_experiment(tmp_path):
    source = RESULTS / "uci" / "gamma11" / "uci.json"
    copy = tmp_path / "uci.json"
    shutil.copy(source, copy)
    page = render_saved(copy)
    assert page == tmp_path / "uci.md" and _tables(page.read_text()) == _tables(source.with_suffix(".md").read_text())
    assert renderer_for("graves-prune-lstm-quick") is not None and renderer_for("mnist-mlp") is None
    with pytest.raises(ValueError, match="'name'"):
        render_result({"rows": []})
