"""The runs log: one CSV of measured training runs, which ``tune``, ``validate --runs``
and ``runs import`` append to and ``calibrate``, ``evaluate --runs`` and ``check --runs``
read.

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
  when the run was made; calibrate predicts again);
- ``kind``: ``training`` (or empty, as in logs written before serving runs were) or
  ``serving``.

A serving run (``kind`` serving: ``tune --serving``, ``runs import`` of a benchmark
client's result; :mod:`autoplan.tune.serving_runs` reads it, the training readers pass it
by) is one replica of a serving deployment driven at its share of the job's traffic by
the engine's benchmark client. Its ``plan`` cell is that replica's serving plan file
(required: the row is read from it); ``model``, ``cluster``, ``gpus`` (the replica's),
``tp``, ``pp``, ``ep``, ``time``, ``source``, ``runner``, ``plan_id``, ``group``,
``status`` and ``reason`` mean what they mean above, and its own columns
(``SERVING_COLUMNS``) are:

- what ran: ``engine`` (vllm | sglang | trtllm), ``release`` (the engine release the plan
  names, else its default line's), ``client`` (vllm-bench | sglang-bench | aiperf),
  ``gpu`` (the device), ``deployment`` (the deployment the replica stands for, as serve
  labels it: ``2x tp4``), ``replicas`` (its replicas: the run is one of them),
  ``attention_dp``, ``weights``, ``kv_cache``; the workload: ``input_len``,
  ``output_len`` (tokens, fixed), ``arrival`` (``rate R``, ``concurrency C`` or
  ``offline``), ``requests``, ``ttft_slo_ms``, ``tpot_slo_ms``;
- what the client measured (of the replica): ``completed`` requests,
  ``measured_ttft_mean_ms``, ``measured_ttft_p50_ms``, ``measured_ttft_p99_ms``, the same
  for ``tpot`` and ``itl`` (the mean TTFT and TPOT are required where status is ok),
  ``measured_requests_per_s``, ``measured_output_tokens_per_s``,
  ``measured_goodput_rps`` (requests/s within the SLO);
- what autoplan predicted for it when it ran: ``predicted_ttft_mean_ms``,
  ``predicted_ttft_p99_ms``, ``predicted_tpot_mean_ms``, ``predicted_tpot_p99_ms``,
  ``predicted_requests_per_s``, ``predicted_output_tokens_per_s``,
  ``predicted_goodput_rps`` (calibrate predicts again).

A user's CSV needs only ``model``, ``cluster``, ``global_batch``, ``seq_len``, ``dp``,
``tp``, ``pp``, ``micro_batch`` and ``measured_step_time_s`` (or ``plan`` and the
measurement), in any order; every other column is optional and takes the plan file's
default. Appending to such a file rewrites it whole (the command line writes a temporary
file beside it and renames it into place) with the missing columns added at the end of
its header, its rows' values kept as they were.

Numbers are held to one range wherever they enter (:func:`step_time_problem`,
:func:`peak_gib_problem`): a step time from ``MIN_STEP_S`` (a microsecond) to
``MAX_STEP_S`` (11.6 days), a peak above 0 and at most ``MAX_PEAK_GIB``. The launchers'
log reader (:mod:`autoplan.tune.logs`) and the writer here refuse what the reader here
would: autoplan never writes a row it later refuses.

Text cells are written as OWASP's guidance on CSV injection says
(https://owasp.org/www-community/attacks/CSV_Injection): a cell beginning with ``=``,
``+``, ``-``, ``@``, a tab or a carriage return gets a leading single quote, so that a
spreadsheet shows it as text rather than running it as a formula; the reader takes that
quote off again (:func:`escape_cell`, :func:`unescape_cell`: exact round trip). Number
columns (``NUMBER_COLUMNS``) are never escaped: ``-5`` there is a number, and refused as
one.

Readers' cost is bounded before anything is built: at most ``MAX_RUNS_BYTES`` and
``MAX_ROWS`` rows (counted first, without building a plan), at most ``MAX_PLANS``
distinct plans, and each distinct plan (the same ``plan`` cell, or the same cells saying
what ran) built once, however many rows repeat it.

Pure library: reading refuses a bad file with every problem named by file, row and
column (:class:`~autoplan.errors.InputError`); writing returns the text (the command line
writes it)."""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from autoplan.descriptors.strict import DuplicateKey, json_object, shown
from autoplan.errors import InputError, Problem
from autoplan.plan import Plan
from autoplan.text import one_line

# a serving run's own columns (module doc), after every training column
SERVING_COLUMNS = (
    "engine", "release", "client", "gpu", "deployment", "replicas", "attention_dp", "weights", "kv_cache",
    "input_len", "output_len", "arrival", "requests", "ttft_slo_ms", "tpot_slo_ms", "completed",
    "measured_ttft_mean_ms", "measured_ttft_p50_ms", "measured_ttft_p99_ms",
    "measured_tpot_mean_ms", "measured_tpot_p50_ms", "measured_tpot_p99_ms",
    "measured_itl_mean_ms", "measured_itl_p50_ms", "measured_itl_p99_ms",
    "measured_requests_per_s", "measured_output_tokens_per_s", "measured_goodput_rps",
    "predicted_ttft_mean_ms", "predicted_ttft_p99_ms", "predicted_tpot_mean_ms", "predicted_tpot_p99_ms",
    "predicted_requests_per_s", "predicted_output_tokens_per_s", "predicted_goodput_rps",
)
COLUMNS = (
    "time", "source", "runner", "plan_id", "group",
    "model", "cluster", "gpus", "global_batch", "seq_len", "dtype",
    "dp", "tp", "pp", "cp", "ep", "etp", "vpp", "micro_batch", "schedule", "recompute", "zero",
    "sequence_parallel", "stack",
    "steps", "status", "reason",
    "measured_step_time_s", "measured_peak_gib", "predicted_step_time_s", "predicted_peak_gib",
    "plan", "kind", *SERVING_COLUMNS,
)
KINDS = ("training", "serving")  # the ``kind`` column ("" reads as training)
# columns holding numbers: never escaped as text (a negative number is a number)
NUMBER_COLUMNS = frozenset((
    "gpus", "global_batch", "seq_len", "dp", "tp", "pp", "cp", "ep", "etp", "vpp", "micro_batch",
    "zero", "steps", "measured_step_time_s", "measured_peak_gib", "predicted_step_time_s",
    "predicted_peak_gib", "replicas", "attention_dp", "input_len", "output_len", "requests",
    *(c for c in SERVING_COLUMNS if c.endswith(("_ms", "_per_s", "_rps")) or c == "completed")))
TEXT_COLUMNS = tuple(c for c in COLUMNS if c not in NUMBER_COLUMNS)
STATUSES = ("ok", "oom", "timeout", "failed")
SOURCES = ("tune", "validate", "import", "user")
# the columns a row without ``plan`` needs to say what ran
PLAN_COLUMNS = ("model", "cluster", "global_batch", "seq_len", "dp", "tp", "pp", "micro_batch")
# the cells that say what ran, where no ``plan`` cell does: rows alike in these are one plan
WHAT_RAN = ("model", "cluster", "gpus", "global_batch", "seq_len", "dtype", "dp", "tp", "pp", "cp",
            "ep", "etp", "vpp", "micro_batch", "schedule", "recompute", "zero", "sequence_parallel",
            "stack")
# a row autoplan writes is 0.3 to 1.3 KB (1.3 KB: a cluster file's device inside its plan
# cell); ``MAX_ROWS`` of them, and no more, fit
MAX_RUNS_BYTES = 160 * 2**20
MAX_ROWS = 100_000
# distinct plans a runs log may name: each is built (and calibrate predicts each) on its
# own, about a millisecond apiece; a log of 10^5 runs is many runs of a few plans
MAX_PLANS = 2_000
MIN_STEP_S = 1e-6  # a training step under a microsecond is no measurement of one
MAX_STEP_S = 1e6  # a step of 11.6 days is no measurement
MAX_PEAK_GIB = 1e6  # a million GiB on one device is no measurement
MAX_PROBLEMS = 20
# the characters a spreadsheet takes a cell beginning with as a formula (OWASP, CSV
# injection): a text cell beginning with one is written after a single quote
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def step_time_problem(seconds: float) -> str | None:
    """Why ``seconds`` is no step time (not finite, under ``MIN_STEP_S``, above
    ``MAX_STEP_S``), or None: the one range the runs log and the log reader hold."""
    if not (math.isfinite(seconds) and MIN_STEP_S <= seconds <= MAX_STEP_S):
        return (f"expected a step time from {MIN_STEP_S:g} s to {MAX_STEP_S:g} s, "
                f"got {_shown_number(seconds)} s")
    return None


def peak_gib_problem(gib: float) -> str | None:
    """Why ``gib`` is no peak memory (not finite, at most 0, above ``MAX_PEAK_GIB``), or
    None."""
    if not (math.isfinite(gib) and 0.0 < gib <= MAX_PEAK_GIB):
        return f"expected a peak above 0 GiB and at most {MAX_PEAK_GIB:g} GiB, got {_shown_number(gib)} GiB"
    return None


def _shown_number(x: float) -> str:
    return f"{x:.3g}"


def escape_cell(value: str) -> str:
    """A text cell as written (module doc): a leading single quote before a value a
    spreadsheet would run as a formula, and before one :func:`unescape_cell` would
    otherwise change (a quote before such a character or another quote)."""
    first = value[:1]
    if first in FORMULA_START or (first == "'" and value[1:2] in ("'", *FORMULA_START)):
        return "'" + value
    return value


def unescape_cell(cell: str) -> str:
    """The value :func:`escape_cell` wrote ``cell`` for (a cell it did not escape is its
    own value)."""
    if cell[:1] == "'" and cell[1:2] in ("'", *FORMULA_START):
        return cell[1:]
    return cell


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
    from autoplan.plans.file import plan_document

    return plan_document(plan)


@functools.lru_cache(maxsize=MAX_PLANS)
def _plan_json(plan: Plan) -> tuple[str, str, str, str]:
    """(the plan file of ``plan`` as one line of JSON, its :func:`plan_id`, the model and
    cluster columns naming it), once a plan: a runs log's rows repeat a few plans."""
    doc = plan_document_of(plan)
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    model = doc["model"] if isinstance(doc["model"], str) else plan.model.name
    cluster = doc["cluster"].get("name", plan.cluster.name) if isinstance(doc["cluster"], dict) \
        and "gpus_per_node" not in doc["cluster"] else plan.cluster.name
    return text, hashlib.sha256(text.encode()).hexdigest()[:12], model, cluster


def plan_id(plan: Plan) -> str:
    """12 hex digits naming what runs: the plan file's content (model, cluster, job,
    layout, every choice, stack), so the same plan run again has the same id."""
    return _plan_json(plan)[1]


# --------------------------------------------------------------------------- writing

def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.6g}"


def run_problems(run: Run, source: str = "runs log", where: str = "") -> list[Problem]:
    """What keeps ``run`` from being a row the reader takes back: its numbers outside the
    runs log's ranges (module doc), its status or source not one of the log's."""
    problems: list[Problem] = []

    def at(key: str) -> str:
        return f"{where}.{key}" if where else key

    for key, check in (("measured_step_time_s", step_time_problem),
                       ("predicted_step_time_s", step_time_problem),
                       ("measured_peak_gib", peak_gib_problem), ("predicted_peak_gib", peak_gib_problem)):
        value = getattr(run, key)
        if value is not None and (why := check(float(value))):
            problems.append(Problem(source, at(key), why))
    if run.status not in STATUSES:
        problems.append(Problem(source, at("status"),
                                f"expected one of {', '.join(STATUSES)}, got {run.status!r}"))
    if run.status == "ok" and run.measured_step_time_s is None:
        problems.append(Problem(source, at("measured_step_time_s"),
                                "missing: a run with status ok needs its measured step time"))
    if run.source not in SOURCES:
        problems.append(Problem(source, at("source"),
                                f"expected one of {', '.join(SOURCES)}, got {run.source!r}"))
    return problems


def row_of(run: Run) -> dict[str, str]:
    """The CSV row of ``run`` (every column of ``COLUMNS``), each value as it is (text
    cells unescaped: :func:`csv_text` escapes them as it writes)."""
    plan, lay = run.plan, run.plan.layout
    text, pid, model, cluster = _plan_json(plan)
    return {
        "time": run.time, "source": run.source, "runner": run.runner, "plan_id": pid,
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
        "plan": text, "kind": "training",
    }


def _written(row: dict[str, str], header: Sequence[str]) -> list[str]:
    """``row``'s cells in ``header``'s order (names as written, stripped), text escaped."""
    cells = []
    for raw in header:
        name = raw.strip()
        value = row.get(name, "")
        cells.append(value if name in NUMBER_COLUMNS else escape_cell(value))
    return cells


class LogRow(Protocol):
    """A run of another kind than training's (a serving run: :mod:`autoplan.tune.serving_runs`)
    as the writer takes it: its problems and its row."""

    def problems(self, source: str = ..., where: str = ...) -> list[Problem]: ...

    def row(self) -> dict[str, str]: ...


def _problems_of(run: Run | LogRow, source: str) -> list[Problem]:
    return run_problems(run, source, "new run") if isinstance(run, Run) else run.problems(source, "new run")


def _row_of(run: Run | LogRow) -> dict[str, str]:
    return row_of(run) if isinstance(run, Run) else run.row()


def csv_text(runs: Iterable[Run | LogRow], existing: str = "", source: str = "runs log",
             base: Path | None = None) -> str:
    """The runs log with ``runs`` appended. ``existing`` is the file's text ('' for a new
    one): autoplan's own (its header ``COLUMNS``: appended to, what was there kept byte for
    byte), or a user's CSV of runs log columns in any order (rewritten with the missing
    columns added at the end of its header, each row's values kept). Given ``base`` (the
    file's folder) every existing row is checked as :func:`parse_runs` reads it, so that
    nothing is added to a file the readers refuse; without it, the header only. A run the
    reader would refuse (:func:`run_problems`) is refused here."""
    runs = list(runs)
    problems = [p for run in runs for p in _problems_of(run, source)]
    if problems:
        raise InputError(problems[:MAX_PROBLEMS])
    body = existing.removeprefix("\ufeff")
    bom = existing[: len(existing) - len(body)]
    if body.strip():
        header = _header(body, source)
        if base is not None:
            parse_runs(body, source, base)
        rows = count_rows(body, source)
    else:
        header, rows = list(COLUMNS), 0
    if rows + len(runs) > MAX_ROWS:
        raise InputError.single(source, "", f"{rows:,} rows already: appending {len(runs)} would pass "
                                            f"the runs log's {MAX_ROWS:,}; start a new one")
    names = [h.strip() for h in header]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    if not body.strip():
        writer.writerow(COLUMNS)
        head = ""
    elif names == list(COLUMNS):
        head = existing if existing.endswith("\n") else existing + "\n"
    else:
        # a user's CSV: rewritten with the columns it lacks, its rows' values as they were
        missing = [c for c in COLUMNS if c not in names]
        header = [*header, *missing]
        reader = iter(_records(body, source))
        next(reader)
        writer.writerow(header)
        for cells in reader:
            if cells:
                writer.writerow([*cells, *[""] * (len(header) - len(cells))])
        head = bom
    for run in runs:
        writer.writerow(_written(_row_of(run), header))
    text = head + buf.getvalue()
    if len(text.encode()) > MAX_RUNS_BYTES:
        raise InputError.single(source, "", f"appending would make the runs log larger than "
                                            f"{MAX_RUNS_BYTES >> 20} MiB; start a new one")
    return text


# --------------------------------------------------------------------------- reading

def read_runs(path: Path, flag: str | None = None) -> list[Run]:
    """Every run of the CSV at ``path`` (see module doc); every problem at once, named by
    file, row (``row 3``: the third data row) and column. ``flag``: the option that named
    the file (``--runs``), for the errors about the file itself (missing, not a file)."""
    from autoplan.descriptors.strict import read_limited

    data = read_limited(path, MAX_RUNS_BYTES, "a runs log", source=flag)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError.single(str(path), "", f"not UTF-8 text (byte {exc.start})") from None
    del data  # the text only from here: a log at the bound is held once, not twice
    return parse_runs(text, str(path), path.parent)


def _header(text: str, source: str) -> list[str]:
    """The header row of a runs log's ``text``, as written, once checked: no unknown and no
    repeated column, and what a row needs to say what ran and what it measured."""
    from autoplan.descriptors.strict import did_you_mean

    header = next(iter(_records(text, source)), [])
    names = [h.strip() for h in header]
    if not any(names):
        raise InputError.single(source, "", "empty: expected a header row of the runs log's columns")
    problems: list[Problem] = []
    first: dict[str, int] = {}
    for i, name in enumerate(names, start=1):
        if name not in COLUMNS:
            problems.append(Problem(source, f"column {i}", f"unknown column {shown(one_line(name))}"
                                    + did_you_mean(name, COLUMNS)))
        elif name in first:
            problems.append(Problem(source, f"column {i}", f"{name!r} again (column {first[name]} is "
                                    f"{name!r}): a reader would keep one of the two silently"))
        else:
            first[name] = i
        if len(problems) >= MAX_PROBLEMS:
            break
    if problems:
        raise InputError(problems)
    if "measured_step_time_s" not in names:
        raise InputError.single(source, "", "missing column measured_step_time_s")
    if "plan" not in names:
        missing = [c for c in PLAN_COLUMNS if c not in names]
        if missing:
            raise InputError.single(source, "", "missing columns " + ", ".join(missing)
                                    + " (or a plan column holding the plan file as JSON)")
    return header


def count_rows(text: str, source: str) -> int:
    """The data rows of a runs log's ``text`` (blank lines aside), refused past
    ``MAX_ROWS`` as soon as they are counted: nothing is built. Counting lines first (a
    row is at least one) spares the count of a file well under the bound."""
    if _most_rows(text) <= MAX_ROWS:
        return sum(1 for cells in _records(text, source) if cells) - 1
    n = -1
    for cells in _records(text, source):
        if cells:
            n += 1
            if n > MAX_ROWS:
                raise InputError.single(source, "", f"more than {MAX_ROWS:,} rows: not a runs log "
                                                    "(start a new one; calibrate and check read "
                                                    f"at most {MAX_ROWS:,})")
    return n


def _most_rows(text: str) -> int:
    """The most data rows ``text`` can hold: a row ends at a newline, or at the end, and
    the header is one too."""
    return text.count("\n") - text.endswith("\n")


def _lines(text: str) -> Iterable[str]:
    """The lines of ``text``, each with its newline, as ``io.StringIO`` gives them but
    without its copy of the whole text (four bytes a character)."""
    start, end = 0, len(text)
    while start < end:
        stop = text.find("\n", start)
        if stop < 0:
            yield text[start:]
            return
        yield text[start:stop + 1]
        start = stop + 1


def _records(text: str, source: str) -> Iterable[list[str]]:
    try:
        yield from csv.reader(_lines(text))
    except csv.Error as exc:
        raise InputError.single(source, "", f"not a CSV file: {exc}") from None


class _Refused(Exception):
    """A plan that did not build, with its problems (``ROW`` where the row goes)."""

    def __init__(self, problems: list[Problem]):
        super().__init__()
        self.problems = problems


ROW = "\x00row\x00"  # where a row's name goes in a cached plan's problems


def parse_runs(text: str, source: str, base: Path) -> list[Run]:
    """:func:`read_runs` of ``text``; relative paths in ``model``/``cluster`` are taken from
    ``base``."""
    text = text.removeprefix("\ufeff")
    header = _header(text, source)
    if _most_rows(text) > MAX_ROWS:  # else no more rows than that
        count_rows(text, source)  # refused past MAX_ROWS before any plan is built
    names = [h.strip() for h in header]
    width = len(names)
    has_plan = "plan" in names
    # each row's cells by name, unescaped where text: the run's own columns at once, what
    # ran only for a row without a plan cell (a row with one is read from it)
    own = [(n, j, n in NUMBER_COLUMNS) for j, n in enumerate(names) if n not in WHAT_RAN]
    what_ran = [(n, j, n in NUMBER_COLUMNS) for j, n in enumerate(names) if n in WHAT_RAN]
    problems: list[Problem] = []
    runs: list[Run] = []
    plans: dict[tuple[str, ...], Plan | _Refused] = {}
    records = iter(_records(text, source))
    next(records)
    i = 0
    for cells in records:
        if not cells:
            continue
        i += 1
        if len(cells) > width:
            problems.append(Problem(source, f"row {i}", "more values than the header has columns"))
        else:
            if len(cells) < width:  # a short row: the rest empty
                cells = cells + [""] * (width - len(cells))
            row = _cells(cells, own)
            kind = row.get("kind", "")
            if kind == "serving":  # a serving run: autoplan.tune.serving_runs reads it
                continue
            if kind not in ("", "training"):
                problems.append(Problem(source, f"row {i}.kind", f"expected one of {', '.join(KINDS)}, "
                                                                 f"got {shown(one_line(kind))}"))
                continue
            if not row.get("plan"):
                row.update(_cells(cells, what_ran))
            if not any(row.values()) and not any(c.strip() for c in cells):
                continue
            run = _run_of(row, i, source, base, problems, plans, has_plan)
            if run is not None:
                runs.append(run)
        if len(problems) >= MAX_PROBLEMS:
            break
    if problems:
        raise InputError(problems[:MAX_PROBLEMS])
    return runs


def _cells(cells: list[str], columns: list[tuple[str, int, bool]]) -> dict[str, str]:
    """``cells`` of ``columns`` (name, index, holds a number) by name: stripped, and text
    unescaped (:func:`unescape_cell`)."""
    out = {}
    for name, j, number in columns:
        value = cells[j].strip()
        out[name] = value if number or value[:1] != "'" else unescape_cell(value)
    return out


def _float(row: dict[str, str], key: str, where: str, source: str, problems: list[Problem],
           check: Any) -> float | None:
    text = row.get(key, "")
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        problems.append(Problem(source, f"{where}.{key}", f"expected a number, got {shown(text)}"))
        return None
    if (why := check(value)) is not None:
        problems.append(Problem(source, f"{where}.{key}", why))
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


def _build(row: dict[str, str], source: str, base: Path, has_plan: bool) -> Plan:
    """The plan a row says ran (its ``plan`` cell, else its columns); a row it cannot be
    built from raises :class:`_Refused`, its problems named at ``ROW``."""
    from autoplan.plans.file import read_plan

    try:
        if has_plan and row.get("plan"):
            try:
                doc = json.loads(row["plan"], object_pairs_hook=json_object)
            except DuplicateKey as exc:
                raise InputError.single(source, f"{ROW}.plan", f"key {shown(exc.key)} twice in one "
                                        "object: a reader would keep one of the two silently") from None
            except (ValueError, RecursionError) as exc:
                raise InputError.single(source, f"{ROW}.plan",
                                        f"not JSON: {one_line(str(exc))[:200]}") from None
            return read_plan(doc, source, f"{ROW}.plan")
        missing = [c for c in PLAN_COLUMNS if not row.get(c)]
        if missing:
            raise InputError.single(source, ROW, "missing " + ", ".join(missing)
                                    + " (what ran; or a plan column)")
        return read_plan(_plan_mapping(row, base), source, ROW)
    except InputError as exc:
        # a problem in a file a row names (a model or cluster file) is named after the
        # row too: the runs log is what the user gave
        raise _Refused([p if p.source == source else Problem(source, ROW, str(p))
                        for p in exc.problems]) from None


def _run_of(row: dict[str, str], i: int, source: str, base: Path, problems: list[Problem],
            plans: dict[tuple[str, ...], Plan | _Refused], has_plan: bool) -> Run | None:
    where = f"row {i}"
    before = len(problems)
    status = row.get("status") or "ok"
    if status not in STATUSES:
        problems.append(Problem(source, f"{where}.status",
                                f"expected one of {', '.join(STATUSES)}, got {shown(status)}"))
    origin = row.get("source") or "user"
    if origin not in SOURCES:
        problems.append(Problem(source, f"{where}.source",
                                f"expected one of {', '.join(SOURCES)}, got {shown(origin)}"))
    step = _float(row, "measured_step_time_s", where, source, problems, step_time_problem)
    if status == "ok" and step is None and len(problems) == before:
        problems.append(Problem(source, f"{where}.measured_step_time_s",
                                "missing: a run with status ok needs its measured step time"))
    peak = _float(row, "measured_peak_gib", where, source, problems, peak_gib_problem)
    pstep = _float(row, "predicted_step_time_s", where, source, problems, step_time_problem)
    ppeak = _float(row, "predicted_peak_gib", where, source, problems, peak_gib_problem)
    steps = None
    if row.get("steps"):
        try:
            steps = int(row["steps"])
            if not 1 <= steps <= 10**9:
                raise ValueError
        except ValueError:
            problems.append(Problem(source, f"{where}.steps",
                                    f"expected a whole number from 1, got {shown(row['steps'])}"))
    key = (("plan", row["plan"]) if has_plan and row.get("plan")
           else tuple(row.get(c, "") for c in WHAT_RAN))
    plan = plans.get(key)
    if plan is None:
        if len(plans) >= MAX_PLANS:
            raise InputError.single(source, where, f"more than {MAX_PLANS:,} distinct plans: a runs log "
                                    "is many runs of a few plans (split it, a log for each model or cluster)")
        try:
            plan = _build(row, source, base, has_plan)
        except _Refused as exc:
            plan = exc
        plans[key] = plan
    if isinstance(plan, _Refused):
        problems.extend(Problem(p.source, p.field.replace(ROW, where), p.message.replace(ROW, where))
                        for p in plan.problems)
        return None
    if len(problems) > before:
        return None
    return Run(plan=plan, status=status, measured_step_time_s=step, measured_peak_gib=peak,
               predicted_step_time_s=pstep, predicted_peak_gib=ppeak, reason=row.get("reason", ""),
               source=origin, runner=row.get("runner", ""), time=row.get("time", ""),
               steps=steps, group=row.get("group", ""), row=i)


def latest(runs: Sequence[Run], of: Plan) -> list[Run]:
    """The measured runs of the plan ``of`` (same :func:`plan_id`), oldest first (by
    ``time`` where every one has it, else file order)."""
    pid = plan_id(of)
    mine = [r for r in runs if r.ok and plan_id(r.plan) == pid]
    if all(r.time for r in mine):
        mine.sort(key=lambda r: (r.time, r.row))
    return mine


def distinct_plans(plans: Iterable[Plan]) -> tuple[list[Plan], list[int]]:
    """The distinct plans of ``plans`` (those of a log's runs; first seen first) and, for
    each, the index of its plan among them: what costs a plan once for all its runs."""
    index: dict[Plan, int] = {}
    of = [index.setdefault(plan, len(index)) for plan in plans]
    return list(index), of
