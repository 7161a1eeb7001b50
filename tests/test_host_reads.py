"""A training step of ``fit`` reads no device value on a GPU: every such read makes the host wait for the device, so
that the next step's host work cannot overlap this step's kernels (issue 29's host syncs per step).

There is no GPU here: the branches a CUDA device takes are switched on for the CPU (fit's deferred checks, the vMF
sampler's fixed rejection rounds, the Bessel functions' masked evaluation), and every operation that reads a tensor's
value on the host (``item``/``bool``/``float``, ``nonzero``, boolean masks, tensors made from Python lists, which
would be host-to-device copies, ``tolist``) is counted per step: the reads of an epoch of 12 steps minus those of an
epoch of 6 (the per-epoch reads cancel), divided by 6. The data check, which reads the batch on the host before it
moves to the device, is not counted."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader, TensorDataset

import varbnn
import varbnn.likelihoods as L
from varbnn import special
from varbnn.distributions import vmf_sampling
from varbnn.priors import Laplace, Normal
from varbnn.training.checks import _DeferredChecks

aten = torch.ops.aten
READS = {aten._local_scalar_dense.default, aten._is_all_true.default, aten.nonzero.default, aten.masked_select.default,
         aten.lift_fresh.default, aten.lift_fresh_copy.default}  # fmt: skip


class _Reads(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        mask_index = func is aten.index.Tensor and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or [])
        )
        if (func in READS or mask_index) and not any(f.function == "_nonfinite_data" for f in inspect.stack(0)[:12]):
            self.count += 1
        return func(*args, **(kwargs or {}))


CASES = {
    "MeanField-reparam": (lambda: varbnn.MeanField(), None, None),
    "MeanField-local": (lambda: varbnn.MeanField(estimator="local"), None, None),
    "MeanField-flipout": (lambda: varbnn.MeanField(estimator="flipout"), None, None),
    "KTied": (lambda: varbnn.KTied(rank=2), None, None),
    "Radial": (lambda: varbnn.Radial(), None, None),
    "Radial-flipout": (lambda: varbnn.Radial(estimator="flipout"), None, None),
    "Delta-Normal": (lambda: varbnn.Delta(), lambda: Normal(0.0, 1.0), None),
    "Delta-Laplace": (lambda: varbnn.Delta(), lambda: Laplace(0.0, 1.0), None),
    "RDP-row": (lambda: varbnn.RadialDirectional(grouping="row"), lambda: varbnn.RadialDirectionalPrior(), None),
    "RDP-double": (lambda: varbnn.RadialDirectional(grouping="double"), lambda: varbnn.RadialDirectionalPrior(), None),
    "MeanField+Gaussian": (lambda: varbnn.MeanField(), None, lambda: L.Gaussian()),
    "MeanField+heteroscedastic": (lambda: varbnn.MeanField(), None, lambda: L.HeteroscedasticGaussian()),
    "MeanField+Gamma-precision": (lambda: varbnn.MeanField(), None, lambda: L.GammaPrecisionGaussian()),
}


def _reads(case: str, steps: int) -> int:
    family, prior, likelihood = CASES[case]
    lik = likelihood() if likelihood else None
    outputs = 3 if lik is None else 2 if isinstance(lik, L.HeteroscedasticGaussian) else 1
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, outputs))
    model = varbnn.bayesianize(net, family(), prior() if prior else None)
    n = 12 * steps
    x = torch.randn(n, 6)
    y = torch.randint(0, 3, (n,)) if lik is None else torch.randn(n) if outputs == 2 else torch.randn(n, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=12, shuffle=True)
    options = {"likelihood": lik} if lik is not None else {}
    varbnn.fit(model, loader, n_data=n, epochs=1, progress=False, diagnose=False, **options)  # first-step caches
    probe = _Reads()
    with probe:
        varbnn.fit(model, loader, n_data=n, epochs=1, progress=False, diagnose=False, **options)
    return probe.count


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_training_step_reads_no_device_value_on_a_gpu(case, monkeypatch):
    monkeypatch.setattr(_DeferredChecks, "DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(_DeferredChecks, "EVERY", 1000)  # one read of the checks per epoch
    monkeypatch.setattr(vmf_sampling, "_fixed_rounds", True)
    monkeypatch.setattr(special, "_use_masked", lambda device: True)
    monkeypatch.setattr(special, "_scalar_path", lambda z: False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        per_step = (_reads(case, 12) - _reads(case, 6)) / 6
    assert per_step == 0, f"{case}: {per_step} host reads of device values per step"


def test_the_probe_sees_the_per_step_checks_when_they_are_not_deferred(monkeypatch):
    """The oracle for the probe: with the deferred checks off, fit's per-step loss and gradient checks read the
    device every step (float(loss), the gradients' finiteness, float(nll), float(kl))."""
    monkeypatch.setattr(_DeferredChecks, "DEVICES", ())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        per_step = (_reads("MeanField-reparam", 12) - _reads("MeanField-reparam", 6)) / 6
    assert per_step >= 3
