"""Back to plain modules: the built-in deterministic forms (``BayesLinear`` -> ``nn.Linear``, the convolutions,
``BayesEmbedding``, ``BayesLSTM``/``BayesGRU``, ``BayesMultiheadAttention`` -> ``nn.MultiheadAttention``), registered
with :func:`register_deterministic`, and :func:`to_deterministic`, which exports a Bayesian model's posterior mean or
mode as a plain model (and gives torch's transformer encoders back the fused fast path ``bayesianize`` switched off).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from varbnn.convert.fastpath import restore_fast_paths
from varbnn.convert.placement import _carry_hooks
from varbnn.convert.registry import _DETERMINIZERS, _lookup, register_deterministic
from varbnn.nn.attention import BayesMultiheadAttention
from varbnn.nn.base import BayesianModule
from varbnn.nn.layers import BayesEmbedding, BayesLinear, BayesLSTM, _BayesConvNd, _BayesRNN


@register_deterministic(BayesLinear)
def _det_linear(module: nn.Module, mode: str) -> nn.Module:
    assert isinstance(module, BayesLinear)
    plain = nn.Linear(module.in_features, module.out_features, "bias" in module.posteriors)
    _copy_point(module, plain, mode)
    return plain


_PLAIN_CONV: dict[int, type[nn.Module]] = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}


@register_deterministic(_BayesConvNd)
def _det_conv(module: nn.Module, mode: str) -> nn.Module:
    assert isinstance(module, _BayesConvNd)
    plain = _PLAIN_CONV[module.dim](
        module.in_channels,
        module.out_channels,
        module.kernel_size,
        module.stride,
        module.padding,
        module.dilation,
        module.groups,
        "bias" in module.posteriors,
    )
    _copy_point(module, plain, mode)
    return plain


@register_deterministic(BayesEmbedding)
def _det_embedding(module: nn.Module, mode: str) -> nn.Module:
    assert isinstance(module, BayesEmbedding)
    plain = nn.Embedding(
        module.num_embeddings, module.embedding_dim, module.padding_idx, scale_grad_by_freq=module.scale_grad_by_freq
    )
    _copy_point(module, plain, mode)
    if module.padding_row is not None:
        with torch.no_grad():
            plain.weight[module.padding_idx].copy_(module.padding_row)
    return plain


@register_deterministic(_BayesRNN)
def _det_recurrent(module: nn.Module, mode: str) -> nn.Module:
    assert isinstance(module, _BayesRNN)
    plain_type = nn.LSTM if isinstance(module, BayesLSTM) else nn.GRU
    plain = plain_type(module.input_size, module.hidden_size, module.num_layers, module.bias, module.batch_first, module.dropout)
    _copy_point(module, plain, mode)
    return plain


@register_deterministic(BayesMultiheadAttention)
def _det_attention(module: nn.Module, mode: str) -> nn.Module:
    assert isinstance(module, BayesMultiheadAttention)
    names = module.tensor_names()
    bias = "in_proj_bias" in names or "out_proj.bias" in names
    plain = nn.MultiheadAttention(
        module.embed_dim, module.num_heads, module.dropout, bias, "bias_k" in names, module.add_zero_attn,
        module.kdim, module.vdim, module.batch_first,
    )  # fmt: skip
    reference = next(module.parameters())
    plain.to(device=reference.device, dtype=reference.dtype)
    with torch.no_grad():
        if bias:  # a bias the Bayesian layer does not have acts as zero
            for name in ("in_proj_bias", "out_proj.bias"):
                plain.get_parameter(name).zero_()
        for name, (_, posterior, _) in zip(names, module.bayesian_tensors()):
            plain.get_parameter(name).copy_(posterior.mean if mode == "mean" else posterior.mode)
    return plain


def _copy_point(bayes: BayesianModule, plain: nn.Module, mode: str) -> None:
    reference = next(bayes.parameters())
    plain.to(device=reference.device, dtype=reference.dtype)
    with torch.no_grad():
        for name, posterior, _ in bayes.bayesian_tensors():
            point = posterior.mean if mode == "mean" else posterior.mode
            getattr(plain, name).copy_(point)


def to_deterministic(model: nn.Module, mode: str = "mean") -> nn.Module:
    """A NEW plain model whose weights are the posterior ``"mean"`` or ``"mode"`` of each Bayesian layer.

    The model is deep-copied (the Bayesian one is not modified) and each Bayesian layer is replaced by the plain
    layer of its registered form (:func:`register_deterministic`: ``BayesLinear`` -> ``nn.Linear``, ...). The result
    runs as fast as the original network, with Graves' (2011, section 6) MAP approximation ``p(y | x, w*)`` for
    ``"mode"``. A Bayesian module used at several places becomes one plain module used at the same places; forward
    and backward hooks move to the plain module. A Bayesian module with no registered form raises
    ``NotImplementedError``.
    """
    if mode not in ("mean", "mode"):
        raise ValueError(f"mode must be 'mean' or 'mode', got {mode!r}")
    new = copy.deepcopy(model)
    root = _lookup(_DETERMINIZERS, new)
    if root is not None:  # the model is one Bayesian layer
        plain_root: nn.Module = root(new, mode)
        _carry_hooks(new, plain_root)
        return plain_root

    done: dict[int, tuple[nn.Module, nn.Module]] = {}  # id(module) -> (it, its replacement): a shared one stays shared

    def convert(parent: nn.Module) -> None:
        for child_name, child in list(parent._modules.items()):
            if child is None:
                continue
            if id(child) in done and done[id(child)][0] is child:
                setattr(parent, child_name, done[id(child)][1])
                continue
            fn = _lookup(_DETERMINIZERS, child)
            if fn is None:
                convert(child)
                done[id(child)] = (child, child)
            else:
                plain = fn(child, mode)
                _carry_hooks(child, plain)
                done[id(child)] = (child, plain)
                setattr(parent, child_name, plain)

    convert(new)
    restore_fast_paths(new)
    leftover = [n for n, m in new.named_modules() if isinstance(m, BayesianModule)]
    if leftover:
        raise NotImplementedError(f"no deterministic form registered for Bayesian modules {leftover}")
    return new
