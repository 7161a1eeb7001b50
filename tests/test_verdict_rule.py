"""The results pages' verdict rule, per-seed comparisons, tolerant number matching and staleness (docs/gen_results.py).

Hand-made cases for the rule; every claim that declares per-seed comparisons has the verdict the rule computes from
the committed records; the staleness check on a tiny temporary git repository.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))

import gen_results as g  # noqa: E402

# --- the rule on hand-made differences -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("diffs", "verdict"),
    [
        ([0.01, 0.012, 0.009, 0.011, 0.010], "yes"),  # every seed the paper's way, far beyond the SE
        ([-0.0066, -0.0103, -0.0033, -0.0075, -0.0086], "no"),  # vcl-split-fmnist: the reverse on 5 of 5
        ([0.03, -0.05, 0.04, 0.03, -0.01], "partly"),  # a majority the paper's way, but the mean within one SE
        ([0.1, -0.001, -0.001], "partly"),  # the mean far positive, but a majority the other way
        ([0.5], "partly"),  # one seed: no standard error, never more than partly
        ([-0.5], "partly"),
        ([0.0, 0.0, 0.0], "partly"),  # all ties
        ([0.2, 0.1], "yes"),  # two seeds: both one way and the mean beyond the SE
    ],
)
def test_verdict_rule_on_hand_made_differences(diffs: list[float], verdict: str) -> None:
    assert g.verdict_rule(diffs).verdict == verdict


def test_verdict_rule_statistics() -> None:
    stats = g.verdict_rule([1.0, 2.0, 3.0, -1.0])
    assert (stats.n, stats.wins, stats.losses) == (4, 3, 1)
    assert stats.mean == pytest.approx(1.25)
    assert stats.se == pytest.approx(math.sqrt(((0.25**2) + 0.75**2 + 1.75**2 + 2.25**2) / 3) / 2)
    assert stats.verdict == "yes"
    one = g.verdict_rule([0.3])
    assert math.isnan(one.se) and one.verdict == "partly"


@pytest.mark.parametrize(
    ("diffs", "match"), [([], "diffs: expected at least one"), ([1.0, math.nan], "diffs: expected finite numbers")]
)
def test_verdict_rule_refuses_bad_input(diffs: list[float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        g.verdict_rule(diffs)


def test_combined_verdicts() -> None:
    assert g.combine_verdicts(["yes", "yes"]) == "yes"
    assert g.combine_verdicts(["no", "no"]) == "no"
    assert g.combine_verdicts(["yes", "no"]) == "partly"
    assert g.combine_verdicts(["partly"]) == "partly"
    with pytest.raises(ValueError, match="verdicts: expected 'yes', 'partly' or 'no'"):
        g.combine_verdicts(["n/a"])
    with pytest.raises(ValueError, match="verdicts: expected at least one"):
        g.combine_verdicts([])
    with pytest.raises(ValueError, match="better: expected 'higher' or 'lower'"):
        g.Comparison("x", "f", (), (), "m", better="up")


# --- comparisons read from records -----------------------------------------------------------------------------------


def test_a_comparison_reads_pairs_by_seed_and_signs_by_direction(tmp_path: Path) -> None:
    runs = tmp_path / "runs.jsonl"
    rows = [("a", 0, [0.9, 0.8]), ("b", 0, [0.7, 0.6]), ("a", 1, [0.5, 0.5]), ("b", 1, [0.6, 0.6]), ("a", 2, [1, 1])]
    runs.write_text("".join(json.dumps({"variant": v, "seed": s, "acc": [[0.0], acc]}) + "\n" for v, s, acc in rows))
    up = g.Comparison("a vs b", "runs.jsonl", (("variant", "a"),), (("variant", "b"),), "acc/-1/mean")
    pairs = g.paired_values(up, root=tmp_path)
    assert [(s, round(d, 6)) for s, _, _, d in pairs] == [(0, 0.2), (1, -0.1)]  # seed 2 has no b: left out
    down = g.Comparison("a vs b", "runs.jsonl", (("variant", "a"),), (("variant", "b"),), "acc/-1/mean", better="lower")
    assert [round(d, 6) for *_, d in g.paired_values(down, root=tmp_path)] == [-0.2, 0.1]
    nested = tmp_path / "r.json"
    nested.write_text(json.dumps({"traces": {"x": [[{"step": 5, "v": 2.0}], [{"step": 5, "v": 3.0}]],
                                             "y": [[{"step": 5, "v": 1.0}], [{"step": 5, "v": 1.0}]]}}))  # fmt: skip
    traced = g.Comparison("x vs y", "r.json", (("key", "x"),), (("key", "y"),), "value/[step=5]/v", records="traces")
    assert g.compare(traced, root=tmp_path).mean == pytest.approx(1.5)


def test_every_claim_with_comparisons_has_the_rules_verdict() -> None:
    """The hand-written verdict equals :func:`gen_results.rule_verdict` for every claim whose comparisons decide."""
    checked = 0
    for claim in g.CLAIMS:
        rule = g.rule_verdict(claim)
        if rule is not None:
            checked += 1
            assert claim.verdict == rule, (claim.folder, claim.verdict, rule)
    assert checked >= 8


def test_the_audited_numbers_come_from_the_records() -> None:
    """The numbers the audit named, recomputed from the committed runs."""
    claims = g.claims_by_folder()
    vcl = g.compare(claims["vcl-split-fmnist"].comparisons[0])
    assert (vcl.losses, vcl.n, round(vcl.mean, 4), round(vcl.se, 4), vcl.verdict) == (5, 5, -0.0071, 0.0012, "no")
    retina = {c.label: g.compare(c) for c in claims["retina-referral"].comparisons}
    at20 = retina["radial vs mean-field, AUROC at 20% referred"]
    assert (at20.wins, round(at20.mean, 3), round(at20.se, 3), at20.verdict) == (3, 0.015, 0.016, "partly")  # a8427a7
    assert retina["radial vs mean-field, AUROC at 50% referred"].verdict == "yes"
    snr = g.paired_values(claims["ktied-snr-anneal"].comparisons[0])
    assert all(d < 0 for *_, d in snr)  # mean-field's SNR above 2-tied's on every seed, on the paper's schedule
    meanfield = next(c for c in claims["uncertainty-mnist"].comparisons if c.label.startswith("MeanField vs plain, NLL"))
    seed1 = {s: (a, b) for s, a, b, _ in g.paired_values(meanfield)}[1]
    assert (round(seed1[0], 4), round(seed1[1], 4)) == (0.0336, 0.0323)  # MeanField above plain on seed 1


def test_the_pages_show_the_per_seed_evidence_and_the_rule() -> None:
    text, _ = g.render_folder("vcl-split-fmnist")
    assert "## Per-seed evidence {#per-seed}" in text and "0 of 5 | 5 of 5 | -0.00712 ± 0.001206 | **no**" in text
    index = g.render_index()
    assert g.VERDICT_RULE in index and "## Not attempted" in index and "| runs' commit | stale |" in index


# --- numbers matched after rounding ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "values", "percent", "expected"),
    [
        ("0.0073", [0.00731], False, True),
        ("0.0073", [0.00726], False, True),
        ("0.0073", [0.0075], False, False),
        ("1,273", [1272.6], False, True),
        ("1.76", [0.0176], True, True),  # 1.76%
        ("1.76", [0.0176], False, False),
        ("7.7e-15", [7.66e-15], False, True),
        ("7.7e-15", [7.9e-15], False, False),
        ("0.98", [0.978], False, True),
        ("0.978", [0.98], False, False),  # more digits written than the data holds
    ],
)
def test_number_matches_after_rounding(written: str, values: list[float], percent: bool, expected: bool) -> None:
    assert g.number_matches(written, sorted(values), percent) is expected


def test_claim_numbers_skip_hashes_and_references() -> None:
    numbers = g.claim_numbers("at 9dac41c (issue 30, figure 5): 1.76% and 3 seeds")
    assert numbers == [("1.76", True), ("3", False)]


def test_data_values_read_numbers_and_strings(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"device": "cpu, 2 threads", "commit": "abc1234ff", "x": [-1.5, True, None]}))
    assert sorted(g.data_values(path)) == [1.5, 2.0]


# --- staleness on a tiny repository -----------------------------------------------------------------------------------


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "HOME": str(repo), "PATH": "/usr/bin:/bin"}  # fmt: skip
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True, env=env).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_staleness_on_a_tiny_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    (repo / "src" / "varbnn" / "families").mkdir(parents=True)
    _git(repo, "init", "-q")
    family = repo / "src" / "varbnn" / "families" / "f.py"
    family.write_text("a = 1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "library")
    run = _git(repo, "rev-parse", "HEAD")
    (repo / "README.md").write_text("docs\n")  # not library code
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "docs")
    monkeypatch.setattr(g, "_HISTORY", {})
    fresh = g.staleness([run], root=repo)
    assert fresh is not None and not fresh.stale and fresh.since is None and fresh.commits == (run[:7],)
    assert g.staleness([run + "+dirty"], root=repo).stale  # dirty: the code is unknown
    assert g.staleness(["1234567"], root=repo).unknown == ("1234567",)
    family.write_text("a = 2\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "family change")
    change = _git(repo, "rev-parse", "HEAD")
    monkeypatch.setattr(g, "_HISTORY", {})  # the cache holds one history per repository
    stale = g.staleness([run], root=repo)
    assert stale is not None and stale.stale and stale.since == change[:7]
    assert not g.staleness([change], root=repo).stale
    # code only some folders use (the adapters: finetune-cpu) makes those folders stale, not the others
    (repo / "src" / "varbnn" / "adapters").mkdir()
    (repo / "src" / "varbnn" / "adapters" / "a.py").write_text("b = 1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "adapters")
    adapters = _git(repo, "rev-parse", "HEAD")
    monkeypatch.setattr(g, "_HISTORY", {})
    assert not g.staleness([change], root=repo).stale
    assert not g.staleness([change], root=repo, paths=g.library_paths("vcl-split-fmnist")).stale
    only_there = g.staleness([change], root=repo, paths=g.library_paths("finetune-cpu"))
    assert only_there.stale and only_there.since == adapters[:7]
    assert not g.staleness([adapters], root=repo, paths=g.library_paths("finetune-cpu")).stale
    assert "`src/varbnn/adapters`" in g.STALE_RULE and "`finetune-cpu`" in g.STALE_RULE


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_comment_and_docstring_changes_do_not_make_a_page_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    (repo / "src" / "varbnn" / "families").mkdir(parents=True)
    _git(repo, "init", "-q")
    source = repo / "src" / "varbnn" / "families" / "o.py"
    source.write_text('"""Module."""\n\ndef f(x):\n    """Doc."""\n    return x + 1\n')
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "library")
    run = _git(repo, "rev-parse", "HEAD")
    source.write_text(
        '"""Module, reworded."""\n\ndef f(x):  # a comment\n    """Other doc."""\n    return x + 1  # type: ignore[operator]\n'
    )
    _git(repo, "commit", "-qam", "comments and docstrings")
    neutral = _git(repo, "rev-parse", "HEAD")
    monkeypatch.setattr(g, "_HISTORY", {})
    assert g.neutral_commit(neutral, root=repo) and not g.staleness([run], root=repo).stale
    source.write_text('"""Module."""\n\ndef f(x):\n    return x + 2\n')
    _git(repo, "commit", "-qam", "code")
    change = _git(repo, "rev-parse", "HEAD")
    monkeypatch.setattr(g, "_HISTORY", {})
    assert not g.neutral_commit(change, root=repo)
    stale = g.staleness([run], root=repo)
    assert stale.stale and stale.since == change[:7]  # the first change that runs, not the comment commit
    (repo / "src" / "varbnn" / "families" / "new.py").write_text("x = 1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "a new file")
    assert not g.neutral_commit(_git(repo, "rev-parse", "HEAD"), root=repo)
    assert g._code_of("def f(:\n") is None


def test_file_commits_and_the_per_file_breakdown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "exp"
    folder.mkdir()
    (folder / "a.json").write_text(json.dumps({"commit": "aaa1111, bbb2222", "rows": []}))
    (folder / "b.json").write_text(json.dumps({"commit": "render", "records": [{"commit": "ccc3333"}]}))
    (folder / "c.json").write_text(json.dumps(["not", "a", "dict"]))
    assert g.file_commits(folder / "a.json") == ["aaa1111", "bbb2222"]
    assert g.file_commits(folder / "b.json") == ["ccc3333"]  # the records, not the render
    assert g.file_commits(folder / "c.json") == []
    monkeypatch.setattr(g, "RESULTS", tmp_path)
    verdicts = {"aaa1111": True, "bbb2222": True, "ccc3333": False}
    monkeypatch.setattr(g, "staleness", lambda commits, root=None, paths=g.LIBRARY_PATHS: g.Staleness(
        tuple(commits), any(verdicts[c] for c in commits), "ddd4444" if any(verdicts[c] for c in commits) else None))
    monkeypatch.setattr(g, "folder_staleness", lambda name: g.Staleness(("aaa1111",), True, "ddd4444"))
    monkeypatch.setattr(g, "stale_runs", lambda name: [])
    text = "\n".join(g.stale_lines("exp"))
    assert "- `a.json` (`aaa1111`, `bbb2222`): stale since `ddd4444`" in text and "- `b.json` (`ccc3333`): current" in text


def test_staleness_without_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(g, "_HISTORY", {})
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on the PATH
    assert g.staleness(["abcdef1"], root=tmp_path) is None
    monkeypatch.setattr(g, "_HISTORY", {g.ROOT: None})
    text, _ = g.render_folder("demo")
    assert "Staleness not checked" in text
    assert "git was not available" in g.render_index()


def test_run_commits_and_stale_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "exp"
    (folder / "history").mkdir(parents=True)
    (folder / "exp.json").write_text(json.dumps({"commit": "render1", "stale_runs": ["seed 1: code changed"]}))
    (folder / "exp_runs.jsonl").write_text(json.dumps({"commit": "run1"}) + "\n" + json.dumps({"commit": "run2+dirty"}))
    (folder / "history" / "old.json").write_text(json.dumps({"commit": "old"}))
    assert g.run_commits(folder) == ["run1", "run2+dirty"]  # the runs, not the render; history left out
    (folder / "exp_runs.jsonl").unlink()
    assert g.run_commits(folder) == ["render1"]
    monkeypatch.setattr(g, "RESULTS", tmp_path)
    assert g.stale_runs("exp") == ["exp/exp.json: seed 1: code changed"]


# the scripts that train with varbnn.optim.IVON (directly, or through uncertainty_cpu's methods) and their folders
IVON_SCRIPTS = {
    "finetune_cpu.py": "finetune-cpu",
    "ivon_classification_clip.py": "uncertainty-cpu",
    "ivon_noise_trace.py": "uci-learned",
    "ivon_regression_recipe.py": "uci-learned",
    "ivon_step.py": "ivon",
    "moment_predictive.py": "moment-predictive",
    "uncertainty_cpu.py": "uncertainty-cpu",
    "validation_predictive.py": "validation-predictive",
}


def test_every_experiment_that_trains_with_ivon_watches_the_optimizer() -> None:
    # src/varbnn/optim is watched only for the folders whose runs use it: a new user of IVON must be listed, or a
    # change to the optimizer would leave its page marked current
    import re

    from varbnn_lab.registry import CONFIGS

    uses = re.compile(r"varbnn\.optim|\bIVON\(|optimizer=\"ivon\"|\bivon-es\b")
    scripts = {p.name for p in (ROOT / "benchmarks").glob("*.py") if uses.search(p.read_text())}
    assert scripts <= set(IVON_SCRIPTS), f"new IVON users: {sorted(scripts - set(IVON_SCRIPTS))}"
    lab = {p.name for p in (ROOT / "lab" / "varbnn_lab").rglob("*.py") if re.search(r"varbnn\.optim", p.read_text())}
    assert lab <= {"config.py", "registry.py", "runner.py", "uci_learned.py"}, sorted(lab)
    folders = set(IVON_SCRIPTS.values()) | {"uci-learned"}
    folders |= {name for name, config in CONFIGS.items() if any(v.optimizer == "ivon" for v in config.variants)}
    assert {"uncertainty-mnist", "uncertainty-fmnist"} <= folders
    for folder in folders:
        assert "src/varbnn/optim" in g.library_paths(folder), folder
    assert "src/varbnn/optim" not in g.LIBRARY_PATHS
    assert "src/varbnn/optim" not in g.library_paths("retina-referral")
