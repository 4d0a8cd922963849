"""Per-chunk pipeline layouts: Megatron's layout string, chunk lists per stage, and what
the cost model makes of chunks of their own sizes."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.cost.evaluate import evaluate
from autoplan.cost.stage import chunk_work, stage_work
from autoplan.descriptors.pipeline_layout import (
    MAX_UNITS,
    Chunk,
    LayoutError,
    from_stage_lists,
    parse_layout,
    render_layout,
    stage_lists,
)
from autoplan.errors import InputError
from autoplan.plans.file import read_plan
from autoplan.schedules import Schedule
from autoplan.schedules.memory import peak_held, peak_inflight
from autoplan.schedules.simulator import simulate_exact
from tests.helpers import autoplan, cpu_seconds, make_plan

ROOT = Path(__file__).resolve().parents[2]
DEEPSEEK_LAYOUT = ROOT / "examples" / "plans" / "deepseek-v3-2048xh100-pp16vpp2-layout.yaml"


# ----------------------------------------------------------------------------- the string

def test_megatron_docs_deepseek_example_parses_to_its_table():
    # Megatron-Core docs (pipeline_parallel_layout.md): PP16 VPP2, rank 0 runs the
    # embedding and 3 decoders then 2, ranks 1-13 2 and 2, rank 14 2 then the MTP,
    # rank 15 2 then the loss
    chunks = parse_layout("Et*3|(tt|)*29,m|L")
    assert len(chunks) == 32
    assert chunks[0] == Chunk(3, embedding=True)
    assert all(c == Chunk(2) for c in chunks[1:30])
    assert chunks[30] == Chunk(0, mtp=1) and chunks[31] == Chunk(0, loss=True)
    assert sum(c.layers for c in chunks) == 61  # DeepSeek-V3's decoder layers
    assert stage_lists(chunks, 16)[0] == [3, 2] and stage_lists(chunks, 16)[15] == [2, 0]


def test_groups_repeat_and_commas_are_cosmetic():
    assert parse_layout("E(t|)*2,tL") == parse_layout("Et|t|tL") == (
        Chunk(1, embedding=True), Chunk(1), Chunk(1, loss=True))
    assert parse_layout("Et*3|t*2mL") == (Chunk(3, embedding=True), Chunk(2, loss=True, mtp=1))


@pytest.mark.parametrize(("text", "message"), [
    ("Ext", "unknown symbol 'x'"),
    ("E(t|", "never closed"),
    ("Et)|L", "without '('"),
    ("Et*|L", "needs a count"),
    ("tE|L", "embedding E must come first"),
    ("Et|Lt", "loss L must come last"),
    ("Et|mt|L", "before the MTP layers"),
    ("EEt|L", "E must come first, exactly once"),
    ("", "empty"),
])
def test_bad_strings_say_what_is_wrong(text: str, message: str):
    with pytest.raises(LayoutError, match=re.escape(message)):
        parse_layout(text)


@pytest.mark.parametrize("text", [
    "E(t*9999999)*9999999L", "E" + "(" * 50 + "t" + ")" * 50 + "L", "Et" * 6000 + "L",
    "E((t*99)*99)*99L",
])
def test_hostile_strings_fail_fast_without_unrolling(text: str):
    with cpu_seconds() as took, pytest.raises(LayoutError):
        parse_layout(text)
    assert took[0] < 0.5  # a bound, not a benchmark: nothing was unrolled
    assert MAX_UNITS < 10**6


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=1, max_size=40), st.integers(0, 2))
def test_rendered_layouts_read_back_unchanged(layers: list[int], mtp: int):
    last = len(layers) - 1
    chunks = tuple(Chunk(n, embedding=i == 0, loss=i == last, mtp=mtp if i == last else 0)
                   for i, n in enumerate(layers))
    text = render_layout(chunks)
    assert parse_layout(text) == chunks
    assert len(text) <= 12 * len(layers) + 8  # runs compress, nothing grows


def test_chunk_lists_are_in_megatrons_order():
    # chunk k of stage s is virtual stage k*pp + s
    chunks = from_stage_lists([[3, 5], [4, 4]])
    assert [c.layers for c in chunks] == [3, 4, 5, 4]
    assert chunks[0].embedding and chunks[-1].loss
    assert stage_lists(chunks, 2) == [[3, 5], [4, 4]]


# ----------------------------------------------------------------------------- plan files

def _doc(**extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "autoplan": 1, "model": "llama3-8b", "cluster": {"name": "dgx-h100", "nodes": 2},
        "job": {"global_batch": 64, "seq_len": 4096},
        "layout": {"dp": 2, "tp": 2, "pp": 4, "vpp": 2}, "micro_batch": 1,
        "schedule": "interleaved", "sequence_parallel": True}
    doc.update(extra)
    return doc


def test_a_plan_takes_chunk_lists_or_a_layout_and_writes_them_back():
    plan = read_plan(_doc(stages=[[3, 5], [4, 4], [4, 4], [5, 3]]), "p.yaml")
    assert plan.chunks is not None and plan.stage_layers == (8, 8, 8, 8)
    assert plan.to_dict()["stages"] == [[3, 5], [4, 4], [4, 4], [5, 3]]
    same = read_plan(_doc(pipeline_layout="Et*3|t*4|t*4|t*5|t*5|t*4|t*4|t*3L"), "p.yaml")
    assert same.chunks == plan.chunks
    # one chunk per stage, embedding first and loss last: the plain per-stage form
    flat = read_plan(_doc(layout={"dp": 2, "tp": 2, "pp": 4}, schedule="1f1b",
                          pipeline_layout="Et*7|t*9|t*9|t*7L"), "p.yaml")
    assert flat.stages == (7, 9, 9, 7) and flat.chunks is None


def test_a_layout_that_cannot_be_written_as_lists_is_written_as_a_layout():
    # a chunk list puts the MTP layers with the loss; this layout gives them a stage
    plan = read_plan(yaml.safe_load(DEEPSEEK_LAYOUT.read_text()), str(DEEPSEEK_LAYOUT))
    assert plan.to_dict()["pipeline_layout"] == "Et*3|(tt|)*29,m|L"
    assert read_plan({**yaml.safe_load(DEEPSEEK_LAYOUT.read_text()),
                      "pipeline_layout": plan.to_dict()["pipeline_layout"]}, "p.yaml") == plan
    # empty chunks are still chunk lists
    empty = read_plan(_doc(pipeline_layout="E|t*4|t*4|t*4|t*4|t*4|t*4|t*8L"), "p.yaml")
    assert empty.to_dict()["stages"] == [[0, 4], [4, 4], [4, 4], [4, 8]]


@pytest.mark.parametrize(("extra", "field", "message"), [
    ({"stages": [[3, 5], [4, 4], [4, 4]]}, "stages", "expected 4 lists"),
    ({"stages": [[3, 5], [4, 4, 0], [4, 4], [5, 3]]}, "stages[1]", "vpp=2 chunk layer counts"),
    ({"stages": [[3, 5], [4, -4], [4, 4], [5, 3]]}, "stages[1]", "integers >= 0"),
    ({"stages": [[3, 5], [4, 4], [4, 4], [5, 4]]}, "stages", "expected 32 transformer layers"),
    ({"stages": [8, 8, 8, 8]}, "stages", "one list of 2 chunk layer counts per stage"),
    ({"pipeline_layout": "Et*4|(t*4|)*6,t*4L", "stages": [[4, 4]] * 4}, "pipeline_layout",
     "not both"),
    ({"pipeline_layout": 7}, "pipeline_layout", "Megatron layout string"),
    ({"pipeline_layout": "Et*4|(t*4|)*5,t*8L"}, "pipeline_layout", "expected pp*vpp = 8"),
    ({"pipeline_layout": "Et*4|(t*4|)*6,t*4mL"}, "pipeline_layout", "0 MTP layers"),
    ({"pipeline_layout": "Et*4|(t*4|)*6,t*4L", "schedule": "zb-v"}, "pipeline_layout",
     "places its chunks in a V"),
])
def test_bad_splits_name_the_field(extra: dict[str, Any], field: str, message: str):
    with pytest.raises(InputError) as err:
        read_plan(_doc(**extra), "p.yaml")
    assert any(p.field == field and message in p.message for p in err.value.problems), \
        err.value.problems


def test_cli_evaluates_a_layout_and_rejects_a_bad_one(tmp_path: Path):
    ok = autoplan("evaluate", DEEPSEEK_LAYOUT, "-f", "json")
    assert ok.returncode == 0, ok.stderr
    doc = yaml.safe_load(DEEPSEEK_LAYOUT.read_text())
    doc["pipeline_layout"] = "Et*3|(tt|)*29,mm|L"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    out = autoplan("evaluate", bad)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"{bad}: pipeline_layout: expected the model's 1 MTP layers (m), got 2" in out.stderr


# ----------------------------------------------------------------------------- the cost

def _interleaved(**kw: Any):
    return make_plan("llama3-70b", gpus=64, global_batch=256, dp=4, tp=4, pp=4, vpp=2,
                     schedule=Schedule.INTERLEAVED, sequence_parallel=True, **kw)


def test_equal_chunks_cost_what_the_uniform_split_costs():
    uniform = _interleaved()
    chunked = dataclasses.replace(uniform, chunks=from_stage_lists([[10, 10]] * 4))
    a, b = evaluate(uniform), evaluate(chunked)
    # the same layers and sends; only where the embedding and logits sit is now exact
    # (their chunk, not spread over the stage's), so the two agree closely, not bitwise
    assert b.step_time_s == pytest.approx(a.step_time_s, rel=1e-3)
    for ma, mb in zip(a.memory_per_stage, b.memory_per_stage, strict=True):
        assert mb.peak == pytest.approx(ma.peak, rel=0.02)
        assert (mb.weights, mb.grads, mb.optimizer) == pytest.approx(
            (ma.weights, ma.grads, ma.optimizer), rel=1e-9)


def test_a_stage_is_the_sum_of_its_chunks():
    plan = dataclasses.replace(_interleaved(), chunks=from_stage_lists(
        [[9, 11], [10, 10], [10, 10], [11, 9]]))
    chunks, stages = chunk_work(plan), stage_work(plan)
    for s, w in enumerate(stages):
        mine = chunks[s::4]
        assert w.layers == sum(c.layers for c in mine)
        assert w.forward == pytest.approx(sum(c.forward for c in mine))
        assert w.params == pytest.approx(sum(c.params for c in mine))
    # the embedding's parameters on virtual stage 0, the output layer's on the last
    assert chunks[0].params > chunks[1].params and chunks[-1].params > chunks[-2].params


def test_the_simulator_reads_per_chunk_durations_as_per_stage_ones_when_equal():
    f, b, w = (1.0, 1.2, 0.9, 1.1), (2.0, 2.1, 1.9, 2.2), (0.0,) * 4
    per_stage = simulate_exact(Schedule.INTERLEAVED, f, b, w, 8, 2)
    per_chunk = simulate_exact(Schedule.INTERLEAVED, f * 2, b * 2, w * 2, 8, 2, per_chunk=True)
    assert per_chunk.makespan == per_stage.makespan
    assert per_chunk.busy == pytest.approx(per_stage.busy)


def test_an_unbalanced_chunk_slows_the_pipeline_by_at_least_its_own_extra_work():
    f, b, w = (1.0,) * 8, (2.0,) * 8, (0.0,) * 8
    base = simulate_exact(Schedule.INTERLEAVED, f, b, w, 8, 2, per_chunk=True).makespan
    slow = simulate_exact(Schedule.INTERLEAVED, (1.5,) + f[1:], (3.0,) + b[1:], w, 8, 2,
                          per_chunk=True)
    # virtual stage 0 runs 8 microbatches, each 1.5 s longer: stage 0 is busy 8*2*3 + 12 s
    assert slow.busy[0] == 8 * 2 * 3.0 + 8 * 1.5
    assert slow.makespan >= slow.busy[0] and slow.makespan > base


@pytest.mark.parametrize("m", [4, 8, 12])
@pytest.mark.parametrize("stage", [0, 1, 3])
def test_held_bytes_with_equal_chunks_are_the_in_flight_count(m: int, stage: int):
    for schedule, v in ((Schedule.INTERLEAVED, 2), (Schedule.INTERLEAVED, 3),
                        (Schedule.ONE_F_ONE_B, 1), (Schedule.GPIPE, 1)):
        count = peak_inflight(schedule, 4, m, v, stage)
        assert peak_held(schedule, 4, m, v, stage, (3.0,) * v) == 3.0 * count


def test_held_bytes_weigh_each_chunk():
    # interleaved 1F1B, p=2, m=2, v=2 (m = p: every forward first): stage 0 holds both
    # microbatches of both its chunks at once
    assert peak_held(Schedule.INTERLEAVED, 2, 2, 2, 0, (1.0, 10.0)) == 22.0


def test_megatron_docs_deepseek_layout_puts_the_mtp_on_rank_14():
    plan = read_plan(yaml.safe_load(DEEPSEEK_LAYOUT.read_text()), str(DEEPSEEK_LAYOUT))
    works = stage_work(plan)
    assert [w.mtp for w in works] == [0] * 14 + [1, 0]
    assert works[14].layers == 2 and works[15].layers == 2 and works[0].layers == 5
    pred = evaluate(plan)
    assert pred.feasible and pred.step_time_s > 0


def test_diff_names_the_layout_that_changed():
    from autoplan.commands.diff import plan_fields

    uniform = _interleaved()
    chunked = dataclasses.replace(uniform, chunks=from_stage_lists([[9, 11], [10, 10],
                                                                    [10, 10], [11, 9]]))
    assert plan_fields(uniform)["pipeline_layout"] is None
    # virtual stage k*pp + s is chunk k of stage s: 9, 10, 10, 11 then 11, 10, 10, 9
    assert plan_fields(chunked)["pipeline_layout"] == "Et*9|t*10|t*10|t*11|t*11|t*10|t*10|t*9L"
