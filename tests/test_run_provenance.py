"""Provenance that cannot go stale silently (issue 64): every run record names the code that made it (commit, code hash,
dirty flag); ``reproduce`` retrains a run made by other code (keeping its old record aside) unless ``--reuse-stale``,
flags it on the page under ``--reuse-stale`` / ``--no-train``, and refuses to write a committed results folder from a
tree with uncommitted code changes unless ``--allow-dirty``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from varbnn_lab import provenance as prov
from varbnn_lab.engine import RunStore, execute, expand

CPU = torch.device("cpu")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _toy(out: Path) -> RunStore:
    return RunStore.keyed(out, "toy", ("variant", "seed"), "toyhash")


def _toy_run(calls: list, key):
    calls.append(key)
    return {"variant": key[0], "seed": key[1], "value": float(key[1])}


# -- the code hash and the git state -----------------------------------------------------------------------------------


def test_the_code_path_is_the_whole_library_and_the_experiments_own_lab_modules():
    import varbnn

    names = [name for name, _ in prov.code_path(["varbnn_lab.runner"])]
    library = Path(varbnn.__file__).parent
    expected = sorted(f"varbnn/{p.relative_to(library).as_posix()}" for p in library.rglob("*.py")
                      if "__pycache__" not in p.parts)  # fmt: skip
    assert set(expected) <= set(names) and names == sorted(names)
    lab = {n for n in names if n.startswith("varbnn_lab/")}
    assert {"varbnn_lab/runner.py", "varbnn_lab/evaluation.py", "varbnn_lab/hooks.py", "varbnn_lab/config.py"} <= lab
    assert not lab & {"varbnn_lab/render.py", "varbnn_lab/engine.py", "varbnn_lab/cli.py", "varbnn_lab/registry.py"}
    assert not any(n.endswith(".pyc") for n in names)
    # a lazy import inside a function counts; the uci experiment's path runs through the shared regression module
    assert "varbnn_lab.regression" in prov.lab_modules(["varbnn_lab.uci"])
    digest = prov.code_hash(["varbnn_lab.runner"])
    assert len(digest) == 64 and digest == prov.code_hash(["varbnn_lab.runner"]) != prov.code_hash()


def _git_repo(root: Path) -> Path:
    """A git checkout with committed src/lib.py, lab/exp.py and docs/notes.md."""
    for name in ("src/lib.py", "lab/exp.py", "docs/notes.md"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x = 1\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "."], cwd=root, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], cwd=root, check=True)
    return root


def test_dirty_means_uncommitted_changes_to_tracked_code_files(tmp_path):
    root = _git_repo(tmp_path / "repo")
    assert prov.dirty_files(root) == [] and prov.current_commit(root)[1] is False  # type: ignore[index]
    (root / "docs" / "notes.md").write_text("changed\n")  # not code
    (root / "src" / "new.py").write_text("untracked\n")  # untracked
    assert prov.dirty_files(root) == []
    (root / "src" / "lib.py").write_text("x = 2\n")
    commit, dirty = prov.current_commit(root)  # type: ignore[misc]
    assert prov.dirty_files(root) == ["src/lib.py"] and dirty is True and len(commit) == 40
    assert prov.current_commit(tmp_path / "not-a-checkout") is None and prov.dirty_files(tmp_path) is None


# -- records carry their code; stale records are retrained and kept aside ------------------------------------------------


def test_a_new_record_carries_its_commit_code_hash_and_dirty_flag(tmp_path):
    calls: list = []
    execute(expand(variant=("a",), seed=(0, 1)), lambda key: _toy_run(calls, key), _toy(tmp_path), device=CPU,
            commit="c1", code_hash="hash-A", dirty=False)  # fmt: skip
    records = _lines(tmp_path / "toy_runs.jsonl")
    assert [(r["commit"], r["code_hash"], r["dirty"]) for r in records] == [("c1", "hash-A", False)] * 2
    # by default the hash is the run function's code path, the flag today's tree
    execute([("b", 0)], lambda key: _toy_run(calls, key), _toy(tmp_path), device=CPU, commit="c1")
    last = _lines(tmp_path / "toy_runs.jsonl")[-1]
    assert last["code_hash"] == prov.code_hash([__name__]) and last["dirty"] in (True, False, None)


def test_a_run_made_by_other_code_is_retrained_and_its_old_record_moved_aside(tmp_path):
    runs = expand(variant=("a",), seed=(0, 1))
    calls: list = []
    execute(runs, lambda key: _toy_run(calls, key), _toy(tmp_path), device=CPU, commit="old", code_hash="hash-A")
    with (tmp_path / "toy_runs.jsonl").open("a") as handle:  # a record of before code hashes: stale too
        handle.write(json.dumps({"variant": "b", "seed": 0, "value": 0.0, "protocol": "toyhash", "commit": "older"}) + "\n")
    calls.clear()
    done = execute([*runs, ("b", 0)], lambda key: _toy_run(calls, key), _toy(tmp_path), device=CPU, commit="new",
                   code_hash="hash-B")  # fmt: skip
    assert calls == [*runs, ("b", 0)] and all(r["code_hash"] == "hash-B" for r in done.values())
    assert [(r["variant"], r["seed"], r["commit"]) for r in _lines(tmp_path / "toy_runs.jsonl")] == [
        ("a", 0, "new"), ("a", 1, "new"), ("b", 0, "new")]  # fmt: skip
    aside = _lines(tmp_path / "toy_runs.stale.jsonl")  # never deleted; not read as runs
    assert [(r["variant"], r["seed"], r["commit"], r.get("code_hash")) for r in aside] == [
        ("a", 0, "old", "hash-A"), ("a", 1, "old", "hash-A"), ("b", 0, "older", None)]  # fmt: skip
    calls.clear()
    execute([*runs, ("b", 0)], lambda key: _toy_run(calls, key), _toy(tmp_path), device=CPU, commit="new",
            code_hash="hash-B")  # fmt: skip
    assert calls == []  # today's records are reused


def test_reuse_stale_keeps_the_old_records(tmp_path):
    runs = expand(variant=("a",), seed=(0,))
    calls: list = []
    execute(runs, lambda key: _toy_run(calls, key), _toy(tmp_path), device=CPU, commit="old", code_hash="hash-A")
    with prov.provenance_policy(reuse_stale=True):
        done = execute(runs, lambda key: _toy_run(calls, key), _toy(tmp_path), device=CPU, code_hash="hash-B")
    assert calls == runs and done[("a", 0)]["code_hash"] == "hash-A"
    assert prov.stale_runs(done, runs, "hash-B", ("variant", "seed")) == [
        {"variant": "a", "seed": 0, "commit": "old", "code_hash": "hash-A"}]  # fmt: skip
    assert not (tmp_path / "toy_runs.stale.jsonl").exists()


# -- the generic runner: retrain, --reuse-stale, --no-train ----------------------------------------------------------------


def _config(name: str):
    from varbnn_lab import ExperimentConfig, Variant

    return ExperimentConfig(
        name=name, description="", dataset="digits", model="mlp",
        model_options={"in_features": 64, "hidden": (8,), "out_features": 10},
        variants=(Variant("plain", family="plain"), Variant("mf", family_options={"init_std": 1e-2})),
        epochs=1, batch_size=256, seeds=(0,), eval_samples=2, resumable=True, figures=(), train_limit=300,
        test_limit=200,
    )  # fmt: skip


@pytest.fixture
def other_code(monkeypatch):
    """Switch to 'other code' (a changed code hash) when called."""

    def switch(value: str = "changed-code") -> None:
        monkeypatch.setattr(prov, "code_hash", lambda modules=(): value)

    return switch


def test_the_runner_retrains_stale_runs_from_scratch_and_keeps_the_old_records(tmp_path, other_code, capsys):
    from varbnn_lab import run_experiment

    config = _config("prov-retrain")
    first = run_experiment(config, out_dir=tmp_path, progress=False, command="test")
    assert first["code_hash"] == prov.code_hash(["varbnn_lab.runner"]) and first["stale_runs"] == []
    assert "dirty" in first and all("code_hash" in r for r in _lines(tmp_path / "prov-retrain_runs.jsonl"))
    other_code()
    again = run_experiment(config, out_dir=tmp_path, progress=False, command="test")
    records = _lines(tmp_path / "prov-retrain_runs.jsonl")
    assert [(r["variant"], r["code_hash"]) for r in records] == [("plain", "changed-code"), ("mf", "changed-code")]
    assert [r["variant"] for r in _lines(tmp_path / "prov-retrain_runs.stale.jsonl")] == ["plain", "mf"]
    assert again["stale_runs"] == [] and "stale" not in (tmp_path / "prov-retrain.md").read_text()
    # trained again from the start: the older code's checkpoints were renamed, not resumed
    aside = {p.name for p in tmp_path.glob(".checkpoints/*/*.stale")}
    assert {"mf-seed0.pt.stale", "plain-seed0.pt.stale", "mf-seed0.traces.json.stale"} <= aside


def test_reuse_stale_and_no_train_reuse_the_old_runs_and_flag_them_on_the_page(tmp_path, other_code):
    from varbnn_lab import run_experiment

    config = _config("prov-reuse")
    first = run_experiment(config, out_dir=tmp_path, progress=False, command="test")
    other_code()
    before = (tmp_path / "prov-reuse_runs.jsonl").read_text()
    with prov.provenance_policy(reuse_stale=True):
        reused = run_experiment(config, out_dir=tmp_path, progress=False, command="test")
    assert (tmp_path / "prov-reuse_runs.jsonl").read_text() == before  # nothing trained
    assert [(s["variant"], s["seed"], s["commit"]) for s in reused["stale_runs"]] == [
        ("plain", 0, first["commit"]), ("mf", 0, first["commit"])]  # fmt: skip
    saved = json.loads((tmp_path / "prov-reuse.json").read_text())
    assert saved["stale_runs"] == reused["stale_runs"] and saved["code_hash"] == "changed-code"
    page = (tmp_path / "prov-reuse.md").read_text()
    assert "**stale runs**: 2 run(s)" in page
    assert f"  - variant plain (seed 0): stale, from commit `{first['commit']}`, code changed since" in page
    rendered = run_experiment(config, out_dir=tmp_path, progress=False, command="test", train=False)
    assert (tmp_path / "prov-reuse_runs.jsonl").read_text() == before and len(rendered["stale_runs"]) == 2
    assert "**stale runs**" in (tmp_path / "prov-reuse.md").read_text()


def test_an_engine_experiment_flags_stale_runs_in_its_result(tmp_path, other_code):
    """Every other experiment opens its call with open_run: its provenance carries the code hash and the stale runs."""
    from varbnn_lab.engine import open_run

    runs = expand(variant=("a",), seed=(0,))
    call = open_run("toy", tmp_path, "cpu", False, 1)
    call.execute(runs, lambda key: _toy_run([], key), _toy(tmp_path))
    info = call.provenance("test")
    assert info["stale_runs"] == [] and len(info["code_hash"]) == 64 and "dirty" in info
    other_code()
    call = open_run("toy", tmp_path, "cpu", False, 1)
    call.execute(runs, lambda key: _toy_run([], key), _toy(tmp_path), train=False)
    assert [(s["variant"], s["seed"]) for s in call.provenance("test")["stale_runs"]] == [("a", 0)]


# -- a dirty tree and the committed results ----------------------------------------------------------------------------


@pytest.fixture
def dirty_repo(tmp_path, monkeypatch):
    """A git checkout whose src/lib.py has an uncommitted change, taken as the lab's repository."""
    root = _git_repo(tmp_path / "repo")
    (root / "src" / "lib.py").write_text("x = 2\n")
    monkeypatch.setattr(prov, "repository_root", lambda: root)
    return root


def test_a_dirty_tree_is_refused_a_committed_results_folder_unless_allowed(dirty_repo):
    from varbnn_lab import run_experiment

    committed = dirty_repo / "benchmarks" / "results" / "prov-dirty"
    with pytest.raises(ValueError, match=r"committed results folder.*\(src/lib.py\).*--allow-dirty"):
        run_experiment(_config("prov-dirty"), out_dir=committed, progress=False, command="test")
    assert not (committed / "prov-dirty_runs.jsonl").exists()  # refused before any run
    with pytest.raises(ValueError, match="--allow-dirty"):
        from varbnn_lab.engine import open_run

        open_run("toy", committed, "cpu", False, 1)
    with prov.provenance_policy(allow_dirty=True):
        result = run_experiment(_config("prov-dirty"), out_dir=committed, progress=False, command="test")
    assert result["dirty"] is True and all(r["dirty"] is True for r in _lines(committed / "prov-dirty_runs.jsonl"))
    own = dirty_repo.parent / "mine"  # a user's own folder: allowed and recorded
    assert run_experiment(_config("prov-dirty"), out_dir=own, progress=False, command="test")["dirty"] is True


def test_the_command_names_the_dirty_files_and_its_options(dirty_repo, capsys):
    from varbnn.cli import main
    from varbnn_lab.registry import CONFIGS, register_config

    register_config(_config("prov-cli"))
    committed = dirty_repo / "benchmarks" / "results" / "prov-cli"
    try:
        with pytest.raises(SystemExit) as exit_:
            main(["reproduce", "prov-cli", "--out", str(committed), "--no-progress"])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "src/lib.py" in err and "--allow-dirty" in err and "committed results folder" in err
        assert main(["reproduce", "prov-cli", "--out", str(committed), "--no-progress", "--allow-dirty"]) == 0
        assert all(r["dirty"] is True for r in _lines(committed / "prov-cli_runs.jsonl"))
        (dirty_repo / "src" / "lib.py").write_text("x = 1\n")  # clean again; the code hash differs from the runs'
        before = (committed / "prov-cli_runs.jsonl").read_text()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(prov, "code_hash", lambda modules=(): "changed-code")
            assert main(["reproduce", "prov-cli", "--out", str(committed), "--no-progress", "--reuse-stale"]) == 0
            assert (committed / "prov-cli_runs.jsonl").read_text() == before
            assert "**stale runs**" in (committed / "prov-cli.md").read_text()
            assert main(["reproduce", "prov-cli", "--out", str(committed), "--no-progress"]) == 0
            assert {r["code_hash"] for r in _lines(committed / "prov-cli_runs.jsonl")} == {"changed-code"}
            assert "**stale runs**" not in (committed / "prov-cli.md").read_text()
    finally:
        CONFIGS.pop("prov-cli")
