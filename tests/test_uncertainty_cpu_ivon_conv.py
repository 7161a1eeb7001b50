"""benchmarks/uncertainty_cpu.py's ivon-conv rows: the early-stopped plain net converted and trained by IVON."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _module():
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("uncertainty_cpu")


@pytest.mark.filterwarnings("ignore:TemperatureScaled.fit")  # random labels: T at its bound
def test_ivon_conv_trains_the_converted_plain_net_by_ivon_with_the_chosen_lr(monkeypatch):
    bench = _module()
    g = torch.Generator().manual_seed(0)
    data = {"x_train": torch.rand(256, 1, 28, 28, generator=g), "y_train": torch.randint(0, 10, (256,), generator=g),
            "x_val": torch.rand(128, 1, 28, 28, generator=g), "y_val": torch.randint(0, 10, (128,), generator=g)}  # fmt: skip
    made = []
    real = bench.IVON

    def spy(*args, **kwargs):
        made.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(bench, "IVON", spy)
    args = argparse.Namespace(dataset="mnist", model="mlp", epochs=1, max_epochs=1, draws=2, quick=True)
    runner = bench.Run(args, data, torch.device("cpu"), (0.02, 0.5))
    net, seconds, epochs = runner.train("ivon-conv-ts-m", 0)
    assert len(made) == 1 and made[0]["lr"] == 0.02 and "hess_init" not in made[0]  # the curvature from the std
    plain, plain_seconds, plain_epochs = runner.cache[("plain-es", 0)]
    assert epochs == plain_epochs + bench.CONVERT_EPOCHS  # patience 5 cannot end 2 epochs early
    assert seconds > plain_seconds  # the plain net's training is charged to the converted row
    assert bench._ivon_record("ivon-conv-ts", (0.02, 0.5)) == [0.02, None]
    assert bench._ivon_record("ivon-es-ts", (0.02, 0.5)) == [0.02, 0.5]
    assert bench._ivon_record("meanfield-conv-ts", (0.02, 0.5)) is None
