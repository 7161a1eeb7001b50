"""The built-in converters: ``nn.Linear``, ``nn.Conv1d``/``Conv2d``/``Conv3d``, ``nn.Embedding``, ``nn.LSTM``,
``nn.GRU`` and ``nn.MultiheadAttention`` to their Bayesian layers, the plain weights copied into the posterior means
when ``pretrained``; and HuggingFace ``transformers``' ``Conv1D`` (GPT-2's projections, ``y = x W + b`` with ``W`` of
shape ``(in, out)``) to :class:`~varbnn.BayesLinear`, registered by :func:`register_optional_converters` once
``transformers`` is imported (an optional extra: varbnn never imports it).

An option of these types that has no Bayesian form is refused with :meth:`ConversionContext.refuse`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

import torch
from torch import nn

from varbnn.convert.registry import _CONVERTERS, ConversionContext, register_converter
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


def _huggingface_conv1d(module: nn.Module, ctx: ConversionContext) -> nn.Module:
    """``transformers``' ``Conv1D(nf, nx)``: ``y = x W + b``, ``W`` of shape ``(nx, nf)``: a BayesLinear with ``W^T`` as
    its weight mean (``to_deterministic`` gives an ``nn.Linear``, which computes the same)."""
    weight = module.weight
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ctx.refuse(f"a Conv1D whose weight is not a matrix ({type(weight).__name__}) has no Bayesian form")
    in_features, out_features = weight.shape
    bias = getattr(module, "bias", None)
    init = _weights(module, ("weight", "bias"), ctx.pretrained)
    return BayesLinear(
        int(in_features), int(out_features), bias is not None,
        init_weight=init["weight"].T.contiguous() if "weight" in init else None, init_bias=init.get("bias"),
        **ctx.layer_kwargs(),
    )  # fmt: skip


def register_optional_converters() -> None:
    """Register the converters of optional libraries that the process has imported: ``transformers``' ``Conv1D``
    (looked up in ``sys.modules``; nothing is imported here). :func:`~varbnn.convert.bayesianize` calls it first."""
    utils = sys.modules.get("transformers.pytorch_utils")
    conv1d = getattr(utils, "Conv1D", None) if utils is not None else None
    if isinstance(conv1d, type) and issubclass(conv1d, nn.Module) and conv1d not in _CONVERTERS:
        register_converter(conv1d)(_huggingface_conv1d)
