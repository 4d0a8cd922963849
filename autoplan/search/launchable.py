"""The launchable search: by default autoplan ranks only plans some launcher runs as they
are (``export --to`` takes them).

Each launcher's search space (``searchspace/<space>.yaml``, its rules) and stack (the
software its plans run on) come from the launcher registry (``autoplan.export``); the
default space, ``launchable``, is the union of the launchers' spaces: each part is searched
on its own stack and the plans are ranked together, each kept once (where two parts
find the same layout, on their two stacks, the faster prediction ranks it) and only where
a launcher runs it. ``any`` (formerly ``default``, still read) is the launcher-free space
every launcher's choice makes up, for what-if questions.

The union's parts split layers uniformly (``plan.uniform_stages``, as the launcher-free
space does): the uneven splits Megatron-LM and torchtitan take cost their searches 3-15x
(GPT-3 175B on 1024 A100: 0.27 s against 3.4 s) and ``--launcher NAME`` searches them.

The parts run in turn, each after the first cut off at the union's k-th best step time so
far (``engine.search``'s ``cutoff``): a later part's search stops where none of its plans
can enter the union's top k, its own best included. Under a caller's ceiling (a sweep's)
the cutoff is also the later of the union's best and the ceiling. The answer is the same as
searching every part in full and ranking all their plans (tests/unit/test_launchable.py,
test_whatif.py).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence

from autoplan.descriptors.hardware import Cluster
from autoplan.descriptors.job import Job
from autoplan.descriptors.model import Model
from autoplan.descriptors.space import SearchSpace, StageShape, load_space
from autoplan.plan import Plan
from autoplan.search import engine
from autoplan.search.results import Ceiling, Ranked, SearchResult, SearchStats, rank_key

LAUNCHABLE = "launchable"
"""The default space: the union of the launchers' spaces."""
ANY = "any"
"""The launcher-free space (``searchspace/any.yaml``)."""
# how much faster a launcher-free plan must be for the search to say so under its table
GAP_NOTE = 0.03


def launcher_spaces() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(space name, the launchers obeying it) for each distinct space of the registry's
    training launchers, in the registry's order (Megatron-LM first: its plans are the
    fastest of most searches, and bound the later parts best)."""
    from autoplan.export import specs

    out: dict[str, list[str]] = {}
    for spec in specs():
        out.setdefault(spec.space, []).append(spec.name)
    return tuple((space, tuple(names)) for space, names in out.items())


def launchable_space() -> SearchSpace:
    """The union of the launchers' spaces; :func:`search` splits each part's layers
    uniformly (module doc), a pooled search as the part's launcher does."""
    parts = [load_space(name) for name, _ in launcher_spaces()]
    first = parts[0]
    return dataclasses.replace(first, name=LAUNCHABLE, launcher=LAUNCHABLE, parts=tuple(parts))


def resolve_space(ref: str | None, source: str = "--space", field: str = "") -> SearchSpace:
    """A space by name or path: ``launchable`` (and no name) the union, ``any`` and its
    former name ``default`` the launcher-free space, else ``load_space``'s."""
    if ref is None or ref == LAUNCHABLE:
        return launchable_space()
    return load_space(ref, source, field)


def launcher_space(name: str, source: str = "--launcher") -> SearchSpace:
    """The full space of one launcher (``--launcher NAME``): its uneven layer splits too."""
    from autoplan.export import get

    return load_space(get(name, source).space)


def with_bf16_states(space: SearchSpace) -> SearchSpace:
    """``--allow-bf16-states``: bf16 gradient reduction and Adam moments tried in the space,
    of a union in the parts whose launchers run them (the others would find only plans
    their launchers refuse)."""
    if not space.parts:
        return space.changed(bf16_states=True)
    from autoplan.export import specs
    from autoplan.export.launcher import MAIN_GRADS, OPTIMIZER_STATES

    runs = {s.space for s in specs() if MAIN_GRADS in s.runs or OPTIMIZER_STATES in s.runs}
    return dataclasses.replace(space, parts=tuple(
        p.changed(bf16_states=True) if p.name in runs else p for p in space.parts))


def search(model: Model, cluster: Cluster, job: Job, space: SearchSpace, top_k: int = 10,
           min_headroom_bytes: float = 0.0, ceiling: Ceiling | None = None) -> SearchResult:
    """``engine.search`` of a space, or of each part of a union ranked together (module
    doc): the top_k plans some launcher runs, each once."""
    if not space.parts:
        return engine.search(model, cluster, job, space, top_k, min_headroom_bytes, ceiling)
    from autoplan.export import launchers

    stats = SearchStats()
    kept: dict[Plan, Ranked] = {}  # by the plan on the first part's stack: one row a layout
    closest = []
    cut = float("inf")  # past it no plan of a later part is wanted (below)

    base = space.parts[0].stack
    for part in space.parts:
        if part.stage_shape is not StageShape.UNIFORM:  # uniform splits (module doc)
            part = dataclasses.replace(part, stage_shape=StageShape.UNIFORM)
        result = engine.search(model, cluster, job, part, top_k, min_headroom_bytes, ceiling,
                               cutoff=cut)
        stats.merge(result.stats)
        if result.closest is not None:
            closest.append(result.closest)
        for r in result.plans:
            if not launchers(r.plan):  # a rule its launcher's exporter adds to its space's
                continue
            key = r.plan if r.plan.stack == base else r.plan.replace(stack=base)
            held = kept.get(key)
            if held is None or rank_key(r.plan, r.prediction) < rank_key(held.plan, held.prediction):
                kept[key] = r
        # a later part's plan slower than the union's k-th best enters no top k, not even as
        # the part's best (``engine.search``'s cutoff); with a caller's ceiling, one slower
        # than the union's best and past the ceiling is wanted neither (the ceiling only
        # falls as the caller learns more: asked now, it keeps at least what it would later)
        if len(kept) >= top_k:
            cut = heapq.nsmallest(top_k, (r.prediction.step_time_s for r in kept.values()))[-1]
        if ceiling is not None and kept:
            best = min(kept.values(), key=lambda r: rank_key(r.plan, r.prediction))
            cut = min(cut, max(ceiling(best), best.prediction.step_time_s))
    ranked = sorted(kept.values(), key=lambda r: rank_key(r.plan, r.prediction))[:top_k]
    near = min(closest, key=lambda c: c[2].peak, default=None) if not ranked else None
    return SearchResult(tuple(ranked), stats, near)


def launcher_free_best(results: Sequence[Ranked], found: SearchResult) -> tuple[Ranked, float] | None:
    """The launcher-free search's best (``found``) and how much faster it is than the best
    launchable plan (``results``), where by more than ``GAP_NOTE``."""
    if not results or not found.plans:
        return None
    free, best = found.plans[0], results[0]
    gain = best.prediction.step_time_s / free.prediction.step_time_s - 1
    return (free, gain) if gain > GAP_NOTE else None
