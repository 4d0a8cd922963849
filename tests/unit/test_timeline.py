"""The timeline picture of a simulated schedule: SVG, rich, PNG, and the idle shares in its legend."""

from __future__ import annotations

import io
import sys
import xml.etree.ElementTree as ET

import pytest
from rich.console import Console

from autoplan.errors import AutoplanError
from autoplan.schedules.events import Event
from autoplan.schedules.timeline import idle_fraction, timeline_png, timeline_rich, timeline_svg

SVG = "{http://www.w3.org/2000/svg}"


def ev(stage: int, kind: str, mb: int, start: float, end: float, chunk: int = 0) -> Event:
    return Event(stage=stage, kind=kind, microbatch=mb, chunk=chunk, start_s=start, end_s=end)


# 1F1B with p = 2 stages, m = 3 microbatches, F = 1 ms, B = 2 ms, worked by hand:
#   stage 0: F0 [0,1] F1 [1,2] . . B0 [4,6] F2 [6,7] B1 [7,9] . B2 [10,12]
#   stage 1: . F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7] F2 [7,8] B2 [8,10] . .
# makespan (m + p - 1)(F + B) = 12 ms; each stage computes m (F + B) = 9 ms, idle 3 ms.
MS = 1e-3
ONE_F_ONE_B = [
    ev(0, "F", 0, 0 * MS, 1 * MS), ev(0, "F", 1, 1 * MS, 2 * MS), ev(0, "B", 0, 4 * MS, 6 * MS),
    ev(0, "F", 2, 6 * MS, 7 * MS), ev(0, "B", 1, 7 * MS, 9 * MS), ev(0, "B", 2, 10 * MS, 12 * MS),
    ev(1, "F", 0, 1 * MS, 2 * MS), ev(1, "B", 0, 2 * MS, 4 * MS), ev(1, "F", 1, 4 * MS, 5 * MS),
    ev(1, "B", 1, 5 * MS, 7 * MS), ev(1, "F", 2, 7 * MS, 8 * MS), ev(1, "B", 2, 8 * MS, 10 * MS),
]

# A split backward (B then W) on two chunks, to exercise W and chunk shades.
SPLIT_TWO_CHUNKS = [
    ev(0, "F", 0, 0.0, 1.0), ev(0, "F", 0, 1.0, 2.0, chunk=1),
    ev(0, "B", 0, 2.0, 3.0, chunk=1), ev(0, "W", 0, 3.0, 4.0, chunk=1),
    ev(0, "B", 0, 4.0, 5.0), ev(0, "W", 0, 5.0, 6.0),
]


def event_rects(root: ET.Element) -> list[ET.Element]:
    return [r for r in root.iter(f"{SVG}rect") if r.get("class") == "event"]


def test_idle_fraction_of_the_hand_worked_1f1b_is_p_minus_1_over_m_plus_p_minus_1():
    assert idle_fraction(ONE_F_ONE_B, 2) == pytest.approx((0.25, 0.25))


def test_idle_fraction_counts_a_stage_without_events_as_wholly_idle():
    assert idle_fraction(ONE_F_ONE_B[:6], 2) == pytest.approx((0.25, 1.0))


def test_idle_fraction_of_no_events_is_zero_on_every_stage():
    assert idle_fraction([], 3) == (0.0, 0.0, 0.0)


def test_svg_is_a_standalone_document_with_a_namespace_and_viewbox():
    root = ET.fromstring(timeline_svg(ONE_F_ONE_B, 2))
    assert root.tag == f"{SVG}svg"
    assert root.get("viewBox", "").startswith("0 0 ")


def test_svg_has_one_row_group_per_stage_with_stage_0_on_top():
    root = ET.fromstring(timeline_svg(ONE_F_ONE_B, 2))
    groups = [g for g in root.iter(f"{SVG}g") if g.get("class") == "stage"]
    assert [g.get("id") for g in groups] == ["stage-0", "stage-1"]
    tops = [float(next(r for r in g.iter(f"{SVG}rect") if r.get("class") == "idle").get("y", ""))
            for g in groups]
    assert tops[0] < tops[1]


def test_svg_draws_one_rect_per_event_in_that_events_stage_row():
    root = ET.fromstring(timeline_svg(ONE_F_ONE_B, 2))
    assert len(event_rects(root)) == len(ONE_F_ONE_B)
    for g in root.iter(f"{SVG}g"):
        if g.get("class") == "stage":
            assert len(event_rects(g)) == 6


def test_svg_box_widths_are_proportional_to_durations():
    root = ET.fromstring(timeline_svg(ONE_F_ONE_B, 2))
    widths = {r.get("data-kind"): float(r.get("width", "")) for r in event_rects(root)}
    assert widths["B"] / widths["F"] == pytest.approx(2.0, rel=1e-3)


def test_svg_boxes_are_placed_at_their_start_times():
    root = ET.fromstring(timeline_svg(ONE_F_ONE_B, 2))
    xs = sorted(float(r.get("x", "")) for r in event_rects(root))
    unit = xs[1] - xs[0]  # stage 0's F0 at 0 ms and F1 at 1 ms (stage 1's F0 also at 1 ms)
    assert xs[-1] - xs[0] == pytest.approx(10 * unit, rel=1e-3)  # stage 0's B2 starts at 10 ms


def test_svg_labels_the_axis_in_milliseconds_for_a_millisecond_step():
    svg = timeline_svg(ONE_F_ONE_B, 2)
    assert "time (ms)" in svg
    assert "makespan 12.0 ms" in svg


def test_svg_shows_each_stages_idle_share():
    texts = [t.text for t in ET.fromstring(timeline_svg(ONE_F_ONE_B, 2)).iter(f"{SVG}text")]
    assert texts.count("25.0% idle") == 2


def test_svg_escapes_xml_special_characters_in_the_title():
    title = 'a <b> & "c" \'d\''
    root = ET.fromstring(timeline_svg(ONE_F_ONE_B, 2, title=title))
    titles = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "title"]
    assert titles == [title]


def test_svg_drops_control_characters_xml_cannot_hold_from_the_title():
    root = ET.fromstring(timeline_svg(ONE_F_ONE_B, 2, title="plan\x00 \x1b[1mA"))
    assert [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "title"] == ["plan [1mA"]


def test_svg_is_byte_identical_across_calls_and_input_orders():
    first = timeline_svg(ONE_F_ONE_B, 2, title="1F1B")
    assert timeline_svg(ONE_F_ONE_B, 2, title="1F1B") == first
    assert timeline_svg(list(reversed(ONE_F_ONE_B)), 2, title="1F1B") == first


def test_svg_gives_each_chunk_a_distinct_shade_of_its_kinds_colour():
    fills = {(r.get("data-kind"), r.get("fill")) for r in event_rects(
        ET.fromstring(timeline_svg(SPLIT_TWO_CHUNKS, 1)))}
    assert len(fills) == 6  # F, B, W each in two shades
    assert {kind for kind, _ in fills} == {"F", "B", "W"}


def test_svg_legend_names_w_only_when_the_backward_is_split():
    assert "W backward (weight grad)" in timeline_svg(SPLIT_TWO_CHUNKS, 1)
    assert "weight grad" not in timeline_svg(ONE_F_ONE_B, 2)


def test_svg_of_no_events_still_parses():
    root = ET.fromstring(timeline_svg([], 2))
    assert event_rects(root) == []


def render(renderable) -> str:
    console = Console(file=io.StringIO(), record=True, width=120, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_rich_timeline_has_one_line_per_stage_an_axis_and_a_legend_in_a_plain_console():
    text = render(timeline_rich(ONE_F_ONE_B, 2, width=96))
    lines = text.splitlines()
    assert [line.split()[:2] for line in lines[:2]] == [["stage", "0"], ["stage", "1"]]
    assert len(lines) == 4
    assert "12.0 ms" in lines[2]
    assert "F forward" in lines[3] and "B backward" in lines[3] and "idle" in lines[3]


def test_rich_cells_show_the_kind_that_fills_them():
    # 96 cells over 12 ms: 8 cells per ms
    lines = render(timeline_rich(ONE_F_ONE_B, 2, width=96)).splitlines()
    cells = [line[len("stage 0 "):len("stage 0 ") + 96] for line in lines[:2]]
    assert cells[0] == "F" * 16 + "·" * 16 + "B" * 16 + "F" * 8 + "B" * 16 + "·" * 8 + "B" * 16
    assert cells[1] == "·" * 8 + "F" * 8 + "B" * 16 + "F" * 8 + "B" * 16 + "F" * 8 + "B" * 16 + "·" * 16
    assert lines[0].rstrip().endswith("25.0% idle")


def test_rich_cell_goes_to_idle_when_idle_fills_most_of_it():
    # 3 cells of 4 ms: stage 0's first cell is half F, half idle (a tie goes to the work)
    lines = render(timeline_rich(ONE_F_ONE_B, 2, width=3)).splitlines()
    assert lines[0][len("stage 0 "):][:3] == "FBB"
    events = [ev(0, "F", 0, 0.0, 1.0), ev(0, "B", 0, 2.6, 3.0)]  # last cell is 60 % idle
    assert render(timeline_rich(events, 1, width=3)).splitlines()[0][len("stage 0 "):][:3] == "F··"


def test_rich_writes_later_chunks_in_lower_case():
    lines = render(timeline_rich(SPLIT_TWO_CHUNKS, 1, width=6)).splitlines()
    assert lines[0][len("stage 0 "):][:6] == "FfbwBW"
    assert "W backward (weight grad)" in lines[2]


def test_png_without_matplotlib_raises_a_clear_autoplan_error(monkeypatch, tmp_path):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(AutoplanError, match=r'PNG needs matplotlib: pip install "autoplan\[png\]"'):
        timeline_png(ONE_F_ONE_B, 2)


def test_png_with_matplotlib_is_a_png():
    pytest.importorskip("matplotlib")
    png = timeline_png(SPLIT_TWO_CHUNKS + [ev(1, "F", 0, 1.0, 2.0)], 2, title="a <title> & more")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
