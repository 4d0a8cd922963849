"""torchtitan: the job configuration (TOML) that ``torchrun -m torchtitan.train`` reads.

Keys checked against torchtitan 0.2.2's ``torchtitan/config/job_config.py`` (the last
release configured by TOML; 0.3 moved to Python config registries), and parsed in the
tests by its own ``ConfigManager``:

- ``[parallelism]``: data_parallel_replicate_degree (DDP, zero 0; the replicas of HSDP),
  data_parallel_shard_degree (FSDP2: zero 3, or zero 1 under a pipeline; dp_shard under HSDP),
  fsdp_reshard_after_forward ("default": not pp_enabled), tensor_parallel_degree (always with
  sequence parallel), pipeline_parallel_degree, pipeline_parallel_schedule (class names
  of torch.distributed.pipelining: GPipe, 1F1B, Interleaved1F1B, ZBVZeroBubble),
  pipeline_parallel_schedule_csv (the operation order of a schedule torch has no class
  for: zb-h1, zb-h2, v-half, v-min, written beside the TOML as ``pipeline_schedule.csv``),
  pipeline_parallel_microbatch_size, module_fqns_per_model_part (the plan's layer split,
  one list of module names per model chunk), context_parallel_degree,
  context_parallel_rotate_method, expert_parallel_degree, expert_tensor_parallel_degree.
- ``[activation_checkpoint] mode`` (none, selective, full); selective_ac_option "op"
  is op-level selective checkpointing (keeps the matmul and attention outputs,
  recomputes the cheap element-wise work), the nearest torchtitan has to recomputing
  the attention core only.
- ``[training]``: local_batch_size (per data-parallel rank; with a pipeline, all of a
  step's microbatches), global_batch_size, seq_len, steps, dataset.
- ``[compile]`` enable, components (["model", "loss"], Compile's default) for the compiled stacks
  (torchtitan-compiled, torchtitan-async-tp); ``[parallelism] enable_async_tensor_parallel``
  where the plan runs async TP (``cost.stage.tp_overlap_in``: its stack's, with tp > 1).
- ``[model]``: name, flavor, converters ("float8" for fp8 GEMMs, through torchao).
- ``[checkpoint]`` enable, interval (steps), where the cluster file gives its failure rate
  and storage: Daly's optimum interval (autoplan/cost/reliability.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoplan.cost.stage import tp_overlap_in
from autoplan.descriptors import pipeline_layout
from autoplan.descriptors.model import Model
from autoplan.export import nodes
from autoplan.export.launcher import PLACEMENT, LauncherSpec, SlurmProgram, TuneLaunch
from autoplan.export.nodes import launch, pool_lines
from autoplan.plan import Plan
from autoplan.schedules import Schedule, orders
from autoplan.shell import comment
from autoplan.vocab import Dtype, Recompute, TpOverlap, ZeroStage

FILENAME = "torchtitan.toml"
# stacks whose kernels torch.compile makes (profiles/stacks/): the export turns [compile] on
COMPILED_STACKS = ("torchtitan-compiled", "torchtitan-async-tp")
# the schedule's operation order, where torch has no class for it (read from the folder
# torchrun runs in; the slurm export passes its path)
CSV_FILENAME = "pipeline_schedule.csv"

# torchtitan's own models of the same architecture (torchtitan/models/*/__init__.py)
_MODELS = {"llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B"),
           "llama3-405b": ("llama3", "405B"), "deepseek-v3": ("deepseek_v3", "671B"),
           "qwen3-235b-a22b": ("qwen3", "235B-A22B"),
           # hybrid and sliding-window families torchtitan builds itself (torchtitan at b5bcd76c6,
           # August 2026: models/qwen3_5/__init__.py qwen3_5_configs, models/gpt_oss/__init__.py)
           "qwen3.5-397b-a17b": ("qwen3_5", "397B-A17B"), "gpt-oss-120b": ("gpt_oss", "120b")}


def problems(plan: Plan) -> list[tuple[str, str]]:
    """What torchtitan cannot run beyond its search space's rules (every schedule runs:
    those torch has no class for, from the schedule CSV, :func:`schedule_csv`)."""
    out = model_problems(plan.model)
    if plan.job.dtype is Dtype.FP16:
        out.append(("job.dtype", "torchtitan trains in bf16 (training.mixed_precision_param: "
                                 "bfloat16 or float32), not fp16"))
    return out


def model_problems(m: Model) -> list[tuple[str, str]]:
    """The families torchtitan builds no model of, whatever the plan."""
    if (m.mixers or m.mlps) and m.name not in _MODELS:
        # of these families torchtitan builds Qwen3.5 and gpt-oss only (_MODELS)
        return [("model.mixers",
                 f"torchtitan builds no model of {m.name}'s layer kinds (its hybrid and "
                 f"sliding-window models are Qwen3.5 and gpt-oss: torchtitan/models)")]
    return []


def schedule_name(schedule: Schedule) -> str:
    """torchtitan's ``pipeline_parallel_schedule`` for the schedule: its own class where
    torch has one; else a class of the same stage placement (ZBVZeroBubble places stages
    in a V, PipelineScheduleMulti in a loop: ``pipeline_module_split``), the order then
    coming from the schedule CSV (:func:`schedule_csv`)."""
    return schedule.spec.torchtitan_schedule


def schedule_csv(plan: Plan) -> str | None:
    """The plan's pipeline schedule as torch.distributed.pipelining's compute-only CSV
    (``_PipelineScheduleRuntime._load_csv``), where torch has no class for it: one row per
    pipeline rank, one action per column in the order autoplan's simulator runs them
    (``schedules.orders.stage_orders``), each ``{stage}{F|I|W|B}{microbatch}`` with the
    stage the chunk's virtual stage (``orders.virtual_stage``, the placement torchtitan
    builds for the class :func:`schedule_name` names). A schedule that splits the backward
    runs I (input gradients) and W (weight gradients); the others B (both). None where a
    built-in class runs the schedule, or there is no pipeline."""
    lay, schedule = plan.layout, plan.schedule
    if lay.pp == 1 or schedule.spec.torchtitan is not None:
        return None
    p, m = lay.pp, plan.num_microbatches
    kinds = {"F": "F", "B": "I" if "W" in schedule.spec.op_kinds else "B", "W": "W"}
    rows = []
    for stage, ops in enumerate(orders.stage_orders(schedule, p, m, lay.vpp)):
        rows.append(",".join(f"{orders.virtual_stage(schedule, p, stage, chunk)}{kinds[kind]}{mb}"
                             for kind, mb, chunk in ops))
    return "\n".join(rows) + "\n"


def model_parts(plan: Plan) -> list[list[str]]:
    """Module names of each model chunk in model order: embedding with the first layers,
    final norm and output with the last (torchtitan's llama3/deepseek_v3/qwen3 names)."""
    lay, layers = plan.layout, plan.model.layers
    if plan.chunks is not None:  # virtual stage i is chunk i // pp of rank i % pp in both
        chunks = plan.chunks
    else:
        counts = ([layers // (lay.pp * lay.vpp)] * (lay.pp * lay.vpp) if lay.vpp > 1
                  else list(plan.stage_layers))
        chunks = pipeline_layout.from_stage_lists([counts])
    parts, first = [], 0
    for c in chunks:
        parts.append(["tok_embeddings"] * c.embedding
                     + [f"layers.{i}" for i in range(first, first + c.layers)]
                     + ["norm", "output"] * c.loss)
        first += c.layers
    return parts


def config(plan: Plan) -> dict[str, dict[str, Any]]:
    m, lay, job = plan.model, plan.layout, plan.job
    name, flavor = _MODELS.get(m.name, (m.name, m.name))
    model: dict[str, Any] = {"name": name, "flavor": flavor}
    if job.dtype is Dtype.FP8:
        model["converters"] = ["float8"]
    pipelined = lay.pp > 1
    training = {
        "local_batch_size": plan.micro_batch * plan.num_microbatches if pipelined else plan.micro_batch,
        "global_batch_size": job.global_batch,
        "seq_len": job.seq_len,
        "steps": 100,
        "dataset": "c4",
    }
    # FSDP2 over dp_shard, replicated over the rest (HSDP): ZeRO-3 without a pipeline, ZeRO-1
    # under one (searchspace/torchtitan.yaml: the default policy keeps parameters unsharded
    # between forward and backward where pp > 1, and pipelining defers the gradient sync)
    shard = plan.zero in (ZeroStage.PARAMETERS, ZeroStage.OPTIMIZER)
    par: dict[str, Any] = {
        "data_parallel_replicate_degree": lay.dp_replicas if shard else lay.dp,
        "data_parallel_shard_degree": lay.dp_shard if shard else 1,
        "fsdp_reshard_after_forward": "default",
        "tensor_parallel_degree": lay.tp,
        "pipeline_parallel_degree": lay.pp,
    }
    if pipelined:
        par["pipeline_parallel_schedule"] = schedule_name(plan.schedule)
        if plan.schedule.spec.torchtitan is None:  # run from the orders autoplan simulated
            par["pipeline_parallel_schedule_csv"] = CSV_FILENAME
        par["pipeline_parallel_microbatch_size"] = plan.micro_batch
        par["module_fqns_per_model_part"] = model_parts(plan)
    par["context_parallel_degree"] = lay.cp
    if m.is_moe:
        par["expert_parallel_degree"] = lay.ep
        par["expert_tensor_parallel_degree"] = lay.etp
    compiled = plan.stack.name in COMPILED_STACKS or plan.stack.tp_overlap is TpOverlap.ASYNC
    if tp_overlap_in(plan) is TpOverlap.ASYNC:  # needs [compile] with "model" (tensor_parallel.py)
        par["enable_async_tensor_parallel"] = True
    ac: dict[str, Any] = {"mode": plan.recompute.value}
    if plan.recompute is Recompute.SELECTIVE:
        ac["selective_ac_option"] = "op"
    out = {"job": {"description": f"{m.name} (autoplan export)"}, "model": model,
           "training": training, "parallelism": par, "activation_checkpoint": ac}
    if compiled:  # the stack's kernels are Inductor's (torchtitan-compiled)
        out["compile"] = {"enable": True, "components": ["model", "loss"]}
    from autoplan.cost.reliability import checkpoint_steps

    steps = checkpoint_steps(plan) if plan.placement is None else None
    if steps is not None:  # Daly's optimum interval for the cluster's failure rate
        out["checkpoint"] = {"enable": True, "interval": steps}
    return out


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise AssertionError(f"no TOML form for {value!r}")


def _toml_string(text: str) -> str:
    """A TOML basic string: backslash, quote and control characters escaped."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def render(plan: Plan) -> str:
    c = launch(plan)
    lines = [
        comment(f"torchtitan job for {plan.model.name} on {c.what}, exported by autoplan."),
        *pool_lines(c),
        # across pools the node ranks are fixed (static rendezvous): c10d assigns them in
        # the order the nodes join
        comment(f"Run on each node: torchrun --nnodes {c.nodes} --nproc-per-node {c.gpus_per_node} "
                "--rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:29500 -m torchtitan.train "
                f"--job.config_file {FILENAME} (or use the slurm export).") if not c.pools else
        comment(f"Run on each node: torchrun --nnodes {c.nodes} --nproc-per-node {c.gpus_per_node} "
                "--node-rank $NODE_RANK --master-addr $MASTER_ADDR --master-port 29500 "
                f"-m torchtitan.train --job.config_file {FILENAME}"),
        comment("Data, tokenizer (model.hf_assets_path) and run length are not part of the plan."),
    ]
    if plan.model.name not in _MODELS:
        lines.append(comment(f"torchtitan has no built-in model named {plan.model.name}: register one "
                             "(a TrainSpec) with its architecture, or set [model] name and flavor."))
    for section, values in config(plan).items():
        lines += ["", f"[{section}]"]
        for key, value in values.items():
            if key == "module_fqns_per_model_part":
                lines.append(f"{key} = [")
                lines += [f"    {toml_value(part)}," for part in value]
                lines.append("]")
            else:
                lines.append(f"{key} = {toml_value(value)}")
    return "\n".join(lines) + "\n"


def export(plan: Plan) -> dict[str, str]:
    out = {FILENAME: render(plan)}
    if (csv := schedule_csv(plan)) is not None:
        out[CSV_FILENAME] = csv
    return out


def slurm_program(plan: Plan) -> SlurmProgram:
    """``torchrun -m torchtitan.train`` in the Slurm job, the TOML (and the schedule's CSV)
    beside the job script."""
    setup = (f'CONFIG_FILE="${{CONFIG_FILE:-$SLURM_SUBMIT_DIR/{FILENAME}}}"',)
    words = ["-m torchtitan.train", '--job.config_file "$CONFIG_FILE"']
    files = export(plan)
    if CSV_FILENAME in files:  # the schedule's order, beside the config
        words.append('--parallelism.pipeline_parallel_schedule_csv '
                     f'"$SLURM_SUBMIT_DIR/{CSV_FILENAME}"')
    return SlurmProgram(setup=setup, words=(*words, '"$@"'), files=files)


def tune_args(steps: int) -> list[str]:
    """The run's length and a metrics line every step (job_config.py: training.steps,
    metrics.log_freq), as command-line overrides of the TOML."""
    return ["--training.steps", str(steps), "--metrics.log_freq", "1"]


def tune_command(plan: Plan, steps: int, workdir: Path) -> list[str]:
    return ["torchrun", "--standalone", "--nnodes", "1", "--nproc-per-node", str(plan.layout.gpus),
            "-m", "torchtitan.train", "--job.config_file", str(workdir / FILENAME), *tune_args(steps)]


LAUNCHER = LauncherSpec(
    name="torchtitan",
    summary="torchtitan: its job configuration (TOML) and the torchrun line",
    space="torchtitan",
    stack="torchtitan",
    export=export,
    source="pytorch/torchtitan torchtitan/config/job_config.py (0.2.2)",
    problems=problems,
    model_problems=model_problems,
    runs={PLACEMENT: nodes.problems},
    slurm=slurm_program,
    tune=TuneLaunch(
        log_format="torchtitan",  # components/metrics.py MetricsProcessor.log (tune/logs.py)
        note="",
        command=tune_command,
        job_args=tune_args,
        environment=lambda steps, workdir: {"CONFIG_FILE": str(workdir / FILENAME)}),
    order=40,
)
