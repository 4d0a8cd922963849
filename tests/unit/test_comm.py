"""Collective costs against the ring formulas (Thakur et al. 2005) worked by hand."""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.cost import comm
from autoplan.descriptors.library import resolve_cluster, with_gpus

CLUSTER = with_gpus(resolve_cluster("dgx-h100"), 64)
INTRA, INTER = CLUSTER.intra_node, CLUSTER.inter_node


def test_all_reduce_inside_a_node_is_the_ring_formula():
    g = comm.place_group(CLUSTER, 8, 1)
    assert g.domains == 1
    m = 1e9
    expected = 2 * 7 / 8 * m / INTRA.effective_Bps + 2 * 7 * INTRA.latency_s
    assert comm.all_reduce(m, g) == pytest.approx(expected)


def test_group_spanning_nodes_reduces_inside_first_and_crosses_with_all_nics():
    """dp group of 16 with stride 2 on 8-GPU nodes: 4 members per node, 4 nodes."""
    g = comm.place_group(CLUSTER, 16, 2)
    assert (g.per_domain, g.domains) == (4, 4)
    m = 1e9
    inner = 3 * INTRA.latency_s + 3 / 4 * m / INTRA.effective_Bps
    outer = 3 * INTER.latency_s + 3 / 4 * (m / 4) / INTER.effective_Bps
    assert comm.reduce_scatter(m, g) == pytest.approx(inner + outer)
    assert comm.all_reduce(m, g) == pytest.approx(2 * (inner + outer))


def test_group_with_stride_of_a_node_crosses_the_network_on_one_nic_each():
    g = comm.place_group(CLUSTER, 8, 8)
    assert (g.per_domain, g.domains) == (1, 8)
    m = 1e8
    expected = 2 * (7 * INTER.latency_s + 7 / 8 * m / INTER.effective_Bps)
    assert comm.all_reduce(m, g) == pytest.approx(expected)


def test_a_72_gpu_nvlink_domain_keeps_larger_groups_on_nvlink():
    nvl = with_gpus(resolve_cluster("gb200-nvl72"), 144)
    assert comm.place_group(nvl, 64, 1).domains == 1
    assert comm.place_group(nvl, 16, 8).domains == 2


def test_many_small_collectives_pay_their_latency_each():
    g = comm.place_group(CLUSTER, 8, 1)
    tiny = comm.all_reduce(8, g)
    assert tiny == pytest.approx(2 * 7 * INTRA.latency_s, rel=1e-3)


def test_link_efficiency_scales_only_the_bandwidth_term():
    slow = dataclasses.replace(INTRA, efficiency=INTRA.efficiency / 2)
    fast_g = comm.Group(8, 8, INTRA, INTER)
    slow_g = comm.Group(8, 8, slow, INTER)
    m = 1e9
    lat = 2 * 7 * INTRA.latency_s
    assert comm.all_reduce(m, slow_g) - lat == pytest.approx(2 * (comm.all_reduce(m, fast_g) - lat))
