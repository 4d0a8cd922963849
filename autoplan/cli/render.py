"""Rich tables for search and evaluate results."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from autoplan.cost.evaluate import StageWork
from autoplan.descriptors.hardware import Cluster
from autoplan.plan import TIME_TERMS, Plan, Prediction, Uncertainty
from autoplan.search.engine import SearchStats
from autoplan.vocab import CpComm

if TYPE_CHECKING:
    from autoplan.bench.profile import Profile

MOE_MFU_NOTE = " of active parameters"


def layout_text(plan: Plan) -> str:
    lay = plan.layout
    text = f"dp{lay.dp} tp{lay.tp} pp{lay.pp}"
    if lay.cp > 1:
        text += f" cp{lay.cp}" + (" a2a" if plan.cp_comm is CpComm.A2A else "")
    if plan.model.is_moe:
        text += f" ep{lay.ep}" + (f" etp{lay.etp}" if lay.etp != lay.tp else "")
    if lay.vpp > 1:
        text += f" vpp{lay.vpp}"
    if len(set(plan.stage_layers)) > 1:
        text += " stages " + "/".join(str(n) for n in plan.stage_layers)
    return text


def plans_table(rows: list[tuple[Plan, Prediction]], title: str) -> Table:
    caption = ("MFU counts the active parameters only (top_k routed experts per token)"
               if any(plan.model.is_moe for plan, _ in rows) else None)
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    for name, justify in (("#", "right"), ("layout", "left"), ("mbs", "right"),
                          ("schedule", "left"), ("recompute", "left"), ("zero", "right"),
                          ("sp", "left"), ("step s", "right"), ("tokens/s", "right"),
                          ("MFU", "right"), ("peak GiB", "right"), ("headroom", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for i, (plan, pred) in enumerate(rows, 1):
        table.add_row(
            str(i), layout_text(plan), str(plan.micro_batch), plan.schedule.value,
            plan.recompute.value, str(int(plan.zero)), "yes" if plan.sequence_parallel else "no",
            f"{pred.step_time_s:.3f}", f"{pred.tokens_per_s:,.0f}", f"{pred.mfu:.1%}",
            f"{pred.memory.peak / 2**30:.1f}",
            f"{pred.headroom_bytes / 2**30:.1f}" if pred.feasible else "[red]OOM[/red]",
        )
    return table


def stats_text(stats: SearchStats) -> str:
    lines = [f"candidates: {stats.generated:,} generated, {stats.evaluated:,} evaluated"]
    for rule, n in sorted(stats.pruned.items()):
        lines.append(f"  pruned {n:>9,}  {rule}")
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
    """Per-stage layers and per-microbatch times: forward, input-grad (B), weight-grad (W)."""
    table = Table(title="per pipeline stage, one microbatch (ms)", title_justify="left")
    for col in ("stage", "layers", "F", "B", "W", "of which comm"):
        table.add_column(col, justify="right")
    for s, w in enumerate(works):
        comm_s = (w.tp_f + w.tp_b + w.cp_f + w.cp_b + w.ep_f + w.ep_b + w.pp_f + w.pp_b
                  + w.zero3_f + w.zero3_b)
        table.add_row(str(s), str(w.layers), f"{w.forward * 1e3:.2f}",
                      f"{w.backward_input * 1e3:.2f}", f"{w.backward_weight * 1e3:.2f}",
                      f"{comm_s * 1e3:.2f}")
    return table


def memory_table(pred: Prediction) -> Table:
    table = Table(title="memory per GPU (GiB) by pipeline stage", title_justify="left")
    table.add_column("stage", justify="right")
    for col in ("weights", "grads", "optimizer", "activations", "other", "peak"):
        table.add_column(col, justify="right")
    for s, mem in enumerate(pred.memory_per_stage):
        d = mem.to_gib_dict()
        style = "red" if mem.peak > pred.capacity_bytes else ""
        table.add_row(str(s), *(f"[{style}]{d[k]:.1f}[/{style}]" if style else f"{d[k]:.1f}"
                                for k in ("weights", "grads", "optimizer", "activations", "other",
                                          "peak")))
    return table


def summary_line(plan: Plan, pred: Prediction) -> str:
    status = "fits" if pred.feasible else "[red]does not fit[/red]"
    return (f"{layout_text(plan)}, micro_batch {plan.micro_batch}, {plan.schedule.value}, "
            f"recompute {plan.recompute.value}, zero {int(plan.zero)}"
            f"{', sp' if plan.sequence_parallel else ''}: "
            f"step {pred.step_time_s:.3f} s, {pred.tokens_per_s:,.0f} tokens/s, "
            f"MFU {pred.mfu:.1%}{MOE_MFU_NOTE if plan.model.is_moe else ''} "
            f"({pred.tflops_per_gpu:.0f} model / "
            f"{pred.hw_tflops_per_gpu:.0f} hardware TFLOP/s per GPU), "
            f"peak {pred.memory.peak / 2**30:.1f} of {pred.capacity_bytes / 2**30:.0f} GiB, {status}")


def band_line(pred: Prediction, unc: Uncertainty) -> str:
    """The step time with its band over the learned correction's trees."""
    return (f"step time {pred.step_time_s:.3f} s (p10 {unc.step_time_s_p10:.3f} s, "
            f"p90 {unc.step_time_s_p90:.3f} s, profile {unc.profile})")


def profile_text(source: str) -> str:
    return f"times corrected by the measured profile {source} (learned ratio to the analytic model)"


def profile_note(profile: Profile, cluster: Cluster) -> str | None:
    """A note when a profile corrects another device than the one it was taken on."""
    if profile.descriptor and profile.descriptor != cluster.device.name:
        return (f"autoplan: note: {profile.source} was taken on {profile.descriptor}; "
                f"it corrects {cluster.device.name} here")
    return None
