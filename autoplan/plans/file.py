"""The plan file (schema v1, docs/ARCHITECTURE.md): read strictly, checked against every plan rule
(``parallel.rules``), and written deterministically. Apart from the ``Plan`` type
(``autoplan.plan``), which the cost model reads: the reader sits above the axes whose
rules it applies."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from autoplan.descriptors import pipeline_layout
from autoplan.descriptors.hardware import Cluster, PooledCluster
from autoplan.descriptors.job import read_job
from autoplan.descriptors.library import default_stack
from autoplan.descriptors.model import Model
from autoplan.descriptors.pipeline_layout import Chunk
from autoplan.descriptors.strict import Fields, shown
from autoplan.errors import InputError, Problem
from autoplan.measured.door import corrected
from autoplan.measured.profile import Profile
from autoplan.parallel.rules import plan_problems
from autoplan.plan import SCHEMA_VERSION, Layout, Placement, Plan, Prediction
from autoplan.schedules import Schedule
from autoplan.vocab import NO_OFFLOAD, CpComm, MoeDispatch, Offload, Recompute, RecomputeModule, ZeroStage


def read_plan(data: Any, source: str, path: str = "", *, profile: Profile | None = None,
              correct: bool = True) -> Plan:
    """Build and check a Plan from a plan-file mapping; every problem is reported at once.

    The plan's cluster comes through the one door of measured profiles
    (``measured.door.corrected``: ``profile``, else the one shipped for its device), as
    every command that costs a plan sees it; ``correct=False`` leaves it analytic (for
    what runs or exports a plan and predicts nothing). A cluster of pools stays analytic."""
    from autoplan.descriptors.library import resolve_any_cluster, resolve_model, resolve_stack

    problems: list[Problem] = []
    f = Fields(data, source, path, problems)
    if not f.ok:
        raise InputError(problems)
    if "layout" not in f.data and "job" in f.data:
        raise InputError.single(source, _join(path, "layout"),
                                "missing: this looks like a job file (no layout); "
                                "use `autoplan search` on it, or add a layout to make it a plan")
    version = f.int("autoplan")
    if version is not None and version != SCHEMA_VERSION:
        f.fail("autoplan", f"expected schema version {SCHEMA_VERSION}, got {version}")
    kind = f.str("kind", "training")
    if kind == "serving":
        raise InputError.single(source, _join(path, "kind"), (
            "a serving plan: `autoplan evaluate` reads it; this command takes training plans"))
    if kind is not None and kind != "training":
        f.fail("kind", f"expected training or serving, got {shown(kind)}")
    model: Model | None = None
    cluster: Cluster | PooledCluster | None = None
    try:
        if (ref := f.raw("model")) is not None:
            model = resolve_model(ref, source, f.key_path("model"))
    except InputError as exc:
        problems.extend(exc.problems)
    try:
        if (ref := f.raw("cluster")) is not None:
            cluster = resolve_any_cluster(ref, source, f.key_path("cluster"))
    except InputError as exc:
        problems.extend(exc.problems)
    stack = default_stack()
    try:
        if (ref := f.raw("stack", None)) is not None:
            stack = resolve_stack(ref, source, f.key_path("stack"))
    except InputError as exc:
        problems.extend(exc.problems)
    job = read_job(f.child("job", f.raw("job")))
    lf = f.child("layout", f.raw("layout"))
    layout_values = dict(
        dp=lf.int("dp", min=1), tp=lf.int("tp", min=1), pp=lf.int("pp", min=1),
        cp=lf.int("cp", 1, min=1), ep=lf.int("ep", 1, min=1), vpp=lf.int("vpp", 1, min=1),
        etp=lf.int("etp", None, min=1),  # None: as tp (Layout)
        dp_shard=lf.int("dp_shard", None, min=1),  # None: as dp
    )
    lf.close()
    values = dict(
        micro_batch=f.int("micro_batch", min=1),
        schedule=f.enum("schedule", Schedule, Schedule.ONE_F_ONE_B),
        recompute=f.enum("recompute", Recompute, Recompute.NONE),
        zero=f.enum("zero", ZeroStage, ZeroStage.NONE),
        sequence_parallel=f.bool("sequence_parallel", False),
        cp_comm=f.enum("cp_comm", CpComm, CpComm.RING),
        offload=_read_offload(f),
        recompute_modules=_read_recompute_modules(f),
        moe_dispatch=f.enum("moe_dispatch", MoeDispatch, MoeDispatch.ALLTOALL),
        ep_overlap=f.bool("ep_overlap", False),
    )
    stages, chunks = _read_split(f, layout_values["pp"], layout_values["vpp"], model)
    placement = _read_placement(f, cluster, layout_values["pp"])
    f.raw("prediction", {})  # written by search/evaluate, ignored on input
    f.raw("measured", {})  # written by tune, read by check --runs (tune/runs.py), ignored here
    f.raw("launchers", [])  # written by search: the launchers that run it, ignored on input
    f.str("space", None)  # the space it was searched in: read by check (``searched_space``)
    f.close()
    if problems or model is None or cluster is None or job is None:
        raise InputError(problems or [Problem(source, path, "incomplete plan")])
    if placement is not None:
        cluster = placement.pool(0)
    assert isinstance(cluster, Cluster)
    plan = Plan(model=model, cluster=cluster, job=job, layout=Layout(**layout_values), stack=stack,
                stages=stages, chunks=chunks, placement=placement, **values)
    given_as = "pipeline_layout" if "pipeline_layout" in f.data else "stages"
    rule_problems = [Problem(source, _join(path, given_as if k == "stages" else k), msg)
                     for k, msg in plan_problems(plan)]
    if rule_problems:
        raise InputError(rule_problems)
    if correct and placement is None:
        plan = plan.replace(cluster=corrected(cluster, profile).cluster)
    return plan


def _read_recompute_modules(f: Fields) -> tuple[RecomputeModule, ...]:
    """``recompute_modules: [moe_act, layernorm, ...]`` (Megatron-Core's names), each once."""
    raw = f.raw("recompute_modules", None)
    if raw is None:
        return ()
    names = [m.value for m in RecomputeModule]
    if not isinstance(raw, list) or not raw:
        f.fail("recompute_modules", f"expected a list of modules from {', '.join(names)}")
        return ()
    out: list[RecomputeModule] = []
    for i, item in enumerate(raw):
        if not isinstance(item, str) or item not in names:
            f.fail(f"recompute_modules[{i}]", f"expected one of {', '.join(names)}, got {shown(item)}")
        elif RecomputeModule(item) in out:
            f.fail(f"recompute_modules[{i}]", f"{item} is listed twice")
        else:
            out.append(RecomputeModule(item))
    return tuple(out)


def _read_placement(f: Fields, cluster: Cluster | PooledCluster | None,
                    pp: int | None) -> Placement | None:
    """``placement: [{stage: 0, pool: NAME}, ...]``, every stage once, in order: given
    exactly where the cluster has pools."""
    raw = f.raw("placement", None)
    pooled = isinstance(cluster, PooledCluster)
    if raw is None:
        if pooled:
            f.fail("placement", "missing: a cluster with pools needs the pool of each "
                                "pipeline stage ([{stage: 0, pool: NAME}, ...])")
        return None
    if cluster is not None and not pooled:
        f.fail("placement", f"cluster {cluster.name} has no pools to place stages on")
        return None
    if not isinstance(raw, list) or (pp is not None and len(raw) != pp):
        got = f"{len(raw)} entries" if isinstance(raw, list) else type(raw).__name__
        f.fail("placement", f"expected a list of {pp} entries (one per pipeline stage), got {got}")
        return None
    if not isinstance(cluster, PooledCluster):
        return None
    names = [p.name for p in cluster.pools]
    pools: list[int] = []
    for i, item in enumerate(raw):
        entry = f.child(f"placement[{i}]", item)
        stage, pool = entry.int("stage", min=0), entry.str("pool")
        entry.close()
        if stage is not None and stage != i:
            entry.fail("stage", f"expected stage {i} (stages in order), got {stage}")
        elif pool is not None and pool not in names:
            entry.fail("pool", f"unknown pool {shown(pool)}; the cluster's pools: "
                               f"{', '.join(names)}")
        elif stage is not None and pool is not None:
            pools.append(names.index(pool))
    if len(pools) != len(raw):
        return None
    return Placement(cluster=cluster, stage_pools=tuple(pools))


def _read_offload(f: Fields) -> Offload:
    """``offload: {optimizer: true, activations: 0.5}`` (both optional)."""
    if f.raw("offload", None) is None:
        return NO_OFFLOAD
    of = f.child("offload", f.raw("offload"))
    optimizer = of.bool("optimizer", False)
    activations = of.float("activations", 0.0, min=0.0, max=1.0)
    of.close()
    return Offload(optimizer=bool(optimizer), activations=activations or 0.0)


def _read_split(f: Fields, pp: int | None, vpp: int | None, model: Model | None
                ) -> tuple[tuple[int, ...] | None, tuple[Chunk, ...] | None]:
    """``stages`` (a list of layers per stage, or with model chunks one list of chunk
    layer counts per stage) or ``pipeline_layout`` (Megatron's string), as (stages,
    chunks). Counts are checked against the model by the plan rules."""
    given = f.raw("stages", None)
    text = f.raw("pipeline_layout", None)
    if given is not None and text is not None:
        f.fail("pipeline_layout", "give stages or pipeline_layout, not both")
        return None, None
    if text is not None:
        if not isinstance(text, str):
            f.fail("pipeline_layout", f"expected a Megatron layout string such as "
                                      f"'Et*3|(tt|)*29,m|L', got {type(text).__name__}")
            return None, None
        try:
            chunks = pipeline_layout.parse_layout(text)
        except pipeline_layout.LayoutError as exc:
            f.fail("pipeline_layout", str(exc))
            return None, None
        return _plain_or_chunks(chunks, pp, model)
    if not isinstance(given, list) or not given or not isinstance(given[0], list):
        return f.int_list("stages", None, min=1), None
    if pp is None or vpp is None or model is None:
        return None, None
    if len(given) != pp:
        f.fail("stages", f"expected {pp} lists (one per pipeline stage), got {len(given)}")
        return None, None
    for i, row in enumerate(given):
        if (not isinstance(row, list) or len(row) != vpp
                or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in row)):
            f.fail(f"stages[{i}]", f"expected a list of vpp={vpp} chunk layer counts (integers "
                                   f">= 0), got {row!r:.60}")
            return None, None
    chunks = pipeline_layout.with_mtp(pipeline_layout.from_stage_lists(given), model.mtp_layers)
    return _plain_or_chunks(chunks, pp, model)


def _plain_or_chunks(chunks: tuple[Chunk, ...], pp: int | None, model: Model | None
                     ) -> tuple[tuple[int, ...] | None, tuple[Chunk, ...] | None]:
    """One chunk per stage, the embedding first and the loss and MTP last, each stage
    with a layer: plain per-stage ``stages`` (the form every launcher flag takes)."""
    if (model is not None and len(chunks) == pp and all(c.layers for c in chunks)
            and pipeline_layout.is_plain(chunks, model.mtp_layers)):
        return tuple(c.layers for c in chunks), None
    return None, chunks


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def plan_document(plan: Plan, prediction: Prediction | None = None,
                  space: str | None = None) -> dict[str, Any]:
    """The mapping written to plan.yaml / JSON; built-ins are referenced by name.
    ``space``: the search space the plan was found in (``check --max-regression``
    compares against it unless told otherwise)."""
    from autoplan.descriptors.library import (
        builtin_cluster_matches,
        builtin_cluster_ref,
        builtin_model_matches,
        builtin_stack_matches,
    )

    cluster = plan.cluster
    if cluster.device.correction is not None:  # a measured correction is no part of the cluster file
        cluster = replace(cluster, device=replace(cluster.device, correction=None))
    out = plan.to_dict(
        builtin_model=builtin_model_matches(plan.model),
        builtin_cluster=builtin_cluster_matches(cluster),
        builtin_stack=builtin_stack_matches(plan.stack),
    )
    if plan.placement is None and (ref := builtin_cluster_ref(cluster)) is not None:
        out["cluster"] = ref  # a built-in by name: whole nodes, or part of a node by its GPUs
    if space is not None:
        out["space"] = space
    if prediction is not None:
        out["prediction"] = prediction.to_dict()
        out["prediction"]["stack"] = plan.stack.name  # the software the prediction assumed
        if plan.model.is_moe:  # tflops_per_gpu and mfu count what each token computes
            out["prediction"]["mfu_basis"] = "active parameters"
    return out


def searched_space(data: Any) -> str | None:
    """The ``space`` a plan-file mapping records it was searched in, if any."""
    space = data.get("space") if isinstance(data, dict) else None
    return space if isinstance(space, str) and space.strip() else None
