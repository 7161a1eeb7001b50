"""fit's loss and gradient checks without a host read per step (_DeferredChecks, used on CUDA with the fused Adam):
run here on the CPU by enabling it for the CPU, against fit's per-step checks as the oracle."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import varbnn
from varbnn.training import NonFiniteError
from varbnn.training.checks import _DeferredChecks


def _data(n: int = 96) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 5, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long())


class _PoisonAt(nn.Module):
    """Identity, except that on forward call ``at`` (1-based) it makes the output NaN (``where="output"``: a NaN
    loss) or makes the gradient flowing back through it NaN (``where="gradient"``: finite loss, NaN gradients)."""

    def __init__(self, at: int, where: str) -> None:
        super().__init__()
        self.at, self.where, self.calls = at, where, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.training and self.calls == self.at:
            if self.where == "output":
                return x * float("nan")
            return _NaNGrad.apply(x)
        return x


class _NaNGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        return grad * float("nan")


def _model(poison: nn.Module | None = None) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(5, 16), nn.ReLU()]
    if poison is not None:
        layers.append(poison)
    layers.append(nn.Linear(16, 2))
    return varbnn.bayesianize(nn.Sequential(*layers), varbnn.MeanField())


def _fit(model: nn.Module, deferred: bool, monkeypatch, epochs: int = 3, **kwargs):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(_DeferredChecks, "DEVICES", ("cuda", "cpu") if deferred else ("cuda",))
    monkeypatch.setattr(_DeferredChecks, "EVERY", 5)
    torch.manual_seed(1)
    loader = DataLoader(_data(), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(2))
    return varbnn.fit(model, loader, n_data=96, epochs=epochs, progress=False, diagnose=False, **kwargs)


@pytest.mark.parametrize("options", [{}, {"mc_samples": 2}], ids=["default", "S=2"])
def test_deferred_checks_give_the_same_history_and_parameters(monkeypatch, options):
    eager, deferred = _model(), _model()
    history = _fit(eager, False, monkeypatch, **options)
    assert _fit(deferred, True, monkeypatch, **options) == history  # the same sums, in the same order
    for (name, a), b in zip(eager.named_parameters(), deferred.parameters()):
        assert torch.equal(a, b), name


def test_deferred_checks_are_used_only_where_they_apply(monkeypatch):
    monkeypatch.setattr(_DeferredChecks, "DEVICES", ("cuda", "cpu"))
    cpu = torch.device("cpu")
    fused = torch.optim.Adam([nn.Parameter(torch.ones(2))], fused=True)
    assert _DeferredChecks.applies(cpu, fused, excluded=False)
    assert not _DeferredChecks.applies(cpu, fused, excluded=True)  # distributed, Graves, skip_nonfinite, adaptive
    assert not _DeferredChecks.applies(cpu, torch.optim.SGD([nn.Parameter(torch.ones(2))], lr=0.1), excluded=False)
    fused.found_inf = torch.zeros(())  # type: ignore[attr-defined]  # a caller's own use (a GradScaler)
    assert not _DeferredChecks.applies(cpu, fused, excluded=False)
    monkeypatch.setattr(_DeferredChecks, "DEVICES", ("cuda",))
    assert not _DeferredChecks.applies(cpu, torch.optim.Adam([nn.Parameter(torch.ones(2))], fused=True), excluded=False)


@pytest.mark.parametrize("where, kind", [("output", "loss"), ("gradient", "gradient")])
def test_a_non_finite_step_is_reported_at_its_own_step_with_the_model_as_before_it(monkeypatch, where, kind):
    """Step 18 (epoch 2, batch index 5) goes bad. The per-step checks raise there; the deferred ones at the check
    after step 22, naming step 18, and no step from 18 on has changed the parameters: the same model as the oracle's."""
    oracle, deferred = _model(_PoisonAt(18, where)), _model(_PoisonAt(18, where))
    with pytest.raises(NonFiniteError) as expected:
        _fit(oracle, False, monkeypatch)
    with pytest.raises(NonFiniteError) as got:
        _fit(deferred, True, monkeypatch)
    assert expected.value.kind == got.value.kind == kind
    assert (got.value.epoch, got.value.step, got.value.batch) == (expected.value.epoch, expected.value.step,
                                                                  expected.value.batch) == (2, 18, 5)  # fmt: skip
    # the same message as the per-step checks' (the names of the bad gradients too), then where it was read:
    # epoch 2 holds steps 13-24, checked after steps 17, 22 and 24
    assert str(got.value).startswith(str(expected.value).split("; ")[0].split(" (the loss")[0])
    assert "read at the check after step 22" in str(got.value) and "steps 18 to 22 left the parameters" in str(got.value)
    for (name, a), b in zip(oracle.named_parameters(), deferred.parameters()):
        assert torch.equal(a, b), name


def test_deferred_checks_under_a_float64_default_dtype(monkeypatch):
    """The fused kernels read found_inf as float32: the halt flag keeps that dtype whatever the default."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        eager, deferred = _model(), _model()
        assert _fit(deferred, True, monkeypatch, epochs=1) == _fit(eager, False, monkeypatch, epochs=1)
    finally:
        torch.set_default_dtype(previous)


def test_a_bad_step_waiting_in_the_window_is_reported_before_a_later_error(monkeypatch):
    """Step 3's gradient is NaN, step 4's batch holds NaN data: the per-step checks stop at step 3, and so must the
    deferred ones (the data error is the context), or the model's silent halt at step 3 would go unreported."""

    class _NaNDataAt4(DataLoader):
        def __iter__(self):  # type: ignore[no-untyped-def]
            for i, (x, y) in enumerate(super().__iter__()):
                yield (x * float("nan"), y) if i == 3 else (x, y)

    def run(deferred: bool) -> NonFiniteError:
        monkeypatch.setattr(_DeferredChecks, "DEVICES", ("cuda", "cpu") if deferred else ("cuda",))
        model = _model(_PoisonAt(3, "gradient"))
        with pytest.raises(NonFiniteError) as caught:
            varbnn.fit(model, _NaNDataAt4(_data(), batch_size=8), n_data=96, epochs=1, progress=False, diagnose=False)
        return caught.value

    expected, got = run(False), run(True)
    assert (expected.kind, expected.step) == (got.kind, got.step) == ("gradient", 3)
    assert isinstance(got.__cause__, NonFiniteError) and got.__cause__.kind == "data"


def test_deferred_checks_only_with_the_fused_adam(monkeypatch):
    """Fused SGD with momentum would keep uninitialised momentum buffers from a skipped first step."""
    monkeypatch.setattr(_DeferredChecks, "DEVICES", ("cuda", "cpu"))
    cpu = torch.device("cpu")
    sgd = torch.optim.SGD([nn.Parameter(torch.ones(2))], lr=0.1, momentum=0.9, fused=True)
    assert getattr(sgd, "_step_supports_amp_scaling", False) and not _DeferredChecks.applies(cpu, sgd, excluded=False)
    assert _DeferredChecks.applies(cpu, torch.optim.AdamW([nn.Parameter(torch.ones(2))], fused=True), excluded=False)


@pytest.mark.slow
def test_deferred_checks_with_the_compiled_step(monkeypatch):
    """fit(compile=True) with the deferred checks: the same history as with the per-step ones (the compiled step on
    the CPU draws eager's random numbers, so the two runs are the same run up to float rounding)."""
    eager, deferred = _model(), _model()
    history = _fit(eager, False, monkeypatch, epochs=2, compile=True)
    got = _fit(deferred, True, monkeypatch, epochs=2, compile=True)
    for a, b in zip(history, got):
        assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], rel=1e-5) for k in a)
