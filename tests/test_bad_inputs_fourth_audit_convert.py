"""Issue 61 (fourth audit), conversion: a module used at several places, one of which lies inside a subtree that
``bayesianize`` leaves as it is (an excluded parent, by name or type; a frozen or attention module; a module that is
Bayesian already). It stays one plain object at all its places, and the report says why; before, it became a
Bayesian layer at one place and stayed a plain one at the other, silently."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from bad_input_table import BadInput, check, params
from torch import nn

import varbnn
from varbnn import BayesLinear, ConversionWarning
from varbnn.convert import _CONVERTERS, FROZEN, register_converter, to_deterministic


class A(nn.Module):
    """A parent that holds one module (the audit's reproducer)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.l = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l(x)


class Block(nn.Module):
    """A container with a registered converter (below) that replaces it as a whole."""

    def __init__(self, inner: nn.Linear) -> None:
        super().__init__()
        self.l = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l(x)


def _block(module: nn.Module, ctx: Any) -> nn.Module:
    assert isinstance(module, Block)
    return BayesLinear(module.l.in_features, module.l.out_features, **ctx.layer_kwargs())


def reproducer(*, excluded_first: bool = False) -> nn.Sequential:
    lin = nn.Linear(3, 3)
    if excluded_first:
        return nn.Sequential(nn.Sequential(lin), A(lin), nn.Linear(3, 2))
    return nn.Sequential(A(lin), nn.Sequential(lin), nn.Linear(3, 2))


def convert(model: nn.Module, **kwargs: Any) -> Any:
    """``bayesianize(model, report=True, **kwargs)`` -> ``(model, report, [ConversionWarning messages])``."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        new, report = varbnn.bayesianize(model, report=True, **kwargs)
    return new, report, [str(w.message) for w in record if issubclass(w.category, ConversionWarning)]


def one_plain_object(first: str, second: str, reason: str, *, deliberate: bool = True) -> Any:
    """expect=: the modules at ``first`` and ``second`` are one plain (not Bayesian) object; its row (at whichever place
    the walk met first outside the subtree) starts with ``reason``, lists the other place in ``also_at``, is deliberate
    (no warning) or warned."""

    def expect(result: Any) -> None:
        model, report, messages = result
        at_first, at_second = model.get_submodule(first), model.get_submodule(second)
        assert at_first is at_second, "the shared module was split"
        assert not isinstance(at_first, varbnn.BayesianModule)
        rows = [d for d in report.deterministic if d.name in (first, second) and (set(d.also_at) & {first, second})]
        assert len(rows) == 1, report
        assert rows[0].reason.startswith(reason), rows[0].reason
        assert rows[0].deliberate is deliberate and rows[0] in report.shared
        named = any(repr(rows[0].name) in m for m in messages)
        assert named is not deliberate, messages

    return expect


def same_as_excluding_the_child(result: Any) -> None:
    """Excluding the parent "1" gives the model that excluding the child path "1.0" gives (types and sharing)."""
    model, report, messages = result
    by_child, _, _ = convert(reproducer(), exclude=["1.0"])
    for got in (model, by_child):
        assert type(got[0].l) is nn.Linear and got[0].l is got[1][0] and isinstance(got[2], BayesLinear)
    assert not messages
    (row,) = [d for d in report.deterministic if d.name == "0.l"]
    assert "'1'" in row.reason and row.also_at == ("1.0",)
    assert "shared" in str(report) and "0.l also at 1.0" in str(report)


def tied_through_excluded_parent(result: Any) -> None:
    model, report, messages = result
    assert model[0].l is model[1][0] and model[2].weight is model[0].l.weight  # the tie and the sharing both hold
    rows = {d.name: d for d in report.deterministic}
    assert rows["1.0"].reason.startswith("excluded by the user") and rows["1.0"].deliberate
    assert rows["2"].reason.startswith("weight tying") and not rows["2"].deliberate
    assert len(messages) == 1 and "'2'" in messages[0] and "'1.0'" not in messages[0]


def tied_model() -> nn.Sequential:
    lin, tied = nn.Linear(3, 3), nn.Linear(3, 3)
    tied.weight = lin.weight
    return nn.Sequential(A(lin), nn.Sequential(lin), tied)


def frozen_attention_shared() -> nn.ModuleList:
    attention = nn.MultiheadAttention(4, 2)
    attention.requires_grad_(False)
    return nn.ModuleList([attention, attention.out_proj])


def encoder_shared() -> nn.Sequential:
    encoder = nn.TransformerEncoderLayer(4, 2, 8, batch_first=True)
    return nn.Sequential(encoder, encoder.linear1)


def attention_shared() -> nn.ModuleList:
    attention = nn.MultiheadAttention(4, 2)
    return nn.ModuleList([attention, attention.out_proj])


def one_bayesian_object(first: str, second: str) -> Any:
    """expect=: the module at ``first`` and ``second`` became one Bayesian object (one row, the other place in
    ``also_at``), without a warning (issue 65: the transformer encoder layer is walked into)."""

    def expect(result: Any) -> None:
        model, report, messages = result
        at_first, at_second = model.get_submodule(first), model.get_submodule(second)
        assert at_first is at_second and isinstance(at_first, varbnn.BayesianModule)
        rows = [c for c in report.converted if {c.name, *c.also_at} == {first, second}]
        assert len(rows) == 1 and not messages, (report, messages)

    return expect


def attention_split_and_warned(result: Any) -> None:
    """The attention is converted as a whole (issue 65), so its ``out_proj`` used at another place gets its own
    posterior there: the split a registered converter of a container makes, warned about."""
    model, _, messages = result
    assert isinstance(model[0], varbnn.nn.BayesMultiheadAttention) and isinstance(model[1], BayesLinear)
    assert any("'1' (also '0.out_proj' inside '0')" in m for m in messages), messages


def two_shared_parents() -> nn.Sequential:
    lin = nn.Linear(3, 3)
    first, second = nn.Sequential(lin), nn.Sequential(lin)
    return nn.Sequential(first, second, first, second, A(lin))


def shared_parent_with_shared_child() -> nn.Sequential:
    lin = nn.Linear(3, 3)
    parent = nn.Sequential(lin, nn.ReLU())
    return nn.Sequential(parent, A(lin), parent)


def pinned_parent() -> nn.Sequential:
    lin = nn.Linear(3, 3)
    parent = nn.Sequential(lin)
    return nn.Sequential(A(parent), parent, A(lin))


def bayesian_with_plain_child() -> nn.Sequential:
    lin, bayes = nn.Linear(3, 3), BayesLinear(3, 3)
    bayes.extra = lin
    return nn.Sequential(bayes, lin)


def grandparent() -> nn.Sequential:
    lin = nn.Linear(3, 3)
    return nn.Sequential(nn.Sequential(A(lin)), lin)


def lazy_left_as_it_is(result: Any) -> None:
    """An excluded lazy module (what the lazy-module error suggests) is left as it is, with a row of 0 parameters
    (its size is unknown); it used to fail inside torch ("Attempted to use an uninitialized parameter")."""
    model, report, messages = result
    assert isinstance(model[0], nn.LazyLinear) and isinstance(model[1], BayesLinear) and not messages
    assert [(d.name, d.num_parameters, d.reason) for d in report.deterministic] == [("0", 0, "excluded by the user")]


def lazy_shared() -> nn.Sequential:
    lazy = nn.LazyLinear(3)
    return nn.Sequential(A(lazy), nn.Sequential(lazy))


def bidirectional_shared() -> nn.ModuleList:
    lstm = nn.LSTM(3, 3, bidirectional=True)
    return nn.ModuleList([A(lstm), nn.Sequential(lstm)])


EXCLUDED = "excluded by the user: one object with"
LEFT_WHOLE = "one object with"

CASES = [
    BadInput("exclude-parent-name", lambda: convert(reproducer(), exclude=["1"]), expect=same_as_excluding_the_child),
    BadInput("exclude-parent-name-rows", lambda: convert(reproducer(), exclude=["1"]),
             expect=one_plain_object("0.l", "1.0", EXCLUDED)),
    BadInput("exclude-parent-type", lambda: convert(reproducer(), exclude=[A]),
             expect=one_plain_object("0.l", "1.0", EXCLUDED)),
    BadInput("exclude-parent-met-first", lambda: convert(reproducer(excluded_first=True), exclude=["0"]),
             expect=one_plain_object("0.0", "1.l", EXCLUDED)),
    BadInput("exclude-grandparent", lambda: convert(grandparent(), exclude=["0"]),
             expect=one_plain_object("1", "0.0.l", EXCLUDED)),
    BadInput("exclude-one-of-two-shared-parents", lambda: convert(two_shared_parents(), exclude=["1"]),
             expect=one_plain_object("0.0", "4.l", EXCLUDED)),
    BadInput("exclude-shared-parent-at-one-place", lambda: convert(shared_parent_with_shared_child(), exclude=["2"]),
             expect=one_plain_object("1.l", "0.0", EXCLUDED)),
    BadInput("exclude-child-through-shared-parent", lambda: convert(shared_parent_with_shared_child(), exclude=["2.0"]),
             expect=one_plain_object("0.0", "1.l", "excluded by the user")),
    BadInput("pinned-parent-and-its-child", lambda: convert(pinned_parent(), exclude=["0"]),
             expect=one_plain_object("2.l", "1.0", EXCLUDED)),
    BadInput("exclude-parent-strict", lambda: convert(reproducer(), exclude=["1"], strict=True),
             expect=one_plain_object("0.l", "1.0", EXCLUDED)),
    BadInput("tied-through-excluded-parent", lambda: convert(tied_model(), exclude=["0"]),
             expect=tied_through_excluded_parent),
    BadInput("frozen-attention-shared", lambda: convert(frozen_attention_shared()),
             expect=one_plain_object("1", "0.out_proj", FROZEN)),
    BadInput("encoder-linear-shared", lambda: convert(encoder_shared()), expect=one_bayesian_object("1", "0.linear1")),
    BadInput("attention-out-proj-shared", lambda: convert(attention_shared()), expect=attention_split_and_warned),
    BadInput("plain-child-of-bayesian-shared", lambda: convert(bayesian_with_plain_child()),
             expect=one_plain_object("1", "0.extra", LEFT_WHOLE, deliberate=False)),
    BadInput("lazy-inside-excluded-parent-shared", lambda: convert(lazy_shared(), exclude=["0"]),
             expect=one_plain_object("1.0", "0.l", EXCLUDED)),
    BadInput("lazy-excluded", lambda: convert(nn.Sequential(nn.LazyLinear(3), nn.Linear(3, 2)), exclude=["0"]),
             expect=lazy_left_as_it_is),
    BadInput("unsupported-option-inside-excluded-parent", lambda: convert(bidirectional_shared(), exclude=[A]),
             expect=one_plain_object("1.0", "0.l", EXCLUDED)),
]  # fmt: skip


@pytest.mark.parametrize("case", params(CASES))
def test_bad_input(case: BadInput) -> None:
    check(case)


def test_to_deterministic_keeps_the_excluded_shared_module_one_object() -> None:
    bayes, _, _ = convert(reproducer(), exclude=["1"])
    plain = to_deterministic(bayes)
    assert type(plain[0].l) is nn.Linear and plain[0].l is plain[1][0] and type(plain[2]) is nn.Linear
    x = torch.randn(4, 3)
    assert torch.equal(plain[1](x), bayes[1](x))  # the excluded part kept its weights


def test_the_input_model_is_not_modified_and_the_result_runs() -> None:
    model = reproducer()
    before = model[0].l
    bayes, _, _ = convert(model, exclude=["1"])
    assert model[0].l is before is model[1][0] and type(before) is nn.Linear
    assert bayes[2](bayes[1](bayes[0](torch.randn(2, 3)))).shape == (2, 2)


@pytest.fixture
def block_converter() -> Any:
    register_converter(Block)(_block)
    yield
    del _CONVERTERS[Block]


def test_a_registered_converter_that_splits_a_shared_module_warns(block_converter: None) -> None:
    lin = nn.Linear(3, 3)
    model, _, messages = convert(nn.Sequential(Block(lin), nn.Sequential(lin)))
    assert isinstance(model[0], BayesLinear) and isinstance(model[1][0], BayesLinear)  # two objects: the converter's
    assert any("'1.0' (also '0.l' inside '0')" in m and "Exclude the converted module" in m for m in messages), messages
    _, _, quiet = convert(nn.Sequential(Block(lin), nn.Sequential(lin)), exclude=["0"])
    assert not quiet  # excluding the converted module keeps both plain and shared, without a warning
    _, _, unshared = convert(nn.Sequential(Block(nn.Linear(3, 3)), nn.Sequential(nn.Linear(3, 3))))
    assert not unshared


def test_a_converted_parent_inside_an_excluded_one_is_not_split_and_not_warned_about(block_converter: None) -> None:
    lin = nn.Linear(3, 3)
    block = Block(lin)
    model, _, messages = convert(nn.Sequential(A(block), block, nn.Sequential(lin)), exclude=["0"])
    assert model[0].l is model[1]  # the block: one object, left as it is
    assert type(model[1]) is Block and model[1].l is model[2][0] and type(model[2][0]) is nn.Linear
    assert not messages
