"""varbnn.special against mpmath (arbitrary precision) on a log-uniform grid nu in [0.5, 1e4], z in [1e-4, 1e5].

The oracle table tests/data/bessel_oracle.json is produced by scripts/make_bessel_oracle.py (mpmath, 40 digits).
Errors of log I are measured as |error| / max(1, |log I|): the relative error of I itself where log I is small,
the relative error of log I where it is large.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import mpmath
import numpy as np
import pytest
import torch
from scipy import special as sps

from varbnn import special
from varbnn.special import bessel_ratio, bessel_ratio_bounds, log_bessel_iv, log_bessel_iv_over_power

ORACLE = Path(__file__).parent / "data" / "bessel_oracle.json"


@pytest.fixture(scope="module")
def oracle() -> dict[str, np.ndarray]:
    rows = json.loads(ORACLE.read_text())["rows"]
    with mpmath.workdps(40):
        ratio = [float(mpmath.exp(mpmath.mpf(r["log_iv"]) - mpmath.mpf(r["log_iv_minus_1"]))) for r in rows]
    return {
        "nu": np.array([r["nu"] for r in rows]),
        "z": np.array([r["z"] for r in rows]),
        "log_iv": np.array([float(mpmath.mpf(r["log_iv"])) for r in rows]),
        "ratio": np.array(ratio),
    }


def _log_err(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return np.abs(got - want) / np.maximum(1.0, np.abs(want))


def _t(x: np.ndarray, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.tensor(x, dtype=dtype)


def test_oracle_grid_covers_the_issue_range(oracle):
    nu, z = oracle["nu"], oracle["z"]
    assert nu.min() <= 0.5 and nu.max() >= 1e4 and z.min() <= 1e-4 and z.max() >= 1e5
    assert len(nu) > 1200


def test_accurate_ratio_matches_mpmath(oracle):
    got = bessel_ratio(_t(oracle["nu"]), _t(oracle["z"])).numpy()
    err = np.abs(got / oracle["ratio"] - 1)
    assert np.isfinite(got).all()
    assert err.max() < 1e-12, (err.max(), oracle["nu"][err.argmax()], oracle["z"][err.argmax()])


def test_accurate_log_iv_matches_mpmath(oracle):
    got = log_bessel_iv(_t(oracle["nu"]), _t(oracle["z"])).numpy()
    assert np.isfinite(got).all()
    err = _log_err(got, oracle["log_iv"])
    assert err.max() < 1e-12, (err.max(), oracle["nu"][err.argmax()], oracle["z"][err.argmax()])


def test_log_iv_over_power_matches_mpmath(oracle):
    nu, z = oracle["nu"], oracle["z"]
    got = log_bessel_iv_over_power(_t(nu), _t(z)).numpy() + nu * np.log(z)
    assert _log_err(got, oracle["log_iv"]).max() < 1e-12


def test_over_power_is_exact_at_small_z_where_the_naive_difference_cancels():
    # log(I_nu(z) / z^nu) -> -nu log 2 - lgamma(nu + 1) as z -> 0; the naive difference loses ~nu*|log z|*eps.
    nu = torch.tensor([4999.0, 49.0, 0.0], dtype=torch.float64)
    z = torch.tensor([1e-8, 1e-8, 1e-8], dtype=torch.float64)
    want = -nu * math.log(2) - torch.lgamma(nu + 1)
    torch.testing.assert_close(log_bessel_iv_over_power(nu, z), want, rtol=1e-15, atol=1e-12)
    with mpmath.workdps(50):
        for n in (4999.0, 49.0):
            exact = float(mpmath.log(mpmath.besseli(n, mpmath.mpf("1e-3")) / mpmath.mpf("1e-3") ** n))
            got = log_bessel_iv_over_power(n, torch.tensor(1e-3, dtype=torch.float64)).item()
            assert abs(got - exact) < 1e-12 * abs(exact)


def test_masked_evaluation_path_used_on_gpus_matches(oracle, monkeypatch):
    nu, z = _t(oracle["nu"]), _t(oracle["z"])
    subsets = [fn(nu, z) for fn in (bessel_ratio, log_bessel_iv, log_bessel_iv_over_power)]
    monkeypatch.setattr(special, "_use_masked", lambda device: True)
    masked = [fn(nu, z) for fn in (bessel_ratio, log_bessel_iv, log_bessel_iv_over_power)]
    for a, b in zip(subsets, masked):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    zz = torch.tensor([0.0, 1.0, 30.0], dtype=torch.float64, requires_grad=True)
    log_bessel_iv(torch.tensor([0.0, 2.0, 40.0]), zz).sum().backward()
    assert torch.isfinite(zz.grad[1:]).all()


def test_regions_where_scipy_fails_are_accurate_here(oracle):
    nu, z = oracle["nu"], oracle["z"]
    with np.errstate(all="ignore"):
        scipy_ratio = sps.ive(nu, z) / sps.ive(nu - 1, z)
    scipy_bad = ~np.isfinite(scipy_ratio) | (np.abs(scipy_ratio / oracle["ratio"] - 1) > 1e-6)
    assert scipy_bad.mean() > 0.2  # the motivation: large orders underflow in scipy
    got = bessel_ratio(_t(nu[scipy_bad]), _t(z[scipy_bad])).numpy()
    assert np.abs(got / oracle["ratio"][scipy_bad] - 1).max() < 1e-12


def test_theorem_bounds_bracket_the_exact_ratio(oracle):
    nu, z, exact = oracle["nu"], oracle["z"], oracle["ratio"]
    for theorem in (4, 5):
        # (theorem 4 holds for nu >= 0, but at nu = 0, z = 1e-6 its upper bound z / (-1 + sqrt(1 + z^2)) cancels)
        mask = nu >= (0.1 if theorem == 4 else 0.5)
        lower, upper = bessel_ratio_bounds(_t(nu[mask]), _t(z[mask]), theorem=theorem)
        slack = 1e-14 * exact[mask]
        assert (lower.numpy() <= exact[mask] + slack).all()
        assert (upper.numpy() >= exact[mask] - slack).all()


def test_paper_bound_averages_are_the_baseline(oracle):
    """The accurate method is at least as good as the paper's averages everywhere and much better at worst."""
    keep = oracle["nu"] >= 0.5
    nu, z, exact = oracle["nu"][keep], oracle["z"][keep], oracle["ratio"][keep]
    acc = np.abs(bessel_ratio(_t(nu), _t(z)).numpy() / exact - 1)
    for method in ("bounds", "bounds-amos"):
        approx = np.abs(bessel_ratio(_t(nu), _t(z), method=method).numpy() / exact - 1)
        assert (acc <= approx + 2e-15).all()
        assert approx.max() > 1e-3  # the averaged bounds are not accurate near nu = 1/2 and z ~ nu
    # Theorem 5's average is tight at large orders (Oh et al. use it for nu = d/2 of a weight row)
    big = nu >= 50
    approx = np.abs(bessel_ratio(_t(nu[big]), _t(z[big]), method="bounds").numpy() / exact[big] - 1)
    assert approx.max() < 1e-4


def test_paper_log_iv_methods(oracle):
    nu, z, want = oracle["nu"], oracle["z"], oracle["log_iv"]
    series = log_bessel_iv(_t(nu), _t(z), method="ratio-series").numpy()
    assert np.isfinite(series).all() and _log_err(series, want).max() < 0.1
    approx = log_bessel_iv(_t(nu), _t(z), method="approx").numpy()
    assert np.isfinite(approx).all()
    # eq. 44's second branch is Hankel's leading term, accurate for z >> nu^2
    far = z > 100 * np.maximum(nu, 1) ** 2
    assert far.any() and _log_err(approx[far], want[far]).max() < 1e-2


@pytest.mark.parametrize("fn", [bessel_ratio, log_bessel_iv])
def test_float32_matches_float64_at_the_rounded_inputs(fn, oracle):
    nu, z32 = _t(oracle["nu"]), _t(oracle["z"], torch.float32)
    got = fn(nu, z32)
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    want = fn(nu, z32.double())
    err = ((got.double() - want).abs() / want.abs().clamp_min(1.0)).max()
    assert err < 2e-7


def test_gradients_against_finite_differences():
    nu = torch.tensor([0.0, 0.5, 1.0, 3.0, 20.0, 30.0, 500.0, 5000.0, 1e4, 2.5], dtype=torch.float64)
    z = torch.tensor([0.3, 2.0, 25.9, 26.1, 40.0, 10.0, 300.0, 1e4, 1e3, 1e5], dtype=torch.float64, requires_grad=True)
    for fn in (lambda x: bessel_ratio(nu, x), lambda x: log_bessel_iv(nu, x), lambda x: log_bessel_iv_over_power(nu, x)):
        assert torch.autograd.gradcheck(fn, (z,))
        assert torch.autograd.gradgradcheck(fn, (z,))
    fn = lambda x: bessel_ratio(nu[1:], x, method="bounds")  # noqa: E731
    assert torch.autograd.gradcheck(fn, (z[1:].detach().requires_grad_(),))


def test_log_iv_derivative_matches_mpmath():
    with mpmath.workdps(30):
        for n, x in [(0.0, 0.5), (2.5, 30.0), (100.0, 50.0), (1000.0, 3000.0)]:
            z = torch.tensor(x, dtype=torch.float64, requires_grad=True)
            log_bessel_iv(n, z).backward()
            want = float(mpmath.diff(lambda t, n=n: mpmath.log(mpmath.besseli(n, t)), x))
            assert z.grad.item() == pytest.approx(want, rel=1e-10)


def test_edge_values():
    z0 = torch.zeros(3, dtype=torch.float64)
    assert log_bessel_iv(torch.tensor([0.0, 1.0, 7.0]), z0).tolist() == [0.0, -math.inf, -math.inf]
    assert bessel_ratio(torch.tensor([1.0, 30.0, 3.0]), z0).tolist() == [0.0, 0.0, 0.0]
    # I_{1/2}(z) / I_{-1/2}(z) = tanh(z) and I_{3/2}/I_{1/2} = coth(z) - 1/z
    z = torch.tensor([1e-6, 0.1, 1.0, 10.0, 100.0, 1e4], dtype=torch.float64)
    torch.testing.assert_close(bessel_ratio(0.5, z), torch.tanh(z), rtol=1e-14, atol=0)
    torch.testing.assert_close(bessel_ratio(1.5, z[2:]), 1 / torch.tanh(z[2:]) - 1 / z[2:], rtol=1e-13, atol=0)
    # I_0 by scipy where scipy is fine
    x = np.array([1e-6, 0.5, 5.0, 25.0, 27.0, 700.0])
    torch.testing.assert_close(log_bessel_iv(0.0, _t(x)), _t(np.log(sps.ive(0, x)) + x), rtol=1e-14, atol=1e-14)


def test_broadcasting_and_dtype():
    nu = torch.tensor([[1.0], [10.0]])
    z = torch.tensor([0.5, 5.0, 50.0], dtype=torch.float32)
    out = bessel_ratio(nu, z)
    assert out.shape == (2, 3) and out.dtype == torch.float32
    assert log_bessel_iv(3.0, 2.0).dtype == torch.get_default_dtype()


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: bessel_ratio(-1.0, 1.0), "order nu must be >= 0"),
        (lambda: log_bessel_iv(1.0, -1.0), "argument z must be >= 0"),
        (lambda: log_bessel_iv(1.0, float("nan")), "not NaN"),
        (lambda: bessel_ratio(1.0, 1.0, method="cf"), "unknown method 'cf'"),
        (lambda: log_bessel_iv(1.0, 1.0, method="scipy"), "choose one of"),
        (lambda: bessel_ratio(0.25, 1.0, method="bounds"), "nu >= 1/2"),
        (lambda: bessel_ratio_bounds(1.0, 1.0, theorem=3), "theorem must be 4 or 5"),
    ],
)
def test_bad_input_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():  # pragma: no cover - CPU-only CI
    nu = torch.logspace(-0.3, 4, 50, dtype=torch.float64)
    z = torch.logspace(-4, 5, 50, dtype=torch.float64)
    for fn in (bessel_ratio, log_bessel_iv):
        torch.testing.assert_close(fn(nu.cuda(), z.cuda()).cpu(), fn(nu, z), rtol=1e-13, atol=1e-13)


def test_fused_log_iv_over_power_and_ratio_match_mpmath_and_the_separate_functions(oracle):
    """At order nu - 1 the fused call returns log(I_{nu-1} / z^{nu-1}) and I_nu / I_{nu-1}: both against the oracle."""
    keep = oracle["nu"] >= 1
    nu, z = oracle["nu"][keep] - 1, oracle["z"][keep]
    rows = json.loads(ORACLE.read_text())["rows"]
    log_iv_minus_1 = np.array([float(mpmath.mpf(r["log_iv_minus_1"])) for r in rows])[keep]
    log_iv, ratio = special.log_bessel_iv_over_power_and_ratio(_t(nu), _t(z))
    assert _log_err(log_iv.numpy() + nu * np.log(z), log_iv_minus_1).max() < 1e-12
    assert np.abs(ratio.numpy() / oracle["ratio"][keep] - 1).max() < 1e-12


def test_fused_gradients_need_no_bessel_evaluation_and_are_exact():
    nu = torch.tensor([0.0, 0.5, 3.0, 20.0, 499.0, 4999.0, 2.5], dtype=torch.float64)
    z = torch.tensor([0.3, 25.9, 26.1, 40.0, 300.0, 1e4, 1e5], dtype=torch.float64, requires_grad=True)
    for part in (0, 1):
        fn = lambda x, part=part: special.log_bessel_iv_over_power_and_ratio(nu, x)[part]  # noqa: E731
        assert torch.autograd.gradcheck(fn, (z,))
        assert torch.autograd.gradgradcheck(fn, (z,))
    log_iv, ratio = special.log_bessel_iv_over_power_and_ratio(nu, z)
    torch.testing.assert_close(log_iv, log_bessel_iv_over_power(nu, z), rtol=0, atol=0)
    torch.testing.assert_close(ratio, bessel_ratio(nu + 1, z), rtol=0, atol=0)


def test_cpu_scalar_path_matches_mpmath_and_the_tensor_path(oracle):
    """Inputs of <= 8 elements on the CPU take the Python-float path: every oracle point one at a time, against mpmath
    and against the tensor path (the same formulas, so equal up to rounding)."""
    nu, z = oracle["nu"], oracle["z"]
    tensor_path = [fn(_t(nu), _t(z)).numpy() for fn in (bessel_ratio, log_bessel_iv, log_bessel_iv_over_power)]
    assert len(nu) > special._SCALAR_MAX  # the grid itself takes the tensor path
    scalar = np.array(
        [
            [fn(_t(nu[i : i + 1]), _t(z[i : i + 1])).item() for fn in (bessel_ratio, log_bessel_iv, log_bessel_iv_over_power)]
            for i in range(len(nu))
        ]
    )
    assert np.abs(scalar[:, 0] / oracle["ratio"] - 1).max() < 1e-12
    assert _log_err(scalar[:, 1], oracle["log_iv"]).max() < 1e-12
    assert _log_err(scalar[:, 2] + nu * np.log(z), oracle["log_iv"]).max() < 1e-12
    for column, want in enumerate(tensor_path):
        np.testing.assert_allclose(scalar[:, column], want, rtol=1e-13, atol=1e-13)
    # fused call on a few values (a vMF's concentration), values and closed-form gradient
    nu_f = torch.tensor([0.0, 391.0, 199.0, 4.0], dtype=torch.float64)
    z_f = torch.tensor([0.0, 25.0, 3e3, 60.0], dtype=torch.float64)
    log_iv, ratio = special.log_bessel_iv_over_power_and_ratio(nu_f, z_f)
    big = special.log_bessel_iv_over_power_and_ratio(nu_f.repeat(3), z_f.repeat(3))  # 12 elements: tensor path
    torch.testing.assert_close(log_iv, big[0][:4], rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(ratio, big[1][:4], rtol=1e-13, atol=1e-13)
    assert log_bessel_iv(torch.tensor([0.0, 1.0]), torch.zeros(2, dtype=torch.float64)).tolist() == [0.0, -math.inf]
    assert bessel_ratio(torch.tensor([0.0, 3.0]), torch.zeros(2, dtype=torch.float64)).tolist() == [math.inf, 0.0]


# --- the end points, tiny arguments and argument types (issue 25) ----------------------------------------------------


def _paths(values: list[float], dtype: torch.dtype) -> list[torch.Tensor]:
    """The values as a small CPU tensor (Python-float path) and repeated past _SCALAR_MAX (tensor path)."""
    small = torch.tensor(values, dtype=dtype)
    return [small, small.repeat(special._SCALAR_MAX // len(values) + 1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("masked", [False, True])
def test_infinite_argument_gives_the_limits_with_finite_gradients(dtype, masked, monkeypatch):
    # R_nu(z) -> 1 and log I_nu(z) ~ z - log(2 pi z)/2 -> inf as z -> inf, for every finite order; dR/dz -> 0 and
    # d log I_nu / dz = R_{nu+1} + nu / z -> 1.
    monkeypatch.setattr(special, "_use_masked", lambda device: masked)
    nus = [0.0, 0.5, 2.0, 1e4]
    for z in _paths([math.inf] * 4, dtype):
        nu = torch.tensor(nus, dtype=torch.float64).repeat(z.numel() // 4)
        z = z.clone().requires_grad_()
        ratio = bessel_ratio(nu, z)
        assert ratio.dtype == dtype and (ratio == 1).all()
        assert (torch.autograd.grad(ratio.sum(), z)[0] == 0).all()
        log_iv = log_bessel_iv(nu, z)
        assert torch.isposinf(log_iv).all()
        assert (torch.autograd.grad(log_iv.sum(), z)[0] == 1).all()
        over_power = log_bessel_iv_over_power(nu, z)
        assert torch.isposinf(over_power).all()
        assert (torch.autograd.grad(over_power.sum(), z)[0] == 1).all()
        fused_log, fused_ratio = special.log_bessel_iv_over_power_and_ratio(nu, z)
        assert torch.isposinf(fused_log).all() and (fused_ratio == 1).all()
        assert (torch.autograd.grad(fused_ratio.sum(), z)[0] == 0).all()
        for method in ("bounds", "bounds-amos"):
            approx = bessel_ratio(nu + 0.5, z, method=method)
            assert (approx == 1).all() and (torch.autograd.grad(approx.sum(), z)[0] == 0).all()
        for method in ("approx", "ratio-series"):  # (ratio-series is O(nu) work: small orders)
            assert torch.isposinf(log_bessel_iv(nu.clamp_max(10), z.detach(), method=method)).all()
        for theorem in (4, 5):
            assert all((b == 1).all() for b in bessel_ratio_bounds(nu + 0.5, z.detach(), theorem=theorem))


def test_huge_finite_arguments_do_not_overflow_to_nan():
    # sqrt(nu^2 + z^2) overflowed to inf for z > 1e154 and gave inf / inf; hypot does not
    z = torch.tensor([1e200, 1e300], dtype=torch.float64)
    assert (bessel_ratio(3.0, z) == 1).all()
    torch.testing.assert_close(log_bessel_iv(3.0, z), z, rtol=1e-13, atol=0)  # log I ~ z - log(2 pi z)/2


@pytest.mark.parametrize("fn", [bessel_ratio, log_bessel_iv, log_bessel_iv_over_power, bessel_ratio_bounds])
@pytest.mark.parametrize("bad_nu", [math.inf, -math.inf, math.nan, -0.5])
def test_order_must_be_finite_and_non_negative(fn, bad_nu):
    with pytest.raises(ValueError, match=r"order nu must be >= 0 and finite, i\.e\. in \[0, inf\)"):
        fn(bad_nu, 1.0)
    with pytest.raises(ValueError, match=r"order nu must be >= 0 and finite"):
        fn(torch.tensor([1.0, bad_nu]), torch.tensor([2.0, 3.0]))


def test_finite_values_at_zero_have_finite_derivatives():
    # R_nu(z) ~ z / (2 nu): dR/dz = 1/(2 nu) at 0; log I_0 is even: derivative 0 at 0
    nu = torch.tensor([0.5, 1.0, 2.0, 50.0], dtype=torch.float64)
    for z in _paths([0.0] * 4, torch.float64):
        z = z.clone().requires_grad_()
        n = nu.repeat(z.numel() // 4)
        (grad,) = torch.autograd.grad(bessel_ratio(n, z).sum(), z)
        torch.testing.assert_close(grad, 0.5 / n)
        _, ratio = special.log_bessel_iv_over_power_and_ratio(n, z)
        (grad,) = torch.autograd.grad(ratio.sum(), z)
        torch.testing.assert_close(grad, 0.5 / (n + 1))
        (grad,) = torch.autograd.grad(log_bessel_iv(torch.zeros_like(n), z).sum(), z)
        assert (grad == 0).all()
    # the paper's baselines at z = 0: finite values with finite derivatives, the exact limits of log I_nu
    z = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    nu = torch.tensor([0.5, 1.0, 7.0], dtype=torch.float64)
    for out in (bessel_ratio(nu, z, method="bounds"), bessel_ratio(nu, z, method="bounds-amos")):
        assert torch.isfinite(out).all() and torch.isfinite(torch.autograd.grad(out.sum(), z)[0]).all()
    for method in ("approx", "ratio-series"):
        out = log_bessel_iv(torch.zeros(3), z, method=method)
        assert (out == 0).all() and torch.isfinite(torch.autograd.grad(out.sum(), z)[0]).all()
        assert torch.isneginf(log_bessel_iv(nu, z.detach(), method=method)).all()


TINY_Z = np.logspace(-12, -4, 9)
TINY_Z_ORDERS = [0.0, 0.5, 1.0, 2.5, 10.0, 49.5, 1000.0]


@pytest.fixture(scope="module")
def tiny_z_oracle() -> dict[torch.dtype, dict[str, np.ndarray]]:
    """mpmath (40 digits) at the tiny z as float64 and as rounded to float32, for every order."""
    out = {}
    with mpmath.workdps(40):
        for dtype in (torch.float64, torch.float32):
            zs = torch.tensor(TINY_Z, dtype=dtype).double().numpy()
            rows = {"nu": [], "z": [], "log_iv": [], "over_power": [], "ratio": []}
            for n in TINY_Z_ORDERS:
                for x in zs:
                    xm, nm = mpmath.mpf(float(x)), mpmath.mpf(n)
                    log_iv = mpmath.log(mpmath.besseli(nm, xm))
                    rows["nu"].append(n)
                    rows["z"].append(float(x))
                    rows["log_iv"].append(float(log_iv))
                    rows["over_power"].append(float(log_iv - nm * mpmath.log(xm)))
                    rows["ratio"].append(float(mpmath.besseli(nm, xm) / mpmath.besseli(nm - 1, xm)))
            out[dtype] = {k: np.array(v) for k, v in rows.items()}
    return out


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-14), (torch.float32, 2**-23)])
def test_tiny_arguments_match_mpmath(tiny_z_oracle, dtype, tolerance):
    """z in [1e-12, 1e-4]: relative error of log I_nu itself (log I_0(5.8e-8) = 8.41e-16 was 8.88e-16 before log1p), of
    log(I_nu / z^nu) and of the ratio, on both the Python-float and the tensor path; float32 to its rounding."""
    want = tiny_z_oracle[dtype]
    nu, z = _t(want["nu"]), _t(want["z"], dtype)
    checks = [(log_bessel_iv, "log_iv"), (log_bessel_iv_over_power, "over_power"), (bessel_ratio, "ratio")]
    for fn, key in checks:
        batched = fn(nu, z)
        one_by_one = torch.cat([fn(nu[i : i + 1], z[i : i + 1]) for i in range(len(nu))])
        for got in (batched, one_by_one):
            assert got.dtype == dtype
            err = np.abs(got.double().numpy() / want[key] - 1)
            assert err.max() < tolerance, (key, err.max(), want["nu"][err.argmax()], want["z"][err.argmax()])
    got = log_bessel_iv(0.0, torch.tensor(5.8e-8, dtype=torch.float64)).item()
    assert got == pytest.approx(5.8e-8**2 / 4, rel=1e-14)


def test_numbers_of_any_numeric_type_are_accepted():
    want = bessel_ratio(2.0, 3.0)
    for nu, z in [(np.int64(2), np.int64(3)), (np.float32(2), np.float64(3)), (torch.tensor(2), torch.tensor(3.0)),
                  (2, 3), (np.array(2.0), np.array(3))]:  # fmt: skip
        torch.testing.assert_close(bessel_ratio(nu, z), want)
        torch.testing.assert_close(log_bessel_iv(nu, z), log_bessel_iv(2.0, 3.0))
    assert bessel_ratio_bounds(2.0, 3.0, theorem=np.int64(4))[0] == bessel_ratio_bounds(2.0, 3.0, theorem=4)[0]
    # a Python float order is used in float64, not rounded through float32 first
    assert log_bessel_iv(1e-3, torch.tensor(1e-12, dtype=torch.float64)).item() == pytest.approx(
        1e-3 * math.log(0.5e-12) - math.lgamma(1.001), rel=1e-13
    )


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: bessel_ratio(True, 1.0), "nu must be a real number.*bool"),
        (lambda: log_bessel_iv(1.0, torch.tensor(True)), "z must be a real number.*torch.bool"),
        (lambda: log_bessel_iv("1", 1.0), "nu must be a real number.*str"),
        (lambda: log_bessel_iv(1.0, 1 + 2j), "z must be a real number"),
        (lambda: bessel_ratio_bounds(1.0, 1.0, theorem=4.0), "theorem must be an int"),
        (lambda: bessel_ratio_bounds(1.0, 1.0, theorem=True), "theorem must be an int.*bool"),
    ],
)
def test_non_numbers_are_refused_by_name(call, message):
    with pytest.raises(ValueError, match=message):
        call()
