"""The experiment engine: what every ``varbnn reproduce NAME`` shares, written once.

An experiment declares its runs (each a frozen key of plain values, e.g. ``(variant, seed)`` or ``(dataset, variant,
split)``, expanded from its config's factors by :func:`expand`) and a function that trains and evaluates one run and
returns its record (a JSON-able dict). The engine

- keeps the records in ``OUT/NAME_runs.jsonl`` (:class:`RunStore`): one JSON line per finished run, tagged with the
  protocol hash of the config's training fields, so a rerun of the same command skips what is done and a killed
  invocation loses at most the run in progress (inside a run, per-epoch checkpoints stay :func:`varbnn.training.fit`'s);
  shard files ``NAME_runs.shardK.jsonl`` are merged on read;
- runs the pending runs in this process, in ``workers`` spawned processes of one thread each, or only the ``shard``
  ``(K, N)`` share of them (every N-th run from the K-th of the fixed order: the shards partition the runs) for N
  processes or machines (:func:`execute`, :func:`select_shard`);
- writes the same provenance (command, commit, device, seconds) on every page (:func:`provenance`);
- tags every record with the code that made it (``code_hash``, ``dirty``: :mod:`varbnn_lab.provenance`) and retrains a
  record made by other code (stale) unless told to reuse it, moving the old record to ``NAME_runs.stale.jsonl``;
- opens every ``run_*`` function's call the same way (:func:`open_run`: start time, commit, device, results folder)
  and writes its ``NAME.json`` and ``NAME.md`` the same way (:class:`Invocation`).

The experiment module keeps only its protocol: its config, its run function and its paper-specific evaluation.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import itertools
import json
import multiprocessing
import os
import platform
import re
import shlex
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from varbnn._checks import as_bool
from varbnn_lab.config import results_dir

__all__ = [
    "RunKey",
    "RunStore",
    "RunsFailed",
    "failure_policy",
    "nothing_saved",
    "fingerprint",
    "config_fields",
    "expand",
    "select_shard",
    "parse_shard",
    "check_workers",
    "worker_pool",
    "execute",
    "provenance",
    "read_result",
    "default_command",
    "git_commit",
    "describe_device",
    "processes",
    "for_this_rank",
    "Invocation",
    "open_run",
]

RunKey = tuple[Any, ...]
"""One run: a tuple of plain values (str, int, float) naming it within its experiment, e.g. ``("yacht", "radial", 3)``."""


def fingerprint(data: Any, length: int | None = 10) -> str:
    """A protocol hash: the SHA-1 of ``data`` as JSON with sorted keys (what JSON cannot hold written as its ``str``),
    its first ``length`` hex digits (all 40 for ``None``). Every experiment's records are keyed by one of these."""
    digest = hashlib.sha1(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()
    return digest if length is None else digest[:length]


def config_fields(config: Any, drop: Iterable[str] = ()) -> dict[str, Any]:
    """The fields of the dataclass ``config`` as a dict (:func:`dataclasses.asdict`) without those named in ``drop``
    (fields that do not change how a run trains or is evaluated: its name, the seeds, the list of variants, ...): what a
    protocol hash is taken over, after any experiment-specific adjustment."""
    data = dataclasses.asdict(config)
    for key in drop:
        data.pop(key)
    return data


def expand(**factors: Iterable[Any]) -> list[RunKey]:
    """Every combination of the factors' values, in a fixed order (the first factor varies slowest): the runs of an
    experiment whose config varies, e.g., ``variant=labels, seed=seeds``. Order matters: it fixes the shards."""
    return [tuple(values) for values in itertools.product(*(list(v) for v in factors.values()))]


def select_shard(runs: Sequence[Any], shard: tuple[int, int] | None) -> list[Any]:
    """The ``shard = (k, n)`` share of ``runs``: every n-th run from the k-th (0-based); all of them for ``None``. Over
    k = 0..n-1 the shares partition the runs (each exactly once), whatever is already done."""
    if shard is None:
        return list(runs)
    if not (
        isinstance(shard, tuple)
        and len(shard) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in shard)
        and 0 <= shard[0] < shard[1]
    ):
        raise ValueError(f"shard must be (k, n) with 0 <= k < n, got {shard!r}")
    return list(runs)[shard[0] :: shard[1]]


_SHARD_TEXT = re.compile(r"([0-9]+)/([0-9]+)")


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` (the ``--shard`` option) as ``(K, N)``: exactly two non-negative integers in ASCII digits with a slash
    between them and nothing else (no spaces, signs or an empty value), 0 <= K < N; anything else is a ``ValueError``
    naming ``--shard`` and the form ``K/N``."""
    found = _SHARD_TEXT.fullmatch(text) if isinstance(text, str) else None
    if found is None or not 0 <= int(found[1]) < int(found[2]):
        raise ValueError(
            f"--shard must be K/N with integers 0 <= K < N (e.g. 0/2 and 1/2 for two processes or machines), got {text!r}"
        )
    return int(found[1]), int(found[2])


def check_workers(workers: int, device: torch.device) -> None:
    """``workers`` must be a positive integer, and more than one only on the CPU (they are CPU processes)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}")
    if workers > 1 and device.type != "cpu":
        raise ValueError(f"workers > 1 runs CPU processes; got device {device} (use workers=1 on an accelerator)")


_SHARD_FILE = re.compile(r"_runs(\.shard\d+)?\.jsonl$")


@dataclass(frozen=True)
class RunStore:
    """The finished runs of experiment ``name`` in folder ``out``.

    ``key(record)`` names a record's run; ``protocol(key)`` is the protocol hash a record of that run must carry to
    count (``None``: a run this config does not know). Records whose hash differs were trained under another protocol
    and are ignored (kept in the file); so is a record that lacks a field of the key (``key`` raises ``KeyError``).
    Writes go to ``NAME_runs.jsonl``, or ``NAME_runs.shardK.jsonl`` for shard K, so that shards on one shared folder
    never write to one file; reads merge every such file (sorted by name; for a run found twice, the last record read
    wins). Appends hold an exclusive lock on the file (``fcntl.flock``, where the platform has it), so that two
    processes appending to one file (e.g. the same shard started twice) never cut or interleave each other's lines."""

    out: Path
    name: str
    key: Callable[[Mapping[str, Any]], RunKey]
    protocol: Callable[[RunKey], str | None]
    shard: tuple[int, int] | None = None
    readonly: bool = False
    """A store that never writes (:meth:`append` does nothing): the processes other than rank 0 of a distributed run."""
    check: Callable[[Mapping[str, Any]], str | None] | None = None
    """What a record of this protocol must hold beyond its key (``None``: anything): ``check(record)`` returns ``None``
    for a usable record, else what is wrong with it; :meth:`load` then raises a ``ValueError`` naming the file and line
    (rather than an unclear error where the page reads the record)."""
    fields: tuple[str, ...] | None = None
    """The names of the record fields that ``key`` reads, in the key's order (``None``: not known), so that a record
    that does not match its run (:meth:`key_problem`) is named by its fields; :meth:`keyed` sets them."""

    @classmethod
    def keyed(
        cls,
        out: os.PathLike[str] | str,
        name: str,
        fields: Sequence[str],
        protocol: str | Mapping[Any, str | None],
        shard: tuple[int, int] | None = None,
    ) -> RunStore:
        """The usual store: a record's key is the tuple of its ``fields`` (e.g. ``("variant", "seed")``); ``protocol``
        is one hash for every run (a ``str``) or a hash per value of the key's first field (a mapping, e.g. one per
        variant label: a run whose first field is not in it is unknown)."""
        names = tuple(fields)
        if isinstance(protocol, str):
            text = protocol
            return cls(Path(out), name, key=lambda r: tuple(r[f] for f in names), protocol=lambda key: text, shard=shard,
                       fields=names)  # fmt: skip
        table = dict(protocol)
        return cls(Path(out), name, key=lambda r: tuple(r[f] for f in names), protocol=lambda key: table.get(key[0]),
                   shard=shard, fields=names)  # fmt: skip

    def key_problem(self, key: RunKey, record: Mapping[str, Any]) -> str | None:
        """Why ``record``, returned by run ``key``, cannot be saved as that run's record, or ``None``: it lacks a field
        of the key, or its key fields name another run (saved so, it would count for that run, and run ``key`` would
        be run again by every invocation). Each problem names the key and the fields (:attr:`fields`, where known)."""
        names = f" (fields {', '.join(self.fields)})" if self.fields else ""
        if self.fields:
            missing = [f for f in self.fields if f not in record]
            if missing:
                return f"the record of run {key!r} lacks the key field(s) {', '.join(missing)}{names}"
        try:
            found = self.key(record)
        except KeyError as error:
            return f"the record of run {key!r} lacks the key field {error}"
        except (TypeError, ValueError, IndexError) as error:
            return f"the record of run {key!r} has a key that cannot be read ({type(error).__name__}: {error})"
        if found == key:
            return None
        if self.fields and isinstance(found, tuple) and len(found) == len(self.fields):
            told = ", ".join(f"{f}={v!r}" for f, v in zip(self.fields, found))
            return f"the record of run {key!r} has the key fields {told}: the key of run {found!r}, not of {key!r}"
        return f"the record of run {key!r} has the key {found!r}{names}: another run's"

    @property
    def path(self) -> Path:
        """The file this store appends to."""
        suffix = "" if self.shard is None else f".shard{self.shard[0]}"
        return Path(self.out) / f"{self.name}_runs{suffix}.jsonl"

    def files(self) -> list[Path]:
        """Every runs file of this experiment in ``out`` (the plain one and the shards), sorted by name."""
        prefix = f"{self.name}_runs"
        return sorted(
            p for p in Path(self.out).glob(f"{_glob_escape(prefix)}*.jsonl") if _SHARD_FILE.fullmatch(p.name[len(self.name) :])
        )

    def _records(self) -> Iterator[tuple[Path, int, dict[str, Any]]]:
        """Every record of every runs file as ``(file, line number, record)``; see :meth:`load` for damaged lines."""
        for path in self.files():
            lines = path.read_bytes().split(b"\n")
            if lines and not lines[-1]:
                lines.pop()  # the file ends with a newline, as a finished write leaves it
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line.decode("utf-8"))
                except (UnicodeDecodeError, json.JSONDecodeError) as error:
                    if number == len(lines):
                        warnings.warn(f"{path}: skipping a last line cut short or damaged ({error})", stacklevel=3)
                        continue
                    raise ValueError(
                        f"{path}, line {number}: not a JSON record ({error}); repair or delete that line (every other "
                        "line is a finished run's record, read as it is)"
                    ) from error
                if not isinstance(record, dict):
                    raise ValueError(
                        f"{path}, line {number}: not a run's record (a JSON object was expected, got "
                        f"{type(record).__name__}); repair or delete that line"
                    )
                yield path, number, record

    def _key_of(self, path: Path, number: int, record: Mapping[str, Any]) -> RunKey | None:
        """``key(record)`` (``None`` when the record lacks a field of the key); a key that cannot be one (e.g. a list
        where a label belongs) is an error naming the file and line."""
        try:
            key = self.key(record)
            hash(key)
        except KeyError:
            return None  # not a record of this store's layout: like another protocol's, ignored
        except (TypeError, ValueError, IndexError) as error:
            raise ValueError(
                f"{path}, line {number}: the record's run key is not made of plain values ({type(error).__name__}: "
                f"{error}); repair or delete that line"
            ) from None
        return key

    def load(self) -> dict[RunKey, dict[str, Any]]:
        """The records of this protocol by run key. A last line cut short by a killed write (or whose bytes are not
        UTF-8 text) is skipped (with a warning); a malformed line elsewhere, a line that is not a JSON object, a run key
        of other than plain values, or (with :attr:`check`) a record of this protocol missing what it must hold is an
        error naming the file and line."""
        done: dict[RunKey, dict[str, Any]] = {}
        for path, number, record in self._records():
            key = self._key_of(path, number, record)
            if key is None:
                continue
            expected = self.protocol(key)
            if expected is not None and record.get("protocol") == expected:
                problem = self.check(record) if self.check is not None else None
                if problem is not None:
                    raise ValueError(f"{path}, line {number}: the record of run {key!r} is not usable: {problem}")
                done[key] = record
        return done

    def ignored(self) -> int:
        """How many records the files hold that :meth:`load` does not count (another protocol's, or runs this store
        does not know): what a page drawn from nothing usable says (:func:`nothing_saved`)."""
        count = 0
        for path, number, record in self._records():
            key = self._key_of(path, number, record)
            expected = None if key is None else self.protocol(key)
            count += expected is None or record.get("protocol") != expected
        return count

    def append(self, record: Mapping[str, Any]) -> None:
        """Append one finished run's record as one line. A last line cut short by a killed write (no newline at the end
        of the file) is removed first, so that it never ends up between two records. The file is locked meanwhile
        (see the class). A ``readonly`` store writes nothing."""
        if self.readonly:
            return
        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        line = (json.dumps(record) + "\n").encode()  # before the file is touched: a record JSON cannot hold fails here
        _append_line(path, line)

    @property
    def stale_path(self) -> Path:
        """Where :meth:`set_aside` moves the records made by other code: ``NAME_runs.stale.jsonl`` (never read as
        runs)."""
        return Path(self.out) / f"{self.name}_runs.stale.jsonl"

    def set_aside(self, key: RunKey, code_hash: str) -> int:
        """Move every record of run ``key`` under its protocol that was made by other code than ``code_hash`` (a
        stale record: :func:`varbnn_lab.provenance.is_stale`) out of the runs files into :attr:`stale_path`; returns
        how many. Each is appended there before its runs file is rewritten without it (atomically, under the file's
        lock): an interrupted move leaves a copy, never a loss. Nothing for a ``readonly`` store."""
        from varbnn_lab.provenance import is_stale

        if self.readonly:
            return 0
        expected = self.protocol(key)
        moved = 0
        for path in self.files():
            with path.open("rb") as handle, _locked(handle):
                data = handle.read()
                lines = data.split(b"\n")
                keep, aside = [], []
                for number, line in enumerate(lines, 1):
                    try:
                        record = json.loads(line.decode("utf-8")) if line.strip() else None
                    except (UnicodeDecodeError, json.JSONDecodeError):
                        record = None
                    if (isinstance(record, dict) and self._key_of(path, number, record) == key
                            and record.get("protocol") == expected and is_stale(record, code_hash)):  # fmt: skip
                        aside.append(line + b"\n")
                    else:
                        keep.append(line)
                if not aside:
                    continue
                for line in aside:
                    _append_line(self.stale_path, line)
                tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
                tmp.write_bytes(b"\n".join(keep))
                os.replace(tmp, path)
                moved += len(aside)
        return moved


def _append_line(path: Path, line: bytes) -> None:
    """Append ``line`` to ``path`` under an exclusive lock, first removing a last line cut short (no final newline).
    A file replaced while this waited for its lock (:meth:`RunStore.set_aside` rewrites runs files) is opened again,
    so that the line never goes to a file no longer in the folder."""
    while True:
        with path.open("ab") as handle, _locked(handle):
            try:
                same = os.path.samestat(os.fstat(handle.fileno()), os.stat(path))
            except FileNotFoundError:
                same = False
            if not same:
                continue
            size = os.fstat(handle.fileno()).st_size
            if size > 0:
                with path.open("rb") as reader:
                    data = reader.read()
                if not data.endswith(b"\n"):
                    handle.truncate(data.rfind(b"\n") + 1)
            handle.write(line)
            handle.flush()
            return


@contextlib.contextmanager
def _locked(handle: Any) -> Iterator[None]:
    """An exclusive ``flock`` on the open file ``handle`` for the duration (nothing where ``fcntl`` is missing)."""
    try:
        import fcntl
    except ImportError:  # not a POSIX platform
        yield
        return
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def nothing_saved(store: RunStore, count: int, produce: str | None = None) -> ValueError:
    """The error of a page to be drawn from saved runs only (``--no-train``) when ``store`` holds none of the
    experiment's ``count`` runs: it names the folder and the experiment, says how many records there belong to another
    protocol (e.g. trained with ``--quick`` or another ``--set``) and how to produce the runs (``produce``; default: the
    ``varbnn reproduce`` command of ``store.name`` into ``store.out``)."""
    if produce is None:
        base = store.name.removesuffix("-quick")
        quick = " --quick" if base != store.name else ""
        produce = f"run the same command without --no-train, e.g. varbnn reproduce {base}{quick} --out {store.out}"
    files = store.files()
    ignored = store.ignored() if files else 0
    found = (
        f"its runs files there ({', '.join(p.name for p in files)}) hold {ignored} record(s) of another protocol "
        "(trained with other settings, e.g. with or without --quick or another --set), which do not count"
        if files
        else f"there is no {store.name}_runs.jsonl (nor a shard of it) there"
    )
    return ValueError(
        f"train=False (--no-train): none of this experiment's {count} runs is saved in {store.out}, so there is nothing "
        f"to render: no finished runs of {store.name} were found there ({found}). Train them first ({produce}), or pass "
        "the folder that holds its _runs.jsonl as out_dir (--out)"
    )


def _glob_escape(text: str) -> str:
    """``text`` with the glob wildcards ``*?[`` escaped."""
    return re.sub(r"([*?\[])", r"[\1]", text)


def _worker_start(parent: int, poll: float = 1.0) -> None:
    """A worker process's initializer: one thread for torch, SIGINT ignored, and a watchdog that ends the worker (exit
    status 1) as soon as its parent ``parent`` is gone. A parent killed without a chance to clean up (SIGKILL, a lost
    session) would otherwise leave its workers training runs whose records nobody can write any more. Ctrl-C in a
    terminal signals every process of the foreground group: the parent alone decides what stops (it ends its workers,
    :class:`_WorkerPool`), rather than each worker failing its run or dying in its queue with a traceback of its own."""
    import signal
    import threading

    torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while True:
            time.sleep(poll)
            if os.getppid() != parent:  # re-parented: the invoking process is gone
                os._exit(1)

    threading.Thread(target=watch, name="varbnn-parent-watchdog", daemon=True).start()


class _WorkerPool(ProcessPoolExecutor):
    """A process pool whose ``with`` block, left by an exception (an error, or ``KeyboardInterrupt`` on Ctrl-C), cancels
    the queued work and ends the worker processes (:func:`_stop_pool`) instead of waiting for every queued task to run
    to its end, whose results nobody would read."""

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> bool | None:
        if exc_type is not None:
            _stop_pool(self)
        return super().__exit__(exc_type, exc_val, exc_tb)


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """``workers`` spawned processes of one thread each that end with this process (:func:`_worker_start`): the
    engine's run workers and the front points' (:func:`varbnn_lab.evaluation.front_points`). Leaving its
    ``with`` block by an exception (an error, Ctrl-C) cancels the queued tasks and ends the workers at once; a normal
    exit waits for the tasks, as :class:`~concurrent.futures.ProcessPoolExecutor` does."""
    context = multiprocessing.get_context("spawn")  # fresh interpreters: no forked torch thread pools
    return _WorkerPool(workers, mp_context=context, initializer=_worker_start, initargs=(os.getpid(),))


def _run_in_worker(
    run: Callable[[RunKey], dict[str, Any]], key: RunKey, device: torch.device
) -> tuple[RunKey, dict[str, Any], str]:
    return key, run(key), describe_device(device) + " (worker process)"


class RunsFailed(RuntimeError):
    """Some runs of an experiment raised (or their worker process died): raised by :func:`execute` after every other
    run has finished and been recorded (or, with ``fail_fast``, at once). ``failed``: each failed run's key and its
    traceback (also printed to stderr when it failed); ``not_started``: the runs a ``fail_fast`` stop left out;
    ``records``: every record the store holds (the runs found and the runs done now), as :func:`execute` returns them.
    A rerun of the same command retries exactly the failed and the left-out runs (the finished ones are skipped)."""

    def __init__(
        self,
        name: str,
        failed: Mapping[RunKey, str],
        records: Mapping[RunKey, dict[str, Any]],
        not_started: Sequence[RunKey] = (),
        path: Path | None = None,
    ) -> None:
        self.name = name
        self.failed = dict(failed)
        self.records = dict(records)
        self.not_started = list(not_started)
        stopped = f"; stopped before {len(self.not_started)} other run(s) (fail_fast)" if self.not_started else ""
        where = f" in {path}" if path is not None else ""
        super().__init__(
            f"{len(self.failed)} run(s) of {name} failed: {', '.join(repr(k) for k in self.failed)}{stopped} (each "
            f"traceback was printed when it failed). The finished runs are saved{where}; rerunning the same command "
            "runs only the failed and the left-out ones"
        )


_FAIL_FAST: contextvars.ContextVar[bool] = contextvars.ContextVar("varbnn_fail_fast", default=False)


@contextlib.contextmanager
def failure_policy(fail_fast: bool) -> Iterator[None]:
    """Within the block, :func:`execute` calls that do not say otherwise (``fail_fast=None``) stop at the first failed
    run (``True``) or let the other runs go on (``False``, the default outside any block). ``varbnn reproduce
    --fail-fast`` runs its experiment in ``failure_policy(True)``: every experiment's runs go through :func:`execute`."""
    fail_fast = as_bool(fail_fast, "fail_fast", owner="failure_policy")
    token = _FAIL_FAST.set(fail_fast)
    try:
        yield
    finally:
        _FAIL_FAST.reset(token)


def _stop_pool(pool: ProcessPoolExecutor) -> None:
    """Cancel the queued runs of ``pool`` and end its worker processes (the runs in progress: a resumable run keeps its
    epoch checkpoint for the rerun). The pool's own thread cancels the queued runs (a future cancelled from here could
    be failed again by it when the workers end, which Python 3.11 reports as an error in that thread)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()


def _collect_finished(
    futures: Mapping[Future[Any], RunKey], finished: set[RunKey], collect: Callable[[RunKey, Future[Any]], None]
) -> None:
    """``collect`` every run of a stopped pool that finished with a record and is not in ``finished`` yet (the runs
    that the stop ended or cancelled are not failures: they are left for the rerun)."""
    for future, key in futures.items():
        if key in finished or not future.done() or future.cancelled() or future.exception() is not None:
            continue
        collect(key, future)


def _failure_text(error: BaseException) -> str:
    """A failed run's traceback (a worker's, as the pool hands it back, included); a worker process that died says
    so."""
    if isinstance(error, BrokenProcessPool):
        return (
            f"{type(error).__name__}: {error}\n(a worker process died: killed by a signal or out of memory; every run "
            "in progress in the pool was stopped with it)\n"
        )
    return "".join(traceback.format_exception(error))


def execute(
    runs: Sequence[RunKey],
    run: Callable[[RunKey], dict[str, Any]],
    store: RunStore,
    *,
    device: torch.device,
    workers: int = 1,
    commit: str | None = None,
    on_record: Callable[[RunKey, dict[str, Any]], None] | None = None,
    fail_fast: bool | None = None,
    redo: Collection[RunKey] = (),
    code_hash: str | None = None,
    dirty: bool | None = None,
    reuse_stale: bool | None = None,
) -> dict[RunKey, dict[str, Any]]:
    """Run every run of ``runs`` that ``store`` does not hold yet (and those of ``redo`` even if it does) and append its
    record as soon as it finishes; returns every record of ``store`` (the runs found and the runs done now) by key.

    ``run(key)`` trains and evaluates one run and returns its record; the engine adds ``protocol``, ``commit``,
    ``device``, ``code_hash`` (default :func:`varbnn_lab.provenance.code_hash` of the module that defines ``run``) and
    ``dirty`` (default: whether :func:`varbnn_lab.provenance.dirty_files` names any file; ``None`` outside a git
    checkout). ``run`` must seed everything it draws from (each run is then independent of the order and of the process
    it runs in).

    A saved run of ``runs`` whose record was made by other code (a stale record: another or no ``code_hash``) is run
    again, and once the new record is saved the old one is moved to ``NAME_runs.stale.jsonl``
    (:meth:`RunStore.set_aside`); with ``reuse_stale`` (``None``: the :func:`~varbnn_lab.provenance.provenance_policy`
    in force, ``False`` outside any) it is kept and returned as it is.

    ``workers`` > 1 (CPU only) runs them in that many spawned processes of one thread each (``run`` must then
    be picklable: a module-level function or a ``functools.partial`` of one); this process appends each record as it
    arrives, so a killed invocation keeps every finished run, and its workers end within a second of it (they watch
    their parent). ``on_record(key, record)`` is called after each append (progress lines).

    A run that raises (in a worker process: any exception, ``SystemExit`` and ``KeyboardInterrupt`` included), whose
    record cannot be written or does not carry its own run key (:meth:`RunStore.key_problem`: saved so it would count
    for another run, and this one would be redone by every invocation), or whose worker process dies is a failed run,
    reported on stderr at once with its key and traceback. With ``fail_fast`` False the other runs go on (each recorded
    as it finishes) and :class:`RunsFailed` is raised at the end, naming the failed runs; with ``fail_fast`` True the
    queued runs are cancelled and the worker processes ended at the first failure, then :class:`RunsFailed` is raised.
    ``None`` (the default): the :func:`failure_policy` in force (``False`` outside any). Under ``torchrun`` (every rank
    trains every run together) a failure is raised at once, as it is: the ranks cannot go on apart.
    ``KeyboardInterrupt`` (Ctrl-C) or another ``BaseException`` in this process stops at once: with workers, the queued
    runs are cancelled and the worker processes ended (they ignore SIGINT themselves), every run that finished is
    recorded, and the interrupt is re-raised; in this process, the run in progress is stopped by it (the finished ones
    are recorded already)."""
    check_workers(workers, device)
    fail_fast = _FAIL_FAST.get() if fail_fast is None else fail_fast
    fail_fast = as_bool(fail_fast, "fail_fast (or None)", owner="execute")
    from varbnn_lab import provenance as prov

    code = prov.code_hash([m for m in [prov.module_of(run)] if m]) if code_hash is None else code_hash
    if dirty is None:
        files = prov.dirty_files()
        dirty = None if files is None else bool(files)
    reuse = prov.current_policy().reuse_stale if reuse_stale is None else reuse_stale
    done = store.load()
    again = set(redo)
    if not reuse:
        again |= {key for key in runs if key in done and prov.is_stale(done[key], code)}
    pending = [key for key in runs if key not in done or key in again]
    from varbnn import distributed as vdist

    distributed = vdist.is_distributed()
    if distributed:  # every rank runs rank 0's list (the ranks must train the same runs in the same order)
        import torch.distributed as dist

        shared: list[Any] = [pending]
        dist.broadcast_object_list(shared, src=0)
        pending = [tuple(key) for key in shared[0]]
    commit = git_commit() if commit is None else commit
    failed: dict[RunKey, str] = {}

    def save(key: RunKey, record: dict[str, Any], device_text: str) -> None:
        problem = store.key_problem(key, record) if isinstance(record, Mapping) else (
            f"run {key!r} returned {type(record).__name__}, not a record (a dict of JSON-able values)")  # fmt: skip
        if problem is not None:
            raise ValueError(f"{problem}; not saved (a run's record must carry its own run key)")
        problem = store.check(record) if store.check is not None else None
        if problem is not None:  # saved, it would make every later load of the runs file fail
            raise ValueError(f"the record of run {key!r} is not usable: {problem}; not saved")
        record.update(protocol=store.protocol(key), commit=commit, device=device_text, code_hash=code, dirty=dirty)
        store.append(record)
        moved = store.set_aside(key, code)
        if moved:
            print(f"[{store.name}] run {key!r}: the record made by older code moved to {store.stale_path}",
                  file=sys.stderr, flush=True)  # fmt: skip
        done[key] = record
        if on_record is not None:
            try:
                on_record(key, record)
            except Exception as error:  # noqa: BLE001 -- the run is saved: a callback's failure does not undo it
                warnings.warn(f"[{store.name}] on_record failed after run {key!r} was saved: {type(error).__name__}: {error}",
                              stacklevel=2)  # fmt: skip

    def fail(key: RunKey, error: BaseException) -> None:
        failed[key] = text = _failure_text(error)
        then = "stopping the others (fail_fast)" if fail_fast else "the other runs go on"
        print(f"[{store.name}] run {key!r} failed ({then}):\n{text}", file=sys.stderr, end="", flush=True)

    finished: set[RunKey] = set()

    def collect(key: RunKey, future: Future[tuple[RunKey, dict[str, Any], str]]) -> None:
        """Save the record of a worker's finished run, or report its failure: whatever it raised (a ``SystemExit``
        or ``KeyboardInterrupt`` of the run included: the pool hands it back as the run's result), its record's
        problem, or its worker's death (``BrokenProcessPool``)."""
        error = future.exception()  # the run's own, handed back: never raised here
        try:
            if error is None:
                save(*future.result())
        except Exception as problem:  # its record could not be saved
            error = problem
        if error is not None:
            fail(key, error)
        finished.add(key)

    if workers > 1 and len(pending) > 1:
        with worker_pool(min(workers, len(pending))) as pool:
            futures = {pool.submit(_run_in_worker, run, key, device): key for key in pending}
            stopped = False
            try:
                for future in as_completed(futures):
                    key = futures[future]
                    if future.cancelled():
                        continue
                    collect(key, future)
                    if fail_fast and key in failed:
                        stopped = True
                        _stop_pool(pool)
                        break
            except BaseException:  # this process interrupted (Ctrl-C) or exiting: stop at once, keep what finished
                _stop_pool(pool)
                _collect_finished(futures, finished, collect)
                left = len([key for key in pending if key not in finished])
                print(f"[{store.name}] interrupted: {left} run(s) in progress or queued were stopped; every finished "
                      "run is saved" + ("" if store.readonly else f" in {store.path}"), file=sys.stderr, flush=True)  # fmt: skip
                raise
            if stopped:  # a run that finished while the pool was being stopped is still recorded
                _collect_finished(futures, finished, collect)
    else:
        text = describe_device(device)
        for key in pending:
            try:
                save(key, run(key), text)
            except Exception as error:
                if distributed:
                    raise
                fail(key, error)
                if fail_fast:
                    finished.add(key)
                    break
            finished.add(key)
    if failed:
        left_out = [key for key in pending if key not in finished]
        raise RunsFailed(store.name, failed, done, left_out, None if store.readonly else store.path)
    return done


def git_commit() -> str:
    """HEAD's hash (with ``+dirty`` if tracked files outside ``benchmarks/results/`` have uncommitted changes: results
    that runs in progress append to are not code); ``$VARBNN_COMMIT`` where the tree has no git metadata (e.g. a copy
    sent to another machine); else ``unknown``."""
    if os.environ.get("VARBNN_COMMIT"):
        return os.environ["VARBNN_COMMIT"]
    try:
        root = Path(__file__).resolve().parents[2]
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results"],
            cwd=root, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def describe_device(device: torch.device) -> str:
    """``"cuda: <GPU name>"`` or ``"cpu: <processor>, <threads> threads"``."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    threads = torch.get_num_threads()
    return f"cpu: {name}, {threads} thread{'' if threads == 1 else 's'}"


def processes(device: str | torch.device | None, distributed: bool, workers: int = 1) -> tuple[torch.device, int]:
    """The device of this process and the number of processes training each run: with ``distributed`` (under
    ``torchrun``) the process group is set up (:func:`varbnn.distributed.setup`; each rank its device) and must hold
    several processes, which runs in worker processes cannot be; else ``(resolve_device(device), 1)``."""
    from varbnn import distributed as vdist
    from varbnn.training import resolve_device

    if not distributed:
        dev = resolve_device(device)
        check_workers(workers, dev)
        return dev, 1
    if workers != 1:
        raise ValueError(f"--distributed runs every run in every process: workers must be 1, got {workers}")
    context = vdist.setup(device=device if device not in (None, "auto") else None)
    if context.world_size < 2:
        raise ValueError("distributed=True needs several processes: launch with torchrun --nproc_per_node N")
    return context.device, context.world_size


def for_this_rank(store: RunStore) -> RunStore:
    """``store`` on rank 0 (or a single process); a read-only copy on the other ranks of a distributed run."""
    from varbnn import distributed as vdist

    return store if vdist.is_main_process() else dataclasses.replace(store, readonly=True)


@dataclass(frozen=True)
class Invocation:
    """One call of a ``run_*`` function, opened by :func:`open_run`: what its runs and its page share. Its methods are
    the steps every run function takes the same way: :meth:`execute` the runs, :meth:`provenance` for the page,
    :meth:`write_result` (``OUT/NAME.json``) and :meth:`write_page` (``OUT/NAME.md``)."""

    start: float
    """``time.perf_counter()`` when the call began (the page's ``seconds``)."""
    commit: str
    device: torch.device
    world: int
    """The number of processes training each run (> 1 only under ``torchrun``)."""
    workers: int
    out: Path
    name: str = ""
    """The experiment's name (the tag of :meth:`reporter`'s lines)."""
    dirty: bool | None = None
    """Whether the code had uncommitted changes when the call began (:func:`varbnn_lab.provenance.check_tree`)."""
    seen: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)
    """What :meth:`execute` learnt for :meth:`provenance`: ``code_hash`` and ``stale_runs``."""

    def progress(self, progress: bool) -> bool:
        """Whether a run prints its own progress: asked to, in this process (``workers == 1``) and on rank 0."""
        from varbnn import distributed as vdist

        return progress and self.workers == 1 and vdist.is_main_process()

    def execute(
        self,
        runs: Sequence[RunKey],
        run: Callable[[RunKey], dict[str, Any]],
        store: RunStore,
        on_record: Callable[[RunKey, dict[str, Any]], None] | None = None,
        *,
        shard: tuple[int, int] | None = None,
        train: bool = True,
    ) -> dict[RunKey, dict[str, Any]]:
        """:func:`execute` of the ``shard`` share of ``runs`` (:func:`select_shard`; none at all if not ``train``: only
        the saved records are read) on this call's device, workers, commit and dirty flag, appending to ``store`` on
        rank 0 only (:func:`for_this_rank`). The code hash and the stale runs among ``runs`` (those reused with
        ``--reuse-stale`` or rendered with ``--no-train``) are kept for :meth:`provenance`."""
        from varbnn_lab import provenance as prov

        code = prov.code_hash([m for m in [prov.module_of(run)] if m])
        pending = select_shard(runs, shard) if train else []
        done = execute(pending, run, for_this_rank(store), device=self.device, workers=self.workers, commit=self.commit,
                       on_record=on_record, code_hash=code, dirty=self.dirty)  # fmt: skip
        keys = list(runs)
        if not train and keys and not any(key in done for key in keys):  # a page of NaNs otherwise
            raise nothing_saved(store, len(keys))
        self.seen["code_hash"] = code
        self.seen.setdefault("stale_runs", []).extend(prov.stale_runs(done, keys, code, store.fields))
        return done

    def writes(self, shard: tuple[int, int] | None = None) -> bool:
        """Whether this call writes the page: on rank 0 (or a single process) of a call that ran every shard (a
        shard's page would show a part of the runs: it waits for all of them, rendered by a ``train=False`` call)."""
        from varbnn import distributed as vdist

        return shard is None and vdist.is_main_process()

    def reporter(self, progress: bool, line: Callable[[RunKey, dict[str, Any]], str]) -> Callable[[RunKey, dict[str, Any]], None]:
        """An ``on_record`` for :meth:`execute` that prints ``[NAME] line(key, record)`` to stderr for every finished
        run, if ``progress`` and on rank 0."""
        from varbnn import distributed as vdist

        def report(key: RunKey, record: dict[str, Any]) -> None:
            if progress and vdist.is_main_process():
                print(f"[{self.name}] {line(key, record)}", file=sys.stderr)

        return report

    def device_text(self, parallel: str = "data-parallel") -> str:
        """A page's device: :func:`describe_device`, plus `` x WORLD processes (PARALLEL)`` when several processes
        train each run."""
        return describe_device(self.device) + (f" x {self.world} processes ({parallel})" if self.world > 1 else "")

    def provenance(self, command: str | None, device: str | None = None) -> dict[str, Any]:
        """:func:`provenance` of this call (``device`` by default :meth:`device_text`), with the code's provenance
        (:mod:`varbnn_lab.provenance`): ``code_hash`` (of the last :meth:`execute`; ``None`` before any), ``dirty`` and
        ``stale_runs`` (the stale runs :meth:`execute` returned)."""
        return {
            **provenance(command, self.commit, self.device_text() if device is None else device, self.start),
            "code_hash": self.seen.get("code_hash"),
            "dirty": self.dirty,
            "stale_runs": list(self.seen.get("stale_runs", [])),
        }

    def write_result(self, result: Mapping[str, Any], default: Callable[[Any], Any] | None = str) -> Path:
        """Write ``result`` to ``OUT/NAME.json`` (``NAME``: its ``"name"``), JSON indented by 2 with a final newline;
        ``default`` turns what JSON cannot hold into something it can (``None``: an error). Returns the path."""
        path = self.out / f"{result['name']}.json"
        path.write_text(json.dumps(result, indent=2, default=default) + "\n")
        return path

    def write_page(self, result: dict[str, Any], markdown: str) -> dict[str, Any]:
        """Write ``markdown``, the page of ``result``, to ``OUT/NAME.md``; returns ``result`` (the run function's
        return value)."""
        (self.out / f"{result['name']}.md").write_text(markdown)
        return result


def open_run(
    name: str, out_dir: str | os.PathLike[str] | None, device: str | torch.device | None, distributed: bool, workers: int
) -> Invocation:
    """What every ``run_*`` function does first, in this order: note the start time and the commit (:func:`git_commit`),
    refuse a committed results folder ``OUT`` (:func:`varbnn_lab.config.results_dir`) from a tree with uncommitted
    code changes unless allowed (:func:`varbnn_lab.provenance.check_tree`, a ``ValueError``), set up this process's
    device and count the processes training each run (:func:`processes`), and create ``OUT``."""
    from varbnn_lab.provenance import check_tree

    start, commit = time.perf_counter(), git_commit()
    out = results_dir(name, out_dir)
    dirty = check_tree(out)
    dev, world = processes(device, distributed, workers)
    out.mkdir(parents=True, exist_ok=True)
    return Invocation(start, commit, dev, world, workers, out, name, dirty)


def default_command() -> str:
    """The command line of this process as ``varbnn ARGS`` (what a page shows when the caller gives none)."""
    return "varbnn " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def read_result(path: str | Path) -> dict[str, Any]:
    """The saved result ``NAME.json`` of ``varbnn reproduce NAME`` at ``path``, as a dict (what ``varbnn render``
    re-renders); a missing file, another suffix or invalid JSON is an error naming the path."""
    path = Path(path)
    if path.suffix != ".json" or not path.is_file():
        raise FileNotFoundError(f"path must be a saved result NAME.json of `varbnn reproduce NAME`; no such file: {path}")
    try:
        result = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error
    if not isinstance(result, dict):
        raise ValueError(f"{path} is not a saved result: a JSON object with the experiment's 'name' was expected")
    return result


def provenance(command: str | None, commit: str, device: str, start: float) -> dict[str, Any]:
    """The provenance every page carries, the same way: ``command`` (default :func:`default_command`), ``commit``,
    ``device`` and the ``seconds`` since ``start`` (a ``time.perf_counter()`` value)."""
    return {
        "command": command or default_command(),
        "commit": commit,
        "device": device,
        "seconds": round(time.perf_counter() - start, 2),
    }
