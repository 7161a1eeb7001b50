"""Export of a structurally pruned model: the smaller PLAIN ``nn.Sequential`` with the pruned units physically
removed, the masked dense reference it must equal, and Oh et al.'s parameter and FLOPs counts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from varbnn.convert import to_deterministic
from varbnn.models import lenet5
from varbnn.prune.scores import GroupKey, ThresholdSpec, select_units

__all__ = ["export", "masked_model", "count_parameters_and_flops", "SelectFeatures"]

class SelectFeatures(nn.Module):
    """Keeps the features (``dim=1``: channels of an image batch, or units of a flat batch) listed in ``index``."""

    index: torch.Tensor

    def __init__(self, index: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("index", index.to(torch.long).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.index_select(1, self.index)

    def extra_repr(self) -> str:
        return f"{self.index.numel()} features"


_PASS_THROUGH = (
    nn.ReLU, nn.Tanh, nn.Sigmoid, nn.GELU, nn.ELU, nn.LeakyReLU,
    nn.MaxPool2d, nn.AvgPool2d, nn.Dropout, nn.Identity, SelectFeatures,
)  # fmt: skip


def _chain(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The leaf modules of a (nested) ``nn.Sequential`` in execution order, checked to be exportable."""
    if not isinstance(model, nn.Sequential):
        raise NotImplementedError(f"export supports nn.Sequential chains, got {type(model).__name__}")
    leaves: list[tuple[str, nn.Module]] = []
    for name, child in model.named_children():
        if isinstance(child, nn.Sequential):
            leaves += [(f"{name}.{n}", m) for n, m in _chain(child)]
        elif isinstance(child, (nn.Linear, nn.Conv2d, nn.Flatten, *_PASS_THROUGH)):
            if isinstance(child, nn.Conv2d) and child.groups != 1:
                raise NotImplementedError(f"export: grouped convolution {name!r} is not supported")
            leaves.append((name, child))
        else:
            raise NotImplementedError(
                f"export: module {name!r} ({type(child).__name__}) is not supported; allowed: Linear, Conv2d, Flatten, "
                "element-wise activations, pooling, Dropout, nested Sequential"
            )
    return leaves


def _trace_shapes(chain: list[tuple[str, nn.Module]], example: torch.Tensor) -> dict[str, tuple[torch.Size, torch.Size]]:
    shapes: dict[str, tuple[torch.Size, torch.Size]] = {}
    x = example
    with torch.no_grad():
        for name, module in chain:
            y = module(x)
            shapes[name] = (x.shape[1:], y.shape[1:])
            x = y
    return shapes


def count_parameters_and_flops(model: nn.Module, example: torch.Tensor) -> tuple[int, int]:
    """Weights + biases of the Linear/Conv2d layers, and FLOPs by the paper's formulas: convolution
    ``(Kw Kh Cin + 1) Hout Wout Cout`` (= ``(Kw Kh Cin + 1)(H - Kh + 1 + P)(W - Kw + 1 + P) Cout`` at stride 1),
    dense ``(In + 1) Out``."""
    chain = _chain(model)
    shapes = _trace_shapes(chain, example[:1])
    params = flops = 0
    for name, module in chain:
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            params += sum(p.numel() for p in module.parameters())
            flops += _flops(module, shapes[name][1])
    return params, flops


def lenet5_sizes(architecture: str | Sequence[int]) -> tuple[int, int]:
    """Parameters and FLOPs (Oh et al.'s formulas, as :func:`count_parameters_and_flops` counts them) of LeNet-5-Caffe
    on 28x28 images with ``architecture`` = ``"c1-c2-f-h"`` (or four integers) units kept: conv1 filters, conv2
    filters, fc1 inputs (at most ``16 c2``: the 4x4 positions of the kept conv2 channels) and fc1 outputs (10 classes).
    The sizes of an exported model's ``architecture``; also a published architecture's sizes recomputed the same way
    (a paper's own counts can differ)."""
    units = [int(u) for u in architecture.split("-")] if isinstance(architecture, str) else [int(u) for u in architecture]
    if len(units) != 4 or any(u < 1 for u in units) or units[2] > 16 * units[1]:
        raise ValueError(
            f"architecture must be four positive unit counts c1-c2-f-h with f <= 16 c2 (LeNet-5-Caffe), got {architecture!r}"
        )

    c1, c2, inputs, hidden = units
    features = list(lenet5(widths=(c1, c2, hidden)).children())[:7]  # conv - pool - conv - pool - flatten, as the exported model
    model = nn.Sequential(*features, SelectFeatures(torch.arange(inputs)), nn.Linear(inputs, hidden), nn.ReLU(),
                          nn.Linear(hidden, 10))  # fmt: skip
    return count_parameters_and_flops(model, torch.zeros(1, 1, 28, 28))


def _flops(module: nn.Linear | nn.Conv2d, out_shape: torch.Size) -> int:
    """Oh et al.'s FLOPs of one layer; ``out_shape``: its output's shape without the batch (only H, W are read)."""
    if isinstance(module, nn.Linear):
        return (module.in_features + 1) * module.out_features
    kh, kw = module.kernel_size
    return (kh * kw * module.in_channels + 1) * out_shape[1] * out_shape[2] * module.out_channels


def export(
    model: nn.Module,
    example: torch.Tensor,
    keep: Mapping[GroupKey, torch.Tensor] | None = None,
    threshold: ThresholdSpec = "gap",
    min_gap: float = 1.0,
    mode: str = "mode",
) -> tuple[nn.Sequential, dict[str, object]]:
    """A smaller PLAIN model with the pruned units physically removed, and a report.

    ``model`` is a Bayesian ``nn.Sequential`` chain (Linear / Conv2d / Flatten / activations / pooling); its point
    weights are the posterior ``mode`` (or ``"mean"``). Units are pruned by ``keep`` masks (default:
    :func:`select_units` with ``threshold``): an output unit survives if its row group is kept AND the next layer
    still reads it through a kept column group; the last layer's outputs are never removed. Removed units are
    dropped with their biases, so the exported model equals :func:`masked_model` (the same point weights with those
    rows, biases and columns set to zero) on every input. ``example``: one input batch, for shapes and FLOPs.

    Report: ``architecture`` (kept units per layer, e.g. ``"4-7-110-66"``: conv output channels, then the first
    dense layer's input features and the dense output units except the last), per-layer ``layers``, and the
    ``parameters`` / ``flops`` of the dense and the exported model.
    """
    keep = dict(keep) if keep is not None else select_units(model, threshold, min_gap)
    return _export_plain(to_deterministic(model, mode), example, keep)


def _export_plain(
    dense: nn.Module,
    example: torch.Tensor,
    keep: Mapping[GroupKey, torch.Tensor],
    shapes: Mapping[str, tuple[torch.Size, torch.Size]] | None = None,
) -> tuple[nn.Sequential, dict[str, object]]:
    """:func:`export` of an already plain (point-weight) copy ``dense`` of the model: ``dense`` is only read.
    ``shapes``: :func:`_trace_shapes` of ``dense`` (traced here if not given; pruning channels leaves every spatial
    size as it is, so the exported model's FLOPs follow from them)."""
    chain = _chain(dense)
    if shapes is None:
        shapes = _trace_shapes(chain, example[:1])
    weighted = [(n, m) for n, m in chain if isinstance(m, (nn.Linear, nn.Conv2d))]
    if not weighted:
        raise ValueError("export: the model has no Linear or Conv2d layer")
    device = next(dense.parameters()).device
    out_keep: list[torch.Tensor] = []
    in_keep: list[torch.Tensor] = []  # over the layer's inputs: features (dense) or channels (conv)
    for i, (name, module) in enumerate(weighted):
        n_out = module.out_features if isinstance(module, nn.Linear) else module.out_channels
        n_in = module.in_features if isinstance(module, nn.Linear) else module.in_channels
        row = keep.get((name, "row"), torch.ones(n_out, dtype=torch.bool)).to(torch.bool).cpu()
        col = keep.get((name, "column"), torch.ones(n_in, dtype=torch.bool)).to(torch.bool).cpu()
        out_keep.append(row if i < len(weighted) - 1 else torch.ones(n_out, dtype=torch.bool))
        in_keep.append(col)
    # reconcile each consecutive pair: a unit lives if its row is kept and the next layer reads one of its features
    for i in range(len(weighted) - 1):
        n_out = out_keep[i].numel()
        n_next = in_keep[i + 1].numel()
        if n_next % n_out:
            raise ValueError(
                f"export: cannot map {n_out} outputs of {weighted[i][0]!r} onto {n_next} inputs of {weighted[i + 1][0]!r}"
            )
        per_unit = n_next // n_out  # spatial positions per channel after a Flatten, else 1
        reads = in_keep[i + 1].reshape(n_out, per_unit)
        alive = out_keep[i] & reads.any(dim=1)
        out_keep[i] = alive
        in_keep[i + 1] = (reads & alive[:, None]).reshape(-1)
    # build the exported chain
    layers: list[nn.Module] = []
    report_layers = []
    produced: torch.Tensor | None = None  # original indices of the units the previous weighted layer kept
    produced_units = 0
    index = 0
    for name, leaf in chain:
        if not isinstance(leaf, (nn.Linear, nn.Conv2d)):
            layers.append(leaf)
            continue
        wanted = in_keep[index].nonzero().flatten()
        n_in = in_keep[index].numel()
        if produced is None:
            arriving = torch.arange(n_in)
        else:
            per_unit = n_in // produced_units
            arriving = (produced[:, None] * per_unit + torch.arange(per_unit)).reshape(-1)
        if not torch.equal(arriving, wanted):
            position = {int(f): p for p, f in enumerate(arriving.tolist())}
            layers.append(SelectFeatures(torch.tensor([position[int(f)] for f in wanted.tolist()], device=device)))
        rows = out_keep[index].nonzero().flatten().to(device)
        cols = wanted.to(device)
        weight = leaf.weight.detach().index_select(0, rows).index_select(1, cols)
        bias = leaf.bias.detach().index_select(0, rows) if leaf.bias is not None else None
        if isinstance(leaf, nn.Linear):
            new: nn.Module = nn.Linear(cols.numel(), rows.numel(), bias is not None)
        else:
            new = nn.Conv2d(
                cols.numel(), rows.numel(), leaf.kernel_size, leaf.stride, leaf.padding,  # type: ignore[arg-type]
                leaf.dilation, 1, bias is not None,  # type: ignore[arg-type]
            )  # fmt: skip
        new = new.to(device=device, dtype=weight.dtype)
        with torch.no_grad():
            new.weight.copy_(weight)  # type: ignore[operator]
            if bias is not None:
                new.bias.copy_(bias)  # type: ignore[operator]
        layers.append(new)
        report_layers.append(
            {"layer": name, "inputs": f"{cols.numel()}/{n_in}", "outputs": f"{rows.numel()}/{out_keep[index].numel()}"}
        )
        produced, produced_units = rows.cpu(), out_keep[index].numel()
        index += 1
    exported = nn.Sequential(*layers)
    units: list[int] = []
    for i, (_, module) in enumerate(weighted):
        if isinstance(module, nn.Linear) and (i == 0 or isinstance(weighted[i - 1][1], nn.Conv2d)):
            units.append(int(in_keep[i].sum()))
        if i < len(weighted) - 1:
            units.append(int(out_keep[i].sum()))
    dense_params = dense_flops = params = flops = 0
    for name, module in weighted:
        dense_params += sum(p.numel() for p in module.parameters())
        dense_flops += _flops(module, shapes[name][1])
    for layer in exported:
        if isinstance(layer, (nn.Linear, nn.Conv2d)):
            params += sum(p.numel() for p in layer.parameters())
    flops = sum(
        _flops(new_module, shapes[name][1])
        for (name, _), new_module in zip(weighted, [m for m in exported if isinstance(m, (nn.Linear, nn.Conv2d))])
    )
    report: dict[str, object] = {
        "architecture": "-".join(map(str, units)),
        "layers": report_layers,
        "parameters": params,
        "flops": flops,
        "dense_parameters": dense_params,
        "dense_flops": dense_flops,
        "keep_out": [m.tolist() for m in out_keep],
        "keep_in": [m.tolist() for m in in_keep],
    }
    return exported, report


def masked_model(model: nn.Module, report: Mapping[str, object], mode: str = "mode") -> nn.Sequential:
    """The dense plain model (posterior ``mode``/``mean`` weights) with the units that :func:`export` removed set to
    zero (weight rows and biases of dropped outputs, weight columns of dropped inputs): the reference the
    exported model must match exactly."""
    dense = to_deterministic(model, mode)
    weighted = [m for _, m in _chain(dense) if isinstance(m, (nn.Linear, nn.Conv2d))]
    keep_out, keep_in = report["keep_out"], report["keep_in"]
    with torch.no_grad():
        for module, rows, cols in zip(weighted, keep_out, keep_in):  # type: ignore[call-overload]
            r = torch.tensor(rows, device=module.weight.device)
            c = torch.tensor(cols, device=module.weight.device)
            module.weight[~r] = 0
            module.weight[:, ~c] = 0
            if module.bias is not None:
                module.bias[~r] = 0
    return dense  # type: ignore[return-value]
