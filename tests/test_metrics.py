import math

import numpy as np
import pytest
import torch
from sklearn.metrics import brier_score_loss, log_loss, roc_auc_score

from varbnn import metrics


@pytest.fixture
def probs_labels():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(300, 5, generator=g) * 2
    labels = torch.randint(0, 5, (300,), generator=g)
    return torch.softmax(logits, -1).double(), labels


def test_brier_and_nll_match_sklearn(probs_labels):
    p, y = probs_labels
    assert metrics.brier_score(p, y) == pytest.approx(brier_score_loss(y.numpy(), p.numpy(), labels=range(5)), rel=1e-10)
    assert metrics.negative_log_likelihood(p, y) == pytest.approx(log_loss(y.numpy(), p.numpy(), labels=range(5)), rel=1e-10)


@pytest.mark.parametrize("ties", [False, True])
def test_auroc_matches_sklearn(ties):
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(500, generator=g)
    if ties:
        scores = (scores * 3).round()
    labels = (torch.rand(500, generator=g) < 0.3).long()
    assert metrics.auroc(scores, labels) == pytest.approx(roc_auc_score(labels.numpy(), scores.numpy()), rel=1e-12)


def test_ece_by_hand():
    # two bins used: confidences 0.9 (2 examples, 1 correct) and 0.6 (2 examples, 2 correct)
    p = torch.tensor([[0.9, 0.1], [0.1, 0.9], [0.6, 0.4], [0.4, 0.6]])
    y = torch.tensor([0, 0, 0, 1])
    expected = 0.5 * abs(0.5 - 0.9) + 0.5 * abs(1.0 - 0.6)
    assert metrics.expected_calibration_error(p, y, n_bins=15) == pytest.approx(expected)


def test_ece_with_numpy_binning(probs_labels):
    p, y = probs_labels
    conf, pred = p.max(-1)
    conf, correct = conf.numpy(), (pred == y).numpy()
    edges = np.linspace(0, 1, 16)
    ece = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        inside = (conf > lo) & (conf <= hi)
        if inside.any():
            ece += inside.mean() * abs(correct[inside].mean() - conf[inside].mean())
    assert metrics.expected_calibration_error(p, y) == pytest.approx(ece, rel=1e-9)


def test_accuracy_and_rmse():
    p = torch.tensor([[0.2, 0.8], [0.7, 0.3], [0.4, 0.6]])
    assert metrics.accuracy(p, torch.tensor([1, 1, 1])) == pytest.approx(2 / 3)
    assert metrics.rmse(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 4.0])) == pytest.approx(math.sqrt(2))


def test_gaussian_log_likelihood_by_hand():
    f = torch.tensor([[0.0, 1.0], [2.0, 1.5], [1.0, -1.0]], dtype=torch.float64)  # S=3 samples, N=2 points
    y = torch.tensor([0.5, 1.0], dtype=torch.float64)
    s = 0.7
    per_point = []
    for n in range(2):
        dens = [math.exp(-0.5 * ((y[n] - f[k, n]) / s) ** 2) / (s * math.sqrt(2 * math.pi)) for k in range(3)]
        per_point.append(math.log(sum(dens) / 3))
    assert metrics.gaussian_log_likelihood(f, y, s) == pytest.approx(sum(per_point) / 2, rel=1e-12)


def test_referral_curve_keeps_the_most_certain():
    p = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.5, 0.5]])
    y = torch.tensor([0, 1, 1, 1])
    uncertainty = torch.tensor([0.1, 0.2, 0.9, 0.8])
    rows = metrics.referral_curve(p, y, uncertainty, fractions=[0.0, 0.5])
    assert rows[0] == {"referred": 0.0, "retained": 4, "accuracy": 0.5}
    assert rows[1] == {"referred": 0.5, "retained": 2, "accuracy": 1.0}


def test_referral_curve_auroc_on_the_kept_examples_matches_sklearn():
    g = torch.Generator().manual_seed(0)
    p1 = torch.rand(200, generator=g, dtype=torch.float64)
    p = torch.stack([1 - p1, p1], dim=1)
    y = (torch.rand(200, generator=g) < p1).long()
    uncertainty = torch.rand(200, generator=g)
    rows = metrics.referral_curve(p, y, uncertainty, fractions=[0.0, 0.3, 0.995], with_auroc=True)
    order = torch.argsort(uncertainty)
    for row in rows[:2]:
        kept = order[: row["retained"]]
        assert row["auroc"] == pytest.approx(roc_auc_score(y[kept].numpy(), p1[kept].numpy()), abs=1e-12)
    assert rows[2]["retained"] == 1 and math.isnan(rows[2]["auroc"])  # one class left
    with pytest.raises(ValueError, match="with_auroc needs two classes"):
        metrics.referral_curve(torch.full((4, 3), 1 / 3), torch.zeros(4, dtype=torch.long), torch.rand(4), with_auroc=True)


def test_bad_metric_input_is_named():
    with pytest.raises(ValueError, match="probs must have shape"):
        metrics.accuracy(torch.rand(3), torch.zeros(3))
    with pytest.raises(ValueError, match="probs contains NaN"):
        metrics.brier_score(torch.tensor([[float("nan"), 1.0]]), torch.tensor([0]))
    with pytest.raises(ValueError, match="at least one positive and one negative"):
        metrics.auroc(torch.rand(4), torch.ones(4))
    with pytest.raises(ValueError, match="noise_std must be a finite number > 0"):
        metrics.gaussian_log_likelihood(torch.zeros(2, 3), torch.zeros(3), -1.0)


def test_mean_and_standard_error_matches_numpy_and_skips_nan():
    import numpy as np

    from varbnn.metrics import mean_and_standard_error

    values = [0.3, 1.2, -0.4, 2.0]
    mean, se = mean_and_standard_error(values + [float("nan")])
    assert mean == pytest.approx(np.mean(values)) and se == pytest.approx(np.std(values, ddof=1) / 2)
    assert math.isnan(mean_and_standard_error([1.0])[1]) and math.isnan(mean_and_standard_error([])[0])
