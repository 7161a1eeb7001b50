"""fit(compile=...): the compiled step against the eager one, per family (small models: compilation is slow on the CPU)."""

import logging
import math
import re

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import varbnn
from varbnn import Delta, KTied, MeanField, Radial, RadialDirectional, RadialDirectionalPrior, philox
from varbnn.training import fit
from varbnn.training.compiled import _compiled_elbo_step
from varbnn.training.loop import _accumulated_elbo_gradient

FAMILIES = {
    "meanfield": lambda: (MeanField(), {}),
    "meanfield-local": lambda: (MeanField(estimator="local"), {}),
    "ktied": lambda: (KTied(), {}),
    "delta": lambda: (Delta(), {}),
    "radial": lambda: (Radial(), {}),
    "radial-flipout": lambda: (Radial(estimator="flipout"), {}),
    "radial-closed-form": lambda: (Radial(cross_entropy="closed_form"), {}),
    "rdp-row": lambda: (RadialDirectional(grouping="row"), {"prior": RadialDirectionalPrior()}),
    "rdp-double": lambda: (RadialDirectional(grouping="double"), {"prior": RadialDirectionalPrior()}),
    "rdp-per-group": lambda: (RadialDirectional(grouping="row", shared_concentration=False), {"prior": RadialDirectionalPrior()}),
}
MC_KL = ("radial", "radial-flipout")
"""Families whose KL is a Monte Carlo estimate: it draws even when the weights are at their means."""
INDUCTOR_BY_DEFAULT = ("meanfield",)
"""The family compiled with inductor in the default run (a cold compile is ~25 s on 2 cores); every family is
traced with aot_eager there (the same graph capture, graph-break count and compiled backward, without code generation,
~5x cheaper), and compiled with inductor under --runslow."""
AOT_EAGER_SLOW = ("rdp-double",)
"""Traced but not compared in the default run (~25 s: its Bessel and sampler graph is the largest; the default run
traces it in test_a_compiled_step_compiles_once_from_its_first_call); compared with aot_eager and inductor under
--runslow."""
CASES = [
    pytest.param(name, "aot_eager", id=f"{name}-aot_eager", marks=pytest.mark.slow if name in AOT_EAGER_SLOW else ())
    for name in FAMILIES
] + [
    pytest.param(name, "inductor", id=name, marks=() if name in INDUCTOR_BY_DEFAULT else pytest.mark.slow)
    for name in FAMILIES
]
N_DATA = 100


def _model(name):
    torch.manual_seed(0)
    family, kwargs = FAMILIES[name]()
    model = varbnn.bayesianize(nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)), family, **kwargs)
    if name == "rdp-per-group":  # the groups' concentrations apart, as after training
        with torch.no_grad():
            for param_name, param in model.named_parameters():
                if param_name.endswith("concentration_rho"):
                    param.add_(torch.randn(param.shape))
    return model


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)


def _counter(step):
    """An eager step with the compiled CPU step's draws: after the step's key (drawn first from torch's generator),
    every weight noise from varbnn.philox with that key, in call order."""

    def counted(seed):
        with philox.counter_draws(philox.new_key()):
            return step(seed)

    return counted


def _run(step, model, seed):
    """Loss, NLL, KL and the gradients of one step from ``seed``."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    terms = step(seed)
    grads = [p.grad.clone() for p in model.parameters()]
    return torch.stack([terms.loss.detach(), terms.nll, terms.kl]), grads


def _assert_same_step(eager, compiled, seed):
    (values_e, grads_e), (values_c, grads_c) = eager, compiled
    # float32 re-association in the fused kernels: a few ulps of the loss, relative to each gradient's scale
    assert torch.allclose(values_c, values_e, rtol=1e-5, atol=1e-6), (seed, values_e, values_c)
    for ge, gc in zip(grads_e, grads_c):
        scale = float(ge.abs().max()) + 1e-6
        assert float((ge - gc).abs().max()) <= 1e-4 * scale, (seed, float((ge - gc).abs().max()), scale)


@pytest.mark.parametrize("name,backend", CASES)
def test_compiled_step_equals_eager_for_the_same_seed(name, backend):
    """On the CPU the compiled step draws its weight noise from varbnn.philox with one key per step from torch's
    generator (``draws="counter"``); the eager step with those draws (:func:`_counter`) gets the same noise for the
    same seed, so loss and gradients agree to float rounding, for sampled and mean weights. RDP's directions too:
    Wood's eager rejection rounds run inside the graph as one opaque operation (``varbnn::wood_accepted_proposals``),
    drawing from torch's generator. With ``draws="generator"`` the compiled step draws what the plain eager step draws
    (checked with mc_samples=2, whose samples each draw a key in the counter mode)."""
    torch._dynamo.reset()
    counts = torch._dynamo.utils.counters
    counts.clear()
    model = _model(name)
    x, y = _batch()
    compiled = _compiled_elbo_step(model, F.cross_entropy, N_DATA, torch.device("cpu"), True, backend=backend)

    @_counter
    def eager_step(_seed):  # RDP: on the CPU the compiled step runs Wood's eager rejection rounds as one opaque op
        return _accumulated_elbo_gradient(model, model, x, y, F.cross_entropy, N_DATA, 0.5, 1)

    def compiled_step(_seed):
        return compiled(x, y, 0.5, 1)

    runs = {}
    for seed in (3, 4):
        runs[seed] = _run(eager_step, model, seed)
        _assert_same_step(runs[seed], _run(compiled_step, model, seed), seed)
    # one graph for the whole loss: a graph break (e.g. Radial's draw bookkeeping did, until it knew it was being
    # traced) splits the step into many small graphs with Python in between, slower than eager
    assert not counts["graph_break"], dict(counts["graph_break"])
    assert counts["stats"]["unique_graphs"] == 1
    if name != "delta":  # the test can fail: the two seeds draw different weights, so different losses
        assert not torch.equal(runs[3][0][0], runs[4][0][0])
    with varbnn.sample_mode(model, "mean"):  # the mean weights do not depend on the seed (a Monte Carlo KL does)
        _assert_same_step(_run(eager_step, model, 5), _run(compiled_step, model, 5 if name in MC_KL else 6), "mean")
    if name in MC_KL + ("rdp-row",):  # and mc_samples > 1 averages the same draws (and RDP's scores) in the same order
        def eager_two(_seed):
            return _accumulated_elbo_gradient(model, model, x, y, F.cross_entropy, N_DATA, 0.5, 2)

        torch._dynamo.reset()
        plain = _compiled_elbo_step(model, F.cross_entropy, N_DATA, torch.device("cpu"), True, draws="generator",
                                    backend=backend)  # fmt: skip
        _assert_same_step(_run(eager_two, model, 9), _run(lambda _seed: plain(x, y, 0.5, 2), model, 9), "mc_samples=2")


@pytest.mark.parametrize("name", ["meanfield-local", "radial-flipout"])
def test_a_smaller_last_batch_recompiles_with_the_same_draws(name):
    """A last, smaller batch makes dynamo recompile with symbolic sizes: the Philox draws' sizes (the local estimator's
    noise per output, flipout's signs per example) are then symbols, and the step still equals eager's with the same
    draws, for the full batch and the short one."""
    torch._dynamo.reset()
    model = _model(name)
    x, y = _batch()
    compiled = _compiled_elbo_step(model, F.cross_entropy, N_DATA, torch.device("cpu"), True, backend="aot_eager")
    for rows, seed in ((8, 3), (5, 4)):
        xs, ys = x[:rows], y[:rows]
        eager = _counter(lambda _s, xs=xs, ys=ys: _accumulated_elbo_gradient(model, model, xs, ys, F.cross_entropy,
                                                                             N_DATA, 0.5, 1))  # fmt: skip
        _assert_same_step(_run(eager, model, seed), _run(lambda _s, xs=xs, ys=ys: compiled(xs, ys, 0.5, 1), model, seed), rows)


@pytest.mark.parametrize("name", ["rdp-row", pytest.param("rdp-double", marks=pytest.mark.slow)])
def test_the_fixed_proposal_path_of_other_devices_compiles_into_one_graph_and_equals_its_eager_form(name):
    """Off the CPU a compiled RDP step draws Wood's ``PROPOSALS_FIXED`` proposals at once (no host read); within
    ``fixed_rejection_rounds`` the CPU takes that path too, compiled and eager, so it is traced and compared here."""
    from varbnn.distributions.vmf import fixed_rejection_rounds

    torch._dynamo.reset()
    counts = torch._dynamo.utils.counters
    counts.clear()
    model = _model(name)
    x, y = _batch()
    with fixed_rejection_rounds():
        compiled = _compiled_elbo_step(model, F.cross_entropy, N_DATA, torch.device("cpu"), True, backend="aot_eager")
        for seed in (3, 4):
            eager_step = _counter(lambda _s: _accumulated_elbo_gradient(model, model, x, y, F.cross_entropy, N_DATA, 0.5, 1))
            eager = _run(eager_step, model, seed)
            _assert_same_step(eager, _run(lambda _s: compiled(x, y, 0.5, 1), model, seed), seed)
    assert not counts["graph_break"], dict(counts["graph_break"])
    assert counts["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("draws,backend", [("inductor", "inductor"), ("counter", "aot_eager")])
def test_in_graph_random_is_equal_in_distribution(draws, backend):
    """Inductor's own generator (as on a GPU) and varbnn.philox's (the CPU's default; that inductor computes it as
    eager does is test_philox's) draw other streams: the loss over N seeds must match eager's in mean and variance.
    Two-sample z statistic of the means, |z| < 4; log of the variance ratio within 4 standard errors,
    sqrt(2/(N-1) + 2/(N-1)) for near-normal losses: a false alarm has probability < 1e-4 per check (fixed seeds, so
    the outcome is deterministic). A step whose draws were not random (zero variance) or shifted fails."""
    torch._dynamo.reset()
    model = _model("meanfield")
    x, y = _batch()
    compiled = _compiled_elbo_step(model, F.cross_entropy, N_DATA, torch.device("cpu"), True, draws=draws, backend=backend)
    n = 200
    eager, graph = [], []
    with torch.no_grad():
        for seed in range(n):
            torch.manual_seed(seed)
            eager.append(F.cross_entropy(model(x), y))
    for seed in range(n):
        torch.manual_seed(10_000 + seed)
        model.zero_grad(set_to_none=True)
        graph.append(compiled(x, y, 0.5, 1).nll)
    eager_t, graph_t = torch.stack(eager).double(), torch.stack(graph).double()
    z = (eager_t.mean() - graph_t.mean()) / torch.sqrt(eager_t.var() / n + graph_t.var() / n)
    assert abs(float(z)) < 4, float(z)
    log_ratio = math.log(float(eager_t.var() / graph_t.var()))
    assert abs(log_ratio) < 4 * math.sqrt(4 / (n - 1)), log_ratio
    assert float(graph_t.var()) > 0


def test_fit_compiled_trains_with_annealing_without_recompiling(caplog):
    caplog.set_level(logging.INFO, logger="varbnn.train")
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    y = (x[:, 0] > 0).long()
    model = _model("meanfield")
    counts = torch._dynamo.utils.counters
    counts.clear()
    torch.distributions.Distribution.set_default_validate_args(True)  # (torch.compile() itself turns it off)
    validating = torch.distributions.Distribution._validate_args
    history = fit(model, DataLoader(TensorDataset(x, y), batch_size=16), n_data=64, epochs=3, lr=1e-2,
                  kl_weight=lambda s: min(1.0, s / 8), progress=False, diagnose=False, compile=True)  # fmt: skip
    assert len(history) == 3 and all(math.isfinite(r[k]) for r in history for k in ("loss", "nll", "kl"))
    assert history[-1]["beta"] == 1.0 and history[-1]["nll"] < history[0]["nll"]
    assert counts["stats"]["unique_graphs"] == 1  # beta is a tensor input: 12 steps, 9 betas, one graph
    # the wait for the compilation is announced and timed once: one batch shape
    said = [r.getMessage() for r in caplog.records if "first training step with batches of shape (16, 4)" in r.getMessage()]
    assert len(said) == 2 and "compiles the step first" in said[0] and re.search(r"took \d+\.\d s", said[1])
    # torch.compile switches torch.distributions' validation off globally while tracing; fit restores it
    assert torch.distributions.Distribution._validate_args == validating


def test_fit_announces_each_new_batch_shape_of_a_compiled_step(caplog, monkeypatch):
    """The first shape compiles; a later one (a smaller last batch) may compile again: each is announced once, and how
    long its first step took (the step stood in for by the eager one here: what is tested is fit's loop)."""

    def eager_step(model, nll, n_data, device, mode, **kwargs):
        return lambda x, y, beta, samples: _accumulated_elbo_gradient(model, model, x, y, nll, n_data, beta, samples)

    monkeypatch.setattr(varbnn.training.loop, "_compiled_elbo_step", eager_step)
    caplog.set_level(logging.INFO, logger="varbnn.train")
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(20, 4, generator=g), torch.randint(0, 3, (20,), generator=g)
    fit(_model("meanfield"), DataLoader(TensorDataset(x, y), batch_size=8), n_data=20, epochs=2, progress=False,
        diagnose=False, compile=True)  # fmt: skip
    said = [r.getMessage() for r in caplog.records if "first training step with batches of shape" in r.getMessage()]
    assert len(said) == 4  # two shapes, (8, 4) and (4, 4), each announced and timed once over two epochs
    assert "(8, 4)" in said[0] and "compiles the step first" in said[0] and re.search(r"took \d+\.\d s", said[1])
    assert "(4, 4)" in said[2] and "may compile the step again" in said[2] and "(4, 4)" in said[3]


def test_each_compiled_step_has_a_cache_of_its_own():
    """torch.compile counts recompilations per code object (``recompile_limit``, 8 by default): steps for differently
    built models in one process must not share one count, or from the limit on they silently run eager. With the limit
    at 1, two structures compile two graphs (a shared code object gave one: the second ran eager)."""
    torch._dynamo.reset()
    counts = torch._dynamo.utils.counters
    counts.clear()
    x, y = _batch()
    # torch's own patch, not pytest's monkeypatch: undoing a monkeypatch of this config entry left it hidden
    # ("torch._dynamo.config.recompile_limit does not exist") for every later compile in the process
    with torch._dynamo.config.patch(recompile_limit=1):
        for name in ("meanfield", "delta"):
            model = _model(name)
            # the recompile count is dynamo's, whatever the backend: aot_eager spares two inductor compiles
            step = _compiled_elbo_step(model, F.cross_entropy, N_DATA, torch.device("cpu"), True, backend="aot_eager")
            step(x, y, 0.5, 1)
            assert all(p.grad is not None for p in model.parameters())
    assert counts["stats"]["unique_graphs"] == 2


@pytest.mark.parametrize("name", ["rdp-double", "radial", "meanfield"])
def test_a_compiled_step_compiles_once_from_its_first_call(name):
    """State that a family fills on its first step (RDP's dims tensor of the fused Bessel evaluation was cached on the
    module while traced) must not change the guards: four steps from a fresh model, one graph (it was two: a second
    compile of minutes for RDP)."""
    torch._dynamo.reset()
    counts = torch._dynamo.utils.counters
    counts.clear()
    model = _model(name)
    x, y = _batch()
    step = _compiled_elbo_step(model, F.cross_entropy, N_DATA, torch.device("cpu"), True, backend="aot_eager")
    for _ in range(4):
        model.zero_grad(set_to_none=True)
        step(x, y, 0.5, 1)
    assert counts["stats"]["unique_graphs"] == 1


def test_fit_compile_refusals():
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    loader = [(x, y)]
    model = varbnn.bayesianize(nn.Sequential(nn.Linear(4, 3)), MeanField(estimator="graves"))
    with pytest.raises(ValueError, match="compile=.*graves.*per-example"):
        fit(model, loader, n_data=8, epochs=1, progress=False, compile=True)
    with pytest.raises(ValueError, match=r"draws must be one of \('counter', 'generator', 'inductor'\)"):
        _compiled_elbo_step(_model("meanfield"), F.cross_entropy, N_DATA, torch.device("cpu"), True, draws="fast")
    with pytest.raises(ValueError, match="compile must be True, False or one of the modes"):
        fit(_model("meanfield"), loader, n_data=8, epochs=1, progress=False, compile="fast")
    # a family not verified under compile is refused by name rather than trained with a possibly different gradient
    class Unverified(MeanField):  # the refusal is the family's declaration, not a list of names in fit
        compile_unsupported = "not checked"

    with pytest.raises(ValueError, match=r"\(Unverified: not checked\)"):
        fit(varbnn.bayesianize(nn.Sequential(nn.Linear(4, 3)), Unverified()), loader, n_data=8, epochs=1,
            progress=False, compile=True)  # fmt: skip


@pytest.mark.parametrize("first, then", [(False, True), (True, False), (True, True)])
def test_a_checkpoint_resumes_across_compile_and_eager(tmp_path, monkeypatch, first, then):
    """``compile`` is a runtime choice (the experiment runner resumes an eager run's checkpoint compiled, e.g. the
    LeNet-5 front's seeds): a run stopped after 2 epochs and resumed the other way ends where one straight eager run
    ends, to rounding, when the compiled step draws the eager step's random numbers (``draws="generator"``); a
    compiled run (its default draws: one key per step from torch's generator) resumed compiled ends where one straight
    compiled run ends."""
    import functools

    from varbnn.training import loop as train

    # the checkpoint's side of compile is the step function, whatever the backend: aot_eager spares inductor's compiles
    draws = "generator" if first != then else None
    monkeypatch.setattr(train, "_compiled_elbo_step", functools.partial(train._compiled_elbo_step, backend="aot_eager",
                                                                        draws=draws))  # fmt: skip
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    y = (x[:, 0] > 0).long()

    def run(epochs, path, resume, compile):
        torch._dynamo.reset()
        model = _model("meanfield")
        if resume:  # another start and another random stream: only the checkpoint can make it end as the straight run
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1.0)
            torch.manual_seed(123)
        loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
        history = fit(model, loader, n_data=64, epochs=epochs, lr=1e-2, progress=False, diagnose=False,
                      checkpoint=path, resume=resume, compile=compile)  # fmt: skip
        return model, history

    straight, straight_history = run(4, tmp_path / "straight.pt", False, first and then)
    run(2, tmp_path / "cut.pt", False, first)  # "killed" after 2 epochs
    resumed, history = run(4, tmp_path / "cut.pt", True, then)
    assert [h["epoch"] for h in history] == [1, 2, 3, 4]
    for mine, theirs in zip(history, straight_history):
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-4)
    for a, b in zip(straight.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)



def _traced_calls(name, share=True):
    """The call_function targets (as strings) of the compiled step's one graph, traced with aot_eager."""
    from collections import Counter

    from torch._dynamo.testing import CompileCounterWithBackend

    import varbnn.training.compiled as compiled

    torch._dynamo.reset()
    model = _model(name)
    x, y = _batch()
    backend = CompileCounterWithBackend("aot_eager")
    real = compiled.share_sigmas_in_trace  # where the compiled step looks it up
    compiled.share_sigmas_in_trace = real if share else (lambda active: None)
    try:  # the step looks the function up when it traces (its first call)
        step = _compiled_elbo_step(model, F.cross_entropy, N_DATA, torch.device("cpu"), True, backend=backend)
        step(x, y, 0.5, 1)
    finally:
        compiled.share_sigmas_in_trace = real
    assert len(backend.graphs) == 1
    return Counter(str(node.target) for node in backend.graphs[0].graph.nodes if node.op == "call_function")


def test_a_tied_sigma_is_computed_once_for_the_forward_pass_and_the_kl():
    """Inside the compiled step the eager step's per-step sigma node does not trace, so the step shares KTied's tied
    sigma (a GEMM whose backward is two more) itself: one ``U V^T`` node per tied tensor (the model's two weights) where
    the forward pass and the KL built one each. MeanField's elementwise softplus is left to inductor, which recomputes
    it inside each kernel that reads it: one softplus per use (weights and biases, draw and KL), traced as
    ``log1p(exp(min(rho, 20)))`` (:func:`varbnn._fast.softplus.softplus`), F.softplus nowhere."""
    shared, unshared = _traced_calls("ktied"), _traced_calls("ktied", share=False)
    assert shared["autograd_function_apply"] == unshared["autograd_function_apply"] - 2, (dict(shared), dict(unshared))
    meanfield = _traced_calls("meanfield")
    assert meanfield[str(torch.log1p)] == 8 and not meanfield[str(F.softplus)], dict(meanfield)


def test_families_ask_inductor_for_their_options_and_fit_merges_them():
    """RDP's double grouping asks for realize_opcount_threshold 8 (its column factor's per-column values then go to a
    buffer once instead of into every row's output pass); the row grouping and the Gaussian families ask for nothing,
    and a model mixing them gets the one request."""
    from varbnn.training.compiled import _family_inductor_options

    assert _family_inductor_options(_model("rdp-double")) == {"realize_opcount_threshold": 8}
    assert _family_inductor_options(_model("rdp-row")) == {}
    assert _family_inductor_options(_model("meanfield")) == {}
    mixed = nn.Sequential(_model("meanfield"), _model("rdp-double"))
    assert _family_inductor_options(mixed) == {"realize_opcount_threshold": 8}
