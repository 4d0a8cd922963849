"""``autoplan bench``: microbenchmarks into a profile.
Registered on the one ``app`` (:mod:`autoplan.cli.app`) when :mod:`autoplan.cli.main`
imports this module."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from autoplan.cli import files, output
from autoplan.cli.app import app
from autoplan.cli.options import (
    Device,
)

if TYPE_CHECKING:
    from autoplan.measured.profile import Profile


@app.command()
def bench(
    device: Annotated[Device | None, typer.Option(
        "--device", "-d", help="cpu or cuda (default: cuda when a GPU is visible).")] = None,
    out_path: Annotated[Path | None, typer.Option(
        "--out", "-o", parser=files.out_path, metavar="<path>",
        help="Write the profile CSV here and print a summary "
                            "(default: the CSV to stdout).")] = None,
    preset: Annotated[str, typer.Option(
        "--preset", "-p", metavar="<tiny|default|full>",
        help="tiny (seconds), default (about a minute on a CPU), or full.")] = "default",
    model: Annotated[str | None, typer.Option(
        "--model", "-m", help="Models whose sharded layer shapes to measure: comma-separated built-in "
                              "names or descriptor paths (default: the preset's).")] = None,
    world: Annotated[int | None, typer.Option(
        "--world", "-w", help="Processes for the collectives; on CPU the kernels then run with "
                              "cpu_count // world torch threads, as each validate rank does "
                              "(OMP_NUM_THREADS overrides) (default: 2 on CPU, every GPU on CUDA; "
                              "under torchrun: the launched world).")] = None,
    descriptor: Annotated[str | None, typer.Option(
        "--descriptor", help="The built-in device this machine is (default: known from the CUDA "
                             "device name; none on CPU).")] = None,
    fit: Annotated[bool, typer.Option(
        "--fit", help="Fit the random-forest surrogate on the profile and print its cross-validated "
                      "error against the analytic model's.")] = False,
    profile_path: Annotated[Path | None, typer.Option(
        "--profile", help="Fit (--fit) or describe (--describe) this profile instead of measuring.")
    ] = None,
    fit_cluster: Annotated[str | None, typer.Option(
        "--cluster", "-c", help="--fit: the analytic baseline (default: the machine described from "
                                "the profile itself).")] = None,
    describe: Annotated[Path | None, typer.Option(
        "--describe", parser=files.out_path, metavar="<path>",
        help="Write a cluster descriptor of this machine fitted on the profile "
                           "(peaks, memory bandwidth, link bandwidth and latency).")] = None,
    name: Annotated[str, typer.Option("--name", help="--describe: the cluster's name.")] = "local-cpu",
) -> None:
    """Microbenchmarks on the local devices (GEMMs, attention, elementwise, collectives) as a
    profile CSV: exit 0, or 2 on bad input or when the benchmarks cannot run here."""
    import shlex
    import time

    from autoplan.api.bench import check_options, check_profile_use, model_names
    from autoplan.bench import run as bench_run
    from autoplan.measured.profile import format_profile, parse_profile, read_profile

    check_options(name, preset)
    for target in (out_path, describe):  # refused before minutes of measuring
        if target is not None:
            files.check_target(target)
    files.check_apart([("--out", out_path), ("--describe", describe)], [profile_path])
    if profile_path is not None:
        check_profile_use(fit, describe)
        _fit_and_describe(read_profile(profile_path), fit, fit_cluster, describe, name)
        return
    models = model_names(model)
    kwargs: dict[str, Any] = dict(device=None if device is None else device.value, preset=preset,
                                  models=models, world=world, descriptor=descriptor,
                                  command=shlex.join(["autoplan", *sys.argv[1:]]))
    started = time.monotonic()
    if output.interactive("table") and bench_run.is_writer():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("bench"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.description}"), console=output.err, transient=True) as bar:
            task = bar.add_task("", total=None)
            meta, rows = bench_run.run_bench(
                **kwargs, progress=lambda done, total, label: bar.update(
                    task, completed=done, total=total, description=escape(label)))
    else:
        meta, rows = bench_run.run_bench(**kwargs)
    if not bench_run.is_writer():
        return  # torchrun: rank 0 writes
    text = format_profile(meta, rows)
    profile = parse_profile(text, str(out_path or "<stdout>"))  # what we write must read back
    if out_path is None or files.is_stdout(out_path):
        sys.stdout.write(text)
        return
    files.write_text(out_path, text)
    from rich.table import Table

    title = f"bench: {meta['device_name']} ({meta['device_kind']}, preset {meta['preset']})"
    table = Table(title=escape(title), title_justify="left")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for label, value in bench_run.summary(profile):
        table.add_row(escape(label), value)
    output.out.print(table)
    output.err.print(f"wrote {len(rows)} rows to {escape(str(out_path))} "
                     f"in {time.monotonic() - started:.0f} s")
    _fit_and_describe(profile, fit, fit_cluster, describe, name)


def _fit_and_describe(profile: Profile, fit: bool, cluster_ref: str | None, describe: Path | None,
                      name: str) -> None:
    """bench --fit: the surrogate's cross-validated error; --describe: the machine descriptor."""
    from rich.table import Table

    from autoplan.measured import surrogate
    from autoplan.measured.machine import cluster_yaml, describe_machine, physical_memory_bytes

    if fit:
        from autoplan.descriptors.library import resolve_cluster

        # default: the machine described from the profile; an engine profile (no elementwise
        # rows to describe one) the built-in node cluster of its device
        cluster = (resolve_cluster(cluster_ref) if cluster_ref is not None
                   else surrogate.builtin_baseline(profile))
        table = Table(title="surrogate fit: mean relative error per kind", title_justify="left",
                      caption=escape(f"{profile.source}; surrogate error cross-validated over "
                                     f"{surrogate.CV_FOLDS} folds"), caption_justify="left")
        for col in ("kind", "rows", "analytic", "surrogate"):
            table.add_column(col, justify="left" if col == "kind" else "right")
        report = surrogate.fit_report(profile, cluster)
        for row in report:
            table.add_row(row.kind, str(row.rows), f"{row.analytic_mape:.1%}",
                          "-" if row.surrogate_mape is None else f"{row.surrogate_mape:.1%}")
        output.out.print(table)
        output.out.print("analytic: the cost model's formula on " + escape(
            cluster.name if cluster else "the machine described from the profile")
            + "; surrogate: the same corrected by forests fitted without the row")
        for line in _fit_notes(profile, report):
            output.out.print(escape(line))
    if describe is not None:
        import shlex

        from autoplan.api.bench import check_describe

        check_describe(profile)
        ranks = surrogate.measured_machine(profile).gpus_per_node
        # each local process is one "GPU" and gets an equal share of the machine's memory
        cluster = describe_machine(profile, name=name, ranks_per_node=ranks,
                                   mem_bytes=physical_memory_bytes() / ranks,
                                   compute_dtype=surrogate.compute_dtype(profile))
        command = shlex.join(["autoplan", *sys.argv[1:]])
        files.write_text(describe, cluster_yaml(cluster, profile, command))
        output.err.print(f"wrote the machine descriptor to {escape(str(describe))}")


def _fit_notes(profile: Profile, report: list[Any]) -> list[str]:
    """What the fit table leaves unsaid: which of the profile's rows it counts, and where
    the surrogate does worse held out than the formula it corrects."""
    from autoplan.measured.surrogate import kind_rows

    counts = kind_rows(profile.rows)
    used = {r.kind: r.rows for r in report}
    unused = [f"{counts[k] - n} {k}" for k, n in used.items() if counts.get(k, 0) > n]
    others = [f"{n} {k}" for k, n in sorted(counts.items()) if k not in used]
    notes = [f"rows: {sum(used.values())} of the profile's {len(profile.rows)} train the surrogate"
             + (f"; {', '.join(unused)} rows are in a precision the analytic model prices no job in "
                f"(fp32; fp4 until autoplan names it: see autoplan/measured/surrogate.py, dtype rule)"
                if unused else "")
             + (f"; {', '.join(others)} rows fit the machine descriptor (--describe) only"
                if others else "")]
    for r in report:
        if r.surrogate_mape is not None and r.surrogate_mape > r.analytic_mape:
            notes.append(
                f"{r.kind}: the surrogate's held-out error ({r.surrogate_mape:.1%}) is worse than the "
                f"formula's ({r.analytic_mape:.1%}): its {r.rows} rows are too few or too scattered to "
                f"learn from; measure more (longer bench runs, more sizes) before trusting its "
                f"{r.kind} correction")
    return notes

