"""Slurm: an sbatch script that starts one torchrun per node around the chosen launcher.

sbatch options (--job-name, --nodes, --ntasks-per-node, --gpus-per-node, --exclusive)
and ``scontrol show hostnames "$SLURM_JOB_NODELIST"`` are Slurm's own; the first host
is the rendezvous endpoint of torchrun's c10d backend (--rdzv-backend c10d,
--rdzv-endpoint HOST:PORT, --rdzv-id), so every node runs the same command. DeepSpeed
initializes from torchrun's environment, and torchtitan's own launcher is torchrun.
Files beside the script are found through ``$SLURM_SUBMIT_DIR``: sbatch runs a copy of
the script from its spool directory.
"""

from __future__ import annotations

from autoplan.export import deepspeed, megatron, torchtitan
from autoplan.export.shell import continued, quote, slug
from autoplan.plan import Plan

FILENAME = "job.sbatch"


def _program(plan: Plan, launcher: str) -> tuple[list[str], list[str], dict[str, str]]:
    """(setup lines, words after the torchrun options, extra files) for the launcher."""
    if launcher == "megatron":
        return ([megatron.settings(plan), "", megatron.arrays(plan)], megatron.program_words(plan), {})
    if launcher == "deepspeed":
        setup = ['TRAIN_SCRIPT="${TRAIN_SCRIPT:-train.py}"  # calls deepspeed.initialize(args=...)',
                 'DS_CONFIG="${DS_CONFIG:-$SLURM_SUBMIT_DIR/ds_config.json}"']
        words = ['"$TRAIN_SCRIPT"', "--deepspeed", '--deepspeed_config "$DS_CONFIG"']
        if plan.layout.pp > 1:
            words.append(f"--pipeline-parallel-size {plan.layout.pp}")
        return setup, [*words, '"$@"'], {deepspeed.CONFIG: deepspeed.export(plan)[deepspeed.CONFIG]}
    assert launcher == "torchtitan", launcher
    setup = [f'CONFIG_FILE="${{CONFIG_FILE:-$SLURM_SUBMIT_DIR/{torchtitan.FILENAME}}}"']
    words = ["-m torchtitan.train", '--job.config_file "$CONFIG_FILE"']
    files = torchtitan.export(plan)
    if torchtitan.CSV_FILENAME in files:  # the schedule's order, beside the config
        words.append('--parallelism.pipeline_parallel_schedule_csv '
                     f'"$SLURM_SUBMIT_DIR/{torchtitan.CSV_FILENAME}"')
    return setup, [*words, '"$@"'], files


def script(plan: Plan, launcher: str) -> tuple[str, dict[str, str]]:
    c = plan.cluster
    setup, program, files = _program(plan, launcher)
    torchrun = [
        "srun --kill-on-bad-exit=1 torchrun",
        f"--nnodes {c.nodes}",
        f"--nproc-per-node {c.gpus_per_node}",
        '--rdzv-id "$SLURM_JOB_ID"',
        "--rdzv-backend c10d",
        '--rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT"',
        *program,
    ]
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name={slug(plan.model.name)}",
        f"#SBATCH --nodes={c.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={c.gpus_per_node}",
        "#SBATCH --exclusive",
        *megatron.header(plan, f"Slurm job ({launcher})"),
        "set -euo pipefail",
        "",
        *setup,
    ]
    if launcher != "megatron":  # megatron's settings name the run already
        lines.append(f"RUN_NAME={quote(plan.model.name)}")
    lines += [
        # awk reads every host: under pipefail, head's early exit would kill scontrol with
        # SIGPIPE and fail the job on a long node list
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | awk \'NR == 1\')"',
        'MASTER_PORT="${MASTER_PORT:-29500}"',
        "",
        'echo "autoplan: launching $RUN_NAME on $SLURM_JOB_NUM_NODES nodes, rendezvous '
        '$MASTER_ADDR:$MASTER_PORT" >&2',
    ]
    if launcher == "megatron":
        lines.append("# shellcheck disable=SC2086  # DATA_ARGS is a list of words")
    lines += [continued(torchrun), ""]
    return "\n".join(lines), files


def export(plan: Plan, launcher: str = "megatron") -> dict[str, str]:
    text, files = script(plan, launcher)
    return {FILENAME: text, **files}
