"""Schedules, uneven splits and the timeline, end to end through the cost model,
the search and the command line."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET

import pytest

from autoplan.cost.evaluate import evaluate, simulate_timeline
from autoplan.descriptors.job import Job
from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.descriptors.pipeline_layout import render_layout, stage_lists
from autoplan.descriptors.space import StageShape, load_space
from autoplan.export.megatron import export as megatron_export
from autoplan.parallel.rules import plan_problems, space_problems
from autoplan.plans.file import plan_document, read_plan
from autoplan.schedules import Schedule
from autoplan.schedules.registry import Chunks
from autoplan.search.engine import search
from autoplan.search.partition import stage_memory
from autoplan.search.stages import chunks_of, partition_problem, with_best_stages
from autoplan.vocab import Axis, Recompute, ZeroStage
from tests.helpers import autoplan, make_plan

LARGE_VOCAB = dict(model="nemotron-4-15b", gpus=16, dp=2, tp=2, pp=4, global_batch=64,
                   sequence_parallel=True)


@pytest.mark.parametrize("schedule", list(Schedule))
def test_every_schedule_evaluates_with_a_consistent_breakdown(schedule):
    vpp = 1 if schedule.spec.chunks is Chunks.ONE else 2
    plan = make_plan(model="llama3-8b", gpus=8, dp=2, pp=4, global_batch=32, schedule=schedule,
                     vpp=vpp)
    assert plan_problems(plan) == []
    pred = evaluate(plan)
    assert pred.breakdown.total == pytest.approx(pred.step_time_s, rel=1e-12)


def test_zero_bubble_h1_shrinks_the_bubble_of_1f1b():
    kw = dict(model="llama3-8b", gpus=8, dp=2, pp=4, global_batch=32)
    one = evaluate(make_plan(schedule=Schedule.ONE_F_ONE_B, **kw))
    zb = evaluate(make_plan(schedule=Schedule.ZB_H1, **kw))
    assert zb.breakdown.bubble < 0.6 * one.breakdown.bubble


def test_v_shape_schedules_need_two_chunks_per_stage():
    plan = make_plan(model="llama3-8b", gpus=8, dp=2, pp=4, global_batch=32, schedule=Schedule.ZB_V)
    assert any(field == "layout.vpp" for field, _ in plan_problems(plan))


def test_the_partitioner_beats_the_uniform_split_on_a_large_vocabulary():
    plan = make_plan(**LARGE_VOCAB)
    split = with_best_stages(plan, StageShape.ANY)
    assert split is not None and split.stages is not None
    assert split.stages[-1] < split.stages[0]  # the logits stage gets fewer layers
    assert evaluate(split).step_time_s < 0.9 * evaluate(plan).step_time_s


def test_the_partition_problem_predicts_the_evaluators_memory_for_any_split():
    plan = make_plan(**LARGE_VOCAB)
    problem = partition_problem(plan, StageShape.ANY)
    for layers in [(8, 8, 8, 8), (9, 9, 9, 5), (5, 9, 9, 9), (12, 10, 6, 4)]:
        split = make_plan(stages=layers, **LARGE_VOCAB)
        got = [m.peak for m in evaluate(split).memory_per_stage]
        assert stage_memory(problem, layers) == pytest.approx(got, rel=1e-9)


def test_megatrons_space_returns_splits_it_can_express():
    m = resolve_model("nemotron-4-15b")
    c = with_gpus(resolve_cluster("dgx-h100"), 16)
    result = search(m, c, Job(global_batch=64, seq_len=4096), load_space("megatron"), top_k=5)
    assert result.plans
    for r in result.plans:
        stages = r.plan.stage_layers
        if r.plan.chunks is None:  # else --pipeline-model-parallel-layout
            assert len(set(stages[1:-1])) <= 1  # --decoder-first/last-pipeline-num-layers
        assert r.plan.schedule in (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED)


def test_the_timeline_traces_every_operation_of_the_step():
    plan = make_plan(model="llama3-8b", gpus=8, dp=2, pp=4, global_batch=32,
                     schedule=Schedule.ZB_H1, recompute=Recompute.NONE, zero=ZeroStage.OPTIMIZER)
    sim = simulate_timeline(plan)
    m, p = plan.num_microbatches, plan.layout.pp
    assert len(sim.events) == 3 * m * p  # F, B and W of every microbatch on every stage
    assert max(e.end_s for e in sim.events) == pytest.approx(sim.makespan)


def test_explain_prints_the_schedule_and_writes_an_svg_timeline(tmp_path):
    svg = tmp_path / "timeline.svg"
    run = autoplan("explain", "examples/plans/gpt3-175b-1024xa100-sc21.yaml",
                  "--timeline", str(svg), "--microbatches", "16")
    assert run.returncode == 0, run.stderr
    assert "where the step time goes" in run.stdout and "timeline" in run.stdout
    assert "stage 7" in run.stdout
    root = ET.fromstring(svg.read_text())
    assert root.tag.endswith("svg")


def test_explain_refuses_a_timeline_of_an_unknown_format(tmp_path):
    run = autoplan("explain", "examples/plans/gpt3-175b-1024xa100-sc21.yaml",
                  "--timeline", str(tmp_path / "t.gif"))
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "--timeline" in run.stderr and not (tmp_path / "t.gif").exists()


def test_a_v_shape_puts_the_output_layer_and_logits_back_on_stage_zero():
    """ZB-V's last model chunk runs on stage 0 (Qi et al. 2024b), and so does the loss."""
    from autoplan.cost.stage import stage_work
    from autoplan.parallel.pp import output_stage

    kw = dict(model="llama3-8b", gpus=8, dp=2, pp=4, global_batch=32)
    v = make_plan(schedule=Schedule.ZB_V, vpp=2, **kw)
    one = make_plan(schedule=Schedule.ONE_F_ONE_B, **kw)
    assert output_stage(v) == 0 and output_stage(one) == 3
    works_v, works_one = stage_work(v), stage_work(one)
    assert works_v[0].params == pytest.approx(works_one[0].params + works_one[3].params
                                              - works_one[1].params)
    assert works_v[3].params == pytest.approx(works_one[1].params)
    # the turning stage hands chunk 0 to its own chunk 1: one send each way, not two
    assert works_v[3].comm[Axis.PP][0] == pytest.approx(works_v[1].comm[Axis.PP][0] / 2)


# ----------------------------------------------------------------------------- per-chunk splits

def test_chunks_of_puts_each_ranks_short_chunk_beside_its_fixed_work():
    plan = make_plan(model="llama3-405b", gpus=64, dp=1, tp=4, pp=16, vpp=4)
    per_rank = (7,) + (8,) * 14 + (7,)  # 126 layers
    chunks = chunks_of(plan, per_rank)
    assert stage_lists(chunks, 16) == [[1, 2, 2, 2]] + [[2, 2, 2, 2]] * 14 + [[2, 2, 2, 1]]
    assert chunks[0].embedding and chunks[-1].loss
    assert sum(c.layers for c in chunks) == 126
    assert render_layout(chunks) == "Et|(tt|)*62,tL"


def test_the_partitioner_finds_nemos_llama3_405b_layout():
    """NeMo's Llama 3 405B recipe (pp16 vpp4 on 126 layers: the embedding and the loss
    each stand for a layer, so the first and last chunks hold one layer)."""
    plan = make_plan(model="llama3-405b", gpus=512, dp=4, tp=8, pp=16, vpp=4,
                     global_batch=64, seq_len=8192, schedule=Schedule.INTERLEAVED,
                     recompute=Recompute.FULL, sequence_parallel=True)
    best = with_best_stages(plan, StageShape.ANY)
    assert best is not None and best.chunks is not None
    assert render_layout(best.chunks) == "Et|(tt|)*62,tL"
    assert plan_problems(best) == []


def test_an_uneven_per_chunk_split_beats_the_uniform_one_on_a_large_vocabulary():
    plan = make_plan(schedule=Schedule.INTERLEAVED, vpp=2, **LARGE_VOCAB)
    best = with_best_stages(plan, StageShape.ANY)
    assert best is not None and best.chunks is not None
    assert plan_problems(best) == []
    assert sum(c.layers for c in best.chunks) == plan.model.layers
    assert evaluate(best).step_time_s < 0.9 * evaluate(plan).step_time_s


def test_searches_return_per_chunk_splits_their_launcher_can_write(tmp_path):
    """30 layers on 4 stages of 2 chunks: no uniform interleaved split exists."""
    model = dataclasses.replace(resolve_model("nemotron-4-15b"), layers=30)
    cluster = with_gpus(resolve_cluster("dgx-a100"), 16)
    for name in ("megatron", "torchtitan"):
        space = dataclasses.replace(load_space(name), schedules=(Schedule.INTERLEAVED,),
                                    cp_max=1, tp_max=2, micro_batches=(1,))
        result = search(model, cluster, Job(global_batch=64, seq_len=4096), space, top_k=8)
        chunked = [r.plan for r in result.plans if r.plan.chunks is not None]
        assert chunked, name
        for plan in chunked:
            assert plan_problems(plan) == [] and space_problems(plan, space) == []
            assert read_plan(plan_document(plan), "<searched>", correct=False) == plan
        if name == "megatron":
            args = megatron_export(chunked[0])
            assert any("--pipeline-model-parallel-layout" in text for text in args.values())
