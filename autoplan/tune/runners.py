"""Where ``tune`` runs a plan, and how it reads back what the plan measured.

- :class:`LocalRunner`: this machine's devices through ``validate``'s torch engine
  (:mod:`autoplan.bench.validate`): the plan's ranks as local processes over gloo on CPU,
  one rank's slice on a GPU. It measures the median step time of the timed steps and the
  peak memory of the worst rank.
- :class:`LaunchRunner`: the plan's exported launch on the user's cluster: ``torchrun``
  on this node (the Megatron-LM script, or torchtitan's TOML under ``torchrun -m
  torchtitan.train``), or ``slurm`` (the exported sbatch script under ``sbatch --wait``).
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
import math
import os
import select
import signal
import stat
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from autoplan.errors import AutoplanError
from autoplan.plan import Plan
from autoplan.tune.logs import ANSI, LogReader, LogReading
from autoplan.units import GiB

Progress = Callable[[str], None]

# seconds a run may take before its first step on top of its predicted steps (process
# start, torch's import, the process group, building the model, the first compile)
STARTUP_S = {"local": 90.0, "torchrun": 600.0, "slurm": 1800.0}
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


def deadline_s(kind: str, trial: Trial) -> float:
    """The seconds a run may take: the trial's timeout, or less where the prediction says
    the run should be done long before (startup, then every step at ``diverge`` times its
    prediction): a run still going then has diverged."""
    if trial.predicted_step_s <= 0 or not math.isfinite(trial.predicted_step_s):
        return trial.timeout_s
    steps = trial.warmup + trial.steps + 2  # validate's memory step and one more warm-up
    return min(trial.timeout_s, STARTUP_S[kind] + steps * trial.predicted_step_s * trial.diverge)


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
    """The exported launch of each plan: ``torchrun`` on this node or ``slurm``."""

    name: str = "torchrun"  # torchrun | slurm
    launcher: str = "megatron"  # megatron | torchtitan
    env: tuple[tuple[str, str], ...] = ()  # more environment for the launch

    def refuses(self, plan: Plan) -> str | None:
        from autoplan.export import Launcher, Target, refusals

        if self.name == "torchrun" and plan.layout.gpus > plan.cluster.gpus_per_node:
            return (f"{plan.layout.gpus} GPUs is more than one node of {plan.cluster.gpus_per_node}: "
                    "torchrun runs on this node (use --runner slurm)")
        target = Target.SLURM if self.name == "slurm" else Target(self.launcher)
        found = refusals(plan, target, Launcher(self.launcher))
        return "; ".join(f"{k}: {v}" if k else v for k, v in found) or None

    def files(self, plan: Plan) -> dict[str, str]:
        from autoplan.export import Launcher, Target, export

        target = Target.SLURM if self.name == "slurm" else Target(self.launcher)
        return export(plan, target, "plan", Launcher(self.launcher))

    def command(self, plan: Plan, trial: Trial, workdir: Path, files: dict[str, str]) -> list[str]:
        """The command that launches ``plan`` for ``trial`` from ``workdir`` (run in it):
        every path in it absolute."""
        workdir = workdir.absolute()
        total = trial.warmup + trial.steps + 1  # one more: the run is stopped once they are logged
        titan = ["--training.steps", str(total), "--metrics.log_freq", "1"]
        if self.name == "slurm":
            return ["sbatch", "--wait", "--parsable", f"--output={workdir / 'slurm-%j.out'}",
                    str(workdir / "job.sbatch"), *(titan if self.launcher == "torchtitan" else [])]
        if self.launcher == "torchtitan":
            return ["torchrun", "--standalone", "--nnodes", "1", "--nproc-per-node",
                    str(plan.layout.gpus), "-m", "torchtitan.train", "--job.config_file",
                    str(workdir / "torchtitan.toml"), *titan]
        (script,) = [name for name in files if name.endswith(".sh")]
        return ["bash", str(workdir / script)]

    def environment(self, trial: Trial, workdir: Path) -> dict[str, str]:
        """The launch's environment: every path in it absolute."""
        workdir = workdir.absolute()
        total = trial.warmup + trial.steps + 1
        return {**os.environ, "TRAIN_ITERS": str(total), "EVAL_ITERS": "0",
                "EVAL_INTERVAL": str(total), "SAVE_INTERVAL": str(10**9),
                "CHECKPOINT_DIR": str(workdir / "checkpoints"),
                "CONFIG_FILE": str(workdir / "torchtitan.toml"),
                **dict(self.env)}

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
        limit = deadline_s(self.name, trial)
        started = time.monotonic()
        job_id: str | None = None
        with open(log_path, "wb") as log:
            try:
                proc = subprocess.Popen(cmd, cwd=workdir, env=self.environment(trial, workdir),
                                        stdout=subprocess.PIPE if self.name == "slurm" else log,
                                        stderr=log, start_new_session=True)
            except OSError as exc:
                return Outcome(status="failed", reason=f"{cmd[0]}: {exc.strerror or exc}")
        logs = _Logs(tokens_per_step=plan.job.global_batch * plan.job.seq_len, gpus=plan.layout.gpus)
        try:
            if self.name == "slurm":
                job_id = _job_id(proc, started + limit)
                if job_id is None:
                    late = time.monotonic() - started > limit
                    return self._stop(proc, job_id, Outcome(
                        status="timeout" if late else "failed",
                        reason=f"sbatch printed no job id{f' in {limit:.0f} s' if late else ''}: "
                               + _tail(log_path)))
                progress(f"submitted job {job_id}")
            while True:
                code = proc.poll()
                paths = _log_paths(log_path, job_id, workdir)
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
                        status="oom", reason="the run ran out of memory: " + _tail(log_path, job_id, workdir),
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
                            else "no Megatron-LM or torchtitan step line in its log")
                    return Outcome(status="failed", reason=f"the run ended (exit {code}) before its "
                                   f"timed steps: {what}; " + _tail(log_path, job_id, workdir),
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
        if job_id is not None and proc.poll() is None:
            try:
                subprocess.run(["scancel", job_id], timeout=60, capture_output=True, check=False)
            except (OSError, subprocess.TimeoutExpired):
                pass
        # the whole group, the launcher's children too (the run may have exited, its
        # workers not): asked to end, then killed once they have had their seconds
        for sig, seconds in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 30.0)):
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
        if proc.stdout is not None:
            proc.stdout.close()
        return outcome if outcome is not None else Outcome(status="failed")


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


def _job_id(proc: subprocess.Popen[bytes], until: float) -> str | None:
    """The job id ``sbatch --parsable`` prints first (``ID`` or ``ID;cluster``), read
    until the monotonic clock reads ``until`` (None: none came by then, or it is no id)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    got = b""
    while b"\n" not in got and len(got) < 256:
        left = until - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if ready:
            chunk = os.read(fd, 256 - len(got))
            if not chunk:
                break
            got += chunk
    job = got.split(b"\n")[0].decode("utf-8", "replace").strip().split(";")[0]
    return job if job.isdigit() and len(job) <= 20 else None


def _log_paths(log_path: Path, job_id: str | None, workdir: Path | None) -> list[Path]:
    """Where a run's log is: the launch's own output, and a Slurm job's output file."""
    return [log_path] + ([workdir / f"slurm-{job_id}.out"] if job_id and workdir else [])


def _tail(log_path: Path, job_id: str | None = None, workdir: Path | None = None, lines: int = 3) -> str:
    """The last lines of the run's log, on one line: read from the last TAIL_BYTES of each
    file, each line cut to TAIL_LINE_CHARS, escapes and control characters taken out."""
    found: list[str] = []
    for path in _log_paths(log_path, job_id, workdir):
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
