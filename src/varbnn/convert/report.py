"""What :func:`bayesianize` reports: a :class:`ConversionReport` (rows :class:`ConvertedModule` and
:class:`DeterministicModule`; ``str(report)`` is a table), and the :class:`ConversionWarning` for modules left
deterministic without being asked to. :func:`conversion_report` reports a model as it is now.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from varbnn.convert.registry import FROZEN


class ConversionWarning(UserWarning):
    """``bayesianize`` left modules that own parameters deterministic without being asked to."""


@dataclass(frozen=True)
class ConvertedModule:
    """A Bayesian module of the converted model.

    :ivar name: qualified name (as in ``named_modules``; ``""`` for the model itself).
    :ivar bayesian_type: its type, e.g. ``"BayesLinear"``.
    :ivar source_type: the plain type it was converted from (``None`` when unknown: :func:`conversion_report`, or a
        module that was Bayesian already).
    :ivar num_weights: elements of its random tensors (the plain module's parameter count).
    :ivar num_variational_parameters: parameters of its posteriors.
    :ivar also_at: the other names at which the same module object sits (a module used twice in the plain model,
        e.g. ``nn.Sequential(lin, nn.ReLU(), lin)``, stays ONE Bayesian module at every place: one posterior and one
        KL term, as the plain network had one weight; each call still draws its own weights). Empty when used once.
    :ivar num_random_tensors: its random tensors, each with a posterior and a KL term (2 for a ``BayesLinear`` with
        bias; 4 for a ``BayesMultiheadAttention`` with packed projections and biases: ``in_proj_weight``,
        ``in_proj_bias``, ``out_proj.weight``, ``out_proj.bias``); 0 for a converted module that is not a
        :class:`~varbnn.nn.BayesianModule` (a registered converter's container).
    """

    name: str
    bayesian_type: str
    source_type: str | None
    num_weights: int
    num_variational_parameters: int
    also_at: tuple[str, ...] = ()
    num_random_tensors: int = 0


@dataclass(frozen=True)
class DeterministicModule:
    """A module left as it was that owns parameters (or a subtree left whole: excluded, attention).

    :ivar name: qualified name (``""`` for the model itself).
    :ivar type_name: its type, e.g. ``"BatchNorm2d"``.
    :ivar num_parameters: parameters left deterministic (its own; a subtree's all).
    :ivar reason: why, e.g. ``"normalisation layer (deterministic by design)"``, ``"excluded by the user"``,
        ``"no Bayesian form registered"``.
    :ivar deliberate: ``True`` for normalisation layers, user exclusions and frozen modules (no warning); ``False`` for
        the modules the :class:`ConversionWarning` names and ``strict=True`` refuses.
    :ivar also_at: the other names at which the same module object sits (see :attr:`ConvertedModule.also_at`).
    """

    name: str
    type_name: str
    num_parameters: int
    reason: str
    deliberate: bool
    also_at: tuple[str, ...] = ()


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [header, *rows]]


@dataclass(frozen=True)
class ConversionReport:
    """What :func:`bayesianize` made Bayesian and what it left deterministic; ``str(report)`` is a table.

    :ivar converted: one :class:`ConvertedModule` per Bayesian module (a module used at several places is one row,
        its other places in ``also_at``).
    :ivar deterministic: one :class:`DeterministicModule` per parameter-owning module left as it was.
    """

    converted: tuple[ConvertedModule, ...]
    deterministic: tuple[DeterministicModule, ...]

    @property
    def unintended(self) -> tuple[DeterministicModule, ...]:
        """The deterministic modules that are not deliberate: what the warning names and ``strict=True`` refuses."""
        return tuple(d for d in self.deterministic if not d.deliberate)

    @property
    def shared(self) -> tuple[ConvertedModule | DeterministicModule, ...]:
        """The rows whose module sits at several places of the model (``also_at`` not empty)."""
        rows: list[ConvertedModule | DeterministicModule] = [*self.converted, *self.deterministic]
        return tuple(row for row in rows if row.also_at)

    @property
    def frozen(self) -> tuple[DeterministicModule, ...]:
        """The modules left deterministic because all their parameters had ``requires_grad=False``."""
        return tuple(d for d in self.deterministic if d.reason == FROZEN)

    @property
    def num_bayesian_weights(self) -> int:
        """Elements of every random tensor of the converted modules (the plain model's weights they replace)."""
        return sum(c.num_weights for c in self.converted)

    @property
    def num_random_tensors(self) -> int:
        """Random tensors (each with a posterior and a KL term) over every converted module."""
        return sum(c.num_random_tensors for c in self.converted)

    @property
    def num_deterministic_parameters(self) -> int:
        """Parameters left deterministic, over every :class:`DeterministicModule`."""
        return sum(d.num_parameters for d in self.deterministic)

    def summary(self) -> str:
        """One line: how many modules and weights were converted, and what was left deterministic, by type and reason."""
        text = (
            f"{len(self.converted)} modules Bayesian ({self.num_bayesian_weights:,} weights in "
            f"{self.num_random_tensors} random tensors)"
        )
        if not self.deterministic:
            text += "; nothing left deterministic"
        else:
            text += (
                f"; {len(self.deterministic)} left deterministic ({self.num_deterministic_parameters:,} parameters): "
                + _by_type(self.deterministic)
            )
        return text + _shared_text(self.shared)

    def __str__(self) -> str:
        lines = [
            f"Bayesian ({len(self.converted)} modules, {self.num_random_tensors} random tensors, "
            f"{self.num_bayesian_weights:,} weights):"
        ]
        rows = [
            (c.name or "(model)", f"{c.source_type} -> {c.bayesian_type}" if c.source_type else c.bayesian_type,
             str(c.num_random_tensors), f"{c.num_weights:,}", f"{c.num_variational_parameters:,}")
            for c in self.converted
        ]  # fmt: skip
        header = ("name", "type", "random tensors", "weights", "variational parameters")
        lines += _table(header, rows) if rows else ["  (none)"]
        lines.append(f"left deterministic ({len(self.deterministic)} modules, {self.num_deterministic_parameters:,} parameters):")
        left = [
            (d.name or "(model)", d.type_name, f"{d.num_parameters:,}", d.reason + ("" if d.deliberate else "  [warned]"))
            for d in self.deterministic
        ]
        lines += _table(("name", "type", "parameters", "reason"), left) if left else ["  (none)"]
        if self.shared:
            lines.append("shared (one module object at several places; a Bayesian one has one posterior, one KL term):")
            lines += [f"  {row.name or '(model)'} also at {', '.join(row.also_at)}" for row in self.shared]
        return "\n".join(lines)


def _shared_text(rows: Sequence[ConvertedModule | DeterministicModule]) -> str:
    if not rows:
        return ""
    shown = "; ".join(f"{row.name or '(model)'!r} also at {', '.join(map(repr, row.also_at))}" for row in rows[:3])
    return f"; shared module{'s' if len(rows) > 1 else ''} (one object at several places): {shown}" + (
        ", ..." if len(rows) > 3 else ""
    )


def _by_type(entries: Iterable[DeterministicModule], names: bool = False) -> str:
    groups: dict[tuple[str, str], list[DeterministicModule]] = {}
    for entry in entries:
        groups.setdefault((entry.type_name, entry.reason), []).append(entry)
    parts = []
    for (type_name, reason), members in groups.items():
        listed = ""
        if names:
            shown = ", ".join(repr(m.name or "(model)") for m in members[:3])
            listed = f" at {shown}{', ...' if len(members) > 3 else ''}"
        parts.append(f"{type_name} x{len(members)} ({reason}){listed}")
    return "; ".join(parts)
