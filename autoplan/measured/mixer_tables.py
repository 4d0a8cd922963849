"""Serving's measured token-mixer tables: one layer's Gated DeltaNet kernels, Mamba-2's causal
conv, DeepSeek Sparse Attention's whole block and DeepSeek-V4's compressed-attention modules
(C, H), timed per GPU and engine version, shipped
under ``profiles/measured/mixers/`` (made from NVIDIA AIConfigurator's tables by
:mod:`autoplan.measured.aiconfigurator_mixers`, which says what each table measured).

Plain Python on the lookup path (no pandas): a serving simulation asks for thousands of
iterations.

A file (``# autoplan-mixer-kernels: 1``) holds one ``kind`` (gdn, mamba2, dsa, dsv4_csa,
dsv4_hca) of one ``descriptor`` (the autoplan device), ``engine`` and ``engine_version``; its
``key`` line says what a key is (a GPU's share of a layer: its heads and head dims, its conv
channels, or a DSA or DeepSeek-V4 architecture's dims with its heads and KV dtype, the dims
written as the alias of an ``arch.<alias>: <name> <dims>`` line); ``axis.context`` and
``axis.generation`` the lengths of its columns (tokens a sequence computes; DSA's and
DeepSeek-V4's generation: the context each sequence reads); each row ``phase,key,batch,us...`` one
batch size's microseconds over that phase's lengths. ``applies`` names the phases the cost
model takes from the file (``context``, ``generation``; ``yes``: both, ``no``: none); the
rest of the file is shipped, read by :func:`shipped_mixers` with ``every=True``.

Lookup (:meth:`MixerTables.seconds`): inside a key's grid, the bilinear interpolation of
log(time) in log(batch) and log(length) between the four cells around the point: exact at
a cell, and exact for any time that is a power law of both between them. Outside (a batch
or a length past the grid's edge) it answers the time at the nearest point inside and that
point, for the cost model to scale by its own curve (as the training GEMM grids do,
:mod:`autoplan.measured.kernels`). A key the file lacks, a phase it does not apply, or a
device without files answers None: the cost model keeps its roofline.

Which file (:func:`shipped_mixers`): per kind, of the files of the device and engine, the
newest version not after the one asked, else the engine's newest of the same major version
(the serving profiles' rule, :mod:`autoplan.measured.shipped`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from autoplan import resources
from autoplan.descriptors.strict import read_limited
from autoplan.errors import InputError
from autoplan.measured.kernels import bracket, clamp, positive_number, read_header
from autoplan.measured.shipped import _pick_version

MIXERS_DIR = ("measured", "mixers")
FORMAT = "1"
MAX_TABLE_BYTES = 1 << 20
US = 1e-6
PHASES = ("context", "generation")
KINDS = ("gdn", "mamba2", "dsa", "dsv4_csa", "dsv4_hca")


def _label(path: Path) -> str:
    return "profiles/" + "/".join(MIXERS_DIR) + f"/{path.name}"


@dataclass(frozen=True, slots=True)
class Grid:
    """One key's grid in one phase: log(seconds) at [batch][length]."""

    batches: tuple[float, ...]
    lengths: tuple[float, ...]
    log_s: tuple[tuple[float, ...], ...]

    def seconds(self, batch: float, length: float) -> tuple[float, float, float]:
        """(seconds, batch, length) at the nearest point inside the grid (module doc)."""
        b, s = clamp(self.batches, batch), clamp(self.lengths, length)
        (i, x), (j, y) = bracket(self.batches, b), bracket(self.lengths, s)
        total = 0.0
        for di, wi in ((0, 1 - x), (1, x)):
            if not wi:
                continue
            row = self.log_s[i + di]
            for dj, wj in ((0, 1 - y), (1, y)):
                if wj:
                    total += wi * wj * row[j + dj]
        return math.exp(total), b, s


@dataclass(frozen=True, slots=True, eq=False)
class MixerTable:
    """One file: a kind's grids per (phase, key) on one device and engine version."""

    source: str  # the file's label
    kind: str
    applies: frozenset[str]  # the phases the cost model takes from it
    grids: dict[tuple[str, str], Grid]
    aliases: dict[str, str] = field(default_factory=dict)  # DSA: architecture dims -> the key's alias
    meta: dict[str, str] = field(default_factory=dict)
    identity: str = ""  # path and modification time (MixerTables' equality)

    def grid(self, phase: str, key: str) -> Grid | None:
        """The grid of ``key`` (DSA: its dims written out, resolved to the file's alias)."""
        dims, sep, rest = key.partition("/")
        if sep and dims in self.aliases:
            key = f"{self.aliases[dims]}/{rest}"
        return self.grids.get((phase, key))


@dataclass(frozen=True, slots=True, eq=False)
class MixerTables:
    """A device's measured mixer tables for one engine version (``Device.mixer_kernels``):
    a table per kind, any absent. Equal when read from the same files, unchanged."""

    tables: dict[str, MixerTable]
    every: bool = False  # every phase, whatever the files' ``applies`` lines say
    _key: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_key", (str(self.every), *sorted(
            f"{t.source} {t.identity}" for t in self.tables.values())))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MixerTables) and other._key == self._key

    def __hash__(self) -> int:
        return hash(self._key)

    def _grid(self, kind: str, phase: str, key: str) -> tuple[MixerTable, Grid] | None:
        table = self.tables.get(kind)
        if table is None or not (self.every or phase in table.applies):
            return None
        grid = table.grid(phase, key)
        return None if grid is None else (table, grid)

    def source(self, kind: str, phase: str, key: str) -> str | None:
        """The file that prices ``key`` of ``kind`` in ``phase``, or None where none does."""
        found = self._grid(kind, phase, key)
        return None if found is None else found[0].source

    def seconds(self, kind: str, phase: str, key: str, batch: float, length: float
                ) -> tuple[float, float, float] | None:
        """(seconds, batch, length): one layer's measured time at the nearest point of the
        grid inside it, and that point (module doc); None where nothing applies."""
        found = self._grid(kind, phase, key)
        if found is None or batch <= 0 or length <= 0:
            return None
        return found[1].seconds(batch, length)

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(sorted(t.source for t in self.tables.values()))


# --------------------------------------------------------------------------- files

def _axis(meta: dict[str, str], phase: str, label: str) -> tuple[float, ...] | None:
    line = meta.get(f"axis.{phase}")
    if line is None:
        return None
    words = line.split()
    axis = tuple(positive_number(w, label, f"axis.{phase}") for w in words[1:])
    if not axis or list(axis) != sorted(set(axis)):
        raise InputError.single(label, f"axis.{phase}", "expected a name, then lengths ascending")
    return axis


def applies(meta: dict[str, str], label: str) -> frozenset[str]:
    """The phases a file's ``# applies:`` line names (module doc; no line: both)."""
    words = {w.strip() for w in meta.get("applies", "yes").lower().replace(",", " ").split()}
    if words == {"yes"}:
        return frozenset(PHASES)
    if words == {"no"}:
        return frozenset()
    unknown = sorted(words - set(PHASES))
    if unknown:
        raise InputError.single(label, "applies", f"expected yes, no or phases of {', '.join(PHASES)}, "
                                                  f"got {unknown[0]!r}")
    return frozenset(words)


def parse_mixer_table(text: str, label: str) -> MixerTable:
    """A mixer table file (module doc); every row checked."""
    meta: dict[str, str] = {}
    lines = [ln for ln in text.splitlines() if ln.strip()]
    body = 0
    while body < len(lines) and lines[body].startswith("#"):
        key, _, value = lines[body][1:].partition(":")
        meta[key.strip()] = value.strip()
        body += 1
    if meta.get("autoplan-mixer-kernels") != FORMAT:
        raise InputError.single(label, "", "not an autoplan mixer table "
                                           f"(want '# autoplan-mixer-kernels: {FORMAT}')")
    kind = meta.get("kind", "")
    if kind not in KINDS:
        raise InputError.single(label, "kind", f"expected one of {', '.join(KINDS)}, got {kind!r}")
    axes = {phase: _axis(meta, phase, label) for phase in PHASES}
    if body < len(lines) and lines[body].startswith("phase,"):
        body += 1
    cells: dict[tuple[str, str], dict[float, tuple[float, ...]]] = {}
    for number, line in enumerate(lines[body:], body + 1):
        where = f"line {number}"
        parts = [p.strip() for p in line.split(",")]
        phase = parts[0]
        axis = axes.get(phase)
        if axis is None:
            raise InputError.single(label, where,
                                    f"phase: expected one with an axis.<phase> line, got {phase!r}")
        if len(parts) != 3 + len(axis):
            raise InputError.single(label, where, f"expected {3 + len(axis)} values, got {len(parts)}")
        batch = positive_number(parts[2], label, where)
        cells.setdefault((phase, parts[1]), {})[batch] = tuple(
            math.log(positive_number(v, label, where) * US) for v in parts[3:])
    if not cells:
        raise InputError.single(label, "", "no rows")
    grids = {}
    for (phase, key), rows in cells.items():
        axis = axes[phase]
        assert axis is not None
        batches = tuple(sorted(rows))
        grids[(phase, key)] = Grid(batches, axis, tuple(rows[b] for b in batches))
    aliases = {}
    for name, value in meta.items():
        if name.startswith("arch."):
            words = value.split()
            if len(words) < 2:
                raise InputError.single(label, name, "expected an architecture and its dims")
            aliases[words[1]] = name[len("arch."):]
    return MixerTable(label, kind, applies(meta, label), grids, aliases, meta)


@lru_cache(maxsize=64)
def _read(path: Path, mtime_ns: int) -> MixerTable:
    label = _label(path)
    try:
        text = read_limited(path, MAX_TABLE_BYTES, "a mixer table", label=label).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError.single(label, "", f"cannot read file: {exc}") from None
    table = parse_mixer_table(text, label)
    return MixerTable(table.source, table.kind, table.applies, table.grids, table.aliases, table.meta,
                      f"{path}@{mtime_ns}")


@lru_cache(maxsize=256)
def _header(path: Path, mtime_ns: int) -> dict[str, str]:
    return read_header(path, _label(path))


def mixers_dir() -> Path:
    return resources.profiles_dir().joinpath(*MIXERS_DIR)


def _files(folder: Path) -> Iterable[tuple[Path, int, dict[str, str]]]:
    for path in sorted(folder.iterdir()):
        if path.suffix == ".csv" and path.is_file():
            mtime = path.stat().st_mtime_ns
            yield path, mtime, _header(path, mtime)


def shipped_mixers(device_name: str, engine: str, version: str | None = None,
                   every: bool = False) -> MixerTables | None:
    """The mixer tables shipped for ``device_name`` and ``engine`` at ``version`` (module
    doc), or None where there are none; ``every``: their every phase, whatever their
    ``applies`` lines say. Read once per file."""
    folder = mixers_dir()
    if not folder.is_dir():
        return None
    by_kind: dict[str, list[tuple[Path, int, str]]] = {}
    for path, mtime, header in _files(folder):
        if header.get("descriptor") == device_name and header.get("engine") == engine:
            entry = (path, mtime, header.get("engine_version", ""))
            by_kind.setdefault(header.get("kind", ""), []).append(entry)
    tables = {}
    for kind, found in by_kind.items():
        picked = _pick_version(found, version)
        if picked is not None:
            table = _read(*picked)
            if every or table.applies:
                tables[kind] = table
    return MixerTables(tables, every) if tables else None
