"""The user pages run as written: every Python block of the README and the user guide runs verbatim (each in a fresh
namespace, in a temporary directory), and every relative link of the user pages points to a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "docs" / "guide.md", ROOT / "benchmarks" / "results" / "README.md"]
BLOCKS = [
    (page.relative_to(ROOT).as_posix(), i, block)
    for page in PAGES[:2]
    for i, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S))
]


def test_the_user_pages_have_python_blocks() -> None:
    assert sum(page == "README.md" for page, _, _ in BLOCKS) >= 1 and len(BLOCKS) >= 3


def test_the_readme_stays_a_users_page() -> None:
    assert len((ROOT / "README.md").read_text()) <= 10_000


@pytest.mark.parametrize("page, index, block", BLOCKS, ids=[f"{p}:{i + 1}" for p, i, _ in BLOCKS])
def test_python_block_runs(page: str, index: int, block: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(block, f"{page} python block {index + 1}", "exec"), {"__name__": "__docs__"})


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_relative_links_exist(page: Path) -> None:
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
    missing = [t for t in targets if not t.startswith(("http://", "https://")) and not (page.parent / t).exists()]
    assert not missing, f"{page.name}: links to missing files {missing}"
