"""The schedule registry (``autoplan/schedules/registry.py``): a schedule is one file.

This file is that file for a toy schedule, GPipe with the weight gradients deferred
("gpipe-w": every F, then every B, then every W; a legitimate order that splits the
backward, with no closed-form peak, so the memory walk counts it). Registered here and
nowhere else, it is read from a plan file, simulated, counted in memory, searched (and
the search's best equals brute force over the space), and refused by the launchers that
have no class for it: nothing else in the tree names it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from autoplan import caches
from autoplan.cost.evaluate import evaluate
from autoplan.descriptors.job import Job
from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.descriptors.space import load_space
from autoplan.errors import InputError
from autoplan.export import Target, export
from autoplan.plans.file import plan_document, read_plan
from autoplan.schedules import Schedule
from autoplan.schedules.memory import peak_inflight
from autoplan.schedules.registry import Chunks, Op, ScheduleSpec, register, unregister
from autoplan.schedules.simulator import simulate_exact
from autoplan.search.engine import search
from autoplan.vocab import Dtype
from tests.unit.test_search import brute_force


def gpipe_w(stage: int, p: int, m: int, v: int = 1) -> Iterator[Op]:
    """All forwards, all input gradients, then all weight gradients."""
    for kind in "FBW":
        yield from ((kind, j, 0) for j in range(m))


TOY = ScheduleSpec(name="gpipe-w", attr="GPIPE_W", doc="GPipe with every weight gradient deferred.",
                   chunks=Chunks.ONE, splits_backward=True, stage_order=gpipe_w)


@pytest.fixture
def toy() -> Iterator[Schedule]:
    schedule = register(TOY)
    try:
        yield schedule
    finally:
        caches.clear()  # memos keyed by it go with it
        unregister(schedule)


def test_a_registered_schedule_is_looked_up_by_name_and_forgotten_after(toy):
    assert Schedule("gpipe-w") is toy and toy in list(Schedule) and toy.rank == len(Schedule) - 1
    assert toy.splits_backward and not toy.v_shape
    with pytest.raises(ValueError, match="registered already"):
        register(TOY)


def test_after_the_toy_schedule_is_gone_the_registry_holds_the_builtins_only():
    assert [s.value for s in Schedule] == ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2",
                                           "zb-v", "v-half", "v-min", "bfpp"]
    with pytest.raises(ValueError, match="not a pipeline schedule"):
        Schedule("gpipe-w")


def test_its_memory_is_walked_from_its_order_and_matches_the_simulator(toy):
    """Every forward is held until its W: m on every stage, as the simulator counts."""
    for p, m in ((2, 3), (4, 8), (3, 1)):
        sim = simulate_exact(toy, [1.0] * p, [1.0] * p, [0.5] * p, m, 1)
        assert [peak_inflight(toy, p, m, 1, s) for s in range(p)] == list(sim.peak_inflight) == [m] * p


PLAN = {"autoplan": 1, "model": "llama3-8b", "cluster": {"name": "dgx-h100", "nodes": 1},
        "job": {"global_batch": 16, "seq_len": 4096, "dtype": "bf16"},
        "layout": {"dp": 2, "tp": 1, "pp": 4}, "micro_batch": 1, "zero": 1}


def test_a_plan_file_names_it_and_is_predicted_between_gpipe_and_the_zero_bubble_schedules(toy):
    """Deferring W leaves GPipe's fill but fills its drain with W: faster than GPipe, slower
    than ZB-H1 (which also runs W late, one by one, as 1F1B's steady state frees room)."""
    steps = {}
    for name in ("gpipe", "gpipe-w", "zb-h1"):
        plan = read_plan({**PLAN, "schedule": name}, "<test>", correct=False)
        steps[name] = evaluate(plan).step_time_s
    assert steps["zb-h1"] < steps["gpipe-w"] < steps["gpipe"]
    plan = read_plan({**PLAN, "schedule": "gpipe-w"}, "<test>", correct=False)
    assert plan.schedule is toy
    assert plan_document(plan)["schedule"] == "gpipe-w"


def test_the_search_takes_it_from_a_space_and_its_best_equals_brute_force(toy):
    space = dataclasses.replace(load_space("default"), name="toy", schedules=(Schedule.ONE_F_ONE_B, toy),
                                vpp_max=1)
    model = resolve_model("llama3-8b")
    cluster = with_gpus(resolve_cluster("dgx-h100"), 8)
    job = Job(global_batch=16, seq_len=4096, dtype=Dtype.BF16)
    expected = brute_force(model, cluster, job, space)
    result = search(model, cluster, job, space, top_k=5)
    assert any(p.schedule is toy for _, p, _ in expected)
    assert [r.plan for r in result.plans] == [p for _, p, _ in expected[:5]]
    assert [r.prediction for r in result.plans] == [q for _, _, q in expected[:5]]


def test_launchers_without_a_class_for_it_refuse_to_export_it(toy):
    plan = read_plan({**PLAN, "schedule": "gpipe-w"}, "<test>", correct=False)
    with pytest.raises(InputError, match="schedule"):
        export(plan, Target.TORCHTITAN)
