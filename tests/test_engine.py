"""The experiment engine on a toy experiment: expansion, shards, workers, the record store, kill and resume."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from varbnn_lab.engine import (
    RunStore,
    check_workers,
    config_fields,
    execute,
    expand,
    fingerprint,
    parse_shard,
    provenance,
    select_shard,
)

sys.path.insert(0, str(Path(__file__).parent))
from engine_toy import PROTOCOL, toy_run, toy_runs, toy_store  # noqa: E402

CPU = torch.device("cpu")


def _records(out: Path, name: str = "toy_runs.jsonl") -> list[dict]:
    return [json.loads(line) for line in (out / name).read_text().splitlines()]


def _strip(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in ("commit", "device")}


def test_expand_varies_the_first_factor_slowest():
    assert expand(variant=("a", "b"), seed=(0, 1, 2)) == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1), ("b", 2)]
    assert expand(variant=("a",), split=range(2), task=("x",)) == [("a", 0, "x"), ("a", 1, "x")]


def test_shards_partition_the_runs():
    runs = expand(variant=("a", "b", "c"), seed=range(7))
    for n in (1, 2, 3, 5, 21, 30):
        shares = [select_shard(runs, (k, n)) for k in range(n)]
        assert sorted(r for share in shares for r in share) == sorted(runs)  # every run exactly once
    assert select_shard(runs, None) == runs
    for bad in ((2, 2), (-1, 2), (0, 0), (1,), (True, 2)):
        with pytest.raises(ValueError, match="shard must be"):
            select_shard(runs, bad)  # type: ignore[arg-type]
    assert parse_shard("1/4") == (1, 4)
    for text in ("3/2", "a/b", "1", "1/2/3", "-1/2"):
        with pytest.raises(ValueError, match=r"--shard must be K/N"):
            parse_shard(text)


def test_check_workers_names_the_argument():
    check_workers(1, CPU)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="workers must be a positive integer"):
            check_workers(bad, CPU)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="workers > 1 runs CPU processes"):
        check_workers(2, torch.device("meta"))


def test_execute_records_each_run_once_and_skips_what_is_done(tmp_path):
    calls = tmp_path / "calls"
    run = functools.partial(toy_run, str(calls), 0.0)
    done = execute(toy_runs()[:3], run, toy_store(tmp_path), device=CPU, commit="c1")
    assert sorted(done) == sorted(toy_runs()[:3])
    done = execute(toy_runs(), run, toy_store(tmp_path), device=CPU, commit="c2")
    assert sorted(done) == sorted(toy_runs())
    assert len(calls.read_text().splitlines()) == len(toy_runs())  # nothing redone
    records = _records(tmp_path)
    assert [r["commit"] for r in records] == ["c1"] * 3 + ["c2"] * 3
    assert all(r["protocol"] == PROTOCOL for r in records)
    # a record of another protocol is kept in the file but does not count
    with (tmp_path / "toy_runs.jsonl").open("a") as handle:
        handle.write(json.dumps({"variant": "zz", "seed": 0, "protocol": "other"}) + "\n")
    assert ("zz", 0) not in toy_store(tmp_path).load()


def test_shard_files_are_merged_on_read_and_equal_one_process(tmp_path):
    run = functools.partial(toy_run, None, 0.0)
    whole = execute(toy_runs(), run, toy_store(tmp_path / "one"), device=CPU, commit="c")
    for k in range(4):
        store = toy_store(tmp_path / "shared", (k, 4))
        execute(select_shard(toy_runs(), (k, 4)), run, store, device=CPU, commit="c")
        assert store.path.name == f"toy_runs.shard{k}.jsonl"
    merged = toy_store(tmp_path / "shared").load()
    assert {k: _strip(v) for k, v in merged.items()} == {k: _strip(v) for k, v in whole.items()}


def test_workers_give_the_records_of_one_process(tmp_path):
    run = functools.partial(toy_run, None, 0.0)
    one = execute(toy_runs(), run, toy_store(tmp_path / "one"), device=CPU, commit="c")
    two = execute(toy_runs(), run, toy_store(tmp_path / "two"), device=CPU, workers=2, commit="c")
    assert {k: _strip(v) for k, v in two.items()} == {k: _strip(v) for k, v in one.items()}
    assert all(r["device"].endswith("(worker process)") for r in two.values())


def test_a_cut_short_last_line_is_skipped_then_removed_before_the_next_record(tmp_path):
    store = toy_store(tmp_path)
    run = functools.partial(toy_run, None, 0.0)
    execute(toy_runs()[:1], run, store, device=CPU, commit="c")
    with store.path.open("a") as handle:
        handle.write('{"variant": "bb", "se')  # a write killed half-way
    with pytest.warns(UserWarning, match="cut short"):
        execute(toy_runs()[:2], run, store, device=CPU, commit="c")
    lines = store.path.read_text().splitlines()  # the torn line is gone
    assert [(json.loads(line)["variant"], json.loads(line)["seed"]) for line in lines] == [("a", 0), ("a", 1)]
    with open(store.path, "a") as handle:
        handle.write("not json\n")
    with pytest.warns(UserWarning, match="cut short"):
        execute(toy_runs()[:3], run, store, device=CPU, commit="c")  # a bad line in the middle: an error on the next read
    with pytest.raises(ValueError, match="line 3: not a JSON record"):
        store.load()


def test_kill_and_resume_loses_only_the_run_in_progress(tmp_path):
    """Kill the toy experiment's process (SIGKILL) after two runs have finished; a rerun redoes none of them and ends
    with the records of an uninterrupted run."""
    script = Path(__file__).parent / "engine_toy.py"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1] / "src"), os.environ.get("PYTHONPATH")])),
    }
    killed, calls = tmp_path / "killed", tmp_path / "calls"
    process = subprocess.Popen([sys.executable, str(script), str(killed), str(calls), "0.5"], env=env)
    runs_file = killed / "toy_runs.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if runs_file.exists() and len(runs_file.read_text().splitlines()) >= 2:
            break
        if process.poll() is not None:
            pytest.fail("the toy experiment ended before it could be killed")
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    finished = {(r["variant"], r["seed"]) for r in _records(killed)}
    assert 2 <= len(finished) < len(toy_runs())
    before = len(calls.read_text().splitlines())
    subprocess.run([sys.executable, str(script), str(killed), str(calls), "0"], env=env, check=True)
    again = [tuple(json.loads(line)) for line in calls.read_text().splitlines()[before:]]
    assert not finished & set(again)  # no finished run was redone
    assert len(again) == len(toy_runs()) - len(finished)
    whole = tmp_path / "whole"
    subprocess.run([sys.executable, str(script), str(whole), str(tmp_path / "calls2"), "0"], env=env, check=True)
    key = lambda r: (r["variant"], r["seed"])  # noqa: E731
    assert sorted(map(_strip, _records(killed)), key=key) == sorted(map(_strip, _records(whole)), key=key)


def test_workers_end_soon_after_their_invocation_is_killed(tmp_path):
    """SIGKILL the process that runs the toy experiment in 2 worker processes while both workers are inside a long run:
    the workers notice that their parent is gone and exit (no orphans training runs nobody can record)."""
    script = Path(__file__).parent / "engine_toy.py"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1] / "src"), os.environ.get("PYTHONPATH")])),
    }
    calls = tmp_path / "calls"
    pids_file = Path(f"{calls}.pids")
    process = subprocess.Popen([sys.executable, str(script), str(tmp_path / "out"), str(calls), "60", "2"], env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (pids_file.exists() and len(pids_file.read_text().split()) >= 2):
        if process.poll() is not None:
            pytest.fail("the toy experiment ended before it could be killed")
        time.sleep(0.05)
    workers = [int(p) for p in pids_file.read_text().split()]
    assert len(workers) == 2 and process.pid not in workers
    process.send_signal(signal.SIGKILL)
    process.wait()

    def alive(pid: int) -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        return state != "Z"  # a zombie has exited

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(alive(pid) for pid in workers):
        time.sleep(0.1)
    assert not any(alive(pid) for pid in workers), "worker processes outlived their killed parent"
    assert not (tmp_path / "out" / "toy_runs.jsonl").exists()  # no run finished: nothing was recorded


def test_provenance_is_the_same_for_every_page():
    start = time.perf_counter()
    info = provenance("varbnn reproduce x", "abc", "cpu: test", start)
    assert list(info) == ["command", "commit", "device", "seconds"] and info["seconds"] >= 0
    assert provenance(None, "abc", "cpu", start)["command"].startswith("varbnn")


def _digits_config(name: str = "runner-engine"):
    from varbnn_lab import ExperimentConfig, Variant

    return ExperimentConfig(
        name=name,
        description="",
        dataset="digits",
        model="mlp",
        model_options={"in_features": 64, "hidden": (8,), "out_features": 10},
        variants=(Variant("plain", family="plain"), Variant("mf", family_options={"init_std": 1e-2})),
        epochs=1,
        batch_size=256,
        seeds=(0, 1),
        eval_samples=2,
        resumable=True,
        figures=("reliability",),
    )


def test_the_generic_runner_keeps_one_record_per_run_and_shards_like_a_single_run(tmp_path):
    from varbnn_lab import run_experiment

    config = _digits_config()
    whole = run_experiment(config, out_dir=tmp_path / "whole", progress=False, command="test")
    records = _records(tmp_path / "whole", "runner-engine_runs.jsonl")
    assert [(r["variant"], r["seed"]) for r in records] == [("plain", 0), ("mf", 0), ("plain", 1), ("mf", 1)]  # seed by seed
    assert (tmp_path / "whole" / "runner-engine_reliability.png").exists()
    # a rerun trains nothing: the records are read back, the figures rebuilt from the first seed's saved data
    again = run_experiment(config, out_dir=tmp_path / "whole", progress=False, command="test")
    assert len(_records(tmp_path / "whole", "runner-engine_runs.jsonl")) == 4 and again["figures"] == whole["figures"]
    # two shards, then only rendering: the same rows as the single run
    for k in (0, 1):
        part = run_experiment(config, out_dir=tmp_path / "sharded", progress=False, shard=(k, 2))
        assert part["rows"] == [] and part["runs_file"].endswith(f"runner-engine_runs.shard{k}.jsonl")
    merged = run_experiment(config, out_dir=tmp_path / "sharded", progress=False, command="test", train=False)
    for row, other in zip(whole["rows"], merged["rows"], strict=True):
        for key in ("variant", "seeds", "accuracy", "nll", "ece"):
            assert row[key] == other[key], key
    assert merged["figures"] == whole["figures"]


def test_the_generic_runner_is_refused_a_bad_shard_and_workers_on_an_accelerator(tmp_path):
    from varbnn_lab import run_experiment

    with pytest.raises(ValueError, match="shard must be"):
        run_experiment(_digits_config(), out_dir=tmp_path, progress=False, shard=(2, 2))
    with pytest.raises(ValueError, match="workers must be a positive integer"):
        run_experiment(_digits_config(), out_dir=tmp_path, progress=False, workers=0)


def test_the_generic_runner_killed_mid_run_resumes_from_its_epoch_checkpoint(tmp_path, data_dir):
    """SIGKILL `varbnn reproduce` after the first epoch checkpoint of a resumable run; the rerun continues from that
    epoch (it does not start over) and ends with exactly the scores of an uninterrupted run."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1] / "src"), os.environ.get("PYTHONPATH")])),
    }
    overrides = ["--set", "epochs=3", "--set", "train_limit=800", "--set", "test_limit=200", "--set", "eval_samples=2",
                 "--set", "resumable=True", "--set", "figures=()", "--variants", "MeanField"]  # fmt: skip

    def command(out: Path) -> list[str]:
        return [sys.executable, "-m", "varbnn.cli", "reproduce", "uncertainty-fmnist", "--quick", "--out", str(out),
                "--data-dir", str(data_dir), "--no-progress", "--threads", "1", *overrides]  # fmt: skip

    killed = tmp_path / "killed"
    process = subprocess.Popen(command(killed), env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(killed.glob(".checkpoints/*/MeanField-seed0.pt")):
        if process.poll() is not None:
            pytest.fail("the run ended before it could be killed")
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    from varbnn.training import read_checkpoint

    (checkpoint,) = killed.glob(".checkpoints/*/MeanField-seed0.pt")
    assert 1 <= read_checkpoint(checkpoint)["epoch"] < 3  # killed mid-run, after an epoch checkpoint
    assert not (killed / "uncertainty-fmnist_runs.jsonl").exists() or not _records(killed, "uncertainty-fmnist_runs.jsonl")
    subprocess.run(command(killed), env=env, check=True, capture_output=True)
    whole = tmp_path / "whole"
    subprocess.run(command(whole), env=env, check=True, capture_output=True)
    name = "uncertainty-fmnist_runs.jsonl"
    (resumed,), (uninterrupted,) = _records(killed, name), _records(whole, name)
    a, b = resumed["scores"][0][1], uninterrupted["scores"][0][1]
    for key in ("accuracy", "nll", "ece", "brier", "final_train_loss", "ood_auroc_entropy"):
        assert a[key] == b[key], key


def test_open_run_and_invocation_write_what_every_run_function_writes(tmp_path):
    from varbnn_lab.engine import describe_device, open_run

    call = open_run("toy", tmp_path / "out", "cpu", False, 1)
    assert call.out == tmp_path / "out" and call.out.is_dir() and call.device == CPU and call.world == 1
    assert call.device_text() == describe_device(CPU) and call.progress(True) and not call.progress(False)
    assert dataclasses.replace(call, world=2).device_text("DDP") == describe_device(CPU) + " x 2 processes (DDP)"
    result = {"name": "toy", **call.provenance("varbnn reproduce toy"), "path": tmp_path}
    assert result["command"] == "varbnn reproduce toy" and result["device"] == call.device_text()
    path = call.write_result(result)
    assert path == call.out / "toy.json"
    assert path.read_text() == json.dumps(result, indent=2, default=str) + "\n"
    with pytest.raises(TypeError):
        call.write_result(result, default=None)
    assert call.write_page(result, "# toy\n") is result and (call.out / "toy.md").read_text() == "# toy\n"
    done = call.execute(toy_runs(), functools.partial(toy_run, None, 0.0), toy_store(call.out))
    assert set(done) == set(toy_runs()) and all(r["commit"] == call.commit for r in done.values())


def test_fingerprint_is_the_sha1_of_sorted_json_and_config_fields_drop_what_is_named():
    import hashlib

    data = {"b": (1, 2), "a": Path("x")}
    digest = hashlib.sha1(b'{"a": "x", "b": [1, 2]}').hexdigest()
    assert fingerprint(data) == digest[:10] and fingerprint(data, 16) == digest[:16] and fingerprint(data, None) == digest
    assert fingerprint({"a": 1, "b": 2}) == fingerprint({"b": 2, "a": 1}) != fingerprint({"a": 1, "b": 3})

    @dataclasses.dataclass(frozen=True)
    class Config:
        name: str = "n"
        seeds: tuple[int, ...] = (0,)
        lr: float = 1e-3

    assert config_fields(Config(), drop=("name", "seeds")) == {"lr": 1e-3}
    assert fingerprint(config_fields(Config(name="other", seeds=(5,)), drop=("name", "seeds"))) == fingerprint({"lr": 1e-3})
    with pytest.raises(KeyError):
        config_fields(Config(), drop=("epochs",))  # a misspelt field is an error, not a silently different hash


def test_a_keyed_store_takes_one_hash_or_one_per_first_field(tmp_path):
    one = RunStore.keyed(tmp_path, "toy", ("variant", "seed"), PROTOCOL)
    for record in ({"variant": "a", "seed": 0, "protocol": PROTOCOL}, {"variant": "b", "seed": 1, "protocol": "old"}):
        one.append(record)
    assert list(one.load()) == [("a", 0)]
    per_variant = RunStore.keyed(tmp_path, "toy", ("variant", "seed"), {"a": "other", "b": "old"}, shard=(1, 2))
    assert list(per_variant.load()) == [("b", 1)]  # "a" carries another hash; an unknown variant would not count
    assert per_variant.path.name == "toy_runs.shard1.jsonl"


def test_invocation_execute_runs_its_shard_or_nothing_and_writes_only_unsharded(tmp_path, capsys):
    from varbnn_lab.engine import open_run

    call = open_run("toy", tmp_path, "cpu", False, 1)
    run = functools.partial(toy_run, None, 0.0)
    report = call.reporter(True, lambda key, record: f"{key[0]} {key[1]}")
    done = call.execute(toy_runs(), run, toy_store(tmp_path, (0, 2)), report, shard=(0, 2))
    assert sorted(done) == sorted(toy_runs()[0::2])
    assert capsys.readouterr().err.splitlines() == [f"[toy] {v} {s}" for v, s in toy_runs()[0::2]]
    assert call.execute(toy_runs(), run, toy_store(tmp_path), train=False) == toy_store(tmp_path).load()  # reads only
    assert len(toy_store(tmp_path).load()) == 3
    assert call.writes() and not call.writes((0, 2))
    call.reporter(False, lambda key, record: "never")(("a", 0), {})
    assert capsys.readouterr().err == ""


def test_best_state_keeps_the_lowest_score_and_restores_it():
    from varbnn_lab.hooks import BestState

    model = torch.nn.Linear(2, 1)
    start = model.weight.detach().clone()
    best = BestState(model)
    for epoch, score in enumerate((3.0, 1.0, 1.0, float("nan"), 2.0), 1):
        with torch.no_grad():
            model.weight.fill_(epoch)
        best.offer(epoch, score)
    assert best.restore() == 2 and best.score == 1.0 and torch.all(model.weight == 2.0)  # the tie keeps the earlier epoch
    untouched = BestState(model)
    with torch.no_grad():
        model.weight.fill_(9.0)
    assert untouched.offer(1, float("nan")) is False and untouched.restore() == 0 and torch.all(model.weight == 2.0)
    lazy = BestState(model, from_start=False)
    with torch.no_grad():
        model.weight.copy_(start)
    assert lazy.restore() == 0 and torch.equal(model.weight, start)  # nothing offered: the model is left as it is
