"""The slurm runner: each plan's exported Slurm job (``export --to slurm``) submitted with
``sbatch --wait --parsable`` (Slurm's sbatch: --parsable prints ``ID`` or ``ID;cluster``
first; --wait returns when the job ends), its output file read as the run's log,
``scancel`` when it is stopped: ``tune --runner slurm``."""

from __future__ import annotations

import os
import select
import subprocess
import time
from pathlib import Path

from autoplan.export.launcher import LauncherSpec
from autoplan.tune.runners import Batch, LaunchRunner, Runner, RunnerSpec


def submit(workdir: Path, job_args: list[str]) -> list[str]:
    return ["sbatch", "--wait", "--parsable", f"--output={workdir / 'slurm-%j.out'}",
            str(workdir / "job.sbatch"), *job_args]


def job_id(proc: subprocess.Popen[bytes], until: float) -> str | None:
    """The job id ``sbatch --parsable`` prints first (``ID`` or ``ID;cluster``), read
    until the monotonic clock reads ``until`` (None: none came by then, or it is no id)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    got = b""
    while b"\n" not in got and len(got) < 256:
        left = until - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if ready:
            chunk = os.read(fd, 256 - len(got))
            if not chunk:
                break
            got += chunk
    job = got.split(b"\n")[0].decode("utf-8", "replace").strip().split(";")[0]
    return job if job.isdigit() and len(job) <= 20 else None


def accepts(launcher: LauncherSpec) -> bool:
    """A launcher tune launches whose Slurm job autoplan writes."""
    return launcher.tune is not None and launcher.slurm is not None


def make(device: str, launcher: str) -> Runner:
    return LaunchRunner(name="slurm", launcher=launcher)


RUNNER = RunnerSpec(
    name="slurm",
    summary="the exported sbatch job",
    startup_s=1800.0,
    make=make,
    launches=True,
    accepts=accepts,
    batch=Batch(target="slurm", submit=submit, job_id=job_id,
                cancel=lambda job: ["scancel", job],
                output=lambda workdir, job: workdir / f"slurm-{job}.out"),
    order=30,
)
