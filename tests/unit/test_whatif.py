"""Time-to-train, cost and energy (autoplan.whatif): hand calculations, the Pareto front's
invariants, constraints, GPU-count parsing, and a sweep run in parallel equal to one in turn."""

from __future__ import annotations

import dataclasses
import math
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.cost.evaluate import evaluate
from autoplan.descriptors.job import Job
from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.descriptors.space import load_space
from autoplan.errors import InputError
from autoplan.plan import TimeBreakdown
from autoplan.schedules import Schedule
from autoplan.search.engine import search
from autoplan.search.launchable import resolve_space
from autoplan.whatif.counts import MAX_COUNTS, parse_gpu_counts
from autoplan.whatif.economics import Economics, Objective, economics, mean_power_W
from autoplan.whatif.plot import front_svg
from autoplan.whatif.sweep import Point, constrain, meets, pareto_front, sweep
from tests.helpers import cpu_seconds, make_plan

# ----------------------------------------------------------------------------- economics


def test_economics_by_hand() -> None:
    """Llama 3 8B on 8 H100 (dp8): days, GPU-hours, dollars and MWh from the step's own
    numbers, computed here independently."""
    plan = make_plan(gpus=8, dp=8)
    pred = evaluate(plan)
    tokens, price = 1e11, 2.0
    e = economics(plan, pred, tokens, price)
    seconds = tokens / (64 * 4096 / pred.step_time_s)  # global batch x seq len per step
    assert e.train_days == pytest.approx(seconds / 86400)
    assert e.gpu_hours == pytest.approx(8 * seconds / 3600)
    assert e.cost_usd == pytest.approx(8 * seconds / 3600 * 2.0)
    # no pipeline: no bubble; the step waits on the host only for the stack's overhead
    b = pred.breakdown
    waiting = b.bubble + b.overhead
    watts = (700 * (pred.step_time_s - waiting) + 105 * waiting) / pred.step_time_s
    assert e.mean_power_W == pytest.approx(watts)
    assert e.energy_mwh == pytest.approx(8 * watts * seconds * 1.56 / 3.6e9)
    assert economics(plan, pred, tokens, None).cost_usd is None


def test_mean_power_lies_between_idle_and_load_and_falls_with_the_bubble() -> None:
    """A pipeline with few microbatches waits more of the step: its mean power is lower."""
    busy = make_plan(gpus=8, dp=2, pp=4, global_batch=64)  # 32 microbatches per pipeline
    idle = make_plan(gpus=8, dp=2, pp=4, global_batch=8)  # 4: a bubble of 3/7 (GPipe-like)
    p_busy = mean_power_W(busy, evaluate(busy))
    p_idle = mean_power_W(idle, evaluate(idle))
    assert p_busy is not None and p_idle is not None
    assert 105 < p_idle < p_busy < 700


def test_no_power_figures_no_energy() -> None:
    plan = make_plan(gpus=8, dp=8)
    device = dataclasses.replace(plan.cluster.device, power_load_W=None, power_idle_W=None)
    plan = dataclasses.replace(plan, cluster=dataclasses.replace(plan.cluster, device=device))
    e = economics(plan, evaluate(plan), 1e9, 1.0)
    assert e.energy_mwh is None and e.mean_power_W is None


def test_built_in_devices_carry_power_and_clusters_a_pue() -> None:
    for name in ("dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200", "gb200-nvl72", "mi300x-node",
                 "frontier", "gh200-node", "l40s-node", "rtx-pro-6000-node", "dgx-b300", "gb300-nvl72"):
        cluster = resolve_cluster(name)
        dev = cluster.device
        assert dev.power_load_W is not None and dev.power_idle_W is not None
        assert 0 < dev.power_idle_W < dev.power_load_W
        assert 1.0 <= cluster.pue < 2.0
    assert resolve_cluster("dgx-h100").device.price_per_gpu_hour == 3.24


# ----------------------------------------------------------------------------- the front


def _point(gpus: int, days: float, cost: float, energy: float = 1.0) -> Point:
    e = Economics(gpus=gpus, step_time_s=1.0, tokens_per_s=1.0, train_days=days,
                  gpu_hours=cost / 2, cost_usd=cost, energy_mwh=energy, mean_power_W=500.0)
    return Point(None, None, e)  # type: ignore[arg-type]  # the front reads economics only


def _dominates(a: Point, b: Point) -> bool:
    ea, eb = a.economics, b.economics
    assert ea.cost_usd is not None and eb.cost_usd is not None
    return (ea.train_days <= eb.train_days and ea.cost_usd <= eb.cost_usd
            and (ea.train_days < eb.train_days or ea.cost_usd < eb.cost_usd))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 60), st.integers(1, 60)), min_size=1, max_size=12))
def test_front_is_exactly_the_non_dominated_points(values: list[tuple[int, int]]) -> None:
    points = [_point(8 * (i + 1), d, c) for i, (d, c) in enumerate(values)]
    front = pareto_front(points)
    assert [p.gpus for p in front] == sorted(p.gpus for p in front)
    for p in front:
        assert not any(_dominates(q, p) for q in points)
    for p in points:
        if p not in front:  # dominated, or a duplicate of a point with fewer GPUs
            assert any(_dominates(q, p) or (q.economics == dataclasses.replace(
                p.economics, gpus=q.gpus) and q.gpus < p.gpus) for q in front)


def test_front_drops_a_dominated_count() -> None:
    """More GPUs that are no faster (communication-bound) and dearer leave the front."""
    points = [_point(64, 20, 100), _point(128, 10, 110), _point(256, 10.5, 200)]
    assert [p.gpus for p in pareto_front(points)] == [64, 128]


def test_constraints_say_which_binds() -> None:
    front = [_point(64, 40, 100), _point(128, 20, 110), _point(256, 10, 130)]
    free = constrain(front, Objective.TIME)
    assert free.chosen is front[2] and free.binding == () and free.reason == ""
    late = constrain(front, Objective.COST, deadline_days=25)
    assert late.chosen is front[1] and late.binding == ("deadline",)
    assert "deadline binds" in late.reason and "128 GPUs" in late.reason
    poor = constrain(front, Objective.TIME, budget_usd=120)
    assert poor.chosen is front[1] and poor.binding == ("budget",)
    loose = constrain(front, Objective.TIME, deadline_days=100, budget_usd=1000)
    assert loose.chosen is front[2] and loose.binding == () and "do not bind" in loose.reason
    none = constrain(front, Objective.TIME, deadline_days=5, budget_usd=90)
    assert none.chosen is None and none.kept == ()
    assert none.binding == ("deadline", "budget")
    assert "no GPU count meets" in none.reason and "10.0 days" in none.reason


def test_energy_objective_ranks_by_energy() -> None:
    front = [_point(64, 40, 100, energy=5.0), _point(128, 20, 110, energy=4.0)]
    assert constrain(front, Objective.ENERGY).chosen is front[1]
    assert constrain(front, Objective.COST).chosen is front[0]


# ----------------------------------------------------------------------------- counts


def test_gpu_counts() -> None:
    assert parse_gpu_counts("64..1024") == (64, 128, 256, 512, 1024)
    assert parse_gpu_counts("96..1000") == (96, 192, 384, 768)
    assert parse_gpu_counts("256, 64,128,64") == (64, 128, 256)
    assert parse_gpu_counts("8") == (8,)


@pytest.mark.parametrize("text", [
    "0", "1..1000000000000", "64..32", "sixty-four", "64;128", "1e3", "-8", "1..", "..8",
    ",".join(str(8 * i) for i in range(1, MAX_COUNTS + 2)), "8," * 300, "9" * 13,
    "4194304",
])
def test_bad_gpu_counts_are_refused_fast(text: str) -> None:
    with cpu_seconds() as took, pytest.raises(InputError) as err:
        parse_gpu_counts(text)
    assert took[0] < 0.1
    assert str(err.value).startswith("--gpus")


# ----------------------------------------------------------------------------- sweep


def _small_sweep(jobs: int | None, **kw: object):  # type: ignore[no-untyped-def]
    base = resolve_cluster("dgx-h100")
    clusters = [with_gpus(base, n) for n in (8, 16, 32)]
    return sweep(resolve_model("llama3-8b"), clusters, Job(global_batch=64, seq_len=4096),
                 load_space("default"), train_tokens=1e11, top_k=3, jobs=jobs, **kw)


def test_sweep_in_parallel_equals_in_turn_and_its_front_holds() -> None:
    one, two = _small_sweep(1), _small_sweep(2)
    assert [p.economics for p in one.points] == [p.economics for p in two.points]
    assert [p.plan for p in one.points] == [p.plan for p in two.points]
    assert one.counts == (8, 16, 32) and len(one.points) == 3
    # each count's point is its search's best (time objective: the fastest plan)
    for p, n in zip(one.points, one.counts, strict=True):
        best = search(resolve_model("llama3-8b"), with_gpus(resolve_cluster("dgx-h100"), n),
                      Job(global_batch=64, seq_len=4096), load_space("default"), top_k=1)
        assert p.prediction.step_time_s == best.plans[0].prediction.step_time_s
    days = [p.economics.train_days for p in one.front]
    assert days == sorted(days, reverse=True)  # more GPUs, fewer days
    for p in one.points:
        assert p.economics.gpu_hours == pytest.approx(p.gpus * p.economics.train_days * 24)
    ranked = one.ranked()
    keys = [p.economics.key(Objective.TIME) for p in ranked]
    assert keys == sorted(keys) and ranked[0].gpus == 32


@pytest.mark.parametrize("objective,limits,space", [
    (Objective.TIME, {}, "default"),
    (Objective.COST, {}, "default"),
    (Objective.TIME, {"deadline_days": 60.0}, "default"),  # 32 GPUs' plans meet it, 8's and 16's miss it
    (Objective.COST, {"budget_usd": 9e4}, "default"),
    # the launchers' union: its later parts cut off at the union's k-th best and, with the
    # sweep's ceiling, at its best or the ceiling (search/launchable.py)
    (Objective.TIME, {}, "launchable"),
    (Objective.COST, {"budget_usd": 9e4}, "launchable"),
])
def test_a_sweep_searching_only_what_its_top_k_can_use_ranks_the_same(
        monkeypatch: pytest.MonkeyPatch, objective: Objective, limits: dict[str, float],
        space: str) -> None:
    """Each count's search is asked only for plans that can enter the sweep's top k (by
    the objective, among those meeting the deadline and budget) or be the count's best:
    the ranked plans that meet them, the points and the front are those of every count's
    own top k, and the capped searches evaluate no more plans."""
    from autoplan.whatif import sweep as sweep_module

    def run(capped: bool):  # type: ignore[no-untyped-def]
        if not capped:
            monkeypatch.setattr(sweep_module._Wanted, "make", classmethod(lambda cls, *a: None))
        else:
            monkeypatch.undo()
        base = resolve_cluster("dgx-h100")
        return sweep(resolve_model("llama3-8b"), [with_gpus(base, n) for n in (8, 16, 32)],
                     Job(global_batch=64, seq_len=4096), resolve_space(space),
                     train_tokens=1e12, top_k=4, jobs=1, objective=objective, **limits)

    full, capped = run(False), run(True)
    deadline, budget = limits.get("deadline_days"), limits.get("budget_usd")

    def wanted(result):  # type: ignore[no-untyped-def]
        return [(p.plan, p.prediction) for p in result.ranked()
                if all(meets(p, deadline, budget))][:4]

    assert wanted(capped) == wanted(full) and len(wanted(full)) > 0
    assert [(p.plan, p.economics) for p in capped.points] == \
        [(p.plan, p.economics) for p in full.points]
    assert [p.plan for p in capped.front] == [p.plan for p in full.front]
    # the most GPUs are searched first: by time their plans are the fastest and the other
    # counts' searches stop at them (by cost they are the dearest here: no saving)
    assert capped.stats().evaluated <= full.stats().evaluated
    if objective is Objective.TIME:
        assert capped.stats().evaluated < full.stats().evaluated


def test_a_capped_sweep_counts_the_same_work_in_turn_and_in_parallel() -> None:
    """Each count's ceiling is fixed before its search starts, whichever process runs it:
    the whole answer, its counts included, is the same in one process and in two."""
    base = resolve_cluster("dgx-h100")

    def run(jobs: int):  # type: ignore[no-untyped-def]
        return sweep(resolve_model("llama3-8b"), [with_gpus(base, n) for n in (8, 16, 32, 64)],
                     Job(global_batch=64, seq_len=4096), load_space("default"),
                     train_tokens=1e12, top_k=3, jobs=jobs)

    one, two = run(1), run(2)
    assert one.results == two.results
    assert one.stats() == two.stats()


def test_counts_too_small_for_the_model_searched_last_change_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where some counts cannot hold one bf16 copy of the weights and gradients (Llama 3 70B
    on 2 H100), they are dealt after the others (``forking.deal``'s ``last``): the answer and
    its counts are those of the sweep in turn."""
    from autoplan import forking

    dealt: list[tuple[list[int], list[int]]] = []
    deal = forking.deal

    def seen(order, work, told=None, workers=None, ended=None, last=()):  # type: ignore[no-untyped-def]
        dealt.append((list(order), list(last)))
        return deal(order, work, told, workers, ended, last)

    monkeypatch.setattr(forking, "deal", seen)
    base = resolve_cluster("dgx-h100")

    def run(jobs: int):  # type: ignore[no-untyped-def]
        return sweep(resolve_model("llama3-70b"), [with_gpus(base, n) for n in (2, 8, 16)],
                     Job(global_batch=32, seq_len=4096), load_space("default"),
                     train_tokens=1e11, top_k=3, jobs=jobs)

    one = run(1)
    if forking.dealt_to(3, 2) == 1:
        pytest.skip("one process here: nothing is dealt")
    two = run(2)
    assert dealt[-1] == ([1, 2], [0])
    assert one.results == two.results and one.stats() == two.stats()
    assert one.counts == (2, 8, 16) and not one.results[0].plans and one.points


def test_a_search_keeps_its_best_whatever_its_ceiling_says() -> None:
    """A ceiling that wants nothing still gets the search's best plan (its count's point)."""
    args = (resolve_model("llama3-8b"), with_gpus(resolve_cluster("dgx-h100"), 16),
            Job(global_batch=64, seq_len=4096), load_space("default"))
    best = search(*args, top_k=1).plans[0]
    asked = []
    found = search(*args, top_k=5, ceiling=lambda r: asked.append(r) or 0.0)
    assert found.plans[0] == best and asked
    assert all(r.prediction.step_time_s == best.prediction.step_time_s for r in found.plans)


def test_sweep_price_override_scales_cost_only() -> None:
    base, cheap = _small_sweep(1), _small_sweep(1, price_per_gpu_hour=1.0)
    for a, b in zip(base.points, cheap.points, strict=True):
        assert a.economics.cost_usd == pytest.approx(b.economics.cost_usd * 3.24)
        assert a.economics.train_days == b.economics.train_days


# ----------------------------------------------------------------------------- picture


def test_front_svg_is_well_formed_and_labels_every_point() -> None:
    points = [_point(64, 40, 1e5), _point(128, 20, 1.1e5), _point(256, 21, 1.3e5)]
    front = pareto_front(points)
    svg = front_svg(points, front, front[1], {64: "dp64", 128: "dp128", 256: "dp<256>"},
                    "t & t", deadline_days=30, budget_usd=1.2e5)
    root = ET.fromstring(svg)
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "64 GPUs: dp64" in texts and "256 GPUs: dp<256>" in texts and "t & t" in texts
    assert any(t and t.startswith("deadline") for t in texts)
    assert any(t and t.startswith("budget") for t in texts)
    assert front_svg(points, front, None, {}, "t") == front_svg(points, front, None, {}, "t")


def test_breakdown_split_is_the_step() -> None:
    """The energy split leans on the breakdown summing to the step time."""
    plan = make_plan(gpus=8, dp=2, pp=4, schedule=Schedule.ONE_F_ONE_B)
    pred = evaluate(plan)
    assert isinstance(pred.breakdown, TimeBreakdown)
    assert math.isclose(pred.breakdown.total, pred.step_time_s, rel_tol=1e-9)
