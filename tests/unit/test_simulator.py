"""The pipeline simulator against closed forms (Narayanan et al. 2021, Sec. 2.2), and
every schedule's operation order against the simulator's dependency checks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.schedules import Schedule
from autoplan.schedules.memory import peak_inflight
from autoplan.schedules.orders import stage_orders
from autoplan.schedules.simulator import compile_orders, run, simulate, simulate_exact


def uniform(p: int, f: float, b: float, w: float) -> tuple[list[float], list[float], list[float]]:
    return [f] * p, [b] * p, [w] * p


@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ONE_F_ONE_B])
@pytest.mark.parametrize(("p", "m"), [(2, 1), (4, 8), (8, 8), (8, 64), (3, 7)])
def test_uniform_stage_bubble_fraction_is_p_minus_1_over_m_plus_p_minus_1(schedule, p, m):
    f, b, w = 1.0, 1.5, 0.5  # the backward runs as one operation of b + w = 2
    r = simulate_exact(schedule, *uniform(p, f, b, w), m)
    assert r.makespan == pytest.approx((m + p - 1) * (f + b + w))
    bubble = (r.makespan - r.busy[0]) / r.makespan
    assert bubble == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize(("p", "m", "v"), [(4, 8, 2), (4, 16, 4), (8, 16, 3), (2, 4, 2)])
def test_interleaved_bubble_over_ideal_time_is_p_minus_1_over_v_m(p, m, v):
    """Narayanan et al. 2021, Sec. 2.2.2: bubble time fraction (p - 1) / (v m)."""
    f, b, w = 1.0, 1.5, 0.5  # per stage; each of the v chunks takes 1/v of it
    r = simulate_exact(Schedule.INTERLEAVED, *uniform(p, f / v, b / v, w / v), m, v)
    ideal = m * (f + b + w)
    assert (r.makespan - ideal) / ideal == pytest.approx((p - 1) / (v * m))


@pytest.mark.parametrize(("p", "m"), [(4, 8), (8, 3), (1, 5)])
def test_stage_0_holds_p_microbatches_in_1f1b_and_m_in_gpipe(p, m):
    durations = uniform(p, 1.0, 1.0, 1.0)
    assert simulate_exact(Schedule.ONE_F_ONE_B, *durations, m).peak_inflight[0] == min(p, m)
    assert simulate_exact(Schedule.GPIPE, *durations, m).peak_inflight[0] == m


def test_one_stage_has_no_bubble():
    r = simulate_exact(Schedule.ONE_F_ONE_B, [1.0], [1.5], [0.5], 5)
    assert r.makespan == pytest.approx(15.0)
    assert r.peak_inflight == (1,)


def _v(schedule: Schedule, v: int) -> int:
    if schedule is Schedule.INTERLEAVED:
        return v
    return 2 if schedule.v_shape else 1


@settings(max_examples=300, deadline=None)
@given(p=st.integers(1, 8), m=st.integers(1, 24), v=st.integers(1, 4),
       schedule=st.sampled_from(list(Schedule)),
       f=st.lists(st.floats(0.1, 3.0), min_size=8, max_size=8),
       b=st.lists(st.floats(0.1, 3.0), min_size=8, max_size=8),
       w=st.lists(st.floats(0.0, 3.0), min_size=8, max_size=8),
       latency=st.sampled_from([0.0, 0.3]))
def test_every_schedule_runs_to_completion_and_holds_its_closed_form_inflight_count(
        p, m, v, schedule, f, b, w, latency):
    v = _v(schedule, v)
    if schedule is Schedule.INTERLEAVED:
        m = -(-m // p) * p  # Megatron-LM's rule: p divides m
    r = simulate_exact(schedule, f[:p], b[:p], w[:p], m, v, p2p_latency_s=latency)
    # every stage does all its work; nothing finishes before the work it contains
    for s in range(p):
        assert r.busy[s] == pytest.approx(m * v * (f[s] + b[s] + w[s]))
        assert r.finish[s] >= r.busy[s] - 1e-9
    assert r.makespan == max(r.finish)
    assert r.peak_inflight == tuple(peak_inflight(schedule, p, m, v, s) for s in range(p))


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 5), m=st.integers(1, 12), schedule=st.sampled_from(list(Schedule)),
       f=st.floats(0.1, 3.0), b=st.floats(0.1, 3.0), w=st.floats(0.1, 3.0))
def test_a_trace_lists_every_operation_once_without_overlap_and_changes_nothing(
        p, m, schedule, f, b, w):
    v = _v(schedule, 2)
    if schedule is Schedule.INTERLEAVED:
        m = m * p
    plain = simulate_exact(schedule, *uniform(p, f, b, w), m, v)
    traced = simulate_exact(schedule, *uniform(p, f, b, w), m, v, trace=True)
    assert plain.events == ()
    assert (traced.makespan, traced.busy, traced.finish, traced.peak_inflight) == (
        plain.makespan, plain.busy, plain.finish, plain.peak_inflight)
    kinds = ("F", "B", "W") if schedule.splits_backward else ("F", "B")
    assert {e.kind for e in traced.events} == set(kinds)
    assert len(traced.events) == len(kinds) * p * v * m
    duration = {"F": f, "B": b if schedule.splits_backward else b + w, "W": w}
    for s in range(p):
        mine = [e for e in traced.events if e.stage == s]
        assert all(e.duration_s == pytest.approx(duration[e.kind]) for e in mine)
        assert all(x.end_s <= y.start_s + 1e-9 for x, y in zip(mine, mine[1:], strict=False))
        assert mine[-1].end_s == traced.finish[s]


def test_fused_schedules_report_one_backward_of_b_plus_w():
    r = simulate_exact(Schedule.ONE_F_ONE_B, *uniform(2, 1.0, 2.0, 3.0), 2, trace=True)
    assert [(e.kind, e.duration_s) for e in r.events if e.stage == 1] == [
        ("F", 1.0), ("B", 5.0), ("F", 1.0), ("B", 5.0)]


def test_a_p2p_latency_delays_each_crossing_of_gpipe_once_each_way():
    """GPipe: the fill crosses p - 1 links down and the drain p - 1 links up."""
    p, m, c = 4, 6, 0.25
    r = simulate_exact(Schedule.GPIPE, *uniform(p, 1.0, 1.5, 0.5), m, p2p_latency_s=c)
    assert r.makespan == pytest.approx((m + p - 1) * 3.0 + 2 * (p - 1) * c)


def test_a_p2p_latency_is_not_paid_where_the_v_turns_on_the_same_stage():
    one_stage = simulate_exact(Schedule.ZB_V, [1.0], [1.0], [1.0], 4, 2, p2p_latency_s=5.0)
    assert one_stage.makespan == pytest.approx(4 * 2 * 3.0)


def test_simulate_is_memoized_simulate_exact():
    args = (Schedule.ZB_H1, (1.0, 1.2), (1.0, 0.9), (0.5, 0.4), 6, 1)
    assert simulate(*args) is simulate(*args)
    assert simulate(*args) == simulate_exact(*args)


# --- the simulator refuses orders it cannot run ---------------------------------------------


def _orders_1f1b(p: int, m: int) -> list[list[tuple[str, int, int]]]:
    return stage_orders(Schedule.ONE_F_ONE_B, p, m)


def test_an_order_that_deadlocks_fails_an_assertion():
    orders = _orders_1f1b(2, 2)
    orders[1] = [("B", 0, 0), ("F", 0, 0), ("F", 1, 0), ("B", 1, 0)]  # B before its own F
    compiled = compile_orders(Schedule.ONE_F_ONE_B, 2, 2, 1, orders)
    with pytest.raises(AssertionError, match="deadlocks"):
        run(compiled, Schedule.ONE_F_ONE_B, *uniform(2, 1.0, 1.0, 1.0), 2)


def test_a_w_before_its_own_b_fails_an_assertion():
    orders = stage_orders(Schedule.ZB_H1, 2, 2)
    orders[0] = [("W", 0, 0)] + [op for op in orders[0] if op != ("W", 0, 0)]
    compiled = compile_orders(Schedule.ZB_H1, 2, 2, 1, orders)
    with pytest.raises(AssertionError, match="deadlocks"):
        run(compiled, Schedule.ZB_H1, *uniform(2, 1.0, 1.0, 1.0), 2)


@pytest.mark.parametrize(("change", "message"), [
    (lambda o: o[0].append(("F", 0, 0)), "runs twice"),
    (lambda o: o[1].remove(("B", 1, 0)), "never run"),
    (lambda o: o[0].append(("W", 0, 0)), "kinds are"),
    (lambda o: o[0].append(("F", 0, 1)), "chunk 1"),
])
def test_a_missing_duplicated_or_foreign_operation_fails_an_assertion(change, message):
    orders = _orders_1f1b(2, 2)
    change(orders)
    with pytest.raises(AssertionError, match=message):
        compile_orders(Schedule.ONE_F_ONE_B, 2, 2, 1, orders)


@pytest.mark.parametrize(("schedule", "p", "m", "v", "message"), [
    (Schedule.INTERLEAVED, 4, 6, 2, "multiple of p=4"),
    (Schedule.ZB_V, 4, 8, 1, "exactly 2 chunks"),
    (Schedule.V_MIN, 4, 8, 3, "exactly 2 chunks"),
    (Schedule.ZB_H2, 4, 8, 2, "one model chunk"),
    (Schedule.ONE_F_ONE_B, 4, 0, 1, "m >= 1"),
])
def test_an_undefined_p_m_v_raises_value_error(schedule, p, m, v, message):
    with pytest.raises(ValueError, match=message):
        simulate_exact(schedule, *uniform(p, 1.0, 1.0, 1.0), m, v)
    with pytest.raises(ValueError, match=message):
        peak_inflight(schedule, p, m, v, 0)


@pytest.mark.parametrize("schedule", list(Schedule))
def test_closed_form_inflight_counts_match_the_simulator_on_a_grid(schedule):
    """Exhaustive over p <= 10, m <= 30 (the counts depend on the order, not on times)."""
    for p in range(1, 11):
        for m in range(1, 31):
            for v in ((2, 3) if schedule is Schedule.INTERLEAVED else (_v(schedule, 1),)):
                if schedule is Schedule.INTERLEAVED and m % p:
                    continue
                r = simulate_exact(schedule, *uniform(p, 1.0, 1.0, 1.0), m, v)
                assert r.peak_inflight == tuple(
                    peak_inflight(schedule, p, m, v, s) for s in range(p)), (p, m, v)


@pytest.mark.parametrize("schedule", list(Schedule))
def test_every_schedules_own_orders_pass_the_checks_the_search_skips(schedule):
    """The search compiles the schedules' own orders unchecked (``_compiled_orders``):
    here each is checked (every operation once, on its chunk's stage) over p <= 10 and
    m <= 24, and compiles to the same thing either way."""
    from autoplan.schedules.simulator import _compiled_orders

    for p in range(1, 11):
        for m in range(1, 25):
            for v in ((2, 3, 4) if schedule is Schedule.INTERLEAVED else (_v(schedule, 1),)):
                try:
                    orders = stage_orders(schedule, p, m, v)
                except ValueError:  # not defined there (test_an_undefined_p_m_v_...)
                    continue
                assert compile_orders(schedule, p, m, v, orders) == _compiled_orders(
                    schedule, p, m, v), (p, m, v)
