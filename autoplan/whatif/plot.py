"""The sweep's front as an SVG: days to train (x) against dollars (y), one point per
GPU count labelled with its count and layout; front points joined, the others hollow,
the chosen one ringed, a deadline and a budget drawn as dashed limits.

Pure: returns the SVG text. The x axis is logarithmic when the days span more than 4x
(doubling GPU counts halve the days, so points then sit evenly), else linear.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape as _escape

from autoplan.text import xml_safe
from autoplan.whatif.sweep import Point

WIDTH, HEIGHT = 760, 440
LEFT, RIGHT, TOP, BOTTOM = 90, 200, 40, 60
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
FRONT, OTHER, LIMIT, CHOSEN = "#4c78a8", "#9d9d9d", "#e45756", "#f58518"


def escape(text: str) -> str:
    """``text`` as SVG character data: markup escaped, characters XML cannot hold shown
    as ``\\xNN`` (a name or path may hold any)."""
    return _escape(xml_safe(text))


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    """Round tick values covering [lo, hi]: 1-2-5 steps, or 1-2-5 per decade on a log axis."""
    if log:
        out = []
        for decade in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
            for m in (1, 2, 5):
                v = m * 10.0 ** decade
                if lo <= v <= hi:
                    out.append(v)
        return out or [lo, hi]
    raw = (hi - lo) / 5 or abs(hi) or 1.0
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 5, 10) if raw <= m * step)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt(v: float, money: bool) -> str:
    prefix = "$" if money else ""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{prefix}{v / scale:.3g}{suffix}"
    return f"{prefix}{v:.3g}"


def _axis(lo: float, hi: float, log: bool, a: float, b: float) -> Callable[[float], float]:
    if log:
        llo, lhi = math.log10(lo), math.log10(hi)
        return lambda v: a + (math.log10(v) - llo) / (lhi - llo) * (b - a)
    return lambda v: a + (v - lo) / (hi - lo) * (b - a)


def svg_open(title: str) -> list[str]:
    """An SVG of the plot's size on white, with its title (escaped)."""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="{FONT}" font-size="12">',
            f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
            f'<text x="{LEFT}" y="22" font-size="14" font-weight="bold">{escape(title)}</text>']


def axes(x: tuple[float, float, bool], y: tuple[float, float, bool], fx: Callable[[float], float],
         fy: Callable[[float], float], x_label: str, y_label: str) -> list[str]:
    """The axes, the grid at round ticks and the labels: ``x`` (lo, hi, logarithmic) and
    ``y`` (lo, hi, in dollars), mapped to the plot by ``fx`` and ``fy``."""
    x0, x1, y0, y1 = LEFT, WIDTH - RIGHT, HEIGHT - BOTTOM, TOP
    out = [f'<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="#222"/>',
           f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="#222"/>']
    for v in _ticks(x[0], x[1], x[2]):
        px = fx(v)
        out.append(f'<line x1="{px:.1f}" y1="{y0}" x2="{px:.1f}" y2="{y1}" stroke="#eee"/>')
        out.append(f'<text x="{px:.1f}" y="{y0 + 16}" text-anchor="middle">{_fmt(v, False)}</text>')
    for v in _ticks(y[0], y[1], False):
        py = fy(v)
        out.append(f'<line x1="{x0}" y1="{py:.1f}" x2="{x1}" y2="{py:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{x0 - 6}" y="{py + 4:.1f}" text-anchor="end">{_fmt(v, y[2])}</text>')
    out.append(f'<text x="{(x0 + x1) / 2}" y="{HEIGHT - 18}" text-anchor="middle">{escape(x_label)}</text>')
    out.append(f'<text x="20" y="{(y0 + y1) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 20 {(y0 + y1) / 2})">{escape(y_label)}</text>')
    return out


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
