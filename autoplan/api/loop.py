"""The auto-tuner loop as functions: ``tune`` (run the best plans of a search for real and
rank them by measurement, each run appended to the runs log) and ``calibrate`` (a stack's
constants, or a serving engine release line's, fitted to a runs log's measured runs)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import stat
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoplan.api._base import (
    MAX_TOP,
    Progress,
    Result,
    check_at_least,
    check_top,
    choice,
    frame,
    path_or_none,
    ref,
    told,
    training_dtype,
)
from autoplan.errors import InputError, naming

if TYPE_CHECKING:
    import pandas

    from autoplan.commands.request import Request
    from autoplan.vocab import Dtype

DEFAULT_RUNS = Path("autoplan-runs.csv")
MAX_TOP_K = 20  # distinct plans one tuning runs


def appended_runs(path: Path, runs: Sequence[Any], *, check: bool = True, room: int = 0) -> str:
    """The runs log at ``path`` (if it exists) with ``runs`` appended (:func:`csv_text`:
    a user's CSV gains the columns it lacks). ``check``: every existing row is read as
    calibrate and check read it, so nothing is appended to a log they refuse (done before
    any trial or import; the append after it checks the header only). ``room``: rows that
    must fit after the existing ones (a tuning's trials). Errors name ``--runs`` and the
    log."""
    from autoplan.descriptors.strict import read_limited
    from autoplan.tune.runs import MAX_ROWS, MAX_RUNS_BYTES, count_rows, csv_text

    with naming(("--runs", path), every="--runs"):
        existing = ""
        if path.exists() or path.is_symlink():
            data = read_limited(path, MAX_RUNS_BYTES, "a runs log", source="--runs")
            try:
                existing = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError.single(str(path), "", f"not UTF-8 text (byte {exc.start})") from None
        text = csv_text(list(runs), existing, str(path), path.parent if check else None)
        if check and existing.strip():  # its serving rows too, as calibrate reads them
            from autoplan.tune.serving_runs import parse_serving_runs

            parse_serving_runs(existing.removeprefix("\ufeff"), str(path))
        body = existing.removeprefix("\ufeff")
        if room and body.strip() and count_rows(body, str(path)) + room > MAX_ROWS:
            raise InputError.single(str(path), "", f"no room for {room} more runs under the runs log's "
                                                   f"{MAX_ROWS:,} rows: append to a new one")
        return text


def write_text(path: Path, text: str) -> None:
    """``text`` written to ``path`` whole or not at all (a temporary file beside it,
    renamed over it), with the mode of the file it replaces; errors name the file."""
    path = Path(os.path.realpath(path.expanduser()))
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(text.encode("utf-8"))
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise InputError.single(str(path), "", f"cannot write: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


# --------------------------------------------------------------------------- tune

@dataclass(frozen=True, slots=True, kw_only=True)
class TuneResult(Result):
    """The trials run, fastest measured first (``best``: its index; None where none
    measured), the searched plans skipped (the runner cannot run them) and whether the
    tuning was stopped early; ``reason``: why nothing ran, where the search found no plan."""

    request: Request
    runner: str
    steps: int
    trials: tuple[Any, ...]  # autoplan.tune.tune.TrialResult
    best: int | None
    skipped: tuple[tuple[int, Any, str], ...] = ()  # (searched rank, plan, why)
    interrupted: bool = False
    searched: int = 0  # the plans the search ranked
    reason: str | None = None
    runs_log: Path | None = None  # the runs log each trial was appended to

    @property
    def ok(self) -> bool:
        """A plan measured (the command's exit 0; 1 otherwise)."""
        return self.best is not None

    def to_dict(self) -> dict[str, Any]:
        """``tune --format json``'s document."""
        from autoplan.plans.file import plan_document

        space = self.request.space.name
        doc: dict[str, Any] = {
            "trials": [t.to_dict(plan_document(t.plan, t.prediction, space)) for t in self.trials],
            "best": self.best,
            "skipped": [{"searched_rank": rank, "plan": plan_document(plan), "reason": why}
                        for rank, plan, why in self.skipped],
            "interrupted": self.interrupted,
        }
        if self.reason is not None:
            doc["reason"] = self.reason
        return doc

    def to_frame(self) -> pandas.DataFrame:
        """A row per trial, fastest measured first: its layout, searched rank, predicted
        and measured step time and peak memory, status."""
        from autoplan.tune.tune import layout_text

        rows = [{"plan": layout_text(t.plan), "searched_rank": t.searched_rank,
                 "predicted_step_s": t.predicted_step_s, "measured_step_s": t.outcome.step_time_s,
                 "predicted_peak_gib": t.predicted_peak_gib, "measured_peak_gib": t.outcome.peak_gib,
                 "status": t.outcome.status, "reason": t.outcome.reason} for t in self.trials]
        return frame(rows, ("plan", "searched_rank", "predicted_step_s", "measured_step_s",
                            "predicted_peak_gib", "measured_peak_gib", "status", "reason"))

    table = to_frame

    def best_yaml(self) -> str:
        """The fastest measured plan with its measurements, as ``tune --out`` writes it."""
        from autoplan.api.search import plan_yaml
        from autoplan.plans.file import plan_document

        if self.best is None:
            raise InputError.single("--out", "", "no plan measured: no plan to write")
        t = self.trials[self.best]
        doc = plan_document(t.plan, t.prediction, self.request.space.name)
        o = t.outcome
        doc["measured"] = {"step_time_s": o.step_time_s, "peak_memory_gib": o.peak_gib,
                           "steps": self.steps, "runner": self.runner, "time": t.started}
        return plan_yaml(doc)


@dataclass(frozen=True, slots=True, kw_only=True)
class TuneJob:
    """A tuning checked and ready: the request, the runner made, the trial's settings."""

    request: Request
    runner_name: str
    runner: Any  # a autoplan.tune.runners.Runner
    top: int
    within: float | None
    trial: Any  # autoplan.tune.runners.Trial
    workdir: Path | None
    runs: Path | None

    @property
    def notes(self) -> tuple[str, ...]:
        return self.request.notes

    def search(self) -> Any:
        """The search the trials are picked from: ranked plans enough to find ``top``
        distinct ones the runner can run (more candidates while the search had more to
        give and too few were found)."""
        from autoplan.kernels.memory import default_headroom_bytes
        from autoplan.search.launchable import search as run_search
        from autoplan.tune.tune import pick

        req = self.request
        headroom = default_headroom_bytes(req.cluster.device.mem_bytes)
        pool = max(30, 10 * self.top)
        while True:
            found = run_search(req.model, req.cluster, req.job, req.space, pool, headroom)
            ranked = [(r.plan, r.prediction) for r in found.plans]
            chosen, _ = pick(ranked, self.runner, self.top, self.within)
            if len(chosen) >= self.top or len(found.plans) < pool or pool >= MAX_TOP:
                return found
            pool = min(MAX_TOP, pool * 8)

    def run(self, progress: Progress | None = None, *, found: Any = None,
            stop: Callable[[], bool] | None = None, on_trial: Callable[[Any], None] | None = None
            ) -> TuneResult:
        """Search (unless ``found``, :meth:`search`'s, is given), run the trials, append
        each to the runs log. ``progress``: told of each trial's steps; ``on_trial``: each
        trial's result as it ends; ``stop``: asked before each trial (True: run no more)."""
        from autoplan.tune.tune import runs_of
        from autoplan.tune.tune import tune as run_tune

        if found is None:
            found = self.search()
        req = self.request
        if not found.plans:
            return TuneResult(request=req, runner=self.runner_name, steps=self.trial.steps, trials=(),
                              best=None, reason=found.why_none())
        ranked = [(r.plan, r.prediction) for r in found.plans]
        result = run_tune(ranked, self.runner, self.trial, top_k=self.top, within=self.within,
                          workdir=self.workdir, progress=told(progress),
                          stop=stop or (lambda: False), done=on_trial or (lambda _: None))
        if self.runs is not None and result.trials:
            rows = runs_of(result, self.runner_name, self.trial.steps)
            write_text(self.runs, appended_runs(self.runs, rows, check=False))
        return TuneResult(request=req, runner=self.runner_name, steps=self.trial.steps,
                          trials=tuple(result.trials), best=result.best, skipped=tuple(result.skipped),
                          interrupted=result.interrupted, searched=len(found.plans),
                          runs_log=self.runs if result.trials else None)


def check_serving_options(given: Sequence[str], runner: str) -> None:
    """``tune --serving``: the training options (``given``, the flags given in the
    command's order) left out, and the deployments run on this node."""
    if given:
        raise InputError.single(given[0], "", "tune --serving reads the model, cluster and workload from "
                                              "its job file: leave the training options out")
    if runner != "local":
        raise InputError.single("--runner", "", f"tune --serving runs deployments on this node: --runner "
                                                f"local, got {runner!r}")


def check_training_options(checkpoint: object) -> None:
    """``tune`` of training plans: ``--checkpoint`` (the weights a serving engine serves) left out."""
    if checkpoint is not None:
        raise InputError.single("--checkpoint", "", "the weights a serving engine serves: with --serving "
                                                    "only")


def one_top(top: int | None, top_k: int | None, *, former: bool = True) -> int:
    """``--top``, also given as ``--top-k`` (its former name): the two must agree; 3 by
    default. ``former``: the message names --top-k as the former name."""
    if top is not None and top_k is not None and top != top_k:
        if former:
            raise InputError.single("--top", "", f"given twice, as --top {top} and --top-k {top_k} "
                                                 "(--top-k is its former name): give one")
        raise InputError.single("--top", "", f"given twice, as --top {top} and --top-k {top_k}: give one")
    return top if top is not None else top_k if top_k is not None else 3


def prepare_tune(
    job: str | Path | None = None,
    *,
    model: Any = None,
    cluster: Any = None,
    gpus: int | None = None,
    global_batch: int | None = None,
    seq_len: int | None = None,
    dtype: Dtype | str | None = None,
    space: str | Path | None = None,
    profile: str | Path | None = None,
    stack: str | Path | None = None,
    no_offload: bool = False,
    runner: str = "local",
    launcher: str = "megatron",
    device: str = "cpu",
    top: int = 3,
    within: float | None = None,
    steps: int = 3,
    warmup: int = 2,
    timeout: float = 1800.0,
    diverge: float = 3.0,
    workdir: str | Path | None = None,
    runs: str | Path | None = DEFAULT_RUNS,
) -> TuneJob:
    """Every option of :func:`tune` checked, the runs log read whole (nothing is appended
    to a log calibrate would refuse), the request built and the runner made, before any
    search or trial."""
    from autoplan.commands.request import build_request
    from autoplan.tune.runners import Trial, get_runner, tuned_launchers
    from autoplan.vocab import NO_OFFLOAD

    runs_with = get_runner(runner)
    launch = {s.name: s for s in tuned_launchers()}
    choice("--launcher", launcher, tuple(launch))
    if runs_with.launches and not runs_with.accepts(launch[launcher]):
        takes = [name for name, s in launch.items() if runs_with.accepts(s)]
        raise InputError.single("--launcher", "", f"the {runner} runner launches {', '.join(takes)}, "
                                                  f"got {launcher!r}")
    choice("--device", device, ("cpu", "cuda"))
    check_top(top, most=MAX_TOP_K)
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
        raise InputError.single("--gpus", "", f"expected a whole number >= 1, got {gpus!r}")
    if within is not None and not (isinstance(within, (int, float)) and math.isfinite(within)):
        raise InputError.single("--within", "", f"expected a finite fraction of the best's predicted "
                                                f"step time (0.05 = 5%), got {within}")
    for flag, value, least, most in (("--steps", steps, 1, 10000), ("--warmup", warmup, 1, 10000),
                                     ("--timeout", timeout, 1.0, 1e6), ("--diverge", diverge, 1.01, 1e6),
                                     ("--within", within, 0.0, math.inf)):
        check_at_least(flag, value, least, most)
    log = path_or_none(runs)
    if log is not None:
        # a log that cannot be appended to (any row calibrate would refuse, no room left) is
        # refused before any search or trial
        appended_runs(log, [], room=top)
    folder = (path_or_none(workdir) or Path("autoplan-tune")) if runs_with.launches else None
    if folder is not None and (folder.exists() or folder.is_symlink()) and not folder.is_dir():
        raise InputError.single("--workdir", "", f"{folder}: not a folder (each trial's scripts "
                                                 "and logs go in a folder of it)")
    # a launch runs one launcher: its plans alone, its uneven layer splits too
    runs_one = space is None and runs_with.launches and job is None
    req = build_request(path_or_none(job), model=ref(model), cluster=ref(cluster), gpus=gpus,
                        global_batch=global_batch, seq_len=seq_len, dtype=training_dtype(dtype),
                        space=None if space is None else str(space), profile=path_or_none(profile),
                        stack=None if stack is None else str(stack), launcher=launcher if runs_one else None)
    if req.pools is not None:
        raise InputError.single("--cluster", "", f"{req.pools.name} has pools of unlike GPUs: tune "
                                                 "runs plans on one kind of GPU")
    if len(req.clusters) > 1:
        raise InputError.single("--gpus", "", "tune runs plans for one GPU count")
    if no_offload:
        req = dataclasses.replace(req, space=req.space.changed(offload=(NO_OFFLOAD,)))
    runs_with.check(req, device)  # what the runner cannot run: before the search, not after it
    return TuneJob(request=req, runner_name=runner, runner=runs_with.make(device, launcher), top=top,
                   within=within, trial=Trial(steps=steps, warmup=warmup, timeout_s=timeout, diverge=diverge),
                   workdir=folder, runs=log)


def tune(
    job: str | Path | None = None,
    *,
    model: Any = None,
    cluster: Any = None,
    gpus: int | None = None,
    global_batch: int | None = None,
    seq_len: int | None = None,
    dtype: Dtype | str | None = None,
    space: str | Path | None = None,
    profile: str | Path | None = None,
    stack: str | Path | None = None,
    no_offload: bool = False,
    runner: str = "local",
    launcher: str = "megatron",
    device: str = "cpu",
    top: int = 3,
    within: float | None = None,
    steps: int = 3,
    warmup: int = 2,
    timeout: float = 1800.0,
    diverge: float = 3.0,
    workdir: str | Path | None = None,
    runs: str | Path | None = DEFAULT_RUNS,
    progress: Progress | None = None,
    stop: Callable[[], bool] | None = None,
    on_trial: Callable[[Any], None] | None = None,
) -> TuneResult:
    """``autoplan tune``: run the best ``top`` distinct plans of a search for real (the
    ``runner``: local, torchrun, slurm, ...; ``launcher``: what a launching runner runs) and
    rank them by measured step time. Each trial is appended to the ``runs`` log (None:
    none). The search takes :func:`search`'s descriptors. Raises InputError on bad input;
    ``ok`` is False where no plan measured."""
    return prepare_tune(
        job, model=model, cluster=cluster, gpus=gpus, global_batch=global_batch, seq_len=seq_len, dtype=dtype,
        space=space, profile=profile, stack=stack, no_offload=no_offload, runner=runner, launcher=launcher,
        device=device, top=top, within=within, steps=steps, warmup=warmup, timeout=timeout, diverge=diverge,
        workdir=workdir, runs=runs).run(progress, stop=stop, on_trial=on_trial)


# --------------------------------------------------------------------------- tune --serving

@dataclass(frozen=True, slots=True, kw_only=True)
class ServingTuneResult(Result):
    """Serving deployments run with their engine's server and benchmark client, best
    measured first (by goodput where the job has an SLO, else output tokens/s); ``reason``:
    why nothing ran (no deployment fits, or none the local runner can run)."""

    request: Any  # autoplan.serving.request.ServeRequest
    trials: tuple[Any, ...]  # autoplan.tune.serving_tune.ServingTrialResult
    best: int | None
    skipped: tuple[tuple[int, Any, str], ...] = ()
    interrupted: bool = False
    searched: int = 0
    reason: str | None = None
    runs_log: Path | None = None

    @property
    def ok(self) -> bool:
        """A deployment measured (the command's exit 0; 1 otherwise)."""
        return self.best is not None

    def to_dict(self) -> dict[str, Any]:
        """``tune --serving --format json``'s document."""
        from autoplan.serving.evaluate import serving_document

        doc: dict[str, Any] = {
            "trials": [t.to_dict(serving_document(t.deployment, t.prediction)) for t in self.trials],
            "best": self.best,
            "skipped": [{"searched_rank": rank, "plan": serving_document(plan, None), "reason": why}
                        for rank, plan, why in self.skipped],
            "interrupted": self.interrupted,
        }
        if self.reason is not None:
            doc["reason"] = self.reason
        return doc

    def to_frame(self) -> pandas.DataFrame:
        """A row per trial: the deployment, its searched rank, predicted and measured TTFT,
        TPOT, goodput and output tokens/s, status."""
        rows = []
        for t in self.trials:
            m, p = t.outcome.measured, t.replica_prediction
            rows.append({"deployment": t.deployment.deployment.label(), "searched_rank": t.searched_rank,
                         "client": t.client, "ttft_ms_predicted": p.ttft_ms.mean,
                         "ttft_ms_measured": None if m is None else m.ttft_ms.mean,
                         "tpot_ms_predicted": p.tpot_ms.mean,
                         "tpot_ms_measured": None if m is None else m.tpot_ms.mean,
                         "goodput_rps_predicted": t.predicted_goodput_rps,
                         "goodput_rps_measured": t.measured_goodput_rps,
                         "tokens_per_s_predicted": t.predicted_tokens_per_s,
                         "tokens_per_s_measured": t.measured_tokens_per_s, "status": t.outcome.status})
        return frame(rows, ("deployment", "searched_rank", "client", "ttft_ms_predicted", "ttft_ms_measured",
                            "tpot_ms_predicted", "tpot_ms_measured", "goodput_rps_predicted",
                            "goodput_rps_measured", "tokens_per_s_predicted", "tokens_per_s_measured",
                            "status"))

    table = to_frame

    def best_yaml(self) -> str:
        """The best measured deployment with what it measured, as ``tune --serving --out`` writes it."""
        from autoplan.serving.evaluate import serving_document

        if self.best is None:
            raise InputError.single("--out", "", "no deployment measured: no plan to write")
        t = self.trials[self.best]
        doc = serving_document(t.deployment, t.prediction)
        m = t.outcome.measured
        doc["measured"] = {"client": t.client, "replicas_run": 1, "time": t.started,
                           "ttft_ms": m.ttft_ms.to_dict(), "tpot_ms": m.tpot_ms.to_dict(),
                           "goodput_rps": t.measured_goodput_rps,
                           "output_tokens_per_s": t.measured_tokens_per_s}
        return _yaml(doc)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingTuneJob:
    """A serving tuning checked and ready: the request, the trial's settings."""

    request: Any
    top: int
    trial: Any  # autoplan.tune.serving_tune.ServingTrial
    workdir: Path
    runs: Path | None

    @property
    def notes(self) -> tuple[str, ...]:
        return self.request.notes  # type: ignore[no-any-return]

    def search(self) -> Any:
        """serve's search of the job: the deployments the trials are picked from."""
        from autoplan.serving.search import serve_search

        req = self.request
        return serve_search(req.model, req.cluster, req.engine, req.workload, req.slo, req.weights,
                            req.kv_caches, speculative=req.speculative, engine_version=req.engine_version)

    def run(self, progress: Progress | None = None, *, found: Any = None,
            stop: Callable[[], bool] | None = None, on_trial: Callable[[Any], None] | None = None
            ) -> ServingTuneResult:
        """Search (unless ``found`` is given), run the trials on this node, append each to
        the runs log. The engine and its benchmark client must be installed (InputError
        naming them otherwise, before any trial)."""
        from autoplan.tune.serving_tune import LocalServingRunner, check_programs, pick, runs_of, tune_serving

        req = self.request
        if found is None:
            found = self.search()
        if not found.plans:
            return ServingTuneResult(request=req, trials=(), best=None, reason=found.why_none(req.slo))
        ranked = [(r.plan, r.prediction) for r in found.plans]
        chosen, skipped = pick(ranked, self.top)
        if not chosen:
            return ServingTuneResult(request=req, trials=(), best=None, skipped=tuple(skipped),
                                     searched=len(found.plans),
                                     reason="no deployment the local runner can run")
        check_programs([plan for _, plan, _ in chosen])  # the engine and its client are here
        result = tune_serving(ranked, LocalServingRunner(), self.trial, top_k=self.top, workdir=self.workdir,
                              progress=told(progress), stop=stop or (lambda: False),
                              done=on_trial or (lambda _: None))
        if self.runs is not None and result.trials:
            write_text(self.runs, appended_runs(self.runs, runs_of(result, "local"), check=False))
        return ServingTuneResult(request=req, trials=tuple(result.trials), best=result.best,
                                 skipped=tuple(result.skipped), interrupted=result.interrupted,
                                 searched=len(found.plans), runs_log=self.runs if result.trials else None)


def prepare_tune_serving(job: str | Path, *, top: int = 3, runs: str | Path | None = DEFAULT_RUNS,
                         workdir: str | Path | None = None, checkpoint: str | None = None,
                         health_timeout: float = 1200.0, timeout: float = 1800.0) -> ServingTuneJob:
    """Every option of :func:`tune_serving` checked, the runs log read whole, the request
    built, before any search or trial."""
    from autoplan.serving.request import ServeOptions, build_serve_request, check_serve_options
    from autoplan.tune.serving_tune import ServingTrial, workload_refusals

    job_file = Path(job)
    check_top(top, most=MAX_TOP_K)
    check_at_least("--health-timeout", health_timeout, 0.1, 1e6)
    check_at_least("--timeout", timeout, 1.0, 1e6)
    given = ServeOptions()
    serving_job = check_serve_options(job_file, given)
    weights = checkpoint if checkpoint is not None else os.environ.get("MODEL")
    if not weights or not weights.strip():
        raise InputError.single("--checkpoint", "", "missing: the weights the engine serves, a path or a "
                                                    "HuggingFace id (or set MODEL, as the export's scripts "
                                                    "read it)")
    log = path_or_none(runs)
    if log is not None:
        appended_runs(log, [], room=top)
    folder = path_or_none(workdir) or Path("autoplan-tune")
    if (folder.exists() or folder.is_symlink()) and not folder.is_dir():
        raise InputError.single("--workdir", "", f"{folder}: not a folder (each trial's logs and results go "
                                                 "in a folder of it)")
    req = build_serve_request(job_file, serving_job, given)
    refused = list(workload_refusals(req, str(job_file)))
    if refused:
        raise InputError(refused)
    trial = ServingTrial(checkpoint=weights.strip(), health_timeout_s=health_timeout, timeout_s=timeout)
    return ServingTuneJob(request=req, top=top, trial=trial, workdir=folder, runs=log)


def tune_serving(job: str | Path, *, top: int = 3, runs: str | Path | None = DEFAULT_RUNS,
                 workdir: str | Path | None = None, checkpoint: str | None = None,
                 health_timeout: float = 1200.0, timeout: float = 1800.0, progress: Progress | None = None,
                 stop: Callable[[], bool] | None = None,
                 on_trial: Callable[[Any], None] | None = None) -> ServingTuneResult:
    """``autoplan tune --serving JOB.yaml --runner local``: serve's best ``top``
    deployments for the serving job run on this node, each with its engine's server and
    benchmark client (``checkpoint``: the weights served, default ``$MODEL``), ranked by
    measured goodput; each appended to the ``runs`` log (None: none)."""
    return prepare_tune_serving(job, top=top, runs=runs, workdir=workdir, checkpoint=checkpoint,
                                health_timeout=health_timeout, timeout=timeout).run(
        progress, stop=stop, on_trial=on_trial)


# --------------------------------------------------------------------------- calibrate

def percent_text(x: float) -> str:
    """A percentage in at most a few digits however large (a prediction 10^6 times off)."""
    return f"{x:.1f}%" if x < 1e4 else f"{x:.3g}%"


def error_percent_text(x: float) -> str:
    """A percentage in a few digits (two decimals under 1%, a fit's error on synthetic runs)."""
    if x != x:
        return "-"
    return f"{x:.2f}%" if x < 1 else f"{x:.1f}%" if x < 1e4 else f"{x:.3g}%"


def serving_held_out_text(result: Any, ttft: str = "TTFT") -> str:
    """A serving calibration's held-out errors, TTFT's (named ``ttft``) and TPOT's, with the
    line's constants and with the calibrated ones (the calibration file's comment and the
    command's table)."""
    e = [error_percent_text(result.mape(i, after)) for i in (0, 1) for after in (False, True)]
    return f"{ttft} {e[0]} before, {e[1]} after; TPOT {e[2]} before, {e[3]} after"


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationResult(Result):
    """A calibration of the runs log: a training stack's constants (``serving`` False) or a
    serving engine release line's (True), fitted, with the held-out error before and after.
    ``result``: the fit (autoplan.tune.calibrate's, or tune.serving_calibrate's)."""

    result: Any
    runs_path: str
    serving: bool = False

    def to_dict(self) -> dict[str, Any]:
        """``calibrate --format json``'s document."""
        return _serving_document(self.result) if self.serving else _stack_document(self.result)

    def file_text(self) -> str:
        """What ``calibrate --out`` writes: the calibrated stack file (``--stack FILE``),
        or the serving calibration (``--calibration FILE``), with its provenance."""
        return (_calibration_file(self.result, self.runs_path) if self.serving
                else _stack_file(self.result, self.runs_path))

    def to_frame(self) -> pandas.DataFrame:
        """A row per held-out run: what it measured and what the base and calibrated
        constants predict without its group."""
        held = self.result.held_out
        if self.serving:
            rows = [{"plan_id": h.run.plan_id, "deployment": h.run.label or h.run.plan.deployment.label(),
                     "ttft_measured_ms": h.measured[0], "ttft_before_ms": h.before[0],
                     "ttft_after_ms": h.after[0],
                     "tpot_measured_ms": h.measured[1], "tpot_before_ms": h.before[1],
                     "tpot_after_ms": h.after[1]} for h in held]
            return frame(rows, ("plan_id", "deployment", "ttft_measured_ms", "ttft_before_ms",
                                "ttft_after_ms", "tpot_measured_ms", "tpot_before_ms", "tpot_after_ms"))
        from autoplan.tune.calibrate import regime_of

        rows = [{"plan_id": h.run.plan_id, "regime": regime_of(h.run.plan), "measured_s": h.measured_s,
                 "before_s": h.before_s, "after_s": h.after_s} for h in held]
        return frame(rows, ("plan_id", "regime", "measured_s", "before_s", "after_s"))

    table = to_frame


def _stack_document(result: Any) -> dict[str, Any]:
    from autoplan.tune.calibrate import by_regime, regime_of

    held = result.held_out
    return {
        "stack": result.stack.to_dict(), "base": result.base.name,
        "runs": result.runs, "groups": result.groups,
        "fitted": result.fitted, "not_fitted": result.not_fitted,
        "held_out": {"mape_before": result.mape_before, "mape_after": result.mape_after,
                     "by_regime": {k: {"runs": n, "mape_before": b, "mape_after": a}
                                   for k, (n, b, a) in by_regime(held).items()},
                     "runs": [{"plan_id": h.run.plan_id, "regime": regime_of(h.run.plan),
                               "measured_s": h.measured_s, "before_s": h.before_s,
                               "after_s": h.after_s} for h in held]},
        "log_loss": {"before": result.loss_before, "after": result.loss_after},
    }


def _serving_document(result: Any) -> dict[str, Any]:
    held = result.held_out
    return {
        "engine": result.engine.value, "line": result.line, "base": result.base,
        "constants": result.constants, "fitted": list(result.fitted), "not_fitted": result.not_fitted,
        "runs": result.runs, "groups": result.groups,
        "held_out": {"ttft_mape_before": result.mape(0, False), "ttft_mape_after": result.mape(0, True),
                     "tpot_mape_before": result.mape(1, False), "tpot_mape_after": result.mape(1, True),
                     "runs": [{"plan_id": h.run.plan_id, "deployment": h.run.label or
                               h.run.plan.deployment.label(), "measured_ms": list(h.measured),
                               "before_ms": list(h.before), "after_ms": list(h.after)} for h in held]},
        "rms_log_error": {"before": result.rms_before, "after": result.rms_after},
    }


def _yaml(doc: Any) -> str:
    from autoplan.api.search import plan_yaml

    return plan_yaml(doc)


def _stack_file(result: Any, runs_path: str) -> str:
    from autoplan.text import one_line

    before, after = result.mape_before, result.mape_after
    lines = [
        f"# Calibrated by `autoplan calibrate` on {one_line(runs_path)}: {result.runs} measured runs "
        f"in {result.groups} groups,",
        f"# from the stack {one_line(result.base.name)}. Held out (each group predicted without it): "
        f"step time error {percent_text(before)} before, {percent_text(after)} after.",
        "# Fitted: " + (", ".join(f"{k} {v:.4g}" for k, v in result.fitted.items()) or "none") + ".",
    ]
    lines += [f"# Not fitted, {k}: {one_line(v)}" for k, v in result.not_fitted.items()]
    return "\n".join(lines) + "\n" + _yaml({"stack": result.stack.to_dict()})


def _calibration_file(result: Any, runs_path: str) -> str:
    from autoplan.text import one_line

    label = f"{result.engine.value} release line {result.line}" if result.line else result.engine.value
    lines = [
        f"# Calibrated by `autoplan calibrate` on {one_line(runs_path)}: {result.runs} measured serving "
        f"runs of {label} in {result.groups} groups.",
        f"# Held out (each group predicted without it): {serving_held_out_text(result, 'TTFT error')}.",
        "# Fitted: " + ", ".join(f"{k} {result.constants[k]:.4g}" for k in result.fitted) + ".",
    ]
    lines += [f"# Not fitted, {k}: {one_line(v)}" for k, v in result.not_fitted.items()]
    lines.append("# autoplan serve/evaluate --calibration THIS_FILE predicts that line with these constants.")
    return "\n".join(lines) + "\n" + _yaml(result.calibration(one_line(runs_path)).to_dict())


def _calibrate_serving(runs_path: Path, serving: list[Any], engine: str | None,
                       engine_version: str | None) -> CalibrationResult:
    """The log's serving runs of one engine release line calibrated."""
    from autoplan.serving.engine import Engine
    from autoplan.serving.versions import VersionError
    from autoplan.tune.serving_calibrate import calibrate_serving, lines_of

    lines = lines_of(serving)
    if engine is not None:
        try:
            chosen = Engine(engine)
        except ValueError:
            raise InputError.single("--engine", "", f"expected one of {', '.join(e.value for e in Engine)}, "
                                                    f"got {engine[:40]!r}") from None
        lines = {k: v for k, v in lines.items() if k[0] is chosen}
        if engine_version is not None:
            try:
                line = chosen.spec.at(engine_version).version
            except VersionError as exc:
                raise InputError.single("--engine-version", "", str(exc)) from None
            lines = {k: v for k, v in lines.items() if k[1] == line}
    elif engine_version is not None:
        raise InputError.single("--engine-version", "", "a release of which engine? give --engine too")
    if not lines:
        what = f" of {engine}" + (f" {engine_version}" if engine_version else "") if engine else ""
        raise InputError.single(str(runs_path), "", f"no measured serving run{what} (tune --serving and runs "
                                                    "import of a benchmark client's result write them)")
    if len(lines) > 1:
        listed = ", ".join(f"{e.value} {line or '-'}: {len(v)} runs" for (e, line), v in sorted(
            lines.items(), key=lambda kv: (kv[0][0].value, kv[0][1])))
        raise InputError.single(str(runs_path), "", f"serving runs of several engine release lines "
                                                    f"({listed}): name one with --engine (and "
                                                    "--engine-version)")
    (chosen_engine, line), _ = next(iter(lines.items()))
    result = calibrate_serving(serving, chosen_engine, line, str(runs_path))
    return CalibrationResult(result=result, runs_path=str(runs_path), serving=True)


def calibrate(runs: str | Path, *, stack: str | Path | None = None, name: str | None = None,
              engine: str | None = None, engine_version: str | None = None) -> CalibrationResult:
    """``autoplan calibrate``: fit a stack's constants (compute efficiency, step overhead,
    host cost per kernel, overlap slowdown) to the runs log's measured training runs, or
    with ``engine`` (or a log of serving runs only) a serving engine release line's to its
    serving runs; each group held out in turn to give the error before and after.
    ``stack``: the stack to calibrate (default: the one every run names); ``name``: the
    calibrated stack's. Raises InputError on runs that identify no constant."""
    from autoplan.descriptors.library import resolve_stack
    from autoplan.descriptors.strict import name_problem
    from autoplan.tune.calibrate import calibrate as run_calibrate
    from autoplan.tune.runs import read_runs
    from autoplan.tune.serving_runs import read_serving_runs

    runs_path = Path(runs)
    if name is not None and (why := name_problem(name)):
        raise InputError.single("--name", "", why)
    measured = read_runs(runs_path)
    wants_serving = engine is not None or engine_version is not None
    if wants_serving and stack is not None:
        raise InputError.single("--stack", "", "a training stack: --engine calibrates serving runs; give one")
    if wants_serving or (stack is None and not any(r.ok for r in measured)):
        serving = read_serving_runs(runs_path)
        if wants_serving or any(r.ok for r in serving):
            if name is not None:
                raise InputError.single("--name", "", "names a calibrated training stack: a serving "
                                                      "calibration is named by its engine and release line")
            return _calibrate_serving(runs_path, serving, engine, engine_version)
    if stack is not None:
        base = resolve_stack(str(stack), "--stack", "")
    else:
        names = sorted({r.plan.stack.name for r in measured if r.ok})
        if len(names) > 1:
            raise InputError.single(str(runs_path), "stack", f"runs of several stacks ({', '.join(names)}): "
                                    "name the one to calibrate with --stack")
        base = next((r.plan.stack for r in measured if r.ok), None) or resolve_stack("megatron-core")
    result = run_calibrate(measured, base, name or f"{base.name}-calibrated", str(runs_path))
    return CalibrationResult(result=result, runs_path=str(runs_path))
