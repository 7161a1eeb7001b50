"""Variational continual learning: the posterior of one task becomes the prior of the next.

In continual learning a network meets tasks one after another and never sees an old task's data again. Trained
naively, it drifts towards each new task and may forget the old ones. Variational continual learning (VCL; Nguyen et
al. 2018) uses Bayes' rule as the memory: after task ``t`` the approximate posterior ``q_t(w)`` summarises everything
learned so far, so it becomes the prior for task ``t + 1``. Weights that mattered for old tasks have narrow posteriors,
hence narrow priors, and the KL term of the next task's ELBO holds them in place; unimportant weights have wide
priors and stay free to learn.

:mod:`varbnn.continual` provides the two pieces:

* :class:`~varbnn.continual.MultiHeadNet` -- a shared trunk and one output head per task ("multi-head": at test time
  we know which task an input comes from). ``task_model(t)`` is the ``nn.Sequential(trunk, heads[t])`` view that is
  trained and evaluated for task ``t``.
* :func:`~varbnn.continual.set_posterior_as_prior` -- replaces every Bayesian tensor's prior by a frozen copy of its
  current posterior.

The tasks: scikit-learn's 8x8 digits (offline) split into five two-class problems, {0, 1}, {2, 3}, ..., {8, 9}. After
each task we measure the test accuracy of every head trained so far, for three learners:

1. **plain** -- an ordinary multi-head network trained on each task in turn;
2. **Bayesian, prior kept at N(0, 1)** -- the Bayesian network without the posterior-to-prior step: it shows what the
   prior update contributes;
3. **VCL** -- the Bayesian network with ``set_posterior_as_prior`` after every task.

Run ``python examples/continual.py --help`` for the options; ``--quick`` is the seconds-long form the test suite runs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import varbnn
import varbnn.plots
from varbnn.continual import MultiHeadNet, set_posterior_as_prior
from varbnn.data import load_digits
from varbnn.training import resolve_device, seed_everything

TASKS = ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few epochs only (what the test suite runs)")
    parser.add_argument("--out", default="varbnn-results/tutorials", help="folder for the figure and the printed output")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default cpu)")
    return parser.parse_args(argv)


def task_data(x: torch.Tensor, y: torch.Tensor, classes: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The examples of the task's two classes, labelled 0 (first class) and 1 (second class)."""
    chosen = (y == classes[0]) | (y == classes[1])
    return x[chosen], (y[chosen] == classes[1]).long()


def make_multihead(hidden: int = 100) -> MultiHeadNet:
    trunk = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
    return MultiHeadNet(trunk, [nn.Linear(hidden, 2) for _ in TASKS])


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def say(text: str = "") -> None:  # print, and keep the line for continual.txt
        print(text, flush=True)
        lines.append(text)

    device = resolve_device(args.device)
    epochs, samples = (8, 8) if args.quick else (100, 32)
    say(f"varbnn {varbnn.__version__}, torch {torch.__version__}, device {device}, {torch.get_num_threads()} thread(s)")
    say(f"epochs per task {epochs}, Monte Carlo samples {samples}, seed {args.seed}")

    x_train, y_train = load_digits("train")
    x_test, y_test = load_digits("test")
    train_sets = [task_data(x_train, y_train, classes) for classes in TASKS]
    test_sets = [task_data(x_test, y_test, classes) for classes in TASKS]
    say("tasks: " + ", ".join(f"{a} vs {b} ({len(tr[0])} train / {len(te[0])} test)"
                              for (a, b), tr, te in zip(TASKS, train_sets, test_sets)))  # fmt: skip

    # --- The three learners -----------------------------------------------------------------------------------------
    # The same initial network for all three. The Bayesian ones start every posterior std at 0.1 rather than the
    # default 0.01: in VCL the std IS the memory (the next task's prior width), and each task gives only a few hundred
    # steps, too few for stds started at 0.01 to grow to their size for the weights a task does not need.
    seed_everything(args.seed)
    plain = make_multihead()
    learners = {
        "plain": plain,
        "Bayesian, prior kept at N(0, 1)": varbnn.bayesianize(plain, family=varbnn.MeanField(init_std=0.1)),
        "VCL (posterior becomes prior)": varbnn.bayesianize(plain, family=varbnn.MeanField(init_std=0.1)),
    }

    # accuracy[name][t][j]: test accuracy of head j after training on tasks 0..t
    accuracy: dict[str, list[list[float]]] = {name: [] for name in learners}
    kl_after_update: list[float] = []
    for t, (x_task, y_task) in enumerate(train_sets):
        for name, model in learners.items():
            bayesian = name != "plain"
            # task_model(t) = Sequential(trunk, heads[t]): fit trains the trunk and this task's head only, and its
            # KL covers exactly those tensors. n_data is the task's training-set size. kl_weight=1.0: VCL is Bayes' rule
            # applied task after task, so each task's loss is the exact negative ELBO (mean NLL + KL / N_task).
            task_model = model.task_model(t)
            loader = DataLoader(
                TensorDataset(x_task, y_task), batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(args.seed + t)
            )
            varbnn.fit(
                task_model,
                loader,
                n_data=len(x_task),
                epochs=epochs,
                lr=3e-3,
                kl_weight=1.0 if bayesian else None,
                device=device,
                progress=False,
            )
            if name.startswith("VCL"):
                # Pass the TASK model, not the whole MultiHeadNet: heads of tasks not yet seen must keep their
                # N(0, 1) prior rather than get their untrained initial posterior as one.
                set_posterior_as_prior(task_model)
                kl_after_update.append(varbnn.kl(task_model).item())  # KL(q || q) = 0: the prior is the posterior
            accuracy[name].append([
                varbnn.evaluate(model.task_model(j), x_j, y_j, samples=samples if bayesian else 1, seed=args.seed,
                                device=device)["accuracy"]
                for j, (x_j, y_j) in enumerate(test_sets[: t + 1])
            ])  # fmt: skip
        say(
            f"after task {t + 1}: "
            + "; ".join(f"{name.split(' (')[0]} " + " ".join(f"{a:.3f}" for a in accuracy[name][t]) for name in learners)
        )

    # --- Results ----------------------------------------------------------------------------------------------------
    say()
    say(f"KL(posterior || prior) right after each prior update: {', '.join(f'{v:.2g}' for v in kl_after_update)} nats")
    say()
    say("test accuracy of each head after the last task, and its drop since that head's own task")
    say(f"{'learner':<34}" + "".join(f"{f'task {j + 1}':>9}" for j in range(len(TASKS))) + f"{'mean':>8}{'mean drop':>11}")
    final: dict[str, dict[str, float]] = {}
    for name, rows in accuracy.items():
        last = rows[-1]
        drops = [rows[j][j] - last[j] for j in range(len(TASKS))]
        final[name] = {"mean": sum(last) / len(last), "mean_drop": sum(drops) / len(drops), "first_task": last[0]}
        say(f"{name:<34}" + "".join(f"{a:>9.3f}" for a in last) + f"{final[name]['mean']:>8.3f}{final[name]['mean_drop']:>11.3f}")

    # --- Figure -----------------------------------------------------------------------------------------------------
    # plots.continual_figure takes rows {"variant", "after_task", "head<j>": (mean, standard error), "mean": (...)}:
    # one panel per head (its accuracy as tasks go by) and one with the mean over the heads seen so far. One seed, so
    # the standard errors are NaN and no band is drawn.
    nan = float("nan")
    rows = [
        {"variant": name, "after_task": t + 1, **{f"head{j + 1}": (a, nan) for j, a in enumerate(accs)},
         "mean": (sum(accs) / len(accs), nan)}
        for name, per_task in accuracy.items() for t, accs in enumerate(per_task)
    ]  # fmt: skip
    figure = varbnn.plots.continual_figure({"name": "split digits, multi-head", "rows": rows}, out / "continual.png")
    say()
    say(f"figure: {figure.name}")
    say(f"finished in {time.perf_counter() - started:.1f} s")
    (out / "continual.txt").write_text("\n".join(lines) + "\n")
    return {
        "accuracy": accuracy,
        "final": final,
        "kl_after_update": kl_after_update,
        "figure": figure,
        "transcript": out / "continual.txt",
    }


if __name__ == "__main__":
    main()
