"""Bayesian layers: thin wrappers that take weights from their families and call the ``F.*`` op.

``BayesLinear``, ``BayesConv1d``/``BayesConv2d``/``BayesConv3d`` (one generic convolution) and ``BayesEmbedding`` hand a
weight-linear op (:mod:`varbnn.ops`) to their weight family, which draws the weights or, with local reparameterization
or flipout, the outputs; ``BayesLSTM`` and ``BayesGRU`` draw every weight once per forward pass and run torch's fused
recurrent kernel. Every layer samples in ``model.eval()`` too: only ``sample_mode`` stops the sampling (see
:class:`varbnn.nn.BayesianModule`).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch.nn.modules.utils import _ntuple

from varbnn.families.base import VariationalFamily
from varbnn.families.meanfield import MeanField
from varbnn.nn.base import BayesianModule
from varbnn.ops import ConvOp, EmbeddingOp, LinearOp, WeightOp
from varbnn.priors import PriorSpec

__all__ = ["BayesLinear", "BayesConv1d", "BayesConv2d", "BayesConv3d", "BayesEmbedding", "BayesLSTM", "BayesGRU"]


def _positive_int(value: int, name: str, owner: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{owner}: {name} must be a positive integer, got {value!r}")
    return value


class _WeightOpLayer(BayesianModule):
    """A layer computing ``op(x, W, b)`` with a weight op that is linear in W (dense, convolution, embedding)."""

    _op: WeightOp

    def _add_weight_and_bias(
        self,
        op: WeightOp,
        weight_shape: tuple[int, ...],
        bias: bool,
        family: VariationalFamily | None,
        prior: PriorSpec | None,
        bias_family: VariationalFamily | None,
        bias_prior: PriorSpec | None,
        init_weight: torch.Tensor | None,
        init_bias: torch.Tensor | None,
    ) -> None:
        self._op = op
        family = family if family is not None else MeanField()
        self._add_tensor("weight", weight_shape, family, prior, init_weight)
        if bias:
            self._add_tensor(
                "bias",
                weight_shape[:1],
                bias_family if bias_family is not None else family,
                bias_prior if bias_prior is not None else prior,
                init_bias,
            )

    def _apply_op(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.posteriors["bias"] if "bias" in self.posteriors else None
        return self.posteriors["weight"].forward_op(self._op, x, bias, self.sample_mode)  # type: ignore[operator]


class BayesLinear(_WeightOpLayer):
    """``y = x W^T + b`` with W, b random: a Bayesian ``nn.Linear``.

    Every forward pass takes the weights from the families (:meth:`~varbnn.families.VariationalFamily.forward_op`):
    one draw per pass with ``"reparam"``, per-example outputs with the Gaussian families' ``"local"`` and
    ``"flipout"`` estimators, or the mean / mode under :func:`~varbnn.nn.base.sample_mode`. The KL of its two
    tensors is :meth:`~varbnn.nn.base.BayesianModule.kl`.

    :param in_features: size of each input sample, as ``nn.Linear``.
    :param out_features: size of each output sample, as ``nn.Linear``.
    :param bias: whether to learn a (random) bias (default True).
    :param family: posterior spec of the weight (default ``MeanField()``); built once per tensor.
    :param prior: prior of the weight (default ``Normal(0, 1)``): a shared ``Prior`` or a callable name -> Prior
        (:data:`~varbnn.priors.PriorSpec`).
    :param bias_family: posterior spec of the bias (default: ``family``).
    :param bias_prior: prior of the bias (default: ``prior``).
    :param init_weight: initial posterior mean of the weight, shape ``(out_features, in_features)`` (default
        He-normal).
    :param init_bias: initial posterior mean of the bias (default zeros).
    """

    layer_kind = "linear"

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        family: VariationalFamily | None = None,
        prior: PriorSpec | None = None,
        bias_family: VariationalFamily | None = None,
        bias_prior: PriorSpec | None = None,
        init_weight: torch.Tensor | None = None,
        init_bias: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.in_features = _positive_int(in_features, "in_features", "BayesLinear")
        self.out_features = _positive_int(out_features, "out_features", "BayesLinear")
        self._add_weight_and_bias(
            LinearOp(), (out_features, in_features), bias, family, prior, bias_family, bias_prior, init_weight, init_bias
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"BayesLinear: input has {x.shape[-1]} features in its last dim, expected {self.in_features}")
        return self._apply_op(x)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {super().extra_repr()}"


_SPATIAL = {1: "L", 2: "H, W", 3: "D, H, W"}


class _BayesConvNd(_WeightOpLayer):
    """``dim``-d convolution with random kernel and bias; arguments as ``nn.Conv{dim}d`` (zero padding only).

    Subclasses set ``dim`` and ``layer_kind``; everything else is shared.
    """

    dim: ClassVar[int]

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, ...],
        stride: int | tuple[int, ...] = 1,
        padding: int | tuple[int, ...] | str = 0,
        dilation: int | tuple[int, ...] = 1,
        groups: int = 1,
        bias: bool = True,
        *,
        family: VariationalFamily | None = None,
        prior: PriorSpec | None = None,
        bias_family: VariationalFamily | None = None,
        bias_prior: PriorSpec | None = None,
        init_weight: torch.Tensor | None = None,
        init_bias: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        tuple_of = _ntuple(self.dim)
        self.in_channels = _positive_int(in_channels, "in_channels", owner)
        self.out_channels = _positive_int(out_channels, "out_channels", owner)
        self.groups = _positive_int(groups, "groups", owner)
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"{owner}: in_channels ({in_channels}) and out_channels ({out_channels}) must be divisible by groups ({groups})"
            )
        self.kernel_size: tuple[int, ...] = tuple_of(kernel_size)
        self.stride: tuple[int, ...] = tuple_of(stride)
        self.padding: tuple[int, ...] | str = padding if isinstance(padding, str) else tuple_of(padding)
        self.dilation: tuple[int, ...] = tuple_of(dilation)
        if isinstance(self.padding, str) and self.padding not in ("same", "valid"):
            raise ValueError(f"{owner}: padding must be an int, a {self.dim}-tuple, 'same' or 'valid', got {padding!r}")
        op = ConvOp(self.dim, self.stride, self.padding, self.dilation, self.groups)
        shape = (out_channels, in_channels // groups, *self.kernel_size)
        self._add_weight_and_bias(op, shape, bias, family, prior, bias_family, bias_prior, init_weight, init_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() not in (self.dim + 1, self.dim + 2) or x.shape[-self.dim - 1] != self.in_channels:
            spatial = _SPATIAL[self.dim]
            raise ValueError(
                f"{type(self).__name__}: input must be (N, {self.in_channels}, {spatial}) or ({self.in_channels}, {spatial}), "
                f"got {tuple(x.shape)}"
            )
        return self._apply_op(x)

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, {super().extra_repr()}"
        )


class BayesConv1d(_BayesConvNd):
    """1-d convolution with random kernel and bias; arguments as ``nn.Conv1d`` (zero padding only), plus the
    keyword-only ``family``, ``prior``, ``bias_family``, ``bias_prior``, ``init_weight``, ``init_bias`` of
    :class:`BayesLinear`. Input ``(N, C, L)`` or ``(C, L)``."""

    dim = 1
    layer_kind = "conv1d"


class BayesConv2d(_BayesConvNd):
    """2-d convolution with random kernel and bias; arguments as ``nn.Conv2d`` (zero padding only), plus the
    keyword-only ``family``, ``prior``, ``bias_family``, ``bias_prior``, ``init_weight``, ``init_bias`` of
    :class:`BayesLinear`. Input ``(N, C, H, W)`` or ``(C, H, W)``."""

    dim = 2
    layer_kind = "conv2d"


class BayesConv3d(_BayesConvNd):
    """3-d convolution with random kernel and bias; arguments as ``nn.Conv3d`` (zero padding only), plus the
    keyword-only ``family``, ``prior``, ``bias_family``, ``bias_prior``, ``init_weight``, ``init_bias`` of
    :class:`BayesLinear`. Input ``(N, C, D, H, W)`` or ``(C, D, H, W)``."""

    dim = 3
    layer_kind = "conv3d"


class BayesEmbedding(_WeightOpLayer):
    """A lookup table with a random weight: ``y = W[x]`` for integer indices ``x`` (as ``nn.Embedding``).

    ``F.embedding`` is linear in W (a one-hot row times W), so the weight family's estimators apply: ``"reparam"``
    (one table drawn per forward pass) and, for Gaussian families, ``"local"``, which draws every output element
    from ``N(mu[x], sigma^2[x])`` independently -- exact here, since each output element depends on one weight.
    Flipout is refused (its random signs flip input features; an index has none).

    ``max_norm`` (an in-place renormalisation of the table) and ``sparse`` gradients have no Bayesian form and are
    not offered.

    :param num_embeddings: as ``nn.Embedding``.
    :param embedding_dim: as ``nn.Embedding``.
    :param padding_idx: as ``nn.Embedding``: positions holding this index output the padding row, which is fixed
        (a buffer ``padding_row``: the initial row, zeros by default) and gets no gradient; the posterior of that
        row is unused by the forward pass but stays in the KL, which alone moves it (towards the prior).
    :param scale_grad_by_freq: as ``nn.Embedding``.
    :param family: posterior spec of the weight (default ``MeanField()``).
    :param prior: prior of the weight (default ``Normal(0, 1)``).
    :param init_weight: initial posterior mean, shape ``(num_embeddings, embedding_dim)`` (default ``N(0, 1)`` entries
        as ``nn.Embedding``, the padding row zero).
    """

    layer_kind = "embedding"
    padding_row: torch.Tensor | None

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        scale_grad_by_freq: bool = False,
        *,
        family: VariationalFamily | None = None,
        prior: PriorSpec | None = None,
        init_weight: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.num_embeddings = _positive_int(num_embeddings, "num_embeddings", "BayesEmbedding")
        self.embedding_dim = _positive_int(embedding_dim, "embedding_dim", "BayesEmbedding")
        if padding_idx is not None:
            valid = isinstance(padding_idx, int) and not isinstance(padding_idx, bool)
            if not (valid and -num_embeddings <= padding_idx < num_embeddings):
                raise ValueError(
                    f"BayesEmbedding: padding_idx must be None or an int in [-{num_embeddings}, {num_embeddings}), "
                    f"got {padding_idx!r}"
                )
            padding_idx %= num_embeddings
        self.padding_idx = padding_idx
        self.scale_grad_by_freq = bool(scale_grad_by_freq)
        if init_weight is None:  # nn.Embedding's default initialisation
            init_weight = torch.randn(num_embeddings, embedding_dim)
            if padding_idx is not None:
                init_weight[padding_idx] = 0.0
        shape = (num_embeddings, embedding_dim)
        op = EmbeddingOp(padding_idx, self.scale_grad_by_freq)
        self._add_weight_and_bias(op, shape, False, family, prior, None, None, init_weight, None)
        padding_row = None if padding_idx is None else init_weight[padding_idx].detach().clone()
        self.register_buffer("padding_row", padding_row)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"BayesEmbedding: input must be integer indices (int64 or int32), got {x.dtype}")
        out = self._apply_op(x)
        if self.padding_row is not None and self.padding_idx is not None:
            out = torch.where(x.eq(self.padding_idx).unsqueeze(-1), self.padding_row.to(out.dtype), out)
        return out

    def extra_repr(self) -> str:
        padding = f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""
        return f"{self.num_embeddings}, {self.embedding_dim}{padding}, {super().extra_repr()}"


class _BayesRNN(BayesianModule):
    """Shared part of :class:`BayesLSTM` and :class:`BayesGRU`: ``gates * hidden_size`` rows per weight, torch's
    parameter names and default initialisation, one draw of every weight per forward pass."""

    gates: ClassVar[int]

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = True,
        dropout: float = 0.0,
        *,
        family: VariationalFamily | None = None,
        prior: PriorSpec | None = None,
        bias_family: VariationalFamily | None = None,
        bias_prior: PriorSpec | None = None,
        init: dict[str, torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        self.input_size = _positive_int(input_size, "input_size", owner)
        self.hidden_size = _positive_int(hidden_size, "hidden_size", owner)
        self.num_layers = _positive_int(num_layers, "num_layers", owner)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"{owner}: dropout must be in [0, 1), got {dropout!r}")
        self.batch_first = batch_first
        self.bias = bias
        self.dropout = float(dropout)
        family = family if family is not None else MeanField()
        init = init or {}
        bound = 1.0 / math.sqrt(hidden_size)
        rows = self.gates * hidden_size
        for layer in range(num_layers):
            width = input_size if layer == 0 else hidden_size
            shapes: dict[str, tuple[int, ...]] = {
                f"weight_ih_l{layer}": (rows, width),
                f"weight_hh_l{layer}": (rows, hidden_size),
            }
            if bias:
                shapes[f"bias_ih_l{layer}"] = (rows,)
                shapes[f"bias_hh_l{layer}"] = (rows,)
            for name, shape in shapes.items():
                start = init.get(name)
                if start is None:  # torch's default initialisation of recurrent layers
                    start = torch.empty(shape).uniform_(-bound, bound)
                is_bias = name.startswith("bias")
                self._add_tensor(
                    name,
                    shape,
                    (bias_family if bias_family is not None else family) if is_bias else family,
                    (bias_prior if bias_prior is not None else prior) if is_bias else prior,
                    start,
                )

    def _check_input(self, x: torch.Tensor) -> int:
        """The batch size of a valid input."""
        if x.dim() != 3 or x.shape[-1] != self.input_size:
            layout = "(batch, time, features)" if self.batch_first else "(time, batch, features)"
            raise ValueError(
                f"{type(self).__name__}: input must be {layout} with {self.input_size} features, got {tuple(x.shape)}"
            )
        return x.shape[0] if self.batch_first else x.shape[1]

    def _flat_weights(self) -> list[torch.Tensor]:
        """One draw of every weight (torch's order: per layer w_ih, w_hh, b_ih, b_hh), shared by all time steps."""
        flat: list[torch.Tensor] = []
        for layer in range(self.num_layers):
            names = [f"weight_ih_l{layer}", f"weight_hh_l{layer}"]
            if self.bias:
                names += [f"bias_ih_l{layer}", f"bias_hh_l{layer}"]
            flat += [self._weight(name) for name in names]
        return flat

    def extra_repr(self) -> str:
        return (
            f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, batch_first={self.batch_first}, "
            f"{super().extra_repr()}"
        )


class BayesLSTM(_BayesRNN):
    """Multi-layer LSTM with random weights, one draw per forward pass shared by all time steps.

    Same gate order (i, f, g, o), parameter names (``weight_ih_l{k}``, ``weight_hh_l{k}``, ``bias_ih_l{k}``,
    ``bias_hh_l{k}``) and return value ``(output, (h_n, c_n))`` as ``nn.LSTM``, so it is a drop-in
    replacement (but ``batch_first`` defaults to True); unidirectional, no projections. Only estimators that draw
    whole weights (``reparam``, ``graves``) are allowed, since local reparameterization or flipout would draw new
    weights at every step.

    :param input_size: features of the input ``x_t``, as ``nn.LSTM``.
    :param hidden_size: features of the hidden state, as ``nn.LSTM``.
    :param num_layers: stacked recurrent layers (default 1), as ``nn.LSTM``.
    :param bias: whether the layers have the biases ``bias_ih_l{k}`` and ``bias_hh_l{k}`` (default True).
    :param batch_first: inputs and outputs are ``(batch, time, feature)`` (default True; ``nn.LSTM``'s default is
        False).
    :param dropout: dropout on the outputs of every layer but the last, in training mode (default 0), as ``nn.LSTM``.
    :param family: posterior spec of the weights (default ``MeanField()``), as :class:`BayesLinear`.
    :param prior: prior of the weights (default ``Normal(0, 1)``), as :class:`BayesLinear`.
    :param bias_family: posterior spec of the biases (default: ``family``).
    :param bias_prior: prior of the biases (default: ``prior``).
    :param init: initial posterior means by parameter name (default: ``nn.LSTM``'s uniform(-1/sqrt(hidden),
        1/sqrt(hidden))).
    """

    layer_kind = "lstm"
    gates = 4

    def forward(
        self, x: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        batch = self._check_input(x)
        if hx is None:
            zeros = x.new_zeros(self.num_layers, batch, self.hidden_size)
            hx = (zeros, zeros)
        # torch's fused LSTM kernel (what nn.LSTM calls), differentiable in the sampled weights
        output, h_n, c_n = torch._VF.lstm(  # type: ignore[attr-defined]
            x, hx, self._flat_weights(), self.bias, self.num_layers, self.dropout, self.training, False, self.batch_first
        )
        return output, (h_n, c_n)


class BayesGRU(_BayesRNN):
    """Multi-layer GRU with random weights, one draw per forward pass shared by all time steps.

    Same gate order (r, z, n), parameter names (``weight_ih_l{k}``, ``weight_hh_l{k}``, ``bias_ih_l{k}``,
    ``bias_hh_l{k}``) and return value ``(output, h_n)`` as ``nn.GRU`` (torch's fused kernel), so it is a drop-in
    replacement (but ``batch_first`` defaults to True, as :class:`BayesLSTM`); unidirectional. Only estimators that
    draw whole weights (``reparam``, ``graves``) are allowed, since local reparameterization or flipout would draw new
    weights at every step.

    :param input_size: features of the input ``x_t``, as ``nn.GRU``.
    :param hidden_size: features of the hidden state, as ``nn.GRU``.
    :param num_layers: stacked recurrent layers (default 1), as ``nn.GRU``.
    :param bias: whether the layers have the biases ``bias_ih_l{k}`` and ``bias_hh_l{k}`` (default True).
    :param batch_first: inputs and outputs are ``(batch, time, feature)`` (default True; ``nn.GRU``'s default is
        False).
    :param dropout: dropout on the outputs of every layer but the last, in training mode (default 0), as ``nn.GRU``.
    :param family: posterior spec of the weights (default ``MeanField()``), as :class:`BayesLinear`.
    :param prior: prior of the weights (default ``Normal(0, 1)``), as :class:`BayesLinear`.
    :param bias_family: posterior spec of the biases (default: ``family``).
    :param bias_prior: prior of the biases (default: ``prior``).
    :param init: initial posterior means by parameter name (default: ``nn.GRU``'s uniform(-1/sqrt(hidden),
        1/sqrt(hidden))).
    """

    layer_kind = "gru"
    gates = 3

    def forward(self, x: torch.Tensor, hx: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self._check_input(x)
        if hx is None:
            hx = x.new_zeros(self.num_layers, batch, self.hidden_size)
        output, h_n = torch._VF.gru(  # type: ignore[attr-defined]
            x, hx, self._flat_weights(), self.bias, self.num_layers, self.dropout, self.training, False, self.batch_first
        )
        return output, h_n
