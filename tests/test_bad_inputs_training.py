"""Bad inputs to training and checkpoints (issue 25): each row feeds exactly one input an audit found answered by a
silent wrong result or a crash, and asserts the clear error (naming what is wrong) or the right result."""

from __future__ import annotations

import inspect
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from bad_input_table import BadInput, check, params
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import varbnn
from varbnn.objectives import elbo_loss
from varbnn.training import CheckpointError, NonFiniteError, fit, load_checkpoint, read_checkpoint, save_checkpoint

N = 48


def _data(target: str = "class") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, 4, generator=g)
    y = x[:, :1] + x[:, 1:2] if target == "real" else (x[:, 0] > 0).long()
    return x, y


def _model() -> nn.Module:
    torch.manual_seed(0)
    return varbnn.bayesianize(nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2)), varbnn.MeanField())


def _mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output[:, :1], target)


def _fit(loader: Any = None, model: nn.Module | None = None, **kwargs: Any) -> list[dict[str, float]]:
    options: dict[str, Any] = {"n_data": N, "epochs": 2, "progress": False, **kwargs}
    return fit(model or _model(), loader if loader is not None else DataLoader(TensorDataset(*_data()), batch_size=16), **options)


def _poisoned_target(value: float) -> Callable[[], Any]:
    def call() -> Any:
        x, y = _data("real")
        y[7, 0] = value
        return _fit(DataLoader(TensorDataset(x, y), batch_size=16), nll=_mse)

    return call


def _nan_input() -> Any:
    x, y = _data()
    x[30, 2] = float("nan")
    return _fit(DataLoader(TensorDataset(x, y), batch_size=16))


def _nan_gradient_only(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A finite loss (0 + the NLL) whose gradient is NaN: d sqrt(|u|)/du at u = 0."""
    return F.cross_entropy(output, target) + (output - output.detach()).abs().sqrt().mean()


def _nan_on_short_batches(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    loss = F.cross_entropy(output, target)
    return loss * float("nan") if output.shape[0] < 16 else loss


def _three_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    x, y = _data()
    return [(x[:16], y[:16]), (x[16:24], y[16:24]), (x[24:40], y[24:40])]  # the short middle one gets a NaN loss


def _nan_linear() -> nn.Module:
    model = nn.Linear(2, 2)
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    return model


def _skips_one_batch_per_epoch(history: list[dict[str, float]]) -> None:
    assert [h["skipped"] for h in history] == [1, 1] and all(np.isfinite(h["loss"]) for h in history)


def _divergence_keeps_finite_parameters() -> Any:
    model = _model()
    with pytest.raises(NonFiniteError, match=r"non-finite (loss|gradient) at epoch \d+, step \d+ \(batch index \d+"):
        _fit(model=model, lr=1e8, epochs=30)
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())  # never stepped on the bad values
    return model


def _trained_checkpoint(path: Path, poison: str | None = None) -> Path:
    """A checkpoint as fit writes it, optionally with a NaN parameter or an inf in the optimizer state."""
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    history = _fit(model=model, optimizer=optimizer, epochs=1)
    if poison == "parameter":
        with torch.no_grad():
            next(model.parameters())[0, 0] = float("nan")
    if poison == "optimizer":
        next(iter(optimizer.state.values()))["exp_avg_sq"][0] = float("inf")
    return save_checkpoint(path, model, optimizer, allow_nonfinite=True, epoch=1, history=history, step=3)


def _resume(path: Path) -> Any:
    return _fit(checkpoint=path, resume=True, epochs=2)


def _record_offset(path: Path, suffix: str) -> int:
    """Where the bytes of the zip member ending in ``suffix`` start in the file."""
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith(suffix))
    header = path.read_bytes()[info.header_offset : info.header_offset + 30]
    return info.header_offset + 30 + int.from_bytes(header[26:28], "little") + int.from_bytes(header[28:30], "little")


def _damaged(edit: Callable[[Path, bytes], bytes]) -> Callable[[Path], Any]:
    def call(tmp: Path) -> Any:
        path = _trained_checkpoint(tmp / "ckpt.pt")
        path.write_bytes(edit(path, path.read_bytes()))
        return _resume(path)

    return call


def _flip(position: Callable[[Path, bytes], int], mask: int) -> Callable[[Path, bytes], bytes]:
    def edit(path: Path, data: bytes) -> bytes:
        flipped = bytearray(data)
        flipped[position(path, data)] ^= mask
        return bytes(flipped)

    return edit


def _written(write: Callable[[Path], None]) -> Callable[[Path], Any]:
    def call(tmp: Path) -> Any:
        path = tmp / "ckpt.pt"
        write(path)
        return load_checkpoint(path, _model())

    return call


def _legacy_checkpoint_loads_with_a_warning(tmp: Path) -> Any:
    model = _model()
    torch.save({"model": model.state_dict(), "optimizer": None, "epoch": 1}, tmp / "old.pt")
    with pytest.warns(UserWarning, match="has no checksum"):
        return load_checkpoint(tmp / "old.pt", _model()), model


def _same_model(result: Any) -> None:
    state, model = result
    assert state["epoch"] == 1 and all(torch.equal(v, model.state_dict()[k]) for k, v in state["model"].items())


def _resume_refused_leaves_the_model(tmp: Path) -> Any:
    path = _trained_checkpoint(tmp / "ckpt.pt", poison="parameter")
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(CheckpointError, match="holds NaN or inf"):
        _fit(model=model, checkpoint=path, resume=True)
    return before, list(model.parameters())


def _unchanged(result: Any) -> None:
    before, after = result
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def _two_epochs(history: list[dict[str, float]]) -> None:
    assert [h["epoch"] for h in history] == [1, 2] and all(np.isfinite(h["loss"]) for h in history)


def _n_data_is_an_int(terms: Any) -> None:
    assert type(terms.n_data) is int and terms.n_data == N


def _always_nan(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output, target) * float("nan")


def _empty_dataset() -> DataLoader:
    return DataLoader(TensorDataset(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long)))


def _inf_batch() -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((4, 4), float("inf")), torch.zeros(4, dtype=torch.long))]


AT_FIRST_STEP = r"at epoch 1, step 1 \(batch index 0 of the epoch\)"
SHA_MISMATCH = r"checkpoint .*ckpt.pt: damaged: its sha256 checksum does not match"

CASES: list[BadInput] = [
    # training on non-finite values: data, loss, gradient
    BadInput("nan-target-mse", _poisoned_target(float("nan")), raises=NonFiniteError,
             match=rf"non-finite data {AT_FIRST_STEP}: training targets contain NaN or infinite values \(1 NaN, 0 inf"),
    BadInput("inf-target-mse", _poisoned_target(float("inf")), raises=NonFiniteError,
             match=rf"non-finite data {AT_FIRST_STEP}: training targets contain NaN or infinite values \(0 NaN, 1 inf"),
    BadInput("nan-input", _nan_input, raises=ValueError,
             match=r"non-finite data at epoch 1, step 2 \(batch index 1 .*training inputs contain NaN"),
    BadInput("lr-1e8-diverges", _divergence_keeps_finite_parameters, expect=lambda model: None),
    BadInput("nan-gradient-finite-loss", lambda: _fit(nll=_nan_gradient_only), raises=FloatingPointError,
             match=rf"non-finite gradient {AT_FIRST_STEP}: the gradients of .* hold NaN or inf"),
    BadInput("skip-nonfinite-skips-and-counts", lambda: _fit(_three_batches(), nll=_nan_on_short_batches, skip_nonfinite=True),
             expect=_skips_one_batch_per_epoch),
    BadInput("skip-nonfinite-every-batch", lambda: _fit(nll=_always_nan, skip_nonfinite=True), raises=NonFiniteError,
             match=r"every batch of epoch 1 \(3\) had a non-finite loss or gradient"),
    BadInput("skip-nonfinite-still-refuses-bad-data", lambda: _fit(_inf_batch(), skip_nonfinite=True), raises=NonFiniteError,
             match=r"non-finite data .*inputs contain NaN or infinite values \(0 NaN, 16 inf"),
    BadInput("save-refuses-nan-parameters", lambda tmp: save_checkpoint(tmp / "c.pt", _nan_linear()), raises=NonFiniteError,
             match=r"refusing to write checkpoint .*c.pt: parameters weight hold NaN or inf"),
    # n_data
    BadInput("n_data-negative", lambda: _fit(n_data=-1), raises=ValueError, match=r"n_data must be a positive integer .*got -1"),
    BadInput("n_data-bool", lambda: _fit(n_data=True), raises=ValueError, match=r"n_data must be a positive integer .*got True"),
    BadInput("n_data-fractional", lambda: _fit(n_data=47.5), raises=ValueError, match=r"n_data must be .*got 47.5"),
    BadInput("n_data-np-int64", lambda: _fit(n_data=np.int64(N)), expect=_two_epochs),
    BadInput("n_data-0d-tensor", lambda: _fit(n_data=torch.tensor(N)), expect=_two_epochs),
    BadInput("elbo_loss-n_data-np-int64", lambda: elbo_loss(torch.tensor(1.0), _model(), np.int64(N)), expect=_n_data_is_an_int),
    BadInput("empty-loader", lambda: _fit([]), raises=ValueError, match=r"the loader yielded no batches in epoch 1"),
    BadInput("empty-dataset-loader", lambda: _fit(_empty_dataset()), raises=ValueError, match=r"the loader yielded no batches"),
    BadInput("n_data-smaller-than-a-batch", lambda: _fit([_data()], n_data=10), raises=ValueError,
             match=r"n_data=10 is smaller than one batch \(48 examples .*training-set size"),
    BadInput("n_data-smaller-than-an-epoch", lambda: _fit(n_data=40), raises=ValueError,
             match=r"n_data=40 is smaller than the 48 distinct examples the loader yields per epoch"),
    # resuming from checkpoints that must not be trained on
    BadInput("resume-nan-parameters", lambda tmp: _resume(_trained_checkpoint(tmp / "c.pt", poison="parameter")),
             raises=CheckpointError, match=r"checkpoint .*c.pt: holds NaN or inf values in 0\.\S*: refusing to load it"),
    BadInput("resume-inf-optimizer-state", lambda tmp: _resume(_trained_checkpoint(tmp / "c.pt", poison="optimizer")),
             raises=CheckpointError, match=r"checkpoint .*c.pt: holds NaN or inf values in optimizer state 0.exp_avg_sq"),
    BadInput("resume-refused-leaves-the-model", _resume_refused_leaves_the_model, expect=_unchanged),
    BadInput("resume-without-epoch", lambda tmp: _resume(save_checkpoint(tmp / "c.pt", _model())), raises=CheckpointError,
             match=r"checkpoint .*c.pt: has no 'epoch' or 'history' entry"),
    # damaged and foreign files
    BadInput("flipped-byte-in-pickle", _damaged(_flip(lambda path, data: _record_offset(path, "data.pkl") + 40, 0xFF)),
             raises=CheckpointError, match=SHA_MISMATCH),
    BadInput("flipped-bit-in-tensor", _damaged(_flip(lambda path, data: _record_offset(path, "/data/0") + 2, 0x01)),
             raises=CheckpointError, match=SHA_MISMATCH),
    BadInput("flipped-byte-in-zip-header", _damaged(_flip(lambda path, data: 12, 0xFF)),  # the first entry's date
             raises=CheckpointError, match=SHA_MISMATCH),
    BadInput("flipped-byte-in-checksum", _damaged(_flip(lambda path, data: len(data) - 1, 0x02)),
             raises=CheckpointError, match=SHA_MISMATCH),
    BadInput("truncated-file", _damaged(lambda path, data: data[: len(data) // 2]), raises=CheckpointError,
             match=r"checkpoint .*ckpt.pt: cannot be read \(\d+ bytes\): truncated"),
    BadInput("truncated-trailer", _damaged(lambda path, data: data[:-10]), raises=CheckpointError,
             match=r"checkpoint .*ckpt.pt: damaged: its checksum trailer is missing"),
    BadInput("empty-file", _damaged(lambda path, data: b""), raises=CheckpointError,
             match=r"checkpoint .*ckpt.pt: the file is empty"),
    BadInput("text-file", _written(lambda path: path.write_text("not a checkpoint")), raises=CheckpointError,
             match=r"ckpt.pt: not a checkpoint: not the zip archive torch.save writes \(it starts with b'not a ch'\)"),
    BadInput("pickled-module", _written(lambda path: torch.save(nn.Linear(2, 2), path)), raises=CheckpointError,
             match=r"checkpoint .*ckpt.pt: not a varbnn checkpoint: it holds Python objects other than plain data"),
    BadInput("dict-without-model", _written(lambda path: torch.save({"epoch": 1, "weights": torch.ones(2)}, path)),
             raises=CheckpointError, match=r"checkpoint .*ckpt.pt: not a varbnn checkpoint: a dict without a 'model' entry"),
    BadInput("checkpoint-of-another-model", _written(lambda path: save_checkpoint(path, nn.Linear(3, 3))),
             raises=CheckpointError, match=r"checkpoint .*ckpt.pt: does not fit the model"),
    BadInput("directory", lambda tmp: read_checkpoint(tmp), raises=CheckpointError, match=r"is not a file"),
    BadInput("missing-file", lambda tmp: read_checkpoint(tmp / "nothing.pt"), raises=FileNotFoundError,
             match=r"nothing.pt does not exist"),
    BadInput("extra-not-plain-data", lambda tmp: save_checkpoint(tmp / "c.pt", nn.Linear(2, 2), epoch=np.float64(1.0)),
             raises=TypeError, match=r"checkpoint entry .*'epoch'.* numpy.float64: checkpoints hold plain data only"),
    BadInput("legacy-checkpoint-without-checksum", _legacy_checkpoint_loads_with_a_warning, expect=_same_model),
]  # fmt: skip


@pytest.mark.parametrize("case", params(CASES))
def test_bad_training_input(case: BadInput, tmp_path: Path) -> None:
    call = case.call
    if inspect.signature(case.call).parameters:  # rows that write files get a fresh directory
        call = lambda: case.call(tmp_path)  # type: ignore[call-arg]  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no row may pass by way of a warning it did not ask for
        check(BadInput(case.id, call, case.raises, case.match, case.expect))


def test_nonfinite_data_check_is_exact_where_the_sum_overflows():
    """The batch check sums first (a finite sum proves the batch finite); finite data whose sum overflows is still
    accepted, and one bad element among them is still found and counted."""
    from varbnn.training.checks import _nonfinite_data

    huge = torch.full((4, 8), 3e38)  # every element finite, the sum inf
    labels = torch.zeros(4, dtype=torch.long)
    assert _nonfinite_data(huge, labels) is None
    assert _nonfinite_data(torch.full((2,), 65504.0, dtype=torch.float16), torch.zeros(2)) is None
    huge[1, 3] = -float("inf")
    assert _nonfinite_data(huge, labels) == "training inputs contain NaN or infinite values (0 NaN, 1 inf of 32)"
    targets = torch.full((4,), 3e38)
    targets[2] = float("nan")
    assert _nonfinite_data(torch.zeros(4, 2), targets) == "training targets contain NaN or infinite values (1 NaN, 0 inf of 4)"


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.float16, torch.float32), (torch.float64,)])
def test_gradients_finite_finds_nan_and_inf_in_any_tensor_and_dtype(dtypes):
    from varbnn.training.checks import _gradients_finite

    params = [torch.zeros(3, 4, dtype=d, requires_grad=True) for d in dtypes]
    for p in params:
        p.grad = torch.full_like(p, 65504.0 if p.dtype == torch.float16 else 1e30)  # finite, near the dtype's top
    assert _gradients_finite(params)
    for bad in (float("nan"), float("inf"), -float("inf")):
        for p in params:
            saved = p.grad.clone()
            p.grad[1, 2] = bad
            assert not _gradients_finite(params), (p.dtype, bad)
            p.grad = saved
    assert _gradients_finite([torch.zeros(2, requires_grad=True)])  # no gradient at all
