"""Kernel physics and fixed costs of the cost model (kernels/compute.py), the software
stack's part in them (descriptors/stack.py), and the per-step terms (parallel/dp.py),
each against a number worked by hand."""

from __future__ import annotations

import dataclasses
import math

import pytest

from autoplan.cost.evaluate import evaluate
from autoplan.cost.stage import stage_work
from autoplan.descriptors.library import builtin_stack, resolve_device, resolve_model
from autoplan.descriptors.stack import AttentionKernel
from autoplan.kernels import comm, compute
from autoplan.kernels.compute import attention_efficiency, gemm_time, wave_efficiency
from autoplan.kernels.layer import Shard, layer_gemms
from autoplan.parallel import dp, mesh
from autoplan.vocab import Axis, Dtype, ZeroStage
from tests.helpers import ROOT, make_plan

H100 = resolve_device("h100-sxm", "test", "device")
A100 = resolve_device("a100-80gb", "test", "device")


def test_a_single_tile_gemm_fills_one_sm_with_the_smallest_tile():
    """128 x 256 output on 132 SMs: 1 big tile, 2 medium or 4 small ones, all one wave;
    the small tile finishes first (64 x 128 at 0.80 of the rate)."""
    best = 64 * 128 / 0.80
    assert wave_efficiency(128, 256, 132) == pytest.approx(128 * 256 / (132 * best))


def test_a_large_gemm_loses_only_its_last_partial_wave():
    """8192 x 8192 with 128 x 256 tiles: 2048 tiles in 16 waves of 132 (2112 slots)."""
    assert wave_efficiency(8192, 8192, 132) == pytest.approx(2048 / (16 * 132))
    t = gemm_time(8192, 8192, 8192, H100, Dtype.BF16)
    assert t == pytest.approx(2 * 8192**3 / (989e12 * 0.80 * 2048 / 2112))


def test_fp8_gemms_run_at_their_own_efficiency_of_the_fp8_peak():
    dev = dataclasses.replace(H100, gemm_fp8_efficiency=0.5)
    bf16 = gemm_time(8192, 8192, 8192, dev, Dtype.BF16)
    fp8 = gemm_time(8192, 8192, 8192, dev, Dtype.FP8)
    # the fp8 peak (1979 TFLOPS) at 0.5 against the bf16 peak (989) at 0.8
    assert bf16 / fp8 == pytest.approx(1979 * 0.5 / (989 * 0.8))


def test_devices_without_an_sm_count_keep_the_size_curve():
    dev = dataclasses.replace(H100, sms=0, gemm_half_flop=2e9)
    work = 2.0 * 1024**3
    eff = 0.80 * work / (work + 2e9)
    assert gemm_time(1024, 1024, 1024, dev, Dtype.BF16) == pytest.approx(work / (989e12 * eff))


def test_attention_rate_ramps_with_the_query_length_and_picks_the_stacks_kernel():
    """FA3 fig. 5 ramp: E * s / (s + 500); flash2 on a device without a Hopper-class rate."""
    fa3 = attention_efficiency(H100, AttentionKernel.FLASH3, False, 2048)
    assert fa3 == pytest.approx(0.645 * 2048 / 2548)
    assert attention_efficiency(H100, AttentionKernel.FLASH3, True, 1e9) == pytest.approx(0.55, rel=1e-6)
    assert attention_efficiency(H100, AttentionKernel.FLASH2, False, 1e9) == pytest.approx(0.35, rel=1e-6)
    # the A100 file has no Hopper-class rate: flash3 falls back to flash2's
    assert (attention_efficiency(A100, AttentionKernel.FLASH3, False, 4096)
            == attention_efficiency(A100, AttentionKernel.FLASH2, False, 4096))


def test_unfused_attention_writes_the_score_square_to_memory():
    """GPT-1.7B-like layer, s = 2048, mbs 1, tp 1, 24 heads of 96: QK^T and AV over the full
    square (2 * 24 * 2048^2 * 96 FLOPs each), and softmax + dropout on 24 * 2048^2 scores."""
    model = resolve_model("gpt-1.7b")
    shard = Shard(1, 2048, 1, 1, False, Dtype.BF16, attention_kernel=AttentionKernel.UNFUSED)
    fwd, bwd = compute.attention_core_time(model, shard, A100)
    bh, s, d = model.heads, 2048, model.hidden // model.heads
    scores = bh * s * s
    hbm = A100.hbm_Bps * A100.hbm_efficiency
    qk = compute.gemm_roofline(2.0 * scores * d, 2 * (2 * bh * s * d + scores), A100, Dtype.BF16,
                               bh * s, s)
    av = compute.gemm_roofline(2.0 * scores * d, 2 * (scores + 2 * bh * s * d), A100, Dtype.BF16,
                               bh * s, d)
    soft = scores * 4 + (scores * 5 if model.dropout else 0)
    assert fwd == pytest.approx(qk + av + soft / hbm)
    soft_b = scores * 6 + (scores * 5 if model.dropout else 0)
    assert bwd == pytest.approx(2 * qk + 2 * av + soft_b / hbm)
    # the fused kernel never touches the square in memory: much faster here
    flash = dataclasses.replace(shard, attention_kernel=AttentionKernel.FLASH2)
    assert compute.attention_core_time(model, flash, A100)[0] < fwd


def test_a_layer_pass_cannot_beat_the_hosts_kernel_dispatch():
    """A tiny layer: the GPU work is microseconds, the host needs kernels x dispatch."""
    model = resolve_model("gpt-1.7b")
    base = Shard(1, 64, 8, 1, False, Dtype.BF16, layer_kernels=16)
    slow_host = dataclasses.replace(base, host_kernel_s=100e-6, host_backward_kernel_s=200e-6)
    lt = compute.layer_times(model, slow_host, A100)
    assert lt.forward == pytest.approx(16 * 100e-6)
    # the backward's host time per forward kernel (twice the kernels at the same rate)
    assert lt.backward_input + lt.backward_weight == pytest.approx(16 * 200e-6)
    # without the host floor: GPU time plus each kernel's gap
    gpu = compute.layer_times(model, base, A100)
    assert gpu.forward < lt.forward
    bare = compute.layer_times(model, dataclasses.replace(base, layer_kernels=0), A100)
    assert gpu.forward == pytest.approx(bare.forward + 16 * A100.kernel_gap_s)


def test_cuda_graphs_remove_the_host_floor():
    stack = dataclasses.replace(builtin_stack("megatron-core"), host_kernel_s=1e-3)
    tiny = dict(model="gpt-1.7b", cluster="dgx-a100", gpus=8, dp=8, global_batch=8, seq_len=128)
    eager = make_plan(**tiny)
    eager = dataclasses.replace(eager, stack=stack)
    graphed = dataclasses.replace(eager, stack=dataclasses.replace(stack, cuda_graphs=True))
    assert evaluate(graphed).step_time_s < evaluate(eager).step_time_s / 5


def test_a_stack_that_sustains_less_of_the_kernel_rates_is_slower_in_proportion():
    plan = make_plan(model="llama3-8b")
    half = dataclasses.replace(plan, stack=dataclasses.replace(plan.stack, compute_efficiency=0.5,
                                                               layer_kernels=0))
    full = dataclasses.replace(plan, stack=dataclasses.replace(plan.stack, compute_efficiency=1.0,
                                                               layer_kernels=0))
    assert stage_work(half)[0].compute_f == pytest.approx(2 * stage_work(full)[0].compute_f)


def test_memory_pressure_is_quadratic_above_ninety_percent():
    assert dp.memory_pressure(10.0, 0.89, 1.0) == 0.0
    assert dp.memory_pressure(10.0, 0.95, 1.0) == pytest.approx(10.0 * 0.10 * 0.25)
    assert dp.memory_pressure(10.0, 1.00, 1.0) == pytest.approx(1.0)
    assert dp.memory_pressure(10.0, 1.30, 1.0) == pytest.approx(1.0)  # capped


def test_the_step_pays_the_stacks_overhead_once():
    plan = make_plan()
    more = dataclasses.replace(plan, stack=dataclasses.replace(
        plan.stack, step_overhead_s=plan.stack.step_overhead_s + 0.5))
    a, b = evaluate(plan), evaluate(more)
    assert b.step_time_s - a.step_time_s == pytest.approx(0.5, rel=1e-6)
    assert b.breakdown.overhead - a.breakdown.overhead == pytest.approx(0.5, rel=1e-6)


def test_zero3_waits_for_the_first_layers_gather_and_slows_the_compute_it_hides_behind():
    plan = make_plan(model="llama3-8b", gpus=16, dp=16, global_batch=64, zero=ZeroStage.PARAMETERS)
    work = stage_work(plan)[0]
    groups = mesh.groups(plan)
    gather = comm.all_gather(work.params * 2, groups[Axis.DP])
    scatter = comm.reduce_scatter(work.params * dp.grad_bytes(plan.job.dtype), groups[Axis.DP])
    slow = plan.stack.comm_compute_slowdown
    n = work.layers
    f, b = work.comm[Axis.DP]
    assert f == pytest.approx(gather / n + max(0, gather - work.compute_f)
                              + slow * min(gather, work.compute_f))
    assert b == pytest.approx(gather / n + max(0, gather + scatter - work.compute_b - work.compute_w)
                              + slow * min(gather + scatter, work.compute_b + work.compute_w))
    # ZeRO-3 now costs more time than ZeRO-2 on the same layout
    z2 = evaluate(dataclasses.replace(plan, zero=ZeroStage.GRADIENTS))
    assert evaluate(plan).step_time_s > z2.step_time_s


def test_a_stack_without_overlapped_gradient_reduction_exposes_all_of_it():
    plan = make_plan(model="llama3-8b", gpus=16, dp=16, global_batch=64, zero=ZeroStage.NONE)
    no = dataclasses.replace(plan, stack=dataclasses.replace(plan.stack, overlap_grad_reduce=False))
    groups = mesh.groups(plan)
    work = stage_work(plan)[0]
    reduce_s = comm.all_reduce(work.params * dp.grad_bytes(plan.job.dtype), groups[Axis.DP])
    pred = evaluate(no)
    assert pred.breakdown.dp_comm == pytest.approx(reduce_s)
    assert evaluate(plan).breakdown.dp_comm < reduce_s


def test_every_built_in_stack_names_a_kernel_set_and_positive_costs():
    for name in ("megatron-core", "megatron-lm", "deepspeed", "torchtitan", "torchtitan-compiled",
                 "fsdp"):
        s = builtin_stack(name)
        assert s.name == name and s.layer_kernels > 0
        assert 0 < s.compute_efficiency <= 1 and s.step_overhead_s >= 0
        assert math.isfinite(s.host_kernel_s)


def test_torch_native_stacks_keep_sequence_parallel_gemm_inputs_gathered():
    # torchtitan's TP plan gathers SP inputs with DTensor, whose linears save them whole;
    # Megatron's sequence-parallel linear saves the local shard (tests/reference/test_memory.py)
    for name in ("torchtitan", "torchtitan-compiled"):
        assert builtin_stack(name).sp_saves_gathered
        assert builtin_stack(name).to_dict()["sp_saves_gathered"] is True
    for name in ("megatron-core", "megatron-lm", "deepspeed"):
        assert not builtin_stack(name).sp_saves_gathered
        assert "sp_saves_gathered" not in builtin_stack(name).to_dict()
    sp = make_plan(dp=2, tp=4, sequence_parallel=True)
    titan = dataclasses.replace(sp, stack=builtin_stack("torchtitan"))
    core = dataclasses.replace(titan, stack=dataclasses.replace(titan.stack, sp_saves_gathered=False))
    assert evaluate(titan).memory.activations > evaluate(core).memory.activations
    assert evaluate(titan).step_time_s == evaluate(core).step_time_s  # memory only


def test_fp8_layers_pay_the_cast_transpose_of_each_gemm_input_and_output_gradient():
    """Per GEMM (m, n, k): forward reads 2 and writes 2 bytes per input element (m k),
    backward the same per output-gradient element (m n), at the device's HBM rate."""
    model = resolve_model("llama3-8b")
    shard = Shard(2, 4096, 1, 1, False, Dtype.FP8)
    gemms = layer_gemms(model, shard.tokens, shard.tp)
    hbm = H100.hbm_Bps * H100.hbm_efficiency
    f, b = compute.fp8_cast_seconds(gemms, H100)
    assert f == pytest.approx(sum(m * k * 4 for m, _, k, _ in gemms) / hbm)
    assert b == pytest.approx(sum(m * n * 4 for m, n, _, _ in gemms) / hbm)
    fp8 = compute.layer_times(model, shard, H100)
    no_cast = sum(compute.gemm_time(g.m, g.n, g.k, H100, Dtype.FP8) for g in gemms)
    assert fp8.forward > no_cast + f


def test_narrow_and_odd_head_dims_run_a_padded_slower_kernel():
    """hd 128: the full rate; hd 64: FA2's 324/370 of it (FA3 paper, fig. 5); hd 80 runs
    the 96 kernel: 80/96 of the rate halfway between 64's and 128's."""
    f2 = AttentionKernel.FLASH2
    assert compute.head_dim_factor(128, f2) == 1.0
    assert compute.head_dim_factor(64, f2) == pytest.approx(324 / 370)
    assert compute.head_dim_factor(80, f2) == pytest.approx((324 / 370 + 1) / 2 * 80 / 96)
    assert compute.head_dim_factor(192, f2) == 1.0
    assert (attention_efficiency(H100, f2, False, 1e9, 64)
            == pytest.approx(0.35 * 324 / 370, rel=1e-6))


def test_unfused_attention_keeps_the_score_square_for_backward():
    """Korthikanti et al. 2022, eq. (1): 5 a s^2 b bytes per layer beyond flash attention's
    per-query statistics, unless selective recompute rebuilds them."""
    from autoplan.kernels import memory
    from autoplan.vocab import Recompute

    model = resolve_model("gpt-1.7b")
    flash = Shard(2, 2048, 2, 1, False, Dtype.BF16)
    unfused = dataclasses.replace(flash, attention_kernel=AttentionKernel.UNFUSED)
    a = model.heads / 2
    square = 5 * a * 2048 * 2 * 2048
    lse = 4 * a * 2 * 2048
    diff = (memory.layer_activation_bytes(model, unfused, Recompute.NONE)
            - memory.layer_activation_bytes(model, flash, Recompute.NONE))
    assert diff == pytest.approx(square - lse)
    assert (memory.layer_activation_bytes(model, unfused, Recompute.SELECTIVE)
            == memory.layer_activation_bytes(model, flash, Recompute.SELECTIVE))


def test_deepspeed_caps_the_gathered_zero3_parameters_alive_at_once():
    """Two layers of 70B (2 x 856M params) gathered by FSDP; DeepSpeed keeps at most
    stage3_max_live_parameters = 1e9 of them alive (2 GB in 16-bit)."""
    assert dp.zero3_buffer_bytes(856e6) == pytest.approx(2 * 2 * 856e6)
    assert dp.zero3_buffer_bytes(856e6, 1e9) == pytest.approx(2 * 1e9)
    assert builtin_stack("deepspeed").zero3_max_live_params == 1e9
    assert builtin_stack("fsdp").zero3_max_live_params == 0


def test_a_plans_hash_covers_every_field_it_is_compared_by():
    """Plans hash once and remember it (memoized costs key on them): every field that
    takes part in equality must change the hash, or two different plans could share
    memoized costs by accident of a collision on a common path."""
    from autoplan.descriptors.library import resolve_any_cluster
    from autoplan.descriptors.pipeline_layout import from_stage_lists
    from autoplan.plan import Layout, Placement, Plan
    from autoplan.schedules import Schedule
    from autoplan.vocab import CpComm, MoeDispatch, Offload, Recompute, RecomputeModule

    plan = make_plan(model="llama3-8b", gpus=16, dp=8, pp=2)
    other = {
        "model": resolve_model("llama2-7b"), "cluster": dataclasses.replace(plan.cluster, nodes=4),
        "job": dataclasses.replace(plan.job, seq_len=2048), "layout": Layout(dp=4, tp=2, pp=2),
        "micro_batch": 2, "schedule": Schedule.GPIPE, "recompute": Recompute.FULL,
        "zero": ZeroStage.GRADIENTS, "sequence_parallel": True, "stages": (15, 17),
        "cp_comm": CpComm.A2A, "stack": builtin_stack("torchtitan"),
        "chunks": from_stage_lists([[15], [17]]), "offload": Offload(optimizer=True),
        "placement": Placement(cluster=resolve_any_cluster(
            str(ROOT / "examples" / "clusters" / "h100-a100.yaml")), stage_pools=(0, 1)),
        "recompute_modules": (RecomputeModule.MLP,), "moe_dispatch": MoeDispatch.DEEPEP,
        "ep_overlap": True,
    }
    compared = {f.name for f in dataclasses.fields(Plan) if f.compare}
    assert compared == set(other)
    for name, value in other.items():
        assert hash(dataclasses.replace(plan, **{name: value})) != hash(plan), name


@pytest.mark.parametrize("name", ["deepseek-v3", "mixtral-8x7b"])
def test_a_dense_layer_and_the_logits_read_no_expert_field_of_the_shard(name: str) -> None:
    """An MoE model's dense layers and output layer cost the same on shards that differ only
    in the expert degrees, the busiest expert rank's load and the dispatcher: the layer
    costs share one shard for them (``cost.stage._dense_shard``)."""
    from autoplan.cost.stage import _dense_shard
    from autoplan.vocab import MoeDispatch

    model, device = resolve_model(name), H100
    for dtype in (Dtype.BF16, Dtype.FP8):
        for tp, cp, sp in ((1, 1, False), (4, 2, True), (8, 1, True)):
            base = Shard(2, 4096, tp, cp, sp, dtype, cp_ring=cp > 1, layer_kernels=20,
                         host_kernel_s=1e-5, host_backward_kernel_s=2e-5, kernel_efficiency=0.8)
            dense = compute.layer_times(model, base, device)
            logits = compute.logits_times(model, base, device)
            moe = set()
            for ep, etp, load, dispatch in ((8, 1, 1.25, MoeDispatch.ALLTOALL),
                                            (2, 2, 1.5, MoeDispatch.DEEPEP),
                                            (4, 1, 1.0, MoeDispatch.DEEPEP)):
                shard = dataclasses.replace(base, ep=ep, etp=etp, expert_load=load,
                                            moe_dispatch=dispatch)
                assert compute.layer_times(model, shard, device) == dense
                assert compute.logits_times(model, shard, device) == logits
                assert _dense_shard(shard) == base
                moe.add(compute.layer_times(model, shard, device, True))
            # the MoE layer does read them: its experts run on the busiest rank's tokens
            assert len(moe) == 3
