"""How a serving engine launches a plan, beside the exports that write the launches.

An engine is two files: what a deployment costs on it (its defaults, release lines, fitted
constants, hybrid caches, the models it refuses) is its
:class:`~autoplan.serving.engine.EngineSpec` in ``autoplan/serving/engines/<engine>.py``;
how a plan is launched on it is its :class:`LaunchSpec` here, in
``autoplan/export/engines/<engine>.py``: the command, its flags from the engine's own
argument definitions, the files beside the script, what a launch of it cannot express, its
multi-node and prefill/decode disaggregated launches, and its container image and pip pin.
The launch scripts (:mod:`autoplan.export.serving`), the deployment exports
(:mod:`autoplan.export.kube` and its targets) and ``tune``'s local runner find an engine's
launch by the engine (:func:`launch_of`), never by its name. The serving package imports
nothing of this one (``tests/unit/test_layers.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autoplan.serving.cost import StepModel
from autoplan.serving.deployment import ServingPlan
from autoplan.serving.engine import Engine
from autoplan.serving.versions import parse_version
from autoplan.shell import Arg

Problems = list[tuple[str, str]]  # (plan field, why)


def _no_refusals(plan: ServingPlan) -> Problems:
    return []


def _no_lines(plan: ServingPlan) -> list[str]:
    return []


def _no_files(plan: ServingPlan, step: StepModel) -> dict[str, str]:
    return {}


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


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchSpec:
    """Everything the exports need to launch a plan on one serving engine."""

    engine: Engine  # the engine it launches (its cost side: ``engine.spec``)
    command: str  # the launch command, the checkpoint as "$MODEL" (shell text)
    args: Callable[[ServingPlan, StepModel], list[Arg]]  # its flags for the plan
    # (field, why) for what its launch cannot express of a plan, after the models the plan's
    # release runs none of (the engine's ``model_refusals``: :meth:`problems` has both)
    refusals: Callable[[ServingPlan], Problems] = _no_refusals
    # a multi-node replica's launch lines (reading NODE, MASTER_ADDR, DIST_PORT), given the
    # nodes per replica; None: it has none autoplan writes (refused)
    multi_node: Callable[[ServingPlan, int], list[str]] | None = None
    side_files: Callable[[ServingPlan, StepModel], dict[str, str]] = _no_files  # beside the script
    side_flag: str = ""  # the flag naming a side file on the command line
    notes: Callable[[ServingPlan], list[str]] = _no_lines  # comments for the script's reader
    parser: str = ""  # where the engine's own argument parser lives (the export tests run it)
    # shell lines after ARGS (reading the environment: a draft checkpoint's path)
    launch_lines: Callable[[ServingPlan], list[str]] = _no_lines
    disaggregation: Disaggregation | None = None  # None: disaggregated launches refused
    # the container image of a release ("{version}" the release, without a leading v) and
    # how pip installs it, for the launch scripts' comment
    image: str = ""
    pip: str = ""

    @property
    def script(self) -> str:
        return f"serve-{self.engine.value}.sh"

    def problems(self, plan: ServingPlan) -> Problems:
        """(field, why) for what this launch cannot run of ``plan``: the models the plan's
        release of the engine runs none of, then what the launch cannot express."""
        return self.engine.spec.model_refusals(plan.engine_release, plan.model) + self.refusals(plan)

    def image_of(self, release: str) -> str:
        """The container image of ``release`` (empty where the engine names none)."""
        return self.image.format(version=release.removeprefix("v")) if self.image else ""

    def pip_of(self, release: str) -> str:
        """How pip installs ``release`` (empty for a nightly build or where none is named)."""
        if not self.pip or parse_version(release).nightly:
            return ""
        return self.pip.format(version=release.removeprefix("v"))


_LAUNCHES: dict[Engine, LaunchSpec] = {}


def register_launch(spec: LaunchSpec) -> LaunchSpec:
    """Make ``spec`` the launch of its engine (which must have none yet)."""
    if spec.engine in _LAUNCHES:
        raise ValueError(f"{spec.engine.value}: a launch is registered already")
    _LAUNCHES[spec.engine] = spec
    return spec


def unregister_launch(engine: Engine) -> None:
    """Forget an engine's launch (tests that register one of their own)."""
    _LAUNCHES.pop(engine, None)


def launch_of(engine: Engine) -> LaunchSpec | None:
    """The engine's launch (None: no file registers one: :func:`no_launch` says so)."""
    return _LAUNCHES.get(engine)


def no_launch(engine: Engine) -> str:
    """Why an engine without a launch is refused by the exports."""
    return (f"autoplan writes no launch of {engine.value}: no file of autoplan/export/engines/ "
            "registers one")


def launch(engine: Engine) -> LaunchSpec:
    """The engine's launch, for a plan the exports' refusals let through (LookupError where
    none is registered)."""
    found = _LAUNCHES.get(engine)
    if found is None:
        raise LookupError(no_launch(engine))
    return found
