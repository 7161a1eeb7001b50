"""The ``varbnn`` command: ``varbnn demo``, ``varbnn reproduce NAME``, ``varbnn render NAME.json``, ``varbnn list``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

__all__ = ["main", "max_threads", "DEVICE_CHOICES", "ENGINE_EXPERIMENTS"]

ENGINE_EXPERIMENTS = (
    "uci", "uci-learned", "retina-referral", "retina-robustness", "vcl-split-fmnist",
    "vcl-split-fmnist-search", "vcl-split-fmnist-selected", "graves-mnist", "graves-mnist-lstm", "graves-prune",
    "graves-prune-lstm", "soap-bubble",
)  # fmt: skip
# and every config of the generic runner (varbnn.experiments.registry.CONFIGS: mnist-mlp, ktied-*, lenet5-*, ...)
"""The experiments whose runs :mod:`varbnn.experiments.engine` executes: they take ``--workers``, ``--shard`` and
``--no-train``."""
ENGINE_TEXT = "every experiment of `varbnn reproduce`"

DEVICE_CHOICES = "cpu, cuda, cuda:N (N < the number of GPUs), mps, or auto (cuda if available, else cpu)"
"""The values ``--device`` accepts (a device that this machine lacks is refused before anything runs)."""


def max_threads() -> int:
    """The largest ``--threads``: 4 x ``os.cpu_count()``. More threads than that only contend for the cores (10,000 hung
    torch and 100,000 crashed it)."""
    return 4 * (os.cpu_count() or 1)


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


def main(argv: Sequence[str] | None = None) -> int:
    """The ``varbnn`` command (``list``, ``demo``, ``reproduce``, ``render``): parse ``argv`` (default ``sys.argv``) and
    run it; returns the exit status (0 on success, 2 for a usage error)."""
    parser = argparse.ArgumentParser(prog="varbnn", description="Variational Bayesian neural networks for PyTorch.")
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
        help=f"N worker processes of one thread each run the pending runs (CPU; default 1); {ENGINE_TEXT}",
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
    rep.add_argument("--no-train", action="store_true", help=f"render the results from the runs already saved; {ENGINE_TEXT}")
    rep.add_argument(
        "--shard", default=None,
        help=f"K/N runs every N-th run from the K-th (0-based), for parallel processes or machines; {ENGINE_TEXT}",
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

    from varbnn.experiments import CONFIGS, get_config, run_experiment
    from varbnn.experiments.config import apply_overrides, results_dir

    if args.command == "render":
        from varbnn.experiments.engine import git_commit
        from varbnn.experiments.render import render_saved

        commit = git_commit()  # before the first page is rewritten (which would make the tree dirty)
        for path in args.results:
            try:
                print(f"wrote {render_saved(path, commit)}")
            except (OSError, ValueError) as error:
                parser.error(str(error))
        return 0
    if args.command == "list":
        for name, config in sorted(CONFIGS.items()):
            print(f"{name:20s} {config.description}")
        print(f"{'uci':20s} UCI regression, 9 sets x standard splits, every family (Oh et al. 2020 Table 1 protocol)")
        print(f"{'uci-learned':20s} UCI regression with learned noise and a validation search, every family and baseline")
        print(f"{'retina-referral':20s} Referral by mutual information on RetinaMNIST, radial vs mean-field, 5 seeds")
        print(f"{'retina-robustness':20s} Random hyperparameter search, radial vs mean-field (Farquhar et al. 2020 Fig. 7)")
        print(f"{'soap-bubble':20s} Distance of samples from the mode: analytic/sampled densities and during training")
        print(f"{'vcl-split-fmnist':20s} VCL on Split Fashion-MNIST, radial vs mean-field (Farquhar et al. 2020)")
        print(f"{'vcl-split-fmnist-search':20s} vcl-split-fmnist's grid search: the same 8 settings for radial and mean-field")
        print(f"{'vcl-split-fmnist-selected':20s} each family's setting chosen by vcl-split-fmnist-search, 5 seeds")
        print(f"{'graves-mnist':20s} Graves 2011 table 1 on an MNIST MLP: delta/Gaussian posteriors x fixed/adaptive priors, MDL")
        print(f"{'graves-prune':20s} Graves 2011 table 2 and figures 3-4: pruning by |mu|/sigma < lambda, then retraining")
        print(f"{'graves-mnist-lstm':20s} graves-mnist on a row LSTM (the recurrent case)")
        print(f"{'graves-prune-lstm':20s} graves-prune on the row LSTM of graves-mnist-lstm")
        return 0
    prog = f"varbnn {args.command}"
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
    command = "varbnn " + " ".join(sys.argv[1:] if argv is None else argv)
    shard = None
    if args.command == "reproduce":
        from varbnn.experiments.engine import parse_shard
        from varbnn.experiments.registry import CONFIGS

        engine = name.removesuffix("-quick") in ENGINE_EXPERIMENTS or name in CONFIGS
        used = [
            flag for flag, on in (("--shard", args.shard), ("--workers", args.workers != 1), ("--no-train", args.no_train)) if on
        ]
        if used and not engine:
            parser.error(f"{', '.join(used)}: supported by {ENGINE_TEXT}, not by {name!r}")
        if args.variants and name not in CONFIGS:
            parser.error(f"--variants: supported by the generic runner's configs (see `varbnn list`), not by {name!r}")
        if args.workers < 1:
            parser.error(f"--workers must be a positive integer, got {args.workers}")
        if args.shard:
            try:
                shard = parse_shard(args.shard)
            except ValueError as error:
                parser.error(str(error))
    if name == "uci-learned":
        from varbnn.experiments.uci_learned import UCILearnedConfig, quick_config, run_uci_learned

        try:
            learned = apply_overrides(quick_config() if args.quick else UCILearnedConfig(), args.overrides)
            learned_result = run_uci_learned(learned, device=args.device, out_dir=args.out, data_dir=args.data_dir,
                                             progress=not args.no_progress, command=command, shard=shard,
                                             train=not args.no_train, workers=args.workers,
                                             distributed=distributed)  # fmt: skip
        except ValueError as error:
            parser.error(str(error))
        out = results_dir(learned.name, args.out)
        if learned_result.get("written") is False:
            return 0  # not rank 0
        if shard is not None:
            print(f"wrote {out}/{learned.name}_runs.shard{shard[0]}.jsonl")
            return 0
        print(f"wrote {out}/{learned.name}.json, {out}/{learned.name}.md")
        return 0 if any(len(row) > 3 for row in learned_result["rows"]) else 1
    if name == "uci":
        from varbnn.experiments.uci import run_uci, uci_config

        try:
            try:
                a0, b0 = (float(v) for v in args.noise_prior.split(","))
            except ValueError:
                parser.error(f"--noise-prior must be A,B (two positive numbers), got {args.noise_prior!r}")
            datasets = tuple(args.datasets.split(",")) if args.datasets else None
            if args.splits is not None and args.splits < 1:
                parser.error(f"--splits must be a positive integer, got {args.splits}")
            if args.epochs is not None and args.epochs < 1:
                parser.error(f"--epochs must be a positive integer, got {args.epochs}")
            families = tuple(args.families.split(",")) if args.families else None
            uci = uci_config(args.quick, datasets, args.noise_update, (a0, b0), args.splits, args.rdp_defaults,
                             args.epochs, families)  # fmt: skip
            uci = apply_overrides(uci, args.overrides)
        except ValueError as error:
            parser.error(str(error))
        try:
            uci_result = run_uci(uci, device=args.device, out_dir=args.out, data_dir=args.data_dir,
                                 progress=not args.no_progress, command=command, shard=shard,
                                 train=not args.no_train, workers=args.workers, distributed=distributed)  # fmt: skip
        except ValueError as error:
            parser.error(str(error))
        if uci_result.get("written") is False:
            return 0  # not rank 0
        out = results_dir(uci.name, args.out)
        runs = f"{uci.name}_runs" + ("" if shard is None else f".shard{shard[0]}") + ".jsonl"
        print(f"wrote {out}/{uci.name}.json, {out}/{uci.name}.md, {out}/{runs}")
        return 0 if uci_result["rows"] else 1
    if name in ("retina-referral", "retina-robustness"):
        from varbnn.experiments.retina import retina_config, run_retina

        try:
            retina = apply_overrides(retina_config(name, args.quick), args.overrides)
            retina_result = run_retina(retina, device=args.device, out_dir=args.out, data_dir=args.data_dir,
                                       progress=not args.no_progress, command=command, shard=shard,
                                       train=not args.no_train, workers=args.workers, distributed=distributed)  # fmt: skip
        except ValueError as error:
            parser.error(str(error))
        if shard is None and retina_result.get("written", True):
            out = results_dir(retina.name, args.out)
            print(f"wrote {out}/{retina.name}.json, {out}/{retina.name}.md, {out}/{retina.name}.png")
        return 0
    if name == "soap-bubble":
        from varbnn.experiments.soap_bubble import run_soap_bubble, soap_bubble_config

        try:
            soap = apply_overrides(soap_bubble_config(args.quick), args.overrides)
            soap_result = run_soap_bubble(soap, device=args.device, out_dir=args.out, data_dir=args.data_dir,
                                          progress=not args.no_progress, command=command, shard=shard,
                                          train=not args.no_train, workers=args.workers, distributed=distributed)  # fmt: skip
        except ValueError as error:
            parser.error(str(error))
        out = results_dir(soap.name, args.out)
        if shard is not None:
            print(f"wrote {out}/{soap.name}_runs.shard{shard[0]}.jsonl")
        elif soap_result.get("written", True):
            print(f"wrote {out}/{soap.name}.json, {out}/{soap.name}.md and figures")
        return 0
    if name in ("vcl-split-fmnist", "vcl-split-fmnist-search", "vcl-split-fmnist-selected"):
        from varbnn.experiments.continual import run_vcl, vcl_config

        try:
            vcl = apply_overrides(vcl_config(args.quick, name), args.overrides)
            vcl_result = run_vcl(vcl, device=args.device, out_dir=args.out, data_dir=args.data_dir,
                                 progress=not args.no_progress, command=command, shard=shard, train=not args.no_train,
                                 workers=args.workers, distributed=distributed)  # fmt: skip
        except ValueError as error:
            parser.error(str(error))
        if shard is not None:
            print(f"wrote {results_dir(vcl.name, args.out)}/{vcl.name}_runs.shard{shard[0]}.jsonl")
            return 0
        if vcl_result.get("written") is False:
            return 0  # not rank 0
        final = [r for r in vcl_result["rows"] if r["after_task"] == len(vcl.tasks)]
        print(_table([{"variant": r["variant"], "mean accuracy": r["mean"][0]} for r in final], ("variant", "mean accuracy")))
        out = results_dir(vcl.name, args.out)
        print(f"wrote {out}/{vcl.name}.json, {out}/{vcl.name}.md, {out}/{vcl.name}.png")
        return 0
    if name.startswith("graves-"):
        from varbnn.experiments.graves import graves_config, run_graves_mnist, run_graves_prune

        try:
            graves = apply_overrides(graves_config(name, args.quick), args.overrides)
        except ValueError as error:
            parser.error(str(error))
        out = results_dir(graves.name, args.out)
        run = run_graves_prune if name.startswith("graves-prune") else run_graves_mnist
        try:
            graves_result = run(graves, device=args.device, out_dir=args.out, data_dir=args.data_dir,
                                progress=not args.no_progress, command=command, shard=shard, train=not args.no_train,
                                workers=args.workers, distributed=distributed)  # fmt: skip
        except ValueError as error:
            parser.error(str(error))
        if shard is not None:
            print(f"wrote {out}/{graves.name}_runs.shard{shard[0]}.jsonl")
        elif graves_result.get("written", True):
            print(f"wrote {out}/{graves.name}.json, {out}/{graves.name}.md, {out}/{graves.name}.png")
        return 0
    try:
        config = apply_overrides(get_config(name, quick=args.quick), getattr(args, "overrides", []))
    except ValueError as error:
        parser.error(str(error))
    try:
        result = run_experiment(config, device=args.device, out_dir=args.out, data_dir=args.data_dir,
                                progress=not args.no_progress, command=command, distributed=distributed, shard=shard,
                                train=not getattr(args, "no_train", False), workers=getattr(args, "workers", 1),
                                only=args.variants.split(",") if getattr(args, "variants", None) else None)  # fmt: skip
    except ValueError as error:
        parser.error(str(error))
    if "runs_file" in result:
        print(f"wrote {result['runs_file']}")
        return 0
    if not result.get("written", True):
        return 0  # not rank 0
    columns = ("variant", "accuracy", "nll", "ece", "nelbo", "parameters", "train_seconds")
    keys = [k for k in columns if any(k in row for row in result["rows"])]
    print(_table(result["rows"], keys))
    out = results_dir(config.name, args.out)
    print(f"\nwrote {out}/{config.name}.json, {out}/{config.name}.md" + "".join(f", {out}/{f}" for f in result["figures"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
