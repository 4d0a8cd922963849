"""``autoplan tune``: run the best few plans of a search for real and rank them by what
they measured (DeepSpeed's autotuner and NeMo's AutoConfigurator answer the same question
by trial; here the search picks which trials are worth running).

From the search's ranked plans it takes the first ``top_k`` distinct ones (distinct: a
different layout or schedule; of plans differing only in ZeRO stage, micro-batch or
recompute the best predicted stands for its kind) that the runner can run (the others
are skipped, each with the runner's reason) and whose prediction is within ``within`` of
the best's; runs each (``runners``); and ranks them: the runs that measured, fastest
first, then the others in the order they ran. Each trial is stopped where it runs out of
memory, past its time, or off its prediction by more than the trial's factor
(``runners``), recorded with why, and the next one runs. ``stop`` is asked before each
trial (a first Ctrl-C: no more trials); a KeyboardInterrupt during one (a second) ends it
and the tuning, keeping what was measured."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoplan.plan import Plan, Prediction
from autoplan.tune.runners import Outcome, Progress, Runner, Trial
from autoplan.tune.runs import Run, plan_id
from autoplan.units import GiB


@dataclass(frozen=True, slots=True)
class TrialResult:
    plan: Plan
    prediction: Prediction  # the search's
    outcome: Outcome
    searched_rank: int  # its place in the search's ranking, from 1
    started: str = ""  # ISO 8601 UTC

    @property
    def predicted_step_s(self) -> float:
        """The prediction for what ran (the runner's where it predicts, else the search's)."""
        own = self.outcome.predicted_step_s
        return own if own is not None else self.prediction.step_time_s

    @property
    def predicted_peak_gib(self) -> float:
        own = self.outcome.predicted_peak_gib
        return own if own is not None else self.prediction.memory.peak / GiB

    def to_dict(self, document: dict[str, Any]) -> dict[str, Any]:
        o = self.outcome
        return {
            "plan": document,
            "predicted": {"step_time_s": self.predicted_step_s,
                          "peak_memory_gib": self.predicted_peak_gib},
            "measured": {"step_time_s": o.step_time_s, "peak_memory_gib": o.peak_gib,
                         "step_times_s": list(o.step_times_s)},
            "status": o.status,
            "reason": o.reason,
            "searched_rank": self.searched_rank,
            "plan_id": plan_id(self.plan),
            "notes": list(o.notes),
        }


@dataclass(frozen=True, slots=True)
class TuneResult:
    trials: tuple[TrialResult, ...]  # ranked by measurement (module doc)
    skipped: tuple[tuple[int, Plan, str], ...]  # (searched rank, plan, the runner's reason)
    interrupted: bool = False

    @property
    def best(self) -> int | None:
        """Index of the fastest measured trial (the first), None where none measured."""
        return 0 if self.trials and self.trials[0].outcome.status == "ok" else None


def distinct_key(plan: Plan) -> tuple:
    """What makes two plans different trials: the layout and the schedule."""
    return (plan.layout, plan.schedule)


def pick(ranked: Sequence[tuple[Plan, Prediction]], runner: Runner, top_k: int,
         within: float | None = None) -> tuple[list[tuple[int, Plan, Prediction]],
                                               list[tuple[int, Plan, str]]]:
    """The trials to run (searched rank, plan, prediction) and the candidates the runner
    refused on the way (module doc)."""
    chosen: list[tuple[int, Plan, Prediction]] = []
    skipped: list[tuple[int, Plan, str]] = []
    seen: set[tuple] = set()
    refused: set[tuple] = set()  # one note per kind of plan the runner cannot run
    best = ranked[0][1].step_time_s if ranked else 0.0
    for i, (plan, pred) in enumerate(ranked, start=1):
        if len(chosen) >= top_k:
            break
        if within is not None and pred.step_time_s > best * (1 + within):
            break
        key = distinct_key(plan)
        if key in seen or key in refused:
            continue
        why = runner.refuses(plan)
        if why:
            refused.add(key)
            skipped.append((i, plan, why))
            continue
        seen.add(key)
        chosen.append((i, plan, pred))
    return chosen, skipped


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def tune(ranked: Sequence[tuple[Plan, Prediction]], runner: Runner, trial: Trial, *, top_k: int = 3,
         within: float | None = None, workdir: Path | None = None,
         progress: Progress = lambda _: None, stop: Callable[[], bool] = lambda: False,
         done: Callable[[TrialResult], None] = lambda _: None) -> TuneResult:
    """Run the chosen plans (:func:`pick`) one after another; see module doc. ``done`` is
    told of each trial as it ends."""
    chosen, skipped = pick(ranked, runner, top_k, within)
    results: list[TrialResult] = []
    interrupted = False
    for n, (rank, plan, pred) in enumerate(chosen, start=1):
        if stop():
            break
        spec = dataclasses.replace(
            trial, predicted_step_s=pred.step_time_s,
            workdir=None if workdir is None else workdir / f"trial-{n}-{plan_id(plan)}")
        progress(f"trial {n} of {len(chosen)}: {layout_text(plan)} ({runner.name}, "
                 f"{trial.warmup} + {trial.steps} steps, predicted {pred.step_time_s:.3g} s each)")
        started = _now()
        def told(line: str, n: int = n) -> None:
            progress(f"trial {n}: {line}")

        try:
            outcome = runner.run(plan, spec, told)
        except KeyboardInterrupt:
            outcome = Outcome(status="failed", reason="interrupted (Ctrl-C): the run was stopped")
            interrupted = True
        result = TrialResult(plan, pred, outcome, rank, started)
        results.append(result)
        done(result)
        if interrupted:
            break
    ok = sorted((r for r in results if r.outcome.status == "ok"),
                key=lambda r: (r.outcome.step_time_s, r.searched_rank))
    rest = [r for r in results if r.outcome.status != "ok"]
    return TuneResult(tuple(ok + rest), tuple(skipped), interrupted)


def layout_words(plan: Plan) -> list[str]:
    """A plan's degrees in words (``dp8 tp2 pp1``, then ``shardN``, ``cpN``, ``epN``,
    ``vppN`` where they are set)."""
    lay = plan.layout
    parts = [f"dp{lay.dp}", f"tp{lay.tp}", f"pp{lay.pp}"]
    if lay.dp_shard < lay.dp:
        parts.append(f"shard{lay.dp_shard}")
    return parts + [f"{k}{v}" for k, v in (("cp", lay.cp), ("ep", lay.ep), ("vpp", lay.vpp)) if v > 1]


def layout_text(plan: Plan) -> str:
    """One line naming what a trial runs."""
    return " ".join(layout_words(plan)) + (f", mbs {plan.micro_batch}, {plan.schedule.value}, "
                                           f"zero {int(plan.zero)}, recompute {plan.recompute.value}")


def runs_of(result: TuneResult, runner: str, steps: int) -> list[Run]:
    """The runs log rows of a tuning (every trial, measured or not). The runs log holds
    numbers in one range (:mod:`autoplan.tune.runs`): a prediction outside it is left out
    (calibrate predicts again), and a trial whose measurement is outside it is recorded as
    failed, with why, its numbers left out, so that the tuning's other rows are still
    written."""
    from autoplan.tune.runs import peak_gib_problem, step_time_problem

    out = []
    for t in result.trials:
        o = t.outcome
        run = Run(plan=t.plan, status=o.status, measured_step_time_s=o.step_time_s,
                  measured_peak_gib=o.peak_gib, reason=o.reason, source="tune", runner=runner,
                  time=t.started, steps=steps if o.status == "ok" else None,
                  predicted_step_time_s=t.predicted_step_s if step_time_problem(t.predicted_step_s) is None
                  else None,
                  predicted_peak_gib=t.predicted_peak_gib if peak_gib_problem(t.predicted_peak_gib) is None
                  else None)
        why = [f"{key}: {problem}" for key, value, check in (
            ("measured_step_time_s", o.step_time_s, step_time_problem),
            ("measured_peak_gib", o.peak_gib, peak_gib_problem))
            if value is not None and (problem := check(value)) is not None]
        if why:
            run = dataclasses.replace(run, status="failed", measured_step_time_s=None, measured_peak_gib=None,
                                      steps=None, reason="not a measurement: " + "; ".join(why))
        out.append(run)
    return out
