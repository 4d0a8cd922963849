"""Launch scripts for serving plans: vLLM, SGLang and TensorRT-LLM.

One script per plan, run once per replica (``REPLICA=0 .. replicas-1``): a replica takes
its own GPUs of a node (``CUDA_VISIBLE_DEVICES``) and its own port, and a load balancer in
front spreads requests over them, as the simulation assumed. A replica larger than a node
takes whole nodes, and the script runs on each (``NODE=0 ..``, ``MASTER_ADDR`` the address
of the replica's first node, which serves the API; vLLM and SGLang only). ``MODEL`` is the checkpoint
(a path or a HuggingFace id) and must be set: a descriptor does not say where weights live.
Every value passes through :func:`autoplan.shell.quote`.

Each engine's launch file (``autoplan/export/engines/``, its
:class:`~autoplan.export.engines.launch.LaunchSpec`) gives its command, its flags from the
engine's own argument definitions and what its launch cannot express; this module writes the
script around them:

- vLLM (``vllm serve``, vllm/engine/arg_utils.py): ``--tensor-parallel-size``,
  ``--pipeline-parallel-size``, ``--data-parallel-size`` with ``--enable-expert-parallel``
  (attention data parallel; experts over TP x DP), ``--max-num-seqs``,
  ``--max-num-batched-tokens``, ``--enable-chunked-prefill`` / ``--no-enable-chunked-prefill``,
  ``--gpu-memory-utilization``, ``--kv-cache-dtype fp8``, ``--quantization fp8``,
  ``--max-model-len``; across nodes ``--nnodes``, ``--node-rank``, ``--master-addr``,
  ``--master-port`` and ``--headless`` past the first node (0.33's multiprocessing backend).
- SGLang (``python -m sglang.launch_server``, sglang/srt/server_args.py): ``--tp-size``,
  ``--pp-size``, ``--attn-dp-size`` (attention data parallel within the TP group), ``--ep-size``,
  ``--max-running-requests``, ``--chunked-prefill-size`` (-1 turns it off),
  ``--mem-fraction-static``, ``--kv-cache-dtype fp8_e4m3``, ``--quantization fp8``,
  ``--context-length``; across nodes ``--nnodes``, ``--node-rank``, ``--dist-init-addr``.
- TensorRT-LLM (``trtllm-serve``, tensorrt_llm/commands/common_llm_options.py): ``--tp_size``,
  ``--pp_size``, ``--ep_size``, ``--max_batch_size``, ``--max_num_tokens``, ``--max_seq_len``,
  ``--kv_cache_free_gpu_memory_fraction``, ``--extra_llm_api_options`` (a YAML of LLM API
  fields: ``enable_attention_dp``, ``enable_chunked_prefill``, ``kv_cache_config.dtype``).

A prefill/decode disaggregated deployment is a script per pool, ``serve-<engine>-prefill.sh``
and ``serve-<engine>-decode.sh`` (each run once per instance; the prefill pool's GPUs and
ports first), with the engine's flags for the role, and ``router-<engine>.sh``, which lists
every instance by its node's address (``NODE_ADDRS``) and port: vLLM's NIXL connector
(``--kv-transfer-config``) behind ``vllm-router --vllm-pd-disaggregation``, SGLang's
``--disaggregation-mode prefill|decode`` (NIXL, a bootstrap port per prefill instance) behind
``sglang_router.launch_router --pd-disaggregation``. Speculative decoding is the engine's own
configuration of it (vLLM ``--speculative-config``, SGLang ``--speculative-*``, TensorRT-LLM's
``speculative_config``), a draft checkpoint read from ``DRAFT_MODEL``.

The values the engines default to differ between releases (trtllm-serve's max_batch_size and
max_num_tokens among them), so every limit the prediction used is written out, and the script
names the release the plan was predicted for (its container image and pip pin:
:func:`release_lines`; the plan's ``engine: {name, version}``, else the engine's default line).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from autoplan.errors import InputError, Problem
from autoplan.export.engines import LaunchSpec, launch, launch_of, no_launch
from autoplan.serving.cost import StepModel
from autoplan.serving.deployment import Precision, ServingPlan
from autoplan.serving.engine import Engine
from autoplan.shell import Arg, bash_array, comment, slug

BASE_PORT = 8000


def refusals(plan: ServingPlan, target: Engine) -> list[tuple[str, str]]:
    """(field, why) for what the target cannot run as the plan says: what no engine's
    launch here expresses, then the target engine's own (its launch's ``problems``); an
    engine without a launch file, that alone."""
    d, c = plan.deployment, plan.cluster
    spec = launch_of(target)
    if spec is None:
        return [("engine", no_launch(target))]
    out: list[tuple[str, str]] = []
    if d.disaggregated is not None:
        if spec.disaggregation is None:
            out.append(("deployment.disaggregated", f"{target.value}'s prefill/decode disaggregated "
                                                    "launch is not written by autoplan (vllm and sglang "
                                                    "are)"))
        out += [(f"deployment.disaggregated.{role}", why) for role, why in _straddling(plan)]
    if target.value != plan.engine.value:
        out.append(("engine", f"the plan was predicted for {plan.engine.value}, whose batching and "
                              f"memory differ from {target.value}'s: run `autoplan serve --engine "
                              f"{target.value}` for a {target.value} plan"))
    if d.disaggregated is not None:  # each pool's workers as the engine launches them
        for role, pool, _, _ in _pools(plan):
            out += [(f"deployment.disaggregated.{role}" + field.removeprefix("deployment"), why)
                    for field, why in spec.problems(pool)]
        return out
    if (d.gpus_per_replica > c.gpus_per_node and spec.multi_node is not None
            and d.gpus_per_replica % c.gpus_per_node):
        out.append(("deployment", f"a replica of {d.gpus_per_replica} GPUs spans nodes of "
                                  f"{c.gpus_per_node} without filling them: a multi-node replica "
                                  "takes whole nodes"))
    return out + spec.problems(plan)


def export_serving(plan: ServingPlan, target: Engine, source: str) -> dict[str, str]:
    """``{filename: text}`` for the target, or InputError with every refusal."""
    problems = refusals(plan, target)
    if problems:
        raise InputError([Problem(source, field, f"--to {target.value}: {why}") for field, why in problems])
    if plan.deployment.disaggregated is not None:
        return _disaggregated(plan, target)
    spec = launch(target)
    step = StepModel(plan.model, plan.cluster, plan.deployment, plan.engine, plan.engine_version)
    side = spec.side_files(plan, step)
    return {spec.script: _script(plan, spec, spec.args(plan, step), side), **side}


ROLES = ("prefill", "decode")


def _pools(plan: ServingPlan) -> list[tuple[str, ServingPlan, int, int]]:
    """(role, the pool as a plan of its own, its first GPU, its first port) per pool: the
    prefill pool's GPUs and ports first, the decode pool's after them. On a heterogeneous
    cluster (``ServingPlan.pools``) each side is a plan on its own pool's cluster, its GPUs
    counted from that pool's first."""
    d = plan.deployment
    assert d.disaggregated is not None
    out, gpu, port = [], 0, BASE_PORT
    for role in ROLES:
        pool = dataclasses.replace(plan, deployment=d.pool(role), cluster=plan.cluster_of(role), pools=None)
        if plan.pools is not None:
            gpu = 0
        out.append((role, pool, gpu, port))
        gpu += pool.deployment.gpus
        port += pool.deployment.replicas
    return out


def _first_nodes(plan: ServingPlan) -> dict[str, int]:
    """Per role, the index of its first node among the deployment's nodes in order (NODE_ADDRS):
    0 for both where the sides share one cluster (their GPUs are numbered through it); on a
    heterogeneous cluster the prefill side's nodes, then the decode side's."""
    if plan.pools is None:
        return dict.fromkeys(ROLES, 0)
    out, first = {}, 0
    for role, pool, _, _ in _pools(plan):
        out[role] = first
        first += -(-pool.deployment.gpus // pool.cluster.gpus_per_node)
    return out


def _straddling(plan: ServingPlan) -> list[tuple[str, str]]:
    """(role, why) for a pool with an instance on two nodes (each instance is launched on
    the node that holds its GPUs)."""
    out = []
    for role, pool, first, _ in _pools(plan):
        node = pool.cluster.gpus_per_node
        width = pool.deployment.gpus_per_replica
        for r in range(pool.deployment.replicas):
            start = first + r * width
            if start // node != (start + width - 1) // node:
                out.append((role, f"{role} instance {r} (GPUs {start}..{start + width - 1}) would span "
                                  f"two nodes of {node}: give pools whose instances each fit one node"))
                break
    return out


def _disaggregated(plan: ServingPlan, target: Engine) -> dict[str, str]:
    """A prefill/decode disaggregated deployment: a launch script per pool (run once per
    instance, ``REPLICA=0 ..``, on the node that holds its GPUs) with the engine's flags
    for its role, and the router's script, which lists every instance."""
    spec = launch(target)
    dis = spec.disaggregation
    assert dis is not None
    files: dict[str, str] = {}
    for role, pool, first, port in _pools(plan):
        step = StepModel(pool.model, pool.cluster, pool.deployment, pool.engine, pool.engine_version)
        side = {f"{role}-{name}": text for name, text in spec.side_files(pool, step).items()}
        files[f"serve-{target.value}-{role}.sh"] = _script(
            pool, spec, spec.args(pool, step), side, role=role, first_gpu=first, first_port=port,
            role_lines=dis.role_lines(pool, role),
            of=f"pool {pool.cluster.name}'s" if plan.pools is not None else "the deployment's")
        files.update(side)
    files[f"router-{target.value}.sh"] = _router(plan, target)
    return files


def _router(plan: ServingPlan, target: Engine) -> str:
    """The router's script: every prefill and decode instance by its node's address
    (NODE_ADDRS, the deployment's nodes in order; one node: 127.0.0.1) and port."""
    dis = launch(target).disaggregation
    assert dis is not None
    d = plan.deployment
    starts = _first_nodes(plan)
    sides = _pools(plan)
    nodes = (sum(-(-p.deployment.gpus // p.cluster.gpus_per_node) for _, p, _, _ in sides)
             if plan.pools is not None else -(-d.gpus // plan.cluster.gpus_per_node))
    where = (" and ".join(f"{p.deployment.gpus} x {p.cluster.device.name} ({p.cluster.name})"
                          for _, p, _, _ in sides)
             if plan.pools is not None else f"{d.gpus} x {plan.cluster.device.name}")
    lines = ["#!/usr/bin/env bash",
             comment(f"Router for {plan.model.name}: {d.label()} on {where} "
                     f"({target.value}; written by autoplan export). Start the instances first: "
                     f"serve-{target.value}-prefill.sh and serve-{target.value}-decode.sh."),
             comment(f"NODE_ADDRS: the addresses of the deployment's {nodes} node(s), in order "
                     "(space-separated; one node: 127.0.0.1 by default)."),
             "set -euo pipefail",
             'read -r -a NODES <<< "${NODE_ADDRS:-127.0.0.1}"',
             f"if (( ${{#NODES[@]}} < {nodes} )); then",
             f'  echo "NODE_ADDRS must name the deployment\'s {nodes} nodes" >&2; exit 2',
             "fi",
             'ROUTER_PORT="${ROUTER_PORT:-30000}"',
             bash_array("ARGS", [dis.router_flags, ("--host", "0.0.0.0")]),
             'ARGS+=(--port "$ROUTER_PORT")']
    for role, pool, first, port in sides:
        width, node = pool.deployment.gpus_per_replica, pool.cluster.gpus_per_node
        for r in range(pool.deployment.replicas):
            url = f'"http://${{NODES[{starts[role] + (first + r * width) // node}]}}:{port + r}"'
            boot = f" {dis.bootstrap_port(r)}" if role == "prefill" and dis.bootstrap_port is not None else ""
            lines.append(f"ARGS+=(--{role} {url}{boot})")
    lines.append(f'exec {dis.router} "${{ARGS[@]}}"')
    return "\n".join(lines) + "\n"


def release_lines(plan: ServingPlan) -> list[str]:
    """The comment naming the engine release the plan was predicted with: its container
    image and pip pin (each engine's launch file names them)."""
    spec, release = launch(plan.engine), plan.engine_release
    image, pip = spec.image_of(release), spec.pip_of(release)
    if not image and not pip:
        return []
    how = ", or ".join(x for x in (f"image {image}" if image else "", pip) if x)
    return [comment(f"{plan.engine.value} {release} (the release the plan was predicted for): {how}")]


def nodes_per_replica(plan: ServingPlan) -> int:
    """Nodes one replica spans: 1, or whole nodes (``refusals`` turns down the rest)."""
    return plan.nodes_per_replica


def _script(plan: ServingPlan, spec: LaunchSpec, args: list[Arg], side_files: dict[str, str], *,
            role: str = "", first_gpu: int = 0, first_port: int = BASE_PORT,
            role_lines: Sequence[str] = (), of: str = "the deployment's") -> str:
    """The launch script of one deployment, or of one pool (``role``) of a disaggregated
    one, whose GPUs start at ``first_gpu`` of the deployment and ports at ``first_port``."""
    d, c = plan.deployment, plan.cluster
    per, nodes = d.gpus_per_replica, nodes_per_replica(plan)
    what = f"the {role} pool: " if role else ""
    lines = [
        "#!/usr/bin/env bash",
        comment(f"{plan.model.name} on {d.gpus} x {c.device.name}: {what}{d.label()}, weights "
                f"{d.weights.value}, KV cache {d.kv_cache.value} ({plan.engine.value}; written by autoplan "
                "export)"),
        *release_lines(plan),
    ]
    if nodes == 1:
        where = (f"GPUs {first_gpu} + REPLICA x {per} of {of}, on the node that holds them"
                 if role else "on the node that holds them")
        lines.append(comment(f"Run once per replica: REPLICA=0 .. {d.replicas - 1}, {per} GPUs each, "
                             f"{where}; replica r listens on port {first_port} + r."))
    else:
        lines.append(comment(f"Run on each of a replica's {nodes} nodes: REPLICA=0 .. {d.replicas - 1}, "
                             f"NODE=0 .. {nodes - 1}, MASTER_ADDR the address of the replica's NODE 0, "
                             f"which listens on port {BASE_PORT} + r; all {c.gpus_per_node} GPUs of "
                             "each node."))
    lines += [
        "set -euo pipefail",
        ': "${MODEL:?set MODEL to the checkpoint (path or HuggingFace id) of '
        + slug(plan.model.name) + '}"',
        'REPLICA="${REPLICA:-0}"',
        f"if (( REPLICA < 0 || REPLICA >= {d.replicas} )); then",
        f'  echo "REPLICA must be 0..{d.replicas - 1}" >&2; exit 2',
        "fi",
        f"PER_NODE={c.gpus_per_node}",
    ]
    if nodes == 1:
        start = f"{first_gpu} + REPLICA * {per}" if first_gpu else f"REPLICA * {per}"
        lines += [f"FIRST=$(( ({start}) % PER_NODE ))",
                  f'export CUDA_VISIBLE_DEVICES="$(seq -s, "$FIRST" "$(( FIRST + {per} - 1 ))")"']
    else:
        lines += ['NODE="${NODE:-0}"',
                  f"if (( NODE < 0 || NODE >= {nodes} )); then",
                  f'  echo "NODE must be 0..{nodes - 1}" >&2; exit 2',
                  "fi",
                  ': "${MASTER_ADDR:?set MASTER_ADDR to the address of NODE 0 of this replica}"',
                  'DIST_PORT="${DIST_PORT:-$(( 29500 + REPLICA ))}"',
                  'export CUDA_VISIBLE_DEVICES="$(seq -s, 0 "$(( PER_NODE - 1 ))")"']
    lines.append(f"PORT=$(( {first_port} + REPLICA ))")
    if d.weights in (Precision.INT8, Precision.INT4, Precision.FP4):
        lines.append(comment(f"{d.weights.value} weights: MODEL must be a checkpoint quantized to "
                             f"{d.weights.value} (the engine reads its format from the checkpoint)"))
    lines += [comment(note) for note in spec.notes(plan)]
    lines.append(bash_array("ARGS", args))
    lines += spec.launch_lines(plan)
    lines += role_lines
    if nodes > 1:
        assert spec.multi_node is not None  # refusals turn down an engine without one
        lines += spec.multi_node(plan, nodes)
    extra = ""
    for name in side_files:  # each side file on the command line, beside the script
        extra = f' {spec.side_flag} "$(dirname "$0")/{name}"'
    lines.append(f'exec {spec.command} --host 0.0.0.0 --port "$PORT" "${{ARGS[@]}}"{extra}')
    return "\n".join(lines) + "\n"
