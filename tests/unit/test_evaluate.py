"""Behaviour of the evaluator: breakdown, precision, recompute, communication terms."""

from __future__ import annotations

import pytest

from autoplan.cost.evaluate import evaluate
from autoplan.vocab import Dtype, Recompute, Schedule, ZeroStage
from tests.helpers import make_plan


def test_the_breakdown_adds_up_to_the_step_time():
    pred = evaluate(make_plan(model="llama2-13b", gpus=16, dp=2, tp=4, pp=2, global_batch=32,
                              sequence_parallel=True, recompute=Recompute.SELECTIVE))
    assert pred.breakdown.total == pytest.approx(pred.step_time_s, rel=1e-12)
    assert pred.breakdown.bubble > 0 and pred.breakdown.tp_comm > 0 and pred.breakdown.pp_comm > 0


def test_mfu_counts_model_flops_and_hardware_flops_add_the_recompute():
    none = evaluate(make_plan(recompute=Recompute.NONE))
    full = evaluate(make_plan(recompute=Recompute.FULL))
    assert none.hw_tflops_per_gpu == pytest.approx(none.tflops_per_gpu)
    assert full.hw_tflops_per_gpu > full.tflops_per_gpu
    assert full.step_time_s > none.step_time_s
    assert full.breakdown.recompute > 0 == none.breakdown.recompute
    # hardware / model FLOPs ratio of full recompute: (3F + F) / 3F = 4/3 (logits not recomputed)
    assert full.hw_tflops_per_gpu / full.tflops_per_gpu == pytest.approx(4 / 3, rel=0.02)


def test_fp8_gemms_run_faster_than_bf16_on_hopper():
    bf16 = evaluate(make_plan(dtype=Dtype.BF16))
    fp8 = evaluate(make_plan(dtype=Dtype.FP8))
    assert fp8.step_time_s < bf16.step_time_s


def test_fp8_on_an_a100_is_refused_as_bad_input():
    from autoplan.parallel.rules import plan_problems

    problems = plan_problems(make_plan(cluster="dgx-a100", dtype=Dtype.FP8))
    assert any(field == "job.dtype" for field, _ in problems)


def test_one_gpu_per_axis_has_no_communication():
    pred = evaluate(make_plan(gpus=1, dp=1, global_batch=4, zero=ZeroStage.NONE))
    b = pred.breakdown
    assert b.tp_comm == b.pp_comm == b.dp_comm == b.cp_comm == b.bubble == 0


def test_zero3_pays_parameter_gathers_that_zero1_does_not():
    z1 = evaluate(make_plan(model="llama2-70b", gpus=64, dp=64, global_batch=64,
                            zero=ZeroStage.OPTIMIZER, recompute=Recompute.FULL))
    z3 = evaluate(make_plan(model="llama2-70b", gpus=64, dp=64, global_batch=64,
                            zero=ZeroStage.PARAMETERS, recompute=Recompute.FULL))
    assert z3.memory.weights < z1.memory.weights / 32
    assert z3.memory.peak < z1.memory.peak


def test_gpipe_holds_more_activations_than_1f1b_for_the_same_time():
    kw = dict(model="llama3-8b", gpus=8, dp=2, pp=4, global_batch=64)
    one = evaluate(make_plan(schedule=Schedule.ONE_F_ONE_B, **kw))
    gp = evaluate(make_plan(schedule=Schedule.GPIPE, **kw))
    assert gp.memory.activations > 3 * one.memory.activations
    # the same pipeline time; GPipe's fuller memory pays the allocator's pressure
    assert gp.step_time_s - gp.breakdown.overhead == pytest.approx(
        one.step_time_s - one.breakdown.overhead, rel=0.02)
    assert gp.memory.peak / gp.capacity_bytes > 0.9
    assert gp.breakdown.overhead > one.breakdown.overhead


def test_interleaving_shrinks_the_bubble():
    kw = dict(model="llama3-8b", gpus=8, dp=2, pp=4, global_batch=16)
    one = evaluate(make_plan(schedule=Schedule.ONE_F_ONE_B, **kw))
    inter = evaluate(make_plan(schedule=Schedule.INTERLEAVED, vpp=2, **kw))
    assert inter.breakdown.bubble < 0.7 * one.breakdown.bubble



def test_zero3_first_layer_gathers_are_what_no_compute_hides():
    """dp.zero3_first_gathers (the search's floor) is what dp.zero3_exposed charges past
    its overlapped part: at most the exposed sync whatever the compute, and exactly the
    rest once the compute hides every gather (overlapped = slowdown x collective)."""
    from autoplan.parallel import mesh
    from autoplan.parallel.dp import zero3_exposed, zero3_first_gathers
    from autoplan.vocab import Axis

    plan = make_plan(model="llama2-70b", gpus=64, dp=64, global_batch=64,
                     zero=ZeroStage.PARAMETERS)
    groups = mesh.groups(plan)
    params, layers = 4e9, 20
    first = zero3_first_gathers(plan, groups, params, 0.0, layers)
    for compute in (0.0, 1e-3, 1.0, 1e3):
        f, b = zero3_exposed(plan, groups, params, 0.0, compute, compute, compute, layers)
        assert first <= f + b
    from autoplan.cost import comm
    from autoplan.cost.compute import BF16_BYTES
    from autoplan.parallel.dp import grad_bytes
    gather = comm.all_gather(params * BF16_BYTES, groups[Axis.DP])
    scatter = comm.reduce_scatter(params * grad_bytes(plan.job.dtype), groups[Axis.DP])
    assert first == pytest.approx(2 * gather / layers, rel=1e-12)
    slow = plan.stack.comm_compute_slowdown
    f, b = zero3_exposed(plan, groups, params, 0.0, 1e3, 1e3, 1e3, layers)
    assert f + b == pytest.approx(first + slow * (2 * gather + scatter), rel=1e-12)
    one = make_plan(model="llama2-70b", gpus=64, dp=64, global_batch=64, zero=ZeroStage.GRADIENTS)
    assert zero3_first_gathers(one, mesh.groups(one), params, 0.0, layers) == 0.0
