"""The SVG drawing the fronts' plots share (:mod:`autoplan.whatif.plot`'s training sweep,
:mod:`autoplan.serving.plot`'s serving front): the canvas, its colours, axes with round
ticks (1-2-5 steps, or per decade on a log axis) and text escaped as SVG character data.

Pure: returns SVG text, knows nothing of plans; on the base floor, so neither plot imports
the other's package.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from html import escape as _escape

from autoplan.text import xml_safe

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
