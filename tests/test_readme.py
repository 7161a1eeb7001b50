"""The user pages run as written: every Python block of the README, the home page, the getting-started page and the
user guide (``docs/guide/*.md``) runs verbatim (in a fresh namespace, in a temporary directory), and every relative
link of the user pages points to a file that exists (or to a page the site generates at build time).

A block runs on its own unless the line before its fence is ``<!-- continued -->`` (an HTML comment, invisible on the
site): then it runs after the page's previous block, in the same namespace, as the next step of a tutorial. Each chain
of blocks (a block and its continuations) is one test.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RUN_PAGES = [ROOT / "README.md", DOCS / "index.md", DOCS / "getting-started.md", *sorted((DOCS / "guide").glob("*.md"))]
LINK_PAGES = [*RUN_PAGES, ROOT / "benchmarks" / "results" / "README.md"]

FENCE = re.compile(r"^```python\n(.*?)^```", flags=re.S | re.M)
CONTINUED = "<!-- continued -->"


def _chains(page: Path) -> list[tuple[str, int, int, str]]:
    """``(page, first block, last block, source)`` for every chain of blocks on ``page`` (1-based block numbers)."""
    text = page.read_text(encoding="utf-8")
    chains: list[tuple[str, int, int, str]] = []
    name = page.relative_to(ROOT).as_posix()
    for number, match in enumerate(FENCE.finditer(text), start=1):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        if before == CONTINUED:
            if not chains or chains[-1][0] != name:
                raise AssertionError(f"{name}: python block {number} is marked {CONTINUED} but has no block before it")
            page_name, first, _, source = chains[-1]
            chains[-1] = (page_name, first, number, source + f"\n# --- python block {number}\n" + match.group(1))
        else:
            chains.append((name, number, number, match.group(1)))
    return chains


CHAINS = [chain for page in RUN_PAGES for chain in _chains(page)]


def _chain_id(page: str, first: int, last: int) -> str:
    return f"{page}:{first}" if first == last else f"{page}:{first}-{last}"


def test_the_user_pages_have_python_blocks() -> None:
    pages = {page for page, _, _, _ in CHAINS}
    assert "README.md" in pages and "docs/getting-started.md" in pages
    guide = {p.relative_to(ROOT).as_posix() for p in (DOCS / "guide").glob("*.md")}
    assert len(guide) >= 17 and len(pages & guide) >= 10


def test_the_readme_stays_a_users_page() -> None:
    assert len((ROOT / "README.md").read_text()) <= 10_000


@pytest.mark.parametrize("page, first, last, source", CHAINS, ids=[_chain_id(p, f, last) for p, f, last, _ in CHAINS])
def test_python_block_runs(page: str, first: int, last: int, source: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(source, f"{page} python blocks {first}-{last}", "exec"), {"__name__": "__docs__"})


def _generated_pages() -> set[str]:
    """Pages ``docs/gen_pages.py`` writes at build time, relative to ``docs/`` (the results pages: any under
    ``results/``, written by ``docs/gen_results.py``)."""
    source = (DOCS / "gen_pages.py").read_text(encoding="utf-8")
    titles = re.findall(r'^\s*\("varbnn[\w.]*", "([\w-]+)",', source, flags=re.M)
    return {"changelog.md", "reference/index.md", *(f"reference/{title}.md" for title in titles)}


def _link_targets(text: str) -> list[str]:
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # code blocks hold no links
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)


def _missing(page: Path) -> list[str]:
    generated = _generated_pages()
    missing = []
    for target in _link_targets(page.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path = (page.parent / target).resolve()
        if path.exists():
            continue
        try:
            inside_docs = path.relative_to(DOCS.resolve()).as_posix()
        except ValueError:
            inside_docs = None
        if inside_docs is not None and (inside_docs in generated or inside_docs.startswith("results/")):
            continue  # written at build time; mkdocs build --strict checks these
        missing.append(target)
    return missing


@pytest.mark.parametrize("page", LINK_PAGES, ids=[p.relative_to(ROOT).as_posix() for p in LINK_PAGES])
def test_relative_links_exist(page: Path) -> None:
    missing = _missing(page)
    assert not missing, f"{page.name}: links to missing files {missing}"


def test_links_into_generated_pages_are_checked() -> None:
    generated = _generated_pages()
    assert {"reference/varbnn.md", "reference/training.md", "reference/prune.md", "changelog.md"} <= generated
