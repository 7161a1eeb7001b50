"""VonMisesFisher / HypersphericalUniform against scipy.stats.vonmises_fisher, mpmath and Monte Carlo."""

from __future__ import annotations

import json
import math
from pathlib import Path

import mpmath
import numpy as np
import pytest
import torch
from scipy import stats
from torch.distributions import kl_divergence
from torch.overrides import TorchFunctionMode

from varbnn.distributions import HypersphericalUniform, RejectionSamplingError, VonMisesFisher
from varbnn.distributions.vmf import fixed_rejection_rounds, householder_sample

DIMS = (2, 3, 10, 100, 1000, 10000)
KAPPAS = (1e-3, 1.0, 100.0, 1e5)
ORACLE = Path(__file__).parent / "data" / "bessel_oracle.json"


@pytest.fixture(scope="module")
def vmf_oracle() -> dict[tuple[int, float], tuple[float, float]]:
    """(d, kappa) -> (log C_d(kappa), entropy) from mpmath's log I_{d/2-1}(kappa) and log I_{d/2}(kappa)."""
    out = {}
    with mpmath.workdps(40):
        for row in json.loads(ORACLE.read_text())["vmf"]:
            d, kappa = row["d"], row["kappa"]
            k = mpmath.mpf(kappa)
            log_c = (d / 2 - 1) * mpmath.log(k) - (d / 2) * mpmath.log(2 * mpmath.pi) - mpmath.mpf(row["log_iv_d2m1"])
            a = mpmath.exp(mpmath.mpf(row["log_iv_d2"]) - mpmath.mpf(row["log_iv_d2m1"]))
            out[(d, kappa)] = (float(log_c), float(-k * a - log_c))
    return out


def _unit(d: int, dtype: torch.dtype = torch.float64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(d, generator=g, dtype=torch.float64)
    return (v / v.norm()).to(dtype)


def _close(got: float, want: float, rel: float) -> bool:
    return abs(got - want) <= rel * max(1.0, abs(want))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("d", DIMS)
def test_log_prob_and_entropy_against_mpmath_and_scipy(d, dtype, vmf_oracle):
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    mu = _unit(d, dtype)
    x = torch.stack([mu, -mu, _unit(d, dtype, seed=1)])
    for kappa in KAPPAS:
        q = VonMisesFisher(mu, torch.tensor(kappa, dtype=dtype))
        log_c, entropy = vmf_oracle[(d, kappa)]
        lp = q.log_prob(x)
        assert lp.dtype == dtype and torch.isfinite(lp).all() and torch.isfinite(q.entropy())
        assert _close(q.log_normalizer().item(), log_c, tol)
        # entropy = -kappa A - log C subtracts two terms of size ~kappa: absolute error ~kappa * eps
        assert abs(q.entropy().item() - entropy) <= tol * max(1.0, abs(entropy), kappa)
        want = kappa * (x.double() @ mu.double()).numpy() + log_c
        assert all(abs(g - w) <= tol * max(1.0, abs(w), kappa) for g, w in zip(lp.double().tolist(), want.tolist()))
        with np.errstate(all="ignore"):
            sp = stats.vonmises_fisher(mu.double().numpy(), kappa)
            sp_entropy, sp_lp = sp.entropy(), sp.logpdf(x.double().numpy())
        if np.isfinite(sp_entropy):  # scipy is NaN for d >= 1000 at small kappa; mpmath covers those
            assert abs(q.entropy().item() - float(sp_entropy)) <= max(tol, 1e-10) * max(1.0, abs(float(sp_entropy)), kappa)
            assert np.allclose(lp.double().numpy(), sp_lp, rtol=max(tol, 1e-10), atol=max(tol, 1e-10) * kappa)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("d", DIMS)
def test_samples_have_the_right_first_two_moments(d, dtype):
    """E[mu.x] = A_d(kappa) and E[(mu.x)^2] = 1 - (d-1) A_d(kappa)/kappa, within 5 Monte Carlo standard errors."""
    torch.manual_seed(d)
    n = 4000 if d < 10000 else 800
    mu = _unit(d, dtype)
    for kappa in KAPPAS:
        q = VonMisesFisher(mu, torch.tensor(kappa, dtype=dtype))
        x = q.rsample((n,))
        assert x.shape == (n, d) and x.dtype == dtype and torch.isfinite(x).all()
        assert ((x.double().norm(dim=-1) - 1).abs() < (1e-12 if dtype == torch.float64 else 1e-5)).all()
        w = x.double() @ mu.double()
        a = q.mean_resultant_length.double().item()
        for values, want in ((w, a), (w * w, 1 - (d - 1) * a / kappa)):
            se = values.std().item() / math.sqrt(n)
            # float32 rounds omega (|1 - omega| ~ d/kappa at large kappa) to ~6e-8 relative
            slack = 5 * se + (3e-7 if dtype == torch.float32 else 1e-14)
            assert abs(values.mean().item() - want) <= slack, (kappa, values.mean().item(), want, se)
        # tangent components: mean zero (the direction around mu is uniform)
        tangent = x.double() - w.unsqueeze(-1) * mu.double()
        mean_t = tangent.mean(0)
        assert (mean_t.abs() <= 5 * tangent.std(0) / math.sqrt(n) + 1e-12).float().mean() > 0.99


def test_d3_marginal_matches_the_exact_cdf():
    # on S^2 the density of w = mu.x is kappa e^{kappa w} / (2 sinh kappa) on [-1, 1]
    torch.manual_seed(0)
    for kappa in (0.5, 5.0, 50.0):
        q = VonMisesFisher(_unit(3), torch.tensor(kappa, dtype=torch.float64))
        w = (q.sample((5000,)) @ q.loc).numpy()
        cdf = lambda t, k=kappa: np.expm1(k * (t + 1)) / np.expm1(2 * k)  # noqa: E731
        assert stats.kstest(w, cdf).pvalue > 1e-3


def test_batched_parameters_and_shapes():
    torch.manual_seed(0)
    loc = torch.nn.functional.normalize(torch.randn(4, 5, dtype=torch.float64), dim=-1)
    kappa = torch.tensor([0.1, 1.0, 10.0, 1e3], dtype=torch.float64)
    q = VonMisesFisher(loc, kappa)
    assert q.batch_shape == (4,) and q.event_shape == (5,)
    x = q.rsample((300, 2))
    assert x.shape == (300, 2, 4, 5)
    assert q.log_prob(x).shape == (300, 2, 4)
    assert q.entropy().shape == (4,) and q.mean.shape == (4, 5) and torch.equal(q.mode, loc)
    # every batch element samples around its own loc
    w = (x * loc).sum(-1).reshape(-1, 4).mean(0)
    torch.testing.assert_close(w, q.mean_resultant_length, atol=0.05, rtol=0)
    e = q.expand((3, 4))
    assert e.batch_shape == (3, 4) and e.rsample().shape == (3, 4, 5)
    # a loc batch broadcast against a scalar kappa, and the reverse
    assert VonMisesFisher(loc, 2.0).batch_shape == (4,)
    assert VonMisesFisher(loc[0], kappa).rsample().shape == (4, 5)


def _per_sample_kappa_grads(d: int, kappa: float, n: int, with_score: bool) -> torch.Tensor:
    mu = _unit(d)
    kap = torch.full((n,), kappa, dtype=torch.float64, requires_grad=True)
    q = VonMisesFisher(mu.expand(n, d), kap)
    if with_score:
        w, score = q.rsample_with_score()
        f = w @ mu
        (f + f.detach() * score).sum().backward()
    else:
        (q.rsample() @ mu).sum().backward()
    return kap.grad


@pytest.mark.parametrize("d, kappa", [(2, 3.0), (3, 1.0), (10, 10.0), (100, 100.0)])
def test_concentration_gradient_with_correction_is_unbiased(d, kappa):
    """d/dkappa E[mu.x] = A'_d(kappa) = 1 - (d-1) A/kappa - A^2 exactly; RSVI's estimate must match it."""
    torch.manual_seed(1)
    n = 100_000
    a = VonMisesFisher(_unit(d), torch.tensor(kappa, dtype=torch.float64)).mean_resultant_length.item()
    exact = 1 - (d - 1) * a / kappa - a * a
    g = _per_sample_kappa_grads(d, kappa, n, with_score=True)
    assert abs(g.mean().item() - exact) < 5 * g.std().item() / math.sqrt(n)
    # without the correction term the pathwise part alone is biased (why rsample_with_score exists)
    g0 = _per_sample_kappa_grads(d, kappa, n, with_score=False)
    assert abs(g0.mean().item() - exact) > 5 * g0.std().item() / math.sqrt(n)


def test_loc_gradient_is_unbiased():
    """d/dmu E[a.x] = A_d(kappa) a, projected on the tangent space at mu (loc lives on the sphere)."""
    torch.manual_seed(2)
    d, kappa, n = 6, 4.0, 50_000
    mu = _unit(d).requires_grad_()
    a_vec = torch.randn(d, dtype=torch.float64)
    q = VonMisesFisher(mu, torch.tensor(kappa, dtype=torch.float64))
    x = q.rsample((n,))
    (x @ a_vec).mean().backward()
    proj = torch.eye(d, dtype=torch.float64) - torch.outer(mu.detach(), mu.detach())
    got = proj @ mu.grad
    want = q.mean_resultant_length.item() * (proj @ a_vec)
    assert (got - want).abs().max() < 0.02


def test_kl_vmf_vmf_against_monte_carlo():
    torch.manual_seed(3)
    for d, kq, kp in [(3, 2.0, 5.0), (10, 50.0, 1.0), (100, 300.0, 10.0), (1000, 1e4, 100.0)]:
        q = VonMisesFisher(_unit(d, seed=4), torch.tensor(kq, dtype=torch.float64))
        p = VonMisesFisher(
            torch.nn.functional.normalize(_unit(d, seed=4) + 0.5 * _unit(d, seed=5), dim=0), torch.tensor(kp, dtype=torch.float64)
        )
        kl = kl_divergence(q, p).item()
        x = q.sample((20_000,))
        terms = q.log_prob(x) - p.log_prob(x)
        assert abs(terms.mean().item() - kl) < 5 * terms.std().item() / math.sqrt(len(terms)) + 1e-9
        assert kl > 0
        assert abs(kl_divergence(q, q).item()) < 1e-9 * max(1.0, kq)


def test_kl_and_entropy_gradients_against_finite_differences():
    """Supplementary eq. 47-48 are what autograd gives through bessel_ratio and the log-normaliser."""
    for d in (3, 50, 2000):
        mu_q = torch.nn.functional.normalize(_unit(d, seed=6) + 0.3 * _unit(d, seed=7), dim=0)
        mu_p = _unit(d, seed=6)
        kappas = torch.tensor([0.7, 40.0], dtype=torch.float64, requires_grad=True)

        def kl(k: torch.Tensor, loc: torch.Tensor, d: int = d, mu_p: torch.Tensor = mu_p) -> torch.Tensor:
            q = VonMisesFisher(torch.nn.functional.normalize(loc, dim=0), k[0])
            p = VonMisesFisher(mu_p, k[1])
            return kl_divergence(q, p) + q.entropy() + kl_divergence(q, HypersphericalUniform(d, dtype=torch.float64))

        assert torch.autograd.gradcheck(kl, (kappas, mu_q.clone().requires_grad_()))
        # eq. 48: d KL / d mu_q = -kappa_p mu_p A_d(kappa_q) (before projecting on the sphere)
        loc = mu_q.clone().requires_grad_()
        q = VonMisesFisher(loc, kappas[0].detach())
        kl_divergence(q, VonMisesFisher(mu_p, 40.0)).backward()
        torch.testing.assert_close(loc.grad, -40.0 * mu_p * q.mean_resultant_length)


def test_kl_with_the_uniform_distribution():
    torch.manual_seed(4)
    for d in (2, 3, 50, 10000):
        u = HypersphericalUniform(d, dtype=torch.float64)
        for kappa in (1e-3, 3.0, 1e4):
            q = VonMisesFisher(_unit(d), torch.tensor(kappa, dtype=torch.float64))
            kl = kl_divergence(q, u).item()
            assert kl == pytest.approx(u.entropy().item() - q.entropy().item(), rel=1e-12, abs=1e-12)
            assert kl >= -1e-12 and math.isfinite(kl)
            assert kl_divergence(u, q).item() >= -1e-9
        x = u.sample((20_000 if d < 1000 else 1000,))
        q = VonMisesFisher(_unit(d), torch.tensor(3.0, dtype=torch.float64))
        terms = u.log_prob(x) - q.log_prob(x)
        assert abs(terms.mean().item() - kl_divergence(u, q).item()) < 5 * terms.std().item() / math.sqrt(len(terms)) + 1e-9
    # log surface area of S^2 is log(4 pi)
    assert HypersphericalUniform(3).log_surface_area() == pytest.approx(math.log(4 * math.pi))
    assert kl_divergence(HypersphericalUniform(4), HypersphericalUniform(4)).item() == 0.0


def test_tiny_concentration_tends_to_uniform():
    for d in (3, 100, 10000):
        q = VonMisesFisher(_unit(d), torch.tensor(1e-8, dtype=torch.float64))
        uniform = HypersphericalUniform(d, dtype=torch.float64)
        assert q.entropy().item() == pytest.approx(uniform.entropy().item(), rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_no_nan_or_inf_anywhere_at_the_extremes(dtype):
    torch.manual_seed(5)
    for d in (2, 10000):
        for kappa in (1e-3, 1e5):
            mu = _unit(d, dtype).requires_grad_()
            kap = torch.tensor(kappa, dtype=dtype, requires_grad=True)
            q = VonMisesFisher(mu, kap)
            x, score = q.rsample_with_score((64,))
            loss = q.log_prob(x.detach()).sum() + x.sum() + score.sum() + q.entropy()
            loss = (
                loss
                + kl_divergence(q, HypersphericalUniform(d, dtype=dtype))
                + kl_divergence(q, VonMisesFisher(mu.detach(), 1.0))
            )
            loss.backward()
            for t in (x, score, loss, mu.grad, kap.grad):
                assert torch.isfinite(t).all(), (d, kappa, dtype)


def test_bounds_ratio_method():
    q = VonMisesFisher(_unit(200), torch.tensor(50.0, dtype=torch.float64), ratio_method="bounds")
    exact = VonMisesFisher(_unit(200), torch.tensor(50.0, dtype=torch.float64))
    assert q.mean_resultant_length.item() == pytest.approx(exact.mean_resultant_length.item(), rel=1e-4)
    assert q.mean_resultant_length.item() != exact.mean_resultant_length.item()


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda: VonMisesFisher(torch.ones(3), 1.0), ValueError, "unit norm"),
        (lambda: VonMisesFisher(_unit(3), -1.0), ValueError, "concentration must be finite and > 0"),
        (lambda: VonMisesFisher(_unit(3), float("nan")), ValueError, "concentration"),
        (lambda: VonMisesFisher(torch.tensor([float("nan"), 0.0, 1.0]), 1.0), ValueError, "NaN"),
        (lambda: VonMisesFisher(torch.ones(1), 1.0), ValueError, "must be >= 2"),
        (lambda: VonMisesFisher(_unit(3), 1.0, ratio_method="scipy"), ValueError, "choose one of"),
        (lambda: VonMisesFisher(_unit(3), 1.0, max_rejection_rounds=0), ValueError, "max_rejection_rounds"),
        (lambda: HypersphericalUniform(1), ValueError, "dim must be an int >= 2"),
        (lambda: kl_divergence(VonMisesFisher(_unit(3), 1.0), HypersphericalUniform(4)), ValueError, "different dimension"),
        (lambda: VonMisesFisher(_unit(3), 1.0).log_prob(torch.ones(3)), ValueError, "support"),
    ],
)
def test_bad_input(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_validation_can_be_switched_off():
    q = VonMisesFisher(torch.ones(3), 1.0, validate_args=False)  # the caller takes responsibility
    assert q.rsample().shape == (3,)


def test_bounded_rejection_rounds_raise_a_clear_error(monkeypatch):
    from varbnn.distributions import vmf_sampling

    torch.manual_seed(0)
    kappa = torch.full((100_000,), 1e4, dtype=torch.float64)  # one per element: the per-element rounds
    q = VonMisesFisher(_unit(3).expand(100_000, 3), kappa, max_rejection_rounds=1)  # ~68% acceptance
    with pytest.raises(RejectionSamplingError, match="max_rejection_rounds=1"):
        q.rsample()  # 8 first-round proposals: P(all rejected) ~ 0.32^8 per element
    shared = VonMisesFisher(_unit(3), torch.tensor(1e4, dtype=torch.float64), max_rejection_rounds=1)
    assert shared.rsample((1000,)).shape == (1000, 3)  # the shared pool's first round suffices
    monkeypatch.setattr(vmf_sampling, "POOL_FACTOR", 1.0)  # ~0.68 n accepted of n proposals
    monkeypatch.setattr(vmf_sampling, "POOL_EXTRA", 0)
    with pytest.raises(RejectionSamplingError, match=r"left \d+ of 1000 elements .* max_rejection_rounds=1"):
        shared.rsample((1000,))
    monkeypatch.setattr(vmf_sampling, "POOL_FACTOR", 0.01)  # one proposal a round: many rounds, the draws still all there
    assert VonMisesFisher(_unit(3), torch.tensor(2.0, dtype=torch.float64)).rsample((50,)).isfinite().all()


def test_a_shared_concentration_draws_from_one_pool_of_about_1_6_proposals_per_element(monkeypatch):
    """On the CPU the elements of a shared (expanded) concentration take the accepted proposals of one sequence, in
    order: about POOL_FACTOR Gamma draws per element where the per-element rounds draw 8; a per-element concentration
    still takes the rounds. The pool's draws are the target distribution: the S^2 marginal against its exact CDF."""
    from varbnn.distributions import vmf

    drawn = []
    gamma = torch._standard_gamma
    monkeypatch.setattr(torch, "_standard_gamma", lambda a, *args, **kw: drawn.append(a.numel()) or gamma(a, *args, **kw))
    torch.manual_seed(0)
    n, d = 2000, 50
    vmf.wood_accepted_proposals(d, torch.tensor(30.0, dtype=torch.float64).expand(n))
    assert n < sum(drawn) <= math.ceil(vmf.POOL_FACTOR * n) + vmf.POOL_EXTRA + 100, drawn  # a rare second round
    drawn.clear()
    vmf.wood_accepted_proposals(d, torch.full((n,), 30.0, dtype=torch.float64))
    assert sum(drawn) >= vmf.PROPOSALS_FIRST_ROUND * n
    for kappa in (1.0, 50.0):
        q = VonMisesFisher(_unit(3), torch.tensor(kappa, dtype=torch.float64))
        w = (q.rsample((5000,)) @ q.loc).numpy()
        cdf = lambda t, k=kappa: np.expm1(k * (t + 1)) / np.expm1(2 * k)  # noqa: E731
        assert stats.kstest(w, cdf).pvalue > 1e-3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda():  # pragma: no cover - CPU-only CI
    q = VonMisesFisher(_unit(100).cuda(), torch.tensor(50.0, device="cuda", dtype=torch.float64))
    x = q.rsample((1000,))
    assert x.is_cuda and torch.isfinite(x).all()
    assert q.log_prob(x).is_cuda and q.entropy().is_cuda


def test_a_concentration_shared_by_rows_is_evaluated_once_and_gets_the_summed_gradient():
    from varbnn.distributions.vmf import log_normalizer_and_resultant

    kappa = torch.tensor(37.0, dtype=torch.float64, requires_grad=True)
    shared = kappa.expand(5)
    log_c, a = log_normalizer_and_resultant(40, shared)
    (log_c.sum() + a.sum()).backward()
    single = torch.tensor(37.0, dtype=torch.float64, requires_grad=True)
    log_c1, a1 = log_normalizer_and_resultant(40, single)
    (log_c1 + a1).backward()
    torch.testing.assert_close(log_c, log_c1.expand(5))
    torch.testing.assert_close(kappa.grad, 5 * single.grad)
    # d log C / d kappa = -A_d (the identity the score and the KL gradients rely on)
    torch.testing.assert_close(torch.autograd.grad(log_normalizer_and_resultant(40, single)[0], single)[0], -a1.detach())


def test_rsample_synchronises_with_the_host_once_when_the_first_round_accepts_all():
    """Boolean indexing, .item() and bool() each wait for the device on a GPU: the common case must need one."""

    torch.manual_seed(0)
    q = VonMisesFisher(_unit(50), torch.tensor(30.0, dtype=torch.float64))
    syncs: list[str] = []

    class CountSyncs(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            index = args[1] if name in ("__getitem__", "__setitem__") and len(args) > 1 else None
            if name in ("item", "__bool__", "__float__", "__int__", "nonzero", "tolist") or (
                isinstance(index, torch.Tensor) and index.dtype == torch.bool
            ):
                syncs.append(name)
            return func(*args, **(kwargs or {}))

    with CountSyncs():
        x = q.rsample((200,))
    # on the CPU (only) the shared concentration is read once as a Python float for the envelope's constants, and its
    # pool of proposals keeps the accepted ones (one boolean index)
    assert x.shape == (200, 50) and syncs == ["__float__", "__getitem__"]


class _CountSyncs(TorchFunctionMode):
    """Records the calls that read a tensor's value on the host (each waits for the device on a GPU)."""

    def __init__(self):
        super().__init__()
        self.syncs: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("item", "__bool__", "__float__", "__int__", "nonzero", "tolist"):
            self.syncs.append(name)
        return func(*args, **(kwargs or {}))


def test_fixed_rejection_rounds_draw_the_same_distribution_without_a_host_synchronisation():
    """The compiled step's sampler (32 proposals at once, the first accepted kept): on S^2 the marginal of mu.x against
    its exact CDF (Kolmogorov-Smirnov), and the first two moments at d = 50 and 1000; no data-dependent host read.
    kappa = 1 at d = 3 is where Wood's acceptance rate is lowest."""
    torch.manual_seed(0)
    for kappa in (1.0, 5.0, 50.0):
        q = VonMisesFisher(_unit(3), torch.tensor(kappa, dtype=torch.float64))
        with fixed_rejection_rounds(), _CountSyncs() as counter:
            w = q.rsample((5000,)) @ q.loc
        assert counter.syncs == []
        cdf = lambda t, k=kappa: np.expm1(k * (t + 1)) / np.expm1(2 * k)  # noqa: E731
        assert stats.kstest(w.numpy(), cdf).pvalue > 1e-3
    for d, kappa in ((50, 30.0), (1000, 500.0)):
        q = VonMisesFisher(_unit(d), torch.tensor(kappa, dtype=torch.float64))
        with fixed_rejection_rounds():
            w = q.rsample((4000,)) @ q.loc
        a = q.mean_resultant_length.item()
        for values, want in ((w, a), (w * w, 1 - (d - 1) * a / kappa)):
            assert abs(values.mean().item() - want) <= 5 * values.std().item() / math.sqrt(4000) + 1e-14


@pytest.mark.parametrize("d", [2, 3, 11, 785])
def test_wood_proposals_are_symmetric_beta(d):
    """Wood's proposals eps ~ Beta((d-1)/2, (d-1)/2) (drawn from one Gamma and one normal): Kolmogorov-Smirnov against
    scipy's Beta, and no value outside (0, 1) even in the arcsine-shaped d = 2 case."""
    from varbnn.distributions.vmf_sampling import _wood_proposals

    torch.manual_seed(d)
    e, _ = _wood_proposals(d, 1.0, 4, 5_000, torch.float64, torch.device("cpu"))
    a = (d - 1) / 2
    assert stats.kstest(e.reshape(-1).numpy(), stats.beta(a, a).cdf).pvalue > 1e-3
    assert bool(((e > 0) & (e < 1)).all())


def test_wood_acceptance_rate_is_at_least_about_0_65_for_every_dimension_and_concentration():
    """The bound PROPOSALS_FIXED's fallback probability (0.37^32) rests on: the minimum over kappa in [1e-3, 1e6] of
    the acceptance rate, 20,000 proposals a point (standard error <= 0.0034), is at least 0.63 for every d."""
    from varbnn.distributions.vmf_sampling import _wood_proposals

    torch.manual_seed(0)
    for d in (2, 3, 10, 100, 1000):
        rates = [
            _wood_proposals(d, kappa, 1, 20_000, torch.float64, torch.device("cpu"))[1].double().mean().item()
            for kappa in torch.logspace(-3, 6, 28).tolist()
        ]
        assert min(rates) >= 0.63, (d, min(rates))
        assert min(rates) <= 0.75, (d, min(rates))  # the grid reaches the worst concentrations (kappa >> d)


def _explicit_householder(mu, omega, sin_theta, radius, noise):
    """Reference: build Q = -s (I - 2 u u^T / |u|^2) as a matrix for each row and apply it to [omega, sin v / |v|]."""
    out = torch.empty(noise.shape, dtype=mu.dtype)
    d = mu.shape[-1]
    for index in np.ndindex(*omega.shape):
        row = mu[index[-mu.dim() + 1 :]] if mu.dim() > 1 else mu
        unit = row / row.norm()
        s = 1.0 if unit[0] >= 0 else -1.0
        u = unit.clone()
        u[0] += s
        q = -s * (torch.eye(d, dtype=mu.dtype) - 2 * torch.outer(u, u) / (u @ u))
        v = noise[index][1:]
        local = torch.cat([omega[index].reshape(1), sin_theta[index] * v / v.norm()])
        out[index] = radius[index] * (q @ local)
    return out


@pytest.mark.parametrize("sample_shape", [(), (3,)], ids=["one-draw", "three-draws"])
def test_householder_sample_equals_the_explicit_reflection_and_passes_gradcheck(sample_shape):
    """The fused map (row statistics + one output pass, custom backwards) against the explicit orthogonal matrix,
    and its gradients in mu (normalised or not), omega, sin_theta and radius against finite differences."""
    g = torch.Generator().manual_seed(3)
    rows, d = 4, 6
    mu = torch.randn(rows, d, generator=g, dtype=torch.float64)
    mu[1, 0] = -abs(mu[1, 0])  # both signs of the first coordinate
    mu[2, 0] = abs(mu[2, 0])
    shape = sample_shape + (rows,)
    omega = torch.rand(shape, generator=g, dtype=torch.float64) * 1.8 - 0.9
    sin_theta = (1 - omega.square()).sqrt()
    radius = torch.rand(shape, generator=g, dtype=torch.float64) + 0.5
    noise = torch.randn(shape + (d,), generator=g, dtype=torch.float64)
    out = householder_sample(mu, omega, sin_theta, radius, normalize=True, noise=noise)
    torch.testing.assert_close(out, _explicit_householder(mu, omega, sin_theta, radius, noise), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.linalg.vector_norm(out, dim=-1), radius, rtol=1e-12, atol=1e-12)
    unit = mu / mu.norm(dim=-1, keepdim=True)
    torch.testing.assert_close((out * unit).sum(-1), radius * omega, rtol=1e-12, atol=1e-12)
    unnormalised = householder_sample(unit, omega, sin_theta, radius, noise=noise)
    torch.testing.assert_close(unnormalised, out, rtol=1e-12, atol=1e-12)

    for normalize, base in ((True, mu), (False, unit)):

        def fn(m, o, st, r, normalize=normalize):
            return householder_sample(m, o, st, r, normalize=normalize, noise=noise)

        inputs = tuple(t.clone().requires_grad_() for t in (base, omega, sin_theta, radius))
        assert torch.autograd.gradcheck(fn, inputs)
    # the plain operations a torch.func transform runs: the same values, and autograd's gradients pass gradcheck
    from varbnn.distributions.vmf_sampling import _householder_values

    plain = _householder_values(mu, noise, omega, sin_theta, radius, normalize=True)[0]
    torch.testing.assert_close(plain, out, rtol=1e-12, atol=1e-12)
    inputs = tuple(t.clone().requires_grad_() for t in (mu, omega, sin_theta, radius))
    assert torch.autograd.gradcheck(lambda m, o, st, r: _householder_values(m, noise, o, st, r, True)[0], inputs)
    # a zero row (as F.normalize leaves it: direction e_1 up to sign) still gives a point on the sphere
    zero = mu.clone()
    zero[0] = 0
    zero.requires_grad_()
    out = householder_sample(zero, omega, sin_theta, radius, normalize=True, noise=noise)
    torch.testing.assert_close(torch.linalg.vector_norm(out, dim=-1), radius, rtol=1e-12, atol=1e-12)
    out.sum().backward()
    assert torch.isfinite(zero.grad).all()


def test_householder_sample_draws_its_noise_where_the_other_weight_noise_comes_from():
    """Without ``noise``: torch's generator outside a block, Philox's next stream inside ``philox.counter_draws`` (the
    compiled CPU step's draws, so that no tangent noise of RDP's row grouping is an eager generator call there)."""
    from varbnn import philox

    g = torch.Generator().manual_seed(5)
    rows, d = 3, 7
    mu = torch.randn(rows, d, generator=g)
    omega = torch.rand(2, rows, generator=g) * 1.8 - 0.9
    sin_theta, radius = (1 - omega.square()).sqrt(), torch.rand(2, rows, generator=g) + 0.5
    torch.manual_seed(11)
    outside = householder_sample(mu, omega, sin_theta, radius, normalize=True)
    torch.manual_seed(11)
    expected = householder_sample(mu, omega, sin_theta, radius, normalize=True, noise=torch.randn(2, rows, d))
    assert torch.equal(outside, expected)
    key = torch.tensor(987654321, dtype=torch.int64)
    with philox.counter_draws(key):
        philox.randn((4,), dtype=torch.float32, device=torch.device("cpu"))  # stream 0: an earlier draw of the step
        inside = householder_sample(mu, omega, sin_theta, radius, normalize=True)
    noise = philox.standard_normal((2, rows, d), key, 1)
    assert torch.equal(inside, householder_sample(mu, omega, sin_theta, radius, normalize=True, noise=noise))
    assert not torch.equal(inside, outside)


def _wood_transform_autograd(dim: int, kappa: torch.Tensor, eps: torch.Tensor, a_d: torch.Tensor):
    """The Wood transform and its score written as plain tensor operations (autograd differentiates them): the oracle
    for the closed-form backward of ``wood_sample``."""
    m1 = dim - 1.0
    b = m1 / (2 * kappa + torch.sqrt(4 * kappa * kappa + m1 * m1))
    denom = 1 - (1 - b) * eps
    one_minus = 2 * b * eps / denom
    one_minus_sq = one_minus * (2 * (1 - eps) / denom)
    omega = 1 - one_minus
    log_q = -(kappa - kappa.detach()) * a_d + kappa * omega + 0.5 * (dim - 3) * torch.log(one_minus_sq)
    log_pi = log_q + torch.log(2 * b) - 2 * torch.log(denom)
    return omega, torch.sqrt(one_minus_sq), log_pi - log_pi.detach()


@pytest.mark.parametrize("dim", [3, 10, 785])
def test_wood_sample_closed_form_backward_matches_autograd_of_the_formula(dim, monkeypatch):
    from varbnn.distributions import vmf_sampling as vmf

    kappa0 = torch.tensor([0.05, 1.0, 30.0, 2e3, 1e5], dtype=torch.float64)
    eps = torch.tensor([0.3, 0.55, 0.01, 0.9, 0.5], dtype=torch.float64)
    monkeypatch.setattr(vmf, "wood_accepted_proposals", lambda d, k, rounds: eps.clone())
    a_d = torch.tensor(0.7, dtype=torch.float64)
    weights = torch.tensor([[0.3, -1.2, 0.7], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 2.0]], dtype=torch.float64)
    for w in weights:
        grads = []
        fused = lambda k: vmf.wood_sample(dim, k, score=True, resultant=a_d)  # noqa: E731
        plain = lambda k: vmf._wood_plain_with_score(k, eps, a_d, dim)  # noqa: E731  (the torch.func path)
        for fn in (fused, lambda k: _wood_transform_autograd(dim, k, eps, a_d), plain):
            kappa = kappa0.clone().requires_grad_(True)
            omega, sin_theta, score = fn(kappa)
            (w[0] * omega + w[1] * sin_theta + w[2] * score).sum().backward()
            grads.append((omega.detach(), sin_theta.detach(), score.detach(), kappa.grad))
        for other in grads[1:]:
            for got, want in zip(grads[0], other):
                torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-300)
    # without the score: two outputs, no Bessel ratio needed
    kappa = kappa0.clone().requires_grad_(True)
    omega, sin_theta, none = vmf.wood_sample(dim, kappa)
    assert none is None
    assert torch.autograd.gradcheck(lambda k: vmf.wood_sample(dim, k)[:2], (kappa,))


@pytest.mark.parametrize("dim", [2, 3, 50])
def test_wood_sample_under_torch_func_is_finite_at_proposals_of_exactly_0_and_1(dim, monkeypatch):
    """A Beta proposal can round to exactly 0 or 1 (most likely for d = 2, Beta(1/2, 1/2)). The closed-form Function
    has finite values and gradients there; the plain operations a torch.func transform takes had NaN (sqrt's and log's
    derivatives at 0, and a score of -inf - -inf): they now equal the Function's."""
    from torch.func import grad

    from varbnn.distributions import vmf_sampling as vmf

    eps = torch.tensor([0.0, 1.0, 0.3], dtype=torch.float64)
    monkeypatch.setattr(vmf, "wood_accepted_proposals", lambda d, k, rounds: eps.clone())
    a_d = torch.tensor(0.6, dtype=torch.float64)

    def loss(kappa):
        omega, sin_theta, score = vmf.wood_sample(dim, kappa, score=True, resultant=a_d)
        return (0.3 * omega - 1.2 * sin_theta + 0.7 * score).sum()

    kappa = torch.tensor([4.0, 4.0, 4.0], dtype=torch.float64)
    under_func = grad(loss)(kappa)
    eager = kappa.clone().requires_grad_(True)
    loss(eager).backward()
    assert torch.isfinite(under_func).all()
    # the clamp moves 0 and 1 by 2e-16, hence sin_theta ~ sqrt(eps (1 - eps)) by 1e-8: the gradients agree to that size
    torch.testing.assert_close(under_func, eager.grad, rtol=1e-7, atol=1e-7)
    assert grad(lambda k: vmf.wood_sample(dim, k)[1].sum())(kappa).isfinite().all()  # without the score


def test_draws_under_vmap_equal_the_draws_one_by_one():
    """Under torch.func.vmap (``varbnn.predict``'s batched draws) the Householder map takes plain operations, since
    its autograd Function is not transform-ready: with the same noise, the batched draws equal the draws one by one;
    Wood's sampler takes its fixed rounds there (no data-dependent loop) and gives the right number of draws."""
    from torch.func import vmap

    from varbnn.distributions.vmf import wood_sample

    g = torch.Generator().manual_seed(5)
    mu = torch.randn(4, 6, generator=g, dtype=torch.float64)
    omega = torch.rand(4, generator=g, dtype=torch.float64) * 1.8 - 0.9
    sin_theta = (1 - omega.square()).sqrt()
    radius = torch.rand(4, generator=g, dtype=torch.float64) + 0.5
    noise = torch.randn(3, 4, 6, generator=g, dtype=torch.float64)
    batched = vmap(lambda n: householder_sample(mu, omega, sin_theta, radius, normalize=True, noise=n))(noise)
    one_by_one = torch.stack([householder_sample(mu, omega, sin_theta, radius, normalize=True, noise=n) for n in noise])
    torch.testing.assert_close(batched, one_by_one, rtol=1e-12, atol=1e-12)
    kappa = torch.tensor([0.5, 5.0, 50.0, 500.0], dtype=torch.float64)
    with torch.no_grad():
        omega_b, sin_b = vmap(lambda _: wood_sample(6, kappa)[:2], randomness="different")(torch.arange(5))
    assert omega_b.shape == (5, 4) and not torch.equal(omega_b[0], omega_b[1])
    torch.testing.assert_close(omega_b.square() + sin_b.square(), torch.ones_like(omega_b), rtol=1e-12, atol=1e-12)


def test_wood_sampler_reads_the_host_only_on_the_cpu(monkeypatch):
    """Off the CPU a host read waits for the device (one per layer and step before): there, inside torch.compile and
    under torch.func transforms, Wood's sampler takes the fixed proposals (their distribution is tested above)."""
    from torch.func import vmap

    from varbnn.distributions import vmf_sampling as vmf
    from varbnn.distributions.vmf_sampling import _without_host_sync

    q = VonMisesFisher(_unit(20), torch.tensor(10.0, dtype=torch.float64))
    with _CountSyncs() as counter:
        q.rsample((50,))
    assert counter.syncs  # the CPU's rounds read the acceptance
    monkeypatch.setattr(vmf, "_without_host_sync", lambda device: True)  # what a GPU device gets
    with _CountSyncs() as counter:
        assert q.rsample((50,)).shape == (50, 20)
    assert counter.syncs == []
    monkeypatch.undo()

    assert not _without_host_sync(torch.device("cpu"))
    for device in ("cuda", "cuda:1", "mps", "xpu"):
        assert _without_host_sync(torch.device(device))
    seen = []
    vmap(lambda t: seen.append(_without_host_sync(torch.device("cpu"))) or t)(torch.zeros(2))
    assert seen == [True]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_compiled_cpu_rejection_op_passes_torch_library_opcheck(dtype):
    """``varbnn::wood_accepted_proposals`` (the eager rounds inside a compiled CPU graph): its schema, autograd
    registration and fake implementation agree with the real op for every layout of ``kappa`` (a fake that kept a
    transposed kappa's strides broke inductor's compiled graphs), an expanded layer concentration, the circle and
    the sphere, and an empty batch."""
    torch.manual_seed(0)
    kappa = torch.rand(4, 3, dtype=dtype) * 10 + 0.1
    cases = [(kappa, 5), (kappa.t(), 5), (torch.full((), 2.0, dtype=dtype).expand(6, 3), 3),
             (kappa[:, :1].expand(4, 7), 2), (torch.empty(0, 3, dtype=dtype), 50)]  # fmt: skip
    for dim, n in ((3, 7), (50, 400), (5, 0)):
        shared = torch.tensor(4.0, dtype=dtype)
        torch.library.opcheck(torch.ops.varbnn.wood_pool.default, (shared, dim, n, 1000))
        out = torch.ops.varbnn.wood_pool(shared, dim, n, 1000)
        assert out.shape == (n,) and out.dtype == dtype and bool(((out > 0) & (out < 1)).all())
    for k, dim in cases:
        torch.library.opcheck(torch.ops.varbnn.wood_accepted_proposals.default, (k, dim, 1000))
        out = torch.ops.varbnn.wood_accepted_proposals(k, dim, 1000)
        assert out.shape == k.shape and out.dtype == dtype and out.is_contiguous()
        assert bool(((out > 0) & (out < 1)).all())  # Beta draws


def test_first_accepted_is_argmax_down_the_columns():
    from varbnn.distributions.vmf_sampling import _first_accepted

    g = torch.Generator().manual_seed(0)
    for k, n, p in ((8, 400, 0.7), (4, 3, 0.1), (1, 5, 0.5), (8, 0, 0.5)):
        accept = torch.rand(k, n, generator=g) < p
        assert torch.equal(_first_accepted(accept), accept.to(torch.uint8).argmax(0))
    accept = torch.zeros(8, 3, dtype=torch.bool)
    accept[5, 0] = accept[2, 0] = accept[7, 2] = True  # the first of two, none, the last
    assert _first_accepted(accept).tolist() == [2, 0, 7]
