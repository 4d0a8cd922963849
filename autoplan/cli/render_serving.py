"""Rich tables for the serving commands' results: serve's ranking, sweep, front and traffic
plan, and evaluate's serving prediction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from autoplan.serving.autoscale import ScalingMetric
from autoplan.units import GiB

if TYPE_CHECKING:
    from autoplan.serving.cost import StepModel
    from autoplan.serving.deployment import ServingPlan, Slo
    from autoplan.serving.evaluate import ServingPrediction
    from autoplan.serving.search import Ranked
    from autoplan.serving.traffic_plan import TrafficPlan



def ms(x: float | None) -> str:
    """Milliseconds in a table cell ("-": none)."""
    return "-" if x is None else f"{x:,.4g}"


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
    decode = step.iteration(batch, decodes=batch, decode_context=batch * ctx, prefill_pairs=0.0,
                            prefill_context=0.0, sampled=batch)
    n = int(min(w.input_len.mean, step.max_batched_tokens))
    prefill = step.iteration(n, decodes=0, decode_context=0.0, prefill_pairs=n * (n + 1) / 2,
                             prefill_context=0.0, sampled=1)
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
