"""bayesianize over every convertible module type, the conversion report, the eval()/sampling rule, torch priors."""

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import nn

import varbnn
from varbnn import (
    BayesConv1d,
    BayesConv3d,
    BayesEmbedding,
    BayesGRU,
    BayesianModule,
    BayesLinear,
    ConversionReport,
    ConversionWarning,
    Delta,
    MeanField,
)
from varbnn.convert import register_left_deterministic
from varbnn.priors import Laplace, Normal


@dataclass(frozen=True)
class Case:
    id: str
    plain: Callable[[], nn.Module]
    inputs: Callable[[], tuple[torch.Tensor, ...]]
    bayes_type: type[nn.Module]


def _indices() -> tuple[torch.Tensor, ...]:
    x = torch.arange(12).reshape(3, 4) % 7  # every row of the table, the padding row 0 included
    return (x,)


CASES = [
    Case("embedding", lambda: nn.Embedding(7, 5), _indices, BayesEmbedding),
    Case("embedding-padding", lambda: nn.Embedding(7, 5, padding_idx=0, scale_grad_by_freq=True), _indices, BayesEmbedding),
    Case("conv1d", lambda: nn.Conv1d(3, 4, 3, stride=2, padding=1), lambda: (torch.randn(2, 3, 9),), BayesConv1d),
    Case("conv1d-groups-dilation", lambda: nn.Conv1d(4, 6, 3, groups=2, dilation=2, bias=False),
         lambda: (torch.randn(2, 4, 11),), BayesConv1d),
    Case("conv3d", lambda: nn.Conv3d(2, 3, (3, 1, 3), padding="same"), lambda: (torch.randn(2, 2, 4, 5, 4),), BayesConv3d),
    Case("gru", lambda: nn.GRU(3, 4), lambda: (torch.randn(6, 2, 3),), BayesGRU),
    Case("gru-2-layers-batch-first", lambda: nn.GRU(3, 4, num_layers=2, batch_first=True),
         lambda: (torch.randn(2, 6, 3), torch.randn(2, 2, 4)), BayesGRU),
]  # fmt: skip


def _outputs(result: object) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    assert isinstance(result, tuple)
    return [t for item in result for t in _outputs(item)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_delta_family_reproduces_the_plain_module(case):
    plain = case.plain()
    bayes = varbnn.bayesianize(plain, Delta(), pretrained=True)
    assert isinstance(bayes, case.bayes_type)
    inputs = case.inputs()
    for got, want in zip(_outputs(bayes(*inputs)), _outputs(plain(*inputs)), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_gradients_of_the_output_reach_every_variational_parameter(case):
    bayes = varbnn.bayesianize(case.plain(), MeanField(init_std=0.1))
    loss = sum((out * torch.randn_like(out)).sum() for out in _outputs(bayes(*case.inputs())))
    loss.backward()
    for name, parameter in bayes.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name
        grad = parameter.grad
        if getattr(bayes, "padding_idx", None) is not None:  # the padding row gets no gradient, as in nn.Embedding
            assert (grad[bayes.padding_idx] == 0).all(), name
            grad = torch.cat([grad[: bayes.padding_idx], grad[bayes.padding_idx + 1 :]])
        assert (grad != 0).all(), name


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_to_deterministic_round_trip(case):
    plain = case.plain()
    bayes = varbnn.bayesianize(plain, MeanField(), pretrained=True)
    back = varbnn.to_deterministic(bayes, "mean")
    assert type(back) is type(plain)
    assert {n: p.shape for n, p in back.named_parameters()} == {n: p.shape for n, p in plain.named_parameters()}
    inputs = case.inputs()
    for got, want in zip(_outputs(back(*inputs)), _outputs(plain(*inputs)), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_embedding_padding_row_is_fixed_and_bayesian_elsewhere():
    layer = BayesEmbedding(5, 3, padding_idx=-1, family=MeanField(init_std=0.5))
    assert layer.padding_idx == 4
    x = torch.tensor([[4, 1, 4]])
    a, b = layer(x), layer(x)
    assert torch.equal(a[0, 0], torch.zeros(3)) and torch.equal(a[0, 2], torch.zeros(3))
    assert not torch.equal(a[0, 1], b[0, 1])
    with pytest.raises(ValueError, match="integer indices"):
        layer(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="padding_idx must be None or an int in \\[-5, 5\\)"):
        BayesEmbedding(5, 3, padding_idx=5)


def _local_moments_check(layer: nn.Module, x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> None:
    n = 20000
    out = varbnn.predict(layer, x, samples=n, vectorize=True)
    # Monte Carlo tolerance: 5 standard errors of the mean and of the (Gaussian) sample variance
    assert ((out.mean(0) - mean).abs() <= 5 * (var / n).sqrt()).all()
    assert ((out.var(0) - var).abs() <= 5 * var * math.sqrt(2 / n)).all()


def _jitter_std(layer: nn.Module) -> None:
    with torch.no_grad():
        for q in layer.posteriors.values():
            q.rho.add_(torch.randn_like(q.rho) * 0.3)


def test_local_reparameterization_of_an_embedding_has_the_exact_output_moments():
    torch.manual_seed(0)
    layer = BayesEmbedding(6, 3, family=MeanField(init_std=0.4, estimator="local"))
    _jitter_std(layer)
    x = torch.tensor([[0, 5, 5], [2, 3, 0]])
    q = layer.posteriors["weight"]
    _local_moments_check(layer, x, q.loc[x].detach(), q.variance[x].detach())


def test_local_reparameterization_of_a_conv1d_has_the_exact_output_moments():
    torch.manual_seed(0)
    layer = BayesConv1d(2, 3, 3, padding=1, family=MeanField(init_std=0.4, estimator="local"))
    _jitter_std(layer)
    x = torch.randn(2, 2, 5)
    w, b = layer.posteriors["weight"], layer.posteriors["bias"]
    mean = nn.functional.conv1d(x, w.loc, b.loc, padding=1).detach()
    var = nn.functional.conv1d(x * x, w.variance, b.variance, padding=1).detach()
    _local_moments_check(layer, x, mean, var)


def test_estimators_allowed_per_layer_kind():
    BayesConv3d(2, 2, 2, family=MeanField(estimator="flipout"))(torch.randn(1, 2, 3, 3, 3))
    BayesConv1d(2, 2, 2, family=varbnn.Radial(estimator="flipout"))(torch.randn(1, 2, 3))
    with pytest.raises(ValueError, match="not supported in embedding layers.*\\['reparam', 'local', 'graves'\\].*index"):
        varbnn.bayesianize(nn.Embedding(4, 2), MeanField(estimator="flipout"))
    with pytest.raises(ValueError, match="not supported in gru layers.*time step"):
        BayesGRU(2, 3, family=MeanField(estimator="local"))


def test_gru_draws_one_weight_per_forward_pass():
    layer = BayesGRU(2, 3, family=MeanField(init_std=0.5))
    calls = []
    original = layer.posteriors["weight_hh_l0"].rsample
    layer.posteriors["weight_hh_l0"].rsample = lambda *a: calls.append(1) or original(*a)
    out, h_n = layer(torch.randn(2, 7, 2))
    assert len(calls) == 1 and out.shape == (2, 7, 3) and h_n.shape == (1, 2, 3)


# -- eval() does not stop sampling --------------------------------------------------------------------------


def test_eval_mode_still_samples_and_only_sample_mode_stops_it():
    model = varbnn.bayesianize(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)), MeanField(init_std=0.1))
    model.eval()
    x = torch.randn(5, 3)
    assert not torch.equal(model(x), model(x)), "eval() must not stop weight sampling (predict relies on it)"
    with varbnn.sample_mode(model, "mean"):
        assert torch.equal(model(x), model(x))
    assert not torch.equal(model(x), model(x))


# -- torch distributions as priors --------------------------------------------------------------------------


def test_a_torch_normal_or_laplace_prior_becomes_the_varbnn_prior():
    net = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    model = varbnn.bayesianize(net, MeanField(), torch.distributions.Normal(0.5, 2.0))
    priors = [p for m in model.modules() if isinstance(m, BayesianModule) for _, _, p in m.bayesian_tensors()]
    assert len(priors) == 4 and all(p is priors[0] for p in priors), "one shared prior, as for a varbnn instance"
    assert isinstance(priors[0], Normal) and float(priors[0].loc) == 0.5 and float(priors[0].scale) == 2.0
    reference = varbnn.bayesianize(net, MeanField(), Normal(0.5, 2.0))
    reference.load_state_dict(model.state_dict())
    assert float(varbnn.kl(model)) == pytest.approx(float(varbnn.kl(reference)), rel=1e-6)
    laplace = BayesLinear(2, 2, prior=torch.distributions.Laplace(torch.tensor([0.0]), torch.tensor([0.1])))
    assert isinstance(laplace.priors["weight"], Laplace) and laplace.priors["weight"].loc.dim() == 0
    factory = varbnn.bayesianize(net, MeanField(), lambda name: torch.distributions.Normal(0.0, 3.0))
    scales = [float(p.scale) for m in factory.modules() if isinstance(m, BayesianModule) for _, _, p in m.bayesian_tensors()]
    assert scales == [3.0] * 4


def test_other_torch_distributions_are_refused_as_priors():
    with pytest.raises(TypeError, match="prior must be a varbnn prior.*Normal, Laplace.*got torch.distributions.Gamma"):
        varbnn.bayesianize(nn.Linear(2, 2), prior=torch.distributions.Gamma(1.0, 1.0))
    with pytest.raises(TypeError, match="loc of shape \\(3,\\).*varbnn.priors.Normal\\(loc, scale\\)"):
        varbnn.bayesianize(nn.Linear(2, 2), prior=torch.distributions.Normal(torch.zeros(3), 1.0))
    with pytest.raises(TypeError, match="got torch.distributions.Uniform"):
        BayesLinear(2, 2, prior=torch.distributions.Uniform(0.0, 1.0))
    with pytest.raises(TypeError, match="prior must be a varbnn prior.*got str"):
        varbnn.bayesianize(nn.Linear(2, 2), prior="normal")  # type: ignore[call-overload]


# -- the conversion report ----------------------------------------------------------------------------------


class Mixed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.norm = nn.LayerNorm(8)
        self.attention = nn.MultiheadAttention(8, 2, batch_first=True)
        self.bilinear = nn.Bilinear(8, 8, 3)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.embed(x))
        a, _ = self.attention(h, h, h)
        return self.bilinear(a[:, 0], h[:, -1]) + self.head(h.mean(1))


def test_report_lists_every_module_that_owns_parameters():
    net = Mixed()
    with pytest.warns(ConversionWarning) as record:
        model, report = varbnn.bayesianize(net, MeanField(), report=True)
    assert len(record) == 1, "one warning per call"
    message = str(record[0].message)
    assert "Bilinear" in message and "LayerNorm" not in message and "MultiheadAttention" not in message
    assert isinstance(report, ConversionReport)
    assert [(c.name, c.source_type, c.bayesian_type) for c in report.converted] == [
        ("embed", "Embedding", "BayesEmbedding"),
        ("attention", "MultiheadAttention", "BayesMultiheadAttention"),  # converted since issue 65
        ("head", "Linear", "BayesLinear"),
    ]
    left = {d.name: (d.type_name, d.deliberate) for d in report.deterministic}
    assert left == {"norm": ("LayerNorm", True), "bilinear": ("Bilinear", False)}
    total = sum(p.numel() for p in net.parameters())
    assert report.num_bayesian_weights + report.num_deterministic_parameters == total
    assert {d.name for d in report.unintended} == {"bilinear"}
    text = str(report)
    assert "normalisation layer (deterministic by design)" in text and "Embedding -> BayesEmbedding" in text
    assert "3 modules Bayesian" in report.summary()
    x = torch.randint(0, 10, (2, 5))
    model.eval()
    assert model(x).shape == (2, 3), "MultiheadAttention's forward works after bayesianize"
    again = varbnn.conversion_report(model)
    assert [c.name for c in again.converted] == ["embed", "attention", "head"] and again.converted[0].source_type is None
    assert [(d.name, d.deliberate) for d in again.deterministic] == [(d.name, d.deliberate) for d in report.deterministic]


def test_strict_refuses_and_exclusion_acknowledges():
    with pytest.raises(ValueError, match="strict=True.*: Bilinear x1.*'bilinear'"):
        varbnn.bayesianize(Mixed(), strict=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model, report = varbnn.bayesianize(Mixed(), strict=True, exclude=[nn.MultiheadAttention, "bilinear"], report=True)
    assert {d.name for d in report.deterministic if d.reason == "excluded by the user"} == {"attention", "bilinear"}
    assert isinstance(model, Mixed)


def test_normalisation_layers_are_deterministic_without_a_warning():
    net = nn.Sequential(nn.BatchNorm2d(2), nn.Conv2d(2, 4, 3), nn.ReLU(), nn.GroupNorm(2, 4), nn.InstanceNorm2d(4, affine=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model, report = varbnn.bayesianize(net, report=True, strict=True)
    assert [d.type_name for d in report.deterministic] == ["BatchNorm2d", "GroupNorm", "InstanceNorm2d"]
    assert isinstance(model[0], nn.BatchNorm2d) and model(torch.randn(2, 2, 6, 6)).shape == (2, 4, 4, 4)


def test_a_batch_norm_after_a_bayesian_layer_is_warned_about_once():
    """Its running statistics average over weight draws: one warning naming the pair and the ways out; none when the
    layer before it stays deterministic or the batch norm keeps no running statistics."""
    net = nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.BatchNorm2d(4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        varbnn.bayesianize(net, strict=True)
    messages = [str(w.message) for w in caught if issubclass(w.category, ConversionWarning)]
    assert len(messages) == 1
    assert "BatchNorm2d '1' comes after the Bayesian module '0'" in messages[0] and "exclude=" in messages[0]
    for quiet in (
        lambda: varbnn.bayesianize(net, exclude=["0", "3"]),
        lambda: varbnn.bayesianize(nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4, track_running_stats=False))),
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            quiet()


def test_transformer_layers():
    """Since issue 65 the encoder layer is walked into (its attention and Linear layers converted, its fused eval fast
    path switched off) and the decoder layer's two attentions are converted; tests/test_attention_conversion.py has
    the rest."""
    x = torch.randn(2, 5, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        encoder, report = varbnn.bayesianize(nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), report=True)
    assert {c.name for c in report.converted} == {"self_attn", "linear1", "linear2"}
    encoder.eval()
    with torch.no_grad():
        assert encoder(x).shape == x.shape  # the regular path, with the Bayesian modules
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        decoder = varbnn.bayesianize(nn.TransformerDecoderLayer(8, 2, 16, batch_first=True))
    assert isinstance(decoder.linear1, BayesLinear) and isinstance(decoder.self_attn, varbnn.nn.BayesMultiheadAttention)
    assert isinstance(decoder.multihead_attn, varbnn.nn.BayesMultiheadAttention)
    decoder.eval()
    with torch.no_grad():
        assert decoder(x, x).shape == x.shape


def test_custom_parameters_are_reported_and_types_can_be_registered():
    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gain = nn.Parameter(torch.ones(3))
            self.inner = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x) * self.gain

    with pytest.warns(ConversionWarning, match="Scale x1 \\(no Bayesian form registered\\)"):
        model, report = varbnn.bayesianize(Scale(), report=True)
    assert isinstance(model.inner, BayesLinear), "children of an unregistered module are still converted"
    assert [(d.name, d.num_parameters) for d in report.deterministic] == [("", 3)]

    class Gate(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.logit = nn.Parameter(torch.zeros(()))

    register_left_deterministic(Gate, "a gate, deterministic by design")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, report = varbnn.bayesianize(nn.Sequential(nn.Linear(2, 2), Gate()), report=True)
    assert report.deterministic[0].reason == "a gate, deterministic by design" and report.deterministic[0].deliberate
