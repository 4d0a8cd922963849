"""``autoplan export``: a plan file into launcher configs or a serving launch.
Registered on the one ``app`` (:mod:`autoplan.cli.app`) when :mod:`autoplan.cli.main`
imports this module."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from autoplan.cli import files, output
from autoplan.cli.app import app
from autoplan.serving.engine import Engine


def _export_choices() -> tuple[list[str], list[str]]:
    """export's --to (training targets, then serving engines) and slurm's --launcher, from
    the launcher registry (autoplan/export/*.py) and the engine registry."""
    from autoplan.export.launcher import Target, slurm_launchers

    return ([t.value for t in Target] + [e.value for e in Engine] + list(_deploy_targets()),
            [s.name for s in slurm_launchers()])


def _deploy_targets() -> tuple[str, ...]:
    """export's Kubernetes-style targets of a serving plan (autoplan.export.deploy)."""
    from autoplan.export.deploy import TARGETS

    return TARGETS


def _listed(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


_TARGETS, _SLURM_RUNS = _export_choices()
# export's choices as its help shows them (tests/cli/test_vocabulary.py holds them to the registries)
EXPORT_TARGETS = "<" + "|".join(_TARGETS) + ">"
SLURM_LAUNCHERS = "<" + "|".join(_SLURM_RUNS) + ">"
_SERVING = [t for t in _TARGETS if t in {e.value for e in Engine} or t in _deploy_targets()]


@app.command("export")
def export_plan(
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN.yaml", help="A plan file.")],
    to: Annotated[str, typer.Option(
        "--to", "-t", metavar=EXPORT_TARGETS,
        help=f"Training plans: {_listed([t for t in _TARGETS if t not in _SERVING])}; serving plans: "
             f"{_listed(_SERVING)}.")],
    launcher: Annotated[str, typer.Option(
        "--launcher", metavar=SLURM_LAUNCHERS,
        help=f"slurm only: what the job runs ({_listed(_SLURM_RUNS)}).")] = "megatron",
    out_path: Annotated[Path | None, typer.Option(
        "--out", "-o", parser=files.out_path, metavar="<path>",
        help="Write here (a directory when the target writes several files) "
                            "instead of printing.")] = None,
) -> None:
    """Write a launcher's configuration for a plan: exit 0, or 2 on bad input or a plan it can't run."""
    from autoplan.api.plans import export as run_export

    written = run_export(plan_path, to=to, launcher=launcher).files
    if out_path is None or files.is_stdout(out_path):
        for name, text in written.items():
            if len(written) > 1:
                sys.stdout.write(f"# ==> {name} <==\n")
            sys.stdout.write(text)
        return
    directory = files.named_as_directory(out_path)  # --out launch/: a folder, made if need be
    out_path = out_path.expanduser()
    if len(written) > 1 or directory or out_path.is_dir():
        paths = {name: out_path / name for name in written}
    else:
        paths = {name: out_path for name in written}
    for path in paths.values():
        files.check_target(path)  # every one before any is written
    files.check_apart([("--out", path) for path in paths.values()], [plan_path])
    for name, path in paths.items():
        files.write_text(path, written[name], executable=name.endswith((".sh", ".sbatch")))
        output.err.print(f"wrote {escape(str(path))}")

