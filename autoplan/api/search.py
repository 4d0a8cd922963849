"""``autoplan search`` as a function: rank the training plans that fit, on one GPU count,
on a cluster of pools, or over several counts with the time, cost and energy to train.

:func:`prepare_search` checks every option and builds the request (descriptors resolved,
the space read) without searching; :meth:`SearchJob.run` searches. :func:`search` is
both."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoplan.api._base import (
    PLAN_COLUMNS,
    Progress,
    Result,
    check_at_least,
    check_top,
    choice,
    frame,
    gpu_counts,
    layout_text,
    offload_text,
    path_or_none,
    plan_row,
    ref,
    told,
    training_dtype,
)
from autoplan.errors import InputError, Problem, naming

if TYPE_CHECKING:
    import pandas

    from autoplan.commands.request import Request, TrainGoal
    from autoplan.descriptors.model import Model
    from autoplan.plan import Plan, Prediction
    from autoplan.search.stats import SearchStats
    from autoplan.vocab import Dtype, RecomputeModule
    from autoplan.whatif.economics import Objective


@dataclass(frozen=True, slots=True, kw_only=True)
class RankedPlan:
    """One plan of a search, its rank (1 is the best) and prediction; ``launchers``: the
    launchers that run it as it is (``export --to``), None where the search does not say
    (a sweep over GPU counts)."""

    rank: int
    plan: Plan
    prediction: Prediction
    space: str
    launchers: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The plan file's document with its prediction (``search --format json``'s plans)."""
        from autoplan.plans.file import plan_document

        doc = plan_document(self.plan, self.prediction, self.space)
        if self.launchers is not None:
            doc["launchers"] = list(self.launchers)
        return doc

    def to_yaml(self) -> str:
        """The plan file ``search --out`` writes (without the launchers it runs on)."""
        from autoplan.plans.file import plan_document

        return plan_yaml(plan_document(self.plan, self.prediction, self.space))


def plan_yaml(doc: Any) -> str:
    import yaml

    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)


@dataclass(frozen=True, slots=True, kw_only=True)
class LauncherFree:
    """The launcher-free space's best plan (``--space any``), where it is faster than the
    best plan some launcher runs: by ``faster_by`` (0.1 = 10 %)."""

    plan: Plan
    prediction: Prediction
    faster_by: float

    def to_dict(self) -> dict[str, Any]:
        from autoplan.plans.file import plan_document
        from autoplan.search.launchable import ANY

        return {"faster_by": self.faster_by, "plan": plan_document(self.plan, self.prediction, ANY)}


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolAlone:
    """The best plan on one pool of a pooled cluster alone (None where none fits, and why)."""

    pool: str
    gpus: int
    device: str
    tokens_per_s: float | None
    step_time_s: float | None = None
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        head = {"pool": self.pool, "gpus": self.gpus, "device": self.device}
        if self.tokens_per_s is None:
            return {**head, "tokens_per_s": None, "reason": self.reason}
        return {**head, "tokens_per_s": self.tokens_per_s, "step_time_s": self.step_time_s}


@dataclass(frozen=True, slots=True, kw_only=True)
class Pools:
    """What a search on a cluster of pools found: which pools the best plan uses, and the
    best on each alone."""

    cluster: str
    verdict: str
    alone: tuple[PoolAlone, ...]
    result: Any  # autoplan.search.pooled.PooledResult, for tables

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "verdict": self.verdict, "alone": [a.to_dict() for a in self.alone]}


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainSweep:
    """``--train-tokens``: each GPU count's best plan priced (days, GPU-hours, cost, energy),
    the Pareto front of days against dollars, the constraints, the count chosen."""

    summary: dict[str, Any]  # search --format json's "train"
    sweep: Any  # autoplan.whatif.sweep.Sweep: every count's search
    limits: Any  # autoplan.whatif.sweep.Constrained: the front kept under the deadline and budget
    labels: dict[int, str]  # GPU count -> its best plan's layout in words
    space: str
    price_per_gpu_hour: float | None

    @property
    def chosen_gpus(self) -> int | None:
        return self.summary["best_gpus"]  # type: ignore[no-any-return]

    def pareto(self) -> list[dict[str, Any]]:
        from autoplan.plans.file import plan_document

        return [{**p.economics.to_dict(), "layout": self.labels[p.gpus],
                 "plan": plan_document(p.plan, p.prediction, self.space)} for p in self.limits.kept]

    def to_frame(self) -> pandas.DataFrame:
        """One row per GPU count that has a plan: its best plan's layout, step time,
        days, GPU-hours, cost and energy to train, whether it is on the front, kept under
        the deadline and budget, and chosen by the objective."""
        front = {p.gpus for p in self.sweep.front}
        kept = {p.gpus for p in self.limits.kept}
        chosen = self.chosen_gpus
        rows = []
        for p in self.sweep.points:
            e = p.economics.to_dict()
            rows.append({"gpus": p.gpus, "layout": self.labels[p.gpus], "step_time_s": e["step_time_s"],
                         "tokens_per_s": e["tokens_per_s"], "mfu": p.prediction.mfu,
                         "train_days": e["train_days"], "gpu_hours": e["gpu_hours"],
                         "cost_usd": e["cost_usd"], "energy_mwh": e["energy_mwh"],
                         "on_front": p.gpus in front, "kept": p.gpus in kept, "chosen": p.gpus == chosen})
        return frame(rows, ("gpus", "layout", "step_time_s", "tokens_per_s", "mfu", "train_days",
                            "gpu_hours", "cost_usd", "energy_mwh", "on_front", "kept", "chosen"))

    def front_svg(self, title: str | None = None) -> str:
        """The front drawn as ``search --plot FILE.svg`` draws it (days against dollars)."""
        from autoplan.whatif.plot import front_svg

        sweep, limits = self.sweep, self.limits
        if not sweep.points:
            raise InputError.single("--plot", "", "no GPU count has a plan: nothing to draw")
        return front_svg(sweep.points, sweep.front, limits.chosen, self.labels, title or self.title(),
                         deadline_days=self.summary["deadline_days"], budget_usd=self.summary["budget_usd"])

    def title(self) -> str:
        p = self.sweep.points[0].plan
        money = "dollars" if self.price_per_gpu_hour is not None else "GPU-hours"
        return (f"{p.model.name} on {p.cluster.device.name}, {self.summary['tokens']:.3g} tokens: "
                f"days against {money}")


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchResult(Result):
    """A search's ranked plans (best first; at most ``top``) and what it searched
    (``stats``); ``reason``: why no plan is ranked, where none is. A search on a cluster of
    pools has ``pools``; one over GPU counts with tokens to train has ``train``."""

    request: Request
    plans: tuple[RankedPlan, ...]
    stats: SearchStats
    headroom_bytes: float | None  # None: each pool's device's default
    headroom_default: bool  # no min_headroom given: 5 % of the device
    reason: str | None = None
    closest: Any = None  # the plan nearest to fitting, where none fits
    launcher_free: LauncherFree | None = None
    pools: Pools | None = None
    train: TrainSweep | None = None

    @property
    def ok(self) -> bool:
        """Whether a plan is ranked (the command's exit 0; 1 otherwise)."""
        return bool(self.plans)

    @property
    def best(self) -> RankedPlan | None:
        return self.plans[0] if self.plans else None

    @property
    def notes(self) -> tuple[str, ...]:
        return self.request.notes

    def to_dict(self) -> dict[str, Any]:
        plans = [r.to_dict() for r in self.plans]
        stats = self.stats.to_dict()
        if self.train is not None:
            if not self.train.sweep.points:
                return {"plans": [], "stats": stats, "pareto": [], "train": self.train.summary,
                        "reason": self.reason}
            return {"plans": plans, "stats": stats, "pareto": self.train.pareto(),
                    "train": self.train.summary}
        if self.pools is not None:
            if not plans:
                return {"plans": [], "stats": stats, "pools": self.pools.to_dict(), "reason": self.reason}
            return {"plans": plans, "stats": stats, "pools": self.pools.to_dict()}
        if not plans:
            return {"plans": [], "stats": stats, "reason": self.reason}
        doc: dict[str, Any] = {"plans": plans, "stats": stats}
        if self.launcher_free is not None:
            doc["launcher_free"] = self.launcher_free.to_dict()
        if self.request.profile is not None:
            doc["profile"] = self.request.profile.source
        return doc

    def to_frame(self) -> pandas.DataFrame:
        """The ranked plans, a row each: rank, GPUs, the layout and its degrees, micro-batch,
        schedule, recompute, ZeRO stage, step time, tokens/s, MFU, TFLOP/s per GPU, peak
        memory (GiB), the launchers that run it."""
        return frame([plan_row(r.rank, r.plan, r.prediction, r.launchers) for r in self.plans], PLAN_COLUMNS)

    table = to_frame


@dataclass(frozen=True, slots=True)
class _WhatIf:
    """The time-to-train options, checked."""

    train_tokens: float
    objective: Objective
    price: float | None
    deadline: float | None
    budget: float | None

    @classmethod
    def read(cls, train_tokens: float | None, objective: Objective | None, price: float | None,
             deadline: float | None, budget: float | None) -> _WhatIf | None:
        from autoplan.commands.request import MAX_DEADLINE_DAYS, MAX_TRAIN_TOKENS
        from autoplan.units import MAX_MONEY
        from autoplan.whatif.economics import Objective

        given = {"--objective": objective, "--price": price, "--deadline": deadline, "--budget": budget}
        if train_tokens is None:
            for flag, value in given.items():
                if value is not None:
                    raise InputError.single(flag, "", "needs --train-tokens (the run it prices)")
            return None
        problems = []
        for flag, value, hi in (("--train-tokens", train_tokens, MAX_TRAIN_TOKENS),
                                ("--price", price, MAX_MONEY),
                                ("--deadline", deadline, MAX_DEADLINE_DAYS),
                                ("--budget", budget, MAX_MONEY)):
            if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                          and math.isfinite(value) and 0 < value <= hi):
                shown = f"{value:g}" if isinstance(value, float) else repr(value)
                problems.append(Problem(flag, "", f"expected a number > 0 and <= {hi:g}, got {shown}"))
        if problems:
            raise InputError(problems)
        return cls(float(train_tokens), objective or Objective.TIME, price, deadline, budget)

    @classmethod
    def from_options_and_file(cls, goal: TrainGoal | None, train_tokens: float | None,
                              objective: Objective | None, price: float | None, deadline: float | None,
                              budget: float | None) -> _WhatIf | None:
        """The options over the job file's ``train:`` section (each option overrides its
        field; ``build_request`` notes where it does)."""
        if goal is None:
            return cls.read(train_tokens, objective, price, deadline, budget)
        return cls.read(train_tokens or goal.tokens, objective or goal.objective,
                        price or goal.price_per_gpu_hour, deadline or goal.deadline_days,
                        budget or goal.budget_usd)


def recompute_modules_option(value: str | Sequence[RecomputeModule | str]) -> tuple[RecomputeModule, ...]:
    """``--recompute-modules moe_act,layernorm``: Megatron-Core's module names, each once."""
    from autoplan.descriptors import strict
    from autoplan.vocab import RecomputeModule

    names = ([n.strip() for n in value.split(",")] if isinstance(value, str)
             else [getattr(n, "value", n) for n in value])
    known = {m.value: m for m in RecomputeModule}
    bad = [n for n in names if n not in known]
    if bad or not names or len(set(names)) != len(names):
        raise InputError.single("--recompute-modules", "", (
            f"expected a comma-separated list of distinct modules from {', '.join(known)}, "
            f"got {strict.shown(value if isinstance(value, str) else ','.join(map(str, names)))}"))
    return tuple(known[n] for n in names)


# The objectives' one vocabulary (docs/CLI.md): cost and energy mean the same to search and
# serve (dollars, energy per unit of work); the third is each one's own measure of speed, with
# no meaning to the other: days to train a run (search's time) is not goodput per GPU of a
# deployment (serve's goodput), which ranks counts as cost does at one price
OTHER_OBJECTIVE = ("goodput per GPU ranks serving deployments, autoplan serve's; a training run's speed "
                   "is its days to train, time")


def _objective(value: Objective | str | None) -> Objective | None:
    from autoplan.whatif.economics import Objective

    if value is None or isinstance(value, Objective):
        return value
    if value == "goodput":
        words = ", ".join(o.value for o in Objective)
        raise InputError.single("--objective", "", f"expected one of {words}, got 'goodput': "
                                                   f"{OTHER_OBJECTIVE}")
    return choice("--objective", value, Objective)  # type: ignore[no-any-return]


def best_plan_files(plan: Plan, plan_text: str, runs_on: Sequence[str],
                    launcher: str | None) -> tuple[str, dict[str, str]]:
    """``search --export``: the launcher and the files that launch the best plan (``export
    --to`` its first launcher, or ``launcher``), with the plan itself (``plan.yaml``,
    ``plan_text``); refused where no launcher runs it."""
    from autoplan.export import Target
    from autoplan.export import export as run_export

    name = launcher or (runs_on[0] if runs_on else None)
    if name is None:
        raise InputError.single("--export", "", "no launcher runs the best plan as it is "
                                                "(--space any): search without --space")
    return name, {**run_export(plan, Target(name), "the best plan"), "plan.yaml": plan_text}


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchJob:
    """A search checked and ready to run: the request (descriptors resolved, notes on what
    the options override), the time-to-train options, the memory every plan leaves free."""

    request: Request
    top: int
    headroom_bytes: float | None
    headroom_default: bool
    whatif: _WhatIf | None
    no_offload: bool
    async_checkpoint: bool

    @property
    def notes(self) -> tuple[str, ...]:
        return self.request.notes

    @property
    def pooled(self) -> bool:
        return self.request.pools is not None

    @property
    def sweep(self) -> bool:
        return self.whatif is not None

    def check_outputs(self, *, plot: bool = False, export: bool = False) -> None:
        """Refuse, before the search, what this search does not make: a front to draw
        (``--plot``) without a run to price, one best plan to export (``--export``) of a
        sweep or of pools."""
        if plot and not self.sweep:
            raise InputError.single("--plot", "", "needs --train-tokens (the run it prices)")
        if export and (self.sweep or self.pooled):
            raise InputError.single("--export", "", "writes the best plan of one search: save a plan "
                                    "of the sweep or the pools with --out and `autoplan export` it")

    @property
    def price_per_gpu_hour(self) -> float | None:
        w = self.whatif
        if w is not None and w.price is not None:
            return w.price
        return self.request.cluster.device.price_per_gpu_hour

    def run(self, progress: Progress | None = None) -> SearchResult:
        """Search; ``progress`` is told as each part ends (a GPU count, a pool)."""
        if self.request.pools is not None:
            return self._pooled(told(progress))
        if self.whatif is not None:
            return self._sweep(self.whatif, told(progress))
        return self._one()

    def _ranked(self, found: Any) -> tuple[RankedPlan, ...]:
        from autoplan.export import launchers

        return tuple(RankedPlan(rank=i, plan=r.plan, prediction=r.prediction, space=self.request.space.name,
                                launchers=tuple(launchers(r.plan)))
                     for i, r in enumerate(found, start=1))

    def _one(self) -> SearchResult:
        from autoplan.search.launchable import launcher_free_best
        from autoplan.search.launchable import search as run_search

        req = self.request
        assert self.headroom_bytes is not None
        free = _launcher_free(req, self.headroom_bytes, self.no_offload)  # beside, in a second process
        try:
            result = run_search(req.model, req.cluster, req.job, req.space, self.top, self.headroom_bytes)
        except BaseException:
            if free is not None:
                free.abandon()
            raise
        gap = launcher_free_best(result.plans, free.result()) if free is not None else None
        return SearchResult(
            request=req, plans=self._ranked(result.plans), stats=result.stats,
            headroom_bytes=self.headroom_bytes, headroom_default=self.headroom_default,
            reason=None if result.plans else result.why_none(), closest=result.closest,
            launcher_free=None if gap is None else LauncherFree(
                plan=gap[0].plan, prediction=gap[0].prediction, faster_by=gap[1]))

    def _pooled(self, progress: Progress) -> SearchResult:
        from autoplan.search.pooled import search_pooled

        req = self.request
        pools = req.pools
        assert pools is not None
        result = search_pooled(req.model, pools, req.job, req.space, self.top, self.headroom_bytes, progress)
        verdict = result.verdict()
        alone = tuple(
            PoolAlone(pool=p.name, gpus=p.gpus, device=p.device.name,
                      **({"tokens_per_s": r.plans[0].prediction.tokens_per_s,
                          "step_time_s": r.plans[0].prediction.step_time_s} if r.plans else
                         {"tokens_per_s": None, "reason": r.why_none()}))
            for p, r in zip(pools.pools, result.alone, strict=True))
        return SearchResult(
            request=req, plans=self._ranked(result.plans), stats=result.stats,
            headroom_bytes=self.headroom_bytes, headroom_default=self.headroom_default,
            reason=None if result.plans else verdict,
            pools=Pools(cluster=pools.name, verdict=verdict, alone=alone, result=result))

    def _sweep(self, whatif: _WhatIf, progress: Progress) -> SearchResult:
        from autoplan.whatif.sweep import constrain, meets, sweep

        req = self.request
        device = req.cluster.device
        price = self.price_per_gpu_hour
        assert self.headroom_bytes is not None
        result = sweep(req.model, req.clusters, req.job, req.space, train_tokens=whatif.train_tokens,
                       objective=whatif.objective, price_per_gpu_hour=price, top_k=self.top,
                       min_headroom_bytes=self.headroom_bytes, progress=progress,
                       asynchronous=self.async_checkpoint, deadline_days=whatif.deadline,
                       budget_usd=whatif.budget)
        limits = constrain(result.front, whatif.objective, deadline_days=whatif.deadline,
                           budget_usd=whatif.budget)
        ranked = [p for p in result.ranked() if all(meets(p, whatif.deadline, whatif.budget))][:self.top]
        labels = {p.gpus: layout_text(p.plan) + (f" offload {offload_text(p.plan)}" if p.plan.offload.any
                                                 else "")
                  for p in result.points}
        summary = {
            "tokens": whatif.train_tokens,
            "objective": whatif.objective.value,
            "gpus": [c.gpus for c in req.clusters],
            "price_per_gpu_hour": price,
            "price_source": ("--price" if whatif.price is not None
                             else f"device {device.name}" if price is not None else None),
            "pue": req.cluster.pue,
            "deadline_days": whatif.deadline,
            "budget_usd": whatif.budget,
            "binding": list(limits.binding),
            "best_gpus": limits.chosen.gpus if limits.chosen is not None else None,
            "reason": limits.reason,
        }
        train = TrainSweep(summary=summary, sweep=result, limits=limits, labels=labels, space=req.space.name,
                           price_per_gpu_hour=price)
        plans = tuple(RankedPlan(rank=i, plan=p.plan, prediction=p.prediction, space=req.space.name)
                      for i, p in enumerate(ranked, start=1))
        reason = result.why_none() if not result.points else None if plans else limits.reason
        return SearchResult(request=req, plans=plans, stats=result.stats(),
                            headroom_bytes=self.headroom_bytes, headroom_default=self.headroom_default,
                            reason=reason, train=train)


def _launcher_free(req: Request, headroom: float, no_offload: bool) -> Any:
    """The launcher-free space's best plan (``--space any``), searched beside a search of
    the launchers' spaces (``forking.beside``: in a second process where one runs) to say
    where it is faster; None for any other search."""
    if not req.space.parts:
        return None
    from autoplan import forking
    from autoplan.search.engine import search as engine_search
    from autoplan.search.launchable import ANY, resolve_space
    from autoplan.vocab import NO_OFFLOAD

    free = resolve_space(ANY)
    # the choices the user fixed hold for it too: the stack, the modules, no offload
    free = dataclasses.replace(free, stack=req.space.stack, recompute_modules=req.space.recompute_modules,
                               offload=(NO_OFFLOAD,) if no_offload else free.offload)
    return forking.beside(functools.partial(engine_search, req.model, req.cluster, req.job, free, 1,
                                            headroom))


def prepare_search(
    job: str | Path | None = None,
    *,
    model: str | Path | Model | None = None,
    cluster: Any = None,
    gpus: int | str | Sequence[int] | None = None,
    global_batch: int | None = None,
    seq_len: int | None = None,
    dtype: Dtype | str | None = None,
    space: str | Path | None = None,
    launcher: str | None = None,
    moe_imbalance: float | None = None,
    top: int = 10,
    profile: str | Path | None = None,
    stack: str | Path | None = None,
    min_headroom: float | None = None,
    train_tokens: float | None = None,
    objective: Objective | str | None = None,
    price: float | None = None,
    deadline: float | None = None,
    budget: float | None = None,
    no_offload: bool = False,
    allow_bf16_states: bool = False,
    recompute_modules: str | Sequence[RecomputeModule | str] | None = None,
    async_checkpoint: bool = False,
) -> SearchJob:
    """Every option of :func:`search` checked and its request built, without searching."""
    from autoplan.commands.request import build_request
    from autoplan.kernels.memory import default_headroom_bytes
    from autoplan.units import GiB
    from autoplan.vocab import NO_OFFLOAD

    goal = _objective(objective)
    check_top(top)
    check_at_least("--min-headroom", min_headroom, 0.0)
    counts = gpu_counts(gpus)
    modules = None if recompute_modules is None else recompute_modules_option(recompute_modules)
    space_ref, profile_path, stack_ref = (None if space is None else str(space), path_or_none(profile),
                                          None if stack is None else str(stack))
    with naming(("--space", space_ref), ("--profile", profile_path), ("--stack", stack_ref)):
        req = build_request(path_or_none(job), model=ref(model), cluster=ref(cluster),
                            gpus=None if counts is None else counts[0] if len(counts) == 1 else counts,
                            global_batch=global_batch, seq_len=seq_len, dtype=training_dtype(dtype),
                            space=space_ref, moe_imbalance=moe_imbalance, profile=profile_path,
                            stack=stack_ref, recompute_modules=modules, launcher=launcher,
                            train_flags=(("--train-tokens", train_tokens),
                                         ("--objective", goal and goal.value),
                                         ("--price", price), ("--deadline", deadline),
                                         ("--budget", budget)))
    whatif = _WhatIf.from_options_and_file(req.train, train_tokens, goal, price, deadline, budget)
    if no_offload:
        req = dataclasses.replace(req, space=req.space.changed(offload=(NO_OFFLOAD,)))
    if allow_bf16_states:
        from autoplan.search.launchable import with_bf16_states

        req = dataclasses.replace(req, space=with_bf16_states(req.space))
    given = dict(request=req, top=top, headroom_default=min_headroom is None, whatif=whatif,
                 no_offload=no_offload, async_checkpoint=async_checkpoint)
    if req.pools is not None:
        if whatif is not None:
            raise InputError.single("--train-tokens", "", f"cluster {req.pools.name} has pools: "
                                    "time to train is answered for one kind of GPU")
        headroom = None if min_headroom is None else min_headroom * GiB
        smallest = min(p.device.mem_bytes for p in req.pools.pools)
        if headroom is not None and headroom >= smallest:
            raise InputError.single("--min-headroom", "", f"expected less than the smallest "
                                    f"device's {smallest / GiB:.0f} GiB, got {min_headroom:g}")
        return SearchJob(headroom_bytes=headroom, **given)  # type: ignore[arg-type]
    if async_checkpoint and whatif is None:
        raise InputError.single("--async-checkpoint", "", "needs --train-tokens (the run it prices)")
    if async_checkpoint and not (req.cluster.fails and req.cluster.host_link_Bps):
        raise InputError.single("--async-checkpoint", "", f"cluster {req.cluster.name} gives no "
                                "reliability, storage and host link (host_link_GBps) to cost it")
    if whatif is None and len(req.clusters) > 1:
        raise InputError.single("--gpus", "", "a sweep over GPU counts answers how long and how "
                                              "much: give --train-tokens too")
    device = req.cluster.device
    headroom = (min_headroom * GiB if min_headroom is not None else default_headroom_bytes(device.mem_bytes))
    if headroom >= device.mem_bytes:
        raise InputError.single("--min-headroom", "", f"expected less than the device's "
                                f"{device.mem_bytes / GiB:.0f} GiB, got {min_headroom:g}")
    prepared = SearchJob(headroom_bytes=headroom, **given)  # type: ignore[arg-type]
    if whatif is not None:
        from autoplan.whatif.economics import Objective

        if prepared.price_per_gpu_hour is None and whatif.budget is not None:
            raise InputError.single("--budget", "", f"{device.name} has no price_per_gpu_hour in its "
                                                    f"device file: give --price")
        if whatif.objective is Objective.ENERGY and device.power_load_W is None:
            raise InputError.single("--objective", "", f"energy needs {device.name}'s power_W "
                                                       f"(load, idle) in its device file")
    return prepared


def search(
    job: str | Path | None = None,
    *,
    model: str | Path | Model | None = None,
    cluster: Any = None,
    gpus: int | str | Sequence[int] | None = None,
    global_batch: int | None = None,
    seq_len: int | None = None,
    dtype: Dtype | str | None = None,
    space: str | Path | None = None,
    launcher: str | None = None,
    moe_imbalance: float | None = None,
    top: int = 10,
    profile: str | Path | None = None,
    stack: str | Path | None = None,
    min_headroom: float | None = None,
    train_tokens: float | None = None,
    objective: Objective | str | None = None,
    price: float | None = None,
    deadline: float | None = None,
    budget: float | None = None,
    no_offload: bool = False,
    allow_bf16_states: bool = False,
    recompute_modules: str | Sequence[RecomputeModule | str] | None = None,
    async_checkpoint: bool = False,
    progress: Progress | None = None,
) -> SearchResult:
    """``autoplan search``: the plans that fit, ranked by predicted throughput.

    ``job``: a job file (its model, cluster, job, gpus, space, train); each option
    overrides its field, as the command's flags do (``result.notes`` says where). ``model``
    and ``cluster``: a built-in name, a descriptor path (a HuggingFace config.json for a
    model) or an object (:class:`~autoplan.descriptors.model.Model`, a Cluster). ``gpus``:
    one count, or several (``[64, 128]``, ``"64..1024"``), which needs ``train_tokens``.
    Raises :class:`~autoplan.errors.InputError` on bad input; a search that finds no plan
    returns a result whose ``ok`` is False and whose ``reason`` says why."""
    return prepare_search(
        job, model=model, cluster=cluster, gpus=gpus, global_batch=global_batch, seq_len=seq_len,
        dtype=dtype, space=space, launcher=launcher, moe_imbalance=moe_imbalance, top=top, profile=profile,
        stack=stack, min_headroom=min_headroom, train_tokens=train_tokens, objective=objective, price=price,
        deadline=deadline, budget=budget, no_offload=no_offload, allow_bf16_states=allow_bf16_states,
        recompute_modules=recompute_modules, async_checkpoint=async_checkpoint).run(progress)
