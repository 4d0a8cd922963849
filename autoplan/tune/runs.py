"""The runs log: one CSV of measured training runs, which ``tune``, ``validate --runs``
and ``runs import`` append to and ``calibrate`` and ``check --runs`` read.

One row per run of one plan. Columns (``COLUMNS``, in this order when autoplan writes):

- ``time`` (ISO 8601, UTC), ``source`` (tune | validate | import | user), ``runner``
  (local | torchrun | slurm | the launcher a log came from), ``plan_id`` (:func:`plan_id`:
  the same plan, run again, has the same id), ``group`` (runs calibrate holds out
  together: by default the plan's id);
- what ran, readable by people and writable from a user's own job history: ``model``,
  ``cluster`` (built-in names, or paths relative to the CSV's folder), ``gpus``,
  ``global_batch``, ``seq_len``, ``dtype``, ``dp``, ``tp``, ``pp``, ``cp``, ``ep``,
  ``etp``, ``vpp``, ``micro_batch``, ``schedule``, ``recompute``, ``zero``,
  ``sequence_parallel``, ``stack``;
- ``plan``: the whole plan file as one line of JSON (written by autoplan; where it is
  present it is what ran, and the columns above only describe it);
- ``steps`` (timed steps), ``status`` (ok | oom | timeout | failed), ``reason``;
- ``measured_step_time_s`` (required where status is ok), ``measured_peak_gib``
  (optional), ``predicted_step_time_s``, ``predicted_peak_gib`` (what autoplan predicted
  when the run was made; calibrate predicts again).

A user's CSV needs only ``model``, ``cluster``, ``global_batch``, ``seq_len``, ``dp``,
``tp``, ``pp``, ``micro_batch`` and ``measured_step_time_s`` (or ``plan`` and the
measurement); every other column is optional and takes the plan file's default.

Pure library: reading refuses a bad file with every problem named by row and column
(:class:`~autoplan.errors.InputError`); writing returns the text (the command line writes
it)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoplan.errors import InputError, Problem
from autoplan.plan import Plan
from autoplan.text import one_line

COLUMNS = (
    "time", "source", "runner", "plan_id", "group",
    "model", "cluster", "gpus", "global_batch", "seq_len", "dtype",
    "dp", "tp", "pp", "cp", "ep", "etp", "vpp", "micro_batch", "schedule", "recompute", "zero",
    "sequence_parallel", "stack",
    "steps", "status", "reason",
    "measured_step_time_s", "measured_peak_gib", "predicted_step_time_s", "predicted_peak_gib",
    "plan",
)
STATUSES = ("ok", "oom", "timeout", "failed")
SOURCES = ("tune", "validate", "import", "user")
# the columns a row without ``plan`` needs to say what ran
PLAN_COLUMNS = ("model", "cluster", "global_batch", "seq_len", "dp", "tp", "pp", "micro_batch")
MAX_RUNS_BYTES = 64 * 2**20  # a log of ~100k runs; larger is not a runs log
MAX_ROWS = 100_000
MAX_STEP_S = 1e6  # a step of 11 days is no measurement
MAX_PEAK_GIB = 1e6


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One measured (or failed) run of one plan."""

    plan: Plan
    status: str = "ok"
    measured_step_time_s: float | None = None
    measured_peak_gib: float | None = None
    predicted_step_time_s: float | None = None
    predicted_peak_gib: float | None = None
    reason: str = ""
    source: str = "user"
    runner: str = ""
    time: str = ""
    steps: int | None = None
    group: str = ""
    row: int = 0  # 1-based data row of the file it was read from (0: not read)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.measured_step_time_s is not None

    @property
    def plan_id(self) -> str:
        return plan_id(self.plan)

    @property
    def group_key(self) -> str:
        return self.group or self.plan_id


def plan_document_of(plan: Plan) -> dict[str, Any]:
    """The plan file of ``plan`` without prediction (built-ins by name)."""
    from autoplan.planfile import plan_document

    return plan_document(plan)


def plan_id(plan: Plan) -> str:
    """12 hex digits naming what runs: the plan file's content (model, cluster, job,
    layout, every choice, stack), so the same plan run again has the same id."""
    doc = plan_document_of(plan)
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# --------------------------------------------------------------------------- writing

def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.6g}"


def row_of(run: Run) -> dict[str, str]:
    """The CSV row of ``run`` (every column of ``COLUMNS``)."""
    plan, lay = run.plan, run.plan.layout
    doc = plan_document_of(plan)
    model = doc["model"] if isinstance(doc["model"], str) else plan.model.name
    cluster = doc["cluster"].get("name", plan.cluster.name) if isinstance(doc["cluster"], dict) \
        and "gpus_per_node" not in doc["cluster"] else plan.cluster.name
    return {
        "time": run.time, "source": run.source, "runner": run.runner, "plan_id": plan_id(plan),
        "group": run.group,
        "model": model, "cluster": cluster, "gpus": str(lay.gpus),
        "global_batch": str(plan.job.global_batch), "seq_len": str(plan.job.seq_len),
        "dtype": plan.job.dtype.value,
        "dp": str(lay.dp), "tp": str(lay.tp), "pp": str(lay.pp), "cp": str(lay.cp),
        "ep": str(lay.ep), "etp": str(lay.etp), "vpp": str(lay.vpp),
        "micro_batch": str(plan.micro_batch), "schedule": plan.schedule.value,
        "recompute": plan.recompute.value, "zero": str(int(plan.zero)),
        "sequence_parallel": "true" if plan.sequence_parallel else "false",
        "stack": plan.stack.name,
        "steps": "" if run.steps is None else str(run.steps), "status": run.status,
        "reason": one_line(run.reason),
        "measured_step_time_s": _num(run.measured_step_time_s),
        "measured_peak_gib": _num(run.measured_peak_gib),
        "predicted_step_time_s": _num(run.predicted_step_time_s),
        "predicted_peak_gib": _num(run.predicted_peak_gib),
        "plan": json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True),
    }


def csv_text(runs: Iterable[Run], existing: str = "", source: str = "runs log") -> str:
    """The runs log with ``runs`` appended: ``existing`` (the file's text, '' for a new
    one) must be a runs log autoplan wrote (its header ``COLUMNS``)."""
    if existing.strip():
        header = next(csv.reader(io.StringIO(existing)), [])
        if tuple(h.strip() for h in header) != COLUMNS:
            raise InputError.single(source, "", "not a runs log autoplan writes (its header is not "
                                                "autoplan's columns): append to a new file")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    if not existing.strip():
        writer.writeheader()
    for run in runs:
        writer.writerow(row_of(run))
    base = existing if not existing or existing.endswith("\n") else existing + "\n"
    return base + buf.getvalue()


# --------------------------------------------------------------------------- reading

def read_runs(path: Path) -> list[Run]:
    """Every run of the CSV at ``path`` (see module doc); every problem at once, named by
    row (``row 3``: the third data row) and column."""
    from autoplan.descriptors.strict import read_limited

    data = read_limited(path, MAX_RUNS_BYTES, "a runs log")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError.single(str(path), "", f"not UTF-8 text (byte {exc.start})") from None
    return parse_runs(text, str(path), path.parent)


def parse_runs(text: str, source: str, base: Path) -> list[Run]:
    """:func:`read_runs` of ``text``; relative paths in ``model``/``cluster`` are taken from
    ``base``."""
    try:
        reader = csv.DictReader(io.StringIO(text))
        header = [h.strip() for h in (reader.fieldnames or [])]
    except csv.Error as exc:
        raise InputError.single(source, "", f"not a CSV file: {exc}") from None
    if not header:
        raise InputError.single(source, "", "empty: expected a header row of the runs log's columns")
    unknown = [h for h in header if h not in COLUMNS]
    if unknown:
        from autoplan.descriptors.strict import did_you_mean
        raise InputError([Problem(source, f"column {one_line(h)!r}", "unknown column"
                                  + did_you_mean(h, COLUMNS)) for h in unknown[:10]])
    if "measured_step_time_s" not in header:
        raise InputError.single(source, "", "missing column measured_step_time_s")
    if "plan" not in header:
        missing = [c for c in PLAN_COLUMNS if c not in header]
        if missing:
            raise InputError.single(source, "", "missing columns " + ", ".join(missing)
                                    + " (or a plan column holding the plan file as JSON)")
    problems: list[Problem] = []
    runs: list[Run] = []
    try:
        for i, raw in enumerate(reader, start=1):
            if i > MAX_ROWS:
                raise InputError.single(source, "", f"more than {MAX_ROWS:,} rows: not a runs log")
            if None in raw:
                problems.append(Problem(source, f"row {i}", "more values than the header has columns"))
                continue
            row = {k.strip(): (v or "").strip() for k, v in raw.items()}
            if not any(row.values()):
                continue
            run = _run_of(row, i, source, base, problems)
            if run is not None:
                runs.append(run)
            if len(problems) >= 20:
                break
    except csv.Error as exc:
        raise InputError.single(source, "", f"not a CSV file: {exc}") from None
    if problems:
        raise InputError(problems[:20])
    return runs


def _float(row: dict[str, str], key: str, where: str, source: str, problems: list[Problem],
           lo: float, hi: float) -> float | None:
    text = row.get(key, "")
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and lo < value <= hi):
        problems.append(Problem(source, f"{where}.{key}",
                                f"expected a number above {lo:g} and at most {hi:g}, got {one_line(text)!r}"))
        return None
    return value


def _plan_mapping(row: dict[str, str], base: Path) -> dict[str, Any]:
    """A plan-file mapping from a row's columns."""
    def ref(text: str) -> str:
        from autoplan.descriptors.library import looks_like_path

        if looks_like_path(text) and not Path(text).is_absolute():
            return str(base / text)
        return text

    doc: dict[str, Any] = {"autoplan": 1, "model": ref(row["model"])}
    cluster: dict[str, Any] = {"name": ref(row["cluster"])}
    if row.get("gpus"):
        cluster["gpus"] = _int_or_text(row["gpus"])
    doc["cluster"] = cluster
    job: dict[str, Any] = {"global_batch": _int_or_text(row["global_batch"]),
                           "seq_len": _int_or_text(row["seq_len"])}
    if row.get("dtype"):
        job["dtype"] = row["dtype"]
    doc["job"] = job
    doc["layout"] = {k: _int_or_text(row[k]) for k in ("dp", "tp", "pp", "cp", "ep", "etp", "vpp")
                     if row.get(k)}
    doc["micro_batch"] = _int_or_text(row["micro_batch"])
    for key in ("schedule", "recompute", "stack"):
        if row.get(key):
            doc[key] = row[key]
    if row.get("zero"):
        doc["zero"] = _int_or_text(row["zero"])
    if row.get("sequence_parallel"):
        sp = row["sequence_parallel"].lower()
        doc["sequence_parallel"] = {"true": True, "false": False, "1": True, "0": False}.get(sp, sp)
    return doc


def _int_or_text(text: str) -> int | str:
    try:
        return int(text)
    except ValueError:
        return text  # the plan reader names the field and what it expected


def _run_of(row: dict[str, str], i: int, source: str, base: Path,
            problems: list[Problem]) -> Run | None:
    from autoplan.planfile import read_plan

    where = f"row {i}"
    before = len(problems)
    status = row.get("status") or "ok"
    if status not in STATUSES:
        problems.append(Problem(source, f"{where}.status",
                                f"expected one of {', '.join(STATUSES)}, got {one_line(status)!r}"))
    origin = row.get("source") or "user"
    if origin not in SOURCES:
        problems.append(Problem(source, f"{where}.source",
                                f"expected one of {', '.join(SOURCES)}, got {one_line(origin)!r}"))
    step = _float(row, "measured_step_time_s", where, source, problems, 0.0, MAX_STEP_S)
    if status == "ok" and step is None and len(problems) == before:
        problems.append(Problem(source, f"{where}.measured_step_time_s",
                                "missing: a run with status ok needs its measured step time"))
    peak = _float(row, "measured_peak_gib", where, source, problems, 0.0, MAX_PEAK_GIB)
    pstep = _float(row, "predicted_step_time_s", where, source, problems, 0.0, math.inf)
    ppeak = _float(row, "predicted_peak_gib", where, source, problems, 0.0, math.inf)
    steps = None
    if row.get("steps"):
        try:
            steps = int(row["steps"])
            if not 1 <= steps <= 10**9:
                raise ValueError
        except ValueError:
            problems.append(Problem(source, f"{where}.steps",
                                    f"expected a whole number from 1, got {one_line(row['steps'])!r}"))
    plan = None
    try:
        if row.get("plan"):
            try:
                doc = json.loads(row["plan"])
            except (ValueError, RecursionError) as exc:
                raise InputError.single(source, f"{where}.plan", f"not JSON: {one_line(str(exc))}") from None
            plan = read_plan(doc, source, f"{where}.plan")
        else:
            missing = [c for c in PLAN_COLUMNS if not row.get(c)]
            if missing:
                raise InputError.single(source, where, "missing " + ", ".join(missing)
                                        + " (what ran; or a plan column)")
            plan = read_plan(_plan_mapping(row, base), source, where)
    except InputError as exc:
        problems.extend(exc.problems)
    if len(problems) > before or plan is None:
        return None
    return Run(plan=plan, status=status, measured_step_time_s=step, measured_peak_gib=peak,
               predicted_step_time_s=pstep, predicted_peak_gib=ppeak, reason=row.get("reason", ""),
               source=origin, runner=row.get("runner", ""), time=row.get("time", ""),
               steps=steps, group=row.get("group", ""), row=i)


def latest(runs: Sequence[Run], of: Plan) -> list[Run]:
    """The measured runs of the plan ``of`` (same :func:`plan_id`), oldest first (by
    ``time`` where every one has it, else file order)."""
    pid = plan_id(of)
    mine = [r for r in runs if r.ok and r.plan_id == pid]
    if all(r.time for r in mine):
        mine.sort(key=lambda r: (r.time, r.row))
    return mine
