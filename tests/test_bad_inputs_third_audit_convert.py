"""Issue 61 (third audit), conversion: shared and tied modules, frozen layers, subclasses, batch norm after Bayesian
layers, parametrizations, lazy modules, low precision, the meta device and hooks; every input and what it gives now."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from bad_input_table import BadInput, check, params
from test_bad_inputs_conversion import quietly
from torch import nn
from torch.nn.utils import parametrize

import varbnn
from varbnn import BayesConv2d, BayesLinear, ConversionWarning, Delta
from varbnn.convert import FROZEN, conversion_report, recalibrate_batchnorm


class TiedLM(nn.Module):
    """A language model whose decoder reuses the embedding table (weight tying)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.dec = nn.Linear(4, 10, bias=False)
        self.dec.weight = self.emb.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.dec(self.emb(tokens))


class Doubled(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * super().forward(x)


class Named(nn.Linear):
    """A subclass that only adds a name: converting it is faithful."""


class Circular(nn.Conv2d):
    def _conv_forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return super()._conv_forward(nn.functional.pad(x, (1, 1, 1, 1), mode="circular"), weight, bias)


class Symmetric(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.triu() + x.triu(1).T


def frozen_net(*, partly: bool = False) -> nn.Sequential:
    net = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    net[0].weight.requires_grad_(False)
    if not partly:
        net[0].bias.requires_grad_(False)
    return net


def parametrized_linear() -> nn.Sequential:
    net = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))
    parametrize.register_parametrization(net[0], "weight", Symmetric())
    return net


def left_plain(position: str, reason: str, *, warned: bool = True) -> Any:
    """expect= for ``quietly(bayesianize(..., report=True))``: the module at ``position`` stays plain (same output as
    before: Delta family), its row has ``reason`` and is warned about (named in the warning) unless not ``warned``."""

    def expect(result: Any) -> None:
        (model, report), messages = result
        row = next(d for d in report.deterministic if d.name == position)
        assert reason in row.reason, row.reason
        assert row.deliberate is not warned
        assert not isinstance(model.get_submodule(position), varbnn.nn.BayesianModule)
        if warned:
            assert len(messages) == 1 and repr(position) in messages[0] and reason in messages[0], messages
        else:
            assert not messages, messages

    return expect


def keeps_dtype(dtype: torch.dtype) -> Any:
    def expect(model: nn.Module) -> None:
        assert {p.dtype for _, q in model.named_modules() if isinstance(q, varbnn.nn.BayesianModule)
                for p in q.posteriors.parameters()} == {dtype}  # fmt: skip
        assert model(torch.randn(2, 3, dtype=dtype)).dtype == dtype

    return expect


def all_meta(model: nn.Module) -> None:
    assert {p.device.type for p in model.parameters()} | {b.device.type for b in model.buffers()} == {"meta"}
    model.to_empty(device="cpu")
    assert model(torch.randn(2, 3)).shape == (2, 2)


def weight_normed() -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch deprecates it; models in the wild still use it
        return nn.Sequential(torch.nn.utils.weight_norm(nn.Linear(3, 3)))


def spectral_normed() -> nn.Module:
    return nn.Sequential(torch.nn.utils.spectral_norm(nn.Linear(3, 3)), nn.Linear(3, 2))


def meta_net() -> nn.Module:
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))


CASES = [
    BadInput("tied-left-deterministic-and-warned", quietly(lambda: varbnn.bayesianize(TiedLM(), report=True)),
             expect=left_plain("dec", "weight tying: 'weight' is 'emb.weight'")),
    BadInput("tied-strict", lambda: varbnn.bayesianize(TiedLM(), strict=True),
             raises=ValueError, match="weight tying.*at 'emb'.*at 'dec'.*untie the parameter"),
    BadInput("frozen-left-deterministic", quietly(lambda: varbnn.bayesianize(frozen_net(), report=True)),
             expect=left_plain("0", FROZEN, warned=False)),
    BadInput("partly-frozen-left-deterministic", quietly(lambda: varbnn.bayesianize(frozen_net(partly=True), report=True)),
             expect=left_plain("0", "partly frozen: 'weight' requires_grad=False")),
    BadInput("partly-frozen-strict", lambda: varbnn.bayesianize(frozen_net(partly=True), strict=True),
             raises=ValueError, match="partly frozen.*frozen='convert'"),
    BadInput("frozen-bad-value", lambda: varbnn.bayesianize(nn.Linear(2, 2), frozen="skip"),  # type: ignore[call-overload]
             raises=ValueError, match="frozen must be 'keep' or 'convert', got 'skip'"),
    BadInput("subclass-own-forward", quietly(lambda: varbnn.bayesianize(nn.Sequential(Doubled(3, 3)), report=True)),
             expect=left_plain("0", "subclass of Linear with its own forward")),
    BadInput("subclass-own-conv-forward",
             quietly(lambda: varbnn.bayesianize(nn.Sequential(Circular(2, 2, 3)), report=True)),
             expect=left_plain("0", "subclass of Conv2d with its own _conv_forward")),
    BadInput("subclass-own-forward-strict", lambda: varbnn.bayesianize(nn.Sequential(Doubled(3, 3)), strict=True),
             raises=ValueError, match="Doubled x1 \\(subclass of Linear with its own forward.*register_converter"),
    BadInput("parametrized", quietly(lambda: varbnn.bayesianize(parametrized_linear(), report=True)),
             expect=left_plain("0", "parametrized: 'weight' computed by torch.nn.utils.parametrize")),
    BadInput("parametrizations-weight-norm",
             quietly(lambda: varbnn.bayesianize(
                 nn.Sequential(torch.nn.utils.parametrizations.weight_norm(nn.Linear(3, 3))), report=True)),
             expect=left_plain("0", "parametrized: 'weight'")),
    BadInput("old-spectral-norm", quietly(lambda: varbnn.bayesianize(spectral_normed(), report=True)),
             expect=left_plain("0", "Linear with parameters 'weight_orig' and no 'weight'")),
    BadInput("old-weight-norm-copy", lambda: varbnn.bayesianize(weight_normed()),
             raises=RuntimeError, match="deep-copies the model.*deprecated torch.nn.utils.weight_norm.*parametrizations"),
    BadInput("lazy-uninitialised", lambda: varbnn.bayesianize(nn.Sequential(nn.LazyLinear(3))),
             raises=ValueError, match="'0' is a LazyLinear whose parameters are not initialised.*forward pass"),
    BadInput("float16-fresh", lambda: varbnn.bayesianize(nn.Sequential(nn.Linear(3, 2)).half(), pretrained=False),
             expect=keeps_dtype(torch.float16)),
    BadInput("bfloat16-fresh",
             lambda: varbnn.bayesianize(nn.Sequential(nn.Linear(3, 2)).to(torch.bfloat16), pretrained=False),
             expect=keeps_dtype(torch.bfloat16)),
    BadInput("meta-pretrained", lambda: varbnn.bayesianize(meta_net()), expect=all_meta),
    BadInput("recalibrate-samples", lambda: recalibrate_batchnorm(nn.BatchNorm1d(2), [torch.ones(2, 2)], samples=0),
             raises=ValueError, match="samples must be an int >= 1, got 0"),
    BadInput("recalibrate-no-batch-norm", lambda: recalibrate_batchnorm(nn.Linear(2, 2), [torch.ones(2, 2)]),
             raises=ValueError, match="no batch-norm layer with running statistics"),
    BadInput("recalibrate-empty-loader", lambda: recalibrate_batchnorm(nn.BatchNorm1d(2), []),
             raises=ValueError, match="loader yielded no batches"),
]  # fmt: skip


@pytest.mark.parametrize("case", params(CASES))
def test_bad_input(case: BadInput) -> None:
    check(case)


def test_a_module_used_twice_stays_one_bayesian_module_at_both_places() -> None:
    """nn.Sequential(lin, act, lin): both places hold the SAME Bayesian module (one posterior, one KL term, as the plain
    network had one weight); the report says so; nothing plain is left; to_deterministic keeps the sharing."""
    torch.manual_seed(0)
    lin = nn.Linear(3, 3)
    plain = nn.Sequential(lin, nn.ReLU(), lin)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model, report = varbnn.bayesianize(plain, Delta(), report=True)
    assert isinstance(model[0], BayesLinear) and model[0] is model[2]
    assert not [n for n, m in model.named_modules(remove_duplicate=False) if type(m) is nn.Linear]
    assert [(c.name, c.also_at) for c in report.converted] == [("0", ("2",))] and report.shared == report.converted
    assert report.deterministic == () and report.num_bayesian_weights == 12
    assert "'0' also at '2'" in report.summary() and "0 also at 2" in str(report)
    x = torch.randn(4, 3)
    torch.testing.assert_close(model(x), plain(x), rtol=0, atol=1e-6)
    back = varbnn.to_deterministic(model)
    assert type(back[0]) is nn.Linear and back[0] is back[2]
    # a shared block, and exclusion by the second name of a shared module
    block = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    model, report = varbnn.bayesianize(nn.Sequential(block, block), report=True)
    assert model[0] is model[1] and isinstance(model[1][0], BayesLinear)
    assert [(c.name, c.also_at) for c in report.converted] == [("0.0", ("1.0",))]
    kept, report = varbnn.bayesianize(plain, exclude=["2"], report=True)
    assert type(kept[0]) is nn.Linear and kept[0] is kept[2] and report.deterministic[0].also_at == ("2",)


def test_weight_tying_is_kept_and_warned_about() -> None:
    """The tied modules stay deterministic (the tie holds), the warning names both and says how to proceed; excluding
    both is quiet; untied, both are converted."""
    with pytest.warns(ConversionWarning, match="at 'emb'.*at 'dec'.*exclude all of them.*untie") as caught:
        model = varbnn.bayesianize(TiedLM())
    assert len([w for w in caught if issubclass(w.category, ConversionWarning)]) == 1
    assert type(model.emb) is nn.Embedding and type(model.dec) is nn.Linear and model.dec.weight is model.emb.weight
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, report = varbnn.bayesianize(TiedLM(), exclude=["emb", "dec"], report=True)
    assert {d.reason for d in report.deterministic} == {"excluded by the user"}
    untied = TiedLM()
    untied.dec.weight = nn.Parameter(untied.dec.weight.detach().clone())
    model = varbnn.bayesianize(untied)
    assert isinstance(model.emb, varbnn.BayesEmbedding) and isinstance(model.dec, BayesLinear)
    assert [d.reason[:12] for d in conversion_report(TiedLM()).deterministic] == ["weight tying"] * 2


def test_frozen_modules_stay_frozen_unless_asked() -> None:
    net = frozen_net()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model, report = varbnn.bayesianize(net, report=True, strict=True)
    assert type(model[0]) is nn.Linear and not any(p.requires_grad for p in model[0].parameters())
    assert [d.name for d in report.frozen] == ["0"] and "frozen, left deterministic" in report.summary()
    assert isinstance(model[2], BayesLinear)
    assert [(d.name, d.reason) for d in conversion_report(model).deterministic] == [("0", FROZEN)]
    converted = varbnn.bayesianize(net, frozen="convert")
    assert isinstance(converted[0], BayesLinear) and all(p.requires_grad for p in converted.parameters())
    partly = varbnn.bayesianize(frozen_net(partly=True), frozen="convert")
    assert isinstance(partly[0], BayesLinear)
    with pytest.warns(ConversionWarning, match="partly frozen"):
        kept = varbnn.bayesianize(frozen_net(partly=True))
    assert [p.requires_grad for p in kept[0].parameters()] == [False, True], "the flags stay as they were"


def test_subclasses_with_their_own_forward_keep_it() -> None:
    torch.manual_seed(0)
    plain = nn.Sequential(Doubled(3, 3), Named(3, 3))
    with pytest.warns(ConversionWarning, match="Doubled x1"):
        model = varbnn.bayesianize(plain, Delta())
    assert type(model[0]) is Doubled and isinstance(model[1], BayesLinear), "a subclass without a forward converts"
    x = torch.randn(2, 3)
    torch.testing.assert_close(model(x), plain(x), rtol=0, atol=1e-6)
    assert isinstance(varbnn.bayesianize(nn.Conv2d(2, 2, 3)), BayesConv2d)


def test_hooks_move_to_the_bayesian_layer() -> None:
    seen: list[tuple[int, ...]] = []
    lin = nn.Linear(3, 2)
    lin.register_forward_hook(lambda module, inputs, output: seen.append(tuple(output.shape)))
    model = varbnn.bayesianize(nn.Sequential(lin))
    model(torch.randn(4, 3))
    assert seen == [(4, 2)]
    varbnn.to_deterministic(model)(torch.randn(5, 3))
    assert seen == [(4, 2), (5, 2)]
    root = nn.Linear(3, 2)  # the model itself one layer: its hooks go and come back too
    root.register_forward_hook(lambda module, inputs, output: seen.append(tuple(output.shape)))
    bayesian = varbnn.bayesianize(root)
    bayesian(torch.randn(6, 3))
    varbnn.to_deterministic(bayesian)(torch.randn(7, 3))
    assert seen[-2:] == [(6, 2), (7, 2)]


def test_batch_norm_warning_says_what_to_do() -> None:
    """The warning names the remedies (recalibrate_batchnorm, exclude, GroupNorm) and, when the Bayesian layer just
    before has a bias that the batch norm cancels, says to build it with bias=False."""
    for bias in (True, False):
        net = nn.Sequential(nn.Conv2d(1, 4, 3, bias=bias), nn.BatchNorm2d(4), nn.ReLU())
        with pytest.warns(ConversionWarning, match="recalibrate_batchnorm\\(model, loader\\).*sample_mode") as caught:
            varbnn.bayesianize(net)
        message = str(caught[0].message)
        assert ("'0' just before it has a bias" in message and "bias=False" in message) is bias, message


def test_recalibrate_batchnorm_re_estimates_the_running_statistics() -> None:
    """Oracle: under the mean network, the recalibrated running mean and variance are the average of the batches'
    means and unbiased variances of the conv output (equal batch sizes); flags and momentum are restored."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.Dropout(0.5), nn.Flatten(), nn.Linear(3 * 4 * 4, 2))
    with pytest.warns(ConversionWarning, match="BatchNorm2d"):
        model = varbnn.bayesianize(plain, pretrained=False)
    data = torch.randn(24, 1, 6, 6)
    batches = [(data[i : i + 8], torch.zeros(8)) for i in range(0, 24, 8)]
    model.train()
    with varbnn.sample_mode(model, "mean"):
        assert recalibrate_batchnorm(model, batches, samples=2) is model
        with torch.no_grad():
            outputs = [model[0](x) for x, _ in batches]
    norm = model[1]
    torch.testing.assert_close(norm.running_mean, torch.stack([o.mean((0, 2, 3)) for o in outputs]).mean(0))
    variances = torch.stack([o.transpose(0, 1).flatten(1).var(1) for o in outputs]).mean(0)
    torch.testing.assert_close(norm.running_var, variances)
    assert int(norm.num_batches_tracked) == 6 and norm.momentum == 0.1
    assert all(m.training for m in model.modules()), "train/eval flags restored"
