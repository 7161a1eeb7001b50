"""A smoke check of ``fit(compile="reduce-overhead")`` (CUDA graphs) on a GPU: a MeanField MLP trained 3 epochs on
random data, its losses and the warnings printed. Needs CUDA. Ran on the H200 of 2026-11-27 (code 022ea0f, from an
untracked copy of this file at the repository root, by ``PYTHONPATH=src python3 fitcheck.py`` after
``scripts/gpu_speed.sh`` in the same device call): "reduce-overhead fit ok 14.5 s; losses [1.947, 1.902, 1.865]".

Usage: PYTHONPATH=src python benchmarks/cudagraph_fit_check.py
"""

import time
import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset

import varbnn

torch.manual_seed(0)
x = torch.randn(512, 20)
y = (x[:, 0] > 0).long()
for mode in ("reduce-overhead",):
    m = varbnn.bayesianize(varbnn.models.mlp(20, (64,), 2), varbnn.MeanField()).cuda()
    t = time.time()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        loader = DataLoader(TensorDataset(x, y), batch_size=64, drop_last=True)
        h = varbnn.fit(m, loader, epochs=3, n_data=512, compile=mode, progress=False)
    losses = [round(r["loss"], 3) for r in h]
    print(mode, "fit ok", round(time.time() - t, 1), "s; losses", losses, "warnings", [str(i.message)[:80] for i in w][:3])
