"""Measured profiles from NVIDIA AIConfigurator's kernel tables (``autoplan profiles import
aiconfigurator``).

The ``aiconfigurator-core`` package (Apache-2.0; autoplan's optional extra
``aiconfigurator``) ships the kernel timings NVIDIA measured per GPU x serving engine x
engine version, as parquet tables under
``aiconfigurator_core/systems/data/<system>/<family>/<backend>/<version>/``. This module
reads the ones autoplan's cost model has a function for and writes them as autoplan
measured profiles (:mod:`autoplan.measured.profile`, format 2), one per system, engine and
engine version. The package is located with :func:`importlib.util.find_spec`, never
imported (its compiled core is not needed to read its tables). Only the kernel tables
are read: the package's ``systems/silicon_sample.csv`` (end-to-end runs kept for
validation) is never opened.

Systems (``systems/<system>.yaml``) and the autoplan device descriptor each becomes
(:data:`SYSTEMS`): h100_sxm -> h100-sxm, h200_sxm -> h200, b200_sxm -> b200, gb200 ->
gb200, b300_sxm -> b300, gb300 -> gb300, a100_sxm -> a100-80gb, l40s -> l40s,
rtx_pro_6000_server -> rtx-pro-6000. Other systems (a100_pcie, h100_pcie, a30, l4, b60)
have no built-in descriptor and are not offered.

Tables and rows (latencies in the tables are milliseconds; profiles hold seconds):

================================================ ==========================================
aiconfigurator table (file)                      autoplan profile rows
================================================ ==========================================
``gemm/<engine>/<v>/gemm_perf.parquet``          ``gemm`` ``matmul``, m n k as given;
                                                 gemm_dtype bfloat16 -> bf16, fp8 -> fp8,
                                                 fp8_block -> fp8_block, nvfp4 -> fp4
                                                 (int8_wo, int4_wo, sq: left out)
``attention/<engine>/<v>/                        ``attention`` ``sdpa_fwd`` causal: batch,
context_attention_perf.parquet``                 num_heads, num_key_value_heads, seq = isl,
                                                 head_dim; the rows without a prefix
                                                 (step 0), sliding window (window_size 0),
                                                 beam (1), with bf16 compute and KV cache
``attention/<engine>/<v>/                        ``attention`` ``decode``: one query token per
generation_attention_perf.parquet``              sequence against seq = isl + step tokens
                                                 of KV cache (isl is 1; step, 1 to 2^k - 1,
                                                 is the context: latency grows with it at
                                                 the cache's read rate, 3.1 TB/s on an H100
                                                 at 8192 tokens); dtype the KV cache's
                                                 (bfloat16 -> bf16, fp8 -> fp8); window 0,
                                                 beam 1, bf16 compute
``comm/nccl/<newest>/nccl_perf.parquet``         ``collective`` all_reduce, all_gather,
                                                 reduce_scatter, all_to_all (alltoall):
                                                 nbytes = message_size x 2 (message_size
                                                 counts elements: the int8 rows of a size
                                                 take as long as the half rows of half that
                                                 count; 8 H100s all-reduce 2^28 halves in
                                                 2.1 ms, a bus bandwidth of 445 GB/s),
                                                 the half rows; ranks = ranks_per_node =
                                                 num_gpus (one NVLink domain)
``comm/<engine>/<v>/                             ``collective`` ``custom_all_reduce``: the
custom_allreduce_perf.parquet``                  engine's own kernel under CUDA graphs (the
                                                 ``*_graph`` rows; TensorRT-LLM's are all
                                                 graph-launched), the fastest of its
                                                 strategies per size; nbytes = message_size
                                                 x 2 (bf16 elements, as NCCL's)
``moe/<engine>/<v>/moe_perf.parquet``            ``moe`` ``experts``: m = num_tokens (the
                                                 tokens entering the layer, every
                                                 attention-DP rank's), n = inter_size,
                                                 k = hidden_size, experts, top_k, moe_tp,
                                                 moe_ep; distribution ``balanced`` only,
                                                 gated kernels only (``*nongated*`` left
                                                 out); moe_dtype mapped as GEMMs' (w4a16,
                                                 w4a8, int4 weight-only: left out)
================================================ ==========================================

A shape a table holds twice (several kernels of one engine measured on it) keeps the
row of the kernel that table measured most shapes with: the engine's main path for that
dtype.

Versions: ``--version`` names the engine version of the GEMM table (the default: its
newest). Every other table of the engine is taken at the newest version not after it,
else its oldest (each table's version is recorded in the profile's ``tables`` header);
NCCL at its newest.

Thinning (``--thin``, what ships under ``profiles/measured/``): per table and dtype, at
most :data:`THIN_ROWS` rows, drawn stratified over log2-shape cells: the shape columns'
log2 are binned (as coarse as needed for the cells to number at most the quota), the
cells are visited in a seeded random order and one unused row taken from each per round,
until the quota is met. Small and large shapes, and every dtype and op, keep their share.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoplan.errors import InputError
from autoplan.measured.profile import ENGINE_APPLIED_KINDS
from autoplan.measured.shipped import version_key

if TYPE_CHECKING:
    import pandas as pd

PACKAGE = "aiconfigurator_core"
DISTRIBUTION = "aiconfigurator-core"
INSTALL_HINT = "pip install 'autoplan[aiconfigurator]'"
LICENSE = "Apache-2.0 (NVIDIA AIConfigurator)"
ENGINES = ("vllm", "sglang", "trtllm")

# aiconfigurator system -> autoplan device descriptor (module doc)
SYSTEMS: dict[str, str] = {
    "h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200", "gb200": "gb200",
    "b300_sxm": "b300", "gb300": "gb300", "a100_sxm": "a100-80gb", "l40s": "l40s",
    "rtx_pro_6000_server": "rtx-pro-6000",
}
GEMM_DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "fp4"}
KV_DTYPES = {"bfloat16": "bf16", "fp8": "fp8"}
NCCL_OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
            "alltoall": "all_to_all"}
NCCL_ELEMENT_BYTES = {"half": 2}  # the rows kept; message_size counts elements (module doc)
CUSTOM_ELEMENT_BYTES = {"bfloat16": 2}
# rows per table and dtype (NCCL: per op) a thinned profile keeps (module doc): about 1,500 a
# profile (1,340 on Hopper, 1,600 with Blackwell's fp4), most of them GEMMs and MoE kernels,
# whose leave-shapes-out errors fall most with rows (an H100 vLLM profile's GEMMs: 36% at 100
# rows a dtype, 23% at 300; its MoE kernels: 51% at 50, 40% at 100, 33% at 150)
THIN_ROWS = {"gemm": 170, "context_attention": 140, "generation_attention": 110, "nccl": 32,
             "custom_allreduce": 100, "moe": 90}
THIN_SEED = 0
MS = 1e-3


@dataclass(frozen=True, slots=True)
class Table:
    """One table a profile is made of: its file, and the engine (or ``nccl``) and version
    directory it was taken from."""

    name: str  # gemm, context_attention, generation_attention, moe, custom_allreduce, nccl
    path: Path
    owner: str  # the engine, or nccl
    version: str


@dataclass(frozen=True, slots=True)
class Selection:
    """One profile to write: a system, an engine and its version, and the tables read."""

    system: str
    engine: str
    version: str
    tables: tuple[Table, ...] = field(default=())

    @property
    def descriptor(self) -> str:
        return SYSTEMS[self.system]

    @property
    def file_name(self) -> str:
        return f"{self.descriptor}-{self.engine}-{self.version}-aiconfigurator.csv"

    @property
    def label(self) -> str:
        return f"{self.system}/{self.engine}/{self.version}"


@dataclass(frozen=True, slots=True)
class Package:
    """The installed aiconfigurator-core: its kernel tables' root and its version."""

    data: Path  # aiconfigurator_core/systems/data
    version: str


def locate() -> Package:
    """The installed aiconfigurator-core (found, not imported), or an InputError saying how
    to install it."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    data = next((Path(p) / "systems" / "data" for p in locations
                 if (Path(p) / "systems" / "data").is_dir()), None)
    if data is None:
        why = "not installed" if spec is None else "installed without its systems/data tables"
        raise InputError.single("aiconfigurator", "", f"{DISTRIBUTION} is {why}: {INSTALL_HINT}")
    try:
        version = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return Package(data, version)


def _dirs(path: Path) -> list[str]:
    return sorted((p.name for p in path.iterdir() if p.is_dir()), key=version_key) if path.is_dir() else []


def _versions_with(data: Path, system: str, family: str, owner: str, filename: str) -> list[str]:
    """Versions (oldest first) of ``family/owner`` that hold ``filename``."""
    base = data / system / family / owner
    return [v for v in _dirs(base) if (base / v / filename).is_file()]


def _nearest(versions: list[str], wanted: str) -> str | None:
    """The newest of ``versions`` not after ``wanted``, else the oldest (module doc)."""
    if not versions:
        return None
    before = [v for v in versions if version_key(v) <= version_key(wanted)]
    return before[-1] if before else versions[0]


def systems(package: Package) -> list[str]:
    """The systems of :data:`SYSTEMS` the package has tables of."""
    return [s for s in SYSTEMS if (package.data / s).is_dir()]


def engine_versions(package: Package, system: str, engine: str) -> list[str]:
    """Versions (oldest first) of ``engine`` with a GEMM table on ``system``."""
    return _versions_with(package.data, system, "gemm", engine, "gemm_perf.parquet")


def _tables(package: Package, system: str, engine: str, version: str) -> tuple[Table, ...]:
    data = package.data
    wanted = (("gemm", "gemm", engine, "gemm_perf.parquet"),
              ("context_attention", "attention", engine, "context_attention_perf.parquet"),
              ("generation_attention", "attention", engine, "generation_attention_perf.parquet"),
              ("moe", "moe", engine, "moe_perf.parquet"),
              ("custom_allreduce", "comm", engine, "custom_allreduce_perf.parquet"))
    found: list[Table] = []
    for name, family, owner, filename in wanted:
        v = _nearest(_versions_with(data, system, family, owner, filename), version)
        if v is not None:
            found.append(Table(name, data / system / family / owner / v / filename, owner, v))
    nccl = _versions_with(data, system, "comm", "nccl", "nccl_perf.parquet")
    if nccl:
        found.append(Table("nccl", data / system / "comm" / "nccl" / nccl[-1] / "nccl_perf.parquet",
                           "nccl", nccl[-1]))
    return tuple(found)


def select(package: Package, system: str | None = None, engine: str | None = None,
           version: str | None = None) -> list[Selection]:
    """The profiles ``--system``, ``--backend`` and ``--version`` ask for (each default: all
    of them; an engine's newest version), or an InputError naming the valid choices."""
    known = systems(package)
    by_descriptor = {SYSTEMS[s]: s for s in known}
    if system is not None and system not in known:
        if system in by_descriptor:  # the autoplan descriptor's name for it
            system = by_descriptor[system]
        else:
            raise InputError.single("--system", "", f"expected one of {', '.join(known)} (or their autoplan "
                                                    f"devices {', '.join(by_descriptor)}), got {system!r}")
    if engine is not None and engine not in ENGINES:
        raise InputError.single("--backend", "", f"expected one of {', '.join(ENGINES)}, got {engine!r}")
    if version is not None and engine is None:
        raise InputError.single("--version", "", "names one engine's version: give --backend too")
    out: list[Selection] = []
    for s in [system] if system is not None else known:
        for e in [engine] if engine is not None else ENGINES:
            versions = engine_versions(package, s, e)
            if version is not None and version not in versions:
                raise InputError.single("--version", "", (
                    f"{s} has {e} GEMM tables of versions {', '.join(versions) or 'none'}, "
                    f"got {version!r}"))
            if not versions:
                if engine is not None and system is not None:
                    raise InputError.single("--backend", "", f"{s} has no {e} GEMM table")
                continue
            v = version if version is not None else versions[-1]
            out.append(Selection(s, e, v, _tables(package, s, e, v)))
    return out


SOURCES = ("aiconfigurator",)  # ``profiles import SOURCE``: the tools whose measurements it reads


def check_source(source: str) -> None:
    """``profiles import``'s SOURCE: a tool it reads."""
    if source not in SOURCES:
        raise InputError.single("SOURCE", "", f"expected one of {', '.join(SOURCES)}, got {source!r}")


def select_for(package: Package, system: str | None, engine: str | None, version: str | None,
               *, directory: bool) -> list[Selection]:
    """:func:`select`, refused where nothing is selected, or several where the output is
    one file (``directory``: each profile gets its own file)."""
    chosen = select(package, system, engine, version)
    if not chosen:
        raise InputError.single("--system", "", "the package has no GEMM table of the engines asked for")
    if len(chosen) > 1 and not directory:
        names = ", ".join(s.label for s in chosen)
        raise InputError.single("--out", "", (
            f"{len(chosen)} profiles selected ({names}): give a directory (-o DIR/), or one --system "
            "and --backend"))
    return chosen


# --------------------------------------------------------------------------- rows

def _read(path: Path) -> pd.DataFrame:
    import pandas as pd

    try:
        return pd.read_parquet(path)
    except ImportError as exc:  # pyarrow comes with the extra
        raise InputError.single(str(path), "", f"cannot read parquet ({exc}): {INSTALL_HINT}") from None
    except (OSError, ValueError) as exc:
        raise InputError.single(str(path), "", f"cannot read the table: {exc}") from None


def _need(frame: pd.DataFrame, path: Path, columns: tuple[str, ...]) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise InputError.single(str(path), "", f"missing column(s) {', '.join(missing)}: not an "
                                               f"aiconfigurator-core {DISTRIBUTION} 0.12 table")


def _main_kernel(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One row per key: the one of the kernel source that measured most rows (module doc)."""
    if "kernel_source" not in frame.columns or frame.empty:
        return frame.drop_duplicates(keys)
    rank = frame["kernel_source"].map(frame["kernel_source"].value_counts())
    return frame.assign(_rank=-rank).sort_values(["_rank", *keys], kind="stable").drop_duplicates(
        keys).drop(columns="_rank").sort_index()


def thin(frame: pd.DataFrame, shape: list[str], quota: int, seed: int = THIN_SEED) -> pd.DataFrame:
    """At most ``quota`` rows, stratified over log2-shape cells (module doc)."""
    if len(frame) <= quota:
        return frame
    import numpy as np

    logs = np.log2(frame[shape].to_numpy(dtype=float).clip(min=1.0))
    cells = None
    for width in (1.0, 2.0, 3.0, 4.0, 6.0, 8.0):
        binned = np.floor(logs / width).astype(int)
        cells = [tuple(row) for row in binned]
        if len(set(cells)) <= quota:
            break
    assert cells is not None
    order = np.random.default_rng(seed).permutation(len(frame))
    queues: dict[tuple[int, ...], list[int]] = {}
    for i in order:
        queues.setdefault(cells[i], []).append(int(i))
    picked: list[int] = []
    lists = list(queues.values())
    depth = 0
    while len(picked) < quota:
        took = False
        for q in lists:
            if depth < len(q):
                picked.append(q[depth])
                took = True
                if len(picked) == quota:
                    break
        if not took:
            break
        depth += 1
    return frame.iloc[sorted(picked)]


def _thinned(frame: pd.DataFrame, shape: list[str], quota: int | None, by: str = "dtype") -> pd.DataFrame:
    import pandas as pd

    if quota is None or frame.empty:
        return frame
    return pd.concat([thin(group, shape, quota) for _, group in frame.groupby(by, sort=True)])


def _rows(frame: pd.DataFrame, kind: str, op: str, columns: Mapping[str, str],
          extra: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Profile rows of ``frame``: profile column <- frame column, seconds from ms."""
    out = []
    for rec in frame.to_dict("records"):
        seconds = float(rec["latency"]) * MS
        row = {"kind": kind, "op": op, **(extra or {}), **{c: rec[src] for c, src in columns.items()},
               "seconds": seconds, "seconds_p10": seconds, "seconds_p90": seconds, "repeats": 0}
        out.append(row)
    return out


def _positive(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    mask = (frame["latency"] > 0) & frame["latency"].map(math.isfinite)
    for c in columns:
        mask &= frame[c] > 0
    return frame[mask]


def _gemm(frame: pd.DataFrame, quota: int | None) -> list[dict[str, Any]]:
    frame = frame[frame["gemm_dtype"].isin(list(GEMM_DTYPES))]
    frame = _positive(frame.assign(dtype=frame["gemm_dtype"].map(GEMM_DTYPES)), ["m", "n", "k"])
    frame = _main_kernel(frame, ["dtype", "m", "n", "k"])
    frame = _thinned(frame, ["m", "n", "k"], quota)
    return _rows(frame, "gemm", "matmul", {"dtype": "dtype", "m": "m", "n": "n", "k": "k"})


ATTENTION_SHAPE = ["batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim"]


def _plain_attention(frame: pd.DataFrame) -> pd.DataFrame:
    keep = (frame["attn_dtype"] == "bfloat16") & (frame["window_size"] == 0)
    if "beam_width" in frame.columns:
        keep &= frame["beam_width"] == 1
    return frame[keep]


def _context(frame: pd.DataFrame, quota: int | None) -> list[dict[str, Any]]:
    frame = _plain_attention(frame)
    frame = frame[(frame["kv_cache_dtype"] == "bfloat16") & (frame["step"] == 0)]
    frame = _positive(frame.assign(dtype="bf16"), ATTENTION_SHAPE)
    frame = _main_kernel(frame, ATTENTION_SHAPE)
    frame = _thinned(frame, ATTENTION_SHAPE, quota)
    return _rows(frame, "attention", "sdpa_fwd",
                 {"dtype": "dtype", "batch": "batch_size", "heads": "num_heads",
                  "kv_heads": "num_key_value_heads", "seq": "isl", "head_dim": "head_dim"}, {"causal": 1})


def _generation(frame: pd.DataFrame, quota: int | None) -> list[dict[str, Any]]:
    frame = _plain_attention(frame)
    frame = frame[frame["kv_cache_dtype"].isin(list(KV_DTYPES))]
    frame = frame.assign(dtype=frame["kv_cache_dtype"].map(KV_DTYPES), context=frame["isl"] + frame["step"])
    shape = ["batch_size", "context", "num_heads", "num_key_value_heads", "head_dim"]
    frame = _positive(frame, shape)
    frame = _main_kernel(frame, ["dtype", *shape])
    frame = _thinned(frame, shape, quota)
    return _rows(frame, "attention", "decode",
                 {"dtype": "dtype", "batch": "batch_size", "heads": "num_heads",
                  "kv_heads": "num_key_value_heads", "seq": "context", "head_dim": "head_dim"}, {"causal": 0})


def _nccl(frame: pd.DataFrame, quota: int | None) -> list[dict[str, Any]]:
    frame = frame[frame["nccl_dtype"].isin(list(NCCL_ELEMENT_BYTES)) & frame["op_name"].isin(list(NCCL_OPS))]
    frame = frame.assign(nbytes=frame["message_size"] * frame["nccl_dtype"].map(NCCL_ELEMENT_BYTES),
                         dtype="fp16")
    frame = _positive(frame, ["nbytes", "num_gpus"])
    frame = _main_kernel(frame, ["op_name", "num_gpus", "nbytes"])
    frame = _thinned(frame, ["num_gpus", "nbytes"], quota, by="op_name")
    out = []
    for op, group in frame.groupby("op_name", sort=True):
        out += _rows(group, "collective", NCCL_OPS[str(op)],
                     {"dtype": "dtype", "nbytes": "nbytes", "ranks": "num_gpus",
                      "ranks_per_node": "num_gpus"})
    return out


def _custom(frame: pd.DataFrame, quota: int | None) -> list[dict[str, Any]]:
    graph = ~frame["kernel_source"].str.lower().str.endswith("eager")
    frame = frame[graph & frame["allreduce_dtype"].isin(list(CUSTOM_ELEMENT_BYTES))]
    frame = frame.assign(nbytes=frame["message_size"] * frame["allreduce_dtype"].map(CUSTOM_ELEMENT_BYTES),
                         dtype="bf16")
    frame = _positive(frame, ["nbytes", "num_gpus"])
    # the fastest of the engine's strategies (one-shot, two-shot, multi-node NVLink) per size
    frame = frame.sort_values(["num_gpus", "nbytes", "latency"], kind="stable").drop_duplicates(
        ["num_gpus", "nbytes"])
    frame = _thinned(frame, ["num_gpus", "nbytes"], quota)
    return _rows(frame, "collective", "custom_all_reduce",
                 {"dtype": "dtype", "nbytes": "nbytes", "ranks": "num_gpus", "ranks_per_node": "num_gpus"})


MOE_SHAPE = ["num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size"]


def _moe(frame: pd.DataFrame, quota: int | None) -> list[dict[str, Any]]:
    frame = frame[(frame["distribution"] == "balanced") & frame["moe_dtype"].isin(list(GEMM_DTYPES))]
    if "kernel_source" in frame.columns:
        frame = frame[~frame["kernel_source"].str.contains("nongated", case=False)]
    frame = _positive(frame.assign(dtype=frame["moe_dtype"].map(GEMM_DTYPES)), MOE_SHAPE)
    frame = _main_kernel(frame, ["dtype", *MOE_SHAPE])
    frame = _thinned(frame, MOE_SHAPE, quota)
    return _rows(frame, "moe", "experts",
                 {"dtype": "dtype", "m": "num_tokens", "n": "inter_size", "k": "hidden_size",
                  "experts": "num_experts", "top_k": "topk", "moe_tp": "moe_tp_size",
                  "moe_ep": "moe_ep_size"})


_READERS: dict[str, tuple[Callable[[pd.DataFrame, int | None], list[dict[str, Any]]], tuple[str, ...]]] = {
    "gemm": (_gemm, ("gemm_dtype", "m", "n", "k", "latency")),
    "context_attention": (_context, (*ATTENTION_SHAPE, "attn_dtype", "kv_cache_dtype", "step",
                                     "window_size", "latency")),
    "generation_attention": (_generation, (*ATTENTION_SHAPE, "attn_dtype", "kv_cache_dtype", "step",
                                           "window_size", "latency")),
    "moe": (_moe, (*MOE_SHAPE, "moe_dtype", "distribution", "latency")),
    "custom_allreduce": (_custom, ("kernel_source", "allreduce_dtype", "num_gpus", "message_size",
                                   "latency")),
    "nccl": (_nccl, ("op_name", "nccl_dtype", "num_gpus", "message_size", "latency")),
}


def _collected(table: Table) -> str | None:
    """The table's ``collected_at`` in its directory's collection_meta.yaml, if recorded."""
    from autoplan.descriptors.strict import read_limited

    meta_path = table.path.parent / "collection_meta.yaml"
    if not meta_path.is_file():
        return None
    import yaml

    try:
        doc = yaml.safe_load(read_limited(meta_path, 1 << 20, "a collection_meta.yaml").decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, InputError):
        return None
    entry = (doc or {}).get("tables", {}).get(table.path.stem) if isinstance(doc, dict) else None
    when = entry.get("collected_at") if isinstance(entry, dict) else None
    return str(when) if when else None


def build(selection: Selection, package: Package, *, thinned: bool, command: str
          ) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """(header, rows) of the profile of ``selection``."""
    rows: list[dict[str, Any]] = []
    device_name = ""
    counts: list[str] = []
    dates: list[str] = []
    for table in selection.tables:
        reader, columns = _READERS[table.name]
        frame = _read(table.path)
        _need(frame, table.path, columns)
        if not device_name and "device" in frame.columns and len(frame):
            device_name = str(frame["device"].iloc[0])
        got = reader(frame, THIN_ROWS[table.name] if thinned else None)
        rows += got
        counts.append(f"{table.name} {table.owner}/{table.version} ({len(got)} of {len(frame)} rows)")
        when = _collected(table)
        if when:
            dates.append(when)
    if not rows:
        raise InputError.single(selection.label, "", "no table autoplan reads has rows here")
    meta = {
        "device_kind": "cuda",
        "device_name": device_name or selection.system,
        "descriptor": selection.descriptor,
        "engine": selection.engine,
        "engine_version": selection.version,
        "source": f"{DISTRIBUTION} {package.version} {selection.label}",
        "license": LICENSE,
        "tables": "; ".join(counts),
        "attention_kernel": "flash3",  # serving prices prefill attention with it (surrogate doc)
        # the kinds its correction applies (surrogate.ENGINE_APPLIED_KINDS: why; delete the
        # line to apply every kind)
        "applies": ", ".join(ENGINE_APPLIED_KINDS),
        "thinned": (f"at most {', '.join(f'{k} {v}' for k, v in THIN_ROWS.items())} rows per table and "
                    f"dtype, stratified over log2-shape cells (seed {THIN_SEED}; "
                    "autoplan/measured/aiconfigurator.py)") if thinned else "no",
        "date": max(dates) if dates else f"{DISTRIBUTION} {package.version} release",
        "command": command,
    }
    return meta, rows


# --------------------------------------------------------------------------- training grids

# Training's measured kernel grids (autoplan/measured/kernels.py; ``python
# scripts/aiconfigurator_profiles.py kernels``). One engine's GEMM table per device:
# TensorRT-LLM's, the plain cuBLAS / cuBLASLt path Megatron-Core, Transformer Engine and torch
# run: its collector (collector/trtllm/collect_gemm.py) times TensorRT-LLM's PyTorch ``Linear``,
# which runs a bf16 GEMM as ``torch.nn.functional.linear`` (cuBLAS) and a per-tensor fp8 GEMM
# as a static quantization of the input then ``torch.ops.trtllm.cublas_scaled_mm``
# (cuBLASLt, which Transformer Engine's fp8 GEMMs also call). vLLM's and SGLang's bf16 tables
# time torch's linear too (their medians agree with it within 4% on H100 at m, n, k >= 1024);
# their fp8 tables time CUTLASS kernels. Shapes kept (what training's GEMMs span): m a
# multiple of 64 (the table's m+1 rows time misaligned shapes no training GEMM has), n and
# k from 64; dtypes bf16 and fp8.
KERNEL_ENGINE = "trtllm"
KERNEL_GEMM_DTYPES = {"bfloat16": "bf16", "fp8": "fp8"}
# Each engine's table is one timing per shape, and timings of one kernel scatter: vLLM's and
# TensorRT-LLM's bf16 tables on H100 (both torch.nn.functional.linear) differ by 0.88-1.04x
# (10th-90th percentile) at m, n, k >= 1024, neighbouring shapes of one table by as much
# (n 15360, k 5120: 666 TFLOPS at m 4096, 758 at 8192). The bf16 grid is the median per
# shape of the three engines' timings of that same torch linear (vLLM's
# UnquantizedLinearMethod and SGLang's unquantized linear call it as TensorRT-LLM's does);
# fp8 is TensorRT-LLM's alone (the others time CUTLASS kernels, not cuBLASLt).
KERNEL_ENGINES = {"trtllm": ("bfloat16", "fp8"), "vllm": ("bfloat16",), "sglang": ("bfloat16",)}
# Whether the training door attaches each grid (its ``# applies:`` line; autoplan/measured/
# kernels.py): the NCCL grids lower the calibration runs' held-out error in every slice, the
# GEMM grids raise it (profiles/measured/README.md, "Training's kernel grids").
KERNEL_APPLIES = {"gemm": "no", "nccl": "yes"}
KERNEL_MIN_DIM = 64
KERNEL_M_MULTIPLE = 64


@dataclass(frozen=True, slots=True)
class KernelGrid:
    """One grid file to write: its name, header and CSV body."""

    name: str
    header: dict[str, str]
    columns: list[str]
    rows: list[list[str]]

    def text(self) -> str:
        lines = [f"# {k}: {v}" for k, v in self.header.items()]
        lines.append(",".join(self.columns))
        lines += [",".join(r) for r in self.rows]
        return "\n".join(lines) + "\n"


def _us(ms: float) -> str:
    return f"{ms * 1e3:.5g}"


def _filled(cell: dict[tuple[int, int, int], float], shape: tuple[int, int, int],
            axes: tuple[list[int], list[int], list[int]]) -> float | None:
    """A cell the table did not measure (its largest shapes: m n, m k or n k >= 2^31), at
    the rate of the nearest measured shape along one dim (m first, then k, then n): time x
    the ratio of that dim (a GEMM at a constant rate takes time ~ m n k)."""
    for dim in (0, 2, 1):
        measured = {v: cell[at] for v in axes[dim]
                    if (at := _with(shape, dim, v)) in cell}
        if measured:
            near = min(measured, key=lambda v: abs(v - shape[dim]))
            return measured[near] * shape[dim] / near
    return None


def _with(shape: tuple[int, int, int], dim: int, value: int) -> tuple[int, int, int]:
    out = list(shape)
    out[dim] = value
    return (out[0], out[1], out[2])


def _gemm_frames(package: Package, system: str) -> list[tuple[str, str, pd.DataFrame]]:
    """(engine, version, rows kept) of each GEMM table a grid is made of (the newest version
    of each engine of :data:`KERNEL_ENGINES` that has one): the kept shapes of the dtypes
    that engine answers."""
    out = []
    for engine, dtypes in KERNEL_ENGINES.items():
        versions = engine_versions(package, system, engine)
        if not versions:
            continue
        path = package.data / system / "gemm" / engine / versions[-1] / "gemm_perf.parquet"
        frame = _read(path)
        _need(frame, path, ("gemm_dtype", "m", "n", "k", "latency", "kernel_source"))
        frame = frame[frame["gemm_dtype"].isin(list(dtypes))]
        frame = _positive(frame, ["m", "n", "k"])
        frame = frame[(frame["m"] % KERNEL_M_MULTIPLE == 0) & (frame["n"] >= KERNEL_MIN_DIM)
                      & (frame["k"] >= KERNEL_MIN_DIM)]
        frame = _main_kernel(frame.assign(dtype=frame["gemm_dtype"].map(KERNEL_GEMM_DTYPES)),
                             ["dtype", "m", "n", "k"])
        if len(frame):
            out.append((engine, versions[-1], frame.assign(engine=f"{engine}/{versions[-1]}")))
    return out


def _gemm_grid(package: Package, system: str, command: str) -> KernelGrid | None:
    import pandas as pd

    frames = _gemm_frames(package, system)
    if not frames or frames[0][0] != KERNEL_ENGINE:
        return None
    measured = pd.concat([f for _, _, f in frames])
    sources = {dtype: sorted({f"{e} {', '.join(sorted(g['kernel_source'].unique()))}"
                              for e, g in group.groupby("engine")})
               for dtype, group in measured.groupby("dtype")}
    # the median of the engines' times of one shape (one engine's where only it measured it)
    frame = measured.groupby(["dtype", "m", "n", "k"], as_index=False).agg(
        latency=("latency", "median"), device=("device", "first"))
    k_axis = sorted(int(k) for k in frame["k"].unique())
    rows: list[list[str]] = []
    filled: list[str] = []
    kernels: list[str] = []
    for dtype, group in frame.groupby("dtype", sort=True):
        kernels.append(f"{dtype} " + ("the median per shape of " if len(sources[dtype]) > 1 else "")
                       + "; ".join(sources[dtype]))
        cell = {(int(r.m), int(r.n), int(r.k)): float(r.latency) for r in group.itertuples()}
        ms, ns = sorted({m for m, _, _ in cell}), sorted({n for _, n, _ in cell})
        missing = [(m, n, k) for m in ms for n in ns for k in k_axis if (m, n, k) not in cell]
        count = len(missing)
        while missing:  # filled from measured cells, then from filled ones
            got = {shape: _filled(cell, shape, (ms, ns, k_axis)) for shape in missing}
            if all(v is None for v in got.values()):
                raise InputError.single(f"{system}/gemm", "", f"{dtype}: nothing measured near {missing[0]}")
            cell.update({shape: v for shape, v in got.items() if v is not None})
            missing = [shape for shape, v in got.items() if v is None]
        for m in ms:
            for n in ns:
                rows.append([str(dtype), str(m), str(n), *(_us(cell[(m, n, k)]) for k in k_axis)])
        if count:
            filled.append(f"{dtype} {count}")
    tables = ", ".join(f"{e}/{v}" for e, v, _ in frames)
    header = {
        **_grid_header("gemm", system, frame,
                       f"{DISTRIBUTION} {package.version} {system}/gemm/{{{tables}}}/gemm_perf.parquet"),
        "kernels": " | ".join(kernels) + " (bf16: torch.nn.functional.linear, cuBLAS, as each engine's "
                   "collector times it; fp8: TensorRT-LLM's Linear, a static per-tensor input "
                   "quantization and cublas_scaled_mm, cuBLASLt)",
        "units": "microseconds of one (m x k) @ (k x n) GEMM; one row per (dtype, m, n), one column per k",
        "kept": f"m a multiple of {KERNEL_M_MULTIPLE}, n and k from {KERNEL_MIN_DIM}, dtypes "
                f"{', '.join(KERNEL_GEMM_DTYPES.values())}",
        "filled": ("; ".join(filled) + " cells the table did not measure (its collector skips m n, m k "
                   "or n k >= 2^31), at the rate of the nearest measured shape along m, else k, else n "
                   "(time x m / m')") if filled else "none",
        "command": command,
    }
    name = f"{SYSTEMS[system]}-gemm-aiconfigurator-{package.version}.csv"
    return KernelGrid(name, header, ["dtype", "m", "n", *(f"k={k}" for k in k_axis)], rows)


def _grid_header(kind: str, system: str, frame: pd.DataFrame, source: str) -> dict[str, str]:
    """The provenance lines every kernel grid file opens with: format, kind, the autoplan
    device it prices, the device the table was measured on, where it came from, whether it
    applies (``KERNEL_APPLIES``) and its licence."""
    measured_on = str(frame["device"].iloc[0]) if "device" in frame.columns and len(frame) else system
    return {"autoplan-kernels": "1", "kind": kind, "descriptor": SYSTEMS[system],
            "device_name": measured_on, "source": source, "applies": KERNEL_APPLIES[kind],
            "license": LICENSE}


def _comm_grid(package: Package, system: str, command: str) -> KernelGrid | None:
    versions = _versions_with(package.data, system, "comm", "nccl", "nccl_perf.parquet")
    if not versions:
        return None
    version = versions[-1]
    path = package.data / system / "comm" / "nccl" / version / "nccl_perf.parquet"
    frame = _read(path)
    _need(frame, path, ("op_name", "nccl_dtype", "num_gpus", "message_size", "latency"))
    frame = frame[frame["nccl_dtype"].isin(list(NCCL_ELEMENT_BYTES)) & frame["op_name"].isin(list(NCCL_OPS))]
    frame = frame.assign(nbytes=frame["message_size"] * frame["nccl_dtype"].map(NCCL_ELEMENT_BYTES))
    frame = _positive(frame, ["nbytes", "num_gpus"])
    frame = _main_kernel(frame, ["op_name", "num_gpus", "nbytes"])
    sizes = sorted(int(b) for b in frame["nbytes"].unique())
    cell = {(str(r.op_name), int(r.num_gpus), int(r.nbytes)): float(r.latency) for r in frame.itertuples()}
    rows = []
    for op in NCCL_OPS:
        for gpus in sorted({g for o, g, _ in cell if o == op}):
            if all((op, gpus, b) in cell for b in sizes):  # a complete row of sizes only
                rows.append([NCCL_OPS[op], str(gpus), *(_us(cell[(op, gpus, b)]) for b in sizes)])
    header = {
        **_grid_header("nccl", system, frame,
                       f"{DISTRIBUTION} {package.version} {system}/comm/nccl/{version}/nccl_perf.parquet"),
        "kernels": ("nccl-tests all_reduce_perf, all_gather_perf, reduce_scatter_perf, alltoall_perf "
                    "(one process, a thread per GPU, -w 40 -n 100-1000 -c 0; collector/collect_nccl.py): "
                    "the half rows, NCCL " + version),
        "units": "microseconds of one call; bytes = nccl-tests' size (the whole buffer: message_size x 2)",
        "command": command,
    }
    name = f"{SYSTEMS[system]}-nccl-{version}-aiconfigurator-{package.version}.csv"
    return KernelGrid(name, header, ["op", "gpus", *(f"bytes={b}" for b in sizes)], rows)


def kernel_grids(package: Package, system: str, command: str) -> list[KernelGrid]:
    """The training grids of ``system`` (autoplan/measured/kernels.py): its GEMM grid
    (TensorRT-LLM's table) and its NCCL grid, where the package has them."""
    return [g for g in (_gemm_grid(package, system, command), _comm_grid(package, system, command))
            if g is not None]
