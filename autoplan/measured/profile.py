"""Microbenchmark profiles: the CSV that ``autoplan bench`` writes and the surrogate reads.

A profile is a CSV file with a header of ``# key: value`` lines (provenance: device,
software versions, date, command) and one row per measured kernel or collective.
Every row has every column; a column that does not apply to a row's kind is 0.

=========== ================================================================
column      meaning
=========== ================================================================
kind        gemm | attention | elementwise | collective | host
op          gemm: ``matmul`` (one (m x k) @ (k x n) product, both row-major) |
            ``linear`` (a linear layer's three training GEMMs of that size: the
            forward x @ W^T with W stored n x k, the input gradient dy @ W and the
            weight gradient dy^T @ x; ``seconds`` is a third of the three);
            attention: ``sdpa_fwd`` | ``sdpa_bwd`` (backward alone) | ``decode``
            (one query token per sequence reading ``seq`` tokens of its KV cache:
            a serving engine's generation attention);
            elementwise: ``copy`` | ``add`` | ``mul`` | ``layer`` (a decoder
            layer's memory-bound passes, forward and backward, as validate's eager
            torch model runs them: ``bench/eager.py``; ``n`` its hidden size,
            ``seq`` its tokens);
            collective: ``all_reduce`` | ``all_gather`` | ``reduce_scatter`` |
            ``all_to_all`` | ``p2p`` | ``custom_all_reduce`` (a serving engine's own
            all-reduce kernel inside one NVLink domain, under CUDA graphs);
            host: ``layer_forward`` | ``layer_backward`` (eager PyTorch's host time
            to issue one kernel of a decoder layer's pass: ``bench/host.py``);
            moe: ``experts`` (one rank's routed experts of an MoE layer, gated
            (three matrices), tokens routed evenly: the engine's fused MoE kernel)
dtype       bf16 | fp16 | fp32 | fp8 | fp8_block (fp8 with per-block scales, as
            DeepSeek-V3's checkpoints) | fp4 (NVFP4); attention ``decode``: the KV
            cache's dtype (bf16 | fp8)
m, n, k     gemm: (m x k) @ (k x n); host: n the layer's hidden size, k the
            kernels one pass issues; moe: m the tokens entering the layer (every
            attention-DP rank's, gathered at the experts), n each expert's
            intermediate width, k the hidden size
batch       attention: batch size
heads       attention: query heads
kv_heads    attention: key/value heads (GQA)
seq         attention: sequence length (queries = keys; ``decode``: the tokens of
            context each sequence reads); host: the layer's tokens
head_dim    attention: channels per head
causal      attention: 1 causal, 0 full (``decode``: 0)
nbytes      elementwise: bytes read + written (``layer``: those autoplan's cost model
            counts for the layer's passes, ``kernels.layer.elementwise_bytes_forward``
            forward and twice that backward); collective: the buffer size in the
            convention of :mod:`autoplan.kernels.comm` (all-reduce: the buffer;
            all-gather: the gathered output; reduce-scatter: the input;
            all-to-all: each rank's buffer; p2p: the message)
ranks       collective: ranks in the group
ranks_per_node  collective: of those, ranks on one node (= ranks on one machine)
experts     moe: routed experts of the layer (all ranks')
top_k       moe: experts each token is routed to
moe_tp      moe: ranks each expert's matrices are split over (tensor parallel)
moe_ep      moe: ranks the experts are spread over (expert parallel)
seconds     median time of one call over ``repeats`` timed calls (after warm-up);
            host: of one pass, over its k kernels
seconds_p10, seconds_p90  10th / 90th percentile of the timed calls
repeats     timed calls
=========== ================================================================

Format versions: 1 has the columns up to ``ranks_per_node``, ``repeats`` and the
seconds, and the kinds, ops and dtypes ``autoplan bench`` measures; 2 adds the
``experts``, ``top_k``, ``moe_tp`` and ``moe_ep`` columns, the ``moe`` kind, the
``decode`` and ``custom_all_reduce`` ops and the ``fp8_block`` and ``fp4`` dtypes
(profiles imported from a serving engine's kernel tables:
:mod:`autoplan.measured.aiconfigurator`); 3 adds the elementwise ``layer`` op. Version 1
and 2 files read as ever (the version 2 columns are 0); :func:`format_profile` writes the
lowest version the rows fit, so a ``bench`` profile without ``layer`` rows still reads in
an autoplan that knows only version 1. A collective row's dtype is the dtype summed or
moved (a CPU profile has its reducing ops in fp32 and bf16).

Provenance: every profile names its device (``device_kind``, ``device_name``), date and
command; a profile ``autoplan bench`` measured names its ``torch``, one imported from
another tool's measurements its ``source`` instead. A profile of a serving engine's
kernels also names ``engine`` and ``engine_version`` (what
:func:`autoplan.measured.door.profile_for` matches a serving plan's engine against).
"""

from __future__ import annotations

import hashlib
import io
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoplan.errors import InputError, Problem

if TYPE_CHECKING:  # pandas is imported where a profile is parsed or written: not at start-up
    import pandas as pd

FORMAT_VERSION = "3"  # what a profile needing the version 3 names is written as
FORMAT_VERSIONS = ("1", "2", "3")  # what reads
# new names are appended, never inserted: the surrogate codes ops and dtypes by position
KINDS: dict[str, tuple[str, ...]] = {
    "gemm": ("matmul", "linear"),
    "attention": ("sdpa_fwd", "sdpa_bwd", "decode"),
    "elementwise": ("copy", "add", "mul", "layer"),
    "collective": ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p",
                   "custom_all_reduce"),
    "host": ("layer_forward", "layer_backward"),
    "moe": ("experts",),
}
# what version 2 knows of the names (version 3 adds the elementwise ``layer`` op)
V2_KINDS: dict[str, tuple[str, ...]] = {
    **KINDS, "elementwise": ("copy", "add", "mul")}
DTYPES = ("bf16", "fp16", "fp32", "fp8", "fp8_block", "fp4")
V1_INT_COLUMNS = ("m", "n", "k", "batch", "heads", "kv_heads", "seq", "head_dim", "causal",
                  "nbytes", "ranks", "ranks_per_node", "repeats")
V2_INT_COLUMNS = ("experts", "top_k", "moe_tp", "moe_ep")
INT_COLUMNS = (*V1_INT_COLUMNS, *V2_INT_COLUMNS)
FLOAT_COLUMNS = ("seconds", "seconds_p10", "seconds_p90")
COLUMNS = ("kind", "op", "dtype", *INT_COLUMNS, *FLOAT_COLUMNS)
V1_COLUMNS = ("kind", "op", "dtype", *V1_INT_COLUMNS, *FLOAT_COLUMNS)
# what version 1 knows of the names (format_profile writes version 1 where they suffice)
V1_KINDS: dict[str, tuple[str, ...]] = {
    "gemm": ("matmul", "linear"), "attention": ("sdpa_fwd", "sdpa_bwd"),
    "elementwise": ("copy", "add", "mul"),
    "collective": ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"),
    "host": ("layer_forward", "layer_backward"),
}
V1_DTYPES = ("bf16", "fp16", "fp32", "fp8")
# what ``autoplan bench`` measures (the other kinds are imported)
BENCH_KINDS = {**V1_KINDS, "elementwise": KINDS["elementwise"]}
# shape columns each kind must set (> 0)
REQUIRED: dict[str, tuple[str, ...]] = {
    "gemm": ("m", "n", "k"),
    "attention": ("batch", "heads", "kv_heads", "seq", "head_dim"),
    "elementwise": ("nbytes",),
    "collective": ("nbytes", "ranks", "ranks_per_node"),
    "host": ("n", "seq", "k"),
    "moe": ("m", "n", "k", "experts", "top_k", "moe_tp", "moe_ep"),
}
# the kinds a profile corrects, and its ``applies`` header line may name (the surrogate fits each)
CORRECTABLE = ("gemm", "attention", "collective", "decode", "moe")
# the kinds an imported engine profile's correction applies by default (its ``applies``
# header line; a profile without the line applies every kind it has rows of). Measured on
# NVIDIA's end-to-end serving runs (``benchmarks/serving_silicon.py --every 4 --applies``;
# docs/ACCURACY.md, "Which measured kernels serving takes"): AIConfigurator's isolated
# GEMM, fused-MoE and decode-attention timings, applied to whole iterations, gave TPOT
# 69% MAPE where the roofline gave 23% (they time each call alone, launch and
# synchronization included, where an engine replays its decode step as one CUDA graph);
# its prefill attention and collectives kept TPOT at 23%. The forests of every kind are
# still fitted and cross-validated (``surrogate.fit_report``).
ENGINE_APPLIED_KINDS = ("attention", "collective")
# provenance every profile carries in its header; and one of ``torch`` (measured by
# ``autoplan bench``) or ``source`` (imported)
REQUIRED_META = ("autoplan-profile", "device_kind", "device_name", "date", "command")
MEASURED_BY = ("torch", "source")


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """A validated profile: provenance and rows (a DataFrame with :data:`COLUMNS`)."""

    source: str
    meta: Mapping[str, str]
    rows: pd.DataFrame = field(compare=False, repr=False)
    digest: str  # sha256 of the CSV text: identifies the profile in caches

    def __hash__(self) -> int:
        return hash(self.digest)

    def of_kind(self, kind: str) -> pd.DataFrame:
        """The rows of one kind; for ``gemm``, the rows :func:`gemm_rows` keeps."""
        rows = self.rows[self.rows["kind"] == kind]
        return gemm_rows(rows) if kind == "gemm" else rows

    @property
    def descriptor(self) -> str | None:
        """The autoplan device name the profile was taken on (``descriptor`` in the header)."""
        return self.meta.get("descriptor") or None

    @property
    def engine(self) -> str | None:
        """The serving engine whose kernels the profile timed (``engine``); None: a
        profile of autoplan's own microbenchmarks (``autoplan bench``)."""
        return self.meta.get("engine") or None

    @property
    def engine_version(self) -> str | None:
        return self.meta.get("engine_version") or None


def gemm_rows(gemm: pd.DataFrame) -> pd.DataFrame:
    """Of a profile's GEMM rows, the ones that stand for training: per dtype, the ``linear``
    rows where the profile has any, else the ``matmul`` ones. A training step runs every
    weight's GEMM in the three layouts ``linear`` times; on a GPU they cost about the same,
    but a CPU without native bf16 runs them 10-25x apart (torch 2.13 on AVX2, 1 thread,
    512 x 1024 x 1024 bf16: x @ W^T 8.5 GFLOP/s, row-major @ 0.9), so a ``matmul`` row
    would misprice a step there."""
    has_linear = set(gemm.loc[gemm["op"] == "linear", "dtype"])
    keep = (gemm["op"] == "linear") | ~gemm["dtype"].isin(has_linear)
    return gemm[keep]


def row_flops(row: Mapping[str, Any]) -> float:
    """FLOPs of one gemm or attention row (attention: causal halves the square; backward
    is 2.5 x forward, FlashAttention-2's 5 GEMMs against 2; Dao 2023, Algorithm 2)."""
    if row["kind"] == "gemm":
        return 2.0 * row["m"] * row["n"] * row["k"]
    if row["kind"] == "attention" and row["op"] == "decode":  # one query against seq keys
        return 4.0 * row["batch"] * row["heads"] * row["seq"] * row["head_dim"]
    if row["kind"] == "attention":
        fwd = 4.0 * row["batch"] * row["heads"] * row["seq"] ** 2 * row["head_dim"]
        fwd *= 0.5 if row["causal"] else 1.0
        return fwd * (2.5 if row["op"] == "sdpa_bwd" else 1.0)
    return 0.0


def _check_rows(frame: pd.DataFrame, source: str, columns: tuple[str, ...] = COLUMNS) -> list[Problem]:
    problems: list[Problem] = []
    for col in columns:
        if col not in frame.columns:
            problems.append(Problem(source, col, "missing column"))
    for col in frame.columns:
        if col not in columns:
            problems.append(Problem(source, str(col), f"unknown column; expected {', '.join(columns)}"))
    if problems:
        return problems
    for col in COLUMNS:  # a version 1 file: the version 2 columns are 0
        if col not in frame.columns:
            frame[col] = "0"
    for i, rec in enumerate(frame.to_dict("records")):
        where = f"row {i + 1}"  # data rows, 1-based, after the header
        kind, op = rec["kind"], rec["op"]
        if kind not in KINDS:
            problems.append(Problem(source, f"{where}.kind", f"expected one of {', '.join(KINDS)}, "
                                                              f"got {kind!r}"))
            continue
        if op not in KINDS[kind]:
            problems.append(Problem(source, f"{where}.op", f"expected one of {', '.join(KINDS[kind])} "
                                                            f"for {kind}, got {op!r}"))
        if rec["dtype"] not in DTYPES:
            problems.append(Problem(source, f"{where}.dtype", f"expected one of {', '.join(DTYPES)}, "
                                                               f"got {rec['dtype']!r}"))
        for col in INT_COLUMNS:
            v = rec[col]
            if not _is_int(v) or int(v) < 0:
                problems.append(Problem(source, f"{where}.{col}", f"expected a whole number >= 0, got {v!r}"))
        for col in REQUIRED[kind]:
            if _is_int(rec[col]) and int(rec[col]) == 0:
                problems.append(Problem(source, f"{where}.{col}", f"expected > 0 for {kind}, got {rec[col]}"))
        for col in FLOAT_COLUMNS:
            v = rec[col]
            if not _is_number(v) or not float(v) > 0:
                problems.append(Problem(source, f"{where}.{col}", f"expected seconds > 0, got {v!r}"))
        if len(problems) > 50:
            problems.append(Problem(source, "", "too many problems; stopped here"))
            break
    return problems


def _is_int(v: Any) -> bool:
    return _is_number(v) and float(v) == int(v)


def _is_number(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _header_entry(line: str) -> tuple[str, str] | None:
    """``# key: value`` as (key, value); None for a comment without a colon."""
    key, sep, value = line[1:].partition(":")
    return (key.strip(), value.strip()) if sep else None


def profile_header(lines: Iterable[str]) -> dict[str, str]:
    """The ``# key: value`` lines before the first row (no pandas: cheap enough to look
    through every shipped profile for the one of a device)."""
    meta: dict[str, str] = {}
    for line in lines:
        if not line.startswith("#"):
            break
        entry = _header_entry(line)
        if entry is not None:
            meta[entry[0]] = entry[1]
    return meta


def parse_profile(text: str, source: str) -> Profile:
    """Validate a profile's text; every problem is reported at once with the file and field."""
    meta: dict[str, str] = {}
    body: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            entry = _header_entry(line)
            if entry is not None:
                meta[entry[0]] = entry[1]
        elif line.strip():
            body.append(line)
    problems = [Problem(source, f"header.{k}", "missing (a '# key: value' line)")
                for k in REQUIRED_META if k not in meta]
    applies = meta.get("applies")
    if applies is not None:
        unknown = [k for k in applies.replace(",", " ").split() if k not in CORRECTABLE]
        if unknown or not applies.split():
            problems.append(Problem(source, "header.applies",
                                    f"expected kinds among {', '.join(CORRECTABLE)}, got {applies!r}"))
    if not any(meta.get(k) for k in MEASURED_BY):
        problems.append(Problem(source, "header.torch", "missing (a '# key: value' line; a profile "
                                                        "imported from other measurements names its "
                                                        "'source' instead)"))
    version = meta.get("autoplan-profile", FORMAT_VERSION)
    if version not in FORMAT_VERSIONS:
        problems.append(Problem(source, "header.autoplan-profile",
                                f"expected one of {', '.join(FORMAT_VERSIONS)}, got {version!r}"))
    if not body:
        raise InputError([*problems, Problem(source, "", "no rows")])
    import pandas as pd

    try:
        frame = pd.read_csv(io.StringIO("\n".join(body)), dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, ValueError) as exc:
        raise InputError([*problems, Problem(source, "", f"not a CSV table: {exc}")]) from None
    problems += _check_rows(frame, source, V1_COLUMNS if version == "1" else COLUMNS)
    if problems:
        raise InputError(problems)
    for col in INT_COLUMNS:
        frame[col] = frame[col].astype(float).astype("int64")
    for col in FLOAT_COLUMNS:
        frame[col] = frame[col].astype(float)
    frame = frame[list(COLUMNS)].reset_index(drop=True)
    digest = hashlib.sha256(text.encode()).hexdigest()
    return Profile(source=source, meta=meta, rows=frame, digest=digest)


# a profile: the shipped H200 one is 40 KiB; a full sweep over many shapes stays far below
MAX_PROFILE_BYTES = 64 << 20


def read_profile(path: Path) -> Profile:
    """A profile file through the one reader of file inputs (regular files only, at most
    :data:`MAX_PROFILE_BYTES`)."""
    from autoplan.descriptors.strict import read_limited

    data = read_limited(Path(path), MAX_PROFILE_BYTES, "a profile CSV")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError.single(str(path), "", f"cannot read file: {exc}") from None
    return parse_profile(text, str(path))


def _fits_v1(records: list[dict[str, Any]]) -> bool:
    """Whether every row is one a version 1 profile can hold."""
    return all(r["kind"] in V1_KINDS and r["op"] in V1_KINDS[r["kind"]] and r["dtype"] in V1_DTYPES
               and not any(r[c] for c in V2_INT_COLUMNS) for r in records)


def _fits_v2(records: list[dict[str, Any]]) -> bool:
    """Whether every row is one a version 2 profile can hold."""
    return all(r["op"] in V2_KINDS.get(r["kind"], ()) for r in records)


def format_profile(meta: Mapping[str, Any], rows: Iterable[Mapping[str, Any]]) -> str:
    """The CSV text of a profile: the header lines, then the rows (missing columns are 0);
    the lowest version every row fits (module doc)."""
    records = [{c: r.get(c, 0) for c in COLUMNS} for r in rows]
    columns = V1_COLUMNS if _fits_v1(records) else COLUMNS
    version = "1" if columns is V1_COLUMNS else "2" if _fits_v2(records) else FORMAT_VERSION
    # the version the rows need (a header copied from another profile names its own)
    head = {"autoplan-profile": version, **{k: str(v) for k, v in meta.items() if k != "autoplan-profile"}}
    lines = [f"# {k}: {' '.join(str(v).split())}" for k, v in head.items()]
    import pandas as pd

    frame = pd.DataFrame([{c: r[c] for c in columns} for r in records], columns=list(columns))
    for col in FLOAT_COLUMNS:
        frame[col] = frame[col].map(lambda s: f"{float(s):.6e}")
    return "\n".join(lines) + "\n" + frame.to_csv(index=False, lineterminator="\n")


def stream_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The elementwise rows of one streaming op (copy, add, mul): the memory's rate, not
    the eager layer's passes (op ``layer``)."""
    return rows[(rows["kind"] == "elementwise") & (rows["op"] != "layer")]


def layer_pass_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The elementwise ``layer`` rows: a decoder layer's eager memory-bound passes."""
    return rows[(rows["kind"] == "elementwise") & (rows["op"] == "layer")]


def sdpa_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The attention rows of whole sequences (forward or backward: not ``decode``)."""
    return rows[(rows["kind"] == "attention") & (rows["op"] != "decode")]


@dataclass(frozen=True, slots=True)
class Achieved:
    """The best rates a profile shows: what a descriptor of the measured machine calls peak."""

    gemm_flops: Mapping[str, float]  # dtype -> FLOP/s of the fastest GEMM
    attention_flops: float | None  # FLOP/s of the fastest attention call (forward or backward)
    memory_Bps: float | None  # bytes/s of the fastest streaming elementwise op (not ``layer``)


def achieved(profile: Profile) -> Achieved:
    """Best achieved rates: max FLOPs/second over the GEMM rows (per dtype) and attention
    rows, and max bytes/second over the elementwise rows."""
    rows = profile.rows
    gemm: dict[str, float] = {}
    for rec in profile.of_kind("gemm").to_dict("records"):
        rate = row_flops(rec) / rec["seconds"]
        gemm[rec["dtype"]] = max(gemm.get(rec["dtype"], 0.0), rate)
    attn = [row_flops(r) / r["seconds"] for r in sdpa_rows(rows).to_dict("records")]
    mem = [r["nbytes"] / r["seconds"] for r in stream_rows(rows).to_dict("records")]
    return Achieved(gemm, max(attn) if attn else None, max(mem) if mem else None)
