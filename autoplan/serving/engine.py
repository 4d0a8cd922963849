"""The serving engines autoplan knows, by name, as Vidur registers its schedulers.

One file per engine (``serving/engines/vllm.py``, ``sglang.py``, ``trtllm.py``) registers
an :class:`EngineSpec`: what a deployment costs on it: its batching limits and memory budget
by default (what the simulation admits against), its host time per iteration, how it caches
a model whose layers differ, the models it cannot run. How a plan is launched on it (the
command, its flags from the engine's own argument definitions, what a launch cannot express)
is the exports' and sits beside them: the engine's file in ``autoplan/export/engines/``
registers its :class:`autoplan.export.engines.launch.LaunchSpec`. The simulation, the
search, the plan files and the command line read the spec, never an engine's name, so
adding an engine is its cost file and its launch file (``tests/unit/test_engine_registry.py``
adds one). ``autoplan/serving/__init__.py`` registers the built-in ones.

Engines by version. What an engine does changes between releases (vLLM's async scheduling
on by default from 0.14, TensorRT-LLM's overlap scheduler and CUDA graphs with its PyTorch
backend from 1.0, default memory budgets), so an engine's file holds a table of its release
lines (:class:`EngineVersion`, ``VERSIONS``: the documented behaviour of each, with the
release notes or code it is read from) and, apart from it, the constants fitted on measured
runs per line (:class:`Fitted`, the file's ``FITTED``: host time per iteration and per
sequence, the kernels' time over the roofline's, the host time per kernel launched outside
a CUDA graph; ``benchmarks/serving_fit.py`` fits them). A line without a fitted entry takes
the constants of the newest fitted line before it (else the oldest after it).
:meth:`EngineSpec.at` resolves a release: None gives the newest fitted line (the default),
a release the newest line at or before it, a nightly build the newest line, a release
older than every line the oldest line (with a note). Release spellings:
:mod:`autoplan.serving.versions`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import ClassVar

from autoplan.descriptors.hardware import Device
from autoplan.descriptors.model import LINEAR_MIXERS, MAMBA, SLIDING, Model
from autoplan.registry import Named
from autoplan.serving.instances import Deployment
from autoplan.serving.versions import Version, VersionError, parse_version


@dataclass(frozen=True, slots=True)
class EngineDefaults:
    """An engine's batching limits and memory budget when the plan leaves them unset."""

    max_num_seqs: int
    max_batched_tokens: int
    chunked_prefill: bool
    # share of the GPU's memory the engine may fill with weights, activations and KV
    # cache (``memory_of_free``: of what is free after the weights instead)
    memory_fraction: float
    memory_of_free: bool = False
    # admission policy: the share of a request's output tokens whose KV cache admission
    # sets aside (0: admit on the prompt alone and preempt when the cache runs out)
    reserve_output: float = 0.0
    # where the default ``memory_fraction`` leaves no KV cache beside the weights, the
    # value a launch sets the engine's flag to instead (its launch script writes it): the
    # weights of a deployment that only just fits take what the default keeps back for
    # headroom, as operators do (NVIDIA's measured runs of DeepSeek-R1 FP8 on 4 B200 under
    # SGLang ran where its default of about 0.86 leaves none). 0.95 keeps 5% back for
    # fragmentation and CUDA graphs: a modelling choice, not an engine's number
    raised_fraction: float = 0.95


def _overlap_always(deployment: Deployment) -> str | None:
    return None


# what the engines' fits on NVIDIA's measured closed loops name as their source (the lines
# of each engine file's FITTED that benchmarks/serving_silicon_fit.py wrote)
SILICON_FIT = ("serving_silicon.csv (NVIDIA's measured runs on H100, B200 and GB200; the H200, B300 "
               "and GB300 rows reserved), every second distinct measurement, with its benchmark "
               "clients' lengths: python benchmarks/serving_silicon_fit.py --every 2 (2026-11-29)")


class StateReuse(str, enum.Enum):
    """What an engine's prefix cache reuses of a model with recurrent layers (GDN, KDA,
    Mamba-2): their state after a prefix must be kept to skip the prefix, and engines keep
    it at some positions only."""

    NONE = "none"  # no state kept: the whole prompt is computed again
    BLOCKS = "blocks"  # a state at every (hybrid) block boundary: the prefix in whole blocks
    # a state at the end of each scheduler step that ends on the block grid (vLLM's
    # ``mamba_cache_mode`` align: prefills scheduled in whole blocks, a step of at most
    # max_batched_tokens): the prefix in whole steps
    STEPS = "steps"


@dataclass(frozen=True, slots=True)
class HybridCache:
    """How an engine release caches a model whose layers differ (serving.kinds reads it):
    whether sliding-window layers hold only their window of KV (else every token, as a full
    layer does), what its prefix cache reuses of recurrent layers' states, whether it sizes
    its KV blocks so that one holds a recurrent layer's state (vLLM: the prefix cache then
    reuses whole such blocks), and where each fact is read."""

    windowed: bool = False
    reuse: StateReuse = StateReuse.NONE
    state_blocks: bool = False
    source: str = "not described for this engine: sliding layers as full ones, no recurrent state reused"


def _plain_hybrid(release: str, model: Model) -> HybridCache:
    return HybridCache()


def release_version(release: str) -> Version:
    """A release as the engine facts compare it: an engine without release lines names none
    (""), taken as its newest."""
    return parse_version(release) if release.strip() else parse_version("nightly")


def _runs_every_model(release: str, model: Model) -> list[tuple[str, str]]:
    return []


def uses_recurrent(model: Model) -> bool:
    """Whether any layer keeps a recurrent state (GDN, KDA, Mamba-2)."""
    return any(m in LINEAR_MIXERS for m in model.mixers)


def uses_sliding(model: Model) -> bool:
    return SLIDING in model.mixers


def mamba_only(model: Model) -> bool:
    """Recurrent layers, all of them Mamba-2."""
    recurrent = {m for m in model.mixers if m in LINEAR_MIXERS}
    return recurrent == {MAMBA}


@dataclass(frozen=True, slots=True, kw_only=True)
class Fitted:
    """One release line's constants fitted on measured runs (an engine file's ``FITTED``,
    keyed by the line's version; ``benchmarks/serving_fit.py`` writes them)."""

    # host time per iteration: the scheduler, input preparation, sampling and output
    # processing between two forward passes
    host_step_s: float
    # host time per sequence an iteration samples (sampling, detokenizing, streaming the
    # token out): it grows with the batch where the per-iteration part does not
    host_seq_s: float = 0.0
    # the engine's kernels' time over the roofline's at the device's rates (GEMMs, experts,
    # attention, KV reads, logits): >1 where they reach less of the rates than modelled
    kernel_scale: float = 1.0
    # host time per kernel an iteration launches outside a CUDA graph (the GPU runs no
    # faster than the host issues them): 0 where not fitted
    launch_s: float = 0.0
    # the front end's time per request, one request after another (the API server's
    # HTTP handling, tokenizing the prompt and routing it: vLLM's AsyncLLM process, SGLang's
    # TokenizerManager, the OpenAI server of trtllm-serve / Dynamo's frontend): a request
    # reaches the scheduler this long after the front end is free (serving.simulate)
    request_s: float = 0.0
    source: str  # the rows and command they were fitted with, or why they are a prior
    prior: bool = False  # set by hand, not fitted on measured runs
    # the constants are the host time an iteration shows in series with the GPU's work (set
    # before the overlap scheduler was modelled): the line's ``host_hidden`` is not applied
    # to them again
    serial: bool = False
    # calibrated on the user's own measured runs (``autoplan calibrate``'s file, given to
    # serve or evaluate with --calibration): what they were calibrated on, "" for the file's own
    calibration: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineVersion:
    """One release line of an engine: what its releases from ``version`` on do by default
    (documented: ``source`` names the release notes or code), and the constants fitted for
    it (:class:`Fitted`, filled in by :class:`EngineSpec` from the engine's ``FITTED``)."""

    version: str  # the line's first release
    source: str = ""  # where its documented behaviour is read
    # share of the per-iteration host time the overlap scheduler hides behind the GPU's
    # work: the CPU prepares iteration i+1 while the GPU runs i, so an iteration takes
    # max(GPU, hidden host) + the rest of the host time (serving.cost.iteration_seconds)
    host_hidden: float = 0.0
    # why the overlap is off for a deployment (None: on), e.g. vLLM's async scheduling
    # with pipeline parallelism
    overlap_off: Callable[[Deployment], str | None] = _overlap_always
    # decode iterations replayed as CUDA graphs (no kernel launched from the host): the
    # decode-only iterations of at most ``graph_max_batch`` sequences (0: any batch)
    cuda_graphs: bool = True
    graph_max_batch: int = 0
    # a prefill batch runs alone whenever a prompt can be scheduled, the decodes waiting
    # (serving.scheduler.SchedulerConfig.prefill_first: SGLang); False: mixed batches
    prefill_first: bool = False
    defaults: Callable[[Device], EngineDefaults] | None = None  # None: the spec's
    # the fitted constants (EngineSpec fills them from FITTED)
    host_step_s: float = 0.0
    host_seq_s: float = 0.0
    kernel_scale: float = 1.0
    launch_s: float = 0.0
    request_s: float = 0.0
    fitted: Fitted | None = None  # the FITTED entry they come from (None: the spec's own)
    fitted_line: str = ""  # the line that entry is keyed by

    @property
    def key(self) -> Version:
        return parse_version(self.version)

    @property
    def is_fitted(self) -> bool:
        """Whether this line's own constants were fitted on measured runs (not a prior,
        not taken from another line)."""
        return self.fitted is not None and not self.fitted.prior and self.fitted_line == self.version

    def hidden_share(self, deployment: Deployment) -> float:
        """The share of host time hidden for ``deployment``: the line's, or 0 where the
        overlap is off for it or the constants are already the host time shown (serial)."""
        if self.host_hidden <= 0.0 or (self.fitted is not None and self.fitted.serial):
            return 0.0
        return 0.0 if self.overlap_off(deployment) is not None else self.host_hidden

    def engine_defaults(self, device: Device) -> EngineDefaults:
        assert self.defaults is not None, "EngineSpec fills every line's defaults"
        return self.defaults(device)


@dataclass(frozen=True, slots=True)
class Resolved:
    """A release asked for and the line that predicts it."""

    line: EngineVersion
    asked: str | None  # as given (None: the default)
    note: str | None = None  # said where the release is older than every line

    @property
    def release(self) -> str:
        """The release a plan runs: the one asked for, else the default line's."""
        return self.asked if self.asked is not None else self.line.version


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """Everything autoplan needs of one serving engine."""

    name: str  # as plan files, ``--engine`` and ``export --to`` spell it
    attr: str  # its Python name (``Engine.VLLM``)
    doc: str
    defaults: Callable[[Device], EngineDefaults]  # its server's defaults on a device
    # an engine without a version table: its constants (:class:`Fitted`'s), one line of
    # its own; with one, unused: each line's are set from ``fitted`` (:meth:`at`)
    host_step_s: float = 0.0
    host_seq_s: float = 0.0
    kernel_scale: float = 1.0
    # tokens per KV cache block: prefix caching reuses whole blocks (vLLM's block_size 16,
    # SGLang's radix cache page_size 1, TensorRT-LLM's tokens_per_block 32)
    kv_block_tokens: int = 16
    # how a release caches a model whose layers differ (sliding windows, recurrent states;
    # :class:`HybridCache`), given the release and the model
    hybrid_cache: Callable[[str, Model], HybridCache] = _plain_hybrid
    # (field, why) for a model the release cannot run at all (a kind of layer it lacks), by
    # name: the plan readers, ``serve`` and the exports refuse it
    model_refusals: Callable[[str, Model], list[tuple[str, str]]] = _runs_every_model
    versions: tuple[EngineVersion, ...] = ()  # its release lines, oldest first (module doc)
    fitted: Mapping[str, Fitted] = field(default_factory=dict, compare=False)  # line -> constants
    _lines: tuple[EngineVersion, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # the lines resolved once (a memo, as a cached hash: ``lines`` reads it); no given
        # field is overwritten: a versioned engine's constants are its lines' (:meth:`at`)
        object.__setattr__(self, "_lines", _resolve_lines(self))

    @property
    def lines(self) -> tuple[EngineVersion, ...]:
        """The release lines with their constants, oldest first (one, versionless, for an
        engine without a table)."""
        return self._lines

    @property
    def default_line(self) -> EngineVersion:
        """The newest line whose constants were fitted on measured runs; where none is, the
        newest line with constants of its own (a prior); else the newest line."""
        for want in (lambda v: v.is_fitted, lambda v: v.fitted is not None and v.fitted_line == v.version):
            found = [v for v in self._lines if want(v)]
            if found:
                return found[-1]
        return self._lines[-1]

    def resolve(self, version: str | None) -> Resolved:
        """The line that predicts ``version`` (module doc); :class:`VersionError` for text
        that is no version."""
        if version is None:
            return Resolved(self.default_line, None)
        asked = parse_version(version)
        if not self.versions:  # one line: every release is predicted alike
            return Resolved(self._lines[0], version)
        if asked.nightly:
            return Resolved(self._lines[-1], version)
        at_or_before = [v for v in self._lines if v.key <= asked]
        if at_or_before:
            return Resolved(at_or_before[-1], version)
        oldest = self._lines[0]
        return Resolved(oldest, version, (f"{self.name} {version} is older than the oldest release line "
                                          f"autoplan describes ({oldest.version}): predicted as "
                                          f"{oldest.version}"))

    def at(self, version: str | None) -> EngineVersion:
        """The line that predicts ``version`` (None: the default line)."""
        return self.resolve(version).line

    def with_fitted(self, line: str, constants: Fitted) -> EngineSpec:
        """The spec with ``constants`` as the fitted entry of ``line`` (a fit's trial values;
        ``line`` a line of the table, or "" for an engine without one)."""
        if not self.versions:
            return dataclasses.replace(self, host_step_s=constants.host_step_s,
                                       host_seq_s=constants.host_seq_s, kernel_scale=constants.kernel_scale)
        assert any(v.version == line for v in self.versions), line
        return dataclasses.replace(self, fitted={**self.fitted, line: constants})


def _resolve_lines(spec: EngineSpec) -> tuple[EngineVersion, ...]:
    """The spec's lines, each with its defaults and the fitted constants it predicts with
    (its own entry, else the newest fitted line before it, else the oldest after it)."""
    if not spec.versions:
        own = Fitted(host_step_s=spec.host_step_s, host_seq_s=spec.host_seq_s,
                     kernel_scale=spec.kernel_scale, source="the engine's own constants")
        return (EngineVersion(version="", defaults=spec.defaults, host_step_s=own.host_step_s,
                              host_seq_s=own.host_seq_s, kernel_scale=own.kernel_scale, fitted=own),)
    lines = sorted(spec.versions, key=lambda v: v.key)
    if [v.version for v in lines] != [v.version for v in spec.versions]:
        raise ValueError(f"{spec.name}: release lines must be listed oldest first")
    unknown = [k for k in spec.fitted if all(v.version != k for v in lines)]
    if unknown or not spec.fitted:
        raise ValueError(f"{spec.name}: FITTED must key lines of its table (got {unknown or 'none'})")
    keyed = [v.version for v in lines if v.version in spec.fitted]
    out = []
    for v in lines:
        before = [k for k in keyed if parse_version(k) <= v.key]
        src = before[-1] if before else keyed[0]
        c = spec.fitted[src]
        out.append(dataclasses.replace(
            v, defaults=v.defaults or spec.defaults, host_step_s=c.host_step_s, host_seq_s=c.host_seq_s,
            kernel_scale=c.kernel_scale, launch_s=c.launch_s, request_s=c.request_s, fitted=c,
            fitted_line=src))
    return tuple(out)


class Engine(Named):
    """A registered serving engine (module doc). Compares and hashes as its name."""

    KIND = "serving engine"
    spec: EngineSpec

    # the built-in engines, registered by their files (autoplan/serving/engines/)
    VLLM: ClassVar[Engine]
    SGLANG: ClassVar[Engine]
    TRTLLM: ClassVar[Engine]



def register(spec: EngineSpec) -> Engine:
    """Make ``spec`` an engine every part of autoplan takes (its name must be new)."""
    return Engine._add(spec.name, spec.attr, spec)


def unregister(engine: Engine) -> None:
    """Forget an engine (tests that register one of their own)."""
    Engine._remove(engine, engine.spec.attr)


@contextmanager
def fitted_as(engine: Engine, trials: Mapping[str, Fitted]) -> Iterator[None]:
    """Predict with ``engine``'s release lines (the keys: a line's first release) fitted as
    ``trials`` instead of its file's ``FITTED`` (a fit's trial constants, a test's own), the
    registered spec restored after; the cost caches are cleared both ways, so no memo made
    with one set of constants answers for the other."""
    from autoplan import caches

    spec = engine.spec
    trial = spec
    for line, constants in trials.items():
        trial = trial.with_fitted(line, constants)
    engine.spec = trial
    caches.clear()
    try:
        yield
    finally:
        engine.spec = spec
        caches.clear()


def engine_defaults(engine: Engine, device: Device, version: str | None = None) -> EngineDefaults:
    """The engine's server defaults on ``device`` at ``version`` (None: its default line)."""
    return engine.spec.at(version).engine_defaults(device)


def check_version(engine: Engine, version: str | None) -> str | None:
    """Why ``version`` is no release of ``engine`` (None: it is, or is not given)."""
    if version is None:
        return None
    try:
        engine.spec.resolve(version)
    except VersionError as exc:
        return str(exc)
    return None
