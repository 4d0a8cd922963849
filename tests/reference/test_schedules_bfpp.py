"""Breadth-first pipeline parallelism (autoplan/schedules/bfpp.py) against Lamy-Poirier,
"Breadth-First Pipeline Parallelism" (MLSys 2023, arXiv:2211.05953) and torch's
``ScheduleLoopedBFS``: its order, its bubble in closed form, its memory, and the ZeRO-3
passes it runs once a step where a depth-first schedule runs them every microbatch."""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.cost.evaluate import evaluate
from autoplan.cost.stage import stage_work
from autoplan.parallel import dp, mesh
from autoplan.parallel.rules import plan_problems
from autoplan.schedules import Schedule, orders
from autoplan.schedules.memory import peak_inflight
from autoplan.schedules.simulator import simulate_exact
from autoplan.vocab import Axis, ZeroStage
from tests.helpers import make_plan

BFPP = Schedule.BFPP


def test_its_order_is_torchs_looped_bfs():
    # ScheduleLoopedBFS._calculate_single_rank_operations: every microbatch's forward of the
    # rank's first stage, then of its next; then the backwards, the last stage first and the
    # last microbatch first
    p, m, v = 4, 3, 2
    for stage, ops in enumerate(orders.stage_orders(BFPP, p, m, v)):
        f = [(orders.virtual_stage(BFPP, p, stage, c), j) for k, j, c in ops if k == "F"]
        b = [(orders.virtual_stage(BFPP, p, stage, c), j) for k, j, c in ops if k == "B"]
        assert f == [(stage + c * p, j) for c in range(v) for j in range(m)]
        assert b == [(stage + c * p, j) for c in reversed(range(v)) for j in reversed(range(m))]
        assert [k for k, _, _ in ops] == ["F"] * (m * v) + ["B"] * (m * v)


@pytest.mark.parametrize(("p", "m", "v"), [(4, 4, 2), (4, 8, 3), (2, 6, 4), (8, 8, 2)])
def test_its_step_is_m_v_plus_p_minus_1_chunk_passes(p, m, v):
    # m >= p: a stage waits (p - 1) chunk forwards before its first and (p - 1) chunk
    # backwards after its last: (m v + p - 1)(f + b), interleaved 1F1B's bubble (Sec. 3)
    f, b = 1.0, 2.0
    sim = simulate_exact(BFPP, [f] * p, [b] * p, [0.0] * p, m, v)
    assert sim.makespan == pytest.approx((m * v + p - 1) * (f + b))
    inter = simulate_exact(Schedule.INTERLEAVED, [f] * p, [b] * p, [0.0] * p, m, v)
    if m % p == 0:
        assert sim.makespan == pytest.approx(inter.makespan)
    # every microbatch of every chunk is held before the first backward (GPipe's memory)
    assert list(sim.peak_inflight) == [m * v] * p == [peak_inflight(BFPP, p, m, v, s) for s in range(p)]


def test_zero3_gathers_once_a_step_behind_every_microbatch():
    # dp.zero3_exposed per pass, with compute C per microbatch: a depth-first stage exposes
    # it every microbatch behind C, a breadth-first one once behind m C (per microbatch 1/m)
    kw = dict(model="llama3-70b", gpus=64, dp=8, tp=2, pp=2, cp=2, vpp=2, micro_batch=1,
              global_batch=32, zero=ZeroStage.PARAMETERS, sequence_parallel=True)
    breadth = make_plan(schedule=BFPP, **kw)
    depth = make_plan(schedule=Schedule.INTERLEAVED, **kw)
    assert not plan_problems(breadth) and not plan_problems(depth)
    m = breadth.num_microbatches
    wb, wd = stage_work(breadth)[0], stage_work(depth)[0]
    assert (wb.compute_f, wb.compute_b) == (wd.compute_f, wd.compute_b)  # the same layers
    groups = mesh.groups(dataclasses.replace(breadth, schedule=Schedule.GPIPE, layout=dataclasses.replace(
        breadth.layout, vpp=1)))
    once = dp.zero3_exposed(breadth, groups, wb.params, wb.expert_params, m * wb.compute_f,
                            m * wb.compute_b, m * wb.compute_w, wb.layers)
    each = dp.zero3_exposed(depth, groups, wd.params, wd.expert_params, wd.compute_f,
                            wd.compute_b, wd.compute_w, wd.layers)
    assert wb.comm[Axis.DP] == pytest.approx(tuple(x / m for x in once))
    assert wd.comm[Axis.DP] == pytest.approx(each)
    assert sum(wb.comm[Axis.DP]) < sum(wd.comm[Axis.DP])
    pb, pd = evaluate(breadth), evaluate(depth)
    assert pb.breakdown.dp_comm < pd.breakdown.dp_comm
    # without ZeRO-3 the two run the same stage work
    plain = {**kw, "zero": ZeroStage.OPTIMIZER}
    assert stage_work(make_plan(schedule=BFPP, **plain))[0].comm == stage_work(
        make_plan(schedule=Schedule.INTERLEAVED, **plain))[0].comm


def test_torchtitan_runs_it_by_its_class():
    from autoplan.export import Target, export

    plan = make_plan("llama3-8b", gpus=32, dp=8, pp=4, vpp=2, schedule=BFPP, micro_batch=1,
                     global_batch=64, zero=ZeroStage.OPTIMIZER, sequence_parallel=False)
    files = export(plan, Target.TORCHTITAN)
    assert 'pipeline_parallel_schedule = "LoopedBFS"' in files["torchtitan.toml"]
    assert "pipeline_schedule.csv" not in files  # torch has a class for it
