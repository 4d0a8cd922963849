"""The one registry of rules: what makes a plan valid, and what a launcher's search
space lets it run.

Plan rules live beside their axis (``tp.py``, ``ep.py``, ``dp.py``, ``cp.py``,
``pp.py``) and are listed here in the order the plan reader reports them. The reader
(``plans.file.read_plan``) reports every broken rule; the search prunes by the first broken
rule of each scope as it fixes choices, counting candidates by rule id; validate and
the exporters judge plans by the same predicates. A rule's id is stable: search
statistics and scripts key on it.

Space rules (``space_problems``) judge a valid plan against ``searchspace/<name>.yaml``:
the search generates only plans inside its space, and export refuses a plan outside
its launcher's space with the rule it breaks. Each check reads a field of
``SearchSpace``; nothing here is a second list of a launcher's rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoplan.descriptors.pipeline_layout import render_layout, uniform_stages
from autoplan.descriptors.space import SearchSpace, StageShape
from autoplan.parallel import cp, dp, ep, pp, tp
from autoplan.parallel.common import Rule, Scope
from autoplan.vocab import CpComm, Offload

if TYPE_CHECKING:
    from collections.abc import Iterable

    from autoplan.descriptors.hardware import Cluster
    from autoplan.descriptors.model import Model
    from autoplan.plan import Plan
    from autoplan.vocab import RecomputeModule


def _gpus(plan: Plan) -> str | None:
    lay, c = plan.layout, plan.cluster
    if plan.placement is not None:
        return _pool_gpus(plan)
    if lay.gpus != c.gpus:
        return (f"dp*tp*pp*cp = {lay.dp}*{lay.tp}*{lay.pp}*{lay.cp} = {lay.gpus}, "
                f"but the cluster has {c.gpus} GPUs ({c.nodes} nodes x {c.gpus_per_node})")
    return None


def _pool_gpus(plan: Plan) -> str | None:
    """Each pool hosts whole stages of dp*tp*cp ranks; GPUs of a pool may stay idle."""
    assert plan.placement is not None
    lay, placement = plan.layout, plan.placement
    block = lay.dp * lay.tp * lay.cp
    for i, pool in enumerate(placement.cluster.pools):
        k = placement.stages_on(i)
        if k * block > pool.gpus:
            return (f"pool {pool.name} hosts {k} stages of dp*tp*cp = {block} GPUs each "
                    f"({k * block}), but has {pool.gpus} GPUs")
    # ranks are numbered pp outermost, nodes in rank order: each run of stages on one pool
    # must fill whole nodes of it, or a node would hold ranks of two pools
    for pool, stages in placement.runs():
        n = len(stages)
        if n * block % pool.gpus_per_node:
            takes = "takes" if n == 1 else "take"
            return (f"{placement.span(stages)} {takes} {n * block} GPUs on pool {pool.name}, "
                    f"not whole {pool.gpus_per_node}-GPU nodes")
    return None


def _dtype(plan: Plan) -> str | None:
    dtype = plan.job.dtype
    if not dtype.trains:  # a Job built in code; files and flags refuse it as they read it
        return f"{dtype.value} is a serving precision, not a training one"
    devices = ([plan.placement.cluster.pools[i].device for i in set(plan.placement.stage_pools)]
               if plan.placement is not None else [plan.cluster.device])
    for device in devices:
        if not device.supports(dtype):
            return f"{device.name} has no {dtype.value} tensor cores"
    return None


def _placed_pipeline(plan: Plan) -> str | None:
    """What a plan across pools runs: one model chunk per stage in model order (stage s
    sends to s + 1, costed on the link between their pools), the optimizer on the GPUs."""
    if plan.placement is None:
        return None
    if plan.layout.vpp > 1 or plan.chunks is not None or not plan.schedule.spec.looping:
        return ("a plan across pools runs one model chunk per stage (vpp = 1, no V-shape "
                f"schedule, no per-chunk layout); got vpp={plan.layout.vpp}, "
                f"schedule {plan.schedule.value}")
    if plan.offload.any:
        return "a plan across pools keeps its state on the GPUs (no offload)"
    return None


def recompute_modules_problem(model: Model, modules: Iterable[RecomputeModule]) -> str | None:
    """What of ``modules`` ``model`` does not have, in a sentence naming the module and why
    (None: it has them all): Megatron-Core's checks (TransformerConfig.__post_init__), the
    MoE ones need MoE layers, mla_up_proj multi-head latent attention, shared_experts shared
    experts, and mlp a dense MLP. One rule for a plan file's ``recompute_modules``, a search
    space's and ``--recompute-modules`` (autoplan.commands.request), so that a search never writes a
    plan its reader refuses."""
    from autoplan.vocab import RecomputeModule as M

    mods = tuple(modules)
    if not model.is_moe and (bad := [x.value for x in mods if x in (M.MOE, M.MOE_ACT, M.SHARED_EXPERTS)]):
        return f"{', '.join(bad)}: {model.name} has no MoE layers (a dense model)"
    if M.SHARED_EXPERTS in mods and not model.shared_experts:
        return f"shared_experts: {model.name} has no shared experts"
    if M.MLA_UP_PROJ in mods and not model.is_mla:
        return f"mla_up_proj: {model.name} has no multi-head latent attention"
    if M.MLP in mods and model.is_moe and model.moe_layers == model.layers:
        return (f"mlp: every layer of {model.name} is an MoE layer, with no dense MLP "
                "(recompute its experts with moe)")
    return None


def _recompute_modules(plan: Plan) -> str | None:
    """Modules name what selective recompute recomputes, each one the model has
    (:func:`recompute_modules_problem`)."""
    from autoplan.vocab import Recompute

    if not plan.recompute_modules:
        return None
    if plan.recompute is not Recompute.SELECTIVE:
        return f"modules are what selective recompute recomputes; recompute is {plan.recompute.value}"
    return recompute_modules_problem(plan.model, plan.recompute_modules)


GPUS = Rule("layout-gpus", "layout", Scope.LAYOUT, "dp*tp*pp*cp must equal the GPUs", _gpus)
DTYPE = Rule("dtype-supported", "job.dtype", Scope.JOB,
             "the device must support the precision", _dtype)
RECOMPUTE_MODULES = Rule("recompute-modules", "recompute_modules", Scope.SCHEDULE,
                         "selective recompute's modules must exist in the model", _recompute_modules)
PLACED = Rule("placement-pipeline", "placement", Scope.SCHEDULE,
              "stages across pools run one chunk each, in order, without offload",
              _placed_pipeline)

RULES: tuple[Rule, ...] = (
    GPUS, *tp.LAYOUT_RULES, *ep.RULES, *dp.RULES, *cp.RULES, *tp.SP_RULES, DTYPE,
    *pp.STAGE_RULES, *pp.SCHEDULE_RULES, *dp.OFFLOAD_RULES, RECOMPUTE_MODULES, PLACED,
)
"""Every rule of a valid plan, in the order the plan reader reports them."""

BY_ID: dict[str, Rule] = {r.id: r for r in RULES}
_BY_SCOPE: dict[Scope, tuple[Rule, ...]] = {
    s: tuple(r for r in RULES if r.scope is s) for s in Scope}


def plan_problems(plan: Plan) -> list[tuple[str, str]]:
    """Every rule the plan breaks, as (field, message). Empty when it can run."""
    return [(r.field, msg) for r in RULES if (msg := r.broken(plan)) is not None]


def first_broken(plan: Plan, scope: Scope) -> Rule | None:
    """The first rule of ``scope`` the plan breaks (the search's pruning), or None.
    The plan's choices beyond ``scope`` are not read."""
    for r in _BY_SCOPE[scope]:
        if r.broken(plan) is not None:
            return r
    return None


# ----------------------------------------------------------------------------- space rules

def _clusters(plan: Plan) -> list[Cluster]:
    """The clusters the plan's stages run on: its own, or the pools it places stages on."""
    if plan.placement is None:
        return [plan.cluster]
    return [plan.placement.cluster.pools[i] for i in sorted(set(plan.placement.stage_pools))]


def space_problems(plan: Plan, space: SearchSpace) -> list[tuple[str, str]]:
    """Every rule of ``space`` the plan breaks, as (plan field, message)."""
    lay, name = plan.layout, space.name
    out: list[tuple[str, str]] = []

    def outside(field: str, what: str, allowed: str) -> None:
        out.append((field, f"{name} cannot run {what} (searchspace/{name}.yaml allows {allowed})"))

    if lay.tp > space.tp_max:
        outside("layout.tp", f"tp={lay.tp}", f"tp up to {space.tp_max}")
    domain = min(min(c.nvlink_domain, c.gpus) for c in _clusters(plan))
    if space.tp_within_nvlink and lay.tp > domain:
        outside("layout.tp", f"tp={lay.tp} across the {domain}-GPU NVLink domain",
                "tensor parallel groups inside one NVLink domain")
    for axis, value, cap in (("pp", lay.pp, space.pp_max), ("cp", lay.cp, space.cp_max),
                             ("vpp", lay.vpp, space.vpp_max), ("ep", lay.ep, space.ep_max)):
        if value > cap:
            outside(f"layout.{axis}", f"{axis}={value}", f"{axis} up to {cap}")
    if plan.model.is_moe and lay.ep > 1:
        etps = {1 if e == "1" else lay.tp for e in space.etp}
        if lay.etp not in etps:
            outside("layout.etp", f"etp={lay.etp}",
                    " or ".join(f"etp={e}" for e in sorted(etps)) + f" with tp={lay.tp}")
    if lay.pp > 1 and plan.schedule not in space.schedules:
        outside("schedule", f"the {plan.schedule.value} schedule",
                ", ".join(s.value for s in space.schedules))
    if plan.recompute not in space.recompute:
        outside("recompute", f"recompute: {plan.recompute.value}",
                ", ".join(r.value for r in space.recompute))
    if lay.pp > 1 and space.zero_with_pp:  # the launcher's own sharding under a pipeline
        if plan.zero not in space.zero_with_pp:
            outside("zero", f"zero: {int(plan.zero)} with pipeline parallelism (pp={lay.pp})",
                    "zero " + ", ".join(str(int(z)) for z in space.zero_with_pp) + " when pp > 1")
        elif dp.plain_dp_refused(lay, plan.zero, space):
            outside("zero", "plain data parallel (zero: 0) with tensor, pipeline or context "
                            "parallelism", "zero 0 only without tp, pp and cp")
    elif plan.zero not in space.zero:
        outside("zero", f"zero: {int(plan.zero)}", "zero " + ", ".join(str(int(z)) for z in space.zero))
    elif lay.pp > 1 and plan.zero > space.zero_max_with_pp:
        outside("zero", f"zero: {int(plan.zero)} with pipeline parallelism (pp={lay.pp})",
                f"zero up to {int(space.zero_max_with_pp)} when pp > 1")
    elif dp.plain_dp_refused(lay, plan.zero, space):
        outside("zero", "plain data parallel (zero: 0) with tensor, pipeline or context "
                        "parallelism", "zero 0 only without tp, pp and cp")
    if lay.tp > 1 and plan.sequence_parallel not in space.sequence_parallel:
        outside("sequence_parallel", f"sequence_parallel: {str(plan.sequence_parallel).lower()}",
                "sequence_parallel: " + ", ".join(str(s).lower() for s in space.sequence_parallel))
    if lay.cp > 1 and plan.cp_comm not in space.cp_comm:
        outside("cp_comm", f"cp_comm: {plan.cp_comm.value}", ", ".join(c.value for c in space.cp_comm))
    elif (lay.cp > 1 and plan.cp_comm is CpComm.A2A and not space.a2a_replicates_kv
          and (split := cp.a2a_head_split(plan.model, lay, False)) is not None):
        outside("cp_comm", f"cp_comm: a2a over cp={lay.cp} with {split[1]} key-value heads per "
                           "TP rank", "a2a where cp divides the key-value heads per TP rank")
    if plan.model.is_moe and plan.moe_dispatch not in space.moe_dispatch:
        outside("moe_dispatch", f"moe_dispatch: {plan.moe_dispatch.value}",
                ", ".join(d.value for d in space.moe_dispatch))
    if plan.offload not in space.offload:
        def shown(o: Offload) -> str:  # as the plan file writes it
            return "{" + ", ".join(f"{k}: {str(v).lower()}" for k, v in o.to_dict().items()) + "}"

        allowed = "; ".join(shown(o) for o in space.offload if o.any)
        outside("offload", f"offload {shown(plan.offload)}",
                f"offload {allowed}" if allowed else "no offload")
    # across pools an even split is never the one to run: where the launcher takes any
    # split (the layout flag of Megatron-LM; every launcher, for the default space) the
    # split is balanced to the pools' speeds whatever the space's ``stages`` says
    free = plan.placement is not None and (space.launcher == "any"
                                           or space.stage_shape is not StageShape.UNIFORM)
    stage = "" if free else _stage_shape_problem(plan, space.stage_shape)
    if stage:
        what = (f"the per-chunk layout {render_layout(plan.chunks)}" if plan.chunks is not None
                else f"the layer split {list(plan.stage_layers)}")
        outside("stages", what, stage)
    return out


def _stage_shape_problem(plan: Plan, shape: StageShape) -> str:
    """Which splits the launcher takes, when the plan's split is not one of them."""
    if plan.chunks is not None:  # Megatron's layout flag and torchtitan's split points
        return "" if shape is not StageShape.UNIFORM else "no per-chunk layouts"
    layers = plan.stage_layers
    uniform = uniform_stages(plan.model.layers, plan.layout.pp)
    if shape is StageShape.ANY or layers == uniform:  # the search always tries the uniform split
        return ""
    if shape is StageShape.UNIFORM:
        return f"only the uniform split {list(uniform)}"
    middle = layers[1:-1]
    if len(set(middle)) <= 1:
        return ""
    return "any first and last stage, but equal middle stages"
