"""Shared writer of the benchmarks' result files: OUT/STEM.json and OUT/STEM.md with the provenance header."""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch


def commit_of(root: Path) -> str:
    """The short hash of ``root``'s checkout, ``+dirty`` if tracked files outside ``benchmarks/results/`` have
    uncommitted changes (results that a run in progress appends to are not code; run from a clean worktree at a
    commit so the records name the code); ``unknown`` without git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)benchmarks/results"], cwd=root, capture_output=True,
                               text=True, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty else "")


def device_name(device: torch.device) -> str:
    """The lab's device description when the lab is installed (``cpu: <processor>, N threads``), else a short one."""
    try:
        from varbnn_lab.engine import describe_device
    except ImportError:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
        return f"{device.type}: {name}"
    return describe_device(device)


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
