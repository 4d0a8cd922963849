"""The commands that take plans: ``evaluate`` (predict each), ``explain`` (where time and
memory go, the simulated schedule), ``export`` (a launcher's files) and ``check`` (the CI
gate). A plan is given as its file's path, or as the object (a training
:class:`~autoplan.plan.Plan` or a :class:`~autoplan.serving.deployment.ServingPlan`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from autoplan.api._base import PLAN_COLUMNS, Result, check_at_least, frame, plan_row
from autoplan.errors import InputError, naming

if TYPE_CHECKING:
    import pandas

    from autoplan.commands.check import CheckReport
    from autoplan.descriptors.space import SearchSpace
    from autoplan.measured.profile import Profile
    from autoplan.plan import Plan, Prediction
    from autoplan.serving.deployment import ServingPlan

# a plan as the API takes it: its file, or the object
PlanLike = Union[str, Path, "Plan", "ServingPlan"]
OBJECT = "<plan>"  # the source an object given in place of a file is named by


def read_profile_option(profile: str | Path | None) -> Profile | None:
    """``--profile``: the profile CSV, its errors naming the option."""
    if profile is None:
        return None
    from autoplan.measured.profile import read_profile

    with naming(("--profile", Path(profile))):
        return read_profile(Path(profile))


def read_runs_option(runs: str | Path | None) -> list[Any] | None:
    """``--runs``: the runs log, every error naming the option and the log (a row's own
    model or cluster file too)."""
    if runs is None:
        return None
    from autoplan.tune.runs import read_runs

    with naming(("--runs", Path(runs)), every="--runs"):
        return read_runs(Path(runs))


def resolve_stack_option(stack: str | Path | None) -> Any:
    if stack is None:
        return None
    from autoplan.descriptors.library import resolve_stack

    with naming(("--stack", str(stack))):
        return resolve_stack(str(stack), "--stack", "")


@dataclass(frozen=True, slots=True)
class _Loaded:
    """A plan as read: where from, and whether it is a serving plan."""

    source: str
    plan: Any
    serving: bool


def _is_object(plan: Any) -> bool:
    return not isinstance(plan, (str, Path))


def load_plans(plans: PlanLike | Sequence[PlanLike], profile: str | Path | None = None,
               given: Profile | None = None) -> list[_Loaded]:
    """Each plan read (a file, its cluster through the one door of measured profiles with
    ``given``) or taken as it is (an object); serving plans told apart. Every file is read
    before any is predicted."""
    from autoplan.descriptors.strict import read_yaml
    from autoplan.plans.file import read_plan
    from autoplan.serving.deployment import ServingPlan
    from autoplan.serving.planfile import is_serving, read_serving_plan

    items: list[Any] = ([plans] if isinstance(plans, (str, Path)) or not isinstance(plans, Sequence)
                        else list(plans))
    if not items:
        raise InputError.single("PLAN.yaml", "", "missing argument: give one or more plans")
    out = []
    profile_path = None if profile is None else Path(profile)
    for item in items:
        if _is_object(item):
            out.append(_Loaded(OBJECT, item, isinstance(item, ServingPlan)))
            continue
        path = Path(item)
        data = read_yaml(path)
        with naming(("--profile", profile_path)):
            if is_serving(data):
                out.append(_Loaded(str(path), read_serving_plan(data, str(path), profile=given), True))
            else:
                out.append(_Loaded(str(path), read_plan(data, str(path), profile=given), False))
    return out


def reliabilities(plan: Plan) -> dict[str, Any]:
    """What failures and checkpoints cost a run on the plan (cost/reliability.py), saved
    synchronously, and asynchronously where the cluster gives its host link; {} where its
    cluster file gives no failure rate and storage."""
    if plan.placement is not None or not plan.cluster.fails:
        return {}
    from autoplan.cost.reliability import reliability

    out = {"synchronous": reliability(plan)}
    if plan.cluster.host_link_Bps is not None:
        out["asynchronous"] = reliability(plan, asynchronous=True)
    return {k: v for k, v in out.items() if v is not None}


def training_document(plan: Plan, pred: Prediction) -> dict[str, Any]:
    """A training plan and its prediction as evaluate's (and explain's) JSON gives it."""
    from autoplan.plans.file import plan_document

    doc = plan_document(plan, pred)
    if found := reliabilities(plan):
        doc["prediction"]["reliability"] = {k: v.to_dict() for k, v in found.items()}
    return doc


def predicted(loaded: Sequence[Plan], given: Profile | None
              ) -> tuple[list[tuple[Plan, Prediction]], list[str]]:
    """Each plan's prediction, with the uncertainty band where its device carries a fitted
    correction; and the notes on where a profile corrects (or does not)."""
    from autoplan.cost.evaluate import evaluate as predict
    from autoplan.measured.door import Corrected

    results, notes = [], []
    for plan in loaded:
        if plan.cluster.device.correction is None:
            results.append((plan, predict(plan)))
            continue
        from autoplan.measured.surrogate import predict_with_band

        if note := Corrected(plan.cluster, given).note:
            notes.append(note)
        results.append((plan, predict_with_band(plan)))
    return results, notes


@dataclass(frozen=True, slots=True, kw_only=True)
class Evaluated:
    """One plan and its prediction (a training plan's, or a serving plan's simulation);
    ``learned``: the step time a runs log's measured runs predict for it (``runs=``), as
    evaluate's JSON gives it under ``learned_from_runs``."""

    source: str
    plan: Any
    prediction: Any
    serving: bool
    learned: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        """A training plan fits; a serving plan fits and meets its SLO (where it has one)."""
        if self.serving:
            return bool(self.prediction.fits and (not self.plan.slo.any or self.prediction.meets_slo))
        return bool(self.prediction.feasible)

    def to_dict(self) -> dict[str, Any]:
        if self.serving:
            from autoplan.serving.evaluate import serving_document

            return serving_document(self.plan, self.prediction)
        doc = training_document(self.plan, self.prediction)
        if self.learned is not None:
            doc["prediction"]["learned_from_runs"] = self.learned
        return doc


@dataclass(frozen=True, slots=True, kw_only=True)
class EvaluateResult(Result):
    """Each plan's prediction, in the order given; ``notes``: what the command says on
    stderr (a profile's correction, a plan the runs log cannot correct)."""

    plans: tuple[Evaluated, ...]
    notes: tuple[str, ...] = ()
    residual: Any = None  # the runs log's learned correction (autoplan.tune.residual), with runs=
    calibration: Any = None  # the serving engine's calibrated constants, with calibration=

    @property
    def ok(self) -> bool:
        """Every plan fits (the command's exit 0; 1 otherwise)."""
        return all(e.ok for e in self.plans)

    def check_one_kind(self) -> None:
        """One JSON document (``--format json``) holds training or serving plans, not both."""
        if len({e.serving for e in self.plans}) > 1:
            raise InputError.single("--format", "", "json takes training or serving plans, not both at once")

    def to_dict(self) -> dict[str, Any]:
        """``evaluate --format json``'s document (the command takes training or serving
        plans in one JSON document, not both)."""
        return {"plans": [e.to_dict() for e in self.plans]}

    def to_frame(self) -> pandas.DataFrame:
        """A row per plan: its source and kind, and the training table's columns (a serving
        plan's own: its deployment, SLO percentiles, tokens/s per GPU and per user)."""
        from autoplan.api.serve import SERVE_COLUMNS, serving_row
        from autoplan.serving.search import Ranked

        rows, columns = [], ["source", "kind"]
        for i, e in enumerate(self.plans, start=1):
            row = (serving_row(i, Ranked(e.plan, e.prediction)) if e.serving
                   else plan_row(i, e.plan, e.prediction))
            rows.append({"source": e.source, "kind": "serving" if e.serving else "training", **row})
        for name in (*PLAN_COLUMNS, *SERVE_COLUMNS):
            if name not in columns and any(name in r for r in rows):
                columns.append(name)
        return frame(rows, [c for c in columns if c != "launchers"])

    table = to_frame


def evaluate(plans: PlanLike | Sequence[PlanLike], *, profile: str | Path | None = None,
             stack: str | Path | None = None, runs: str | Path | None = None,
             calibration: str | Path | None = None) -> EvaluateResult:
    """``autoplan evaluate``: predict each plan (a training plan's step time, throughput,
    MFU and memory with their breakdown; a serving plan's latencies and throughput under
    its workload). ``profile``: a microbenchmark profile whose learned correction applies;
    ``stack``: run the training plans on this stack instead of theirs; ``runs``: a runs log
    whose measured runs correct the step time (``learned_from_runs``); ``calibration``: a
    serving engine's calibrated constants (serving plans only)."""
    from autoplan.serving.calibration import applied, check, read_calibration

    given = read_profile_option(profile)
    measured_runs = read_runs_option(runs)
    loaded = load_plans(plans, profile, given)
    serving = [x for x in loaded if x.serving]
    training = [x for x in loaded if not x.serving]
    cal = None
    if calibration is not None:
        if not serving:
            raise InputError.single("--calibration", "", "a serving engine's constants: give serving plans")
        with naming(("--calibration", Path(calibration))):
            cal = read_calibration(Path(calibration))
        check(cal, [x.plan for x in serving])
    simulated = {}
    if serving:  # the simulator loads numpy: only where a serving plan needs it
        from autoplan.serving.evaluate import evaluate_serving

        with applied(cal):
            simulated = {id(x): evaluate_serving(x.plan) for x in serving}
    software = resolve_stack_option(stack)
    plain = [x.plan if software is None else dataclasses.replace(x.plan, stack=software) for x in training]
    results, notes = predicted(plain, given)
    learned = None
    if measured_runs is not None:
        from autoplan.tune.residual import fit_residual

        with naming(("--runs", Path(str(runs))), every="--runs"):
            learned = fit_residual(measured_runs, str(runs))
    trained: dict[int, Evaluated] = {}
    for x, (plan, pred) in zip(training, results, strict=True):
        why_not = None if learned is None else learned.why_not(plan)
        if learned is not None and why_not is not None:
            notes.append(f"autoplan: note: --runs: {runs}: no correction for {x.source}: {why_not}")
        band = learned.to_dict(plan, pred) if learned is not None and why_not is None else None
        trained[id(x)] = Evaluated(source=x.source, plan=plan, prediction=pred, serving=False, learned=band)
    out = tuple(Evaluated(source=x.source, plan=x.plan, prediction=simulated[id(x)], serving=True)
                if x.serving else trained[id(x)] for x in loaded)
    return EvaluateResult(plans=out, notes=tuple(notes), residual=learned, calibration=cal)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExplainResult(Result):
    """A training plan explained: its prediction, each pipeline stage's work, and the
    simulated schedule (``microbatches`` of them: the plan's, or fewer for a readable
    picture); a serving plan: its evaluation (``stages`` and ``timeline`` are then None)."""

    source: str
    plan: Any
    prediction: Any
    serving: bool = False
    stages: tuple[Any, ...] | None = None  # autoplan.cost.stage.StageWork per stage
    timeline: Any = None  # autoplan.schedules simulation (events, busy time, makespan)
    microbatches: int | None = None
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return Evaluated(source=self.source, plan=self.plan, prediction=self.prediction,
                         serving=self.serving).ok

    @property
    def title(self) -> str:
        """The timeline's title: the schedule, its degrees and microbatches."""
        plan, m = self.plan, self.plan.num_microbatches
        sim_m = self.microbatches if self.microbatches is not None else m
        return (f"{plan.model.name}: {plan.schedule.value}, pp={plan.layout.pp}"
                + (f", vpp={plan.layout.vpp}" if plan.layout.vpp > 1 else "")
                + f", {sim_m} microbatches" + (f" (the plan runs {m})" if sim_m != m else ""))

    def to_dict(self) -> dict[str, Any]:
        """``explain --format json``: evaluate's document of the plan with the explanation
        (per-stage times, the simulated schedule's makespan and idle share per stage)."""
        doc = Evaluated(source=self.source, plan=self.plan, prediction=self.prediction,
                        serving=self.serving).to_dict()
        if self.serving:
            return {"plans": [doc]}
        from autoplan.schedules import timeline as tl

        plan, sim, works = self.plan, self.timeline, self.stages
        assert works is not None
        idle = tl.idle_fraction(sim.events, plan.layout.pp)
        doc["explanation"] = {
            "stages": [{"stage": s, "layers": w.layers, "forward_s": w.forward,
                        "backward_input_s": w.backward_input, "backward_weight_s": w.backward_weight,
                        "exposed_comm_s": w.comm.total} for s, w in enumerate(works)],
            "timeline": {"schedule": plan.schedule.value, "pp": plan.layout.pp, "vpp": plan.layout.vpp,
                         "microbatches": self.microbatches if self.microbatches is not None
                         else plan.num_microbatches,
                         "plan_microbatches": plan.num_microbatches, "makespan_s": sim.makespan,
                         "stages": [{"stage": s, "busy_s": sim.busy[s], "idle_share": idle[s],
                                     "peak_inflight": sim.peak_inflight[s]}
                                    for s in range(plan.layout.pp)]},
        }
        return {"plans": [doc]}

    def to_frame(self) -> pandas.DataFrame:
        """A row per pipeline stage: its layers, forward and backward seconds, exposed
        communication, and on the simulated timeline its busy seconds, idle share and
        most microbatches in flight."""
        if self.serving:
            raise InputError.single(self.source, "", "a serving plan has no pipeline stages to tabulate")
        doc = self.to_dict()["plans"][0]["explanation"]
        rows = [{**s, **{k: v for k, v in t.items() if k != "stage"}}
                for s, t in zip(doc["stages"], doc["timeline"]["stages"], strict=True)]
        return frame(rows, ("stage", "layers", "forward_s", "backward_input_s", "backward_weight_s",
                            "exposed_comm_s", "busy_s", "idle_share", "peak_inflight"))

    table = to_frame

    def timeline_svg(self) -> str:
        """The simulated schedule as ``explain --timeline FILE.svg`` draws it."""
        from autoplan.schedules import timeline as tl

        if self.serving:
            raise InputError.single("--timeline", "", "draws a training pipeline's schedule; a serving "
                                                      "plan's batch over the run is in its evaluation")
        return tl.timeline_svg(self.timeline.events, self.plan.layout.pp, title=self.title)


def diff(a: str | Path, b: str | Path) -> Any:
    """``autoplan diff``: what changed from plan file ``a`` to plan file ``b`` and what it
    does to the prediction (:class:`autoplan.commands.diff.PlanDiff`, or ``ServingDiff`` for two
    serving plans); both files' problems at once, two of a kind or refused."""
    from autoplan.commands.diff import diff_plans, diff_serving
    from autoplan.descriptors.strict import read_yaml
    from autoplan.plans.file import read_plan
    from autoplan.serving.planfile import is_serving, read_serving_plan

    a_path, b_path = Path(a), Path(b)
    problems: list[Any] = []
    plans: list[Any] = []
    documents = [read_yaml(a_path), read_yaml(b_path)]
    kinds = [is_serving(d) for d in documents]
    if kinds[0] != kinds[1]:
        raise InputError.single(str(b_path), "kind", "one plan is a serving plan and the other a training "
                                                     "plan: diff compares two of a kind")
    for path, data in zip((a_path, b_path), documents, strict=True):  # every problem at once
        try:
            plans.append(read_serving_plan(data, str(path)) if kinds[0] else read_plan(data, str(path)))
        except InputError as exc:
            problems.extend(exc.problems)
    if problems:
        raise InputError(problems)
    return (diff_serving(plans[0], plans[1], str(a_path), str(b_path)) if kinds[0]
            else diff_plans(plans[0], plans[1], str(a_path), str(b_path)))


def check_timeline(plan_path: str | Path) -> None:
    """``explain --timeline`` draws a training pipeline's schedule: refused for a serving plan
    file."""
    from autoplan.descriptors.strict import read_yaml
    from autoplan.serving.planfile import is_serving

    if is_serving(read_yaml(Path(plan_path))):
        raise InputError.single("--timeline", "", "draws a training pipeline's schedule; a serving "
                                                  "plan's batch over the run is shown in the output")


def explain(plan: PlanLike, *, microbatches: int | None = None, profile: str | Path | None = None,
            stack: str | Path | None = None) -> ExplainResult:
    """``autoplan explain``: where a plan's time and memory go, each stage's work, and its
    pipeline schedule simulated (``microbatches``: draw it with this many instead of the
    plan's). A serving plan is evaluated (``microbatches`` and ``stack`` are training
    options, refused)."""
    from autoplan.cost.evaluate import simulate_timeline
    from autoplan.cost.stage import stage_work
    from autoplan.parallel.pp import MAX_PIPELINE_OPS

    check_at_least("--microbatches", microbatches, 1)
    if not isinstance(plan, (str, Path)) and isinstance(plan, Sequence):
        raise InputError.single("PLAN.yaml", "", "explain takes one plan")
    given = read_profile_option(profile)
    (loaded,) = load_plans(plan, profile, given)
    if loaded.serving:
        if microbatches is not None or stack is not None:
            flag = "--microbatches" if microbatches is not None else "--stack"
            raise InputError.single(flag, "", (
                "sets a training plan's software stack; a serving plan's engine is in the plan"
                if flag == "--stack" else "draws a training pipeline's schedule; a serving plan's "
                                          "batch over the run is shown in the output"))
        from autoplan.serving.evaluate import evaluate_serving

        return ExplainResult(source=loaded.source, plan=loaded.plan, prediction=evaluate_serving(loaded.plan),
                             serving=True)
    software = resolve_stack_option(stack)
    p = loaded.plan if software is None else dataclasses.replace(loaded.plan, stack=software)
    chunks = p.layout.pp * p.layout.vpp
    if microbatches is not None and microbatches * chunks > MAX_PIPELINE_OPS:
        raise InputError.single("--microbatches", "", f"at most {MAX_PIPELINE_OPS // chunks:,} for "
                                f"this plan (pp x vpp = {chunks}: {MAX_PIPELINE_OPS:,} pipeline "
                                f"operations), got {microbatches:,}")
    [(p, pred)], notes = predicted([p], given)
    return ExplainResult(source=loaded.source, plan=p, prediction=pred, stages=tuple(stage_work(p)),
                         timeline=simulate_timeline(p, microbatches), microbatches=microbatches,
                         notes=tuple(notes))


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportResult(Result):
    """A launcher's files for a plan: ``{filename: text}``, as ``autoplan export`` prints
    them (or writes them with ``--out``)."""

    target: str
    files: dict[str, str]
    launcher: str | None = None  # --to slurm: what the job runs

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, **({"launcher": self.launcher} if self.launcher else {}),
                "files": dict(self.files)}

    def text(self) -> str:
        """What ``autoplan export`` prints: the one file, or each under a ``# ==> name <==`` line."""
        if len(self.files) == 1:
            return next(iter(self.files.values()))
        return "".join(f"# ==> {name} <==\n{text}" for name, text in self.files.items())


def export(plan: PlanLike, *, to: str, launcher: str = "megatron") -> ExportResult:
    """``autoplan export``: a launcher's configuration for a plan. Training plans: ``to``
    one of the launchers (megatron, nemo, deepspeed, torchtitan, accelerate, slurm, ...;
    ``launcher``: what a slurm job runs); serving plans: an engine (vllm, sglang, trtllm)
    or a deployment (k8s, dynamo, llm-d, ...). Raises InputError for a plan the target
    cannot run, naming each field."""
    from autoplan.descriptors.strict import read_yaml
    from autoplan.export import Target, slurm_launchers
    from autoplan.export import export as run_export
    from autoplan.export.deploy import TARGETS as DEPLOY
    from autoplan.export.deploy import export_deployment
    from autoplan.export.serving import export_serving
    from autoplan.plans.file import read_plan
    from autoplan.serving.deployment import ServingPlan
    from autoplan.serving.engine import Engine
    from autoplan.serving.planfile import is_serving, read_serving_plan

    given: Any = plan
    if _is_object(given):
        source, serving, data = OBJECT, isinstance(given, ServingPlan), None
    else:
        source = str(given)
        data = read_yaml(Path(given))
        serving = is_serving(data)
    serving_targets = {e.value for e in Engine} | set(DEPLOY)
    if serving:
        if to not in serving_targets:
            valid = ", ".join(sorted(serving_targets))
            raise InputError.single("--to", "", f"a serving plan exports to {valid}, got {to!r}")
        serving_plan = given if data is None else read_serving_plan(data, source, correct=False)
        if to in DEPLOY:
            return ExportResult(target=to, files=export_deployment(serving_plan, to, source))
        return ExportResult(target=to, files=export_serving(serving_plan, Engine(to), source))
    if to in serving_targets:
        raise InputError.single("--to", "", f"{to} serves models: give a serving plan (`autoplan serve "
                                            "--out plan.yaml` writes one)")
    from autoplan.api._base import choice

    target = choice("--to", to, Target)  # as registered now (a launcher found since start-up too)
    runs = choice("--launcher", launcher, [s.name for s in slurm_launchers()])
    if target is not Target.SLURM and runs != "megatron":
        raise InputError.single("--launcher", "", "only --to slurm takes a launcher")
    training = given if data is None else read_plan(data, source, correct=False)  # exported, not predicted
    if training.placement is None:  # its checkpoint interval prices the step with the grids evaluate takes
        from autoplan.measured.door import with_kernels

        training = training.replace(cluster=with_kernels(training.cluster))
    return ExportResult(target=target.value, files=run_export(training, target, source, runs),
                        launcher=runs if target is Target.SLURM else None)


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckResult(Result):
    """A check's report: each rule passed, failed, skipped or in error; ``exit_code`` is
    the command's (0 pass, 1 a rule failed, 2 bad input: a plan that does not read is
    reported, not raised, so a CI report can show why)."""

    report: CheckReport

    @property
    def passed(self) -> bool:
        return self.report.passed

    @property
    def exit_code(self) -> int:
        return self.report.exit_code

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(r.rule.value for r in self.report.failed)

    def to_dict(self) -> dict[str, Any]:
        """``check --format json``'s document."""
        return self.report.to_dict()

    def to_text(self) -> str:
        """``check --format text``: what was checked, one line per rule, the verdict."""
        from autoplan.api.reports import check_text

        return check_text(self.report)

    def to_junit(self) -> str:
        """``check --format junit``: JUnit XML for a CI's test reports."""
        from autoplan.api.reports import check_junit

        return check_junit(self.report)

    def to_frame(self) -> pandas.DataFrame:
        """A row per rule: its name, status, message."""
        return frame([{"rule": r.rule.value, "status": r.status.value, "message": r.message}
                      for r in self.report.rules], ("rule", "status", "message"))

    table = to_frame


def check_space(space: str | Path | SearchSpace | None, launcher: str | None) -> SearchSpace | None:
    """``--space`` or ``--launcher``: where ``--max-regression`` searches (None: the space
    the plan file records)."""
    from autoplan.descriptors.space import SearchSpace
    from autoplan.search.launchable import launcher_space, resolve_space

    if launcher is not None and space is not None:
        raise InputError.single("--launcher", "", "--space names the space already: give one")
    if isinstance(space, SearchSpace):
        return space
    with naming(("--space", None if space is None else str(space))):
        return (launcher_space(launcher) if launcher is not None
                else resolve_space(str(space)) if space is not None else None)


def check(plan: PlanLike, *, max_regression: float | None = None, min_headroom: float = 0.0,
          space: str | Path | SearchSpace | None = None, launcher: str | None = None,
          runs: str | Path | None = None,
          max_slowdown: float = 0.10, stack: str | Path | None = None) -> CheckResult:
    """``autoplan check``: the CI gate for a committed plan. Valid; fits memory (with
    ``min_headroom`` GiB free on each stage); ``max_regression``: within this fraction
    (0.05 = 5 %) of the best plan a search finds for the same model, cluster and job, in
    ``space`` (or ``launcher``'s; default the one the plan records); ``runs``: the last
    measured run of the plan within ``max_slowdown`` of its baseline; ``stack``: predicted
    on this stack (a calibrated one) instead of the plan's."""
    from autoplan.commands.check import check_plan

    searchspace = check_space(space, launcher)
    check_at_least("--max-slowdown", max_slowdown, 0.0, 1e6)
    software = resolve_stack_option(stack)
    measured_runs = read_runs_option(runs)
    if _is_object(plan):
        from autoplan.serving.deployment import ServingPlan

        if isinstance(plan, ServingPlan):
            from autoplan.serving.evaluate import serving_document

            data = serving_document(plan, None)
        else:
            from autoplan.plans.file import plan_document

            data = plan_document(plan)  # type: ignore[arg-type]
        source: Path = Path(OBJECT)
    else:
        data, source = None, Path(plan)  # type: ignore[arg-type]
    report = check_plan(source, space=searchspace, max_regression=max_regression,
                        min_headroom_gib=min_headroom, runs=measured_runs, max_slowdown=max_slowdown,
                        runs_source=str(runs), stack=software, data=data)
    return CheckResult(report=report)
