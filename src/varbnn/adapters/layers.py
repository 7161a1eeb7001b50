"""The adapted layers: :class:`LoRALayer` and its two forms, :class:`LoRALinear` and :class:`LoRAConv2d`, registered
with :func:`varbnn.convert.register_deterministic` so that :func:`varbnn.to_deterministic` merges them."""

from __future__ import annotations

import copy
import math
from typing import Any, cast

import torch
from torch import nn

from varbnn._checks import as_float_in, as_int
from varbnn.convert import register_deterministic
from varbnn.families.base import VariationalFamily
from varbnn.families.meanfield import INIT_STD_RANGE, MeanField
from varbnn.nn.attention import check_whole_weights, multi_head_attention
from varbnn.nn.base import BayesianModule
from varbnn.ops import ConvOp, LinearOp, WeightOp
from varbnn.priors import PriorSpec

__all__ = ["LoRALayer", "LoRALinear", "LoRAConv2d", "LoRAMultiheadAttention", "BAYESIAN_CHOICES", "INIT_CHOICES"]

BAYESIAN_CHOICES: tuple[str, ...] = ("A", "B", "both")
"""The values of ``bayesian``: which adapter matrices carry the variational family (the others are point estimates)."""
INIT_CHOICES: tuple[str, ...] = ("lora", "gaussian")
"""The values of ``init``: ``"lora"`` draws A from torch's ``nn.Linear`` default (Kaiming-uniform with ``a = sqrt(5)``,
i.e. ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``, as PEFT), ``"gaussian"`` from ``N(0, 1 / fan_in)``; B is zero for both."""
_MATRICES = ("lora_A", "lora_B")


def check_std_scale(std_scale: Any, family: VariationalFamily | None, owner: str) -> float | None:
    """``std_scale`` checked (None, or a finite number > 0) and refused together with a ``family``."""
    if std_scale is None:
        return None
    if family is not None:
        raise ValueError(f"{owner}: std_scale sets the default family's initial std of A; pass it or a family, not both "
                         f"(got std_scale={std_scale!r} and family={family!r})")  # fmt: skip
    return as_float_in(std_scale, "std_scale", 0.0, None, low_open=True, owner=owner)


def _transformer_fast_path_off(module: nn.Module, args: Any) -> None:
    """A forward pre-hook that does nothing: its presence makes ``nn.TransformerEncoderLayer`` take its slow path
    (the fused eval-mode kernel reads ``linear1.weight`` directly and would skip the adapter)."""
    return None


class LoRALayer(BayesianModule):
    """A frozen pretrained layer plus a low-rank update, ``base(x) + (alpha / rank) * B (A x)``, with a variational
    posterior over ``A`` (default), ``B`` or both; :class:`LoRALinear` and :class:`LoRAConv2d` are its two forms.

    The matrices with a posterior are the layer's ``bayesian_tensors()`` (names ``"lora_A"``, ``"lora_B"``; their KL is
    the layer's :meth:`~varbnn.nn.BayesianModule.kl`); the others are plain ``nn.Parameter`` s of the same names, with
    no prior and no KL term. ``sample_mode`` works as in every Bayesian layer. ``weight`` and ``bias`` read the base
    layer's (frozen) tensors, as PEFT's adapted layers do, for code that reads ``layer.weight``; they do NOT include the
    update (that is :func:`merge_adapters`).
    """

    base: nn.Module
    rank: int
    alpha: float
    scaling: float
    bayesian: str

    def _setup(
        self,
        base: nn.Module,
        rank: int,
        alpha: float | None,
        family: VariationalFamily | None,
        prior: PriorSpec | None,
        bayesian: str,
        init: str,
        shapes: tuple[tuple[int, ...], tuple[int, ...]],
        ops: tuple[WeightOp, WeightOp],
        std_scale: float | None = None,
    ) -> None:
        owner = type(self).__name__
        self.rank = rank
        self.alpha = float(self.rank) if alpha is None else as_float_in(alpha, "alpha", 0.0, None, low_open=True, owner=owner)
        self.scaling = self.alpha / self.rank
        if bayesian not in BAYESIAN_CHOICES:
            raise ValueError(f"{owner}: bayesian must be one of {BAYESIAN_CHOICES}, got {bayesian!r}")
        if init not in INIT_CHOICES:
            raise ValueError(f"{owner}: init must be one of {INIT_CHOICES}, got {init!r}")
        std_scale = check_std_scale(std_scale, family, owner)
        fan_in = math.prod(shapes[0][1:])
        if family is None:
            a_std = MeanField().init_std if std_scale is None else std_scale / math.sqrt(fan_in)
            if not INIT_STD_RANGE[0] <= a_std <= INIT_STD_RANGE[1]:
                raise ValueError(f"{owner}: std_scale={std_scale!r} gives A (fan_in {fan_in}) the initial std {a_std:g}, "
                                 f"outside MeanField's allowed init_std range {INIT_STD_RANGE}")  # fmt: skip
            families: dict[str, VariationalFamily] = {"lora_A": MeanField(init_std=a_std), "lora_B": MeanField()}
        elif isinstance(family, VariationalFamily):
            families = {"lora_A": family, "lora_B": family}
        else:
            raise TypeError(f"{owner}: family must be a varbnn VariationalFamily (e.g. MeanField()), got {type(family).__name__}")
        self.bayesian = bayesian
        self.base = base
        self._ops = dict(zip(_MATRICES, ops))
        reference = self._adapted(base)
        dtype = reference.dtype if reference.is_floating_point() else torch.get_default_dtype()
        initial_a = torch.empty(shapes[0], dtype=dtype)
        if init == "lora":
            bound = 1.0 / math.sqrt(fan_in)  # kaiming_uniform_(a=sqrt(5)): nn.Linear's default, PEFT's LoRA default
            nn.init.uniform_(initial_a, -bound, bound)
        else:
            nn.init.normal_(initial_a, 0.0, 1.0 / math.sqrt(fan_in))
        initial = {"lora_A": initial_a, "lora_B": torch.zeros(shapes[1], dtype=dtype)}
        for name in _MATRICES:
            if bayesian == "both" or name.endswith(bayesian):
                self._add_tensor(name, tuple(initial[name].shape), families[name], prior, initial[name])
            else:
                setattr(self, name, nn.Parameter(initial[name].to(reference.device)))
        self.posteriors.to(device=reference.device)
        self.priors.to(device=reference.device)
        base.requires_grad_(False)

    @staticmethod
    def _adapted(base: nn.Module) -> torch.Tensor:
        """The base layer's tensor that the update ``(alpha / rank) B A`` is added to: its weight."""
        return base.weight  # type: ignore[return-value]

    def _matrix_op(self, name: str, x: torch.Tensor) -> torch.Tensor:
        if name in self.posteriors:
            return self.posteriors[name].forward_op(self._ops[name], x, None, self.sample_mode)  # type: ignore[operator]
        return self._ops[name](x, getattr(self, name), None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``base(x) + (alpha / rank) * B (A x)``, A and B drawn from their posteriors (or at their mean / mode)."""
        update = self._matrix_op("lora_B", self._matrix_op("lora_A", x))
        return self.base(x) + self.scaling * update

    def matrix(self, name: str, mode: str = "mean") -> torch.Tensor:
        """Adapter matrix ``"lora_A"`` or ``"lora_B"`` at its posterior ``"mean"`` or ``"mode"`` (the point estimate
        itself for a matrix without a posterior)."""
        if name not in _MATRICES:
            raise ValueError(f"name must be one of {_MATRICES}, got {name!r}")
        if mode not in ("mean", "mode"):
            raise ValueError(f"mode must be 'mean' or 'mode', got {mode!r}")
        if name in self.posteriors:
            posterior = self.posteriors[name]
            return posterior.mean if mode == "mean" else posterior.mode  # type: ignore[return-value]
        return getattr(self, name)  # type: ignore[no-any-return]

    def delta_weight(self, mode: str = "mean") -> torch.Tensor:
        """``(alpha / rank) * B A`` at the posterior ``mode`` (``"mean"`` or ``"mode"``), in the base weight's shape."""
        b, a = self.matrix("lora_B", mode), self.matrix("lora_A", mode)
        product = b.reshape(b.shape[0], -1) @ a.reshape(a.shape[0], -1)
        return (self.scaling * product).reshape(self.weight.shape)

    def merged(self, mode: str = "mean") -> nn.Module:
        """A plain copy of the base layer with ``delta_weight(mode)`` added to its weight (its parameters frozen like
        the base's: ``requires_grad_(True)`` to train it further)."""
        plain = copy.deepcopy(self.base)
        weight = self._adapted(plain)
        with torch.no_grad():
            weight.add_(self.delta_weight(mode).to(weight.dtype))
        return plain

    @property
    def weight(self) -> torch.Tensor:
        """The base layer's (frozen, pretrained) weight, without the update."""
        return self._adapted(self.base)

    @property
    def bias(self) -> torch.Tensor | None:
        """The base layer's (frozen, pretrained) bias, or None."""
        return self.base.bias  # type: ignore[return-value]

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha:g}, bayesian={self.bayesian!r}, {super().extra_repr()}"


class LoRALinear(LoRALayer):
    """A LoRA-adapted ``nn.Linear``: ``base(x) + (alpha / rank) * x A^T B^T`` with ``A`` of shape ``(rank, in)`` and
    ``B`` of shape ``(out, rank)`` (see :class:`LoRALayer`).

    :param base: the pretrained ``nn.Linear`` (frozen: ``requires_grad=False`` on its parameters).
    :param rank: the rank r, an int in ``[1, min(in_features, out_features)]`` (default 8).
    :param alpha: the scale numerator, a number > 0; the update is multiplied by ``alpha / rank`` (default None:
        ``alpha = rank``, a scale of 1).
    :param family: the posterior spec of the Bayesian matrices (default None: ``MeanField()``, or with ``std_scale``
        ``A`` started at ``std_scale / sqrt(fan_in)``; ``Delta()`` gives plain LoRA).
    :param prior: their prior (default ``Normal(0, 1)``; a ``Prior``, or a callable ``"lora_A"`` / ``"lora_B"`` ->
        Prior, :data:`~varbnn.priors.PriorSpec`).
    :param bayesian: ``"A"`` (default, BLoB), ``"B"`` or ``"both"``: which matrices get the posterior.
    :param init: ``"lora"`` (default) or ``"gaussian"`` (:data:`INIT_CHOICES`).
    :param std_scale: with the default family, ``A``'s initial posterior std relative to its initial scale
        ``1 / sqrt(fan_in)``: ``init_std = std_scale / sqrt(fan_in)`` (default None: ``MeanField()``'s ``1e-2``; see
        :func:`~varbnn.adapters.add_adapters`); not together with ``family``.
    """

    layer_kind = "linear"

    def __init__(
        self,
        base: nn.Linear,
        rank: int = 8,
        alpha: float | None = None,
        *,
        family: VariationalFamily | None = None,
        prior: PriorSpec | None = None,
        bayesian: str = "A",
        init: str = "lora",
        std_scale: float | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"LoRALinear: base must be an nn.Linear, got {type(base).__name__}")
        self.in_features, self.out_features = base.in_features, base.out_features
        rank = as_int(rank, "rank", 1, min(base.in_features, base.out_features), owner="LoRALinear")
        shapes = ((rank, base.in_features), (base.out_features, rank))
        self._setup(base, rank, alpha, family, prior, bayesian, init, shapes, (LinearOp(), LinearOp()), std_scale)


class LoRAConv2d(LoRALayer):
    """A LoRA-adapted ``nn.Conv2d``: ``A`` is a ``rank``-channel convolution with the base's kernel, stride, padding and
    dilation, ``B`` a 1x1 convolution to the output channels (PEFT's convolutional LoRA); merged, ``B A`` is the
    flattened kernel's low-rank update. Only ``groups=1`` and zero padding (``padding_mode="zeros"``) are adapted.
    Arguments as :class:`LoRALinear`; ``rank`` at most ``min(in_channels * kh * kw, out_channels)``.
    """

    layer_kind = "conv2d"

    def __init__(
        self,
        base: nn.Conv2d,
        rank: int = 8,
        alpha: float | None = None,
        *,
        family: VariationalFamily | None = None,
        prior: PriorSpec | None = None,
        bayesian: str = "A",
        init: str = "lora",
        std_scale: float | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(base, nn.Conv2d):
            raise TypeError(f"LoRAConv2d: base must be an nn.Conv2d, got {type(base).__name__}")
        if base.groups != 1 or base.padding_mode != "zeros":
            raise ValueError(
                f"LoRAConv2d adapts convolutions with groups=1 and padding_mode='zeros', got groups={base.groups}, "
                f"padding_mode={base.padding_mode!r}"
            )
        self.in_channels, self.out_channels = base.in_channels, base.out_channels
        kh, kw = base.kernel_size
        rank = as_int(rank, "rank", 1, min(base.in_channels * kh * kw, base.out_channels), owner="LoRAConv2d")
        shapes = ((rank, base.in_channels, kh, kw), (base.out_channels, rank, 1, 1))
        padding = base.padding if isinstance(base.padding, str) else tuple(base.padding)
        first = ConvOp(2, tuple(base.stride), padding, tuple(base.dilation), 1)
        second = ConvOp(2, (1, 1), (0, 0), (1, 1), 1)
        self._setup(base, rank, alpha, family, prior, bayesian, init, shapes, (first, second), std_scale)


class LoRAMultiheadAttention(LoRALayer):
    """An ``nn.MultiheadAttention`` whose packed input projection (queries, keys and values together) gets a LoRA
    update: ``in_proj_weight + (alpha / rank) B A`` with ``A`` of shape ``(rank, embed_dim)`` and ``B`` of shape
    ``(3 embed_dim, rank)`` (see :class:`LoRALayer`); the output projection keeps its pretrained weight.

    A forward pass draws the adapter once (one draw for the whole batch, or its mean / mode under ``sample_mode``),
    forms the updated projection and runs ``F.multi_head_attention_forward`` with the base layer's other tensors: the
    arguments, ``batch_first`` handling and return value of ``nn.MultiheadAttention.forward``. As in
    :class:`~varbnn.nn.BayesMultiheadAttention`, only estimators that draw whole matrices are accepted (``"local"`` and
    ``"flipout"`` draw the outputs of one linear map, which attention is not), and ``in_proj_weight`` /
    ``in_proj_bias`` read ``None`` here (so ``nn.TransformerEncoderLayer`` takes its regular path, which calls this
    module; the base layer holds the pretrained tensors). An attention with key or value sizes of its own (``kdim`` /
    ``vdim``: three separate projections) is refused. ``merge_adapters`` and ``to_deterministic`` give back an
    ``nn.MultiheadAttention`` with the update added to its ``in_proj_weight``.

    :param base: the pretrained ``nn.MultiheadAttention`` (frozen).
    :param rank: the rank r, an int in ``[1, embed_dim]`` (default 8).
    Other arguments as :class:`LoRALinear`.
    """

    layer_kind = "attention"
    in_proj_weight: None = None
    """No plain tensor here: the pretrained one is ``base.in_proj_weight``, the used one has the update added."""
    in_proj_bias: None = None
    """No plain tensor here: the pretrained one is ``base.in_proj_bias``."""

    def __init__(
        self,
        base: nn.MultiheadAttention,
        rank: int = 8,
        alpha: float | None = None,
        *,
        family: VariationalFamily | None = None,
        prior: PriorSpec | None = None,
        bayesian: str = "A",
        init: str = "lora",
        std_scale: float | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(base, nn.MultiheadAttention):
            raise TypeError(f"LoRAMultiheadAttention: base must be an nn.MultiheadAttention, got {type(base).__name__}")
        if not base._qkv_same_embed_dim:
            raise ValueError(
                "LoRAMultiheadAttention adapts the packed input projection; this attention has key / value sizes of its "
                f"own (kdim={base.kdim}, vdim={base.vdim}, embed_dim={base.embed_dim}: three separate projections)"
            )
        self._qkv_same_embed_dim = True  # refused otherwise (above)
        rank = as_int(rank, "rank", 1, base.embed_dim, owner="LoRAMultiheadAttention")
        shapes = ((rank, base.embed_dim), (3 * base.embed_dim, rank))
        self._setup(base, rank, alpha, family, prior, bayesian, init, shapes, (LinearOp(), LinearOp()), std_scale)

    def _check_family(self, family: VariationalFamily) -> None:
        check_whole_weights(family)

    @staticmethod
    def _adapted(base: nn.Module) -> torch.Tensor:
        """The packed input projection ``in_proj_weight`` ``(3 embed_dim, embed_dim)``."""
        return base.in_proj_weight  # type: ignore[return-value]

    @property
    def _attention(self) -> nn.MultiheadAttention:
        return cast(nn.MultiheadAttention, self.base)

    @property
    def embed_dim(self) -> int:
        """The base layer's ``embed_dim``."""
        return int(self._attention.embed_dim)

    @property
    def num_heads(self) -> int:
        """The base layer's ``num_heads``."""
        return int(self._attention.num_heads)

    @property
    def batch_first(self) -> bool:
        """The base layer's ``batch_first``."""
        return bool(self._attention.batch_first)

    @property
    def out_proj(self) -> nn.Module:
        """The base layer's (frozen) output projection."""
        return self._attention.out_proj

    @property
    def add_zero_attn(self) -> bool:
        """The base layer's ``add_zero_attn``."""
        return bool(self._attention.add_zero_attn)

    @property
    def dropout(self) -> float:
        """The base layer's attention dropout probability."""
        return float(self._attention.dropout)

    def _matrix(self, name: str) -> torch.Tensor:
        if name in self.posteriors:
            return self.posteriors[name].weight(self.sample_mode)  # type: ignore[operator, no-any-return]
        return getattr(self, name)  # type: ignore[no-any-return]

    def forward(  # type: ignore[override]
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
        """``(attn_output, attn_output_weights)`` as ``nn.MultiheadAttention.forward``, with the input projection
        ``W + (alpha / rank) B A`` (A and B drawn once for this pass, or at their mean / mode)."""
        base = self._attention
        update = self.scaling * (self._matrix("lora_B") @ self._matrix("lora_A"))
        tensors: dict[str, Any] = {
            "in_proj_weight": base.in_proj_weight + update.to(base.in_proj_weight.dtype),
            "in_proj_bias": base.in_proj_bias, "bias_k": base.bias_k, "bias_v": base.bias_v,
            "out_proj_weight": base.out_proj.weight, "out_proj_bias": base.out_proj.bias,
        }  # fmt: skip
        return multi_head_attention(
            self, query, key, value, tensors, key_padding_mask=key_padding_mask, need_weights=need_weights,
            attn_mask=attn_mask, average_attn_weights=average_attn_weights, is_causal=is_causal,
        )  # fmt: skip


@register_deterministic(LoRALayer)
def _det_lora(module: nn.Module, mode: str) -> nn.Module:
    """:func:`varbnn.to_deterministic`'s form of an adapted layer: the base layer with the merged update."""
    assert isinstance(module, LoRALayer)
    return module.merged(mode)


_ADAPTERS: dict[type[nn.Module], type[LoRALayer]] = {
    nn.Linear: LoRALinear, nn.Conv2d: LoRAConv2d, nn.MultiheadAttention: LoRAMultiheadAttention,
}  # fmt: skip
