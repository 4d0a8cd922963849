"""Collective costs against the ring formulas (Thakur et al. 2005) and NCCL's protocol
model (src/graph/tuning.cc: base latency per call, per-step latency and bandwidth share
per protocol, the fastest protocol wins), worked by hand."""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.descriptors.library import resolve_cluster, with_gpus
from autoplan.kernels import comm

CLUSTER = with_gpus(resolve_cluster("dgx-h100"), 64)
INTRA, INTER = CLUSTER.intra_node, CLUSTER.inter_node
SIMPLE_BASE = 8.4e-6  # NCCL baseLat[Ring][Simple]
LL_BASE = 6.6e-6  # NCCL baseLat[Ring][LL]


def test_a_large_all_reduce_inside_a_node_is_the_ring_formula_with_simple_protocol():
    g = comm.place_group(CLUSTER, 8, 1)
    assert g.domains == 1
    m = 1e9
    expected = SIMPLE_BASE + 2 * 7 / 8 * m / INTRA.effective_Bps + 2 * 7 * INTRA.latency_s
    assert comm.all_reduce(m, g) == pytest.approx(expected)


def test_group_spanning_nodes_reduces_inside_first_and_crosses_with_all_nics():
    """dp group of 16 with stride 2 on 8-GPU nodes: 4 members per node, 4 nodes."""
    g = comm.place_group(CLUSTER, 16, 2)
    assert (g.per_domain, g.domains) == (4, 4)
    m = 1e9
    inner = 3 * INTRA.latency_s + 3 / 4 * m / INTRA.effective_Bps
    outer = 3 * INTER.latency_s + 3 / 4 * (m / 4) / INTER.effective_Bps
    assert comm.reduce_scatter(m, g) == pytest.approx(SIMPLE_BASE + inner + outer)
    assert comm.all_reduce(m, g) == pytest.approx(SIMPLE_BASE + 2 * (inner + outer))


def test_group_with_stride_of_a_node_crosses_the_network_on_one_nic_each():
    g = comm.place_group(CLUSTER, 8, 8)
    assert (g.per_domain, g.domains) == (1, 8)
    m = 1e8
    expected = SIMPLE_BASE + 2 * (7 * INTER.latency_s + 7 / 8 * m / INTER.effective_Bps)
    assert comm.all_reduce(m, g) == pytest.approx(expected)


def test_a_72_gpu_nvlink_domain_keeps_larger_groups_on_nvlink():
    nvl = with_gpus(resolve_cluster("gb200-nvl72"), 144)
    assert comm.place_group(nvl, 64, 1).domains == 1
    assert comm.place_group(nvl, 16, 8).domains == 2


def test_a_tiny_all_reduce_runs_the_low_latency_protocol():
    """8 bytes over 8 NVLink ranks: LL's smaller base latency (6.6 us against Simple's
    8.4) wins; every protocol pays the link's step latency, 14 steps."""
    g = comm.place_group(CLUSTER, 8, 1)
    tiny = comm.all_reduce(8, g)
    assert tiny == pytest.approx(LL_BASE + 2 * 7 * INTRA.latency_s, rel=1e-3)
    assert tiny < SIMPLE_BASE + 2 * 7 * INTRA.latency_s


def test_the_cost_is_the_fastest_protocols_and_grows_with_the_size():
    g = comm.place_group(CLUSTER, 8, 1)
    sizes = [2.0 ** k for k in range(3, 34)]
    times = [comm.all_reduce(m, g) for m in sizes]
    assert times == sorted(times)
    m = 2.0 ** 20
    for _, base, share in comm.PROTOCOLS:
        own = base + 2 * (7 * INTRA.latency_s + 7 / 8 * m / (INTRA.effective_Bps * share))
        assert comm.all_reduce(m, g) <= own * (1 + 1e-12)


@pytest.mark.parametrize(("mib", "measured_us", "within"),
                         [(0.03125, 40, 0.25), (4, 69, 0.10), (16, 134, 0.10), (32, 213, 0.10)])
def test_all_reduce_over_an_h200_node_matches_measured_times(mib: float, measured_us: float,
                                                             within: float):
    """torch.distributed all_reduce on 8 H200 (NVLink 4, the H100's fabric), NCCL 2.27:
    stas00/ml-engineering network/benchmarks/results/all-reduce-8xH200.md (time =
    payload / algbw). The small-message floor is 23% high here: the cluster file's
    3 us per step against about 2.4 measured."""
    g = comm.place_group(with_gpus(resolve_cluster("dgx-h200"), 8), 8, 1)
    assert comm.all_reduce(mib * 2**20, g) == pytest.approx(measured_us * 1e-6, rel=within)


def test_many_small_collectives_pay_their_latency_each():
    g = comm.place_group(CLUSTER, 8, 1)
    assert comm.all_reduce(8, g) == pytest.approx(LL_BASE + 14 * 3e-6, rel=1e-3)
    assert 100 * comm.all_reduce(8, g) > comm.all_reduce(800, g)


def test_link_efficiency_scales_only_the_bandwidth_term():
    slow = dataclasses.replace(INTRA, efficiency=INTRA.efficiency / 2)
    fast_g = comm.Group(8, 8, INTRA, INTER)
    slow_g = comm.Group(8, 8, slow, INTER)
    m = 1e9  # Simple protocol at this size
    lat = SIMPLE_BASE + 2 * 7 * INTRA.latency_s
    assert comm.all_reduce(m, slow_g) - lat == pytest.approx(2 * (comm.all_reduce(m, fast_g) - lat))


def test_a_link_without_nccl_protocols_is_plain_alpha_beta():
    plain = dataclasses.replace(INTRA, nccl_protocols=False)
    g = comm.Group(8, 8, plain, plain)
    assert comm.all_reduce(8, g) == pytest.approx(2 * 7 * INTRA.latency_s + 2 * 7 / 8 * 8
                                                  / INTRA.effective_Bps)


@pytest.mark.parametrize("cluster", ["dgx-h100", "gb200-nvl72", "dgx-a100"])
def test_a_layers_costs_read_the_node_count_only_below_one_nvlink_domain(cluster):
    """``cost.stage.count_free``: the clusters of a sweep's counts share their layers'
    costs, so every group placed on them (size x stride within the cluster) must be the
    same on the cluster and on its count-free stand-in; below one NVLink domain the
    cluster is its own stand-in."""
    from autoplan.cost.stage import count_free, layer_core
    from tests.helpers import make_plan

    base = resolve_cluster(cluster)
    for gpus in (base.gpus_per_node, 2 * base.nvlink_domain, 64 * base.nvlink_domain):
        c = with_gpus(base, gpus)
        free = count_free(c)
        assert free.gpus <= max(c.gpus, base.nvlink_domain + base.gpus_per_node)
        for size in (1, 2, 4, 8, 16, 64, 256):
            for stride in (1, 2, 8, 32):
                if size * stride <= c.gpus:
                    assert comm.place_group(free, size, stride) == comm.place_group(c, size, stride)
    small = with_gpus(base, base.gpus_per_node)
    if small.gpus <= small.nvlink_domain:
        assert count_free(small) == small
    if cluster == "dgx-h100":  # the sweep's counts share one core
        a = make_plan(gpus=64, dp=64)
        b = make_plan(gpus=128, dp=128)
        assert layer_core(a) is layer_core(b)
