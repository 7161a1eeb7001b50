"""Variational LoRA adapters (issue 65, part 1): varbnn.adapters.

Oracles: the adapted model equals the pretrained one exactly at initialisation; the Delta family reproduces a
hand-written LoRA forward exactly; merging the posterior means equals the adapted model run at its means; the model's
KL is the sum of the adapters' own KLs; training never moves a pretrained weight.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from bad_input_table import BadInput, check, params
from torch import nn

import varbnn
from varbnn.adapters import (
    LoRAConv2d,
    LoRALayer,
    LoRALinear,
    LoRAMultiheadAttention,
    adapter_parameters,
    adapter_state_dict,
    add_adapters,
    load_adapter_state_dict,
    merge_adapters,
)
from varbnn.optim import IVON
from varbnn.priors import Uniform

FAMILIES = {
    "meanfield": lambda: varbnn.MeanField(),
    "ktied": lambda: varbnn.KTied(rank=2),
    "radial": lambda: varbnn.Radial(),
    "delta": lambda: varbnn.Delta(),
}


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))


def _perturb(model: nn.Module, seed: int = 1) -> None:
    """Move every adapter matrix away from its initial value (B = 0 would hide the update from every oracle)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in adapter_parameters(model):
            parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("bayesian", ["A", "B", "both"])
def test_identity_at_initialisation(family: str, bayesian: str) -> None:
    """B = 0 exactly: the adapted model is the pretrained one (every draw with A Bayesian; at the mean otherwise)."""
    model, x = _mlp(), torch.randn(9, 6)
    adapted = add_adapters(model, rank=3, family=FAMILIES[family](), bayesian=bayesian)
    expected = model(x)
    with varbnn.sample_mode(adapted, "mean"):
        assert torch.equal(adapted(x), expected)
    if bayesian == "A" or family == "delta":
        assert all(torch.equal(adapted(x), expected) for _ in range(3))
    assert all(p.requires_grad for p in model.parameters())  # a deep copy: the input model is untouched


def test_delta_is_plain_lora() -> None:
    """family=Delta() (here on both matrices) computes base(x) + (alpha / r) x A^T B^T, written out by hand."""
    model, x = _mlp(), torch.randn(9, 6)
    adapted = add_adapters(model, rank=4, alpha=2.0, family=varbnn.Delta(), bayesian="both")
    _perturb(adapted)
    expected = x
    for index, layer in enumerate(model):
        if isinstance(layer, nn.Linear):
            a = adapted[index].posteriors["lora_A"].value
            b = adapted[index].posteriors["lora_B"].value
            expected = layer(expected) + (2.0 / 4) * F.linear(F.linear(expected, a), b)
        else:
            expected = layer(expected)
    assert torch.equal(adapted(x), expected)
    # the default bayesian="A": A a Delta, B a plain parameter, same forward
    plain = add_adapters(model, rank=4, alpha=2.0, family=varbnn.Delta(), prior=Uniform())
    _perturb(plain)
    first = plain[0]
    want = model[0](x) + 0.5 * F.linear(F.linear(x, first.posteriors["lora_A"].value), first.lora_B)
    assert torch.equal(first(x), want)
    assert float(varbnn.kl(plain)) == 0.0  # Delta against the flat prior: maximum likelihood, plain LoRA


def _shifted_task(n: int = 64) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """An MLP 'pretrained' on one random linear classification task, and data of a shifted one."""
    model = _mlp()
    torch.manual_seed(3)
    x = torch.randn(n, 6)
    w_old, w_shift = torch.randn(6, 4), torch.randn(6, 4)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(30):
        optimizer.zero_grad()
        F.cross_entropy(model(x), (x @ w_old).argmax(1)).backward()
        optimizer.step()
    return model, x, (x @ (w_old + 1.5 * w_shift)).argmax(1)


def test_fit_trains_only_the_adapters_and_the_loss_falls() -> None:
    pretrained, x, y = _shifted_task()
    adapted = add_adapters(pretrained, rank=4)
    base = {k: v.clone() for k, v in adapted.state_dict().items() if ".base." in k}
    trainable = {id(p) for p in adapted.parameters() if p.requires_grad}
    assert trainable == {id(p) for p in adapter_parameters(adapted)} and trainable
    assert all(not p.requires_grad for n, p in adapted.named_parameters() if ".base." in n)
    optimizer = torch.optim.Adam(adapter_parameters(adapted), lr=0.05)
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert held == trainable  # only adapter parameters in the optimizer
    before = F.cross_entropy(pretrained(x), y).item()
    history = varbnn.fit(adapted, [(x, y)], n_data=len(x), epochs=40, optimizer=optimizer, progress=False)
    assert history[-1]["nll"] < 0.7 * history[0]["nll"]
    with varbnn.sample_mode(adapted, "mean"):
        assert F.cross_entropy(adapted(x), y).item() < 0.7 * before
    after = adapted.state_dict()
    assert all(torch.equal(after[k], v) for k, v in base.items())  # the pretrained weights never moved, bit for bit
    # fit's default optimizer (Adam over model.parameters(), frozen ones included) leaves them alone too
    varbnn.fit(adapted, [(x, y)], n_data=len(x), epochs=3, progress=False)
    assert all(torch.equal(adapted.state_dict()[k], v) for k, v in base.items())


@pytest.mark.parametrize("family", ["meanfield", "ktied", "radial", "delta"])
def test_kl_is_the_sum_of_the_adapters_kls(family: str) -> None:
    # Radial's default KL draws Monte Carlo samples of its cross-entropy: its closed form here, for an exact comparison
    spec = varbnn.Radial(cross_entropy="closed_form") if family == "radial" else FAMILIES[family]()
    adapted = add_adapters(_mlp(), rank=3, family=spec, bayesian="both")
    _perturb(adapted)
    own = sum(
        posterior.kl(prior)
        for module in adapted.modules()
        if isinstance(module, LoRALayer)
        for _, posterior, prior in module.bayesian_tensors()
    )
    names = [n for m in adapted.modules() if isinstance(m, LoRALayer) for n, _, _ in m.bayesian_tensors()]
    assert names == ["lora_A", "lora_B"] * 3
    assert torch.allclose(varbnn.kl(adapted), own, rtol=1e-5)  # type: ignore[arg-type]


def test_ivon_trains_a_meanfield_adapter() -> None:
    pretrained, x, y = _shifted_task()
    adapted = add_adapters(pretrained, rank=4)
    base = [p.clone() for n, p in adapted.named_parameters() if ".base." in n]
    optimizer = IVON(adapted, n_data=len(x), lr=0.5)
    kinds = sorted(g["kind"] for g in optimizer.param_groups)
    assert kinds == ["meanfield"] * 3 + ["plain"]  # A's posteriors natural-gradient, B as a point estimate
    history = varbnn.fit(adapted, [(x, y)], n_data=len(x), epochs=40, optimizer=optimizer, progress=False)
    assert history[-1]["nll"] < 0.6 * history[0]["nll"]  # (0.33 to 0.37 of it over three seeds)
    assert all(torch.equal(p, q) for p, q in zip((p for n, p in adapted.named_parameters() if ".base." in n), base))


def test_predict_draws_vary_for_meanfield_and_not_for_delta() -> None:
    x = torch.randn(5, 6)
    gaussian = add_adapters(_mlp(), rank=3)
    _perturb(gaussian)
    draws = varbnn.predict(gaussian, x, samples=4)
    assert draws.shape == (4, 5, 4) and not torch.allclose(draws[0], draws[1])
    point = add_adapters(_mlp(), rank=3, family=varbnn.Delta())
    _perturb(point)
    draws = varbnn.predict(point, x, samples=4)
    assert all(torch.equal(draws[0], d) for d in draws[1:])
    labels = torch.tensor([0, 1, 2, 3, 0])
    summary = varbnn.evaluate(gaussian, x, labels, samples=4)
    assert "nll" in summary
    with warnings.catch_warnings():  # five random labels: T runs to its bound, which TemperatureScaled warns about
        warnings.simplefilter("ignore", UserWarning)
        scaled = varbnn.calibration.TemperatureScaled(gaussian).fit(x, labels, samples=4)
    assert varbnn.predict(scaled, x, samples=2).shape == (2, 5, 4)


@pytest.mark.parametrize("bayesian", ["A", "both"])
@pytest.mark.parametrize("family", ["meanfield", "ktied", "radial"])
def test_merge_equals_the_adapted_model_at_its_means(family: str, bayesian: str) -> None:
    adapted = add_adapters(_mlp(), rank=3, alpha=6.0, family=FAMILIES[family](), bayesian=bayesian)
    _perturb(adapted)
    x = torch.randn(7, 6)
    merged = merge_adapters(adapted)
    assert not any(isinstance(m, (LoRALayer, varbnn.BayesianModule)) for m in merged.modules())
    assert [type(m) for m in merged] == [type(m) for m in _mlp()]
    with varbnn.sample_mode(adapted, "mean"):
        expected = adapted(x)
    assert torch.allclose(merged(x), expected, atol=1e-5)
    assert torch.allclose(varbnn.to_deterministic(adapted)(x), expected, atol=1e-5)
    assert adapted[0].sample_mode == "sample"  # merging changed nothing in the adapted model


def test_adapter_state_dict_round_trip() -> None:
    pretrained = _mlp()
    adapted = add_adapters(pretrained, rank=3, include=("0", "4"))
    _perturb(adapted)
    state = adapter_state_dict(adapted)
    assert state and not any(".base." in k for k in state)
    assert {k.split(".")[0] for k in state} == {"0", "4"}
    fresh = add_adapters(pretrained, rank=3, include=("0", "4"))
    load_adapter_state_dict(fresh, state)
    x = torch.randn(5, 6)
    with varbnn.sample_mode(adapted, "mean"), varbnn.sample_mode(fresh, "mean"):
        assert torch.equal(fresh(x), adapted(x))
    torch.manual_seed(4)
    a = adapted(x)
    torch.manual_seed(4)
    assert torch.equal(fresh(x), a)  # the same posterior: the same draws from the same seed


def test_load_adapter_state_dict_is_strict() -> None:
    adapted = add_adapters(_mlp(), rank=3)
    state = adapter_state_dict(adapted)
    other = add_adapters(_mlp(), rank=3, include="4")
    with pytest.raises(ValueError, match=r"missing keys \[\].*unexpected keys \['0\.lora_B'"):
        load_adapter_state_dict(other, state)
    short = dict(state)
    del short["2.lora_B"]
    with pytest.raises(ValueError, match=r"missing keys \['2\.lora_B'\]"):
        load_adapter_state_dict(adapted, short)
    with pytest.raises(ValueError, match="has no adapters"):
        load_adapter_state_dict(_mlp(), state)


def test_transformer_encoder_layer_linear_layers() -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, dropout=0.0)
    adapted = add_adapters(layer, rank=2, include="linear*")
    assert isinstance(adapted.linear1, LoRALinear) and isinstance(adapted.linear2, LoRALinear)
    src = torch.randn(3, 4, 8)
    frozen = copy.deepcopy(layer).requires_grad_(False)  # (torch's attention takes another kernel without gradients)
    assert torch.equal(adapted(src), frozen(src))
    _perturb(adapted)
    merged = merge_adapters(adapted)
    for mode in ("train", "eval"):  # eval: torch's fused fast path would read linear1.weight and skip the adapter
        getattr(adapted, mode)()
        getattr(merged, mode)()
        with torch.no_grad(), varbnn.sample_mode(adapted, "mean"):
            assert torch.allclose(adapted(src), merged(src), atol=1e-5)
            assert not torch.allclose(adapted(src), layer.eval()(src), atol=1e-3)


def test_multihead_attention_out_proj_is_refused() -> None:
    attention = nn.MultiheadAttention(8, 2, batch_first=True)
    with pytest.raises(ValueError, match="out_proj.*F.multi_head_attention_forward reads directly"):
        add_adapters(attention, include="out_proj")
    model = nn.Sequential(nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), nn.Linear(8, 2))
    with pytest.warns(UserWarning, match=r"\['0.self_attn.out_proj'\] without adapters"):
        adapted = add_adapters(model, rank=2)
    assert isinstance(adapted[0].linear1, LoRALinear) and isinstance(adapted[1], LoRALinear)
    assert not isinstance(adapted[0].self_attn.out_proj, LoRALayer)


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_adapter_on_the_packed_projection(batch_first: bool) -> None:
    """An nn.MultiheadAttention chosen by type or name: the pretrained attention exactly at initialisation (every
    draw: A is the Bayesian matrix, B = 0), then at the posterior mean the attention with in_proj_weight + (alpha /
    rank) B A, which merge_adapters returns; masks and need_weights pass through; draws vary."""
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(8, 2, batch_first=batch_first)
    adapted = add_adapters(attention, rank=3, alpha=6.0, include=nn.MultiheadAttention)
    assert isinstance(adapted, LoRAMultiheadAttention) and adapted.lora_B.shape == (24, 3)
    q, kv = torch.randn(4, 5, 8), torch.randn(4, 6, 8)  # batch 4, 5 queries, 6 keys
    if not batch_first:
        q, kv = q.transpose(0, 1), kv.transpose(0, 1)
    mask = torch.zeros(4, 6, dtype=torch.bool)
    mask[:, -1] = True
    kwargs = {"key_padding_mask": mask}
    for draw in range(2):
        assert torch.equal(adapted(q, kv, kv, **kwargs)[0], attention(q, kv, kv, **kwargs)[0]), draw
    _perturb(adapted)
    merged = merge_adapters(adapted)
    assert type(merged) is nn.MultiheadAttention
    a_mean = adapted.posteriors["lora_A"].mean
    expected = copy.deepcopy(attention)
    with torch.no_grad():
        expected.in_proj_weight.add_(2.0 * adapted.lora_B @ a_mean)
    with torch.no_grad(), varbnn.sample_mode(adapted, "mean"):
        out, weights = adapted(q, kv, kv, **kwargs)
        torch.testing.assert_close(out, expected(q, kv, kv, **kwargs)[0])
        torch.testing.assert_close(out, merged(q, kv, kv, **kwargs)[0])
        assert weights is not None and adapted(q, kv, kv, need_weights=False, **kwargs)[1] is None
        assert not torch.allclose(out, attention(q, kv, kv, **kwargs)[0], atol=1e-3)
    with torch.no_grad():
        assert not torch.equal(adapted(q, kv, kv)[0], adapted(q, kv, kv)[0])  # A is drawn on every pass
    assert torch.equal(attention.in_proj_weight, adapted.base.in_proj_weight)  # the base is untouched (deep copy)


def test_multihead_attention_adapter_in_transformer_layers() -> None:
    """Adapted self-attention inside nn.TransformerEncoderLayer / nn.TransformerEncoder: trains through fit (only the
    adapters move), and in eval mode the layers take their regular path (the fused one would skip the adapter)."""
    torch.manual_seed(0)
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, dropout=0.0), 2,
                                    enable_nested_tensor=False)  # fmt: skip
    model = nn.Sequential(encoder, nn.Flatten(), nn.Linear(32, 3))
    adapted = add_adapters(model, rank=2, include=nn.MultiheadAttention)
    attentions = [m for m in adapted.modules() if isinstance(m, LoRAMultiheadAttention)]
    assert len(attentions) == 2 and not any(isinstance(m, LoRALinear) for m in adapted.modules())
    x, y = torch.randn(16, 4, 8), torch.randint(0, 3, (16,))
    frozen = {n: p.detach().clone() for n, p in adapted.named_parameters() if not p.requires_grad}
    varbnn.fit(adapted, [(x, y)], n_data=16, epochs=3, lr=1e-2, progress=False, diagnose=False)
    assert all(torch.equal(p, frozen[n]) for n, p in adapted.named_parameters() if n in frozen)
    assert any(float(a.lora_B.abs().max()) > 0 for a in attentions)
    merged = merge_adapters(adapted)
    for mode in ("train", "eval"):
        getattr(adapted, mode)()
        getattr(merged, mode)()
        with torch.no_grad(), varbnn.sample_mode(adapted, "mean"):
            torch.testing.assert_close(adapted(x), merged(x), atol=1e-5, rtol=1e-5)


def test_multihead_attention_adapter_refusals() -> None:
    separate = nn.MultiheadAttention(8, 2, kdim=4, vdim=4)
    with pytest.raises(ValueError, match="kdim / vdim of its own"):
        add_adapters(separate, include=nn.MultiheadAttention, rank=2)
    with pytest.raises(ValueError, match=r"rank must be an int in \[1, 8\]"):
        add_adapters(nn.MultiheadAttention(8, 2), include=nn.MultiheadAttention, rank=9)
    with pytest.raises(ValueError, match="not supported in attention layers"):
        add_adapters(nn.MultiheadAttention(8, 2), include=nn.MultiheadAttention, rank=2,
                     family=varbnn.MeanField(estimator="local"))  # fmt: skip
    with pytest.raises(TypeError, match="base must be an nn.MultiheadAttention"):
        LoRAMultiheadAttention(nn.Linear(8, 8))  # type: ignore[arg-type]


def test_conv2d_adapter() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1, stride=2), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 4 * 4, 2))
    adapted = add_adapters(model, rank=2, include=(nn.Conv2d, nn.Linear))
    assert isinstance(adapted[0], LoRAConv2d) and isinstance(adapted[3], LoRALinear)
    x = torch.randn(2, 3, 8, 8)
    assert torch.equal(adapted(x), model(x))
    _perturb(adapted)
    with varbnn.sample_mode(adapted, "mean"):
        assert torch.allclose(merge_adapters(adapted)(x), adapted(x), atol=1e-5)
    assert [tuple(p.shape) for p in adapted[0].parameters() if p.requires_grad] == [(6, 2, 1, 1), (2, 3, 3, 3), (2, 3, 3, 3)]


def test_include_patterns_types_exclude_and_shared_modules() -> None:
    shared = nn.Linear(4, 4)
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 4), shared), shared, nn.Linear(4, 2))
    adapted = add_adapters(model, rank=2, include="0.*")
    assert isinstance(adapted[0][0], LoRALinear) and adapted[0][1] is adapted[1]  # one adapter, both places
    assert not isinstance(adapted[2], LoRALayer)
    assert len(list(adapter_parameters(adapted))) == 2 * 3
    assert not any(p.requires_grad for n, p in adapted.named_parameters() if n.startswith("2."))  # frozen, not adapted
    kept = add_adapters(model, rank=2, exclude="0")
    assert isinstance(kept[2], LoRALinear) and not isinstance(kept[0][0], LoRALayer)
    assert sum(isinstance(m, LoRALayer) for m in add_adapters(model, rank=2).modules()) == 3
    same = add_adapters(model, rank=2, inplace=True)
    assert same is model and isinstance(model[2], LoRALinear)


def test_a_callable_prior_gets_the_qualified_name() -> None:
    seen: list[str] = []

    def prior(name: str) -> varbnn.priors.Normal:
        seen.append(name)
        return varbnn.priors.Normal(0.0, 0.5)

    add_adapters(_mlp(), rank=2, include="2", prior=prior, bayesian="both")
    assert seen == ["2.lora_A", "2.lora_B"]


def test_warnings_only_where_due() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        add_adapters(_mlp(), rank=2)


def _twice() -> nn.Module:
    return add_adapters(add_adapters(_mlp(), rank=2, include="0"), rank=2)


BAD_INPUTS = [
    BadInput("no matching layer", lambda: add_adapters(_mlp(), include="encoder.*.q_proj"), ValueError,
             r"no layer matches include=\['encoder\.\*\.q_proj'\].*layers are: 0, 2, 4"),
    BadInput("rank 0", lambda: add_adapters(_mlp(), rank=0), ValueError, r"rank must be an int >= 1, got 0"),
    BadInput("rank above min(in, out)", lambda: add_adapters(_mlp(), rank=7), ValueError,
             r"rank must be an int in \[1, 6\] for '0'"),
    BadInput("rank a float", lambda: add_adapters(_mlp(), rank=2.0), TypeError, r"rank must be an int"),
    BadInput("alpha 0", lambda: add_adapters(_mlp(), alpha=0.0), ValueError, r"alpha must be a finite number > 0"),
    BadInput("alpha negative", lambda: add_adapters(_mlp(), alpha=-1), ValueError, r"alpha must be a finite number > 0"),
    BadInput("adapters twice", _twice, ValueError, r"'0' already has an adapter"),
    BadInput("already Bayesian", lambda: add_adapters(varbnn.bayesianize(_mlp()), include="2"), ValueError,
             r"'2' is already Bayesian \(BayesLinear\)"),
    BadInput("bayesianized model, default include", lambda: add_adapters(varbnn.bayesianize(_mlp())), ValueError,
             r"no layer matches"),
    BadInput("bayesian", lambda: add_adapters(_mlp(), bayesian="a"), ValueError,
             r"bayesian must be one of \('A', 'B', 'both'\)"),
    BadInput("init", lambda: add_adapters(_mlp(), init="zeros"), ValueError, r"init must be one of \('lora', 'gaussian'\)"),
    BadInput("family a class", lambda: add_adapters(_mlp(), family=varbnn.MeanField), TypeError,
             r"family must be a varbnn VariationalFamily"),
    BadInput("exclude typo", lambda: add_adapters(_mlp(), exclude="9"), ValueError, r"exclude pattern '9' matches no module"),
    BadInput("include a type without adapters", lambda: add_adapters(_mlp(), include=nn.Conv1d), ValueError,
             r"include type Conv1d cannot be adapted; adaptable: nn.Linear, nn.Conv2d"),
    BadInput("include a number", lambda: add_adapters(_mlp(), include=3), TypeError, r"include must hold name patterns"),
    BadInput("grouped convolution", lambda: add_adapters(nn.Conv2d(4, 4, 3, groups=2), rank=2, include=nn.Conv2d), ValueError,
             r"groups=2.*only groups=1 with zero padding"),
    BadInput("model not a module", lambda: add_adapters("model"), TypeError, r"model must be an nn.Module"),  # type: ignore[arg-type]
    BadInput("merge without adapters", lambda: merge_adapters(_mlp()), ValueError, r"has no adapters"),
    BadInput("merge mode", lambda: merge_adapters(add_adapters(_mlp(), rank=2), mode="median"), ValueError,
             r"mode must be 'mean' or 'mode'"),
    BadInput("state dict without adapters", lambda: adapter_state_dict(_mlp()), ValueError, r"has no adapters"),
    BadInput("LoRALinear of a conv", lambda: LoRALinear(nn.Conv2d(2, 2, 1)), TypeError,  # type: ignore[arg-type]
             r"base must be an nn.Linear"),
]  # fmt: skip


@pytest.mark.parametrize("case", params(BAD_INPUTS))
def test_bad_inputs(case: BadInput) -> None:
    check(case)


def test_refusals_leave_an_inplace_model_untouched() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 3))
    with pytest.raises(ValueError, match=r"rank must be an int in \[1, 3\] for '1'"):
        add_adapters(model, rank=4, inplace=True)
    assert all(isinstance(m, nn.Linear) for m in model) and all(p.requires_grad for p in model.parameters())


def _a_scale(layer: LoRALayer, name: str = "lora_A") -> torch.Tensor:
    with torch.no_grad():
        return layer.posteriors[name].scale


def test_std_scale_sets_a_posterior_std_relative_to_the_fan_in() -> None:
    """``std_scale=s``: A's initial std is s / sqrt(fan_in) of each layer (Linear: in_features; Conv2d: in_channels
    * kh * kw; attention: embed_dim); B keeps MeanField's 1e-2; the default (None) is MeanField()'s 1e-2."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.Linear(8 * 4 * 4, 16), nn.ReLU(), nn.Linear(16, 4))
    model = add_adapters(net, rank=2, include=[nn.Linear, nn.Conv2d], std_scale=0.5, bayesian="both")
    for index, fan_in in [(0, 3 * 3 * 3), (2, 128), (4, 16)]:
        torch.testing.assert_close(_a_scale(model[index]), torch.full_like(_a_scale(model[index]), 0.5 / fan_in**0.5))
        torch.testing.assert_close(_a_scale(model[index], "lora_B"), torch.full_like(_a_scale(model[index], "lora_B"), 1e-2))
    attention = add_adapters(nn.MultiheadAttention(32, 4), rank=2, include=nn.MultiheadAttention, std_scale=2.0)
    torch.testing.assert_close(_a_scale(attention), torch.full_like(_a_scale(attention), 2.0 / 32**0.5))
    default = add_adapters(net, rank=2, include=[nn.Linear, nn.Conv2d])  # MeanField()'s 1e-2 everywhere
    assert all(torch.allclose(_a_scale(default[i]), torch.tensor(1e-2)) for i in (0, 2, 4))
    with pytest.raises(ValueError, match=r"std_scale sets the default family's initial std of A; pass it or a family"):
        add_adapters(net, std_scale=0.5, family=varbnn.MeanField())
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match=r"std_scale must be a finite number > 0"):
            add_adapters(net, std_scale=bad)
    with pytest.raises(ValueError, match=r"std_scale=1000000.0 gives A \(fan_in 128\) the initial std 88388.3, outside"):
        add_adapters(net, include="2", std_scale=1e6)
    with pytest.raises(ValueError, match=r"LoRALinear: std_scale sets"):
        LoRALinear(nn.Linear(4, 4), 2, family=varbnn.MeanField(), std_scale=1.0)


def test_a_model_that_is_one_layer() -> None:
    layer = nn.Linear(5, 3)
    adapted = add_adapters(layer, rank=2)
    assert isinstance(adapted, LoRALinear) and adapted.base is not layer
    x = torch.randn(4, 5)
    assert torch.equal(adapted(x), layer(x))
    _perturb(adapted)
    with varbnn.sample_mode(adapted, "mean"):
        assert torch.allclose(merge_adapters(adapted)(x), adapted(x), atol=1e-6)
    with pytest.raises(ValueError, match="the model already has an adapter"):
        add_adapters(adapted, rank=2)
