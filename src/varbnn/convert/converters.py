"""The built-in converters: ``nn.Linear``, ``nn.Conv1d``/``Conv2d``/``Conv3d``, ``nn.Embedding``, ``nn.LSTM``,
``nn.GRU`` and ``nn.MultiheadAttention`` to their Bayesian layers, the plain weights copied into the posterior means
when ``pretrained``.

An option of these types that has no Bayesian form is refused with :meth:`ConversionContext.refuse`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from varbnn.convert.registry import ConversionContext, register_converter
from varbnn.nn.attention import BayesMultiheadAttention
from varbnn.nn.layers import BayesConv1d, BayesConv2d, BayesConv3d, BayesEmbedding, BayesGRU, BayesLinear, BayesLSTM, _BayesConvNd


def _weights(module: nn.Module, names: Iterable[str], pretrained: bool) -> dict[str, torch.Tensor]:
    """CPU copies of the plain tensors to start the posterior means from (the layer is built on the CPU and then put
    where the plain module was); none for a tensor on the meta device (no values: the layer's own initialisation)."""
    if not pretrained:
        return {}
    tensors = {n: getattr(module, n, None) for n in names}
    return {n: t.detach().to("cpu", copy=True) for n, t in tensors.items() if t is not None and not t.is_meta}


@register_converter(nn.Linear)
def _linear(module: nn.Module, ctx: ConversionContext) -> nn.Module:
    assert isinstance(module, nn.Linear)
    init = _weights(module, ("weight", "bias"), ctx.pretrained)
    return BayesLinear(
        module.in_features, module.out_features, module.bias is not None,
        init_weight=init.get("weight"), init_bias=init.get("bias"), **ctx.layer_kwargs(),
    )  # fmt: skip


_BAYES_CONV: dict[int, type[_BayesConvNd]] = {1: BayesConv1d, 2: BayesConv2d, 3: BayesConv3d}


@register_converter(nn.Conv1d)
@register_converter(nn.Conv2d)
@register_converter(nn.Conv3d)
def _conv(module: nn.Module, ctx: ConversionContext) -> nn.Module:
    assert isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d))
    if module.padding_mode != "zeros":
        raise ctx.refuse(f"{type(module).__name__} padding_mode={module.padding_mode!r} is not supported (only 'zeros')")
    init = _weights(module, ("weight", "bias"), ctx.pretrained)
    return _BAYES_CONV[len(module.kernel_size)](
        module.in_channels, module.out_channels, module.kernel_size, module.stride, module.padding,  # type: ignore[arg-type]
        module.dilation, module.groups, module.bias is not None,
        init_weight=init.get("weight"), init_bias=init.get("bias"), **ctx.layer_kwargs(),
    )  # fmt: skip


@register_converter(nn.Embedding)
def _embedding(module: nn.Module, ctx: ConversionContext) -> nn.Module:
    assert isinstance(module, nn.Embedding)
    if module.max_norm is not None:
        raise ctx.refuse("Embedding max_norm (an in-place renormalisation of the table) has no Bayesian form")
    if module.sparse:
        raise ctx.refuse("Embedding sparse=True is not supported (the gradient reaches the posterior densely)")
    init = _weights(module, ("weight",), ctx.pretrained)
    return BayesEmbedding(
        module.num_embeddings, module.embedding_dim, module.padding_idx, module.scale_grad_by_freq,
        family=ctx.family, prior=ctx.prior, init_weight=init.get("weight"),
    )  # fmt: skip


@register_converter(nn.LSTM)
@register_converter(nn.GRU)
def _recurrent(module: nn.Module, ctx: ConversionContext) -> nn.Module:
    assert isinstance(module, (nn.LSTM, nn.GRU))
    kind = type(module).__name__
    if module.bidirectional or module.proj_size:
        raise ctx.refuse(f"bidirectional {kind}s and proj_size > 0 are not supported by Bayes{kind}")
    names = [n for n, _ in module.named_parameters()]
    layer_type = BayesLSTM if isinstance(module, nn.LSTM) else BayesGRU
    return layer_type(
        module.input_size, module.hidden_size, module.num_layers, module.bias, module.batch_first, module.dropout,
        init=_weights(module, names, ctx.pretrained), **ctx.layer_kwargs(),
    )  # fmt: skip


@register_converter(nn.MultiheadAttention)
def _attention(module: nn.Module, ctx: ConversionContext) -> nn.Module:
    """Every projection tensor random (packed or separate q/k/v, biases, ``bias_k``/``bias_v``), with torch's names."""
    assert isinstance(module, nn.MultiheadAttention)
    named = dict(module.named_parameters())
    bias = module.in_proj_bias is not None or module.out_proj.bias is not None
    init = {n: t.detach().to("cpu", copy=True) for n, t in named.items() if ctx.pretrained and not t.is_meta}
    if ctx.pretrained and bias:  # one bias without the other: the missing one is zero, as it acts
        for name, size in (("in_proj_bias", 3 * module.embed_dim), ("out_proj.bias", module.embed_dim)):
            if name not in named:
                init[name] = torch.zeros(size)
    return BayesMultiheadAttention(
        module.embed_dim, module.num_heads, module.dropout, bias, module.bias_k is not None, module.add_zero_attn,
        module.kdim, module.vdim, module.batch_first, init=init, **ctx.layer_kwargs(),
    )  # fmt: skip
