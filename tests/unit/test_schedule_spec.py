"""A schedule is one file: the cost model and the search ask its spec
(``autoplan/schedules/registry.py``, ``ScheduleSpec``'s questions), never its flags.

This file is that one file for a new schedule, "bfpp-fifo": breadth-first pipelining
(a variant of ``schedules/bfpp.py``) whose backwards run the microbatches in the order of
their forwards, its peak walked from its order. Registered here through the registry's
public hook and nowhere else (no other module patched), it is costed as breadth-first
(ZeRO-3 once a step), bounded, searched (the search's best equals brute force, and it
ranks it above 1F1B at ZeRO-3), and evaluated. The library has no flag read outside
``schedules/`` that a new schedule would need another file for.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autoplan import caches
from autoplan.cost.evaluate import evaluate
from autoplan.cost.stage import stage_work
from autoplan.descriptors.job import Job
from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.descriptors.space import load_space
from autoplan.export.torchtitan import schedule_csv, schedule_name
from autoplan.parallel import pp
from autoplan.schedules import Schedule
from autoplan.schedules.memory import peak_inflight
from autoplan.schedules.registry import Chunks, Op, ScheduleSpec, alike, register, unregister
from autoplan.schedules.simulator import simulate_exact
from autoplan.search.engine import search
from autoplan.vocab import NO_OFFLOAD, Axis, Dtype, Recompute, ZeroStage
from tests.helpers import make_plan
from tests.unit.test_search import brute_force

PACKAGE = Path(__file__).resolve().parents[2] / "autoplan"
FLAGS = re.compile(r"\.(v_shape|breadth_first|splits_backward)\b")


def bfpp_fifo(stage: int, p: int, m: int, v: int) -> Iterator[Op]:
    """Each chunk's forwards for every microbatch, chunk by chunk; then each chunk's
    backwards, the last chunk first, the first microbatch first."""
    for chunk in range(v):
        yield from (("F", j, chunk) for j in range(m))
    for chunk in reversed(range(v)):
        yield from (("B", j, chunk) for j in range(m))


FIFO = ScheduleSpec(name="bfpp-fifo", attr="BFPP_FIFO",
                    doc="Breadth-first over looped chunks, backwards first in first out.",
                    chunks=Chunks.LAYOUT, splits_backward=False, stage_order=bfpp_fifo,
                    breadth_first=True)


def module_state() -> dict[str, dict[str, int]]:
    """The id of every global of every loaded autoplan module but submodules (which a
    lazy import adds to its package)."""
    return {name: {k: id(v) for k, v in vars(mod).items() if not inspect.ismodule(v)}
            for name, mod in list(sys.modules.items())
            if name.startswith("autoplan") and mod is not None}


@pytest.fixture
def fifo() -> Iterator[tuple[Schedule, dict[str, dict[str, int]]]]:
    before = module_state()
    schedule = register(FIFO)
    try:
        yield schedule, before
    finally:
        caches.clear()  # memos keyed by it go with it
        unregister(schedule)


def library_files_naming(text: str) -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if text in p.read_text(encoding="utf-8"))


KW: dict[str, Any] = dict(model="llama3-70b", gpus=64, dp=8, tp=2, pp=2, cp=2, vpp=2,
                          micro_batch=1, global_batch=32, zero=ZeroStage.PARAMETERS,
                          sequence_parallel=True)


def test_no_module_outside_schedules_reads_a_schedule_flag():
    """The cost model, the rules, the search and the exports ask the spec's questions
    (``ScheduleSpec``), never ``v_shape``, ``breadth_first`` nor ``splits_backward``."""
    sites = [f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}"
             for path in sorted(PACKAGE.rglob("*.py")) if "schedules" not in path.parts
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if FLAGS.search(line)]
    assert sites == []
    assert library_files_naming("representative(") == [PACKAGE / "schedules" / "registry.py",
                                                       PACKAGE / "search" / "layout_floor.py"]


def test_a_schedule_defined_in_a_test_touches_one_file(fifo):
    """Adding it took this file: the library names it nowhere, and registering it changed
    no module's globals (only the registry's members)."""
    schedule, before = fifo
    assert Schedule("bfpp-fifo") is schedule and schedule in list(Schedule)
    touched = {Path(inspect.getsourcefile(FIFO.stage_order) or "")}
    touched |= set(library_files_naming("bfpp-fifo"))
    after = module_state()
    touched |= {Path(sys.modules[name].__file__ or "") for name, state in before.items()
                if after.get(name) != state}
    assert touched == {Path(__file__).resolve()}
    assert len(touched) == 1


def test_the_spec_answers_for_it_as_for_the_breadth_first_schedule(fifo):
    schedule, _ = fifo
    spec, bfpp = schedule.spec, Schedule.BFPP.spec
    assert spec.work_key == bfpp.work_key and alike(schedule) is Schedule.BFPP
    for ask in (lambda s: s.looping, lambda s: s.chunk_counts(4), lambda s: s.output_stage(4),
                lambda s: [s.sends(4, 3, k) for k in range(4)], lambda s: s.op_kinds,
                lambda s: s.drain_counts_w, lambda s: s.hides_tp_behind_w,
                lambda s: s.gathers_once_a_step, lambda s: s.zero3_passes(8),
                lambda s: s.uneven_splits, lambda s: s.chain_bounded):
        assert ask(spec) == ask(bfpp)
    assert spec.zero3_passes(8) == 1 and Schedule.INTERLEAVED.spec.zero3_passes(8) == 8
    assert pp.schedule_choices(make_plan(gpus=16, dp=4, pp=4).layout, dataclasses.replace(
        load_space("any"), schedules=(schedule,), vpp_max=3)) == [(schedule, 2, False),
                                                                   (schedule, 3, False)]


def test_torchtitan_runs_it_from_its_orders_in_a_loop_of_stages(fifo):
    """No class of torch's runs it: torchtitan's PipelineScheduleMulti places its chunks
    (looping) and a schedule CSV gives its order, B as the whole backward."""
    schedule, _ = fifo
    plan = make_plan(schedule=schedule, **KW)
    assert schedule_name(schedule) == schedule.spec.torchtitan_schedule == "PipelineScheduleMulti"
    csv = schedule_csv(plan)
    assert csv is not None
    m = plan.num_microbatches
    first = csv.splitlines()[0].split(",")
    assert first == ([f"{c * 2}F{j}" for c in range(2) for j in range(m)]
                     + [f"{c * 2}B{j}" for c in reversed(range(2)) for j in range(m)])


def test_its_memory_is_walked_from_its_order_and_matches_the_simulator(fifo):
    """Every forward of every chunk before the first backward: m v on every stage."""
    schedule, _ = fifo
    for p, m, v in ((2, 3, 2), (4, 4, 3)):
        sim = simulate_exact(schedule, [1.0] * p, [2.0] * p, [0.0] * p, m, v)
        assert [peak_inflight(schedule, p, m, v, s) for s in range(p)] == list(sim.peak_inflight)
        assert list(sim.peak_inflight) == [peak_inflight(Schedule.BFPP, p, m, v, s)
                                           for s in range(p)] == [m * v] * p


def test_it_is_costed_breadth_first_its_zero3_passes_once_a_step(fifo):
    schedule, _ = fifo
    mine, breadth, depth = (make_plan(schedule=s, **KW)
                            for s in (schedule, Schedule.BFPP, Schedule.INTERLEAVED))
    assert stage_work(mine) == stage_work(breadth)
    assert sum(stage_work(mine)[0].comm[Axis.DP]) < sum(stage_work(depth)[0].comm[Axis.DP])
    own, theirs = evaluate(mine), evaluate(breadth)
    assert own.feasible and own.breakdown.dp_comm == theirs.breakdown.dp_comm
    assert own.breakdown.dp_comm < evaluate(depth).breakdown.dp_comm


def test_the_search_ranks_it_above_1f1b_at_zero3_and_its_best_equals_brute_force(fifo):
    schedule, _ = fifo
    any_ = load_space("any")
    space = dataclasses.replace(
        any_, name="fifo", schedules=(Schedule.ONE_F_ONE_B, schedule), vpp_max=4,
        zero=(ZeroStage.PARAMETERS,), zero_max_with_pp=ZeroStage.PARAMETERS,
        recompute=(Recompute.NONE,), micro_batches=(1, 2), cp_max=1, cp_comm=any_.cp_comm[:1],
        offload=(NO_OFFLOAD,))
    model, cluster = resolve_model("llama3-70b"), with_gpus(resolve_cluster("dgx-h100"), 64)
    job = Job(global_batch=32, seq_len=4096, dtype=Dtype.BF16)
    expected = brute_force(model, cluster, job, space)
    result = search(model, cluster, job, space, top_k=5)
    assert [r.plan for r in result.plans] == [p for _, p, _ in expected[:5]]
    assert [r.prediction for r in result.plans] == [q for _, _, q in expected[:5]]
    assert all(r.plan.schedule is schedule for r in result.plans)
    assert any(p.schedule is Schedule.ONE_F_ONE_B and p.layout.pp > 1 for _, p, _ in expected)
