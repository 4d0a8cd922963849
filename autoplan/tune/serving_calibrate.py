"""``autoplan calibrate`` of serving runs: one engine release line's constants (the ones
its engine file's ``FITTED`` holds, :class:`autoplan.serving.engine.Fitted`: host time per
iteration ``host_step_s`` and per sampled sequence ``host_seq_s``, the kernels' time over
the roofline's ``kernel_scale``, the host time per kernel launched outside a CUDA graph
``launch_s``, the front end's time per request ``request_s``) fitted to the measured
serving runs of that line (the runs log's serving rows, :mod:`autoplan.tune.serving_runs`).

The fit is least squares on ln(predicted / measured) of each run's mean TTFT and mean
TPOT, each predicted by simulating the run's plan (``serving.evaluate``, the
``serving.cost.StepModel`` of its deployment) with the constants varied (``fitted_as``),
inside the bounds an engine can hold (:data:`autoplan.serving.calibration.BOUNDS`), from
the line's own constants. A simulated time steps as the constants move a request into
another iteration, so its slope is read by probes wide enough to step over those steps:
Gauss-Newton iterations whose Jacobian moves each constant by 5% (``PROBE_STEP``), each
step the bounded least squares of the linearised errors, halved until it lowers the loss;
where no step does, the probes are halved (a derivative read by a narrower difference reads
the steps and stalls short of the minimum: scipy's ``least_squares`` with 1% differences
stopped 1 to 4% off in TTFT on runs made with known constants). As
``benchmarks/serving_fit.py`` fits the shipped constants, but on the user's runs of the
user's engine.

A constant the runs cannot identify is not fitted (kept at the line's own), and the
report says which and why: one whose change moves no run's TTFT or TPOT by 1%
(``MIN_EFFECT``: ``launch_s`` where every iteration replays a CUDA graph, ``kernel_scale``
where the host time hides the GPU's), or one that moves them all as a constant before it
does (``PARALLEL``: ``host_seq_s`` on runs of one batch size moves every run as
``host_step_s`` does). Fewer than ``MIN_RUNS`` measured runs, or runs of one group (a
plan's repeats, or the ``group`` column), are refused: one must be held out.

What the fit claims is reported on runs it did not see: each group's runs predicted with
constants fitted without them (leave-one-group-out; past ``MAX_FOLDS`` groups, the groups
dealt in name order into ``MAX_FOLDS`` folds), the TTFT and TPOT mean absolute percentage
error before (the line's own constants) and after. A fold's search starts from the
constants fitted on every run: a starting point only (its loss is its own runs'), which
spares each fold most of the search from the line's constants (a fold's fit costs a few
trust-region steps instead of a dozen)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autoplan.errors import InputError
from autoplan.serving.calibration import BOUNDS, CONSTANTS, Calibration
from autoplan.serving.deployment import ServingPlan
from autoplan.serving.engine import Engine, Fitted, fitted_as
from autoplan.tune.serving_runs import ServingRun

MIN_RUNS = 3
MIN_EFFECT = 0.01
PARALLEL = 0.995
MAX_FOLDS = 5
MAX_PLANS = 100  # distinct plans: each is simulated for every trial of the constants
PROBE_STEP = 0.05  # the Jacobian's probes: 5% of each constant (module doc)
MIN_PROBE_STEP = 0.005  # halved where no step helps, down to this
MAX_STEPS = 30
MIN_GAIN = 1e-3  # a step lowering the loss by less ends the search
# the optimizer's units (each constant of order one in them) and the step each constant is
# moved by to see what it moves (identifiability)
UNITS = {"host_step_s": 1e-3, "host_seq_s": 1e-6, "kernel_scale": 1.0, "launch_s": 1e-6, "request_s": 1e-3}
PROBE = {"host_step_s": 2e-3, "host_seq_s": 2e-5, "kernel_scale": 0.5, "launch_s": 5e-5, "request_s": 2e-3}
# what runs would identify each constant (the refusal says it)
WOULD = {"host_step_s": "runs of more varied iteration counts (output lengths) would",
         "host_seq_s": "runs of several batch sizes (concurrency or rate) would",
         "kernel_scale": "runs whose GPU time differs (prompt lengths, TP, batch) would",
         "launch_s": "runs with eager iterations (long prefills, batches past the CUDA graphs) would",
         "request_s": "runs whose arrivals queue at the front end (higher rates) would"}


@dataclass(frozen=True, slots=True)
class Held:
    """One run predicted with constants fitted without its group: (TTFT, TPOT) ms."""

    run: ServingRun
    before: tuple[float, float]
    after: tuple[float, float]

    @property
    def measured(self) -> tuple[float, float]:
        m = self.run.measured
        assert m is not None
        return (m.ttft_ms.mean, m.tpot_ms.mean)


@dataclass(frozen=True, slots=True)
class ServingCalibration:
    engine: Engine
    line: str
    base: dict[str, float]  # the line's own constants
    constants: dict[str, float]  # fitted on every run (the others the base's)
    fitted: tuple[str, ...]
    not_fitted: dict[str, str]  # constant -> why the runs cannot identify it
    held_out: tuple[Held, ...]
    runs: int
    groups: int
    rms_before: float  # of ln(predicted / measured), every run, the base constants
    rms_after: float  # the same with the fitted constants

    def mape(self, which: int, after: bool) -> float:
        """Held-out mean absolute percentage error of TTFT (0) or TPOT (1), percent."""
        pairs = [((h.after if after else h.before)[which], h.measured[which]) for h in self.held_out
                 if h.measured[which] > 0]
        return 100 * statistics.fmean(abs(p / m - 1) for p, m in pairs) if pairs else math.nan

    def calibration(self, origin: str) -> Calibration:
        return Calibration(engine=self.engine, line=self.line, constants=dict(self.constants),
                           fitted=self.fitted, runs=self.runs, origin=origin)


def constants_of(entry: Fitted | None) -> dict[str, float]:
    if entry is None:
        return {k: (1.0 if k == "kernel_scale" else 0.0) for k in CONSTANTS}
    return {k: float(getattr(entry, k)) for k in CONSTANTS}


def line_of(plan: ServingPlan) -> str:
    return plan.engine_line.version


class _Predictor:
    """The distinct plans of the runs, simulated with trial constants."""

    def __init__(self, engine: Engine, line: str, plans: Sequence[ServingPlan]) -> None:
        self.engine, self.line, self.plans = engine, line, list(plans)
        self.base_entry = engine.spec.at(line or None).fitted or Fitted(host_step_s=0.0, source="")

    def __call__(self, constants: dict[str, float], which: Sequence[int] | None = None
                 ) -> dict[int, tuple[float, float]]:
        from autoplan.serving.calibration import with_constants
        from autoplan.serving.evaluate import evaluate_serving

        entry = with_constants(self.base_entry, constants, source="a trial of calibrate")
        out = {}
        with fitted_as(self.engine, {self.line: entry}):
            for j in (range(len(self.plans)) if which is None else which):
                pred = evaluate_serving(self.plans[j], evidence=False)
                out[j] = (max(pred.ttft_ms.mean, 1e-9), max(pred.tpot_ms.mean, 1e-9))
        return out


def _residuals(pred: dict[int, tuple[float, float]], rows: Sequence[tuple[int, float, float]]) -> list[float]:
    """ln(predicted / measured) of each row's (plan, TTFT, TPOT); a TPOT of 0 (one output
    token) left out."""
    out = []
    for j, ttft, tpot in rows:
        p = pred[j]
        out.append(math.log(p[0] / ttft))
        if tpot > 0:
            out.append(math.log(p[1] / tpot))
    return out


def identifiable(predict: _Predictor, rows: Sequence[tuple[int, float, float]], base: dict[str, float]
                 ) -> tuple[list[str], dict[str, str]]:
    """The constants the runs identify, in ``CONSTANTS`` order, and why each other cannot
    be (module doc): each constant's effect is the change of every run's ln TTFT and ln
    TPOT when it moves by ``PROBE`` from the line's value (inside its bounds)."""
    at_base = predict(base)
    ok: list[str] = []
    effects: dict[str, list[float]] = {}
    why: dict[str, str] = {}
    for name in CONSTANTS:
        lo, hi = BOUNDS[name]
        step = PROBE[name] * (base[name] if name == "kernel_scale" else 1.0)
        moved = min(hi, base[name] + step)
        if moved == base[name]:
            moved = max(lo, base[name] - step)
        trial = predict(dict(base, **{name: moved}))
        effect = [a - b for a, b in zip(_residuals(trial, rows), _residuals(at_base, rows), strict=True)]
        if max((abs(e) for e in effect), default=0.0) < MIN_EFFECT:
            why[name] = (f"no run's TTFT or TPOT moves by {MIN_EFFECT:.0%} when it moves from "
                         f"{base[name]:.3g} to {moved:.3g}: these runs do not exercise it ({WOULD[name]})")
            continue
        norm = math.sqrt(sum(e * e for e in effect))
        twin = next((o for o in ok if abs(sum(a * b for a, b in zip(effect, effects[o], strict=True)))
                     / (norm * math.sqrt(sum(b * b for b in effects[o]))) > PARALLEL), None)
        if twin is not None:
            why[name] = (f"moves every run's TTFT and TPOT as {twin} does: these runs cannot tell them "
                         f"apart ({WOULD[name]})")
            continue
        effects[name] = effect
        ok.append(name)
    return ok, why


def fit(predict: _Predictor, rows: Sequence[tuple[int, float, float]], base: dict[str, float],
        names: Sequence[str], start: dict[str, float] | None = None) -> dict[str, float]:
    """The constants ``names`` minimising the squared ln errors of ``rows`` (the others the
    base's), searched from ``start`` (default the base): Gauss-Newton steps on a Jacobian
    read by probes of ``PROBE_STEP`` of each constant (module doc), each step the bounded
    linear least squares of the linearised errors (scipy's ``lsq_linear``), halved until it
    lowers the loss; where none does, the probes are halved, down to ``MIN_PROBE_STEP``."""
    import numpy as np
    from scipy.optimize import lsq_linear

    which = sorted({j for j, _, _ in rows})
    lo = np.array([BOUNDS[n][0] / UNITS[n] for n in names])
    hi = np.array([BOUNDS[n][1] / UNITS[n] for n in names])
    first = base if start is None else start
    x = np.clip(np.array([first[n] / UNITS[n] for n in names]), lo, hi)

    def constants(v: Any) -> dict[str, float]:
        return dict(base, **{n: float(v[i]) * UNITS[n] for i, n in enumerate(names)})

    def residuals(v: Any) -> Any:
        return np.array(_residuals(predict(constants(v), which), rows))

    r = residuals(x)
    cost = float(r @ r)
    probe = PROBE_STEP
    for _ in range(MAX_STEPS):
        if cost < 1e-12:
            break
        # a constant at 0 (a host time none was fitted for) is probed by a share of its bounds
        h = np.maximum(probe * np.abs(x), probe * 0.02 * (hi - lo))
        jac = np.empty((len(r), len(x)))
        for i in range(len(x)):
            moved = x.copy()
            sign = 1.0 if x[i] + h[i] <= hi[i] else -1.0
            moved[i] += sign * h[i]
            jac[:, i] = (residuals(moved) - r) / (sign * h[i])
        step = lsq_linear(jac, -r, bounds=(lo - x, hi - x)).x
        for _ in range(4):
            trial = np.clip(x + step, lo, hi)
            rt = residuals(trial)
            if float(rt @ rt) < cost:
                gain = 1.0 - float(rt @ rt) / cost
                x, r, cost = trial, rt, float(rt @ rt)
                break
            step = step / 2
        else:
            gain = 0.0
            probe /= 2
            if probe < MIN_PROBE_STEP:
                break
        if 0.0 < gain < MIN_GAIN:  # what is left is the simulation's steps, not the constants'
            break
    return constants(x)


def folds(groups: Sequence[str]) -> list[list[str]]:
    ordered = sorted(groups)
    if len(ordered) <= MAX_FOLDS:
        return [[g] for g in ordered]
    return [ordered[i::MAX_FOLDS] for i in range(MAX_FOLDS)]


def lines_of(runs: Sequence[ServingRun]) -> dict[tuple[Engine, str], list[ServingRun]]:
    """The measured runs by (engine, release line)."""
    out: dict[tuple[Engine, str], list[ServingRun]] = {}
    for r in runs:
        if r.ok:
            out.setdefault((r.plan.engine, line_of(r.plan)), []).append(r)
    return out


def calibrate_serving(runs: Sequence[ServingRun], engine: Engine, line: str,
                      source: str = "runs log") -> ServingCalibration:
    """Fit ``engine``'s release line ``line`` on its measured runs; see module doc."""
    mine = [r for r in runs if r.ok and r.plan.engine is engine and line_of(r.plan) == line]
    label = f"{engine.value} release line {line}" if line else engine.value
    if len(mine) < MIN_RUNS:
        raise InputError.single(source, "", (
            f"{len(mine)} measured serving run{'s' * (len(mine) != 1)} of {label}: calibrate needs at "
            f"least {MIN_RUNS} (some to fit on while another is held out)"))
    keys = [r.group_key for r in mine]
    groups = sorted(set(keys))
    if len(groups) < 2:
        raise InputError.single(source, "", f"{len(mine)} measured runs of {label}, all of one plan (or "
                                            "group): at least two are needed to hold one out")
    texts: dict[str, int] = {}
    plans: list[ServingPlan] = []
    rows: list[tuple[int, float, float]] = []
    for r in mine:
        j = texts.setdefault(r.plan_json, len(plans))
        if j == len(plans):
            plans.append(r.plan)
        assert r.measured is not None
        tpot = r.measured.tpot_ms.mean if r.plan.workload.output_len.mean > 1 else 0.0
        rows.append((j, r.measured.ttft_ms.mean, tpot))
    if len(plans) > MAX_PLANS:
        raise InputError.single(source, "", f"measured runs of {len(plans):,} distinct plans: calibrate fits "
                                            f"on at most {MAX_PLANS}")
    if any(p.deployment.disaggregated is not None for p in plans):
        raise InputError.single(source, "", "a disaggregated deployment's runs: calibrate fits aggregated "
                                            "deployments' (tune --serving's)")
    predict = _Predictor(engine, line, plans)
    base = constants_of(predict.base_entry)
    names, why = identifiable(predict, rows, base)
    if not names:
        raise InputError.single(source, "", "no constant can be fitted on these runs: "
                                + "; ".join(f"{k}: {v}" for k, v in why.items()))
    residuals = 2 * len(rows) - sum(1 for _, _, t in rows if t <= 0)
    if residuals <= len(names):
        raise InputError.single(source, "", f"{len(mine)} runs give {residuals} measurements for "
                                            f"{len(names)} constants ({', '.join(names)}): measure more runs")
    fitted = fit(predict, rows, base, names)
    before_all = predict(base)
    after_all = predict(fitted)
    held_after: dict[int, tuple[float, float]] = {}
    for fold in folds(groups):
        out = set(fold)
        train = [row for row, k in zip(rows, keys, strict=True) if k not in out]
        test = sorted({row[0] for row, k in zip(rows, keys, strict=True) if k in out})
        predicted = predict(fit(predict, train, base, names, start=fitted), test)
        for i, (row, k) in enumerate(zip(rows, keys, strict=True)):
            if k in out:
                held_after[i] = predicted[row[0]]
    held = tuple(Held(r, before_all[row[0]], held_after[i]) for i, (r, row) in enumerate(zip(mine, rows,
                                                                                             strict=True)))

    def rms(pred: dict[int, tuple[float, float]]) -> float:
        res = _residuals(pred, rows)
        return math.sqrt(statistics.fmean(x * x for x in res))

    shown = {k: (float(f"{v:.4g}") if k in names else v) for k, v in fitted.items()}
    return ServingCalibration(engine=engine, line=line, base=base, constants=shown, fitted=tuple(names),
                              not_fitted=why, held_out=held, runs=len(mine), groups=len(groups),
                              rms_before=rms(before_all), rms_after=rms(after_all))
