"""Rich tables for search and evaluate results."""

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
from autoplan.serving.autoscale import ScalingMetric
from autoplan.units import GiB

if TYPE_CHECKING:
    from autoplan.api.search import LauncherFree
    from autoplan.descriptors.space import SearchSpace
    from autoplan.search.results import Ranked as Found
    from autoplan.serving.cost import StepModel
    from autoplan.serving.deployment import ServingPlan, Slo
    from autoplan.serving.evaluate import ServingPrediction
    from autoplan.serving.search import Ranked
    from autoplan.serving.traffic_plan import TrafficPlan
    from autoplan.whatif.reliability import Reliability
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
    """What failures and checkpoints cost a run (autoplan.whatif.reliability), in words:
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


def _serving_label(r: Ranked) -> str:
    d = r.plan.deployment
    text = d.label()
    if d.weights.value != "bf16" or d.kv_cache.value != "bf16":
        text += f" w{d.weights.value}/kv{d.kv_cache.value}"
    return text


def serving_table(ranked: Sequence[Ranked], slo: Slo, title: str) -> Table:
    """Ranked serving deployments: latencies at p50 and the SLO's percentile, throughput,
    goodput, memory and KV capacity."""
    q = f"p{slo.percentile:g}"
    table = Table(title=title, title_justify="left")
    for name in ("#", "deployment", "max seqs", "TTFT p50", f"TTFT {q}", "TPOT p50", f"TPOT {q}",
                 "out tok/s", "tok/s/GPU", "$/Mtok", "goodput r/s", "peak GiB", "KV tokens", "SLO"):
        table.add_column(name, justify="left" if name in ("deployment", "SLO") else "right")
    for i, r in enumerate(ranked, 1):
        p = r.prediction
        seqs = r.plan.deployment.max_num_seqs
        verdict = ("yes" if p.meets_slo else "no") if slo.any else "-"
        if not p.steady:
            verdict += " (queue grows)"
        table.add_row(
            str(i), _serving_label(r), str(seqs) if seqs else "default", f"{p.ttft_ms.p50:,.0f}",
            f"{p.slo_ttft_ms:,.0f}", f"{p.tpot_ms.p50:,.1f}", f"{p.slo_tpot_ms:,.1f}",
            f"{p.output_tokens_per_s:,.0f}", f"{r.per_gpu:,.0f}", _usd_per_million(p),
            f"{p.goodput_rps:,.2f}",
            f"{p.memory.peak / GiB:.1f}", f"{p.kv_cache_tokens:,}", verdict)
    return table


def serving_sweep_table(rows: Sequence[dict[str, Any]], objective: str, title: str) -> Table:
    """``serve --gpus 8,16,32``: each GPU count's best deployment, the chosen count starred."""
    table = Table(title=title, title_justify="left", caption=f"* chosen by {objective}",
                  caption_justify="left")
    for name in ("GPUs", "best deployment", "SLO", "goodput r/s", "tok/s/GPU", "tok/s/user", "$/Mtok",
                 "kWh/Mtok"):
        table.add_column(name, justify="left" if name in ("best deployment", "SLO") else "right")
    for row in rows:
        gpus = f"{row['gpus']}{' *' if row['chosen'] else ''}"
        if not row["fits"]:
            table.add_row(gpus, "none fits", "-", "-", "-", "-", "-", "-")
            continue
        usd, kwh = row["usd_per_million_tokens"], row["kwh_per_million_tokens"]
        table.add_row(gpus, row["deployment"], "yes" if row["meets_slo"] else "no",
                      f"{row['goodput_rps']:,.2f}", f"{row['tokens_per_s_per_gpu']:,.0f}",
                      f"{row['tokens_per_s_per_user']:,.1f}", "-" if usd is None else f"{usd:,.2f}",
                      "-" if kwh is None else f"{kwh:,.2f}")
    return table


def _usd_per_million(p: ServingPrediction) -> str:
    cost = None if p.per_million is None else p.per_million.cost_usd
    return "-" if cost is None else f"{cost:,.2f}"


def _per_million_line(p: ServingPrediction, pue: float) -> str:
    """GPU-hours, dollars and energy per million output tokens, with what they rest on."""
    m = p.per_million
    if m is None:
        return "per million output tokens: nothing served"
    text = f"per million output tokens: {m.gpu_hours:,.3g} GPU-hours"
    if m.cost_usd is not None and m.price_per_gpu_hour is not None:
        text += f", ${m.cost_usd:,.2f} at ${m.price_per_gpu_hour:g}/GPU-hour"
    if m.energy_kwh is not None and m.mean_power_W is not None:
        text += (f", {m.energy_kwh:,.3g} kWh (mean {m.mean_power_W:,.0f} W per GPU: busy "
                 f"{m.busy_share:.0%} of the run at load power; PUE {pue:g}; an upper estimate)")
    return text


def traffic_table(tp: TrafficPlan, title: str) -> Table:
    """``serve --traffic``: each period's load, replicas and latencies on them."""
    q = f"p{tp.plan.slo.percentile:g}"
    lengths = any(p.period.input_len is not None or p.period.output_len is not None for p in tp.periods)
    clients = any(p.period.concurrency is not None for p in tp.periods)
    table = Table(title=title, title_justify="left")
    names = ["start", "hours", "req/s", *(["clients"] if clients else []), *(["in/out"] if lengths else []),
             "replicas", "GPUs", "load", "TTFT p50", f"TTFT {q}", "TPOT p50", f"TPOT {q}", "SLO"]
    for name in names:
        table.add_column(name, justify="left" if name in ("start", "in/out", "SLO") else "right")
    for pp in tp.periods:
        p = pp.prediction
        lat = (["-"] * 4 if p is None else [f"{p.ttft_ms.p50:,.0f}", f"{p.slo_ttft_ms:,.0f}",
                                             f"{p.tpot_ms.p50:,.1f}", f"{p.slo_tpot_ms:,.1f}"])
        row = [pp.period.label(), f"{pp.period.hours:g}", f"{pp.offered_rps:,.3g}",
               *([str(pp.period.concurrency or "-")] if clients else []),
               *([f"{pp.lengths[0]:,.0f}/{pp.lengths[1]:,.0f}"] if lengths else []),
               str(pp.replicas), str(pp.gpus), f"{pp.utilization:.0%}", *lat,
               "yes" if pp.meets_slo else "no"]
        table.add_row(*row)
    return table


def traffic_totals_table(tp: TrafficPlan) -> Table:
    """Static peak provisioning against scaling per period: GPU-hours, energy, dollars."""
    hours = tp.traffic.span_h
    table = Table(title=f"over the {hours:g} hours: static provisioning against scaling per period",
                  title_justify="left")
    for name in ("", "GPU-hours", "energy kWh", "cost $"):
        table.add_column(name, justify="left" if not name else "right")

    def cell(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    static, scaled, saved = tp.static, tp.scaled, tp.saving
    most = tp.autoscale.max_replicas
    for label, t in ((f"static: {most} replica(s) all day", static), ("scaled per period", scaled)):
        table.add_row(label, cell(t.gpu_hours, ",.1f"), cell(t.energy_kwh, ",.1f"), cell(t.cost_usd, ",.2f"))
    share = saved.gpu_hours / static.gpu_hours if static.gpu_hours else 0.0
    table.add_row(f"saving ({share:.0%})", cell(saved.gpu_hours, ",.1f"), cell(saved.energy_kwh, ",.1f"),
                  cell(saved.cost_usd, ",.2f"))
    return table


def autoscale_lines(tp: TrafficPlan) -> list[str]:
    """What to give an autoscaler, in words."""
    a = tp.autoscale
    return [
        f"autoscale: {a.min_replicas} to {a.max_replicas} replicas; scale out above "
        f"{a.target_of(ScalingMetric.REQUESTS_IN_FLIGHT):,.1f} requests in flight per replica "
        f"({a.requests_in_flight:,.1f} at capacity, less the HPA's 10% tolerance) or KV cache "
        f"{a.target_of(ScalingMetric.KV_CACHE_USAGE):.0%} in use ({a.kv_cache_usage:.0%} at capacity)",
    ]


def serving_front_table(front: Sequence[Ranked], show_gpus: bool = False) -> Table:
    """The throughput per GPU against speed per user front; ``show_gpus``: each point's
    GPU count first (a sweep over counts, whose front mixes them)."""
    table = Table(title="front: throughput per GPU against tokens/s per user", title_justify="left")
    for name in ("GPUs",) * show_gpus + ("deployment", "max seqs", "tok/s/GPU", "tok/s/user",
                                          "TPOT mean ms"):
        table.add_column(name, justify="left" if name == "deployment" else "right")
    for r in front:
        seqs = r.plan.deployment.max_num_seqs
        table.add_row(*(str(r.plan.deployment.gpus),) * show_gpus, _serving_label(r),
                      str(seqs) if seqs else "default", f"{r.per_gpu:,.0f}",
                      f"{r.user_tokens_per_s:,.1f}", f"{r.prediction.tpot_ms.mean:,.1f}")
    return table


def serving_evaluation(path: str, plan: ServingPlan, pred: ServingPrediction,
                       step: StepModel) -> list[Any]:
    """A serving plan's prediction: what runs, latencies against the SLO, throughput,
    memory, where a decode and a prefill iteration go, and the batch over the run."""
    from rich.markup import escape

    d, w, c, slo = plan.deployment, plan.workload, plan.cluster, plan.slo
    out: list[Any] = [escape(
        f"{path}: {plan.model.name} on {c.gpus} x {c.device.name} ({c.name}), {plan.engine.value}, "
        f"{d.label()}, weights {d.weights.value}, KV cache {d.kv_cache.value}, max_num_seqs "
        f"{step.max_num_seqs}, max_batched_tokens {step.max_batched_tokens}, chunked prefill "
        f"{'on' if step.chunked_prefill else 'off'}; {w.input_len.mean:g} in / {w.output_len.mean:g} "
        f"out, {w.arrival.label()}, {w.requests} requests")]
    if not pred.fits:
        out.append(f"[red]does not fit: {pred.memory.peak / GiB:.1f} GiB per GPU of "
                   f"{c.device.mem_GiB:.0f}, no room for the KV cache[/red]")
        out.append(_serving_memory_table(pred))
        return out
    table = Table(title="latency, ms", title_justify="left")
    for name in ("", "mean", "p50", "p90", "p99", f"SLO (p{slo.percentile:g})"):
        table.add_column(name, justify="left" if not name else "right")
    for label, lat, target in (("TTFT", pred.ttft_ms, slo.ttft_ms), ("TPOT", pred.tpot_ms, slo.tpot_ms),
                               ("E2E", pred.e2e_ms, None)):
        table.add_row(label, f"{lat.mean:,.1f}", f"{lat.p50:,.1f}", f"{lat.p90:,.1f}", f"{lat.p99:,.1f}",
                      f"{target:g}" if target is not None else "-")
    out.append(table)
    verdict = ("meets the SLO" if pred.meets_slo else "misses the SLO") if slo.any else "no SLO given"
    per_gpu = pred.output_tokens_per_s / d.gpus
    queue = "" if pred.steady else "; the queue grows through the run"
    out.append(escape(
        f"throughput {pred.output_tokens_per_s:,.0f} output tokens/s ({per_gpu:,.0f} per GPU), "
        f"{pred.total_tokens_per_s:,.0f} total, {pred.requests_per_s:,.2f} requests/s, "
        f"goodput {pred.goodput_rps:,.2f}; {verdict}{queue}; {pred.simulated_requests} requests "
        f"simulated on one of {pred.schedulers} schedulers, {pred.preemptions} preemptions"
        + ("" if pred.prefix_hit_share is None else
           f"; {pred.prefix_hit_share:.0%} of prompt tokens from the prefix cache")))
    out.append(escape(_per_million_line(pred, c.pue)))
    if d.disaggregated is not None and pred.prefill_pool is not None:
        pp = pred.prefill_pool
        out.append(escape(
            f"disaggregated: prefill pool {d.disaggregated.prefill.label()} (peak "
            f"{pp.memory.peak / GiB:.1f} GiB per GPU, {pp.kv_cache_tokens:,} KV tokens per instance) "
            f"runs each prompt to its first token; its KV cache reaches the decode pool "
            f"{d.disaggregated.decode.label()} in {pp.transfer_ms_mean:,.1f} ms on average; below: "
            "the decode pool's memory and iterations"))
    out.append(_serving_memory_table(pred))
    ctx = w.input_len.mean + w.output_len.mean / 2
    batch = max(1, pred.max_concurrency)
    decode = step.iteration(batch, batch, batch * ctx, 0.0, 0.0, batch)
    n = int(min(w.input_len.mean, step.max_batched_tokens))
    prefill = step.iteration(n, 0, 0.0, n * (n + 1) / 2, 0.0, 1)
    parts = Table(title=f"where an iteration goes, ms (decode: {batch} sequences at {ctx:,.0f} tokens "
                        f"of context; prefill: one {n:,}-token prompt)", title_justify="left")
    for name in ("", "decode", "prefill"):
        parts.add_column(name, justify="left" if not name else "right")
    for key, value in decode.to_dict().items():
        parts.add_row(key, f"{1e3 * value:,.3f}", f"{1e3 * prefill.to_dict()[key]:,.3f}")
    parts.add_row("total", f"{1e3 * decode.total:,.3f}", f"{1e3 * prefill.total:,.3f}")
    out.append(parts)
    if pred.timeline:
        picks = pred.timeline[:: max(1, len(pred.timeline) // 12)][:12]
        line = Table(title="the batch over the run (one scheduler)", title_justify="left")
        line.add_column("time s", justify="right")
        line.add_column("running sequences", justify="right")
        line.add_column("tokens in the iteration", justify="right")
        for t, running, tokens in picks:
            line.add_row(f"{t:,.2f}", str(running), f"{tokens:,}")
        out.append(line)
    out += evidence_lines(pred)
    return out


def evidence_lines(pred: ServingPrediction, lead: str = "") -> list[str]:
    """How far to trust the prediction (serving.trust): the engine release and its
    constants, the measured kernels, the held-out error of its regime; escaped for rich."""
    from rich.markup import escape

    if pred.evidence is None:
        return []
    return [escape(f"{lead}{line}") for line in pred.evidence.lines()]


def _serving_memory_table(pred: ServingPrediction) -> Table:
    table = Table(title="memory per GPU (GiB)", title_justify="left")
    mem = pred.memory.to_gib()
    for name in (*mem, "KV tokens", "max concurrency"):
        table.add_column(name, justify="right")
    table.add_row(*(f"{v:.1f}" for v in mem.values()), f"{pred.kv_cache_tokens:,}", str(pred.max_concurrency))
    return table


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
    from autoplan.diff import Delta, PlanDiff, ServingDiff

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
    from autoplan.diff import ServingDiff

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
