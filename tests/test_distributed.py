"""Multi-process training: 2 CPU processes with gloo on 127.0.0.1, launched by torchrun (tests/ddp_worker.py)."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

import varbnn
from varbnn import distributed as vdist
from varbnn.training import fit, load_checkpoint

sys.path.insert(0, str(Path(__file__).parent))
from ddp_worker import build, toy_data  # noqa: E402

WORKER = Path(__file__).with_name("ddp_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    out = tmp_path_factory.mktemp("ddp")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for _ in range(3):  # a port found free can be taken before torchrun binds it: try another one
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
                   "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), str(WORKER), str(out)]  # fmt: skip
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        if done.returncode == 0:
            break
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def _load(out: Path, case: str) -> list[dict]:
    return [torch.load(out / f"{case}_rank{r}.pt", weights_only=True) for r in range(2)]


def test_delta_parameters_equal_across_ranks_and_match_single_process_union_batch(ddp_run: Path) -> None:
    ranks = _load(ddp_run, "delta")
    for key, value in ranks[0]["state"].items():
        torch.testing.assert_close(ranks[1]["state"][key], value, rtol=0, atol=0, msg=f"{key} differs across ranks")
    # single process, batches of 16 = the union of the ranks' interleaved shards of 8
    model = build("delta")
    losses: list[float] = []
    loader = torch.utils.data.DataLoader(toy_data(), batch_size=16, shuffle=False)
    fit(model, loader, n_data=64, epochs=2, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), progress=False,
        on_step_end=lambda s, t: losses.append(float(t.loss)))  # fmt: skip
    for key, value in model.state_dict().items():
        torch.testing.assert_close(ranks[0]["state"][key], value, rtol=1e-5, atol=1e-6, msg=f"{key}: DDP != union batch")
    # the union-batch loss is the mean of the ranks' losses (mean NLL over equal shards + KL / N counted once)
    union = torch.tensor([(a + b) / 2 for a, b in zip(ranks[0]["losses"], ranks[1]["losses"])])
    torch.testing.assert_close(union, torch.tensor(losses), rtol=1e-5, atol=1e-6)
    history_loss = [h["loss"] for h in ranks[0]["history"]]
    assert history_loss == pytest.approx([float(union[:4].mean()), float(union[4:].mean())], rel=1e-6)


def test_learned_noise_outside_the_model_stays_equal_across_ranks_and_matches_union_batch(ddp_run: Path) -> None:
    """A likelihood's learned parameter is not inside the DDP-wrapped model: fit must average its gradient too."""
    from ddp_worker import build_regression, regression_data

    ranks = _load(ddp_run, "gaussian")
    for part in ("state", "noise"):
        for key, value in ranks[0][part].items():
            torch.testing.assert_close(ranks[1][part][key], value, rtol=0, atol=0, msg=f"{key} differs across ranks")
    model, likelihood = build_regression()
    fit(model, torch.utils.data.DataLoader(regression_data(), batch_size=16), n_data=64, epochs=2, likelihood=likelihood,
        optimizer=torch.optim.SGD([*model.parameters(), *likelihood.parameters()], lr=0.1), progress=False)  # fmt: skip
    torch.testing.assert_close(likelihood.state_dict()["log_noise_std"], ranks[0]["noise"]["log_noise_std"])
    for key, value in model.state_dict().items():
        torch.testing.assert_close(ranks[0]["state"][key], value, msg=key)


def test_checkpoint_written_under_ddp_loads_in_one_process(ddp_run: Path) -> None:
    ranks = _load(ddp_run, "delta")
    model = build("delta")
    state = load_checkpoint(ddp_run / "delta.pt", model)
    assert state["epoch"] == 2
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, ranks[0]["state"][key], rtol=0, atol=0)


def test_meanfield_ranks_share_parameters_draw_own_noise_and_loss_is_unbiased(ddp_run: Path) -> None:
    ranks = _load(ddp_run, "meanfield")
    for key, value in ranks[0]["state"].items():
        torch.testing.assert_close(ranks[1]["state"][key], value, rtol=0, atol=0, msg=f"{key} differs across ranks")
    assert not torch.equal(ranks[0]["noise"], ranks[1]["noise"]), "ranks must draw their own weight noise"
    # DDP: per step, the mean of the two ranks' losses (each on its 32 examples) estimates the union loss
    ddp = torch.tensor([(a + b) / 2 for a, b in zip(ranks[0]["losses"], ranks[1]["losses"])], dtype=torch.float64)
    model = build("meanfield")
    model.load_state_dict(ranks[0]["state"])
    data: TensorDataset = toy_data()
    x, y = data.tensors
    torch.manual_seed(0)
    with torch.no_grad():
        single = torch.tensor(
            [float(varbnn.elbo_loss(F.cross_entropy(model(x), y), model, 64).loss) for _ in range(400)], dtype=torch.float64
        )
    se = math.sqrt(ddp.var() / len(ddp) + single.var() / len(single))
    assert abs(float(ddp.mean() - single.mean())) < 5 * se, (float(ddp.mean()), float(single.mean()), se)
    assert ddp.std() > 0  # noise was drawn


def test_single_process_helpers_and_errors() -> None:
    ctx = vdist.setup(device="cpu") if "RANK" not in os.environ else None
    if ctx is not None:
        assert (ctx.rank, ctx.world_size, ctx.backend, ctx.is_main) == (0, 1, None, True)
    assert not vdist.is_distributed() and vdist.rank() == 0 and vdist.world_size() == 1 and vdist.is_main_process()
    assert vdist.rank_seed(5, 0) == 5 and vdist.rank_seed(5, 1) != vdist.rank_seed(5, 2)
    with pytest.raises(ValueError, match="backend must be one of"):
        vdist.setup(backend="mpi")
    with pytest.raises(ValueError, match="batch_size"):
        vdist.data_loader(toy_data(), 0)
    model = build("delta")
    with pytest.raises(ValueError, match="distributed=True needs"):
        fit(model, vdist.data_loader(toy_data(), 8), n_data=64, epochs=1, progress=False, distributed=True)
    t = torch.ones(3)
    vdist.all_reduce_mean_([t])  # a no-op in one process
    assert torch.equal(t, torch.ones(3))


def _reproduce_under_torchrun(name: str, data_dir: Path, out: Path, *settings: str) -> None:
    """``torchrun --nproc_per_node 2 -m varbnn.cli reproduce NAME --quick --distributed`` (gloo); rank 0 alone prints.
    ``settings``: ``FIELD=VALUE`` overrides (``--set``), e.g. smaller data limits than the quick form's."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VARBNN_DATA": str(data_dir)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), "-m", "varbnn.cli", "reproduce",
               name, "--quick", "--distributed", "--no-progress", "--out", str(out)]  # fmt: skip
    for setting in settings:
        command += ["--set", setting]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("wrote ") == 1  # rank 0 only


def test_cli_reproduce_distributed_writes_results_once(data_dir: Path, tmp_path: Path) -> None:
    _reproduce_under_torchrun("mnist-mlp", data_dir, tmp_path)
    result = json.loads((tmp_path / "mnist-mlp.json").read_text())
    assert "x 2 processes (DistributedDataParallel)" in result["device"]
    assert all(row["accuracy"] > 0.5 for row in result["rows"])


def test_cli_vcl_distributed_trains_each_rank_on_its_share_and_writes_once(data_dir: Path, tmp_path: Path) -> None:
    _reproduce_under_torchrun("vcl-split-fmnist", data_dir, tmp_path)
    result = json.loads((tmp_path / "vcl-split-fmnist-quick.json").read_text())
    assert "x 2 processes (DistributedDataParallel)" in result["device"]
    records = (tmp_path / "vcl-split-fmnist-quick_runs.jsonl").read_text().splitlines()
    assert len(records) == 4  # one per (variant, seed), written by rank 0 alone
    final = [r for r in result["rows"] if r["after_task"] == 5]
    assert final and all(r["mean"][0] > 0.5 for r in final if r["variant"].endswith("multi-head"))


def test_cli_retina_distributed_writes_results_once(data_dir: Path, tmp_path: Path) -> None:
    _reproduce_under_torchrun("retina-referral", data_dir, tmp_path)
    result = json.loads(next(tmp_path.glob("retina-referral*.json")).read_text())
    assert "x 2 processes (data-parallel)" in result["device"]
    records = next(tmp_path.glob("retina-referral*_runs.jsonl")).read_text().splitlines()
    assert len(records) == len({json.loads(r)["family"] + str(json.loads(r)["seed"]) for r in records})  # once each


def test_cli_lenet5_prune_distributed_selects_its_best_epoch_on_every_rank(data_dir: Path, tmp_path: Path) -> None:
    """select_best_of_last picks by the epoch's training NLL, which fit averages over the ranks: every rank restores
    the same state (rank 0 alone exports it), and the pruned export follows."""
    _reproduce_under_torchrun("lenet5-prune", data_dir, tmp_path, "train_limit=300", "test_limit=100", "validation_size=100")
    result = json.loads((tmp_path / "lenet5-prune.json").read_text())
    assert "x 2 processes (DistributedDataParallel)" in result["device"]
    assert result["rows"] and all(math.isfinite(row["accuracy"]) for row in result["rows"])


@pytest.mark.parametrize("name", ["graves-mnist", "soap-bubble", "uci", "uci-learned", "mnist-mlp"])
def test_cli_distributed_outside_torchrun_is_a_clear_error(
    name: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from varbnn.cli import main

    with pytest.raises(SystemExit):  # --out: a tree with uncommitted changes would be refused first for results/
        main(["reproduce", name, "--quick", "--distributed", "--no-progress", "--out", str(tmp_path)])
    assert "launch with torchrun" in capsys.readouterr().err


def test_cli_uci_distributed_shares_the_noise_posterior_and_writes_once(data_dir: Path, tmp_path: Path) -> None:
    _reproduce_under_torchrun("uci", data_dir, tmp_path, "min_steps=20")
    result = json.loads((tmp_path / "uci-quick.json").read_text())
    assert "x 2 processes (data-parallel)" in result["device"]
    records = (tmp_path / "uci-quick_runs.jsonl").read_text().splitlines()
    keys = [(json.loads(r)["variant"], json.loads(r)["split"]) for r in records]
    assert len(keys) == len(set(keys)) == 2 * len(result["config"]["variants"])  # once each, by rank 0
    assert all(math.isfinite(json.loads(r)["ll"]) for r in records)


@pytest.mark.parametrize("fails", [False, True])
def test_cli_distributed_reproduce_destroys_its_process_group(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fails: bool
) -> None:
    """``varbnn reproduce --distributed`` ends its process group, after a run that finished (past a barrier) and after
    one that failed: a process that exits with its gloo group alive can abort in the group's destructor after writing
    its results. The run here is a stand-in that initialises a group of one process, as the engine does."""
    from types import SimpleNamespace

    import torch.distributed as dist

    from varbnn import cli
    from varbnn_lab import catalog

    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    real = catalog.experiment("soap-bubble")

    def run(config: object, **kwargs: object) -> dict:
        assert kwargs["distributed"] is True
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        if fails:
            raise ValueError("a run that fails")
        return {"written": False}

    stand_in = SimpleNamespace(config=real.config, run=run, generic=False, compiles=False)
    monkeypatch.setattr(catalog, "experiment", lambda name: stand_in)
    argv = ["reproduce", "soap-bubble", "--quick", "--distributed", "--no-progress", "--out", str(tmp_path)]
    try:
        if fails:
            with pytest.raises(SystemExit):
                cli.main(argv)
        else:
            assert cli.main(argv) == 0
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_cli_graves_prune_and_soap_bubble_distributed_write_once(data_dir: Path, tmp_path: Path) -> None:
    """The Graves estimator (the adaptive-weight-noise network graves-prune trains first) and soap-bubble's loop."""
    _reproduce_under_torchrun(
        "graves-prune", data_dir, tmp_path / "graves", "train_limit=400", "test_limit=200", "validation_size=100"
    )
    result = json.loads((tmp_path / "graves" / "graves-prune-quick.json").read_text())
    assert "x 2 processes (data-parallel)" in result["device"]
    assert [r["lambda"] for r in result["rows"]] == list(result["config"]["lambdas"])
    _reproduce_under_torchrun("soap-bubble", data_dir, tmp_path / "soap")
    result = json.loads((tmp_path / "soap" / "soap-bubble-quick.json").read_text())
    assert "x 2 processes (data-parallel)" in result["device"]
    assert [len(run["history"]) for run in result["training"]] == [result["config"]["epochs"] + 1] * 2


def test_equal_share_is_the_identity_in_one_process() -> None:
    x, y = torch.arange(10.0)[:, None], torch.arange(10)
    xs, ys, batch = vdist.equal_share(x, y, 4)
    assert xs is x and ys is y and batch == 4
