"""The serving engines autoplan knows, by name, as Vidur registers its schedulers.

One file per engine (``serving/engines/vllm.py``, ``sglang.py``, ``trtllm.py``) registers
an :class:`EngineSpec`: its batching limits and memory budget by default (what the
simulation admits against), its host time per iteration, and how a plan is launched on it
(the command, its flags from the engine's own argument definitions, what it cannot run).
The simulation, the search, the plan files, the command line and the exports read the
spec, never an engine's name, so adding an engine is one file
(``tests/unit/test_engine_registry.py`` adds one). ``autoplan/serving/__init__.py``
registers the built-in ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from autoplan.descriptors.hardware import Device
from autoplan.registry import Named

# What the spec's functions take: a ``serving.deployment.ServingPlan`` and its
# ``serving.cost.StepModel``, which sit above this module (they name the engine), so they
# are typed here by role; each engine's file types them fully.
ServingPlan = Any
StepModel = Any
Arg = tuple[str, ...]  # ``export.shell.Arg``: a flag and its values


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


def _none(plan: ServingPlan) -> list[tuple[str, str]]:
    return []


def _no_lines(plan: ServingPlan) -> list[str]:
    return []


@dataclass(frozen=True, slots=True)
class Disaggregation:
    """How an engine launches a prefill/decode disaggregated deployment: each pool's
    instances with the engine's own flags for their role, and a router in front that
    sends each request to a prefill instance and then a decode instance."""

    # shell lines after a role's ARGS (role "prefill" or "decode"; they may read REPLICA and
    # PORT): the KV connector, the role, per-instance ports
    role_lines: Callable[[ServingPlan, str], list[str]]
    router: str  # the router's command (shell text), before its flags
    router_flags: tuple[str, ...]  # the flags that turn on its prefill/decode mode
    # the prefill instances' bootstrap ports, as the router's --prefill URL PORT pairs take
    # them (replica -> port); None: the router takes URLs alone
    bootstrap_port: Callable[[int], int] | None = None
    parser: str = ""  # where the router's own argument parser lives (the export tests run it)


def _no_files(plan: ServingPlan, step: StepModel) -> dict[str, str]:
    return {}


def _no_notes(plan: ServingPlan) -> list[str]:
    return []


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """Everything autoplan needs of one serving engine."""

    name: str  # as plan files, ``--engine`` and ``export --to`` spell it
    attr: str  # its Python name (``Engine.VLLM``)
    doc: str
    defaults: Callable[[Device], EngineDefaults]  # its server's defaults on a device
    # host time per iteration: the scheduler, input preparation, sampling and output
    # processing between two forward passes
    host_step_s: float
    command: str  # the launch command, the checkpoint as "$MODEL" (shell text)
    args: Callable[[ServingPlan, StepModel], list[Arg]]  # its flags for the plan
    refusals: Callable[[ServingPlan], list[tuple[str, str]]] = _none  # (field, why) it cannot run
    # a multi-node replica's launch lines (reading NODE, MASTER_ADDR, DIST_PORT), given the
    # nodes per replica; None: it has none autoplan writes (refused)
    multi_node: Callable[[ServingPlan, int], list[str]] | None = None
    side_files: Callable[[ServingPlan, StepModel], dict[str, str]] = _no_files  # beside the script
    side_flag: str = ""  # the flag naming a side file on the command line
    notes: Callable[[ServingPlan], list[str]] = _no_notes  # comments for the script's reader
    parser: str = ""  # where the engine's own argument parser lives (the export tests run it)
    # shell lines after ARGS (reading the environment: a draft checkpoint's path)
    launch_lines: Callable[[ServingPlan], list[str]] = _no_lines
    disaggregation: Disaggregation | None = None  # None: disaggregated launches refused
    # host time per sequence an iteration samples (sampling, detokenizing, streaming the
    # token out): it grows with the batch where the per-iteration part does not
    host_seq_s: float = 0.0
    # the engine's kernels' time over the roofline's at the device's rates (GEMMs, experts,
    # attention, KV reads, logits): >1 where they reach less of the rates than modelled
    kernel_scale: float = 1.0
    # tokens per KV cache block: prefix caching reuses whole blocks (vLLM's block_size 16,
    # SGLang's radix cache page_size 1, TensorRT-LLM's tokens_per_block 32)
    kv_block_tokens: int = 16

    @property
    def script(self) -> str:
        return f"serve-{self.name}.sh"


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


def engine_defaults(engine: Engine, device: Device) -> EngineDefaults:
    """The engine's server defaults on ``device`` (its file's ``defaults``)."""
    return engine.spec.defaults(device)
