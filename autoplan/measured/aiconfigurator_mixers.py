"""Serving's measured token-mixer tables from NVIDIA AIConfigurator's kernel tables: the
Gated DeltaNet and Mamba-2 kernels of its ``linear_attention`` tables, and the DeepSeek Sparse
Attention module and DeepSeek-V4's compressed-attention modules of its ``sparse_attention``
tables, per GPU and engine version, written as
``profiles/measured/mixers/<device>-<engine>-<version>-<kind>-aiconfigurator-<aic>.csv``
(format and lookup: :mod:`autoplan.measured.mixer_tables`; ``python
scripts/aiconfigurator_profiles.py mixers``).

What the tables hold (columns as aiconfigurator-core 0.12.0 writes them; what they mean is
read from its own op classes, ``sdk/operations/mamba.py`` ``GDNKernel`` / ``Mamba2Kernel``
and ``sdk/operations/dsa.py`` ``ContextDSAModule`` / ``GenerationDSAModule``, and the models
that build them, ``sdk/models/qwen35.py``, ``nemotron_h.py``, ``deepseek_v32.py``; latencies
in milliseconds):

- ``gdn_perf.parquet``: one Gated DeltaNet layer's kernels: ``phase`` context runs the
  causal conv (``causal_conv1d_fn``) and the chunked delta rule (``chunk_gated_delta_rule``,
  vLLM's FlashInfer build ``chunk_gated_delta_rule_flashinfer``) over ``batch_size``
  sequences of ``seq_len`` tokens; generation the conv's state update
  (``causal_conv1d_update``) and the recurrent step (``fused_recurrent_gated_delta_rule``,
  ``..._packed_decode``) for ``batch_size`` sequences of one token. ``num_k_heads`` and
  ``num_v_heads`` are one GPU's (Qwen3.5's builder passes heads / tp), ``head_k_dim``,
  ``head_v_dim`` and ``d_conv`` the layer's; ``d_model`` (the model's hidden size) is part of
  the key but no kernel reads it: on an H200 with vLLM 0.24.0 the three d_model of 16 x 32
  heads time alike within 1% (d_model 2048, 2560, 4096), so a cell is the median over them.
  A layer's time in a phase is its two kernels' sum.
- ``mamba2_perf.parquet`` (TensorRT-LLM only): only the causal conv was measured
  (``causal_conv1d_fn`` context, ``causal_conv1d_update`` generation); the SSD scan
  (``mamba_chunk_scan_combined``, ``selective_state_update``) has no rows. Dimensions are the
  whole layer's (``Mamba2Kernel``: "full (unsharded) dimensions"); the depthwise conv runs
  over ``nheads x head_dim + 2 n_groups d_state`` channels, which is the key here (the
  collections with the same channel count: their median), so a GPU's share of a TP-split
  layer is found where its channel count was measured.
- ``dsa_context_module_perf.parquet`` / ``dsa_generation_module_perf.parquet``: the whole
  sparse-attention block of one layer (``ContextDSAModule``: the q/kv down and up
  projections, the indexer's projections, its fp8 MQA logits and top-k, sparse MLA, the
  absorbed BMMs and the output projection) of an ``architecture`` (DeepSeek-V3.2's
  ``DeepseekV32ForCausalLM``, GLM-5's ``GlmMoeDsaForCausalLM``; their dims are autoplan's
  built-in ``deepseek-v3.2`` and ``glm-5``, written in each file) with ``num_heads`` query
  heads on one GPU (``tp_size`` is 1 in vLLM's and TensorRT-LLM's rows: the heads stand for
  the TP split), ``kv_cache_dtype`` and ``gemm_type``. Context: ``batch_size`` prompts of
  ``isl`` tokens with no prefix (``step`` 0; the ``step`` 128 rows are left out);
  generation: ``batch_size`` sequences of one token each reading ``step`` tokens of cache.
  Taken from vLLM and TensorRT-LLM only (:data:`DSA_ENGINES` says why not SGLang's).
- ``dsv4_{csa,hca}_{context,generation}_module_perf.parquet`` (kinds ``dsv4_csa``,
  ``dsv4_hca``: DeepSeek-V4's C and H layers). What a row is was read from AIConfigurator's
  collectors (``collector/vllm/collect_dsv4_attn.py``, ``collector/trtllm/
  collect_dsv4_attn.py`` in its repository), its model builder (``sdk/models/
  deepseek_v4.py``) and its core's sources (``operators/dsv4.rs``, ``perf_database/
  dsv4.rs``; the wheel's compiled core itself is not readable): one layer's whole
  ``DeepseekV4Attention`` forward, built by the engine from a one-layer config of the
  ``model`` column's checkpoint with ``compress_ratios`` [4] (CSA) or [128] (HCA) and dummy
  fp8 weights: the q down and up projections, the key-value projection, the compressor(s)
  (C: its indexer's too), C's indexer (query heads, head weights, FP4 logits, top-k), the
  sparse attention over the sliding window and the pooled keys in one kernel
  (``FLASHMLA_SPARSE_DSV4`` in vLLM, ``DeepseekV4TrtllmAttention`` in TensorRT-LLM), the
  grouped ``wo_a`` and ``wo_b``; timed as a replayed CUDA graph (both collectors'
  ``benchmark_with_power(use_cuda_graph=True)``), no collective (TP is simulated in one
  process). AIConfigurator prices a layer's attention with this one op, no separate
  projection GEMMs (``sdk/models/deepseek_v4.py``), as serving does here: the module less
  its projections at fp8 (``StepModel._block_gemms``), the layer's GEMMs priced apart.
  ``num_heads`` is the GPU's share (the collectors' "rank-local" convention: ``num_heads x
  tp_size`` is the model's heads; rows breaking it are left out); ``tp_size`` the TP it
  stands for. Context rows: ``batch_size`` prompts of ``isl`` new tokens after ``step``
  tokens of prefix; only ``step`` 0 is kept (the serving cost prices a chunk after a prefix
  as the larger of its own time and that of prefix + chunk less that of the prefix: against
  vLLM's measured prefix rows on an H200, Flash at TP 8, within 13% for C, 3% for H).
  Generation rows: ``batch_size`` sequences of one token each after ``step`` tokens of
  cache. The dims of each ``model`` (``sgl-project/DeepSeek-V4-Flash-FP8``, ``...-Pro-FP8``,
  ``deepseek-ai/DeepSeek-V4-Pro``) are read by autoplan's HuggingFace import from the config
  the package ships for it, the one its collectors read (:func:`dsv4_model`), and written in
  each file (``arch.`` lines, through ``kernels.mixers.v4_dims``). Only ``fp8_block`` GEMMs and
  an fp8 cache were timed. Taken from vLLM 0.24.0 (six GPUs) and TensorRT-LLM 1.3.0rc23
  (B200, B300, GB200, GB300: its first release that runs the model; its other tables ship
  at 1.3.0rc20); not SGLang's (:data:`DSV4_ENGINES` says why). Dummy weights give the
  indexer near-constant scores; AIConfigurator corrects SGLang's C rows for the top-k this
  makes slow (``dsv4_csa_topk_calib``) and takes vLLM's and TensorRT-LLM's as measured
  (their collectors: "no trtllm calib table is produced yet - same accepted state as vllm
  0.24.0"), as here. A key whose collection is partial (no one-sequence row at the shortest
  length in a phase: vLLM's Pro rows on B300 and GB300) is left out whole, named in the
  file's ``# skipped:`` line. ``dsv4_hca_attn_module``, ``dsv4_paged_mqa_logits_module``
  and ``dsv4_csa_topk_calib`` are not taken: AIConfigurator reads them only for context
  parallelism's composition and SGLang's top-k correction.

Grids: per key, one row per batch size, one column per sequence length (context: tokens
per sequence; generation: GDN and Mamba-2 one token, DSA its context), microseconds. A cell
the table did not measure (its largest batch x length: the collectors stop where memory
runs out) is filled from the nearest smaller measured batch at its rate per sequence
(time x b / b': sequences are independent), else the nearest shorter length (time x s / s');
each file counts them in its ``# filled:`` line. DSA's length axes are thinned to
:data:`DSA_CONTEXT_LENGTHS` and :data:`DSA_GENERATION_LENGTHS` and its heads to the
architectures' heads over TP 1, 2, 4, 8, DeepSeek-V4's to :data:`DSV4_CONTEXT_LENGTHS` and
:data:`DSV4_GENERATION_LENGTHS` (the shipped files stay small).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autoplan.errors import InputError
from autoplan.measured.aiconfigurator import (
    DISTRIBUTION,
    LICENSE,
    SYSTEMS,
    Package,
    _need,
    _positive,
    _read,
    _versions_with,
    engine_versions,
)
from autoplan.measured.shipped import version_key

if TYPE_CHECKING:
    import pandas as pd

    from autoplan.descriptors.model import Model

FORMAT = "1"
MIXERS_COMMAND = "python scripts/aiconfigurator_profiles.py mixers"
KINDS = ("gdn", "mamba2", "dsa", "dsv4_csa", "dsv4_hca")
# the aiconfigurator kernels each phase of a layer sums (module doc), by the table's names
GDN_KERNELS = {
    "context": ("causal_conv1d_fn", ("chunk_gated_delta_rule", "chunk_gated_delta_rule_flashinfer")),
    "generation": ("causal_conv1d_update", ("fused_recurrent_gated_delta_rule",
                                            "fused_recurrent_gated_delta_rule_packed_decode")),
}
MAMBA_KERNELS = {"context": "causal_conv1d_fn", "generation": "causal_conv1d_update"}
KV_DTYPES = {"bfloat16": "bf16", "fp8": "fp8"}
DSA_GEMM = {"bfloat16": "bf16", "fp8_block": "fp8_block"}
# the DSA architectures and the built-in model whose dims each one's rows were timed at
DSA_ARCHITECTURES = {"DeepseekV32ForCausalLM": "deepseek-v3.2", "GlmMoeDsaForCausalLM": "glm-5"}
DSA_TP = (1, 2, 4, 8)
DSA_DIMS = ("hidden:q_lora_rank:kv_lora_rank:qk_nope_head_dim:qk_rope_head_dim:v_head_dim:index_topk:"
            "index_heads:index_head_dim")
DSA_CONTEXT_LENGTHS = (1, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
DSA_GENERATION_LENGTHS = (1, 2, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
# batch sizes kept (the tables' powers of 2 up to 1024; between these, log-log interpolation
# is within a few percent of the dropped ones)
BATCHES = (1, 4, 16, 64, 256, 1024)
# GDN's and Mamba-2's tokens per sequence kept (the tables' 1, 2, 4, ... 32768 less 2, 4, 8, 32)
LINEAR_LENGTHS = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
SHIPPED_ENGINES = ("vllm", "sglang", "trtllm")
# the phases of each kind the serving cost takes from the shipped files (their ``# applies:``
# line; autoplan/measured/mixer_tables.py). DSA's generation block is timed alone, launches
# included (vLLM 0.24.0 on an H200: 0.17 ms a layer at one sequence, 20x the roofline's reads;
# 4.7x at 64), where the engines replay a decode step as one CUDA graph: the engine profiles'
# decode tables, timed the same way, made NVIDIA's measured TPOT 65% too slow when applied
# (docs/ACCURACY.md, "Which measured kernels serving takes"). It ships, not applied. Its
# context block is timed the same way, as a whole module (projections, indexer, top-k,
# sparse MLA) at 2.8-19x the roofline's time (TensorRT-LLM 1.3.0rc20 on an H200: 3.2 ms a
# layer for a 2,048-token prompt): no measured DeepSeek-V3.2 or GLM-5 run says which is
# right, so both phases ship unapplied (``every`` in mixer_tables.py takes them), as the
# training GEMM grids do (profiles/measured/README.md). DeepSeek-V4's modules apply in both
# phases: their collectors replay each as a CUDA graph (module doc), the form an engine's
# decode step runs in, and no other measurement of the model's attention exists. They run
# 3-20x the roofline of the same work (benchmarks/serving_mixer_tables.py: Flash at TP 8 on an
# H200 with vLLM, a C layer's decode of 64 sequences of 4,096 tokens 125 us against 19 us; its
# TPOT at 2 requests/s 5.2 -> 7.5 ms): no measured DeepSeek-V4 run says which is right; "no"
# here (and a rewrite) keeps the roofline.
APPLIES = {"gdn": "yes", "mamba2": "yes", "dsa": "no", "dsv4_csa": "yes", "dsv4_hca": "yes"}
# the engines whose DSA tables are taken: SGLang 0.5.14's context rows time its dense prefill
# (prompts up to 2048 tokens) at 0.76-0.85 ms whatever the batch (1 to 8192 tokens on an H200)
# and its sparse prefill only at 4096-8192 tokens for one or two prompts: most of a grid would
# be extrapolated, so SGLang's sparse attention keeps the roofline
DSA_ENGINES = ("vllm", "trtllm")
# DeepSeek-V4's module tables: the autoplan kind of each table (its AIConfigurator attention
# kind) and the compress ratio its rows were timed at
DSV4_KINDS = {"csa": ("dsv4_csa", 4), "hca": ("dsv4_hca", 128)}
# the engines whose DeepSeek-V4 tables are taken: SGLang 0.5.14's prefill rows stop at 8,192
# tokens a batch (two thirds of the kept grid would be extrapolated) and its C rows time the
# indexer's top-k on the collector's degenerate scores, which AIConfigurator itself takes off
# with its dsv4_csa_topk_calib table (up to 0.08 ms of a 0.11-0.19 ms decode layer on an
# H200), a correction its compiled core interpolates: SGLang's compressed layers keep the
# roofline (module doc)
DSV4_ENGINES = ("vllm", "trtllm")
DSV4_GEMM = "fp8_block"  # the only GEMM dtype the tables hold (the collectors' fp8 checkpoints)
DSV4_CONTEXT_LENGTHS = (1, 16, 128, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
DSV4_GENERATION_LENGTHS = (1, 128, 512, 2048, 8192, 32768, 65536)


@dataclass(frozen=True, slots=True)
class MixerFile:
    """One mixer table file to write: its name, header and rows (phase, key, batch, values
    over the phase's length axis)."""

    name: str
    header: dict[str, str]
    rows: list[list[str]]

    def text(self) -> str:
        lines = [f"# {k}: {v}" for k, v in self.header.items()]
        lines.append("phase,key,batch,us...")
        lines += [",".join(r) for r in self.rows]
        return "\n".join(lines) + "\n"


def _us(ms: float) -> str:
    """Microseconds to three significant digits, without an exponent."""
    us = ms * 1e3
    if us <= 0:
        return "0"
    digits = max(0, 2 - math.floor(math.log10(us)))
    return f"{round(us, digits):.{digits}f}"


Cells = dict[tuple[int, int], float]  # (batch, length) -> ms


def fill(cells: Cells, batches: list[int], lengths: list[int]) -> tuple[Cells, int]:
    """The grid with every cell (module doc: missing cells from the nearest smaller measured
    batch, time x b / b', else the nearest shorter length, time x s / s'), and how many
    were filled."""
    out = dict(cells)
    filled = 0
    for s in lengths:
        for b in batches:
            if (b, s) in out:
                continue
            below = [bb for bb in batches if bb < b and (bb, s) in cells]
            if below:
                out[(b, s)] = cells[(below[-1], s)] * b / below[-1]
            else:
                shorter = [ss for ss in lengths if ss < s and (b, ss) in out]
                if not shorter:
                    raise InputError.single("aiconfigurator", "",
                                            f"nothing measured near batch {b}, length {s}")
                out[(b, s)] = out[(b, shorter[-1])] * s / shorter[-1]
            filled += 1
    return out, filled


def _grid_rows(phase: str, key: str, cells: Cells, lengths: list[int]) -> tuple[list[list[str]], int]:
    batches = sorted({b for b, _ in cells})
    full, filled = fill(cells, batches, lengths)
    return [[phase, key, str(b), *(_us(full[(b, s)]) for s in lengths)] for b in batches], filled


def _header(kind: str, system: str, engine: str, version: str, frame: pd.DataFrame, source: str,
            package: Package) -> dict[str, str]:
    measured_on = str(frame["device"].iloc[0]) if "device" in frame.columns and len(frame) else system
    return {"autoplan-mixer-kernels": FORMAT, "kind": kind, "descriptor": SYSTEMS[system],
            "device_name": measured_on, "engine": engine, "engine_version": version,
            "source": f"{DISTRIBUTION} {package.version} {system}/{source}", "applies": APPLIES[kind],
            "license": LICENSE}


def _file_name(system: str, engine: str, version: str, kind: str, package: Package) -> str:
    return f"{SYSTEMS[system]}-{engine}-{version}-{kind}-aiconfigurator-{package.version}.csv"


# --------------------------------------------------------------------------- GDN

def _gdn(package: Package, system: str, engine: str, version: str, command: str) -> MixerFile | None:
    path = package.data / system / "linear_attention" / engine / version / "gdn_perf.parquet"
    if not path.is_file():
        return None
    frame = _read(path)
    shape = ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "d_conv")
    _need(frame, path, ("phase", "kernel_source", "batch_size", "seq_len", "latency", *shape))
    frame = _positive(frame, ["batch_size", "seq_len", *shape])
    rows: list[list[str]] = []
    filled = 0
    axes: dict[str, list[int]] = {}
    used: dict[str, set[str]] = {}
    for phase, (conv, cores) in GDN_KERNELS.items():
        part = frame[(frame["phase"] == phase) & frame["kernel_source"].isin([conv, *cores])]
        if part.empty:
            continue
        part = part[part["seq_len"].isin(list(LINEAR_LENGTHS)) & part["batch_size"].isin(list(BATCHES))]
        med = part.groupby([*shape, "kernel_source", "batch_size", "seq_len"],
                           as_index=False)["latency"].median()
        used[phase] = set(med["kernel_source"])
        lengths = sorted(int(s) for s in med["seq_len"].unique())
        axes[phase] = lengths
        for key, group in med.groupby(list(shape), sort=True):
            by: dict[tuple[int, int], dict[str, float]] = {}
            for r in group.itertuples():
                cell = by.setdefault((int(r.batch_size), int(r.seq_len)), {})
                cell[str(r.kernel_source)] = float(r.latency)
            # a cell is measured where both of the phase's kernels were (one core kernel each)
            cells = {bs: ks[conv] + next(ks[c] for c in cores if c in ks) for bs, ks in by.items()
                     if conv in ks and any(c in ks for c in cores)}
            if not cells:
                continue
            got, n = _grid_rows(phase, "/".join(str(int(v)) for v in key), cells, lengths)
            rows += got
            filled += n
    if not rows:
        return None
    header = _header("gdn", system, engine, version, frame,
                     f"linear_attention/{engine}/{version}/gdn_perf.parquet", package)
    header.update({
        "kernels": "; ".join(f"{phase}: {' + '.join(sorted(used[phase]))}" for phase in used),
        "key": "k_heads/v_heads/head_k_dim/head_v_dim/conv_kernel of one GPU",
        "axis.context": "seq " + " ".join(map(str, axes.get("context", []))),
        "axis.generation": "seq " + " ".join(map(str, axes.get("generation", []))),
        "units": "microseconds of one layer's kernels of the phase, summed (median over the table's "
                 "d_model); one row per batch, one column per tokens a sequence computes",
        "filled": f"{filled} cells (module doc: from the nearest smaller batch, time x b / b')",
        "command": command,
    })
    return MixerFile(_file_name(system, engine, version, "gdn", package), header, rows)


# --------------------------------------------------------------------------- Mamba-2

def _mamba(package: Package, system: str, engine: str, version: str, command: str) -> MixerFile | None:
    path = package.data / system / "linear_attention" / engine / version / "mamba2_perf.parquet"
    if not path.is_file():
        return None
    frame = _read(path)
    dims = ("nheads", "head_dim", "n_groups", "d_state", "d_conv")
    _need(frame, path, ("phase", "kernel_source", "batch_size", "seq_len", "latency", *dims))
    frame = _positive(frame, ["batch_size", "seq_len", *dims])
    frame = frame.assign(channels=frame["nheads"] * frame["head_dim"]
                         + 2 * frame["n_groups"] * frame["d_state"])
    rows: list[list[str]] = []
    filled = 0
    axes: dict[str, list[int]] = {}
    for phase, kernel in MAMBA_KERNELS.items():
        part = frame[(frame["phase"] == phase) & (frame["kernel_source"] == kernel)]
        if part.empty:
            continue
        part = part[part["seq_len"].isin(list(LINEAR_LENGTHS)) & part["batch_size"].isin(list(BATCHES))]
        med = part.groupby(["channels", "d_conv", "batch_size", "seq_len"],
                           as_index=False)["latency"].median()
        lengths = sorted(int(s) for s in med["seq_len"].unique())
        axes[phase] = lengths
        for (channels, conv), group in med.groupby(["channels", "d_conv"], sort=True):
            cells = {(int(r.batch_size), int(r.seq_len)): float(r.latency) for r in group.itertuples()}
            got, n = _grid_rows(phase, f"{int(channels)}/{int(conv)}", cells, lengths)
            rows += got
            filled += n
    if not rows:
        return None
    header = _header("mamba2", system, engine, version, frame,
                     f"linear_attention/{engine}/{version}/mamba2_perf.parquet", package)
    header.update({
        "kernels": "; ".join(f"{phase}: {kernel}" for phase, kernel in MAMBA_KERNELS.items()) +
                   " (the causal conv only: the table has no SSD scan rows)",
        "key": "channels/conv_kernel of one GPU (channels: heads x head_dim + 2 x groups x state)",
        "axis.context": "seq " + " ".join(map(str, axes.get("context", []))),
        "axis.generation": "seq " + " ".join(map(str, axes.get("generation", []))),
        "units": "microseconds of one layer's conv kernel (median over the collections of that channel "
                 "count); one row per batch, one column per tokens a sequence computes",
        "filled": f"{filled} cells (module doc: from the nearest smaller batch, time x b / b')",
        "command": command,
    })
    return MixerFile(_file_name(system, engine, version, "mamba2", package), header, rows)


# --------------------------------------------------------------------------- DSA

def dsa_dims(model_name: str) -> str:
    """The dims a DSA table's rows were timed at, as the key's first part: hidden,
    q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, index_topk,
    index_heads, index_head_dim of the built-in model (``autoplan.serving.kinds.dsa_key``
    writes a model's the same way)."""
    from autoplan.descriptors.library import resolve_model

    m = resolve_model(model_name)
    return ":".join(str(int(v)) for v in (m.hidden, m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim,
                                          m.qk_rope_head_dim, m.v_head_dim, m.index_topk, m.index_heads,
                                          m.index_head_dim))


def _dsa_frame(path: Path, op: str) -> pd.DataFrame:
    frame = _read(path)
    _need(frame, path, ("op_name", "kernel_source", "architecture", "kv_cache_dtype", "gemm_type",
                        "num_heads", "batch_size", "isl", "step", "latency"))
    frame = frame[(frame["op_name"] == op) & frame["architecture"].isin(list(DSA_ARCHITECTURES))
                  & frame["kv_cache_dtype"].isin(list(KV_DTYPES)) & frame["gemm_type"].isin(list(DSA_GEMM))]
    return _positive(frame, ["num_heads", "batch_size"])


def _dsa(package: Package, system: str, engine: str, version: str, command: str,
         heads_of: Callable[[str], int]) -> MixerFile | None:
    base = package.data / system / "sparse_attention" / engine / version
    ctx_path, gen_path = base / "dsa_context_module_perf.parquet", base / "dsa_generation_module_perf.parquet"
    if not (ctx_path.is_file() and gen_path.is_file()):
        return None
    ctx = _dsa_frame(ctx_path, "dsa_context_module")
    ctx = ctx[(ctx["step"] == 0) & (ctx["isl"] > 0)].assign(length=lambda f: f["isl"])
    gen = _dsa_frame(gen_path, "dsa_generation_module")
    gen = gen[gen["step"] > 0].assign(length=lambda f: f["step"])
    rows: list[list[str]] = []
    filled = 0
    axes: dict[str, list[int]] = {}
    kernels: dict[str, set[str]] = {}
    gemms: set[str] = set()
    aliases = {arch: f"a{i}" for i, arch in enumerate(DSA_ARCHITECTURES)}
    phases = (("context", ctx, DSA_CONTEXT_LENGTHS), ("generation", gen, DSA_GENERATION_LENGTHS))
    for phase, frame, keep in phases:
        frame = frame[frame["length"].isin(list(keep)) & frame["batch_size"].isin(list(BATCHES))]
        wanted = frame["architecture"].map(lambda a: {heads_of(a) // tp for tp in DSA_TP})
        frame = frame[[h in w for h, w in zip(frame["num_heads"], wanted, strict=True)]]
        keys = ["architecture", "num_heads", "kv_cache_dtype"]
        frame = frame.drop_duplicates([*keys, "gemm_type", "batch_size", "length"])
        kernels[phase] = set(frame["kernel_source"])
        gemms.update(DSA_GEMM[g] for g in frame["gemm_type"].unique())
        frame = frame.groupby([*keys, "batch_size", "length"], as_index=False)["latency"].median()
        lengths = sorted(int(s) for s in frame["length"].unique())
        axes[phase] = lengths
        for (arch, heads, kv), group in frame.groupby(keys, sort=True):
            cells = {(int(r.batch_size), int(r.length)): float(r.latency) for r in group.itertuples()}
            key = f"{aliases[arch]}/{int(heads)}/{KV_DTYPES[kv]}"
            got, n = _grid_rows(phase, key, cells, lengths)
            rows += got
            filled += n
    if not rows:
        return None
    header = _header("dsa", system, engine, version, ctx,
                     f"sparse_attention/{engine}/{version}/dsa_{{context,generation}}_module_perf.parquet",
                     package)
    header.update({
        "kernels": "; ".join(f"{phase}: the whole sparse-attention block ({', '.join(sorted(k))})"
                             for phase, k in kernels.items()),
        "key": "architecture/heads of one GPU/KV cache dtype",
        "gemm": " ".join(sorted(gemms)) + " (the projections' GEMM dtypes measured; a cell is the "
                "median over them: on an H200 fp8_block over bf16 is 0.98-1.00 at the median, "
                "0.89-1.25 10th-90th)",
        **{f"arch.{aliases[a]}": f"{a} {dsa_dims(name)} ({DSA_DIMS}, autoplan's {name})"
           for a, name in DSA_ARCHITECTURES.items()},
        "axis.context": "seq " + " ".join(map(str, axes["context"])),
        "axis.generation": "context " + " ".join(map(str, axes["generation"])),
        "units": "microseconds of one layer's block (projections, indexer, sparse MLA, output projection); "
                 "context: one row per batch, one column per prompt tokens (no prefix); generation: one "
                 "column per tokens of cache each sequence reads",
        "filled": f"{filled} cells (module doc: from the nearest smaller batch, time x b / b')",
        "command": command,
    })
    return MixerFile(_file_name(system, engine, version, "dsa", package), header, rows)


# --------------------------------------------------------------------------- DeepSeek-V4

def dsv4_model(package: Package, name: str) -> Model:
    """The model AIConfigurator's DeepSeek-V4 rows of ``name`` were timed at: the config its
    package ships for it (``model_configs/<owner>--<name>_config.json``, the file its
    collectors read), imported by autoplan's own reader (its ``model_type`` set to
    ``deepseek_v4``, as TensorRT-LLM's collector does: the FP8 repacks name ``deepseek_ref``)."""
    import json

    from autoplan.descriptors.hf import model_from_hf_config

    path = package.data.parent.parent / "model_configs" / f"{name.replace('/', '--')}_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError.single(str(path), "", f"cannot read the config of {name}: {exc}") from None
    if not isinstance(config, dict):
        raise InputError.single(str(path), "", "expected a JSON object")
    return model_from_hf_config({**config, "model_type": "deepseek_v4"}, str(path))


def _dsv4(package: Package, system: str, engine: str, version: str, command: str, which: str
          ) -> MixerFile | None:
    from autoplan.descriptors.model import CSA, HCA
    from autoplan.kernels.mixers import V4_DIMS, V4_INDEX_DIMS, v4_dims

    kind, ratio = DSV4_KINDS[which]
    mixer = CSA if which == "csa" else HCA
    base = package.data / system / "sparse_attention" / engine / version
    paths = {phase: base / f"dsv4_{which}_{phase}_module_perf.parquet" for phase in ("context", "generation")}
    if not all(path.is_file() for path in paths.values()):
        return None
    frames = {}
    for phase, path in paths.items():
        frame = _read(path)
        _need(frame, path, ("op_name", "kernel_source", "model", "kv_cache_dtype", "gemm_type", "num_heads",
                            "tp_size", "batch_size", "isl", "step", "compress_ratio", "latency"))
        frame = frame[(frame["op_name"] == f"dsv4_{which}_{phase}_module") & (frame["gemm_type"] == DSV4_GEMM)
                      & frame["kv_cache_dtype"].isin(list(KV_DTYPES)) & (frame["compress_ratio"] == ratio)]
        frame = _positive(frame, ["num_heads", "tp_size", "batch_size"])
        keep: tuple[int, ...]
        if phase == "context":  # prompts without a prefix (the step > 0 rows are left out)
            frame = frame[(frame["step"] == 0) & (frame["isl"] > 0)].assign(length=lambda f: f["isl"])
            keep = DSV4_CONTEXT_LENGTHS
        else:  # one token each, reading ``step`` tokens of cache
            frame = frame[frame["step"] > 0].assign(length=lambda f: f["step"])
            keep = DSV4_GENERATION_LENGTHS
        frames[phase] = frame[frame["length"].isin(list(keep)) & frame["batch_size"].isin(list(BATCHES))]
    names = sorted(set().union(*(set(f["model"]) for f in frames.values())))
    models = {name: dsv4_model(package, name) for name in names}
    dims = {name: v4_dims(m, mixer) for name, m in models.items()}
    aliases = {d: f"a{i}" for i, d in enumerate(sorted(set(dims.values()), key=lambda d: [int(v) for v in
                                                                                          d.split(":")]))}
    grids: dict[str, dict[str, Cells]] = {}
    axes: dict[str, list[int]] = {}
    kernels: dict[str, set[str]] = {}
    for phase, frame in frames.items():
        # rank-local heads (AIConfigurator's convention: num_heads x tp_size is the model's), at
        # the model's own compress ratio for the kind
        heads = frame["model"].map(lambda n: models[n].heads)
        ratios = frame["model"].map(lambda n: models[n].csa_ratio if mixer == CSA else models[n].hca_ratio)
        frame = frame[(frame["num_heads"] * frame["tp_size"] == heads) & (ratios == ratio)]
        frame = frame.assign(dims=frame["model"].map(dims), kv=frame["kv_cache_dtype"].map(KV_DTYPES))
        frame = frame.drop_duplicates(["model", "num_heads", "kv", "batch_size", "length"])
        kernels[phase] = set(frame["kernel_source"])
        frame = frame.groupby(["dims", "num_heads", "kv", "batch_size", "length"],
                              as_index=False)["latency"].median()
        lengths = sorted(int(s) for s in frame["length"].unique())
        axes[phase] = lengths
        grids[phase] = {f"{aliases[str(arch)]}/{int(local)}/{kv}": {
            (int(r.batch_size), int(r.length)): float(r.latency) for r in group.itertuples()}
            for (arch, local, kv), group in frame.groupby(["dims", "num_heads", "kv"], sort=True)}
    if not axes.get("context") or not axes.get("generation"):
        return None
    # a key is kept where both phases measured one sequence at their shortest length (the grid
    # fills from there); the collectors' partial runs are left out whole (module doc)
    keys = sorted(set(grids["context"]) | set(grids["generation"]))
    kept = [k for k in keys if all((1, axes[p][0]) in grids[p].get(k, {}) for p in grids)]
    rows: list[list[str]] = []
    filled = 0
    for phase in grids:
        for key in kept:
            got, n = _grid_rows(phase, key, grids[phase][key], axes[phase])
            rows += got
            filled += n
    if not rows:
        return None
    fields = V4_DIMS + (":" + V4_INDEX_DIMS if mixer == CSA else "")
    source = (f"sparse_attention/{engine}/{version}/dsv4_{which}_{{context,generation}}_module_perf.parquet")
    header = _header(kind, system, engine, version, frames["context"], source, package)
    header.update({
        "kernels": "; ".join(f"{phase}: the whole DeepSeek-V4 {which.upper()} attention module "
                             f"({', '.join(sorted(k))})" for phase, k in kernels.items()),
        "key": "architecture/heads of one GPU/KV cache dtype",
        "gemm": f"{DSV4_GEMM} (the projections' GEMM dtype the collectors ran)",
        **{f"arch.{alias}": f"{'+'.join(n for n in names if dims[n] == d)} {d} ({fields})"
           for d, alias in aliases.items()},
        "axis.context": "seq " + " ".join(map(str, axes["context"])),
        "axis.generation": "context " + " ".join(map(str, axes["generation"])),
        "units": "microseconds of one layer's attention module (projections, compressor"
                 + (", indexer and top-k" if mixer == CSA else "") + ", sliding window and compressed "
                 "attention, grouped output projection), a CUDA graph replayed; context: one row per "
                 "batch, one column per prompt tokens (no prefix); generation: one column per tokens "
                 "of cache each sequence reads",
        "filled": f"{filled} cells (module doc: from the nearest smaller batch, time x b / b')",
        "skipped": " ".join(k for k in keys if k not in kept) or "none",
        "command": command,
    })
    if header["skipped"] != "none":
        header["skipped"] += " (partial collections: no one-sequence rows at the shortest length)"
    return MixerFile(_file_name(system, engine, version, kind, package), header, rows)


def _dsv4_version(package: Package, system: str, engine: str, version: str) -> str | None:
    """The version of ``engine``'s DeepSeek-V4 tables to take: ``version`` where the package
    holds them there, else the newest release holding them of the same line (major.minor.
    patch): TensorRT-LLM's are at 1.3.0rc23 alone, its first release that runs the model
    (autoplan/serving/engines/trtllm.py), where its serving profile ships at 1.3.0rc20."""
    found = _versions_with(package.data, system, "sparse_attention", engine,
                           "dsv4_csa_context_module_perf.parquet")
    if version in found:
        return version
    line = version_key(version)[0]
    same = [v for v in found if version_key(v)[0] == line]
    return max(same, key=version_key) if same else None


def _heads(arch: str) -> int:
    from autoplan.descriptors.library import resolve_model

    return int(resolve_model(DSA_ARCHITECTURES[arch]).heads)


def mixer_files(package: Package, system: str, command: str = MIXERS_COMMAND,
                versions: Mapping[str, str] | None = None) -> list[MixerFile]:
    """The mixer tables of ``system`` for each engine at ``versions[engine]`` (default: the
    newest version of its GEMM table, the version its serving profile ships at) where the
    package has them at that version exactly."""
    out: list[MixerFile] = []
    for engine in SHIPPED_ENGINES:
        version = (versions or {}).get(engine)
        if version is None:
            found = engine_versions(package, system, engine)
            if not found:
                continue
            version = found[-1]
        for make in (_gdn, _mamba):
            got = make(package, system, engine, version, command)
            if got is not None:
                out.append(got)
        dsa_versions = _versions_with(package.data, system, "sparse_attention", engine,
                                      "dsa_context_module_perf.parquet")
        if engine in DSA_ENGINES and version in dsa_versions:
            dsa = _dsa(package, system, engine, version, command, _heads)
            if dsa is not None:
                out.append(dsa)
        v4 = _dsv4_version(package, system, engine, version) if engine in DSV4_ENGINES else None
        for which in DSV4_KINDS if v4 is not None else ():
            assert v4 is not None
            got = _dsv4(package, system, engine, v4, command, which)
            if got is not None:
                out.append(got)
    return out
