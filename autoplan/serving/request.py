"""A serving request: a serving job file (model, cluster, gpus, engine, workload, slo)
merged with the command line's options, which win over the file (with a note); the
serving counterpart of :mod:`autoplan.commands.request`.

Every option is checked at once, each problem naming its flag (or the job file's field);
the cluster comes through the one door of measured profiles
(``autoplan.measured.door.corrected``), as the training search's does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoplan.descriptors.hardware import Cluster, PooledCluster
from autoplan.descriptors.job import MAX_SEQ_LEN
from autoplan.descriptors.library import resolve_any_cluster, resolve_model, with_gpus
from autoplan.descriptors.model import Model
from autoplan.descriptors.strict import read_yaml, shown
from autoplan.errors import InputError, Problem
from autoplan.measured.door import corrected
from autoplan.serving.deployment import (
    KV_PRECISIONS,
    Arrival,
    ArrivalKind,
    Lengths,
    Precision,
    Prefix,
    Slo,
    SpecMethod,
    Speculative,
    Workload,
)
from autoplan.serving.engine import Engine
from autoplan.serving.planfile import (
    MAX_OUTPUT_TOKENS,
    MAX_RATE,
    MAX_REQUESTS,
    MAX_SLO_MS,
    MAX_SPEC_TOKENS,
    MIN_RATE,
    MIN_SLO_MS,
    ServingJob,
    image_problems,
    read_serving_job,
    read_trace,
    speculative_choice_problems,
    speculative_model_problems,
    trace_too_long,
)
from autoplan.serving.versions import VersionError
from autoplan.units import MAX_MONEY

ARRIVAL_FLAGS = "--rate/--concurrency/--offline/--trace"


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """What ``autoplan serve`` was given on the command line (None: not given)."""

    model: str | None = None
    cluster: str | None = None
    gpus: int | None = None
    input_len: int | None = None
    output_len: int | None = None
    rate: float | None = None
    concurrency: int | None = None
    offline: bool = False
    trace: Path | None = None
    requests: int | None = None
    ttft_slo: float | None = None
    tpot_slo: float | None = None
    percentile: float | None = None
    engine: str | None = None
    engine_version: str | None = None  # the engine's release (None: its default line)
    weights: str = "bf16"  # comma-separated precisions to try
    kv_cache: str = "bf16"
    price: float | None = None  # USD per GPU-hour
    prefix_share: float | None = None  # shared prompt prefix (prefix caching)
    prefix_groups: int | None = None
    speculative: str | None = None  # speculative decoding's method
    spec_tokens: int | None = None
    acceptance_length: float | None = None
    acceptance_rate: float | None = None
    draft_model: str | None = None


@dataclass(frozen=True, slots=True)
class ServeRequest:
    """What a serve search runs on."""

    model: Model
    cluster: Cluster  # through the one door of measured profiles
    engine: Engine
    workload: Workload
    slo: Slo
    weights: tuple[Precision, ...]
    kv_caches: tuple[Precision, ...]
    # what a user should know: an option overriding the job file
    notes: tuple[str, ...] = ()
    speculative: Speculative | None = None  # tried beside every deployment without it
    # the cluster as its file defines it (whole nodes), through the same door: what a sweep
    # over GPU counts resizes (resizing ``cluster``, part of a node, would shrink the node)
    base_cluster: Cluster | None = None
    engine_version: str | None = None  # the engine release the plans name (None: the default)
    # a heterogeneous cluster (``pools:``): the search puts prefill on one pool, decode on
    # another (each pool through the door of measured profiles); ``cluster`` is its first pool
    pools: PooledCluster | None = None


def check_serve_options(job_file: Path | None, given: ServeOptions) -> ServingJob:
    """The job file read and every option checked against it (all problems at once, as
    InputError), before any descriptor is resolved or trace read."""
    job = read_serving_job(read_yaml(job_file), str(job_file)) if job_file is not None else ServingJob()
    problems = _option_problems(job_file, job, given)
    _precisions(given.weights, "--weights", list(Precision), problems)
    _precisions(given.kv_cache, "--kv-cache", KV_PRECISIONS, problems)
    if problems:
        raise InputError(problems)
    return job


def build_serve_request(job_file: Path | None, job: ServingJob, given: ServeOptions) -> ServeRequest:
    """The request of :func:`check_serve_options`' job and the options: descriptors
    resolved, the workload built (a trace read), the SLO merged, the cluster corrected."""
    model = resolve_model(given.model) if given.model is not None else job.model
    found = resolve_any_cluster(given.cluster) if given.cluster is not None else job.cluster
    assert model is not None and found is not None
    engine = _engine(given.engine) if given.engine is not None else job.engine or Engine.VLLM
    version = _engine_version(engine, job, given)
    pools = None
    if isinstance(found, PooledCluster):
        if given.gpus is not None or job.gpus is not None:
            raise InputError.single("--gpus", "", f"{found.name}'s pools give the GPUs "
                                                  f"({found.gpus}): leave --gpus out")
        # each pool through the one door of measured profiles, by its own device
        pools = dataclasses.replace(found, pools=tuple(
            corrected(p, engine=engine, version=version).cluster for p in found.pools))
        base = found.pools[0]
    else:
        base = found
    count = given.gpus if given.gpus is not None else job.gpus if job.gpus is not None else base.gpus
    # the one door of measured profiles, with the engine release whose kernels it prices
    cluster = corrected(with_gpus(base, count), engine=engine, version=version).cluster
    workload = (_traced_workload(job_file, job, given, model) if _traced(job, given)
                else _workload(job_file, job, given, model))
    job_slo = job.slo or Slo()
    slo = Slo(given.ttft_slo if given.ttft_slo is not None else job_slo.ttft_ms,
              given.tpot_slo if given.tpot_slo is not None else job_slo.tpot_ms,
              given.percentile if given.percentile is not None else job_slo.percentile)
    problems: list[Problem] = []
    weights = _precisions(given.weights, "--weights", list(Precision), problems)
    kv_caches = _precisions(given.kv_cache, "--kv-cache", KV_PRECISIONS, problems)
    resolved = engine.spec.resolve(version)
    refused = engine.spec.model_refusals(resolved.release, model)
    if refused:
        flag = "--model" if given.model is not None or job_file is None else str(job_file)
        raise InputError([Problem(flag, "" if flag == "--model" else field, f"{engine.value}: {why}")
                          for field, why in refused])
    older = resolved.note
    return ServeRequest(model, cluster, engine, workload, slo, tuple(weights), tuple(kv_caches),
                        _override_notes(job_file, job, given) + ((older,) if older else ()),
                        _speculative(given, model, job, job_file),
                        corrected(base, engine=engine, version=version).cluster, version, pools)


def _engine_version(engine: Engine, job: ServingJob, given: ServeOptions) -> str | None:
    """The release the plans name: ``--engine-version``; else the job file's, where its
    engine is the one searched (``--engine`` naming another drops it); else None (the
    engine's default line). A usage error for text that is no version (exit 2)."""
    if given.engine_version is not None:
        try:
            engine.spec.resolve(given.engine_version)
        except VersionError as exc:
            raise InputError.single("--engine-version", "", str(exc)) from None
        return given.engine_version.strip()
    return job.engine_version if job.engine is engine else None


def _traced(job: ServingJob, given: ServeOptions) -> bool:
    """Whether the requests come from a recorded trace (``--trace``, or the job's, unless an
    option names another arrival)."""
    return given.trace is not None or (
        job.arrival is not None and job.arrival.trace is not None and given.rate is None
        and given.concurrency is None and not given.offline)


def _arrivals_given(given: ServeOptions) -> list[str]:
    return [f for f, v in (("--rate", given.rate), ("--concurrency", given.concurrency),
                           ("--offline", given.offline or None), ("--trace", given.trace))
            if v is not None]


def _option_problems(job_file: Path | None, job: ServingJob, given: ServeOptions) -> list[Problem]:
    problems: list[Problem] = []
    traced = _traced(job, given)
    lengths = () if traced else ((given.input_len, job.input_len, "--input-len"),
                                 (given.output_len, job.output_len, "--output-len"))
    for given_value, job_value, flag in ((given.model, job.model, "--model"),
                                         (given.cluster, job.cluster, "--cluster"), *lengths):
        if (given_value if given_value is not None else job_value) is None:
            where = f" (or in {job_file})" if job_file is not None else ""
            problems.append(Problem(flag, "", f"missing required option{where}"))
    if traced:
        for length, flag in ((given.input_len, "--input-len"), (given.output_len, "--output-len")):
            if length is not None:
                problems.append(Problem(flag, "", "the arrival trace gives each request's lengths: "
                                                  "leave this out"))
    counts: tuple[tuple[int | None, str, int], ...] = (
        (given.input_len, "--input-len", MAX_SEQ_LEN), (given.output_len, "--output-len", MAX_OUTPUT_TOKENS),
        (given.requests, "--requests", MAX_REQUESTS), (given.concurrency, "--concurrency", MAX_REQUESTS))
    for count, flag, hi in counts:
        if count is not None and not 1 <= count <= hi:
            problems.append(Problem(flag, "", f"expected 1 to {hi:,}, got {count:,}"))
    if given.rate is not None and not (MIN_RATE <= given.rate <= MAX_RATE):
        problems.append(Problem("--rate", "", f"expected requests/s from {MIN_RATE:g} to {MAX_RATE:g}, "
                                              f"got {given.rate:g}"))
    for slo_ms, flag in ((given.ttft_slo, "--ttft-slo"), (given.tpot_slo, "--tpot-slo")):
        if slo_ms is not None and not (MIN_SLO_MS <= slo_ms <= MAX_SLO_MS):
            problems.append(Problem(flag, "", f"expected milliseconds from {MIN_SLO_MS:g} to "
                                              f"{MAX_SLO_MS:g}, got {slo_ms:g}"))
    if given.percentile is not None and not 0 < given.percentile <= 100:
        problems.append(Problem("--percentile", "", f"expected more than 0 and at most 100, "
                                                     f"got {given.percentile:g}"))
    if given.prefix_share is not None and not 0 <= given.prefix_share <= 1:
        problems.append(Problem("--prefix-share", "", f"expected a share of the prompt from 0 to 1, "
                                                      f"got {given.prefix_share:g}"))
    if given.prefix_groups is not None and not 1 <= given.prefix_groups <= MAX_REQUESTS:
        problems.append(Problem("--prefix-groups", "", f"expected 1 to {MAX_REQUESTS:,}, "
                                                       f"got {given.prefix_groups:,}"))
    elif given.prefix_groups is not None and given.prefix_share is None and job.prefix is None:
        problems.append(Problem("--prefix-groups", "", "groups of what prefix? give --prefix-share "
                                                       "(or workload.prefix in the job file)"))
    problems += _speculative_problems(given)
    if given.engine_version is not None:
        named = given.engine if given.engine is not None else job.engine or Engine.VLLM
        if named in Engine:
            try:
                Engine(named).spec.resolve(given.engine_version)
            except VersionError as exc:
                problems.append(Problem("--engine-version", "", str(exc)))
    if given.price is not None and not (0 < given.price <= MAX_MONEY):
        problems.append(Problem("--price", "", f"expected USD per GPU-hour > 0 and at most "
                                               f"{MAX_MONEY:g}, got {given.price:g}"))
    arrivals = _arrivals_given(given)
    if len(arrivals) > 1 or (not arrivals and job.arrival is None):
        problems.append(Problem("--rate", "", "give exactly one of --rate, --concurrency, --offline, --trace"
                                + (f" (got {', '.join(arrivals)})" if arrivals else "")))
    return problems


def _precisions(text: str, flag: str, allowed: Sequence[Precision],
                problems: list[Problem]) -> list[Precision]:
    """The comma-separated precisions of ``text`` in ``allowed``, each once; a problem for
    each other word."""
    out: list[Precision] = []
    for item in text.split(","):
        name = item.strip().lower()
        match = next((p for p in allowed if p.value == name), None)
        if match is None:
            problems.append(Problem(flag, "", f"expected {', '.join(p.value for p in allowed)}, "
                                              f"got {item.strip()[:40]!r}"))
        elif match not in out:
            out.append(match)
    return out


def _traced_workload(job_file: Path | None, job: ServingJob, given: ServeOptions,
                     model: Model) -> Workload:
    recorded = (read_trace(str(given.trace), "--trace", "") if given.trace is not None
                else job.arrival.trace if job.arrival is not None else None)
    assert recorded is not None
    n_requests = given.requests if given.requests is not None else job.requests or len(recorded)
    if n_requests > len(recorded):
        raise InputError.single("--requests", "", f"expected at most the trace's {len(recorded):,} "
                                                  f"requests, got {n_requests:,}")
    workload = Workload.of_trace(recorded, n_requests, _prefix(job, given), job.images)
    _check_images(job_file, workload, model)
    too_long = trace_too_long(workload, model)
    if too_long:
        raise InputError.single(str(given.trace) if given.trace is not None else str(job_file), "",
                                too_long)
    return workload


def _workload(job_file: Path | None, job: ServingJob, given: ServeOptions, model: Model) -> Workload:
    arrival = (Arrival(ArrivalKind.RATE, rate_rps=given.rate) if given.rate is not None
               else Arrival(ArrivalKind.CONCURRENCY, concurrency=given.concurrency)
               if given.concurrency is not None
               else Arrival(ArrivalKind.OFFLINE) if given.offline else job.arrival)
    assert arrival is not None
    inp = Lengths(float(given.input_len)) if given.input_len is not None else job.input_len
    outp = Lengths(float(given.output_len)) if given.output_len is not None else job.output_len
    assert inp is not None and outp is not None
    # engines refuse requests past the model's context (images' tokens are prompt tokens)
    if inp.mean + job.images[0] * job.images[1] + outp.mean > model.max_seq_len:
        from_flag = given.output_len is not None or job_file is None
        source, field = ("--output-len", "") if from_flag else (str(job_file), "workload")
        raise InputError.single(source, field, (
            f"input + output length {inp.mean + outp.mean:,.0f} tokens exceeds {model.name}'s max_seq_len "
            f"{model.max_seq_len:,}: engines refuse such requests (a model file with a longer max_seq_len "
            "serves longer ones)"))
    n_requests = (given.requests if given.requests is not None
                  else job.requests if job.requests is not None else 1000)
    workload = Workload(inp, outp, arrival, n_requests, _prefix(job, given), *job.images)
    _check_images(job_file, workload, model)
    return workload


def _check_images(job_file: Path | None, workload: Workload, model: Model) -> None:
    """A workload with images needs a model with a vision encoder (``--model`` may name
    another than the job file's)."""
    for why in image_problems(model, workload.images_per_request):
        raise InputError.single(str(job_file), "workload.images_per_request", why)


SPEC_FLAGS = ("--spec-tokens", "--acceptance-length", "--acceptance-rate", "--draft-model")


def _speculative_problems(given: ServeOptions) -> list[Problem]:
    """What is wrong with the speculative decoding options (none given: nothing)."""
    out: list[Problem] = []
    rest = dict(zip(SPEC_FLAGS, (given.spec_tokens, given.acceptance_length, given.acceptance_rate,
                                 given.draft_model), strict=True))
    if given.speculative is None:
        out += [Problem(flag, "", "give --speculative METHOD with it") for flag, v in rest.items()
                if v is not None]
        return out
    methods = [m.value for m in SpecMethod]
    if given.speculative not in methods:
        out.append(Problem("--speculative", "", f"expected one of {', '.join(methods)}, "
                                                f"got {given.speculative[:40]!r}"))
    k = given.spec_tokens
    if k is None or not 1 <= k <= MAX_SPEC_TOKENS:
        out.append(Problem("--spec-tokens", "", f"expected proposals per step from 1 to {MAX_SPEC_TOKENS}"
                                                + ("" if k is None else f", got {k}")))
    length, rate = given.acceptance_length, given.acceptance_rate
    if length is not None and not 1 <= length <= MAX_SPEC_TOKENS + 1:
        out.append(Problem("--acceptance-length", "", f"expected 1 to {MAX_SPEC_TOKENS + 1}, got {length:g}"))
    if rate is not None and not 0 <= rate <= 1:
        out.append(Problem("--acceptance-rate", "", f"expected 0 to 1, got {rate:g}"))
    if not out:  # the choices together, as a plan file's are judged
        out += [Problem(SPEC_FIELD_FLAGS[field], "", why) for field, why in speculative_choice_problems(
            SpecMethod(given.speculative), k, length, rate, given.draft_model is not None)]  # type: ignore[arg-type]
    return out


# the flag that gives each field of a plan's ``speculative`` ("": the acceptance figures)
SPEC_FIELD_FLAGS = {"": "--acceptance-length", "acceptance_length": "--acceptance-length",
                    "draft_model": "--draft-model", "method": "--speculative"}


def _speculative(given: ServeOptions, model: Model, job: ServingJob | None = None,
                 job_file: Path | None = None) -> Speculative | None:
    """The options' speculative decoding (checked by :func:`_speculative_problems`), else
    the job file's ``speculative`` (checked against the model served: ``--model`` may
    name another than the file's)."""
    if given.speculative is None:
        spec = job.speculative if job is not None else None
        if spec is None:
            return None
        problems = speculative_model_problems(spec, model)
        if problems:
            raise InputError([Problem(str(job_file), f"speculative.{field}" if field else "speculative",
                                      why) for field, why in problems])
        return spec
    assert given.spec_tokens is not None
    draft = resolve_model(given.draft_model, "--draft-model", "") if given.draft_model is not None else None
    spec = Speculative(SpecMethod(given.speculative), given.spec_tokens, given.acceptance_rate,
                       given.acceptance_length, draft)
    problems = speculative_model_problems(spec, model)
    if problems:
        raise InputError([Problem(SPEC_FIELD_FLAGS[field], "", why) for field, why in problems])
    return spec


def _prefix(job: ServingJob, given: ServeOptions) -> Prefix | None:
    """The shared prompt prefix: the options' over the job file's."""
    base = job.prefix
    if given.prefix_share is None and given.prefix_groups is None:
        return base
    share = given.prefix_share if given.prefix_share is not None else base.share if base else 0.0
    groups = given.prefix_groups if given.prefix_groups is not None else base.groups if base else 1
    return Prefix(share, groups)


def _engine(name: str) -> Engine:
    """A registered engine by name, or a usage error listing them (exit 2)."""
    try:
        return Engine(name)
    except ValueError:
        valid = ", ".join(e.value for e in Engine)
        raise InputError.single("--engine", "", f"expected one of {valid}, got {shown(name)}") from None


def _override_notes(job_file: Path | None, job: ServingJob, given: ServeOptions) -> tuple[str, ...]:
    """An option that replaces what the job file says, one note each."""
    if job_file is None:
        return ()
    arrivals: Any = _arrivals_given(given) or None
    pairs = (("--model", given.model, job.model), ("--cluster", given.cluster, job.cluster),
             ("--gpus", given.gpus, job.gpus), ("--input-len", given.input_len, job.input_len),
             ("--output-len", given.output_len, job.output_len),
             ("--requests", given.requests, job.requests), ("--engine", given.engine, job.engine),
             ("--engine-version", given.engine_version, job.engine_version),
             ("--prefix-share", given.prefix_share, job.prefix),
             ("--speculative", given.speculative, job.speculative),
             (ARRIVAL_FLAGS, arrivals, job.arrival))
    return tuple(f"{flag} overrides {job_file}" for flag, value, in_job in pairs
                 if value is not None and in_job is not None)
