"""A Bayesian multi-head attention: ``nn.MultiheadAttention`` with random projections.

Every projection tensor of torch's attention (``in_proj_weight``, or ``q_proj_weight``/``k_proj_weight``/
``v_proj_weight`` when the key and value sizes differ from ``embed_dim``; ``in_proj_bias``; ``out_proj.weight`` and
``out_proj.bias``; ``bias_k``/``bias_v`` with ``add_bias_kv``) is a random tensor with a posterior of the chosen
family. A forward pass draws each of them once (or takes the mean / mode under
:func:`~varbnn.nn.base.sample_mode`) and runs ``F.multi_head_attention_forward``, the function
``nn.MultiheadAttention.forward`` runs, with the same arguments and the same ``batch_first`` handling.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from varbnn.families.base import VariationalFamily
from varbnn.families.meanfield import MeanField
from varbnn.nn.base import BayesianModule, resolve_prior
from varbnn.priors import PriorSpec

__all__ = ["BayesMultiheadAttention", "multi_head_attention", "check_whole_weights"]

# The layer kind whose estimators draw whole weight tensors (reparam, graves): attention needs whole weights too, as
# local reparameterization and flipout draw the outputs of one weight-linear op, and attention is not one.
_WHOLE_WEIGHT_KIND = "lstm"
# torch's parameter name -> the key of its posterior ("." cannot be a key of an nn.ModuleDict)
_OUT_PROJ = {"out_proj.weight": "out_proj_weight", "out_proj.bias": "out_proj_bias"}


def _key(name: str) -> str:
    return _OUT_PROJ.get(name, name)


class BayesMultiheadAttention(BayesianModule):
    """Multi-head attention with random projections: a Bayesian ``nn.MultiheadAttention``.

    Arguments, call signature and return value ``(attn_output, attn_output_weights)`` as ``nn.MultiheadAttention``
    (``batch_first`` defaults to False, as torch's). The random tensors carry torch's parameter names
    (:meth:`tensor_names`); their posteriors sit in ``posteriors`` under the same names with ``"out_proj.weight"`` as
    ``"out_proj_weight"`` and ``"out_proj.bias"`` as ``"out_proj_bias"``; a prior callable is called with torch's
    names. Every forward pass draws each tensor once (one draw shared by the whole batch), so only estimators that draw
    whole weights are accepted (``"reparam"``, MeanField's ``"graves"``); ``"local"`` and ``"flipout"`` are refused
    with a ``ValueError``.

    The plain tensors of ``nn.MultiheadAttention`` (``in_proj_weight``, ``in_proj_bias``) read ``None`` here: the
    weights are random. torch's ``nn.TransformerEncoderLayer`` reads them to decide on its fused eval-mode fast path
    and, on ``None``, runs its regular path, which calls this module; :func:`varbnn.bayesianize` also switches that
    fast path off for every transformer layer that holds a Bayesian module.

    :param embed_dim: model dimension, as ``nn.MultiheadAttention``.
    :param num_heads: heads (``embed_dim`` must be divisible by it).
    :param dropout: dropout on the attention weights in training mode (default 0).
    :param bias: whether the input and output projections have (random) biases (default True).
    :param add_bias_kv: add the random biases ``bias_k`` and ``bias_v`` to the key and value sequences (default False).
    :param add_zero_attn: add a batch of zeros to the key and value sequences (default False).
    :param kdim: features of the keys (default ``embed_dim``).
    :param vdim: features of the values (default ``embed_dim``).
    :param batch_first: inputs and outputs are ``(batch, seq, feature)`` (default False, as torch's).
    :param family: posterior spec of the projection weights (default ``MeanField()``); built once per tensor.
    :param prior: prior of the weights (default ``Normal(0, 1)``): a shared ``Prior`` or a callable name -> Prior.
    :param bias_family: posterior spec of the biases (``in_proj_bias``, ``out_proj.bias``, ``bias_k``, ``bias_v``;
        default: ``family``).
    :param bias_prior: prior of the biases (default: ``prior``).
    :param init: initial posterior means by torch's parameter name (e.g. ``{"in_proj_weight": ...,
        "out_proj.weight": ...}``); the others start from ``nn.MultiheadAttention``'s own initialisation (Xavier-uniform
        projections, zero biases).
    """

    layer_kind = "attention"
    in_proj_weight: None = None
    """No plain tensor: the packed projection is random (see ``posteriors``)."""
    in_proj_bias: None = None
    """No plain tensor: the packed bias is random (see ``posteriors``)."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        *,
        family: VariationalFamily | None = None,
        prior: PriorSpec | None = None,
        bias_family: VariationalFamily | None = None,
        bias_prior: PriorSpec | None = None,
        init: dict[str, torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        for label, value in (("embed_dim", embed_dim), ("num_heads", num_heads), ("kdim", kdim), ("vdim", vdim)):
            if value is None and label in ("kdim", "vdim"):
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"BayesMultiheadAttention: {label} must be a positive integer, got {value!r}")
        if embed_dim % num_heads:
            raise ValueError(f"BayesMultiheadAttention: embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"BayesMultiheadAttention: dropout must be in [0, 1), got {dropout!r}")
        family = family if family is not None else MeanField()
        init = dict(init or {})
        unknown = sorted(set(init) - set(self._plain_names(embed_dim, kdim, vdim, bias, add_bias_kv)))
        if unknown:
            raise ValueError(
                f"BayesMultiheadAttention: init names no tensor of this attention: {unknown}; its tensors are "
                f"{self._plain_names(embed_dim, kdim, vdim, bias, add_bias_kv)}"
            )
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = float(dropout)
        self.batch_first = bool(batch_first)
        self.add_zero_attn = bool(add_zero_attn)
        # torch's own initialisation for the tensors that init does not give (a plain attention of the same shape)
        missing = [n for n in self._plain_names(embed_dim, kdim, vdim, bias, add_bias_kv) if n not in init]
        if missing:
            plain = nn.MultiheadAttention(embed_dim, num_heads, 0.0, bias, add_bias_kv, False, kdim, vdim)
            parameters = dict(plain.named_parameters())
            init.update({n: parameters[n].detach() for n in missing})
        for name in self._plain_names(embed_dim, kdim, vdim, bias, add_bias_kv):
            is_bias = "bias" in name
            spec = bias_family if (is_bias and bias_family is not None) else family
            tensor_prior = bias_prior if (is_bias and bias_prior is not None) else prior
            start = init[name]
            self._add_tensor(_key(name), tuple(start.shape), spec, resolve_prior(tensor_prior, name), start)

    @staticmethod
    def _plain_names(embed_dim: int, kdim: int | None, vdim: int | None, bias: bool, add_bias_kv: bool) -> list[str]:
        same = (kdim is None or kdim == embed_dim) and (vdim is None or vdim == embed_dim)
        names = ["in_proj_weight"] if same else ["q_proj_weight", "k_proj_weight", "v_proj_weight"]
        if bias:
            names.append("in_proj_bias")
        names.append("out_proj.weight")
        if bias:
            names.append("out_proj.bias")
        if add_bias_kv:
            names += ["bias_k", "bias_v"]
        return names

    def tensor_names(self) -> list[str]:
        """torch's names of this layer's random tensors (``"in_proj_weight"``, ``"out_proj.weight"``, ...), in the
        order of ``posteriors``."""
        back = {v: k for k, v in _OUT_PROJ.items()}
        return [back.get(key, key) for key in self.posteriors]

    def _check_family(self, family: VariationalFamily) -> None:
        check_whole_weights(family)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(attn_output, attn_output_weights)`` as ``nn.MultiheadAttention.forward``, with every projection drawn
        once for this pass (or its mean / mode under ``sample_mode``); ``attn_output_weights`` is ``None`` with
        ``need_weights=False``."""
        drawn = {key_name: self._weight(key_name) for key_name in self.posteriors}
        return multi_head_attention(
            self, query, key, value, drawn, key_padding_mask=key_padding_mask, need_weights=need_weights,
            attn_mask=attn_mask, average_attn_weights=average_attn_weights, is_causal=is_causal,
        )  # fmt: skip

    def extra_repr(self) -> str:
        kv = "" if self._qkv_same_embed_dim else f", kdim={self.kdim}, vdim={self.vdim}"
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}{kv}, batch_first={self.batch_first}, {super().extra_repr()}"
        )


def multi_head_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    tensors: dict[str, torch.Tensor],
    *,
    key_padding_mask: torch.Tensor | None,
    need_weights: bool,
    attn_mask: torch.Tensor | None,
    average_attn_weights: bool,
    is_causal: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``nn.MultiheadAttention.forward``'s regular path with the projection ``tensors`` given (by the keys of
    :class:`BayesMultiheadAttention`'s posteriors: ``in_proj_weight`` or ``q/k/v_proj_weight``, ``in_proj_bias``,
    ``bias_k``, ``bias_v``, ``out_proj_weight``, ``out_proj_bias``; absent ones are ``None``): the masks made canonical,
    ``batch_first`` inputs transposed (keeping ``query is key is value``), then ``F.multi_head_attention_forward``.
    ``module`` gives ``embed_dim``, ``num_heads``, ``batch_first``, ``add_zero_attn``, ``dropout``, ``training`` and
    ``_qkv_same_embed_dim``; the name in errors is its class's."""
    is_batched = query.dim() == 3
    if query.dim() not in (2, 3) or query.shape[-1] != module.embed_dim:
        raise ValueError(
            f"{type(module).__name__}: query must be (L, {module.embed_dim}) or a batch of them, got {tuple(query.shape)}"
        )
    key_padding_mask = F._canonical_mask(
        mask=key_padding_mask,
        mask_name="key_padding_mask",
        other_type=F._none_or_dtype(attn_mask),
        other_name="attn_mask",
        target_type=query.dtype,
    )
    attn_mask = F._canonical_mask(
        mask=attn_mask, mask_name="attn_mask", other_type=None, other_name="", target_type=query.dtype, check_other=False
    )
    if module.batch_first and is_batched:  # as torch: keep "query is key is value" through the transpose
        if key is value:
            if query is key:
                query = key = value = query.transpose(1, 0)
            else:
                query, key = (x.transpose(1, 0) for x in (query, key))
                value = key
        else:
            query, key, value = (x.transpose(1, 0) for x in (query, key, value))
    attn_output, attn_output_weights = F.multi_head_attention_forward(
        query,
        key,
        value,
        module.embed_dim,  # type: ignore[arg-type]  # module: nn.Module (attention or its adapter)
        module.num_heads,  # type: ignore[arg-type]
        tensors.get("in_proj_weight"),  # type: ignore[arg-type]  # None with separate projections, as torch's
        tensors.get("in_proj_bias"),
        tensors.get("bias_k"),
        tensors.get("bias_v"),
        module.add_zero_attn,  # type: ignore[arg-type]
        module.dropout,  # type: ignore[arg-type]
        tensors["out_proj_weight"],
        tensors.get("out_proj_bias"),  # type: ignore[arg-type]  # None without bias, as torch's
        training=module.training,
        key_padding_mask=key_padding_mask,
        need_weights=need_weights,
        attn_mask=attn_mask,
        use_separate_proj_weight=not module._qkv_same_embed_dim,
        q_proj_weight=tensors.get("q_proj_weight"),
        k_proj_weight=tensors.get("k_proj_weight"),
        v_proj_weight=tensors.get("v_proj_weight"),
        average_attn_weights=average_attn_weights,
        is_causal=is_causal,
    )
    if module.batch_first and is_batched:
        return attn_output.transpose(1, 0), attn_output_weights
    return attn_output, attn_output_weights


def check_whole_weights(family: VariationalFamily) -> None:
    """Raise a ``ValueError`` unless ``family``'s estimator draws whole weight tensors (``"reparam"``, MeanField's
    ``"graves"``): an attention layer draws each tensor once per forward pass, while local reparameterization and
    flipout draw the outputs of one weight-linear op."""
    allowed = family.estimator_layers.get(family.estimator, ())
    if _WHOLE_WEIGHT_KIND not in allowed:
        supported = [e for e, kinds in family.estimator_layers.items() if _WHOLE_WEIGHT_KIND in kinds]
        raise ValueError(
            f"{type(family).__name__}(estimator={family.estimator!r}) is not supported in attention layers; "
            f"estimators allowed there: {supported} (attention draws whole weights once per forward pass: "
            "local reparameterization and flipout draw the outputs of one weight-linear op)"
        )
