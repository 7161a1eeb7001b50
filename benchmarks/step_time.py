"""Median training-step time (Adam) per family/estimator vs the deterministic model, in one process.

Models: ``mlp`` (784-400-400-10, batch 128; the default), ``lenet5`` (LeNet-5-Caffe, batch 100), ``resnet18``
(32x32 inputs, batch 32) and ``host`` (11 layers of 8 units at batch 4: a step's host time, which bounds an eager GPU
step), on ``--device cpu`` or ``cuda`` (steps synchronised on CUDA; throughput in images/s).

Usage: python benchmarks/step_time.py [--model mlp] [--device cpu] [--steps 30] [--repeats 10] [--warmup 20] [--threads 2]
       [--optimizer fit|adam] [--mc-samples 2,4] [--compile] [--only SUBSTRING,...] [--skip SUBSTRING] [--processes K]
       [--out benchmarks/results/step-time]
Every candidate (the deterministic baseline and the peers too) steps with the same optimizer: by default what
``varbnn.fit`` uses (Adam, fused where torch supports it), or ``--optimizer adam`` (torch.optim.Adam's defaults; files
get a ``_plain_adam`` suffix). Writes OUT/step_time[_MODEL][_DEVICE].json and .md (``step_time.json`` for the MLP on
the CPU) and prints the ratios. Peers (bayesian-torch, torchbnn) are included when importable (``bash
scripts/install_peers.sh``), in the same process and on the same model. ``--compile`` adds the rows of
``fit(compile=True)``'s step for the deterministic network and every family that compiles (their warm-up steps include
the compilation), and the peers' steps with their loss (NLL + their KL / N) compiled the same way (their rows carry the same
suffix; backward and optimizer eager, as in ``fit``). ``--processes K`` runs every candidate in K processes of its own,
all taking turns, instead of all candidates in one process: two processes of the same code can differ by several
percent for a whole run (``studies/ab_meanfield_a_a.md``), and the machine changes speed within a run
(``history/step_time_processes_acc6ebf.md``: deterministic steps of about 2.3 and 4.1 ms in one run). Its table adds
per-round ratios (two candidates compared within each round) to the deterministic step, the fastest peer and the
family's own floor, and how far each candidate's processes differ (files get a ``_processes`` suffix).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from report import write_result  # type: ignore[import-not-found]
from torch import nn
from tqdm.auto import tqdm

import varbnn
from varbnn.models import lenet5, mlp, resnet18
from varbnn.training import default_optimizer, keep_freed_memory, resolve_device
from varbnn.training.compiled import _compiled_elbo_step, _uses_cudagraphs
from varbnn.training.loop import _accumulated_elbo_gradient
from varbnn_lab.config import results_dir
from varbnn_lab.runner import describe_device, git_commit

N_TRAIN = 60000
OPTIMIZER = {"name": "fit"}  # "fit": varbnn.train.default_optimizer (Adam, fused where supported); "adam": torch's default
COMPILE = {"mode": "default"}  # --compile-mode: torch.compile's mode for the compiled rows ("reduce-overhead": CUDA graphs)
SLOW_STEPS = 10  # steps per round for the Graves estimator's row
MODELS = {  # name: (builder, input shape without batch, default batch, description)
    "mlp": (lambda: mlp(784, (400, 400), 10), (1, 28, 28), 128, "MLP 784-400-400-10"),
    "lenet5": (lambda: lenet5(), (1, 28, 28), 100, "LeNet-5-Caffe"),
    "resnet18": (lambda: resnet18(), (3, 32, 32), 32, "ResNet-18 (32x32 inputs)"),
    # 11 layers of 8 units at batch 4: the arithmetic is negligible, so a step's time is its host time (Python, autograd
    # and dispatch), which is what bounds an eager step on a GPU (where kernels run asynchronously)
    "host": (lambda: mlp(8, (8,) * 10, 10), (8,), 4, "MLP 8-(8x10)-10 (host time per step)"),
}


def _optimizer(params: Any) -> torch.optim.Optimizer:
    if OPTIMIZER["name"] == "fit":
        return default_optimizer(params, 1e-3)
    return torch.optim.Adam(params, lr=1e-3)


def make_step(
    model: nn.Module,
    kl_fn: Callable[[], torch.Tensor] | None,
    elbo: bool = False,
    mc_samples: int = 1,
    compiled: bool = False,
    device: torch.device | None = None,
) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """One Adam step on ``nll + kl / N``: varbnn models through ``varbnn.elbo_loss`` (``elbo``; it also adds the
    RDP rejection-score term), peers with their own KL function. ``mc_samples`` > 1: the gradient of ``varbnn.fit(...,
    mc_samples=S)``, S one-draw ELBO gradients accumulated (one backward per draw). ``compiled``: the step of
    ``varbnn.fit(..., compile=True)`` (the loss and its backward through torch.compile; a plain network's loss is
    compiled the same way, without a KL)."""
    opt = _optimizer(model.parameters())
    graves = any(getattr(m, "estimator", None) == "graves" for m in model.modules())
    if compiled:
        if elbo:
            mode = True if COMPILE["mode"] == "default" else COMPILE["mode"]
            compiled_step = _compiled_elbo_step(model, F.cross_entropy, N_TRAIN, device or torch.device("cpu"), mode)
        elif kl_fn is None:
            loss_fn = torch.compile(lambda x, y: F.cross_entropy(model(x), y), mode=COMPILE["mode"])
        else:  # a peer: its loss (NLL + its own KL / N) through torch.compile with the same settings, backward after
            loss_fn = torch.compile(lambda x, y: F.cross_entropy(model(x), y) + kl_fn() / N_TRAIN, mode=COMPILE["mode"])
        graphs = device is not None and _uses_cudagraphs(COMPILE["mode"], device)

        def fast(x: torch.Tensor, y: torch.Tensor) -> None:
            opt.zero_grad(set_to_none=True)
            if elbo:
                compiled_step(x, y, 1.0, 1)
            else:
                if graphs:  # what _compiled_elbo_step does: each step a new generation of the cudagraph trees
                    torch.compiler.cudagraph_mark_step_begin()
                loss_fn(x, y).backward()
            opt.step()

        return fast

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        if graves:  # what fit() does for MeanField(estimator="graves"): per-example gradients, Fisher variance gradient
            opt.zero_grad(set_to_none=True)
            varbnn.objectives.graves_gradients(model, x, y, n_data=N_TRAIN)
            opt.step()
            return
        if mc_samples > 1:
            opt.zero_grad(set_to_none=True)
            _accumulated_elbo_gradient(model, model, x, y, F.cross_entropy, N_TRAIN, 1.0, mc_samples)
            opt.step()
            return
        nll = F.cross_entropy(model(x), y)
        if elbo:
            loss = varbnn.elbo_loss(nll, model, N_TRAIN).loss
        else:
            loss = nll + kl_fn() / N_TRAIN if kl_fn is not None else nll
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def time_steps(
    step: Callable[[torch.Tensor, torch.Tensor], None],
    steps: int,
    warmup: int,
    shape: tuple[int, ...],
    batch: int,
    device: torch.device,
) -> list[float]:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch, *shape, generator=g).to(device)
    y = torch.randint(0, 10, (batch,), generator=g).to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        step(x, y)
    times = []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        step(x, y)
        sync()
        times.append(time.perf_counter() - t0)
    return times


def floor_step(
    base: Callable[[], nn.Module], device: torch.device, draw_noise: bool, twin: bool
) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """A lower bound for a family's step, not a family: the deterministic step plus only the work that every mean-field
    Gaussian estimator of a kind must do. Every such family also trains a second tensor (the stds) per weight, so Adam
    updates twice the parameters (the second set's gradient is fixed). ``draw_noise``: one N(0, 1) draw per weight
    and step (any family that samples whole weights: reparameterization, Radial, flipout); ``twin``: a second network
    applied to ``x * x`` in forward and backward (local reparameterization's variance product ``x^2 sigma^2^T`` and its
    gradients, per layer)."""
    model, second = base().to(device), base().to(device)
    for p in second.parameters():
        p.grad = torch.randn_like(p)  # kept across steps: only `model` is zeroed
    opt = _optimizer([*model.parameters(), *second.parameters()])
    shapes = [(p.shape, p.dtype) for p in model.parameters()]

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        if draw_noise:
            for shape, dtype in shapes:
                torch.randn(shape, dtype=dtype, device=device)
        model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        if twin:
            second.zero_grad(set_to_none=True)
            loss = loss + F.cross_entropy(second(x * x), y)
        loss.backward()
        opt.step()

    return step


def _torchbnn_convert(module: nn.Module, torchbnn: Any) -> None:
    """Swap every Linear / Conv2d for torchbnn's Bayesian layer with a N(0, 1) prior (its own converter is
    deprecated and handles only Sequential children)."""
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            new: nn.Module = torchbnn.BayesLinear(0.0, 1.0, child.in_features, child.out_features, bias=child.bias is not None)
        elif isinstance(child, nn.Conv2d):
            new = torchbnn.BayesConv2d(0.0, 1.0, child.in_channels, child.out_channels, child.kernel_size,
                                       stride=child.stride, padding=child.padding, bias=child.bias is not None)  # fmt: skip
        else:
            _torchbnn_convert(child, torchbnn)
            continue
        setattr(module, name, new)


def compiled_suffix(device: torch.device | None = None) -> str:
    """The compiled rows' name suffix: ``, fit(compile=True)`` (the default mode: on a GPU, ``fit(compile=True)``
    records CUDA graphs since 2026-11-27, so the rows say ``compile='default'`` there), or ``, fit(compile='MODE')``."""
    if COMPILE["mode"] == "default" and (device is None or device.type == "cpu"):
        return ", fit(compile=True)"
    return f", fit(compile={COMPILE['mode']!r})"


def candidates(
    model_name: str, device: torch.device, mc_samples: tuple[int, ...] = (), compiled: bool = False
) -> dict[str, Callable[[], Callable[[torch.Tensor, torch.Tensor], None]]]:
    """The timed candidates; ``mc_samples`` adds MeanField rows whose steps average S > 1 weight draws; ``compiled``
    adds the rows of ``fit(compile=True)``'s step for the deterministic network and every family that compiles."""
    base = MODELS[model_name][0]

    def plain(compile_it: bool = False) -> Callable[[torch.Tensor, torch.Tensor], None]:
        return make_step(base().to(device), None, compiled=compile_it, device=device)

    def family(
        spec: Callable[[], varbnn.VariationalFamily],
        prior: Callable[[], varbnn.priors.Prior] | None = None,
        samples: int = 1,
        compile_it: bool = False,
    ) -> Callable[[], Callable[[torch.Tensor, torch.Tensor], None]]:
        def build() -> Callable[[torch.Tensor, torch.Tensor], None]:
            model = varbnn.bayesianize(base(), spec(), prior() if prior else None).to(device)
            return make_step(model, None, elbo=True, mc_samples=samples, compiled=compile_it, device=device)

        return build

    table: dict[str, Callable[[], Callable[[torch.Tensor, torch.Tensor], None]]] = {
        "deterministic": plain,
        "varbnn Delta (MAP, Normal prior)": family(lambda: varbnn.Delta()),
    }
    for estimator in ("reparam", "local", "flipout"):
        table[f"varbnn MeanField-{estimator}"] = family(lambda e=estimator: varbnn.MeanField(estimator=e))
    if not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in base().modules()):
        # per-example gradients are undefined under BatchNorm in training mode (varbnn.objectives refuses them)
        table["varbnn MeanField-graves (per-example draws, Fisher variance gradient)"] = family(
            lambda: varbnn.MeanField(estimator="graves")
        )
    for samples in mc_samples:
        if samples > 1:
            for estimator in ("reparam", "local"):
                spec = lambda e=estimator: varbnn.MeanField(estimator=e)  # noqa: E731
                table[f"varbnn MeanField-{estimator}, S={samples} draws per step"] = family(spec, samples=samples)
    for estimator in ("reparam", "local"):
        table[f"varbnn KTied(rank=2)-{estimator}"] = family(lambda e=estimator: varbnn.KTied(rank=2, estimator=e))
    table["varbnn Radial-reparam (MC cross-entropy)"] = family(lambda: varbnn.Radial())
    table["varbnn Radial-reparam (closed-form cross-entropy)"] = family(lambda: varbnn.Radial(cross_entropy="closed_form"))
    table["varbnn Radial-flipout (MC cross-entropy)"] = family(lambda: varbnn.Radial(estimator="flipout"))
    table["floor: deterministic + one N(0, 1) draw per weight + Adam on 2x parameters"] = lambda: floor_step(
        base, device, draw_noise=True, twin=False
    )
    table["floor: deterministic + a second network on x^2 (local reparam.) + Adam on 2x parameters"] = lambda: floor_step(
        base, device, draw_noise=False, twin=True
    )
    for grouping in ("row", "double"):
        table[f"varbnn RadialDirectional({grouping})"] = family(
            lambda g=grouping: varbnn.RadialDirectional(grouping=g), varbnn.RadialDirectionalPrior
        )
    if compiled:
        tag = compiled_suffix(device)
        table["deterministic, compiled" + ("" if COMPILE["mode"] == "default" else f" ({COMPILE['mode']})")] = lambda: plain(
            compile_it=True
        )
        table[f"varbnn Delta (MAP, Normal prior){tag}"] = family(lambda: varbnn.Delta(), compile_it=True)
        for estimator in ("reparam", "local", "flipout"):
            table[f"varbnn MeanField-{estimator}{tag}"] = family(
                lambda e=estimator: varbnn.MeanField(estimator=e), compile_it=True
            )
        for estimator in ("reparam", "local"):
            table[f"varbnn KTied(rank=2)-{estimator}{tag}"] = family(
                lambda e=estimator: varbnn.KTied(rank=2, estimator=e), compile_it=True
            )
        table[f"varbnn Radial-reparam (MC cross-entropy){tag}"] = family(lambda: varbnn.Radial(), compile_it=True)
        for grouping in ("row", "double"):
            table[f"varbnn RadialDirectional({grouping}){tag}"] = family(
                lambda g=grouping: varbnn.RadialDirectional(grouping=g), varbnn.RadialDirectionalPrior, compile_it=True
            )
    peer_modes = [(False, "")] + ([(True, compiled_suffix(device))] if compiled else [])  # the same row suffix
    try:  # optional peers; with --compile also compiled as fit(compile=True) compiles varbnn's loss (same mode)
        from bayesian_torch.models.dnn_to_bnn import dnn_to_bnn, get_kl_loss

        for (compile_it, tag), kind in [(m, k) for m in peer_modes for k in ("Reparameterization", "Flipout")]:

            def bt(kind: str = kind, compile_it: bool = compile_it) -> Callable[[torch.Tensor, torch.Tensor], None]:
                model = base()
                dnn_to_bnn(
                    model,
                    {
                        "prior_mu": 0.0,
                        "prior_sigma": 1.0,
                        "posterior_mu_init": 0.0,
                        "posterior_rho_init": -3.0,
                        "type": kind,
                        "moped_enable": False,
                    },
                )
                model = model.to(device)
                return make_step(model, lambda: get_kl_loss(model), compiled=compile_it, device=device)

            table[f"bayesian-torch {kind}{tag}"] = bt
    except ImportError:
        pass
    try:
        import torchbnn

        for compile_it, tag in peer_modes:

            def tb(compile_it: bool = compile_it) -> Callable[[torch.Tensor, torch.Tensor], None]:
                model = base()
                _torchbnn_convert(model, torchbnn)
                model = model.to(device)
                kl = torchbnn.BKLLoss(reduction="sum", last_layer_only=False)
                return make_step(model, lambda: kl(model), compiled=compile_it, device=device)

            table[f"torchbnn{tag}"] = tb
    except ImportError:
        pass
    return table


PEERS = ("bayesian-torch", "torchbnn")
PROCESS_GIB = 0.6  # a contestant's peak resident memory, rounded up (0.39-0.48 GiB measured for the MLP on the CPU)


def _available_gib() -> float | None:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def own_floor(name: str, names: list[str]) -> str | None:
    """The floor row a candidate is held to (issue 29: within 1.3x of it): the twin network for local
    reparameterization, the one-draw-per-weight floor for every other sampler of whole weights (reparameterization,
    Radial, flipout); none for the deterministic network, Delta, the Graves estimator, RDP (not a Gaussian), the floors
    and the peers, or when the floor is not among ``names``."""
    if not name.startswith("varbnn ") or any(k in name for k in ("Delta", "graves", "RadialDirectional")):
        return None
    kind = "second network" if "-local" in name else "draw per weight"
    return next((n for n in names if n.startswith("floor:") and kind in n), None)


def per_round_ratio(turns: dict[str, list[list[float]]], a: str, b: str) -> float:
    """The median over rounds of ``a``'s step over ``b``'s in the same round, each the median of its processes' turn
    medians that round: both measured in the same stretch of the machine's time, which a ratio of whole-run medians
    is not when the machine changes speed between rounds (it does: 2.3 ms and 4.1 ms deterministic steps within one
    run, ``history/step_time_processes_acc6ebf.md``)."""
    rounds = zip(zip(*turns[a]), zip(*turns[b]))
    return statistics.median(statistics.median(x) / statistics.median(y) for x, y in rounds)


def take_turns(commands: list[list[str]], rounds: int, labels: list[str]) -> list[list[Any]]:
    """Contestant processes taking turns (``--processes`` here, ``ab_step.py``'s variants): start every command (a
    contestant prints ``ready`` once built and warmed, then one JSON value per line it reads), then for ``rounds``
    rounds send each a line, in a new order each round (``random.Random(0)``: no process always first), so that all
    see the same stretches of the machine's time. Returns each command's values, one per round."""
    root = Path(__file__).resolve().parents[1]
    procs = [subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=root)
             for command in commands]  # fmt: skip
    values: list[list[Any]] = [[] for _ in procs]
    try:
        for label, proc in zip(labels, procs):
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"the process of {label!r} failed to start (got {line!r}): run it alone to see why")
        shuffle = random.Random(0)
        for _ in tqdm(range(rounds), desc=f"rounds ({len(procs)} processes)", disable=None):
            for i in shuffle.sample(range(len(procs)), len(procs)):
                proc = procs[i]
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
                values[i].append(json.loads(proc.stdout.readline()))
    finally:
        for proc in procs:
            if proc.stdin:
                proc.stdin.close()
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    return values


def candidate_turns(names: list[str], processes: int, rounds: int, argv: list[str]) -> dict[str, list[list[list[float]]]]:
    """``--processes``: each candidate in ``processes`` child processes of this script (``argv`` plus ``--child
    NAME``) taking turns (:func:`take_turns`); refused before any starts when they would not fit in memory.
    Returns {candidate: per process, per round, its step times (seconds)}."""
    count = len(names) * processes
    free = _available_gib()
    if free is not None and count * PROCESS_GIB > free:
        raise SystemExit(
            f"step_time.py: error: --processes {processes} x {len(names)} candidates = {count} processes need about "
            f"{count * PROCESS_GIB:.0f} GiB and {free:.0f} GiB is available: fewer processes, or fewer candidates "
            "(--only / --skip)"
        )
    order = [name for _ in range(processes) for name in names]
    times = take_turns([[sys.executable, __file__, *argv, "--child", name] for name in order], rounds, order)
    return {name: [times[i] for i in range(len(order)) if order[i] == name] for name in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mlp", choices=sorted(MODELS))
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:i] (default: cpu)")
    parser.add_argument("--batch", type=int, default=None, help="batch size (default: mlp 128, lenet5 100, resnet18 32, host 4)")
    parser.add_argument("--steps", type=int, default=30, help="steps per candidate and round (default 30)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--keep-freed-memory", action="store_true",
        help="call varbnn.train.keep_freed_memory() first (glibc keeps the memory a step frees; files get a "
        "_keep_heap suffix)",
    )  # fmt: skip
    parser.add_argument(
        "--repeats", type=int, default=10,
        help="interleaved rounds (default 10: short rounds, so that every candidate meets the CPU's slow and fast phases "
        "alike; three rounds of 100 steps caught phase changes mid-run); the median over all steps is reported",
    )  # fmt: skip
    parser.add_argument(
        "--optimizer",
        default="fit",
        choices=("fit", "adam"),
        help="fit: what varbnn.fit uses (Adam, fused where torch supports it; default); adam: torch.optim.Adam's defaults",
    )
    parser.add_argument(
        "--mc-samples", default="2,4", help="S values > 1 for extra MeanField rows (fit(mc_samples=S)); '' for none"
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="add the rows of fit(compile=True)'s step (torch.compile; the deterministic network compiled too)",
    )
    parser.add_argument(
        "--compile-mode",
        default="default",
        choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
        help="torch.compile's mode for the --compile rows (reduce-overhead: CUDA graphs on a GPU; files get a "
        "_MODE suffix; default: default)",
    )
    parser.add_argument("--only", default=None, help="comma-separated substrings: time only the matching candidates")
    parser.add_argument(
        "--skip", action="append", default=[], metavar="SUBSTRING", help="leave out the candidates containing it (repeatable)"
    )
    parser.add_argument(
        "--processes", type=int, default=0, metavar="K",
        help="run each candidate in K processes of its own, all taking turns (a shuffled order each round), instead of "
        "all in this one (default 0: one process); files get a _processes suffix. Processes of the same code differ "
        "by up to 1.15x under glibc's default allocator (studies/ab_meanfield_a_a.md): more of them average that out",
    )  # fmt: skip
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(results_dir("step-time")))
    args = parser.parse_args()
    device = resolve_device(args.device)
    _, shape, default_batch, description = MODELS[args.model]
    batch = args.batch or default_batch
    if batch < 1 or args.steps < 1 or args.warmup < 0 or args.repeats < 1 or args.processes < 0:
        parser.error("--batch, --steps and --repeats must be positive, --warmup and --processes >= 0")
    torch.set_num_threads(args.threads)
    if args.keep_freed_memory and not keep_freed_memory():
        parser.error("--keep-freed-memory: glibc's mallopt refused the thresholds (or this is not glibc)")
    OPTIMIZER["name"] = args.optimizer
    COMPILE["mode"] = args.compile_mode
    torch.manual_seed(0)
    start = time.perf_counter()
    try:
        mc_samples = tuple(int(v) for v in args.mc_samples.split(",") if v.strip())
    except ValueError:
        parser.error(f"--mc-samples must be comma-separated integers, got {args.mc_samples!r}")
    if any(v < 1 for v in mc_samples):
        parser.error(f"--mc-samples values must be >= 1, got {args.mc_samples!r}")
    builders = candidates(args.model, device, mc_samples, compiled=args.compile)
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        builders = {k: v for k, v in builders.items() if k == "deterministic" or any(w in k for w in wanted)}
    builders = {k: v for k, v in builders.items() if k == "deterministic" or not any(w in k for w in args.skip)}

    def turn(name: str, step: Callable[[torch.Tensor, torch.Tensor], None]) -> list[float]:
        slow = "graves" in name  # per-example weight draws: ~70x a deterministic step; fewer steps suffice
        n, warm = (min(args.steps, SLOW_STEPS), min(args.warmup, 2)) if slow else (args.steps, args.warmup)
        return time_steps(step, n, warm, shape, batch, device)

    if args.child is not None:  # one contestant of --processes: build, then time one turn per line of stdin
        table_all = candidates(args.model, device, mc_samples, compiled=args.compile)
        if args.child not in table_all:
            parser.error(f"--child must be a candidate name, got {args.child!r}")
        step = table_all[args.child]()
        print("ready", flush=True)
        for _ in sys.stdin:
            print(json.dumps(turn(args.child, step)), flush=True)
        return
    by_process: dict[str, list[list[float]]] = {}
    turn_medians: dict[str, list[list[float]]] = {}
    if args.processes:
        by_turn = candidate_turns(list(builders), args.processes, args.repeats, sys.argv[1:])
        by_process = {name: [[t for turn in runs for t in turn] for runs in procs] for name, procs in by_turn.items()}
        turn_medians = {name: [[round(1000 * statistics.median(turn), 3) for turn in runs] for runs in procs]
                        for name, procs in by_turn.items()}  # fmt: skip
        samples = {name: [t for times in runs for t in times] for name, runs in by_process.items()}
    else:
        steps = {name: build() for name, build in builders.items()}
        samples = {name: [] for name in steps}
        for _ in range(args.repeats):  # interleave so that machine noise hits every candidate alike
            for name, step in steps.items():
                samples[name] += turn(name, step)
    base = statistics.median(samples["deterministic"])
    peer_medians = {name: statistics.median(t) for name, t in samples.items() if name.startswith(PEERS)}
    peer_name = min(peer_medians, key=peer_medians.__getitem__) if peer_medians else None
    rows = []
    for name, times in samples.items():
        median = statistics.median(times)
        row: dict[str, Any] = {"model": name, "median_ms": round(1000 * median, 3), "ratio": round(median / base, 2),
               "images_per_s": round(batch / median, 1), "steps": len(times)}  # fmt: skip
        if by_process:
            row["process_median_ms"] = [round(1000 * statistics.median(t), 3) for t in by_process[name]]
            row["turn_median_ms"] = turn_medians[name]  # per process, per round
            row["round_ratio"] = round(per_round_ratio(turn_medians, name, "deterministic"), 3)
            if peer_name is not None:
                row["ratio_to_fastest_peer"] = round(median / peer_medians[peer_name], 3)
                row["round_ratio_to_fastest_peer"] = round(per_round_ratio(turn_medians, name, peer_name), 3)
            floor = own_floor(name, list(samples))
            if floor is not None:
                row["floor"] = floor
                row["round_ratio_to_floor"] = round(per_round_ratio(turn_medians, name, floor), 3)
        rows.append(row)
        print(f"{name:50s} {1000 * median:8.2f} ms  {median / base:5.2f}x  {batch / median:9.1f} img/s")
    result = {
        "name": "step_time",
        "command": " ".join(["python benchmarks/step_time.py", *sys.argv[1:]]),
        "commit": git_commit(),
        "device": describe_device(device) + (f"; host {describe_device(torch.device('cpu'))}" if device.type == "cuda" else ""),
        "seconds": round(time.perf_counter() - start, 1),
        "config": {
            "model": description,
            "batch": batch,
            "optimizer": "Adam, fused where supported (varbnn.train.default_optimizer)" if args.optimizer == "fit" else "Adam",
            "mc_samples": list(mc_samples),
            "compile": args.compile,
            "compile_mode": args.compile_mode,
            "threads": args.threads,
            "steps": args.steps,
            "warmup": args.warmup,
            "repeats": args.repeats,
            "keep_freed_memory": args.keep_freed_memory,
            "processes": args.processes,
            "torch": torch.__version__,
        },
        "rows": rows,
    }
    stem = "step_time" + ("" if args.model == "mlp" else f"_{args.model}") + ("" if device.type == "cpu" else f"_{device.type}")
    stem += "" if args.optimizer == "fit" else "_plain_adam"
    stem += "" if args.compile_mode == "default" or not args.compile else "_" + args.compile_mode.replace("-", "_")
    stem += "_keep_heap" if args.keep_freed_memory else ""
    stem += "_processes" if args.processes else ""
    notes = [
        f"wall time: {result['seconds']} s; median over {args.repeats} x {args.steps} steps after {args.warmup} warm-up steps "
        f"(the Graves-estimator row: {args.repeats} x {min(args.steps, SLOW_STEPS)} steps)"
    ]
    if args.processes:
        notes[0] += f" in each of a candidate's {args.processes} processes"
        notes.append(
            f"processes: every candidate in {args.processes} processes of its own (not one process for all), taking "
            "turns in a shuffled order each round; the median is over all of a candidate's steps; spread: the slowest "
            "of its processes' medians over the fastest"
        )
        notes.append(
            "per round: the median over the rounds of the candidate's step over the other's in the same round (each "
            "the median of its processes that round), so that both are timed in the same stretch of the machine's "
            "time; its floor: the twin network's floor for local reparameterization, the one-draw floor for the other "
            "samplers of whole weights"
        )
    if args.keep_freed_memory:
        notes.append("allocator: varbnn.train.keep_freed_memory() (glibc keeps the memory a step frees)")
    if not any("graves" in name for name in samples):
        notes.append(
            "no Graves-estimator row: the model has BatchNorm, under which per-example gradients are undefined"
            if args.model == "resnet18"
            else "no Graves-estimator row: left out by --only/--skip"
        )
    table = [
        "| model | median step (ms) | ratio to deterministic | images/s |",
        "|---|---:|---:|---:|",
        *[f"| {r['model']} | {r['median_ms']:.2f} | {r['ratio']:.2f}x | {r['images_per_s']:,.0f} |" for r in rows],
    ]
    if by_process:
        peer = f" | per round: to {peer_name}" if peer_name is not None else ""
        floors = any("floor" in r for r in rows)

        def ratio_cells(r: dict[str, Any]) -> str:
            cells = [f"{r['round_ratio']:.2f}x"]
            cells += [f"{r['round_ratio_to_fastest_peer']:.3f}x"] if peer else []
            cells += [f"{r['round_ratio_to_floor']:.3f}x" if "floor" in r else ""] if floors else []
            return " | ".join(cells)

        table = [
            f"| model | median step (ms) | ratio to deterministic | per round: to deterministic{peer}"
            + (" | per round: to its floor" if floors else "") + " | images/s | processes' medians (ms) | spread |",
            "|---|---:|---:|---:|" + ("---:|" if peer else "") + ("---:|" if floors else "") + "---:|---|---:|",
            *[f"| {r['model']} | {r['median_ms']:.2f} | {r['ratio']:.2f}x | {ratio_cells(r)} | {r['images_per_s']:,.0f} | "
              f"{', '.join(f'{m:.2f}' for m in r['process_median_ms'])} | "
              f"{max(r['process_median_ms']) / min(r['process_median_ms']):.3f}x |" for r in rows],
        ]  # fmt: skip
    title = f"Training-step time, {description}, batch {batch}, " + ("Adam (fused)" if args.optimizer == "fit" else "Adam")
    path = write_result(args.out, stem, result, title, notes, table)
    print(f"wrote {path}.json and .md")


if __name__ == "__main__":
    main()
