"""The learned correction: one random forest per kernel kind predicts measured over
analytic time from shape features, fitted on a microbenchmark profile
(:mod:`autoplan.measured.profile`).

Target: log(measured seconds / analytic seconds) of each profile row, where "analytic"
is the cost model's own function for that row on the uncorrected device and cluster:
:func:`~autoplan.kernels.compute.gemm_time`, :func:`~autoplan.kernels.compute.attention_time`,
:func:`~autoplan.kernels.compute.decode_attention_time`,
:func:`~autoplan.kernels.compute.experts_time`, and the collectives of
:mod:`autoplan.kernels.comm` on the row's group (an engine's own all-reduce:
:func:`~autoplan.kernels.comm.custom_all_reduce`). A corrected device multiplies those same
functions by exp(prediction), so fit and use cannot drift apart.
Log ratios make over- and under-prediction symmetric; trees predict inside the range
of the ratios they saw, so a shape far from every measured one gets its nearest
neighbours' ratio, never an extrapolation (Breiman 2001, random forests).

Features (kinds corrected: gemm, attention, collective, decode, moe; elementwise rows only
serve :func:`autoplan.measured.machine.describe_machine`):

- gemm: log2 of m, n, k, FLOPs and arithmetic intensity (FLOPs per byte moved), dtype;
- attention (whole sequences, ``sdpa_fwd``/``sdpa_bwd`` rows): log2 of batch x heads,
  sequence and head dim, query heads per KV head, causal, backward;
- decode (attention ``decode`` rows): log2 of batch, context, head dim and query heads,
  query heads per KV head, KV bytes per element;
- collective: op, log2 bytes, ranks, ranks per NVLink domain (per node in a profile),
  domains spanned;
- moe: log2 of tokens, hidden, intermediate width, experts, expert TP and EP, and of the
  routed rows per expert, top-k, dtype.

Engine profiles (a header naming an ``engine``: kernels a serving engine runs, imported by
:mod:`autoplan.measured.aiconfigurator`): their GEMMs read weights stored at the row's
dtype (fp8: 1 byte, fp4: half), as serving prices them, where ``autoplan bench``'s
training GEMMs read 16-bit weights; their attention rows are priced with the kernel the
header's ``attention_kernel`` names (``flash3``: what serving prices prefill with),
``bench``'s with FlashAttention-2's rates. fp8_block rows stand for fp8 (the same tensor
cores; the dtype feature keeps them apart from per-tensor fp8 rows, and a job's fp8 GEMM
is looked up as fp8); fp4 rows stand for ``Dtype.FP4`` where autoplan has one.

Tree counts: 100 trees for a kind of at most :data:`FULL_FOREST_ROWS` rows (every ``bench``
profile's kinds); larger kinds, and every kind of an engine profile, get
:data:`LARGE_FOREST_TREES`: a fit costs rows x trees, the forests are fitted whenever a
profile applies (:func:`fit_correction`: an engine profile on every serving command), and
40 trees cross-validate as well as 100 on the shipped engine profiles (the held-out error
of an H100 vLLM profile's kinds moves by under one point). The uncertainty band's member
i takes tree i mod trees of each kind.

Dtype rule: each profile row stands for the job dtype whose peak the analytic model
uses for it: a bf16, fp16 or fp8 row stands for itself, on a CPU as on an accelerator
(``autoplan validate`` computes in bf16 on a CPU too, and ``describe_machine`` fits the
descriptor's peak on the bf16 rows); fp32 rows stand for nothing (no job computes its
GEMMs in fp32). Attention runs in 16 bits (fp8 jobs too): attention rows standing for
bf16 or fp16 are used.

Coverage: a GEMM in a dtype the profile did not measure, and a collective spanning
more ranks or more NVLink domains than any profile row of its op (a single-node
profile says nothing of the inter-node network), keep their analytic time.

Uncertainty: every tree of a forest is one plausible correction. Evaluating a plan once
per tree (member i uses tree i of every kind) gives a distribution of step times; its
10th and 90th percentiles are the band (tree spread as uncertainty: Meinshausen 2006,
quantile regression forests, taken at the level of whole trees).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.ensemble import RandomForestRegressor
from sklearn.model_selection import KFold
from sklearn.utils.validation import check_is_fitted, validate_data

from autoplan.cost.evaluate import evaluate
from autoplan.descriptors.hardware import Cluster
from autoplan.descriptors.stack import AttentionKernel
from autoplan.errors import InputError, Problem
from autoplan.kernels import comm
from autoplan.kernels.compute import (
    AttentionCall,
    attention_time,
    decode_attention_time,
    experts_time,
    gemm_time,
)
from autoplan.kernels.layer import BF16_BYTES
from autoplan.measured.machine import describe_machine
from autoplan.measured.profile import CORRECTABLE, DTYPES, KINDS, Profile, sdpa_rows
from autoplan.plan import Plan, Prediction, Uncertainty
from autoplan.units import GiB
from autoplan.vocab import Dtype

CORRECTED_KINDS = CORRECTABLE  # the kinds a profile's ``applies`` line may name


def applied_kinds(meta: Mapping[str, str]) -> tuple[str, ...]:
    """The kinds a profile's correction applies: its ``applies`` header line (kinds
    separated by commas or spaces), else every kind."""
    text = meta.get("applies")
    if text is None:
        return CORRECTED_KINDS
    return tuple(k for k in text.replace(",", " ").split() if k in CORRECTED_KINDS)
FULL_FOREST_ROWS = 250  # up to here a kind's forest has RatioForest's 100 trees
LARGE_FOREST_TREES = 40  # beyond it (engine profiles' larger kinds): fitted when a profile applies
MIN_ROWS = 5  # a kind with fewer usable rows keeps its analytic time (and KFold needs 5)
BAND_PERCENTILES = (10.0, 90.0)
CV_FOLDS = 5
SEED = 0  # forests and cross-validation folds: same profile, same numbers


# --------------------------------------------------------------------------- the estimator

class RatioForest(RegressorMixin, BaseEstimator):
    """A random forest regressor that also predicts per tree (for the uncertainty band).

    Generic over X and y (the log transform and the features live outside it), and a
    scikit-learn estimator by its rules: ``__init__`` stores hyperparameters, ``fit``
    returns self and sets ``forest_``, ``predict`` checks the model is fitted.
    ``predict`` is the mean of ``predict_members``, so the two never disagree.
    """

    def __init__(self, n_estimators: int = 100, min_samples_leaf: int = 2,
                 max_features: float | str | None = 1.0, random_state: int | None = SEED):
        self.n_estimators = n_estimators
        self.min_samples_leaf = min_samples_leaf  # 2: a single noisy row never makes a leaf
        self.max_features = max_features  # 1.0: every feature at every split (sklearn's default)
        self.random_state = random_state  # fixed: the same profile gives the same forest

    def fit(self, X: Any, y: Any) -> RatioForest:
        X, y = validate_data(self, X, y, y_numeric=True)
        self.forest_ = RandomForestRegressor(
            n_estimators=self.n_estimators, min_samples_leaf=self.min_samples_leaf,
            max_features=self.max_features, random_state=self.random_state).fit(X, y)
        return self

    def predict_members(self, X: Any) -> np.ndarray:
        """Predictions of every tree: shape (n_estimators, n_samples)."""
        check_is_fitted(self)
        # float32, as the trees split (RandomForestRegressor converts the same way)
        X = validate_data(self, X, reset=False, dtype=np.float32, order="C")
        # each tree's ``tree_.predict`` (what DecisionTreeRegressor.predict returns after
        # its input checks, done once above): ~4 us a tree against ~15 us through predict
        return np.stack([tree.tree_.predict(X)[:, 0] for tree in self.forest_.estimators_])

    def predict(self, X: Any) -> np.ndarray:
        return self.predict_members(X).mean(axis=0)


# --------------------------------------------------------------------------- features

DTYPE_CODE = {d: float(i) for i, d in enumerate(DTYPES)}
OP_CODE = {op: float(i) for i, op in enumerate(KINDS["collective"])}


def gemm_features(m: float, n: float, k: float, dtype: str) -> tuple[float, ...]:
    """Shape of an (m x k) @ (k x n) GEMM in a profile dtype; bytes as the roofline counts them."""
    work = 2.0 * m * n * k
    moved = BF16_BYTES * (m * k + k * n + m * n)
    return (math.log2(m), math.log2(n), math.log2(k), math.log2(work), math.log2(work / moved),
            DTYPE_CODE[dtype])


def attention_features(call: AttentionCall) -> tuple[float, ...]:
    return (math.log2(call.batch_heads), math.log2(call.seq), math.log2(call.head_dim),
            float(call.kv_ratio), float(call.causal), float(call.backward))


def collective_features(op: str, nbytes: float, ranks: int, per_domain: int) -> tuple[float, ...]:
    domains = -(-ranks // per_domain)
    return (OP_CODE[op], math.log2(nbytes), float(ranks), float(per_domain), float(domains))


def decode_features(batch: float, context: float, heads: float, kv_heads: float, head_dim: float,
                    kv_bytes: float) -> tuple[float, ...]:
    """Shape of one decode attention call (the fields of ``Correction.decode``)."""
    return (math.log2(batch), math.log2(context), math.log2(head_dim), math.log2(heads),
            heads / kv_heads, float(kv_bytes))


def moe_features(tokens: float, hidden: float, inter: float, top_k: int, experts: int, moe_tp: int,
                 moe_ep: int, dtype: str) -> tuple[float, ...]:
    """Shape of one rank's routed experts (the fields of ``Correction.moe``), in a profile dtype."""
    return (math.log2(tokens), math.log2(hidden), math.log2(inter), float(top_k), math.log2(experts),
            math.log2(moe_tp), math.log2(moe_ep), math.log2(tokens * top_k / experts), DTYPE_CODE[dtype])


# the KV cache's bytes per element of a decode row's dtype (the KV cache's dtype)
KV_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
# bytes per weight element an engine's kernels read at a row's dtype (module doc)
STORED_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "fp4": 0.5}
# the context a decode call is looked up at: rounded to 1/8 of an octave (9%), so a
# simulation whose contexts grow a token an iteration asks the forests a few hundred times
CONTEXT_STEPS_PER_OCTAVE = 8
# an engine profile's GEMM rows (m) and MoE tokens are looked up rounded to 1/16 of an
# octave (4%) above EXACT_TOKENS, and its collectives' bytes likewise: a serving
# simulation asks for every token count an iteration schedules (thousands), and one forest
# lookup costs a few hundred microseconds, while its thinned rows are 2x apart in m and in
# bytes at best. A bench profile's lookups stay exact (its numbers as they were).
TOKEN_STEPS_PER_OCTAVE = 16
EXACT_TOKENS = 64


def rounded(x: float, steps: int) -> float:
    """``x`` > 0 rounded to ``steps`` steps an octave (geometrically)."""
    return 2.0 ** (round(math.log2(x) * steps) / steps)


def analytic_dtype(profile_dtype: str, device_kind: str) -> Dtype | None:
    """The job dtype a profile row stands for (the module's dtype rule); None: none.
    ``device_kind`` does not change the rule today; it stays in the signature because a
    device whose 16-bit GEMMs are emulated would need one."""
    if profile_dtype == "fp4":  # NVFP4: where autoplan's vocabulary has it
        return Dtype.__members__.get("FP4")
    return {"bf16": Dtype.BF16, "fp16": Dtype.FP16, "fp8": Dtype.FP8,
            "fp8_block": Dtype.FP8}.get(profile_dtype)


def measured_dtype(dtype: Dtype, device_kind: str) -> str:
    """The profile dtype whose rows stand for a job dtype (the module's dtype rule)."""
    return dtype.value


def compute_dtype(profile: Profile) -> str:
    """The profile dtype whose GEMMs define a measured machine's 16-bit peak."""
    return measured_dtype(Dtype.BF16, profile.meta.get("device_kind", ""))


@dataclass(frozen=True, slots=True)
class TrainingSet:
    """The usable rows of one kind: features, analytic and measured seconds."""

    X: np.ndarray
    analytic_s: np.ndarray
    measured_s: np.ndarray

    @property
    def log_ratio(self) -> np.ndarray:
        return np.log(self.measured_s / self.analytic_s)

    def __len__(self) -> int:
        return len(self.measured_s)


def _collective_time(op: str, nbytes: float, ranks: int, per_domain: int, cluster: Cluster,
                     dtype: str = "bf16") -> float:
    """The cost model's time of one profile collective of ``dtype`` elements on
    ``cluster``'s links (the reducing ops sum in it: ``comm.reduce_seconds``)."""
    if op == "p2p":
        return comm.p2p(nbytes, per_domain < 2, cluster)
    group = comm.Group(ranks, per_domain, cluster.intra_node, cluster.inter_node,
                       cluster.device.correction)
    if op == "all_reduce":
        return comm.all_reduce(nbytes, group, dtype)
    if op == "reduce_scatter":
        return comm.reduce_scatter(nbytes, group, dtype)
    fn: Callable[[float, comm.Group], float] = {
        "all_gather": comm.all_gather, "all_to_all": comm.all_to_all,
        "custom_all_reduce": comm.custom_all_reduce}[op]
    return fn(nbytes, group)


FEATURE_WIDTH = {"gemm": 6, "attention": 6, "collective": 5, "decode": 6, "moe": 9}
ANALYTIC_FEATURE_KINDS = ("decode", "moe")  # every profile's; an engine profile's every kind


def _kind_rows(profile: Profile, kind: str) -> list[dict[str, Any]]:
    """A forest kind's profile rows: ``attention`` the whole-sequence calls, ``decode`` the
    decode calls (both attention rows), the others the rows of their kind."""
    if kind == "attention":
        return sdpa_rows(profile.rows).to_dict("records")  # type: ignore[no-any-return]
    if kind == "decode":
        rows = profile.rows
        return rows[(rows["kind"] == "attention") & (rows["op"] == "decode")].to_dict("records")  # type: ignore[no-any-return]
    return profile.of_kind(kind).to_dict("records")  # type: ignore[no-any-return]


def attention_kernel(profile: Profile) -> AttentionKernel:
    """The flash kernel a profile's attention rows are priced with (module doc)."""
    name = profile.meta.get("attention_kernel", "")
    return AttentionKernel(name) if name in {k.value for k in AttentionKernel} else AttentionKernel.FLASH2


Sample = tuple[tuple[float, ...], float]  # (features, analytic seconds)


class Sampler:
    """Features and analytic seconds of a kernel, by the rules of one profile on one
    machine (``base``, uncorrected): the same for a profile row (fitting) and a kernel the
    cost model asks about (predicting). The features of an engine profile's kinds, and of
    every profile's decode and MoE kinds, end with log2 of the analytic seconds: kernels
    far below a microsecond in the roofline take the engine's few microseconds, a ratio
    that grows as the roofline's time shrinks, which trees learn from that feature in a
    few splits and from the shape alone only with many rows (the leave-shapes-out error
    of an H100 vLLM profile's 600 GEMM rows: 49% without it, 26% with it)."""

    def __init__(self, profile: Profile, base: Cluster):
        self.base = uncorrected(base)
        self.device_kind = profile.meta.get("device_kind", "")
        self.engine = profile.engine is not None
        self.kernel = attention_kernel(profile)

    def width(self, kind: str) -> int:
        return FEATURE_WIDTH[kind] + self.with_analytic(kind)

    def with_analytic(self, kind: str) -> bool:
        return self.engine or kind in ANALYTIC_FEATURE_KINDS

    def _out(self, kind: str, features: tuple[float, ...], t: float) -> Sample | None:
        if not t > 0:
            return None
        return ((*features, math.log2(t)) if self.with_analytic(kind) else features), t

    def gemm(self, m: float, n: float, k: float, profile_dtype: str) -> Sample | None:
        dtype = analytic_dtype(profile_dtype, self.device_kind)
        if dtype is None or not self.base.device.supports(dtype) or min(m, n, k) <= 0:
            return None
        weight_bytes = STORED_BYTES[profile_dtype] if self.engine else BF16_BYTES
        return self._out("gemm", gemm_features(m, n, k, profile_dtype),
                         gemm_time(m, n, k, self.base.device, dtype, weight_bytes))

    def attention(self, call: AttentionCall) -> Sample | None:
        if min(call.batch_heads, call.seq, call.head_dim) <= 0:
            return None
        work = 4.0 * call.batch_heads * call.seq ** 2 * call.head_dim  # as row_flops counts it
        work *= 0.5 if call.causal else 1.0
        work *= 2.5 if call.backward else 1.0
        return self._out("attention", attention_features(call),
                         attention_time(work, call, self.base.device, self.kernel))

    def decode(self, batch: float, context: float, heads: float, kv_heads: float, head_dim: float,
               kv_bytes: float) -> Sample | None:
        if min(batch, context, heads, kv_heads, head_dim, kv_bytes) <= 0:
            return None
        return self._out("decode", decode_features(batch, context, heads, kv_heads, head_dim, kv_bytes),
                         decode_attention_time(batch, context, heads, kv_heads, head_dim, kv_bytes,
                                               self.base.device))

    def moe(self, tokens: float, hidden: float, inter: float, top_k: int, experts: int, moe_tp: int,
            moe_ep: int, profile_dtype: str) -> Sample | None:
        dtype = analytic_dtype(profile_dtype, self.device_kind)
        if (dtype is None or not self.base.device.supports(dtype)
                or min(tokens, hidden, inter, top_k, experts, moe_tp, moe_ep) <= 0):
            return None
        t = experts_time(tokens, hidden, inter, top_k, experts, moe_ep, moe_tp, self.base.device, dtype,
                         STORED_BYTES[profile_dtype])
        return self._out("moe", moe_features(tokens, hidden, inter, top_k, experts, moe_tp, moe_ep,
                                             profile_dtype), t)

    def collective(self, op: str, nbytes: float, ranks: int, per_domain: int,
                   dtype: str = "bf16") -> Sample | None:
        if ranks < 2 or nbytes <= 0:
            return None  # one rank: free in the model
        return self._out("collective", collective_features(op, nbytes, ranks, per_domain),
                         _collective_time(op, nbytes, ranks, per_domain, self.base, dtype))

    def row(self, kind: str, rec: Mapping[str, Any]) -> Sample | None:
        """A profile row's sample; None for a row the module's rules leave out."""
        if kind == "collective":
            ranks = int(rec["ranks"])
            per_domain = min(ranks, int(rec["ranks_per_node"]))
            return self.collective(rec["op"], float(rec["nbytes"]), ranks, per_domain, rec["dtype"])
        if kind == "decode":
            kv_bytes = KV_BYTES.get(rec["dtype"])
            return None if kv_bytes is None else self.decode(
                float(rec["batch"]), float(rec["seq"]), float(rec["heads"]), float(rec["kv_heads"]),
                float(rec["head_dim"]), kv_bytes)
        if kind == "gemm":
            return self.gemm(float(rec["m"]), float(rec["n"]), float(rec["k"]), rec["dtype"])
        if kind == "moe":
            return self.moe(float(rec["m"]), float(rec["k"]), float(rec["n"]), int(rec["top_k"]),
                            int(rec["experts"]), int(rec["moe_tp"]), int(rec["moe_ep"]), rec["dtype"])
        dtype = analytic_dtype(rec["dtype"], self.device_kind)
        if dtype is None or dtype is Dtype.FP8 or not self.base.device.supports(dtype):
            return None  # attention runs in 16 bits
        return self.attention(_row_call(rec))


def training_set(profile: Profile, cluster: Cluster, kind: str) -> TrainingSet:
    """The rows of ``kind`` the surrogate learns from, with the analytic time of each on
    ``cluster`` (uncorrected). Rows the dtype rule maps to no job dtype, fp8 rows on a
    device without an fp8 peak, and one-rank collectives (free in the model) are left out."""
    sampler = Sampler(profile, cluster)
    feats: list[tuple[float, ...]] = []
    analytic: list[float] = []
    measured: list[float] = []
    for rec in _kind_rows(profile, kind):
        sample = sampler.row(kind, rec)
        if sample is not None:
            feats.append(sample[0])
            analytic.append(sample[1])
            measured.append(float(rec["seconds"]))
    return TrainingSet(np.array(feats, dtype=float).reshape(-1, sampler.width(kind)), np.array(analytic),
                       np.array(measured))


def _row_call(rec: Mapping[str, Any]) -> AttentionCall:
    return AttentionCall(float(rec["batch"] * rec["heads"]), float(rec["seq"]), float(rec["head_dim"]),
                         rec["heads"] / rec["kv_heads"], bool(rec["causal"]), rec["op"] == "sdpa_bwd")


def trees_for(rows: int, engine: bool = False) -> int:
    """Trees of a kind's forest fitted on ``rows`` rows of a profile (``engine``: of an
    engine's kernels): module doc, tree counts."""
    return LARGE_FOREST_TREES if engine or rows > FULL_FOREST_ROWS else RatioForest().n_estimators


# --------------------------------------------------------------------------- the correction

_Entry = tuple[float, list[float]]  # (ratio of the whole forest, ratio of each tree)


class _Fitted:
    """The forests fitted on one profile for one machine, and every prediction made so far
    (the search asks for few distinct shapes hundreds of thousands of times; one
    prediction costs about half a millisecond, so each shape is predicted once, for all
    trees at once)."""

    def __init__(self, profile: Profile, cluster: Cluster):
        self.label = profile.source
        self.meta = dict(profile.meta)  # its provenance (device, engine, version: serving.trust)
        self.key = (profile.digest, cluster.device, cluster.intra_node, cluster.inter_node)
        self.device_kind = profile.meta.get("device_kind", "")
        self.forests: dict[str, RatioForest] = {}
        self.members = RatioForest().n_estimators
        self.sampler = Sampler(profile, cluster)
        applied = applied_kinds(profile.meta)
        for kind in CORRECTED_KINDS:
            if kind not in applied:
                continue
            data = training_set(profile, cluster, kind)
            if len(data) >= MIN_ROWS:
                trees = trees_for(len(data), self.sampler.engine)
                self.forests[kind] = RatioForest(n_estimators=trees).fit(data.X, data.log_ratio)
        # what the forests cover: profile dtypes of the GEMM and MoE rows, the decode rows' KV
        # bytes per element (each kind's forest only where it was fitted)
        supported = {d for d in DTYPES if (job := analytic_dtype(d, self.device_kind)) is not None
                     and cluster.device.supports(job)}
        self.gemm_dtypes = self._covered(profile, "gemm", lambda r: r["dtype"], supported)
        self.moe_dtypes = self._covered(profile, "moe", lambda r: r["dtype"], supported)
        self.kv_bytes = self._covered(profile, "decode", lambda r: KV_BYTES.get(r["dtype"]),
                                      set(KV_BYTES.values()))
        if self.forests:  # the band's members: as many as the largest forest's trees
            self.members = max(f.n_estimators for f in self.forests.values())
        else:
            raise InputError.single(profile.source, "kind", (
                f"no {', '.join(CORRECTED_KINDS)} rows the surrogate can use on {cluster.device.name} "
                f"(at least {MIN_ROWS} of a kind; device_kind "
                f"{self.device_kind or '?'}: see autoplan/measured/surrogate.py for which dtypes count)"))
        self.reach: dict[str, tuple[int, int]] = {}  # op -> (most ranks, most domains)
        for rec in profile.of_kind("collective").to_dict("records"):
            ranks, domains = int(rec["ranks"]), -(-int(rec["ranks"]) // int(rec["ranks_per_node"]))
            most = self.reach.get(rec["op"], (0, 0))
            self.reach[rec["op"]] = (max(most[0], ranks), max(most[1], domains))
        self.ones: _Entry = (1.0, [1.0] * self.members)
        # host seconds per issued forward kernel, and of the backward per forward kernel
        # (its pass issues k_b kernels to the forward's k_f): medians of the rows
        host = profile.of_kind("host")
        passes = {op: (float(rows["seconds"].median()), float(rows["k"].median()))
                  for op, rows in host.groupby("op")}
        self.host: tuple[float, float] | None = None
        if {"layer_forward", "layer_backward"} <= set(passes):
            (f_s, f_k), (b_s, b_k) = passes["layer_forward"], passes["layer_backward"]
            self.host = (f_s, b_s * b_k / f_k)
        self.cache: dict[tuple[Any, ...], _Entry] = {}
        # the kinds whose callers fall back where the profile measured nothing (None)
        self.optional: dict[tuple[Any, ...], _Entry | None] = {}

    def _covered(self, profile: Profile, kind: str, of: Callable[[dict[str, Any]], Any],
                 usable: set[Any]) -> frozenset[Any]:
        """The values ``of`` takes over the rows of ``kind`` the forest learned from (the ones in
        ``usable``: the sampler's dtype rules), if it was fitted."""
        if kind not in self.forests:
            return frozenset()
        return frozenset(v for r in _kind_rows(profile, kind) if (v := of(r)) in usable)

    def predict(self, kind: str, features: tuple[float, ...]) -> _Entry:
        logs = self.forests[kind].predict_members(np.array([features]))[:, 0]
        # member i: tree i mod trees (a large kind's forest has fewer trees than the band's members)
        return float(np.exp(logs.mean())), np.resize(np.exp(logs), self.members).tolist()

    def _forest(self, kind: str, sample: Sample | None) -> _Entry | None:
        return None if sample is None or kind not in self.forests else self.predict(kind, sample[0])

    def gemm(self, key: tuple[Any, ...], m: float, n: float, k: float, dtype: Dtype) -> _Entry:
        profile_dtype = measured_dtype(dtype, self.device_kind)
        entry = (self._forest("gemm", self.sampler.gemm(m, n, k, profile_dtype))
                 if profile_dtype in self.gemm_dtypes else None)
        self.cache[key] = entry = entry or self.ones  # a dtype the profile did not measure
        return entry

    def attention(self, key: tuple[Any, ...], call: AttentionCall) -> _Entry:
        self.cache[key] = entry = self._forest("attention", self.sampler.attention(call)) or self.ones
        return entry

    def decode(self, key: tuple[Any, ...], shape: tuple[float, float, float, float, float],
               kv_bytes: float) -> _Entry | None:
        entry = (self._forest("decode", self.sampler.decode(*shape, kv_bytes))
                 if kv_bytes in self.kv_bytes else None)
        self.optional[key] = entry
        return entry

    def moe(self, key: tuple[Any, ...], tokens: float, hidden: float, inter: float, top_k: int,
            experts: int, moe_tp: int, moe_ep: int, dtype: Dtype) -> _Entry | None:
        profile_dtype = measured_dtype(dtype, self.device_kind)
        entry = (self._forest("moe", self.sampler.moe(tokens, hidden, inter, top_k, experts, moe_tp, moe_ep,
                                                      profile_dtype))
                 if profile_dtype in self.moe_dtypes else None)
        self.optional[key] = entry
        return entry

    def collective(self, key: tuple[Any, ...], op: str, nbytes: float, ranks: int,
                   per_domain: int) -> _Entry:
        most_ranks, most_domains = self.reach.get(op, (0, 0))
        # beyond what the profile measured (more ranks, or a fabric it never crossed, as a
        # single-node profile never crosses the network): keep the analytic time
        entry = None
        if ranks <= most_ranks and -(-ranks // per_domain) <= most_domains:
            entry = self._forest("collective", self.sampler.collective(op, nbytes, ranks, per_domain))
        self.cache[key] = entry = entry or self.ones
        return entry


class SurrogateCorrection:
    """A :class:`~autoplan.descriptors.hardware.Correction` from fitted forests: the whole
    forest (``member`` None: the geometric mean of the trees' ratios, exp of the forest's
    mean log ratio) or one tree of each kind (``member`` i, for the uncertainty band).
    Equal, and hashed alike, when fitted on the same profile (digest) for the same
    machine and taken as the same member."""

    __slots__ = ("fitted", "member", "_key")

    def __init__(self, fitted: _Fitted, member: int | None = None):
        assert member is None or 0 <= member < fitted.members
        self.fitted = fitted
        self.member = member
        self._key = (fitted.key, member)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SurrogateCorrection) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f"SurrogateCorrection(profile={self.profile!r}, member={self.member})"

    @property
    def profile(self) -> str:
        """The profile the forests were fitted on (its path, as given)."""
        return self.fitted.label

    @property
    def members(self) -> int:
        return self.fitted.members

    @property
    def meta(self) -> dict[str, str]:
        """The profile's header lines (device, software, engine and release where given)."""
        return self.fitted.meta

    def host_kernel_s(self) -> tuple[float, float] | None:
        return self.fitted.host

    def with_member(self, member: int | None) -> SurrogateCorrection:
        return SurrogateCorrection(self.fitted, member)

    def _pick(self, entry: _Entry) -> float:
        return entry[0] if self.member is None else entry[1][self.member]

    def _tokens(self, m: float) -> float:
        """The token count (GEMM rows) a lookup is made at (:data:`TOKEN_STEPS_PER_OCTAVE`)."""
        return rounded(m, TOKEN_STEPS_PER_OCTAVE) if self.fitted.sampler.engine and m > EXACT_TOKENS else m

    def gemm(self, m: float, n: float, k: float, dtype: Dtype) -> float:
        m = self._tokens(m)
        key = ("gemm", m, n, k, dtype)
        entry = self.fitted.cache.get(key) or self.fitted.gemm(key, m, n, k, dtype)
        return self._pick(entry)

    def attention(self, batch_heads: float, seq: float, head_dim: float, kv_ratio: float,
                  causal: bool, backward: bool) -> float:
        call = AttentionCall(batch_heads, seq, head_dim, kv_ratio, causal, backward)
        key = ("attention", *call)
        entry = self.fitted.cache.get(key) or self.fitted.attention(key, call)
        return self._pick(entry)

    def collective(self, op: str, nbytes: float, ranks: int, per_domain: int) -> float:
        if self.fitted.sampler.engine and nbytes > 0:  # as token counts (TOKEN_STEPS_PER_OCTAVE)
            nbytes = rounded(nbytes, TOKEN_STEPS_PER_OCTAVE)
        key = ("collective", op, nbytes, ranks, per_domain)
        entry = self.fitted.cache.get(key) or self.fitted.collective(key, op, nbytes, ranks, per_domain)
        return self._pick(entry)

    def decode(self, batch: float, context: float, heads: float, kv_heads: float, head_dim: float,
               kv_bytes: float) -> float | None:
        if context > 0:  # looked up at context rounded to CONTEXT_STEPS_PER_OCTAVE steps an octave
            context = rounded(context, CONTEXT_STEPS_PER_OCTAVE)
        shape = (batch, context, heads, kv_heads, head_dim)
        key = ("decode", *shape, kv_bytes)
        fitted = self.fitted
        entry = fitted.optional[key] if key in fitted.optional else fitted.decode(key, shape, kv_bytes)
        return None if entry is None else self._pick(entry)

    def moe(self, tokens: float, hidden: float, inter: float, top_k: int, experts: int, moe_tp: int,
            moe_ep: int, dtype: Dtype) -> float | None:
        tokens = self._tokens(tokens)
        key = ("moe", tokens, hidden, inter, top_k, experts, moe_tp, moe_ep, dtype)
        fitted = self.fitted
        entry = (fitted.optional[key] if key in fitted.optional
                 else fitted.moe(key, tokens, hidden, inter, top_k, experts, moe_tp, moe_ep, dtype))
        return None if entry is None else self._pick(entry)


def uncorrected(cluster: Cluster) -> Cluster:
    """The cluster without a correction, measured kernel grids or mixer tables on its device
    (itself if it has none): the analytic model a profile is fitted against."""
    dev = cluster.device
    if dev.correction is None and dev.kernels is None and dev.mixer_kernels is None:
        return cluster
    return dataclasses.replace(cluster, device=dataclasses.replace(dev, correction=None, kernels=None,
                                                                   mixer_kernels=None))


@lru_cache(maxsize=16)
def _fit(profile: Profile, cluster: Cluster) -> _Fitted:
    return _Fitted(profile, cluster)


def fit_correction(profile: Profile, cluster: Cluster) -> SurrogateCorrection:
    """The correction fitted on ``profile`` for ``cluster``'s device and links (once per
    profile and machine; fitting a few hundred rows takes well under a second)."""
    base = uncorrected(cluster)
    # the fit reads the device and its links alone: one fit for every size of a cluster
    # (serving sizes a node to its GPUs) and every cluster of the same parts
    return SurrogateCorrection(_fit(profile, Cluster(
        name="", device=base.device, gpus_per_node=1, nvlink_domain=1, intra_node=base.intra_node,
        inter_node=base.inter_node)))


def calibrate(cluster: Cluster, profile: Profile) -> Cluster:
    """The cluster whose device carries the correction fitted on ``profile``."""
    base = uncorrected(cluster)
    device = dataclasses.replace(base.device, correction=fit_correction(profile, base))
    return dataclasses.replace(base, device=device)


def clear_caches() -> None:
    """Forget fitted forests and their predictions (benchmarks time cold runs)."""
    _fit.cache_clear()


# --------------------------------------------------------------------------- the band

def member_plans(plan: Plan) -> list[Plan]:
    """The plan once per tree of its device's correction (none without one)."""
    correction = plan.cluster.device.correction
    if not isinstance(correction, SurrogateCorrection):
        return []
    device = plan.cluster.device
    return [dataclasses.replace(plan, cluster=dataclasses.replace(
        plan.cluster, device=dataclasses.replace(device, correction=correction.with_member(i))))
        for i in range(correction.members)]


def band(plan: Plan) -> Uncertainty | None:
    """The 10th and 90th percentile of the step time over the correction's trees, and the
    profile they were fitted on; None for a plan on an uncorrected device."""
    members = member_plans(plan)
    if not members:
        return None
    times = np.array([evaluate(p).step_time_s for p in members])
    p10, p90 = np.percentile(times, BAND_PERCENTILES)
    correction = plan.cluster.device.correction
    assert isinstance(correction, SurrogateCorrection)
    return Uncertainty(step_time_s_p10=float(p10), step_time_s_p90=float(p90),
                       profile=correction.profile)


def predict_with_band(plan: Plan) -> Prediction:
    """The plan's prediction, with the uncertainty band when its device is corrected."""
    pred = evaluate(plan)
    unc = band(plan)
    return pred if unc is None else dataclasses.replace(pred, uncertainty=unc)


# --------------------------------------------------------------------------- fit report

@dataclass(frozen=True, slots=True)
class FitRow:
    """How well the analytic model and the surrogate reproduce one kind's rows."""

    kind: str
    rows: int  # usable rows (see :func:`training_set`)
    analytic_mape: float  # mean |analytic - measured| / measured
    surrogate_mape: float | None  # the same, cross-validated; None: too few rows

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "rows": self.rows, "analytic_mape": self.analytic_mape,
                "surrogate_mape": self.surrogate_mape}


def kind_rows(rows: Any) -> dict[str, int]:
    """Rows of a profile's table per kind, its decode attention rows counted as ``decode``
    (the forest they train)."""
    kinds = rows["kind"].copy()
    if "op" in rows:
        kinds[(rows["kind"] == "attention") & (rows["op"] == "decode")] = "decode"
    return {str(k): int(n) for k, n in kinds.value_counts().items()}


def _mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted - measured) / measured))


def cross_validated(data: TrainingSet, engine: bool = False) -> np.ndarray:
    """Surrogate-corrected seconds of every row, each predicted by a forest fitted without
    it: KFold(5), shuffled with a fixed seed (leave-shapes-out: a profile has one row per
    shape), each forest with the trees the whole kind's would have."""
    log_ratio = data.log_ratio
    predicted = np.empty(len(data))
    trees = trees_for(len(data), engine)
    for train, test in KFold(CV_FOLDS, shuffle=True, random_state=SEED).split(data.X):
        forest = RatioForest(n_estimators=trees).fit(data.X[train], log_ratio[train])
        predicted[test] = forest.predict(data.X[test])
    return data.analytic_s * np.exp(predicted)


def measured_machine(profile: Profile) -> Cluster:
    """The analytic descriptor of the profiled machine (the dtype rule picks the GEMM rows
    that define its peak; memory size does not enter times)."""
    rows = profile.rows
    per_node = rows.loc[rows["kind"] == "collective", "ranks_per_node"]
    return describe_machine(profile, name=profile.descriptor or "measured",
                            ranks_per_node=max(1, int(per_node.max()) if len(per_node) else 1),
                            mem_bytes=80 * GiB, compute_dtype=compute_dtype(profile))


def builtin_baseline(profile: Profile) -> Cluster | None:
    """The analytic baseline of a profile without the rows that describe a machine
    (elementwise: an imported engine profile): the built-in node cluster of its
    ``descriptor`` device; None for a profile that describes its machine (or names none)."""
    if (profile.rows["kind"] == "elementwise").any() or profile.descriptor is None:
        return None
    from autoplan.descriptors.library import builtin_names, builtin_node_cluster

    if profile.descriptor not in builtin_names("device"):
        return None
    return builtin_node_cluster(profile.descriptor)


def fit_report(profile: Profile, cluster: Cluster | None = None) -> list[FitRow]:
    """Per corrected kind: usable rows, the analytic model's error (MAPE against the
    measured seconds) and the surrogate's cross-validated error (leave-shapes-out: the
    error of interpolating between measured shapes). Without a cluster the analytic
    baseline is the machine described from the profile itself, or for a profile without
    elementwise rows the built-in node cluster of its device (:func:`builtin_baseline`)."""
    if cluster is None:
        cluster = builtin_baseline(profile)
    if cluster is None and profile.engine is not None:  # no elementwise rows to describe a machine
        raise InputError.single(profile.source, "header.descriptor", (
            f"no built-in cluster of {profile.descriptor or 'its device'} to price an engine profile's "
            "rows on: give a cluster (bench --fit --cluster NAME)"))
    cluster = uncorrected(cluster or measured_machine(profile))
    out = []
    for kind in CORRECTED_KINDS:
        data = training_set(profile, cluster, kind)
        if not len(data):
            continue
        surrogate = (_mape(cross_validated(data, profile.engine is not None), data.measured_s)
                     if len(data) >= MIN_ROWS
                     else None)
        out.append(FitRow(kind, len(data), _mape(data.analytic_s, data.measured_s), surrogate))
    return out


def profile_problem(profile: Profile, cluster: Cluster) -> Problem | None:
    """A note when the profile was taken on another device than ``cluster``'s."""
    if profile.descriptor and profile.descriptor != cluster.device.name:
        return Problem(profile.source, "header.descriptor",
                       f"taken on {profile.descriptor}, applied to {cluster.device.name}")
    return None
