"""A search request: a job file (model, cluster, job, optional gpus, space, stack and profile)
merged with command-line overrides. Options win over the file.

A measured profile (``--profile`` or ``profile:``; else the one shipped under
``profiles/measured/`` for the cluster's device, if any) corrects the cost model through
the one door every command takes (``autoplan.measured.door``): the request's cluster then
carries the fitted correction (autoplan.measured.surrogate)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoplan.descriptors.hardware import Cluster, PooledCluster
from autoplan.descriptors.job import Job, read_job
from autoplan.descriptors.library import (
    beside,
    looks_like_path,
    resolve_any_cluster,
    resolve_model_noted,
    resolve_stack,
    with_gpus,
)
from autoplan.descriptors.model import Model
from autoplan.descriptors.space import SearchSpace, space_path
from autoplan.descriptors.strict import Fields, read_yaml, shown
from autoplan.errors import InputError, Problem
from autoplan.measured.door import corrected
from autoplan.measured.profile import Profile, read_profile
from autoplan.measured.shipped import shipped_profile
from autoplan.parallel.rules import recompute_modules_problem
from autoplan.search.launchable import launcher_space, resolve_space
from autoplan.units import MAX_MONEY
from autoplan.vocab import Dtype, RecomputeModule
from autoplan.whatif.counts import check_gpu_counts
from autoplan.whatif.economics import Objective

MAX_TRAIN_TOKENS = 1e18  # ~50,000x Llama 3's 15T tokens
MAX_DEADLINE_DAYS = 1e6


@dataclass(frozen=True, slots=True)
class TrainGoal:
    """A job file's ``train:`` section, the file's side of ``search --train-tokens``: the
    tokens to train on and how to choose among GPU counts (None: the flag's default)."""

    tokens: float
    objective: Objective | None = None
    price_per_gpu_hour: float | None = None
    deadline_days: float | None = None
    budget_usd: float | None = None


def _read_train(f: Fields) -> TrainGoal | None:
    data = f.raw("train", None)
    if data is None:
        return None
    t = f.child("train", data)
    goal = TrainGoal(
        tokens=t.float("tokens", positive=True, max=MAX_TRAIN_TOKENS),
        objective=t.enum("objective", Objective, None),
        price_per_gpu_hour=t.float("price_per_gpu_hour", None, positive=True, max=MAX_MONEY),
        deadline_days=t.float("deadline_days", None, positive=True, max=MAX_DEADLINE_DAYS),
        budget_usd=t.float("budget_usd", None, positive=True, max=MAX_MONEY))
    t.close()
    return goal if t.ok and goal.tokens is not None else None


@dataclass(frozen=True, slots=True)
class Request:
    model: Model
    cluster: Cluster
    job: Job
    space: SearchSpace
    profile: Profile | None = None  # the measured profile the cluster is corrected by
    # one cluster per GPU count of a sweep (--gpus 64,128 or 64..1024, or a list under
    # gpus: in the job file), ascending; () for one count, which ``cluster`` holds
    sizes: tuple[Cluster, ...] = ()
    # what a user should know before trusting the answer: an imported config's shape and
    # what of it is not modelled, a flag overriding the job file, a value past the model
    notes: tuple[str, ...] = ()
    # a heterogeneous cluster (``cluster:`` with pools; search/pooled.py); ``cluster`` is
    # then its first pool
    pools: PooledCluster | None = None
    train: TrainGoal | None = None  # the job file's train: section (time to train)

    def __post_init__(self) -> None:
        # the space never names a recompute module the model lacks (the plans it would
        # give are refused by the plan reader): ``build_request`` checks the space file's
        # and ``recompute_modules``'s with their sources; a space replaced afterwards is
        # one ``search --recompute-modules`` set (autoplan.cli.commands.search)
        problem = recompute_modules_problem(self.model, self.space.recompute_modules)
        if problem:
            raise InputError.single("--recompute-modules", "", problem)

    @property
    def clusters(self) -> tuple[Cluster, ...]:
        return self.sizes or (self.cluster,)


def build_request(
    job_file: Path | None,
    *,
    model: str | None = None,
    cluster: str | None = None,
    gpus: int | Sequence[int] | None = None,
    global_batch: int | None = None,
    seq_len: int | None = None,
    dtype: Dtype | None = None,
    space: str | None = None,
    moe_imbalance: float | None = None,
    profile: Path | None = None,
    stack: str | None = None,
    train_flags: Sequence[tuple[str, Any]] = (),
    recompute_modules: Sequence[RecomputeModule] | None = None,
    launcher: str | None = None,
) -> Request:
    """``train_flags``: (flag, value) of the flags a job file's ``train:`` section holds
    too (``--train-tokens``, ``--objective``, ...; None where not given), each said to
    override the file's field where they differ, as the other flags are.
    ``recompute_modules`` (``--recompute-modules``) replaces the space's. A recompute
    module the model does not have (``parallel.rules.recompute_modules_problem``) is
    refused naming where it came from, as the plan reader refuses it in a plan file."""
    problems: list[Problem] = []
    doc: dict[str, Any] = {}
    train: TrainGoal | None = None
    source = str(job_file) if job_file else "command line"
    if job_file is not None:
        data = read_yaml(job_file)
        f = Fields(data, source, "", problems)
        doc = {k: f.raw(k, None) for k in ("model", "cluster", "job", "space", "profile",
                                                "stack")}
        doc["gpus"] = (f.int_list("gpus", None, min=1) if isinstance(f.raw("gpus", None), list)
                       else f.int("gpus", None, min=1))
        train = _read_train(f)
        f.close()
        _raise(problems)
    # options override the file, and say so where they change it
    notes: list[str] = []
    job_in_file: dict[str, Any] = doc["job"] if isinstance(doc.get("job"), dict) else {}
    for flag, value, was in (("--model", model, doc.get("model")), ("--cluster", cluster, doc.get("cluster")),
                             ("--space", space, doc.get("space")), ("--stack", stack, doc.get("stack")),
                             ("--global-batch", global_batch, job_in_file.get("global_batch")),
                             ("--seq-len", seq_len, job_in_file.get("seq_len")),
                             ("--dtype", dtype.value if dtype else None, job_in_file.get("dtype")),
                             ("--moe-imbalance", moe_imbalance, job_in_file.get("moe_imbalance"))):
        if value is not None and was is not None and value != was:
            notes.append(f"{flag} {value} overrides {source}'s {shown(was)}")
    train_in_file = {} if train is None else {
        "--train-tokens": train.tokens, "--objective": train.objective and train.objective.value,
        "--price": train.price_per_gpu_hour, "--deadline": train.deadline_days,
        "--budget": train.budget_usd}
    for flag, value in train_flags:
        was = train_in_file.get(flag)
        if value is not None and was is not None and value != was:
            given, had = (f"{value:g}", f"{was:g}") if isinstance(value, float) else (value, shown(was))
            notes.append(f"{flag} {given} overrides {source}'s {had}")
    model_ref, model_src = (model, "--model") if model else (doc.get("model"), source)
    cluster_ref, cluster_src = (cluster, "--cluster") if cluster else (doc.get("cluster"), source)
    job_doc = dict(doc.get("job") or {}) if isinstance(doc.get("job") or {}, dict) else doc["job"]
    for key, value in (("global_batch", global_batch), ("seq_len", seq_len),
                       ("dtype", dtype.value if dtype else None), ("moe_imbalance", moe_imbalance)):
        if value is not None and isinstance(job_doc, dict):
            job_doc[key] = value
    if model_ref is None:
        problems.append(Problem(source, "model", "missing: give --model or 'model:' in a job file"))
    if cluster_ref is None:
        problems.append(Problem(source, "cluster",
                                "missing: give --cluster or 'cluster:' in a job file"))
    before = len(problems)
    jf = Fields(job_doc, source, "job", problems)
    job = read_job(jf)
    flagged = {key: flag for key, flag, value in (
        ("global_batch", "--global-batch", global_batch), ("seq_len", "--seq-len", seq_len),
        ("dtype", "--dtype", dtype), ("moe_imbalance", "--moe-imbalance", moe_imbalance))
        if value is not None}
    for i in range(before, len(problems)):  # a flag's value: the flag's, and the field it sets
        key = problems[i].field.removeprefix("job.")
        if problems[i].field.startswith("job.") and key in flagged:
            problems[i] = Problem(flagged[key], problems[i].field, problems[i].message)
    if job is None and isinstance(job_doc, dict):
        # name the option a user would reach for, not only the file field
        for p in list(problems):
            if p.field in ("job.global_batch", "job.seq_len") and "missing" in p.message:
                problems.remove(p)
                flag = "--" + p.field.split(".")[1].replace("_", "-")
                problems.append(Problem(source, p.field, f"missing: give {flag} or set it in a job file"))
    resolved_model = resolved_cluster = None
    pooled: PooledCluster | None = None
    try:
        if model_ref is not None:
            resolved_model, imported = resolve_model_noted(model_ref, model_src,
                                                           "" if model else "model")
            notes = list(imported) + notes
    except InputError as exc:
        problems.extend(exc.problems)
    try:
        if cluster_ref is not None:
            found = resolve_any_cluster(cluster_ref, cluster_src, "" if cluster else "cluster")
            if isinstance(found, PooledCluster):
                pooled, resolved_cluster = found, found.pools[0]
            else:
                resolved_cluster = found
    except InputError as exc:
        problems.extend(exc.problems)
    # no space: the launchers' (``search.launchable``); --launcher NAME: that one's in full
    space_ref = space or doc.get("space")
    if not space and job_file is not None and isinstance(space_ref, str) and looks_like_path(space_ref):
        space_ref = str(beside(space_ref, source))  # beside the job file, as its other files
    try:
        if launcher is not None and space:
            raise InputError.single("--launcher", "", "--space names the space already: give one")
        resolved_space = (launcher_space(launcher) if launcher is not None else
                          resolve_space(None if not space_ref else str(space_ref),
                                        "--space" if space else source, "" if space else "space"))
    except InputError as exc:
        problems.extend(exc.problems)
    stack_ref, stack_src = (stack, "--stack") if stack else (doc.get("stack"), source)
    if stack_ref is not None and not problems:
        try:  # a named stack replaces the one the space implies (each part's, of a union)
            resolved_space = resolved_space.changed(
                stack=resolve_stack(stack_ref, stack_src, "" if stack else "stack"))
        except InputError as exc:
            problems.extend(exc.problems)
    if recompute_modules is not None and not problems:
        resolved_space = resolved_space.changed(recompute_modules=tuple(recompute_modules))
    if launcher is not None and resolved_model is not None and not problems:
        # a family the launcher cannot build at all: said before a search finds nothing it runs
        from autoplan.export import get

        spec = get(launcher)
        problems.extend(Problem(model_src if model else source, f"{'' if model else 'model.'}"
                                f"{field.removeprefix('model.')}",
                                f"--launcher {spec.name} cannot run this model: {why}")
                        for field, why in spec.model_problems(resolved_model))
    if resolved_model is not None and not problems:
        for part in resolved_space.each:
            lacking = recompute_modules_problem(resolved_model, part.recompute_modules)
            if lacking and recompute_modules is not None:
                problems.append(Problem("--recompute-modules", "", lacking))
                break
            if lacking:  # the space file's own list
                where = space_ref if space_ref and not resolved_space.parts else part.name
                problems.append(Problem(str(space_path(str(where))),
                                        "searchspace.recompute_modules", lacking))
    measured: Profile | None = None
    try:
        measured = _read_profile(profile, doc.get("profile"), job_file, source)
    except InputError as exc:
        problems.extend(exc.problems)
    _raise(problems)
    assert resolved_model is not None and resolved_cluster is not None and job is not None
    n = gpus if gpus is not None else doc.get("gpus")
    gpus_src, gpus_field = ("--gpus", "") if gpus is not None else (source, "gpus")
    if pooled is not None:
        return dataclasses.replace(_pooled_request(pooled, resolved_model, job, resolved_space,
                                                   measured, n, (gpus_src, gpus_field), notes,
                                                   source, dtype), train=train)
    sizes: tuple[Cluster, ...] = ()
    if isinstance(n, (list, tuple)):
        counts = check_gpu_counts(n, gpus_src, gpus_field)
        sizes = tuple(with_gpus(resolved_cluster, c, gpus_src, gpus_field) for c in counts)
        if len(sizes) == 1:
            resolved_cluster, sizes = sizes[0], ()
        else:
            resolved_cluster = sizes[0]
    elif n is not None:
        if isinstance(n, bool) or not isinstance(n, int):
            raise InputError.single(source, "gpus", f"expected an integer, got {shown(n)}")
        resolved_cluster = with_gpus(resolved_cluster, n, gpus_src, gpus_field)
    if not resolved_cluster.device.supports(job.dtype):
        raise InputError.single(source if dtype is None else "--dtype",
                                "job.dtype" if dtype is None else "",
                                f"{resolved_cluster.device.name} has no {job.dtype.value} support")
    if job.seq_len > resolved_model.max_seq_len:
        notes.append(f"seq_len {job.seq_len:,} exceeds {resolved_model.name}'s max_seq_len "
                     f"{resolved_model.max_seq_len:,}: the model was not trained on positions past it")
    if moe_imbalance is not None and not resolved_model.is_moe:
        notes.append(f"--moe-imbalance applies to mixture-of-experts models; {resolved_model.name} "
                     "is dense: ignored")
    door = corrected(resolved_cluster, measured)  # the one door (measured/door.py)
    resolved_cluster, measured = door.cluster, door.profile
    if door.note:
        notes.append(door.note.removeprefix("autoplan: note: "))
    sizes = tuple(corrected(c, measured).cluster for c in sizes)
    return Request(resolved_model, resolved_cluster, job, resolved_space, measured, sizes,
                   tuple(notes), train=train)


def _pooled_request(pooled: PooledCluster, model: Model, job: Job, space: SearchSpace,
                    measured: Profile | None, gpus: Any, gpus_at: tuple[str, str],
                    notes: list[str], source: str, dtype: Dtype | None) -> Request:
    """A request on a cluster of pools: sized by its pools' nodes, costed analytically."""
    if gpus is not None and gpus not in (pooled.gpus, str(pooled.gpus)):  # the same count: checked
        raise InputError.single(*gpus_at, (
            f"cluster {pooled.name} has pools of {pooled.gpus} GPUs in all, sized by their nodes: "
            f"leave --gpus out, or give {pooled.gpus} (change each pool's nodes in the cluster file)"))
    if measured is not None:
        raise InputError.single(source, "profile", f"a measured profile corrects one device; "
                                f"cluster {pooled.name} has pools of several")
    for pool in pooled.pools:
        if not pool.device.supports(job.dtype):
            raise InputError.single(source if dtype is None else "--dtype",
                                    "job.dtype" if dtype is None else "",
                                    f"pool {pool.name}'s {pool.device.name} has no "
                                    f"{job.dtype.value} support")
    if job.seq_len > model.max_seq_len:
        notes.append(f"seq_len {job.seq_len:,} exceeds {model.name}'s max_seq_len "
                     f"{model.max_seq_len:,}: the model was not trained on positions past it")
    if any(shipped_profile(p.device.name) is not None for p in pooled.pools):
        notes.append(f"cluster {pooled.name} has pools: its costs are analytic (a shipped "
                     "measured profile corrects one device's, on a cluster of that device)")
    return Request(model, pooled.pools[0], job, space, None, (), tuple(notes), pooled)


def _read_profile(option: Path | None, ref: Any, job_file: Path | None, source: str) -> Profile | None:
    """The profile named by ``--profile``, else by the job file's ``profile:`` (a path
    relative to the job file), else None."""
    if option is not None:
        return read_profile(option)
    if ref is None:
        return None
    if not isinstance(ref, str) or not ref:
        raise InputError.single(source, "profile", f"expected the path of a profile CSV, got {shown(ref)}")
    path = Path(ref).expanduser()
    if not path.is_absolute() and job_file is not None:
        path = job_file.parent / path
    return read_profile(path)


def _raise(problems: list[Problem]) -> None:
    if problems:
        raise InputError(problems)

