"""The results layout and the results pages of the site (docs/gen_results.py).

Every folder of benchmarks/results/ holds a page and its result JSON, has a reviewed claim (a row of the summary) and a
generated page that shows the command, commit and device of every JSON it renders; every number of a claim is in one of
the committed files the claim names; every link of a generated page resolves in the site; mkdocs.yml's nav lists every
generated page. Each check is a function returning the problems it finds, run on the real folder (no problems) and on a
broken copy (problems), so that none of them passes vacuously.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))

import gen_results as g  # noqa: E402

from varbnn_lab.config import RESULTS_DIR, results_dir  # noqa: E402
from varbnn_lab.graves import network_experiment  # noqa: E402

SITE_PAGES = {"index.md", g.JOURNAL}


def layout_problems() -> list[str]:
    """Folders without a page, a page without its JSON, a JSON without command / commit / device."""
    problems = []
    for folder in g.experiment_folders():
        path = g.RESULTS / folder
        pages = g.current_pages(path)
        if not pages:
            problems.append(f"{folder}: no page")
        if folder in g.NO_JSON:
            continue
        for page in pages + [p for v in g.variant_folders(path) for p in g.current_pages(v)] + g.study_pages(path):
            json_path = g.result_json(page)
            if json_path is None:
                problems.append(f"{page.relative_to(g.RESULTS)}: no JSON beside it")
                continue
            data = json.loads(json_path.read_text())
            missing = [k for k in ("command", "commit", "device", "seconds") if not data.get(k) and data.get(k) != 0]
            if missing:
                problems.append(f"{json_path.relative_to(g.RESULTS)}: no {missing}")
    return problems


def summary_problems() -> list[str]:
    """Folders without a reviewed claim or a summary row, claims of folders that do not exist, unknown verdicts."""
    folders = set(g.experiment_folders())
    claimed = g.claims_by_folder()
    index = g.render_index()
    problems = [f"{f}: no claim in CLAIMS" for f in sorted(folders - set(claimed))]
    problems += [f"claim of {f}: no such folder" for f in sorted(set(claimed) - folders)]
    problems += [f"{f}: no row in the summary" for f in sorted(folders) if f"]({f}.md)" not in index]
    for claim in g.CLAIMS:
        if claim.verdict not in g.VERDICTS or claim.paper not in g.PAPERS:
            problems.append(f"{claim.title}: verdict {claim.verdict!r} / paper {claim.paper!r} unknown")
        if (claim.folder is None) != (claim.verdict == "not run"):
            problems.append(f"{claim.title}: 'not run' exactly when there is no folder")
    return problems


def _jsons_shown(folder: str) -> list[Path]:
    path = g.RESULTS / folder
    pages = g.current_pages(path) + [p for v in g.variant_folders(path) for p in g.current_pages(v)]
    pages += g.history_pages(path) + g.study_pages(path)
    return [j for j in (g.result_json(p) for p in pages) if j is not None]


def provenance_problems() -> list[str]:
    """Generated pages that do not show the command, commit and device of each JSON they render."""
    problems = []
    for folder in g.experiment_folders():
        text, _ = g.render_folder(folder)
        for json_path in _jsons_shown(folder):
            info = g.provenance(json_path)
            for key in ("command", "commit", "device"):
                if str(info[key]) not in text.replace("\\|", "|"):
                    problems.append(f"{folder}.md: the {key} of {json_path.relative_to(g.RESULTS)} is missing")
    return problems


def _comparison_values(claim: g.Claim) -> list[float]:
    """The numbers a claim's comparisons compute from its data: each seed's values and difference, the counts, the
    mean difference and its standard error (shown on the page's per-seed table)."""
    out: list[float] = []
    for comparison in claim.comparisons:
        pairs = g.paired_values(comparison)
        stats = g.verdict_rule([d for *_, d in pairs])
        out += [abs(v) for _, a, b, d in pairs for v in (a, b, d)]
        out += [float(stats.n), float(stats.wins), float(stats.losses), abs(stats.mean)]
        out += [stats.se] if stats.n > 1 else []
    return out


def number_problems(claims: tuple[g.Claim, ...]) -> list[str]:
    """Numbers of a claim that no committed data backs. The claim text (the paper's or the issue's numbers, quoted)
    is checked against every source, Markdown included; every number of the result and the why must be one the claim
    text states, one of the data files among the sources (``.json``, ``.jsonl``, ``.csv``; a ``.py`` source's numbers
    count as published references) or one the claim's comparisons compute, matched after rounding
    (:func:`gen_results.number_matches`). A number only a Markdown page holds (the journal, a hand-written page) does
    not count: that check would be circular."""
    problems = []
    for claim in claims:
        if claim.verdict != "not run" and not claim.sources:
            problems.append(f"{claim.title}: no sources")
        corpus, values = "", []
        for source in claim.sources:
            path = ROOT / source
            if not path.is_file():
                problems.append(f"{claim.title}: source {source} does not exist")
                continue
            text = path.read_text(encoding="utf-8").replace("\u2212", "-")
            corpus += text + "\n"
            if path.suffix == ".py":
                values += [abs(float(n.replace(",", ""))) for n in g._NUMBER.findall(g._HASH.sub(" ", text))]
        values += [v for path in g.claim_data_files(claim) for v in g.data_values(path)]
        values += [abs(float(n.replace(",", ""))) for n, _ in g.claim_numbers(claim.claim)]
        values += _comparison_values(claim)
        values.sort()
        for number, _ in set(g.claim_numbers(claim.claim)):
            if claim.sources and not re.search(rf"(?<![\d.,]){re.escape(number)}(?![\d]|[.,]\d)", corpus):
                problems.append(f"{claim.title}: {number} (claim) is in none of {list(claim.sources)}")
        for number, percent in set(g.claim_numbers(claim.result) + g.claim_numbers(claim.why)):
            if claim.verdict == "not run":
                continue
            if not g.number_matches(number, values, percent):
                problems.append(f"{claim.title}: {number}{'%' if percent else ''} is in no data file of {list(claim.sources)}")
    return problems


def _ids(text: str) -> set[str]:
    return set(re.findall(r"\{#([^}]+)\}", text))


def link_problems() -> list[str]:
    """Links of the generated pages that would not resolve in the site: a page that is not generated, an anchor the
    target page does not define, a file that is not copied next to the pages."""
    pages: dict[str, tuple[str, set[Path]]] = {"index.md": (g.render_index(), set())}
    pages[g.JOURNAL] = g.render_journal()
    for folder in g.experiment_folders():
        pages[f"{folder}.md"] = g.render_folder(folder)
    problems = []
    for name, (text, assets) in pages.items():
        copied = {a.relative_to(g.RESULTS).as_posix() for a in assets}
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            if not path:
                if anchor not in _ids(text) and anchor not in _heading_slugs(text):
                    problems.append(f"{name}: #{anchor} is not a section of the page")
            elif path.endswith(".md"):
                if path not in pages:
                    problems.append(f"{name}: {path} is not a generated page")
                elif anchor and anchor not in _ids(pages[path][0]):
                    problems.append(f"{name}: {path} has no section #{anchor}")
            elif path not in copied or not (g.RESULTS / path).is_file():
                problems.append(f"{name}: {path} is not copied into the site")
    return problems


def studies_problems() -> list[str]:
    """A/B pages (``ab_*``) beside an experiment's tables instead of in its ``studies/``; a ``studies/`` without its
    index ``README.md``, a study page the index does not link, an index link to no file; an experiment folder or a
    ``studies/`` index that the journal (``benchmarks/results/README.md``) does not link."""
    journal = (g.RESULTS / "README.md").read_text(encoding="utf-8")
    problems = []
    for folder in g.experiment_folders():
        path = g.RESULTS / folder
        problems += [f"{folder}/{p.name}: an A/B page outside studies/" for p in path.glob("ab_*.md")]
        if f"]({folder}/" not in journal:
            problems.append(f"{folder}: not linked from the journal")
        studies = path / g.STUDIES
        if not studies.is_dir():
            continue
        index = studies / "README.md"
        if not index.is_file():
            problems.append(f"{folder}/{g.STUDIES}: no README.md index")
            continue
        links = {t.partition("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", index.read_text(encoding="utf-8"))}
        problems += [f"{folder}/{g.STUDIES}/{p.name}: not in the index" for p in g.study_pages(path) if p.name not in links]
        problems += [f"{folder}/{g.STUDIES}/README.md: {t} does not exist" for t in sorted(links)
                     if not re.match(r"^[a-z]+:", t) and not (studies / t).exists()]  # fmt: skip
        if f"]({folder}/{g.STUDIES}/README.md)" not in journal:
            problems.append(f"{folder}/{g.STUDIES}: its index is not linked from the journal")
    return problems


def _heading_slugs(text: str) -> set[str]:
    return {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in re.findall(r"^#+ (.+)$", text, re.M)}


def _nav_pages(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in _nav_pages(item)]
    if isinstance(node, dict):
        return [p for value in node.values() for p in _nav_pages(value)]
    return []


def nav_problems(mkdocs_yml: str) -> list[str]:
    """Generated results pages missing from mkdocs.yml's Results block, and entries there that are not generated."""
    yaml = pytest.importorskip("yaml")  # installed with the docs extra (mkdocs)

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)  # tags such as !!python/name
    nav = yaml.load(mkdocs_yml, Loader=Loader)["nav"]
    results = [entry["Results"] for entry in nav if isinstance(entry, dict) and "Results" in entry]
    listed = set(_nav_pages(results))
    expected = {f"{g.SITE}/{p}" for p in SITE_PAGES} | {f"{g.SITE}/{f}.md" for f in g.experiment_folders()}
    return [f"not in the nav: {p}" for p in sorted(expected - listed)] + [
        f"in the nav, not generated: {p}" for p in sorted(listed - expected)
    ]


# --- on the committed results ------------------------------------------------------------------------------------------


def test_every_folder_has_a_page_and_its_json() -> None:
    assert g.experiment_folders(), "no experiment folders found"
    assert not layout_problems()


def test_every_folder_has_a_reviewed_claim_and_a_summary_row() -> None:
    assert not summary_problems()


def test_every_generated_page_shows_the_command_commit_and_device_of_its_json() -> None:
    assert not provenance_problems()


UNBACKED: dict[str, frozenset[str]] = {
    # Numbers of result / why texts that no data file backs yet (only a Markdown page or a figure holds them, or a
    # ratio computed by hand): to be restated or backed by a committed command's output. The test fails when one is
    # fixed (remove it here) and when a new one appears.
}


def test_every_number_of_a_claim_is_in_a_committed_file_it_names() -> None:
    by_title = {c.title: c.folder for c in g.CLAIMS}
    found: dict[str, set[str]] = {}
    for problem in number_problems(g.CLAIMS):
        match = re.match(r"^(.*): (\S+) is in no data file of ", problem)
        assert match, problem  # a missing source or a claim-text number: never allowed
        found.setdefault(str(by_title[match.group(1)]), set()).add(match.group(2))
    assert found == {k: set(v) for k, v in UNBACKED.items()}


def test_every_link_of_the_generated_pages_resolves() -> None:
    assert not link_problems()


def test_the_nav_lists_every_results_page() -> None:
    assert not nav_problems((ROOT / "mkdocs.yml").read_text())


def test_studies_are_indexed_and_apart_from_the_tables() -> None:
    assert not studies_problems()
    text, _ = g.render_folder("step-time")
    assert "## Studies {#studies}" in text and "{#step-time-studies-ab_meanfield_a_a}" in text
    assert g.STUDIES not in {v.name for v in g.variant_folders(g.RESULTS / "step-time")}  # not a variant
    assert "### step_time_summary.md" in text and not re.search(r"^### ab_", text, re.M)  # A/B pages: not tables


def test_generated_pages_hold_the_json_command_and_commit() -> None:
    """Spot check on real pages: the header block and the JSON's provenance."""
    for folder, stem in (("uci", "uci"), ("lenet5-prune", "lenet5-prune"), ("step-time", "step_time")):
        text, assets = g.render_folder(folder)
        data = json.loads((g.RESULTS / folder / f"{stem}.json").read_text())
        assert data["command"] in text and data["commit"] in text
        assert "**Reproduced** | **" in text and any(a.suffix == ".json" for a in assets)
    uci, _ = g.render_folder("uci")
    assert "## Variants" in uci and "## History {#history}" in uci and "uci_51fd771.md" in uci


def test_the_default_output_folder_is_one_per_experiment() -> None:
    assert RESULTS_DIR == Path("benchmarks/results")
    assert results_dir("mnist-mlp") == Path("benchmarks/results/mnist-mlp")
    assert results_dir("mnist-mlp", "elsewhere") == Path("elsewhere")
    assert network_experiment("graves-prune") == "graves-mnist"
    assert network_experiment("graves-prune-lstm-quick") == "graves-mnist-lstm-quick"
    # the benchmark scripts' default folders exist (a renamed folder would leave a script writing beside the layout)
    named = set()
    for script in (ROOT / "benchmarks").glob("*.py"):
        named |= set(re.findall(r'results_dir\("([^"]+)"\)', script.read_text()))
    assert named and not {n for n in named if not (ROOT / RESULTS_DIR / n).is_dir()}, named


def test_the_study_scripts_write_into_studies() -> None:
    """The scripts whose pages are studies (A/B runs, micro-benchmarks; philox_draw.py takes sigma_param's folder)
    default to ``step-time/studies/``, not beside the step-time tables."""
    for name in ("ab_step", "sigma_param", "wood_pool", "ktied_gemms", "compile_graph", "fit_loop"):
        text = (ROOT / "benchmarks" / f"{name}.py").read_text()
        assert re.search(r'"step-time"\)? / "studies"|"benchmarks/results/step-time/studies"', text), name
    assert "from sigma_param import OUT" in (ROOT / "benchmarks" / "philox_draw.py").read_text()


# --- the checks fail where they should -----------------------------------------------------------------------------------


@pytest.fixture
def broken_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of two folders of benchmarks/results, as the generator's RESULTS."""
    copy = tmp_path / "results"
    for folder in ("demo", "vmf"):
        shutil.copytree(g.RESULTS / folder, copy / folder)
    shutil.copy(g.RESULTS / "README.md", copy / "README.md")
    monkeypatch.setattr(g, "RESULTS", copy)
    return copy


def test_the_checks_catch_a_folder_without_json_or_claim(broken_results: Path) -> None:
    (broken_results / "demo" / "demo.json").unlink()
    (broken_results / "new-experiment").mkdir()
    (broken_results / "new-experiment" / "new-experiment.md").write_text("# new\n")
    layout = layout_problems()
    assert any("demo.md: no JSON" in p for p in layout) and any("new-experiment.md: no JSON" in p for p in layout)
    summary = summary_problems()
    assert "new-experiment: no claim in CLAIMS" in summary and any("no such folder" in p for p in summary)
    text, _ = g.render_folder("new-experiment")
    assert "No reviewed claim" in text


def test_the_checks_catch_a_page_that_loses_its_provenance(broken_results: Path, monkeypatch) -> None:
    real = g.render_folder
    # the page's own commit (read from its JSON, so a rerun of the page does not make the test pass vacuously)
    commit = json.loads((broken_results / "vmf" / "vmf.json").read_text())["commit"][:10]
    assert commit in real("vmf")[0]
    monkeypatch.setattr(g, "render_folder", lambda folder: (real(folder)[0].replace(commit, "xxxxxxx"), set()))
    assert any("vmf.md: the commit" in p for p in provenance_problems())


def test_the_checks_catch_an_untraceable_number() -> None:
    claim = g.claims_by_folder()["demo"]
    invented = g.Claim(**{**claim.__dict__, "result": claim.result + " Calibration 0.123456."})
    assert number_problems((invented,)) == [f"{claim.title}: 0.123456 is in no data file of {list(claim.sources)}"]
    # a number only the journal (Markdown) holds does not count: a claim sourced from the journal alone
    journal_only = g.Claim(**{**claim.__dict__, "folder": None, "verdict": "yes", "sources": (g.J,)})
    assert any("0.1015 is in no data file" in p for p in number_problems((journal_only,)))
    rounded = g.Claim(**{**claim.__dict__, "result": "NLL 0.10"})  # demo.json's 0.1015.. rounded to 2 decimals
    assert number_problems((rounded,)) == []
    unsourced = g.Claim(**{**claim.__dict__, "sources": ("benchmarks/results/no-such-file.md",)})
    assert any("does not exist" in p for p in number_problems((unsourced,)))


def test_the_checks_catch_a_broken_link(broken_results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = broken_results / "vmf" / "vmf.md"
    page.write_text(page.read_text() + "\n![gone](vmf_missing.png) [up](../../README.md)\n")
    text, assets = g.render_folder("vmf")
    assert "`vmf_missing.png`" in text and "[up](" not in text  # a dead or outside link becomes plain text
    assert not link_problems()
    real = g.render_folder
    bad = "\n[a](nowhere.md) ![b](vmf/none.png) [c](demo.md#nope) [d](#nothing)\n"
    monkeypatch.setattr(g, "render_folder", lambda folder: (real(folder)[0] + bad, real(folder)[1]))
    problems = [p for p in link_problems() if p.startswith("vmf.md")]
    assert problems == [
        "vmf.md: nowhere.md is not a generated page",
        "vmf.md: vmf/none.png is not copied into the site",
        "vmf.md: demo.md has no section #nope",
        "vmf.md: #nothing is not a section of the page",
    ]


def test_the_checks_catch_studies_out_of_place_or_unindexed(broken_results: Path) -> None:
    vmf = broken_results / "vmf"
    (vmf / "ab_stray.md").write_text("# A/B\n")
    (vmf / g.STUDIES).mkdir()
    (vmf / g.STUDIES / "ab_listed.md").write_text("# A/B\n")
    (vmf / g.STUDIES / "ab_unlisted.md").write_text("# A/B\n")
    (vmf / g.STUDIES / "README.md").write_text("# Studies\n\n[a](ab_listed.md) [b](ab_gone.md) [c](../vmf.md)\n")
    (broken_results / "README.md").write_text("[demo](demo/demo.md)\n")
    assert sorted(studies_problems()) == [
        "vmf/ab_stray.md: an A/B page outside studies/",
        "vmf/studies/README.md: ab_gone.md does not exist",
        "vmf/studies/ab_unlisted.md: not in the index",
        "vmf/studies: its index is not linked from the journal",
        "vmf: not linked from the journal",
    ]
    text, _ = g.render_folder("vmf")
    assert "## Studies {#studies}" in text and "#### ab_unlisted.md {#vmf-studies-ab_unlisted}" in text
    assert "## Variants" not in text


def test_the_checks_catch_a_nav_without_a_results_page() -> None:
    text = (ROOT / "mkdocs.yml").read_text().replace("          - vmf: results/vmf.md\n", "")
    assert nav_problems(text) == ["not in the nav: results/vmf.md"]


def test_a_folder_holding_only_a_first_runs_checkpoints_is_not_an_experiment_folder_yet(tmp_path, monkeypatch):
    """The queue's first run of a new experiment writes ``.checkpoints/`` long before its page: until the folder holds
    anything else it is not checked (a page, claim and nav entry come with the first results)."""
    (tmp_path / "training" / ".checkpoints").mkdir(parents=True)
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "done.md").write_text("# done\n")
    (tmp_path / ".hidden").mkdir()
    monkeypatch.setattr(g, "RESULTS", tmp_path)
    assert g.experiment_folders() == ["done"]
    (tmp_path / "training" / "training_runs.jsonl").write_text("")
    assert g.experiment_folders() == ["done", "training"]
