"""Where ``tune`` runs a plan, and how it reads back what the plan measured.

A runner is one module of ``autoplan.tune`` named ``runner_<name>.py`` that defines
``RUNNER = RunnerSpec(...)``: its name, what ``--runner``'s help says of it, the seconds
its runs take to start, and how it is made; a runner that runs a launcher's export (a
launch runner) says which launchers it launches and, for a batch system, how it submits
a job, reads the job's id, cancels it and where its output goes. The launch itself (its
command on one node, the words a job adds, its environment, its log's format) is the
launcher's (``LauncherSpec.tune``, :mod:`autoplan.export.launcher`). Nothing lists the
runners: :func:`runner_specs` imports every ``runner_*`` module of the package
(``pkgutil.iter_modules`` over its ``__path__``), so a new runner is a new file
(``tests/unit/test_launcher_registry.py`` adds one); one outside the tree is found by
putting its folder on ``autoplan.tune.__path__`` and calling :func:`refresh_runners`.

The built-in runners:

- :class:`LocalRunner`: this machine's devices through ``validate``'s torch engine
  (:mod:`autoplan.bench.validate`): the plan's ranks as local processes over gloo on CPU,
  one rank's slice on a GPU. It measures the median step time of the timed steps and the
  peak memory of the worst rank.
- :class:`LaunchRunner`: the plan's exported launch on the user's cluster: ``torchrun``
  on this node (the launcher's own command: the Megatron-LM script, or torchtitan's TOML
  under ``torchrun -m torchtitan.train``), or ``slurm`` (the exported sbatch script under
  ``sbatch --wait``).
  It reads the step times and the peak memory from the launcher's own log
  (:mod:`autoplan.tune.logs`) as the run writes it, each poll only what was written
  since the last (so a poll's cost does not grow with the log), and stops the run once
  the steps it needs are logged (or it ran out of memory, or diverged, or logged a number
  that is no measurement, or its time is up). Every path the launch is given is absolute:
  it runs in its trial's folder, whatever the folder was named relative to.

Every run is bounded: a trial is stopped (its whole process group, or ``scancel`` of its
job) when it runs past its deadline, and a run whose step time leaves the prediction by
more than the trial's ``diverge`` factor is stopped as soon as a timed step shows it (a
local run: its deadline counts the prediction times that factor). A KeyboardInterrupt
stops the run it interrupts the same way before it propagates. Pure library: nothing is
printed; ``progress`` is told of events in sentences."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import math
import os
import pkgutil
import signal
import stat
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from autoplan.errors import AutoplanError, InputError
from autoplan.export.launcher import LauncherSpec
from autoplan.plan import Plan
from autoplan.tune.logs import ANSI, LogReader, LogReading
from autoplan.units import GiB

Progress = Callable[[str], None]

POLL_S = 0.2
# what a poll reads of a growing log: chunks of READ_BYTES until the log is read or
# READ_S have gone (a run writing faster than it is read is still stopped at its deadline)
READ_BYTES = 2**20
READ_S = 0.5
TAIL_BYTES = 8192  # of a log's end, for the last lines a failure quotes
TAIL_LINE_CHARS = 200  # of each of those lines


@dataclass(frozen=True, slots=True, kw_only=True)
class Trial:
    """How to run one plan."""

    steps: int = 3  # timed steps
    warmup: int = 2  # steps run first and not timed
    timeout_s: float = 1800.0  # the whole run, start to end
    diverge: float = 3.0  # stop a run measuring more than this factor off its prediction
    predicted_step_s: float = 0.0  # what autoplan predicts for it (0: unknown)
    workdir: Path | None = None  # where a launch writes its scripts and logs


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What one run measured, or why it did not."""

    status: str  # ok | oom | timeout | failed
    reason: str = ""
    step_time_s: float | None = None  # median of the timed steps
    peak_gib: float | None = None
    step_times_s: tuple[float, ...] = ()
    # the prediction for exactly what ran, where the runner predicts it (local: on the
    # machine's descriptor); None: the search's stands
    predicted_step_s: float | None = None
    predicted_peak_gib: float | None = None
    notes: tuple[str, ...] = field(default=())


class Runner(Protocol):
    @property
    def name(self) -> str:
        """local | torchrun | slurm"""

    def refuses(self, plan: Plan) -> str | None:
        """Why this runner cannot run ``plan`` (None: it can)."""

    def run(self, plan: Plan, trial: Trial, progress: Progress) -> Outcome:
        """Run ``plan`` once as ``trial`` says."""


# --------------------------------------------------------------------------- the registry


@dataclass(frozen=True, slots=True, kw_only=True)
class Batch:
    """How a launch runner submits its run as a batch system's job: the export it runs
    (``export --to``), the submitting command (it must print the job's id and wait for the
    job), how the id is read from what it prints, how a job is cancelled and where the
    job's output goes (read as the run's log, beside the submission's own)."""

    target: str  # the export target it runs (slurm: the sbatch script around the launcher)
    # (workdir, the launcher's job words) -> the command, run in workdir, every path absolute
    submit: Callable[[Path, list[str]], list[str]]
    # (the submission's stdout, monotonic deadline) -> the job's id (None: none came)
    job_id: Callable[[Any, float], str | None]
    cancel: Callable[[str], list[str]]  # the command that cancels a job
    output: Callable[[Path, str], Path]  # (workdir, job id) -> the job's output file


def _no_check(request: Any, device: str) -> None:
    return None


def _refuses_nothing(plan: Plan) -> str | None:
    return None


def _launches_tuned(launcher: LauncherSpec) -> bool:
    return launcher.tune is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunnerSpec:
    """Everything ``tune`` asks of one runner (module doc)."""

    name: str  # as --runner and the runs log's runner column spell it
    summary: str  # --runner's help, after "<name>: "
    # seconds a run may take before its first step on top of its predicted steps (process
    # start, torch's import, the process group, building the model, the first compile)
    startup_s: float
    make: Callable[[str, str], Runner]  # (--device, --launcher) -> the runner
    # it runs a launcher's export: takes --launcher and --workdir, searches the launcher's
    # space by default
    launches: bool = False
    # before the search: an InputError for a request it cannot run (request, --device)
    check: Callable[[Any, str], None] = _no_check
    # a launch runner: the launchers it launches, what else it cannot run, and its job (None:
    # the launcher's own command on this node)
    accepts: Callable[[LauncherSpec], bool] = _launches_tuned
    refuses: Callable[[Plan], str | None] = _refuses_nothing
    batch: Batch | None = None
    order: int = 100  # where --runner lists it (lower first; then by name)


class _Runners:
    found: tuple[RunnerSpec, ...] | None = None


_runners = _Runners()
RUNNER_PREFIX = "runner_"


def refresh_runners() -> tuple[RunnerSpec, ...]:
    """Look for the runners again (a module added or taken away since), and return them."""
    package = importlib.import_module(__name__.rpartition(".")[0])
    importlib.invalidate_caches()
    found: dict[str, RunnerSpec] = {}
    for info in pkgutil.iter_modules(package.__path__):
        if not info.name.startswith(RUNNER_PREFIX):
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        spec = getattr(module, "RUNNER", None)
        if not isinstance(spec, RunnerSpec):
            raise TypeError(f"{module.__name__} defines no RUNNER = RunnerSpec(...)")
        if spec.name in found:
            raise ValueError(f"{module.__name__}: a runner named {spec.name!r} is registered already")
        found[spec.name] = spec
    _runners.found = tuple(sorted(found.values(), key=lambda r: (r.order, r.name)))
    return _runners.found


def runner_specs() -> tuple[RunnerSpec, ...]:
    """The runners in order (local, torchrun, slurm, then the others)."""
    return _runners.found if _runners.found is not None else refresh_runners()


def runner_names() -> tuple[str, ...]:
    return tuple(r.name for r in runner_specs())


def get_runner(name: str, source: str = "--runner", field: str = "") -> RunnerSpec:
    """The runner named ``name``, or an InputError naming ``source`` with the known ones."""
    for spec in runner_specs():
        if spec.name == name:
            return spec
    raise InputError.single(source, field, f"expected one of {', '.join(runner_names())}, got {name!r}")


def tuned_launchers() -> tuple[LauncherSpec, ...]:
    """The launchers some launch runner launches (``tune --launcher``)."""
    from autoplan.export.launcher import specs

    runners = [r for r in runner_specs() if r.launches]
    return tuple(s for s in specs() if any(r.accepts(s) for r in runners))


def deadline_s(kind: str, trial: Trial) -> float:
    """The seconds a run may take: the trial's timeout, or less where the prediction says
    the run should be done long before (startup, then every step at ``diverge`` times its
    prediction): a run still going then has diverged."""
    if trial.predicted_step_s <= 0 or not math.isfinite(trial.predicted_step_s):
        return trial.timeout_s
    steps = trial.warmup + trial.steps + 2  # validate's memory step and one more warm-up
    startup = get_runner(kind).startup_s
    return min(trial.timeout_s, startup + steps * trial.predicted_step_s * trial.diverge)


def diverged(measured: float, predicted: float, factor: float) -> bool:
    return predicted > 0 and (measured > factor * predicted or measured * factor < predicted)


def divergence_reason(measured: float, predicted: float, factor: float) -> str:
    return (f"diverged: measured {measured:.3g} s per step, {measured / predicted:.2f}x the "
            f"predicted {predicted:.3g} s (the limit is {factor:g}x either way)")


# --------------------------------------------------------------------------- local

@dataclass(frozen=True, slots=True)
class LocalRunner:
    """This machine's devices, through ``validate``'s engine."""

    device: str = "cpu"
    name: str = "local"

    def _options(self, trial: Trial, timeout: float):  # type: ignore[no-untyped-def]
        from autoplan.bench.validate import Options

        return Options(device=self.device, steps=trial.steps, warmup=max(1, trial.warmup),
                       timeout_s=timeout, fit=False)

    def refuses(self, plan: Plan) -> str | None:
        from autoplan.bench.validate import unsupported

        try:
            machine = _machine(self.device)
        except AutoplanError as exc:
            return str(exc)
        problems = unsupported(plan, "plan", self._options(Trial(), 1.0), machine)
        if problems:
            return "; ".join(f"{p.field}: {p.message}" if p.field else p.message for p in problems)
        return _too_big(plan, self.device, machine)

    def run(self, plan: Plan, trial: Trial, progress: Progress) -> Outcome:
        from autoplan.bench.validate import ValidateError, validate

        limit = deadline_s("local", trial)
        try:
            result = validate(plan, "plan", self._options(trial, limit))
        except ValidateError as exc:
            return _failed_outcome(str(exc), limit, trial)
        measured = result.measured_time_s
        outcome = Outcome(status="ok", step_time_s=measured,
                          peak_gib=result.measured_peak_bytes / GiB,
                          step_times_s=result.step_times_s,
                          predicted_step_s=result.predicted_time_s,
                          predicted_peak_gib=result.predicted_peak_bytes / GiB,
                          notes=tuple(result.notes) + tuple(result.adjustments))
        if diverged(measured, result.predicted_time_s, trial.diverge):
            return dataclasses.replace(outcome, status="failed", reason=divergence_reason(
                measured, result.predicted_time_s, trial.diverge))
        return outcome


def _too_big(plan: Plan, device: str, machine: Any) -> str | None:
    """Why this machine cannot run the plan as it is: a built-in GPU cluster's plan on the
    CPU (validate predicts on the plan's cluster, which is then not this machine), or a
    predicted peak past each rank's share of the machine's memory (validate's share)."""
    from autoplan.bench.validate import MEMORY_SHARE, builtin_gpu_cluster
    from autoplan.cost.evaluate import evaluate

    if device == "cpu" and builtin_gpu_cluster(plan.cluster):
        return (f"cluster: {plan.cluster.name} is a built-in GPU cluster, not this machine: "
                "search on a cluster file that describes it (autoplan bench --describe)")
    world = 1 if device == "cuda" else plan.layout.gpus
    budget = machine.mem_bytes * MEMORY_SHARE[device] / world
    peak = evaluate(plan).memory.peak
    if peak > budget:
        return (f"a rank is predicted to need {peak / GiB:.1f} GiB; this machine gives each of "
                f"its {world} ranks {budget / GiB:.1f}")
    return None


@functools.cache
def _machine(device: str) -> Any:
    """This machine as validate sees it (asked once: it imports torch)."""
    from autoplan.bench.validate import Machine

    return Machine.local(device)


def _failed_outcome(message: str, limit: float, trial: Trial) -> Outcome:
    """A local run's failure, sorted into out of memory, timeout or divergence."""
    low = message.lower()
    if "timed out" in low:
        if limit < trial.timeout_s:
            return Outcome(status="failed", reason=(
                f"diverged: still running after {limit:.0f} s, when {trial.warmup + trial.steps} "
                f"steps of {trial.predicted_step_s:.3g} s were predicted (the limit is "
                f"{trial.diverge:g}x)"))
        return Outcome(status="timeout", reason=message)
    if "status -9" in low or "memoryerror" in low or "out of memory" in low:
        return Outcome(status="oom", reason=message)
    return Outcome(status="failed", reason=message)


# --------------------------------------------------------------------------- launches

@dataclass(frozen=True, slots=True)
class LaunchRunner:
    """The exported launch of each plan, as the runner ``name`` runs it (its
    :class:`RunnerSpec`: on this node, or as a batch job) with the launcher ``launcher``
    (its ``LauncherSpec.tune``: the command, the job's words, the environment)."""

    name: str = "torchrun"  # a launch runner: torchrun | slurm | ...
    launcher: str = "megatron"  # a launcher it launches: megatron | torchtitan | ...
    env: tuple[tuple[str, str], ...] = ()  # more environment for the launch

    @property
    def runner(self) -> RunnerSpec:
        return get_runner(self.name)

    @property
    def launch(self) -> LauncherSpec:
        from autoplan.export.launcher import get

        return get(self.launcher)

    def _target(self) -> str:
        batch = self.runner.batch
        return batch.target if batch is not None else self.launcher

    def refuses(self, plan: Plan) -> str | None:
        from autoplan.export import refusals

        runner, launch = self.runner, self.launch
        if launch.tune is None or not runner.accepts(launch):
            return f"the {self.name} runner does not launch {self.launcher}"
        why = runner.refuses(plan)
        if why is not None:
            return why
        found = refusals(plan, self._target(), self.launcher)
        return "; ".join(f"{k}: {v}" if k else v for k, v in found) or None

    def files(self, plan: Plan) -> dict[str, str]:
        from autoplan.export import export

        return export(plan, self._target(), "plan", self.launcher)

    def _tune(self) -> Any:
        tune = self.launch.tune
        if tune is None or not self.runner.accepts(self.launch):
            raise AutoplanError(f"the {self.name} runner does not launch {self.launcher}")
        return tune

    def command(self, plan: Plan, trial: Trial, workdir: Path, files: dict[str, str]) -> list[str]:
        """The command that launches ``plan`` for ``trial`` from ``workdir`` (run in it):
        every path in it absolute."""
        workdir = workdir.absolute()
        total = trial.warmup + trial.steps + 1  # one more: the run is stopped once they are logged
        tune, batch = self._tune(), self.runner.batch
        if batch is not None:
            return batch.submit(workdir, tune.job_args(total))
        return tune.command(plan, total, workdir)

    def environment(self, trial: Trial, workdir: Path) -> dict[str, str]:
        """The launch's environment: every path in it absolute."""
        workdir = workdir.absolute()
        total = trial.warmup + trial.steps + 1
        return {**os.environ, **self._tune().environment(total, workdir), **dict(self.env)}

    def run(self, plan: Plan, trial: Trial, progress: Progress) -> Outcome:
        assert trial.workdir is not None
        # the launch runs in its folder: a relative --workdir named from here would not be
        # found from there (the default, autoplan-tune/trial-N-...)
        workdir = trial.workdir.absolute()
        files = self.files(plan)
        log_path = workdir / "train.log"
        try:
            workdir.mkdir(parents=True, exist_ok=True)
            for name, text in files.items():
                (workdir / name).write_text(text)
                if name.endswith((".sh", ".sbatch")):
                    (workdir / name).chmod(0o755)
            open(log_path, "wb").close()
        except OSError as exc:
            return Outcome(status="failed", reason=f"{workdir}: cannot write the launch: "
                                                   f"{exc.strerror or exc}")
        cmd = self.command(plan, trial, workdir, files)
        batch, tune = self.runner.batch, self._tune()
        limit = deadline_s(self.name, trial)
        started = time.monotonic()
        job_id: str | None = None
        with open(log_path, "wb") as log:
            try:
                proc = subprocess.Popen(cmd, cwd=workdir, env=self.environment(trial, workdir),
                                        stdout=subprocess.PIPE if batch is not None else log,
                                        stderr=log, start_new_session=True)
            except OSError as exc:
                return Outcome(status="failed", reason=f"{cmd[0]}: {exc.strerror or exc}")
        logs = _Logs(tokens_per_step=plan.job.global_batch * plan.job.seq_len, gpus=plan.layout.gpus)
        try:
            if batch is not None:
                job_id = batch.job_id(proc, started + limit)
                if job_id is None:
                    late = time.monotonic() - started > limit
                    return self._stop(proc, job_id, Outcome(
                        status="timeout" if late else "failed",
                        reason=f"{cmd[0]} printed no job id{f' in {limit:.0f} s' if late else ''}: "
                               + _tail(log_path)))
                progress(f"submitted job {job_id}")
            while True:
                code = proc.poll()
                paths = self._log_paths(log_path, job_id, workdir)
                behind = logs.read(paths, time.monotonic() + READ_S)
                ended = code is not None and not behind
                if ended:
                    logs.finish()  # its last line, though no newline ends it
                reading, problem = logs.reading()
                timed = reading.timed(trial.warmup)
                if problem:
                    return self._stop(proc, job_id, Outcome(
                        status="failed", reason=f"its log is no measurement: {problem}",
                        peak_gib=reading.peak_gib))
                if reading.oom:
                    return self._stop(proc, job_id, Outcome(
                        status="oom", reason="the run ran out of memory: "
                        + _tail(*self._log_paths(log_path, job_id, workdir)),
                        peak_gib=reading.peak_gib))
                if timed and diverged(max(timed), trial.predicted_step_s, trial.diverge) \
                        and trial.predicted_step_s > 0:
                    return self._stop(proc, job_id, Outcome(
                        status="failed", reason=divergence_reason(max(timed), trial.predicted_step_s,
                                                                  trial.diverge),
                        step_times_s=tuple(timed), peak_gib=reading.peak_gib))
                if len(timed) >= trial.steps:
                    timed = timed[:trial.steps]
                    return self._stop(proc, job_id, Outcome(
                        status="ok", step_time_s=statistics.median(timed), step_times_s=tuple(timed),
                        peak_gib=reading.peak_gib, notes=reading.notes))
                if ended:
                    got = len(reading.step_times_s)
                    what = (f"it logged {got} of {trial.warmup + trial.steps} steps" if reading.format
                            else f"no {tune.log_format} step line in its log")
                    return Outcome(status="failed", reason=f"the run ended (exit {code}) before its "
                                   f"timed steps: {what}; "
                                   + _tail(*self._log_paths(log_path, job_id, workdir)),
                                   peak_gib=reading.peak_gib)
                if time.monotonic() - started > limit:
                    if limit < trial.timeout_s:
                        outcome = Outcome(status="failed", reason=(
                            f"diverged: {len(reading.step_times_s)} steps logged after {limit:.0f} s, "
                            f"when {trial.warmup + trial.steps} of {trial.predicted_step_s:.3g} s "
                            f"were predicted (the limit is {trial.diverge:g}x)"))
                    else:
                        outcome = Outcome(status="timeout", reason=(
                            f"stopped after {limit:.0f} s (--timeout) with "
                            f"{len(reading.step_times_s)} steps logged"))
                    return self._stop(proc, job_id, outcome)
                if not behind:
                    time.sleep(POLL_S)
        finally:
            self._stop(proc, job_id, None)

    def _stop(self, proc: subprocess.Popen[bytes], job_id: str | None,
              outcome: Outcome | None) -> Outcome:
        """End what this run started (its job, its process group); ``outcome`` back."""
        batch = self.runner.batch
        if job_id is not None and batch is not None and proc.poll() is None:
            try:
                subprocess.run(batch.cancel(job_id), timeout=60, capture_output=True, check=False)
            except (OSError, subprocess.TimeoutExpired):
                pass
        # the whole group, the launcher's children too (the run may have exited, its
        # workers not): asked to end, then killed once they have had their seconds
        end_group(proc, term_s=10.0, kill_s=30.0)
        if proc.stdout is not None:
            proc.stdout.close()
        return outcome if outcome is not None else Outcome(status="failed")

    def _log_paths(self, log_path: Path, job_id: str | None, workdir: Path) -> list[Path]:
        """Where a run's log is: the launch's own output, and a batch job's output file."""
        batch = self.runner.batch
        return [log_path] + ([batch.output(workdir, job_id)] if batch is not None and job_id else [])


def end_group(proc: subprocess.Popen[Any], *, term_s: float, kill_s: float) -> None:
    """End ``proc``'s whole process group: SIGTERM, ``term_s`` seconds for it to go, then
    SIGKILL and ``kill_s`` more, stopping as soon as no process of the group is left (the
    leader may have exited, its children not)."""
    for sig, seconds in ((signal.SIGTERM, term_s), (signal.SIGKILL, kill_s)):
        if proc.poll() is not None and not _group_running(proc.pid):
            break
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            if proc.poll() is None:
                proc.kill()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _group_running(proc.pid):
                break
            time.sleep(0.02)


def _group_running(pgid: int) -> bool:
    """Whether a process of the group ``pgid`` is still running (not a zombie waiting to be
    reaped): read from /proc where there is one, else asked of the kernel."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


class _Logs:
    """A run's log files read as they grow: each from where the last poll stopped, by its
    own :class:`LogReader`."""

    def __init__(self, *, tokens_per_step: int, gpus: int) -> None:
        self._tokens, self._gpus = tokens_per_step, gpus
        self._readers: dict[Path, LogReader] = {}
        self._offsets: dict[Path, int] = {}

    def read(self, paths: list[Path], until: float) -> bool:
        """Read what ``paths`` gained since the last call, until the monotonic clock
        reads ``until``: True where some was left unread then."""
        for path in paths:
            reader = self._readers.setdefault(path, LogReader(tokens_per_step=self._tokens,
                                                              gpus=self._gpus))
            offset = self._offsets.get(path, 0)
            try:
                # not blocking on a FIFO; a log is a regular file or nothing of the run's
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    continue
                while data := os.pread(fd, READ_BYTES, offset):
                    reader.feed(data)
                    offset += len(data)
                    if time.monotonic() > until:
                        return True
            except OSError:
                continue
            finally:
                self._offsets[path] = offset
                os.close(fd)
        return False

    def finish(self) -> None:
        for reader in self._readers.values():
            reader.finish()

    def reading(self) -> tuple[LogReading, str]:
        """What the logs say: the first with a step line's reading (an OOM error in any
        of them counts), and the first problem of any, named by its file and line ("" if
        none)."""
        readings = [(path, reader.reading()) for path, reader in self._readers.items()]
        problem = next((f"{path.name} line {line}: {message}" for path, r in readings
                        for line, message in r.problems[:1]), "")
        oom = any(r.oom for _, r in readings)
        chosen = next((r for _, r in readings if r.format), None)
        if chosen is None:
            peaks = [r.peak_gib for _, r in readings if r.peak_gib is not None]
            chosen = LogReading("", peak_gib=max(peaks) if peaks else None)
        return dataclasses.replace(chosen, oom=oom), problem


def _tail(*paths: Path, lines: int = 3) -> str:
    """The last lines of the run's log files, on one line: read from the last TAIL_BYTES
    of each file, each line cut to TAIL_LINE_CHARS, escapes and control characters taken
    out."""
    found: list[str] = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - TAIL_BYTES))
                text = f.read(TAIL_BYTES).decode("utf-8", "replace")
        except OSError:
            continue
        for line in text.splitlines():
            line = "".join(c if c.isprintable() else " " for c in ANSI.sub("", line)).strip()
            if line:
                found.append(line if len(line) <= TAIL_LINE_CHARS else line[:TAIL_LINE_CHARS] + "...")
    return " | ".join(found[-lines:]) or "(empty log)"
