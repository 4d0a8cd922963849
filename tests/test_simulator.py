"""The pipeline simulator against closed forms (Narayanan et al. 2021, Sec. 2.2)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.schedules.simulator import simulate_exact
from autoplan.search.engine import inflight_chunks
from autoplan.vocab import Schedule


@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ONE_F_ONE_B])
@pytest.mark.parametrize(("p", "m"), [(2, 1), (4, 8), (8, 8), (8, 64), (3, 7)])
def test_uniform_stage_bubble_fraction_is_p_minus_1_over_m_plus_p_minus_1(schedule, p, m):
    f, b = 1.0, 2.0
    r = simulate_exact(schedule, [f] * p, [b] * p, m)
    assert r.makespan == pytest.approx((m + p - 1) * (f + b))
    bubble = (r.makespan - r.busy[0]) / r.makespan
    assert bubble == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize(("p", "m", "v"), [(4, 8, 2), (4, 16, 4), (8, 16, 3), (2, 4, 2)])
def test_interleaved_bubble_over_ideal_time_is_p_minus_1_over_v_m(p, m, v):
    """Narayanan et al. 2021, Sec. 2.2.2: bubble time fraction (p - 1) / (v m)."""
    f, b = 1.0, 2.0  # per stage; each of the v chunks takes 1/v of it
    r = simulate_exact(Schedule.INTERLEAVED, [f / v] * p, [b / v] * p, m, v)
    ideal = m * (f + b)
    assert (r.makespan - ideal) / ideal == pytest.approx((p - 1) / (v * m))


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 8), k=st.integers(1, 4), v=st.integers(1, 4),
       schedule=st.sampled_from([Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED]),
       f=st.lists(st.floats(0.1, 3.0), min_size=8, max_size=8),
       b=st.lists(st.floats(0.1, 6.0), min_size=8, max_size=8))
def test_every_schedule_runs_to_completion_and_holds_its_closed_form_inflight_count(
        p, k, v, schedule, f, b):
    if schedule is Schedule.INTERLEAVED and (p < 2 or v < 2):
        return
    if schedule is not Schedule.INTERLEAVED:
        v = 1
    m = k * p
    r = simulate_exact(schedule, f[:p], b[:p], m, v)
    # every stage does all its work; nothing finishes before the work it contains
    for s in range(p):
        assert r.busy[s] == pytest.approx(m * v * (f[s] + b[s]))
        assert r.finish[s] >= r.busy[s] - 1e-9
    assert r.peak_inflight == tuple(inflight_chunks(schedule, p, m, v, s) for s in range(p))


def test_one_stage_has_no_bubble():
    r = simulate_exact(Schedule.ONE_F_ONE_B, [1.0], [2.0], 5)
    assert r.makespan == pytest.approx(15.0)
    assert r.peak_inflight == (1,)
