"""`autoplan check`: the CI gate for a committed plan.

A plan passes when every rule it is checked against passes. The rules, by stable id:

- ``valid``: the file reads as a plan (schema v1, every field valid) and its layout
  divides the model, the batch and the GPUs. Both come from :func:`autoplan.plans.file.read_plan`,
  the one reader every command uses; when it fails, the input is bad (exit 2) and the
  other rules are skipped.
- ``fits-memory``: every pipeline stage's predicted peak (which includes the device's
  ``reserve_GiB`` for the CUDA context, communication buffers and fragmentation) fits
  the device memory.
- ``headroom`` (with a minimum headroom): every stage's peak plus that headroom fits.
- ``regression`` (with a maximum regression F): the plan's predicted step time is at
  most (1 + F) x that of the best plan the search finds for the same model, cluster and
  job over the search space. A search that finds nothing, or nothing faster, passes:
  the committed plan is then the best known.
- ``measured`` (with a runs log, :mod:`autoplan.tune.runs`): the last measured run of the
  same plan (same plan id) is at most (1 + S) x the baseline: the plan file's own
  ``measured.step_time_s`` (written by ``autoplan tune --out``), else the run before the
  last. A plan with no measured run in the log fails (the gate would check nothing); one
  run and no baseline passes (it is the baseline of the next).

Rules are evaluated independently, so a report names every rule that failed. The
report is data (frozen dataclasses); ``to_dict`` is its stable machine form, the same
bytes for the same input (text and JUnit XML are rendered by the command line).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoplan.cost.evaluate import evaluate
from autoplan.descriptors.space import SearchSpace
from autoplan.descriptors.strict import read_yaml
from autoplan.errors import InputError
from autoplan.plan import SCHEMA_VERSION, Plan, Prediction
from autoplan.plans.file import plan_document, read_plan, searched_space
from autoplan.search.engine import Ranked
from autoplan.search.launchable import resolve_space
from autoplan.search.launchable import search as launchable_search
from autoplan.serving.planfile import is_serving
from autoplan.units import GiB

if TYPE_CHECKING:
    from autoplan.descriptors.stack import Stack
    from autoplan.tune.runs import Run


class Rule(str, enum.Enum):
    """What a plan is checked for; the value is the stable id in every report format."""

    VALID = "valid"
    """The file reads as a plan: schema v1, and the layout divides model, batch and GPUs."""
    FITS_MEMORY = "fits-memory"
    """Every stage's predicted peak memory fits the device."""
    HEADROOM = "headroom"
    """Every stage's predicted peak plus the minimum headroom fits the device."""
    REGRESSION = "regression"
    """The predicted step time is within F of the best plan the search finds (serving:
    goodput per GPU under the SLO, else throughput per GPU, within F of the best deployment
    ``autoplan serve`` finds)."""
    MEASURED = "measured"
    """The last measured run of the plan (a runs log) within S of its baseline: the plan
    file's recorded measurement, else the run before."""
    MEETS_SLO = "meets-slo"
    """Serving plans with an SLO: TTFT and TPOT at its percentile within it, the queue steady."""


class Status(str, enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"  # the rule could not be evaluated: the input is bad
    SKIPPED = "skipped"  # not evaluated because the plan did not read


@dataclass(frozen=True, slots=True, kw_only=True)
class RuleResult:
    rule: Rule
    status: Status
    message: str  # one line: what was found
    details: tuple[str, ...] = ()  # further lines (every problem, every stage over)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.rule.value, "status": self.status.value,
                               "message": self.message}
        if self.details:
            out["details"] = list(self.details)
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Regression:
    """The plan against the best plan the search found (None: it found none that fits)."""

    space: str
    max_regression: float
    best: Ranked | None

    def gap(self, step_time_s: float) -> float | None:
        """How much slower the plan is than the best, relative (0.12 = 12 % slower)."""
        if self.best is None:
            return None
        return step_time_s / self.best.prediction.step_time_s - 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckReport:
    source: str
    rules: tuple[RuleResult, ...]
    plan: Plan | None = None  # None when the plan did not read
    prediction: Prediction | None = None
    regression: Regression | None = None  # with a maximum regression only
    min_headroom_bytes: float = 0.0
    # a serving plan: what it is in a few words, and its prediction and regression (JSON)
    summary: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def bad_input(self) -> bool:
        return any(r.status is Status.ERROR for r in self.rules)

    @property
    def failed(self) -> tuple[RuleResult, ...]:
        return tuple(r for r in self.rules if r.status in (Status.FAILED, Status.ERROR))

    @property
    def passed(self) -> bool:
        return not self.failed

    @property
    def exit_code(self) -> int:
        """0 pass, 1 a rule failed, 2 bad input."""
        return 2 if self.bad_input else 1 if self.failed else 0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "plan": self.source,
            "passed": self.passed,
            "status": "error" if self.bad_input else "passed" if self.passed else "failed",
            "failed": [r.rule.value for r in self.failed],
            "rules": [r.to_dict() for r in self.rules],
        }
        out.update(self.extra)
        if self.prediction is not None:
            out["prediction"] = self.prediction.to_dict()
        if self.regression is not None:
            reg = self.regression
            best: dict[str, Any] | None = None
            if reg.best is not None:
                best = plan_document(reg.best.plan, reg.best.prediction)
            gap = reg.gap(self.prediction.step_time_s) if self.prediction is not None else None
            out["regression"] = {"space": reg.space, "max_regression": reg.max_regression,
                                 "gap": gap, "best": best}
        return out


def check_plan(path: Path, *, space: SearchSpace | None = None, max_regression: float | None = None,
               min_headroom_gib: float = 0.0, runs: Sequence[Run] | None = None,
               max_slowdown: float = 0.10, runs_source: str = "runs log",
               stack: Stack | None = None, data: Any = None) -> CheckReport:
    """Check the plan file at ``path``. A plan that does not read is reported (rule
    ``valid`` in error, exit code 2), not raised, so CI reports can show why; bad options
    (a negative regression or headroom) raise :class:`InputError`. ``space``: where
    --max-regression searches; None: the space the plan file records (``space:``, written
    by search), else the default one. ``runs``: a runs log whose last run of the plan is
    held to ``max_slowdown`` (rule ``measured``). ``stack``: predict the plan, and search
    for --max-regression, on this software stack (a calibrated one: ``autoplan calibrate``)
    instead of the plan's; the runs log still matches the plan as written. ``data``: the
    plan file's mapping, given instead of read from ``path`` (``path`` then only names it:
    a plan object checked through ``autoplan.api.check``)."""
    if max_regression is not None and not max_regression >= 0.0:
        raise InputError.single("--max-regression", "", f"expected a fraction >= 0 (0.05 = 5 %), "
                                                         f"got {max_regression}")
    if not min_headroom_gib >= 0.0:
        raise InputError.single("--min-headroom", "", f"expected GiB >= 0, got {min_headroom_gib}")
    source = str(path)
    headroom = min_headroom_gib * GiB
    later = [Rule.FITS_MEMORY]
    if headroom > 0:
        later.append(Rule.HEADROOM)
    if max_regression is not None:
        later.append(Rule.REGRESSION)
    if runs is not None:
        later.append(Rule.MEASURED)
    try:
        if data is None:
            data = read_yaml(path)
        if is_serving(data):
            if runs is not None:
                raise InputError.single("--runs", "", "measured runs are of training plans; this "
                                                      "is a serving plan")
            if stack is not None:
                raise InputError.single("--stack", "", "a training framework's stack; a serving "
                                                       "plan's costs are its engine's")
            if space is not None:
                raise InputError.single("--space", "", "searches training plans; a serving plan's "
                                                       "regression is against `autoplan serve`")
            return _check_serving(source, data, max_regression, headroom, later)
        plan = read_plan(data, source)
        baseline = recorded_step_time(data, source) if runs is not None else None
        if space is None and max_regression is not None:
            space = resolve_space(searched_space(data), source, "space")
    except InputError as exc:
        return _not_read(source, exc, later, headroom)

    as_written = plan
    if stack is not None:
        plan = dataclasses.replace(plan, stack=stack)
        if space is not None:
            space = space.changed(stack=stack)
    pred = evaluate(plan)
    lay = plan.layout
    rules = [RuleResult(rule=Rule.VALID, status=Status.PASSED,
                        message=f"schema v{SCHEMA_VERSION}; dp*tp*pp*cp = {lay.gpus} GPUs, the layout "
                                f"divides the model and the global batch")]
    rules.append(_memory_rule(plan, pred, Rule.FITS_MEMORY, 0.0))
    if headroom > 0:
        rules.append(_memory_rule(plan, pred, Rule.HEADROOM, headroom))
    regression = None
    if max_regression is not None:
        assert space is not None
        if plan.placement is not None:  # the search over the same pools, alone and across
            from autoplan.search.pooled import search_pooled

            plans = search_pooled(plan.model, plan.placement.cluster, plan.job, space, 1).plans
        else:
            plans = launchable_search(plan.model, plan.cluster, plan.job, space, top_k=1).plans
        regression = Regression(space=space.name, max_regression=max_regression,
                                best=plans[0] if plans else None)
        rules.append(_regression_rule(plan, pred, regression))
    if runs is not None:
        rules.append(_measured_rule(as_written, runs, baseline, max_slowdown, runs_source))
    return CheckReport(source=source, rules=tuple(rules), plan=plan, prediction=pred,
                       regression=regression, min_headroom_bytes=headroom)


def _memory_rule(plan: Plan, pred: Prediction, rule: Rule, headroom: float) -> RuleResult:
    """Every stage's peak (reserve included) plus ``headroom`` against the device memory."""
    stages = range(len(pred.memory_per_stage))
    # across pools each stage against its own device (``Prediction.stage_capacity_bytes``)
    capacities = pred.stage_capacity_bytes or tuple(pred.capacity_bytes for _ in stages)
    need = f" + {headroom / GiB:.1f} GiB headroom" if headroom else ""
    over = [(s, m) for s, m in enumerate(pred.memory_per_stage)
            if m.peak + headroom > capacities[s]]
    # the stage with the least room left (on one device: the highest peak)
    worst = min(stages, key=lambda s: (capacities[s] - pred.memory_per_stage[s].peak, s))
    peak, capacity = pred.memory_per_stage[worst].peak, capacities[worst]
    where = f"stage {worst} peak" if plan.layout.pp > 1 else "peak"
    on = plan.on_stage(worst).cluster.device
    device = (f"{on.name} ({capacity / GiB:.1f} GiB; the peak includes its "
              f"{on.reserve_bytes / GiB:.1f} GiB reserve)")
    if not over:
        return RuleResult(rule=rule, status=Status.PASSED,
                          message=f"{where} {peak / GiB:.1f} GiB{need} fits {device}, "
                                  f"{(capacity - peak) / GiB:.1f} GiB free")
    also = f"; stages {', '.join(str(s) for s, _ in over)} over" if len(over) > 1 else ""
    details = tuple(
        f"stage {s}: peak {m.peak / GiB:.1f} GiB{need}, {(m.peak + headroom - capacities[s]) / GiB:.1f} GiB "
        "over (" + ", ".join(f"{k} {v:.1f}" for k, v in m.to_gib_dict().items() if k != "peak") + ")"
        for s, m in over)
    return RuleResult(rule=rule, status=Status.FAILED,
                      message=f"{where} {peak / GiB:.1f} GiB{need} exceeds {device}{also}",
                      details=details)


def _regression_rule(plan: Plan, pred: Prediction, reg: Regression) -> RuleResult:
    if reg.best is None:
        return RuleResult(rule=Rule.REGRESSION, status=Status.PASSED,
                          message=f"the search over the {reg.space} space finds no plan that fits; "
                                  "the committed plan is the best known")
    best = reg.best.prediction.step_time_s
    gap = reg.gap(pred.step_time_s)
    assert gap is not None
    limit = f"{reg.max_regression:.1%}"
    text = f"step {pred.step_time_s:.3f} s; the best plan in the {reg.space} space {best:.3f} s"
    if gap <= reg.max_regression:
        if gap > 0:
            verdict = f"{gap:.1%} slower, within {limit}"
        elif pred.feasible:
            verdict = "the committed plan is the best known"
        else:
            verdict = "faster than every plan that fits, but it does not fit itself (see fits-memory)"
        return RuleResult(rule=Rule.REGRESSION, status=Status.PASSED, message=f"{text}: {verdict}")
    return RuleResult(rule=Rule.REGRESSION, status=Status.FAILED,
                      message=f"{text}: {gap:.1%} slower, more than {limit}")


def recorded_step_time(data: Any, source: str) -> float | None:
    """The plan file's ``measured.step_time_s`` (``autoplan tune --out``), if it has one,
    read as every field is (``strict.Fields``: a number, in range, or named at fault)."""
    from autoplan.descriptors.strict import Fields
    from autoplan.errors import Problem
    from autoplan.tune.runs import MAX_STEP_S

    measured = data.get("measured") if isinstance(data, Mapping) else None
    if measured is None:
        return None
    problems: list[Problem] = []
    value = Fields(measured, source, "measured", problems).float(
        "step_time_s", None, positive=True, max=MAX_STEP_S)
    if problems:
        raise InputError(problems)
    return value


def _measured_rule(plan: Plan, runs: Sequence[Run], baseline: float | None, max_slowdown: float,
                   runs_source: str) -> RuleResult:
    from autoplan.tune.runs import latest, plan_id

    mine = latest(runs, plan)
    pid = plan_id(plan)
    if not mine:
        return RuleResult(rule=Rule.MEASURED, status=Status.FAILED, message=(
            f"no measured run of this plan (id {pid}) in {runs_source}: nothing to hold it to "
            "(run it with autoplan tune, or import its log with autoplan runs import --plan)"))
    last = mine[-1]
    step = last.measured_step_time_s
    assert step is not None
    when = f" ({last.time})" if last.time else ""
    if baseline is None and len(mine) > 1:
        baseline, against = mine[-2].measured_step_time_s, f"the run before{_at(mine[-2].time)}"
    else:
        against = "the plan file's recorded measurement"
    if baseline is None:
        return RuleResult(rule=Rule.MEASURED, status=Status.PASSED, message=(
            f"one measured run{when}: {step:.3f} s per step, the baseline of the next"))
    gap = step / baseline - 1
    text = (f"last run{when} {step:.3f} s per step against {baseline:.3f} s, {against}: "
            f"{abs(gap):.1%} {'slower' if gap > 0 else 'faster'}")
    if gap > max_slowdown:
        return RuleResult(rule=Rule.MEASURED, status=Status.FAILED,
                          message=f"{text}, more than {max_slowdown:.1%}")
    return RuleResult(rule=Rule.MEASURED, status=Status.PASSED,
                      message=f"{text}, within {max_slowdown:.1%}")


def _at(time: str) -> str:
    return f" ({time})" if time else ""


def _not_read(source: str, exc: InputError, later: list[Rule], headroom: float) -> CheckReport:
    """Rule ``valid`` in error with every problem (the first as the message: the one line CI
    reports show), the rules after it skipped."""
    problems = tuple(str(p) for p in exc.problems)
    rules = [RuleResult(rule=Rule.VALID, status=Status.ERROR, message=problems[0], details=problems[1:])]
    rules += [RuleResult(rule=r, status=Status.SKIPPED, message="not checked: the plan does not read")
              for r in later]
    return CheckReport(source=source, rules=tuple(rules), min_headroom_bytes=headroom)


def _check_serving(source: str, data: Any, max_regression: float | None, headroom: float,
                   later: list[Rule]) -> CheckReport:
    """The rules for a serving plan (``kind: serving``): valid, fits memory (and headroom),
    meets its SLO where it has one, and within ``max_regression`` of the best deployment
    ``autoplan serve`` finds for the same model, GPUs, engine, workload and precisions."""
    from autoplan.serving.evaluate import evaluate_serving, serving_document
    from autoplan.serving.planfile import read_serving_plan
    from autoplan.serving.search import serve_search

    try:
        plan = read_serving_plan(data, source)
    except InputError as exc:
        if plan_has_slo(data):  # the rules it would have had, in their order
            later = [r for r in later if r is not Rule.REGRESSION] + [Rule.MEETS_SLO] + (
                [Rule.REGRESSION] if Rule.REGRESSION in later else [])
        return _not_read(source, exc, later, headroom)
    pred = evaluate_serving(plan)
    d, c = plan.deployment, plan.cluster
    summary = (f"{plan.model.name} on {c.gpus} x {c.device.name} ({c.name}), {plan.engine.value} "
               f"{d.label()}, weights {d.weights.value}, KV cache {d.kv_cache.value}")
    rules = [RuleResult(rule=Rule.VALID, status=Status.PASSED,
                        message=f"schema v{SCHEMA_VERSION}, kind serving; {d.label()} = {d.gpus} GPUs, "
                                "tp divides the attention heads")]
    capacity = c.device.mem_bytes
    peak = pred.memory.peak
    fits = pred.fits
    rules.append(RuleResult(
        rule=Rule.FITS_MEMORY, status=Status.PASSED if fits else Status.FAILED,
        message=(f"peak {peak / GiB:.1f} of {capacity / GiB:.0f} GiB per GPU, "
                 f"{pred.kv_cache_tokens:,} tokens of KV cache per scheduler" if fits else
                 f"weights, activations and reserve leave no KV cache: {peak / GiB:.1f} GiB per GPU "
                 f"of {capacity / GiB:.0f}")))
    if headroom > 0:
        free = capacity - peak
        rules.append(RuleResult(
            rule=Rule.HEADROOM, status=Status.PASSED if free >= headroom else Status.FAILED,
            message=f"{free / GiB:.1f} GiB free per GPU, at least {headroom / GiB:.1f} required"))
    slo = plan.slo
    if slo.any:
        q = f"p{slo.percentile:g}"
        parts = []
        if slo.ttft_ms is not None:
            parts.append(f"TTFT {q} {pred.slo_ttft_ms:,.0f} ms (SLO {slo.ttft_ms:g})")
        if slo.tpot_ms is not None:
            parts.append(f"TPOT {q} {pred.slo_tpot_ms:,.1f} ms (SLO {slo.tpot_ms:g})")
        if not pred.steady:
            parts.append("the queue grows through the run")
        status = Status.PASSED if pred.meets_slo else Status.FAILED
        rules.append(RuleResult(rule=Rule.MEETS_SLO, status=status, message="; ".join(parts)))
    extra: dict[str, Any] = {"kind": "serving", "serving_prediction": pred.to_dict()}
    if max_regression is not None:
        # the space the plan's own search covered: its precisions, and its speculative
        # decoding beside none (a plan with it is held to the best with or without)
        result = serve_search(plan.model, c, plan.engine, plan.workload, slo, (d.weights,), (d.kv_cache,),
                              speculative=d.speculative, engine_version=plan.engine_version)
        what = "goodput per GPU" if slo.any else "output tokens/s per GPU"

        def score(goodput: float, tokens: float) -> float:
            return (goodput if slo.any else tokens) / d.gpus

        mine = score(pred.goodput_rps, pred.output_tokens_per_s)
        best = result.plans[0] if result.plans else None
        if best is None:
            rule = RuleResult(rule=Rule.REGRESSION, status=Status.PASSED,
                              message="no deployment the serve search tried fits: nothing to compare")
            gap = None
        else:
            top = score(best.prediction.goodput_rps, best.prediction.output_tokens_per_s)
            gap = top / mine - 1.0 if mine > 0 else math.inf
            ok = gap <= max_regression
            rule = RuleResult(
                rule=Rule.REGRESSION, status=Status.PASSED if ok else Status.FAILED,
                message=(f"{what} {mine:,.3g}, {gap:.1%} below the best ({top:,.3g}, "
                         f"{best.plan.deployment.label()}); at most {max_regression:.0%} allowed"
                         if gap > 0 else f"{what} {mine:,.3g}: as good as the best deployment found"))
        rules.append(rule)
        extra["regression"] = {"max_regression": max_regression, "gap": gap,
                               "best": serving_document(best.plan, best.prediction) if best else None}
    return CheckReport(source=source, rules=tuple(rules), min_headroom_bytes=headroom,
                       summary=summary, extra=extra)


def plan_has_slo(data: Any) -> bool:
    return isinstance(data, Mapping) and isinstance(data.get("slo"), Mapping)
