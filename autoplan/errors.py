"""Errors a user can cause. Internal invariants use ``assert`` instead."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# what drawing a PNG says where matplotlib (the ``png`` extra, pyproject.toml: png =
# ["matplotlib>=3.7"]) is missing: the README's install line; the timeline and the fronts
# say it alike
PNG_MISSING = ('PNG needs matplotlib: pip install "autoplan[png]" (from a checkout: '
               'pip install ".[png]"), or write .svg')


class AutoplanError(Exception):
    """Base class for every error caused by input; the CLI maps it to exit 2."""

    exit_code = 2


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with one field of one input."""

    source: str  # file path, or a label such as "--model" or "<inline>"
    field: str  # dotted key path, e.g. "model.layers" or "plans[2].layout.tp"
    message: str  # "expected ..., got ..."

    def __str__(self) -> str:
        where = f"{self.source}: {self.field}" if self.field else self.source
        return f"{where}: {self.message}"


class InputError(AutoplanError):
    """Every problem found in one input, reported together."""

    def __init__(self, problems: Sequence[Problem]):
        assert problems, "InputError needs at least one problem"
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    @classmethod
    def single(cls, source: str, field: str, message: str) -> InputError:
        return cls([Problem(source, field, message)])


class NoFeasiblePlan(AutoplanError):
    """The search found no plan that fits; the message says why, with numbers."""

    exit_code = 1
