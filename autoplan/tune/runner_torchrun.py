"""The torchrun runner: each plan's exported launch on this node, by the launcher's own
command (``LauncherSpec.tune.command``: the Megatron-LM script, ``torchrun -m
torchtitan.train``): ``tune --runner torchrun``."""

from __future__ import annotations

from autoplan.plan import Plan
from autoplan.tune.runners import LaunchRunner, Runner, RunnerSpec


def refuses(plan: Plan) -> str | None:
    """A plan of more than this node (torchrun --standalone starts one node's processes)."""
    if plan.layout.gpus > plan.cluster.gpus_per_node:
        return (f"{plan.layout.gpus} GPUs is more than one node of {plan.cluster.gpus_per_node}: "
                "torchrun runs on this node (use --runner slurm)")
    return None


def make(device: str, launcher: str) -> Runner:
    return LaunchRunner(name="torchrun", launcher=launcher)


RUNNER = RunnerSpec(
    name="torchrun",
    summary="the exported launch on this node",
    startup_s=600.0,
    make=make,
    launches=True,
    refuses=refuses,
    order=20,
)
