"""The sweep's front as an SVG: days to train (x) against dollars (y), one point per
GPU count labelled with its count and layout; front points joined, the others hollow,
the chosen one ringed, a deadline and a budget drawn as dashed limits.

Pure: returns the SVG text. The x axis is logarithmic when the days span more than 4x
(doubling GPU counts halve the days, so points then sit evenly), else linear.
"""

from __future__ import annotations

from collections.abc import Sequence

from autoplan.svg import (  # the shared drawing, importable here as it was
    BOTTOM,
    CHOSEN,
    FONT,
    FRONT,
    HEIGHT,
    LEFT,
    LIMIT,
    OTHER,
    RIGHT,
    TOP,
    WIDTH,
    _axis,
    _fmt,
    _ticks,
    axes,
    escape,
    svg_open,
)
from autoplan.whatif.sweep import Point

__all__ = ["BOTTOM", "CHOSEN", "FONT", "FRONT", "HEIGHT", "LEFT", "LIMIT", "OTHER", "RIGHT", "TOP", "WIDTH",
           "_axis", "_fmt", "_ticks", "axes", "escape", "front_svg", "svg_open"]


def front_svg(points: Sequence[Point], front: Sequence[Point], chosen: Point | None,
              labels: dict[int, str], title: str, *, deadline_days: float | None = None,
              budget_usd: float | None = None) -> str:
    """``points``: every count's best plan; ``front``: the non-dominated ones; ``labels``:
    GPU count -> layout text."""
    assert points, "a front needs at least one point"
    money = all(p.economics.cost_usd is not None for p in points)
    xs = [p.economics.train_days for p in points] + ([deadline_days] if deadline_days else [])
    ys = [p.cost for p in points] + ([budget_usd] if budget_usd else [])
    x_lo, x_hi = min(xs), max(xs)
    log = x_hi / x_lo > 4
    if log:
        x_lo, x_hi = x_lo / 1.25, x_hi * 1.25
    else:
        pad = (x_hi - x_lo) * 0.1 or x_hi * 0.1
        x_lo, x_hi = max(0.0, x_lo - pad), x_hi + pad
    y_lo, y_hi = min(ys), max(ys)
    pad = (y_hi - y_lo) * 0.15 or y_hi * 0.1
    y_lo, y_hi = max(0.0, y_lo - pad), y_hi + pad
    fx = _axis(x_lo, x_hi, log, LEFT, WIDTH - RIGHT)
    fy = _axis(y_lo, y_hi, False, HEIGHT - BOTTOM, TOP)

    out = svg_open(title)
    out += axes((x_lo, x_hi, log), (y_lo, y_hi, money), fx, fy,
                f'days to train{" (log scale)" if log else ""}', "cost (USD)" if money else "GPU-hours")
    x0, x1, y0, y1 = LEFT, WIDTH - RIGHT, HEIGHT - BOTTOM, TOP
    # limits
    if deadline_days:
        x = fx(deadline_days)
        out.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y1}" stroke="{LIMIT}" '
                   f'stroke-dasharray="6 4"/>')
        out.append(f'<text x="{x + 4:.1f}" y="{y1 + 12}" fill="{LIMIT}">deadline '
                   f'{deadline_days:g} d</text>')
    if budget_usd:
        y = fy(budget_usd)
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}" stroke="{LIMIT}" '
                   f'stroke-dasharray="6 4"/>')
        out.append(f'<text x="{x1 - 4}" y="{y - 5:.1f}" text-anchor="end" fill="{LIMIT}">'
                   f'budget {_fmt(budget_usd, True)}</text>')
    # the front as a line, then every point
    on_front = {p.gpus for p in front}
    by_days = sorted(front, key=lambda p: p.economics.train_days)
    if len(by_days) > 1:
        path = " ".join(f"{fx(p.economics.train_days):.1f},{fy(p.cost):.1f}" for p in by_days)
        out.append(f'<polyline points="{path}" fill="none" stroke="{FRONT}" stroke-width="1.5"/>')
    for p in sorted(points, key=lambda p: p.gpus):
        x, y = fx(p.economics.train_days), fy(p.cost)
        if p.gpus in on_front:
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{FRONT}"/>')
        else:
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="white" '
                       f'stroke="{OTHER}" stroke-width="1.5"/>')
        if chosen is not None and p.gpus == chosen.gpus:
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="9" fill="none" '
                       f'stroke="{CHOSEN}" stroke-width="2"/>')
        label = f"{p.gpus} GPUs: {labels.get(p.gpus, '')}".rstrip(": ")
        out.append(f'<text x="{x + 10:.1f}" y="{y - 8:.1f}" '
                   f'fill="{"#222" if p.gpus in on_front else OTHER}">{escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
