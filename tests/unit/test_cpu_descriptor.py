"""What a CPU's machine descriptor says that a GPU's does not, against hand counts: gloo
sums a reducing collective's buffer on the rank's core at a rate per dtype (bf16 slower per
byte than fp32), one core per rank computes and communicates in turn (nothing overlaps),
and eager PyTorch's memory-bound passes of a layer run at their own measured rate."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autoplan.cost.evaluate import evaluate
from autoplan.cost.stage import stage_work
from autoplan.descriptors.hardware import Cluster, Link
from autoplan.descriptors.strict import read_yaml
from autoplan.kernels import comm
from autoplan.kernels.compute import attention_core_time, gemm_time, layer_times
from autoplan.kernels.layer import elementwise_bytes_forward, layer_gemms
from autoplan.measured.machine import describe_machine, link_terms, reduced_bytes
from autoplan.measured.profile import format_profile, parse_profile
from autoplan.plans.file import read_plan
from autoplan.vocab import Dtype

CPU = Path(__file__).resolve().parents[2] / "examples" / "cpu"
MiB = 2**20
# a 2-rank link like this machine's gloo (examples/cpu/local-cpu.yaml's order of magnitude)
LAT, BW, SUM_BF16, SUM_FP32 = 2.0e-4, 2.0e9, 0.4e9, 2.0e9
LINK = Link(bandwidth_Bps=BW, latency_s=LAT, efficiency=1.0, nccl_protocols=False,
            reduce_Bps=(("bf16", SUM_BF16), ("fp32", SUM_FP32)))


def test_a_bf16_all_reduce_on_a_summing_link_pays_its_sum_at_the_links_bf16_rate() -> None:
    g = comm.Group(2, 2, LINK, LINK)
    wire = LAT + 0.5 * MiB / BW  # one ring pass of 2 ranks: one step, half the buffer
    assert comm.all_reduce(MiB, g, "bf16") == pytest.approx(2 * wire + 0.5 * MiB / SUM_BF16)
    assert comm.all_reduce(MiB, g, "fp32") == pytest.approx(2 * wire + 0.5 * MiB / SUM_FP32)
    assert comm.reduce_scatter(MiB, g, "bf16") == pytest.approx(wire + 0.5 * MiB / SUM_BF16)
    assert comm.all_gather(MiB, g) == pytest.approx(wire)  # a gather sums nothing
    nccl = dataclasses.replace(LINK, reduce_Bps=())
    plain = comm.Group(2, 2, nccl, nccl)
    assert comm.all_reduce(MiB, plain, "bf16") == pytest.approx(2 * wire)  # NCCL: the sum hides


def _tp2(overlaps: bool) -> tuple[object, Cluster]:
    plan = read_plan(read_yaml(CPU / "plan-tp2.yaml"), str(CPU / "plan-tp2.yaml"))
    c = plan.cluster
    cluster = dataclasses.replace(c, intra_node=LINK, inter_node=LINK,
                                  device=dataclasses.replace(c.device, overlaps_communication=overlaps))
    return plan.replace(cluster=cluster), cluster


def test_on_one_core_per_rank_every_tensor_parallel_all_reduce_adds_to_the_step() -> None:
    """tp2, 4 layers, 2 microbatches of 2 x 256 tokens: per microbatch 2 all-reduces forward
    and 2 backward per layer (Megatron-LM's), the vocab-parallel embedding's forward and the
    output layer's forward and backward: 19 all-reduces of 2 x 256 x 1024 bf16 (1 MiB),
    each 2 ring passes plus the bf16 sum, none hidden behind the weight gradients."""
    plan, _ = _tp2(overlaps=False)
    one = 2 * (LAT + 0.5 * MiB / BW) + 0.5 * MiB / SUM_BF16
    assert evaluate(plan).breakdown.tp_comm == pytest.approx(2 * 19 * one)
    hidden, _ = _tp2(overlaps=True)
    w = stage_work(hidden)[0]
    assert evaluate(hidden).breakdown.tp_comm == pytest.approx(
        2 * (19 * one - min(2 * 4 * one + one, w.compute_w)))  # a GPU hides B's TP behind W


def test_on_one_core_per_rank_the_gradient_all_reduce_is_fp32_and_exposed() -> None:
    """dp2 with ZeRO-0: the fp32 gradients all-reduced after the backward, the sum at the
    link's fp32 rate, nothing hidden behind the last backward."""
    plan = read_plan(read_yaml(CPU / "plan-dp2.yaml"), str(CPU / "plan-dp2.yaml"))
    c = plan.cluster
    for overlaps in (False, True):
        cluster = dataclasses.replace(c, intra_node=LINK, inter_node=LINK,
                                      device=dataclasses.replace(c.device, overlaps_communication=overlaps))
        p = plan.replace(cluster=cluster)
        grads = 4 * stage_work(p)[0].params
        full = 2 * (LAT + 0.5 * grads / BW) + 0.5 * grads / SUM_FP32
        if not overlaps:
            assert evaluate(p).breakdown.dp_comm == pytest.approx(full)
        else:
            assert evaluate(p).breakdown.dp_comm < full


def test_a_layers_memory_bound_passes_run_at_the_devices_elementwise_rate() -> None:
    plan, cluster = _tp2(overlaps=False)
    from autoplan.cost.stage import shard_of

    shard = shard_of(plan)
    slow = dataclasses.replace(cluster.device, elementwise_Bps=1.5e9)
    gemm = sum(gemm_time(g.m, g.n, g.k, slow, Dtype.BF16) for g in layer_gemms(plan.model, shard.tokens, 2))
    attn_f, attn_b = attention_core_time(plan.model, shard, slow)
    elem = elementwise_bytes_forward(plan.model, shard) / 1.5e9
    lt = layer_times(plan.model, dataclasses.replace(shard, kernel_efficiency=1.0, layer_kernels=0), slow)
    assert lt.forward == pytest.approx(gemm + attn_f + elem)
    assert lt.backward_input == pytest.approx(gemm + attn_b + 2 * elem)


def test_describe_machine_recovers_a_cpus_sum_rates_and_layer_pass_rate() -> None:
    """A profile generated from known constants: gloo's ring with a sum per dtype, and the
    eager layer passes at E bytes/s plus a fixed dispatch."""
    E, DISPATCH = 3.0e9, 2e-4
    rows = []

    def row(kind: str, op: str, seconds: float, **cols: object) -> dict:
        return {"kind": kind, "op": op, "dtype": cols.pop("dtype", "fp32"), **cols, "seconds": seconds,
                "seconds_p10": seconds, "seconds_p90": seconds, "repeats": 5}

    for s in (256, 512, 1024):
        rows.append(row("gemm", "linear", 2.0 * s**3 / 1e11, m=s, n=s, k=s, dtype="bf16"))
    rows += [row("elementwise", "copy", nb / 2e10, nbytes=nb) for nb in (10**6, 10**7, 10**8)]
    rows += [row("elementwise", "layer", nb / E + DISPATCH, nbytes=nb, n=1024, seq=nb // 10**4, dtype="bf16")
             for nb in (10**6, 10**7, 10**8)]
    for op in ("all_reduce", "all_gather", "reduce_scatter", "p2p"):
        for dtype, rate in (("fp32", SUM_FP32), ("bf16", SUM_BF16)):
            if dtype == "bf16" and op not in ("all_reduce", "reduce_scatter"):
                continue
            for nb in (2**12, 2**16, 2**20, 2**24):
                lat, wire = link_terms(op, 2, nb)
                t = lat * LAT + wire / BW + reduced_bytes(op, 2, nb) / rate
                rows.append(row("collective", op, t, nbytes=nb, ranks=2, ranks_per_node=2, dtype=dtype))
    meta = {"device_kind": "cpu", "device_name": "test cpu", "torch": "2.13", "date": "2026-11-29",
            "command": "autoplan bench"}
    text = format_profile(meta, rows)
    assert text.startswith("# autoplan-profile: 3")  # the layer rows need version 3
    c = describe_machine(parse_profile(text, "cpu.csv"), name="local-cpu", ranks_per_node=2,
                         mem_bytes=2**33, compute_dtype="bf16")
    assert c.intra_node.bandwidth_Bps == pytest.approx(BW, rel=1e-3)
    assert c.intra_node.latency_s == pytest.approx(LAT, rel=1e-3)
    assert c.intra_node.reduce_rate("bf16") == pytest.approx(SUM_BF16, rel=1e-3)
    assert c.intra_node.reduce_rate("fp32") == pytest.approx(SUM_FP32, rel=1e-3)
    assert c.device.elementwise_Bps == pytest.approx(E, rel=1e-3)
    assert c.device.overlaps_communication is False
    g = comm.place_group(c, 2, 1)
    assert comm.all_reduce(MiB, g, "bf16") == pytest.approx(
        2 * (LAT + 0.5 * MiB / BW) + 0.5 * MiB / SUM_BF16, rel=1e-3)


def test_unfused_gradient_accumulation_streams_18_bytes_per_parameter_each_microbatch() -> None:
    """A stack without gradient-accumulation fusion (eager PyTorch, validate's torch model):
    per microbatch each bf16 gradient is cast to fp32 (2 + 4 bytes) and added into the fp32
    main gradient (4 + 4 + 4 bytes), at the device's memory rate."""
    plan, cluster = _tp2(overlaps=False)
    unfused = plan.replace(stack=dataclasses.replace(plan.stack, grad_accumulation_fusion=False))
    params = stage_work(plan)[0].params
    hbm = cluster.device.hbm_Bps * cluster.device.hbm_efficiency
    m = plan.num_microbatches
    added = evaluate(unfused).breakdown.compute - evaluate(plan).breakdown.compute
    assert added == pytest.approx(m * params * 18 / hbm)
