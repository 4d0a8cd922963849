"""Measured kernel grids for training: GEMM latencies on a grid of shapes and NCCL collective
latencies by size and GPU count, per device, shipped under ``profiles/measured/kernels/``
(made from NVIDIA AIConfigurator's tables by :func:`autoplan.measured.aiconfigurator.write_kernel_grids`).

Plain Python on the lookup path (no pandas, no scikit-learn): a search prices thousands of
shapes and must not pay their imports.

GEMMs (:class:`GemmGrid`): the latency of an (m x k) @ (k x n) GEMM at every (m, n, k) of
three axes, per dtype. Inside the grid a shape's time is the multilinear interpolation of
log(time) in log(m), log(n), log(k) between the 8 grid points around it: exact at a grid
point, and exact for any time that is a power law of the dims between them (a GEMM at a
constant rate: time ~ m n k), so a shape between two grid points takes a time between
theirs. Outside the grid :meth:`GemmGrid.gemm` answers the time at the nearest shape inside
it (each dim clamped to its axis) and that shape, for the cost model to scale by its own
curve (``kernels.compute``). fp16 GEMMs are answered by the bf16 table: the tensor cores run
both at one rate (one peak in every datasheet).

Collectives (:class:`CommGrid`): the latency of NCCL's all-reduce, all-gather, reduce-scatter
and all-to-all over 2, 4 or 8 GPUs of one NVLink domain, at message sizes 512 B to 512 MiB
(nccl-tests' ``size``: the whole buffer: all-reduce's, the all-gather's output, the
reduce-scatter's input, each rank's all-to-all send buffer; autoplan's ``nbytes``).
Between sizes, log(time) is linear in log(bytes); below the smallest the smallest's time (the
latency floor); above the largest, the largest's bus bandwidth (time ~ bytes). A GPU count
the table lacks answers None (the caller keeps its analytic time).

A device carries both as its ``kernels`` (:class:`KernelTables`, ``Device.kernels``), which
the training door attaches (``measured.door.corrected`` without an engine, on a device with
shipped grids and no measured profile); serving never sees them. **Which grids the door
attaches** is each file's ``# applies:`` header line (``yes``; ``no``: shipped, read by
``shipped_kernels(name, every=True)`` and ``benchmarks/accuracy.py --gemm-grids``, not
attached; no line: ``yes``). The shipped NCCL grids apply; the GEMM grids do not:
on the calibration runs (``python benchmarks/accuracy.py``, leave-one-source-out) the NCCL
grids lower the held-out error of every slice, and the GEMM grids, added to them, raise it
(profiles/measured/README.md, "Training's kernel grids", has the numbers). Set a GEMM
grid's line to ``yes`` to price training's GEMMs with it.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from autoplan import resources
from autoplan.descriptors.strict import read_limited
from autoplan.errors import InputError
from autoplan.vocab import Dtype

KERNELS_DIR = ("measured", "kernels")
FORMAT = "1"
MAX_GRID_BYTES = 4 << 20
US = 1e-6
# the table that answers each dtype (fp16 runs at bf16's tensor-core rate: module doc)
TABLE_DTYPE = {Dtype.BF16: "bf16", Dtype.FP16: "bf16", Dtype.FP8: "fp8", Dtype.FP4: "fp4"}
COMM_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def _label(path: Path) -> str:
    return "profiles/" + "/".join(KERNELS_DIR) + f"/{path.name}"


def bracket(axis: tuple[float, ...], x: float) -> tuple[int, float]:
    """(i, w): x lies between axis[i] and axis[i + 1] at weight w in log space (x inside the
    axis; a one-point axis gives (0, 0))."""
    if len(axis) == 1:
        return 0, 0.0
    i = min(max(bisect.bisect_right(axis, x) - 1, 0), len(axis) - 2)
    lo, hi = axis[i], axis[i + 1]
    return i, (math.log(x) - math.log(lo)) / (math.log(hi) - math.log(lo))


def clamp(axis: tuple[float, ...], x: float) -> float:
    return min(max(x, axis[0]), axis[-1])


@dataclass(frozen=True, slots=True)
class _Table:
    """One dtype's grid: axes and log(seconds) at [m][n][k]."""

    m: tuple[float, ...]
    n: tuple[float, ...]
    k: tuple[float, ...]
    log_s: tuple[tuple[tuple[float, ...], ...], ...]

    def seconds(self, m: float, n: float, k: float) -> float:
        """Multilinear in log space (module doc); the shape must lie inside the axes."""
        (i, a), (j, b), (h, c) = bracket(self.m, m), bracket(self.n, n), bracket(self.k, k)
        total = 0.0
        for di, wi in ((0, 1 - a), (1, a)):
            if not wi:
                continue
            plane = self.log_s[i + di]
            for dj, wj in ((0, 1 - b), (1, b)):
                if not wj:
                    continue
                row = plane[j + dj]
                for dh, wh in ((0, 1 - c), (1, c)):
                    if wh:
                        total += wi * wj * wh * row[h + dh]
        return math.exp(total)


@dataclass(frozen=True, slots=True, eq=False)
class GemmGrid:
    """Measured GEMM latencies of one device (module doc)."""

    source: str  # the file it was read from (its label)
    tables: dict[str, _Table]
    meta: dict[str, str] = field(default_factory=dict)
    identity: str = ""  # the file's path and modification time (KernelTables' equality)

    def dtypes(self) -> tuple[str, ...]:
        return tuple(sorted(self.tables))

    def gemm(self, m: float, n: float, k: float, dtype: Dtype
             ) -> tuple[float, tuple[float, float, float]] | None:
        """(seconds, shape): the measured time of the nearest shape inside the grid and that
        shape (the one asked where it lies inside); None where no table has ``dtype``."""
        table = self.tables.get(TABLE_DTYPE.get(dtype, ""))
        if table is None or min(m, n, k) <= 0:
            return None
        shape = (clamp(table.m, m), clamp(table.n, n), clamp(table.k, k))
        return table.seconds(*shape), shape


@dataclass(frozen=True, slots=True, eq=False)
class CommGrid:
    """Measured NCCL latencies of one device's NVLink domain (module doc)."""

    source: str
    sizes: tuple[float, ...]  # bytes, ascending
    log_s: dict[tuple[str, int], tuple[float, ...]]  # (op, gpus) -> log(seconds) per size
    meta: dict[str, str] = field(default_factory=dict)
    identity: str = ""  # the file's path and modification time (KernelTables' equality)

    def gpus(self, op: str) -> tuple[int, ...]:
        return tuple(sorted(g for o, g in self.log_s if o == op))

    def collective(self, op: str, nbytes: float, ranks: int) -> float | None:
        """Seconds of ``op`` on an ``nbytes`` buffer over ``ranks`` GPUs of one NVLink domain;
        None where the table did not measure that op on that many GPUs."""
        row = self.log_s.get((op, ranks))
        if row is None or nbytes <= 0:
            return None
        sizes = self.sizes
        if nbytes <= sizes[0]:
            return math.exp(row[0])
        if nbytes >= sizes[-1]:
            return math.exp(row[-1]) * nbytes / sizes[-1]
        i, w = bracket(sizes, nbytes)
        return math.exp((1 - w) * row[i] + w * row[i + 1])


@dataclass(frozen=True, slots=True, eq=False)
class KernelTables:
    """A device's measured kernel grids (``Device.kernels``): GEMMs and collectives, either
    absent. Equal when read from the same files, unchanged (memoized costs key on it)."""

    gemm_grid: GemmGrid | None
    comm_grid: CommGrid | None
    _key: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_key", tuple(
            f"{g.source} {g.identity}" if g is not None else "" for g in (self.gemm_grid, self.comm_grid)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KernelTables) and other._key == self._key

    def __hash__(self) -> int:
        return hash(self._key)

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(g.source for g in (self.gemm_grid, self.comm_grid) if g is not None)

    def gemm(self, m: float, n: float, k: float, dtype: Dtype
             ) -> tuple[float, tuple[float, float, float]] | None:
        return None if self.gemm_grid is None else self.gemm_grid.gemm(m, n, k, dtype)

    def collective(self, op: str, nbytes: float, ranks: int) -> float | None:
        return None if self.comm_grid is None else self.comm_grid.collective(op, nbytes, ranks)


# --------------------------------------------------------------------------- files

def _split(text: str, label: str) -> tuple[dict[str, str], list[str], list[list[str]]]:
    """(header, column names, rows) of a grid file: ``# key: value`` lines, then CSV."""
    meta: dict[str, str] = {}
    lines = [ln for ln in text.splitlines() if ln.strip()]
    body = 0
    while body < len(lines) and lines[body].startswith("#"):
        key, _, value = lines[body][1:].partition(":")
        meta[key.strip()] = value.strip()
        body += 1
    if meta.get("autoplan-kernels") != FORMAT:
        raise InputError.single(label, "", "not an autoplan kernel grid "
                                           f"(want '# autoplan-kernels: {FORMAT}')")
    if body >= len(lines):
        raise InputError.single(label, "", "no rows")
    columns = [c.strip() for c in lines[body].split(",")]
    rows = [[c.strip() for c in ln.split(",")] for ln in lines[body + 1:]]
    for number, row in enumerate(rows, body + 2):
        if len(row) != len(columns):
            raise InputError.single(label, f"line {number}",
                                    f"expected {len(columns)} values, got {len(row)}")
    return meta, columns, rows


def positive_number(text: str, label: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise InputError.single(label, where, f"expected a positive number, got {text!r}")
    return value


def _axis(columns: list[str], prefix: str, label: str) -> tuple[float, ...]:
    if not columns or any(not c.startswith(prefix) for c in columns):
        raise InputError.single(label, "header", f"expected columns {prefix}<value>")
    axis = tuple(positive_number(c[len(prefix):], label, "header") for c in columns)
    if list(axis) != sorted(set(axis)):
        raise InputError.single(label, "header", f"the {prefix.rstrip('=')} columns must ascend")
    return axis


def parse_gemm_grid(text: str, label: str) -> GemmGrid:
    """A GEMM grid file: columns ``dtype,m,n,k=<k0>,k=<k1>,...``, one row per (dtype, m, n),
    microseconds; every (m, n) of a dtype present (a full grid)."""
    meta, columns, rows = _split(text, label)
    if columns[:3] != ["dtype", "m", "n"]:
        raise InputError.single(label, "header", "expected columns dtype,m,n,k=...")
    k_axis = _axis(columns[3:], "k=", label)
    cells: dict[str, dict[tuple[float, float], tuple[float, ...]]] = {}
    for number, row in enumerate(rows, 1):
        where = f"row {number}"
        m, n = positive_number(row[1], label, where), positive_number(row[2], label, where)
        cells.setdefault(row[0], {})[(m, n)] = tuple(
            math.log(positive_number(v, label, where) * US) for v in row[3:])
    tables = {}
    for dtype, by in cells.items():
        ms, ns = sorted({m for m, _ in by}), sorted({n for _, n in by})
        missing = [(m, n) for m in ms for n in ns if (m, n) not in by]
        if missing:
            raise InputError.single(label, dtype, f"the grid lacks (m, n) = {missing[0]} "
                                                  f"({len(missing)} rows missing)")
        tables[dtype] = _Table(tuple(ms), tuple(ns), k_axis,
                               tuple(tuple(by[(m, n)] for n in ns) for m in ms))
    return GemmGrid(label, tables, meta)


def parse_comm_grid(text: str, label: str) -> CommGrid:
    """A collective grid file: columns ``op,gpus,bytes=<b0>,...``, microseconds."""
    meta, columns, rows = _split(text, label)
    if columns[:2] != ["op", "gpus"]:
        raise InputError.single(label, "header", "expected columns op,gpus,bytes=...")
    sizes = _axis(columns[2:], "bytes=", label)
    log_s: dict[tuple[str, int], tuple[float, ...]] = {}
    for number, row in enumerate(rows, 1):
        where = f"row {number}"
        if row[0] not in COMM_OPS:
            raise InputError.single(label, where,
                                    f"op: expected one of {', '.join(COMM_OPS)}, got {row[0]!r}")
        gpus = positive_number(row[1], label, where)
        log_s[(row[0], int(gpus))] = tuple(math.log(positive_number(v, label, where) * US) for v in row[2:])
    return CommGrid(label, sizes, log_s, meta)


@lru_cache(maxsize=32)
def _read(path: Path, mtime_ns: int) -> GemmGrid | CommGrid:
    label = _label(path)
    try:
        text = read_limited(path, MAX_GRID_BYTES, "a kernel grid", label=label).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError.single(label, "", f"cannot read file: {exc}") from None
    kind = next((ln.partition(":")[2].strip() for ln in text.splitlines()
                 if ln.startswith("# kind:")), "")
    identity = f"{path}@{mtime_ns}"
    if kind == "gemm":
        return dataclasses.replace(parse_gemm_grid(text, label), identity=identity)
    if kind == "nccl":
        return dataclasses.replace(parse_comm_grid(text, label), identity=identity)
    raise InputError.single(label, "kind", f"expected gemm or nccl, got {kind!r}")


@lru_cache(maxsize=64)
def _header(path: Path, mtime_ns: int) -> dict[str, str]:
    return read_header(path, _label(path))


def read_header(path: Path, label: str) -> dict[str, str]:
    """The ``# key: value`` header lines of a measured table file, read without its rows
    (the training grids here, serving's mixer tables: ``measured.mixer_tables``)."""
    out: dict[str, str] = {}
    try:
        with path.open(encoding="utf-8") as f:
            for line in f:
                if not line.startswith("#"):
                    break
                key, _, value = line[1:].partition(":")
                out[key.strip()] = value.strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError.single(label, "", f"cannot read file: {exc}") from None
    return out


def applies(header: dict[str, str], label: str) -> bool:
    """A grid's ``# applies:`` line (module doc): yes (or none) or no."""
    value = header.get("applies", "yes").lower()
    if value not in ("yes", "no"):
        raise InputError.single(label, "applies", f"expected yes or no, got {value!r}")
    return value == "yes"


def kernels_dir() -> Path:
    return resources.profiles_dir().joinpath(*KERNELS_DIR)


def shipped_kernels(device_name: str, every: bool = False) -> KernelTables | None:
    """The grids shipped for ``device_name`` (their ``descriptor`` header line) that apply
    (``every``: all of them; module doc), or None where there are none. Read once per file."""
    folder = kernels_dir()
    if not folder.is_dir():
        return None
    gemm: GemmGrid | None = None
    comm: CommGrid | None = None
    for path in sorted(folder.iterdir()):
        if path.suffix != ".csv" or not path.is_file():
            continue
        mtime = path.stat().st_mtime_ns
        header = _header(path, mtime)
        if header.get("descriptor") != device_name or not (every or applies(header, _label(path))):
            continue
        grid = _read(path, mtime)
        if isinstance(grid, GemmGrid):
            gemm = grid
        else:
            comm = grid
    if gemm is None and comm is None:
        return None
    return KernelTables(gemm, comm)
