"""BayesLinear, BayesConv2d, BayesLSTM: thin wrappers that take weights from their families."""

from __future__ import annotations

import math

import torch
from torch.nn.modules.utils import _pair

from varbnn.families.base import VariationalFamily
from varbnn.families.gaussian import MeanField
from varbnn.nn.base import BayesianModule
from varbnn.ops import Conv2dOp, LinearOp, WeightOp
from varbnn.priors import PriorSpec

__all__ = ["BayesLinear", "BayesConv2d", "BayesLSTM"]


def _positive_int(value: int, name: str, owner: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{owner}: {name} must be a positive integer, got {value!r}")
    return value


class _WeightOpLayer(BayesianModule):
    """A layer computing ``op(x, W, b)`` with a weight op that is linear in W (dense, convolution)."""

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
    """y = x W^T + b with W, b random.

    Args:
        in_features, out_features: as ``nn.Linear``.
        bias: whether to learn a bias.
        family: posterior spec of the weight (default ``MeanField()``); built once per tensor.
        prior: prior of the weight (default ``Normal(0, 1)``): a shared ``Prior`` or a callable name -> Prior.
        bias_family, bias_prior: for the bias; default to ``family`` and ``prior``.
        init_weight, init_bias: initial posterior means (default He-normal weight, zero bias).
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


class BayesConv2d(_WeightOpLayer):
    """2-d convolution with random kernel and bias; arguments as ``nn.Conv2d`` (zero padding only)."""

    layer_kind = "conv2d"

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
        self.in_channels = _positive_int(in_channels, "in_channels", "BayesConv2d")
        self.out_channels = _positive_int(out_channels, "out_channels", "BayesConv2d")
        self.groups = _positive_int(groups, "groups", "BayesConv2d")
        if in_channels % groups or out_channels % groups:
            raise ValueError(
                f"BayesConv2d: in_channels ({in_channels}) and out_channels ({out_channels}) "
                f"must be divisible by groups ({groups})"
            )
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride)
        self.padding = padding if isinstance(padding, str) else _pair(padding)
        self.dilation = _pair(dilation)
        if isinstance(self.padding, str) and self.padding not in ("same", "valid"):
            raise ValueError(f"BayesConv2d: padding must be an int, a pair, 'same' or 'valid', got {padding!r}")
        op = Conv2dOp(self.stride, self.padding, self.dilation, self.groups)  # type: ignore[arg-type]
        shape = (out_channels, in_channels // groups, *self.kernel_size)
        self._add_weight_and_bias(op, shape, bias, family, prior, bias_family, bias_prior, init_weight, init_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() not in (3, 4) or x.shape[-3] != self.in_channels:
            raise ValueError(
                f"BayesConv2d: input must be (N, {self.in_channels}, H, W) or ({self.in_channels}, H, W), got {tuple(x.shape)}"
            )
        return self._apply_op(x)

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, {super().extra_repr()}"
        )


class BayesLSTM(BayesianModule):
    """Multi-layer LSTM with random weights, one draw per forward pass shared by all time steps.

    Same gate order (i, f, g, o), parameter names (``weight_ih_l{k}``, ``weight_hh_l{k}``, ``bias_ih_l{k}``,
    ``bias_hh_l{k}``) and return value ``(output, (h_n, c_n))`` as ``nn.LSTM``, so it is a drop-in
    replacement; unidirectional, no projections. Only estimators that draw whole weights (``reparam``) are
    allowed, since local reparameterization or flipout would draw new weights at every step.
    """

    layer_kind = "lstm"

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
        self.input_size = _positive_int(input_size, "input_size", "BayesLSTM")
        self.hidden_size = _positive_int(hidden_size, "hidden_size", "BayesLSTM")
        self.num_layers = _positive_int(num_layers, "num_layers", "BayesLSTM")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"BayesLSTM: dropout must be in [0, 1), got {dropout!r}")
        self.batch_first = batch_first
        self.bias = bias
        self.dropout = float(dropout)
        family = family if family is not None else MeanField()
        init = init or {}
        bound = 1.0 / math.sqrt(hidden_size)
        for layer in range(num_layers):
            width = input_size if layer == 0 else hidden_size
            shapes: dict[str, tuple[int, ...]] = {
                f"weight_ih_l{layer}": (4 * hidden_size, width),
                f"weight_hh_l{layer}": (4 * hidden_size, hidden_size),
            }
            if bias:
                shapes[f"bias_ih_l{layer}"] = (4 * hidden_size,)
                shapes[f"bias_hh_l{layer}"] = (4 * hidden_size,)
            for name, shape in shapes.items():
                start = init.get(name)
                if start is None:  # nn.LSTM's default initialisation
                    start = torch.empty(shape).uniform_(-bound, bound)
                is_bias = name.startswith("bias")
                self._add_tensor(
                    name,
                    shape,
                    (bias_family if bias_family is not None else family) if is_bias else family,
                    (bias_prior if bias_prior is not None else prior) if is_bias else prior,
                    start,
                )

    def forward(
        self, x: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        if x.dim() != 3 or x.shape[-1] != self.input_size:
            layout = "(batch, time, features)" if self.batch_first else "(time, batch, features)"
            raise ValueError(f"BayesLSTM: input must be {layout} with {self.input_size} features, got {tuple(x.shape)}")
        batch = x.shape[0] if self.batch_first else x.shape[1]
        if hx is None:
            zeros = x.new_zeros(self.num_layers, batch, self.hidden_size)
            hx = (zeros, zeros)
        flat: list[torch.Tensor] = []
        for layer in range(self.num_layers):  # one draw of every weight, shared by all time steps
            names = [f"weight_ih_l{layer}", f"weight_hh_l{layer}"]
            if self.bias:
                names += [f"bias_ih_l{layer}", f"bias_hh_l{layer}"]
            flat += [self._weight(name) for name in names]
        # torch's fused LSTM kernel (what nn.LSTM calls), differentiable in the sampled weights
        output, h_n, c_n = torch._VF.lstm(  # type: ignore[attr-defined]
            x, hx, flat, self.bias, self.num_layers, self.dropout, self.training, False, self.batch_first
        )
        return output, (h_n, c_n)

    def extra_repr(self) -> str:
        return (
            f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, batch_first={self.batch_first}, "
            f"{super().extra_repr()}"
        )
