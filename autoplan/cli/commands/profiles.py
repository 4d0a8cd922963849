"""``autoplan profiles``: measured profiles made from other tools' measurements.
``profiles import aiconfigurator`` writes autoplan profiles from NVIDIA AIConfigurator's
kernel tables (:mod:`autoplan.measured.aiconfigurator`). Registered on the one ``app``
(:mod:`autoplan.cli.app`) when :mod:`autoplan.cli.main` imports this module."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from autoplan.cli import files, output
from autoplan.cli.app import app

profiles_app = typer.Typer(help="Measured profiles made from other tools' measurements.",
                           no_args_is_help=True)
app.add_typer(profiles_app, name="profiles")

@profiles_app.command("import")
def profiles_import(
    source: Annotated[str, typer.Argument(
        metavar="SOURCE", help="Where the measurements come from: aiconfigurator (the installed "
                               "aiconfigurator-core package's kernel tables).")],
    system: Annotated[str | None, typer.Option(
        "--system", help="The aiconfigurator system (h100_sxm, h200_sxm, b200_sxm, b300_sxm, gb200, "
                         "gb300, a100_sxm, l40s, rtx_pro_6000_server) or its autoplan device "
                         "(default: every one the package has).")] = None,
    backend: Annotated[str | None, typer.Option(
        "--backend", metavar="<vllm|sglang|trtllm>",
        help="The serving engine whose kernel tables to read (default: each).")
    ] = None,
    version: Annotated[str | None, typer.Option(
        "--version", help="The engine's version, as the package's GEMM tables name it (default: the "
                          "newest); needs --backend.")] = None,
    out_path: Annotated[Path | None, typer.Option(
        "--out", "-o", parser=files.out_path, metavar="<path>",
        help="A directory (an existing one, or a path ending in '/') to write each profile into as "
             "<device>-<engine>-<version>-aiconfigurator.csv, or a file for one profile "
             "(default: the one profile to stdout).")] = None,
    thin: Annotated[bool, typer.Option(
        "--thin", help="Keep a stratified sample of each table's shapes (about 1,500 rows a profile: "
                       "what ships under profiles/measured/) instead of every row.")] = False,
) -> None:
    """Write autoplan measured profiles from another tool's kernel measurements, one per
    system, engine and version: exit 0, or 2 on bad input or when the package is missing."""
    from autoplan.measured import aiconfigurator
    from autoplan.measured.profile import format_profile, parse_profile

    aiconfigurator.check_source(source)
    directory = out_path is not None and not files.is_stdout(out_path) and (
        files.named_as_directory(out_path) or out_path.expanduser().is_dir())
    package = aiconfigurator.locate()
    chosen = aiconfigurator.select_for(package, system, backend, version, directory=bool(directory))
    targets = [(s, out_path.expanduser() / s.file_name if directory and out_path is not None else out_path)
               for s in chosen]
    for _, target in targets:  # every one refused before any table is read
        if target is not None:
            files.check_target(target)
    command = shlex.join(["autoplan", *sys.argv[1:]])
    for selection, target in targets:
        meta, rows = aiconfigurator.build(selection, package, thinned=thin, command=command)
        text = format_profile(meta, rows)
        where = "<stdout>" if target is None or files.is_stdout(target) else str(target)
        parse_profile(text, where)  # what we write must read back
        if target is None or files.is_stdout(target):
            sys.stdout.write(text)
        else:
            files.write_text(target, text)
        to_file = target is not None and not files.is_stdout(target)
        output.err.print(f"{escape(selection.label)}: {len(rows)} rows"
                         + (f" to {escape(str(target))}" if to_file else ""))
