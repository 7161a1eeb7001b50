"""Issue 61, fourth audit, the engine's part: a worker's run that raises ``SystemExit`` or ``KeyboardInterrupt`` is a
failed run and loses no other run's record; Ctrl-C stops the workers at once and keeps every finished run;
``--no-train`` into a folder without runs says so before any data is loaded, for every kind of experiment; ``--shard``
refuses an empty or malformed value; a run's record that does not carry its own run key is a failed run."""

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
from typing import Any

import pytest
import torch

import varbnn
import varbnn_lab
from varbnn_lab.engine import RunsFailed, RunStore, execute

sys.path.insert(0, str(Path(__file__).parent))
from bad_input_table import BadInput, check, params  # noqa: E402
from engine_toy import PROTOCOL, toy_run, toy_runs, toy_store  # noqa: E402

CPU = torch.device("cpu")
SRC = Path(varbnn.__file__).resolve().parents[1]  # the varbnn under test, for a subprocess
LAB = Path(varbnn_lab.__file__).resolve().parents[1]  # and the lab under test


def _keys(path: Path) -> list[tuple[str, int]]:
    return [(r["variant"], r["seed"]) for r in map(json.loads, path.read_text().splitlines())]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# -- item 1: a BaseException in a worker's run; Ctrl-C ----------------------------------------------------------------


def exiting_run(key: tuple[str, int]) -> dict[str, Any]:
    """``toy_run``, except that the run ``("bb", 0)`` raises ``SystemExit`` and ``("ccc", 1)`` ``KeyboardInterrupt``."""
    if tuple(key) == ("bb", 0):
        raise SystemExit(f"planted exit of run {key!r}")
    if tuple(key) == ("ccc", 1):
        raise KeyboardInterrupt(f"planted interrupt of run {key!r}")
    return toy_run(None, 0.0, key)


def test_a_run_raising_a_base_exception_in_a_worker_is_a_failed_run(tmp_path, capsys):
    """Item 1: with workers=2, a run raising SystemExit re-raised it at once while the pool ran every queued run to its
    end, then threw their records away (1 of 6 saved). Now a run's SystemExit or KeyboardInterrupt in a worker is a
    failed run (key + traceback) and every other run is recorded."""
    store = toy_store(tmp_path)
    with pytest.raises(RunsFailed, match=r"2 run\(s\) of toy failed: \('bb', 0\), \('ccc', 1\)") as info:
        execute(toy_runs(), exiting_run, store, device=CPU, workers=2, commit="c")
    assert sorted(_keys(store.path)) == [("a", 0), ("a", 1), ("bb", 1), ("ccc", 0)]  # the 4 others, all recorded
    assert "SystemExit: planted exit of run ('bb', 0)" in info.value.failed[("bb", 0)]
    assert "KeyboardInterrupt: planted interrupt of run ('ccc', 1)" in info.value.failed[("ccc", 1)]
    err = capsys.readouterr().err
    assert "[toy] run ('bb', 0) failed (the other runs go on)" in err and "planted exit" in err
    assert "[toy] run ('ccc', 1) failed (the other runs go on)" in err and "planted interrupt" in err


def slow_run(calls: str, key: tuple[str, int]) -> dict[str, Any]:
    """``toy_run``: the variant ``"a"``'s runs at once, the others in 120 s (still running when Ctrl-C comes)."""
    return toy_run(calls, 0.0 if key[0] == "a" else 120.0, key)


_CTRL_C_SCRIPT = """
import functools, sys, torch
sys.path.insert(0, {tests!r})
from engine_toy import toy_runs, toy_store
from test_faults_fourth_audit_engine import slow_run
from varbnn_lab.engine import execute
execute(toy_runs(), functools.partial(slow_run, {calls!r}), toy_store({out!r}), device=torch.device("cpu"), commit="c",
        workers=2)
"""


@pytest.mark.slow  # timing-dependent: in one fresh-clone run under load the interrupted parent printed nothing and did
# not end within 30 s (it passed alone and beside two busy processes, 5 of 5): kept out of CI's run until that is found
def test_ctrl_c_stops_the_workers_at_once_and_keeps_every_finished_run(tmp_path):
    """Item 1: Ctrl-C (SIGINT to the whole process group, as a terminal sends it) with workers=2 left the pool running
    the queued runs to their end (each worker took the next queued run once its own was interrupted). Now the parent
    cancels the queue and ends its workers at once, keeping the records of the runs that finished."""
    calls = tmp_path / "calls"
    script = _CTRL_C_SCRIPT.format(tests=str(Path(__file__).parent), calls=str(calls), out=str(tmp_path))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(LAB)])}
    process = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True, stderr=subprocess.PIPE,
                               text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:  # both fast runs saved, two slow runs started
            started = calls.read_text().splitlines() if calls.exists() else []
            saved = (tmp_path / "toy_runs.jsonl").read_text().splitlines() if (tmp_path / "toy_runs.jsonl").exists() else []
            if len(started) >= 4 and len(saved) == 2:
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"the toy runs did not start as planned: {process.poll()=}")
        os.killpg(process.pid, signal.SIGINT)
        _, err = process.communicate(timeout=30)  # the slow runs take 120 s each: it stopped them
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode != 0 and "KeyboardInterrupt" in err
    assert "[toy] interrupted: 4 run(s) in progress or queued were stopped; every finished run is saved" in err
    assert sorted(_keys(tmp_path / "toy_runs.jsonl")) == [("a", 0), ("a", 1)]
    pids = {int(p) for p in Path(f"{calls}.pids").read_text().split()}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)
    assert "Process SpawnProcess" not in err  # no worker died in its queue with a traceback of its own


# -- item 2: --no-train into an empty folder, before any data is loaded ------------------------------------------------


def _kinds() -> list[str]:
    """One experiment per run function the CLI dispatches to (the generic runner's: mnist-mlp)."""
    from varbnn_lab.catalog import experiments

    chosen: dict[str, str] = {}
    for name, spec in sorted(experiments().items()):
        if spec.generic:
            continue
        chosen.setdefault(spec.run.__name__, name)
    return ["mnist-mlp", *chosen.values()]


@pytest.mark.parametrize("shard", [[], ["--shard", "0/2"]], ids=["all", "shard"])
@pytest.mark.parametrize("name", _kinds())
def test_no_train_into_an_empty_folder_says_so_before_loading_data(name, shard, tmp_path, monkeypatch, capsys):
    """Item 2: `reproduce mnist-mlp --quick --no-train --out EMPTY` loaded (and tried to download) MNIST before looking
    for saved runs, then printed a traceback; graves-prune with --shard printed "wrote ...shard0.jsonl" for nothing."""
    from varbnn.cli import main
    from varbnn.data import files

    empty_data = tmp_path / "data"
    empty_data.mkdir()
    monkeypatch.setenv("VARBNN_DATA", str(empty_data))
    attempts: list[str] = []

    def no_download(url: str, *args: Any, **kwargs: Any) -> None:
        attempts.append(url)
        raise OSError("a data download was attempted")

    monkeypatch.setattr(files, "_download", no_download)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as info:
        main(["reproduce", name, "--quick", "--no-train", "--out", str(out), "--no-progress", *shard])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "none of this experiment's" in err and "nothing to render" in err and str(out) in err
    assert attempts == [] and list(empty_data.iterdir()) == []


# -- item 3: --shard -----------------------------------------------------------------------------------------------------


def _reproduce(shard: str) -> None:
    from varbnn.cli import main

    main(["reproduce", "mnist-mlp", "--quick", "--no-train", f"--shard={shard}"])  # "=": "-1/2" is not an option


SHARD_OPTIONS = [
    BadInput(f"--shard {text!r}", functools.partial(_reproduce, text), raises=SystemExit, match="2")
    for text in ("", " 0/2", "0/2 ", "0 /2", "+0/2", "0/2/3", "1/1", "2/1", "-1/2", "0/0", "a/b", "0/2x", "０/2")
]  # fmt: skip


@pytest.mark.parametrize("case", params(SHARD_OPTIONS))
def test_the_shard_option_refuses_an_empty_or_malformed_value(case, capsys):
    """Item 3: `--shard ''` (e.g. "$UNSET") was read as no shard (every run done by every machine), `' 0/2'` passed."""
    check(case)
    err = capsys.readouterr().err
    assert "argument --shard: must be K/N with integers 0 <= K < N" in err
    assert "Traceback" not in err


def test_a_good_shard_is_still_read():
    from varbnn_lab.engine import parse_shard

    assert parse_shard("0/2") == (0, 2) and parse_shard("11/12") == (11, 12)


# -- item 4: a record that does not carry its own run key ----------------------------------------------------------------


def keyed_store(out: Path) -> RunStore:
    return RunStore.keyed(out, "toy", ("variant", "seed"), PROTOCOL)


def _forging(change: dict[str, Any], drop: tuple[str, ...], key: tuple[str, int]) -> dict[str, Any]:
    record = toy_run(None, 0.0, key)
    if tuple(key) == ("bb", 0):
        record.update(change)
        for field in drop:
            record.pop(field)
    return record


@pytest.mark.parametrize(
    ("change", "drop", "store", "match"),
    [
        ({"variant": "zzz"}, (), keyed_store, r"the record of run \('bb', 0\) has the key fields variant='zzz', seed=0: "
                                              r"the key of run \('zzz', 0\), not of \('bb', 0\)"),
        ({"variant": "zzz"}, (), toy_store, r"the record of run \('bb', 0\) has the key \('zzz', 0\): another run's"),
        ({}, ("variant",), keyed_store, r"the record of run \('bb', 0\) lacks the key field\(s\) variant "
                                        r"\(fields variant, seed\)"),
        ({}, ("variant",), toy_store, r"the record of run \('bb', 0\) lacks the key field 'variant'"),
    ],
    ids=["other-key-named-fields", "other-key", "no-key-field-named", "no-key-field"],
)  # fmt: skip
def test_a_record_that_does_not_carry_its_run_key_is_a_failed_run(tmp_path, capsys, change, drop, store, match):
    """Item 4: a record whose key fields differ from its run's was saved under the other key (("zzz", 0) for ("bb", 0)),
    so that run was redone on every invocation; one without the key fields raised a bare KeyError: 'variant'."""
    runs_store = store(tmp_path)
    run = functools.partial(_forging, change, drop)
    with pytest.raises(RunsFailed, match=r"1 run\(s\) of toy failed: \('bb', 0\)") as info:
        execute(toy_runs(), run, runs_store, device=CPU, commit="c")
    assert sorted(_keys(runs_store.path)) == sorted(k for k in toy_runs() if k != ("bb", 0))  # nothing under "zzz"
    text = info.value.failed[("bb", 0)]
    assert "ValueError" in text and "a run's record must carry its own run key" in text
    import re

    assert re.search(match, text), text
    assert "[toy] run ('bb', 0) failed" in capsys.readouterr().err


def test_a_record_with_its_own_key_is_saved_as_before(tmp_path):
    store = keyed_store(tmp_path)
    done = execute(toy_runs(), functools.partial(toy_run, None, 0.0), store, device=CPU, commit="c")
    assert sorted(done) == sorted(toy_runs()) and sorted(store.load()) == sorted(toy_runs())


def test_a_run_returning_something_else_than_a_record_is_a_failed_run(tmp_path):
    def run(key: tuple[str, int]) -> Any:
        return [key[0], key[1]] if key == ("a", 0) else toy_run(None, 0.0, key)

    with pytest.raises(RunsFailed, match=r"\('a', 0\)") as info:
        execute(toy_runs(), run, toy_store(tmp_path), device=CPU, commit="c")
    assert "run ('a', 0) returned list, not a record" in info.value.failed[("a", 0)]


def test_a_record_its_store_would_refuse_on_load_is_a_failed_run_not_a_poisoned_file(tmp_path):
    """A record that fails the store's ``check`` was appended, and every later load of the runs file then failed on
    it: now it is a failed run and the file keeps loading."""
    store = dataclasses.replace(toy_store(tmp_path), check=lambda record: "no 'score'" if "score" not in record else None)

    def run(key: tuple[str, int]) -> Any:
        record = toy_run(None, 0.0, key)
        if key != ("a", 0):
            record["score"] = 1.0
        return record

    with pytest.raises(RunsFailed, match=r"\('a', 0\)") as info:
        execute(toy_runs(), run, store, device=CPU, commit="c")
    assert "is not usable: no 'score'; not saved" in info.value.failed[("a", 0)]
    assert ("a", 0) not in store.load() and len(store.load()) == len(toy_runs()) - 1


def test_a_failing_on_record_callback_does_not_fail_a_saved_run(tmp_path):
    store = toy_store(tmp_path)

    def on_record(key: tuple[str, int], record: dict[str, Any]) -> None:
        raise RuntimeError("a callback's bug")

    with pytest.warns(UserWarning, match=r"on_record failed after run .* was saved: RuntimeError: a callback's bug"):
        done = execute(toy_runs(), functools.partial(toy_run, None, 0.0), store, device=CPU, commit="c",
                       on_record=on_record)  # fmt: skip
    assert sorted(done) == sorted(store.load()) == sorted(toy_runs())
