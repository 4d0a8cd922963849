"""Whether a launcher can run a plan, judged by the launcher's own search space.

``searchspace/<launcher>.yaml`` is the one statement of what a launcher runs: the
search generates only plans inside it, and export refuses a plan outside it with the
rule it breaks. Nothing here is a second list of the launcher's rules; each check reads
a field of ``SearchSpace``.
"""

from __future__ import annotations

from autoplan.plan import Plan, uniform_stages
from autoplan.search.partition import StageShape
from autoplan.search.space import SearchSpace


def space_problems(plan: Plan, space: SearchSpace) -> list[tuple[str, str]]:
    """Every rule of ``space`` the plan breaks, as (plan field, message)."""
    lay, name = plan.layout, space.name
    out: list[tuple[str, str]] = []

    def outside(field: str, what: str, allowed: str) -> None:
        out.append((field, f"{name} cannot run {what} (searchspace/{name}.yaml allows {allowed})"))

    if lay.tp > space.tp_max:
        outside("layout.tp", f"tp={lay.tp}", f"tp up to {space.tp_max}")
    domain = min(plan.cluster.nvlink_domain, plan.cluster.gpus)
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
    if plan.zero not in space.zero:
        outside("zero", f"zero: {int(plan.zero)}", "zero " + ", ".join(str(int(z)) for z in space.zero))
    elif lay.pp > 1 and plan.zero > space.zero_max_with_pp:
        outside("zero", f"zero: {int(plan.zero)} with pipeline parallelism (pp={lay.pp})",
                f"zero up to {int(space.zero_max_with_pp)} when pp > 1")
    if lay.tp > 1 and plan.sequence_parallel not in space.sequence_parallel:
        outside("sequence_parallel", f"sequence_parallel: {str(plan.sequence_parallel).lower()}",
                "sequence_parallel: " + ", ".join(str(s).lower() for s in space.sequence_parallel))
    if lay.cp > 1 and plan.cp_comm not in space.cp_comm:
        outside("cp_comm", f"cp_comm: {plan.cp_comm.value}", ", ".join(c.value for c in space.cp_comm))
    stage = _stage_shape_problem(plan, space.stage_shape)
    if stage:
        outside("stages", f"the layer split {list(plan.stage_layers)}", stage)
    return out


def _stage_shape_problem(plan: Plan, shape: StageShape) -> str:
    """Which splits the launcher takes, when the plan's split is not one of them."""
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
