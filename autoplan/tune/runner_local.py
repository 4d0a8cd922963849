"""The local runner: this machine's devices through ``validate``'s torch engine (the
plan's ranks as CPU processes over gloo, or one rank's slice on a GPU): ``tune --runner
local``. Its runs are :class:`~autoplan.tune.runners.LocalRunner`'s."""

from __future__ import annotations

import importlib.util
from typing import Any

from autoplan.errors import InputError
from autoplan.tune.runners import LocalRunner, Runner, RunnerSpec


def check(request: Any, device: str) -> None:
    """Before the search: torch is there, and on the CPU the cluster is this machine's."""
    from autoplan.bench.validate import TORCH_MISSING, builtin_gpu_cluster

    if importlib.util.find_spec("torch") is None:
        raise InputError.single("--runner", "", "local runs plans with torch: "
                                + TORCH_MISSING.split(": ", 1)[1])
    if device == "cpu" and builtin_gpu_cluster(request.cluster):
        raise InputError.single("--cluster", "", (
            f"{request.cluster.name} is a built-in GPU cluster, not this machine: the local "
            "runner on the CPU runs plans of a cluster file describing it (autoplan bench "
            "--describe; examples/cpu/local-cpu.yaml)"))


def make(device: str, launcher: str) -> Runner:
    return LocalRunner(device=device)


RUNNER = RunnerSpec(
    name="local",
    summary="this machine's devices through validate's torch engine (CPU processes over gloo, or "
            "one rank's slice on a GPU)",
    startup_s=90.0,
    make=make,
    check=check,
    order=10,
)
