"""Shared writer of the benchmarks' result files: OUT/STEM.json and OUT/STEM.md with the provenance header."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch


def write_result(out: str | Path, stem: str, result: dict[str, Any], title: str, notes: list[str], table: list[str]) -> Path:
    """Write ``result`` as JSON and a Markdown page: title, command / commit / device lines, ``notes`` (bullets
    without the dash), a blank line and the ``table`` lines. Returns ``OUT/STEM`` (without a suffix)."""
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"# {title}",
        "",
        f"- command: `{result['command']}`",
        f"- commit: `{result['commit']}`",
        f"- device: {result['device']}; torch {torch.__version__}",
        *[f"- {note}" for note in notes],
        "",
        *table,
    ]
    (out_dir / f"{stem}.md").write_text("\n".join(lines) + "\n")
    return out_dir / stem
