"""Behaviour of the evaluator: breakdown, precision, recompute, communication terms."""

from __future__ import annotations

import pytest

from autoplan.cost.evaluate import evaluate
from autoplan.schedules import Schedule
from autoplan.vocab import Dtype, Recompute, ZeroStage
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



def test_zero3_passes_grow_with_the_compute_they_hide_behind():
    """The search's ZeRO-3 floor reads dp.zero3_exposed at a stage's least compute: that
    holds because a pass's compute plus what it exposes never falls as the compute grows
    (the overlap hides at most the compute it runs beside): checked across the point
    where the compute outlasts the gathers."""
    from autoplan.parallel import mesh
    from autoplan.parallel.dp import zero3_exposed

    plan = make_plan(model="llama2-70b", gpus=64, dp=64, global_batch=64,
                     zero=ZeroStage.PARAMETERS)
    groups = mesh.groups(plan)
    params, layers = 4e9, 20
    computes = [0.0, 1e-4, 1e-3, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0]
    passes = [zero3_exposed(plan, groups, params, 0.0, c, c, 0.0, layers) for c in computes]
    forward = [c + f for c, (f, _) in zip(computes, passes, strict=True)]
    backward = [c + b for c, (_, b) in zip(computes, passes, strict=True)]
    assert forward == sorted(forward) and backward == sorted(backward)
    # the gathers hide behind a long enough compute: only the first layer's and the
    # slowed share stay exposed, so some of the computes above cross that point
    assert passes[0][0] > passes[-1][0] > 0
    one = make_plan(model="llama2-70b", gpus=64, dp=64, global_batch=64, zero=ZeroStage.GRADIENTS)
    assert zero3_exposed(one, mesh.groups(one), params, 0.0, 1.0, 1.0, 1.0, layers) == (0.0, 0.0)
