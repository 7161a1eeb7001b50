"""Why RDP trails mean-field in ``uci-learned``: its direction concentration over one search run, traced.

One run of the ``uci-learned`` protocol's search (the same code: ``varbnn_lab.uci_learned._train`` on 80% of a
standard split, the validation 20% scored every ``--every`` epochs with 32 draws), for five variants at one prior
scale:

* ``RDP (double)`` exactly as the table runs it (``bayesianize``'s default ``pretrained=True``, so the directions start
  at the trained-weights ``init_resultant`` 0.999 although the network is fresh);
* the same with ``init_resultant=0.95`` (the from-scratch default, the published code's);
* the same without the rejection-sampling score correction (``score_correction=False``: its share of the
  concentration gradient);
* the same with one concentration per group (``shared_concentration=False``: every row and column its own kappa,
  starting from the shared value; not the paper's), to test whether the shared concentration is what limits RDP here;
* ``mean-field``, for reference.

The validation set is scored at the protocol's lengths on the training's random stream (as the search does) and at the
trace's other epochs outside it (``torch.random.fork_rng``), so the table's variant trains as its saved search run did
(compiled by default, as the queue ran it); the page sets the saved run's scores beside the trace's.

At each traced epoch: the validation log-likelihood and RMSE (original units), the learned noise std (standardised
units) and, per RDP grouping of the first layer, the shared concentration kappa, the group dimension d, the mean
resultant length A_d(kappa) (the relative size of the direction noise is about sqrt(1 - A^2); per group: the medians
over the groups, and the range of kappa) and the median std of the groups' local log radius. A diagnostic, not a
benchmark: the test set is not touched.

    .venv/bin/python benchmarks/rdp_trace.py [--dataset energy] [--split 0] [--scale 1.0] [--every 25]

Writes ``benchmarks/results/uci-learned/rdp-trace.json`` / ``.md`` / ``.png`` (for another set, split or scale
``rdp-trace-<dataset>-<split>-<scale>.*``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

OUT = ROOT / "benchmarks" / "results" / "uci-learned"
VARIANTS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("RDP (double), as in the table", "RDP (double)", {}),
    ("RDP (double), init_resultant 0.95", "RDP (double)", {"init_resultant": 0.95}),
    ("RDP (double), no score correction", "RDP (double)", {"score_correction": False}),
    ("RDP (double), one concentration per group", "RDP (double)", {"shared_concentration": False}),
    ("mean-field", "mean-field", {}),
)


def trace_run(label: str, base: str, options: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    from varbnn.data import load_uci
    from varbnn.distributions import VonMisesFisher
    from varbnn.families.rdp import RadialDirectional
    from varbnn_lab import uci_learned as U

    config = U.UCILearnedConfig(datasets=(args.dataset,))
    variant = next(v for v in config.variants if v.label == base)
    per_group = options.get("shared_concentration") is False
    variant = dataclasses.replace(variant, family_options={**variant.family_options, **options})
    data = load_uci(args.dataset, args.split, None, normalize=False)
    x_all, y_all = data.x_train, data.y_train
    order = torch.randperm(len(x_all), generator=torch.Generator().manual_seed(args.split))  # as the protocol's
    n_val = max(1, round(config.validation_fraction * len(x_all)))
    fit_idx, val_idx = order[n_val:], order[:n_val]
    (xm, xs), (ym, ys) = U._standardise(x_all[fit_idx], y_all[fit_idx])
    x_fit, y_fit = (x_all[fit_idx] - xm) / xs, (y_all[fit_idx] - ym) / ys
    x_val, y_val = (x_all[val_idx] - xm) / xs, (y_all[val_idx] - ym) / ys
    epochs = max(U._lengths(config, len(fit_idx)))
    rows: list[dict[str, Any]] = []

    lengths = U._lengths(config, len(fit_idx))

    def at_epoch(epoch: int, model: torch.nn.Module, likelihood: Any) -> None:
        if epoch % args.every and epoch not in (1, *lengths):
            return
        if epoch in lengths:  # the protocol scores these on the global stream: so does the trace, to draw as it drew
            ll, rmse, _ = U._log_likelihood(model, likelihood, x_val, y_val, config.validation_samples, ys)
        else:  # the trace's own epochs leave the training's random stream as it was
            with torch.random.fork_rng():
                ll, rmse, _ = U._log_likelihood(model, likelihood, x_val, y_val, config.validation_samples, ys)
        row: dict[str, Any] = {"epoch": epoch, "val_ll": ll, "val_rmse": rmse,
                               "noise_std": float(likelihood.noise_std.detach())}  # fmt: skip
        first = next(m for m in model.modules() if hasattr(m, "posteriors"))
        family = first.posteriors["weight"]
        if isinstance(family, RadialDirectional):
            with torch.no_grad():
                for grouping in family.groupings:
                    direction = family.mean_direction(grouping)
                    kappa = family.concentration(grouping).expand(direction.shape[0])  # shared: one value
                    a = VonMisesFisher(direction, kappa).mean_resultant_length
                    _, variance = family.log_radius_moments(grouping, local_only=True)
                    row[grouping] = {"kappa": float(kappa.median()), "d": int(direction.shape[-1]),
                                     "A": float(a.median()), "log_radius_std": float(variance.sqrt().median())}  # fmt: skip
                    if per_group:  # the median above, and the spread over the groups
                        row[grouping].update(kappa_min=float(kappa.min()), kappa_max=float(kappa.max()))
        rows.append(row)

    U.seed_everything(args.split)
    start = time.perf_counter()
    compile = "default" if args.compile else False
    U._train(config, variant, args.scale, x_fit, y_fit, epochs, torch.device("cpu"), args.dataset, 1, at_epoch=at_epoch,
             compile=compile)  # fmt: skip
    if compile:
        torch._dynamo.reset()
    print(f"{label}: {time.perf_counter() - start:.0f} s", flush=True)
    recorded = None
    if not options:  # the table's own variant: its saved search run at this scale, to compare with
        runs = OUT / "uci-learned_runs.jsonl"
        for line in runs.read_text().splitlines() if runs.exists() else []:
            record = json.loads(line)
            if (record["dataset"], record["variant"], record["split"]) == (args.dataset, base, args.split):
                scores = {str(s["epochs"]): s["val_ll"] for s in record["search"] if s["knob"] == args.scale}
                recorded = {"commit": record.get("commit"), "compile": record.get("compile", False), "val_ll": scores}
    return {"label": label, "options": options, "epochs": epochs, "lengths": lengths, "compile": compile,
            "seconds": round(time.perf_counter() - start, 1), "trace": rows, "recorded": recorded}  # fmt: skip


def _stem(result: dict[str, Any]) -> str:
    """The output files' name: ``rdp-trace`` for energy split 0 at scale 1, else with the dataset, split and scale."""
    if (result["dataset"], result["split"], result["scale"]) == ("energy", 0, 1.0):
        return "rdp-trace"
    return f"rdp-trace-{result['dataset']}-{result['split']}-{result['scale']:g}"


def render(result: dict[str, Any]) -> str:
    lines = [
        "# rdp-trace: RDP's direction concentration over one uci-learned search run",
        "",
        f"{result['dataset']} split {result['split']}, prior scale {result['scale']}: the protocol's search run (80% of "
        "the training split, the validation 20% scored with 32 draws). Diagnostic only (no test data).",
        "",
        f"- command: `{result['command']}`",
        f"- commit: `{result['commit']}`",
        f"- device: {result['device']}",
        f"- wall time: {result['seconds']:.0f} s",
        "",
        "Summary (best = the highest validation log-likelihood traced; final = the last epoch; kappa first at epoch 1):",
        "",
    ]
    for run in result["runs"]:
        best, last = max(run["trace"], key=lambda r: r["val_ll"]), run["trace"][-1]
        line = (f"- {run['label']}: best {best['val_ll']:.3f} at epoch {best['epoch']}, final {last['val_ll']:.3f} "
                f"(RMSE {last['val_rmse']:.3f})")  # fmt: skip
        if "row" in last and "kappa_min" in last["row"]:
            row, col = last["row"], last["column"]
            line += (f"; final kappa per group: rows median {row['kappa']:.3g} ({row['kappa_min']:.3g} to "
                     f"{row['kappa_max']:.3g}), columns median {col['kappa']:.3g} ({col['kappa_min']:.3g} to "
                     f"{col['kappa_max']:.3g})")  # fmt: skip
        elif "row" in last:
            row, col = last["row"], last["column"]
            line += (f"; final kappa {row['kappa']:.3g} on the rows (d = {row['d']}, A = {row['A']:.3f}) and "
                     f"{col['kappa']:.3g} on the columns (d = {col['d']}, A = {col['A']:.3f}); at epoch 1 "
                     f"{run['trace'][0]['row']['kappa']:.3g} and {run['trace'][0]['column']['kappa']:.3g}")  # fmt: skip
        lines.append(line)
    lines.append("")
    for run in result["runs"]:
        recorded = run.get("recorded")
        if recorded:
            traced = {str(r["epoch"]): r["val_ll"] for r in run["trace"]}
            pairs = ", ".join(f"epoch {e}: {v:.3f} / {traced[e]:.3f}" for e, v in recorded["val_ll"].items() if e in traced)
            lines += [f"The saved search run of {run['label']} (code {str(recorded['commit'])[:7]}, compile "
                      f"{recorded['compile']}) against this trace at the protocol's lengths, validation LL: {pairs}. "
                      "The trace scores its other epochs outside the training's random stream and draws as the "
                      "protocol; where the code or the compiled kernels changed since, the runs part in rounding.",
                      ""]  # fmt: skip
    for run in result["runs"]:
        rdp = "row" in run["trace"][0]
        head = "| epoch | val LL | val RMSE | noise std |"
        if rdp:
            head += " row kappa (d) | row A | row log-radius std | column kappa (d) | column A |"
        lines += [f"## {run['label']} ({run['seconds']:.0f} s)", "", head,
                  "|" + "---|" * (head.count("|") - 1)]  # fmt: skip
        best = max(run["trace"], key=lambda r: r["val_ll"])
        for r in run["trace"]:
            mark = " (best)" if r is best else ""
            cells = f"| {r['epoch']}{mark} | {r['val_ll']:.3f} | {r['val_rmse']:.3f} | {r['noise_std']:.3f} |"
            if rdp:
                row, col = r["row"], r["column"]
                cells += (f" {row['kappa']:.4g} ({row['d']}) | {row['A']:.4f} | {row['log_radius_std']:.3f} |"
                          f" {col['kappa']:.4g} ({col['d']}) | {col['A']:.4f} |")  # fmt: skip
            lines.append(cells)
        lines.append("")
    lines += [f"![validation log-likelihood and concentration by epoch]({_stem(result)}.png)", ""]
    return "\n".join(lines)


def figure(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for run in result["runs"]:
        epochs = [r["epoch"] for r in run["trace"]]
        left.plot(epochs, [r["val_ll"] for r in run["trace"]], marker=".", label=run["label"])
        if "row" in run["trace"][0]:
            right.plot(epochs, [r["row"]["kappa"] for r in run["trace"]], marker=".", label=run["label"] + ": rows")
    left.set(xlabel="epoch", ylabel="validation log-likelihood (nats per point)", title="validation LL")
    right.set(xlabel="epoch", ylabel="row concentration kappa (per group: median)", yscale="log", title="first layer, rows")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="energy", help="a UCI set (default energy)")
    parser.add_argument("--split", type=int, default=0, help="standard split (default 0)")
    parser.add_argument("--scale", type=float, default=1.0, help="the searched prior scale (default 1.0)")
    parser.add_argument("--every", type=int, default=25, help="trace every this many epochs (default 25)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--no-train", action="store_true", help="re-render the page and figure from the saved JSON")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                        help="fit(compile=True), as the table's queue trains (default; --no-compile: eager)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.no_train:
        result = json.loads((OUT / f"{_stem(vars(args))}.json").read_text())
        (OUT / f"{_stem(result)}.md").write_text(render(result))
        figure(result, OUT / f"{_stem(result)}.png")
        return
    from varbnn_lab.engine import describe_device, git_commit

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    result: dict[str, Any] = {
        "name": "rdp-trace", "dataset": args.dataset, "split": args.split, "scale": args.scale,
        "command": " ".join(["python benchmarks/rdp_trace.py", *(argv if argv is not None else sys.argv[1:])]),
        "commit": git_commit(), "device": describe_device(torch.device("cpu")),
        "runs": [trace_run(label, base, options, args) for label, base, options in VARIANTS],
    }  # fmt: skip
    result["seconds"] = round(time.perf_counter() - start, 1)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{_stem(result)}.json").write_text(json.dumps(result, indent=2) + "\n")
    (OUT / f"{_stem(result)}.md").write_text(render(result))
    figure(result, OUT / f"{_stem(result)}.png")
    print(f"wrote {OUT / (_stem(result) + '.md')}")


if __name__ == "__main__":
    main()
