"""Issue 65 part 2: attention inside ``bayesianize``.

``nn.MultiheadAttention`` becomes a :class:`varbnn.nn.BayesMultiheadAttention` (every projection random), the
transformer encoder layers and stacks are walked into (attention and Linear layers converted) with torch's fused
eval-mode fast path switched off where they hold a Bayesian module, and :func:`varbnn.to_deterministic` maps back.
Oracles: at the posterior mean (``pretrained=True``) and with the Delta family the converted module computes what the
plain one computes; the plain one in training mode with dropout 0 is the hand computation of the regular path.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrizations

import varbnn
from varbnn import BayesLinear, ConversionWarning, Delta, MeanField
from varbnn.nn import BayesMultiheadAttention

ATOL = 1e-6


def quiet_bayesianize(model: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``bayesianize`` that fails on any warning (every module here has a Bayesian form)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return varbnn.bayesianize(model, *args, **kwargs)


def encoder(layers: int = 2, batch_first: bool = True, nested: bool = True) -> nn.TransformerEncoder:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=batch_first)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's note on enable_nested_tensor with batch_first=False
        return nn.TransformerEncoder(layer, layers, enable_nested_tensor=nested)


def padding_mask() -> torch.Tensor:
    """Batch of 3, length 5, right-padded (left aligned: what the nested-tensor path of torch's encoder takes)."""
    return torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])


# -- BayesMultiheadAttention --------------------------------------------------------------------------------


def test_bayesianize_attention_has_random_tensors_and_its_kl_is_the_sum_of_the_families_kls():
    plain = nn.MultiheadAttention(16, 2)
    bayes, report = quiet_bayesianize(plain, report=True)
    assert isinstance(bayes, BayesMultiheadAttention) and list(bayes.parameters())[0] is not plain.in_proj_weight
    assert bayes.tensor_names() == ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]
    expected = sum(q.kl(p) for _, q, p in bayes.bayesian_tensors())
    assert torch.allclose(varbnn.kl(bayes), expected) and torch.allclose(bayes.kl(), expected)
    assert report.converted[0].num_random_tensors == 4
    assert report.converted[0].num_weights == sum(p.numel() for p in plain.parameters())


def test_prior_callables_see_torchs_parameter_names():
    seen: list[str] = []

    def prior(name: str) -> varbnn.priors.Normal:
        seen.append(name)
        return varbnn.priors.Normal(0.0, 1.0)

    model = nn.Sequential(nn.MultiheadAttention(4, 2, add_bias_kv=True))
    quiet_bayesianize(model, prior=prior)
    assert seen == ["0.in_proj_weight", "0.in_proj_bias", "0.out_proj.weight", "0.out_proj.bias", "0.bias_k", "0.bias_v"]


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("variant", ["packed", "separate-kv-bias-kv"])
def test_pretrained_mean_equals_the_original_attention(batch_first: bool, training: bool, variant: str) -> None:
    torch.manual_seed(1)
    separate = variant != "packed"
    kdim = 6 if separate else None
    plain = nn.MultiheadAttention(16, 2, batch_first=batch_first, kdim=kdim, vdim=kdim, add_bias_kv=separate)
    bayes = quiet_bayesianize(plain, pretrained=True)
    plain.train(training), bayes.train(training)
    query, memory = torch.randn(3, 5, 16), torch.randn(3, 4, kdim or 16)
    if not separate:
        memory = query  # self-attention: what torch's own eval fast path takes
    if not batch_first:
        query, memory = query.transpose(0, 1), memory.transpose(0, 1)
    length = 4 if separate else 5
    masks: list[dict[str, Any]] = [
        {},
        {"attn_mask": torch.triu(torch.ones(5, length, dtype=torch.bool), 1)},
        {"key_padding_mask": torch.tensor([[False] * length, [False] * (length - 1) + [True], [False] * length])},
        {"need_weights": False, "attn_mask": nn.Transformer.generate_square_subsequent_mask(5), "is_causal": True}
        if not separate
        else {"average_attn_weights": False},
    ]
    with torch.no_grad(), varbnn.sample_mode(bayes, "mean"):
        for kwargs in masks:
            expected, expected_weights = plain(query, memory, memory, **kwargs)
            got, got_weights = bayes(query, memory, memory, **kwargs)
            assert got.shape == expected.shape and torch.allclose(got, expected, atol=ATOL), kwargs
            if expected_weights is None:
                assert got_weights is None
            else:
                assert torch.allclose(got_weights, expected_weights, atol=ATOL), kwargs


def test_delta_family_gives_exactly_the_deterministic_forward():
    torch.manual_seed(2)
    plain = nn.MultiheadAttention(8, 2, batch_first=True)
    bayes = quiet_bayesianize(plain, Delta())
    x = torch.randn(2, 5, 8)
    assert torch.equal(bayes(x, x, x)[0], plain(x, x, x)[0])  # sample_mode "sample": the point itself
    stack = encoder()
    converted = quiet_bayesianize(stack, Delta())
    stack.train(), converted.train()  # dropout is 0: the regular path in both
    z = torch.randn(3, 5, 8)
    assert torch.equal(converted(z), stack(z))


def test_draws_differ_in_eval_mode():
    plain = nn.MultiheadAttention(8, 2, batch_first=True)
    bayes = quiet_bayesianize(plain).eval()
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        assert not torch.allclose(bayes(x, x, x)[0], bayes(x, x, x)[0])


def test_local_reparameterization_is_refused_with_the_estimators_allowed():
    with pytest.raises(ValueError, match=r"estimator='local'.*attention.*allowed there: \['reparam', 'graves'\]"):
        varbnn.bayesianize(nn.MultiheadAttention(4, 2), MeanField(estimator="local"))
    with pytest.raises(ValueError, match="embed_dim \\(6\\) must be divisible by num_heads \\(4\\)"):
        BayesMultiheadAttention(6, 4)
    with pytest.raises(ValueError, match="init names no tensor.*'out_proj.weight'"):
        BayesMultiheadAttention(4, 2, init={"weight": torch.zeros(4, 4)})


def test_an_attention_whose_out_proj_is_parametrized_is_left_whole_and_warned_about():
    plain = nn.MultiheadAttention(4, 2)
    parametrizations.weight_norm(plain.out_proj)
    with pytest.warns(ConversionWarning, match="MultiheadAttention x1 \\(parametrized: out_proj 'weight'"):
        bayes = varbnn.bayesianize(nn.Sequential(plain))
    assert type(bayes[0]) is nn.MultiheadAttention


# -- transformer encoder layers and stacks ------------------------------------------------------------------


def test_transformer_encoder_is_converted_and_reported():
    stack = encoder()
    bayes, report = quiet_bayesianize(stack, report=True, strict=True)
    plain_types = (nn.Linear, nn.MultiheadAttention)
    assert not [name for name, m in bayes.named_modules() if isinstance(m, plain_types)]
    own = {id(p) for m in bayes.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()}
    random = {id(p) for m in bayes.modules() if isinstance(m, varbnn.BayesianModule) for p in m.parameters()}
    assert all(id(p) in own | random for p in bayes.parameters())  # every Linear / attention weight is random
    attention = {c.name: c for c in report.converted if c.source_type == "MultiheadAttention"}
    assert set(attention) == {"layers.0.self_attn", "layers.1.self_attn"}
    assert all(c.bayesian_type == "BayesMultiheadAttention" and c.num_random_tensors == 4 for c in attention.values())
    text = str(report)
    assert "layers.1.self_attn  MultiheadAttention -> BayesMultiheadAttention  4" in text
    assert "left whole" not in text and "16 random tensors" in report.summary()
    assert report.num_random_tensors == 16


@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")  # torch: vmap over CPU attention
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
@pytest.mark.parametrize("mask", [False, True])
def test_eval_mode_takes_the_regular_path_with_drawn_weights(mask: bool) -> None:
    """Without gradients in eval mode torch's encoder would take its fused fast path (and, with a padding mask, the
    nested-tensor path), reading plain weights: converted, two draws differ and the mean is the regular path's
    hand computation (the plain stack in training mode, dropout 0)."""
    stack = encoder()
    bayes = quiet_bayesianize(stack, pretrained=True).eval()
    x = torch.randn(3, 5, 8)
    kwargs = {"src_key_padding_mask": padding_mask()} if mask else {}
    with torch.no_grad():
        first, second = bayes(x, **kwargs), bayes(x, **kwargs)
        assert not torch.allclose(first, second)
        draws = varbnn.predict(bayes, x, samples=2) if not mask else torch.stack([first, second])
        assert not torch.allclose(draws[0], draws[1])
        with varbnn.sample_mode(bayes, "mean"):
            at_mean = bayes(x, **kwargs)
        hand = stack.train()(x, **kwargs)
    assert torch.allclose(at_mean, hand, atol=ATOL)


def test_an_excluded_attention_next_to_bayesian_linear_layers_still_runs_in_eval_mode():
    """The fast path reads linear1.weight too: it is switched off whenever the layer holds a Bayesian module."""
    stack = encoder(layers=1)
    bayes = quiet_bayesianize(stack, exclude=[nn.MultiheadAttention]).eval()
    assert isinstance(bayes.layers[0].linear1, BayesLinear) and type(bayes.layers[0].self_attn) is nn.MultiheadAttention
    x = torch.randn(3, 5, 8)
    with torch.no_grad():
        assert not torch.allclose(bayes(x), bayes(x))
        assert bayes(x, src_key_padding_mask=padding_mask()).shape == x.shape


def test_fit_on_a_toy_sequence_task_decreases_the_loss():
    """Class = whether the first token's feature 0 is positive, read at the last position through attention."""
    torch.manual_seed(3)
    x = torch.randn(64, 5, 8)
    y = (x[:, 0, 0] > 0).long()
    model = nn.Sequential(encoder(layers=2), nn.Flatten(), nn.Linear(40, 2))
    bayes = quiet_bayesianize(model)
    optimizer = torch.optim.Adam(bayes.parameters(), lr=1e-2)
    losses = []
    for _ in range(60):
        optimizer.zero_grad()
        loss = F.cross_entropy(bayes(x), y) + varbnn.kl(bayes) / 10_000
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5, losses[::10]
    grads = [p.grad for m in bayes.modules() if isinstance(m, BayesMultiheadAttention) for p in m.parameters()]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")  # torch's own fast path, back
@pytest.mark.parametrize("batch_first", [True, False])
def test_to_deterministic_round_trip_gives_the_original_outputs(batch_first: bool) -> None:
    stack = encoder(batch_first=batch_first)
    plain = varbnn.to_deterministic(quiet_bayesianize(stack, pretrained=True))
    assert not [m for m in plain.modules() if isinstance(m, varbnn.BayesianModule)]
    assert type(plain.layers[0].self_attn) is nn.MultiheadAttention and plain.use_nested_tensor is stack.use_nested_tensor
    assert plain.layers[0].activation_relu_or_gelu == stack.layers[0].activation_relu_or_gelu == 1
    assert "_varbnn_fast_path" not in plain.layers[0].__dict__
    x = torch.randn(3, 5, 8) if batch_first else torch.randn(5, 3, 8)
    stack.eval(), plain.eval()
    with torch.no_grad():
        for kwargs in ({}, {"src_key_padding_mask": padding_mask()}):
            assert torch.allclose(plain(x, **kwargs), stack(x, **kwargs), atol=ATOL)  # the fast paths are back
    separate = nn.MultiheadAttention(8, 2, kdim=3, vdim=5, add_bias_kv=True, batch_first=True)
    back = varbnn.to_deterministic(quiet_bayesianize(separate))
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 6, 3), torch.randn(2, 6, 5)
    assert back.kdim == 3 and back.vdim == 5 and back.bias_k is not None
    assert torch.allclose(back(q, k, v)[0], separate(q, k, v)[0], atol=ATOL)


def test_decoder_layer_attentions_are_converted():
    torch.manual_seed(4)
    decoder = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    bayes = quiet_bayesianize(decoder, pretrained=True).eval()
    assert isinstance(bayes.self_attn, BayesMultiheadAttention) and isinstance(bayes.multihead_attn, BayesMultiheadAttention)
    target, memory = torch.randn(2, 4, 8), torch.randn(2, 6, 8)
    with torch.no_grad():
        assert not torch.allclose(bayes(target, memory), bayes(target, memory))
        with varbnn.sample_mode(bayes, "mean"):
            assert torch.allclose(bayes(target, memory), decoder.eval()(target, memory), atol=ATOL)
    back = varbnn.to_deterministic(bayes)
    with torch.no_grad():
        assert torch.allclose(back(target, memory), decoder(target, memory), atol=ATOL)


def test_huggingface_conv1d_is_converted_once_transformers_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPT-2's ``Conv1D`` (``y = x W + b``, ``W`` of shape (in, out)) becomes a BayesLinear with ``W^T`` as its mean;
    registered from ``sys.modules`` (no class-name matching, nothing imported by varbnn). A stand-in module with the
    class's contract checks the mechanism here, where ``transformers`` is not installed."""
    import sys
    import types

    from varbnn.convert import registry
    from varbnn.convert.report import ConversionWarning

    class Conv1D(nn.Module):  # transformers.pytorch_utils.Conv1D's contract
        def __init__(self, nf: int, nx: int) -> None:
            super().__init__()
            self.nf = nf
            self.weight = nn.Parameter(torch.randn(nx, nf))
            self.bias = nn.Parameter(torch.randn(nf))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(*x.shape[:-1], self.nf)

    fake = types.ModuleType("transformers.pytorch_utils")
    fake.Conv1D = Conv1D  # type: ignore[attr-defined]
    model = nn.Sequential(Conv1D(6, 4), nn.ReLU(), Conv1D(2, 6))
    with pytest.warns(ConversionWarning, match="Conv1D x2 \\(no Bayesian form registered\\)"):
        _, report = varbnn.bayesianize(model, report=True)
    assert not report.converted  # before transformers is imported: not registered
    monkeypatch.setitem(sys.modules, "transformers.pytorch_utils", fake)
    try:
        bayes, report = varbnn.bayesianize(model, report=True)
        assert [c.name for c in report.converted] == ["0", "2"]
        assert isinstance(bayes[0], varbnn.BayesLinear) and (bayes[0].in_features, bayes[0].out_features) == (4, 6)
        x = torch.randn(3, 5, 4)
        with torch.no_grad(), varbnn.sample_mode(bayes, "mean"):
            assert torch.allclose(bayes(x), model(x), atol=ATOL)
        with torch.no_grad():
            assert torch.allclose(varbnn.to_deterministic(bayes)(x), model(x), atol=ATOL)
    finally:
        registry._CONVERTERS.pop(Conv1D, None)


def test_huggingface_models_are_optional():
    """``transformers`` is an optional extra; its ``nn.Linear`` projections (BERT-style models) are converted like any
    other, and GPT-2's ``Conv1D`` once ``transformers`` is imported."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
    )
    model = transformers.BertModel(config)
    bayes, report = varbnn.bayesianize(model, report=True)
    assert any(c.name.endswith("attention.self.query") for c in report.converted)
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(vocab_size=20, n_positions=8, n_embd=8, n_layer=1, n_head=2))
    _, report = varbnn.bayesianize(gpt2, report=True)
    assert any(c.name.endswith("attn.c_attn") for c in report.converted)  # a Conv1D
