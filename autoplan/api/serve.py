"""``autoplan serve`` as a function: rank serving deployments under a workload and an
SLO, on one GPU count, on a cluster of pools, over several counts, or through a day of
traffic.

:func:`prepare_serve` checks every option and builds the request (descriptors resolved,
the workload built, a calibration read) without simulating; :meth:`ServeJob.run`
simulates. :func:`serve` is both."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoplan.api._base import MAX_TOP, Progress, Result, check_top, choice, frame, gpu_counts, ref, told
from autoplan.errors import InputError, naming

if TYPE_CHECKING:
    import pandas

    from autoplan.serving.calibration import Calibration
    from autoplan.serving.request import ServeOptions, ServeRequest
    from autoplan.serving.search import Ranked
    from autoplan.serving.sweep import ServeObjective
    from autoplan.serving.traffic import Traffic
    from autoplan.serving.traffic_plan import TrafficPlan

SERVE_COLUMNS = ("rank", "deployment", "gpus", "engine", "weights", "kv_cache", "fits", "meets_slo",
                 "goodput_rps", "ttft_ms_slo", "tpot_ms_slo", "tokens_per_s_per_gpu", "tokens_per_s_per_user",
                 "usd_per_million_tokens")
SWEEP_COLUMNS = ("gpus", "chosen", "fits", "deployment", "meets_slo", "goodput_rps", "tokens_per_s_per_gpu",
                 "tokens_per_s_per_user", "ttft_ms_slo", "tpot_ms_slo", "usd_per_million_tokens",
                 "kwh_per_million_tokens", "objective_value", "reason")


def serving_row(rank: int, r: Ranked) -> dict[str, Any]:
    """One ranked deployment as a table row (:data:`SERVE_COLUMNS`)."""
    p, d = r.prediction, r.plan.deployment
    return {"rank": rank, "deployment": d.label(), "gpus": d.gpus, "engine": r.plan.engine.value,
            "weights": d.weights.value, "kv_cache": d.kv_cache.value, "fits": p.fits,
            "meets_slo": p.meets_slo,
            "goodput_rps": p.goodput_rps, "ttft_ms_slo": p.slo_ttft_ms, "tpot_ms_slo": p.slo_tpot_ms,
            "tokens_per_s_per_gpu": r.per_gpu, "tokens_per_s_per_user": r.user_tokens_per_s,
            "usd_per_million_tokens": None if p.per_million is None else p.per_million.cost_usd}


def max_num_seqs(r: Ranked) -> int:
    """The batch limit a ranked serving plan ran with (the engine's default where unset)."""
    from autoplan.serving.deployment import resolved_limits

    p = r.plan
    return resolved_limits(p.deployment, p.engine, p.cluster.device, p.engine_version)[0]


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeSweep:
    """Several GPU counts: each count's best deployment, the count the objective chooses."""

    objective: ServeObjective
    chosen_gpus: int | None
    rows: tuple[dict[str, Any], ...]  # serve --format json's "sweep", a row a count
    result: Any  # autoplan.serving.sweep.ServeSweep, for tables and plots

    def to_frame(self) -> pandas.DataFrame:
        return frame(self.rows, SWEEP_COLUMNS)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeResult(Result):
    """The deployments ranked (best first, at most ``top``; priced where a price was
    given), the front of throughput per GPU against tokens/s per user; ``reason``: why the
    best does not meet the SLO, where it does not. Several GPU counts: ``sweep``; a day of
    traffic: ``traffic`` (one replica shape, the replicas each period needs)."""

    request: ServeRequest
    plans: tuple[Ranked, ...]
    front: tuple[Ranked, ...]
    ok: bool  # the command's exit 0: the best deployment fits and meets the SLO
    reason: str | None = None
    search: Any = None  # autoplan.serving.search.ServeResult (one count): what it simulated
    sweep: ServeSweep | None = None
    traffic: TrafficPlan | None = None
    traffic_table: Traffic | None = None
    budget_gpus: int | None = None  # with traffic: the most GPUs it may scale to
    document: dict[str, Any] = field(default_factory=dict, repr=False)  # computed under the calibration

    @property
    def best(self) -> Ranked | None:
        return self.plans[0] if self.plans else None

    @property
    def notes(self) -> tuple[str, ...]:
        return self.request.notes

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.document)

    def to_frame(self) -> pandas.DataFrame:
        """The ranked deployments, a row each (:data:`SERVE_COLUMNS`); over several GPU
        counts, each count's best."""
        return frame([serving_row(i, r) for i, r in enumerate(self.plans, start=1)], SERVE_COLUMNS)

    table = to_frame

    def plan_yaml(self, plan_dir: str | None = None) -> str:
        """The best plan as ``serve --out`` writes it (a trace named relative to ``plan_dir``)."""
        from autoplan.api.search import plan_yaml
        from autoplan.serving.evaluate import serving_document

        if self.traffic is not None:
            return plan_yaml(serving_document(self.traffic.plan, self.traffic.prediction, plan_dir))
        if not self.plans:
            raise InputError.single("--out", "", "no deployment fits: no plan to write")
        return plan_yaml(serving_document(self.plans[0].plan, self.plans[0].prediction, plan_dir))

    def front_svg(self, title: str | None = None) -> str:
        """The serving front (tokens/s per GPU against tokens/s per user) as ``serve --plot``
        draws it."""
        from autoplan.serving.plot import serving_front_svg

        points, front, chosen, label_gpus, default = self.front_parts()
        return serving_front_svg(points, front, chosen, title or default, label_gpus=label_gpus)

    def front_parts(self) -> tuple[Sequence[Ranked], Sequence[Ranked], Ranked | None, bool, str]:
        """What a front plot draws: every deployment, the front, the chosen one, whether
        points are labelled by GPU count, and the default title."""
        m, eng = self.request.model, self.request.engine
        if self.sweep is not None:
            every = [r for cr in self.sweep.result.counts for r in cr.result.plans]
            counts = [cr.gpus for cr in self.sweep.result.counts]
            chosen = self.sweep.result.chosen
            c = self.request.base_cluster or self.request.cluster
            if not every:
                raise InputError.single("--plot", "", "no deployment fits at any GPU count: nothing to draw")
            return (every, self.sweep.result.front, None if chosen is None else chosen.best, True,
                    f"{m.name} on {c.device.name}, {eng.value}: the serving front at "
                    f"{', '.join(map(str, counts))} GPUs")
        if self.search is None or not self.search.plans:
            raise InputError.single("--plot", "", "no deployment fits: nothing to draw")
        c = self.request.cluster
        return (self.search.plans, self.search.front, self.search.plans[0], False,
                f"{m.name} on {c.gpus} x {c.device.name}, {eng.value}: the serving front")


def check_traffic_options(given: Sequence[tuple[str, object]]) -> None:
    """With ``--traffic``, the options it replaces (each period has its own arrival) refused,
    the first named: ``given`` is (option, value or None) in the command's order."""
    clashing = [flag for flag, value in given if value is not None]
    if clashing:
        raise InputError.single(clashing[0], "", "--traffic plans each period of the traffic file: "
                                                 f"leave out {', '.join(clashing)}")


def check_autoscale_out(autoscale_out: object, traffic: object) -> None:
    """``--autoscale-out`` writes a day's plan's autoscaler settings: only with ``--traffic``."""
    if autoscale_out is not None and traffic is None:
        raise InputError.single("--autoscale-out", "", "writes the autoscaler settings of a day's plan: "
                                                       "give --traffic FILE.csv")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeJob:
    """A serve checked and ready to run."""

    request: ServeRequest
    options: ServeOptions
    counts: tuple[int, ...] | None
    objective: ServeObjective | None
    top: int
    disaggregated: bool
    calibration: Calibration | None
    traffic: Traffic | None = None
    traffic_source: str | None = None
    budget_gpus: int | None = None

    @property
    def notes(self) -> tuple[str, ...]:
        return self.request.notes

    @property
    def sweep(self) -> bool:
        return self.counts is not None and len(self.counts) > 1

    def run(self, progress: Progress | None = None) -> ServeResult:
        """Simulate; ``progress`` is told as each GPU count's search ends."""
        from autoplan.serving.calibration import applied

        with applied(self.calibration):
            if self.traffic is not None:
                return self._traffic(self.traffic)
            if self.sweep:
                return self._sweep(told(progress))
            return self._one()

    def _one(self) -> ServeResult:
        from autoplan.serving.evaluate import serving_document
        from autoplan.serving.search import serve_pooled_search, serve_search

        req, price = self.request, self.options.price
        w, kv = list(req.weights), list(req.kv_caches)
        if req.pools is not None:  # prefill on one pool, decode on another
            result = serve_pooled_search(req.model, req.pools, req.engine, req.workload, req.slo, w, kv,
                                         engine_version=req.engine_version)
        else:
            result = serve_search(req.model, req.cluster, req.engine, req.workload, req.slo, w, kv,
                                  disaggregated=self.disaggregated, speculative=req.speculative,
                                  engine_version=req.engine_version)
        shown = result.plans[:self.top]
        if price is not None:
            shown = tuple(dataclasses.replace(r, prediction=r.prediction.priced(price)) for r in shown)
        ok = bool(shown) and shown[0].prediction.meets_slo
        front = [{"deployment": r.plan.deployment.label(), "tokens_per_s_per_gpu": r.per_gpu,
                  "tokens_per_s_per_user": r.user_tokens_per_s, "tpot_ms_mean": r.prediction.tpot_ms.mean,
                  "max_num_seqs": max_num_seqs(r)} for r in result.front]
        doc: dict[str, Any] = {"plans": [serving_document(r.plan, r.prediction) for r in shown],
                               "pareto": front}
        reason = None if ok else result.why_none(req.slo)
        if not ok:
            doc["reason"] = reason
        return ServeResult(request=req, plans=tuple(shown), front=result.front, ok=ok, reason=reason,
                           search=result, document=doc)

    def _sweep(self, progress: Progress) -> ServeResult:
        from autoplan.serving.evaluate import serving_document
        from autoplan.serving.sweep import ServeObjective, objective_value, serve_sweep

        req, counts = self.request, self.counts
        goal = self.objective or ServeObjective.GOODPUT
        c, slo = req.base_cluster, req.slo
        assert c is not None and counts is not None
        sweep = serve_sweep(req.model, c, counts, req.engine, req.workload, slo, req.weights, req.kv_caches,
                            objective=goal, price_per_gpu_hour=self.options.price,
                            disaggregated=self.disaggregated, speculative=req.speculative, progress=progress,
                            engine_version=req.engine_version)
        chosen = sweep.chosen
        best = None if chosen is None else chosen.best
        rows = []
        for cr in sweep.counts:
            b = cr.best
            row: dict[str, Any] = {"gpus": cr.gpus, "chosen": chosen is not None and cr.gpus == chosen.gpus}
            if b is None:
                row.update(fits=False, reason=cr.result.why_none(slo))
            else:
                p = b.prediction
                row.update(fits=True, deployment=b.plan.deployment.label(), meets_slo=p.meets_slo,
                           goodput_rps=p.goodput_rps, tokens_per_s_per_gpu=b.per_gpu,
                           tokens_per_s_per_user=b.user_tokens_per_s, ttft_ms_slo=p.slo_ttft_ms,
                           tpot_ms_slo=p.slo_tpot_ms,
                           usd_per_million_tokens=None if p.per_million is None else p.per_million.cost_usd,
                           kwh_per_million_tokens=None if p.per_million is None else p.per_million.energy_kwh,
                           objective_value=_finite(objective_value(b, goal, slo)))
            rows.append(row)
        front = [{"gpus": r.plan.deployment.gpus, "deployment": r.plan.deployment.label(),
                  "tokens_per_s_per_gpu": r.per_gpu, "tokens_per_s_per_user": r.user_tokens_per_s,
                  "tpot_ms_mean": r.prediction.tpot_ms.mean} for r in sweep.front]
        ok = best is not None and best.prediction.meets_slo
        bests = tuple(cr.best for cr in sweep.counts if cr.best is not None)
        doc: dict[str, Any] = {"objective": goal.value,
                               "chosen_gpus": None if chosen is None else chosen.gpus, "sweep": rows,
                               "pareto": front,
                               "plans": [serving_document(b.plan, b.prediction) for b in bests][:self.top]}
        reason = None
        if not ok:
            reason = ("no GPU count fits" if best is None else
                      chosen.result.why_none(slo) if chosen is not None else "")
            doc["reason"] = reason
        summary = ServeSweep(objective=goal, chosen_gpus=None if chosen is None else chosen.gpus,
                             rows=tuple(rows), result=sweep)
        return ServeResult(request=req, plans=bests[:self.top], front=sweep.front, ok=ok, reason=reason,
                           sweep=summary, document=doc)

    def _traffic(self, table: Traffic) -> ServeResult:
        from autoplan.serving.evaluate import serving_document
        from autoplan.serving.traffic_plan import plan_traffic

        req = self.request
        m, c = req.model, req.base_cluster
        assert c is not None
        tp = plan_traffic(req, table, budget_gpus=self.budget_gpus, price_per_gpu_hour=self.options.price)
        if tp is None:
            why = (f"no replica shape of {m.name} on {c.device.name} meets the SLO at the busiest period's "
                   "lengths, at any rate (a looser SLO, fp8 weights or KV cache, another device)")
            return ServeResult(request=req, plans=(), front=(), ok=False, reason=why, traffic_table=table,
                               budget_gpus=self.budget_gpus,
                               document={"traffic": None, "plans": [], "reason": why})
        reason = None
        if not tp.meets_slo:
            short = [p.period.label() for p in tp.periods if not p.meets_slo]
            why = (f"--gpus {self.budget_gpus} is too few" if self.budget_gpus is not None else
                   "no number of replicas meets the SLO at their lengths")
            reason = f"periods {', '.join(short)} fall short of the SLO: {why}"
        return ServeResult(request=req, plans=(), front=(), ok=tp.meets_slo, reason=reason, traffic=tp,
                           traffic_table=table, budget_gpus=self.budget_gpus,
                           document={"traffic": tp.to_dict(),
                                     "plans": [serving_document(tp.plan, tp.prediction)]})


# search's time is a training objective (docs/CLI.md: the objectives' one vocabulary)
OTHER_OBJECTIVE = ("days to train ranks training runs, autoplan search's; a deployment's speed is its "
                   "goodput per GPU, goodput")


def _serve_objective(value: ServeObjective | str | None, counts: tuple[int, ...] | None
                     ) -> ServeObjective | None:
    """``--objective``: it ranks GPU counts, so it needs several."""
    from autoplan.serving.sweep import ServeObjective

    if value is None:
        return None
    if value == "time":
        raise InputError.single("--objective", "", f"expected one of goodput, cost, energy, got 'time': "
                                                   f"{OTHER_OBJECTIVE}")
    goal: ServeObjective = choice("--objective", value, ServeObjective)
    if counts is None or len(counts) < 2:
        raise InputError.single("--objective", "", "it chooses among GPU counts: give several with --gpus "
                                                   "(8,16,32 or 8..64)")
    return goal


def _precisions(value: str | Sequence[Any]) -> str:
    """``--weights``/``--kv-cache``: comma-separated words, or a list of precisions."""
    if isinstance(value, str):
        return value
    return ",".join(str(getattr(v, "value", v)) for v in value)


def _read_calibration(path: str | Path | None) -> Calibration | None:
    if path is None:
        return None
    from autoplan.serving.calibration import read_calibration

    with naming(("--calibration", Path(path))):
        return read_calibration(Path(path))


def prepare_serve(
    job: str | Path | None = None,
    *,
    model: Any = None,
    cluster: Any = None,
    gpus: int | str | Sequence[int] | None = None,
    input_len: int | None = None,
    output_len: int | None = None,
    rate: float | None = None,
    concurrency: int | None = None,
    offline: bool = False,
    trace: str | Path | None = None,
    requests: int | None = None,
    ttft_slo: float | None = None,
    tpot_slo: float | None = None,
    percentile: float | None = None,
    engine: str | None = None,
    engine_version: str | None = None,
    weights: str | Sequence[Any] = "bf16",
    kv_cache: str | Sequence[Any] = "bf16",
    price: float | None = None,
    disaggregated: bool = False,
    prefix_share: float | None = None,
    prefix_groups: int | None = None,
    speculative: str | None = None,
    spec_tokens: int | None = None,
    acceptance_length: float | None = None,
    acceptance_rate: float | None = None,
    draft_model: Any = None,
    objective: ServeObjective | str | None = None,
    traffic: str | Path | None = None,
    top: int | None = None,
    calibration: str | Path | None = None,
) -> ServeJob:
    """Every option of :func:`serve` checked and its request built, without simulating."""
    from autoplan.serving.request import ServeOptions, build_serve_request, check_serve_options

    job_file = None if job is None else Path(job)
    if traffic is not None:
        check_traffic_options((("--rate", rate), ("--concurrency", concurrency),
                               ("--offline", offline or None), ("--trace", trace),
                               ("--disaggregated", disaggregated or None),
                               ("--objective", objective), ("--top", top)))
    if top is not None:
        check_top(top, most=MAX_TOP)
    counts = gpu_counts(gpus)
    goal = _serve_objective(objective, counts)
    given = ServeOptions(
        model=ref(model), cluster=ref(cluster), gpus=None if counts is None else counts[0],
        input_len=input_len, output_len=output_len, rate=rate, concurrency=concurrency, offline=offline,
        trace=None if trace is None else Path(trace), requests=requests, ttft_slo=ttft_slo, tpot_slo=tpot_slo,
        percentile=percentile, engine=engine, engine_version=engine_version, weights=_precisions(weights),
        kv_cache=_precisions(kv_cache), price=price, prefix_share=prefix_share, prefix_groups=prefix_groups,
        speculative=speculative, spec_tokens=spec_tokens, acceptance_length=acceptance_length,
        acceptance_rate=acceptance_rate, draft_model=ref(draft_model))
    common = dict(objective=goal, top=10 if top is None else top, disaggregated=disaggregated)
    if traffic is not None:
        return _prepare_traffic(job_file, given, counts, Path(traffic), calibration, common)
    draft = draft_model if isinstance(draft_model, (str, Path)) else None
    with naming(("--draft-model", draft)):
        serving_job = check_serve_options(job_file, given)
        req = build_serve_request(job_file, serving_job, given)
    cal = _checked_calibration(calibration, req)
    return ServeJob(request=req, options=given, counts=counts, calibration=cal, **common)  # type: ignore[arg-type]


def _checked_calibration(calibration: str | Path | None, req: ServeRequest) -> Calibration | None:
    """``--calibration``: the file read (its errors naming the option) and checked against
    the engine and release searched."""
    from autoplan.serving.calibration import check_engine

    cal = _read_calibration(calibration)
    check_engine(cal, req.engine, req.engine_version)
    return cal


def _prepare_traffic(job_file: Path | None, given: ServeOptions, counts: tuple[int, ...] | None,
                     traffic: Path, calibration: str | Path | None, common: dict[str, Any]) -> ServeJob:
    """``--traffic FILE.csv``: one replica shape for the day, the replicas each period
    needs (autoplan.serving.traffic_plan)."""
    from autoplan.descriptors.strict import read_yaml
    from autoplan.serving.planfile import MIN_RATE, ServingJob, read_serving_job
    from autoplan.serving.request import ARRIVAL_FLAGS, build_serve_request, check_serve_options
    from autoplan.serving.traffic import read_traffic

    if counts is not None and len(counts) > 1:
        raise InputError.single("--gpus", "", "with --traffic, the most GPUs the deployment may scale to: "
                                              "give one count")
    table = read_traffic(traffic)
    job = read_serving_job(read_yaml(job_file), str(job_file)) if job_file is not None else ServingJob()
    # the options' checks want an arrival and lengths: the busiest period's stand in for them (the
    # planner gives each period its own); lengths every row gives need not be given again
    rates = [p.rate_rps for p in table.periods if p.rate_rps]
    clients = [p.concurrency for p in table.periods if p.concurrency]
    if not rates and not clients:
        raise InputError.single(str(traffic), "rate_rps", "no requests in any period: nothing to plan")
    filled: dict[str, Any] = ({"rate": max(max(rates), MIN_RATE)} if rates
                              else {"concurrency": max(clients)})
    for key in ("input_len", "output_len"):
        cells = [getattr(p, key) for p in table.periods]
        if getattr(given, key) is None and getattr(job, key) is None and all(c is not None for c in cells):
            filled[key] = max(1, round(max(cells)))
    given = dataclasses.replace(given, gpus=None, **filled)
    draft = given.draft_model if isinstance(given.draft_model, str) else None
    with naming(("--draft-model", draft)):
        job = check_serve_options(job_file, given)
        req = build_serve_request(job_file, job, given)
    notes = tuple(f"--traffic overrides {job_file}'s arrival" if note.startswith(ARRIVAL_FLAGS) else note
                  for note in req.notes)
    req = dataclasses.replace(req, notes=notes)
    cal = _checked_calibration(calibration, req)
    budget = counts[0] if counts is not None else job.gpus
    return ServeJob(request=req, options=given, counts=None, calibration=cal, traffic=table,  # type: ignore[arg-type]
                    traffic_source=str(traffic), budget_gpus=budget, **common)


def serve(
    job: str | Path | None = None,
    *,
    model: Any = None,
    cluster: Any = None,
    gpus: int | str | Sequence[int] | None = None,
    input_len: int | None = None,
    output_len: int | None = None,
    rate: float | None = None,
    concurrency: int | None = None,
    offline: bool = False,
    trace: str | Path | None = None,
    requests: int | None = None,
    ttft_slo: float | None = None,
    tpot_slo: float | None = None,
    percentile: float | None = None,
    engine: str | None = None,
    engine_version: str | None = None,
    weights: str | Sequence[Any] = "bf16",
    kv_cache: str | Sequence[Any] = "bf16",
    price: float | None = None,
    disaggregated: bool = False,
    prefix_share: float | None = None,
    prefix_groups: int | None = None,
    speculative: str | None = None,
    spec_tokens: int | None = None,
    acceptance_length: float | None = None,
    acceptance_rate: float | None = None,
    draft_model: Any = None,
    objective: ServeObjective | str | None = None,
    traffic: str | Path | None = None,
    top: int | None = None,
    calibration: str | Path | None = None,
    progress: Progress | None = None,
) -> ServeResult:
    """``autoplan serve``: serving deployments simulated under the workload and ranked.

    ``job``: a serving job file (model, cluster, gpus, engine, workload, slo); each option
    overrides its field. ``gpus``: one count, or several (``[8, 16, 32]``, ``"8..64"``) to
    choose among by ``objective`` (goodput, cost, energy). ``traffic``: a CSV of periods
    (one replica shape, the replicas each period needs). ``calibration``: a serving
    engine's constants calibrated on measured runs (:func:`calibrate`). Raises
    :class:`~autoplan.errors.InputError` on bad input; a result whose ``ok`` is False where
    no deployment fits or meets the SLO (``reason`` says why)."""
    return prepare_serve(
        job, model=model, cluster=cluster, gpus=gpus, input_len=input_len, output_len=output_len, rate=rate,
        concurrency=concurrency, offline=offline, trace=trace, requests=requests, ttft_slo=ttft_slo,
        tpot_slo=tpot_slo, percentile=percentile, engine=engine, engine_version=engine_version,
        weights=weights, kv_cache=kv_cache, price=price, disaggregated=disaggregated,
        prefix_share=prefix_share, prefix_groups=prefix_groups, speculative=speculative,
        spec_tokens=spec_tokens, acceptance_length=acceptance_length, acceptance_rate=acceptance_rate,
        draft_model=draft_model, objective=objective, traffic=traffic, top=top,
        calibration=calibration).run(progress)
