"""The fronts of ``search --train-tokens --plot FILE.png`` and ``serve --plot FILE.png``
drawn with matplotlib (the optional ``png`` extra), as PNG bytes: the same points, line,
labels and limits as their SVGs (:mod:`autoplan.whatif.plot`,
:mod:`autoplan.serving.plot`), which need nothing installed.

Pure: returns the bytes. No pyplot (no global backend, no window): a Figure with its own
Agg canvas, as ``schedules.timeline.timeline_png`` draws the timeline. Text from user
files (model and cluster names, layout labels) is drawn as written, never as mathtext
(``parse_math=False``), with its control and format characters shown as escapes.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autoplan.errors import PNG_MISSING, AutoplanError
from autoplan.text import report_safe

if TYPE_CHECKING:
    from autoplan.serving.search import Ranked
    from autoplan.whatif.sweep import Point


# the SVGs' colours (autoplan.svg)
FRONT, OTHER, LIMIT, CHOSEN = "#4c78a8", "#9d9d9d", "#e45756", "#f58518"


def require_png() -> None:
    """Raise the error drawing a PNG would, before any work, where matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise AutoplanError(PNG_MISSING) from None


def _figure() -> tuple[Any, Any]:
    require_png()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.6, 4.4), dpi=150, layout="constrained")
    FigureCanvasAgg(fig)  # attaches itself to the figure
    ax = fig.add_subplot()
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.grid(True, color="#eeeeee")
    ax.set_axisbelow(True)
    return fig, ax


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})  # the same bytes every time
    return buf.getvalue()


def _money(v: float, _: Any = None) -> str:
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"${v / scale:.3g}{suffix}"
    return f"${v:.3g}"


def training_front_png(points: Sequence[Point], front: Sequence[Point], chosen: Point | None,
                       labels: dict[int, str], title: str, *, deadline_days: float | None = None,
                       budget_usd: float | None = None) -> bytes:
    """``search --train-tokens``'s front: days to train (x) against dollars, or GPU-hours
    where a price is missing (y); one point per GPU count labelled with its count and
    layout, the front joined, the others hollow, the chosen one ringed, a deadline and a
    budget as dashed limits. The x axis is logarithmic when the days span more than 4x."""
    assert points, "a front needs at least one point"
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    money = all(p.economics.cost_usd is not None for p in points)
    fig, ax = _figure()
    days = [p.economics.train_days for p in points] + ([deadline_days] if deadline_days else [])
    if max(days) / min(days) > 4:  # doubling GPU counts halve the days: points sit evenly
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))  # the SVG's 1-2-5
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    on_front = {p.gpus for p in front}
    line = sorted(front, key=lambda p: p.economics.train_days)
    if len(line) > 1:
        ax.plot([p.economics.train_days for p in line], [p.cost for p in line], color=FRONT,
                linewidth=1.5, zorder=2)
    for p in sorted(points, key=lambda p: p.gpus):
        x, y = p.economics.train_days, p.cost
        kept = p.gpus in on_front
        ax.scatter([x], [y], s=50, zorder=3, color=FRONT if kept else "white",
                   edgecolors=FRONT if kept else OTHER, linewidths=1.5)
        if chosen is not None and p.gpus == chosen.gpus:
            ax.scatter([x], [y], s=200, zorder=4, facecolors="none", edgecolors=CHOSEN, linewidths=2)
        label = f"{p.gpus} GPUs: {labels.get(p.gpus, '')}".rstrip(": ")
        ax.annotate(report_safe(label), (x, y), xytext=(8, 6), textcoords="offset points",
                    fontsize=8, color="#222222" if kept else OTHER, parse_math=False)
    if deadline_days:
        ax.axvline(deadline_days, color=LIMIT, linestyle="--", linewidth=1)
        ax.annotate(f"deadline {deadline_days:g} d", (deadline_days, 1), xycoords=("data", "axes fraction"),
                    xytext=(4, -12), textcoords="offset points", color=LIMIT, fontsize=8,
                    parse_math=False)
    if budget_usd:
        ax.axhline(budget_usd, color=LIMIT, linestyle="--", linewidth=1)
        ax.annotate(f"budget {_money(budget_usd)}", (1, budget_usd), xycoords=("axes fraction", "data"),
                    xytext=(-4, 4), textcoords="offset points", ha="right", color=LIMIT, fontsize=8,
                    parse_math=False)
    if money:
        # "$" escaped: a tick label with two would be read as mathtext
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _money(v).replace("$", r"\$")))
    ax.set_xlabel("days to train" + (" (log scale)" if ax.get_xscale() == "log" else ""),
                  parse_math=False)
    ax.set_ylabel("cost (USD)" if money else "GPU-hours", parse_math=False)
    ax.set_title(report_safe(title), loc="left", fontsize=10, fontweight="bold", parse_math=False)
    return _png(fig)


def serving_front_png(points: Sequence[Ranked], front: Sequence[Ranked], chosen: Ranked | None,
                      title: str, label_gpus: bool = False) -> bytes:
    """``serve``'s front: tokens/s per user (x) against output tokens/s per GPU (y), one
    point per deployment, the non-dominated ones joined and labelled (with their GPU count
    where ``label_gpus``: a sweep over counts), the chosen one ringed."""
    assert points, "a front needs at least one point"
    fig, ax = _figure()
    line = sorted(front, key=lambda r: r.user_tokens_per_s)
    if len(line) > 1:
        ax.plot([r.user_tokens_per_s for r in line], [r.per_gpu for r in line], color=FRONT,
                linewidth=1.5, zorder=2)
    on_front = {id(r) for r in front}
    for r in points:
        x, y = r.user_tokens_per_s, r.per_gpu
        kept = id(r) in on_front
        ax.scatter([x], [y], s=30 if kept else 18, zorder=3, color=FRONT if kept else "white",
                   edgecolors=FRONT if kept else OTHER, linewidths=1)
        if kept:
            name = r.plan.deployment.label()
            if label_gpus:
                name = f"{r.plan.deployment.gpus} GPUs: {name}"
            ax.annotate(report_safe(name), (x, y), xytext=(6, 5), textcoords="offset points",
                        fontsize=8, color="#222222", parse_math=False)
        if chosen is not None and r is chosen:
            ax.scatter([x], [y], s=160, zorder=4, facecolors="none", edgecolors=CHOSEN, linewidths=2)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("tokens/s per user (1 / mean TPOT)", parse_math=False)
    ax.set_ylabel("output tokens/s per GPU", parse_math=False)
    ax.set_title(report_safe(title), loc="left", fontsize=10, fontweight="bold", parse_math=False)
    return _png(fig)
