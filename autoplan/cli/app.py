"""The one Typer app every command registers on, and what the commands' options share:
the output formats, the --profile and --stack options, the most plans a table shows, and
plan files written as YAML. (``main`` registers the commands and runs the app; ``loop``
the auto-tuner loop's.)"""

from __future__ import annotations

import enum
import os
import typing
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from autoplan import __version__
from autoplan.api._base import MAX_TOP as _MAX_TOP
from autoplan.cli import files, output
from autoplan.errors import InputError, naming  # noqa: F401 (naming: the commands' import)
from autoplan.vocab import TRAINING_DTYPES, Dtype


def _flag_type_hidden(display: Any) -> Any:
    """typer shows a flag (--fit, --help) as taking ``<bool>``; it takes no value."""
    def display_type_rich(self: Any, ctx: Any) -> str | None:
        if getattr(self, "is_flag", False) and self.metavar is None:
            return None
        return display(self, ctx)  # type: ignore[no-any-return]
    return display_type_rich


# A number flag's value as typed: Python's int() and float() (and pydantic's lax parsing,
# which typer 0.29 uses) take "6_4" as 64 and Unicode digits as ASCII ones, so a mistyped
# value would run silently as another number (issue 47's "2_5 reads as 25", refused in files
# too: descriptors.strict). Other bad values keep typer's own words.
def _odd_number(value: str) -> bool:
    return "_" in value or not value.isascii()


def _is_number_option(param: Any) -> bool:
    """Whether ``param`` takes an int or a float: typer 0.29 keeps the annotation
    (``type_descriptor``), older typer a click number type."""
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    if annotation is not None:
        kinds = typing.get_args(annotation) or (annotation,)
        return any(k in (int, float) for k in kinds)
    # older typer: click's types (click is then typer's dependency; recent typer vendors it)
    kind = type(getattr(param, "type", None)).__name__
    return kind in ("IntParamType", "FloatParamType", "IntRange", "FloatRange")


def _numbers_as_typed(consume: Any) -> Any:
    """A number flag's value refused (a usage error naming the flag) where it holds an
    underscore or a character outside ASCII (``_odd_number``)."""
    def consume_value(self: Any, ctx: Any, opts: Any) -> Any:
        value, source = consume(self, ctx, opts)
        if isinstance(value, str) and _odd_number(value) and _is_number_option(self):
            raise typer.BadParameter("expected a number in plain ASCII digits (no _)",
                                     ctx=ctx, param=self)
        return value, source
    return consume_value


typer.core.TyperOption.consume_value = _numbers_as_typed(  # type: ignore[method-assign]
    typer.core.TyperOption.consume_value)

# typer renders option types through this hook in recent releases; older typer (the pyproject allows
# >=0.12) has none, and shows flags its own way
if hasattr(typer.core.TyperOption, "display_type_rich"):
    typer.core.TyperOption.display_type_rich = _flag_type_hidden(  # type: ignore[method-assign]
        typer.core.TyperOption.display_type_rich)

app = typer.Typer(
    name="autoplan",
    help="Plan large-model training and serving. Training: search ranks parallel execution "
         "plans (several GPU counts: time, cost and energy to train), evaluate and explain predict "
         "one, export writes launcher configs (Megatron-LM, DeepSpeed, NeMo, torchtitan, Slurm). "
         "Serving: serve ranks deployments under traffic and latency SLOs, export writes vLLM, "
         "SGLang or TensorRT-LLM launches. Both: check gates CI, diff compares two plans, bench "
         "and validate measure on real devices. Tuning: tune runs the best plans and ranks "
         "them by measurement; runs import and calibrate learn from what ran.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


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


def _version(value: bool) -> None:
    if value:
        output.out.print(f"autoplan {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool | None, typer.Option("--version", callback=_version, is_eager=True,
                                                    help="Print the version and exit.")] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
) -> None:
    output.reset()
    files.reset()
    if debug:
        os.environ["AUTOPLAN_DEBUG"] = "1"


def _yaml(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)
