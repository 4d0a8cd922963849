"""Serving runs in the runs log: the rows ``tune --serving`` and ``runs import`` of a
benchmark client's result append (``kind`` serving), and how they are read back for
``calibrate``. The columns are documented with the others in :mod:`autoplan.tune.runs`
(``SERVING_COLUMNS``); a row's ``plan`` cell is the serving plan file of what ran (one
replica of the deployment, at its share of the job's traffic: :mod:`autoplan.tune.serving_tune`)
as one line of JSON, and it is what the row is read from.

Pure library: reading refuses a bad row with every problem named by file, row and column."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoplan.errors import InputError, Problem
from autoplan.serving.deployment import ArrivalKind, ServingPlan
from autoplan.text import one_line
from autoplan.tune.serving_clients import CLIENTS, Load, Measured, Stats

MAX_MS = 1e9  # a latency of 11.6 days is no measurement
MAX_RATE = 1e9  # requests or tokens per second


@dataclass(frozen=True, slots=True, kw_only=True)
class Predicted:
    """What autoplan predicted for a run (the simulated replica: serving.evaluate)."""

    ttft_ms: Stats
    tpot_ms: Stats
    requests_per_s: float
    output_tokens_per_s: float
    goodput_rps: float

    @classmethod
    def of(cls, pred: Any) -> Predicted:
        """From a ``ServingPrediction``."""
        return cls(ttft_ms=Stats(pred.ttft_ms.mean, pred.ttft_ms.p50, pred.ttft_ms.p99),
                   tpot_ms=Stats(pred.tpot_ms.mean, pred.tpot_ms.p50, pred.tpot_ms.p99),
                   requests_per_s=pred.requests_per_s, output_tokens_per_s=pred.output_tokens_per_s,
                   goodput_rps=pred.goodput_rps)

    def to_dict(self) -> dict[str, Any]:
        return {"ttft_ms": self.ttft_ms.to_dict(), "tpot_ms": self.tpot_ms.to_dict(),
                "requests_per_s": self.requests_per_s, "output_tokens_per_s": self.output_tokens_per_s,
                "goodput_rps": self.goodput_rps}


def load_of(plan: ServingPlan, seed: int = 0) -> Load:
    """The traffic a client drives ``plan`` (one replica's plan) with: its arrival, fixed
    lengths at the workload's means, its requests, its SLO."""
    w = plan.workload
    a = w.arrival
    return Load(rate_rps=a.rate_rps if a.kind is ArrivalKind.RATE else None,
                concurrency=a.concurrency if a.kind is ArrivalKind.CONCURRENCY else None,
                input_len=round(w.input_len.mean), output_len=round(w.output_len.mean), requests=w.requests,
                ttft_slo_ms=plan.slo.ttft_ms, tpot_slo_ms=plan.slo.tpot_ms, seed=seed)


def plan_text(plan: ServingPlan) -> str:
    """The serving plan file of ``plan`` (no prediction) as one line of JSON, keys sorted:
    the runs log's ``plan`` cell, and what its ``plan_id`` is the digest of."""
    from autoplan.serving.evaluate import serving_document

    return json.dumps(serving_document(plan, None), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingRun:
    """One run of one serving deployment's replica, measured or not."""

    plan: ServingPlan  # what ran: one replica, at its share of the traffic
    replicas: int = 1  # of the deployment it stands for
    label: str = ""  # the deployment it stands for (Deployment.label), "" for the plan's own
    client: str = ""  # vllm-bench | sglang-bench | aiperf
    status: str = "ok"
    reason: str = ""
    measured: Measured | None = None
    predicted: Predicted | None = None
    source: str = "tune"
    runner: str = ""
    time: str = ""
    group: str = ""
    line: int = 0  # 1-based data row of the file it was read from (0: not read)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.measured is not None

    @property
    def plan_json(self) -> str:
        return plan_text(self.plan)

    @property
    def plan_id(self) -> str:
        import hashlib

        return hashlib.sha256(self.plan_json.encode()).hexdigest()[:12]

    @property
    def group_key(self) -> str:
        return self.group or self.plan_id

    @property
    def load(self) -> Load:
        return load_of(self.plan)

    def problems(self, source: str = "runs log", where: str = "") -> list[Problem]:
        """What keeps this run from being a row the reader takes back."""
        from autoplan.tune.runs import SOURCES, STATUSES

        def at(key: str) -> str:
            return f"{where}.{key}" if where else key

        out: list[Problem] = []
        if self.status not in STATUSES:
            out.append(Problem(source, at("status"),
                               f"expected one of {', '.join(STATUSES)}, got {self.status!r}"))
        if self.source not in SOURCES:
            out.append(Problem(source, at("source"),
                               f"expected one of {', '.join(SOURCES)}, got {self.source!r}"))
        if self.status == "ok" and self.measured is None:
            out.append(Problem(source, at("measured_ttft_mean_ms"), "missing: a run with status ok needs "
                                                                      "what it measured"))
        for key, value in _numbers(self).items():
            if value is not None and (why := number_problem(key, value)):
                out.append(Problem(source, at(key), why))
        return out

    def row(self) -> dict[str, str]:
        """The runs log row (every column it fills; the others empty)."""
        p, d = self.plan, self.plan.deployment
        doc = json.loads(self.plan_json)
        a = p.workload.arrival
        arrival = (f"rate {a.rate_rps:g}" if a.kind is ArrivalKind.RATE
                   else f"concurrency {a.concurrency}" if a.kind is ArrivalKind.CONCURRENCY else a.kind.value)
        out = {
            "kind": "serving", "time": self.time, "source": self.source, "runner": self.runner,
            "plan_id": self.plan_id, "group": self.group,
            "model": doc["model"] if isinstance(doc["model"], str) else p.model.name,
            "cluster": p.cluster.name, "gpus": str(d.gpus), "tp": str(d.tp), "pp": str(d.pp), "ep": str(d.ep),
            "status": self.status, "reason": one_line(self.reason),
            "engine": p.engine.value, "release": p.engine_release, "client": self.client,
            "gpu": p.cluster.device.name, "deployment": self.label or d.label(),
            "replicas": str(self.replicas), "attention_dp": str(d.attention_dp),
            "weights": d.weights.value, "kv_cache": d.kv_cache.value,
            "input_len": f"{p.workload.input_len.mean:g}", "output_len": f"{p.workload.output_len.mean:g}",
            "arrival": arrival, "requests": str(p.workload.requests),
            "plan": self.plan_json,
        }
        out.update({k: _num(v) for k, v in _numbers(self).items()})
        return out


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.6g}"


def _numbers(run: ServingRun) -> dict[str, float | None]:
    """The run's numeric cells by column."""
    m, q, slo = run.measured, run.predicted, run.plan.slo
    out: dict[str, float | None] = {"ttft_slo_ms": slo.ttft_ms, "tpot_slo_ms": slo.tpot_ms,
                                    "completed": None if m is None else float(m.completed)}
    for metric in ("ttft", "tpot", "itl"):
        stats = None if m is None else getattr(m, f"{metric}_ms")
        for stat in ("mean", "p50", "p99"):
            out[f"measured_{metric}_{stat}_ms"] = None if stats is None else getattr(stats, stat)
    for key in ("requests_per_s", "output_tokens_per_s", "goodput_rps"):
        out[f"measured_{key}"] = None if m is None else getattr(m, key)
    for metric in ("ttft", "tpot"):
        stats = None if q is None else getattr(q, f"{metric}_ms")
        for stat in ("mean", "p99"):
            out[f"predicted_{metric}_{stat}_ms"] = None if stats is None else getattr(stats, stat)
    for key in ("requests_per_s", "output_tokens_per_s", "goodput_rps"):
        out[f"predicted_{key}"] = None if q is None else getattr(q, key)
    return out


def number_problem(key: str, value: float) -> str | None:
    """Why ``value`` is no number of column ``key`` (None: it is)."""
    if not math.isfinite(value) or value < 0:
        return f"expected a finite number >= 0, got {value:.3g}"
    if key.endswith("_ms"):
        positive = key.startswith(("measured_ttft_mean", "measured_tpot_mean", "ttft_slo", "tpot_slo"))
        if value > MAX_MS or (positive and value <= 0):
            return f"expected milliseconds above 0 and at most {MAX_MS:g}, got {value:.3g}"
    elif value > MAX_RATE:
        return f"expected at most {MAX_RATE:g}, got {value:.3g}"
    return None


# --------------------------------------------------------------------------- reading

def read_serving_runs(path: Path, flag: str | None = None) -> list[ServingRun]:
    """Every serving row of the runs log at ``path``, every problem at once."""
    from autoplan.descriptors.strict import read_limited
    from autoplan.tune.runs import MAX_RUNS_BYTES

    data = read_limited(path, MAX_RUNS_BYTES, "a runs log", source=flag)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError.single(str(path), "", f"not UTF-8 text (byte {exc.start})") from None
    return parse_serving_runs(text, str(path))


def parse_serving_runs(text: str, source: str) -> list[ServingRun]:
    """The serving rows (``kind`` serving) of a runs log's ``text``; training rows are
    :func:`autoplan.tune.runs.parse_runs`' and left alone here."""
    from autoplan.tune.runs import (
        MAX_PLANS,
        MAX_PROBLEMS,
        NUMBER_COLUMNS,
        _cells,
        _header,
        _records,
        count_rows,
    )

    text = text.removeprefix("\ufeff")
    header = _header(text, source)
    count_rows(text, source)
    names = [h.strip() for h in header]
    if "kind" not in names:
        return []
    columns = [(n, j, n in NUMBER_COLUMNS) for j, n in enumerate(names)]
    problems: list[Problem] = []
    runs: list[ServingRun] = []
    plans: dict[str, ServingPlan | list[Problem]] = {}
    records = iter(_records(text, source))
    next(records)
    i = 0
    for cells in records:
        if not cells:
            continue
        i += 1
        if len(cells) > len(names):
            continue  # the training reader names it
        cells = cells + [""] * (len(names) - len(cells))
        row = _cells(cells, columns)
        if row.get("kind") != "serving":
            continue
        where = f"row {i}"
        key = row.get("plan", "")
        plan = plans.get(key)
        if plan is None:
            if len(plans) >= MAX_PLANS:
                raise InputError.single(source, where, f"more than {MAX_PLANS:,} distinct serving plans")
            plan = plans[key] = _plan_of(row, source)
        if isinstance(plan, list):
            problems += [Problem(p.source, f"{where}.{p.field}" if p.field else where, p.message)
                         for p in plan]
        else:
            run = _run_of(row, plan, i, source, problems)
            if run is not None:
                runs.append(run)
        if len(problems) >= MAX_PROBLEMS:
            break
    if problems:
        raise InputError(problems[:MAX_PROBLEMS])
    return runs


def _plan_of(row: dict[str, str], source: str) -> ServingPlan | list[Problem]:
    """The serving plan of a row's ``plan`` cell, or its problems (field ``plan``)."""
    from autoplan.descriptors.strict import DuplicateKey, json_object, shown
    from autoplan.serving.planfile import read_serving_plan

    text = row.get("plan", "")
    if not text:
        return [Problem(source, "plan", "missing: a serving row is read from its plan (tune --serving "
                                        "and runs import write it)")]
    try:
        doc = json.loads(text, object_pairs_hook=json_object)
    except DuplicateKey as exc:
        return [Problem(source, "plan", f"key {shown(exc.key)} twice in one object")]
    except (ValueError, RecursionError) as exc:
        return [Problem(source, "plan", f"not JSON: {one_line(str(exc))[:200]}")]
    try:
        return read_serving_plan(doc, "\x00")
    except InputError as exc:
        return [Problem(source, "plan" + (f".{p.field}" if p.field else ""), p.message) for p in exc.problems]


def _float(row: dict[str, str], key: str, where: str, source: str, problems: list[Problem]) -> float | None:
    text = row.get(key, "")
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        problems.append(Problem(source, f"{where}.{key}", f"expected a number, got {text[:40]!r}"))
        return None
    if (why := number_problem(key, value)) is not None:
        problems.append(Problem(source, f"{where}.{key}", why))
        return None
    return value


def _stats(row: dict[str, str], prefix: str, metric: str, where: str, source: str,
           problems: list[Problem], required: bool) -> Stats | None:
    mean = _float(row, f"{prefix}_{metric}_mean_ms", where, source, problems)
    if mean is None:
        if required and not row.get(f"{prefix}_{metric}_mean_ms"):
            problems.append(Problem(source, f"{where}.{prefix}_{metric}_mean_ms",
                                    "missing: a run with status ok needs its measured TTFT and TPOT"))
        return None
    return Stats(mean, _float(row, f"{prefix}_{metric}_p50_ms", where, source, problems),
                 _float(row, f"{prefix}_{metric}_p99_ms", where, source, problems))


def _run_of(row: dict[str, str], plan: ServingPlan, i: int, source: str,
            problems: list[Problem]) -> ServingRun | None:
    from autoplan.tune.runs import SOURCES, STATUSES

    where = f"row {i}"
    before = len(problems)
    status = row.get("status") or "ok"
    if status not in STATUSES:
        problems.append(Problem(source, f"{where}.status", f"expected one of {', '.join(STATUSES)}, "
                                                           f"got {status[:40]!r}"))
    origin = row.get("source") or "user"
    if origin not in SOURCES:
        problems.append(Problem(source, f"{where}.source", f"expected one of {', '.join(SOURCES)}, "
                                                           f"got {origin[:40]!r}"))
    client = row.get("client", "")
    if client and client not in CLIENTS:
        problems.append(Problem(source, f"{where}.client", f"expected one of {', '.join(CLIENTS)}, "
                                                           f"got {client[:40]!r}"))
    replicas = 1
    if row.get("replicas"):
        try:
            replicas = int(row["replicas"])
            if not 1 <= replicas <= 1 << 20:
                raise ValueError
        except ValueError:
            problems.append(Problem(source, f"{where}.replicas", f"expected a whole number from 1, "
                                                                 f"got {row['replicas'][:40]!r}"))
    ok = status == "ok"
    measured = None
    ttft = _stats(row, "measured", "ttft", where, source, problems, ok)
    tpot = _stats(row, "measured", "tpot", where, source, problems, ok)
    itl = _stats(row, "measured", "itl", where, source, problems, False)
    numbers = {k: _float(row, f"measured_{k}", where, source, problems)
               for k in ("requests_per_s", "output_tokens_per_s", "goodput_rps")}
    completed = _float(row, "completed", where, source, problems)
    if ttft is not None and tpot is not None:
        measured = Measured(client=client, completed=int(completed or 0), failed=None, ttft_ms=ttft,
                            tpot_ms=tpot, itl_ms=itl, requests_per_s=numbers["requests_per_s"] or 0.0,
                            output_tokens_per_s=numbers["output_tokens_per_s"] or 0.0,
                            goodput_rps=numbers["goodput_rps"])
    predicted = None
    pt = _stats(row, "predicted", "ttft", where, source, problems, False)
    pp = _stats(row, "predicted", "tpot", where, source, problems, False)
    pn = {k: _float(row, f"predicted_{k}", where, source, problems)
          for k in ("requests_per_s", "output_tokens_per_s", "goodput_rps")}
    if pt is not None and pp is not None:
        predicted = Predicted(ttft_ms=pt, tpot_ms=pp, requests_per_s=pn["requests_per_s"] or 0.0,
                              output_tokens_per_s=pn["output_tokens_per_s"] or 0.0,
                              goodput_rps=pn["goodput_rps"] or 0.0)
    if len(problems) > before:
        return None
    return ServingRun(plan=plan, replicas=replicas, label=row.get("deployment", ""), client=client,
                      status=status, reason=row.get("reason", ""), measured=measured, predicted=predicted,
                      source=origin, runner=row.get("runner", ""), time=row.get("time", ""),
                      group=row.get("group", ""), line=i)


def with_status(run: ServingRun, status: str, reason: str) -> ServingRun:
    return dataclasses.replace(run, status=status, reason=reason)


def measured_runs(runs: Sequence[ServingRun]) -> list[ServingRun]:
    return [r for r in runs if r.ok]
