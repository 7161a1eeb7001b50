"""The experiments' command line: ``demo``, ``reproduce NAME``, ``render NAME.json``, ``list``. The library's ``varbnn``
command (:mod:`varbnn.cli`) forwards these to :func:`main`; ``varbnn-lab`` (:func:`lab_main`) and
``python -m varbnn_lab.cli`` run it directly. The lab is not part of the varbnn package: ``pip install -e lab/`` from a
clone."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from varbnn.cli import DEVICE_CHOICES, max_threads

__all__ = ["main", "lab_main", "max_threads", "DEVICE_CHOICES"]


def _fail(prog: str, message: str) -> NoReturn:
    """An argparse-style error in one line (``prog: error: message``), exit status 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _threads_error(threads: int) -> str | None:
    limit = max_threads()
    if 1 <= threads <= limit:
        return None
    return f"--threads must be an integer in [1, {limit}] (4 x the {limit // 4} CPU cores of os.cpu_count()), got {threads}"


def _device_error(device: str) -> str | None:
    """Why ``--device device`` cannot run here, or None."""
    import torch

    if device == "auto":
        return None
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        return f"--device {device!r} is not a device name; allowed: {DEVICE_CHOICES}"
    if parsed.type == "cpu":
        return None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            return (
                f"--device {device!r}: CUDA is not available on this machine (torch.cuda.is_available() is False); "
                "use cpu or auto"
            )
        count = torch.cuda.device_count()
        if parsed.index is not None and parsed.index >= count:
            return f"--device {device!r}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
        return None
    if parsed.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            return f"--device {device!r}: MPS is not available on this machine; use cpu or auto"
        return None
    return f"--device {device!r}: device type {parsed.type!r} is not supported; allowed: {DEVICE_CHOICES}"


def _table(rows: list[dict[str, object]], keys: Sequence[str]) -> str:
    widths = [max(len(k), *(len(_cell(r.get(k, ""))) for r in rows)) for k in keys]
    line = "  ".join(k.ljust(w) for k, w in zip(keys, widths))
    body = ["  ".join(_cell(r.get(k, "")).ljust(w) for k, w in zip(keys, widths)) for r in rows]
    return "\n".join([line, "-" * len(line), *body])


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4f}"
    return str(value)


def _split_variants(text: str, labels: list[str | None]) -> list[str]:
    """``--variants``' comma-separated labels, where a label may itself hold commas (e.g. "RDP double,
    radius_init=even, ..."): consecutive pieces are joined while they form the start of a known label; a piece that
    starts none is kept alone (the runner then names it among the allowed labels)."""
    known = {label for label in labels if label}
    out: list[str] = []
    current: str | None = None
    for piece in text.split(","):
        candidate = piece if current is None else f"{current},{piece}"
        if any(label.startswith(candidate.strip()) for label in known) and current is not None:
            current = candidate
        elif current is not None:
            out.append(current.strip())
            current = piece
        else:
            current = piece
        if current.strip() in known and not any(label != current.strip() and label.startswith(current.strip() + ",")
                                               for label in known):  # fmt: skip
            out.append(current.strip())
            current = None
    if current is not None:
        out.append(current.strip())
    return out


def _shard_option(text: str) -> tuple[int, int]:
    """``--shard``'s argparse type: ``"K/N"`` as ``(K, N)`` (:func:`varbnn_lab.engine.parse_shard`); an empty
    value (e.g. ``--shard "$UNSET"``, which must not silently run every run here) or anything but ``K/N`` with integers
    0 <= K < N is a usage error naming the option and the form."""
    from varbnn_lab.engine import parse_shard

    try:
        return parse_shard(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("--shard ")) from None  # argparse names the option


def _close_process_group(finished: bool) -> None:
    """End a ``--distributed`` run's process group: after a barrier when the run finished on this rank (every rank
    then leaves together), at once when it failed (a barrier would wait for ranks that may never come). A process
    that exits with its gloo group still initialised can abort in the group's destructor ("terminate called without
    an active exception") after its results are written, which turns a finished run into a failed exit status."""
    from varbnn import distributed as vdist

    if finished:
        vdist.barrier()
    vdist.teardown()


def lab_main() -> int:
    """The ``varbnn-lab`` command: :func:`main` on ``sys.argv`` under the name ``varbnn-lab`` (in its messages and in
    the command line a result records)."""
    return main(prog="varbnn-lab")


def main(argv: Sequence[str] | None = None, prog: str = "varbnn") -> int:
    """The experiments' command (``list``, ``demo``, ``reproduce``, ``render``; ``varbnn`` forwards them here): parse
    ``argv`` (default ``sys.argv``) and run it; returns the exit status (0 on success, 1 when runs of the experiment
    failed: each was reported with its traceback when it failed, and the last line names them all; 2 for a usage
    error). ``prog``: the command's name in its messages and in the command line a result records (default
    ``"varbnn"``)."""
    parser = argparse.ArgumentParser(prog=prog, description="Variational Bayesian neural networks for PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, default_out: str | None, shown_default: str) -> None:
        p.add_argument("--device", default="cpu", help=f"{DEVICE_CHOICES} (default: cpu)")
        p.add_argument("--out", default=default_out, help=f"output directory (default: {shown_default})")
        p.add_argument("--data-dir", default=None, help="dataset directory (default: $VARBNN_DATA, then ~/.cache/varbnn)")
        p.add_argument("--no-progress", action="store_true", help="hide progress bars")
        p.add_argument(
            "--threads", type=int, default=None,
            help=f"CPU threads of this process, 1 to {max_threads()} (4 x the cores; torch.set_num_threads; default: "
            "torch's, one per core); the page's device line names the count",
        )  # fmt: skip

    demo = sub.add_parser("demo", help="plain MLP vs mean-field BNN on the bundled digits set (offline, < 3 min)")
    common(demo, "varbnn-results", "varbnn-results")
    demo.add_argument("--quick", action="store_true", help="a few epochs only")
    rep = sub.add_parser("reproduce", help="run a named experiment config and write NAME.json / NAME.md")
    rep.add_argument("name", help="experiment name (see `varbnn list`)")
    rep.add_argument("--quick", action="store_true", help="CI-sized variant of the same experiment")
    rep.add_argument("--datasets", default=None, help="uci only: comma-separated subset of the UCI datasets")
    rep.add_argument(
        "--noise-update",
        default="closed_form",
        choices=("closed_form", "gradient"),
        help="uci only: fit the noise precision's Gamma posterior in closed form after each step (default) or by Adam",
    )
    rep.add_argument(
        "--noise-prior",
        default="6,6",
        help="uci only: A,B of the Gamma(A, B) prior on the noise precision (default 6,6; the published RDP code uses 1,1)",
    )
    rep.add_argument(
        "--workers", type=int, default=1,
        help="N worker processes of one thread each run the pending runs (CPU; default 1); a run that trains alone "
        "(e.g. one seed's shard) trains in this process, and its prune_front points run in the N workers",
    )  # fmt: skip
    rep.add_argument(
        "--splits", type=int, default=None, help="uci only: run only the first N splits of each dataset (a partial run)"
    )
    rep.add_argument(
        "--rdp-defaults",
        action="store_true",
        help="uci only: run only RDP, with RadialDirectional's current defaults (radius_init=prior, "
        "concentration_param=log) instead of the published code's choices; use its own --out "
        "(the committed one: benchmarks/results/uci/rdp-defaults)",
    )
    rep.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="uci only: training epochs per split (default 40; its own protocol hash: use its own --out, "
        "e.g. benchmarks/results/uci/200-epochs)",
    )
    rep.add_argument(
        "--families", default=None, help="uci only: comma-separated columns to run (rdp, meanfield, radial, ktied, delta)"
    )
    rep.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", dest="overrides",
        help="override a field of the experiment's config, checked against its type (repeatable; e.g. --set epochs=5 "
        "--set seeds='(0, 1)'); a changed training field is a new protocol: give it its own --out",
    )  # fmt: skip
    rep.add_argument(
        "--variants", default=None,
        help="generic runner's configs only: comma-separated variant labels to run now (the page shows every run saved)",
    )  # fmt: skip
    rep.add_argument(
        "--compile", nargs="?", const=True, default=None, metavar="MODE",
        help="generic runner's configs and uci-learned: train with fit(compile=...); alone, fit(compile=True) (CUDA graphs "
        "on a GPU when the batches have one shape, else the default mode); or torch.compile's MODE (default, "
        "reduce-overhead, max-autotune, max-autotune-no-cudagraphs); a runtime choice like --device, not a new protocol",
    )  # fmt: skip
    rep.add_argument(
        "--no-train", action="store_true",
        help="render the results from the runs already saved (never trains; runs made by code that has changed since "
        "are shown and flagged as stale on the page)",
    )  # fmt: skip
    rep.add_argument(
        "--reuse-stale", action="store_true",
        help="reuse the saved runs made by code that has changed since (another code hash; see varbnn_lab.provenance) "
        "instead of retraining them (the default, which moves their old records to NAME_runs.stale.jsonl); the page "
        "flags them as stale",
    )  # fmt: skip
    rep.add_argument(
        "--allow-dirty", action="store_true",
        help="write into a committed results folder (under benchmarks/results/) although tracked files under src/ or "
        "lab/ have uncommitted changes (refused by default); the records then say dirty: true",
    )  # fmt: skip
    rep.add_argument(
        "--fail-fast", action="store_true",
        help="stop at the first run that fails (the queued runs are not started, the worker processes ended); by "
        "default the other runs go on, each recorded as it finishes, and the command then exits with status 1 naming "
        "the failed runs",
    )  # fmt: skip
    rep.add_argument(
        "--shard", default=None, type=_shard_option, metavar="K/N",
        help="K/N runs every N-th run from the K-th (0-based), for parallel processes or machines (integers 0 <= K < N; "
        "an empty or malformed value is refused, never read as no shard)",
    )  # fmt: skip
    rep.add_argument(
        "--distributed",
        action="store_true",
        help="data-parallel training across the processes of `torchrun --nproc_per_node N -m varbnn.cli reproduce ...` "
        "(gloo on CPU, nccl on CUDA); every experiment",
    )
    common(rep, None, "benchmarks/results/NAME/, one folder per experiment")
    sub.add_parser("list", help="list the experiment names")
    ren = sub.add_parser(
        "render", help="rewrite NAME.md from a saved NAME.json of `varbnn reproduce NAME`, any NAME (layout only)"
    )
    ren.add_argument("results", nargs="+", help="saved result files NAME.json")
    args = parser.parse_args(argv)

    from varbnn_lab.config import apply_overrides, results_dir

    if args.command == "render":
        from varbnn_lab.engine import git_commit
        from varbnn_lab.render import render_saved

        commit = git_commit()  # before the first page is rewritten (which would make the tree dirty)
        for path in args.results:
            try:
                print(f"wrote {render_saved(path, commit)}")
            except (OSError, ValueError) as error:
                parser.error(str(error))
        return 0
    if args.command == "list":
        from varbnn_lab.catalog import experiments

        for name, spec in sorted(experiments().items()):
            print(f"{name:20s} {spec.description}")
        return 0
    prog = f"{parser.prog} {args.command}"
    if getattr(args, "threads", None) is not None:
        threads_error = _threads_error(args.threads)
        if threads_error:
            _fail(prog, threads_error)
    if getattr(args, "device", None) is not None:
        device_error = _device_error(args.device)
        if device_error:
            _fail(prog, device_error)
    if getattr(args, "threads", None) is not None:
        import torch

        torch.set_num_threads(args.threads)
    name = "demo" if args.command == "demo" else args.name
    distributed = bool(getattr(args, "distributed", False))
    command = f"{parser.prog} " + " ".join(sys.argv[1:] if argv is None else argv)
    shard = None
    if args.command == "reproduce":
        from varbnn_lab.catalog import base_name
        from varbnn_lab.registry import CONFIGS

        uci_only = [f"--{k}" for k in ("datasets", "families", "splits", "epochs") if getattr(args, k) is not None]
        uci_only += ["--rdp-defaults"] if args.rdp_defaults else []
        changed = [k for k in ("noise_update", "noise_prior") if getattr(args, k) != rep.get_default(k)]
        uci_only += [f"--{k.replace('_', '-')}" for k in changed]
        if base_name(name) != name:
            parser.error(f"{name!r}: give the experiment's name and --quick for its quick form ({base_name(name)} --quick)")
        if uci_only and name != "uci":
            parser.error(f"{', '.join(uci_only)}: options of uci only (use --set FIELD=VALUE for {name!r})")
        if args.variants and name not in CONFIGS:
            parser.error(f"--variants: supported by the generic runner's configs (see `varbnn list`), not by {name!r}")
        if args.compile:
            from varbnn_lab.catalog import experiment as _entry

            try:
                compiles = _entry(name).compiles
            except ValueError:
                compiles = True  # an unknown name: refused below with the list of names
            if not compiles:
                parser.error(f"--compile: supported by the generic runner's configs and uci-learned, not by {name!r}")
        if args.workers < 1:
            parser.error(f"--workers must be a positive integer, got {args.workers}")
        shard = args.shard  # None or (K, N), checked by _shard_option
    from varbnn_lab.catalog import experiment
    from varbnn_lab.engine import RunsFailed, failure_policy
    from varbnn_lab.provenance import provenance_policy

    finished = False
    try:
        spec = experiment(name)
        if name == "uci":
            config = _uci_config(args, parser)
        else:
            config = spec.config(name, args.quick)
        config = apply_overrides(config, getattr(args, "overrides", []))
        options: dict[str, object] = {}
        if spec.generic:
            labels = [getattr(v, "label", None) for v in getattr(config, "variants", ())]
            options["only"] = _split_variants(args.variants, labels) if getattr(args, "variants", None) else None
        if spec.compiles and getattr(args, "compile", None):
            options["compile"] = args.compile  # True (--compile alone) or a mode string
        policy = provenance_policy(allow_dirty=bool(getattr(args, "allow_dirty", False)),
                                   reuse_stale=bool(getattr(args, "reuse_stale", False)))  # fmt: skip
        with failure_policy(bool(getattr(args, "fail_fast", False))), policy:
            result = spec.run(config, device=args.device, out_dir=args.out, data_dir=args.data_dir,
                              progress=not args.no_progress, command=command, shard=shard,
                              train=not getattr(args, "no_train", False), workers=getattr(args, "workers", 1),
                              distributed=distributed, **options)  # fmt: skip
        finished = True
    except RunsFailed as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 1
    except ValueError as error:
        parser.error(str(error))
    finally:
        if distributed:
            _close_process_group(finished)
    out = results_dir(config.name, args.out)
    if shard is not None:
        print(f"wrote {out}/{config.name}_runs.shard{shard[0]}.jsonl")
        return 0
    if result.get("written") is False:
        return 0  # a rank other than 0 of a distributed run
    if spec.generic:
        columns = ("variant", "accuracy", "nll", "ece", "nelbo", "parameters", "train_seconds")
        keys = [k for k in columns if any(k in row for row in result["rows"])]
        print(_table(result["rows"], keys) + "\n")
    figures = result.get("figures") or sorted(p.name for p in out.glob(f"{config.name}*.png"))
    print(f"wrote {out}/{config.name}.json, {out}/{config.name}.md" + "".join(f", {out}/{f}" for f in figures))
    return 0


def _uci_config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> object:
    """``uci``'s config from its own options (``--datasets``, ``--families``, ``--splits``, ``--epochs``,
    ``--noise-update``, ``--noise-prior``, ``--rdp-defaults``)."""
    from varbnn_lab.uci import uci_config

    try:
        a0, b0 = (float(v) for v in args.noise_prior.split(","))
    except ValueError:
        parser.error(f"--noise-prior must be A,B (two positive numbers), got {args.noise_prior!r}")
    if args.splits is not None and args.splits < 1:
        parser.error(f"--splits must be a positive integer, got {args.splits}")
    if args.epochs is not None and args.epochs < 1:
        parser.error(f"--epochs must be a positive integer, got {args.epochs}")
    datasets = tuple(args.datasets.split(",")) if args.datasets else None
    families = tuple(args.families.split(",")) if args.families else None
    return uci_config(args.quick, datasets, args.noise_update, (a0, b0), args.splits, args.rdp_defaults, args.epochs,
                      families)  # fmt: skip

if __name__ == "__main__":
    sys.exit(main())
