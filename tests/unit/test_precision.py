"""Gradient and optimizer-state precision (job.main_grads, job.optimizer_states): the bytes
per parameter Megatron-LM's distributed optimizer holds with bf16 gradients and the
precision-aware optimizer's bf16 moments, the gradient sync they halve, and the job files
that carry them."""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.cost.evaluate import evaluate
from autoplan.cost.stage import stage_work
from autoplan.descriptors.precision import StatePrecision
from autoplan.errors import InputError
from autoplan.kernels import comm
from autoplan.kernels.memory import BytesPerParam, bytes_per_param
from autoplan.parallel import dp, mesh
from autoplan.planfile import read_plan
from autoplan.vocab import Axis, Dtype, StateDtype
from tests.helpers import make_plan

BF16 = StateDtype.BF16


def test_bytes_per_parameter_by_hand():
    # Megatron-LM docs/distrib_optimizer.md: bf16 training keeps a 2-byte weight, a 4-byte
    # fp32 gradient and 12 bytes of fp32 master weight, m and v
    assert bytes_per_param(Dtype.BF16) == BytesPerParam(2, 4, 12)
    assert bytes_per_param(Dtype.BF16, StatePrecision(main_grads=BF16)) == BytesPerParam(2, 2, 12)
    # the precision-aware optimizer with bf16 moments: fp32 master 4 + m 2 + v 2
    both = StatePrecision(main_grads=BF16, optimizer_states=BF16)
    assert bytes_per_param(Dtype.BF16, both) == BytesPerParam(2, 2, 8)
    assert bytes_per_param(Dtype.FP16, StatePrecision(optimizer_states=BF16)) == BytesPerParam(2, 2, 12)


def _plan(**job):
    plan = make_plan("llama3-8b", gpus=16, global_batch=64, dp=16)
    return dataclasses.replace(plan, job=dataclasses.replace(plan.job, **job))


def test_bf16_states_shrink_memory_as_counted_by_hand():
    fp32, bf16 = evaluate(_plan()), evaluate(_plan(main_grads=BF16, optimizer_states=BF16))
    params = stage_work(_plan())[0].params
    gib = 2**30
    assert fp32.memory.grads - bf16.memory.grads == pytest.approx(params * 2)  # 4 -> 2 bytes
    # zero 1 over dp 16: 12 -> 8 bytes per parameter, sharded
    assert fp32.memory.optimizer - bf16.memory.optimizer == pytest.approx(params * 4 / 16)
    assert bf16.memory.peak < fp32.memory.peak - 10 * gib


def test_bf16_gradients_halve_the_gradient_reduction():
    plan = _plan(main_grads=BF16)
    params = stage_work(plan)[0].params
    groups = mesh.groups(plan)
    reduce_s, _ = dp._sync_seconds(plan.zero, plan.job.dtype, params, 0.0, groups[Axis.DP],
                                   groups[Axis.EDP], plan.states.main_grads)
    assert reduce_s == pytest.approx(comm.reduce_scatter(params * 2, groups[Axis.DP]))
    fp32_s, _ = dp._sync_seconds(plan.zero, plan.job.dtype, params, 0.0, groups[Axis.DP],
                                 groups[Axis.EDP])
    assert fp32_s == pytest.approx(comm.reduce_scatter(params * 4, groups[Axis.DP]))


def test_job_files_carry_the_precision_and_refuse_bf16_gradients_under_fp16():
    plan = _plan(main_grads=BF16, optimizer_states=BF16)
    doc = plan.to_dict()
    assert doc["job"]["main_grads"] == doc["job"]["optimizer_states"] == "bf16"
    assert "main_grads" not in _plan().to_dict()["job"]
    back = read_plan(doc, "p.yaml")
    assert (back.job.main_grads, back.job.optimizer_states) == (BF16, BF16)
    with pytest.raises(InputError, match="p.yaml: job.main_grads"):
        read_plan({**doc, "job": {**doc["job"], "dtype": "fp16"}}, "p.yaml")
    with pytest.raises(InputError, match="p.yaml: job.optimizer_states"):
        read_plan({**doc, "job": {**doc["job"], "optimizer_states": "fp8"}}, "p.yaml")
