"""The rules of a valid plan are stated once (autoplan.parallel.rules): the plan reader,
the search's pruning and the exporters ask the same predicates, so whatever the search
generates, the reader accepts and the space's launcher can run."""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.descriptors.job import Job
from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.descriptors.model import Model
from autoplan.descriptors.space import load_space
from autoplan.parallel import rules
from autoplan.parallel.common import Scope
from autoplan.plans.file import plan_document, read_plan
from autoplan.search.engine import (
    SEARCH_PRUNING,
    SearchResult,
    candidate_plans,
    pruning_reason,
    search,
)
from tests.helpers import make_plan


def _mixtral_with_shared_expert() -> Model:
    """Mixtral with one shared expert of width 1002: tp = 4 does not divide it."""
    return dataclasses.replace(resolve_model("mixtral-8x7b"), shared_experts=1,
                               shared_ffn_hidden=1002)


def _all_moe_with_odd_ffn() -> Model:
    """Every layer an MoE layer: the unused dense ffn_hidden must not restrict tp."""
    return dataclasses.replace(resolve_model("mixtral-8x7b"), ffn_hidden=14335)


def _small_deepseek() -> Model:
    """DeepSeek-V3's MLA, 256+1 experts, dense first layer and MTP, in 6 layers."""
    return dataclasses.replace(resolve_model("deepseek-v3"), layers=6, dense_layers=1)


SAMPLES = [
    # (model, space, gpus, global batch, seq len, tp cap, every k-th candidate checked; the
    # any and megatron spaces' strides doubled with their module sets and EP overlap, issue 48)
    (_mixtral_with_shared_expert, "megatron", 16, 256, 4096, 4, 2),
    (_all_moe_with_odd_ffn, "default", 16, 256, 4096, 8, 2),
    (lambda: resolve_model("llama3-8b"), "default", 16, 256, 4096, 8, 2),
    (lambda: resolve_model("llama3-8b"), "torchtitan", 16, 128, 8192, 8, 1),
    (lambda: resolve_model("llama3-8b"), "deepspeed", 16, 256, 4096, 8, 1),
    (lambda: resolve_model("llama3-8b"), "fsdp", 16, 256, 4096, 8, 1),
    (lambda: resolve_model("nemotron-4-15b"), "megatron", 16, 64, 4096, 8, 1),
    (_small_deepseek, "megatron", 32, 256, 4096, 8, 4),
    (_small_deepseek, "torchtitan", 32, 256, 4096, 8, 2),
    (lambda: resolve_model("mixtral-8x7b"), "torchtitan", 16, 256, 4096, 8, 2),
    (lambda: resolve_model("gpt-3.6b"), "default", 16, 64, 2048, 8, 1),
]


@pytest.mark.slow  # more than about 3 s on 2 cores
@pytest.mark.parametrize(("model", "space_name", "gpus", "gbs", "seq", "tp_max", "every"), SAMPLES)
def test_every_candidate_the_search_generates_passes_the_readers_and_its_spaces_rules(
        model, space_name, gpus, gbs, seq, tp_max, every):
    """Every candidate (every k-th of the largest samples, whose spaces' schedules, splits
    and hybrid shards multiply them) passes the rules of a valid plan and its space's."""
    space = dataclasses.replace(load_space(space_name), tp_max=tp_max)
    cluster = with_gpus(resolve_cluster("dgx-h100"), gpus)
    job = Job(global_batch=gbs, seq_len=seq)
    seen = 0
    for i, plan in enumerate(candidate_plans(model(), cluster, job, space)):
        if i % every:
            continue
        seen += 1
        assert rules.plan_problems(plan) == [], plan
        assert rules.space_problems(plan, space) == [], plan
    assert seen


@pytest.fixture(scope="module")
def shared_expert_search() -> SearchResult:
    """The top 50 of Mixtral with a shared expert of width 1002 on 32 H100 (megatron space,
    tp up to 4), searched once for the two tests below (3 s)."""
    space = dataclasses.replace(load_space("megatron"), tp_max=4)
    cluster = with_gpus(resolve_cluster("dgx-h100"), 32)
    return search(_mixtral_with_shared_expert(), cluster, Job(global_batch=256, seq_len=4096),
                  space, top_k=50)


@pytest.mark.slow  # more than about 3 s on 2 cores
def test_searched_plans_with_their_layer_splits_round_trip_through_the_reader(shared_expert_search):
    result = shared_expert_search
    assert result.plans
    for ranked in result.plans:
        doc = plan_document(ranked.plan)
        assert read_plan(doc, "<searched>", correct=False) == ranked.plan  # analytic: the door adds grids


@pytest.mark.slow  # more than about 3 s on 2 cores
def test_tp_that_does_not_divide_a_shared_experts_width_is_never_searched(shared_expert_search):
    result = shared_expert_search  # its top 50 (this test once searched for the top 20)
    assert len(result.plans) == 50
    assert all(r.plan.layout.tp in (1, 2) for r in result.plans)
    assert result.stats.pruned["tp-shared-experts"] > 0


def test_an_all_moe_model_may_take_a_tp_that_does_not_divide_its_unused_dense_width():
    plan = make_plan(_all_moe_with_odd_ffn(), gpus=16, dp=8, tp=2, ep=8, etp=1,
                     sequence_parallel=True)
    assert rules.plan_problems(plan) == []
    cluster = with_gpus(resolve_cluster("dgx-h100"), 16)
    found = {c.layout.tp for c in candidate_plans(_all_moe_with_odd_ffn(), cluster,
                                                   Job(global_batch=256, seq_len=4096),
                                                   load_space("default"))}
    assert {1, 2, 4, 8} <= found


def test_rule_ids_are_unique_and_every_search_statistic_names_one():
    assert len(rules.BY_ID) == len(rules.RULES)
    assert not set(rules.BY_ID) & set(SEARCH_PRUNING)
    cluster = with_gpus(resolve_cluster("dgx-h100"), 64)
    result = search(resolve_model("llama3-70b"), cluster, Job(global_batch=96, seq_len=8192),
                    load_space("megatron"))
    assert result.stats.pruned
    for rule_id in result.stats.pruned:
        assert pruning_reason(rule_id)


def test_each_rule_reports_on_its_own_field_and_only_when_broken():
    ok = make_plan(gpus=8, dp=8)
    for rule in rules.RULES:
        assert rule.broken(ok) is None, rule.id
    broken = {
        "layout-gpus": make_plan(gpus=8, dp=4),
        "tp-heads": make_plan(gpus=48, dp=1, tp=3, pp=16),  # 32 heads
        "dp-batch": make_plan(gpus=8, dp=8, micro_batch=3),
        "cp-seq-len": make_plan(gpus=8, dp=1, cp=8, seq_len=4104),
        "sp-needs-tp": make_plan(gpus=8, dp=8, sequence_parallel=True),
        "vpp-needs-schedule": make_plan(gpus=8, dp=4, pp=2, vpp=2),
        "pp-layers": make_plan(gpus=64, dp=1, pp=64),
        "stages-sum": make_plan(gpus=8, dp=4, pp=2, stages=(16, 15)),
    }
    for rule_id, plan in broken.items():
        rule = rules.BY_ID[rule_id]
        assert rule.broken(plan), rule_id
        assert (rule.field, rule.broken(plan)) in rules.plan_problems(plan)


def test_first_broken_reads_nothing_past_its_scope():
    plan = make_plan(gpus=8, dp=8, micro_batch=3)  # breaks dp-batch (micro-batch scope)
    assert rules.first_broken(plan, Scope.LAYOUT) is None
    assert rules.first_broken(plan, Scope.MICRO_BATCH) is rules.BY_ID["dp-batch"]
