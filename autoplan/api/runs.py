"""``runs import`` as a library call: launcher logs (Megatron-LM, torchtitan) or serving
benchmark clients' results read into runs the runs log records (:mod:`autoplan.tune.runs`,
:mod:`autoplan.tune.serving_runs`), every file refused, naming it and the field, before
anything is appended."""

from __future__ import annotations

import datetime
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoplan.api import outputs
from autoplan.errors import InputError, Problem
from autoplan.units import GiB

MAX_LOG_BYTES = 512 * 2**20  # a training log of many thousands of steps; more is not one run's


def check_group(group: str) -> None:
    """``--group``: a name the runs log can hold (empty: the plan's id)."""
    from autoplan.descriptors.strict import name_problem

    if group and (why := name_problem(group)):
        raise InputError.single("--group", "", why)


@dataclass(frozen=True, slots=True)
class Imported:
    """The runs read (training :class:`~autoplan.tune.runs.Run` or serving
    :class:`~autoplan.tune.serving_runs.ServingRun`), and one line a file saying what
    was read from it."""

    runs: tuple[Any, ...]
    said: tuple[str, ...]


def import_runs(logs: Sequence[Path], plan_path: Path | None = None, *, warmup: int = 2,
                group: str = "") -> Imported:
    """The runs of ``logs``: training logs of the plan ``plan_path`` ran (the median logged
    step after ``warmup``, the peak the launcher reports; a log that ran out of memory is
    recorded as such), or serving results (each matched to its plan: see
    :func:`import_serving`). Every problem is an :class:`InputError` naming the file."""
    check_group(group)
    serving = [is_serving_result(path) for path in logs]
    if any(serving):
        if not all(serving):
            raise InputError.single(str(logs[serving.index(False)]), "", (
                "a training log beside serving results: import each kind on its own"))
        imported = import_serving(list(logs), plan_path, group)
        return Imported(tuple(imported), tuple(said_serving(run, path)
                                               for run, path in zip(imported, logs, strict=True)))
    return _import_training(logs, plan_path, warmup, group)


def _import_training(logs: Sequence[Path], plan_path: Path | None, warmup: int, group: str) -> Imported:
    from autoplan.cost.evaluate import evaluate
    from autoplan.descriptors.strict import read_limited, read_yaml
    from autoplan.plans.file import read_plan
    from autoplan.tune.logs import read_log
    from autoplan.tune.runs import Run, peak_gib_problem, run_problems, step_time_problem

    if plan_path is None:
        raise InputError.single("--plan", "", "missing: the plan file the logged runs ran")
    plan = read_plan(read_yaml(plan_path), str(plan_path))
    pred = evaluate(plan)
    # the prediction is recorded where it is in the runs log's range (calibrate predicts again)
    pred_step = pred.step_time_s if step_time_problem(pred.step_time_s) is None else None
    pred_peak = pred.memory.peak / GiB if peak_gib_problem(pred.memory.peak / GiB) is None else None
    tokens = plan.job.global_batch * plan.job.seq_len
    found: list[Run] = []
    said: list[str] = []
    for path in logs:
        text = read_limited(path, MAX_LOG_BYTES, "a training log").decode("utf-8", "replace")
        reading = read_log(text, tokens_per_step=tokens, gpus=plan.layout.gpus)
        if reading.problems:  # a number that is no measurement: the log, not the runs log, is wrong
            raise InputError([Problem(str(path), f"line {n}", message) for n, message in reading.problems])
        timed = reading.timed(warmup)
        when = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc).isoformat(
            timespec="seconds")
        if reading.oom:
            run = Run(plan=plan, status="oom", reason=f"{path.name}: out of memory",
                      measured_peak_gib=reading.peak_gib, source="import", runner=reading.format,
                      time=when, group=group, predicted_step_time_s=pred_step, predicted_peak_gib=pred_peak)
        elif not timed:
            got = len(reading.step_times_s)
            raise InputError.single(str(path), "", (
                f"{got} step lines, none after --warmup {warmup}" if reading.format else
                "no Megatron-LM (iteration ... elapsed time per iteration) or torchtitan "
                "(step: ... tps:) step line"))
        else:
            run = Run(plan=plan, measured_step_time_s=statistics.median(timed),
                      measured_peak_gib=reading.peak_gib, source="import", runner=reading.format,
                      time=when, steps=len(timed), group=group, predicted_step_time_s=pred_step,
                      predicted_peak_gib=pred_peak)
        if problems := run_problems(run, str(path)):  # what the runs log would refuse to read back
            raise InputError(problems)
        found.append(run)
        shown = (f"{run.measured_step_time_s:.4g} s per step over {len(timed)} steps"
                 if run.ok else run.status)
        said.append(f"{outputs.name(path)}: {reading.format or 'log'}: {shown}")
    return Imported(tuple(found), tuple(said))


def is_serving_result(path: Path) -> bool:
    """Whether ``path`` looks like a benchmark client's JSON result (its first
    non-blank character opens a JSON object), not a training log."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] == b"{"


def import_serving(results: list[Path], plan_path: Path | None, group: str) -> list[Any]:
    """Serving runs of the clients' result files: each matched to the plan it ran, from the
    ``autoplan-trial.json`` beside it (``tune --serving`` writes one) or ``--plan`` (the
    serving plan the client drove, all its replicas behind a load balancer at the plan's
    traffic: recorded as one replica at its share, its throughput the plan's over its
    replicas). What cannot be matched is refused, naming the file and the field."""
    import dataclasses

    from autoplan.descriptors.strict import read_yaml
    from autoplan.serving.evaluate import evaluate_serving
    from autoplan.serving.planfile import is_serving, read_serving_plan
    from autoplan.tune.serving_clients import measured_of, mismatches, read_result_file
    from autoplan.tune.serving_runs import Predicted, ServingRun, load_of
    from autoplan.tune.serving_tune import SIDECAR, read_sidecar, replica_plan

    given = None
    if plan_path is not None:
        data = read_yaml(plan_path)
        if not is_serving(data):
            raise InputError.single(str(plan_path), "kind", "a training plan: a benchmark client's result "
                                                            "needs the serving plan it ran (kind: serving)")
        given = read_serving_plan(data, str(plan_path))
        if given.deployment.disaggregated is not None:
            raise InputError.single(str(plan_path), "deployment.disaggregated",
                                    "runs import records aggregated deployments (tune --serving's)")
    found = []
    for path in results:
        client, doc = read_result_file(path)
        sidecar = path.parent / SIDECAR
        if given is not None:
            replica, _ = replica_plan(given)
            replicas, label, predicted = given.deployment.replicas, given.deployment.label(), None
            drove = load_of(given)
        elif sidecar.is_file():
            side = read_sidecar(sidecar)
            if side.client != client.name:
                raise InputError.single(str(path), "", f"written by {client.name}, but {sidecar} says its "
                                                       f"trial ran {side.client}: give --plan, the serving "
                                                       "plan it ran")
            replica, replicas, label, predicted = side.plan, side.replicas, side.label, side.predicted
            drove = load_of(replica)
        else:
            raise InputError.single(str(path), "", f"no {SIDECAR} beside it (tune --serving writes one): "
                                                   "give --plan, the serving plan the client drove")
        measured = measured_of(client, doc, str(path), drove)
        wrong = mismatches(measured, drove)
        if wrong:
            against = f"--plan {plan_path}" if given is not None else str(sidecar)
            raise InputError([Problem(str(path), field, f"{why} ({against})") for field, why in wrong])
        if measured.completed < 1:
            raise InputError.single(str(path), "completed", "no request completed: no measurement")
        if given is not None and replicas > 1:  # the deployment's throughput: one replica's share
            measured = dataclasses.replace(
                measured, requests_per_s=measured.requests_per_s / replicas,
                output_tokens_per_s=measured.output_tokens_per_s / replicas,
                goodput_rps=None if measured.goodput_rps is None else measured.goodput_rps / replicas)
        if predicted is None:
            predicted = Predicted.of(evaluate_serving(replica))
        when = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc).isoformat(
            timespec="seconds")
        run = ServingRun(plan=replica, replicas=replicas, label=label, client=client.name, measured=measured,
                         predicted=predicted, source="import", runner=client.name, time=when, group=group)
        if problems := run.problems(str(path)):
            raise InputError(problems)
        found.append(run)
    return found


def said_serving(run: Any, path: Path) -> str:
    """What ``runs import`` says of one serving run it read."""
    m = run.measured
    one = "its replica" if run.replicas == 1 else f"one of its {run.replicas} replicas"
    return (f"{outputs.name(path)}: {run.client}: TTFT {m.ttft_ms.mean:.4g} ms, TPOT {m.tpot_ms.mean:.4g} ms "
            f"over {m.completed} requests ({run.label}: {one})")
