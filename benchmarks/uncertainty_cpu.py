"""The CPU-sized fair uncertainty benchmark (issue 63): varbnn's methods against what a careful user picks instead.

Task: the first ``--train-size`` (10,000) training images of MNIST or Fashion-MNIST, the next ``--val-size`` (5,000)
as the validation split, the whole test set (10,000) for the scores; out-of-distribution: the other dataset's test
images. Network: the MLP 784-200-200-10 (``--model mlp``) or LeNet-5 (``--model lenet5``), Adam at ``fit``'s
defaults (lr 1e-3, batch 128) unless a method says otherwise. Every method is what a user gets from the library's
documented recipe without tuning; the one choice made here (IVON's learning rate) is made on the validation split of
seed 0 (``--select``), never on the test set:

| method | training | after training |
|---|---|---|
| ``plain`` | ``--epochs`` (20) epochs, no validation | -- |
| ``plain-es`` | up to ``--max-epochs`` (40), ``fit(validation=..., early_stopping=5)`` (best epoch restored) | -- |
| ``plain-es-ts`` | as ``plain-es`` | ``TemperatureScaled`` fitted on the validation split |
| ``dropout-es`` | ``MCDropout(add_dropout(net, 0.1))``, early-stopped | -- |
| ``ensemble`` | 5 ``plain-es`` members (seeds differ), trained one after the other | ``DeepEnsemble`` |
| ``meanfield-es``, ``ktied-es``, ``radial-es`` | ``bayesianize(net, family())`` at the family's defaults, early-stopped | -- |
| ``*-ts`` | as the method | ``TemperatureScaled`` over the model's predictive, fitted on the validation split |
| ``ivon-es`` | ``bayesianize(net)`` trained by ``varbnn.optim.IVON`` (lr chosen on validation), early-stopped | -- |
| ``ivon-mix`` | 5 ``ivon-es`` members | ``DeepEnsemble`` (a mixture of posteriors) |
| ``meanfield-conv``, ``ktied-conv`` | ``plain-es``'s network converted (``bayesianize(net, family())``), 2 more epochs | -- |
| ``ivon-conv`` | ``plain-es``'s network converted, 2 more epochs by IVON (chosen lr, ``hess_init=None``) | -- |

Scores on the test split: accuracy, NLL, ECE (15 bins), OOD AUROC by predictive entropy; training seconds (the whole
``fit`` calls, validation passes included, summed over members), predict seconds of the test + OOD sets at
``--draws`` (32) draws, and the fewest draws whose validation NLL is within 1% of the 64-draw NLL. Each finished
(method, seed) is appended to ``OUT/runs.jsonl`` at once (a killed run resumes where it stopped);
``--summarize`` writes ``OUT/<dataset>-<model>.json`` / ``.md``: means ± standard errors, per-seed wins and the
issue's goals.

    .venv/bin/python benchmarks/uncertainty_cpu.py --dataset fashion-mnist --model mlp [--seeds 0 1 2] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from report import commit_of, device_name, write_result  # noqa: E402

import varbnn  # noqa: E402
from varbnn import metrics  # noqa: E402
from varbnn.baselines import DeepEnsemble, MCDropout, add_dropout  # noqa: E402
from varbnn.calibration import TemperatureScaled  # noqa: E402
from varbnn.data import load_fashion_mnist, load_mnist  # noqa: E402
from varbnn.models import lenet5  # noqa: E402
from varbnn.moments import moment_support  # noqa: E402
from varbnn.optim import IVON  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "uncertainty-cpu"
LOADERS = {"mnist": load_mnist, "fashion-mnist": load_fashion_mnist}
OOD = {"mnist": "fashion-mnist", "fashion-mnist": "mnist"}
METHODS = (
    "plain", "plain-es", "plain-es-ts", "dropout-es", "ensemble",
    "meanfield-es", "meanfield-es-ts", "ktied-es", "ktied-es-ts", "radial-es", "radial-es-ts",
    "ivon-es", "ivon-es-ts", "ivon-mix",
    "meanfield-es-ts-m", "ktied-es-ts-m", "ivon-es-ts-m",
    "meanfield-conv-ts", "ktied-conv-ts", "meanfield-conv-ts-m", "ktied-conv-ts-m",
    "ivon-conv-ts", "ivon-conv-ts-m",
)  # fmt: skip
"""``-conv``: the user's path of the converted experiments (uncertainty-*-converted): the early-stopped plain network
converted and trained ``CONVERT_EPOCHS`` more epochs; its training seconds include the plain network's."""
"""``-ts-m``: the method's recipe with the one-pass moment predictive everywhere (fit's validation, the temperature,
the test predictions: ``predictive="moments"``). fit's validation reads the moment predictive by default
(``validation_predictive="auto"``) for MeanField, KTied and IVON's MeanField networks, so ``-ts-m`` shares the ``-es``
run's training (and its seconds) and differs in the temperature and the predictions only; early stopping of Radial
and MC dropout reads weight draws (no moment propagation)."""
BASELINE_METHODS = ("plain", "plain-es", "plain-es-ts", "dropout-es", "ensemble")
MEMBERS = 5
PATIENCE = 5
CONVERT_EPOCHS = 2
"""Epochs of variational training after converting the trained plain network: the lab's converted experiments' number
(varbnn_lab.registry.CONVERT_EPOCHS, fixed there before any run), not tuned here."""
CURVE_DRAWS = (1, 2, 4, 8, 16, 32, 64)
IVON_GRID = ((0.03, 0.1), (0.01, 0.03), (0.3, None))
"""IVON's (lr, hess_init) candidates (None: from the family's initial std, h0 ~ 1 here); the validation NLL picks one."""


def _net(model: str) -> nn.Module:
    if model == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(), nn.Linear(200, 10))
    return lenet5()


def _commit() -> str:
    return commit_of(ROOT)


def _device_name(device: torch.device) -> str:
    return device_name(device)


def load(dataset: str, train_size: int, val_size: int, test_limit: int | None) -> dict[str, torch.Tensor]:
    x, y = LOADERS[dataset]("train")
    xt, yt = LOADERS[dataset]("test")
    xo, _ = LOADERS[OOD[dataset]]("test")
    if test_limit:
        xt, yt, xo = xt[:test_limit], yt[:test_limit], xo[:test_limit]
    return {
        "x_train": x[:train_size], "y_train": y[:train_size],
        "x_val": x[train_size : train_size + val_size], "y_val": y[train_size : train_size + val_size],
        "x_test": xt, "y_test": yt, "x_ood": xo,
    }  # fmt: skip


class Run:
    """One (method, seed): trains, then scores."""

    def __init__(
        self,
        args: argparse.Namespace,
        data: dict[str, torch.Tensor],
        device: torch.device,
        ivon: tuple[float, float | None],
        ivon_options: dict[str, Any] | None = None,
    ) -> None:
        self.args, self.data, self.device, self.ivon = args, data, device, ivon
        self.ivon_options = dict(ivon_options or {})  # more IVON keywords (benchmarks/ivon_classification_clip.py)
        self.cache: dict[tuple[str, int], tuple[nn.Module, float, int]] = {}  # (method, seed) -> trained (_trained)

    def _loader(self, seed: int) -> DataLoader:
        g = torch.Generator().manual_seed(seed)
        dataset = TensorDataset(self.data["x_train"], self.data["y_train"])
        return DataLoader(dataset, batch_size=128, shuffle=True, generator=g)

    def train_one(
        self, kind: str, seed: int, ivon: tuple[float, float | None] | None = None, validation_predictive: str | None = None
    ) -> tuple[nn.Module, float, int]:
        """A trained network of ``kind`` (plain, plain-es, dropout-es, <family>-es, ivon-es, <family>-conv), its fit
        seconds and epochs trained."""
        if kind.endswith("-conv"):
            return self.train_converted(kind.removesuffix("-conv"), seed)
        torch.manual_seed(seed)
        net = _net(self.args.model)
        optimizer = None
        kwargs: dict[str, Any] = {}
        if kind == "dropout-es":
            net = MCDropout(add_dropout(net, 0.1))
        elif kind in ("meanfield-es", "ktied-es", "radial-es"):
            family = {"meanfield-es": varbnn.MeanField, "ktied-es": varbnn.KTied, "radial-es": varbnn.Radial}[kind]
            net = varbnn.bayesianize(net, family())
        elif kind == "ivon-es":
            net = varbnn.bayesianize(net)
        net = net.to(self.device)
        n = len(self.data["x_train"])
        if kind == "ivon-es":
            lr, hess_init = ivon if ivon is not None else self.ivon
            optimizer = IVON(net, n_data=n, lr=lr, hess_init=hess_init, **self.ivon_options)
        epochs = self.args.epochs if kind == "plain" else self.args.max_epochs
        if kind != "plain":
            kwargs = {"validation": (self.data["x_val"], self.data["y_val"]), "early_stopping": PATIENCE}
            if validation_predictive is not None:  # else fit's default
                kwargs["validation_predictive"] = validation_predictive
        t0 = time.perf_counter()
        history = varbnn.fit(net, self._loader(seed), n_data=n, epochs=epochs, optimizer=optimizer, progress=False, **kwargs)
        return net, time.perf_counter() - t0, len(history)

    def train_converted(self, family: str, seed: int) -> tuple[nn.Module, float, int]:
        """The ``plain-es`` network of ``seed`` converted with ``bayesianize(pretrained=True)`` to ``family`` at its
        defaults and trained ``CONVERT_EPOCHS`` more epochs by fit (validation and early stopping as the other
        methods': the better of the two epochs is restored); seconds and epochs include the plain network's.
        ``family="ivon"``: the MeanField conversion trained by IVON at the page's chosen lr, its initial curvature
        taken from the converted std (``hess_init=None``, IVON's default for a converted network)."""
        plain, plain_seconds, plain_epochs = self._trained("plain-es", seed)
        torch.manual_seed(seed)
        posterior = {"meanfield": varbnn.MeanField, "ktied": varbnn.KTied, "ivon": varbnn.MeanField}[family]()
        net = varbnn.bayesianize(plain, posterior).to(self.device)
        n = len(self.data["x_train"])
        optimizer = IVON(net, n_data=n, lr=self.ivon[0], **self.ivon_options) if family == "ivon" else None
        t0 = time.perf_counter()
        history = varbnn.fit(net, self._loader(seed), n_data=n, epochs=CONVERT_EPOCHS, optimizer=optimizer,
                             progress=False, validation=(self.data["x_val"], self.data["y_val"]),
                             early_stopping=PATIENCE)  # fmt: skip
        return net, plain_seconds + time.perf_counter() - t0, plain_epochs + len(history)

    def _trained(self, base: str, seed: int) -> tuple[nn.Module, float, int]:
        """``train_one(base, seed)``, run once per (base, seed): the ``-ts`` and ``-ts-m`` rows reuse the ``-es`` row's
        training (a copy of the network, and its seconds), as a user who calibrates a trained model would."""
        if (base, seed) not in self.cache:
            self.cache[(base, seed)] = self.train_one(base, seed)
        net, seconds, epochs = self.cache[(base, seed)]
        return copy.deepcopy(net), seconds, epochs

    def warm_up(self) -> None:
        """One untimed epoch of each kind of training on 512 images: the process's first steps (allocator, kernels,
        lazy initialisation) take seconds that no method should be charged."""
        keep = self.data
        self.data = {**keep, "x_train": keep["x_train"][:512], "y_train": keep["y_train"][:512]}
        epochs = self.args.epochs, self.args.max_epochs
        self.args.epochs = self.args.max_epochs = 1
        try:
            for kind in ("plain", "dropout-es", "meanfield-es", "ktied-es", "radial-es", "ivon-es"):
                self.train_one(kind, 0)
        finally:
            self.data, (self.args.epochs, self.args.max_epochs) = keep, epochs

    def train(self, method: str, seed: int) -> tuple[nn.Module, float, int]:
        if method.endswith("-ts-m"):  # the moment predictive in validation (fit's default here), temperature and test
            net, seconds, epochs = self._trained(method.removesuffix("-ts-m"), seed)
            if not _moments_follow(net):
                raise RuntimeError(f"{method}: fit's default validation predictive is not the moment one for this model")
            x_val, y_val = self.data["x_val"].to(self.device), self.data["y_val"].to(self.device)
            t0 = time.perf_counter()
            net = TemperatureScaled(net).fit(x_val, y_val, samples=self.args.draws, predictive="moments")
            return net, seconds + time.perf_counter() - t0, epochs
        base = method.removesuffix("-ts")
        if base in ("ensemble", "ivon-mix"):
            kind = "plain-es" if base == "ensemble" else "ivon-es"
            members, seconds, epochs = [], 0.0, 0
            member_seconds = []
            for m in range(MEMBERS):
                net, s, e = self.train_one(kind, 1000 * seed + m)
                members.append(net)
                seconds, epochs = seconds + s, epochs + e
                member_seconds.append(s)
            ensemble = DeepEnsemble(members)
            ensemble.member_seconds = member_seconds  # type: ignore[assignment]  # for the equal-time mixture scores
            return ensemble, seconds, epochs
        net, seconds, epochs = self._trained(base, seed)
        if method.endswith("-ts"):
            x_val, y_val = self.data["x_val"].to(self.device), self.data["y_val"].to(self.device)
            t0 = time.perf_counter()
            net = TemperatureScaled(net).fit(x_val, y_val, samples=None if base.startswith("plain") else self.args.draws)
            seconds += time.perf_counter() - t0
        return net, seconds, epochs


def _threads_flag(records: list[dict[str, Any]]) -> str:
    """`` --threads N`` for the recorded command when the runs used other than the default 1 thread."""
    threads = {r["device"].rsplit(", ", 1)[-1] for r in records if r.get("device")}
    return "" if threads <= {"1 thread"} else " --threads " + "/".join(sorted(t.split()[0] for t in threads))


def _moments_follow(model: nn.Module) -> bool:
    """Whether the moment predictive follows ``model`` (what fit's default validation predictive reads then)."""
    return moment_support(model) is None


def _draws(model: nn.Module, x: torch.Tensor, samples: int, seed: int, predictive: str = "sample") -> torch.Tensor:
    return varbnn.predict(model, x, samples=samples, seed=seed, batch_size=2000, predictive=predictive).float()


def _stochastic(method: str) -> bool:
    return method not in ("plain", "plain-es", "plain-es-ts", "ensemble")


def score(model: nn.Module, method: str, data: dict[str, torch.Tensor], draws: int, device: torch.device) -> dict[str, Any]:
    """Test scores of the ``draws``-draw predictive, its predict seconds, and the validation NLL-vs-draws curve."""
    model.eval()
    x_test, y_test = data["x_test"].to(device), data["y_test"].to(device)
    x_ood = data["x_ood"].to(device)
    samples = draws if _stochastic(method) else 1
    t0 = time.perf_counter()
    with torch.no_grad():
        predictive = "moments" if method.endswith("-ts-m") else "sample"
        test_logits = _draws(model, x_test, samples, seed=1, predictive=predictive)
        ood_logits = _draws(model, x_ood, samples, seed=2, predictive=predictive)
    predict_seconds = time.perf_counter() - t0
    probs = test_logits.softmax(-1).mean(0).double()
    ood_probs = ood_logits.softmax(-1).mean(0).double()
    entropy = lambda p: -(p * p.clamp_min(1e-300).log()).sum(-1)  # noqa: E731
    scores_ood = torch.cat([entropy(probs), entropy(ood_probs)])
    labels_ood = torch.cat([torch.zeros(len(probs)), torch.ones(len(ood_probs))])
    out: dict[str, Any] = {
        "accuracy": metrics.accuracy(probs, y_test.cpu()),
        "nll": metrics.negative_log_likelihood(probs, y_test.cpu()),
        "ece": metrics.expected_calibration_error(probs, y_test.cpu()),
        "ood_auroc_entropy": metrics.auroc(scores_ood, labels_ood),
        "predict_seconds": predict_seconds,
        "draws": samples,
    }
    if _stochastic(method):  # OOD by mutual information (epistemic part alone), against the entropy's AUROC above
        mi = lambda draws, p: entropy(p) - entropy(draws.softmax(-1).double()).mean(0)  # noqa: E731
        scores_mi = torch.cat([mi(test_logits, probs), mi(ood_logits, ood_probs)])
        out["ood_auroc_mi"] = metrics.auroc(scores_mi, labels_ood)
    if method == "ivon-mix":  # the mixture of the first k members (k = 1..5) and their summed training seconds
        members = list(model.members)  # type: ignore[union-attr]
        by_k, seconds_k = {}, []
        for k in range(1, len(members) + 1):
            part = members[0] if k == 1 else DeepEnsemble(members[:k])
            with torch.no_grad():
                p = _draws(part, x_test, draws, seed=1).softmax(-1).mean(0).double()
            by_k[str(k)] = metrics.negative_log_likelihood(p, y_test.cpu())
            seconds_k.append(sum(model.member_seconds[:k]))  # type: ignore[union-attr]
        out["nll_by_members"], out["train_seconds_by_members"] = by_k, seconds_k
    if _stochastic(method) and not method.endswith("-ts-m"):  # validation NLL of the first S of 64 draws, fewest within 1%
        x_val, y_val = data["x_val"].to(device), data["y_val"].cpu()
        with torch.no_grad():
            val_probs = _draws(model, x_val, max(CURVE_DRAWS), seed=3).softmax(-1).double()
        curve = {s: metrics.negative_log_likelihood(val_probs[:s].mean(0), y_val) for s in CURVE_DRAWS}
        out["val_nll_by_draws"] = {str(s): v for s, v in curve.items()}
        out["draws_needed"] = min(s for s, v in curve.items() if v <= 1.01 * curve[max(CURVE_DRAWS)])
    return out


def plain_forward_seconds(data: dict[str, torch.Tensor], model_name: str, device: torch.device) -> float:
    """One plain network's forward pass over the test + OOD sets (the unit of goal (d)), median of 5."""
    net = _net(model_name).to(device).eval()
    x = torch.cat([data["x_test"], data["x_ood"]]).to(device)
    times = []
    with torch.no_grad():
        for _ in range(5):
            t0 = time.perf_counter()
            for chunk in x.split(2000):
                net(chunk)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def ivon_grid_point(
    runner: Run, data: dict[str, torch.Tensor], device: torch.device, lr: float, hess_init: float | None, draws: int
) -> dict[str, Any]:
    """One candidate of IVON's choice: the early-stopped ``ivon-es`` run on seed 0 at (lr, hess_init) and its
    validation NLL at ``draws`` weight draws (seed 3), with its training seconds and epochs."""
    net, seconds, epochs = runner.train_one("ivon-es", 0, ivon=(lr, hess_init))
    net.eval()
    with torch.no_grad():
        probs = _draws(net, data["x_val"].to(device), draws, seed=3).softmax(-1).mean(0).double()
    return {"lr": lr, "hess_init": hess_init, "val_nll": metrics.negative_log_likelihood(probs, data["y_val"]),
            "seconds": seconds, "epochs": epochs}  # fmt: skip


def select_ivon(
    args: argparse.Namespace, data: dict[str, torch.Tensor], device: torch.device, out: Path
) -> tuple[float, float | None]:
    """IVON's (lr, hess_init): the lowest validation NLL of the early-stopped run on seed 0 (stored in OUT)."""
    path = out / f"ivon-{args.dataset}-{args.model}{'-quick' if args.quick else ''}.json"
    if path.exists():
        chosen = json.loads(path.read_text())
        return float(chosen["lr"]), chosen["hess_init"]
    runner = Run(args, data, device, IVON_GRID[0])
    found = {}
    for lr, hess_init in IVON_GRID:
        found[f"{lr},{hess_init}"] = ivon_grid_point(runner, data, device, lr, hess_init, args.draws)
        print(f"ivon lr {lr} hess_init {hess_init}: {found[f'{lr},{hess_init}']}", file=sys.stderr)
    best = found[min(found, key=lambda k: found[k]["val_nll"])]
    path.write_text(json.dumps({**best, "candidates": found, "commit": _commit()}, indent=2) + "\n")
    return float(best["lr"]), best["hess_init"]


def run(args: argparse.Namespace) -> None:
    device = torch.device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs_path = out / "runs.jsonl"
    data = load(args.dataset, args.train_size, args.val_size, 500 if args.quick else None)
    done = set()
    if runs_path.exists():
        for line in runs_path.read_text().splitlines():
            r = json.loads(line)
            done.add((r["dataset"], r["model"], r["method"], r["seed"]))
    ivon = select_ivon(args, data, device, out) if any(m.startswith("ivon") for m in args.methods) else IVON_GRID[0]
    runner = Run(args, data, device, ivon)
    runner.warm_up()
    unit = plain_forward_seconds(data, args.model, device)
    for seed in args.seeds:
        for method in args.methods:
            key = (args.dataset, args.model, method, seed)
            if key in done:
                continue
            t0 = time.perf_counter()
            model, train_seconds, epochs = runner.train(method, seed)
            scores = score(model, method, data, args.draws, device)
            record = {
                "dataset": args.dataset, "model": args.model, "method": method, "seed": seed,
                "train_seconds": train_seconds, "epochs": epochs, **scores,
                "plain_forward_seconds": unit, "ivon": _ivon_record(method, ivon),
                "load_average": os.getloadavg()[0],
                "commit": _commit(), "device": _device_name(device), "seconds": time.perf_counter() - t0,
                "quick": bool(args.quick),
            }  # fmt: skip
            with runs_path.open("a") as f:
                f.write(json.dumps(record) + "\n")
            print(f"{method} seed {seed}: NLL {scores['nll']:.4f} ECE {scores['ece']:.4f} AUROC "
                  f"{scores['ood_auroc_entropy']:.4f} train {train_seconds:.1f}s", file=sys.stderr, flush=True)  # fmt: skip


# -- the summary -----------------------------------------------------------------------------------------------------


def _ivon_record(method: str, ivon: tuple[float, float | None]) -> list[float | None] | None:
    """The (lr, hess_init) an IVON method trained with: the chosen pair, or for ``ivon-conv`` the chosen lr with the
    curvature from the converted std (None)."""
    if not method.startswith("ivon"):
        return None
    return [ivon[0], None] if method.startswith("ivon-conv") else list(ivon)


def _mean_se(values: list[float]) -> tuple[float, float]:
    return metrics.mean_and_standard_error(values)


def summarize(args: argparse.Namespace) -> None:
    out = Path(args.out)
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    records = [r for r in records if r["dataset"] == args.dataset and r["model"] == args.model and not r["quick"]]
    if not records:
        raise SystemExit(f"no runs of {args.dataset}/{args.model} in {out / 'runs.jsonl'}")
    by: dict[str, dict[int, dict[str, Any]]] = {}
    for r in records:
        by.setdefault(r["method"], {})[r["seed"]] = r
    methods = [m for m in METHODS if m in by]
    seeds = sorted({r["seed"] for r in records})
    plain_time = statistics.mean(r["train_seconds"] for r in by["plain"].values()) if "plain" in by else float("nan")
    rows = []
    for m in methods:
        row: dict[str, Any] = {"method": m, "seeds": sorted(by[m])}
        for key in ("accuracy", "nll", "ece", "ood_auroc_entropy", "ood_auroc_mi", "train_seconds", "predict_seconds",
                    "epochs"):  # fmt: skip
            if all(key in by[m][s] for s in by[m]):
                row[key], row[f"{key}_se"] = _mean_se([by[m][s][key] for s in sorted(by[m])])
        row["train_vs_plain"] = row["train_seconds"] / plain_time
        unit = statistics.mean(by[m][s]["plain_forward_seconds"] for s in sorted(by[m]))
        row["predict_vs_plain_forward"] = row["predict_seconds"] / unit
        if "draws_needed" in next(iter(by[m].values())):
            row["draws_needed"] = max(by[m][s]["draws_needed"] for s in by[m])
        rows.append(row)
    per_seed = {m: {str(s): {k: by[m][s][k] for k in ("nll", "ece", "ood_auroc_entropy")} for s in sorted(by[m])}
                for m in methods}  # fmt: skip
    goal_lines, goals = _goals(by, methods, seeds)
    commits = sorted({r["commit"] for r in records})
    devices = sorted({r["device"] for r in records})
    result = {
        "command": f"python benchmarks/uncertainty_cpu.py --dataset {args.dataset} --model {args.model} "
        f"--seeds {' '.join(map(str, seeds))}" + _threads_flag(records),
        "commit": ", ".join(commits),
        "summary_commit": _commit(),
        "device": ", ".join(devices),
        "seconds": sum(r["seconds"] for r in records),
        "dataset": args.dataset, "model": args.model, "seeds": seeds,
        "ivon": next((r["ivon"] for r in records if r.get("ivon") and r["method"].startswith("ivon-es")), None),
        "load_average_max": max(r["load_average"] for r in records),
        "rows": rows, "per_seed": per_seed, "goals": goals,
    }  # fmt: skip
    table = [
        "| method | accuracy | test NLL | ECE | OOD AUROC (entropy) | OOD AUROC (mutual information) | epochs | "
        "training s (x plain) | predict s (x one plain pass) | draws for NLL within 1% of 64 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        table.append(
            f"| {r['method']} | {r['accuracy']:.4f} | {r['nll']:.4f} ± {r['nll_se']:.4f} | {r['ece']:.4f} ± "
            f"{r['ece_se']:.4f} | {r['ood_auroc_entropy']:.4f} | "
            f"{format(r['ood_auroc_mi'], '.4f') if 'ood_auroc_mi' in r else '-'} | {r['epochs']:.0f} | {r['train_seconds']:.1f} "
            f"({r['train_vs_plain']:.2f}x) | {r['predict_seconds']:.2f} ({r['predict_vs_plain_forward']:.0f}x) | "
            f"{r.get('draws_needed', '-')} |"
        )
    table += ["", "Per seed (test NLL):", "", "| method | " + " | ".join(f"seed {s}" for s in seeds) + " |",
              "|---|" + "---|" * len(seeds)]  # fmt: skip
    for m in methods:
        table.append(f"| {m} | " + " | ".join(f"{by[m][s]['nll']:.4f}" if s in by[m] else "-" for s in seeds) + " |")
    table += ["", "Goals of issue 63 (a goal is met on the means AND on a majority of seeds):", "", *goal_lines]
    notes = [
        f"{len(seeds)} seeds; {len(records)} runs; training {args.train_size} images, validation {args.val_size}, "
        f"test 10,000, OOD {OOD[args.dataset]} test; IVON (lr, hess_init) = {result['ivon']} (chosen on seed 0's "
        f"validation NLL from {list(IVON_GRID)})",
        f"1-minute load average at the end of each run: at most {result['load_average_max']:.1f} (2 cores; training "
        "times are comparable only within one page)",
        f"seconds (all runs): {result['seconds']:.0f}",
    ]
    write_result(out, f"{args.dataset}-{args.model}", result, f"Uncertainty, CPU form: {args.dataset}, {args.model}",
                 notes, table)  # fmt: skip


def _goals(by: dict[str, dict[int, dict[str, Any]]], methods: list[str], seeds: list[int]) -> tuple[list[str], dict[str, Any]]:
    """The issue's goals (a)-(c) on means and per seed (a majority of seeds must agree)."""

    def wins(a: str, b: str, key: str, lower: bool = True) -> tuple[int, int, bool]:
        common = [s for s in seeds if s in by.get(a, {}) and s in by.get(b, {})]
        won = sum((by[a][s][key] < by[b][s][key]) if lower else (by[a][s][key] > by[b][s][key]) for s in common)
        mean_a = statistics.mean(by[a][s][key] for s in common)
        mean_b = statistics.mean(by[b][s][key] for s in common)
        on_mean = mean_a < mean_b if lower else mean_a > mean_b
        return won, len(common), on_mean and 2 * won > len(common)

    lines, goals = [], {}
    varbnn_methods = [m for m in methods if m not in BASELINE_METHODS]
    families = [m for m in varbnn_methods if m.endswith("-es") or m.endswith("-es-ts")]
    if "plain-es" in by:
        for label, rows in (
            ("(a) every varbnn method by the library's recipe (early stopping + temperature scaling, the '-es-ts' rows)",
             [m for m in families if m.endswith("-es-ts")]),
            ("(a') the same without temperature scaling (the '-es' rows)", [m for m in families if m.endswith("-es")]),
        ):  # fmt: skip
            missing = []
            for m in rows:
                for key in ("nll", "ece"):
                    won, n, ok = wins(m, "plain-es", key)
                    if not ok:
                        missing.append(f"{m} {key} ({won}/{n} seeds)")
            goals["a" if label.startswith("(a)") else "a_without_ts"] = not missing
            lines.append(f"- {label}: NLL and ECE below the early-stopped plain net's: "
                         f"{'met' if not missing else 'not met: ' + ', '.join(missing)}")  # fmt: skip
    singles = [m for m in varbnn_methods if m != "ivon-mix"]
    if singles:
        best = min(singles, key=lambda m: statistics.mean(r["nll"] for r in by[m].values()))
        parts, ok_all = [], True
        for base in ("plain-es-ts", "dropout-es"):
            if base in by:
                won, n, ok = wins(best, base, "nll")
                won_a, n_a, ok_a = wins(best, base, "ood_auroc_entropy", lower=False)
                parts.append(f"vs {base}: NLL below on {won}/{n} seeds, AUROC above on {won_a}/{n_a}")
                ok_all = ok_all and ok and ok_a
        goals["b"] = ok_all
        lines.append(f"- (b) best single varbnn method ({best}) below plain+ES+TS and MC dropout on NLL, above on "
                     f"AUROC: {'met' if ok_all else 'not met'} ({'; '.join(parts)})")  # fmt: skip
        meeting = [
            m for m in singles
            if all(wins(m, base, "nll")[2] and wins(m, base, "ood_auroc_entropy", lower=False)[2]
                   for base in ("plain-es-ts", "dropout-es") if base in by)
        ]  # fmt: skip
        goals["b_met_by"] = meeting
        lines.append(f"- varbnn methods that meet (b)'s test themselves: {', '.join(meeting) or 'none'}")
        if "ensemble" in by and "plain" in by:
            nll_best = statistics.mean(r["nll"] for r in by[best].values())
            nll_ens = statistics.mean(r["nll"] for r in by["ensemble"].values())
            t_best = statistics.mean(r["train_seconds"] for r in by[best].values())
            t_plain = statistics.mean(r["train_seconds"] for r in by["plain"].values())
            ok_c1 = nll_best <= 1.05 * nll_ens and t_best <= 1.5 * t_plain
            goals["c1"] = ok_c1
            lines.append(f"- (c) {best} within 5% of the ensemble's NLL ({nll_best:.4f} vs {nll_ens:.4f}) at <= 1.5x "
                         f"plain's training time ({t_best / t_plain:.2f}x): {'met' if ok_c1 else 'not met'}")  # fmt: skip
            near = {
                m: statistics.mean(r["train_seconds"] for r in by[m].values()) / t_plain
                for m in singles if statistics.mean(r["nll"] for r in by[m].values()) <= 1.05 * nll_ens
            }  # fmt: skip
            goals["c1_met_by"] = [m for m, t in near.items() if t <= 1.5]
            lines.append("- single varbnn methods within 5% of the ensemble's NLL, with their training time: "
                         + (", ".join(f"{m} {t:.2f}x plain" for m, t in sorted(near.items(), key=lambda kv: kv[1]))
                            or "none"))  # fmt: skip
    if "ivon-mix" in by and "ensemble" in by:
        won, n, ok = wins("ivon-mix", "ensemble", "nll")
        t_mix = statistics.mean(r["train_seconds"] for r in by["ivon-mix"].values())
        t_ens = statistics.mean(r["train_seconds"] for r in by["ensemble"].values())
        goals["c2"] = ok
        lines.append(f"- (c) 5-member IVON mixture below the deep ensemble's NLL: {'met' if ok else 'not met'} "
                     f"({won}/{n} seeds; training time {t_mix / t_ens:.2f}x the ensemble's)")  # fmt: skip
        common = [s for s in seeds if s in by["ensemble"] and "nll_by_members" in by["ivon-mix"].get(s, {})]
        if common:  # at equal training time: the most members whose summed seconds fit in the ensemble's, per seed
            picked = []
            for s in common:
                r, budget = by["ivon-mix"][s], by["ensemble"][s]["train_seconds"]
                k = max([i + 1 for i, t in enumerate(r["train_seconds_by_members"]) if t <= budget], default=0)
                picked.append((s, k, r["nll_by_members"][str(k)] if k else float("inf"), by["ensemble"][s]["nll"]))
            won = sum(nll < ens for _, _, nll, ens in picked)
            finite = [nll for _, _, nll, _ in picked if nll != float("inf")]
            ok = (2 * won > len(picked) and len(finite) == len(picked)
                  and statistics.mean(finite) < statistics.mean(e for *_, e in picked))  # fmt: skip
            goals["c2_equal_time"] = ok
            lines.append(
                "- (c) IVON mixture at equal training time (the first k members whose summed training seconds fit in "
                "the ensemble's, per seed): " + ("met" if ok else "not met") + " ("
                + "; ".join(
                    f"seed {s}: k={k}, NLL {nll:.4f} vs {ens:.4f}" if k else
                    f"seed {s}: one member ({by['ivon-mix'][s]['train_seconds_by_members'][0]:.1f} s) already takes "
                    f"longer than the ensemble ({by['ensemble'][s]['train_seconds']:.1f} s)"
                    for s, k, nll, ens in picked
                ) + ")"
            )
    return lines, goals


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", choices=sorted(LOADERS), default="fashion-mnist")
    parser.add_argument("--model", choices=("mlp", "lenet5"), default="mlp")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--train-size", type=int, default=10_000)
    parser.add_argument("--val-size", type=int, default=5_000)
    parser.add_argument("--epochs", type=int, default=20, help="the plain baseline's fixed epochs")
    parser.add_argument("--max-epochs", type=int, default=40, help="the early-stopped methods' limit")
    parser.add_argument("--draws", type=int, default=32)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the committed pages' setting)")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 epochs, 500 test images")
    parser.add_argument("--summarize", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("VARBNN_DATA", str(ROOT.parent / "shared" / "data"))
    if args.quick:
        args.epochs, args.max_epochs = 2, 2
    if args.summarize:
        summarize(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
