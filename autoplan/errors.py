"""Errors a user can cause. Internal invariants use ``assert`` instead."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

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


@contextlib.contextmanager
def naming(*given: tuple[str, object | None], every: str | None = None) -> Iterator[None]:
    """Errors about a file a flag named say so: a problem whose source is a flag's value (a
    path: ``--stack /dev/zero``) is reported as ``FLAG: PATH: ...``, so that the message
    names the flag as well as the file (for the flags whose file is not the command's
    subject: a stack, a space, a profile, a draft model, a runs log; a model or cluster
    file's errors start with the file, as a plan's do). ``every``: the flag every problem
    raised in the block is about (``--runs``: a runs log's rows name files of their own, a
    cluster or model path; the message then names the flag and the log first)."""
    try:
        yield
    except InputError as exc:
        values: dict[str, tuple[str, str]] = {}
        for flag, value in given:
            if value is not None:
                for spelling in (str(value), str(Path(str(value))), str(Path(str(value)).expanduser())):
                    values.setdefault(spelling, (flag, str(value)))
        flags = {flag for flag, _ in given}

        def named(p: Problem) -> Problem:
            if p.source in flags:
                return p
            if p.source in values:
                return Problem(values[p.source][0], "", str(p))
            if every is not None:
                path = next((v for f, v in given if f == every and v is not None), None)
                return Problem(every, "", f"{path}: {p}" if path is not None else str(p))
            return p

        problems = [named(p) for p in exc.problems]
        if problems == list(exc.problems):
            raise
        raise InputError(problems) from None
