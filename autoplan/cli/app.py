"""The one Typer app every command registers on (:mod:`autoplan.cli.commands`, one module a
command; the options they share in :mod:`autoplan.cli.options`), its root options, how number
flags parse, and plan files written as YAML. (``main`` imports the commands and runs the app.)"""

from __future__ import annotations

import os
import typing
from typing import Annotated, Any

import typer
import yaml

from autoplan import __version__
from autoplan.cli import files, output


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
