"""Launcher configurations from a plan: one pure module per launcher.

Each module's ``export(plan)`` returns ``{filename: text}``; nothing here prints,
writes files or exits. ``export`` below first checks the plan against the launcher's
search space (``searchspace/<launcher>.yaml``, the same rules the search obeys) and
the few things a launcher's configuration cannot express, and refuses with every
reason at once, naming the plan file and field.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from autoplan.descriptors.space import load_space
from autoplan.errors import InputError, Problem
from autoplan.export import deepspeed, megatron, nemo, nodes, slurm, torchtitan
from autoplan.parallel.rules import space_problems
from autoplan.plan import Plan
from autoplan.vocab import StateDtype, ZeroStage


class Target(str, enum.Enum):
    """What ``autoplan export --to`` writes."""

    MEGATRON = "megatron"
    """Megatron-LM: a bash script running torchrun pretrain_gpt.py."""
    DEEPSPEED = "deepspeed"
    """DeepSpeed: ds_config.json and the deepspeed launcher line."""
    NEMO = "nemo"
    """NeMo 2 / Megatron-Bridge: recipe overrides (YAML) for Megatron-Core."""
    TORCHTITAN = "torchtitan"
    """torchtitan: its job configuration (TOML) and the torchrun line."""
    SLURM = "slurm"
    """An sbatch script wrapping one of the launchers (torchrun, c10d rendezvous)."""


class Launcher(str, enum.Enum):
    """What a Slurm job runs."""

    MEGATRON = "megatron"
    DEEPSPEED = "deepspeed"
    TORCHTITAN = "torchtitan"


# the search space whose rules a target must obey: NeMo and Megatron-Bridge run Megatron-Core
_SPACE = {Target.MEGATRON: "megatron", Target.DEEPSPEED: "deepspeed", Target.NEMO: "megatron",
          Target.TORCHTITAN: "torchtitan"}
_EXTRA: dict[str, Callable[[Plan], list[tuple[str, str]]]] = {
    "megatron": megatron.problems, "deepspeed": deepspeed.problems,
    "torchtitan": torchtitan.problems,
}


def _space_name(target: Target, launcher: Launcher) -> str:
    """The search space whose rules the target (Slurm: the launcher it runs) obeys."""
    return launcher.value if target is Target.SLURM else _SPACE[target]


def refusals(plan: Plan, target: Target, launcher: Launcher = Launcher.MEGATRON) -> list[tuple[str, str]]:
    """Why the target cannot run the plan, as (plan field, message); empty when it can."""
    space_name = _space_name(target, launcher)
    out = space_problems(plan, load_space(space_name))
    if target is not Target.NEMO:
        out += _EXTRA[space_name](plan)
    elif plan.layout.dp_replicas > 1:
        out.append(("layout.dp_shard", "the NeMo export sets no distributed optimizer instances; "
                                       "export to megatron (--num-distributed-optimizer-instances)"))
    megatron_core = target in (Target.MEGATRON, Target.NEMO) or (
        target is Target.SLURM and launcher is Launcher.MEGATRON)
    if plan.recompute_modules and not megatron_core:
        out.append(("recompute_modules", "selective recompute by module is Megatron-Core's "
                                         "(--recompute-modules); export to megatron or nemo"))
    if plan.job.main_grads is not StateDtype.FP32 and not megatron_core:
        out.append(("job.main_grads", "bf16 gradient reduction is exported to Megatron-LM "
                                      "(--grad-reduce-in-bf16) and NeMo only"))
    if plan.job.optimizer_states is not StateDtype.FP32:
        if target is Target.NEMO or not megatron_core:
            out.append(("job.optimizer_states", "bf16 optimizer states are exported to Megatron-LM "
                                                "only (--use-precision-aware-optimizer "
                                                "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16)"))
        elif plan.zero < ZeroStage.OPTIMIZER:
            out.append(("job.optimizer_states", "Megatron-LM's precision-aware optimizer runs "
                                                "inside the distributed optimizer: zero >= 1"))
    if plan.ep_overlap and not megatron_core:
        out.append(("ep_overlap", "EP all-to-all overlap is Megatron-Core's "
                                  "(--overlap-moe-expert-parallel-comm); export to megatron or nemo"))
    if plan.placement is not None:
        if target in (Target.MEGATRON, Target.TORCHTITAN):
            out += nodes.problems(plan)
        else:
            out.append(("placement", f"{target.value} has no way to name which nodes run which "
                                     "pipeline stages; export to megatron or torchtitan (torchrun "
                                     "node ranks, named per pool in the script)"))
    return out


LAUNCHERS = (Target.MEGATRON, Target.NEMO, Target.DEEPSPEED, Target.TORCHTITAN)


def launchers(plan: Plan) -> tuple[str, ...]:
    """The launchers that run the plan as it is (``export --to`` each takes it): what a
    plan of the default space, which every launcher's choices make up, needs."""
    return tuple(t.value for t in LAUNCHERS if not refusals(plan, t))


def export(plan: Plan, target: Target, source: str = "<plan>",
           launcher: Launcher = Launcher.MEGATRON) -> dict[str, str]:
    """``{filename: text}`` for the target, or InputError naming ``source`` and each field."""
    problems = refusals(plan, target, launcher)
    if problems:
        name = launcher.value if target is Target.SLURM else target.value
        out = [Problem(source, field, f"cannot export to {name}: {msg}") for field, msg in problems]
        out.append(Problem(source, "", f"`autoplan search --space {_space_name(target, launcher)}` "
                                       f"searches only plans {name} can run"))
        raise InputError(out)
    if target is Target.MEGATRON:
        return megatron.export(plan)
    if target is Target.DEEPSPEED:
        return deepspeed.export(plan)
    if target is Target.NEMO:
        return nemo.export(plan)
    if target is Target.TORCHTITAN:
        return torchtitan.export(plan)
    return slurm.export(plan, launcher.value)
