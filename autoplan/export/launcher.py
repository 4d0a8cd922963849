"""The training launchers autoplan exports to, one file each, found by looking.

A launcher is one module of the ``autoplan.export`` package that defines
``LAUNCHER = LauncherSpec(...)``: its name, the search space whose rules it obeys
(``searchspace/<space>.yaml``), the stack its plans run on, the plan features it runs
beyond those rules (and why it refuses the others), its export writer, its Slurm
program, and how ``tune`` launches it and reads its log. Nothing else lists the
launchers: :func:`specs` imports every module of the package (``pkgutil.iter_modules``
over the package's ``__path__``) and collects the specs they define, so a new launcher
is a new file (``tests/unit/test_launcher_registry.py`` adds one). A launcher kept
outside the tree is found the same way: put its folder on ``autoplan.export.__path__``
(the import system's own search path for the package's modules) and call
:func:`refresh`.

:class:`Target` and :class:`Launcher` read as ``str`` enums (``Target.MEGATRON``,
``Launcher("torchtitan")``, iteration in order) over what the files register: ``Target``
is what ``autoplan export --to`` writes for a training plan (every launcher, and
``slurm``: an sbatch script around one of them), ``Launcher`` what a Slurm job runs
(the launchers with a Slurm program). Their members are found on first use. The order is
the specs' ``order``, then their names: Megatron-LM, NeMo, DeepSpeed, torchtitan, then
the others.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from autoplan.descriptors.model import Model
from autoplan.errors import InputError
from autoplan.plan import Plan
from autoplan.registry import Named, _Registry
from autoplan.resources import searchspace_dir
from autoplan.vocab import MasterWeights, StateDtype

Problems = list[tuple[str, str]]  # (plan field, why), as ``parallel.rules.space_problems``
Check = Callable[[Plan], Problems]


def no_problems(plan: Plan) -> Problems:
    return []


def no_model_problems(model: Model) -> Problems:
    return []


# --------------------------------------------------------------------------- plan features


@dataclass(frozen=True, slots=True, eq=False)
class Feature:
    """Something a plan may ask for that no search space rule covers: a launcher runs it
    (``LauncherSpec.runs``) or refuses it with ``refusal`` (``{target}``: the export's
    name). These are Megatron-Core's knobs and multi-pool placement; the texts say so."""

    field: str  # the plan field an export refusal names
    used: Callable[[Plan], bool]  # whether the plan asks for it
    refusal: str


RECOMPUTE_MODULES = Feature(
    "recompute_modules", lambda p: bool(p.recompute_modules),
    "selective recompute by module is Megatron-Core's (--recompute-modules); export to megatron or nemo")
MAIN_GRADS = Feature(
    "job.main_grads", lambda p: p.states.main_grads is not StateDtype.FP32,
    "bf16 gradient reduction is exported to Megatron-LM (--grad-reduce-in-bf16) and NeMo only")
MASTER_WEIGHTS = Feature(
    "job.master_weights", lambda p: p.states.master_weights is not MasterWeights.FP32,
    "master weights other than an fp32 copy are apex's distributed_fused_adam (NeMo 1.x: "
    "export to nemo with stack nemo-1) or, as int16 remainders, Megatron-Core's precision-aware "
    "optimizer; export to megatron or nemo")
OPTIMIZER_STATES = Feature(
    "job.optimizer_states", lambda p: p.states.optimizer_states is not StateDtype.FP32,
    "bf16 optimizer states are Megatron-Core's precision-aware optimizer (Megatron-LM "
    "--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16); export to "
    "megatron or nemo")
EP_OVERLAP = Feature(
    "ep_overlap", lambda p: p.ep_overlap,
    "EP all-to-all overlap is Megatron-Core's (--overlap-moe-expert-parallel-comm); export to "
    "megatron or nemo")
PLACEMENT = Feature(
    "placement", lambda p: p.placement is not None,
    "{target} has no way to name which nodes run which pipeline stages; export to megatron or "
    "torchtitan (torchrun node ranks, named per pool in the script)")
# in the order an export's refusals list them
FEATURES = (RECOMPUTE_MODULES, MAIN_GRADS, MASTER_WEIGHTS, OPTIMIZER_STATES, EP_OVERLAP, PLACEMENT)


# --------------------------------------------------------------------------- the spec


@dataclass(frozen=True, slots=True, kw_only=True)
class SlurmProgram:
    """What a Slurm job (``export/slurm.py``: one torchrun per node, c10d rendezvous) runs
    of a launcher: shell lines before the launch, the words after torchrun's options, and
    the files beside the script (found through ``$SLURM_SUBMIT_DIR``)."""

    setup: tuple[str, ...]
    words: tuple[str, ...]
    files: Mapping[str, str] = field(default_factory=dict)
    names_run: bool = False  # the setup sets RUN_NAME itself (else the job script does)
    before: tuple[str, ...] = ()  # lines just before the launch (a shellcheck directive)


@dataclass(frozen=True, slots=True, kw_only=True)
class TuneLaunch:
    """How ``tune``'s launch runners (torchrun, slurm) run a launcher's export and read
    back what it measured. ``steps`` is every step the run is to take (warm-up, timed and
    one more: the run is stopped once the timed ones are logged); ``workdir`` the trial's
    absolute folder, where the export's files are."""

    log_format: str  # the format ``tune/logs.py`` reads its log as (``logs.FORMATS``)
    note: str  # what --launcher's help says of it ("" for nothing)
    # the command that runs it on this node from ``workdir`` (every path absolute)
    command: Callable[[Plan, int, Path], list[str]]
    # more words for the launch inside a batch job (its Slurm script passes them on)
    job_args: Callable[[int], list[str]]
    # the environment the export's scripts read (run length, paths), every path absolute
    environment: Callable[[int, Path], dict[str, str]]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class LauncherSpec:
    """Everything autoplan asks of one training launcher (module doc)."""

    name: str  # as ``export --to``, ``--launcher`` and a plan's launchers spell it
    summary: str  # what its export writes, in a line
    space: str  # the search space whose rules it obeys: searchspace/<space>.yaml
    stack: str  # the stack its plans run on (profiles/stacks/<stack>.yaml)
    export: Callable[[Plan], dict[str, str]]  # the plan's files: {filename: text}
    source: str  # the launcher's own file its rules were read from (cited)
    # what it cannot run beyond the space's rules and the features: (field, why)
    problems: Check = no_problems
    # of those, what it cannot build of a model whatever the plan (a family's layers), as
    # (model field, why): ``search --launcher`` refuses such a model before it searches
    model_problems: Callable[[Model], Problems] = no_model_problems
    # the features (``FEATURES``) it runs, each with what else it then needs (None: nothing);
    # every other feature a plan uses is refused with the feature's own refusal
    runs: Mapping[Feature, Check | None] = field(default_factory=dict)
    slurm: Callable[[Plan], SlurmProgram] | None = None  # None: no Slurm job runs it
    tune: TuneLaunch | None = None  # None: tune does not launch it
    order: int = 100  # where it is listed (lower first; then by name)

    @property
    def attr(self) -> str:
        """Its Python name (``Launcher.MEGATRON``)."""
        return re.sub(r"\W", "_", self.name).upper()

    def refusals(self, plan: Plan, target: str | None = None) -> Problems:
        """What the plan asks of this launcher's features that it does not run, as
        (field, why); ``target`` names the export (a Slurm job runs no placement across
        pools: it refuses what its launcher would run)."""
        out: Problems = []
        for feature in FEATURES:
            if not feature.used(plan):
                continue
            wrapped = target is not None and feature is PLACEMENT
            if feature in self.runs and not wrapped:
                check = self.runs[feature]
                if check is not None:
                    out += check(plan)
            else:
                out.append((feature.field, feature.refusal.format(target=target or self.name)))
        return out


@dataclass(frozen=True, slots=True)
class _TargetSpec:
    """``Target``'s description of an export that wraps a launcher (slurm)."""

    name: str
    attr: str
    summary: str


SLURM = _TargetSpec("slurm", "SLURM", "an sbatch script around one of the launchers (torchrun, "
                                      "c10d rendezvous)")


# --------------------------------------------------------------------------- the registries


class _Found(_Registry):
    """A registry whose members are found on first use (:func:`specs`)."""

    def __iter__(cls) -> Iterator[Any]:
        specs()
        return super().__iter__()

    def __len__(cls) -> int:
        specs()
        return super().__len__()

    def __contains__(cls, item: object) -> bool:
        specs()
        return super().__contains__(item)

    def __call__(cls, value: Any) -> Any:
        specs()
        return super().__call__(value)

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("_") or _state.found:
            raise AttributeError(name)
        specs()
        return getattr(cls, name)


class Target(Named, metaclass=_Found):
    """What ``autoplan export --to`` writes for a training plan: each launcher's files,
    or ``slurm`` (a job around one). Compares and hashes as its name."""

    KIND = "training export target"
    spec: LauncherSpec | _TargetSpec

    # the built-in launchers, registered by their files, and the Slurm job
    MEGATRON: ClassVar[Target]
    NEMO: ClassVar[Target]
    DEEPSPEED: ClassVar[Target]
    TORCHTITAN: ClassVar[Target]
    ACCELERATE: ClassVar[Target]
    SLURM: ClassVar[Target]


class Launcher(Named, metaclass=_Found):
    """What a Slurm job runs (``export --to slurm --launcher``): a launcher with a Slurm
    program (module doc). Compares and hashes as its name."""

    KIND = "launcher a Slurm job runs"
    spec: LauncherSpec

    MEGATRON: ClassVar[Launcher]
    DEEPSPEED: ClassVar[Launcher]
    TORCHTITAN: ClassVar[Launcher]


class _State:
    found: tuple[LauncherSpec, ...] | None = None  # None: not looked for yet
    busy = False  # looking now (a launcher's file asking for the registry while it loads)


_state = _State()


def _package() -> Any:
    """The ``autoplan.export`` package (imported by name: it imports this module)."""
    return importlib.import_module(__name__.rpartition(".")[0])


def _look() -> tuple[LauncherSpec, ...]:
    """Every ``LAUNCHER`` the package's modules define, in listing order."""
    package = _package()
    importlib.invalidate_caches()  # a module written since the last look
    found: dict[str, LauncherSpec] = {}
    for info in pkgutil.iter_modules(package.__path__):
        if info.name == __name__.rpartition(".")[2]:
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        spec = getattr(module, "LAUNCHER", None)
        if spec is None:
            continue
        if not isinstance(spec, LauncherSpec):
            raise TypeError(f"{module.__name__}.LAUNCHER is a {type(spec).__name__}, not a LauncherSpec")
        if spec.name in found or spec.name == SLURM.name:
            raise ValueError(f"{module.__name__}: a launcher named {spec.name!r} is registered already")
        found[spec.name] = spec
    return tuple(sorted(found.values(), key=lambda s: (s.order, s.name)))


def _sync(kind: Any, wanted: list[tuple[str, str, Any]]) -> None:
    """Make ``kind``'s members exactly ``wanted`` (name, attr, spec), in that order, keeping
    the member objects of names it had (``Target.MEGATRON is`` what it was)."""
    names = {name for name, _, _ in wanted}
    for member in list(kind._members.values()):
        if member.value not in names:
            kind._remove(member, member.spec.attr)
    for name, attr, spec in wanted:
        if name in kind._members:
            kind._members[name].spec = spec
        else:
            kind._add(name, attr, spec)
    kind._members = {name: kind._members[name] for name, _, _ in wanted}
    for rank, member in enumerate(kind._members.values()):
        member.rank = rank


def refresh() -> tuple[LauncherSpec, ...]:
    """Look for the launchers again (a module added or taken away since), and return them."""
    if _state.busy:
        raise RuntimeError("a launcher's module asked for the launcher registry while it loads")
    _state.busy = True
    try:
        found = _look()
        _sync(Target, [(s.name, s.attr, s) for s in found] + [(SLURM.name, SLURM.attr, SLURM)])
        _sync(Launcher, [(s.name, s.attr, s) for s in found if s.slurm is not None])
        _state.found = found
    finally:
        _state.busy = False
    return found


def specs() -> tuple[LauncherSpec, ...]:
    """The training launchers in order (Megatron-LM, NeMo, DeepSpeed, torchtitan, then the
    others), each with its ``name`` and ``space``."""
    if _state.found is None:
        return refresh()
    return _state.found


def names() -> tuple[str, ...]:
    return tuple(s.name for s in specs())


def get(name: str, source: str = "--launcher", field: str = "") -> LauncherSpec:
    """The launcher named ``name``, or an InputError naming ``source`` with the known ones."""
    for spec in specs():
        if spec.name == name:
            return spec
    raise InputError.single(source, field, f"unknown launcher {name!r}; known: {', '.join(names())}")


def slurm_launchers() -> tuple[LauncherSpec, ...]:
    """The launchers a Slurm job runs (``export --to slurm --launcher``; ``Launcher``)."""
    return tuple(s for s in specs() if s.slurm is not None)


def space_file(spec: LauncherSpec) -> Path:
    return searchspace_dir() / f"{spec.space}.yaml"

