"""The cost model under input issue 47 found it could not take: every recompute module on
every kind of model without a division by zero, Daly's wall clock in log space, and the
prefix cache that holds what fits."""

from __future__ import annotations

import dataclasses
import math

import pytest

from autoplan.cost.stage import module_recompute
from autoplan.vocab import Recompute, RecomputeModule
from tests.helpers import make_plan


@pytest.mark.parametrize("model", ["llama3-8b", "mixtral-8x7b", "deepseek-v3", "qwen3-30b-a3b"])
def test_every_recompute_module_costs_a_finite_time_on_every_kind_of_model(model):
    base = make_plan(model, gpus=8, dp=8, global_batch=8, seq_len=1024,
                     recompute=Recompute.SELECTIVE)
    for module in RecomputeModule:
        plan = dataclasses.replace(base, recompute_modules=(module,))
        dense, moe = module_recompute(plan)
        assert math.isfinite(dense) and math.isfinite(moe) and dense >= 0 and moe >= 0
        if not base.model.is_moe and module in (RecomputeModule.MOE, RecomputeModule.MOE_ACT,
                                                RecomputeModule.SHARED_EXPERTS):
            assert dense == moe == 0.0  # a dense model has nothing of them to recompute
