"""The serving front as an SVG: tokens/s per user (x) against output tokens/s per GPU (y),
one point per deployment, the non-dominated ones joined and labelled, the chosen one ringed
(the throughput-interactivity trade-off of NVIDIA's and SemiAnalysis's inference charts).

Pure: returns the SVG text; axes and ticks as the training sweep's plot
draws them (:mod:`autoplan.svg`).
"""

from __future__ import annotations

from collections.abc import Sequence

from autoplan.serving.search import Ranked
from autoplan.svg import (
    BOTTOM,
    CHOSEN,
    FRONT,
    HEIGHT,
    LEFT,
    OTHER,
    RIGHT,
    TOP,
    WIDTH,
    axes,
    escape,
    svg_open,
)
from autoplan.svg import _axis as axis


def serving_front_svg(points: Sequence[Ranked], front: Sequence[Ranked], chosen: Ranked | None,
                      title: str, label_gpus: bool = False) -> str:
    """``points``: every deployment; ``front``: the non-dominated ones; ``label_gpus``:
    name each front point's GPU count too (a sweep over counts)."""
    assert points, "a front needs at least one point"
    xs = [r.user_tokens_per_s for r in points]
    ys = [r.per_gpu for r in points]
    x_lo, x_hi = min(xs), max(xs)
    y_lo, y_hi = min(ys), max(ys)
    px = (x_hi - x_lo) * 0.1 or max(x_hi * 0.1, 1.0)
    py = (y_hi - y_lo) * 0.1 or max(y_hi * 0.1, 1.0)
    x_lo, x_hi, y_lo, y_hi = max(0.0, x_lo - px), x_hi + px, max(0.0, y_lo - py), y_hi + py
    fx = axis(x_lo, x_hi, False, LEFT, WIDTH - RIGHT)
    fy = axis(y_lo, y_hi, False, HEIGHT - BOTTOM, TOP)
    out = svg_open(title)
    out += axes((x_lo, x_hi, False), (y_lo, y_hi, False), fx, fy, "tokens/s per user (1 / mean TPOT)",
                "output tokens/s per GPU")
    line = sorted(front, key=lambda r: r.user_tokens_per_s)
    if len(line) > 1:
        path = " ".join(f"{fx(r.user_tokens_per_s):.1f},{fy(r.per_gpu):.1f}" for r in line)
        out.append(f'<polyline points="{path}" fill="none" stroke="{FRONT}" stroke-width="1.5"/>')
    on_front = {id(r) for r in front}
    for r in points:
        x, y = fx(r.user_tokens_per_s), fy(r.per_gpu)
        if id(r) in on_front:
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{FRONT}"/>')
            name = r.plan.deployment.label()
            if label_gpus:
                name = f"{r.plan.deployment.gpus} GPUs: {name}"
            out.append(f'<text x="{x + 8:.1f}" y="{y - 6:.1f}" fill="#222">{escape(name)}</text>')
        else:
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="white" stroke="{OTHER}"/>')
        if chosen is not None and r is chosen:
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="8" fill="none" stroke="{CHOSEN}" '
                       'stroke-width="2"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
