"""The shape of a bad-input table (like torch's ``EXAMPLES``): one row per input an audit fed the library.

Each ``test_bad_inputs_*.py`` module holds a list of :class:`BadInput` rows and one parametrized test that runs
:func:`check`. A row either expects a clear error (``raises`` + a regex ``match`` that names the argument and what
is allowed) or a correct result (``expect`` is called with the return value and asserts on it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest


@dataclass(frozen=True)
class BadInput:
    id: str
    call: Callable[[], Any]
    raises: type[BaseException] | tuple[type[BaseException], ...] | None = None
    match: str | None = None
    expect: Callable[[Any], None] | None = None

    def __post_init__(self) -> None:
        if (self.raises is None) == (self.expect is None):
            raise ValueError(f"{self.id}: give exactly one of raises= or expect=")


def check(case: BadInput) -> None:
    """Run one row: the error it must raise (never a suggestion of ``weights_only=False``) or the result check."""
    if case.raises is not None:
        with pytest.raises(case.raises, match=case.match) as info:
            case.call()
        assert "weights_only=False" not in str(info.value), f"{case.id}: the message suggests weights_only=False"
    else:
        assert case.expect is not None
        case.expect(case.call())


def params(cases: list[BadInput]) -> list[Any]:
    """``pytest.param`` per row, with the row's id (ids must be unique within a table)."""
    ids = [c.id for c in cases]
    duplicated = {i for i in ids if ids.count(i) > 1}
    if duplicated:
        raise ValueError(f"duplicate bad-input ids: {sorted(duplicated)}")
    return [pytest.param(c, id=c.id) for c in cases]
