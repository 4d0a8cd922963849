"""A search space is data: what one launcher can actually run (searchspace/*.yaml)."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoplan.descriptors.job import MAX_GLOBAL_BATCH
from autoplan.descriptors.library import default_stack, resolve_stack
from autoplan.descriptors.stack import DEFAULT_STACK, Stack
from autoplan.descriptors.strict import Fields, did_you_mean, read_yaml, shown
from autoplan.errors import InputError, Problem
from autoplan.resources import searchspace_dir
from autoplan.schedules import Schedule
from autoplan.vocab import NO_OFFLOAD, CpComm, MoeDispatch, Offload, Recompute, RecomputeModule, ZeroStage


class StageShape(str, enum.Enum):
    """Which splits a launcher can express."""

    ANY = "any"
    """Every stage sized freely (torchtitan split points, DeepSpeed custom partition)."""
    FIRST_LAST = "first_last"
    """Middle stages all equal, first and last free (Megatron-LM
    --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers); a plan's
    own per-chunk layout is taken too (--pipeline-model-parallel-layout)."""
    UNIFORM = "uniform"
    """The uniform split only (``autoplan.plan.uniform_stages``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    name: str
    launcher: str  # the `export --to` target whose rules this space encodes, or "any"
    tp_max: int
    tp_within_nvlink: bool  # TP groups never leave an NVLink domain
    pp_max: int
    cp_max: int
    vpp_max: int
    micro_batches: tuple[int, ...]
    schedules: tuple[Schedule, ...]
    recompute: tuple[Recompute, ...]
    zero: tuple[ZeroStage, ...]
    zero_max_with_pp: ZeroStage  # highest ZeRO stage the launcher combines with pp > 1
    # the ZeRO stages tried where pp > 1 in place of ``zero`` up to ``zero_max_with_pp``,
    # where the launcher runs another sharding under a pipeline (torchtitan: FSDP2 keeps
    # parameters and gradients unsharded through the step, ZeRO-1: searchspace/torchtitan.yaml)
    zero_with_pp: tuple[ZeroStage, ...] = ()
    sequence_parallel: tuple[bool, ...]  # tried where tp > 1
    stage_shape: StageShape = StageShape.UNIFORM  # which uneven layer splits the launcher takes
    ep_max: int = 1  # expert parallel degree (mixture-of-experts models only)
    etp: tuple[str, ...] = ("tp",)  # expert tensor parallel: "1" (experts unsplit) and/or "tp"
    cp_comm: tuple[CpComm, ...] = (CpComm.RING,)  # context-parallel exchanges tried where cp > 1
    # the all-to-all exchange takes cp a multiple of the key-value heads per TP rank, each
    # head replicated (DeepSpeed-Ulysses); False: cp must divide them (Transformer Engine's
    # a2a asserts k.shape[-2] % cp_size == 0: Megatron-Core, searchspace/megatron.yaml)
    a2a_replicates_kv: bool = True
    # MoE token dispatchers the launcher runs; a search takes the fastest for each layout
    # with ep > 1 (``ep.dispatch_for``)
    moe_dispatch: tuple[MoeDispatch, ...] = (MoeDispatch.ALLTOALL,)
    # what selective recompute recomputes in this search (Megatron-Core's
    # --recompute-modules; empty: the attention core): one set, which where given is the
    # only one searched (``search --recompute-modules``; a space file's
    # ``recompute_modules``), in place of ``recompute_module_sets``
    recompute_modules: tuple[RecomputeModule, ...] = ()
    # the module sets searched for selective recompute (``recompute_module_sets: [[core_attn],
    # [core_attn, moe_act, layernorm, mla_up_proj], ...]``), each tried where the model has
    # every module it names (``parallel.rules.recompute_modules_problem``); () is the
    # attention core, Megatron-Core's default (:attr:`module_sets`)
    recompute_module_sets: tuple[tuple[RecomputeModule, ...], ...] = ((),)
    # Megatron-Core's EP A2A overlap (--overlap-moe-expert-parallel-comm): tried where its
    # rules let a plan run it (``parallel.ep``'s ep-overlap: ep > 1, no full recompute,
    # vpp >= 2 with pipelining)
    ep_overlap: tuple[bool, ...] = (False,)
    # also try bf16 gradient reduction and bf16 Adam moments (``Job.main_grads``,
    # ``Job.optimizer_states``) beside the job's own: ``search --allow-bf16-states``. The
    # master weights stay the job's, or where it leaves them unset the stack's (``Stack.states``)
    bf16_states: bool = False
    # plain data parallel (zero 0) with tensor or pipeline parallelism: False where the
    # launcher's DDP runs only one-dimensional (torchtitan: "DDP has not supported > 1D
    # parallelism", torchtitan/distributed/parallel_dims.py)
    plain_dp_with_model_parallel: bool = True
    # hybrid sharded data parallel (HSDP): also try ZeRO over the data-parallel ranks of one
    # node, replicated across nodes (``layout.dp_shard``; ``dp.hybrid_shards``)
    hybrid_shard: bool = False
    # what plans may keep in host memory (``offload: {optimizer: [...], activations: [...]}``),
    # every combination; the first is always no offload. ``search --no-offload`` keeps that one.
    offload: tuple[Offload, ...] = (NO_OFFLOAD,)
    # the software the plans run on: the space file's ``stack`` (its launcher's), else the
    # built-in space of the same name's, else the default; a job file or --stack may name another
    stack: Stack = field(default_factory=default_stack)
    # a union of spaces (the launchable default, ``autoplan.search.launchable``): each part
    # searched on its own stack and the plans ranked together; the union's own fields are
    # its first part's, read by nothing that searches
    parts: tuple[SearchSpace, ...] = ()

    @property
    def each(self) -> tuple[SearchSpace, ...]:
        """The spaces a search of this one searches: its parts, or itself."""
        return self.parts or (self,)

    def changed(self, **changes: Any) -> SearchSpace:
        """This space with ``changes`` (``dataclasses.replace``'s), made to each part of a
        union too."""
        parts = tuple(p.changed(**changes) for p in self.parts)
        return dataclasses.replace(self, **changes, parts=parts)

    @property
    def module_sets(self) -> tuple[tuple[RecomputeModule, ...], ...]:
        """The module sets selective recompute is searched with: ``recompute_modules``
        where given (one set), else ``recompute_module_sets``."""
        return (self.recompute_modules,) if self.recompute_modules else self.recompute_module_sets


def _choices(f: Fields, key: str, kind: Any) -> tuple:
    raw = f.raw(key)
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        f.fail(key, f"expected a non-empty list, got {shown(raw)}")
        return ()
    sub = f.child(key, {str(i): v for i, v in enumerate(raw)})
    values = []
    for i in range(len(raw)):
        value = sub.enum(str(i), kind) if kind is not bool else sub.bool(str(i))
        if value is not None:
            values.append(value)
    return tuple(dict.fromkeys(values))


def read_space(data: Any, source: str) -> SearchSpace:
    problems: list[Problem] = []
    top = Fields(data, source, "", problems)
    f = top.child("searchspace", top.raw("searchspace"))
    top.close()
    name = f.name("name")
    launcher = f.str("launcher", "any")
    tp = f.child("tp", f.raw("tp"))
    tp_max, within = tp.int("max", min=1), tp.bool("within_nvlink", True)
    tp.close()
    pp_max, cp_max, vpp_max = (f.int(k, min=1) for k in ("pp_max", "cp_max", "vpp_max"))
    micro = f.int_list("micro_batch", min=1, max=MAX_GLOBAL_BATCH)  # a micro-batch is of the batch
    schedules = _choices(f, "schedules", Schedule)
    recompute = _choices(f, "recompute", Recompute)
    zero = _choices(f, "zero", ZeroStage)
    zero_pp = f.enum("zero_max_with_pp", ZeroStage, ZeroStage.PARAMETERS)
    zero_with_pp = _choices(f, "zero_with_pp", ZeroStage) if f.has("zero_with_pp") else ()
    sp = _choices(f, "sequence_parallel", bool)
    shape = f.enum("stages", StageShape, StageShape.UNIFORM)
    ep_max = f.int("ep_max", 1, min=1)
    etp = _etp_choices(f)
    cp_comm = _choices(f, "cp_comm", CpComm) if f.has("cp_comm") else (CpComm.RING,)
    replicates_kv = f.bool("a2a_replicates_kv", True)
    dispatch = (_choices(f, "moe_dispatch", MoeDispatch) if f.has("moe_dispatch")
                else (MoeDispatch.ALLTOALL,))
    modules = _choices(f, "recompute_modules", RecomputeModule) if f.has("recompute_modules") else ()
    module_sets = _module_sets(f)  # (a recompute_modules set, where given, is searched alone)
    overlap = _choices(f, "ep_overlap", bool) if f.has("ep_overlap") else (False,)
    bf16 = f.bool("bf16_states", False)
    plain_dp_mp = f.bool("plain_dp_with_model_parallel", True)
    hybrid = f.bool("hybrid_shard", False)
    offloads = _offload_choices(f)
    stack = default_stack()
    try:
        stack = resolve_stack(f.raw("stack", _builtin_stack_name(name, source)), source,
                              f.key_path("stack"))
    except InputError as exc:
        problems.extend(exc.problems)
    f.close()
    if problems:
        raise InputError(problems)
    return SearchSpace(
        name=name, launcher=launcher, tp_max=tp_max, tp_within_nvlink=within, pp_max=pp_max,
        cp_max=cp_max, vpp_max=vpp_max, micro_batches=tuple(sorted(set(micro))),
        schedules=tuple(s for s in Schedule if s in schedules),
        recompute=tuple(r for r in Recompute if r in recompute),
        zero=tuple(z for z in ZeroStage if z in zero), zero_max_with_pp=zero_pp,
        zero_with_pp=tuple(z for z in ZeroStage if z in zero_with_pp),
        sequence_parallel=tuple(sorted(sp, reverse=True)), stage_shape=shape,
        ep_max=ep_max, etp=etp, cp_comm=tuple(c for c in CpComm if c in cp_comm), stack=stack,
        a2a_replicates_kv=replicates_kv,
        moe_dispatch=tuple(d for d in MoeDispatch if d in dispatch),
        recompute_modules=tuple(m for m in RecomputeModule if m in modules),
        recompute_module_sets=module_sets, ep_overlap=tuple(sorted(overlap)), bf16_states=bf16,
        plain_dp_with_model_parallel=plain_dp_mp, hybrid_shard=hybrid, offload=offloads,
    )


def _builtin_stack_name(name: str, source: str) -> str:
    """The stack the built-in space ``name`` names (a space file of the same name that
    names none runs on it, as before the built-in files named theirs), else the default."""
    path = searchspace_dir() / f"{name}.yaml"
    if not name or not path.is_file() or Path(source) == path:
        return DEFAULT_STACK
    data = read_yaml(path)
    section = data.get("searchspace") if isinstance(data, dict) else None
    stack = section.get("stack") if isinstance(section, dict) else None
    return stack if isinstance(stack, str) else DEFAULT_STACK


def _module_sets(f: Fields) -> tuple[tuple[RecomputeModule, ...], ...]:
    """``recompute_module_sets: [[core_attn], [core_attn, moe_act, layernorm, mla_up_proj]]``:
    each a non-empty list of modules, in the enum's order; [core_attn] alone is the
    default, (); a set listed twice is searched once."""
    key = "recompute_module_sets"
    if not f.has(key):
        return ((),)
    raw = f.raw(key)
    if not isinstance(raw, list) or not raw:
        f.fail(key, f"expected a non-empty list of module lists, got {shown(raw)}")
        return ((),)
    names = " | ".join(m.value for m in RecomputeModule)
    out = []
    for i, each in enumerate(raw):
        if not isinstance(each, list) or not each:
            f.fail(f"{key}[{i}]", f"expected a non-empty list of modules, got {shown(each)}")
            continue
        mods = set()
        for j, name in enumerate(each):
            module = next((m for m in RecomputeModule
                           if isinstance(name, str) and name.lower() == m.value), None)
            if module is None:
                f.fail(f"{key}[{i}][{j}]", f"expected one of {names}, got {shown(name)}")
            else:
                mods.add(module)
        ordered = tuple(m for m in RecomputeModule if m in mods)
        out.append(() if ordered == (RecomputeModule.CORE_ATTN,) else ordered)
    return tuple(dict.fromkeys(out)) or ((),)


def _offload_choices(f: Fields) -> tuple[Offload, ...]:
    """``offload: {optimizer: [false, true], activations: [0.0, 0.5]}``: every combination,
    no offload first."""
    if not f.has("offload"):
        f.raw("offload", None)
        return (NO_OFFLOAD,)
    of = f.child("offload", f.raw("offload"))
    optimizer = _choices(of, "optimizer", bool) if of.has("optimizer") else (False,)
    fractions: list[float] = []
    raw = of.raw("activations", [0.0])
    if not isinstance(raw, list) or not raw or any(
            isinstance(a, bool) or not isinstance(a, int | float) or not 0.0 <= a <= 1.0
            for a in raw):
        of.fail("activations", f"expected a non-empty list of fractions from 0.0 to 1.0, "
                               f"got {shown(raw)}")
    else:
        fractions = sorted({float(a) for a in raw})
    of.close()
    combos = {Offload(optimizer=o, activations=a) for o in optimizer for a in fractions or [0.0]}
    combos.add(NO_OFFLOAD)
    return tuple(sorted(combos, key=lambda c: (c.any, c.optimizer, c.activations)))


def _etp_choices(f: Fields) -> tuple[str, ...]:
    """``etp: [1, tp]``: expert layers unsplit, or split like the dense layers."""
    raw = f.raw("etp", ["tp"])
    if not isinstance(raw, list) or not raw or any(str(v) not in ("1", "tp") for v in raw):
        f.fail("etp", f"expected a non-empty list of 1 and/or tp, got {shown(raw)}")
        return ("tp",)
    return tuple(sorted({str(v) for v in raw}))


# built-in spaces renamed, by their former names (plan files and scripts name them)
FORMER_NAMES = {"default": "any"}


def builtin_spaces() -> list[str]:
    return sorted(p.stem for p in searchspace_dir().glob("*.yaml"))


def space_path(ref: str, source: str = "--space", field: str = "") -> Path:
    """The file of a built-in space name (default, megatron, ...) or of a path."""
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        return Path(ref)
    names = builtin_spaces()
    ref = FORMER_NAMES.get(ref, ref)
    if ref not in names:
        raise InputError.single(source, field, f"unknown search space {shown(ref)}"
                                f"{did_you_mean(ref, names)}; built-in: {', '.join(names)}")
    return searchspace_dir() / f"{ref}.yaml"


def load_space(ref: str, source: str = "--space", field: str = "") -> SearchSpace:
    """A built-in space name (default, megatron, ...) or a path to a space file."""
    path = space_path(ref, source, field)
    return read_space(read_yaml(path), str(path))
