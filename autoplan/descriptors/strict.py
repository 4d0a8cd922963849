"""Strict YAML reading: the one place input is validated.

PyYAML keeps the last of two duplicate keys silently and reads ``989e12`` as a
string; this loader refuses the first and reads the second as a number.
:class:`Fields` walks one mapping, records every problem with its key path and
refuses unknown keys with the nearest valid one suggested, so a whole file's
problems are reported at once.
"""

from __future__ import annotations

import builtins
import difflib
import enum
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from autoplan.errors import InputError, Problem

E = TypeVar("E", bound=enum.Enum)
_MISSING: Any = object()


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"duplicate key {key!r} (first at line {seen[key].start_mark.line + 1})",
                key_node.start_mark,
            )
        seen[key] = key_node
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping  # type: ignore[arg-type]
)
# YAML 1.1 wants a dot in a float ("1.0e3"); people write "989e12" and mean a number.
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text; a syntax error or duplicate key becomes an InputError."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "document"
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError.single(source, where, f"invalid YAML: {problem}") from None


def read_yaml(path: Path) -> Any:
    """Read and parse a YAML (or JSON) file, reporting a missing file as input error."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError.single(str(path), "", "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError.single(str(path), "", f"cannot read file: {exc}") from None
    return parse_yaml(text, str(path))


def _type_name(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"boolean {value}"
    if isinstance(value, (int, float)):
        return f"number {value}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


class Fields:
    """Reads typed fields out of one mapping, collecting problems instead of raising.

    Every getter returns the value, or None where it recorded a problem; call
    :meth:`close` after the last getter to refuse keys nobody asked for.
    """

    def __init__(self, data: Any, source: str, path: str, problems: list[Problem]):
        self.source = source
        self.path = path
        self.problems = problems
        self.ok = isinstance(data, Mapping)
        if not self.ok:
            self.fail("", f"expected a mapping, got {_type_name(data)}")
            data = {}
        self.data: Mapping[str, Any] = data
        self._asked: set[str] = set()

    # -- reporting -------------------------------------------------------------
    def key_path(self, key: builtins.str) -> str:
        if not key:
            return self.path
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: builtins.str, message: str) -> None:
        self.problems.append(Problem(self.source, self.key_path(key), message))

    def child(self, key: builtins.str, data: Any) -> Fields:
        return Fields(data, self.source, self.key_path(key), self.problems)

    def has(self, key: builtins.str) -> bool:
        self._asked.add(key)
        return key in self.data and self.data[key] is not None

    def raw(self, key: builtins.str, default: Any = _MISSING) -> Any:
        self._asked.add(key)
        if key in self.data and self.data[key] is not None:
            return self.data[key]
        if default is _MISSING:
            self.fail(key, "missing required field")
        return None if default is _MISSING else default

    def close(self, extra_known: Iterable[str] = ()) -> None:
        known = self._asked | set(extra_known)
        for key in self.data:
            if key in known:
                continue
            close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            valid = ", ".join(sorted(known))
            if close:  # a misspelt key: its "missing" twin says nothing new
                missing = Problem(self.source, self.key_path(close[0]), "missing required field")
                if missing in self.problems:
                    self.problems.remove(missing)
            self.fail(str(key), f"unknown field{hint}; valid fields: {valid}")

    # -- typed getters ---------------------------------------------------------
    def int(
        self, key: builtins.str, default: Any = _MISSING, *, min: int | None = None, max: int | None = None
    ) -> Any:
        value = self.raw(key, default)
        if value is None or (value is default and default is not _MISSING):
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(key, f"expected an integer, got {_type_name(value)}")
            return None
        if isinstance(value, float):
            if not value.is_integer():
                self.fail(key, f"expected an integer, got {value}")
                return None
            value = int(value)
        return self._bounded(key, value, min, max)

    def float(
        self,
        key: builtins.str,
        default: Any = _MISSING,
        *,
        min: float | None = None,
        max: float | None = None,
        positive: bool = False,
    ) -> Any:
        value = self.raw(key, default)
        if value is None or (value is default and default is not _MISSING):
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(key, f"expected a number, got {_type_name(value)}")
            return None
        value = float(value)
        if not math.isfinite(value):
            self.fail(key, f"expected a finite number, got {value}")
            return None
        if positive and value <= 0:
            self.fail(key, f"expected a number > 0, got {value:g}")
            return None
        return self._bounded(key, value, min, max)

    def _bounded(self, key: builtins.str, value: Any, lo: Any, hi: Any) -> Any:
        if lo is not None and value < lo:
            self.fail(key, f"expected a value >= {lo}, got {value}")
            return None
        if hi is not None and value > hi:
            self.fail(key, f"expected a value <= {hi}, got {value}")
            return None
        return value

    def bool(self, key: builtins.str, default: Any = _MISSING) -> Any:
        value = self.raw(key, default)
        if value is None or isinstance(value, bool):
            return value
        self.fail(key, f"expected true or false, got {_type_name(value)}")
        return None

    def str(self, key: builtins.str, default: Any = _MISSING) -> Any:
        value = self.raw(key, default)
        if value is None or isinstance(value, str):
            if isinstance(value, str) and not value.strip():
                self.fail(key, "expected a non-empty string, got ''")
                return None
            return value
        self.fail(key, f"expected a string, got {_type_name(value)}")
        return None

    def enum(self, key: builtins.str, kind: type[E], default: Any = _MISSING) -> Any:
        value = self.raw(key, default)
        if value is None or isinstance(value, kind):
            return value
        for member in kind:
            if value == member.value or (isinstance(value, str) and value.lower() == member.value):
                return member
        choices = " | ".join(str(m.value) for m in kind)
        self.fail(key, f"expected one of {choices}, got {_type_name(value)}")
        return None

    def int_list(self, key: builtins.str, default: Any = _MISSING, *, min: builtins.int | None = None) -> Any:
        value = self.raw(key, default)
        if value is None or (value is default and default is not _MISSING):
            return value
        if not isinstance(value, list) or not value:
            self.fail(key, f"expected a non-empty list of integers, got {_type_name(value)}")
            return None
        out = []
        for i, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, int):
                self.fail(f"{key}[{i}]", f"expected an integer, got {_type_name(item)}")
                return None
            if min is not None and item < min:
                self.fail(f"{key}[{i}]", f"expected a value >= {min}, got {item}")
                return None
            out.append(item)
        return tuple(out)
