"""``varbnn render OUT/NAME/NAME.json``: one entry point that rewrites the page of ANY experiment from its saved JSON.

The numbers and the run's provenance (command, commit, device, seconds) are the JSON's; only the layout is today's.
Each experiment's page is drawn by its own module's renderer (:func:`renderer_for` names it): the generic runner's
configs by :func:`varbnn.experiments.runner.render_markdown`, ``uci``, ``retina-*``, ``graves-*``, ``vcl-split-fmnist``
and ``soap-bubble`` by theirs. Figures are linked when their files lie beside the JSON (they are not redrawn).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from varbnn.experiments.engine import read_result

__all__ = ["renderer_for", "render_result", "render_saved", "SPECIAL_PAGES"]

SPECIAL_PAGES = (
    "uci", "uci-learned", "retina-referral", "retina-robustness", "graves-mnist", "graves-prune", "vcl-split-fmnist",
    "soap-bubble",
)  # fmt: skip
"""The experiments (and their ``-lstm`` / ``-quick`` forms) whose pages are not the generic runner's."""


def _base(name: str) -> str:
    name = name.removesuffix("-quick").removesuffix("-lstm")
    return name


def renderer_for(name: str) -> Callable[[dict[str, Any], Path | None], str] | None:
    """The page renderer of experiment ``name`` as ``render(result, folder)`` (``folder``: where the JSON lies, to find
    the figures), or ``None`` for a config of the generic runner."""
    base = _base(name)

    def figure(result: dict[str, Any], folder: Path | None, suffix: str = ".png") -> str | None:
        file = f"{result['name']}{suffix}"
        return file if folder is None or (folder / file).exists() else None

    if base == "uci-learned":
        from varbnn.experiments.uci_learned import render_uci_learned_markdown

        return lambda result, folder: render_uci_learned_markdown(result)
    if base == "uci":
        from varbnn.experiments.uci import render_uci_markdown

        return lambda result, folder: render_uci_markdown(result)
    if base in ("retina-referral", "retina-robustness"):
        from varbnn.experiments.retina import render_retina_markdown

        return lambda result, folder: render_retina_markdown(result, f"{result['name']}.png")
    if base == "graves-prune":
        from varbnn.experiments.graves import render_prune_markdown

        return lambda result, folder: render_prune_markdown(result, figure(result, folder))
    if base == "graves-mnist":
        from varbnn.experiments.graves import render_graves_markdown

        return lambda result, folder: render_graves_markdown(result, figure(result, folder))
    if base == "vcl-split-fmnist":
        from varbnn.experiments.continual import render_vcl_markdown

        return lambda result, folder: render_vcl_markdown(result, figure(result, folder))
    if base == "soap-bubble":
        from varbnn.experiments.soap_bubble import render_soap_bubble_markdown

        def soap(result: dict[str, Any], folder: Path | None) -> str:
            files = [figure(result, folder, f"_{kind}.png") for kind in ("kernel", "training")]
            return render_soap_bubble_markdown(result, [f for f in files if f is not None])

        return soap
    return None


def render_result(result: dict[str, Any], folder: Path | None = None, rendered_at: str | None = None) -> str:
    """The Markdown page of a saved result of ``varbnn reproduce NAME`` (any NAME of ``varbnn list``). ``rendered_at``:
    the commit named as the re-rendering one on generic runner pages."""
    if not isinstance(result, dict) or not isinstance(result.get("name"), str):
        raise ValueError("a saved result is a JSON object with a 'name' (the experiment's)")
    render = renderer_for(result["name"])
    if render is not None:
        return render(result, folder)
    from varbnn.experiments.runner import render_markdown

    return render_markdown(result, rendered_at=rendered_at)


def render_saved(path: str | Path, rendered_at: str | None = None) -> Path:
    """Rewrite the page ``NAME.md`` beside a saved result ``NAME.json`` of ``varbnn reproduce NAME`` (any experiment)
    and return its path; the generic runner's pages name the commit that re-rendered them (``rendered_at``, default
    :func:`varbnn.experiments.runner.git_commit` now)."""
    path = Path(path)
    result = read_result(path)
    name = result.get("name")
    if not isinstance(name, str) or renderer_for(name) is None:
        from varbnn.experiments import runner

        return runner.render_saved(path, rendered_at)
    page = path.with_suffix(".md")
    page.write_text(render_result(result, path.parent))
    return page
