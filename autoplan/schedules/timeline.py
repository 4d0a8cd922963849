"""A simulated pipeline step drawn as a per-stage timeline: SVG, rich, PNG.

One row per pipeline stage (stage 0 on top), time on the x axis, one box per
:class:`Event` coloured by kind (F forward, B input-gradient backward, W
weight-gradient; later model chunks of interleaved schedules in lighter shades
of the same hue), idle time as the light-grey background. This is the picture
of Narayanan et al. 2021, Fig. 3-4, drawn from the simulator's own trace.

Everything here is pure: functions return text, PNG bytes or a rich renderable.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from html import escape

from rich.console import Group, RenderableType
from rich.text import Text

from autoplan.errors import PNG_MISSING, AutoplanError
from autoplan.schedules.events import Event

KINDS = ("F", "B", "W")
KIND_BASE = {"F": "#4c78a8", "B": "#54a24b", "W": "#f58518"}  # blue, green, orange
IDLE_FILL = "#e6e6e6"
IDLE_TEXT = "#7f7f7f"
TEXT_FILL = "#222222"
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
_LIGHTEST = 0.5  # how far toward white the last chunk's shade goes


# --- shared facts ---------------------------------------------------------------------------


def _check(events: Sequence[Event], stages: int) -> None:
    assert stages >= 1, f"a timeline needs at least one stage, got {stages}"
    for e in events:
        assert 0 <= e.stage < stages, f"event on stage {e.stage}, timeline has {stages}"
        assert e.kind in KIND_BASE, f"event kind {e.kind!r} is not one of {KINDS}"
        assert e.end_s >= e.start_s, f"event ends before it starts: {e}"


def _span(events: Sequence[Event]) -> tuple[float, float]:
    """(start, makespan) in seconds: from the first operation's start to the last one's end."""
    if not events:
        return 0.0, 0.0
    t0 = min(e.start_s for e in events)
    return t0, max(e.end_s for e in events) - t0


def _busy_s(events: Sequence[Event], stage: int) -> float:
    """Seconds the stage is occupied: the union of its events' intervals."""
    busy, reach = 0.0, -math.inf
    for start, end in sorted((e.start_s, e.end_s) for e in events if e.stage == stage):
        if end > reach:
            busy += end - max(start, reach)
            reach = end
    return busy


def idle_fraction(events: Sequence[Event], stages: int) -> tuple[float, ...]:
    """Per stage, idle time over the makespan: the stage's share of the pipeline bubble.

    For uniform 1F1B or GPipe this is (p - 1) / (m + p - 1) on every stage
    (Narayanan et al. 2021, Sec. 2.2.1). With no events there is no time to be idle in: 0.
    """
    _check(events, stages)
    _, span = _span(events)
    if span <= 0.0:
        return (0.0,) * stages
    return tuple((span - _busy_s(events, s)) / span for s in range(stages))


def _chunks(events: Sequence[Event]) -> int:
    return 1 + max((e.chunk for e in events), default=0)


def _shade(kind: str, chunk: int, chunks: int) -> str:
    """The kind's hue; chunk 0 the full colour, later chunks mixed toward white."""
    base = KIND_BASE[kind]
    t = _LIGHTEST * chunk / (chunks - 1) if chunks > 1 else 0.0
    rgb = (int(base[i:i + 2], 16) for i in (1, 3, 5))
    return "#" + "".join(f"{round(c + (255 - c) * t):02x}" for c in rgb)


def _ink(fill: str) -> str:
    """Text colour readable on ``fill``: white on dark, near-black on light (WCAG luminance)."""
    def lin(c: int) -> float:
        x = c / 255
        return x / 12.92 if x <= 0.04045 else ((x + 0.055) / 1.055) ** 2.4
    r, g, b = (lin(int(fill[i:i + 2], 16)) for i in (1, 3, 5))
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    # contrast with white (1.05 / (L + 0.05)) beats contrast with black ((L + 0.05) / 0.05)
    return "#ffffff" if luminance < 0.179 else TEXT_FILL


def _unit(span_s: float) -> tuple[str, float]:
    """The time unit for a makespan, and seconds -> that unit's factor."""
    if span_s >= 1.0:
        return "s", 1.0
    if span_s >= 1e-3:
        return "ms", 1e3
    return "µs", 1e6


def _nice_step(raw: float) -> float:
    """The smallest of 1, 2, 5 x 10^k that is at least ``raw``."""
    if raw <= 0.0:
        return 1.0
    k = math.floor(math.log10(raw))
    for mult in (1.0, 2.0, 5.0, 10.0):
        if mult * 10.0**k >= raw * (1 - 1e-9):
            return mult * 10.0**k
    raise AssertionError("unreachable: 10 x 10^k >= raw")


def _decimals(step: float) -> int:
    return max(0, -math.floor(math.log10(step) + 1e-9))


def _legend_names(events: Sequence[Event]) -> dict[str, str]:
    """What each kind means here: B includes the weight gradient unless W runs on its own."""
    split = any(e.kind == "W" for e in events)
    names = {"F": "forward", "B": "backward (input grad)" if split else "backward"}
    if split:
        names["W"] = "backward (weight grad)"
    return names


# --- SVG ------------------------------------------------------------------------------------


def _xml(text: str) -> str:
    """``text`` as XML character data: specials escaped, characters XML 1.0 forbids dropped."""
    return escape("".join(c for c in text if c >= " " or c in "\t\n\r"))


def _n(x: float) -> str:
    """A coordinate with fixed precision, so the same input gives the same bytes."""
    return f"{x:.2f}"


def timeline_svg(events: Sequence[Event], stages: int, *, title: str = "", width_px: int = 1200) -> str:
    """A standalone SVG document (xmlns, viewBox) of the timeline, with axis and legend.

    Each stage is a ``<g class="stage">``; each event one ``<rect class="event">``
    whose width is proportional to its duration; idle time is the row's
    ``<rect class="idle">`` background. Events are drawn in time order, so the
    output depends only on the set of events.
    """
    _check(events, stages)
    pad, label_w, right_w = 12.0, 70.0, 86.0
    row_h = 28.0 if stages <= 16 else 16.0
    gap = 6.0 if stages <= 16 else 3.0
    font, small = 12, 11
    x0 = pad + label_w
    plot_w = max(width_px - x0 - right_w - pad, 100.0)
    width = x0 + plot_w + right_w + pad
    t0, span = _span(events)
    scale = plot_w / span if span > 0 else 0.0
    unit, per_s = _unit(span)
    chunks = _chunks(events)
    idle = idle_fraction(events, stages)

    top = pad + (28.0 if title else 0.0)
    rows_bottom = top + stages * row_h + (stages - 1) * gap
    axis_y = rows_bottom + 4.0
    caption_y = axis_y + 34.0
    legend_y = caption_y + 16.0
    height = legend_y + 14.0 + pad

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_n(width)}" height="{_n(height)}" '
        f'viewBox="0 0 {_n(width)} {_n(height)}" font-family="{FONT}" font-size="{font}">',
        f"<title>{_xml(title or 'pipeline timeline')}</title>",
        f'<rect class="background" x="0" y="0" width="{_n(width)}" height="{_n(height)}" fill="#ffffff"/>',
    ]
    if title:
        out.append(f'<text class="title" x="{_n(pad)}" y="{_n(pad + 16)}" font-size="15" '
                   f'font-weight="bold">{_xml(title)}</text>')

    by_stage: list[list[Event]] = [[] for _ in range(stages)]
    for e in sorted(events, key=lambda e: (e.start_s, e.end_s, e.kind, e.microbatch, e.chunk)):
        by_stage[e.stage].append(e)
    for s in range(stages):
        y = top + s * (row_h + gap)
        mid = y + row_h / 2 + font * 0.35
        out.append(f'<g class="stage" id="stage-{s}">')
        out.append(f'<text x="{_n(pad)}" y="{_n(mid)}">stage {s}</text>')
        out.append(f'<rect class="idle" x="{_n(x0)}" y="{_n(y)}" width="{_n(plot_w)}" '
                   f'height="{_n(row_h)}" fill="{IDLE_FILL}"/>')
        for e in by_stage[s]:
            x = x0 + (e.start_s - t0) * scale
            w = e.duration_s * scale
            fill = _shade(e.kind, e.chunk, chunks)
            stroke = ' stroke="#ffffff" stroke-width="0.75"' if w >= 4.0 else ""
            what = f"{e.kind} microbatch {e.microbatch}" + (f" chunk {e.chunk}" if chunks > 1 else "")
            when = f"{(e.start_s - t0) * per_s:.3f}-{(e.end_s - t0) * per_s:.3f} {unit}"
            out.append(f'<rect class="event" data-kind="{e.kind}" x="{_n(x)}" y="{_n(y)}" '
                       f'width="{_n(w)}" height="{_n(row_h)}" fill="{fill}"{stroke}>'
                       f"<title>{what}, {when}</title></rect>")
            label = str(e.microbatch)
            if row_h >= 14 and w >= 0.62 * small * len(label) + 4:
                out.append(f'<text x="{_n(x + w / 2)}" y="{_n(y + row_h / 2 + small * 0.35)}" '
                           f'font-size="{small}" text-anchor="middle" fill="{_ink(fill)}">{label}</text>')
        out.append(f'<text x="{_n(x0 + plot_w + 8)}" y="{_n(mid)}" fill="{IDLE_TEXT}">'
                   f"{idle[s]:.1%} idle</text>")
        out.append("</g>")

    # time axis: ticks at 1, 2, 5 x 10^k of the unit, about one per 90 px
    out.append('<g class="axis">')
    out.append(f'<line x1="{_n(x0)}" y1="{_n(axis_y)}" x2="{_n(x0 + plot_w)}" y2="{_n(axis_y)}" '
               f'stroke="{TEXT_FILL}" stroke-width="1"/>')
    span_u = span * per_s
    step = _nice_step(span_u / max(plot_w / 90.0, 1.0)) if span_u > 0 else 1.0
    dec = _decimals(step)
    for i in range(int(span_u / step + 1e-9) + 1):
        x = x0 + i * step / per_s * scale
        out.append(f'<line x1="{_n(x)}" y1="{_n(axis_y)}" x2="{_n(x)}" y2="{_n(axis_y + 5)}" '
                   f'stroke="{TEXT_FILL}" stroke-width="1"/>')
        out.append(f'<text x="{_n(x)}" y="{_n(axis_y + 18)}" font-size="{small}" '
                   f'text-anchor="middle">{i * step:.{dec}f}</text>')
    out.append(f'<text x="{_n(x0 + plot_w / 2)}" y="{_n(caption_y)}" text-anchor="middle">'
               f"time ({unit})</text>")
    out.append("</g>")

    # legend: one swatch per kind (a strip of shades when there are several chunks), idle, totals
    out.append('<g class="legend">')
    x = x0
    sw = 12.0
    names = _legend_names(events)
    for kind, name in names.items():
        for c in range(chunks):
            out.append(f'<rect x="{_n(x)}" y="{_n(legend_y)}" width="{_n(sw)}" height="{_n(sw)}" '
                       f'fill="{_shade(kind, c, chunks)}"/>')
            x += sw
        text = f"{kind} {name}"
        out.append(f'<text x="{_n(x + 5)}" y="{_n(legend_y + 10)}">{_xml(text)}</text>')
        x += 5 + 0.6 * font * len(text) + 16
    out.append(f'<rect x="{_n(x)}" y="{_n(legend_y)}" width="{_n(sw)}" height="{_n(sw)}" '
               f'fill="{IDLE_FILL}" stroke="#bbbbbb" stroke-width="0.75"/>')
    x += sw
    mean_idle = sum(idle) / stages
    notes = [f"idle (bubble), {mean_idle:.1%} mean", f"makespan {span_u:.{dec + 1}f} {unit}"]
    if chunks > 1:
        notes.append(f"chunks 0-{chunks - 1} dark to light")
    out.append(f'<text x="{_n(x + 5)}" y="{_n(legend_y + 10)}">{_xml("; ".join(notes))}</text>')
    out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


# --- terminal -------------------------------------------------------------------------------


def _cells(events: Sequence[Event], t0: float, dt: float, width: int) -> list[tuple[str, int] | None]:
    """For one stage: per cell, the (kind, chunk) that covers most of it, or None where idle does."""
    cover: list[dict[tuple[str, int], float]] = [{} for _ in range(width)]
    for e in events:
        a, b = (e.start_s - t0) / dt, (e.end_s - t0) / dt
        for k in range(max(int(a), 0), min(math.ceil(b), width)):
            overlap = min(b, k + 1) - max(a, k)
            if overlap > 0:
                key = (e.kind, e.chunk)
                cover[k][key] = cover[k].get(key, 0.0) + overlap
    result: list[tuple[str, int] | None] = []
    for cell in cover:
        idle = 1.0 - sum(cell.values())
        best = min(cell.items(), key=lambda kv: (-kv[1], KINDS.index(kv[0][0]), kv[0][1]), default=None)
        result.append(best[0] if best is not None and best[1] >= idle else None)
    return result


def _style(kind: str, chunk: int, chunks: int) -> str:
    fill = _shade(kind, chunk, chunks)
    return f"bold {_ink(fill)} on {fill}"


def timeline_rich(events: Sequence[Event], stages: int, *, width: int = 100) -> RenderableType:
    """One line per stage, ``width`` cells of makespan / width seconds each, then an axis and a legend.

    A cell shows the kind that occupies most of it: F, B or W (lower case for
    chunks after the first), or '·' where the stage is mostly idle. Letters carry
    the meaning, so it reads in a console without colour too. Each line is
    ``width`` plus ``len("stage N ")`` plus 12 columns wide.
    """
    _check(events, stages)
    assert width >= 1, f"a timeline needs at least one cell, got width={width}"
    t0, span = _span(events)
    dt = span / width if span > 0 else 1.0
    chunks = _chunks(events)
    idle = idle_fraction(events, stages)
    label_w = len(f"stage {stages - 1} ")
    unit, per_s = _unit(span)

    lines: list[Text] = []
    for s in range(stages):
        line = Text(f"stage {s}".ljust(label_w), no_wrap=True, overflow="crop")
        for cell in _cells([e for e in events if e.stage == s], t0, dt, width):
            if cell is None:
                line.append("·", style="grey50")
            else:
                kind, chunk = cell
                line.append(kind if chunk == 0 else kind.lower(), style=_style(kind, chunk, chunks))
        line.append(f" {idle[s]:>6.1%} idle", style="grey50")
        lines.append(line)

    span_u = span * per_s
    dec = _decimals(_nice_step(span_u / 10)) if span_u > 0 else 0
    end = f"{span_u:.{dec + 1}f} {unit}"
    lines.append(Text(" " * label_w + "0" + end.rjust(max(width - 1, len(end) + 1)),
                      style="grey50", no_wrap=True, overflow="crop"))

    legend = Text(" " * label_w)  # wraps on a narrow console rather than losing its end
    for kind, name in _legend_names(events).items():
        legend.append(kind, style=_style(kind, 0, chunks))
        legend.append(f" {name}  ")
    legend.append("·", style="grey50")
    legend.append(" idle")
    if chunks > 1:
        legend.append("  lower case: chunk ≥ 1")
    legend.append(f"  (1 cell = {dt * per_s:.{dec + 2}f} {unit})", style="grey50")
    lines.append(legend)
    return Group(*lines)


# --- PNG ------------------------------------------------------------------------------------


def require_png() -> None:
    """Raise the error :func:`timeline_png` would, before any work, where matplotlib (an
    optional extra) is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise AutoplanError(PNG_MISSING) from None


def timeline_png(events: Sequence[Event], stages: int, *, title: str = "") -> bytes:
    """The timeline drawn with matplotlib (an optional extra), as PNG bytes."""
    _check(events, stages)
    require_png()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    t0, span = _span(events)
    unit, per_s = _unit(span)
    chunks = _chunks(events)
    idle = idle_fraction(events, stages)
    fig = Figure(figsize=(12.0, 1.6 + 0.45 * stages), dpi=150, layout="constrained")
    FigureCanvasAgg(fig)  # attaches itself to the figure; no pyplot, no global backend
    ax = fig.add_subplot()
    bar = 0.86  # row height in stage units; the white between rows separates them
    right = span * per_s if span > 0 else 1.0
    ax.barh(range(stages), [right] * stages, height=bar, color=IDLE_FILL)  # idle background
    for e in sorted(events, key=lambda e: (e.stage, e.start_s, e.end_s, e.kind, e.microbatch)):
        fill = _shade(e.kind, e.chunk, chunks)
        left, w = (e.start_s - t0) * per_s, e.duration_s * per_s
        ax.barh(e.stage, w, left=left, height=bar, color=fill, edgecolor="#ffffff", linewidth=0.5)
        if span > 0 and e.duration_s / span * 10.0 * 72 >= 7 * len(str(e.microbatch)) + 4:
            ax.text(left + w / 2, e.stage, str(e.microbatch), ha="center", va="center",
                    fontsize=7, color=_ink(fill))
    ax.set_ylim(stages - 0.5, -0.5)  # stage 0 on top
    ax.set_xlim(0.0, right)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.set_yticks(range(stages), [f"stage {s}\n{idle[s]:.1%} idle" for s in range(stages)])
    ax.set_xlabel(f"time ({unit})")
    if title:
        ax.set_title(title, loc="left")
    handles = [Patch(color=_shade(k, 0, chunks), label=f"{k} {name}")
               for k, name in _legend_names(events).items()]
    handles.append(Patch(color=IDLE_FILL, label=f"idle (bubble), {sum(idle) / stages:.1%} mean"))
    if chunks > 1:
        handles.append(Patch(color=_shade("F", chunks - 1, chunks), label="lighter: later chunks"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), frameon=False)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
