"""The walk of :func:`bayesianize` and :func:`conversion_report`: top-down over a model, converting what has a
registered converter and recording everything else that owns parameters as a report row.

It applies the rules of the package docstring (:mod:`varbnn.convert`): a module used at several places gets one
replacement at all of them; a module inside a subtree left as it is (excluded, frozen, a module left whole ...) stays as it is at
its other places too; frozen, partly frozen, tied and structurally unfaithful modules are left deterministic with
their reason.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.parameter import UninitializedParameter

from varbnn.convert.placement import _carry_hooks, _place_like
from varbnn.convert.registry import (
    _CONVERTERS,
    _LEFT,
    _NOT_CONVERTED,
    _PARTLY_FROZEN,
    _TIED,
    EXCLUDED,
    FROZEN,
    NO_BAYESIAN_FORM,
    ConversionContext,
    Converter,
    _lookup,
    _lookup_class,
)
from varbnn.convert.report import ConversionReport, ConvertedModule, DeterministicModule
from varbnn.convert.structure import _Pin, _places, _quoted, _structure_problem, _tied_parameters
from varbnn.nn.base import BayesianModule


class _Row:
    """A report row being collected, with the other places of its module."""

    def __init__(self, row: ConvertedModule | DeterministicModule) -> None:
        self.row = row
        self.also_at: list[str] = []

    def done(self) -> Any:
        return dataclasses.replace(self.row, also_at=tuple(self.also_at)) if self.also_at else self.row


class _Walker:
    """Walks a model top-down: converts what has a converter (when ``context`` is given), records the rest.

    A module object met again at another place (``nn.Sequential(lin, nn.ReLU(), lin)``) is given the same
    replacement there, and its row (and the rows of the modules inside it) lists the other place in ``also_at``.
    A module in ``pins`` (it sits inside a subtree left as it is, e.g. under an excluded parent) is left as it is at
    its other places too. ``dry=True`` decides without converting anything (the model is not changed) and collects in
    ``found_pins`` the modules inside the subtrees it leaves as they are: the ``pins`` of the walk that converts.
    """

    def __init__(
        self,
        context: Callable[[str], ConversionContext] | None,
        excluded_names: frozenset[str] = frozenset(),
        excluded_types: tuple[type[nn.Module], ...] = (),
        *,
        frozen: str = "keep",
        aliases: dict[int, list[str]] | None = None,
        ties: dict[int, str] | None = None,
        pins: dict[int, _Pin] | None = None,
        dry: bool = False,
    ) -> None:
        self.context = context
        self.pins = pins or {}
        self.dry = dry
        self.found_pins: dict[int, _Pin] = {}
        # id -> (a module inside one that a converter replaces whole, its place there, the converted one, its place)
        self.found_replaced: dict[int, tuple[nn.Module, str, nn.Module, str]] = {}
        self.excluded_names = excluded_names
        self.excluded_types = excluded_types
        self.frozen = frozen
        self.aliases = aliases or {}
        self.ties = ties or {}
        self.converted: list[_Row] = []
        self.deterministic: list[_Row] = []
        self._rows: dict[int, tuple[nn.Module, _Row]] = {}  # id(module placed in the model) -> its row
        self._done: dict[int, tuple[nn.Module, nn.Module]] = {}  # id(module visited) -> (it, what replaced it)

    def report(self) -> ConversionReport:
        return ConversionReport(tuple(r.done() for r in self.converted), tuple(r.done() for r in self.deterministic))

    def _add(self, rows: list[_Row], placed: nn.Module, row: ConvertedModule | DeterministicModule) -> None:
        entry = _Row(row)
        rows.append(entry)
        self._rows[id(placed)] = (placed, entry)

    def _leave(self, module: nn.Module, name: str, reason: str, deliberate: bool, recurse: bool = True) -> nn.Module:
        parameters = list(module.parameters(recurse=recurse))
        lazy = [p for p in parameters if isinstance(p, UninitializedParameter)]  # no size yet: counted as 0
        count = sum(p.numel() for p in parameters if not isinstance(p, UninitializedParameter))
        if count or lazy:
            self._add(self.deterministic, module, DeterministicModule(name, type(module).__name__, count, reason, deliberate))
        if recurse and self.dry:
            self._pin_inside(module, name, reason, deliberate)
        return module

    def _pin_inside(self, module: nn.Module, name: str, reason: str, deliberate: bool) -> None:
        """Note every module inside ``module`` (left as it is at ``name``, not walked into) in ``found_pins``."""
        for sub_name, sub in module.named_modules(prefix=name, remove_duplicate=False):
            if sub is not module and id(sub) not in self.found_pins:
                self.found_pins[id(sub)] = _Pin(sub, sub_name, name, reason, deliberate)

    def _record(self, name: str, new: nn.Module, source: nn.Module | None) -> nn.Module:
        variational = sum(p.numel() for p in new.parameters())
        if isinstance(new, BayesianModule):
            weights = sum(math.prod(q._require_built()) for _, q, _ in new.bayesian_tensors())
        else:
            weights = sum(p.numel() for p in (source if source is not None else new).parameters())
        source_type = type(source).__name__ if source is not None else None
        tensors = len(list(new.bayesian_tensors())) if isinstance(new, BayesianModule) else 0
        row = ConvertedModule(name, type(new).__name__, source_type, weights, variational, num_random_tensors=tensors)
        self._add(self.converted, new, row)
        return new

    def _also_at(self, placed: nn.Module, name: str) -> None:
        for sub_name, sub in placed.named_modules(prefix=name, remove_duplicate=False):
            found = self._rows.get(id(sub))
            if found is not None and found[0] is sub:
                row = found[1]
                if sub_name != row.row.name and sub_name not in row.also_at:
                    row.also_at.append(sub_name)

    def visit(self, module: nn.Module, name: str) -> nn.Module:
        """The module to put at ``name``: a converted one, or ``module`` itself (its children visited); a module met
        before gets what it got the first time."""
        done = self._done.get(id(module))
        if done is not None and done[0] is module:
            self._also_at(done[1], name)
            return done[1]
        placed = self._visit(module, name)
        self._done[id(module)] = (module, placed)
        return placed

    def _all_frozen(self, module: nn.Module, recurse: bool = True) -> bool:
        parameters = list(module.parameters(recurse=recurse))
        return self.frozen == "keep" and bool(parameters) and not any(p.requires_grad for p in parameters)

    def _visit(self, module: nn.Module, name: str) -> nn.Module:
        places = self.aliases.get(id(module), [name])
        if any(n in self.excluded_names for n in places) or (self.excluded_types and isinstance(module, self.excluded_types)):
            return self._leave(module, name, EXCLUDED, True)
        if isinstance(module, BayesianModule):
            if self.dry:
                self._pin_inside(module, name, "a Bayesian module already, left as it is", False)
                return module
            return self._record(name, module, None)
        pin = self.pins.get(id(module))
        if pin is not None and pin.module is module:  # also inside a subtree left as it is: one object, so here too
            self._leave(module, name, pin.reason(), pin.deliberate)
            found = self._rows.get(id(module))
            if found is not None and found[0] is module:
                found[1].also_at.extend(p for p in places if p != name and p not in found[1].also_at)
            return module
        registered, converter = _lookup_class(_CONVERTERS, module)
        if converter is not None:
            assert registered is not None
            return self._convert(module, name, registered, converter)
        left = _lookup(_LEFT, module)
        if left is not None:
            reason, warn = left
            if warn and self._all_frozen(module):
                return self._leave(module, name, FROZEN, True)
            return self._leave(module, name, reason, not warn)
        if any(True for _ in module.parameters(recurse=False)):
            if self._all_frozen(module, recurse=False):
                self._leave(module, name, FROZEN, True, recurse=False)
            else:
                self._leave(module, name, NO_BAYESIAN_FORM, False, recurse=False)
        return self._children(module, name)

    def _children(self, module: nn.Module, name: str) -> nn.Module:
        # module._modules, not named_children(): that skips a module's second place (nn.Sequential(lin, act, lin))
        for child_name, child in list(module._modules.items()):
            if child is None:
                continue
            new = self.visit(child, f"{name}.{child_name}" if name else child_name)
            if new is not child:
                setattr(module, child_name, new)
        return module

    def _convert(self, module: nn.Module, name: str, registered: type[nn.Module], converter: Converter) -> nn.Module:
        if self.frozen == "keep":
            frozen = [n for n, p in module.named_parameters() if not p.requires_grad]
            if frozen and self._all_frozen(module):
                return self._leave(module, name, FROZEN, True)
            if frozen:
                return self._leave(module, name, _PARTLY_FROZEN.format(names=_quoted(frozen)), False)
        problem = _structure_problem(module, registered)
        if problem is not None:
            reason, whole = problem
            if whole:
                return self._leave(module, name, reason, False)
            self._leave(module, name, reason, False, recurse=False)
            return self._children(module, name)
        ties = [self.ties[id(sub)] for sub in module.modules() if id(sub) in self.ties]  # (a submodule's: MHA.out_proj)
        if ties:
            return self._leave(module, name, _TIED.format(pairs="; ".join(ties)), False)
        if self.context is None:
            return self._leave(module, name, _NOT_CONVERTED, False)
        if self.dry:
            for sub_name, sub in module.named_modules(prefix=name, remove_duplicate=False):
                if sub is not module:  # replaced with the module by its converter: not one object with another place
                    self.found_replaced.setdefault(id(sub), (sub, sub_name, module, name))
            return module
        if isinstance(module, LazyModuleMixin) and module.has_uninitialized_params():
            where = repr(name) if name else "the model"
            raise ValueError(
                f"{where} is a {type(module).__name__} whose parameters are not initialised yet (a lazy module): run one "
                f"forward pass with an example input (model(x)) before bayesianize, so that its shapes are known"
                + (f", or pass exclude=[{name!r}]" if name else "")
            )
        new = converter(module, self.context(name))
        _place_like(new, module)
        _carry_hooks(module, new)
        return self._record(name, new, module)


def conversion_report(model: nn.Module) -> ConversionReport:
    """The :class:`ConversionReport` of a model as it is now: its Bayesian modules, and the modules that own
    parameters and are deterministic (a plain module of a convertible type is reported as not converted; the
    ``source_type`` of a Bayesian module is not known here and is ``None``)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    walker = _Walker(None, aliases=_places(model), ties=_tied_parameters(model))
    walker.visit(model, "")
    return walker.report()
