"""The experiment engine: what every ``varbnn reproduce NAME`` shares, written once.

An experiment declares its runs (each a frozen key of plain values, e.g. ``(variant, seed)`` or ``(dataset, variant,
split)``, expanded from its config's factors by :func:`expand`) and a function that trains and evaluates one run and
returns its record (a JSON-able dict). The engine

- keeps the records in ``OUT/NAME_runs.jsonl`` (:class:`RunStore`): one JSON line per finished run, tagged with the
  protocol hash of the config's training fields, so a rerun of the same command skips what is done and a killed
  invocation loses at most the run in progress (inside a run, per-epoch checkpoints stay :func:`varbnn.train.fit`'s);
  shard files ``NAME_runs.shardK.jsonl`` are merged on read;
- runs the pending runs in this process, in ``workers`` spawned processes of one thread each, or only the ``shard``
  ``(K, N)`` share of them (every N-th run from the K-th of the fixed order: the shards partition the runs) for N
  processes or machines (:func:`execute`, :func:`select_shard`);
- writes the same provenance (command, commit, device, seconds) on every page (:func:`provenance`);
- opens every ``run_*`` function's call the same way (:func:`open_run`: start time, commit, device, results folder)
  and writes its ``NAME.json`` and ``NAME.md`` the same way (:class:`Invocation`).

The experiment module keeps only its protocol: its config, its run function and its paper-specific evaluation.
"""

from __future__ import annotations

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
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from varbnn.experiments.config import results_dir

__all__ = [
    "RunKey",
    "RunStore",
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


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` (the ``--shard`` option) as ``(K, N)``; a clear error for anything but integers 0 <= K < N."""
    try:
        k, n = (int(v) for v in text.split("/"))
        if not 0 <= k < n:
            raise ValueError
    except (ValueError, AttributeError):
        raise ValueError(f"--shard must be K/N with integers 0 <= K < N, got {text!r}") from None
    return k, n


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
    and are ignored (kept in the file). Writes go to ``NAME_runs.jsonl``, or ``NAME_runs.shardK.jsonl`` for shard K, so
    that shards on one shared folder never write to one file; reads merge every such file (sorted by name; for a run
    found twice, the last record read wins)."""

    out: Path
    name: str
    key: Callable[[Mapping[str, Any]], RunKey]
    protocol: Callable[[RunKey], str | None]
    shard: tuple[int, int] | None = None
    readonly: bool = False
    """A store that never writes (:meth:`append` does nothing): the processes other than rank 0 of a distributed run."""

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
            return cls(Path(out), name, key=lambda r: tuple(r[f] for f in names), protocol=lambda key: text, shard=shard)
        table = dict(protocol)
        return cls(Path(out), name, key=lambda r: tuple(r[f] for f in names), protocol=lambda key: table.get(key[0]),
                   shard=shard)  # fmt: skip

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

    def load(self) -> dict[RunKey, dict[str, Any]]:
        """The records of this protocol by run key. A last line cut short by a killed write is skipped (with a
        warning); a malformed line elsewhere is an error naming the file and line."""
        done: dict[RunKey, dict[str, Any]] = {}
        for path in self.files():
            lines = path.read_text().splitlines()
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    if number == len(lines):
                        warnings.warn(f"{path}: skipping a last line cut short ({error})", stacklevel=2)
                        continue
                    raise ValueError(f"{path}, line {number}: not a JSON record ({error})") from error
                key = self.key(record)
                expected = self.protocol(key)
                if expected is not None and record.get("protocol") == expected:
                    done[key] = record
        return done

    def append(self, record: Mapping[str, Any]) -> None:
        """Append one finished run's record as one line. A last line cut short by a killed write (no newline at the end
        of the file) is removed first, so that it never ends up between two records. A ``readonly`` store writes
        nothing."""
        if self.readonly:
            return
        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.stat().st_size > 0:
            data = path.read_bytes()
            if not data.endswith(b"\n"):
                with path.open("r+b") as handle:
                    handle.truncate(data.rfind(b"\n") + 1)
        with path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()


def _glob_escape(text: str) -> str:
    """``text`` with the glob wildcards ``*?[`` escaped."""
    return re.sub(r"([*?\[])", r"[\1]", text)


def _worker_start(parent: int, poll: float = 1.0) -> None:
    """A worker process's initializer: one thread for torch, and a watchdog that ends the worker (exit status 1) as
    soon as its parent ``parent`` is gone. A parent killed without a chance to clean up (SIGKILL, a lost session)
    would otherwise leave its workers training runs whose records nobody can write any more."""
    import threading

    torch.set_num_threads(1)

    def watch() -> None:
        while True:
            time.sleep(poll)
            if os.getppid() != parent:  # re-parented: the invoking process is gone
                os._exit(1)

    threading.Thread(target=watch, name="varbnn-parent-watchdog", daemon=True).start()


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """``workers`` spawned processes of one thread each that end with this process (:func:`_worker_start`): the
    engine's run workers and the front points' (:func:`varbnn.experiments.evaluation.front_points`)."""
    context = multiprocessing.get_context("spawn")  # fresh interpreters: no forked torch thread pools
    return ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_start, initargs=(os.getpid(),))


def _run_in_worker(
    run: Callable[[RunKey], dict[str, Any]], key: RunKey, device: torch.device
) -> tuple[RunKey, dict[str, Any], str]:
    return key, run(key), describe_device(device) + " (worker process)"


def execute(
    runs: Sequence[RunKey],
    run: Callable[[RunKey], dict[str, Any]],
    store: RunStore,
    *,
    device: torch.device,
    workers: int = 1,
    commit: str | None = None,
    on_record: Callable[[RunKey, dict[str, Any]], None] | None = None,
) -> dict[RunKey, dict[str, Any]]:
    """Run every run of ``runs`` that ``store`` does not hold yet and append its record as soon as it finishes; returns
    every record of ``store`` (the runs found and the runs done now) by key.

    ``run(key)`` trains and evaluates one run and returns its record; the engine adds ``protocol``, ``commit`` and
    ``device``. It must seed everything it draws from (each run is then independent of the order and of the process it
    runs in). ``workers`` > 1 (CPU only) runs them in that many spawned processes of one thread each (``run`` must then
    be picklable: a module-level function or a ``functools.partial`` of one); this process appends each record as it
    arrives, so a killed invocation keeps every finished run, and its workers end within a second of it (they watch
    their parent). ``on_record(key, record)`` is called after each append
    (progress lines)."""
    check_workers(workers, device)
    done = store.load()
    pending = [key for key in runs if key not in done]
    from varbnn import distributed as vdist

    if vdist.is_distributed():  # every rank runs rank 0's list (the ranks must train the same runs in the same order)
        import torch.distributed as dist

        shared: list[Any] = [pending]
        dist.broadcast_object_list(shared, src=0)
        pending = [tuple(key) for key in shared[0]]
    commit = git_commit() if commit is None else commit

    def save(key: RunKey, record: dict[str, Any], device_text: str) -> None:
        record.update(protocol=store.protocol(key), commit=commit, device=device_text)
        store.append(record)
        done[key] = record
        if on_record is not None:
            on_record(key, record)

    if workers > 1 and len(pending) > 1:
        with worker_pool(min(workers, len(pending))) as pool:
            futures = [pool.submit(_run_in_worker, run, key, device) for key in pending]
            for future in as_completed(futures):
                save(*future.result())
    else:
        text = describe_device(device)
        for key in pending:
            save(key, run(key), text)
    return done


def git_commit() -> str:
    """HEAD's hash (with ``+dirty`` if tracked files outside ``benchmarks/results/`` have uncommitted changes: results
    that runs in progress append to are not code); ``$VARBNN_COMMIT`` where the tree has no git metadata (e.g. a copy
    sent to another machine); else ``unknown``."""
    if os.environ.get("VARBNN_COMMIT"):
        return os.environ["VARBNN_COMMIT"]
    try:
        root = Path(__file__).resolve().parents[3]
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
    from varbnn.train import resolve_device

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
        the saved records are read) on this call's device, workers and commit, appending to ``store`` on rank 0 only
        (:func:`for_this_rank`)."""
        pending = select_shard(runs, shard) if train else []
        done = execute(pending, run, for_this_rank(store), device=self.device, workers=self.workers, commit=self.commit,
                       on_record=on_record)  # fmt: skip
        keys = list(runs)
        if not train and keys and not any(key in done for key in keys):  # a page of NaNs otherwise
            raise ValueError(
                f"train=False (--no-train): none of this experiment's {len(keys)} runs is saved in {self.out}, so there "
                "is nothing to render; pass the folder that holds its _runs.jsonl as out_dir (--out), or train the runs"
            )
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
        """:func:`provenance` of this call: ``device`` by default :meth:`device_text`."""
        return provenance(command, self.commit, self.device_text() if device is None else device, self.start)

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
    set up this process's device and count the processes training each run (:func:`processes`), and create the
    results folder ``OUT`` (:func:`varbnn.experiments.config.results_dir`)."""
    start, commit = time.perf_counter(), git_commit()
    dev, world = processes(device, distributed, workers)
    out = results_dir(name, out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return Invocation(start, commit, dev, world, workers, out, name)


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
