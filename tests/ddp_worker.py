"""One rank of the 2-process DDP test (run by torchrun from tests/test_distributed.py; not a test module).

Usage: torchrun --nproc_per_node 2 tests/ddp_worker.py OUT_DIR
Writes OUT_DIR/{case}_rank{r}.pt with each rank's parameters, its per-step losses and a draw of its RNG.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

import varbnn
from varbnn import distributed as vdist
from varbnn.likelihoods import Gaussian
from varbnn.models import mlp
from varbnn.training import fit, seed_everything


def toy_data() -> TensorDataset:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(64, 5, generator=g)
    y = torch.randint(0, 3, (64,), generator=g)
    return TensorDataset(x, y)


def build(family: str) -> torch.nn.Module:
    seed_everything(0)
    spec = varbnn.Delta() if family == "delta" else varbnn.MeanField(init_std=0.3)
    return varbnn.bayesianize(mlp(5, (8,), 3), spec)


def regression_data() -> TensorDataset:
    g = torch.Generator().manual_seed(11)
    x = torch.randn(64, 5, generator=g)
    return TensorDataset(x, x[:, :1] * 2 + 0.3 * torch.randn(64, 1, generator=g))


def build_regression() -> tuple[torch.nn.Module, Gaussian]:
    seed_everything(0)
    return varbnn.bayesianize(mlp(5, (8,), 1), varbnn.Delta()), Gaussian(init_noise_std=0.5)


def main(out: Path) -> None:
    torch.set_num_threads(1)
    ctx = vdist.setup(backend="gloo", device="cpu")
    assert ctx.world_size == 2, ctx
    data = toy_data()

    # Delta: 2 epochs of SGD, 4 steps each on 8 examples per rank (the union batch is 16 consecutive examples).
    model = build("delta")
    losses: list[float] = []
    history = fit(model, vdist.data_loader(data, 8, shuffle=False), n_data=64, epochs=2, kl_weight=1.0,
                  optimizer=torch.optim.SGD(model.parameters(), lr=0.1), progress=False,
                  checkpoint=out / "delta.pt", on_step_end=lambda s, t: losses.append(float(t.loss)))  # fmt: skip
    torch.save({"state": model.state_dict(), "losses": losses, "history": history}, out / f"delta_rank{ctx.rank}.pt")

    # MeanField: a few Adam steps (parameters must stay equal across ranks while the noise differs), then
    # 100 steps at fixed parameters (lr 0) to estimate the expected loss.
    model = build("meanfield")
    fit(model, vdist.data_loader(data, 16, seed=3), n_data=64, epochs=3, kl_weight=1.0,
        optimizer=torch.optim.Adam(model.parameters(), lr=0.01), progress=False)  # fmt: skip
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    losses = []
    fit(model, vdist.data_loader(data, 32, shuffle=False), n_data=64, epochs=100, kl_weight=1.0,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.0), progress=False,
        on_step_end=lambda s, t: losses.append(float(t.loss)))  # fmt: skip
    torch.save({"state": trained, "losses": losses, "noise": torch.randn(4)}, out / f"meanfield_rank{ctx.rank}.pt")

    # Delta regression with a learned Gaussian noise std (a parameter outside the DDP-wrapped model): it must stay
    # equal across ranks and follow the single-process union-batch run, like the network's parameters.
    model, likelihood = build_regression()
    fit(model, vdist.data_loader(regression_data(), 8, shuffle=False), n_data=64, epochs=2, likelihood=likelihood,
        optimizer=torch.optim.SGD([*model.parameters(), *likelihood.parameters()], lr=0.1), progress=False)  # fmt: skip
    torch.save({"state": model.state_dict(), "noise": likelihood.state_dict()}, out / f"gaussian_rank{ctx.rank}.pt")
    vdist.teardown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
