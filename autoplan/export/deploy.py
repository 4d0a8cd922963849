"""``export --to dynamo | llm-d | k8s``: a serving plan as the resources of where serving runs
(NVIDIA Dynamo's DynamoGraphDeployment, llm-d's model-service values, plain Kubernetes with
LeaderWorkerSets), one module each over :mod:`autoplan.export.kube`'s shared pieces; this one
only dispatches, so the targets import kube and kube imports none of them."""

from __future__ import annotations

from collections.abc import Callable

from autoplan.export import dynamo, k8s, llmd
from autoplan.serving.deployment import ServingPlan

Export = Callable[[ServingPlan, str], dict[str, str]]

# the deployment targets of `export --to`, in the order the help lists them
TARGETS = ("dynamo", "llm-d", "k8s")
_EXPORTS: dict[str, Export] = {"dynamo": dynamo.export, "llm-d": llmd.export, "k8s": k8s.export}


def export_deployment(plan: ServingPlan, target: str, source: str) -> dict[str, str]:
    """``{filename: text}`` of ``target`` (one of :data:`TARGETS`), or InputError naming
    ``source`` and each field it cannot run."""
    return _EXPORTS[target](plan, source)
