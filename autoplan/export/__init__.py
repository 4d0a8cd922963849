"""Launcher configurations from a plan: one pure module per launcher.

Each launcher is one module of this package defining ``LAUNCHER``, a
:class:`~autoplan.export.launcher.LauncherSpec` found by the registry
(:mod:`autoplan.export.launcher`); its ``export(plan)`` returns ``{filename: text}``, and
nothing here prints, writes files or exits. :func:`export` below first checks the plan
against the launcher's search space (``searchspace/<space>.yaml``, the same rules the
search obeys), the plan features it runs and what else its configuration cannot
express, and refuses with every reason at once, naming the plan file and field.
"""

from __future__ import annotations

from typing import Any

from autoplan import caches
from autoplan.descriptors.space import SearchSpace, load_space
from autoplan.errors import InputError, Problem
from autoplan.export import slurm
from autoplan.export.launcher import (
    Launcher,
    LauncherSpec,
    Target,
    get,
    refresh,
    slurm_launchers,
    specs,
)
from autoplan.parallel.rules import space_problems
from autoplan.plan import Plan

__all__ = ["Launcher", "LauncherSpec", "Target", "export", "get", "launchers", "refresh", "refusals",
           "slurm_launchers", "specs"]


@caches.memo(maxsize=64)
def _space(name: str) -> SearchSpace:
    """A launcher's search space, read once (a search asks of every plan it shows)."""
    return load_space(name)


def _spec(target: str, launcher: str) -> tuple[LauncherSpec, str | None]:
    """The launcher that runs (the target's own, or for slurm the one its job runs: any
    launcher, one without a Slurm program refused) and the name of the export around it
    (None: none). ValueError for a name no file registers."""
    found = Target(target)
    runs = found.spec if found is not Target.SLURM else Target(launcher).spec
    if not isinstance(runs, LauncherSpec):
        raise ValueError(f"a Slurm job runs a launcher, not {launcher!r}")
    return runs, (found.value if found is Target.SLURM else None)


def refusals(plan: Plan, target: Target | str,
             launcher: Launcher | str = "megatron") -> list[tuple[str, str]]:
    """Why the target cannot run the plan, as (plan field, message); empty when it can."""
    spec, wrapper = _spec(target, launcher)
    out = space_problems(plan, _space(spec.space))
    out += spec.problems(plan)
    if wrapper is not None and spec.slurm is None:
        runs = ", ".join(s.name for s in slurm_launchers())
        out.append(("", f"a Slurm job runs no {spec.name} launch (it runs {runs})"))
    return out + spec.refusals(plan, wrapper)


def launchers(plan: Plan) -> tuple[str, ...]:
    """The launchers that run the plan as it is (``export --to`` each takes it), in the
    registry's order: what a plan of the default space, which every launcher's choices
    make up, needs."""
    return tuple(s.name for s in specs() if not refusals(plan, s.name))


def export(plan: Plan, target: Target | str, source: str = "<plan>",
           launcher: Launcher | str = "megatron") -> dict[str, str]:
    """``{filename: text}`` for the target, or InputError naming ``source`` and each field."""
    spec, wrapper = _spec(target, launcher)
    problems = refusals(plan, target, launcher)
    if problems:
        out = [Problem(source, field, f"cannot export to {spec.name}: {msg}") for field, msg in problems]
        out.append(Problem(source, "", f"`autoplan search --space {spec.space}` searches only plans "
                                       f"{spec.name} can run"))
        raise InputError(out)
    if wrapper is not None:
        return slurm.export(plan, spec)
    return spec.export(plan)


def __getattr__(name: str) -> Any:
    """``LAUNCHERS``: the training launchers as export targets, in order (its former
    spelling, a tuple of ``Target``)."""
    if name == "LAUNCHERS":
        return tuple(Target(s.name) for s in specs())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
