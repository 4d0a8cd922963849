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

from autoplan.export.launcher import LauncherSpec
from autoplan.export.megatron import header
from autoplan.plan import Plan
from autoplan.shell import continued, quote, slug

FILENAME = "job.sbatch"


def script(plan: Plan, launcher: LauncherSpec) -> tuple[str, dict[str, str]]:
    """The job script running the launcher's Slurm program (``LauncherSpec.slurm``) and the
    files beside it."""
    assert launcher.slurm is not None, launcher.name
    c = plan.cluster
    job = launcher.slurm(plan)
    torchrun = [
        "srun --kill-on-bad-exit=1 torchrun",
        f"--nnodes {c.nodes}",
        f"--nproc-per-node {c.gpus_per_node}",
        '--rdzv-id "$SLURM_JOB_ID"',
        "--rdzv-backend c10d",
        '--rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT"',
        *job.words,
    ]
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name={slug(plan.model.name)}",
        f"#SBATCH --nodes={c.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={c.gpus_per_node}",
        "#SBATCH --exclusive",
        *header(plan, f"Slurm job ({launcher.name})"),
        "set -euo pipefail",
        "",
        *job.setup,
    ]
    if not job.names_run:
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
    lines += [*job.before, continued(torchrun), ""]
    return "\n".join(lines), dict(job.files)


def export(plan: Plan, launcher: LauncherSpec) -> dict[str, str]:
    text, files = script(plan, launcher)
    return {FILENAME: text, **files}
