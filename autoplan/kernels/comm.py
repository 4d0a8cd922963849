"""Collectives, alpha-beta (Hockney 1994; ring algorithms of Thakur et al. 2005).

A group is placed by rank order (TP innermost, then CP, DP, PP: Megatron-LM's
tp-cp-dp-pp). A group whose members all sit in one NVLink domain uses the
intra-node link. A group spanning domains with k members per domain runs
hierarchically, as NCCL does with one ring per NIC: reduce-scatter inside the
domain, the cross-domain step on 1/k of the data through the k members' NICs
at once, then all-gather inside the domain.

A device corrected by a measured profile (autoplan.measured.surrogate) scales each
collective by its predicted measured/analytic ratio; the surrogate is fitted on
these same functions evaluated for each profile row.

A device with measured kernel grids (``Device.kernels``: training's, attached by the
training door; autoplan.measured.kernels) takes NCCL's measured time (nccl-tests) for an
all-reduce, all-gather, reduce-scatter or all-to-all whose group lies in one NVLink
domain on a GPU count the grid measured (2, 4, 8); groups across domains, other counts
and point-to-point sends stay alpha-beta.

A reducing collective (all-reduce, reduce-scatter) sums (n-1)/n of its buffer on each rank
(the ring's reduce-scatter phase). NCCL's kernels sum as the data streams, hidden in the
transfer; where a link gives the rate a rank sums a dtype at (``Link.reduce_Bps``: gloo on a
CPU, which sums on the rank's core, bf16 element by element through fp32) that time is
added, in the dtype the buffer holds: tensor parallelism's activations bf16, data
parallelism's gradients as the plan's states keep them (``Plan.states.main_grads``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autoplan.caches import memo
from autoplan.descriptors.hardware import Cluster, Correction, Link, MeasuredKernels, cache_hash


@dataclass(frozen=True, slots=True)
class Group:
    """A communicator of ``size`` ranks, ``per_domain`` of them sharing an NVLink domain;
    ``correction``: the devices' measured/analytic ratios, if any; ``kernels``: their
    measured grids, if any (module doc)."""

    size: int
    per_domain: int
    intra: Link
    inter: Link
    correction: Correction | None = None
    kernels: MeasuredKernels | None = None
    # one ring pass, worked out once (costs ask millions of times): the step latencies,
    # and the seconds each byte of the buffer spends on the wires
    ring_latency: float = field(init=False, compare=False, repr=False)
    ring_s_per_byte: float = field(init=False, compare=False, repr=False)
    # memoized costs key on groups: hashed once (the fields are frozen)
    _hash: int = field(init=False, compare=False, repr=False)

    def __hash__(self) -> int:
        return self._hash

    def __post_init__(self) -> None:
        cache_hash(self)
        # a ring phase over n ranks takes (n-1) steps of nbytes/n: (n-1) step latencies
        # and (n-1)/n of the buffer over the link; across domains each of the k members
        # of a domain carries 1/k of the buffer on its own NIC
        if self.domains == 1:
            n = self.size
            lat = (n - 1) * self.intra.latency_s
            per_byte = (n - 1) / n / self.intra.effective_Bps if n > 1 else 0.0
        else:
            k, d = self.per_domain, self.domains
            lat = (k - 1) * self.intra.latency_s + (d - 1) * self.inter.latency_s
            per_byte = ((k - 1) / k / self.intra.effective_Bps
                        + (d - 1) / d / k / self.inter.effective_Bps)
        object.__setattr__(self, "ring_latency", lat)
        object.__setattr__(self, "ring_s_per_byte", per_byte)

    @property
    def domains(self) -> int:
        return -(-self.size // self.per_domain)


@memo(4096)
def place_group(cluster: Cluster, size: int, stride: int) -> Group:
    """The group of ``size`` ranks ``stride`` apart (stride = product of the inner degrees)."""
    domain = min(cluster.nvlink_domain, cluster.gpus)
    per_domain = 1 if stride >= domain else max(1, min(size, domain // stride))
    device = cluster.device
    return Group(size, per_domain, cluster.intra_node, cluster.inter_node, device.correction,
                 device.kernels if device.correction is None else None)


def _measured(op: str, nbytes: float, g: Group) -> float | None:
    """NCCL's measured time of this collective where the group's device has a grid covering
    it (one NVLink domain, a GPU count measured), else None (module doc)."""
    if g.kernels is None or g.domains != 1:
        return None
    return g.kernels.collective(op, nbytes, g.size)


def _ratio(op: str, nbytes: float, g: Group) -> float:
    """The correction's measured/analytic ratio of this collective (1 without one)."""
    if g.correction is None:
        return 1.0
    return g.correction.collective(op, nbytes, g.size, g.per_domain)


# NCCL's own cost model (src/graph/tuning.cc, ncclTopoTuneModel, NCCL 2.18-2.19), ring
# algorithm: a protocol trades latency for bandwidth, and NCCL runs each call with the
# protocol its model predicts fastest. Per protocol: base latency per call (baseLat, us)
# and the share of the bus bandwidth it carries (LL: 1/4 for all-reduce and multi-node
# rings; LL128: 0.92, "120/128"). Per ring step every protocol pays the link's latency
# (a cluster file's latency_us): NCCL's tuner scales LL's step down to 0.6 of 3.4 us,
# but measured small-message floors do not show it - nccl-tests all_reduce_perf on
# 8 A100s takes 43.8 us at 32 KB, torch.distributed on 8 H200s 38-40 us up to 512 KiB
# (stas00/ml-engineering network/README.md and network/benchmarks/results/
# all-reduce-8xH200.md): 14 steps of about 3 us plus the base, as modelled here.
PROTOCOLS = (
    # name, base latency s, bandwidth share
    ("LL", 6.6e-6, 1 / 4),
    ("LL128", 14.0e-6, 0.92),
    ("Simple", 8.4e-6, 1.0),
)
LL_BASE, LL_SHARE = PROTOCOLS[0][1], PROTOCOLS[0][2]
SIMPLE_BASE = PROTOCOLS[2][1]


def _ring_pass(nbytes: float, g: Group, passes: int = 1) -> float:
    """``passes`` reduce-scatter or all-gather passes in one call (all-reduce: 2), each
    hierarchical across domains (``Group.ring_latency``, ``ring_s_per_byte``), with the
    fastest protocol; the call's base latency once."""
    lat, wire = g.ring_latency, nbytes * g.ring_s_per_byte
    if not g.intra.nccl_protocols:
        return passes * (lat + wire)
    # LL128 never wins once every protocol pays the same step latency (a higher base and
    # a lower bandwidth share than Simple's): LL for the smallest buffers, else Simple
    ll = LL_BASE + passes * (lat + wire / LL_SHARE)
    simple = SIMPLE_BASE + passes * (lat + wire)
    return ll if ll < simple else simple


def reduce_seconds(nbytes: float, g: Group, dtype: str) -> float:
    """Seconds a rank spends summing its (n-1)/n of an ``nbytes`` buffer of ``dtype`` in a
    reducing collective, where the group's link gives a rate for the dtype (else 0)."""
    rate = g.intra.reduce_rate(dtype) if g.size > 1 else None
    return 0.0 if rate is None else (g.size - 1) / g.size * nbytes / rate


def reduce_scatter(nbytes: float, g: Group, dtype: str = "bf16") -> float:
    """Reduce-scatter of an ``nbytes`` buffer of ``dtype`` elements."""
    if g.size <= 1:
        return 0.0
    measured = _measured("reduce_scatter", nbytes, g)
    if measured is not None:
        return measured
    return (_ring_pass(nbytes, g) + reduce_seconds(nbytes, g, dtype)) * _ratio("reduce_scatter", nbytes, g)


def all_gather(nbytes: float, g: Group) -> float:
    """All-gather into an ``nbytes`` buffer: the reduce-scatter's ring run backwards."""
    if g.size <= 1:
        return 0.0
    measured = _measured("all_gather", nbytes, g)
    if measured is not None:
        return measured
    return _ring_pass(nbytes, g) * _ratio("all_gather", nbytes, g)


def all_reduce(nbytes: float, g: Group, dtype: str = "bf16") -> float:
    """Ring all-reduce = reduce-scatter + all-gather: 2(n-1)/n * M / B + 2(n-1) alpha,
    plus the call's base latency, plus the sum of ``dtype`` elements where it costs
    (:func:`reduce_seconds`)."""
    if g.size <= 1:
        return 0.0
    measured = _measured("all_reduce", nbytes, g)
    if measured is not None:
        return measured
    return ((_ring_pass(nbytes, g, passes=2) + reduce_seconds(nbytes, g, dtype))
            * _ratio("all_reduce", nbytes, g))


def p2p(nbytes: float, cross_domain: bool, cluster: Cluster) -> float:
    """One send/recv between neighbouring pipeline stages (corrected as a two-rank group)."""
    link = cluster.inter_node if cross_domain else cluster.intra_node
    t = link.latency_s + nbytes / link.effective_Bps
    correction = cluster.device.correction
    if correction is not None:
        t *= correction.collective("p2p", nbytes, 2, 1 if cross_domain else 2)
    return t


def all_to_all(nbytes: float, g: Group) -> float:
    """All-to-all where each rank holds ``nbytes`` and keeps 1/n of it, sending nbytes/n to
    each of its n - 1 peers (Thakur et al. 2005, Sec. 4.4). Peers in the rank's own NVLink
    domain are reached over the intra-node link, the others through the rank's own NIC
    (one per GPU, as on rail-optimized DGX clusters). NCCL posts every send and receive
    at once (an all-to-all is a group of ncclSend/ncclRecv, as nccl-tests' alltoall_perf
    and torch's all_to_all_single issue it), so the NVLink and the network legs run side
    by side: the call takes the longer, plus one latency per peer."""
    if g.size <= 1:
        return 0.0
    measured = _measured("all_to_all", nbytes, g)
    if measured is not None:
        return measured
    chunk = nbytes / g.size
    near = min(g.per_domain, g.size) - 1  # peers in the same domain
    far = g.size - 1 - near
    latency = near * g.intra.latency_s + far * g.inter.latency_s
    wire = max(near * chunk / g.intra.effective_Bps, far * chunk / g.inter.effective_Bps)
    return (latency + wire) * _ratio("all_to_all", nbytes, g)


# Serving engines' own all-reduce kernels (vLLM csrc/custom_all_reduce.cuh, SGLang's copy of
# it in sgl-kernel, TensorRT-LLM cpp/tensorrt_llm/kernels/customAllReduceKernels.cu): inside
# one NVLink domain each GPU reads every
# peer's buffer over NVLink in one step (one-shot), which vLLM runs below 512 KiB (two-shot
# above it, where NCCL's ring is as fast)
ONE_SHOT_MAX_BYTES = 512 * 1024


def custom_all_reduce(nbytes: float, g: Group) -> float:
    """A serving engine's one-shot all-reduce of an ``nbytes`` buffer inside one NVLink
    domain: one link latency, each peer's buffer read once, (n - 1) M / B; times the
    measured/analytic ratio of the engine's kernel (``custom_all_reduce`` rows of its
    profile) where the device's correction has one."""
    if g.size <= 1:
        return 0.0
    one_shot = g.intra.latency_s + nbytes * (g.size - 1) / g.intra.effective_Bps
    return one_shot * _ratio("custom_all_reduce", nbytes, g)


def serving_all_reduce(nbytes: float, g: Group) -> float:
    """A tensor-parallel all-reduce as serving engines run it: the least of NCCL's ring
    (:func:`all_reduce`) and, inside one NVLink domain for messages up to
    :data:`ONE_SHOT_MAX_BYTES`, the engine's own kernel (:func:`custom_all_reduce`)."""
    ring = all_reduce(nbytes, g)
    if g.domains > 1 or nbytes > ONE_SHOT_MAX_BYTES or g.size < 2:
        return ring
    return min(ring, custom_all_reduce(nbytes, g))
