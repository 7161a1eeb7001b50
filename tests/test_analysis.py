"""varbnn.analysis: SVD of std matrices, rank-k replacement, gradient SNR."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import varbnn
from varbnn import BayesLinear, KTied, MeanField
from varbnn.analysis import GradientSNR, low_rank, replace_stds_with_rank_k, std_matrix, variance_explained
from varbnn.plots import std_heatmaps, variance_explained_figure


def test_variance_explained_of_a_known_spectrum():
    u, _ = torch.linalg.qr(torch.randn(6, 6, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(4, 4, dtype=torch.float64))
    s = torch.tensor([3.0, 2.0, 1.0, 0.0], dtype=torch.float64)
    matrix = u[:, :4] @ torch.diag(s) @ v.T
    torch.testing.assert_close(variance_explained(matrix), torch.tensor([9, 4, 1, 0], dtype=torch.float64) / 14)


def test_low_rank_recovers_a_rank_k_matrix_and_stays_positive():
    torch.manual_seed(0)
    a, b = torch.rand(7, 2) + 0.1, torch.rand(5, 2) + 0.1
    m = a @ b.T
    torch.testing.assert_close(low_rank(m, 2), m, rtol=1e-5, atol=1e-6)
    assert (low_rank(torch.randn(7, 5).abs(), 1) > 0).all()
    with pytest.raises(ValueError, match="rank must be an int >= 1"):
        low_rank(m, 0)


def test_std_matrix_shapes_and_errors():
    conv = varbnn.BayesConv2d(3, 8, 3, family=MeanField(init_std=0.2)).posteriors["weight"]
    assert std_matrix(conv).shape == (8, 27)
    tied = KTied(rank=1).build((6, 4))
    assert torch.linalg.matrix_rank(std_matrix(tied).double(), rtol=1e-5) == 1
    with pytest.raises(ValueError, match=">= 2 dimensions"):
        std_matrix(MeanField().build((5,)))
    with pytest.raises(TypeError, match="MeanField or KTied"):
        std_matrix(varbnn.Delta().build((3, 3)))


def test_replace_stds_with_rank_k_changes_only_mean_field_weight_stds():
    torch.manual_seed(1)
    model = varbnn.bayesianize(nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2)), MeanField(init_std=0.1))
    with torch.no_grad():
        for q in model.modules():
            if isinstance(q, MeanField):
                q.rho.add_(torch.randn_like(q.rho))
    rank1 = replace_stds_with_rank_k(model, 1)
    for (name, q), (_, r) in zip(model.named_modules(), rank1.named_modules()):
        if isinstance(q, MeanField):
            torch.testing.assert_close(q.loc, r.loc)
            if q.loc.dim() == 2:
                assert torch.linalg.matrix_rank(std_matrix(r).double(), rtol=1e-4) == 1, name
                torch.testing.assert_close(std_matrix(r), low_rank(std_matrix(q), 1))
            else:
                torch.testing.assert_close(q.rho, r.rho)
    # full rank reproduces the model
    full = replace_stds_with_rank_k(model, 5)
    for q, r in zip(model.modules(), full.modules()):
        if isinstance(q, MeanField):
            torch.testing.assert_close(q.scale, r.scale, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="no MeanField posterior"):
        replace_stds_with_rank_k(nn.Linear(2, 2), 1)


def test_gradient_snr_matches_a_hand_computation():
    p = nn.Parameter(torch.zeros(3))
    snr = GradientSNR({"p": p}, window=4)
    grads = [torch.tensor(g) for g in ([1.0, 2.0, 0.0], [1.2, -2.0, 0.0], [0.8, 2.0, 0.0], [1.0, -2.0, 0.0])]
    for g in grads:
        p.grad = g.clone()
        snr.update()
    assert snr.ready
    g = torch.stack(grads).double()
    per_element = g.mean(0) ** 2 / g.var(0)
    assert snr.snr()["p"] == pytest.approx(float(per_element[:2].mean()))  # zero-variance element excluded
    p.grad = torch.tensor([5.0, 5.0, 5.0])
    snr.update()  # the window slides: the first gradient drops out
    g = torch.stack(grads[1:] + [torch.tensor([5.0, 5.0, 5.0])]).double()
    assert snr.snr()["p"] == pytest.approx(float((g.mean(0) ** 2 / g.var(0)).mean()))


def test_ktied_has_higher_gradient_snr_than_mean_field_at_init():
    """The paper's mechanism: each u_ik, v_jk pools the std gradients of a whole row/column, whose data-term
    noise (from independent eps_ij) averages out while the KL-term signal adds up. Layer 200 -> 100, MNIST-like
    KL weight 1/60000."""
    torch.manual_seed(2)
    x, y = torch.randn(1280, 200), torch.randint(0, 10, (1280,))
    results = {}
    for label, family in (("mf", MeanField(init_std=0.01)), ("ktied", KTied(rank=2, init_std=0.01))):
        layer, head = BayesLinear(200, 100, family=family), nn.Linear(100, 10)
        q = layer.posteriors["weight"]
        tracker = GradientSNR({"std": [q.rho] if label == "mf" else [q.log_u, q.log_v]}, window=10)
        for i in range(10):
            idx = torch.arange(i * 128, (i + 1) * 128)
            layer.zero_grad()
            loss = nn.functional.cross_entropy(head(torch.relu(layer(x[idx]))), y[idx]) + q.kl(varbnn.priors.Normal(0, 1)) / 60000
            loss.backward()
            tracker.update()
        results[label] = tracker.snr()["std"]
    assert results["ktied"] > 10 * results["mf"], results


def test_figures(tmp_path):
    m = KTied(rank=2, init_std=0.1).build((12, 9))
    spectrum = variance_explained(std_matrix(m))
    assert variance_explained_figure({"dense 1": spectrum}, tmp_path / "spec.png").exists()
    assert std_heatmaps(std_matrix(m), tmp_path / "heat.png").exists()


def test_front_figure_marks_each_published_row_and_refuses_more_rows_than_marker_shapes(tmp_path):
    from varbnn_lab.figures import _MARKERS, front_figure

    row = {"variant": "RDP double", "front60000_flops": 6e4, "front60000_parameters": 1e4, "front60000_test_error": 0.02,
           "front60000_scratch_test_error": 0.012}  # fmt: skip
    published = [(f"m{i}", 1e5 + i, 9e4 + i, 2e4, 1e4, 0.01) for i in range(len(_MARKERS))]
    assert front_figure([row], [60000], published, tmp_path / "front.png").exists()
    with pytest.raises(ValueError, match=f"published: at most {len(_MARKERS)} rows"):
        front_figure([row], [60000], [*published, ("one more", 1, 1, 1, 1, 0.01)], tmp_path / "more.png")
