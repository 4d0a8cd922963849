"""The options the commands share: the output formats, the model/cluster/job flags, --profile,
--stack, --dtype, --calibration and --objective's check, and the most plans a table shows."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Any

import typer

from autoplan.api._base import MAX_TOP as _MAX_TOP
from autoplan.api.search import OTHER_OBJECTIVE as SEARCH_OTHER
from autoplan.api.serve import OTHER_OBJECTIVE as SERVE_OTHER
from autoplan.vocab import TRAINING_DTYPES, Dtype

# more plans than anyone reads (autoplan.api: the API refuses more too)
MAX_TOP = _MAX_TOP


class Format(str, enum.Enum):
    table = "table"
    json = "json"


class Device(str, enum.Enum):
    """Where bench and validate run: the host's cores, or a CUDA GPU."""

    cpu = "cpu"
    cuda = "cuda"


FormatOpt = Annotated[Format, typer.Option("--format", "-f", help="table for people, json for machines")]
ProfileOpt = Annotated[Path | None, typer.Option(
    "--profile", help="Microbenchmark profile CSV (autoplan bench) whose learned correction and "
                      "uncertainty band apply; default: the one shipped for the cluster's device.")]
LauncherOpt = Annotated[str | None, typer.Option(
    "--launcher", metavar="<megatron|nemo|torchtitan|deepspeed|...>",
    help="Rank only plans this launcher runs (export --to), its uneven layer splits too; "
         "default: every launcher's plans (each tagged with the launchers that run it).")]
StackOpt = Annotated[str | None, typer.Option(
    "--stack", help="Software stack: megatron-core, megatron-lm, torchtitan, torchtitan-compiled, "
                    "torchtitan-async-tp, deepspeed, fsdp, nemo-1, or a stack file; default: the one "
                    "the space (or plan) names. A plan's states its job leaves unset are the stack's.")]
# what a training job is, as search and tune take it (a job file, or the flags over it)
JobFileArg = Annotated[Path | None, typer.Argument(
    metavar="JOB.yaml", help="Job file: model, cluster, job, optional gpus and space.")]
ModelOpt = Annotated[str | None, typer.Option(
    "--model", "-m", help="Built-in model name, descriptor path, or HuggingFace config.json.")]
ClusterOpt = Annotated[str | None, typer.Option(
    "--cluster", "-c", help="Built-in cluster name or descriptor path.")]
GlobalBatchOpt = Annotated[int | None, typer.Option(
    "--global-batch", "-b", help="Sequences per optimizer step.")]
SeqLenOpt = Annotated[int | None, typer.Option("--seq-len", "-s", help="Tokens per sequence.")]


def training_dtype(value: str) -> Dtype:
    """``--dtype``'s value: a training precision (a choice's usage error otherwise); a
    serving one (fp4) refused with what it is for."""
    for d in TRAINING_DTYPES:
        if value.lower() == d.value:
            return d
    exc = typer.BadParameter(f"expected one of {', '.join(d.value for d in TRAINING_DTYPES)}")
    if any(value.lower() == d.value for d in Dtype):  # a dtype, but not one a job trains in
        exc.autoplan_hint = (  # type: ignore[attr-defined]
            f"{value.lower()} GEMMs are a serving precision (autoplan serve --weights "
            f"{value.lower()}), not a training one")
    raise exc


DtypeOpt = Annotated[Dtype | None, typer.Option(
    "--dtype", parser=training_dtype, metavar="<" + "|".join(d.value for d in TRAINING_DTYPES) + ">",
    help="Training precision.")]


# The objectives' one vocabulary (docs/CLI.md): cost and energy mean the same to both commands
# (dollars, energy per unit of work); the third is each command's own measure of speed, with
# no meaning to the other: days to train a run (search's time) is not goodput per GPU of a
# deployment (serve's goodput), which ranks counts as cost does at one price
_OTHER_OBJECTIVE = {"search": {"goodput": SEARCH_OTHER}, "serve": {"time": SERVE_OTHER}}


def objective_choices(command: str, names: tuple[str, ...]) -> Any:
    """The ``--objective`` option's check, a usage error as a choice's is (``FLAG:
    expected one of ..., got ...``, then where the help is); the other command's word
    refused with what it means there and the word here."""
    def check(value: str | None) -> str | None:
        if value is None or value in names:
            return value
        exc = typer.BadParameter(f"expected one of {', '.join(names)}")
        hint = _OTHER_OBJECTIVE[command].get(value)
        if hint:
            exc.autoplan_hint = hint  # type: ignore[attr-defined]
        raise exc
    return check

CalibrationOpt = Annotated[Path | None, typer.Option(
    "--calibration", metavar="<path>",
    help="A serving engine's constants calibrated on measured runs (autoplan calibrate --out of serving "
         "runs): plans of its engine release line are predicted with them.")]

