"""A descriptor of the measured machine, fitted on its profile.

The analytic model's constants are fitted so that it reproduces the profile as well
as its functional form allows; what it cannot reproduce is left for the surrogate.

- GEMM: the efficiency curve eff(F) = F / (F + h) makes a GEMM of F FLOPs take
  t = F / P + h / P (``autoplan.kernels.compute.gemm_time`` with gemm_efficiency 1):
  linear in F, so a least-squares line over the GEMM rows gives the peak P = 1/slope
  and the half-efficiency size h = intercept * P.
- Memory-bound ops: t = bytes / B, B from the same kind of line over the
  elementwise rows (its intercept is launch overhead the analytic model leaves out). On a
  CPU only the rows of each op's largest sizes enter (a quarter of its largest and up):
  smaller tensors stay in the caches, where a training step's gradients, optimizer states
  and logits do not.
- Attention: achieved FLOP/s over all attention rows, as a fraction of P.
- Links: every collective of :mod:`autoplan.kernels.comm` on a group inside one node is
  t = L * alpha + W / B with L latency terms and W bytes on the wire per rank (ring:
  Thakur et al. 2005); non-negative least squares over the collective rows gives the
  latency alpha and bandwidth B. A profile taken on one GPU has no collective rows: the
  intra-node link of the built-in cluster of its ``descriptor`` device stands in
  (:func:`standin_link`). On a CPU (gloo sums on the rank's core) a reducing collective
  adds R / S_d, R the bytes a rank sums ((n-1)/n of the buffer) and S_d its summing rate
  in the row's dtype d: one more column per dtype in the same least squares
  (``Link.reduce_Bps``, ``comm.reduce_seconds``).
- Eager layer passes (CPU profiles' elementwise ``layer`` rows: bench/eager.py): the
  line t = X / E + c over them, X the bytes the cost model counts for a layer's
  memory-bound passes, gives the rate E the model prices them at (``Device.elementwise_Bps``;
  the intercept, the passes' fixed dispatch, is left to the stack's host cost).
- A CPU computes and communicates on the same core: its device says communication does not
  overlap compute (``Device.overlaps_communication``).

Rows are weighted by 1/seconds, so the fit minimizes relative error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.optimize import nnls

from autoplan.descriptors.hardware import Cluster, Device, Link
from autoplan.errors import InputError, Problem
from autoplan.measured.profile import Profile, achieved, layer_pass_rows, row_flops, sdpa_rows, stream_rows
from autoplan.text import one_line
from autoplan.units import GiB

if TYPE_CHECKING:
    import pandas as pd


def _line(x: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """(slope, intercept) >= 0 of t = slope * x + intercept, relative least squares."""
    w = 1.0 / t
    coef, _ = nnls(np.column_stack([x * w, w]), t * w)
    return float(coef[0]), float(coef[1])


def link_terms(op: str, ranks: int, nbytes: float) -> tuple[float, float]:
    """(latency terms, bytes on the wire per rank) of one collective in a single-node
    group, as :mod:`autoplan.kernels.comm` costs it."""
    n = ranks
    if op == "p2p":
        return 1.0, nbytes
    if op in ("all_gather", "reduce_scatter"):  # one ring phase
        return n - 1.0, (n - 1) / n * nbytes
    if op == "all_reduce":  # reduce-scatter + all-gather
        return 2.0 * (n - 1), 2.0 * (n - 1) / n * nbytes
    if op == "all_to_all":  # pairwise exchange: n - 1 steps of nbytes / n
        return n - 1.0, (n - 1) / n * nbytes
    raise AssertionError(op)


REDUCING_OPS = ("all_reduce", "reduce_scatter")


def reduced_bytes(op: str, ranks: int, nbytes: float) -> float:
    """Bytes one rank sums in a reducing collective ((n-1)/n of the buffer), else 0."""
    return (ranks - 1) / ranks * nbytes if op in REDUCING_OPS else 0.0


def _fit_link(rows: pd.DataFrame, sums: bool = False) -> tuple[float, float, dict[str, float]]:
    """(bandwidth bytes/s, latency s, summing rate bytes/s per dtype) of the local fabric
    from the collective rows; the rates only where ``sums`` (a CPU profile), for the dtypes
    whose least-squares coefficient is positive."""
    recs = rows.to_dict("records")
    terms = np.array([link_terms(r["op"], r["ranks"], r["nbytes"]) for r in recs])
    dtypes = sorted({r["dtype"] for r in recs if r["op"] in REDUCING_OPS}) if sums else []
    summed = np.array([[reduced_bytes(r["op"], r["ranks"], r["nbytes"]) if r["dtype"] == d else 0.0
                        for d in dtypes] for r in recs]).reshape(len(recs), len(dtypes))
    t = rows["seconds"].to_numpy()
    w = 1.0 / t
    coef, _ = nnls(np.column_stack([terms[:, 0] * w, terms[:, 1] * w, summed * w[:, None]]), t * w)
    alpha, inv_bw = float(coef[0]), float(coef[1])
    if inv_bw <= 0:  # latency explains everything: take the best achieved rate
        inv_bw = float(np.min(t / terms[:, 1]))
    # a sum 100x faster than the wire is invisible next to it (a residue of the fit)
    rates = {d: 1.0 / float(c) for d, c in zip(dtypes, coef[2:], strict=True)
             if c > 0 and 1.0 / c < SUM_VISIBLE * (1.0 / inv_bw)}
    return 1.0 / inv_bw, alpha, rates


SUM_VISIBLE = 100.0  # a summing rate over this many times the bandwidth is left out
LARGEST_SHARE = 4  # a CPU's memory rate: the stream rows within this factor of their op's largest


def describe_machine(profile: Profile, *, name: str, ranks_per_node: int, mem_bytes: float,
                     compute_dtype: str) -> Cluster:
    """A one-node cluster of ``ranks_per_node`` devices like the profiled one.

    ``compute_dtype`` is the profile dtype whose GEMM rows define the descriptor's
    bf16/fp16 peak: what the validated model really computes in (fp32 on most CPUs,
    whose bf16 GEMMs are emulated).
    """
    rows = profile.rows
    gemm = profile.of_kind("gemm")
    gemm = gemm[gemm["dtype"] == compute_dtype]
    elem = stream_rows(rows)
    # NCCL's collectives (an engine's own all-reduce kernel runs another algorithm)
    coll = rows[(rows["kind"] == "collective") & (rows["ranks"] > 1) & (rows["op"] != "custom_all_reduce")]
    standin = standin_link(profile) if coll.empty else None
    problems = [Problem(profile.source, field, f"needs {what} rows to describe the machine")
                for field, what, frame in (("kind", f"gemm ({compute_dtype})", gemm),
                                           ("kind", "elementwise", elem)) if frame.empty]
    if coll.empty and standin is None:
        problems.append(Problem(profile.source, "kind", (
            "needs collective rows to describe the machine (a profile taken on 2 ranks or more), "
            "or a descriptor header naming a built-in device whose node links stand in")))
    if problems:
        raise InputError(problems)
    flops = np.array([row_flops(r) for r in gemm.to_dict("records")])
    slope, intercept = _line(flops, gemm["seconds"].to_numpy())
    best = achieved(profile)
    peak = 1.0 / slope if slope > 0 else best.gemm_flops[compute_dtype]
    half = intercept * peak
    cpu = profile.meta.get("device_kind") == "cpu"
    if cpu:  # past the caches (module doc)
        largest = elem.groupby(["op", "dtype"])["nbytes"].transform("max")
        elem = elem[elem["nbytes"] * LARGEST_SHARE >= largest]
    mem_slope, _ = _line(elem["nbytes"].to_numpy().astype(float), elem["seconds"].to_numpy())
    hbm = 1.0 / mem_slope if mem_slope > 0 else float(best.memory_Bps or 0.0)
    attn_rows = sdpa_rows(rows)
    if attn_rows.empty:
        attention = 1.0
    else:
        attn_flops = sum(row_flops(r) for r in attn_rows.to_dict("records"))
        attention = min(1.0, attn_flops / float(attn_rows["seconds"].sum()) / peak)
    layer = layer_pass_rows(rows)
    elementwise = None
    if not layer.empty:
        slope, _ = _line(layer["nbytes"].to_numpy().astype(float), layer["seconds"].to_numpy())
        elementwise = 1.0 / slope if slope > 0 else None
    device = Device(name=f"{name}-device", peak_bf16_flops=peak, peak_fp16_flops=peak,
                    peak_fp8_flops=None, mem_bytes=mem_bytes, hbm_Bps=hbm,
                    gemm_efficiency=1.0, gemm_half_flop=half, attention_efficiency=max(attention, 0.01),
                    hbm_efficiency=1.0, reserve_bytes=0.0, elementwise_Bps=elementwise,
                    overlaps_communication=not cpu)
    if standin is not None:
        link = standin[0]
    else:
        bandwidth, latency, sums = _fit_link(coll, sums=cpu)
        link = Link(bandwidth_Bps=bandwidth, latency_s=latency, efficiency=1.0, nccl_protocols=False,
                    reduce_Bps=tuple(sorted(sums.items())))
    return Cluster(name=name, device=device, gpus_per_node=ranks_per_node,
                   nvlink_domain=ranks_per_node, intra_node=link, inter_node=link, nodes=1)


def standin_link(profile: Profile) -> tuple[Link, str] | None:
    """The link a profile without collective rows (taken on one GPU) is described with: the
    intra-node link of the built-in cluster of its ``descriptor`` device, and that cluster's
    name; None where the header names no built-in device with a cluster. A one-rank slice
    (``autoplan validate --slice``) never communicates, so the stand-in does not enter its time."""
    from autoplan.descriptors.library import builtin_names, builtin_node_cluster

    device = profile.descriptor
    if device is None or device not in builtin_names("device"):
        return None
    cluster = builtin_node_cluster(device)
    return None if cluster is None else (cluster.intra_node, cluster.name)


def physical_memory_bytes() -> float:
    """This machine's physical memory (a CPU 'device' shares it with the other local ranks)."""
    import os

    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def cluster_yaml(cluster: Cluster, profile: Profile, command: str) -> str:
    """The cluster as a descriptor file, with where its numbers came from."""
    import yaml

    d = cluster.device
    doc = {"cluster": {
        "name": cluster.name,
        "device": {
            "name": d.name,
            "peak_tflops": {"bf16": _r(d.peak_bf16_flops / 1e12), "fp16": _r(d.peak_fp16_flops / 1e12)},
            "mem_GiB": _r(d.mem_bytes / GiB),
            "hbm_GBps": _r(d.hbm_Bps / 1e9),
            "reserve_GiB": 0,
            "efficiency": {"gemm": 1.0, "gemm_half_gflop": _r(d.gemm_half_flop / 1e9),
                           "attention": _r(d.attention_efficiency), "hbm": 1.0},
            **({"elementwise_GBps": _r(d.elementwise_Bps / 1e9)} if d.elementwise_Bps else {}),
            **({} if d.overlaps_communication else {"overlaps_communication": False}),
        },
        "gpus_per_node": cluster.gpus_per_node,
        "nvlink_domain": cluster.nvlink_domain,
        "intra_node": _link(cluster.intra_node),
        "inter_node": _link(cluster.inter_node),
        "nodes": 1,
    }}
    meta = profile.meta
    head = [
        f"# Fitted by `{command}` on the profile {profile.source}",
        f"#   (taken by `{meta.get('command', '?')}` on {meta.get('date', '?')}:",
        f"#   {meta.get('device_name', '?')}, torch {meta.get('torch', '?')}).",
        "# peak_tflops and gemm_half_gflop: least-squares line t = (F + h) / P over the GEMM rows;",
        "# hbm_GBps: line over the streaming elementwise rows (copy, add, mul); elementwise_GBps:",
        "# line over the eager layer-pass rows; attention: achieved attention FLOP/s over peak;",
        "# links: non-negative least squares of the collective rows on autoplan's ring model",
        "# (reduce_GBps: the rate a rank sums a reducing collective's buffer at, per dtype);",
        "# overlaps_communication false: one core per rank computes and communicates in turn",
        "# (autoplan/measured/machine.py). A 'GPU' here is one local process, computing with the",
        f"# profile's {meta.get('torch_threads', '?')} torch thread(s); mem_GiB is its share of the "
        "machine's memory.",
    ]
    # a path or a header value may hold a line break: each comment stays one line
    text = "\n".join(one_line(line) for line in head)
    return text + "\n" + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None)


def _r(x: float) -> float:
    return float(f"{x:.4g}")


def _link(link: Link) -> dict[str, Any]:
    out: dict[str, Any] = {"bandwidth_GBps": _r(link.bandwidth_Bps / 1e9),
                           "latency_us": _r(link.latency_s * 1e6), "efficiency": 1.0}
    if link.reduce_Bps:
        out["reduce_GBps"] = {dtype: _r(rate / 1e9) for dtype, rate in link.reduce_Bps}
    return out
