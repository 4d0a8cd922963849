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
import json
import math
import os
import re
import reprlib
import stat
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from autoplan.errors import InputError, Problem
from autoplan.text import NOT_IN_NAMES

_MISSING: Any = object()


MAX_FILE_BYTES = 32 << 10  # a descriptor, plan or job file: the largest shipped is 4 KiB
MAX_DEPTH = 64  # nested mappings and lists (a plan file nests 4 deep)
MAX_NODES = 20_000  # values once aliases are expanded (a plan file holds a few hundred)
MAX_PROBLEMS = 20  # reported for one input; the rest are counted as "more"
MAX_NAME = 200  # characters of a model, cluster, device, stack or space name
# every integer and number a file gives is at most this unless its field says less: past
# any physical quantity autoplan models (2^50 ~ 1.1e15), far below where float arithmetic
# on it overflows or loses integers
MAX_MAGNITUDE = 1 << 50


def name_problem(value: str) -> str | None:
    """What keeps ``value`` from being a name (:meth:`Fields.name`), or None."""
    if len(value) > MAX_NAME:
        return f"expected a name of at most {MAX_NAME} characters, got {len(value)}"
    for i, ch in enumerate(value):
        if unicodedata.category(ch) in NOT_IN_NAMES:
            return (f"expected a name without control, separator or format characters, "
                    f"got U+{ord(ch):04X} at position {i}")
    return None


# libyaml's parser where PyYAML has it (every wheel on the common platforms): ten times
# the pure-Python one's speed, and its own nesting limit before any recursion
_Parser: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(_Parser):  # type: ignore[misc,valid-type]
    """A safe loader that refuses duplicate keys, and documents nested past ``MAX_DEPTH``
    or holding more than ``MAX_NODES`` values once their aliases are expanded (a
    "billion laughs" document: nine lines, 10^9 values once walked) or an alias inside
    itself: checked on the composed tree, before any value is built."""

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            _check_tree(node)
        return node  # type: ignore[no-any-return]


def _check_tree(root: yaml.Node) -> None:
    """Depth and expanded size of a composed document, without expanding anything: a
    node's count is 1 plus its children's and its depth 1 plus their deepest, each
    shared (aliased) node worked out once. Iterative: no recursion on any input."""
    counts: dict[int, tuple[int, int]] = {}  # id -> (values, depth)
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = _children(node)
        if done:
            open_.discard(key)
            below = [counts[id(c)] for c in children]
            count = 1 + sum(n for n, _ in below)
            depth = 1 + max((d for _, d in below), default=0)
            if depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_DEPTH} "
                                                              "levels", node.start_mark)
            if count > MAX_NODES:
                raise yaml.composer.ComposerError(
                    None, None, f"more than {MAX_NODES:,} values (an alias counts each time "
                                "it is used)", node.start_mark)
            counts[key] = (count, depth)
            continue
        if key in counts:
            continue
        if key in open_:
            raise yaml.composer.ComposerError(None, None, "an alias refers to the value holding it",
                                              node.start_mark)
        open_.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in counts)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            raise yaml.constructor.ConstructorError(
                None, None, "merge keys (<<) are not read: write the keys out", key_node.start_mark)
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"duplicate key {shown(key)} (first at line {seen[key].start_mark.line + 1})",
                key_node.start_mark,
            )
        seen[key] = key_node
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping  # type: ignore[arg-type]
)
_LEADING_ZERO = re.compile(r"^[-+]?0[0-9_]+$")


# underscores a person writes in a number: between groups of three digits, thousands
# (1_000, 16_384), before any point or exponent
_THOUSANDS = re.compile(r"[-+]?[0-9]{1,3}(?:_[0-9]{3})+(?:[.eE][-+.0-9eE]*)?")


def _odd_number(node: yaml.ScalarNode, kind: str) -> None:
    """YAML 1.1 reads ``2_5`` as 25 and ``1:30`` as 90 (base 60) where YAML 1.2, JSON and
    people read neither as a number: refused, as a typo would be. Underscores between
    thousands (``1_000``) are what they look like: kept."""
    value = node.value
    if ":" in value:
        raise yaml.constructor.ConstructorError(
            None, None, f"ambiguous {kind} {shown(value)}: YAML 1.1 reads digits with colons "
                        "in base 60 (1:30 is 90); quote it for a string", node.start_mark)
    if "_" in value and not _THOUSANDS.fullmatch(value):
        raise yaml.constructor.ConstructorError(
            None, None, f"ambiguous {kind} {shown(value)}: YAML 1.1 drops underscores "
                        "anywhere in a number (2_5 is 25); write the digits alone, or group "
                        "thousands (1_000)", node.start_mark)


def _construct_int(loader: _StrictLoader, node: yaml.ScalarNode) -> int:
    """YAML 1.1 reads ``010`` as octal 8 where YAML 1.2 and people read 10: refused; and
    digits with underscores or colons (:func:`_odd_number`)."""
    _odd_number(node, "integer")
    if _LEADING_ZERO.match(node.value):
        raise yaml.constructor.ConstructorError(
            None, None, f"ambiguous integer {shown(node.value)}: YAML 1.1 reads a leading zero as "
                        f"octal (010 is 8); write it without the zero", node.start_mark)
    return loader.construct_yaml_int(node)  # type: ignore[no-any-return]


def _construct_float(loader: _StrictLoader, node: yaml.ScalarNode) -> float:
    _odd_number(node, "number")
    return loader.construct_yaml_float(node)  # type: ignore[no-any-return]


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)  # type: ignore[arg-type]
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)  # type: ignore[arg-type]


# a number written in a CSV cell or a line of text: decimal digits, a point, an exponent;
# no underscores (Python's float("2_5") is 25), no inf or nan, no other script's digits
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def decimal(text: str) -> float | None:
    """``text`` (surrounding blanks aside) as a finite number written in decimal, or None
    where it is not one: what float() reads, less what it reads that no one writes."""
    text = text.strip()
    if not _DECIMAL.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None
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
    except RecursionError:  # MAX_DEPTH stops the composer first; this is a second fence
        raise InputError.single(source, "document", f"invalid YAML: nested deeper than "
                                                    f"{MAX_DEPTH} levels") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "document"
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError.single(source, where, f"invalid YAML: {problem}") from None


class DuplicateKey(ValueError):
    """A JSON object naming ``key`` twice (:func:`json_object`)."""

    def __init__(self, key: builtins.str):
        super().__init__(f"duplicate key {shown(key)}")
        self.key = key


def json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all distinct (``json`` keeps the last silently, as
    PyYAML would: refused here as the YAML loader refuses them): ``json.loads``'s
    ``object_pairs_hook``, raising :class:`DuplicateKey`."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def read_yaml(path: Path) -> Any:
    """Read and parse a YAML file (a ``.json`` one as JSON, its errors JSON's), reporting
    a missing file as input error."""
    text = _read_text(path)
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text, object_pairs_hook=json_object)
        except DuplicateKey as exc:
            raise InputError.single(str(path), "document", f"invalid JSON: {exc}") from None
        except json.JSONDecodeError as exc:
            raise InputError.single(str(path), f"line {exc.lineno}, column {exc.colno}",
                                    f"invalid JSON: {exc.msg}") from None
        except RecursionError:
            raise InputError.single(str(path), "document", "invalid JSON: nested too deep") from None
    return parse_yaml(text, str(path))


def read_limited(path: Path, max_bytes: int, what: str, *, source: str | None = None,
                 field: str = "", label: str | None = None) -> bytes:
    """The bytes of an input file, the one way every file input is read: a regular file
    only (a FIFO would block, a device never end), at most ``max_bytes`` (``what`` says
    what the file should have been), symbolic links followed, a loop of them refused.
    Errors name ``path`` (or ``label``, the path as the user wrote it); given ``source``
    (the file or flag that named it), as ``source: field: path``.

    The file is looked at before it is opened (opening a device can act: a watchdog, a
    tape), then opened without blocking and looked at again, so a FIFO put in its place
    between the two cannot hang the read."""
    def refused(message: str) -> InputError:
        named = clipped(str(path) if label is None else label, MAX_SHOWN_PATH)
        if source is None:
            return InputError.single(named, "", message)
        return InputError.single(source, field, f"{named}: {message}")

    def not_regular(mode: int) -> InputError:
        kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                else "a device or socket")
        return refused(f"not a regular file ({kind}): not {what}")

    too_big = f"larger than {_size(max_bytes)}: not {what}"
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise refused("file not found") from None
    except (OSError, ValueError) as exc:  # ELOOP: a link loop; EACCES; ENAMETOOLONG; a NUL
        raise refused(f"cannot read file: {getattr(exc, 'strerror', None) or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise not_regular(info.st_mode)
    if info.st_size > max_bytes:
        raise refused(too_big)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise refused(f"cannot read file: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # swapped for something else since the look above
            raise not_regular(mode)
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise refused(f"cannot read file: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:  # grew since the look above
        raise refused(too_big)
    return data


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def _read_text(path: Path) -> str:
    """The file's text, at most ``MAX_FILE_BYTES``."""
    data = read_limited(path, MAX_FILE_BYTES, "a descriptor, plan or job file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError.single(str(path), "", f"cannot read file: {exc}") from None


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxdict, _SHOWN.maxlist, _SHOWN.maxstring, _SHOWN.maxother = 2, 4, 4, 60, 60


# a path named in an error: the longest the file systems take (PATH_MAX 4096) is too long
# to read in a message, and a longer one is a value, not a path someone typed
MAX_SHOWN_PATH = 200


def clipped(text: str, limit: int = 60) -> str:
    """``text`` whole where it has at most ``limit`` characters, else its start and end
    around "...": a value named in an error, never echoed back whole."""
    if len(text) <= limit:
        return text
    keep = (limit - 3) // 2
    return f"{text[:keep]}...{text[len(text) - keep:]}"


def shown(value: Any) -> str:
    """``repr`` of a value read from input, cut short: an error never echoes a whole
    document back (a string of megabytes, a list aliased a billion times)."""
    return _SHOWN.repr(value)


def did_you_mean(given: str, names: Iterable[str]) -> str:
    """" (did you mean 'x'?)" for the valid name ``given`` most likely meant, or "": one
    it begins or holds (h100 -> h100-sxm) before the most similar spelling. Nothing
    for a long ``given``, whose comparison would cost more than it could tell."""
    names = sorted(names)
    if len(given) > 100:
        return ""
    lowered = given.lower()
    close = [n for n in names if n.lower().startswith(lowered)] if lowered else []
    close = close or ([n for n in names if lowered in n.lower()] if lowered else [])
    close = close[:3] or difflib.get_close_matches(given, names, n=1, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(n) for n in close)}?)" if close else ""


def _number(value: float) -> str:
    """An integer with thousands separators (limits read at a glance), else as given; past
    10^18 in scientific notation (a 300-digit value is not echoed back whole)."""
    if abs(value) >= 1e18:
        return f"{float(value):.3g}"
    return f"{value:,}" if isinstance(value, int) and abs(value) >= 10_000 else f"{value}"


def _type_name(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"boolean {value}"
    if isinstance(value, (int, float)):
        return f"number {value}"
    if isinstance(value, str):
        return f"string {shown(value)}"
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
        """Record a problem; past ``MAX_PROBLEMS`` only that more were found."""
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(Problem(self.source, self.key_path(key), message))
        elif len(self.problems) == MAX_PROBLEMS:
            self.problems.append(Problem(self.source, "", f"more problems (the first "
                                                          f"{MAX_PROBLEMS} are shown)"))

    @property
    def full(self) -> bool:
        """As many problems as are reported: looking for more is wasted."""
        return len(self.problems) > MAX_PROBLEMS

    def child(self, key: builtins.str, data: Any) -> Fields:
        return Fields(data, self.source, self.key_path(key), self.problems)

    def has(self, key: builtins.str) -> bool:
        self._asked.add(key)
        return key in self.data and self.data[key] is not None

    def _given(self, key: builtins.str) -> bool:
        """The mapping gives ``key`` a value (a default stands in otherwise, unchecked: a
        value given equal to it is checked as any other, so 0 is refused where 1 is the
        least, though 0 stands for "unset")."""
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
            if self.full:
                break
            if key in known:
                continue
            close = difflib.get_close_matches(str(key)[:100], sorted(known), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            valid = ", ".join(sorted(known))
            if close:  # a misspelt key: its "missing" twin says nothing new
                missing = Problem(self.source, self.key_path(close[0]), "missing required field")
                if missing in self.problems:
                    self.problems.remove(missing)
            name = str(key) if len(str(key)) <= 100 else str(key)[:97] + "..."
            self.fail(name, f"unknown field{hint}; valid fields: {valid}")

    # -- typed getters ---------------------------------------------------------
    def int(
        self, key: builtins.str, default: Any = _MISSING, *, min: int | None = None, max: int | None = None
    ) -> Any:
        value = self.raw(key, default)
        if value is None or not self._given(key):
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(key, f"expected an integer, got {_type_name(value)}")
            return None
        if isinstance(value, float):
            if not value.is_integer():
                self.fail(key, f"expected an integer, got {value}")
                return None
            value = int(value)
        return self._bounded(key, value, min, MAX_MAGNITUDE if max is None else max)

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
        if value is None or not self._given(key):
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
        return self._bounded(key, value, min, MAX_MAGNITUDE if max is None else max)

    def _bounded(self, key: builtins.str, value: Any, lo: Any, hi: Any) -> Any:
        if lo is not None and value < lo:
            self.fail(key, f"expected a value >= {_number(lo)}, got {_number(value)}")
            return None
        if hi is not None and value > hi:
            self.fail(key, f"expected a value <= {_number(hi)}, got {_number(value)}")
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

    def name(self, key: builtins.str, default: Any = _MISSING) -> Any:
        """A name: a non-empty string of at most :data:`MAX_NAME` characters with no control,
        line or paragraph separator, format (bidi, zero-width) or surrogate character. Names
        are data written into exported YAML, TOML, shell comments and terminals: a U+2028 in
        one would start a new YAML line, an ESC would drive the terminal."""
        value = self.str(key, default)
        if not isinstance(value, builtins.str):
            return value
        problem = name_problem(value)
        if problem:
            self.fail(key, problem)
            return None
        return value

    def enum(self, key: builtins.str, kind: Any, default: Any = _MISSING, *,
             members: Iterable[Any] | None = None) -> Any:
        """One of ``kind``'s members by its value (case-insensitive): an ``enum.Enum`` or
        an open enumeration such as the schedule registry (iterable, members with ``value``).
        ``members``: the ones this field accepts (and lists), where not all of ``kind``'s."""
        value = self.raw(key, default)
        accepted = list(kind if members is None else members)
        if value is None or (isinstance(value, kind) and value in accepted):
            return value
        for member in accepted:
            if value == member.value or (isinstance(value, str) and value.lower() == member.value):
                return member
        choices = " | ".join(str(m.value) for m in accepted)
        self.fail(key, f"expected one of {choices}, got {_type_name(value)}")
        return None

    def int_list(self, key: builtins.str, default: Any = _MISSING, *, min: builtins.int | None = None,
                 max: builtins.int | None = None) -> Any:
        """A non-empty list of integers, each at least ``min`` and at most ``max``
        (default :data:`MAX_MAGNITUDE`, as :meth:`int`)."""
        value = self.raw(key, default)
        if value is None or not self._given(key):
            return value
        if not isinstance(value, list) or not value:
            self.fail(key, f"expected a non-empty list of integers, got {_type_name(value)}")
            return None
        out = []
        for i, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, int):
                self.fail(f"{key}[{i}]", f"expected an integer, got {_type_name(item)}")
                return None
            if self._bounded(f"{key}[{i}]", item, min, MAX_MAGNITUDE if max is None else max) is None:
                return None
            out.append(item)
        return tuple(out)
