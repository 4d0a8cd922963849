"""What the Kubernetes-style exports of a serving plan share (``export --to dynamo``, ``llm-d``,
``k8s``): their names, how a container gets the checkpoint and the engine's flags, the
YAML they are written as, what none of them runs, and the autoscaling hook.

Each target is a module of its own (:mod:`autoplan.export.dynamo`, :mod:`autoplan.export.llmd`,
:mod:`autoplan.export.k8s`), a pure function from a plan to ``{filename: text}``;
:func:`export_deployment` picks one by name. The engine's flags are its launch file's ``args``
(``autoplan/export/engines/``), the same the launch scripts write
(:mod:`autoplan.export.serving`), so a deployment runs the batch limits, memory budget and
widths the prediction used.

The checkpoint: a descriptor names the architecture, not where its weights live, so every
container reads ``MODEL`` (a path or a HuggingFace id, as the launch scripts do) from the
ConfigMap ``<name>-model`` (key ``MODEL``), which the manifests' header says how to create;
a container does not start until it exists. Kubernetes expands ``$(MODEL)`` in a container's
command and args from its environment (Kubernetes API reference, Container ``args``: "Variable
references $(VAR_NAME) are expanded using the container's environment").
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import yaml

from autoplan.errors import InputError, Problem
from autoplan.export.engines import launch_of, no_launch
from autoplan.serving.deployment import ServingPlan, SpecMethod
from autoplan.shell import comment

if TYPE_CHECKING:
    from autoplan.serving.cost import StepModel

PORT = 8000  # the engines' API port in every container (the launch scripts' BASE_PORT)
HEALTH = "/health"  # vLLM, SGLang and trtllm-serve each answer GET /health once serving (module docs)
HF_SECRET = "hf-token-secret"  # the Secret holding HF_TOKEN (Dynamo's and llm-d's examples' name)
MAX_NAME = 40  # a base name's length: pods add suffixes, and Services take at most 63 characters


def base_name(plan: ServingPlan) -> str:
    """The deployment's name, a DNS-1035 label (what a Service's name must be: lowercase
    letters, digits and '-', starting with a letter): the model's name and the engine's,
    ``llama3-1-70b-vllm``."""
    raw = re.sub(r"[^a-z0-9]+", "-", f"{plan.model.name}-{plan.engine.value}".lower()).strip("-")
    if not raw or not raw[0].isalpha():
        raw = "m-" + raw
    return raw[:MAX_NAME].rstrip("-")


def model_configmap(plan: ServingPlan) -> str:
    return f"{base_name(plan)}-model"


def model_env(plan: ServingPlan) -> dict[str, Any]:
    """``MODEL`` from the ConfigMap the header names (module doc)."""
    return {"name": "MODEL",
            "valueFrom": {"configMapKeyRef": {"name": model_configmap(plan), "key": "MODEL"}}}


def draft_env(plan: ServingPlan) -> list[dict[str, Any]]:
    """``DRAFT_MODEL`` from the same ConfigMap, for a draft model's or EAGLE head's checkpoint."""
    spec = plan.deployment.speculative
    if spec is None or spec.method not in (SpecMethod.DRAFT, SpecMethod.EAGLE):
        return []
    return [{"name": "DRAFT_MODEL",
             "valueFrom": {"configMapKeyRef": {"name": model_configmap(plan), "key": "DRAFT_MODEL"}}}]


def setup_lines(plan: ServingPlan, what: str) -> list[str]:
    """The header's lines saying what to create before applying ``what``."""
    cm = model_configmap(plan)
    draft = " --from-literal=DRAFT_MODEL=<its draft checkpoint>" if draft_env(plan) else ""
    return [f"Before applying {what}: kubectl create configmap {cm} --from-literal=MODEL=<checkpoint: "
            f"a path or HuggingFace id of {plan.model.name}>{draft}",
            f"and, for a gated checkpoint, kubectl create secret generic {HF_SECRET} "
            "--from-literal=HF_TOKEN=<token>"]


def flat(args: Sequence[tuple[str, ...]]) -> list[str]:
    """Flags and their values as a container's ``args`` (every word a string)."""
    return [str(word) for arg in args for word in arg]


DRAFT_ENGINES = ("vllm", "sglang")  # whose draft checkpoint flag draft_args writes


def draft_args(plan: ServingPlan) -> list[str]:
    """A draft model's or EAGLE head's flags, naming ``$(DRAFT_MODEL)`` (the launch scripts'
    ``launch_lines`` write the same from the shell variable): vLLM's ``--speculative-config``
    JSON (vllm/config/speculative.py), SGLang's ``--speculative-draft-model-path``."""
    import json

    spec = plan.deployment.speculative
    if spec is None or spec.method not in (SpecMethod.DRAFT, SpecMethod.EAGLE):
        return []
    if plan.engine.value == "vllm":
        from autoplan.export.engines.vllm import SPEC_METHOD

        config = {"method": SPEC_METHOD[spec.method], "model": "$(DRAFT_MODEL)",
                  "num_speculative_tokens": spec.tokens}
        return ["--speculative-config", json.dumps(config)]
    return ["--speculative-draft-model-path", "$(DRAFT_MODEL)"]


def step_of(plan: ServingPlan) -> StepModel:
    from autoplan.serving.cost import StepModel

    return StepModel(plan.model, plan.cluster, plan.deployment, plan.engine, plan.engine_version)


def pools(plan: ServingPlan) -> list[tuple[str, ServingPlan]]:
    """(role, the pool as a plan of its own) per pool of a disaggregated plan (prefill, then
    decode), each on its own cluster (a heterogeneous cluster's pool: ``ServingPlan.pools``);
    an aggregated plan is one pool, role ""."""
    d = plan.deployment
    if d.disaggregated is None:
        return [("", plan)]
    return [(role, dataclasses.replace(plan, deployment=d.pool(role), cluster=plan.cluster_of(role),
                                       pools=None)) for role in ("prefill", "decode")]


def nodes_of(plan: ServingPlan) -> int:
    """Nodes one instance spans: 1, or whole nodes (:func:`refusals` turns down the rest)."""
    return plan.nodes_per_replica


def gpus_per_pod(plan: ServingPlan) -> int:
    """GPUs of one pod: an instance's, or a node's where an instance spans nodes."""
    return min(plan.deployment.gpus_per_replica, plan.cluster.gpus_per_node)


def refusals(plan: ServingPlan, target: str, *, disaggregation: bool,
             multi_node: bool) -> list[tuple[str, str]]:
    """(field, why) for what the target cannot run: the engine's own refusals per pool, an
    instance across nodes that does not fill them, a multi-node instance or a disaggregated
    plan where the target has no launch for it (``disaggregation``, ``multi_node``)."""
    spec = launch_of(plan.engine)
    if spec is None:
        return [("engine", no_launch(plan.engine))]
    out: list[tuple[str, str]] = []
    disagg = plan.deployment.disaggregated is not None
    if draft_env(plan) and plan.engine.value not in DRAFT_ENGINES:
        out.append(("deployment.speculative", f"a draft checkpoint's flag for {plan.engine.value} is not "
                                              f"written by autoplan ({', '.join(DRAFT_ENGINES)} are)"))
    if disagg and not disaggregation:
        out.append(("deployment.disaggregated", f"{target} runs no prefill/decode disaggregated "
                                                f"{plan.engine.value} deployment autoplan writes"))
    for role, pool in pools(plan):
        at = f"deployment.disaggregated.{role}" if role else "deployment"
        out += [((at + field.removeprefix("deployment")) if role else field, why)
                for field, why in spec.problems(pool)]
        d, node = pool.deployment, pool.cluster.gpus_per_node
        if d.gpus_per_replica > node:
            if d.gpus_per_replica % node:
                out.append((at, f"an instance of {d.gpus_per_replica} GPUs spans nodes of {node} without "
                                "filling them: a multi-node instance takes whole nodes"))
            elif not multi_node:
                out.append((at, f"an instance of {d.gpus_per_replica} GPUs spans nodes of {node}: "
                                f"{target} runs no multi-node {plan.engine.value} instance autoplan writes"))
    return list(dict.fromkeys(out))


def autoscaling_manifests(plan: ServingPlan, target: str = "k8s",
                          workload: str | None = None) -> list[dict[str, Any]]:
    """The autoscaler's objects for a plan with an ``autoscale:`` block (``serve --traffic``:
    minimum and maximum replicas and the per-replica target an autoscaler keeps, requests in
    flight or KV-cache use), none for a plan of fixed replicas: for ``k8s`` a
    HorizontalPodAutoscaler on the replicas' ``workload`` (``export.autoscale``; none where
    the engine exports no Prometheus gauge it could read: TensorRT-LLM), for ``dynamo`` a
    ConfigMap holding the Dynamo planner's settings (``planner.json``: the planner reads its
    PlannerConfig from a file). ``serve --traffic --autoscale-out`` writes a KEDA ScaledObject
    too, for clusters that scale with KEDA instead."""
    from autoplan.export import autoscale

    if plan.autoscale is None:
        return []
    if target == "dynamo":
        return [{"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": f"{base_name(plan)}-planner"},
                 "data": {"planner.json": json.dumps(autoscale.dynamo_planner_config(plan), indent=2)}}]
    if plan.engine.value not in autoscale.ENGINE_GAUGES:
        return []
    return [autoscale.horizontal_pod_autoscaler(plan, name=workload or base_name(plan))]


class _Dumper(yaml.SafeDumper):
    """Block-style YAML; a long string (a script) as a literal block."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)
_Dumper.ignore_aliases = lambda self, data: True  # type: ignore[method-assign]  # no &id001 anchors


def dump(docs: Sequence[dict[str, Any]], header: Sequence[str]) -> str:
    """The documents as one YAML stream, the header as comment lines above them."""
    head = "".join(comment(line) + "\n" for line in header)
    body = "---\n".join(yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                                  width=10_000) for doc in docs)
    return head + body


def release_line(plan: ServingPlan) -> str:
    if plan.pools is not None:  # each side on its own pool's GPUs: schedule its pods there
        where = " and ".join(f"{p.deployment.gpus} x {p.cluster.device.name} ({role}, pool {p.cluster.name})"
                             for role, p in pools(plan))
        where += ("; put each pool's pods on its GPUs (a nodeSelector on the cluster's GPU "
                  "product label, e.g. GPU feature discovery's nvidia.com/gpu.product)")
    else:
        where = f"{plan.deployment.gpus} x {plan.cluster.device.name}"
    return (f"{plan.model.name} on {where}: "
            f"{plan.deployment.label()}, {plan.engine.value} {plan.engine_release} "
            "(written by autoplan export)")





def refuse(source: str, target: str, problems: list[tuple[str, str]]) -> None:
    if problems:
        raise InputError([Problem(source, field, f"--to {target}: {why}") for field, why in problems])
