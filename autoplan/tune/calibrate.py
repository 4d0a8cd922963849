"""``autoplan calibrate``: a software stack's bounded constants fitted to the user's own
measured runs (the runs log, :mod:`autoplan.tune.runs`), with the same discipline as the
accuracy benchmark (``benchmarks/accuracy.py``): the loss is the mean |ln(predicted /
measured)| over the runs, minimised one constant at a time (a coarse grid over its bounds
to find the basin, then golden-section search inside it: :func:`descend`), and what the
fit claims is reported on runs it did not see: each group of runs (a plan's repeats, or
the ``group`` column) predicted with constants fitted on the other groups only
(leave-one-group-out cross-validation).

The constants (``PARAMS``), each inside bounds a real stack can hold:

- ``compute_efficiency``: the share of the device's kernel rates the stack sustains;
- ``step_overhead_ms``: the fixed host cost of a step (optimizer launch, logging);
- ``host_kernel_us``: the host's dispatch time per kernel (eager stacks only);
- ``comm_compute_slowdown``: compute slowed while communication overlaps it.

A constant the runs cannot identify is not fitted, and the report says which and why:
one no run's prediction moves with (by 1% across its bounds: ``host_kernel_us`` under CUDA
graphs, ``comm_compute_slowdown`` where nothing overlaps), or one that moves every run's
prediction the way a constant fitted before it does (``step_overhead_ms`` and
``compute_efficiency`` on runs of one step time: the runs cannot tell a slower kernel
from a longer step's fixed cost). At least two groups are needed, to hold one out.

The cost is the distinct plans' (:func:`autoplan.tune.runs.distinct_plans`), not the
runs': each candidate set of constants predicts each distinct plan once, and the loss
sums each plan's runs at once (their sorted measurements: :class:`Sample`). Groups are
held out one at a time up to ``MAX_FOLDS``; past that they are dealt, in name order, into
``MAX_FOLDS`` folds held out one at a time (group k-fold), so a log of many groups costs
``MAX_FOLDS + 1`` fits, not one a group."""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autoplan.cost.evaluate import evaluate
from autoplan.descriptors.stack import Stack
from autoplan.errors import InputError
from autoplan.plan import Plan
from autoplan.tune.runs import Run, distinct_plans

# name -> (lowest, highest) a stack can hold (the stack file's own bounds, narrowed to
# where a value measures the stack rather than absorbs a cost the model lacks)
PARAMS: dict[str, tuple[float, float]] = {
    "compute_efficiency": (0.05, 1.0),
    "step_overhead_ms": (0.0, 1e5),
    "host_kernel_us": (0.0, 1e3),
    "comm_compute_slowdown": (0.0, 0.9),
}
MIN_EFFECT = 0.01  # a constant moving no prediction by 1% across its bounds is not identified
PARALLEL = 0.995  # |cos| of two constants' effects past which the runs cannot tell them apart
MAX_FOLDS = 10  # held-out folds past which groups are held out several at a time (module doc)
# distinct measured plans calibrate fits on: each fit predicts each about 180 times (a
# quarter to half a millisecond apiece), MAX_FOLDS + 1 fits: about a minute at this bound
MAX_PLANS = 100


def with_constants(stack: Stack, p: dict[str, float]) -> Stack:
    """``stack`` with the constants of ``p`` (in the stack file's units)."""
    return dataclasses.replace(
        stack,
        compute_efficiency=p.get("compute_efficiency", stack.compute_efficiency),
        step_overhead_s=p["step_overhead_ms"] * 1e-3 if "step_overhead_ms" in p else stack.step_overhead_s,
        host_kernel_s=p["host_kernel_us"] * 1e-6 if "host_kernel_us" in p else stack.host_kernel_s,
        comm_compute_slowdown=p.get("comm_compute_slowdown", stack.comm_compute_slowdown))


def constants_of(stack: Stack) -> dict[str, float]:
    return {"compute_efficiency": stack.compute_efficiency,
            "step_overhead_ms": stack.step_overhead_s * 1e3,
            "host_kernel_us": stack.host_kernel_s * 1e6,
            "comm_compute_slowdown": stack.comm_compute_slowdown}


# --------------------------------------------------------------------------- search

def golden(f: Callable[[float], float], lo: float, hi: float, steps: int = 12) -> float:
    """Minimise f on [lo, hi] by golden-section search (f assumed unimodal there)."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(steps):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


def descend(loss: Callable[[dict[str, float]], float], start: dict[str, float], names: Sequence[str],
            bounds: Callable[[str], tuple[float, float]], sweeps: int,
            after_sweep: Callable[[int, dict[str, float]], None] = lambda *_: None,
            digits: int = 2) -> dict[str, float]:
    """Coordinate descent of ``loss`` over ``names`` inside ``bounds``: per name a grid of 9
    over its bounds, then golden-section search between the best grid point's neighbours,
    rounded to ``digits``; up to ``sweeps`` passes, stopping when one changes nothing."""
    p = dict(start)

    def loss_with(name: str, value: float) -> float:
        return loss(dict(p, **{name: value}))

    for sweep in range(sweeps):
        before = dict(p)
        for name in names:
            lo, hi = bounds(name)
            grid = [lo + (hi - lo) * i / 8 for i in range(9)]
            losses = [loss_with(name, v) for v in grid]
            i = min(range(len(grid)), key=lambda k: (losses[k], k))
            a, b = grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)]
            p[name] = round(golden(functools.partial(loss_with, name), a, b, steps=10), digits)
        after_sweep(sweep, p)
        if p == before:
            break
    return p


# --------------------------------------------------------------------------- fitting

@dataclass(frozen=True, slots=True)
class Held:
    """One run predicted with constants fitted without its group."""

    run: Run
    before_s: float  # with the base stack
    after_s: float  # with the fold's constants

    @property
    def measured_s(self) -> float:
        assert self.run.measured_step_time_s is not None
        return self.run.measured_step_time_s


@dataclass(frozen=True, slots=True)
class Calibration:
    base: Stack
    stack: Stack  # the base with the constants fitted on every run
    fitted: dict[str, float]  # the constants fitted, on every run
    not_fitted: dict[str, str]  # constant -> why the runs cannot identify it
    held_out: tuple[Held, ...]  # leave-one-group-out
    runs: int
    groups: int
    loss_before: float  # on every run, base stack
    loss_after: float  # on every run, fitted stack

    @property
    def mape_before(self) -> float:
        """Held-out step time error with the base stack, percent."""
        return mape([(h.before_s, h.measured_s) for h in self.held_out])

    @property
    def mape_after(self) -> float:
        """Held-out step time error with each fold's constants, percent."""
        return mape([(h.after_s, h.measured_s) for h in self.held_out])


def regime_of(plan: Plan) -> str:
    """The kind of parallelism a run is: its axes above 1, joined (``dp+pp``), or ``one GPU``."""
    lay = plan.layout
    axes = [k for k, v in (("dp", lay.dp), ("tp", lay.tp), ("pp", lay.pp), ("cp", lay.cp),
                           ("ep", lay.ep)) if v > 1]
    return "+".join(axes) or "one GPU"


def _predict(plans: Sequence[Plan], stack: Stack) -> list[float]:
    return [evaluate(dataclasses.replace(p, stack=stack)).step_time_s for p in plans]


@dataclass(frozen=True, slots=True)
class Sample:
    """Runs as calibrate costs them: their distinct plans, and each plan's runs' ln
    measured step times, sorted, with their running sums, so that the loss of a prediction
    of each plan sums all of that plan's runs in one bisection."""

    plans: tuple[Plan, ...]
    logs: tuple[tuple[float, ...], ...]  # per plan, ascending
    sums: tuple[tuple[float, ...], ...]  # per plan, sums[k] = sum of logs[:k]
    runs: int

    @classmethod
    def of(cls, plans: Sequence[Plan], measured: Sequence[float]) -> Sample:
        distinct, of = distinct_plans(plans)
        logs: list[list[float]] = [[] for _ in distinct]
        for j, m in zip(of, measured, strict=True):
            logs[j].append(math.log(m))
        for x in logs:
            x.sort()
        return cls(tuple(distinct), tuple(tuple(x) for x in logs),
                   tuple(tuple(itertools.accumulate(x, initial=0.0)) for x in logs), len(plans))

    @property
    def weights(self) -> list[int]:
        """Runs of each distinct plan."""
        return [len(x) for x in self.logs]

    def loss(self, predicted: Sequence[float]) -> float:
        """The mean |ln(predicted / measured)| over the runs, ``predicted`` given for each
        distinct plan."""
        total = 0.0
        for p, logs, sums in zip(predicted, self.logs, self.sums, strict=True):
            x = math.log(p)
            k = bisect.bisect_left(logs, x)  # the runs measuring less than predicted
            total += x * k - sums[k] + (sums[-1] - sums[k]) - x * (len(logs) - k)
        return total / self.runs


def identifiable(plans: Sequence[Plan], base: Stack, bounds: dict[str, tuple[float, float]]
                 ) -> tuple[list[str], dict[str, str]]:
    """The constants the runs can identify, in ``PARAMS`` order, and why each other one
    cannot be (module doc): each constant's effect is the change in every run's log
    prediction from its lowest to its highest value, the others at the base's (each
    distinct plan predicted once, weighed by its runs)."""
    distinct, of = distinct_plans(plans)
    weight = [0] * len(distinct)
    for j in of:
        weight[j] += 1
    start = constants_of(base)
    effects: dict[str, list[float]] = {}
    ok: list[str] = []
    why: dict[str, str] = {}

    def dot(a: Sequence[float], b: Sequence[float]) -> float:
        return sum(w * x * y for w, x, y in zip(weight, a, b, strict=True))

    for name, (lo, hi) in bounds.items():
        low = _predict(distinct, with_constants(base, dict(start, **{name: lo})))
        high = _predict(distinct, with_constants(base, dict(start, **{name: hi})))
        effect = [math.log(h / lo_) for h, lo_ in zip(high, low, strict=True)]
        if max(abs(e) for e in effect) < MIN_EFFECT:
            why[name] = (f"no run's prediction moves by {MIN_EFFECT:.0%} across {lo:g}..{hi:g}: "
                         "these runs do not exercise it")
            continue
        norm = math.sqrt(dot(effect, effect))
        twin = next((other for other in ok if abs(dot(effect, effects[other]))
                     / (norm * math.sqrt(dot(effects[other], effects[other]))) > PARALLEL), None)
        if twin is not None:
            why[name] = (f"moves every run's prediction as {twin} does: these runs cannot tell "
                         f"them apart (runs of more varied step times, or layouts, would)")
            continue
        effects[name] = effect
        ok.append(name)
    return ok, why


def fit(plans: Sequence[Plan], measured: Sequence[float], base: Stack, names: Sequence[str],
        bounds: dict[str, tuple[float, float]], sweeps: int = 2) -> dict[str, float]:
    """The constants ``names`` minimising the loss on these runs (the others at the base's):
    coordinate descent (:func:`descend`) to find the basin, then Nelder-Mead over all of
    them at once inside their bounds (scipy), which follows the narrow valleys coordinate
    steps stall in (a kernel rate traded against a step's fixed cost)."""
    return fit_sample(Sample.of(plans, measured), base, names, bounds, sweeps)


def fit_sample(sample: Sample, base: Stack, names: Sequence[str],
               bounds: dict[str, tuple[float, float]], sweeps: int = 2) -> dict[str, float]:
    """:func:`fit` of runs already made a :class:`Sample`."""
    from scipy.optimize import minimize

    start = constants_of(base)

    def loss(p: dict[str, float]) -> float:
        return sample.loss(_predict(sample.plans, with_constants(base, p)))

    p = descend(loss, start, names, lambda n: bounds[n], sweeps)
    lo = [bounds[n][0] for n in names]
    span = [bounds[n][1] - bounds[n][0] or 1.0 for n in names]

    def scaled(x: Sequence[float]) -> float:  # every constant on [0, 1] of its bounds
        q = dict(p, **{n: lo[i] + span[i] * min(1.0, max(0.0, x[i])) for i, n in enumerate(names)})
        return loss(q)

    x0 = [(p[n] - lo[i]) / span[i] for i, n in enumerate(names)]
    found = minimize(scaled, x0, method="Nelder-Mead", bounds=[(0.0, 1.0)] * len(names),
                     options={"xatol": 1e-4, "fatol": 1e-7, "maxiter": 200 * len(names)})
    if found.fun < loss(p):
        p = dict(p, **{n: lo[i] + span[i] * min(1.0, max(0.0, float(found.x[i])))
                       for i, n in enumerate(names)})
    return {k: round(v, 4) if k in names else v for k, v in p.items()}


def folds(groups: Sequence[str]) -> list[list[str]]:
    """The groups held out together, fold by fold: each its own up to ``MAX_FOLDS``, else
    dealt in name order into ``MAX_FOLDS`` folds (module doc)."""
    ordered = sorted(groups)
    if len(ordered) <= MAX_FOLDS:
        return [[g] for g in ordered]
    return [ordered[i::MAX_FOLDS] for i in range(MAX_FOLDS)]


def calibrate(runs: Sequence[Run], base: Stack, name: str, source: str = "runs log") -> Calibration:
    """Fit ``base``'s constants on the measured runs; see module doc."""
    measured_runs = [r for r in runs if r.ok]
    if not measured_runs:
        raise InputError.single(source, "", "no run with status ok and a measured step time")
    ids: dict[Plan, str] = {}
    keys = [r.group or ids.setdefault(r.plan, r.plan_id) for r in measured_runs]
    groups = sorted(set(keys))
    if len(groups) < 2:
        raise InputError.single(source, "", f"{len(measured_runs)} measured runs, all of one plan "
                                "(or group): at least two are needed to hold one out")
    plans = [r.plan for r in measured_runs]
    measured = [float(r.measured_step_time_s or 0.0) for r in measured_runs]
    everything = Sample.of(plans, measured)
    if len(everything.plans) > MAX_PLANS:
        raise InputError.single(source, "", (
            f"measured runs of {len(everything.plans):,} distinct plans: calibrate fits on at most "
            f"{MAX_PLANS} (each is predicted for every candidate constant); keep the runs of plans "
            "like the ones to be predicted (a runs log for each model or cluster)"))
    longest_ms = max(measured) * 1e3
    bounds = {k: (lo, min(hi, 2 * longest_ms) if k == "step_overhead_ms" else hi)
              for k, (lo, hi) in PARAMS.items()}
    if base.cuda_graphs:
        bounds.pop("host_kernel_us")
    names, why = identifiable(plans, base, bounds)
    if base.cuda_graphs:
        why["host_kernel_us"] = "the stack captures CUDA graphs: no per-kernel dispatch to fit"
    if not names:
        raise InputError.single(source, "", "no constant can be fitted on these runs: "
                                + "; ".join(f"{k}: {v}" for k, v in why.items()))
    distinct, of = everything.plans, distinct_plans(plans)[1]  # of: each run's plan among them
    fitted = fit_sample(everything, base, names, bounds)
    before_of = _predict(distinct, base)
    after_s: list[float] = [0.0] * len(measured_runs)
    for fold in folds(groups):
        out = set(fold)
        test = [i for i, k in enumerate(keys) if k in out]
        train = [i for i, k in enumerate(keys) if k not in out]
        constants = fit_sample(Sample.of([plans[i] for i in train], [measured[i] for i in train]),
                               base, names, bounds)
        tested = sorted({of[i] for i in test})
        predicted = dict(zip(tested, _predict([distinct[j] for j in tested],
                                              with_constants(base, constants)), strict=True))
        for i in test:
            after_s[i] = predicted[of[i]]
    held = [Held(r, before_of[of[i]], after_s[i]) for i, r in enumerate(measured_runs)]
    stack = dataclasses.replace(with_constants(base, fitted), name=name,
                                summary=f"{base.name} calibrated on {len(measured_runs)} measured runs")
    return Calibration(base=base, stack=stack, fitted={k: fitted[k] for k in names}, not_fitted=why,
                       held_out=tuple(held), runs=len(measured_runs), groups=len(groups),
                       loss_before=everything.loss(before_of),
                       loss_after=everything.loss(_predict(distinct, stack)))


def mape(pairs: Sequence[tuple[float, float]]) -> float:
    """Mean absolute percentage error of (predicted, measured) pairs."""
    return 100 * statistics.fmean(abs(p / m - 1) for p, m in pairs)


def by_regime(held: Sequence[Held]) -> dict[str, tuple[int, float, float]]:
    """regime -> (runs, held-out MAPE before, after)."""
    out: dict[str, list[Held]] = {}
    for h in held:
        out.setdefault(regime_of(h.run.plan), []).append(h)
    return {k: (len(v), mape([(h.before_s, h.measured_s) for h in v]),
                mape([(h.after_s, h.measured_s) for h in v])) for k, v in sorted(out.items())}
