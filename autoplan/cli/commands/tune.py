"""``autoplan tune``: run the top plans and rank them by measurement.
Registered on the one ``app`` (:mod:`autoplan.cli.app`) when :mod:`autoplan.cli.main`
imports this module."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from autoplan.api import outputs
from autoplan.api.loop import DEFAULT_RUNS, MAX_TOP_K
from autoplan.cli import files, output
from autoplan.cli.app import app
from autoplan.cli.options import (
    ClusterOpt,
    DtypeOpt,
    Format,
    FormatOpt,
    GlobalBatchOpt,
    JobFileArg,
    ModelOpt,
    ProfileOpt,
    SeqLenOpt,
    StackOpt,
)


def _runner_help() -> tuple[str, str, str, str, str]:
    """--runner's and --launcher's choices and help, from the runner and launcher registries
    (``tune/runner_*.py``, ``export/*.py``: a new one is listed without an edit here)."""
    from autoplan.tune.runners import runner_specs, tuned_launchers

    runners = runner_specs()
    launchers = tuned_launchers()
    launching = [r.name for r in runners if r.launches]
    runner_help = "; ".join(f"{r.name}: {r.summary}" for r in runners) + "."
    named = [f"{s.name} ({s.tune.note})" if s.tune is not None and s.tune.note else s.name
             for s in launchers]
    launcher_help = (f"{_or(launching, 'and')} runners: {_or(named, 'or')}.")
    return ("<" + "|".join(r.name for r in runners) + ">", runner_help,
            "<" + "|".join(s.name for s in launchers) + ">", launcher_help, _or(launching, "or"))


def _or(words: list[str], last: str) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} {last} {words[-1]}"


RUNNER_METAVAR, RUNNER_HELP, LAUNCHER_METAVAR, LAUNCHER_HELP, _LAUNCHING = _runner_help()


class _CtrlC:
    """A first Ctrl-C lets the running trial finish and starts no other; a second stops
    it (KeyboardInterrupt in the runner, which stops what it started)."""

    def __init__(self) -> None:
        self.count = 0
        self._old: Any = None

    def __enter__(self) -> _CtrlC:
        try:
            self._old = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread (an embedding program's): Ctrl-C as it was
            self._old = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)

    def _handle(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count == 1:
            output.err.print("autoplan: Ctrl-C: no more trials after this one (Ctrl-C again stops "
                             "it now)", markup=False)
            return
        raise KeyboardInterrupt

    def stopping(self) -> bool:
        return self.count > 0


@app.command()
def tune(
    job_file: JobFileArg = None,
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    gpus: Annotated[int | None, typer.Option("--gpus", "-n", min=1, help="Total GPUs.")] = None,
    global_batch: GlobalBatchOpt = None,
    seq_len: SeqLenOpt = None,
    dtype: DtypeOpt = None,
    space: Annotated[str | None, typer.Option(
        "--space", help="Search space: launchable (plans some launcher runs), any (launcher-free; "
                        "its former name default), megatron, deepspeed, torchtitan, fsdp, or a path "
                        f"(default: launchable; with --runner {_LAUNCHING}, the --launcher's).")] = None,
    profile: ProfileOpt = None,
    stack: StackOpt = None,
    no_offload: Annotated[bool, typer.Option(
        "--no-offload", help="Keep optimizer states and activations on the GPUs.")] = False,
    runner: Annotated[str, typer.Option("--runner", metavar=RUNNER_METAVAR, help=RUNNER_HELP)] = "local",
    launcher: Annotated[str, typer.Option(
        "--launcher", metavar=LAUNCHER_METAVAR, help=LAUNCHER_HELP)] = "megatron",
    device: Annotated[str, typer.Option(
        "--device", "-d", metavar="<cpu|cuda>", help="local runner: cpu or cuda.")] = "cpu",
    top: Annotated[int | None, typer.Option(
        "--top", "-k", min=1, max=MAX_TOP_K, show_default=False,
        help="Distinct plans to run (a different layout or schedule each; default 3).")] = None,
    top_k: Annotated[int | None, typer.Option(
        "--top-k", min=1, max=MAX_TOP_K, hidden=True, help="--top's former name.")] = None,
    within: Annotated[float | None, typer.Option(
        "--within", min=0.0, help="Only plans predicted within this fraction of the best "
                                  "(0.05 = 5%).")] = None,
    steps: Annotated[int, typer.Option("--steps", min=1, max=10000, help="Timed steps per plan.")] = 3,
    warmup: Annotated[int, typer.Option(
        "--warmup", min=1, max=10000, help="Untimed steps before them.")] = 2,
    timeout: Annotated[float, typer.Option(
        "--timeout", min=1.0, max=1e6, help="Seconds one trial may take before it is stopped.")] = 1800.0,
    diverge: Annotated[float, typer.Option(
        "--diverge", min=1.01, max=1e6, help="Stop a trial measuring more than this factor off its "
                                             "prediction (either way).")] = 3.0,
    workdir: Annotated[Path | None, typer.Option(
        "--workdir", help="torchrun and slurm runners: where each trial's scripts and logs go "
                          "(default: ./autoplan-tune).")] = None,
    runs: Annotated[Path | None, typer.Option(
        "--runs", parser=files.out_path, metavar="<path>",
        help="The runs log every trial is appended to (created if missing; default "
             "./autoplan-runs.csv).")] = None,
    no_runs: Annotated[bool, typer.Option("--no-runs", help="Append to no runs log.")] = False,
    out_path: Annotated[Path | None, typer.Option(
        "--out", "-o", parser=files.out_path, metavar="<path>",
        help="Write the fastest measured plan here, with its measurements.")] = None,
    serving: Annotated[Path | None, typer.Option(
        "--serving", metavar="JOB.yaml",
        help="A serving job file: run serve's best deployments for it on this node (--runner "
             "local), each with its engine's server and benchmark client, and rank them by measured "
             "goodput.")] = None,
    checkpoint: Annotated[str | None, typer.Option(
        "--checkpoint", help="--serving: the weights the engines serve, a path or HuggingFace id "
                             "(default: $MODEL, as the export's scripts read it).")] = None,
    health_timeout: Annotated[float, typer.Option(
        "--health-timeout", min=0.1, max=1e6,
        help="--serving: seconds an engine has to answer /health before its trial fails.")] = 1200.0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr.")] = False,
    fmt: FormatOpt = Format.table,
) -> None:
    """Run the best few plans of a search for real and rank them by measured step time (with
    --serving, serving deployments by measured goodput): exit 0 a plan measured, 1 none did,
    2 bad input."""
    from autoplan.api.loop import check_serving_options, check_training_options, one_top

    if quiet:
        output.quiet()
    if serving is not None:
        from autoplan.cli.commands.tune_serving import tune_serving_command

        given = [flag for flag, value in (
            ("JOB.yaml", job_file), ("--model", model), ("--cluster", cluster), ("--gpus", gpus),
            ("--global-batch", global_batch), ("--seq-len", seq_len), ("--dtype", dtype), ("--space", space),
            ("--profile", profile), ("--stack", stack), ("--within", within)) if value is not None]
        if no_offload:
            given.append("--no-offload")
        check_serving_options(given, runner)
        tune_serving_command(serving, top_k=one_top(top, top_k, former=False),
                             log=None if no_runs else (runs or DEFAULT_RUNS), workdir=workdir,
                             out_path=out_path, checkpoint=checkpoint, health_timeout=health_timeout,
                             timeout=timeout, fmt=fmt, ctrl_c=_CtrlC())
        return
    check_training_options(checkpoint)
    from autoplan.api.loop import prepare_tune
    from autoplan.tune.tune import layout_text

    top_k = one_top(top, top_k)
    log = None if no_runs else (runs or DEFAULT_RUNS)
    for target in (out_path, log):
        if target is not None:
            files.check_target(target)
    files.check_apart([("--out", out_path), ("--runs", log)], [job_file])
    outputs.not_stdout("--runs", log, "the runs log is a file to append to, not stdout")
    if files.is_stdout(out_path):
        output.data_to_stderr()
    prepared = prepare_tune(
        job_file, model=model, cluster=cluster, gpus=gpus, global_batch=global_batch, seq_len=seq_len,
        dtype=dtype, space=space, profile=profile, stack=stack, no_offload=no_offload, runner=runner,
        launcher=launcher, device=device, top=top_k, within=within, steps=steps, warmup=warmup,
        timeout=timeout, diverge=diverge, workdir=workdir, runs=log)
    req = prepared.request
    for line in prepared.notes:
        output.err.print(f"autoplan: note: {line}", markup=False)
    with output.working(fmt.value, f"searching {req.space.name} space on {req.cluster.gpus} GPUs ..."):
        found = prepared.search()
    if not found.plans:
        output.err.print(f"autoplan: {found.why_none()}", markup=False)
        raise typer.Exit(1)
    with _CtrlC() as ctrl_c, output.working(fmt.value, f"tuning on {runner} ...", lines=True) as told:
        def done(t: Any) -> None:
            o = t.outcome
            what = (f"{o.step_time_s:.3f} s measured, {t.predicted_step_s:.3f} s predicted"
                    if o.status == "ok" else f"{o.status}: {o.reason}")
            line = f"trial done: {layout_text(t.plan)}: {what}"
            if output.interactive(fmt.value):
                output.err.print(f"autoplan: {line}", markup=False)
            else:
                told(line)

        result = prepared.run(told, found=found, stop=ctrl_c.stopping, on_trial=done)
    if out_path is not None and result.best is not None:
        files.write_text(out_path, result.best_yaml())
    _print_tuning(result, fmt, req, runner, result.searched)
    if log is not None and result.trials and fmt is not Format.json:
        output.err.print(f"appended {len(result.trials)} runs to {files.name(log)}")
    if out_path is not None and result.best is not None and not files.is_stdout(out_path):
        output.err.print(f"wrote the fastest measured plan to {files.name(out_path)}")
    if result.best is None:
        raise typer.Exit(1)


def _print_tuning(result: Any, fmt: Format, req: Any, runner: str, searched: int) -> None:
    from rich.table import Table

    from autoplan.tune.tune import layout_text

    if fmt is Format.json:
        output.emit_json(result.to_dict())
        return
    tokens = req.job.global_batch * req.job.seq_len
    title = escape(f"{req.model.name} on {req.cluster.gpus} x {req.cluster.device.name}, global batch "
                   f"{req.job.global_batch} x {req.job.seq_len}: measured on {runner}, fastest first")
    table = Table(title=title, title_justify="left")
    for col in ("#", "plan", "searched", "predicted s", "measured s", "ratio", "tokens/s",
                "predicted GiB", "measured GiB", "status"):
        table.add_column(col, justify="left" if col in ("plan", "status") else "right")
    for i, t in enumerate(result.trials, start=1):
        o = t.outcome
        ok = o.step_time_s is not None
        table.add_row(
            str(i), escape(layout_text(t.plan)), str(t.searched_rank), f"{t.predicted_step_s:.3f}",
            f"{o.step_time_s:.3f}" if ok else "-",
            f"{o.step_time_s / t.predicted_step_s:.2f}" if ok and t.predicted_step_s > 0 else "-",
            f"{tokens / o.step_time_s:,.0f}" if ok and o.step_time_s > 0 else "-",
            f"{t.predicted_peak_gib:.3f}", f"{o.peak_gib:.3f}" if o.peak_gib is not None else "-",
            o.status if o.status == "ok" else escape(f"{o.status}: {o.reason}"))
    output.out.print(table)
    if result.best is not None:
        b = result.trials[result.best]
        output.out.print(escape(f"fastest measured: {layout_text(b.plan)} ({b.outcome.step_time_s:.3f} s "
                                f"per step; searched rank {b.searched_rank} of {searched})"))
    else:
        output.out.print("no plan measured")
    for rank, plan, why in result.skipped:
        output.err.print(f"note: skipped searched plan {rank} ({layout_text(plan)}): {why}", markup=False)
    if result.interrupted:
        output.err.print("note: interrupted: the trials above are what was measured", markup=False)
    for t in result.trials:
        for line in t.outcome.notes:
            output.err.print(f"note: {layout_text(t.plan)}: {line}", markup=False)

