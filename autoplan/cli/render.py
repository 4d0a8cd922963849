"""Rich tables for the training commands' results (search, evaluate, explain), and
check's and diff's; the serving ones are :mod:`autoplan.cli.render_serving`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from autoplan.api._base import layout_text, offload_text
from autoplan.api.reports import (  # noqa: F401 (the commands' names for them)
    CHECK_SUITE,
    check_junit,
    check_message,
    check_text,
    cluster_text,
    plan_words,
)
from autoplan.cost.stage import StageWork
from autoplan.kernels.memory import DEFAULT_HEADROOM_FRACTION
from autoplan.plan import TIME_TERMS, Plan, Prediction, Uncertainty
from autoplan.search.engine import SearchStats, pruning_reason
from autoplan.units import GiB

if TYPE_CHECKING:
    from autoplan.api.search import LauncherFree
    from autoplan.cost.reliability import Reliability
    from autoplan.descriptors.space import SearchSpace
    from autoplan.search.results import Ranked as Found
    from autoplan.whatif.sweep import Point

MOE_MFU_NOTE = " of active parameters"


def exposed_comm(pred: Prediction) -> float:
    """Seconds of the step communication leaves exposed, every axis."""
    b = pred.breakdown
    return b.tp_comm + b.cp_comm + b.ep_comm + b.pp_comm + b.dp_comm


def launchers_line(runs_on: Sequence[Sequence[str]]) -> str:
    """Which launchers run each ranked plan (``export --to``), in one line."""
    parts = [f"{i} {', '.join(on) if on else 'none'}" for i, on in enumerate(runs_on, 1)]
    hint = ("; none: no launcher runs it as it is (search --space megatron, torchtitan or "
            "deepspeed ranks only plans that one runs)" if not all(runs_on) else "")
    return "runs on (export --to): " + "; ".join(parts) + hint


def space_words(space: SearchSpace) -> str:
    """The title's words for where a search looked: a space and its stack, or the union of
    the launchers' spaces with theirs."""
    if space.parts:
        from autoplan.search.launchable import launcher_spaces

        stacks = ", ".join(dict.fromkeys(p.stack.name for p in space.parts))
        names = [n for _, ns in launcher_spaces() for n in ns]
        return (f"plans {', '.join(names)} run (space {space.name}, uniform layer splits; "
                f"stacks {stacks})")
    if space.launcher == "any":
        return (f"space {space.name}: launcher-free, for what-if questions (plans may run on no "
                f"launcher), stack {space.stack.name}")
    return f"space {space.name}, stack {space.stack.name}"


def gap_line(free: Found | LauncherFree, faster_by: float) -> str:
    """Under a launchable search's table: the launcher-free plan that beats its best."""
    plan = free.plan
    return (f"a plan no launcher runs is {faster_by:.0%} faster: {layout_text(plan)} mbs "
            f"{plan.micro_batch} {plan.schedule.value} recompute {plan.recompute_label} zero "
            f"{int(plan.zero)}{' offload ' + offload_text(plan) if plan.offload.any else ''} "
            f"({free.prediction.tokens_per_s:,.0f} tokens/s); --space any ranks such plans")


def uneven_hint(plan: Plan) -> str | None:
    """Under a launchable search whose best plan splits its layers unevenly only by the
    remainder (the uniform split): the launchers that search their own uneven splits."""
    layers = plan.stage_layers
    if plan.layout.pp == 1 or len(set(layers)) == 1:
        return None
    return (f"its layers do not divide over pp{plan.layout.pp} (stages "
            f"{'/'.join(map(str, layers))}): --launcher megatron or torchtitan also searches "
            "their uneven layer splits and vpp over them (slower)")


def plans_table(rows: list[tuple[Plan, Prediction]], title: str, show_gpus: bool = False,
                launchers: Sequence[Sequence[str]] | None = None) -> Table:
    """The ranked plans; ``launchers``: who runs each, shown in its layout cell."""
    caption = ("MFU counts the active parameters only (top_k routed experts per token)"
               if any(plan.model.is_moe for plan, _ in rows) else None)
    caption = "; ".join(c for c in (caption, "micro: microbatches per step; bubble: share of the "
                                    "step the pipeline idles; comm s: communication left exposed")
                        if c)
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    offloads = any(plan.offload.any for plan, _ in rows)  # the column only where one does
    pooled = any(plan.placement is not None for plan, _ in rows)
    for name, justify in (("#", "right"), *((("GPUs", "right"),) if show_gpus else ()),
                          *((("pools: layers", "left"),) if pooled else ()),
                          ("layout", "left"), ("mbs", "right"), ("micro", "right"),
                          ("schedule", "left"), ("recompute", "left"), ("zero", "right"),
                          ("sp", "left"), *((("offload", "left"),) if offloads else ()),
                          ("step s", "right"), ("bubble", "right"),
                          ("comm s", "right"), ("tokens/s", "right"),
                          ("MFU", "right"), ("peak GiB", "right"), ("headroom", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for i, (plan, pred) in enumerate(rows, 1):
        table.add_row(
            str(i), *((str(plan.cluster.gpus),) if show_gpus else ()),
            *((escape(placement_text(plan)),) if pooled else ()),
            layout_text(plan) + (f"\n[dim]{escape(', '.join(launchers[i - 1]))}[/dim]"
                                 if launchers is not None else ""),
            str(plan.micro_batch), str(plan.num_microbatches),
            plan.schedule.value,
            plan.recompute_label, str(int(plan.zero)), "yes" if plan.sequence_parallel else "no",
            *((offload_text(plan),) if offloads else ()),
            f"{pred.step_time_s:.3f}", f"{pred.breakdown.bubble / pred.step_time_s:.1%}",
            f"{exposed_comm(pred):.3f}", f"{pred.tokens_per_s:,.0f}", f"{pred.mfu:.1%}",
            f"{pred.memory.peak / GiB:.1f}",
            f"{pred.headroom_bytes / GiB:.1f}" if pred.feasible else "[red]OOM[/red]",
        )
    return table


def placement_text(plan: Plan) -> str:
    """Each pool the plan's stages run on, in pipeline order, with their layers
    (``ampere 11/10, hopper 30/29``); a plan on one pool: its name and ``alone``."""
    if plan.placement is None:
        return f"{plan.cluster.name} alone"
    return ", ".join(f"{pool.name} {'/'.join(str(plan.stage_layers[s]) for s in stages)}"
                     for pool, stages in plan.placement.runs())


def headroom_note(headroom_bytes: float, default: bool) -> str:
    """What the plans leave free, and why."""
    why = (f"{DEFAULT_HEADROOM_FRACTION:.0%} of the device, for the allocator's fragmentation "
           "(kernels/memory.py; --min-headroom changes it)" if default else "--min-headroom")
    return f"every plan leaves at least {headroom_bytes / GiB:.1f} GiB free per GPU: {why}"


def front_table(points: Sequence[Point], front: Sequence[Point], kept: Sequence[Point],
                chosen: Point | None, labels: dict[int, str], price_known: bool) -> Table:
    """The best plan of each GPU count with what a whole run on it takes; ``*`` marks
    the Pareto front (days against cost), ``x`` a front point a deadline or budget
    rules out, ``>`` the chosen one."""
    table = Table(title="time to train, by GPU count (* Pareto front, > best by the objective, "
                        "x outside the deadline or budget)", title_justify="left")
    fails = any(p.economics.reliability is not None for p in points)
    for name in ("", "GPUs", "layout", "step s", "tokens/s", *(("goodput",) if fails else ()),
                 "days", "GPU-hours", "cost USD", "energy MWh"):
        table.add_column(name, justify="left" if name in ("", "layout") else "right")
    on_front, ok = {p.gpus for p in front}, {p.gpus for p in kept}
    for p in points:
        e = p.economics
        mark = (">" if chosen is not None and p.gpus == chosen.gpus
                else "*" if p.gpus in ok else "x" if p.gpus in on_front else "")
        goodput = () if not fails else (f"{e.goodput:.1%}" if e.goodput is not None else "-",)
        # a run failures keep from finishing (Reliability.finishes) takes forever: "never"
        # rather than inf days, GPU-hours, dollars and MWh
        never = not e.finishes
        table.add_row(
            mark, str(p.gpus), labels[p.gpus], f"{e.step_time_s:.3f}", f"{e.tokens_per_s:,.0f}",
            *goodput, "never" if never else f"{e.train_days:,.1f}",
            "never" if never else f"{e.gpu_hours:,.0f}",
            "never" if never and price_known else
            f"{e.cost_usd:,.0f}" if price_known and e.cost_usd is not None else "-",
            "never" if never and e.energy_mwh is not None else
            f"{e.energy_mwh:,.1f}" if e.energy_mwh is not None else "-")
    return table


def packing_line(plan: Plan, docs: Any) -> str:
    """What packed documents do to attention (autoplan.kernels.packing), in one line."""
    from autoplan.kernels import packing

    s, cp = plan.job.seq_len, plan.layout.cp
    share = packing.attention_share(docs, s)
    text = (f"packed documents ({docs.kind}): attention runs {share:.1%} of a whole-sequence "
            f"document's work, at {packing.attention_length(docs, s):,.0f} tokens a document")
    if cp > 1 and plan.cp_comm.value == "ring":
        text += (f"; the busiest of the {cp} context-parallel ranks {packing.cp_imbalance(docs, s, cp):.2f}x "
                 "the mean (zig-zag split)")
    return text


def reliability_lines(found: dict[str, Reliability], gpus: int) -> list[str]:
    """What failures and checkpoints cost a run (autoplan.cost.reliability), in words:
    each way of saving of ``found`` (synchronous, asynchronous)."""
    first = next(iter(found.values()))
    out = [f"failures: one every {first.mtbf_s / 3600:,.2f} h on {gpus:,} GPUs, each costing a "
           f"restart and the checkpoint's load ({first.restart_s / 60:,.1f} min) and the work "
           "since the last checkpoint",
           f"a checkpoint: {first.checkpoint_bytes / GiB:,.0f} GiB (weights and optimizer states), "
           f"written in {first.write_s:,.1f} s"]
    for how, r in found.items():
        out.append(f"saved {how}ly: every {r.interval_s / 60:,.1f} min of training (Daly's optimum), "
                   f"stalling {r.stall_s:,.2f} s each; goodput {r.goodput:.1%} of the wall clock"
                   + ("" if r.finishes else ": the run never finishes (failures come faster than "
                                            "a checkpoint's write and a restart)"))
    return out




def economics_note(summary: dict[str, Any]) -> str:
    """Where the price and the PUE came from."""
    price = summary["price_per_gpu_hour"]
    priced = (f"price ${price:g} per GPU-hour ({summary['price_source']})" if price is not None
              else "no price (the device file has none; --price sets one): cost by GPU-hours")
    return f"{priced}; energy at PUE {summary['pue']:g}; objective {summary['objective']}"


def stats_text(stats: SearchStats) -> str:
    lines = [f"candidates: {stats.generated:,} generated, {stats.evaluated:,} evaluated"]
    for rule, n in sorted(stats.pruned.items()):
        lines.append(f"  pruned {n:>9,}  {rule}: {pruning_reason(rule)}")
    for reason, n in sorted(stats.infeasible.items()):
        lines.append(f"  infeasible {n:>5,}  {reason}")
    return "\n".join(lines)


def breakdown_table(plan: Plan, pred: Prediction, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("time", justify="left")
    table.add_column("s", justify="right")
    table.add_column("share", justify="right")
    total = pred.step_time_s
    for term in TIME_TERMS:
        value = getattr(pred.breakdown, term)
        table.add_row(term, f"{value:.3f}", f"{value / total:.1%}" if total else "-")
    table.add_row("[bold]step[/bold]", f"[bold]{total:.3f}[/bold]", "100%")
    return table


def stage_table(plan: Plan, works: tuple[StageWork, ...]) -> Table:
    """Per-stage layers and per-microbatch times: forward, input-grad (B), weight-grad (W);
    a hybrid model's layers by kind (mixer and MLP symbols, ``Model.mixers``)."""
    kinds = tuple(plan.model.kinds) if plan.model.is_hybrid else ()
    caption = ("kinds: layers of each mixer and MLP (A full attention, W sliding window, G gated "
               "delta net, K kimi delta attention, M mamba-2, D sparse attention; - dense MLP, "
               "E experts; . none)") if kinds else None
    table = Table(title="per pipeline stage, one microbatch (ms)", title_justify="left",
                  caption=caption, caption_justify="left")
    for col in ("stage", "layers", *(("kinds",) if kinds else ()), "F", "B", "W", "of which comm"):
        table.add_column(col, justify="right")
    for s, w in enumerate(works):
        comm_s = w.comm.total
        mix = (" ".join(f"{n}{a}{b}" for (a, b), n in zip(kinds, w.mix, strict=True) if n),
               ) if kinds and w.mix else ()
        table.add_row(str(s), str(w.layers), *mix, f"{w.forward * 1e3:.2f}",
                      f"{w.backward_input * 1e3:.2f}", f"{w.backward_weight * 1e3:.2f}",
                      f"{comm_s * 1e3:.2f}")
    return table


def memory_table(pred: Prediction) -> Table:
    """Each stage's bytes per GPU, with what its offload keeps in host memory (only where
    the plan offloads) and, then, the node's host memory in the caption."""
    host = pred.host_memory_bytes_per_node > 0
    caption = (f"host memory per node for offload: {pred.host_memory_bytes_per_node / GiB:,.0f} "
               f"GiB (every GPU of a node as its fullest stage's)" if host else None)
    table = Table(title="memory per GPU (GiB) by pipeline stage", title_justify="left",
                  caption=caption, caption_justify="left")
    table.add_column("stage", justify="right")
    pooled = bool(pred.stage_pools)  # across pools: each stage's pool, its GPU's memory, time
    if pooled:
        table.add_column("pool", justify="left")
    cols = ("weights", "grads", "optimizer", "activations", "other", "peak") + (
        ("host",) if host else ()) + (("of GiB",) if pooled else ())
    for col in cols:
        table.add_column(col, justify="right")
    if pooled:
        table.add_column("busy s", justify="right")
    for s, mem in enumerate(pred.memory_per_stage):
        capacity = pred.stage_capacity_bytes[s] if pooled else pred.capacity_bytes
        d = {"host": 0.0, "of GiB": capacity / GiB, **mem.to_gib_dict()}
        style = "red" if mem.peak > capacity else ""
        table.add_row(str(s), *((escape(pred.stage_pools[s]),) if pooled else ()),
                      *(f"[{style}]{d[k]:.1f}[/{style}]" if style else f"{d[k]:.1f}"
                        for k in cols),
                      *((f"{pred.stage_busy_s[s]:.3f}",) if pooled else ()))
    return table


def _rate(tflops: float) -> str:
    """TFLOP/s as whole numbers on a GPU, with three significant digits below 10 (a CPU's
    0.21 is not 0)."""
    return f"{tflops:.0f}" if tflops >= 10 else f"{tflops:.3g}"


def summary_line(plan: Plan, pred: Prediction) -> str:
    status = "fits" if pred.feasible else "[red]does not fit[/red]"
    return (f"{layout_text(plan)}, micro_batch {plan.micro_batch}, {plan.schedule.value}, "
            f"recompute {plan.recompute_label}, zero {int(plan.zero)}"
            f"{', sp' if plan.sequence_parallel else ''}"
            f"{', offload ' + offload_text(plan) if plan.offload.any else ''}: "
            f"step {pred.step_time_s:.3f} s, {pred.tokens_per_s:,.0f} tokens/s, "
            f"MFU {pred.mfu:.1%}{MOE_MFU_NOTE if plan.model.is_moe else ''} "
            f"({_rate(pred.tflops_per_gpu)} model / "
            f"{_rate(pred.hw_tflops_per_gpu)} hardware TFLOP/s per GPU), "
            f"peak {pred.memory.peak / GiB:.1f} of {pred.capacity_bytes / GiB:.0f} GiB, {status}")


def band_line(pred: Prediction, unc: Uncertainty) -> str:
    """The step time with its band over the learned correction's trees."""
    return (f"step time {pred.step_time_s:.3f} s (p10 {unc.step_time_s_p10:.3f} s, "
            f"p90 {unc.step_time_s_p90:.3f} s, profile {unc.profile})")


def profile_text(source: str) -> str:
    return f"times corrected by the measured profile {source} (learned ratio to the analytic model)"


# --------------------------------------------------------------------------- check and diff

if TYPE_CHECKING:
    from autoplan.commands.diff import Delta, PlanDiff, ServingDiff

def _value_text(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, tuple):
        return "/".join(str(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def diff_changes_table(diff: PlanDiff | ServingDiff) -> Table:
    from rich.markup import escape

    table = Table(title="what changed", title_justify="left")
    table.add_column("field")
    table.add_column("A", justify="right")
    table.add_column("B", justify="right")
    for c in diff.changes:
        table.add_row(escape(c.field), escape(_value_text(c.a)), escape(_value_text(c.b)))
    if not diff.changes:
        table.add_row("(nothing: the same plan)", "", "")
    return table


def _metric_text(delta: Delta, value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    sign = "+" if signed else ""
    if delta.unit == "fraction":
        return f"{value * 100:{sign}.1f} pp" if signed else f"{value:.1%}"
    if delta.unit == "tokens/s":
        return f"{value:{sign},.0f}"
    if delta.unit == "TFLOP/s":
        return f"{value:{sign}.0f}"
    if delta.unit == "GiB":
        return f"{value:{sign}.1f}"
    return f"{value:{sign}.3f}"


def diff_metrics_table(diff: PlanDiff | ServingDiff) -> Table:
    """Both predictions side by side: A, B, B - A and (B - A) / A."""
    from rich.markup import escape

    table = Table(title="what it does to the prediction", title_justify="left")
    for col, justify in (("metric", "left"), ("unit", "left"), ("A", "right"), ("B", "right"),
                         ("change", "right"), ("relative", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for d in diff.deltas:
        rel = d.relative
        table.add_row(escape(d.metric), d.unit, _metric_text(d, d.a), _metric_text(d, d.b),
                      _metric_text(d, d.change, signed=True), "-" if rel is None else f"{rel:+.1%}")
    return table


def diff_summary(diff: PlanDiff | ServingDiff) -> str:
    """For people: which file is A and which B, each in a few words, and B against A in step
    time and peak memory (serving: whether each meets its SLO)."""
    from autoplan.commands.diff import ServingDiff

    if isinstance(diff, ServingDiff):
        meets = {True: "meets its SLO", False: "misses its SLO or does not fit"}
        return (f"A: {diff.source_a}: {diff.summary_a} ({meets[diff.meets_a]})\n"
                f"B: {diff.source_b}: {diff.summary_b} ({meets[diff.meets_b]})")
    pa, pb = diff.prediction_a, diff.prediction_b
    fits = {True: "fits", False: "does not fit"}
    step = pb.step_time_s / pa.step_time_s - 1.0
    return (f"A: {diff.source_a}: {plan_words(diff.plan_a)} ({fits[pa.feasible]})\n"
            f"B: {diff.source_b}: {plan_words(diff.plan_b)} ({fits[pb.feasible]})\n"
            f"B against A: step {pa.step_time_s:.3f} -> {pb.step_time_s:.3f} s ({step:+.1%}), "
            f"peak {pa.memory.peak / GiB:.1f} -> {pb.memory.peak / GiB:.1f} GiB")
